"""The Loader held to every semantic of DESIGN.md "Loader semantics", against independent
truths: DuckDB (or plain pyarrow) over the same files for which rows are selected and in
which source order, bytes actually read through a counting filesystem, threads actually
alive in ``threading.enumerate()``.

Lakes are generated here (small, several shards, several row-group sizes, one hive
partitioned); ids are unique, so rows are identified by ``id``. Every loader gets a
``cache_dir`` under pytest's tmp dirs, never the user's cache.
"""

from __future__ import annotations

import gc
import glob
import json
import os
import re
import shutil
import threading
import time
import traceback

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import arrowload as al
from arrowload.datagen import events_table, write_lake

from _support import CountingLocalFileSystem, footer_size, state_after

KINDS = ("none", "block", "global")
COLS = ("id", "f0", "label")  # no nulls: every output type can hold them
LAKE_ARGS = dict(features=2, emb_dim=4)
LAKES = {  # rows are prime-ish so no world size or batch size divides them
    "flat": dict(rows=9_973, shards=4, row_group_size=997),
    "small_rg": dict(rows=6_007, shards=3, row_group_size=250),
    "hive": dict(rows=6_007, shards=2, row_group_size=400, partition_by="country"),
}
FILTERS = {
    "all": None,
    "some": "label = 0 OR f0 > 0.8",
    "countries": "country IN ('US', 'DE', 'FR')",  # on "hive": decided by partitions alone
}


# ---------------------------------------------------------------------------
# fixtures and helpers


@pytest.fixture(scope="module")
def lakes(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("loader_lakes")
    out = {}
    for name, args in LAKES.items():
        write_lake(root / name, **args, **LAKE_ARGS)
        out[name] = str(root / name)
    return out


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory) -> str:
    """One cache dir for the read-only lakes of this module (selection indexes reused)."""
    return str(tmp_path_factory.mktemp("loader_cache"))


def files_of(lake: str) -> list[str]:
    return sorted(glob.glob(os.path.join(lake, "**", "*.parquet"), recursive=True))


def truth_ids(lake: str, pred: str | None) -> np.ndarray:
    """Ids DuckDB selects, in source order: files sorted by path, then rows in the file."""
    pattern = os.path.join(lake, "**", "*.parquet").replace("'", "''")
    hive = "true" if "=" in "".join(os.listdir(lake)) else "false"
    where = f"WHERE {pred}" if pred else ""
    sql = (f"SELECT id FROM read_parquet('{pattern}', hive_partitioning={hive}, filename=true, "
           f"file_row_number=true) {where} ORDER BY filename, file_row_number")
    con = duckdb.connect()
    try:
        return con.sql(sql).fetchnumpy()["id"].astype(np.int64)
    finally:
        con.close()


def selection(lake: str, pred: str | None = None, *, filesystem=None, cols=COLS) -> al.Dataset:
    ds = al.dataset(lake, filesystem=filesystem)
    if pred:
        ds = ds.filter(pred)
    return ds.select(*cols)


def ids_of(batch) -> np.ndarray:
    if isinstance(batch, pa.RecordBatch):
        return batch.column("id").to_numpy()
    col = batch["id"]
    return col.numpy() if hasattr(col, "numpy") else np.asarray(col)


def collect(loader) -> list[np.ndarray]:
    return [ids_of(b).copy() for b in loader]


def same_batches(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def arrowload_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("arrowload")]


def unit_of_id(lake: str) -> dict[int, int]:
    """Source-order index of the (file, row group) holding each id, from plain pyarrow."""
    out, unit = {}, 0
    for path in files_of(lake):
        f = pq.ParquetFile(path)
        for rg in range(f.num_row_groups):
            for i in f.read_row_group(rg, columns=["id"]).column("id").to_pylist():
                out[i] = unit
            unit += 1
    return out


def non_footer_bytes(fs: CountingLocalFileSystem) -> int:
    """Bytes read other than Parquet footer fetches (a read that ends at the end of the file
    and is no longer than pyarrow's speculative 64 KiB footer read, or the footer itself)."""
    total = 0
    for r in fs.stats.reads:
        size = os.path.getsize(r.path)
        footer = footer_size(r.path)
        if r.offset + r.nbytes == size and r.nbytes <= max(64 * 1024, footer):
            continue
        total += r.nbytes
    return total


CASES = [("flat", "all"), ("flat", "some"), ("small_rg", "countries"), ("hive", "all"),
         ("hive", "countries"), ("hive", "some")]


# ---------------------------------------------------------------------------
# 1-2. coverage, equal disjoint ranks, source order


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("lake_name,filter_name", CASES)
def test_every_selected_row_once_per_epoch(lakes, shared_cache, lake_name, filter_name, kind):
    lake, pred = lakes[lake_name], FILTERS[filter_name]
    truth = truth_ids(lake, pred)
    n, bs = len(truth), 97
    ds = selection(lake, pred)
    for world in (1, 2, 3):
        per = n // world
        for drop_last in (False, True):
            rank_rows = per // bs * bs if drop_last else per
            seen = []
            for rank in range(world):
                loader = ds.loader(bs, shuffle=kind, seed=11, rank=rank, world_size=world,
                                   drop_last=drop_last, output="arrow", cache_dir=shared_cache)
                assert loader.num_rows == n
                batches = collect(loader)
                where = f"world={world} rank={rank} drop_last={drop_last}"
                assert len(batches) == len(loader), where
                sizes = [len(b) for b in batches]
                assert all(s == bs for s in sizes[:-1]), where
                assert not sizes or 0 < sizes[-1] <= bs
                if drop_last:
                    assert sizes[-1:] in ([], [bs]), where
                ids = np.concatenate(batches) if batches else np.zeros(0, np.int64)
                assert len(ids) == rank_rows, where
                if kind == "none":  # source order; rank r holds positions [r*per, (r+1)*per)
                    assert np.array_equal(ids, truth[rank * per: rank * per + rank_rows]), where
                seen.append(ids)
            everything = np.concatenate(seen)
            assert len(np.unique(everything)) == len(everything)  # disjoint, never padded
            assert np.isin(everything, truth).all()
            left_out = n - len(everything)
            if not drop_last:
                assert left_out == n % world and left_out < world
            else:
                assert left_out == n - world * (per // bs * bs)
            if world == 1 and not drop_last:
                assert np.array_equal(np.sort(everything), np.sort(truth))


@pytest.mark.parametrize("lake_name", ["flat", "hive"])
def test_unshuffled_order_is_pyarrow_reading_sorted_files(lakes, shared_cache, lake_name):
    lake = lakes[lake_name]
    expected = np.concatenate([pq.read_table(p, columns=["id"]).column("id").to_numpy()
                               for p in files_of(lake)])
    loader = selection(lake).loader(128, output="numpy", cache_dir=shared_cache)
    got = np.concatenate(collect(loader))
    assert np.array_equal(got, expected)


def test_block_shuffle_keeps_windows_of_whole_row_groups(lakes, shared_cache):
    """"block": row groups in random order, rows shuffled within windows of
    ``shuffle_window`` of them. Read in order, the epoch splits into segments each made of
    at most ``window`` complete row groups; a global shuffle does not."""
    lake = lakes["small_rg"]
    units = unit_of_id(lake)
    sizes = np.bincount(list(units.values()))

    def segments(ids):
        out, touched, rows = [], set(), 0
        for i in ids.tolist():
            touched.add(units[i])
            rows += 1
            if rows == sum(sizes[u] for u in touched):
                out.append(touched)
                touched, rows = set(), 0
        assert not touched, "an epoch must end on a complete segment"
        return out

    for window in (1, 3):
        loader = selection(lake).loader(100, shuffle="block", shuffle_window=window, seed=4,
                                        cache_dir=shared_cache)
        ids = np.concatenate(collect(loader))
        segs = segments(ids)
        assert all(len(s) <= window for s in segs)
        assert len(segs) >= len(sizes) // window
        # units really are visited out of order, and rows inside a window are mixed
        first_units = [min(s) for s in segs]
        assert first_units != sorted(first_units)
        assert not np.array_equal(ids, np.sort(ids))
    glob_ids = np.concatenate(collect(selection(lake).loader(100, shuffle="global", seed=4,
                                                             cache_dir=shared_cache)))
    assert len(set(units[i] for i in glob_ids[:200].tolist())) > 3


# ---------------------------------------------------------------------------
# 3. determinism and the named shuffle kind


@pytest.mark.parametrize("kind", KINDS)
def test_same_inputs_same_batches_whatever_the_threads(lakes, shared_cache, kind):
    lake, pred = lakes["flat"], FILTERS["some"]
    runs = []
    for cfg in (dict(io_threads=1, prefetch=1), dict(io_threads=4),
                dict(io_threads=3, prefetch=150_000)):
        loader = selection(lake, pred).loader(101, shuffle=kind, seed=5, rank=1, world_size=2,
                                              output="arrow", cache_dir=shared_cache, **cfg)
        runs.append([(b.column("id").to_numpy().copy(), b.column("f0").to_numpy().copy())
                     for b in loader])
    for other in runs[1:]:
        assert len(other) == len(runs[0])
        for (i0, f0), (i1, f1) in zip(runs[0], other):
            assert np.array_equal(i0, i1) and np.array_equal(f0, f1)


@pytest.mark.parametrize("kind", ["block", "global"])
def test_epochs_and_seeds_give_different_orders(lakes, shared_cache, kind):
    ds = selection(lakes["flat"])
    loader = ds.loader(128, shuffle=kind, seed=0, cache_dir=shared_cache)
    e0 = np.concatenate(collect(loader))
    loader.set_epoch(1)
    e1 = np.concatenate(collect(loader))
    loader.set_epoch(0)
    again = np.concatenate(collect(loader))
    other_seed = np.concatenate(collect(ds.loader(128, shuffle=kind, seed=1, cache_dir=shared_cache)))
    assert np.array_equal(np.sort(e0), np.sort(e1))
    assert not np.array_equal(e0, e1)
    assert np.array_equal(e0, again)
    assert not np.array_equal(e0, other_seed)
    assert not np.array_equal(e0, np.sort(e0))


def test_unshuffled_epochs_are_all_source_order(lakes, shared_cache):
    loader = selection(lakes["flat"]).loader(128, cache_dir=shared_cache)
    e0 = np.concatenate(collect(loader))
    loader.set_epoch(3)
    assert np.array_equal(e0, np.concatenate(collect(loader)))


def test_shuffle_kind_is_named(lakes, shared_cache):
    ds = selection(lakes["flat"])
    auto = ds.loader(64, shuffle=True, cache_dir=shared_cache)
    assert auto.shuffle_kind == "global"  # local files allow random access
    assert "shuffle='global'" in repr(auto)
    assert re.search(r"shuffle\s+global", auto.explain())
    block = ds.loader(64, shuffle="block", shuffle_window=3, cache_dir=shared_cache)
    assert block.shuffle_kind == "block" and "shuffle='block'" in repr(block)
    assert "block, window 3" in block.explain()
    plain = ds.loader(64, cache_dir=shared_cache)
    assert plain.shuffle_kind == "none" and "shuffle='none'" in repr(plain)
    with pytest.raises(ValueError):
        ds.loader(64, shuffle="random", cache_dir=shared_cache)


# ---------------------------------------------------------------------------
# 4. resume


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("world,rank", [(1, 0), (2, 1)])
def test_resume_yields_exactly_the_rest_of_the_epoch(lakes, shared_cache, kind, world, rank):
    lake, pred = lakes["small_rg"], FILTERS["some"]

    def build():  # a fresh Dataset each time, as a restarted process would build it
        return selection(lake, pred).loader(64, shuffle=kind, seed=3, rank=rank, world_size=world,
                                            output="arrow", cache_dir=shared_cache)

    reference = build()
    reference.set_epoch(2)
    full = collect(reference)
    reference.set_epoch(3)
    next_epoch = collect(reference)
    n = len(full)
    assert n > 10
    for k in sorted({0, 1, n // 2, n - 1, n}):
        loader = build()
        loader.set_epoch(2)
        state = state_after(loader, k)
        assert state["epoch"] == 2 and state["batches"] == k
        fresh = build()
        fresh.load_state_dict(state)
        assert same_batches(collect(fresh), full[k:]), f"k={k}"
        fresh.set_epoch(3)  # and training goes on normally
        assert same_batches(collect(fresh), next_epoch)


@pytest.fixture(scope="module")
def tiny_lake(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny_lake")
    write_lake(path, rows=1_503, shards=3, row_group_size=100, **LAKE_ARGS)
    return str(path)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(KINDS), world=st.integers(1, 3), bs=st.integers(5, 300),
       drop_last=st.booleans(), data=st.data())
def test_resume_anywhere(tiny_lake, shared_cache, kind, world, bs, drop_last, data):
    rank = data.draw(st.integers(0, world - 1), label="rank")

    def build():
        return selection(tiny_lake, "f0 < 1.0").loader(bs, shuffle=kind, seed=9, rank=rank,
                                                       world_size=world, drop_last=drop_last,
                                                       output="arrow", cache_dir=shared_cache)

    full = collect(build())
    k = data.draw(st.integers(0, len(full)), label="k")
    state = state_after(build(), k)
    fresh = build()
    fresh.load_state_dict(state)
    assert same_batches(collect(fresh), full[k:])


def test_state_from_another_setup_is_refused(lakes, shared_cache, tmp_path):
    lake = lakes["flat"]

    def build(path=lake, pred=None, **kw):
        args = dict(seed=1, rank=0, world_size=2, cache_dir=shared_cache)
        args.update(kw)
        return selection(path, pred).loader(64, **args)

    state = state_after(build(), 3)
    same = build()
    same.load_state_dict(state)  # the same setup over the same files: accepted
    copy = tmp_path / "copy"
    shutil.copytree(lake, copy)
    others = {
        "snapshot": build(str(copy)),
        "plan": build(pred="id >= 0"),
        "seed": build(seed=2),
        "batch_size": selection(lake).loader(32, seed=1, rank=0, world_size=2, cache_dir=shared_cache),
        "shuffle": build(shuffle="block"),
    }
    for field, loader in others.items():
        with pytest.raises(al.StateMismatchError) as info:
            loader.load_state_dict(state)
        assert isinstance(info.value, ValueError) and isinstance(info.value, al.ArrowloadError)
        assert f"{field}:" in str(info.value), str(info.value)
    build(world_size=3).load_state_dict(state)  # another world size: an elastic resume (test_elastic.py)
    for bad in (dict(state, version=5), dict(state, format="torch.checkpoint"), {"epoch": 0}):
        with pytest.raises(al.StateMismatchError):
            same.load_state_dict(bad)
    with pytest.raises(al.StateMismatchError):
        same.load_state_dict(dict(state, position=state["position"] + 1))  # off a batch boundary


@pytest.fixture(scope="module")
def many_groups_lake(tmp_path_factory) -> str:
    """40 row groups of exactly 200 rows (2 batches of 100 each)."""
    path = tmp_path_factory.mktemp("many_groups")
    write_lake(path, rows=8_000, shards=4, row_group_size=200, **LAKE_ARGS)
    return str(path)


@pytest.mark.parametrize("kind", KINDS)
def test_resume_costs_about_as_much_as_starting_an_epoch(many_groups_lake, tmp_path, kind):
    """Bytes read from building the loader to its first batch: resuming at ~90% of the
    epoch reads no more than twice what a fresh epoch reads (reading and discarding the
    rows before the position would read ~9x), and finishing the epoch from there reads
    about a tenth of a whole epoch."""
    cache = str(tmp_path / "cache")

    def build(fs):
        return selection(many_groups_lake, filesystem=fs).loader(
            100, shuffle=kind, shuffle_window=2, seed=1, io_threads=1, prefetch=1, cache_dir=cache)

    fs = CountingLocalFileSystem()
    loader = build(fs)
    n = len(loader)
    k = int(n * 0.9) // 4 * 4  # on a window boundary (windows are 2 groups = 4 batches)
    state = state_after(loader, k)

    def first_batch(fs, state=None):
        """(bytes building the loader and taking its first batch, of which after building)"""
        loader = build(fs)
        built = fs.stats.bytes_read
        if state is not None:
            loader.load_state_dict(state)
        it = iter(loader)
        next(it)
        it.close()  # joins the readers: every read is counted
        return fs.stats.bytes_read, fs.stats.bytes_read - built

    fresh, fresh_iter = first_batch(CountingLocalFileSystem())
    resumed, resumed_iter = first_batch(CountingLocalFileSystem(), state)
    assert 0 < resumed <= 2 * fresh, (resumed, fresh)
    assert resumed_iter <= 2 * fresh_iter, (resumed_iter, fresh_iter)

    fs_whole = CountingLocalFileSystem()
    whole_loader = build(fs_whole)
    before = fs_whole.stats.bytes_read
    assert len(collect(whole_loader)) == n
    whole_epoch = fs_whole.stats.bytes_read - before
    fs_rest = CountingLocalFileSystem()
    rest_loader = build(fs_rest)
    rest_loader.load_state_dict(state)
    before = fs_rest.stats.bytes_read
    assert len(collect(rest_loader)) == n - k
    rest = fs_rest.stats.bytes_read - before
    if kind == "global":  # all reads happen building the random-access table
        assert rest == whole_epoch == 0
    else:
        assert rest <= 0.3 * whole_epoch, (rest, whole_epoch)
        assert 0 < fresh_iter and whole_epoch > 4 * fresh_iter  # a full read would show


# ---------------------------------------------------------------------------
# 5. the selection index and the random-access cache


def test_selection_index_makes_the_second_count_free(lakes, tmp_path):
    lake, pred = lakes["flat"], FILTERS["some"]
    cache = str(tmp_path / "cache")
    counted = []
    for _ in range(2):
        fs = CountingLocalFileSystem()
        ds = selection(lake, pred, filesystem=fs)
        loader = ds.loader(64, cache_dir=cache)
        counted.append(non_footer_bytes(fs))
        assert loader.num_rows == len(truth_ids(lake, pred))
    assert counted[0] > 0  # the first loader read the filter's columns
    assert counted[1] == 0, counted  # the second one read footers only
    assert len(glob.glob(os.path.join(cache, "selection-*.json"))) == 1


def test_a_rewritten_shard_invalidates_the_selection_index(lakes, tmp_path):
    lake = tmp_path / "lake"
    shutil.copytree(lakes["flat"], lake)
    cache = str(tmp_path / "cache")
    pred = FILTERS["some"]
    old = selection(str(lake), pred).loader(64, cache_dir=cache)
    assert old.num_rows == len(truth_ids(str(lake), pred))
    target = files_of(str(lake))[1]
    pq.write_table(events_table(1_234, start_id=50_000, seed=5, **LAKE_ARGS), target,
                   row_group_size=300, compression="zstd")
    truth = truth_ids(str(lake), pred)
    new = selection(str(lake), pred).loader(64, cache_dir=cache)
    assert new.num_rows == len(truth) != old.num_rows
    assert np.array_equal(np.concatenate(collect(new)), truth)
    assert len(glob.glob(os.path.join(cache, "selection-*.json"))) == 1  # the new version's replaced the old
    with pytest.raises(al.ArrowloadError):  # the old loader must not serve stale counts silently
        collect(old)


@pytest.fixture(scope="module")
def big_lake(tmp_path_factory) -> str:
    """More rows than one random-access cache chunk (65,536 rows)."""
    path = tmp_path_factory.mktemp("big_lake")
    write_lake(path, rows=70_001, shards=2, row_group_size=20_000, features=1, emb_dim=0)
    return str(path)


def test_random_access_cache_spills_to_disk_and_is_reused(big_lake, tmp_path):
    cache = str(tmp_path / "cache")
    truth = truth_ids(big_lake, "f0 < 3.0")

    def build(fs=None, **kw):
        return selection(big_lake, "f0 < 3.0", filesystem=fs, cols=("id", "f0")).loader(
            4096, shuffle="global", seed=2, memory_budget=1, cache_dir=cache, **kw)

    first = build(CountingLocalFileSystem())  # snapshots differ by filesystem (mtime precision)
    arrows = glob.glob(os.path.join(cache, "ra-*.arrow"))
    manifests = glob.glob(os.path.join(cache, "ra-*.json"))
    assert len(arrows) == len(manifests) == 1
    assert first.source_kind == f"table ({arrows[0]})"
    with open(manifests[0]) as f:
        doc = json.load(f)
    assert doc["format"] == "arrowload.ra_cache" and doc["version"] == 1
    assert doc["num_rows"] == len(truth) and doc["reusable"] is True
    with pa.memory_map(arrows[0]) as src:
        reader = pa.ipc.open_file(src)
        lengths = [reader.get_batch(i).num_rows for i in range(reader.num_record_batches)]
        stored = reader.read_all().column("id").to_numpy()
    assert len(lengths) > 1 and set(lengths[:-1]) == {doc["chunk_rows"]}
    assert 0 < lengths[-1] <= doc["chunk_rows"]
    assert np.array_equal(stored, truth)  # source order
    batches = collect(first)
    assert np.array_equal(np.sort(np.concatenate(batches)), np.sort(truth))

    fs = CountingLocalFileSystem()
    second = build(fs)
    assert non_footer_bytes(fs) == 0  # reused, not rebuilt
    assert second.source_kind == first.source_kind
    assert same_batches(collect(second), batches)


def test_random_access_cache_of_an_unnamed_map_is_rebuilt(lakes, tmp_path):
    cache = str(tmp_path / "cache")

    def double(batch):
        return pa.record_batch({"id": batch.column("id"), "y": pc.multiply(batch.column("f0"), 2)})

    reads = {}
    for name in ("", "double"):
        for attempt in range(2):
            fs = CountingLocalFileSystem()
            ds = selection(lakes["flat"], filesystem=fs).map(double, columns=["id", "f0"], name=name)
            ds.loader(64, shuffle="global", memory_budget=1, cache_dir=cache)
            reads[name, attempt] = non_footer_bytes(fs)
        docs = []
        for m in glob.glob(os.path.join(cache, "ra-*.json")):
            with open(m) as f:
                docs.append(json.load(f)["reusable"])
        assert (bool(name) in docs)
    assert reads["", 0] > 0 and reads["", 1] > 0  # code it cannot fingerprint: rebuilt
    assert reads["double", 0] > 0 and reads["double", 1] == 0  # named: reused


# ---------------------------------------------------------------------------
# 6. threads are owned and stopped; errors reach the consumer


class Boom(Exception):
    pass


def test_threads_stop_after_close_with_break_and_gc(lakes, shared_cache):
    ds = selection(lakes["flat"])
    assert not arrowload_threads()

    loader = ds.loader(32, io_threads=3, cache_dir=shared_cache)
    it = iter(loader)
    next(it)
    assert arrowload_threads()  # the check below can see them
    loader.close()
    assert not arrowload_threads()
    with pytest.raises(al.LoaderClosedError):
        iter(loader)  # closed for good

    with ds.loader(32, shuffle="block", cache_dir=shared_cache) as loader:
        it = iter(loader)
        next(it)
        assert arrowload_threads()
    assert not arrowload_threads()

    loader = ds.loader(32, shuffle="global", cache_dir=shared_cache)
    for i, _ in enumerate(loader):
        if i == 2:
            break
    it = iter(loader)
    next(it)
    assert arrowload_threads()
    del it
    gc.collect()
    assert not arrowload_threads()
    # and the loader still works afterwards
    assert sum(len(b) for b in collect(loader)) == loader.num_rows


def _explode_on_third_batch():
    calls = []

    def explode_on_third_batch(batch):
        calls.append(batch.num_rows)
        if len(calls) == 3:
            raise Boom("transform failed")
        return batch
    return explode_on_third_batch


@pytest.mark.parametrize("kind", KINDS)
def test_transform_error_reaches_the_consumer_and_threads_stop(lakes, shared_cache, kind):
    loader = selection(lakes["flat"]).loader(32, shuffle=kind, transform=_explode_on_third_batch(),
                                             cache_dir=shared_cache)
    got = 0
    with pytest.raises(Boom) as info:
        for _ in loader:
            got += 1
    assert got == 2
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert "explode_on_third_batch" in frames
    assert not arrowload_threads()


def _map_failing_after(limit):
    def failing_map(batch):
        if batch.num_rows and pc.max(batch.column("id")).as_py() > limit:
            raise Boom("map failed")
        return batch
    return failing_map


@pytest.mark.parametrize("kind", KINDS)
def test_map_error_reaches_the_consumer(lakes, shared_cache, kind):
    ds = selection(lakes["flat"]).map(_map_failing_after(5_000))
    with pytest.raises(Boom) as info:
        # global shuffle runs the map while building its table (in the caller's thread);
        # streaming kinds run it on reader threads and re-raise it here
        for _ in ds.loader(32, shuffle=kind, cache_dir=shared_cache):
            pass
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert "failing_map" in frames
    assert not arrowload_threads()


@pytest.mark.parametrize("kind", KINDS)
def test_a_map_that_drops_rows_is_named_and_cache_is_the_way(tmp_path, kind):
    """A map() keeping even ids: a loader counts rows before maps, so the first read that
    disagrees says the map changed the number of rows (an UnsupportedError), not that the
    data changed under the loader (a SnapshotChangedError said so); over .cache() of the
    mapped dataset the loader reads exactly its rows."""
    pq.write_table(pa.table({"id": np.arange(100)}), str(tmp_path / "a.parquet"), row_group_size=25)

    def evens(b):
        return b.filter(pc.equal(pc.bit_wise_and(b.column("id"), 1), 0))
    mapped = al.dataset(str(tmp_path)).map(evens, name="evens")
    assert mapped.count() == 50
    with pytest.raises(al.UnsupportedError, match=r"map\(\) changed the number of rows.*\.cache\(\)"):
        list(mapped.loader(10, shuffle=kind, seed=1, cache_dir=str(tmp_path / "c")))
    cached = mapped.cache(str(tmp_path / "entries"))
    ids = np.concatenate([b["id"] for b in cached.loader(10, shuffle=kind, seed=1, cache_dir=str(tmp_path / "c"))])
    np.testing.assert_array_equal(np.sort(ids), np.arange(0, 100, 2))


# ---------------------------------------------------------------------------
# 7. memory bounded in bytes; stats


@pytest.mark.parametrize("kind", ["none", "block"])
def test_prefetch_is_bounded_in_bytes(lakes, shared_cache, kind):
    ds = selection(lakes["small_rg"], cols=("id", "f0", "f1", "emb"))
    probe = ds.loader(50, shuffle=kind, shuffle_window=2, cache_dir=shared_cache)
    src = probe._source  # the units as the loader budgets them
    unit = max(src.est_bytes(i) for i in range(len(src.counts)))
    window = 2 if kind == "block" else 1
    task = unit * window
    budget = 2 * unit
    assert sum(src.est_bytes(i) for i in range(len(src.counts))) > 3 * (budget + task)
    loader = ds.loader(50, shuffle=kind, shuffle_window=2, prefetch=budget, io_threads=4,
                       cache_dir=shared_cache)
    it = iter(loader)
    rows, batches = len(ids_of(next(it))), 1
    time.sleep(0.3)  # let a producer that ignored its budget run ahead (no timing is asserted)
    for b in it:
        rows += len(ids_of(b))
        batches += 1
    stats = loader.stats()
    assert 0 < stats.peak_prefetch_bytes <= budget + task, (stats.peak_prefetch_bytes, budget, task)
    assert stats.rows == rows == loader.num_rows
    assert stats.batches == batches == len(loader)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("prefetch", [1, 10_000])
def test_tiny_prefetch_budgets_still_progress(lakes, shared_cache, kind, prefetch):
    """A unit (or a window, or a gather) larger than the whole budget must still flow."""
    loader = selection(lakes["small_rg"]).loader(100, shuffle=kind, prefetch=prefetch, io_threads=2,
                                                 cache_dir=shared_cache)
    rows = []
    # A watchdog, not a timing assertion: a deadlocked pipeline fails instead of hanging.
    worker = threading.Thread(target=lambda: rows.extend(len(b) for b in collect(loader)), daemon=True)
    worker.start()
    worker.join(120)
    assert not worker.is_alive(), "the loader deadlocked on a budget smaller than one read"
    loader.close()
    assert sum(rows) == loader.num_rows


# ---------------------------------------------------------------------------
# 8. transforms and maps


def test_transform_runs_on_every_batch_in_order(lakes, shared_cache):
    ds = selection(lakes["flat"], FILTERS["some"])
    seen = []

    def add_double(batch):
        seen.append(batch.column("id").to_numpy().copy())
        return batch.append_column("id2", pc.multiply(batch.column("id"), 2))

    plain = collect(ds.loader(97, shuffle="global", seed=8, cache_dir=shared_cache))
    out = list(ds.loader(97, shuffle="global", seed=8, transform=add_double, io_threads=4,
                         cache_dir=shared_cache))
    assert same_batches(seen, plain)
    assert same_batches([b["id"] for b in out], plain)
    assert all(np.array_equal(b["id2"], 2 * b["id"]) for b in out)


def test_map_prunes_columns_and_is_deterministic(lakes, tmp_path):
    lake = lakes["flat"]
    cache = str(tmp_path / "cache")
    table = pa.concat_tables(pq.read_table(p, columns=["id", "f0"]) for p in files_of(lake))
    f0_by_id = dict(zip(table.column("id").to_pylist(), table.column("f0").to_pylist()))

    def double(batch):
        return pa.record_batch({"id": batch.column("id"), "y": pc.multiply(batch.column("f0"), 2)})

    read, runs = {}, {}
    for columns in (None, ["id", "f0"]):
        for threads in (1, 4):
            fs = CountingLocalFileSystem()
            ds = al.dataset(lake, filesystem=fs).map(double, columns=columns, name="double")
            loader = ds.loader(128, shuffle="block", seed=1, io_threads=threads, cache_dir=cache)
            before = fs.stats.bytes_read
            runs[columns is None, threads] = batches = list(loader)
            read[columns is None, threads] = fs.stats.bytes_read - before
            assert sorted(batches[0]) == ["id", "y"]
    first = runs[False, 1]
    for batches in runs.values():
        assert same_batches([b["id"] for b in batches], [b["id"] for b in first])
        assert same_batches([b["y"] for b in batches], [b["y"] for b in first])
    ids = np.concatenate([b["id"] for b in first])
    assert np.array_equal(np.sort(ids), np.sort(table.column("id").to_numpy()))
    y = np.concatenate([b["y"] for b in first])
    assert np.array_equal(y, np.array([f0_by_id[i] for i in ids.tolist()], np.float32) * 2)
    assert read[False, 1] < 0.5 * read[True, 1], read  # map(columns=...) decodes only those


# ---------------------------------------------------------------------------
# 9. torch


def test_torch_output_dtypes_and_values(lakes, shared_cache):
    import torch
    ds = al.dataset(lakes["flat"]).select("id", "f0", "label", "emb", "day", "ts")
    as_numpy = list(ds.loader(64, seed=1, shuffle="global", cache_dir=shared_cache))
    as_torch = list(ds.loader(64, seed=1, shuffle="global", output="torch", cache_dir=shared_cache))
    assert len(as_numpy) == len(as_torch)
    expected = {"id": torch.int64, "f0": torch.float32, "label": torch.int8, "emb": torch.float32,
                "day": torch.int64, "ts": torch.int64}
    for n, t in zip(as_numpy, as_torch):
        assert {k: v.dtype for k, v in t.items()} == expected
        assert tuple(t["emb"].shape) == (len(n["id"]), LAKE_ARGS["emb_dim"])
        for k in ("id", "f0", "label", "emb"):
            assert np.array_equal(t[k].numpy(), n[k])
        assert np.array_equal(t["day"].numpy(), n["day"].astype("datetime64[D]").astype(np.int64))
        assert np.array_equal(t["ts"].numpy(), n["ts"].astype("datetime64[us]").astype(np.int64))


@pytest.mark.parametrize("workers, kind", [(0, "block"), (2, "global"), (2, "none"), (2, "block")])
def test_torch_dataloader_gives_the_loaders_batches(lakes, shared_cache, workers, kind):
    """Spawned workers unpickle the loader: a streaming scan's source too (its compiled
    reader, with locks and open files, is compiled again in the worker)."""
    import torch
    from torch.utils.data import DataLoader

    loader = selection(lakes["small_rg"], FILTERS["some"]).loader(
        100, shuffle=kind, seed=6, output="torch", cache_dir=shared_cache)
    loader.set_epoch(1)
    own = [b["id"].clone() for b in loader]
    # spawn, not fork: the test process has threads (and may have jax loaded); forking it can deadlock
    extra = {"multiprocessing_context": "spawn"} if workers else {}
    via = [b["id"] for b in DataLoader(loader.torch_dataset(), batch_size=None, num_workers=workers, **extra)]
    assert len(via) == len(own) == len(loader)
    assert all(torch.equal(a, b) for a, b in zip(own, via))
    ids = torch.cat(via)
    assert len(torch.unique(ids)) == len(ids) == loader.num_rows


@pytest.mark.parametrize("kind,rank,loaded", [("global", 0, 0), ("block", 1, 3)])
def test_a_checkpoint_taken_while_dataloader_workers_read(lakes, shared_cache, kind, rank, loaded):
    """DataLoader workers read in other processes, so their batches do not move the loader:
    ``state_dict()`` mid-epoch said the epoch's start (a resume repeated every batch seen).
    ``state_dict(dataloader_batches=k)`` is the state after the DataLoader's first ``k``
    batches: truth, the state of the same rank's loader iterated ``loaded + k`` batches in
    this process, and a resumed loader giving exactly the rest."""
    import torch
    from torch.utils.data import DataLoader

    def build():
        return selection(lakes["small_rg"], FILTERS["some"]).loader(
            64, shuffle=kind, seed=4, output="torch", cache_dir=shared_cache, rank=rank, world_size=2)
    own = [b["id"].clone() for b in build()]
    loader = build()
    if loaded:
        loader.load_state_dict(state_after(build(), loaded))
    k = 5
    it = iter(DataLoader(loader.torch_dataset(), batch_size=None, num_workers=2, multiprocessing_context="spawn"))
    seen = [next(it)["id"] for _ in range(k)]
    del it
    assert all(torch.equal(a, b) for a, b in zip(own[loaded:loaded + k], seen))
    state = json.loads(json.dumps(loader.state_dict(dataloader_batches=k)))
    assert state == state_after(build(), loaded + k)
    resumed = build()
    resumed.load_state_dict(state)
    rest = [b["id"] for b in resumed]
    assert len(rest) == len(own) - loaded - k and all(torch.equal(a, b) for a, b in zip(own[loaded + k:], rest))
    assert loader.state_dict(dataloader_batches=len(own) - loaded) == state_after(build(), len(own))
    with pytest.raises(al.InvalidArgumentError, match="dataloader_batches"):
        loader.state_dict(dataloader_batches=len(own) - loaded + 1)


def _resumed_at_5(lakes, shared_cache):
    """(how to build the loader, its own epoch's batches, a loader resumed after 5 of them)."""
    def build():
        return selection(lakes["small_rg"], FILTERS["some"]).loader(
            64, shuffle="global", seed=4, output="torch", cache_dir=shared_cache)
    own = [b["id"].clone() for b in build()]
    loader = build()
    loader.load_state_dict(state_after(build(), 5))
    return build, own, loader


def test_a_second_checkpoint_after_a_resume_with_no_dataloader_workers(lakes, shared_cache):
    """With num_workers=0 the DataLoader iterates the loader itself, which used up the
    loaded position: after a resume and 3 more batches, state_dict(dataloader_batches=3)
    said the loaded epoch's 3rd batch, not 5 + 3, and resuming it read 4 batches twice.
    Truth: the loader iterated 8 batches in this process."""
    import torch
    from torch.utils.data import DataLoader

    build, own, loader = _resumed_at_5(lakes, shared_cache)
    it = iter(DataLoader(loader.torch_dataset(), batch_size=None, num_workers=0))
    seen = [next(it)["id"] for _ in range(3)]
    assert all(torch.equal(a, b) for a, b in zip(own[5:8], seen))
    state = loader.state_dict(dataloader_batches=3)
    assert state == state_after(build(), 8) == loader.state_dict()
    resumed = build()
    resumed.load_state_dict(state)
    assert [b["id"].tolist() for b in resumed] == [b.tolist() for b in own[8:]]


@pytest.mark.parametrize("persistent", [False, True])
def test_a_second_dataloader_pass_over_a_resumed_epoch_is_the_whole_epoch(lakes, shared_cache, persistent):
    """After load_state_dict, a DataLoader's workers each hold the loaded position: every
    pass over that epoch started there (18 of 23 batches, then 18 again), where the loader
    itself starts its next iteration afresh. A pass that went through the loaded position
    says so to the workers of the next (shared memory), and dataloader_batches then counts
    from the epoch's start. Truth: the loader's own uninterrupted epoch."""
    from torch.utils.data import DataLoader

    build, own, loader = _resumed_at_5(lakes, shared_cache)
    dl = DataLoader(loader.torch_dataset(), batch_size=None, num_workers=2, multiprocessing_context="spawn",
                    persistent_workers=persistent)
    first = [b["id"] for b in dl]
    second = [b["id"] for b in dl]
    assert [b.tolist() for b in first] == [b.tolist() for b in own[5:]]
    assert [b.tolist() for b in second] == [b.tolist() for b in own]
    assert loader.state_dict(dataloader_batches=3) == state_after(build(), 3)


def test_persistent_dataloader_workers_follow_set_epoch(lakes, shared_cache):
    """Workers kept across epochs (persistent_workers=True) hold the loader they started
    with: they follow set_epoch (on the dataset or the loader) through shared memory, and a
    state loaded after they started is refused there, in the training process, rather than
    ignored. Without that every epoch repeated epoch 0's order."""
    import torch
    from torch.utils.data import DataLoader

    def build():
        return selection(lakes["small_rg"], FILTERS["some"]).loader(
            100, shuffle="global", seed=6, output="torch", cache_dir=shared_cache)
    loader = build()
    own = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        own.append([b["id"].clone() for b in loader])
    assert not torch.equal(torch.cat(own[0]), torch.cat(own[1]))
    batches = loader.torch_dataset()
    workers = DataLoader(batches, batch_size=None, num_workers=2, persistent_workers=True,
                         multiprocessing_context="spawn")
    for epoch in range(3):
        (batches if epoch % 2 else loader).set_epoch(epoch)
        via = [b["id"] for b in workers]
        assert len(via) == len(own[epoch]) and all(torch.equal(a, b) for a, b in zip(own[epoch], via))
    loader.load_state_dict(state_after(build(), 1))
    with pytest.raises(al.UnsupportedError, match="persistent_workers"):
        list(workers)


# ---------------------------------------------------------------------------
# 10. an SQL result


def test_sql_aggregate_loader_matches_duckdb(lakes, tmp_path):
    lake = lakes["flat"]
    query = "SELECT country, label, count(*) AS n, sum(id) AS s FROM t GROUP BY country, label"
    pattern = os.path.join(lake, "*.parquet").replace("'", "''")
    con = duckdb.connect()
    expected = con.sql(query.replace("FROM t", f"FROM read_parquet('{pattern}')")).to_arrow_table()
    con.close()
    ds = al.sql(query, t=al.dataset(lake))
    loader = ds.loader(5, shuffle=True, seed=0, output="arrow", cache_dir=str(tmp_path / "cache"))
    assert loader.source_kind.startswith("table") and loader.shuffle_kind == "global"
    got = pa.Table.from_batches(list(loader))
    keys = [("country", "ascending"), ("label", "ascending")]
    got = got.sort_by(keys)
    expected = expected.cast(got.schema).sort_by(keys)
    assert got.num_rows == expected.num_rows == loader.num_rows
    assert got.equals(expected)
    ranks = [pa.Table.from_batches(list(ds.loader(4, rank=r, world_size=2, output="arrow",
                                                  cache_dir=str(tmp_path / "cache"))))
             for r in range(2)]
    assert ranks[0].num_rows == ranks[1].num_rows == expected.num_rows // 2


def _open_files_under(root: str) -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(root):
            out.append(target)
    return out


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc (Linux)")
@pytest.mark.parametrize("shuffle", [False, "block", "global"])
def test_close_releases_every_file_the_loader_opened(tmp_path, shuffle):
    """The decoders keep Parquet files open between reads of one loader; ``close()`` (and
    building a global shuffle's table) gives every descriptor back. Truth: /proc/self/fd."""
    from arrowload.datagen import write_lake
    root = str(tmp_path / "lake")
    write_lake(root, rows=20_000, shards=4, row_group_size=2_000, emb_dim=0)
    loader = al.dataset(root).select("f0", "label").loader(
        1_000, shuffle=shuffle, cache_dir=str(tmp_path / "cache"))
    if shuffle == "global":
        assert _open_files_under(os.path.realpath(root)) == []  # the build closed its reads
    it = iter(loader)
    next(it)
    loader.close()
    # an unshuffled epoch may read through a polars streaming query: dropping it stops the
    # query, whose tasks then close their files on polars' own threads, a moment later
    # (seen once in ~120 runs under load, gone within 0.2 s); polars has no call to wait on
    deadline = time.monotonic() + 2.0
    while _open_files_under(os.path.realpath(root)) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _open_files_under(os.path.realpath(root)) == []


@pytest.mark.parametrize("shuffle", [False, "block", "global"])
def test_an_ended_or_closed_epoch_iterator_is_exhausted_like_a_generator(shuffle):
    ds = al.dataset(pa.table({"a": list(range(50))}))
    with ds.loader(8, shuffle=shuffle) as loader:
        it = iter(loader)
        assert sum(len(b["a"]) for b in it) == 50
        for _ in range(2):  # next() after the end: StopIteration again, never an error
            with pytest.raises(StopIteration):
                next(it)
        it = iter(loader)
        next(it)
        it.close()
        with pytest.raises(StopIteration):
            next(it)


@pytest.mark.parametrize("decoder", ["pyarrow", "dataset"])
def test_stats_count_the_units_each_decoder_read_in_the_iteration(parquet_lake, monkeypatch, decoder):
    monkeypatch.setenv("ARROWLOAD_DECODER", decoder)
    ds = al.dataset(parquet_lake).select("id", "f0")
    from arrowload.plan.nodes import scans
    units = len(scans(ds.optimized_plan())[0].selected_units())
    with ds.loader(1000) as loader:
        for epoch in range(2):  # each iteration's own count, not the reader's running total
            loader.set_epoch(epoch)
            assert sum(len(b["id"]) for b in loader) == ds.count()
            assert loader.stats().decoders == {decoder: units}
            assert f"decoded by {decoder} {units}" in str(loader.stats())


# -- an iteration the loader takes away from its consumer says so --------------------------

def _ids_loader(**kw):
    return al.dataset(pa.table({"id": np.arange(1000)})).loader(100, output="arrow", **kw)


def test_a_second_iter_ends_the_first_with_an_error_not_a_short_epoch():
    """``zip(loader, loader)`` or two threads over one loader: the first iterator used to end
    as if its epoch were over (0 of 10 batches), losing rows silently."""
    loader = _ids_loader()
    first = iter(loader)
    next(first)
    second = iter(loader)
    with pytest.raises(al.LoaderClosedError, match="new iter"):
        next(first)
    assert sum(len(b) for b in second) == 1000
    done = iter(loader)
    assert sum(len(b) for b in done) == 1000
    iter(loader).close()
    with pytest.raises(StopIteration):  # an iteration that reached its end just ends
        next(done)


@pytest.mark.parametrize("how", ["close", "load_state_dict"])
def test_an_iteration_ended_by_close_or_a_loaded_state_says_so(how):
    loader = _ids_loader()
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    if how == "close":
        loader.close()
    else:
        loader.load_state_dict(state)
    with pytest.raises(al.LoaderClosedError, match="close" if how == "close" else "load_state_dict"):
        next(it)


def test_profile_refuses_to_end_an_iteration_in_progress():
    """It ran an iteration of its own, ending the user's live one silently (300 of 1,000
    rows); the loader's position is restored, so the rest of the epoch was lost."""
    loader = _ids_loader()
    it = iter(loader)
    seen = [len(next(it)) for _ in range(3)]
    with pytest.raises(al.UnsupportedError, match="profiling"):
        loader.profile(3)
    assert sum(seen) + sum(len(b) for b in it) == 1000
    assert loader.profile(3).batches == 3  # once the epoch is over


def test_a_mixtures_second_iter_ends_the_first_with_an_error():
    t = pa.table({"id": np.arange(600), "src": np.array(["a", "b"])[np.arange(600) % 2]})
    ds = al.dataset(t)
    m = al.mix({s: ds.filter(f"src = '{s}'") for s in "ab"}, weights={"a": 0.5, "b": 0.5})
    loader = m.loader(20)
    first = iter(loader)
    next(first)
    iter(loader)
    with pytest.raises(al.LoaderClosedError, match="new iter"):
        next(first)


def test_stats_readers_counts_threads_that_ran_not_the_autotuners_ceiling(tmp_path):
    """With io_threads=64 and a small budget, ``stats().readers`` said 41 reader threads
    where 22 ever existed: the autotuner's target, not capped by the threads the work
    needed. Truth: the row groups (one read each) and the reader threads a map() saw."""
    import pyarrow.parquet as pq
    for i in range(4):
        pq.write_table(pa.table({"id": np.arange(i * 5000, (i + 1) * 5000)}), tmp_path / f"p{i}.parquet",
                       row_group_size=500)
    seen = set()

    def note(batch):
        seen.add(threading.current_thread().name)
        return batch
    loader = al.dataset(str(tmp_path)).map(note).loader(256, io_threads=64, prefetch=8 << 20, output="arrow")
    assert sum(len(b) for b in loader) == 20000
    readers = {n for n in seen if n.startswith("arrowload-read")}
    # 40 row groups, one task each: never more than 40 threads (the ceiling was 64); the
    # threads that ran the map are a lower bound of those started (one may start and end idle)
    assert 1 <= len(readers) <= 40 and 1 <= loader.stats().readers <= 40 < loader.stats().readers_max
    assert f"{loader.stats().readers} reader thread" in loader.stats().settings_text()


@pytest.mark.parametrize("prefetch,shown", [(100 << 10, "100.0 KiB"), (int(3.5 * 2**20), "3.5 MiB")])
def test_a_small_prefetch_is_shown_as_it_is(prefetch, shown):
    """It read "prefetch 0 MiB budget" for 100 KiB, "4 MiB" for 3.5 MiB."""
    loader = _ids_loader(prefetch=prefetch)
    list(loader)
    assert f"prefetch     {shown} budget" in loader.explain()
    assert f"prefetch {shown}" in loader.stats().settings_text()


@pytest.mark.parametrize("shuffle,budget", [(False, None), ("global", None), ("global", 1)])
def test_in_memory_tables_alike_at_their_ends_share_no_cached_counts_or_rows(tmp_path, shuffle, budget):
    """In-memory data's fingerprint samples its first and last slices: two tables equal
    there (two runs of a job over data built in memory) shared the selection counts and the
    random-access table kept in the cache dir, so the second got the first's length and,
    spilled, its rows (or a 'changed' error on every build). Truth: pyarrow's filter of
    each table."""
    import pyarrow.compute as pc
    n = 100_000
    ids = np.arange(n)
    first = pa.table({"id": ids, "v": ids % 7})
    v = ids % 7
    v[20_000:30_000] = 100
    second = pa.table({"id": ids, "v": v})
    cache = str(tmp_path / "cache")
    kw = {} if budget is None else {"memory_budget": budget}
    for table in (first, second, first):
        want = sorted(table.filter(pc.equal(table["v"], 100))["id"].to_pylist())
        with al.dataset(table).filter("v = 100").select("id").loader(
                1000, shuffle=shuffle, seed=1, cache_dir=cache, output="numpy", **kw) as loader:
            assert len(loader) == -(-len(want) // 1000)
            got = sorted(int(i) for b in loader for i in b["id"])
        assert got == want
    assert not [p for p in (os.listdir(cache) if os.path.isdir(cache) else []) if p.endswith(".arrow")]  # spills go with their tables


def test_a_cache_dir_that_cannot_be_written_is_never_fatal(tmp_path, monkeypatch):
    """An unwritable or full cache dir (a read-only home, a path under a file) raised a bare
    OSError from filtered loaders, global shuffles held in memory and mixture sizes, none of
    which asked for a cache: the counts' cache write was not guarded. A spill that cannot
    be written is a MemoryBudgetError saying so. Truth: pyarrow's filter of the file."""
    import pyarrow.compute as pc
    table = pa.table({"id": np.arange(5000), "v": np.arange(5000) % 3})
    pq.write_table(table, str(tmp_path / "t.parquet"), row_group_size=1000)
    (tmp_path / "file").write_text("not a folder")
    cache = str(tmp_path / "file" / "cache")
    monkeypatch.setenv("ARROWLOAD_CACHE_DIR", cache)
    want = sorted(table.filter(pc.equal(table["v"], 1))["id"].to_pylist())
    ds = al.dataset(str(tmp_path / "t.parquet")).filter("v = 1").select("id")
    for shuffle in (False, "block", "global"):
        with ds.loader(100, shuffle=shuffle, cache_dir=cache, output="numpy") as loader:
            assert sorted(int(i) for b in loader for i in b["id"]) == want
    m = al.mix({"a": ds, "b": al.dataset(str(tmp_path / "t.parquet")).filter("v = 2").select("id")}, cache_dir=cache)
    assert m.sizes() == (len(want), len(want) - 1)
    with pytest.raises(al.MemoryBudgetError, match="cannot take it"):
        ds.loader(100, shuffle="global", cache_dir=cache, memory_budget=1)


_FULL_DISK = """
import glob, os, resource, signal
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
import arrowload as al
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as on a full disk
table = pa.table({{"id": np.arange(400_000), "x": np.random.default_rng(0).random(400_000)}})
pq.write_table(table, {lake!r}, row_group_size=50_000)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
try:
    al.dataset({lake!r}).loader(1000, shuffle="global", memory_budget=64 << 10, cache_dir={cache!r})
except al.MemoryBudgetError as exc:
    assert "writing it to" in str(exc) and {cache!r} in str(exc), exc
    print("MemoryBudgetError")
print(sorted(os.listdir({cache!r})))
"""


def test_a_spill_the_disk_cannot_take_is_a_memory_budget_error(tmp_path):
    """A global-shuffle spill that ran out of disk (ENOSPC, a file size limit: EFBIG here)
    raised IndexError from the writer's cleanup, the OSError only chained; it is a
    MemoryBudgetError naming the directory, and the partial spill is removed."""
    import subprocess
    import sys
    cache = str(tmp_path / "cache")
    code = _FULL_DISK.format(lake=str(tmp_path / "t.parquet"), cache=cache)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["MemoryBudgetError", "[]"], out.stdout


@pytest.mark.parametrize("shuffle", [False, "block", "global"])
def test_a_filter_over_a_maps_columns_counts_through_the_map(tmp_path, shuffle):
    """The loader counts a selection with its maps stripped (they keep one row per row):
    a filter over a column a map adds raised ColumnNotFoundError from every loader (while
    to_arrow() worked), and over a column it rewrites it would count other rows. Truth:
    the map and the filter applied by pyarrow."""
    import pyarrow.compute as pc
    table = pa.table({"id": np.arange(3000), "v": np.arange(3000) % 5})
    pq.write_table(table, str(tmp_path / "t.parquet"), row_group_size=500)

    def grade(b):  # rewrites v, adds w
        high = pc.cast(pc.greater(b["v"], 2), pa.int64())
        return pa.RecordBatch.from_arrays([b["id"], high, pc.multiply(b["v"], 2)], names=["id", "v", "w"])
    base = al.dataset(str(tmp_path / "t.parquet")).map(grade, name="grade")
    mapped = pa.Table.from_batches([grade(b) for b in table.to_batches()])
    for where, mask in (("w = 4", pc.equal(mapped["w"], 4)), ("v = 1", pc.equal(mapped["v"], 1))):
        want = sorted(mapped.filter(mask)["id"].to_pylist())
        with base.filter(where).select("id").loader(128, shuffle=shuffle, output="numpy") as loader:
            assert len(loader) == -(-len(want) // 128), where
            assert sorted(int(i) for b in loader for i in b["id"]) == want, where


def test_a_spilled_table_of_an_older_snapshot_is_removed(tmp_path):
    """Each snapshot of a selection spilled a whole copy into the cache dir, never removed
    (a lake appended to daily kept one a day), nor were the spill files of killed builds.
    Truth: the files in the cache dir, and pyarrow's rows of the lake as it is now."""
    lake = tmp_path / "lake"
    lake.mkdir()
    cache = str(tmp_path / "cache")
    os.makedirs(cache)
    dead = os.path.join(cache, ".tmp-ra-dead.arrow")
    with open(dead, "wb") as f:
        f.write(b"half a table")
    os.utime(dead, (time.time() - 7 * 3600,) * 2)
    fresh = os.path.join(cache, ".tmp-ra-busy.arrow")  # another build at work: kept
    with open(fresh, "wb") as f:
        f.write(b"being written")
    for day in range(3):
        pq.write_table(pa.table({"id": np.arange(day * 1000, day * 1000 + 1000)}), str(lake / f"day{day}.parquet"))
        ds = al.dataset(str(lake)).filter("id % 3 = 0")
        with ds.loader(100, shuffle="global", memory_budget=1, cache_dir=cache, output="numpy") as loader:
            got = sorted(int(i) for b in loader for i in b["id"])
        ids = pq.read_table(str(lake))["id"].to_numpy()
        assert got == sorted(ids[ids % 3 == 0].tolist())
        assert len(glob.glob(os.path.join(cache, "ra-*.arrow"))) == len(glob.glob(os.path.join(cache, "ra-*.json"))) == 1
    assert not os.path.exists(dead) and os.path.exists(fresh)


def test_cache_documents_nested_past_the_json_parsers_depth_are_rebuilt(tmp_path):
    """A damaged cache document of deeply nested JSON raised a bare RecursionError (the
    selection counts, the decoder choices, a plan cache commit), where every other damage
    is ignored and rebuilt. Truth: the rows of the file."""
    pq.write_table(pa.table({"id": np.arange(3000)}), str(tmp_path / "t.parquet"), row_group_size=500)
    cache, root = str(tmp_path / "cache"), str(tmp_path / "plans")
    ds = al.dataset(str(tmp_path / "t.parquet")).filter("id % 2 = 0")
    assert sum(len(b["id"]) for b in ds.loader(100, cache_dir=cache)) == 1500
    assert ds.cache(root).count() == 1500
    damaged = glob.glob(os.path.join(cache, "selection-*.json")) + glob.glob(os.path.join(cache, "decoders-*.json")) \
        + glob.glob(os.path.join(root, "**", "commit.json"), recursive=True)
    assert len(damaged) >= 2
    for path in damaged:
        with open(path, "w") as f:
            f.write("[" * 100_000 + "]" * 100_000)
    assert sum(len(b["id"]) for b in ds.loader(100, cache_dir=cache)) == 1500
    assert ds.cache(root).count() == 1500


def test_lakes_alike_keep_their_own_spilled_tables(tmp_path):
    """Two lakes under one selection (the same plan, other roots) in one cache dir: each
    keeps its spilled random-access table (a new version replaces only its own lake's),
    and the next loader over each reuses it. Truth: the files in the cache dir."""
    cache = str(tmp_path / "cache")
    lakes = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        pq.write_table(pa.table({"id": np.arange(2000)}), str(tmp_path / name / "t.parquet"))
        lakes.append(str(tmp_path / name))
    kinds = []
    for lake in lakes + lakes:
        with al.dataset(lake).filter("id % 2 = 0").loader(100, shuffle="global", memory_budget=1,
                                                          cache_dir=cache) as loader:
            kinds.append(loader.source_kind)
            assert sum(len(b["id"]) for b in loader) == 1000
    assert kinds[:2] == kinds[2:] and kinds[0] != kinds[1]  # reused, one each
    assert len(glob.glob(os.path.join(cache, "ra-*.arrow"))) == 2


def test_selection_counts_of_an_older_version_are_replaced(tmp_path):
    """The counts of a filtered selection were kept for every version of the data (5,074
    documents in one user cache dir, one plan alone with 1,360 snapshots). Writing a
    version's counts now removes the same selection's older ones, never another lake's.
    Truth: the files in the cache dir, and the counts against numpy."""
    cache = str(tmp_path / "cache")
    lakes = [tmp_path / "a", tmp_path / "b"]
    for lake in lakes:
        lake.mkdir()
    for day in range(3):
        for lake in lakes:
            pq.write_table(pa.table({"id": np.arange(day * 100, day * 100 + 100)}), str(lake / f"d{day}.parquet"))
            with al.dataset(str(lake)).filter("id % 3 = 0").loader(10, cache_dir=cache) as loader:
                assert loader.num_rows == sum(1 for i in range((day + 1) * 100) if i % 3 == 0)
        assert len(glob.glob(os.path.join(cache, "selection-*.json"))) == 2


def _wait_until(cond, timeout=30.0):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "the condition never held"
        time.sleep(0.005)


def _two_groups(n=2000):
    ids = np.arange(n)
    return al.dataset(pa.table({"id": ids, "src": np.array(["a", "b"])[ids % 2]}))


@pytest.mark.parametrize("kind", ["loader", "mixture"])
@pytest.mark.parametrize("how", ["close", "iter", "load_state_dict"])
def test_an_iteration_ended_by_another_thread_while_its_consumer_waits_says_so(kind, how):
    """The consumer waits inside next() (its batch is being made) when another thread closes
    the loader, iterates it again or loads a state: it gets LoaderClosedError. It used to
    end as though the epoch were over (1 batch of 20, no error) or raise InternalError."""
    release = threading.Event()
    made = []

    def slow(batch):  # the second batch waits until the iteration has been ended
        made.append(len(batch))
        if len(made) == 2:
            release.wait(30)
        return batch

    ds = _two_groups()
    if kind == "loader":
        loader = ds.loader(100, output="arrow", transform=slow)
    else:
        m = al.mix({s: ds.filter(f"src = '{s}'") for s in "ab"}, weights={"a": 0.5, "b": 0.5})
        loader = m.loader(100, output="arrow", transform=slow)
    state = loader.state_dict()
    it = iter(loader)
    next(it)
    got = []

    def consume():
        try:
            got.append(next(it))
        except BaseException as exc:  # noqa: BLE001 - what the consumer meets is the answer
            got.append(exc)

    consumer = threading.Thread(target=consume)
    consumer.start()
    _wait_until(lambda: len(made) >= 2)  # the consumer now waits for the second batch
    end = {"close": loader.close, "iter": lambda: iter(loader), "load_state_dict": lambda: loader.load_state_dict(state)}
    ender = threading.Thread(target=end[how])
    ender.start()
    _wait_until(lambda: it._ended is not None)
    release.set()
    ender.join(30)
    consumer.join(30)
    assert len(got) == 1 and isinstance(got[0], al.LoaderClosedError), got
    loader.close()


@pytest.mark.parametrize("kind", ["loader", "mixture"])
def test_set_epoch_during_an_iteration_ends_it_and_the_new_epoch_resumes_whole(kind):
    """set_epoch(1) after 2 of epoch 0's batches: the running iteration kept yielding epoch
    0's rows while the position counted them in epoch 1, so a state taken then resumed epoch
    1 past rows never yielded. It now ends that iteration (LoaderClosedError), the state is
    epoch 1 at its start, and resuming it gives epoch 1 whole; an iteration that handed out
    every batch just ends."""
    ds = _two_groups()

    def make():
        if kind == "loader":
            return ds.loader(100, output="arrow", shuffle="global", seed=3)
        m = al.mix({s: ds.filter(f"src = '{s}'") for s in "ab"}, weights={"a": 0.5, "b": 0.5}, seed=3)
        return m.loader(100, output="arrow", shuffle="global")

    fresh = make()
    fresh.set_epoch(1)
    want = [b.column("id").to_pylist() for b in fresh]
    loader = make()
    it = iter(loader)
    next(it), next(it)
    loader.set_epoch(1)
    with pytest.raises(al.LoaderClosedError, match="set_epoch"):
        next(it)
    state = loader.state_dict()
    assert state["epoch"] == 1 and state["position"] == 0
    again = make()
    again.load_state_dict(state)
    assert [b.column("id").to_pylist() for b in again] == want
    whole = iter(loader)
    assert [b.column("id").to_pylist() for b in [next(whole) for _ in range(len(want))]] == want
    loader.set_epoch(2)  # every batch was taken: only its end is left
    with pytest.raises(StopIteration):
        next(whole)


@pytest.mark.parametrize("kind", ["block", "mixture"])
def test_close_does_not_run_the_reads_left_in_the_queue(tmp_path, kind):
    """close() while a read's sub-reads (a block window's units, a mixture's reads ahead)
    wait in the queue: they are dropped. They used to run one after another on the closing
    reader thread (62 calls of a 0.2 s map after close(), 12 s, for a mixture)."""
    for f in range(4):
        ids = np.arange(f * 800, (f + 1) * 800)
        pq.write_table(pa.table({"id": ids, "src": np.array(["a", "b"])[ids % 2]}),
                       str(tmp_path / f"part-{f}.parquet"), row_group_size=100)
    calls = []

    def slow(batch):
        calls.append(1)
        time.sleep(0.02)
        return batch

    import polars  # noqa: F401 - imported, an unshuffled mixture reads through its stream (mixture/stream.py)
    ds = al.dataset(str(tmp_path)).map(slow)
    if kind == "block":
        loader = ds.loader(50, shuffle="block", shuffle_window=16, io_threads=2, seed=0)
    else:
        m = al.mix({s: ds.filter(f"src = '{s}'") for s in "ab"}, weights={"a": 0.3, "b": 0.7}, seed=0)
        loader = m.loader(50, shuffle=False, io_threads=2)
    built = len(calls)  # the build's own calls (a mixture counts its components' rows)
    it = iter(loader)
    ended = []

    def consume():
        with pytest.raises(al.LoaderClosedError) as info:
            next(it)
        ended.append(info.value)

    consumer = threading.Thread(target=consume)
    consumer.start()
    _wait_until(lambda: len(calls) > built)  # the epoch's reads have started
    at_close = len(calls)
    loader.close()
    after = len(calls) - at_close
    consumer.join(30)
    # left to finish: the reads running, and a mixture's stream batches its split threads
    # hold (2 * 2 + 1, a map call per component each), and on a loaded machine the calls
    # started between the count above and close(); never the rest of the epoch (about 60:
    # the bug ran 62). 10 was exceeded once (11) by a full suite beside other work
    assert after <= 20, f"{after} reads ran after close() ({at_close - built} before it, {built} at the build)"
    assert len(ended) == 1
