"""Order -> tasks (``arrowload.order.tasks``): the reads of an epoch's positions, as a pure
function of integers.

Properties checked with hypothesis against plain truths: the tasks cover the asked
position ranges exactly, in order (each task's positions, mapped through the order, are
the order's own rows there); each task stays within one unit (source order over a scan),
one window (block shuffle over a scan) or one byte-sized read (a random-access table:
``read_rows`` rows at most, a whole number of batches within ``prefetch / READ_SHARE``);
each task's byte estimate follows the source's numbers. Golden tasks pin the exact
sequence for a small case of each kind.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arrowload.order import EpochOrder, ShuffleKind, SourceShape, Task, TaskKind, plan_tasks
from arrowload.order.tasks import MAX_READ_ROWS, READ_SHARE, RUN_READ_BYTES, WINDOW_COPIES, read_rows

counts_st = st.lists(st.integers(min_value=0, max_value=60), min_size=1, max_size=12).map(tuple)
kinds = st.sampled_from(list(ShuffleKind))


def _ranges(draw_data, total: int) -> list[tuple[int, int]]:
    """Up to 4 disjoint increasing ranges inside [0, total) (a rank's range, or batches of a
    DataLoader worker)."""
    cuts = sorted(draw_data.draw(st.lists(st.integers(0, total), min_size=0, max_size=8)))
    pairs = [(cuts[i], cuts[i + 1]) for i in range(0, len(cuts) - 1, 2) if cuts[i] < cuts[i + 1]]
    return pairs or ([(0, total)] if total else [])


def _rows_of(task: Task, order: EpochOrder) -> np.ndarray:
    """Source-order rows a task reads, computed from its own fields (not its positions)."""
    if task.kind is TaskKind.UNIT:
        return np.arange(task.lo, task.hi, dtype=np.int64) + order.offsets[task.unit]
    if task.kind is TaskKind.WINDOW:
        return order.window_rows(task.window)[order.window_local(task.window, task.lo, task.hi)]
    return order.rows(task.lo, task.hi)


@settings(max_examples=150, deadline=None)
@given(counts=counts_st, kind=kinds, seed=st.integers(0, 2**64 - 1), window=st.integers(1, 5),
       table=st.booleans(), batch=st.integers(1, 50), prefetch=st.integers(1, 1 << 16),
       row_bytes=st.floats(1.0, 500.0), at_once=st.integers(1, 6), data=st.data())
def test_tasks_cover_the_ranges_exactly_in_order(counts, kind, seed, window, table, batch, prefetch,
                                                 row_bytes, at_once, data):
    table = table or kind is ShuffleKind.GLOBAL  # a global shuffle needs random access
    order = EpochOrder(counts, kind.value, seed=seed, epoch=1, window=window)
    unit_bytes = tuple(data.draw(st.integers(0, 10_000)) for _ in counts)
    shape = SourceShape(counts, table=table, unit_bytes=() if table else unit_bytes, row_bytes=row_bytes,
                        units_at_once=at_once)
    ranges = _ranges(data, order.total)
    tasks = list(plan_tasks(order, ranges, shape, batch, prefetch))

    # positions: consecutive tasks tile each range, in order
    spans = [t.positions(order) for t in tasks]
    expect = [p for a, b in ranges for p in range(a, b)]
    assert [p for a, b in spans for p in range(a, b)] == expect
    assert all(t.rows == b - a > 0 for t, (a, b) in zip(tasks, spans))
    # rows: what each task reads is the order's rows at its positions
    got = np.concatenate([_rows_of(t, order) for t in tasks]) if tasks else np.zeros(0, np.int64)
    want = np.concatenate([order.rows(a, b) for a, b in ranges]) if ranges else np.zeros(0, np.int64)
    np.testing.assert_array_equal(got, want)

    step = read_rows(prefetch, row_bytes, batch)
    for t in tasks:
        assert t.est_bytes >= 0
        if table:  # byte-sized slices / gathers of the random-access table
            assert t.kind is (TaskKind.UNIT if kind is ShuffleKind.NONE else TaskKind.GATHER)
            assert t.rows <= step
            assert t.est_bytes == max(1, int(t.rows * row_bytes))
        elif kind is ShuffleKind.BLOCK:  # one window each: its units' estimates once (and the
            # units decoded at once, being placed, as large as the largest) for a whole window,
            # twice (laid out, gathered) for part of one
            assert t.kind is TaskKind.WINDOW
            size = order.window_offsets[t.window + 1] - order.window_offsets[t.window]
            assert t.hi <= size
            units = [unit_bytes[int(u)] for u in order.windows[t.window]]
            whole = t.lo == 0 and t.hi == size
            held = min(at_once, len(units)) * max(units)
            assert t.est_bytes == (sum(units) + held if whole else WINDOW_COPIES * sum(units))
        else:  # source order over a scan: within one unit, its share of the unit's estimate
            assert t.kind is TaskKind.UNIT
            assert 0 <= t.lo < t.hi <= counts[t.unit]
            assert t.est_bytes == unit_bytes[t.unit] * t.rows // max(1, counts[t.unit])


@settings(max_examples=200, deadline=None)
@given(prefetch=st.integers(1, 1 << 34), row_bytes=st.floats(0.0, 1e6), batch=st.integers(1, 100_000))
def test_read_rows_is_whole_batches_within_the_share(prefetch, row_bytes, batch):
    n = read_rows(prefetch, row_bytes, batch)
    assert n % batch == 0 and n >= batch
    if n > batch:  # more than one batch only where it fits the share and the cap
        assert n <= MAX_READ_ROWS
        assert n * max(1.0, row_bytes) <= prefetch / READ_SHARE


def test_plan_tasks_is_lazy_and_pure():
    """A generator over integers: nothing is computed before it is iterated, and the same
    inputs give the same tasks."""
    order = EpochOrder((5, 5), "none")
    shape = SourceShape((5, 5), unit_bytes=(50, 50))
    it = plan_tasks(order, [(0, 10)], shape, 4, 1 << 20)
    assert iter(it) is it
    assert list(it) == list(plan_tasks(order, [(0, 10)], shape, 4, 1 << 20))


def test_source_shape_checks_its_estimates():
    with pytest.raises(ValueError, match="one byte estimate per unit"):
        SourceShape((3, 4), unit_bytes=(1,))
    SourceShape((3, 4), table=True, row_bytes=8.0)  # a table needs none
    with pytest.raises(ValueError, match="random-access table"):  # a scan cannot be gathered from
        list(plan_tasks(EpochOrder((3, 4), "global"), [(0, 7)], SourceShape((3, 4), unit_bytes=(1, 1)), 2, 64))


GOLDEN = {  # counts (3, 0, 5, 2, 4), seed 7, epoch 1, window 2, positions [1, 13), batch 2;
    # (kind, est_bytes, lo, hi, unit or window). Block windows: units (0, 4), (2, 3), (1).
    ("none", False): [("unit", 6, 1, 3, 0), ("unit", 50, 0, 5, 2), ("unit", 20, 0, 2, 3), ("unit", 30, 0, 3, 4)],
    ("block", False): [("window", 100, 1, 7, 0), ("window", 140, 0, 6, 1)],
    # (windows: part of the first, 2x its units' 50; part of the second, 2x its units' 70)
    ("global", True): [("gather", 8, 1, 5, -1), ("gather", 8, 5, 9, -1), ("gather", 8, 9, 13, -1)],
    ("block", True): [("gather", 8, 1, 5, -1), ("gather", 8, 5, 9, -1), ("gather", 8, 9, 13, -1)],
    ("none", True): [("unit", 4, 1, 3, 0), ("unit", 8, 0, 4, 2), ("unit", 2, 4, 5, 2), ("unit", 4, 0, 2, 3),
                     ("unit", 6, 0, 3, 4)],
}


@pytest.mark.parametrize("key", sorted(GOLDEN))
def test_tasks_golden(key):
    kind, table = key
    counts = (3, 0, 5, 2, 4)
    order = EpochOrder(counts, kind, seed=7, epoch=1, window=2)
    shape = (SourceShape(counts, table=True, row_bytes=2.0) if table else
             SourceShape(counts, unit_bytes=(10, 0, 50, 20, 40)))
    # prefetch 32 bytes of 2-byte rows: a share of 8 bytes = 4 rows = 2 batches of 2 per read
    got = [(t.kind.value, t.est_bytes, t.lo, t.hi, t.unit if t.kind is TaskKind.UNIT else t.window)
           for t in plan_tasks(order, [(1, 13)], shape, 2, 32)]
    assert got == GOLDEN[key]


def test_tasks_carry_the_bytes_they_read():
    """``read_bytes`` (compressed bytes from storage, for stats) is each unit task's share of
    its unit's figure and a window's sum; a table reads none."""
    counts = (3, 0, 5, 2, 4)
    unit_bytes, read = (10, 0, 50, 20, 40), (1, 0, 5, 2, 4)
    for kind in ("none", "block"):
        order = EpochOrder(counts, kind, seed=7, epoch=1, window=2)
        tasks = list(plan_tasks(order, [(0, 14)], SourceShape(counts, unit_bytes=unit_bytes, read_bytes=read), 2, 32))
        if kind == "none":
            assert [t.read_bytes for t in tasks] == [read[t.unit] * t.rows // counts[t.unit] for t in tasks]
        else:
            assert [t.read_bytes for t in tasks] == [sum(read[int(u)] for u in order.windows[t.window]) for t in tasks]
        assert sum(t.read_bytes for t in tasks) == sum(read)
    with pytest.raises(ValueError, match="read_bytes"):
        SourceShape(counts, unit_bytes=unit_bytes, read_bytes=(1,))
    table = list(plan_tasks(EpochOrder(counts, "global"), [(0, 14)], SourceShape(counts, table=True, row_bytes=2.0), 2, 32))
    assert all(t.read_bytes == 0 for t in table)


@settings(max_examples=200, deadline=None)
@given(counts=counts_st, run_rows=st.integers(1, 200), prefetch=st.integers(1, 1 << 16), data=st.data())
def test_runs_merge_whole_consecutive_units_and_cover_the_same_rows(counts, run_rows, prefetch, data):
    """``run_rows``: an unshuffled scan's unit tasks merged into RUN tasks read exactly the
    rows the unit tasks read, in order; a run joins only consecutive units it reads whole in
    between, holds under ``run_rows`` rows, at most a read's share of ``prefetch`` and reads
    at most ``RUN_READ_BYTES`` from storage."""
    order = EpochOrder(counts, ShuffleKind.NONE.value, seed=0, epoch=1)
    unit_bytes = tuple(data.draw(st.integers(0, 10_000)) for _ in counts)
    read = tuple(data.draw(st.integers(0, RUN_READ_BYTES)) for _ in counts) if data.draw(st.booleans()) else ()
    shape = SourceShape(counts, unit_bytes=unit_bytes, read_bytes=read)
    ranges = _ranges(data, order.total)
    units = list(plan_tasks(order, ranges, shape, 4, prefetch))
    tasks = list(plan_tasks(order, ranges, shape, 4, prefetch, run_rows=run_rows))
    assert [t.positions(order) for t in tasks] == _merged_spans(tasks, order)
    spans = [p for t in tasks for p in range(*t.positions(order))]
    assert spans == [p for t in units for p in range(*t.positions(order))]
    rows = [int(order.offsets[u]) + r for t in tasks for u, lo, hi in t.pieces()
            for r in range(lo, counts[u] if hi < 0 else hi)]
    assert rows == [int(r) for t in units for r in _rows_of(t, order)]
    assert sum(t.read_bytes for t in tasks) == sum(t.read_bytes for t in units)
    for t in tasks:
        if t.kind is TaskKind.RUN:
            assert t.last > t.unit and t.rows < run_rows and t.est_bytes <= prefetch // READ_SHARE
            assert t.read_bytes <= RUN_READ_BYTES  # its first rows wait for its last unit's read
            assert t.rows == sum((counts[u] if hi < 0 else hi) - lo for u, lo, hi in t.pieces())
    if run_rows > max(counts, default=0) * 2 and prefetch >= 4 * sum(unit_bytes) and len(ranges) == 1 \
            and sum(read) <= RUN_READ_BYTES:
        assert len(tasks) < len(units) or len(units) < 2 or any(  # merged, unless nothing is mergeable
            b.lo != 0 or a.hi != counts[a.unit] or b.unit != a.unit + 1 for a, b in zip(units, units[1:]))


def test_a_run_reads_at_most_its_bound_from_storage():
    """A selective filter keeps few rows of large units: by rows alone, a quarter of the
    epoch was one run, whose first rows waited for its last unit's decode. A run ends
    before it would read more than ``RUN_READ_BYTES`` (a unit alone past it stays alone)."""
    counts = (4_000,) * 6
    order = EpochOrder(counts, ShuffleKind.NONE.value, seed=0, epoch=1)
    big = RUN_READ_BYTES * 3 // 5
    shape = SourceShape(counts, unit_bytes=(1_000,) * 6, read_bytes=(big, big, 1, 1, 2 * RUN_READ_BYTES, 1))
    tasks = list(plan_tasks(order, [(0, order.total)], shape, 4, 1 << 30, run_rows=MAX_READ_ROWS))
    assert [(t.unit, t.last if t.kind is TaskKind.RUN else t.unit) for t in tasks] == [(0, 0), (1, 3), (4, 4), (5, 5)]
    assert all(t.read_bytes <= RUN_READ_BYTES for t in tasks if t.kind is TaskKind.RUN)
    unknown = list(plan_tasks(order, [(0, order.total)], SourceShape(counts, unit_bytes=(1_000,) * 6), 4, 1 << 30,
                              run_rows=MAX_READ_ROWS))
    assert [(t.unit, t.last) for t in unknown] == [(0, 5)]  # bytes unknown: rows and memory decide


def _merged_spans(tasks, order) -> list[tuple[int, int]]:
    return [(int(order.offsets[t.unit]) + t.lo, int(order.offsets[t.unit]) + t.lo + t.rows) for t in tasks]
