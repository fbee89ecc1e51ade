"""Unshuffled epochs read through one polars streaming query per range (``scan/stream.py``,
``pipeline/streamreads.py``).

Truths: the per-unit path (``ARROWLOAD_STREAM=0``) of the same loader, batch by batch
(rows, order and boundaries), and DuckDB's rows over the same files; ``stats()`` says which
path read. Covered: no filter, filters polars translates (one pruning row groups by
statistics), projections, ranks, ``drop_last``, resume mid-unit / mid-file, elastic resume
(several ranges), close mid-epoch, the cases that stay on the per-unit path.
"""

from __future__ import annotations

import os
import threading

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import arrowload as al
from arrowload.pipeline.loader import STREAM_READERS
from arrowload.pipeline.streamreads import StreamReads, merge_ranges
from arrowload.scan.stream import STREAM_DECODER, WINDOW_DECODER, StreamQuery
from _support import fresh_python

FILES = [(1000, 128), (777, 100), (1500, 256)]  # (rows, row group size) per file


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("stream-lake")
    rng = np.random.default_rng(7)
    start = 0
    for i, (n, rg) in enumerate(FILES):
        t = pa.table({
            "id": np.arange(start, start + n, dtype=np.int64),
            "x": rng.standard_normal(n).astype(np.float32),
            "s": pa.array(rng.choice(["a", "b", "c"], n).tolist(), pa.string()),
            "k": rng.integers(0, 10, n).astype(np.int32),
        })
        pq.write_table(t, path / f"part-{i}.parquet", row_group_size=rg)
        start += n
    return str(path)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("stream-cache"))


def _epoch(ds, monkeypatch, stream: bool, output="numpy", n=None, state=None, **kw):
    """Batches (dicts of lists) of one epoch, the loader's decoders and its state after
    ``n`` batches (None: the whole epoch)."""
    monkeypatch.setenv("ARROWLOAD_STREAM", "1" if stream else "0")
    with ds.loader(kw.pop("batch_size", 100), output=output, **kw) as loader:
        if state is not None:
            loader.load_state_dict(state)
        out, taken = [], None
        for i, b in enumerate(loader):
            if output == "arrow":
                b = b.to_pydict()
            out.append({k: np.asarray(v).tolist() for k, v in b.items()})
            if n is not None and i + 1 == n:
                taken = loader.state_dict()
                break
        return out, loader.stats().decoders, taken


def _duck(lake: str, cols: list[str], where: str | None) -> list[dict]:
    sql = f"SELECT {', '.join(cols)} FROM read_parquet('{lake}/*.parquet')"
    if where:
        sql += f" WHERE {where}"
    t = duckdb.sql(sql + " ORDER BY id").arrow()
    t = t.read_all() if hasattr(t, "read_all") else t
    return t.to_pylist()


def _rows(batches: list[dict]) -> list[dict]:
    return [dict(zip(b, vals)) for b in batches for vals in zip(*b.values())]


# "id >= 1500" prunes row groups at the start, "id < 1400" at the end (the last unit ends
# mid-file: the query slices off the rows after it), "id BETWEEN ..." at both ends
FILTERS = [None, "k < 5 AND s = 'a'", "id >= 1500", "id < 1400", "id BETWEEN 300 AND 2000",
           "k IN (1, 2) OR s = 'c'", "x > 0.3 AND k < 7"]  # x: float32 against a literal rounded to it
SELECTS = [("id", "x", "s", "k"), ("x", "id")]


@pytest.mark.parametrize("where", FILTERS)
@pytest.mark.parametrize("cols", SELECTS)
@pytest.mark.parametrize("output", ["numpy", "arrow"])
def test_stream_matches_the_unit_path_and_duckdb(lake, cache_dir, monkeypatch, where, cols, output):
    ds = al.dataset(lake)
    if where:
        ds = ds.filter(where)
    ds = ds.select(*cols)
    streamed, dec, _ = _epoch(ds, monkeypatch, True, output, cache_dir=cache_dir)
    units, dec_units, _ = _epoch(ds, monkeypatch, False, output, cache_dir=cache_dir)
    assert set(dec) == {STREAM_DECODER}, dec
    assert STREAM_DECODER not in dec_units
    assert streamed == units  # rows, order and batch boundaries
    truth = _duck(lake, list(cols) if "id" in cols else ["id", *cols], where)
    got = _rows(streamed)
    assert [{c: r[c] for c in cols} for r in got] == pytest.approx([{c: r[c] for c in cols} for r in truth])


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("where", [None, "k < 5 AND s = 'a'"])
def test_ranks_and_drop_last(lake, cache_dir, monkeypatch, world, drop_last, where):
    ds = al.dataset(lake)
    if where:
        ds = ds.filter(where)
    seen = []
    for rank in range(world):
        kw = dict(rank=rank, world_size=world, drop_last=drop_last, batch_size=64, cache_dir=cache_dir)
        streamed, dec, _ = _epoch(ds, monkeypatch, True, **kw)
        units, _, _ = _epoch(ds, monkeypatch, False, **kw)
        assert set(dec) == {STREAM_DECODER} and streamed == units
        seen += [r["id"] for r in _rows(streamed)]
    assert len(seen) == len(set(seen))  # ranks disjoint


@pytest.mark.parametrize("where", [None, "k < 5 AND s = 'a'", "id >= 1500"])
@pytest.mark.parametrize("at", [0.1, 0.35, 0.6, 0.9])
def test_resume_at_any_position(lake, cache_dir, monkeypatch, where, at):
    """Batches of 90 rows against row groups of 128 / 100 / 256: positions mid-unit and
    mid-file; the stream starts at the first unit's file and skips (with a filter: the
    filtered rows) up to the position."""
    ds = al.dataset(lake)
    if where:
        ds = ds.filter(where)
    full, _, _ = _epoch(ds, monkeypatch, False, batch_size=90, cache_dir=cache_dir)
    k = max(1, int(at * len(full)))
    assert 1 <= k < len(full)
    _, _, state = _epoch(ds, monkeypatch, True, batch_size=90, n=k, cache_dir=cache_dir)
    rest, dec, _ = _epoch(ds, monkeypatch, True, batch_size=90, state=state, cache_dir=cache_dir)
    assert set(dec) == {STREAM_DECODER}
    assert rest == full[k:]


@pytest.mark.parametrize("where", [None, "k < 5 AND s = 'a'"])
def test_elastic_resume_reads_several_ranges(lake, cache_dir, monkeypatch, where):
    """A state taken at world size 2 loaded at 3: each rank reads several ranges, one query
    each; the same batches as the per-unit path, and every row once."""
    ds = al.dataset(lake)
    if where:
        ds = ds.filter(where)
    _, _, state = _epoch(ds, monkeypatch, False, batch_size=50, n=3, rank=0, world_size=2, cache_dir=cache_dir)
    got = []
    for rank in range(3):
        kw = dict(batch_size=50, rank=rank, world_size=3, state=state, cache_dir=cache_dir)
        streamed, dec, _ = _epoch(ds, monkeypatch, True, **kw)
        units, _, _ = _epoch(ds, monkeypatch, False, **kw)
        assert set(dec) == {STREAM_DECODER} and streamed == units
        got += [r["id"] for r in _rows(streamed)]
    assert len(got) == len(set(got))


def test_several_ranges_one_query_each(lake, cache_dir):
    """The reads of two disjoint ranges out of order of the source: each range is its own
    query, started at its first unit's file."""
    ds = al.dataset(lake).filter("k < 5")
    with ds.loader(10, cache_dir=cache_dir) as loader:
        src, order = loader._source, loader._order(0)
        n = loader.num_rows
        ranges = [(n // 2, n - 5), (3, n // 3)]
        reads = StreamReads(src.stream_query(), src, order, ranges, wait_import=True)  # polars may still be importing
        from arrowload.order import plan_tasks
        tasks = list(plan_tasks(order, ranges, loader._source_shape(), 10, 1 << 20))
        got = pa.Table.from_batches([b for t in tasks for b in reads.read(t)[0]])
        reads.close()
        assert reads.queries == 2 and reads.failed is None
    truth = pa.concat_tables([src.read_unit(u) for u in range(len(src.counts))])
    want = pa.concat_tables([truth.slice(a, b - a) for a, b in ranges])
    assert got.equals(want)


@pytest.mark.parametrize("where", ["id < 1400", "id BETWEEN 300 AND 2000", "id >= 1500", None])
def test_the_query_slices_from_the_first_units_start_to_the_last_units_end(lake, where):
    """Before filtering, a range's query keeps exactly the file rows from its first unit's
    start to its last unit's end (so polars reads no row group after the last unit): the
    slice's offset and length against the row groups' rows in the footers (pyarrow)."""
    ds = al.dataset(lake).filter(where) if where else al.dataset(lake)
    q = StreamQuery.compile(ds.optimized_plan(), ds.options)
    assert q is not None
    files = sorted(os.listdir(lake))
    groups = []  # (file, first row in the file, rows) of every row group, in path order
    for f, name in enumerate(files):
        md = pq.ParquetFile(os.path.join(lake, name)).metadata
        at = 0
        for g in range(md.num_row_groups):
            groups.append((f, at, md.row_group(g).num_rows))
            at += md.row_group(g).num_rows
    rows_of = {f: sum(n for g, _, n in groups if g == f) for f in range(len(files))}
    index = {(u.file, u.row_group): i for i, u in enumerate(q.scan.source.units())}
    for first in range(len(q.units)):
        for last in range(first, len(q.units)):
            a, b = q.units[first], q.units[last]
            span_files = sorted({u.file for u in q.units[first:last + 1]})
            fa, start, _ = groups[index[(a.file, a.row_group)]]
            fb, b_start, b_rows = groups[index[(b.file, b.row_group)]]
            want = sum(rows_of[f] for f in span_files[:-1]) - start + b_start + b_rows
            span = q._span(first, last, span_files)
            assert q._file_offset(first) == start
            if b_start + b_rows == rows_of[fb]:
                assert span is None  # the last unit ends its file: nothing to slice off
            else:
                assert span == want, (first, last)


def test_merge_ranges():
    assert merge_ranges([(0, 5), (5, 9), (9, 9), (12, 20), (3, 4)]) == [(0, 9), (12, 20), (3, 4)]


def test_close_mid_epoch_stops_the_query_and_threads(lake, cache_dir, monkeypatch):
    monkeypatch.setenv("ARROWLOAD_STREAM", "1")
    loader = al.dataset(lake).loader(16, prefetch=1, cache_dir=cache_dir)
    it = iter(loader)
    for _ in range(3):
        next(it)
    assert loader.stats().decoders == {} or set(loader.stats().decoders) == {STREAM_DECODER}
    pipeline = it._pipeline
    reads = pipeline.stages.close.__self__
    assert isinstance(reads, StreamReads)
    loader.close()
    assert reads._it is None and reads._closed  # the query dropped (polars stops it)
    assert not any(t.name.startswith("arrowload-") and t.is_alive() for t in threading.enumerate())
    # an early exit (break, the iterator dropped) closes it too
    loader = al.dataset(lake).loader(16, cache_dir=cache_dir)
    it = iter(loader)
    next(it)
    reads = it._pipeline.stages.close.__self__
    del it
    import gc
    gc.collect()
    assert reads._closed and reads._it is None
    loader.close()


@pytest.mark.parametrize("setup", [
    dict(where="s LIKE '%a%b%'"),                 # a predicate polars does not translate here
    dict(where="x > 1e-1"),                       # float32 against a DOUBLE: compared by DuckDB
    dict(shuffle="block"),
    dict(map=True),
])
def test_not_eligible_stays_on_the_unit_path(lake, cache_dir, monkeypatch, setup):
    ds = al.dataset(lake)
    if "where" in setup:
        ds = ds.filter(setup["where"])
    if setup.get("map"):
        ds = ds.map(lambda b: b, name="same")
    monkeypatch.setenv("ARROWLOAD_STREAM", "1")
    kw = {"shuffle": setup["shuffle"]} if "shuffle" in setup else {}
    with ds.loader(100, cache_dir=cache_dir, **kw) as loader:
        n = sum(len(b["id"]) for b in loader)
        assert STREAM_DECODER not in loader.stats().decoders
    assert n == loader.num_rows


def test_the_environment_picks_the_path(lake, cache_dir, monkeypatch):
    ds = al.dataset(lake).select("id", "k")
    monkeypatch.delenv("ARROWLOAD_STREAM", raising=False)
    for pinned, stream in [("pyarrow", False), ("polars-stream", True), ("pyarrow,polars-stream", True)]:
        monkeypatch.setenv("ARROWLOAD_DECODER", pinned)
        with ds.loader(100, cache_dir=cache_dir) as loader:
            list(loader)
            assert (STREAM_DECODER in loader.stats().decoders) is stream, (pinned, loader.stats().decoders)
    monkeypatch.delenv("ARROWLOAD_DECODER")
    monkeypatch.setenv("ARROWLOAD_STREAM", "1")
    with ds.loader(100, cache_dir=cache_dir) as loader:
        list(loader)
        assert set(loader.stats().decoders) == {STREAM_DECODER}
        assert STREAM_DECODER in str(loader.stats()) and STREAM_DECODER in str(loader.profile())


def test_compile_refuses_what_polars_cannot_read_the_same(tmp_path):
    """Files with different types of a column (unified by a cast), or a projection with a
    computed column: no stream."""
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int32())}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": pa.array([3, 4], pa.int64())}), tmp_path / "b.parquet")
    opts = al.Options()
    plan = al.dataset(str(tmp_path)).optimized_plan()
    assert StreamQuery.compile(plan, opts) is None
    one = tmp_path / "one"
    one.mkdir()
    pq.write_table(pa.table({"id": [1, 2]}), one / "a.parquet")
    assert StreamQuery.compile(al.dataset(str(one)).optimized_plan(), opts) is not None
    assert StreamQuery.compile(al.dataset(str(one)).select(y="id + 1").optimized_plan(), opts) is None


def test_data_changed_under_the_stream_is_an_error(tmp_path, cache_dir, monkeypatch):
    path = tmp_path / "lake"
    path.mkdir()
    pq.write_table(pa.table({"id": np.arange(500)}), path / "a.parquet", row_group_size=100)
    monkeypatch.setenv("ARROWLOAD_STREAM", "1")
    loader = al.dataset(str(path)).loader(50, cache_dir=cache_dir)
    pq.write_table(pa.table({"id": np.arange(300)}), path / "a.parquet", row_group_size=100)
    with pytest.raises(al.ArrowloadError):
        list(loader)
    loader.close()


def test_default_never_imports_polars_for_a_short_epoch(lake, tmp_path):
    """Without polars imported (and the unit reader not choosing it), a short epoch stays on
    the per-unit path: the import would cost more than the stream saves. With polars
    imported, the same loader streams."""
    code = (
        "import sys, arrowload as al\n"
        f"ds = al.dataset({lake!r}).select('id', 'x')\n"
        f"with ds.loader(100, cache_dir={str(tmp_path)!r}) as ld:\n"
        "    n = sum(len(b['id']) for b in ld)\n"
        "    print(n, 'polars' in sys.modules, sorted(ld.stats().decoders))\n"
        "import polars\n"
        f"with ds.loader(100, cache_dir={str(tmp_path)!r}) as ld:\n"
        "    n = sum(len(b['id']) for b in ld)\n"
        "    print(n, sorted(ld.stats().decoders))\n")
    out = fresh_python(code)
    rows = sum(n for n, _ in FILES)
    assert out[0] == f"{rows} False ['pyarrow']", out
    assert out[1] == f"{rows} ['{STREAM_DECODER}']", out


def test_many_small_units_pay_for_the_polars_import(tmp_path):
    """Without polars imported, an epoch of many small units (600 row groups of 10 rows)
    is to stream: a task and a hand-off per unit cost more than the import. The first
    tasks read per unit while polars imports on a thread of its own (this epoch may end
    before it does: the import having started is the choice); rows are the file's, in
    order. A short epoch of few units never imports it (above)."""
    from arrowload.pipeline.loader import STREAM_IMPORT_UNITS
    n = 10 * (STREAM_IMPORT_UNITS + 88)
    path = tmp_path / "tiny.parquet"
    pq.write_table(pa.table({"id": np.arange(n, dtype=np.int64), "x": np.ones(n, np.float32)}), path,
                   row_group_size=10)
    code = (
        "import sys, numpy as np, arrowload as al\n"
        "from arrowload.scan import stream\n"
        f"with al.dataset({str(path)!r}).loader(256, output='numpy', cache_dir={str(tmp_path / 'c')!r}) as ld:\n"
        "    ids = np.concatenate([b['id'] for b in ld])\n"
        "    importing = stream._importer\n"
        "    print(len(ids), bool((ids == np.arange(len(ids))).all()), importing is not None)\n")
    out = fresh_python(code)
    assert out[0] == f"{n} True True", out


def test_block_windows_follow_the_loaders_rule_for_polars_reads(lake, tmp_path):
    """Block windows are read by polars by the loader's rule for polars reads
    (``_stream_allowed``): a short block epoch in a process without polars reads per unit
    and does not import it (its import would cost more than it saves); with polars
    imported, the same loader reads its windows through it, the same batches."""
    code = (
        "import sys, threading, arrowload as al\n"
        f"ds = al.dataset({lake!r}).select('id', 'x')\n"
        "def epoch():\n"
        f"    with ds.loader(100, shuffle='block', seed=1, cache_dir={str(tmp_path)!r}) as ld:\n"
        "        ids = [i for b in ld for i in b['id'].tolist()]\n"
        "        return ids, sorted(ld.stats().decoders)\n"
        "a, dec = epoch()\n"
        "print('polars' in sys.modules, any('import-polars' in t.name for t in threading.enumerate()), dec)\n"
        "import polars\n"
        "b, dec = epoch()\n"
        "print(a == b, dec)\n")
    out = fresh_python(code)
    assert out[0] == "False False ['pyarrow']", out
    assert out[1] == f"True ['{WINDOW_DECODER}']", out


def test_a_fresh_process_reads_per_unit_while_polars_imports_then_streams(tmp_path, monkeypatch):
    """Polars not imported: the stream's first tasks read on the per-unit path while its
    import runs on a thread of its own (the first batch does not wait for it), then the query
    opens at the next task's start -- mid-file, after a filter: the file's rows before that
    unit are sliced off ahead of the filter. The batches are the per-unit path's, the rows
    DuckDB's. (The consumer paces itself, 4 ms a batch, so that the epoch outlasts the import.)"""
    import json
    lake = tmp_path / "lake"
    lake.mkdir()
    rng = np.random.default_rng(3)
    n = 40_000
    pq.write_table(pa.table({"id": np.arange(n, dtype=np.int64), "x": rng.standard_normal(n).astype(np.float32),
                             "k": rng.integers(0, 10, n).astype(np.int32)}), lake / "a.parquet", row_group_size=128)
    where = "k IN (1, 2)"
    code = (
        "import json, time, arrowload as al\n"
        "from arrowload.pipeline import loader as L\n"
        "L.STREAM_FILTER_IMPORT_BYTES = 0  # this small lake streams by default, as a large one\n"
        f"ds = al.dataset({str(lake)!r}).filter({where!r}).select('id', 'x')\n"
        "batches = []\n"
        f"with ds.loader(32, prefetch=64 << 10, cache_dir={str(tmp_path)!r}) as ld:\n"
        "    for b in ld:\n"
        "        batches.append(b['id'].tolist())\n"
        "        time.sleep(0.004)\n"
        "    print(json.dumps({'batches': batches, 'dec': ld.stats().decoders}))\n")
    out = json.loads([line for line in fresh_python(code, timeout=300) if line.strip()][-1])
    assert set(out["dec"]) == {"pyarrow", STREAM_DECODER}, out["dec"]
    assert out["dec"]["pyarrow"] >= 1 and out["dec"][STREAM_DECODER] >= 1
    monkeypatch.setenv("ARROWLOAD_STREAM", "0")
    with al.dataset(str(lake)).filter(where).select("id", "x").loader(32, cache_dir=str(tmp_path)) as ld:
        unit_path = [b["id"].tolist() for b in ld]
    assert out["batches"] == unit_path
    truth = duckdb.sql(f"SELECT id FROM read_parquet('{lake}/*.parquet') WHERE {where} ORDER BY id").fetchall()
    assert [i for b in out["batches"] for i in b] == [r[0] for r in truth]


def test_an_unshuffled_mixture_streams_by_the_loaders_rule(lake, tmp_path):
    """A mixture's components are loaders the mixture reads: they start no polars import of
    their own. The unshuffled mixture itself reads one union stream by the single loader's
    rule (``_stream_allowed``): on this small lake at the default import thresholds it
    reads per unit and imports nothing; where the read pays the import (threshold 0, as a
    large lake) its first task starts the import and the epoch streams once it has ended."""
    code = (
        "import sys, threading, arrowload as al\n"
        "from arrowload.pipeline import loader as L\n"
        f"ds = al.dataset({lake!r})\n"
        "parts = {s: ds.filter(f\"s = '{s}'\").select('id', 'x') for s in 'abc'}\n"
        "def mix():\n"
        f"    return al.mix(parts, temperature=1.0, cache_dir={str(tmp_path)!r}).loader(50, shuffle=False, "
        f"cache_dir={str(tmp_path)!r})\n"
        "mx = mix()\n"
        "n = sum(len(b['id']) for b in mx)\n"
        "busy = [t for t in threading.enumerate() if t.name == 'arrowload-import-polars']\n"
        "print(n > 0, 'polars' in sys.modules or bool(busy), mx._stream is None)\n"
        "L.STREAM_FILTER_IMPORT_BYTES = 0  # this small lake streams by default, as a large one\n"
        "mx = mix()\n"
        "n = sum(len(b['id']) for b in mx)\n"
        "for t in threading.enumerate():\n"
        "    if t.name == 'arrowload-import-polars':\n"
        "        t.join()\n"
        "print(n > 0, 'polars' in sys.modules, mx._stream is not None)\n")
    out = fresh_python(code)
    assert out[0] == "True False True", out
    assert out[1] == "True True True", out


def test_default_keeps_to_the_budget(lake, cache_dir, monkeypatch):
    """By default the stream runs only where what polars decodes ahead fits half of
    ``prefetch``: a tiny budget keeps the per-unit path (and its bound), a roomy one
    streams; both the same batches."""
    import polars  # noqa: F401 - imported: the import is no reason to stay per unit
    monkeypatch.delenv("ARROWLOAD_STREAM", raising=False)
    monkeypatch.delenv("ARROWLOAD_DECODER", raising=False)
    ds = al.dataset(lake).filter("k < 5")
    got = {}
    for prefetch in (4096, 64 << 20):
        with ds.loader(64, prefetch=prefetch, cache_dir=cache_dir) as loader:
            got[prefetch] = [b["id"].tolist() for b in loader]
            decoders = loader.stats().decoders
            src = loader._source
            held = src.stream_query().held_bytes(max(src.est_bytes(i) for i in range(len(src.counts))))
            assert (STREAM_DECODER in decoders) is (held <= prefetch // 2), (prefetch, held, decoders)
    assert got[4096] == got[64 << 20]


# ---------------------------------------------------------------------------
# a global shuffle's random-access table built from the stream (rowsource.materialize)


def _count_queries(monkeypatch, fail: str | None = None) -> list:
    """Wrap ``StreamQuery.batches``: each call recorded; ``fail`` makes the query raise after
    its first batch (``"error"``), end a batch early (``"short"``) or repeat its first batch
    (``"long"``)."""
    calls = []
    orig = StreamQuery.batches

    def batches(self, *a, **k):
        calls.append(a)
        it = orig(self, *a, **k)
        if fail is None:
            return it

        def broken():
            batches = list(it)
            yield batches[0]
            if fail == "error":
                raise RuntimeError("the query failed")
            if fail == "long":
                yield batches[0]
            yield from batches[1:-1] if fail == "short" else batches[1:]
        return broken()

    monkeypatch.setattr(StreamQuery, "batches", batches)
    return calls


@pytest.mark.parametrize("where", [None, "k < 5 AND s = 'a'", "id >= 1500"])
@pytest.mark.parametrize("stack", [None, {"v": ["x", "k"]}])
def test_global_table_from_the_stream_equals_the_units(lake, tmp_path, monkeypatch, where, stack):
    """A global shuffle's table built from one polars query holds what the build from the
    units holds: every batch of the epoch equal (rows, order), the rows DuckDB's."""
    from arrowload.pipeline import rabuild
    calls = _count_queries(monkeypatch)
    per_unit = []
    build = rabuild.build
    monkeypatch.setattr(rabuild, "build", lambda *a, **k: per_unit.append(1) or build(*a, **k))
    ds = al.dataset(lake)
    if where:
        ds = ds.filter(where)
    kw = dict(shuffle="global", seed=3, batch_size=64, stack=stack)
    streamed, _, _ = _epoch(ds, monkeypatch, True, cache_dir=str(tmp_path / "a"), **kw)
    assert len(calls) == 1 and not per_unit  # the build's query (a global epoch reads the table)
    units, _, _ = _epoch(ds, monkeypatch, False, cache_dir=str(tmp_path / "b"), **kw)
    assert len(calls) == 1 and per_unit
    assert streamed == units
    ids = sorted(r["id"] for r in _rows(streamed))
    assert ids == [r["id"] for r in _duck(lake, ["id"], where)]


@pytest.mark.parametrize("fail", ["error", "short", "long"])
def test_global_table_falls_back_to_the_units_when_the_stream_fails(lake, tmp_path, monkeypatch, fail):
    """A query that fails, or gives fewer or more rows than counted, leaves the build to the
    units: the same epoch as without the stream."""
    ds = al.dataset(lake).filter("k < 5")
    kw = dict(shuffle="global", seed=5, batch_size=50)
    want, _, _ = _epoch(ds, monkeypatch, False, cache_dir=str(tmp_path / "a"), **kw)
    calls = _count_queries(monkeypatch, fail)
    got, _, _ = _epoch(ds, monkeypatch, True, cache_dir=str(tmp_path / "b"), **kw)
    assert len(calls) == 1 and got == want


def test_global_table_stream_follows_the_environment(lake, tmp_path, monkeypatch):
    """By default (polars imported here) the table streams; ``ARROWLOAD_DECODER`` naming only
    unit decoders, or ``ARROWLOAD_STREAM=0``, keeps it on the units."""
    import polars  # noqa: F401 - the default rule streams where polars is imported
    calls = _count_queries(monkeypatch)
    ds = al.dataset(lake)
    for env, streams in [({}, True), ({"ARROWLOAD_DECODER": "pyarrow"}, False), ({"ARROWLOAD_STREAM": "0"}, False)]:
        monkeypatch.delenv("ARROWLOAD_STREAM", raising=False)
        monkeypatch.delenv("ARROWLOAD_DECODER", raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        before = len(calls)
        with ds.loader(100, shuffle="global", seed=1, cache_dir=str(tmp_path / str(len(calls)))) as loader:
            assert sum(len(b["id"]) for b in loader) == sum(n for n, _ in FILES)
        assert (len(calls) > before) is streams, env


# ---------------------------------------------------------------------------
# a block shuffle's windows read by polars at once (rowsource._window_tables)


@pytest.mark.parametrize("where", [None, "k < 5 AND s = 'a'", "id BETWEEN 300 AND 2000"])
@pytest.mark.parametrize("stack", [None, {"v": ["x", "k"]}])
@pytest.mark.parametrize("cols", [("id", "x", "s", "k"), ("id", "x", "k")])  # Arrow windows / host layouts
def test_block_windows_read_by_polars_equal_the_unit_reads(lake, cache_dir, monkeypatch, where, stack, cols):
    """A block-shuffled epoch whose windows polars reads at once (``StreamQuery.unit_tables``)
    gives the batches of the per-unit reads (``ARROWLOAD_STREAM=0``), batch by batch; its
    rows are DuckDB's. With a string column the window is an Arrow table taken from; with
    numbers only, each unit is placed in the window's host layout."""
    import polars  # noqa: F401 - imported: every window reads through it
    ds = al.dataset(lake)
    if where:
        ds = ds.filter(where)
    ds = ds.select(*cols)
    kw = dict(shuffle="block", seed=5, batch_size=50, stack=stack, cache_dir=cache_dir)
    windows, dec, _ = _epoch(ds, monkeypatch, True, **kw)
    units, dec_units, _ = _epoch(ds, monkeypatch, False, **kw)
    assert dec.get(WINDOW_DECODER, 0) == sum(dec.values()) > 0, dec
    assert WINDOW_DECODER not in dec_units
    assert windows == units
    truth = _duck(lake, ["id", "x", "s", "k"], where)
    got = sorted(_rows(windows), key=lambda r: r["id"])
    assert [r["id"] for r in got] == [r["id"] for r in truth]
    if stack is None and "s" in cols:
        assert [r["s"] for r in got] == [r["s"] for r in truth]


@pytest.mark.parametrize("fail", ["error", "short", "second"])
@pytest.mark.parametrize("cols", [("id", "x", "s", "k"), ("id", "x", "k")])
def test_block_windows_fall_back_to_the_units_when_polars_fails(lake, cache_dir, monkeypatch, fail, cols):
    """A window read that fails (a polars error) or gives other counts than the footers and
    the count index say is read again per unit: the same batches. ``second``: every second
    read of a few row groups fails (a host window reads its row groups a few at a time:
    the later ones then read per unit, the others still by polars)."""
    import polars  # noqa: F401
    orig = StreamQuery.unit_tables
    calls = []

    def broken(self, indices):
        calls.append(indices)
        if fail == "error" or (fail == "second" and len(calls) % 2 == 0):
            raise RuntimeError("the query failed")
        tables = orig(self, indices)
        return tables if fail == "second" else [tables[0].slice(1)] + tables[1:]

    ds = al.dataset(lake).filter("k < 5").select(*cols)
    # one reader: the windows' reads come in order, so the failing ones include later groups
    kw = dict(shuffle="block", seed=5, batch_size=50, cache_dir=cache_dir, io_threads=1)
    want, _, _ = _epoch(ds, monkeypatch, False, **kw)
    monkeypatch.setattr(StreamQuery, "unit_tables", broken)
    got, dec, _ = _epoch(ds, monkeypatch, True, **kw)
    assert calls and sum(dec.values()) > 0
    if fail == "second":
        assert dec.get(WINDOW_DECODER, 0) > 0
        assert "s" in cols or sum(v for k, v in dec.items() if k != WINDOW_DECODER) > 0, dec
    else:
        assert WINDOW_DECODER not in dec
    assert got == want


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_of_a_polars_process_knows_it(monkeypatch):
    """A process forked after polars was imported (a DataLoader worker of a loader that read
    with polars) says so: polars' pool did not survive the fork. The child only reads the
    flag and exits (no lock, no thread: nothing a fork of a threaded process can hang on)."""
    import polars  # noqa: F401 - imported before the fork
    from arrowload.scan import stream
    assert not stream.forked_with_polars()
    pid = os.fork()
    if pid == 0:  # the child
        os._exit(0 if stream.forked_with_polars() else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.parametrize("mixture", [False, True])
def test_block_windows_read_per_unit_in_a_forked_child_of_a_polars_process(lake, cache_dir, monkeypatch, mixture):
    """Where the process is such a fork (``forked_with_polars``), block windows and a
    mixture's shared units are read without polars: no window counted, the same batches."""
    import polars  # noqa: F401
    from arrowload import _polars
    from arrowload.mixture import shared
    ds = al.dataset(lake).select("id", "x", "k")
    if mixture:
        ds = al.mix({"a": ds.filter("k < 5"), "b": ds.filter("k >= 5")}, weights=[1, 1], seed=2,
                    cache_dir=cache_dir)
    calls = []
    decode = shared.Group.decode_many

    def counted(self, units):
        out = decode(self, units)
        calls.append(out is not None)
        return out
    monkeypatch.setattr(shared.Group, "decode_many", counted)

    def epoch():
        with ds.loader(50, shuffle="block", cache_dir=cache_dir, **({} if mixture else {"seed": 5})) as loader:
            got = [{k: np.asarray(v).tolist() for k, v in b.items()} for b in loader]
            return got, (loader.stats().decoders if not mixture else {})
    want, dec = epoch()
    assert (any(calls) if mixture else WINDOW_DECODER in dec)
    calls.clear()
    monkeypatch.setattr(_polars, "_forked_with_polars", True)
    got, dec = epoch()
    assert got == want
    assert not any(calls) and WINDOW_DECODER not in dec


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize("decoder", [None, "polars", "polars-stream"])
def test_dataloader_workers_forked_after_a_polars_epoch_read_without_polars(lake, decoder):
    """A real fork, as a user makes it: a fresh Python reads one epoch with polars (its pool
    running), then ``DataLoader`` forks two workers over the loader's ``torch_dataset()``.
    polars' pool does not survive the fork, so a query there waits forever: the workers
    must read with another decoder, and give the loader's own batches. Unshuffled (the
    stream, or the per-unit polars decoder where pinned) and block windows. Without the
    fork checks the workers hang: the DataLoader's timeout fails the program."""
    pin = "" if decoder is None else f"os.environ['ARROWLOAD_DECODER'] = {decoder!r}"
    code = f"""
import os, tempfile
{pin}
import polars, torch
from torch.utils.data import DataLoader
import arrowload as al
ds = al.dataset({lake!r}).select("id", "x", "k")
with tempfile.TemporaryDirectory() as cache:
    for shuffle in (False, "block"):
        with ds.loader(97, shuffle=shuffle, seed=3, output="torch", cache_dir=cache) as ld:
            own = [b["id"].clone() for b in ld]
            decoders = ld.stats().decoders
        with ds.loader(97, shuffle=shuffle, seed=3, output="torch", cache_dir=cache) as ld:
            got = [b["id"] for b in DataLoader(ld.torch_dataset(), batch_size=None, num_workers=2,
                                               multiprocessing_context="fork", timeout=60)]
        print(shuffle, sorted(decoders), len(own), len(got), all(torch.equal(a, b) for a, b in zip(own, got)))
"""
    lines = [line for line in fresh_python(code, timeout=300) if line]
    assert len(lines) == 2
    for line, shuffle in zip(lines, ("False", "block")):
        got_shuffle, rest = line.split(" ", 1)
        assert got_shuffle == shuffle
        assert "polars" in rest, line  # the parent's epoch did read with polars (stream, window or unit)
        assert rest.endswith("True"), line
        n_own, n_got = rest.rsplit("]", 1)[1].split()[:2]
        assert n_own == n_got and int(n_own) > 0, line


@pytest.mark.parametrize("shuffle", [False, "block"])
def test_a_forked_child_never_picks_polars_per_unit(lake, cache_dir, monkeypatch, shuffle):
    """In a process forked with polars imported, the per-unit reader skips its polars
    decoder even where it is pinned (pyarrow's reads answer, the same rows)."""
    import polars  # noqa: F401
    from arrowload import _polars
    monkeypatch.setenv("ARROWLOAD_DECODER", "polars")
    ds = al.dataset(lake).filter("k < 7").select("id", "x")

    def epoch():
        with ds.loader(64, shuffle=shuffle, seed=1, cache_dir=cache_dir) as loader:
            return [np.asarray(b["id"]).tolist() for b in loader], loader.stats().decoders
    want, dec = epoch()
    assert "polars" in dec
    monkeypatch.setattr(_polars, "_forked_with_polars", True)
    got, dec = epoch()
    assert got == want
    assert not any(name.startswith("polars") for name in dec), dec


def test_a_streamed_epoch_reads_on_one_thread_unless_told(lake, cache_dir, monkeypatch):
    """The stream's tasks take their rows one at a time while polars decodes on its own
    pool: by default one reader thread takes them; ``io_threads`` still sets the bound."""
    monkeypatch.setenv("ARROWLOAD_STREAM", "1")
    ds = al.dataset(lake).filter("k < 5").select("id", "x")
    for io_threads, bound in ((None, STREAM_READERS), (2, 2)):
        names: set[str] = set()
        with ds.loader(64, io_threads=io_threads, cache_dir=cache_dir) as loader:
            ids = []
            for b in loader:
                names |= {t.name for t in threading.enumerate() if t.name.startswith("arrowload-read-")}
                ids += list(b["id"])
            s = loader.stats()
        assert set(s.decoders) == {STREAM_DECODER}
        assert s.readers_max == bound and len(names) <= bound, (io_threads, s.readers_max, names)
        assert ids == [r["id"] for r in _duck(lake, ["id"], "k < 5")]


def test_block_window_tasks_count_the_units_polars_decodes_at_once(lake, cache_dir, monkeypatch):
    """A whole window's task holds its rows once plus the units decoded and not yet placed:
    ``window_step()`` of them where polars reads the window a few units at a time, one
    where the units are read one by one (``order.tasks``)."""
    import polars  # noqa: F401 - imported: the windows read through it
    from arrowload.pipeline.rowsource import window_step
    ds = al.dataset(lake).select("id", "x")
    for env, at_once in (("1", window_step()), ("0", 1)):
        monkeypatch.setenv("ARROWLOAD_STREAM", env)
        with ds.loader(50, shuffle="block", shuffle_window=4, seed=1, cache_dir=cache_dir) as loader:
            order = loader._order(0)
            tasks = list(loader._stages(order, [(0, loader.num_rows)]).tasks)
            assert loader._source.polars_windows is (env == "1")
            est = [loader._source.est_bytes(u) for u in range(len(loader._source.counts))]
            for t in tasks:
                units = [est[int(u)] for u in order.windows[t.window]]
                assert t.est_bytes == sum(units) + min(at_once, len(units)) * max(units), (env, t)


@pytest.mark.parametrize("fail", ["error", "short"])
def test_an_unshuffled_epoch_reads_per_unit_when_its_query_fails(lake, cache_dir, monkeypatch, fail):
    """A query that raises, or ends before the rows counted (polars panicking on a worker
    thread ends its batches without an error), is not a change of the data: the task and
    every later one read per unit, and the epoch is the per-unit one."""
    ds = al.dataset(lake).filter("k < 5")
    want, _, _ = _epoch(ds, monkeypatch, False, cache_dir=cache_dir, batch_size=64)
    calls = _count_queries(monkeypatch, fail)
    got, decoders, _ = _epoch(ds, monkeypatch, True, cache_dir=cache_dir, batch_size=64)
    assert len(calls) == 1 and got == want
    assert any(d != STREAM_DECODER for d in decoders)


def _offset_zone_lake(path) -> str:
    """A file whose unselected column is zoned at a fixed offset (Arrow, Parquet and DuckDB
    take it; polars panics on its schema)."""
    path.mkdir()
    ts = pa.array(np.arange(600, dtype=np.int64) * 3_600_000_000, pa.timestamp("us"))
    pq.write_table(pa.table({"id": np.arange(600), "ts": ts, "local": ts.cast(pa.timestamp("us", "+05:30"))}),
                   path / "a.parquet", row_group_size=50)
    return str(path)


@pytest.mark.parametrize("shuffle", [False, "block", "global"])
def test_a_time_zone_polars_cannot_parse_keeps_its_file_from_polars(tmp_path, monkeypatch, shuffle):
    """polars (imported here, as in any notebook using it) parses a file's whole schema: a
    ``'+05:30'`` column it never reads made the streamed epoch end early, which was taken
    for the data changing (``SnapshotChangedError``). Such a file is read by pyarrow; the
    rows are DuckDB's."""
    import polars  # noqa: F401
    lake = _offset_zone_lake(tmp_path / "lake")
    where = "ts >= '1970-01-05'"
    want = sorted(r[0] for r in duckdb.sql(f"SELECT id FROM read_parquet('{lake}/*.parquet') WHERE {where}").fetchall())
    ds = al.dataset(lake).filter(where).select("id")
    assert StreamQuery.compile(ds.optimized_plan(), al.Options()) is None
    monkeypatch.delenv("ARROWLOAD_STREAM", raising=False)
    with ds.loader(16, shuffle=shuffle, seed=1, output="numpy", cache_dir=str(tmp_path / "c")) as loader:
        got = sorted(int(i) for b in loader for i in b["id"])
        assert not any("polars" in d for d in loader.stats().decoders)
    assert got == want
    with pytest.raises(al.UnsupportedError, match="local"):
        al.dataset(lake).to_polars()


@pytest.mark.parametrize("zone", ["-03:00", "+00:00", "utc", "America/New_York", "+05:30"])
def test_to_polars_and_the_decoders_take_the_zones_polars_parses(tmp_path, zone):
    """Whether polars parses a zone is polars' to say: whole-hour offsets and ``utc`` it
    maps to zones of its own, ``'+05:30'`` it refuses. ``to_polars()`` gives what polars'
    own reader gives, or ``UnsupportedError`` where that fails; a streamed epoch reads the
    same rows either way."""
    import polars as pl
    path = tmp_path / "a.parquet"
    ts = pa.array(np.arange(300, dtype=np.int64) * 3_600_000_000, pa.timestamp("us", zone))
    pq.write_table(pa.table({"id": np.arange(300), "t": ts}), path, row_group_size=50)
    try:
        want = pl.read_parquet(path)
    except BaseException:  # noqa: BLE001 - polars' ComputeError (or a panic)
        want = None
    if want is None:
        with pytest.raises(al.UnsupportedError, match="'t'"):
            al.dataset(str(path)).to_polars()
    else:
        assert al.dataset(str(path)).to_polars().equals(want)
    ds = al.dataset(str(path)).filter("id >= 7").select("id")
    with ds.loader(32, shuffle=False, output="numpy") as loader:
        assert [int(i) for b in loader for i in b["id"]] == list(range(7, 300))
        assert ("polars-stream" in loader.stats().decoders) == (want is not None)
