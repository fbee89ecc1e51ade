"""Decoder measurements remembered across processes (``formats/decoder_choice/v1``).

A unit reader measures what each eligible decoder costs (``choose.py``) before it settles
on one; in a fresh process that measurement (a warm-up and a few trials per candidate, each
read alone) costs more than the choice saves on a short epoch. The measurements are
therefore kept in the cache dir, one small document per *situation*: the machine (CPU
architecture and cores, Python, pyarrow and polars builds), the decoder set, the types of
the columns read and the shape of the filter (which columns it reads, with their types,
and how it is applied). A later reader in the same situation starts from the remembered
costs and reads with the cheapest at once; within its first few reads it still gives each
candidate a warm-up and one measured read (``choose.py``: the early check), then measures
every ``choose.RECHECK``-th read, writing the costs back after each measurement: the
choice stays a measured one, and a choice that stops being cheapest is undone. A remembered
cost counts as one sample, and gives way to the first fresh one (``choose.py``): one
measurement per process replaces a stale or noisy document.

Reading is defensive: a missing, damaged, foreign or other-version document is ignored
(and rewritten by the next measurement), never trusted and never fatal. Which decoder
reads never changes a unit's rows, so a stale document costs CPU at worst, not results.

>>> doc = {"format": FORMAT, "version": 1, "key": "k", "situation": {}, "chosen": "pyarrow",
...        "costs": {"pyarrow": 1e-9, "polars": 2e-9}, "measured": 6}
>>> read_decoder_choice(doc, "example").chosen
'pyarrow'
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
from dataclasses import dataclass
from typing import Any

from ..errors import CorruptFileError, UnsupportedError
from ..jsondoc import check_header, write_atomic
from ..options import usable_cores

FORMAT = "arrowload.decoder_choice"
VERSION = 1
_FIELDS = ("key", "situation", "chosen", "costs", "measured")
_machine: dict | None = None


@dataclass(frozen=True)
class DecoderChoice:
    """Remembered median CPU seconds per byte of each decoder measured in one situation."""

    key: str
    situation: dict
    chosen: str
    costs: dict[str, float]
    measured: int


def _dist(name: str) -> str:
    """The installed distribution of ``name`` (its dist-info directory), without importing
    it or scanning every distribution (``importlib.metadata`` costs ~15 ms)."""
    mod = sys.modules.get(name)
    if mod is not None and isinstance(getattr(mod, "__version__", None), str):
        return f"{name}-{mod.__version__}"
    try:
        from importlib.util import find_spec
        spec = find_spec(name)
        if spec is None or not spec.origin:
            return f"{name}-absent"
        site = os.path.dirname(os.path.dirname(spec.origin))
        prefix = f"{name}-"
        found = sorted(e[:-len(".dist-info")] for e in os.listdir(site)
                       if e.startswith(prefix) and e.endswith(".dist-info"))
        return found[-1] if found else f"{name}-unknown"
    except (ImportError, OSError, ValueError):
        return f"{name}-unknown"


def machine() -> dict:
    """What a measurement depends on of the machine and the installed decoders."""
    global _machine
    if _machine is None:
        cores = usable_cores()
        import pyarrow as pa
        _machine = {"arch": platform.machine(), "node": platform.node(), "cores": cores,
                    "python": platform.python_version(), "pyarrow": pa.__version__,
                    "polars": _dist("polars")}
    return dict(_machine)


def situation_key(situation: dict) -> str:
    """The digest naming a situation's document (sorted JSON, SHA-256, 32 hex digits)."""
    text = json.dumps(situation, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def path_for(cache_dir: str, key: str) -> str:
    return os.path.join(cache_dir, f"decoders-{key}.json")


def read_decoder_choice(doc: Any, where: str) -> DecoderChoice:
    """A parsed document checked field by field: ``UnsupportedError`` for another version,
    ``CorruptFileError`` naming the file and the field for anything else out of the spec."""
    check_header(doc, where, FORMAT, VERSION, _FIELDS, "the decoders are measured again")
    key, situation, chosen, costs, measured = (doc[k] for k in _FIELDS)
    if type(key) is not str or not key:
        raise CorruptFileError(f"{where}: key is {key!r}, not a non-empty string", where)
    if not isinstance(situation, dict):
        raise CorruptFileError(f"{where}: situation is {situation!r}, not an object", where)
    if not isinstance(costs, dict) or not costs or not all(
            isinstance(k, str) and type(v) in (int, float) and 0 <= v < float("inf") for k, v in costs.items()):
        raise CorruptFileError(f"{where}: costs must map decoder names to CPU seconds per byte >= 0 "
                               f"(found {costs!r})", where)
    if type(chosen) is not str or chosen not in costs:
        raise CorruptFileError(f"{where}: chosen is {chosen!r}, not one of the measured decoders "
                               f"{sorted(costs)}", where)
    if type(measured) is not int or measured < 1:
        raise CorruptFileError(f"{where}: measured is {measured!r}, not an integer >= 1", where)
    return DecoderChoice(key, situation, chosen, {k: float(v) for k, v in costs.items()}, measured)


def load(cache_dir: str | None, key: str) -> DecoderChoice | None:
    """The remembered choice for ``key``, or None (no cache dir, no document, or one that is
    damaged, of another version or of another situation)."""
    if not cache_dir:
        return None
    path = path_for(cache_dir, key)
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        got = read_decoder_choice(doc, path)
    except (OSError, ValueError, UnicodeDecodeError, RecursionError, CorruptFileError, UnsupportedError):
        return None
    return got if got.key == key else None


def save(cache_dir: str | None, key: str, situation: dict, chosen: str, costs: dict[str, float],
         measured: int) -> None:
    """Write the document for ``key`` (a temporary file renamed: readers never see half of
    one); a cache dir that cannot be written only means measuring again next time."""
    if not cache_dir or not costs or chosen not in costs or measured < 1:
        return
    doc = {"format": FORMAT, "version": VERSION, "key": key, "situation": situation, "chosen": chosen,
           "costs": {k: float(v) for k, v in sorted(costs.items())}, "measured": int(measured)}
    try:
        write_atomic(path_for(cache_dir, key), doc)
    except OSError:
        pass
