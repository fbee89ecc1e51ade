"""Order -> tasks: the reads of an epoch's positions, in order, each with the bytes it holds.

A pure function of integers: the epoch order (:class:`EpochOrder`), the position ranges
to read (one rank's epoch, or the batches of one DataLoader worker), what the source is
(:class:`SourceShape`: unit counts, per-unit byte estimates or bytes per row, a scan or a
random-access table), the batch size and the prefetch budget. No source object is
touched, so the task sequence is property-tested like the order itself.

The rules (what each task reads, and how big it may be):

- a **scan** is read per unit (a row group) in source order, and per window of units for
  a block shuffle -- the smallest reads it allows; a unit task's ``est_bytes`` is its share
  of its unit's footer-known estimate (``unit_bytes``: the bytes it holds decoded); a task
  over a whole window holds its rows once (each unit scattered to its places as it is read)
  plus the units decoded and not yet placed (``units_at_once`` of the largest), a task over
  part of one twice (``WINDOW_COPIES``: laid out for the gather, and gathered);
- a **random-access table** is read in pieces sized in bytes (:func:`read_rows`: a whole
  number of batches within ``prefetch / READ_SHARE``, at most ``MAX_READ_ROWS`` rows, at
  least one batch): slices of its units in source order, gathers of ``order.rows`` for
  both shuffles.

>>> from arrowload.order import EpochOrder
>>> order = EpochOrder((3, 4))
>>> [(t.kind.value, t.unit, t.lo, t.hi) for t in plan_tasks(order, [(1, 6)], SourceShape((3, 4), unit_bytes=(30, 40)), 2, 1 << 20)]
[('unit', 0, 1, 3), ('unit', 1, 0, 3)]
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from .sequence import EpochOrder, ShuffleKind

#: Most rows one gather (or one slice of the random-access table) takes: past this a
#: read gains nothing (its fixed costs are already amortized); narrow rows reach it.
MAX_READ_ROWS = 65_536
#: Copies of its rows a task over part of a block-shuffle window holds at its peak: its
#: units laid out for the gather (each unit's decoded table dropped once copied in) and the
#: gathered output. A task over a whole window scatters each unit to its places as it is
#: read: its rows once, plus the largest unit (being placed).
WINDOW_COPIES = 2
#: A gather may use this share of the prefetch budget, so that several reads overlap
#: with the batches already queued (reader threads read side by side).
READ_SHARE = 4
#: Most bytes from storage consecutive units taken as one run read (``_runs``; where the
#: units' are known). A run is handed on whole, so its first rows wait for its last unit's
#: decode: a filter keeping few rows of large row groups made runs of 15 row groups (a
#: quarter of the epoch) by rows alone. W2 on the 4M-row benchmark lake (7% kept, 5.4 MB
#: read a row group): first batch 0.11-0.13 -> 0.07-0.09 s, peak RSS 14 MiB lower, the
#: epoch unchanged; the small-unit lakes' runs (about 1 MB read each) are unaffected.
RUN_READ_BYTES = 8 << 20


def read_rows(prefetch: int, row_bytes: float, batch_size: int) -> int:
    """Rows per read of a random-access table (a shuffled gather, a slice in source order):
    a whole number of batches whose bytes fit ``prefetch / READ_SHARE``, at most
    ``MAX_READ_ROWS`` rows, and never less than one batch -- a batch larger than the
    whole prefetch budget is read alone, the one unit that cannot be split."""
    per_row = max(1.0, float(row_bytes))
    fit = int(prefetch // (READ_SHARE * per_row))
    return max(batch_size, min(fit, MAX_READ_ROWS) // batch_size * batch_size)


class TaskKind(str, enum.Enum):
    """What a task reads: rows ``[lo, hi)`` of one unit, a run of consecutive small units
    (from row ``lo`` of the first to row ``hi`` of the last), positions ``[lo, hi)`` of one
    block-shuffle window of a scan, or epoch positions ``[lo, hi)`` gathered from a table."""

    UNIT = "unit"
    RUN = "run"
    WINDOW = "window"
    GATHER = "gather"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Task:
    """One read. ``rows`` rows, ``est_bytes`` bytes it holds at its peak (what the budget
    counts), ``read_bytes`` the compressed bytes it reads from storage (0 where unknown or
    nothing is read: gathers of a random-access table).

    ``unit`` / ``window`` name what is read (-1 where it does not apply); ``lo`` / ``hi``
    are rows within the unit (``UNIT``), within the first and the last unit ``last``
    (``RUN``: units ``unit..last``), positions within the window (``WINDOW``) or epoch
    positions (``GATHER``)."""

    kind: TaskKind
    rows: int
    est_bytes: int
    unit: int = -1
    lo: int = 0
    hi: int = 0
    window: int = -1
    read_bytes: int = 0
    last: int = -1

    def pieces(self) -> list[tuple[int, int, int]]:
        """``(unit, lo, hi)`` of each unit a ``UNIT`` or ``RUN`` task reads, in order
        (``hi`` -1: to the unit's end)."""
        if self.kind is TaskKind.UNIT:
            return [(self.unit, self.lo, self.hi)]
        return [(u, self.lo if u == self.unit else 0, self.hi if u == self.last else -1)
                for u in range(self.unit, self.last + 1)]

    def positions(self, order: EpochOrder) -> tuple[int, int]:
        """The epoch positions ``[start, stop)`` this task covers."""
        if self.kind is TaskKind.UNIT or self.kind is TaskKind.RUN:
            start = int(order.offsets[self.unit]) + self.lo
        elif self.kind is TaskKind.WINDOW:
            start = int(order.window_offsets[self.window]) + self.lo
        else:
            start = self.lo
        return start, start + self.rows


@dataclass(frozen=True)
class SourceShape:
    """What the tasks need to know of a row source, as plain numbers.

    ``table``: a random-access table (slices and gathers sized by ``row_bytes``) rather
    than a scan (units and windows sized by ``unit_bytes``: the bytes each unit holds
    decoded). ``read_bytes``: each unit's compressed bytes read (optional; for stats).
    ``units_at_once``: the units a block-shuffle window's read holds decoded at once beside
    the window being placed (a few where polars decodes them side by side, else one)."""

    counts: tuple[int, ...]
    table: bool = False
    unit_bytes: Sequence[int] = ()
    row_bytes: float = 0.0
    read_bytes: Sequence[int] = ()
    units_at_once: int = 1

    def __post_init__(self) -> None:
        if not self.table and len(self.unit_bytes) != len(self.counts):
            raise ValueError(f"a scan needs one byte estimate per unit: {len(self.unit_bytes)} "
                             f"estimates for {len(self.counts)} units")
        if self.read_bytes and len(self.read_bytes) != len(self.counts):
            raise ValueError(f"read_bytes needs one figure per unit: {len(self.read_bytes)} for "
                             f"{len(self.counts)} units")


def plan_tasks(order: EpochOrder, ranges: Sequence[tuple[int, int]], shape: SourceShape,
               batch_size: int, prefetch: int, run_rows: int = 0) -> Iterator[Task]:
    """The reads of positions ``ranges`` (each ``[start, stop)``, in order), lazily.

    ``run_rows``: a scan read in source order takes consecutive units as one ``RUN`` task
    while they hold under ``run_rows`` rows in all (and their bytes fit a read's share of
    ``prefetch``), so that units of a few hundred rows (small files, tiny row groups) do not
    cost a task each (0: a task per unit)."""
    if run_rows and order.kind == ShuffleKind.NONE and not shape.table:
        yield from _runs(plan_tasks(order, ranges, shape, batch_size, prefetch), shape.counts, run_rows,
                         prefetch // READ_SHARE, RUN_READ_BYTES)
        return
    table = shape.table
    if order.kind == ShuffleKind.GLOBAL and not table:
        raise ValueError("a global shuffle gathers its rows from a random-access table; a scan "
                         "is read in units (source order) or windows (block shuffle)")
    step = read_rows(prefetch, shape.row_bytes, batch_size) if table else 0
    row_bytes = shape.row_bytes
    read = shape.read_bytes or (0,) * len(shape.counts)
    for a, b in ranges:
        if order.kind == ShuffleKind.NONE:
            for u, lo, hi in order.unit_pieces(a, b):
                if table:
                    for p in range(lo, hi, step):
                        q = min(hi, p + step)
                        yield Task(TaskKind.UNIT, q - p, max(1, int((q - p) * row_bytes)), unit=u, lo=p, hi=q)
                    continue
                est = shape.unit_bytes[u] * (hi - lo) // max(1, shape.counts[u])
                yield Task(TaskKind.UNIT, hi - lo, est, unit=u, lo=lo, hi=hi,
                           read_bytes=read[u] * (hi - lo) // max(1, shape.counts[u]))
        elif order.kind == ShuffleKind.BLOCK and not table:
            # one task per window: splitting it into gathers shared through the task
            # cache was measured slower (they wait on the window's read)
            for w, lo, hi in order.window_pieces(a, b):
                units = [int(u) for u in order.windows[w]]
                size = sum(shape.unit_bytes[u] for u in units)
                whole = lo == 0 and hi == int(order.window_offsets[w + 1] - order.window_offsets[w])
                held = max(1, min(shape.units_at_once, len(units))) * max(shape.unit_bytes[u] for u in units)
                est = size + held if whole else WINDOW_COPIES * size
                yield Task(TaskKind.WINDOW, hi - lo, est, window=w, lo=lo, hi=hi,
                           read_bytes=sum(read[u] for u in units))
        else:
            for p in range(a, b, step):
                q = min(b, p + step)
                yield Task(TaskKind.GATHER, q - p, max(1, int((q - p) * row_bytes)), lo=p, hi=q)


def _runs(tasks: Iterator[Task], counts: Sequence[int], run_rows: int, run_bytes: int,
          run_read: int) -> Iterator[Task]:
    """Consecutive unit tasks merged into ``RUN`` tasks of under ``run_rows`` rows, at most
    ``run_bytes`` held and at most ``run_read`` bytes read from storage where the units'
    are known (a task that alone passes a bound stays as it is)."""
    run: list[Task] = []

    def flush() -> Iterator[Task]:
        if len(run) == 1:
            yield run[0]
        elif run:
            first, last = run[0], run[-1]
            yield Task(TaskKind.RUN, sum(t.rows for t in run), sum(t.est_bytes for t in run), unit=first.unit,
                       lo=first.lo, hi=last.hi, read_bytes=sum(t.read_bytes for t in run), last=last.unit)
        run.clear()

    rows = held = read = 0
    for t in tasks:
        joins = run and t.unit == run[-1].unit + 1 and run[-1].hi == counts[run[-1].unit] and t.lo == 0
        if not joins or rows + t.rows >= run_rows or held + t.est_bytes > run_bytes or read + t.read_bytes > run_read:
            yield from flush()
            rows = held = read = 0
        run.append(t)
        rows += t.rows
        held += t.est_bytes
        read += t.read_bytes
    yield from flush()


__all__ = ["MAX_READ_ROWS", "READ_SHARE", "RUN_READ_BYTES", "WINDOW_COPIES", "SourceShape", "Task", "TaskKind",
           "plan_tasks", "read_rows"]
