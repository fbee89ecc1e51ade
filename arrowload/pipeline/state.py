"""The loader state (``formats/loader_state/v4``; ``v1`` to ``v3`` still read): writing it,
and reading it back field by field.

Version 4 is one **global** state, the same document on every rank: no ``rank`` field, and
``world_size`` / ``position`` / ``batches`` describe the epoch's current segment (each of
``world_size`` ranks yielded ``position`` rows in ``batches`` batches, in lockstep) after the
earlier ``segments`` of the epoch (``order.elastic``). It loads at any world size: at the
same one it continues the same lanes; at another the free positions are laid out anew
(``order.elastic.relayout``). Versions 1 to 3 are per rank and load, as before, only on
the rank and world size they were taken at.

Version 3 adds ``sources``: per scan of the plan, the snapshot it read as the source's
``state_snapshot()`` gives it (for files: the compact file list, so a loader opened later
on the same folder, with files appended since, can go back to exactly those files); its
``snapshot`` field is then the dataset's ``snapshot_id``. Versions 1 and 2 name the data
by the sources' fingerprints and resume only on exactly that data, as before.

A state is positions only (epoch, rows of this rank's epoch already yielded, batches
yielded) plus the identity of what it was taken on (data snapshot, plan fingerprint,
seed, shuffle, world) and the version of the order arithmetic it was taken under
(``order``; version 1 documents predate the field and mean order version 1). A state
whose shuffle kind's order changed since (``order.ORDER_SINCE``) is refused mid-epoch: it
would resume into other rows; at the start or the end of its epoch nothing is at stake
and it loads. Reading checks every field: its presence, its type (integers are
ints, never bools), its range (``0 <= position <=`` this rank's rows, on a batch boundary
or at the end; ``epoch >= 0``; ``batches`` = ``position / batch_size`` rounded up), and
the identity against the loader's, saying in words what differs. Anything else raises
:class:`~arrowload.errors.StateMismatchError` (a ``ValueError``) naming the field.

Pure functions over plain values: the loader wires them, so a future global state (one
state for every rank) adds fields and checks here without touching the pipeline.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import StateMismatchError
from ..order import KINDS, ORDER_SINCE, ORDER_VERSION, Segment, free_ranges, lane_rows, relayout
from ..order.elastic import check_segment
from ..source.snapshot import files_of_compact

STATE_FORMAT = "arrowload.loader_state"
STATE_VERSION = 4
#: versions ``read_state`` accepts (1: no ``order`` field, order version 1; 2: no ``sources``;
#: 3: per rank, with ``rank``; 4: global, with ``segments``)
READABLE = (1, 2, 3, 4)

#: identity fields: a state loads only into a loader whose values are the same
IDENTITY = ("snapshot", "plan", "seed", "shuffle", "window", "batch_size", "drop_last", "num_rows")
#: identity fields of the per-rank states (versions 1 to 3): also the rank and world
RANKED = ("world_size", "rank")
#: position fields
POSITION = ("epoch", "position", "batches")
FIELDS = ("format", "version") + IDENTITY + ("order", "epoch", "world_size", "position", "batches",
                                             "segments", "sources")
_V3 = ("format", "version", "snapshot", "plan", "seed", "shuffle", "window", "world_size", "rank",
       "batch_size", "drop_last", "num_rows", "order") + POSITION + ("sources",)
_FIELDS_BY_VERSION = {1: tuple(f for f in _V3 if f not in ("order", "sources")),
                      2: tuple(f for f in _V3 if f != "sources"), 3: _V3, 4: FIELDS}
#: identity fields that name the data (the rest name the plan and the loader's setup)
DATA = ("snapshot", "num_rows")

_INT, _STR, _BOOL = "an integer", "a string", "true or false"
_TYPES = {"snapshot": _STR, "plan": _STR, "seed": _INT, "shuffle": _STR, "window": _INT,
          "world_size": _INT, "rank": _INT, "batch_size": _INT, "drop_last": _BOOL,
          "num_rows": _INT, "order": _INT, "epoch": _INT, "position": _INT, "batches": _INT}


def identity_keys(version: int) -> tuple[str, ...]:
    """The identity fields a state of ``version`` is checked on."""
    return IDENTITY + RANKED if version <= 3 else IDENTITY


@dataclass(frozen=True)
class Position:
    """Where a state resumes: ``position`` rows of ``epoch`` done by each rank of the
    current segment, in ``batches`` batches, after the epoch's earlier ``segments``."""

    epoch: int
    position: int
    batches: int
    segments: tuple[Segment, ...] = ()


def batches_for(position: int, batch_size: int) -> int:
    """Batches that yield ``position`` rows: rounded up (the last one may be short)."""
    return -(-position // batch_size)


def make_state(identity: Mapping[str, Any], world_size: int, at: Position, sources: list[dict]) -> dict:
    """The JSON-serializable global state document (this version, under this order
    version): the same on every rank of ``world_size`` that yielded the same batches;
    ``sources``: each scan's ``Source.state_snapshot()``."""
    return {"format": STATE_FORMAT, "version": STATE_VERSION, **{k: identity[k] for k in IDENTITY},
            "order": ORDER_VERSION, "epoch": at.epoch, "world_size": world_size, "position": at.position,
            "batches": at.batches,
            "segments": [{"world_size": g.world_size, "position": g.position} for g in at.segments],
            "sources": sources}


def state_version(state: Any) -> int:
    """Check the document's shape (format, version, fields, types); its version, or
    ``StateMismatchError`` naming the field."""
    if not isinstance(state, Mapping):
        raise StateMismatchError(f"a loader state is a dict (what Loader.state_dict() returns, or its "
                                 f"JSON), got {type(state).__name__}")
    if state.get("format") != STATE_FORMAT:
        raise StateMismatchError(f"format: {state.get('format')!r} is not an arrowload loader state "
                                 f"(format {STATE_FORMAT!r} expected); pass what Loader.state_dict() returned")
    version = state.get("version")
    if type(version) is not int or version not in READABLE:
        raise StateMismatchError(f"version: loader state version {version!r} is not supported (this "
                                 f"arrowload reads versions {', '.join(map(str, READABLE))}); resume with "
                                 "the arrowload that wrote it, or start the epoch afresh")
    fields = _FIELDS_BY_VERSION[version]
    unknown = sorted(str(k) for k in state if k not in fields)
    if unknown:
        raise StateMismatchError(f"unknown field(s) {', '.join(map(repr, unknown))} in the loader state "
                                 f"(version {version} has {', '.join(fields)}); the state was edited "
                                 "or written by another program")
    missing = [k for k in fields if k not in state]
    if missing:
        raise StateMismatchError(f"field(s) {', '.join(map(repr, missing))} missing from the loader state; "
                                 "pass the whole dict Loader.state_dict() returned")
    for key, kind in _TYPES.items():
        if key not in fields:
            continue
        value = state[key]
        ok = (type(value) is int if kind == _INT else
              type(value) is str if kind == _STR else type(value) is bool)
        if key == "window" and value is None:
            ok = True
        if not ok:
            allowed = f"{kind}{' or null' if key == 'window' else ''}"
            raise StateMismatchError(f"{key}: {value!r} ({type(value).__name__}) in the loader state is "
                                     f"not {allowed}; the state was damaged or edited")
    if version >= 3:
        _check_sources(state["sources"], state["snapshot"])
    if version >= 4:
        _check_segments(state["segments"])
    return version


def _check_segments(segments: Any) -> None:
    ok = isinstance(segments, list) and all(
        isinstance(g, Mapping) and set(g) == {"world_size", "position"}
        and all(type(g[k]) is int for k in g) for g in segments)
    if not ok:
        raise StateMismatchError("segments: not a list of {\"world_size\": int, \"position\": int} objects; "
                                 "the state was damaged or edited")


def _check_sources(sources: Any, snapshot: str) -> None:
    if not isinstance(sources, list) or not all(
            isinstance(s, Mapping) and isinstance(s.get("snapshot"), str) and s["snapshot"] for s in sources):
        raise StateMismatchError("sources: not a list of objects with a 'snapshot' string; the state was "
                                 "damaged or edited")
    for i, s in enumerate(sources):
        if "files" in s:
            if not (isinstance(s.get("root"), str) and isinstance(s.get("file_format"), str)):
                raise StateMismatchError(f"sources: sources[{i}] has files but no 'root' / 'file_format' "
                                         "string; the state was damaged or edited")
            try:
                files_of_compact(s, f"sources[{i}]")
            except ValueError as exc:
                raise StateMismatchError(f"sources: {exc}; the state was damaged or edited") from None
    joined = "+".join(s["snapshot"] for s in sources) or "none"
    if joined != snapshot:
        raise StateMismatchError(f"sources: their snapshots ({joined!r}) are not the state's snapshot "
                                 f"{snapshot!r}; the state was damaged or edited")


def check_identity(state: Mapping[str, Any], identity: Mapping[str, Any], keys=IDENTITY + RANKED) -> None:
    """``StateMismatchError`` saying in words which of ``keys`` differ between a checked
    ``state`` and a loader of ``identity``."""
    diffs = [f"{k}: {_difference(k, state[k], identity[k])}" for k in keys
             if k in state and state[k] != identity[k]]
    if diffs:
        raise StateMismatchError("the state was taken on other data or another loader setup, so it "
                                 "cannot resume this loader: " + "; ".join(diffs) + ". Build the loader "
                                 "the same way over the same data, or start without the state")


def read_state(state: Any, identity: Mapping[str, Any], world_size: int, rank: int) -> Position:
    """Check ``state`` against a loader of ``identity`` that is rank ``rank`` of
    ``world_size``; the position to resume at, or ``StateMismatchError``.

    A version 4 state (global) resumes at any world size (``order.elastic.relayout``);
    versions 1 to 3 only on the rank and world size they name."""
    version = state_version(state)
    check_identity(state, {**identity, "world_size": world_size, "rank": rank}, identity_keys(version))
    epoch, position, batches = state["epoch"], state["position"], state["batches"]
    bsize, drop_last, total = identity["batch_size"], identity["drop_last"], identity["num_rows"]
    if epoch < 0:
        raise StateMismatchError(f"epoch: {epoch} is negative; epochs count from 0")
    raw = state.get("segments", [])
    segments = tuple(Segment(g["world_size"], g["position"]) for g in raw)
    world = state["world_size"]
    if world < 1:
        raise StateMismatchError(f"world_size: {world} is not a world size (>= 1); the state was damaged "
                                 "or edited")
    try:
        free = free_ranges(total, segments, bsize, drop_last)
    except ValueError as exc:
        raise StateMismatchError(f"segments: {exc}; the state was damaged or edited") from None
    rank_rows = lane_rows(sum(b - a for a, b in free), world, bsize, drop_last)
    if not 0 <= position <= rank_rows:
        who = f"rank {state['rank']} of {world}" if version <= 3 else f"each of {world} ranks"
        raise StateMismatchError(f"position: {position} is outside this rank's epoch ({who} has rows "
                                 f"0..{rank_rows}); the state was damaged or edited")
    try:
        check_segment(free, Segment(world, position), bsize, drop_last)
    except ValueError:
        raise StateMismatchError(f"position: {position} is not on a batch boundary (a multiple of "
                                 f"batch_size {bsize}, or {rank_rows} at the end of the epoch)") from None
    if batches != batches_for(position, bsize):
        raise StateMismatchError(f"batches: {batches} does not match position {position} (that is "
                                 f"{batches_for(position, bsize)} batches of {bsize} rows, the last "
                                 "rounded up); the state was damaged or edited")
    _check_order(state.get("order", 1), state["shuffle"], epoch, position,
                 bool(segments) or 0 < position < rank_rows)
    segments, position = relayout(segments, Segment(world, position), world_size)
    return Position(epoch, position, batches_for(position, bsize), segments)


def _check_order(order: int, kind: str, epoch: int, position: int, mid: bool) -> None:
    """The state's order version against this arrowload's: newer is refused; older is
    refused mid-epoch where ``kind``'s order changed since (the rest of the epoch would be
    other rows than the ones the state left)."""
    if order < 1:
        raise StateMismatchError(f"order: {order} is not an order version (versions count from 1); the "
                                 "state was damaged or edited")
    if order > ORDER_VERSION:
        raise StateMismatchError(f"order: the state was taken under order version {order}, newer than this "
                                 f"arrowload's ({ORDER_VERSION}); resume with the arrowload that wrote it")
    if order < ORDER_SINCE[kind] and mid:
        raise StateMismatchError(
            f"order: the state was taken under order version {order}, and the {kind!r} shuffle's order "
            f"changed in version {ORDER_SINCE[kind]}, so "
            f"resuming at position {position} would not yield the rows the state left; start epoch "
            f"{epoch} afresh (set_epoch({epoch}) without the state), or resume with the arrowload that wrote it")


def _difference(key: str, theirs: Any, mine: Any) -> str:
    if key == "snapshot":
        return ("the data is not the data the state was taken on (files added, "
                "removed, resized or rewritten since, or another lake or copy of it)")
    if key == "plan":
        return ("the selection (filters, columns, maps, limits, SQL) is not the one "
                "the state was taken with")
    if key == "num_rows":
        return f"the state's epoch had {theirs} selected rows, this loader selects {mine}"
    if key == "rank":
        return (f"the state belongs to rank {theirs}, this loader is rank {mine} (each rank loads "
                "the state it saved; states of version 4, which arrowload writes now, are global)")
    if key == "world_size":
        return (f"the state was taken at world_size {theirs}, this loader has world_size {mine} (a "
                f"per-rank state of an older arrowload; states of version 4 resume at any world size)")
    if key == "shuffle" and theirs in KINDS:
        return f"the state was taken with shuffle {theirs!r}, this loader shuffles {mine!r}"
    name = "shuffle_window" if key == "window" else key
    return f"the state was taken at {name} {_show(theirs)}, this loader has {name} {_show(mine)}"


def _show(value: Any) -> str:
    return "None" if value is None else str(value)
