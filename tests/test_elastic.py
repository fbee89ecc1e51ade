"""Elastic resume: one global state, loaded at another world size.

Truths from outside the layout arithmetic: a naive list simulation of the rule the spec
states (``formats/loader_state/v4/spec.md``: free positions, equal lanes, consumed
prefixes), the rows themselves (ids of an ``arange`` table or a lake, each counted), and
the uninterrupted epoch of a separate loader. Multi-process runs are in
``test_distributed.py``; this file drives every rank's loader from one process.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import arrowload as al
from arrowload.datagen import write_lake
from arrowload.order import EpochOrder, Segment, free_ranges, lane, resume_ranges
from _support import CountingLocalFileSystem

KINDS = ("none", "block", "global")


# ---------------------------------------------------------------------------
# the arithmetic, against a naive simulation of the rule


def naive_lanes(total: int, plan: list[tuple[int, int]], bs: int, drop_last: bool):
    """``plan``: (world, rows each rank yields) per segment, the last one read to its end
    (its count ignored). Positions each rank of each segment reads, as Python lists."""
    free = list(range(total))
    out = []
    for i, (world, c) in enumerate(plan):
        per = len(free) // world
        rows = per // bs * bs if drop_last else per
        lanes = [free[r * per:r * per + rows] for r in range(world)]
        last = i == len(plan) - 1
        read = [ln if last else ln[:c] for ln in lanes]
        out.append(read)
        used = {p for ln in read for p in ln}
        free = [p for p in free if p not in used]
    return out


def _ranges_list(ranges) -> list[int]:
    return [p for a, b in ranges for p in range(a, b)]


@st.composite
def elastic_plans(draw):
    total = draw(st.integers(0, 400))
    bs = draw(st.integers(1, 40))
    drop_last = draw(st.booleans())
    plan = []
    free = total
    for _ in range(draw(st.integers(1, 4))):
        world = draw(st.integers(1, 6))
        per = free // world
        rows = per // bs * bs if drop_last else per
        # a position its ranks reach together: whole batches, or the end of the lanes
        c = draw(st.sampled_from(sorted({min(rows, k * bs) for k in range(-(-rows // bs) + 1)})))
        plan.append((world, c))
        free -= world * c
    return total, bs, drop_last, plan


@settings(max_examples=300, deadline=None)
@given(case=elastic_plans(), kind=st.sampled_from(KINDS), seed=st.integers(0, 2 ** 32 - 1))
def test_lanes_are_the_rule_and_an_epoch_reads_each_row_at_most_once(case, kind, seed):
    total, bs, drop_last, plan = case
    expected = naive_lanes(total, plan, bs, drop_last)
    segments = [Segment(w, c) for w, c in plan[:-1]]
    world, position = plan[-1]
    # every earlier segment's lanes, and the last one's from its position, are the rule's
    for i, (w, c) in enumerate(plan[:-1]):
        free = free_ranges(total, segments[:i], bs, drop_last)
        for r in range(w):
            assert _ranges_list(lane(free, r, w, bs, drop_last))[:c] == expected[i][r]
    rest = [_ranges_list(resume_ranges(total, segments, world, r, position, bs, drop_last))
            for r in range(world)]
    assert rest == [ln[position:] for ln in expected[-1]]
    # over rows: each row of the epoch read at most once, equal shares per rank
    order = EpochOrder((total,) if total else (), kind, seed, 3, window=1)
    rows = order.rows(0, total) if total else np.zeros(0, np.int64)
    counts = Counter(int(rows[p]) for seg in expected[:-1] for ln in seg for p in ln)
    counts.update(int(rows[p]) for ln in rest for p in ln)
    assert max(counts.values(), default=1) == 1
    assert len({len(ln) for ln in rest}) <= 1
    # what is left out: the last segment's remainder and drop_last tails, nothing else
    left = total - sum(counts.values()) - world * position
    assert 0 <= left < world + (world * bs if drop_last else 0)


def test_resuming_at_the_same_world_size_keeps_the_lanes():
    for segments in ((), (Segment(4, 30), Segment(2, 10))):
        free = free_ranges(1_000, segments, 10, False)
        for r in range(3):
            whole = _ranges_list(lane(free, r, 3, 10, False))
            assert _ranges_list(resume_ranges(1_000, segments, 3, r, 20, 10, False)) == whole[20:]


def test_a_lane_is_a_few_contiguous_runs():
    """4 -> 2 at 90%: each new rank reads the rest of two old lanes (plus the remainder):
    three runs at most, never row by row."""
    total, bs = 100_003, 100
    per = total // 4
    c = int(per * 0.9) // bs * bs
    for r in range(2):
        runs = resume_ranges(total, [Segment(4, c)], 2, r, 0, bs, False)
        assert len(runs) <= 3
        assert sum(b - a for a, b in runs) == (total - 4 * c) // 2


# ---------------------------------------------------------------------------
# real loaders, every rank driven from this process

def _table(n: int) -> pa.Table:
    return pa.table({"id": pa.array(np.arange(n), pa.int64())})


def run_segments(build, plan, epoch=0):
    """Every rank of each segment of ``plan`` ((world, batches), the last one's batches
    None: to the end) loads the state of the one before and yields its batches. Returns
    (ids per segment per rank, the states each segment's ranks wrote)."""
    state, seen, states = None, [], []
    for world, k in plan:
        per_rank, docs = [], []
        for rank in range(world):
            loader = build(rank, world)
            loader.set_epoch(epoch)
            if state is not None:
                loader.load_state_dict(state)
            it = iter(loader)
            per_rank.append([b["id"].tolist() for b in itertools.islice(it, k)])
            it.close()
            docs.append(json.loads(json.dumps(loader.state_dict())))
        assert all(d == docs[0] for d in docs), "ranks in step wrote different states"
        state = docs[0]
        seen.append(per_rank)
        states.append(state)
    return seen, states


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(0, 700), bs=st.integers(1, 64), kind=st.sampled_from(KINDS),
       drop_last=st.booleans(), seed=st.integers(0, 1000), data=st.data())
def test_elastic_resume_reads_every_row_no_rank_has_read_exactly_once(n, bs, kind, drop_last, seed, data):
    world = data.draw(st.integers(1, 5), label="W")
    new = data.draw(st.integers(1, 5), label="W'")
    ds = al.dataset(_table(n))

    def build(rank, w):
        return ds.loader(bs, shuffle=kind, seed=seed, rank=rank, world_size=w, drop_last=drop_last,
                         shuffle_window=2)

    full = [[b["id"].tolist() for b in build(r, world)] for r in range(world)]  # epoch 0, uninterrupted
    k = data.draw(st.integers(0, len(full[0])), label="k")
    (old, rest), (state, after) = run_segments(build, [(world, k), (new, None)])
    assert state["world_size"] == world and state["batches"] == k and state["segments"] == []
    assert all(old[r] == full[r][:k] for r in range(world))
    flat_rest = [sum(batches, []) for batches in rest]
    if new == world:  # the same lanes: exactly the uninterrupted batches
        assert rest == [full[r][k:] for r in range(world)]
    assert len({len(x) for x in flat_rest}) == 1, "new ranks got unequal shares"
    everything = [i for batches in old for b in batches for i in b] + sum(flat_rest, [])
    assert len(everything) == len(set(everything)), "a row was read twice"
    left = n - len(everything)
    assert 0 <= left < new + (new * bs if drop_last else 0), (left, new)
    if drop_last:
        assert all(len(b) == bs for batches in rest for b in batches)
    # the state after the resumed epoch names its segments (where the first one read anything)
    assert after["world_size"] == new
    if new != world:
        assert after["segments"] == ([{"world_size": world, "position": state["position"]}]
                                     if state["position"] else [])


def test_set_epoch_and_a_second_iteration_after_an_elastic_resume_are_ordinary_epochs():
    ds = al.dataset(_table(1_003))

    def build(rank, world):
        return ds.loader(10, shuffle="global", seed=3, rank=rank, world_size=world)

    _, states = run_segments(build, [(4, 7), (2, 3)])
    resumed = build(1, 2)
    resumed.load_state_dict(states[0])
    first = [b["id"].tolist() for b in resumed]
    again = [b["id"].tolist() for b in resumed]  # iterating again: the whole epoch, laid out for 2
    fresh = build(1, 2)
    assert again == [b["id"].tolist() for b in fresh] != first
    assert resumed.state_dict()["segments"] == []
    resumed.load_state_dict(states[0])
    resumed.set_epoch(1)
    fresh.set_epoch(1)
    assert [b["id"].tolist() for b in resumed] == [b["id"].tolist() for b in fresh]


def test_a_second_elastic_resume_reads_the_rest_exactly_once():
    """4 -> 2 -> 3 with drop_last: the state carries both earlier segments."""
    n = 1_003
    ds = al.dataset(_table(n))

    def build(rank, world):
        return ds.loader(10, shuffle="block", seed=1, rank=rank, world_size=world, drop_last=True,
                         shuffle_window=2)

    seen, states = run_segments(build, [(4, 20), (2, 5), (3, None)])
    assert states[1]["segments"] == [{"world_size": 4, "position": 200}]
    assert states[2]["segments"] == [{"world_size": 4, "position": 200}, {"world_size": 2, "position": 50}]
    ids = [i for seg in seen for rank in seg for b in rank for i in b]
    assert len(ids) == len(set(ids))
    last = [sum(len(b) for b in rank) for rank in seen[2]]
    assert len(set(last)) == 1
    assert n - len(ids) < 3 + 3 * 10


def test_a_state_saved_after_loading_and_before_iterating_is_the_resumed_one():
    ds = al.dataset(_table(500))
    build = lambda rank, world: ds.loader(16, shuffle="global", rank=rank, world_size=world)  # noqa: E731
    _, (state,) = run_segments(build, [(4, 3)])
    loaders = [build(r, 2) for r in range(2)]
    for loader in loaders:
        loader.load_state_dict(state)
    docs = [loader.state_dict() for loader in loaders]
    assert docs[0] == docs[1]
    assert docs[0]["segments"] == [{"world_size": 4, "position": 48}] and docs[0]["position"] == 0
    assert "this epoch resumed after 4 ranks x 48 rows: rank 1 reads" in loaders[1].explain()
    # and that document resumes the same rows again
    again = build(0, 2)
    again.load_state_dict(docs[0])
    ref = build(0, 2)
    ref.load_state_dict(state)
    assert [b["id"].tolist() for b in again] == [b["id"].tolist() for b in ref]


def test_the_torch_dataset_workers_follow_the_elastic_lane():
    """DataLoader workers cut the resumed lane into batches ``w, w + n, ...``: together
    they yield exactly the loader's own resumed batches."""
    ds = al.dataset(_table(777))
    build = lambda rank, world: ds.loader(16, shuffle="block", shuffle_window=2, rank=rank,  # noqa: E731
                                          world_size=world)
    _, (state,) = run_segments(build, [(3, 4)])
    own = build(1, 2)
    own.load_state_dict(state)
    expected = [b["id"].tolist() for b in own]
    workers = []
    for w in range(3):
        loader = build(1, 2)
        loader.load_state_dict(state)
        workers.append([b["id"].tolist() for b in loader._worker_iter(w, 3)])
    merged = [b for group in itertools.zip_longest(*workers) for b in group if b is not None]
    assert merged == expected


# ---------------------------------------------------------------------------
# reading cost, in bytes (a counting filesystem)


@pytest.fixture(scope="module")
def windows_lake(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("elastic_lake")
    write_lake(path, rows=16_000, shards=4, row_group_size=200, features=2, emb_dim=4)
    return str(path)


@pytest.mark.parametrize("kind", ["none", "block"])
def test_an_elastic_resume_reads_about_what_a_fresh_start_reads(windows_lake, tmp_path, kind):
    """4 -> 2 at 90% of the epoch: bytes read to the first batch are at most twice a fresh
    start's, and the rest of the epoch on both new ranks reads about the unread tenth (a
    whole read of each rank's share would be ~10x)."""
    cache = str(tmp_path / "cache")

    def build(fs, rank, world):
        return al.dataset(windows_lake, filesystem=fs).select("id", "f0").loader(
            100, shuffle=kind, shuffle_window=2, seed=1, rank=rank, world_size=world, io_threads=1,
            prefetch=1, cache_dir=cache)

    fs = CountingLocalFileSystem()
    n = len(build(fs, 0, 4))
    k = int(n * 0.9)
    _, (state,) = run_segments(lambda r, w: build(CountingLocalFileSystem(), r, w), [(4, k)])

    def first_batch(state=None):
        fs = CountingLocalFileSystem()
        loader = build(fs, 0, 2)
        built = fs.stats.bytes_read
        if state is not None:
            loader.load_state_dict(state)
        it = iter(loader)
        next(it)
        it.close()
        return fs.stats.bytes_read - built

    fresh, resumed = first_batch(), first_batch(state)
    assert 0 < resumed <= 2 * fresh, (resumed, fresh)
    whole = rest = 0
    for rank in range(2):
        fs = CountingLocalFileSystem()
        loader = build(fs, rank, 2)
        before = fs.stats.bytes_read
        for _ in loader:
            pass
        whole += fs.stats.bytes_read - before
        fs = CountingLocalFileSystem()
        loader = build(fs, rank, 2)
        loader.load_state_dict(state)
        before = fs.stats.bytes_read
        for _ in loader:
            pass
        rest += fs.stats.bytes_read - before
    assert 0 < rest <= 0.3 * whole, (rest, whole)
