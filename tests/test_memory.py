"""Memory bounded in bytes, measured from outside the loader.

Each measurement runs the loader in a fresh Python process on a lake of wide rows
(``fixed_size_list<float32>[1024]``, 4 KiB a row) and reads the kernel's own figures from
``/proc/self/status``: the high-water mark of resident memory (``VmHWM``, reset through
``/proc/self/clear_refs`` once the loader is built, so it covers the epoch alone) and
``RssAnon`` sampled every millisecond (anonymous memory: what the process holds, as
opposed to file-backed pages of a memory-mapped cache). The loader's own account
(``LoaderStats.peak_prefetch_bytes``) is checked against them. Every epoch is also checked
for exactness against pyarrow's read of the same files.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import arrowload as al
from arrowload.order import EpochOrder

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"),
                                reason="needs Linux /proc (VmHWM, RssAnon, clear_refs)")

DIM = 1024
ROWS = 16_384          # 64 MiB of embeddings
ROW_BYTES = 8 + 4 * DIM
MIB = 1 << 20

CHILD = r"""
import ctypes, gc, json, sys, threading, time
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
import arrowload as al

lake, cache, mode, prefetch, batch = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
kind, window = sys.argv[6], int(sys.argv[7])

def status():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                out[k] = int(v.split()[0]) * 1024
    return out

def reset_hwm():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")

peak_anon = [0]
stop = threading.Event()
def sample():
    while not stop.is_set():
        peak_anon[0] = max(peak_anon[0], status()["RssAnon"])
        time.sleep(0.001)

truth = pq.read_table(lake, columns=["id"]).column("id").to_numpy()
kw = {"memory": {}, "disk": {"memory_budget": 1}}[mode]
for b in al.dataset(lake).limit(100).loader(10, shuffle="global", cache_dir=cache + "-warm", **kw):
    pass  # imports and one-time setup, outside the measure
if kind != "global":  # the streaming path's one-time setup too
    for b in al.dataset(lake).loader(10, shuffle=kind, shuffle_window=window, cache_dir=cache + "-warm"):
        break
b = None

def trim():  # hand freed memory back to the OS, so that reusing it cannot hide an allocation
    gc.collect()
    pa.default_memory_pool().release_unused()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass

trim()
base = status()
reset_hwm()
peak_anon[0] = base["RssAnon"]
sampler = threading.Thread(target=sample, daemon=True)
sampler.start()
loader = al.dataset(lake).loader(batch, shuffle=kind, seed=3, prefetch=prefetch, shuffle_window=window,
                                 cache_dir=cache, output="numpy", **kw)
at_build = status()
build_hwm = at_build["VmHWM"]  # exact peak of the build: no file is mapped yet, all anonymous
build_anon = peak_anon[0]  # the sampled peak of anonymous memory over the build
trim()
built = status()
reset_hwm()
ids = []
for b in loader:
    ids.append(b["id"].copy())
    assert np.array_equal(b["emb"][:, 0], b["id"].astype(np.float32))  # each row whole
    b = None
epoch_hwm = status()["VmHWM"]
stop.set()
sampler.join()
anon = max(peak_anon[0], status()["RssAnon"])
ids = np.concatenate(ids)
print(json.dumps({
    "exact": bool(np.array_equal(np.sort(ids), np.sort(truth))) and len(ids) == len(truth),
    "order": ids[:50].tolist(),
    "epoch_growth": epoch_hwm - built["VmRSS"],
    "peak_anon": max(anon - base["RssAnon"], build_hwm - base["VmRSS"]),
    # its parts, for a failure's message: the sampled anonymous peak over the build and over
    # the epoch, the build's high-water mark, and the file-backed pages mapped when it ended
    "parts_mib": {"sampled_build": (build_anon - base["RssAnon"]) / 2**20,
                  "sampled_all": (anon - base["RssAnon"]) / 2**20,
                  "build_hwm": (build_hwm - base["VmRSS"]) / 2**20,
                  "file_at_build": (at_build["RssFile"] - base["RssFile"]) / 2**20},
    "accounted": loader.stats().peak_prefetch_bytes,
    "source": loader.source_kind,
    "decoders": loader.stats().decoders,
    "modules": sorted(m for m in ("polars", "duckdb", "torch", "jax", "sqlglot", "pandas") if m in sys.modules),
    "table_bytes": loader._source.table.nbytes if hasattr(loader._source, "table") else 0,
    "window_est": max((sum(loader._source.est_bytes(int(u)) for u in w) for w in loader._order(0).windows),
                      default=0) if kind == "block" else 0,
}))
"""


@pytest.fixture(scope="module")
def wide_lake(tmp_path_factory) -> str:
    """16,384 rows of id + emb (emb[:, 0] == id), 4 files of 512-row groups (2 MiB)."""
    path = tmp_path_factory.mktemp("wide")
    rng = np.random.default_rng(0)
    per = ROWS // 4
    for i in range(4):
        ids = np.arange(i * per, (i + 1) * per, dtype=np.int64)
        emb = rng.standard_normal((per, DIM), dtype=np.float32)
        emb[:, 0] = ids
        table = pa.table({"id": ids, "emb": pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), DIM)})
        pq.write_table(table, path / f"part-{i}.parquet", row_group_size=512, compression="none")
    return str(path)


def run_child(lake: str, cache: str, mode: str, prefetch: int, batch: int, kind: str = "global",
              window: int = 8, stream: bool = False) -> dict:
    """``stream``: an unshuffled epoch reads through the polars stream (``scan/stream.py``);
    else through the per-unit path (``ARROWLOAD_STREAM=0``)."""
    # MIMALLOC_PURGE_DELAY=0: pyarrow's mimalloc pool returns freed pages at once, so that
    # RssAnon counts what the process holds, not pages freed but not yet purged (these made
    # the disk cache's 25 MiB build read anywhere from 38 to 94 MiB from run to run)
    env = {**os.environ, "ARROWLOAD_STREAM": "1" if stream else "0", "MIMALLOC_PURGE_DELAY": "0"}
    out = subprocess.run([sys.executable, "-c", CHILD, lake, cache, mode, str(prefetch), str(batch), kind,
                          str(window)],
                         check=True, capture_output=True, text=True, timeout=300, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("prefetch", [1, 2 * MIB])
def test_global_shuffle_bytes_in_flight_respect_prefetch(wide_lake, tmp_path, prefetch):
    """In flight: at most max(prefetch, one batch) by the loader's account, and the process's
    resident memory grows by no more than that (plus a small constant) during the epoch.
    Before byte-sized gathers a gather was 65,536 rows (here the whole 64 MiB table)."""
    batch = 64
    batch_bytes = batch * ROW_BYTES  # 256 KiB
    got = run_child(wide_lake, str(tmp_path / "cache"), "memory", prefetch, batch)
    assert got["exact"] and got["source"] == "table (memory)"
    bound = max(prefetch, batch_bytes)
    assert 0 < got["accounted"] <= bound, (got["accounted"], bound)
    # independent: the kernel's high-water mark over the epoch (the table was built before)
    assert got["epoch_growth"] <= bound + 16 * MIB, (got["epoch_growth"] / MIB, bound / MIB)


@pytest.mark.parametrize("prefetch", [1, 2 * MIB])
@pytest.mark.parametrize("kind", ["none", "block"])
def test_streaming_bytes_in_flight_respect_prefetch(wide_lake, tmp_path, kind, prefetch):
    """A scan streams its smallest reads: one row group in source order, one window of
    ``shuffle_window`` row groups for a block shuffle (the unit that cannot be split).
    By the loader's account, at most max(prefetch, one read's footer estimate in flight
    (3x its compressed bytes) + the previous read's rows still being cut + one batch); the
    process's resident memory (the kernel's high-water mark over the epoch) grows by at
    most twice that plus a constant (a read is copied once: a window made one chunk, then
    gathered into pooled buffers) -- short of the 64 MiB table a read-ahead without the
    budget holds."""
    batch, window = 64, 2
    rg_bytes = 512 * ROW_BYTES  # 2 MiB, uncompressed
    read = rg_bytes * (window if kind == "block" else 1)
    got = run_child(wide_lake, str(tmp_path / "cache"), "memory", prefetch, batch, kind, window)
    assert got["exact"] and got["source"] == "scan"
    bound = max(prefetch, 3 * read + read + batch * ROW_BYTES)
    assert 0 < got["accounted"] <= bound, (got["accounted"] / MIB, bound / MIB)
    assert got["epoch_growth"] <= 2 * bound + 16 * MIB < ROWS * ROW_BYTES, (got["epoch_growth"] / MIB, bound / MIB)


@pytest.mark.parametrize("prefetch", [1, 2 * MIB, 64 * MIB])
def test_polars_stream_bytes_in_flight_respect_prefetch(wide_lake, tmp_path, prefetch):
    """An unshuffled epoch read through one polars streaming query: the loader's account
    counts what the query holds decoded ahead of the readers (``StreamQuery.held_bytes``:
    a few row groups per polars thread) besides the reads in flight, and stays within
    max(prefetch, that + one read + one batch); the process's resident memory grows by at
    most twice that plus a constant, short of the 64 MiB table."""
    import polars as pl
    from arrowload.scan.stream import AHEAD_EXTRA, AHEAD_PER_THREAD
    batch = 64
    rg_bytes = 512 * ROW_BYTES  # 2 MiB, uncompressed
    got = run_child(wide_lake, str(tmp_path / "cache"), "memory", prefetch, batch, "none", 2, stream=True)
    assert got["exact"] and got["source"] == "scan"
    assert set(got["decoders"]) == {"polars-stream"}, got["decoders"]
    held = (AHEAD_PER_THREAD * pl.thread_pool_size() + AHEAD_EXTRA + 1) * rg_bytes
    bound = max(prefetch, held + rg_bytes + batch * ROW_BYTES)
    assert held <= got["accounted"] <= bound, (got["accounted"] / MIB, bound / MIB)
    assert got["epoch_growth"] <= 2 * bound + 16 * MIB, (got["epoch_growth"] / MIB, bound / MIB)
    assert got["epoch_growth"] < ROWS * ROW_BYTES, got["epoch_growth"] / MIB


def test_disk_cache_holds_less_anonymous_memory_than_memory(wide_lake, tmp_path):
    """The disk cache is written streaming in bounded chunks and read memory-mapped: its
    peak anonymous memory (build and epoch) is below the in-memory table's, and below the
    table itself. Before: 65,536-row write units held the whole table (and a copy).
    (It used to save more than the table: the in-memory build held the batches and their
    concatenation, 3.2x the table; it now holds the table once, see the next test.)"""
    table_bytes = ROWS * ROW_BYTES
    memory = run_child(wide_lake, str(tmp_path / "m"), "memory", 2 * MIB, 64)
    disk = run_child(wide_lake, str(tmp_path / "d"), "disk", 2 * MIB, 64)
    assert memory["exact"] and disk["exact"]
    assert memory["source"] == "table (memory)" and disk["source"].endswith(".arrow)")
    assert memory["order"] == disk["order"]  # where the table lives never changes the order
    assert memory["peak_anon"] >= table_bytes  # the measure sees the table when it is held
    # the disk path never holds the table
    assert disk["peak_anon"] < min(table_bytes, memory["peak_anon"]), (
        f"disk {disk['peak_anon'] / MIB:.1f} MiB {disk['parts_mib']} modules {disk['modules']}; "
        f"memory {memory['peak_anon'] / MIB:.1f} MiB {memory['parts_mib']}")


def test_global_shuffle_peak_is_the_table_plus_prefetch(wide_lake, tmp_path):
    """A global epoch, its build included, holds at most the decoded table + the prefetch
    budget + 10% (+ 16 MiB for the interpreter and allocator): the table is built in place
    (preallocated columns, units copied in and dropped), never as batches plus their
    concatenation (before: 3.2x the table at the build's peak, here about 200 MiB)."""
    prefetch = 32 * MIB
    got = run_child(wide_lake, str(tmp_path / "cache"), "memory", prefetch, 64)
    assert got["exact"] and got["source"] == "table (memory)"
    table = got["table_bytes"]
    assert table >= ROWS * ROW_BYTES
    bound = 1.1 * (table + prefetch) + 16 * MIB
    assert got["peak_anon"] <= bound, (got["peak_anon"] / MIB, bound / MIB)


def test_disk_cache_record_batches_are_bounded_in_bytes(wide_lake, tmp_path):
    """The cache file is written in record batches of a bounded size: at ``memory_budget=1``
    the 1 MiB floor (a 4 KiB row: about 250 rows, where a fixed 65,536 rows made one 64 MiB
    batch here), all of ``chunk_rows`` but the last; the file holds exactly pyarrow's rows,
    in source order."""
    cache = str(tmp_path / "cache")
    loader = al.dataset(wide_lake).loader(64, shuffle="global", memory_budget=1, cache_dir=cache)
    (arrow,) = glob.glob(os.path.join(cache, "ra-*.arrow"))
    (manifest,) = glob.glob(os.path.join(cache, "ra-*.json"))
    with open(manifest) as f:
        doc = json.load(f)
    with pa.memory_map(arrow) as src:
        reader = pa.ipc.open_file(src)
        batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        assert max(b.nbytes for b in batches) <= MIB
        assert {b.num_rows for b in batches[:-1]} == {doc["chunk_rows"]} and batches[-1].num_rows <= doc["chunk_rows"]
        assert MIB // (2 * ROW_BYTES) <= doc["chunk_rows"] <= MIB // ROW_BYTES
        stored = pa.Table.from_batches(batches)
        assert stored.equals(pq.read_table(wide_lake))
    # the units (and so any order) are the table's 65,536-row units, not the file's batches
    assert loader._source.counts == (ROWS,)
    loader.close()


def test_block_shuffle_peak_is_the_prefetch_plus_two_windows(wide_lake, tmp_path):
    """A block epoch never holds the table: at most the windows its budget lets in (the
    one being cut into batches and the next being read, each counted at the loader's
    estimate), + 10% (+ 16 MiB for the interpreter and allocator)."""
    prefetch = 32 * MIB
    got = run_child(wide_lake, str(tmp_path / "cache"), "memory", prefetch, 64, "block")
    assert got["exact"] and got["source"] == "scan"
    window = got["window_est"]
    assert window >= 8 * 512 * ROW_BYTES  # 8 row groups of 512 rows per window
    bound = 1.1 * (prefetch + 2 * window) + 16 * MIB
    assert got["peak_anon"] <= bound, (got["peak_anon"] / MIB, bound / MIB)


@pytest.mark.parametrize("prefetch", [1, 64 << 10, 256 << 20])
@pytest.mark.parametrize("kind", ["global", "block"])
def test_table_orders_are_independent_of_read_sizes(tmp_path, kind, prefetch):
    """Over a random-access table (here forced by a limit), both shuffles follow the order
    layer exactly, whatever prefetch makes the reads: gathers are a grouping of the same
    order. Truth: the order layer's rows over pyarrow's table, units of 65,536 rows."""
    n = 140_000
    table = pa.table({"id": np.arange(n, dtype=np.int64) * 7, "x": np.arange(n, dtype=np.float32)})
    ds = al.dataset(table).limit(n - 1_000)
    loader = ds.loader(1_000, shuffle=kind, seed=5, shuffle_window=2, prefetch=prefetch,
                       cache_dir=str(tmp_path), io_threads=3)
    loader.set_epoch(2)
    got = np.concatenate([b["id"] for b in loader])
    rows = n - 1_000
    counts = (65_536, 65_536, rows - 2 * 65_536)
    assert loader._source.counts == counts
    order = EpochOrder(counts, kind, seed=5, epoch=2, window=2)
    expect = table.column("id").to_numpy()[:rows][order.rows(0, rows)]
    np.testing.assert_array_equal(got, expect)


@pytest.mark.parametrize("shuffle", ["block", "global", False])
def test_idle_pooled_buffers_stay_within_prefetch(tmp_path, shuffle):
    """The loader's buffer pool kept up to 64 MiB of idle buffers whatever ``prefetch``
    said: a block shuffle at prefetch=1 MiB held 24.5 MiB after its epochs (measured by a
    review helper through pyarrow's pool and RSS). The pool's idle bytes now stay within
    the budget, and the rows are pyarrow's."""
    n = 200_000
    table = pa.table({f"f{i}": np.random.default_rng(i).random(n, dtype=np.float32) for i in range(8)})
    table = table.append_column("id", pa.array(np.arange(n)))
    pq.write_table(table, str(tmp_path / "t.parquet"), row_group_size=16_384)
    budget = 1 << 20
    with al.dataset(str(tmp_path / "t.parquet")).loader(1024, shuffle=shuffle, prefetch=budget, output="numpy",
                                                        stack={"x": [f"f{i}" for i in range(8)]}) as loader:
        for _ in range(2):
            ids = np.sort(np.concatenate([b["id"] for b in loader]))
            assert np.array_equal(ids, np.arange(n))
            assert loader._pool.pooled_bytes <= budget


@pytest.mark.parametrize("shuffle", [False, "block"])
def test_strings_converted_to_python_objects_are_counted_in_the_prefetch_budget(tmp_path, shuffle):
    """A column converted to Python objects was counted at its Arrow bytes (about 9 a short
    string) where each row holds a str object and a list slot (about 60): the budget's
    peak said 7 MiB of a block shuffle holding 189 MiB. Truth: sys.getsizeof of the
    strings a block-shuffle window holds at once (it is held whole), one read unshuffled."""
    import arrowload as al
    rows_per_group, groups = 10_000, 4
    words = [f"w{i % 997}" for i in range(rows_per_group * groups)]
    pq.write_table(pa.table({"s": words}), str(tmp_path / "t.parquet"), row_group_size=rows_per_group)
    loader = al.dataset(str(tmp_path / "t.parquet")).loader(
        1000, shuffle=shuffle, shuffle_window=groups, prefetch=1, cache_dir=str(tmp_path / "c"))
    assert sorted(s for b in loader for s in b["s"]) == sorted(words)
    held = words if shuffle == "block" else words[:rows_per_group]  # a window, or one row group's read
    truth = sum(sys.getsizeof(s) + 8 for s in held)
    assert loader.stats().peak_prefetch_bytes >= truth
