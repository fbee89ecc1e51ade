"""Data mixtures (``al.mix``): the arithmetic against its definition, the loader against
DuckDB's answer for each component's SQL, resume and elastic resume against the
uninterrupted run, and the bytes that component sizes cost through a counting filesystem.

Every component here carries its own name in a ``comp`` column (a literal in its
projection), so a batch says which component each row came from without arrowload's help.
"""

from __future__ import annotations

import collections
import functools
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import arrowload as al
from arrowload.order.mixture import Apportion, Phase, Schedule, floor_sum, quantize, rank_blocks
from arrowload.pipeline.loader import STREAM_READERS

from _support import CountingLocalFileSystem, fresh_python, lake_facts, state_after
from conftest import duck, parquet_scan

COUNTRIES = ("US", "DE", "IN", "BR")


def components(ds, countries=COUNTRIES):
    return {c.lower(): ds.filter(f"country = '{c}'").select("id", "label", comp=f"'{c.lower()}'")
            for c in countries}


def duck_ids(lake: str, where: str) -> set:
    return set(duck(f"SELECT id FROM {parquet_scan(lake)} WHERE {where}").column("id").to_pylist())


def batches(loader) -> list[dict]:
    return [{"id": list(map(int, b["id"])), "comp": list(b["comp"])} for b in loader]


def by_component(bs: list[dict]) -> dict[str, list[int]]:
    out = collections.defaultdict(list)
    for b in bs:
        for i, c in zip(b["id"], b["comp"]):
            out[c].append(i)
    return out


# -- the arithmetic --------------------------------------------------------------------

def test_floor_sum_against_the_sum():
    rng = np.random.default_rng(0)
    for _ in range(300):
        n, m, a, b = (int(x) for x in (rng.integers(0, 60), rng.integers(1, 1 << 40),
                                       rng.integers(0, 1 << 45), rng.integers(0, 1 << 45)))
        assert floor_sum(n, m, a, b) == sum((a * i + b) // m for i in range(n))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(0.0, 10.0), min_size=1, max_size=7).filter(lambda w: sum(w) > 1e-6),
       st.integers(1, 700), st.integers(0, (1 << 62)), st.integers(1, 400))
def test_every_block_holds_floor_or_ceil_of_weight_times_batch(weights, batch, theta, blocks):
    """Per block: each component within +-1 of weight x B (floor or ceil), the block sums to
    B; the closed form of the cumulative counts equals the sum of the blocks; cumulative
    counts stay within 2 + log2(k + 1) / 4 rows of weight x B x k (the documented bound)."""
    q = quantize(weights)
    assert sum(q) == 1 << 32
    ap = Apportion(q, batch, theta % (102_334_155 << 32))
    w = np.array(q, dtype=np.float64) / (1 << 32)
    starts, counts = ap.blocks(0, blocks)
    assert (counts.sum(axis=1) == batch).all()
    assert (np.abs(counts - w * batch) < 1 + 1e-9).all()
    for k in {0, blocks // 2, blocks - 1}:
        assert tuple(starts[k]) == ap.cumulative(k)
    ks = np.arange(1, blocks + 1)[:, None]
    dev = np.abs(starts + counts - w * batch * ks)
    assert (dev <= 2 + np.log2(ks + 1) / 4).all(), dev.max()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 3000), min_size=1, max_size=4), st.data(), st.integers(1, 64))
def test_stopping_rules_end_where_the_definition_says(sizes, data, batch):
    weights = tuple(data.draw(st.floats(0.05, 1.0)) for _ in sizes)
    phase = (Phase(0, weights, (0,) * len(sizes)),)
    first = Schedule(tuple(sizes), phase, batch, 1, 0, "first_exhausted")
    k = first.num_blocks
    assert all(d <= n for d, n in zip(first.stream_index(k), sizes))
    assert any(d > n for d, n in zip(first.stream_index(k + 1), sizes))
    every = Schedule(tuple(sizes), phase, batch, 1, 0, "all_exhausted")
    k = every.num_blocks
    assert all(d >= n for d, n in zip(every.stream_index(k), sizes))
    assert k == 0 or any(d < n for d, n in zip(every.stream_index(k - 1), sizes))


def test_rank_blocks_are_round_robin_and_equal():
    got = [list(rank_blocks(3, 20, 4, r)) for r in range(4)]
    assert got == [[3, 7, 11, 15], [4, 8, 12, 16], [5, 9, 13, 17], [6, 10, 14, 18]]
    assert list(rank_blocks(0, 5, 2, 1)) == [1, 3]


# -- the loader against DuckDB -----------------------------------------------------------

@pytest.fixture(scope="module")
def lake_ds(parquet_lake):
    return parquet_lake, al.dataset(parquet_lake)


@pytest.mark.parametrize("shuffle", [True, "block", False])
def test_batches_hold_the_weights_and_rows_match_duckdb(lake_ds, shuffle):
    lake, ds = lake_ds
    weights = {"us": 0.4, "de": 0.3, "in": 0.2, "br": 0.1}
    m = al.mix(components(ds), weights=weights, stopping="all_exhausted", seed=3)
    loader = m.loader(97, shuffle=shuffle)
    bs = batches(loader)
    assert len(bs) == len(loader) > 0
    for b in bs:
        n = collections.Counter(b["comp"])
        for name, w in weights.items():
            assert abs(n[name] - w * 97) <= 1, (n, name)
    drawn = by_component(bs)
    for name, ids in drawn.items():
        truth = duck_ids(lake, f"country = '{name.upper()}'")
        assert set(ids) == truth  # every component finished its first pass (all_exhausted)
        q, r = divmod(len(ids), len(truth))
        times = collections.Counter(collections.Counter(ids).values())
        # each pass is a permutation: every row q or q + 1 times, r rows q + 1 times
        assert times == ({q: len(truth) - r, q + 1: r} if r else {q: len(truth)})
    passes = loader.passes()
    assert all(p >= 1 for p in passes) and min(passes) == pytest.approx(1.0, abs=0.1)


def test_first_exhausted_never_repeats_a_row(lake_ds):
    lake, ds = lake_ds
    m = al.mix(components(ds), weights=[1, 1, 1, 1], seed=1)
    bs = batches(m.loader(64, shuffle=True))
    drawn = by_component(bs)
    for name, ids in drawn.items():
        assert len(ids) == len(set(ids))
        assert set(ids) <= duck_ids(lake, f"country = '{name.upper()}'")
    smallest = min(COUNTRIES, key=lambda c: len(duck_ids(lake, f"country = '{c}'"))).lower()
    assert len(drawn[smallest]) > len(duck_ids(lake, f"country = '{smallest.upper()}'")) - 64


def test_rows_several_components_select_are_drawn_in_each(lake_ds):
    lake, ds = lake_ds
    comps = {"us": ds.filter("country = 'US'").select("id", "label", comp="'us'"),
             "pos": ds.filter("label = 1").select("id", "label", comp="'pos'")}
    bs = batches(al.mix(comps, stopping="all_exhausted").loader(50, shuffle=True))
    drawn = by_component(bs)
    us, pos = duck_ids(lake, "country = 'US'"), duck_ids(lake, "label = 1")
    assert set(drawn["us"]) == us and set(drawn["pos"]) == pos
    both = us & pos
    assert both and both <= set(drawn["us"]) & set(drawn["pos"])


def test_weights_from_a_sql_query_and_from_temperature(lake_ds):
    lake, ds = lake_ds
    where = "country IN ('US', 'DE', 'IN', 'BR')"
    q = al.sql(f"SELECT lower(country) AS component, count(*) AS weight FROM t WHERE {where} GROUP BY 1", t=ds)
    m = al.mix(components(ds), weights=q)
    truth = {r["c"]: r["n"] for r in duck(f"SELECT lower(country) AS c, count(*) AS n FROM {parquet_scan(lake)} "
                                          f"WHERE {where} GROUP BY 1").to_pylist()}
    total = sum(truth.values())
    assert m.weights == pytest.approx(tuple(truth[n] / total for n in m.names))
    t = al.mix(components(ds), temperature=2.0)
    roots = {n: math.sqrt(truth[n]) for n in t.names}
    assert t.weights == pytest.approx(tuple(roots[n] / sum(roots.values()) for n in t.names))
    assert t.sizes() == tuple(truth[n] for n in t.names)
    cold = al.mix(components(ds), temperature=0.01)  # size ** 100 overflowed a float
    logs = {n: math.log(truth[n]) / 0.01 for n in cold.names}
    top = max(logs.values())
    scaled = {n: math.exp(v - top) for n, v in logs.items()}
    assert cold.weights == pytest.approx(tuple(scaled[n] / sum(scaled.values()) for n in cold.names), rel=1e-9)


def test_component_sizes_read_only_the_filter_columns(parquet_lake):
    facts = lake_facts(parquet_lake)
    fs = CountingLocalFileSystem()
    ds = al.dataset(parquet_lake, filesystem=fs)
    ds.schema  # footers read
    fs.reset()
    m = al.mix(components(ds), temperature=1.0)  # temperature needs the sizes: counted here
    sizes = m.sizes()
    country_bytes = sum(f.chunk_bytes({"country"}, range(f.num_row_groups)) for f in facts.values())
    # each component counts its rows reading the country column alone (once per component)
    assert 0 < fs.stats.bytes_read <= len(COUNTRIES) * country_bytes, (fs.stats.bytes_read, country_bytes)
    spans = {p: f.chunk_spans({"country"}) for p, f in facts.items()}
    for r in fs.stats.reads:
        assert any(a <= r.offset and r.offset + r.nbytes <= b for a, b in spans[r.path]), r
    assert sizes == tuple(len(duck_ids(parquet_lake, f"country = '{c}'")) for c in COUNTRIES)
    fs.reset()
    assert al.mix(components(ds), temperature=1.0).sizes() == sizes
    assert fs.stats.bytes_read == 0  # the selection index, cached by snapshot


# -- resume, ranks, elastic, reweighting -----------------------------------------------------

def _memory_mix(stopping="first_exhausted", seed=0, weights=(0.5, 0.3, 0.2), n=3000):
    ids = np.arange(n)
    t = pa.table({"id": ids, "src": np.array(["a", "b", "c"])[(ids * 7) % 3]})
    ds = al.dataset(t)
    comps = {s: ds.filter(f"src = '{s}'").select("id", comp=f"'{s}'") for s in "abc"}
    return al.mix(comps, weights=dict(zip("abc", weights)), seed=seed, stopping=stopping)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["first_exhausted", "all_exhausted"]), st.sampled_from([True, "block", False]),
       st.integers(1, 90), st.integers(0, 40), st.integers(0, 3))
def test_resume_at_any_point_equals_the_uninterrupted_run(stopping, shuffle, batch, at, epoch):
    m = _memory_mix(stopping)
    full = m.loader(batch, shuffle=shuffle)
    full.set_epoch(epoch)
    want = batches(full)
    k = min(at, len(want))
    first = m.loader(batch, shuffle=shuffle)
    first.set_epoch(epoch)
    it = iter(first)
    got = [next(it) for _ in range(k)]
    assert [list(map(int, b["id"])) for b in got] == [b["id"] for b in want[:k]]
    state = first.state_dict()
    again = m.loader(batch, shuffle=shuffle)
    again.load_state_dict(state)
    assert batches(again) == want[k:]


def test_ranks_are_disjoint_equal_and_round_robin():
    m = _memory_mix("all_exhausted")
    one = batches(m.loader(40, shuffle=True))
    ranks = [batches(m.loader(40, shuffle=True, rank=r, world_size=3)) for r in range(3)]
    assert len({len(r) for r in ranks}) == 1 and len(ranks[0]) == len(one) // 3
    for r, got in enumerate(ranks):
        assert got == one[r::3][:len(got)]
    per_comp = [by_component(r) for r in ranks]
    for name in "abc":  # first pass rows: disjoint across ranks
        n = len({i for r in per_comp for i in r[name]})
        assert n <= sum(len(r[name]) for r in per_comp)


@pytest.mark.parametrize("old,new", [(4, 2), (2, 3), (3, 3)])
def test_elastic_resume_reads_every_remaining_batch_once(old, new):
    m = _memory_mix("all_exhausted")
    one = batches(m.loader(30, shuffle=True))
    loaders = [m.loader(30, shuffle=True, rank=r, world_size=old) for r in range(old)]
    its = [iter(ld) for ld in loaders]
    steps = 5
    for it in its:
        for _ in range(steps):
            next(it)
    states = [ld.state_dict() for ld in loaders]
    assert all(s == states[0] for s in states)  # one global state
    rest = []
    for r in range(new):
        ld = m.loader(30, shuffle=True, rank=r, world_size=new)
        ld.load_state_dict(states[0])
        rest.append(batches(ld))
    done = steps * old
    left = (len(one) - done) // new
    assert all(len(r) == left for r in rest)
    for r in range(new):
        assert rest[r] == one[done + r::new][:left]


def test_reweighting_on_resume_repeats_no_row_of_the_pass():
    m = _memory_mix("first_exhausted", weights=(0.6, 0.2, 0.2))
    ld = m.loader(50, shuffle=True)
    it = iter(ld)
    before = [next(it) for _ in range(8)]
    before = [{"id": list(map(int, b["id"])), "comp": list(b["comp"])} for b in before]
    state = ld.state_dict()
    again = m.loader(50, shuffle=True)
    again.load_state_dict(state, weights={"a": 0.1, "b": 0.45, "c": 0.45})
    after = batches(again)
    assert after
    for b in after:
        n = collections.Counter(b["comp"])
        assert abs(n["a"] - 5) <= 1 and abs(n["b"] - 22.5) <= 1 and abs(n["c"] - 22.5) <= 1
    drawn = by_component(before + after)
    for name, ids in drawn.items():
        assert len(ids) == len(set(ids)), name  # first_exhausted: one pass, no row twice
    # the state taken after reweighting resumes too
    s2 = again.state_dict()
    assert len(s2["phases"]) == 2 and s2["phases"][1]["start"] == 8


def test_reweighting_where_a_component_just_finished_its_pass_goes_on_without_it():
    """A state taken right after component ``a`` drew its last row, reloaded with other
    weights (even ones that still give ``a`` a little): the epoch goes on while ``a`` draws
    nothing and ends before its first row of a second pass, as first_exhausted says. It
    ended at once, dropping the rest of ``b``'s pass."""
    t = pa.table({"id": np.arange(3000), "c": np.where(np.arange(3000) < 40, "a", "b")})
    d = al.dataset(t)
    comps = {"a": d.filter("c = 'a'"), "b": d.filter("c = 'b'")}
    m = al.mix(comps, weights={"a": 0.03, "b": 0.97}, seed=0)
    full = [list(b["c"]) for b in m.loader(10)]
    k = int(np.argmax(np.cumsum([b.count("a") for b in full]) == 40)) + 1  # a's pass done after k
    ld = m.loader(10)
    it = iter(ld)
    for _ in range(k):
        next(it)
    state = ld.state_dict()
    assert state["drawn"][0] == 40
    new = {"a": 0.002, "b": 0.998}
    again = m.loader(10)
    again.load_state_dict(state, weights=new)
    rest = [list(b["c"]) for b in again]
    # truth: the same phase in an endless (cycle) mixture, cut where a draws its 41st row
    endless = al.mix(comps, weights={"a": 0.03, "b": 0.97}, seed=0, stopping="cycle")
    c = endless.loader(10, steps=10_000)
    cit = iter(c)
    for _ in range(k):
        next(cit)
    cycled = endless.loader(10, steps=10_000)
    cycled.load_state_dict(c.state_dict(), weights=new)
    want = []
    for b in cycled:
        b = list(b["c"])
        if "a" in b:
            break
        want.append(b)
    assert len(want) > 0 and rest == want
    assert len(again) == k + len(rest)  # the reweighted epoch: its batches before and after


@pytest.mark.parametrize("shuffle", ["none", "block", "global"])
def test_torch_dataloader_workers_give_the_mixture_loaders_batches(tmp_path, shuffle):
    """``DataLoader(mixture_loader.torch_dataset(), num_workers=2)`` with spawned workers,
    kept across epochs: the loader's own batches in its order (each worker builds the
    loader again and makes every second batch), epoch after epoch as set_epoch says, and a
    resumed loader's rest. Mixture loaders had no torch_dataset."""
    import torch
    from torch.utils.data import DataLoader
    ids = np.arange(6000)
    pq.write_table(pa.table({"id": ids, "src": np.array(["a", "b", "c"])[(ids * 7) % 3]}),
                   str(tmp_path / "lake.parquet"), row_group_size=500)
    ds = al.dataset(str(tmp_path / "lake.parquet"))
    m = al.mix({s: ds.filter(f"src = '{s}'").select("id") for s in "abc"}, weights={"a": 0.5, "b": 0.3, "c": 0.2},
               seed=3)

    def build():
        return m.loader(100, shuffle=shuffle, output="torch", cache_dir=str(tmp_path / "cache"))
    own = {}
    for epoch in (0, 1):
        ref = build()
        ref.set_epoch(epoch)
        own[epoch] = [b["id"].clone() for b in ref]
    loader = build()
    workers = DataLoader(loader.torch_dataset(), batch_size=None, num_workers=2, persistent_workers=True,
                         multiprocessing_context="spawn")
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        via = [b["id"] for b in workers]
        assert len(via) == len(own[epoch]) and all(torch.equal(a, b) for a, b in zip(own[epoch], via)), epoch
    resumed = build()
    resumed.load_state_dict(state_after(build(), 5))
    rest = [b["id"] for b in DataLoader(resumed.torch_dataset(), batch_size=None, num_workers=2,
                                        multiprocessing_context="spawn")]
    assert all(torch.equal(a, b) for a, b in zip(own[0][5:], rest)) and len(rest) == len(own[0]) - 5
    # a checkpoint after k of the DataLoader's batches (its workers do not move the loader):
    # the state of the loader iterated 5 + k batches here
    assert resumed.state_dict(dataloader_batches=7) == state_after(build(), 12)
    assert resumed.state_dict(dataloader_batches=len(rest)) == state_after(build(), len(own[0]))
    with pytest.raises(al.InvalidArgumentError, match="dataloader_batches"):
        resumed.state_dict(dataloader_batches=len(rest) + 1)
    # a later pass over the resumed epoch is the whole epoch (its workers started at the
    # loaded position again), and its checkpoints count from the epoch's start
    again = [b["id"] for b in DataLoader(resumed.torch_dataset(), batch_size=None, num_workers=2,
                                         multiprocessing_context="spawn")]
    assert len(again) == len(own[0]) and all(torch.equal(a, b) for a, b in zip(own[0], again))
    assert resumed.state_dict(dataloader_batches=7) == state_after(build(), 7)


def test_cycle_runs_steps_and_counts_passes():
    m = _memory_mix("cycle", weights=(0.8, 0.1, 0.1), n=300)
    with pytest.raises(al.UnsupportedError):
        len(m)
    with pytest.raises(al.UnsupportedError):
        len(m.loader(20))
    ld = m.loader(20, shuffle=True, steps=30)
    assert len(ld) == 30
    bs = batches(ld)
    assert len(bs) == 30
    a = by_component(bs)["a"]
    assert len(a) == 480 and len(set(a)) == 100  # 4.8 passes over 100 rows
    assert collections.Counter(collections.Counter(a).values()) == {4: 20, 5: 80}
    with pytest.raises(al.InvalidArgumentError, match="steps"):
        _memory_mix().loader(20, steps=3)


@pytest.mark.parametrize("shuffle", [True, "block", False])
def test_a_one_row_component_keeps_read_tasks_short_and_rows_exact(lake_ds, shuffle):
    """A one-row component drawn several times a batch: a read task sized by bytes alone
    spanned 1,024 batches, about 7,000 passes of it, each its own order and reads, so the
    first batch and every resume waited seconds (51 s in one review run). Tasks now span
    at most TASK_PASSES passes of any component; the rows stay those of the schedule."""
    from arrowload.mixture.loader import TASK_PASSES
    lake, ds = lake_ds
    one = duck_ids(lake, "country = 'US'")
    target = min(one)
    comps = {"us": ds.filter(f"country = 'US' AND id <> {target}").select("id", comp="'us'"),
             "one": ds.filter(f"id = {target}").select("id", comp="'one'")}
    m = al.mix(comps, weights={"us": 8, "one": 1}, stopping="cycle", seed=2)
    loader = m.loader(64, shuffle=shuffle, steps=300)
    tasks = list(loader._tasks(range(300)))
    w = 1 / 9
    assert sum(t.stop - t.first for t in tasks) == 300
    assert all((t.stop - t.first) * 64 * w <= TASK_PASSES + 1 for t in tasks), [t.stop - t.first for t in tasks]
    bs = batches(loader)
    assert len(bs) == 300
    for b in bs:
        n = collections.Counter(b["comp"])
        assert abs(n["one"] - 64 * w) <= 1 and {i for i, c in zip(b["id"], b["comp"]) if c == "one"} == {target}
    resumed = m.loader(64, shuffle=shuffle, steps=300)
    it = iter(resumed)
    for _ in range(123):
        next(it)
    state = resumed.state_dict()
    again = m.loader(64, shuffle=shuffle, steps=300)
    again.load_state_dict(state)
    assert batches(again) == bs[123:]


@pytest.mark.parametrize("shuffle", [True, "block", False])
def test_profile_profiling_and_progress_as_a_single_loaders(shuffle):
    """A mixture loader profiles as a loader does: the whole epoch's batches and rows
    counted (truth: an uninterrupted run's), the loader left where it was (a loaded,
    reweighted state resumes to the same batches), the real loop recorded by
    ``profiling()`` and ``progress()`` giving ``iter()``'s batches."""
    m = _memory_mix()
    want = batches(m.loader(64, shuffle=shuffle))
    ld = m.loader(64, shuffle=shuffle)
    it = iter(ld)
    for _ in range(7):
        next(it)
    state = ld.state_dict()
    it.close()
    ld.load_state_dict(state, weights={"a": 0.2, "b": 0.2, "c": 0.6})
    fresh = m.loader(64, shuffle=shuffle)
    fresh.load_state_dict(state, weights={"a": 0.2, "b": 0.2, "c": 0.6})
    rest = batches(fresh)
    p = ld.profile()
    assert (p.batches, p.rows) == (len(rest), sum(len(b["id"]) for b in rest))
    assert p.shuffle == ld.shuffle_kind == ("global" if shuffle is True else "block" if shuffle else "none")
    assert batches(ld) == rest  # where it was: the loaded state, its weights
    later = batches(fresh)  # the next epoch, at the loaded weights
    assert ld.profile(3).batches == 3 and batches(ld) == later
    with ld.profiling() as run:
        got = [dict(b) for b in ld]
    assert run.profile.batches == len(later) and run.profile.rows == sum(len(b["id"]) for b in later)
    assert [list(map(int, b["id"])) for b in got] == [b["id"] for b in later]
    assert [list(map(int, b["id"])) for b in ld.progress(enabled=False)] == [b["id"] for b in later]
    assert batches(m.loader(64, shuffle=shuffle)) == want
    endless = _memory_mix("cycle").loader(64, shuffle=shuffle)
    assert endless.profile(5).batches == 5
    with pytest.raises(al.UnsupportedError, match="n_batches"):
        endless.profile()


def test_refusals_name_what_differs():
    m = _memory_mix()
    ld = m.loader(40, shuffle=True)
    state = ld.state_dict()
    with pytest.raises(al.StateMismatchError, match="batch_size"):
        m.loader(41, shuffle=True).load_state_dict(state)
    with pytest.raises(al.StateMismatchError, match="drawn"):
        m.loader(40, shuffle=True).load_state_dict({**state, "drawn": [1, 2, 3]})
    with pytest.raises(al.InvalidArgumentError, match="no component named"):
        m.with_weights({"a": 1, "zz": 2})
    t = al.dataset(pa.table({"id": [1, 2]}))
    with pytest.raises(al.SchemaMismatchError):
        al.mix({"x": t, "y": t.select(id="CAST(id AS DOUBLE)")})
    with pytest.raises(al.InvalidArgumentError, match="not both"):
        al.mix({"x": t}, weights={"x": 1}, temperature=1.0)


def test_repr_html_and_explain():
    m = _memory_mix()
    assert "3 components" in repr(m)
    html = m._repr_html_()
    assert "passes / epoch" in html and "<table" in html
    text = m.explain()
    assert "component" in text and "overlap" in text
    ld = m.loader(40, shuffle=True)
    assert "round-robin" in ld.explain()


@pytest.mark.parametrize("shuffle", [True, "block", False])
def test_host_arrays_path_gives_the_arrow_paths_batches(shuffle):
    """Numeric columns are converted on the reader threads and scattered to their places
    (one copy per component); output="arrow" takes Arrow's path: the same rows, in order."""
    ids = np.arange(4000)
    t = pa.table({"id": ids, "k": (ids * 7) % 3, "v": ids.astype(np.float32) / 3})
    ds = al.dataset(t)
    m = al.mix({str(k): ds.filter(f"k = {k}") for k in range(3)}, weights=[0.2, 0.5, 0.3],
               stopping="all_exhausted", seed=5)
    host = list(m.loader(77, shuffle=shuffle))
    arrow = list(m.loader(77, shuffle=shuffle, output="arrow"))
    assert len(host) == len(arrow) > 0
    for h, a in zip(host, arrow):
        assert isinstance(h["id"], np.ndarray)
        np.testing.assert_array_equal(h["id"], a.column("id").to_numpy())
        np.testing.assert_array_equal(h["v"], a.column("v").to_numpy())
        np.testing.assert_array_equal(h["k"], a.column("k").to_numpy())
        n = collections.Counter(h["k"].tolist())
        assert all(abs(n[k] - w * 77) <= 1 for k, w in enumerate((0.2, 0.5, 0.3)))
    ks = np.concatenate([h["k"] for h in host])
    got = np.concatenate([h["id"] for h in host])
    for k in range(3):  # all_exhausted: every row of each component drawn
        assert set(got[ks == k].tolist()) == set(ids[(ids * 7) % 3 == k].tolist())


# -- one lake, read once: components share each unit's decode (mixture.shared) ------------------

SHARED = ("US", "DE", "IN")


def _shared_mix(lake, cache, fs=None, separate=False):
    """The three countries of ``lake`` (weights proportional to their sizes); ``separate``:
    each component over its own ``al.dataset`` (other source objects: nothing shared)."""
    opened = al.dataset(lake, filesystem=fs)
    comps = {c.lower(): (al.dataset(lake) if separate else opened).filter(f"country = '{c}'")
             .select("id", "label", comp=f"'{c.lower()}'") for c in SHARED}
    return al.mix(comps, temperature=1.0, seed=2, cache_dir=cache)


@pytest.mark.parametrize("shuffle,prefetch", [("global", None), ("block", None), (False, None),
                                              ("global", 1 << 16), (False, 1 << 16)])
def test_components_over_one_lake_read_each_unit_once(parquet_lake, tmp_path, shuffle, prefetch):
    # a small prefetch makes tasks of a batch or two: a unit's rows then span many tasks, whose
    # warm-ups must not decode again a unit every member already took. (Not for block: there
    # a cache of prefetch / 4 = 16 KiB cannot hold a window's units until every member took
    # them, and members decode again by design, bounded memory first.)
    facts = lake_facts(parquet_lake)
    fs = CountingLocalFileSystem()
    m = _shared_mix(parquet_lake, str(tmp_path), fs)
    sizes = m.sizes()  # counted once (the selection index), not part of the epoch
    fs.reset()
    more = {"prefetch": prefetch} if prefetch else {}
    loader = m.loader(64, shuffle=shuffle, cache_dir=str(tmp_path), **more)
    bs = batches(loader)
    needed = {"country", "id", "label"}
    spans = {p: f.chunk_spans(needed) for p, f in facts.items()}
    per_span = collections.Counter()
    for r in fs.stats.reads:
        hit = [s for s in spans[r.path] if s[0] <= r.offset and r.offset + r.nbytes <= s[1]]
        assert hit, r  # only the columns the components need
        per_span[(r.path, hit[0])] += r.nbytes
    # every column chunk read once per epoch, not once per component
    assert per_span and all(n <= b - a for (_, (a, b)), n in per_span.items()), per_span
    assert sum(per_span.values()) <= sum(f.chunk_bytes(needed) for f in facts.values())
    drawn = by_component(bs)
    for c, n in zip(SHARED, sizes):
        truth = duck_ids(parquet_lake, f"country = '{c}'")
        ids = drawn[c.lower()]
        assert len(ids) == len(set(ids)) and set(ids) <= truth and len(truth) == n
        assert len(ids) >= n - 64  # first_exhausted, weights proportional to the sizes: nearly all
    # the same batches as components that share nothing (each over its own dataset)
    alone = _shared_mix(parquet_lake, str(tmp_path), separate=True).loader(64, shuffle=shuffle,
                                                                            cache_dir=str(tmp_path), **more)
    assert not alone._shared.members and loader._shared.members
    assert batches(alone) == bs


def test_shared_unit_cache_counts_in_the_byte_budget(parquet_lake, tmp_path):
    prefetch = 1 << 20
    loader = _shared_mix(parquet_lake, str(tmp_path)).loader(64, shuffle="block", prefetch=prefetch,
                                                             cache_dir=str(tmp_path))
    rows = sum(len(b["id"]) for b in loader)
    cache = next(c for c in loader._shared.caches if c is not None)
    unit = max(t.nbytes for g in loader._shared.groups if g is not None
               for t in g.split(0).values()) * len(SHARED)
    assert rows > 0 and 0 < cache.peak <= prefetch // 4 + unit
    assert loader.stats().peak_prefetch_bytes >= cache.peak


@pytest.mark.parametrize("shuffle,loads", [(True, False), (False, True), ("block", False)])
def test_states_of_the_previous_mixture_order_load_where_the_order_is_unchanged(shuffle, loads):
    m = _memory_mix()
    ld = m.loader(40, shuffle=shuffle)
    it = iter(ld)
    next(it)
    # order 3: permute() rounded its bits up to an even number (global rows, block units)
    state = {**ld.state_dict(), "order": 3}
    again = m.loader(40, shuffle=shuffle)
    if loads:
        again.load_state_dict(state)
        assert batches(again) == batches(_resumed(m, shuffle, ld.state_dict()))
    else:
        with pytest.raises(al.StateMismatchError, match="order"):
            again.load_state_dict(state)


def _resumed(m, shuffle, state):
    ld = m.loader(40, shuffle=shuffle)
    ld.load_state_dict(state)
    return ld


@pytest.mark.parametrize("shuffle", ["global", "block", False])
def test_shared_decode_without_a_common_sql_filter_keeps_every_component_row(parquet_lake, tmp_path, shuffle):
    """A pyarrow-expression filter and a component without a filter: the shared decode keeps
    every row (no OR to filter by); each component still gets exactly its own rows."""
    import pyarrow.compute as pc
    ds = al.dataset(parquet_lake)
    comps = {"us": ds.filter(pc.field("country") == "US").select("id", "label", comp="'us'"),
             "pos": ds.filter("label = 1").select("id", "label", comp="'pos'"),
             "all": ds.select("id", "label", comp="'all'")}
    m = al.mix(comps, weights=[1, 1, 1], stopping="all_exhausted", cache_dir=str(tmp_path))
    loader = m.loader(50, shuffle=shuffle, cache_dir=str(tmp_path))
    assert len(loader._shared.members) == 1
    drawn = by_component(batches(loader))
    assert set(drawn["us"]) == duck_ids(parquet_lake, "country = 'US'")
    assert set(drawn["pos"]) == duck_ids(parquet_lake, "label = 1")
    assert set(drawn["all"]) == duck_ids(parquet_lake, "true")


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 1500), st.lists(st.integers(0, (1 << 64) - 1), max_size=6), st.integers(0, 5))
def test_interleaves_are_the_blocks_interleaves(n, keys, epoch):
    from arrowload.order.permutation import shuffled_range, shuffled_ranges
    got = shuffled_ranges(n, keys)
    assert got.shape == (len(keys), n)
    for row, k in zip(got, keys):
        np.testing.assert_array_equal(row, shuffled_range(n, k))
    s = Schedule((10, 20), (Phase(0, (0.5, 0.5), (0, 0)),), max(1, n % 97), 3, epoch)
    blocks = [b * 7 for b in range(len(keys) + 1)]
    np.testing.assert_array_equal(s.interleaves(blocks), np.array([s.interleave(b) for b in blocks]))


# -- a global mixture's tables built from one polars stream over the union (mixture.shared) ----


def _stream_calls(monkeypatch, fail: bool = False) -> list:
    """Count ``StreamQuery.batches`` calls; ``fail``: the query raises after its first batch."""
    from arrowload.scan.stream import StreamQuery
    calls, orig = [], StreamQuery.batches

    def batches(self, *a, **k):
        calls.append(a)
        it = orig(self, *a, **k)
        if not fail:
            return it

        def broken():
            yield next(it)
            raise RuntimeError("the query failed")
        return broken()

    monkeypatch.setattr(StreamQuery, "batches", batches)
    return calls


def _overlapping_mix(lake, cache):
    ds = al.dataset(lake)
    comps = {"us": ds.filter("country = 'US'").select("id", "label", comp="'us'"),
             "pos": ds.filter("label = 1 AND id % 3 <> 0").select("id", "label", comp="'pos'"),
             "de": ds.filter("country = 'DE' AND label = 0").select("id", "label", comp="'de'")}
    return al.mix(comps, weights=[2, 1, 1], stopping="all_exhausted", seed=4, cache_dir=cache)


@pytest.mark.parametrize("make", [_shared_mix, _overlapping_mix])
def test_global_tables_from_the_union_stream_equal_the_per_unit_build(parquet_lake, tmp_path, monkeypatch, make):
    """One polars query over the union of the components' reads, each batch split among them
    as a shared unit is: the same epoch as the per-unit build (``ARROWLOAD_STREAM=0``), rows
    several components select drawn in each, and every component's rows DuckDB's."""
    from arrowload.pipeline import rabuild
    calls = _stream_calls(monkeypatch)
    per_unit = []
    build_many = rabuild.build_many
    monkeypatch.setattr(rabuild, "build_many", lambda *a, **k: per_unit.append(1) or build_many(*a, **k))
    monkeypatch.setenv("ARROWLOAD_STREAM", "1")
    streamed = batches(make(parquet_lake, str(tmp_path / "a")).loader(64, shuffle="global",
                                                                      cache_dir=str(tmp_path / "a")))
    assert len(calls) == 1 and not per_unit  # built from the stream, not read again per unit
    monkeypatch.setenv("ARROWLOAD_STREAM", "0")
    units = batches(make(parquet_lake, str(tmp_path / "b")).loader(64, shuffle="global",
                                                                   cache_dir=str(tmp_path / "b")))
    assert len(calls) == 1 and per_unit and streamed == units
    drawn = by_component(streamed)
    if make is _overlapping_mix:  # all_exhausted: every row of every component at least once
        assert set(drawn["us"]) == duck_ids(parquet_lake, "country = 'US'")
        assert set(drawn["pos"]) == duck_ids(parquet_lake, "label = 1 AND id % 3 <> 0")
        assert set(drawn["de"]) == duck_ids(parquet_lake, "country = 'DE' AND label = 0")


PLAIN = ["id", "label", "score", "emb", "text", "price", "ts", "f0", "f1"]


def _lake_columns_mix(lake, cache):
    """Components that keep the lake's own columns (no computed column): a shared build
    takes their rows from the union's batches by position. Rows with ``label = 1`` of the
    US and DE are in two components."""
    ds = al.dataset(lake)
    comps = {"us": ds.filter("country = 'US'").select(*PLAIN),
             "pos": ds.filter("label = 1 AND id % 3 <> 0").select(*PLAIN),
             "de": ds.filter("country = 'DE'").select(*PLAIN)}
    return al.mix(comps, weights=[2, 1, 1], stopping="all_exhausted", seed=4, cache_dir=cache)


@pytest.mark.parametrize("output,stack", [("arrow", None), ("arrow", {"x": ["f0", "f1"]}),
                                          ("numpy", {"x": ["f0", "f1"]})])
def test_global_tables_of_plain_components_from_the_union_stream(parquet_lake, tmp_path, monkeypatch, output,
                                                                 stack):
    """Components that keep the lake's columns are written into the shared table straight
    from the union stream's batches, by position (``rabuild.Picked``): nulls, a fixed-size
    list, strings, a decimal, a timestamp, a ``stack=`` group, rows two components share.
    The epoch equals the per-unit build's (``ARROWLOAD_STREAM=0``), every row's values are
    the lake's (pyarrow's read), and every row of every component is drawn. (The table
    holds a ``stack=`` group stacked where the output is not Arrow.)"""
    from arrowload.pipeline import rabuild
    calls = _stream_calls(monkeypatch)
    picked = []
    put_picked = rabuild._put_picked
    monkeypatch.setattr(rabuild, "_put_picked", lambda *a: picked.append(1) or put_picked(*a))

    def epoch(env: str, cache: str) -> list:
        monkeypatch.setenv("ARROWLOAD_STREAM", env)
        # stacked, every numeric column becomes a host array first: score's nulls filled
        fill = {"score": -1.0} if stack else None
        loader = _lake_columns_mix(parquet_lake, cache).loader(64, shuffle="global", output=output, stack=stack,
                                                               fill_null=fill, cache_dir=cache)
        if output == "arrow":
            return list(loader)
        return [_host_batch({k: (list(v) if k == "price" else v) for k, v in b.items()}) for b in loader]

    streamed = epoch("1", str(tmp_path / "a"))
    assert len(calls) == 1 and picked  # built from the stream, by position
    units = epoch("0", str(tmp_path / "b"))
    assert len(streamed) == len(units)
    for a, b in zip(streamed, units):
        assert a.equals(b)
    got = pa.Table.from_batches(streamed)
    lake = pq.read_table(parquet_lake, columns=PLAIN)
    truth = {row["id"]: row for row in lake.to_pylist()}
    rows = got.to_pylist()
    for row in rows:
        want = truth[row["id"]]
        if stack is None:
            assert row == want
        else:
            assert row["x"] == [want["f0"], want["f1"]]
            want = {**want, "score": -1.0 if want["score"] is None else want["score"]}
            assert {k: v for k, v in row.items() if k != "x"} == \
                {k: v for k, v in want.items() if k not in ("f0", "f1")}
    drawn = {row["id"] for row in rows}
    for where in ("country = 'US'", "label = 1 AND id % 3 <> 0", "country = 'DE'"):
        assert duck_ids(parquet_lake, where) <= drawn


def test_global_tables_fall_back_to_units_when_the_union_stream_fails(parquet_lake, tmp_path, monkeypatch):
    monkeypatch.setenv("ARROWLOAD_STREAM", "0")
    want = batches(_shared_mix(parquet_lake, str(tmp_path / "a")).loader(64, shuffle="global",
                                                                         cache_dir=str(tmp_path / "a")))
    calls = _stream_calls(monkeypatch, fail=True)
    monkeypatch.setenv("ARROWLOAD_STREAM", "1")
    got = batches(_shared_mix(parquet_lake, str(tmp_path / "b")).loader(64, shuffle="global",
                                                                        cache_dir=str(tmp_path / "b")))
    assert len(calls) == 1 and got == want


# -- an unshuffled mixture over one lake from one polars stream (mixture.stream) ------------

@pytest.mark.parametrize("one_take", [True, False], ids=["one-take", "per-move"])
@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_gather_puts_every_row_at_its_place(one_take, data):
    """``mixture.stream.gather`` against the components' rows concatenated and taken by
    numpy: parts picking rows by position from shared stream chunks and whole chunks, a
    1-D column, a row-major ``[n, 3]`` column and one whose dtype differs between chunks,
    through the one-take path (chunks laid end to end, one take a column) and the per-move
    path (a take and a scatter per chunk)."""
    from arrowload.mixture import stream as mixstream
    from arrowload.pipeline.chunks import HostChunk
    from arrowload.pipeline.collate import BufferPool

    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    hosts = []
    for h in range(data.draw(st.integers(1, 3))):
        r = data.draw(st.integers(1, 40))
        cols = {"a": rng.random(r, dtype=np.float32), "x": rng.random((r, 3)).astype(np.float32),
                "y": rng.integers(-9, 9, r).astype(np.int64 if h == 0 else np.int32)}
        hosts.append(HostChunk(cols, r, 16.0))
    found, want, first = [], {k: [] for k in ("a", "x", "y")}, None
    for _ in range(data.draw(st.integers(1, 3))):
        parts = []
        for _ in range(data.draw(st.integers(0, 3))):
            host = hosts[data.draw(st.integers(0, len(hosts) - 1))]
            if data.draw(st.booleans()):  # picked rows of a stream chunk, in order
                keep = np.flatnonzero(rng.random(host.num_rows) < 0.6)
                parts.append(mixstream.Rows(pa.record_batch({"i": np.arange(host.num_rows)}), host, keep))
                taken = {k: v[keep] for k, v in host.columns.items()}
            else:  # a whole chunk (a slice of one)
                lo = data.draw(st.integers(0, host.num_rows - 1))
                part = host.slice(lo)
                parts.append(part)
                taken = part.columns
            for k in want:
                want[k].append(taken[k])
            first = first or host  # the output takes the first part's dtypes
        found.append(parts)
    sizes = [sum(p.num_rows for p in parts) for parts in found]
    n = sum(sizes)
    if n == 0:
        return
    base = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    idx = rng.permutation(n)
    span = mixstream.ONE_TAKE_SPAN
    mixstream.ONE_TAKE_SPAN = 10**9 if one_take else -1
    try:
        got = mixstream.gather(found, base, idx, BufferPool())
    finally:
        mixstream.ONE_TAKE_SPAN = span
    for k, parts in want.items():
        expect = np.concatenate([p.astype(np.int64) if k == "y" else p for p in parts])[idx]
        assert got.columns[k].dtype == first.columns[k].dtype
        np.testing.assert_array_equal(got.columns[k], expect)


def _overlapping_first(lake, cache):
    ds = al.dataset(lake)
    comps = {"us": ds.filter("country = 'US'").select("id", "label", comp="'us'"),
             "pos": ds.filter("label = 1 AND id % 3 <> 0").select("id", "label", comp="'pos'"),
             "de": ds.filter("country = 'DE' AND label = 0").select("id", "label", comp="'de'")}
    return al.mix(comps, weights=[2, 1, 1], seed=4, cache_dir=cache)


def _plain_mix(lake, cache, columns=("id", "label", "f0")):
    """Components that keep the lake's columns unchanged (one renamed): the stream hands
    out their rows as positions in each batch (``Group.pick_rows``)."""
    ds = al.dataset(lake)
    comps = {c.lower(): ds.filter(f"country = '{c}'").select(*columns[1:], ident=columns[0]) for c in SHARED}
    comps["pos"] = ds.filter("label = 1 AND id % 3 <> 0").select(*columns[1:], ident=columns[0])
    return al.mix(comps, temperature=1.0, seed=5, cache_dir=cache)


def _unshuffled(make, lake, cache, **kw):
    kw.setdefault("cache_dir", cache)
    return make(lake, cache).loader(kw.pop("batch_size", 64), shuffle=False, **kw)


@pytest.mark.parametrize("stack", [None, {"x": ["f0", "f1"]}])
def test_plain_components_stream_as_positions(parquet_lake, tmp_path, monkeypatch, stack):
    """Components that keep their columns unchanged take their rows as positions in each
    converted stream batch: the per-unit path's batches (a ``stack=`` group's rows taken
    whole), every component's ids DuckDB's rows in lake order (an unshuffled component
    keeps its order), overlaps drawn in each."""
    monkeypatch.setenv("ARROWLOAD_STREAM", "1")
    got = {}
    make = _plain_mix if stack is None else functools.partial(_plain_mix, columns=("id", "label", "f0", "f1"))
    for env in ("1", "0"):
        monkeypatch.setenv("ARROWLOAD_STREAM", env)
        loader = _unshuffled(make, parquet_lake, str(tmp_path / env), stack=stack)
        got[env] = [{k: np.asarray(v).tolist() for k, v in b.items()} for b in loader]
        if env == "1":
            assert loader._stream.picked > 0 and loader._stream.failed is None
    assert got["1"] == got["0"] and got["1"]
    assert set(got["1"][0]) == ({"ident", "label", "f0"} if stack is None else {"ident", "label", "x"})
    # each id drawn at most once per component selecting it; nearly all drawn (temperature=1)
    truths = [duck_ids(parquet_lake, f"country = '{c}'") for c in SHARED] + \
        [duck_ids(parquet_lake, "label = 1 AND id % 3 <> 0")]
    drawn = collections.Counter(i for b in got["1"] for i in b["ident"])
    assert all(n <= sum(i in t for t in truths) for i, n in drawn.items())
    assert sum(drawn.values()) >= sum(map(len, truths)) - 4 * 64
    assert any(n == 2 for n in drawn.values())  # a row two components select, drawn in each


@pytest.mark.parametrize("stack", [False, True])
@pytest.mark.parametrize("nulls", [False, True])
def test_block_shuffled_plain_components_take_their_rows_by_position(tmp_path, stack, nulls):
    """Block shuffle over one lake: members that keep the lake's columns get their rows of a
    shared unit as positions (``rabuild.Picked``), written into their windows by position.
    The batches equal those of the same mixture over separate datasets (nothing shared,
    each unit filtered by its own reader), and every component's values are the lake's.
    Member ``z`` computes a column, so it takes a filtered table; with ``nulls`` its rows
    hold the nulls of ``v``, which the picked members' positions never reach (their unit
    view then does not convert whole, and their rows are taken first)."""
    from arrowload.pipeline.rabuild import Picked
    n = 6000
    ids = np.arange(n)
    k = ids % 4
    v = pa.array(np.where(k == 3, np.nan, ids / 7.0), mask=((k == 3) & (ids % 8 == 3)) if nulls else None)
    t = pa.table({"id": ids, "k": k, "v": v, "w": (ids * 3).astype(np.float32)})
    lake = tmp_path / "lake"
    lake.mkdir()
    for f in range(3):
        pq.write_table(t.slice(f * 2000, 2000), lake / f"part-{f}.parquet", row_group_size=250)

    def make(separate: bool):
        opened = al.dataset(str(lake))
        ds = (lambda: al.dataset(str(lake))) if separate else (lambda: opened)
        comps = {"a": ds().filter("k = 0").select("id", "v", "w"),
                 "b": ds().filter("k = 1 OR k = 2").select("id", "v", "w"),
                 "z": ds().filter("k = 3").select("id", v="coalesce(v, -1.0)", w="w")}
        return al.mix(comps, weights=[1, 2, 1], seed=3, cache_dir=str(tmp_path / "cache"))

    more = {"stack": {"x": ["v", "w"]}} if stack else {}
    got, want = [], []
    for out, separate in ((got, False), (want, True)):
        loader = make(separate).loader(96, shuffle="block", shuffle_window=4, cache_dir=str(tmp_path / "cache"),
                                       **more)
        if not separate:
            group = next(g for g in loader._shared.groups if g is not None)
            parts = group.split(0)
            assert isinstance(parts[0], Picked) and isinstance(parts[1], Picked)
            assert not isinstance(parts[2], Picked)
        for b in loader:
            out.append({name: np.asarray(b[name]).copy() for name in b})
    assert len(got) == len(want) > 10
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for name in g:
            np.testing.assert_array_equal(g[name], w[name])
    every = {name: np.concatenate([b[name] for b in got]) for name in got[0]}
    i = every["id"]
    vs = every["x"][:, 0] if stack else every["v"]
    ws = every["x"][:, 1] if stack else every["w"]
    np.testing.assert_array_equal(ws, (i * 3).astype(np.float32))
    kept = (i % 4) != 3
    np.testing.assert_array_equal(vs[kept], i[kept] / 7.0)
    np.testing.assert_array_equal(vs[~kept], np.where(nulls & (i[~kept] % 8 == 3), -1.0, np.nan))
    assert len(i) == len(set(i.tolist()))  # first_exhausted: no row twice


def test_plain_components_with_nulls_raise_where_the_per_unit_path_raises(parquet_lake, tmp_path, monkeypatch):
    """A column with nulls (``score``) converts to no host arrays: the stream's rows go the
    Arrow way and the batch holding a null raises as on the per-unit path; with
    ``output='arrow'`` both give the same batches."""
    from arrowload.errors import ConversionError
    out = {}
    for env in ("1", "0"):
        monkeypatch.setenv("ARROWLOAD_STREAM", env)
        cache = str(tmp_path / env)
        loader = _plain_mix(parquet_lake, cache, ("id", "score")).loader(64, shuffle=False, cache_dir=cache)
        seen = []
        with pytest.raises(ConversionError):
            for b in loader:
                seen.append(np.asarray(b["ident"]).tolist())
        arrow = _plain_mix(parquet_lake, cache, ("id", "score")).loader(64, shuffle=False, cache_dir=cache,
                                                                         output="arrow")
        out[env] = (seen, [b.to_pydict() for b in arrow])
        if env == "1":
            assert arrow._stream is not None and arrow._stream.failed is None
    assert out["1"] == out["0"] and out["1"][1]


def test_a_failed_stream_with_nulls_reads_per_unit_and_raises_where_the_per_unit_path_raises(
        parquet_lake, tmp_path, monkeypatch):
    """The stream fails after its first batch and a column has nulls: the tasks it no longer
    serves read per unit, whose host conversion fails and reads them again with Arrow --
    again per unit (the stream's turn for them is past; asking it again waited forever)."""
    def ids_until_the_error(cache: str):
        from arrowload.errors import ConversionError
        loader = _plain_mix(parquet_lake, cache, ("id", "score")).loader(64, shuffle=False, cache_dir=cache)
        seen = []
        with pytest.raises(ConversionError):
            for b in loader:
                seen.append(np.asarray(b["ident"]).tolist())
        return loader, seen

    monkeypatch.setenv("ARROWLOAD_STREAM", "0")
    _, want = ids_until_the_error(str(tmp_path / "a"))
    calls = _stream_calls(monkeypatch, fail=True)
    monkeypatch.setenv("ARROWLOAD_STREAM", "1")
    loader, got = ids_until_the_error(str(tmp_path / "b"))
    assert got == want and len(calls) == 1 and isinstance(loader._stream.failed, RuntimeError)


@pytest.mark.parametrize("make", [_shared_mix, _overlapping_first, _plain_mix])
@pytest.mark.parametrize("world", [1, 2])
def test_unshuffled_mixture_from_the_union_stream_equals_the_per_unit_path(parquet_lake, tmp_path, monkeypatch,
                                                                          make, world):
    """One polars query over the union of the components' reads, each batch split among
    them and queued per component: every rank's batches those of the per-unit path
    (``ARROWLOAD_STREAM=0``), rows several components select drawn in each, every
    component's rows DuckDB's."""
    calls = _stream_calls(monkeypatch)
    got = {}
    for env in ("1", "0"):
        monkeypatch.setenv("ARROWLOAD_STREAM", env)
        for rank in range(world):
            cache = str(tmp_path / env)
            loader = _unshuffled(make, parquet_lake, cache, rank=rank, world_size=world)
            got[env, rank] = [{k: np.asarray(v).tolist() for k, v in b.items()} for b in loader]
            if env == "1":
                assert loader._stream is not None and loader._stream.failed is None
                assert loader._stream.queries == 1 and loader.stats().peak_prefetch_bytes >= loader._stream.peak > 0
                assert loader.stats().readers_max == STREAM_READERS  # its tasks take rows one at a time
            else:
                assert loader._stream is None
                assert loader.stats().readers_max == loader.max_readers
    assert len(calls) == world  # one query per rank's epoch
    for rank in range(world):
        assert got["1", rank] == got["0", rank] and got["1", rank]
    if make is _plain_mix:
        return  # no component names in its rows (test_plain_components_stream_as_positions)
    if world == 2:  # disjoint ranks
        ids = [{(i, c) for b in got["1", r] for i, c in zip(b["id"], b["comp"])} for r in range(2)]
        assert not ids[0] & ids[1]
    drawn = by_component(got["1", 0])
    truth = {"us": "country = 'US'", "de": "country = 'DE'", "in": "country = 'IN'"} if make is _shared_mix else \
        {"us": "country = 'US'", "pos": "label = 1 AND id % 3 <> 0", "de": "country = 'DE' AND label = 0"}
    for name, ids in drawn.items():
        assert set(ids) <= duck_ids(parquet_lake, truth[name]) and len(ids) == len(set(ids))


def test_a_resumed_stream_starts_at_the_earliest_next_row_of_any_component(tmp_path, monkeypatch):
    """The union stream opens at the unit of the earliest row any component draws from here
    on, not only those drawing in the first task. Here a rare component (``r``, 1 row in
    about 100,000) has its next rows in the lake's first unit, and the resumed first task
    draws none of them: the query used to open where ``a``'s rows were, so ``r``'s next
    draw found its rows behind the stream's head (here an ``IndexError`` on its empty
    queue: the stream was dropped and the rest of the epoch read per unit; with ``r``'s
    later rows queued it would have taken those instead). Now the stream serves the whole
    resumed epoch, holding none of the rows before each component's next one, and its rows
    are the per-unit path's. Fails without the change (``IndexError``)."""
    n = 200_000
    src = np.full(n, "a", dtype=object)
    src[list(range(0, 20, 2)) + list(range(20_000, n, 97))] = "r"
    lake = tmp_path / "lake"
    lake.mkdir()
    pq.write_table(pa.table({"id": np.arange(n, dtype=np.int64), "src": src.tolist()}), lake / "part-0.parquet",
                   row_group_size=1_000)
    ds = al.dataset(str(lake))
    mixture = al.mix({"a": ds.filter("src = 'a'"), "r": ds.filter("src = 'r'")}, weights={"a": 0.99999, "r": 0.00001},
                     seed=0)
    kw = dict(shuffle=False, prefetch=1 << 20, cache_dir=str(tmp_path / "cache"))
    got = {}
    for env in ("0", "1"):
        monkeypatch.setenv("ARROWLOAD_STREAM", env)
        first = mixture.loader(100, **kw)
        batches = iter(first)
        for _ in range(1_200):
            next(batches)
        state = first.state_dict()
        assert state["drawn"][1] == 1  # r drew its first row; its next ones are in unit 0
        loader = mixture.loader(100, **kw)
        loader.load_state_dict(state)
        got[env] = np.concatenate([np.asarray(b["id"]) for b in loader]).tolist()
        if env == "1":
            assert loader._stream is not None and loader._stream.queries == 1
            assert loader._stream.failed is None, loader._stream.failed
    assert got["1"] == got["0"]
    assert [i for i in got["1"] if src[i] == "r"] == [2]  # r's second row, 324 batches after the resume


def test_unshuffled_mixture_stream_resumes_mid_epoch(parquet_lake, tmp_path, monkeypatch):
    monkeypatch.setenv("ARROWLOAD_STREAM", "1")
    whole = _unshuffled(_overlapping_first, parquet_lake, str(tmp_path))
    want = batches(whole)
    for k in (1, len(want) // 2, len(want) - 1):
        first = _unshuffled(_overlapping_first, parquet_lake, str(tmp_path))
        it = iter(first)
        head = [next(it) for _ in range(k)]
        state = first.state_dict()
        first.close()
        again = _unshuffled(_overlapping_first, parquet_lake, str(tmp_path))
        again.load_state_dict(state)
        rest = batches(again)
        assert len(head) + len(rest) == len(want) and rest == want[k:]
        assert again._stream is not None and again._stream.queries == 1 and again._stream.failed is None


def _sorted_lake(lake: str, out) -> str:
    import pyarrow.parquet as pq
    table = pa.concat_tables([t for _, t in _shards(lake)]).sort_by("country")
    out.mkdir()
    pq.write_table(table, str(out / "part-0.parquet"), row_group_size=1000)
    return str(out)


def _shards(lake: str):
    import os
    import pyarrow.parquet as pq
    return [(n, pq.read_table(os.path.join(lake, n))) for n in sorted(os.listdir(lake)) if n.endswith(".parquet")]


def test_unshuffled_mixture_reads_per_unit_where_the_stream_would_queue_too_much(parquet_lake, tmp_path,
                                                                                monkeypatch):
    """On a lake sorted by the components' column the stream would have to queue nearly all
    of one component to reach the next: over the queues' bound (``prefetch / 4``) the epoch
    reads per unit; the same lake unsorted streams at the same budget. Where the estimate
    lets it through, the bound at run time ends the stream mid-epoch: the same batches."""
    from arrowload.mixture import loader as mixloader
    monkeypatch.setenv("ARROWLOAD_STREAM", "1")
    prefetch = 96 << 10
    lake = _sorted_lake(parquet_lake, tmp_path / "sorted")
    streamed = _unshuffled(_shared_mix, parquet_lake, str(tmp_path / "a"), prefetch=prefetch)
    assert batches(streamed) and streamed._stream is not None and streamed._stream.failed is None
    assert streamed._stream.peak <= prefetch // 4 + prefetch // 4 + streamed._stream.query.held_bytes(
        max(s.unit_bytes and max(s.unit_bytes) for s in streamed._shapes))
    refused = _unshuffled(_shared_mix, lake, str(tmp_path / "b"), prefetch=prefetch)
    want = batches(refused)
    assert refused._stream is None and want
    # the estimate overruled: the stream starts, its queues pass the bound, the rest per unit
    span = mixloader.stream_span
    monkeypatch.setattr(mixloader, "stream_span", lambda *a: span(*a)[:2] + (0.0,))
    forced = _unshuffled(_shared_mix, lake, str(tmp_path / "c"), prefetch=prefetch)
    assert batches(forced) == want
    assert forced._stream is not None and "bound" in str(forced._stream.failed)


def test_unshuffled_mixture_falls_back_to_units_when_the_union_stream_fails(parquet_lake, tmp_path, monkeypatch):
    monkeypatch.setenv("ARROWLOAD_STREAM", "0")
    want = batches(_unshuffled(_shared_mix, parquet_lake, str(tmp_path / "a")))
    calls = _stream_calls(monkeypatch, fail=True)
    monkeypatch.setenv("ARROWLOAD_STREAM", "1")
    loader = _unshuffled(_shared_mix, parquet_lake, str(tmp_path / "b"), batch_size=64, prefetch=1 << 16)
    assert batches(loader) == want and len(calls) == 1
    assert isinstance(loader._stream.failed, RuntimeError)


def _queued_by_simulation(per, row_bytes, sched, first_block, stop_block):
    """The most bytes a stream read unit by unit queues serving blocks ``[first_block,
    stop_block)`` in order, from the schedule's exact block counts."""
    starts, counts = sched.blocks(first_block, stop_block)
    ends = starts + counts
    rows = np.vstack([np.zeros(per.shape[1], np.int64), np.cumsum(per, axis=0)])
    stop = ends[-1]
    live = stop > starts[0]
    j = int(min(np.searchsorted(rows[1:, c], starts[0, c], side="right") for c in np.flatnonzero(live)))
    avail = rows[j].copy()
    peak = 0.0
    for b in range(len(starts)):
        while np.any(avail < ends[b]):
            avail = np.minimum(rows[j + 1], stop)
            j += 1
            head = starts[b]
            peak = max(peak, float(np.maximum(0, avail - np.maximum(head, starts[0])) @ row_bytes))
    return peak


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_stream_span_queues_match_a_unit_by_unit_simulation(data):
    from arrowload.mixture.stream import stream_span
    m = data.draw(st.integers(1, 4))
    units = data.draw(st.integers(1, 12))
    per = np.array(data.draw(st.lists(st.lists(st.integers(0, 300), min_size=m, max_size=m),
                                      min_size=units, max_size=units)), dtype=np.int64)
    per[0] += 1  # every component has a row
    weights = data.draw(st.lists(st.integers(1, 9), min_size=m, max_size=m))
    batch = data.draw(st.sampled_from([1, 7, 32]))
    row_bytes = np.array(data.draw(st.lists(st.integers(1, 16), min_size=m, max_size=m)), dtype=np.float64)
    sched = Schedule(tuple(int(x) for x in per.sum(axis=0)), (Phase(0, tuple(map(float, weights)), (0,) * m),),
                     batch, 3, 0)
    blocks = sched.num_blocks
    if not blocks:
        return
    first = data.draw(st.integers(0, blocks - 1))
    members = [(tuple(range(units)), tuple(int(x) for x in per[:, c])) for c in range(m)]
    span = stream_span(tuple(range(units)), members, list(row_bytes), 0, (0,) * m, sched.apportions[0].q, batch,
                       first, blocks, sched.stream_index(first), sched.stream_index(blocks))
    assert span is not None
    rows, j0, peak = span
    np.testing.assert_array_equal(rows[1:], np.cumsum(per, axis=0))
    truth = _queued_by_simulation(per, row_bytes, sched, first, blocks)
    # on the line of the weights: within a block and a few rows per component of the exact run
    slack = (batch + 8 * m) * float(row_bytes.max())
    assert abs(peak - truth) <= slack, (peak, truth)
    # a component drawn past its pass is refused (the stream reads one pass)
    assert stream_span(tuple(range(units)), members, list(row_bytes), 0, (0,) * m, sched.apportions[0].q, batch,
                       first, blocks, sched.stream_index(first),
                       (int(per[:, 0].sum()) + 1,) + sched.stream_index(blocks)[1:]) is None


@pytest.mark.parametrize("mode", ["polars", "off", "fails"])
def test_block_shuffled_shared_units_decoded_together_by_polars(tmp_path, monkeypatch, mode):
    """A block-shuffled mixture over one lake decodes a window's shared units a few at once
    through the union's polars query (``UnitCache.warm_many`` -> ``Group.decode_many``), then
    splits each as a unit decoded alone is split. ``off`` (``ARROWLOAD_STREAM=0``) and
    ``fails`` (every such query raises: each unit is decoded when a member asks) give the
    same batches; all equal the mixture over separate datasets (nothing shared)."""
    import polars  # noqa: F401 - imported: the windows read through it
    from arrowload.mixture import shared
    from arrowload.scan.stream import StreamQuery
    n = 6000
    ids = np.arange(n)
    t = pa.table({"id": ids, "k": ids % 4, "v": ids / 7.0, "s": pa.array([f"s{i % 5}" for i in ids])})
    lake = tmp_path / "lake"
    lake.mkdir()
    for f in range(3):
        pq.write_table(t.slice(f * 2000, 2000), lake / f"part-{f}.parquet", row_group_size=250)
    calls = []
    decode = shared.Group.decode_many

    def counted(self, units):
        out = decode(self, units)
        calls.append((len(units), out is not None))
        return out
    monkeypatch.setattr(shared.Group, "decode_many", counted)
    if mode == "off":
        monkeypatch.setenv("ARROWLOAD_STREAM", "0")
    if mode == "fails":
        def broken(self, indices):
            raise RuntimeError("the query failed")
        monkeypatch.setattr(StreamQuery, "unit_tables", broken)

    def epoch(separate: bool) -> list:
        opened = al.dataset(str(lake))
        ds = (lambda: al.dataset(str(lake))) if separate else (lambda: opened)
        comps = {"a": ds().filter("k = 0").select("id", "v"),
                 "b": ds().filter("k = 1 OR k = 2").select("id", "v"),
                 "c": ds().filter("k = 3 AND s <> 's1'").select("id", "v")}
        mix = al.mix(comps, weights=[1, 2, 1], seed=3, cache_dir=str(tmp_path / "cache"))
        with mix.loader(96, shuffle="block", shuffle_window=8, cache_dir=str(tmp_path / "cache")) as loader:
            return [{k: np.asarray(v).copy() for k, v in b.items()} for b in loader]

    got = epoch(False)
    used = list(calls)
    want = epoch(True)
    assert used and max(k for k, _ in used) <= max(2, 2 * polars.thread_pool_size())  # a few at once
    if mode == "polars":
        assert all(ok for _, ok in used) and sum(k for k, _ in used) >= 24  # every row group
    else:
        assert not any(ok for _, ok in used)  # each unit decoded when a member asks
    assert len(got) == len(want) > 10
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for name in g:
            np.testing.assert_array_equal(g[name], w[name])


def test_block_mixture_decodes_by_polars_only_by_the_loaders_rule(tmp_path):
    """A block mixture decodes its shared units through polars by the loader's rule for
    polars reads (``_stream_allowed``): a short epoch in a process without polars does not
    import it; with polars imported, the same mixture does decode through it, the same
    batches."""
    lake = tmp_path / "lake"
    lake.mkdir()
    ids = np.arange(3000)
    t = pa.table({"id": ids, "k": ids % 3, "v": ids / 7.0})
    for f in range(2):
        pq.write_table(t.slice(f * 1500, 1500), lake / f"part-{f}.parquet", row_group_size=250)
    code = (
        "import sys, threading, arrowload as al\n"
        "from arrowload.mixture import shared\n"
        "used = []\n"
        "decode = shared.Group.decode_many\n"
        "shared.Group.decode_many = lambda self, u: used.append(1) or decode(self, u) if self.polars_decodes else None\n"
        f"ds = al.dataset({str(lake)!r})\n"
        "def epoch():\n"
        "    mix = al.mix({'a': ds.filter('k = 0').select('id', 'v'), 'b': ds.filter('k > 0').select('id', 'v')},\n"
        f"                 weights=[1, 2], seed=3, cache_dir={str(tmp_path / 'cache')!r})\n"
        f"    with mix.loader(64, shuffle='block', cache_dir={str(tmp_path / 'cache')!r}) as ld:\n"
        "        return [i for b in ld for i in b['id'].tolist()]\n"
        "a = epoch()\n"
        "print('polars' in sys.modules, any('import-polars' in t.name for t in threading.enumerate()), len(used))\n"
        "import polars\n"
        "b = epoch()\n"
        "print(a == b, len(used) > 0)\n")
    out = fresh_python(code)
    assert out[0] == "False False 0", out
    assert out[1] == "True True", out


@pytest.mark.parametrize("shuffle", ["global", "block", False])
def test_the_union_stream_hands_over_the_members_masks_from_polars(tmp_path, monkeypatch, shuffle):
    """Components that take their rows as positions read the union's polars query with
    each predicate's mask as a boolean column polars evaluates (``Group._marked``), not
    the columns the predicates read: nulls in those columns keep the SQL meaning.
    The batches equal the per-unit path's (``ARROWLOAD_STREAM=0``, the masks evaluated by
    Arrow) in every shuffle, and each component's rows are DuckDB's."""
    import polars  # noqa: F401 - imported: block windows decode through it
    from arrowload.mixture import shared
    n = 4000
    ids = np.arange(n)
    t = pa.table({"id": ids, "v": ids / 3.0,
                  "x": pa.array([None if i % 11 == 0 else i * 37 % 11 for i in ids], pa.int32()),
                  "tag": pa.array([None if i % 7 == 0 else "abc"[i % 3] for i in ids])})
    lake = tmp_path / "lake"
    lake.mkdir()
    for f in range(2):
        pq.write_table(t.slice(f * 2000, 2000), lake / f"part-{f}.parquet", row_group_size=400)
    where = {"hi": "x > 5", "lo": "NOT (x > 5)", "tag": "tag IS NULL OR tag = 'b'",
             "both": "tag <> 'a' AND x < 3"}
    seen = []
    marked = shared.Group._marked

    def spy(self, query):
        got = marked(self, query)
        seen.append((got.marks, got.columns))
        return got
    monkeypatch.setattr(shared.Group, "_marked", spy)
    from arrowload.scan.stream import StreamQuery
    read, table = [], StreamQuery._table
    monkeypatch.setattr(StreamQuery, "_table", lambda self, df: read.append(df.columns) or table(self, df))
    got = {}
    for env in ("1", "0"):
        monkeypatch.setenv("ARROWLOAD_STREAM", env)
        ds = al.dataset(str(lake))
        mix = al.mix({k: ds.filter(w).select("id", "v") for k, w in where.items()}, temperature=1.0, seed=2,
                     cache_dir=str(tmp_path / env))
        with mix.loader(50, shuffle=shuffle, shuffle_window=3, cache_dir=str(tmp_path / env)) as loader:
            got[env] = [{k: np.asarray(v).tolist() for k, v in b.items()} for b in loader]
            if env == "1":
                stream = loader._shared.groups[0].union_stream()
                assert [name for name, _ in stream.marks] == [f"__arrowload_mask_{i}" for i in range(4)]
                assert {c for _, c in stream.columns} == {"id", "v"}  # not x, not tag
    assert seen and got["1"] == got["0"] and len(got["1"]) > 20
    assert read and all(cols == ["id", "v"] + [f"__arrowload_mask_{i}" for i in range(4)] for cols in read)
    # each component's rows DuckDB's, nearly all drawn (weights by size), none twice per component
    drawn = collections.Counter(i for b in got["1"] for i in b["id"])
    truth = [duck_ids(str(lake), w) for w in where.values()]
    assert all(0 < k <= sum(i in s for s in truth) for i, k in drawn.items())
    assert sum(drawn.values()) >= sum(map(len, truth)) - 4 * 50


def test_block_mixture_decodes_the_next_window_ahead(tmp_path, monkeypatch):
    """While a block-shuffled component's window is read, polars decodes the shared units of
    its next window on a thread of its own (``UnitCache.warm_ahead``), a few at once: the
    batches are those of the mixture over separate datasets (nothing shared, nothing
    ahead), no unit is decoded twice, and closing the loader ends that thread. (Each
    look-ahead is waited for here: on a busy machine the readers may otherwise claim the
    next window's units first, and the look-ahead finds nothing left to decode.)"""
    import threading

    import polars  # noqa: F401 - imported: the shared units decode through it
    from arrowload.mixture import shared
    ids = np.arange(6000)
    t = pa.table({"id": ids, "k": ids % 4, "v": ids / 7.0})
    lake = tmp_path / "lake"
    lake.mkdir()
    for f in range(3):
        pq.write_table(t.slice(f * 2000, 2000), lake / f"part-{f}.parquet", row_group_size=250)
    calls, decode = [], shared.Group.decode_many

    def counted(self, units):
        out = decode(self, units)
        calls.append((threading.current_thread().name, tuple(units), out is not None))
        return out
    monkeypatch.setattr(shared.Group, "decode_many", counted)
    splits, split = [], shared.Group.split
    monkeypatch.setattr(shared.Group, "split", lambda self, unit, raw=None: splits.append(unit) or split(self, unit, raw))
    warm_ahead = shared.UnitCache.warm_ahead

    def waited(self, units):
        warm_ahead(self, units)
        if self._ahead_job is not None:
            self._ahead_job.result()
    monkeypatch.setattr(shared.UnitCache, "warm_ahead", waited)

    def epoch(separate: bool) -> list:
        opened = al.dataset(str(lake))
        ds = (lambda: al.dataset(str(lake))) if separate else (lambda: opened)
        mix = al.mix({"a": ds().filter("k = 0").select("id", "v"), "b": ds().filter("k > 0").select("id", "v")},
                     weights=[1, 3], seed=5, cache_dir=str(tmp_path / "cache"))
        with mix.loader(80, shuffle="block", shuffle_window=4, cache_dir=str(tmp_path / "cache")) as loader:
            out = [{k: np.asarray(v).copy() for k, v in b.items()} for b in loader]
        assert not any(th.name.startswith("arrowload-ahead") for th in threading.enumerate())
        return out

    got = epoch(False)
    used = list(calls)
    want = epoch(True)
    ahead = [units for name, units, ok in used if name.startswith("arrowload-ahead") and ok]
    assert ahead and max(map(len, ahead)) <= max(2, 2 * polars.thread_pool_size())
    assert sorted(splits) == list(range(24))  # every row group decoded once (ahead, or when asked)
    assert len(got) == len(want) > 10
    for g, w in zip(got, want):
        for name in g:
            np.testing.assert_array_equal(g[name], w[name])


@pytest.mark.parametrize("shuffle", ["global", "block", False])
def test_components_whose_long_in_lists_differ_in_the_middle_keep_their_own_rows(tmp_path, shuffle):
    """Two components over one lake, ``x IN (30 values)`` each, differing only in the 16th
    value: pyarrow prints such a value set as its first and last 10, and the shared decode
    keyed each member's mask by that text, so the second component took the first one's
    rows. Keyed by what the predicate computes, each component's rows are DuckDB's."""
    ids = np.arange(4000)
    lake = tmp_path / "lake"
    lake.mkdir()
    pq.write_table(pa.table({"id": ids, "x": (ids * 37 % 101).astype(np.int32)}), lake / "p.parquet",
                   row_group_size=400)
    a = list(range(0, 60, 2))
    b = list(a)
    b[15] = 99
    where = {"a": f"x IN ({', '.join(map(str, a))})", "b": f"x IN ({', '.join(map(str, b))})"}
    ds = al.dataset(str(lake))
    mix = al.mix({k: ds.filter(w).select("id", comp=f"'{k}'") for k, w in where.items()}, weights=[1, 1],
                 stopping="all_exhausted", seed=1, cache_dir=str(tmp_path / "cache"))
    with mix.loader(50, shuffle=shuffle, cache_dir=str(tmp_path / "cache")) as loader:
        drawn = by_component([{k: np.asarray(v).tolist() for k, v in b.items()} for b in loader])
    for k, w in where.items():
        assert set(drawn[k]) == duck_ids(str(lake), w)


def test_block_components_take_slices_of_windows_placed_once(tmp_path):
    """A block-shuffled component's window is placed once in its shuffled order and each
    task takes its rows as a slice (``ScanRowSource.placed``); with a small ``prefetch``
    tasks cover parts of windows (slices that start inside them). The batches equal the
    Arrow path's (``output="arrow"``: a window read in source order and taken by
    position), over two epochs."""
    from arrowload.mixture import loader as mixture_loader
    from arrowload.pipeline.chunks import HostChunk
    ids = np.arange(24000)
    t = pa.table({"id": ids, "k": ids % 5, "v": ids / 7.0, "x": (ids * 13 % 97).astype(np.int32)})
    lake = tmp_path / "lake"
    lake.mkdir()
    for f in range(3):
        pq.write_table(t.slice(f * 8000, 8000), lake / f"p{f}.parquet", row_group_size=500)
    placed, starts = set(), []
    orig_placed, orig_slice = mixture_loader._placed, HostChunk.slice

    def spy_placed(*a):
        got = orig_placed(*a)
        placed.add(id(got))
        return got

    def spy_slice(self, offset, length=None):
        if id(self) in placed:
            starts.append(offset)
        return orig_slice(self, offset, length)
    ds = al.dataset(str(lake))
    comps = {"a": ds.filter("k = 0").select("id", "v"), "b": ds.filter("k > 0 AND x < 60").select("id", "v"),
             "c": ds.filter("x >= 30").select("id", "v")}
    got = {}
    for output in ("numpy", "arrow"):
        mix = al.mix(comps, weights=[1, 2, 2], seed=5, cache_dir=str(tmp_path / "cache"))
        mixture_loader._placed, HostChunk.slice = spy_placed, spy_slice
        try:
            with mix.loader(64, shuffle="block", shuffle_window=4, prefetch=200_000, output=output,
                            cache_dir=str(tmp_path / "cache")) as loader:
                for epoch in range(2):
                    loader.set_epoch(epoch)
                    got[output, epoch] = [np.asarray(b["id"]).tolist() if output == "numpy" else
                                          b.column("id").to_pylist() for b in loader]
        finally:
            mixture_loader._placed, HostChunk.slice = orig_placed, orig_slice
    assert any(s > 0 for s in starts)  # tasks over parts of placed windows
    for epoch in range(2):
        assert got["numpy", epoch] == got["arrow", epoch] and len(got["numpy", epoch]) > 50


def test_a_child_forked_during_a_look_ahead_does_not_wait_for_it():
    """A process forked while a look-ahead decode runs (a DataLoader worker) inherits the
    cache but not its thread: the child's new iteration (``clear``) and ``close`` return
    at once instead of waiting for a job no thread of its own will finish."""
    import os
    import threading
    import time

    from arrowload.mixture.shared import UnitCache
    release, started = threading.Event(), threading.Event()

    class SlowGroup:  # a group whose polars decode blocks until released
        polars_decodes = True

        def decode_many(self, units):
            started.set()
            release.wait(20)
            return None
    cache = UnitCache(SlowGroup(), capacity=1 << 20)
    cache._largest = 1  # as if a unit had been decoded: the look-ahead fits
    cache.warm_ahead([0, 1])
    assert started.wait(10)
    pid = os.fork()
    if pid == 0:  # the child: must not wait for the parent's look-ahead
        code = 1
        try:
            cache.clear()
            cache.close()
            code = 0
        finally:
            os._exit(code)
    try:
        deadline = time.monotonic() + 10
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        if done[0] == 0:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child waited for its parent's look-ahead")
        assert os.waitstatus_to_exitcode(done[1]) == 0
    finally:
        release.set()
        cache.close()


def _host_batch(host: dict) -> pa.RecordBatch:
    """Host arrays as one Arrow batch (a ``[rows, k]`` array as a fixed-size list), to compare."""
    arrays = [pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1)), v.shape[1])
              if isinstance(v, np.ndarray) and v.ndim == 2 else pa.array(v) for v in host.values()]
    return pa.RecordBatch.from_arrays(arrays, names=list(host))
