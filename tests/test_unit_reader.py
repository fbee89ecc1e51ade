"""The compiled unit reader (scan/units.py): every decoder returns, unit by unit, exactly
the table the plan restricted to that unit returns through ``execute.to_table`` (pyarrow's
dataset scanner): same rows, order, schema and types, over every column type the lake
holds and over the real-files corpus of ``test_real_files.py``. The plan is compiled once
per loader, counting reads only the filter's columns, late materialization never reads
more than the scanner, and the decoder is chosen by measurement.
"""

from __future__ import annotations

import datetime as dt
import decimal
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import arrowload as al
from arrowload.options import OptimizerOptions
from arrowload.pipeline.rowsource import restrict
from arrowload.scan import execute
from arrowload.scan.choose import Chooser
from arrowload.scan.units import UnitReader

from _support import CountingLocalFileSystem

DECODERS = ["dataset", "pyarrow", "polars"]


def typed_table(n: int, seed: int, *, narrow: bool = False) -> pa.Table:
    """Every type the lake may hold, with nulls, NaN and -0.0."""
    rng = np.random.default_rng(seed)

    def nulls(values, typ, p=0.15):
        return pa.array([None if rng.random() < p else v for v in values], typ)

    ids = np.arange(seed * 1000, seed * 1000 + n)
    floats = [float("nan"), -0.0, 0.0, 0.5, 1.5, -2.0, float("inf")]
    strs = ["", "a", "ab", "b", "é", "zz", "US", "a%_\\"]
    days = [dt.date(2024, 1, d) for d in range(1, 8)]
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "i8": nulls(rng.integers(-3, 4, n).tolist(), pa.int8()),
        "u64": nulls([[0, 1, 2**63, 2**64 - 1][i] for i in rng.integers(0, 4, n)], pa.uint64()),
        "w": pa.array(rng.integers(0, 100, n), pa.int32() if narrow else pa.int64()),  # unified to int64
        "f32": nulls([floats[i] for i in rng.integers(0, len(floats), n)], pa.float32()),
        "f64": nulls(rng.random(n).tolist(), pa.float64()),
        "dec": nulls([decimal.Decimal(f"{i}.25") for i in rng.integers(-50, 50, n)], pa.decimal128(10, 2)),
        "d": nulls([days[i] for i in rng.integers(0, len(days), n)], pa.date32()),
        "ts": nulls([dt.datetime(2024, 1, 1, h) for h in rng.integers(0, 24, n)], pa.timestamp("us")),
        "tsz": nulls([dt.datetime(2024, 1, 1, h) for h in rng.integers(0, 24, n)], pa.timestamp("ms", tz="UTC")),
        "tsp": nulls([dt.datetime(2024, 1, 1, h) for h in rng.integers(0, 24, n)],
                     pa.timestamp("ns", tz="Europe/Paris")),
        "s": nulls([strs[i] for i in rng.integers(0, len(strs), n)], pa.string()),
        "ls": nulls([strs[i] for i in rng.integers(0, len(strs), n)], pa.large_string()),
        "sv": nulls([strs[i] for i in rng.integers(0, len(strs), n)], pa.string_view()),
        "dict": nulls([strs[i] for i in rng.integers(0, 3, n)], pa.string()).dictionary_encode(),
        "b": nulls(rng.random(n) < 0.5, pa.bool_()),
        "bin": nulls([bytes([i]) for i in rng.integers(0, 255, n)], pa.binary()),
        "l": nulls([list(range(i)) for i in rng.integers(0, 4, n)], pa.list_(pa.int64())),
        "ll": nulls([[0.5] * i for i in rng.integers(0, 3, n)], pa.large_list(pa.float32())),
        "fsl": pa.FixedSizeListArray.from_arrays(pa.array(rng.random(n * 3).astype(np.float32)), 3),
        "st": nulls([{"x": int(i), "y": str(i)} for i in rng.integers(0, 9, n)],
                    pa.struct([("x", pa.int32()), ("y", pa.string())])),
    })


@pytest.fixture(scope="module")
def typed_lake(tmp_path_factory) -> str:
    """Two hive partitions, several row groups each; one file holds ``w`` as int32 and a
    column the other lacks (``extra``): the unified schema widens and fills nulls."""
    root = tmp_path_factory.mktemp("typed")
    for k in (0, 1):
        folder = root / f"k={k}"
        folder.mkdir()
        t = typed_table(300, k + 1, narrow=k == 1)
        if k == 0:
            t = t.append_column("extra", pa.array(np.arange(300), pa.int16()))
        pq.write_table(t, folder / "part.parquet", row_group_size=70)
    return str(root)


PLANS = {
    "all": lambda d: d,
    "some columns": lambda d: d.select("fsl", "id", "s", "k", "extra", "w"),
    "polars filter": lambda d: d.filter("i8 > 0 AND s <> 'b'").select("id", "f32", "dec", "l", "sv"),
    "float filter": lambda d: d.filter("f64 > 0.5 OR i8 IS NULL").select("id", "tsz", "tsp", "dict"),
    "split filter": lambda d: d.filter("d >= '2024-01-03' AND f32 > 0").select("id", "fsl", "ll"),
    "partition filter": lambda d: d.filter("k = 1 AND i8 < 3 OR k = 0 AND b").select("id", "k", "bin"),
    "like": lambda d: d.filter("s LIKE 'a%'").select("id", "st"),
    "in and not": lambda d: d.filter("i8 IN (1, 2) OR NOT b").select("id", "u64"),
    "extremes": lambda d: d.filter("u64 = 18446744073709551615 OR id < 5").select("id", "u64", "w"),
    "never": lambda d: d.filter("i8 = 100").select("id", "s"),
    "residual duckdb filter": lambda d: d.filter("f64 * 2 > 1").select("id", "f64"),
    "computed": lambda d: d.filter("i8 <> 0").select("id", z="i8 + 1", big="i8 > 1", s="s"),
    "arrow predicate": lambda d: d.filter(pc.field("i8") > 0).select("id", "i8"),
    "map": lambda d: d.filter("i8 >= 0").select("id", "i8").map(
        lambda b: b.append_column("j", pc.multiply(b.column("i8"), 2)), name="double"),
}


def _exact(value):
    """A Python value with each float as its exact hex (NaN equals NaN, -0.0 differs from 0.0)."""
    if isinstance(value, float):
        return "nan" if value != value else value.hex()
    if isinstance(value, list):
        return [_exact(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_exact(v) for v in value)
    if isinstance(value, dict):
        return {k: _exact(v) for k, v in value.items()}
    return value


def same(got: pa.Table, want: pa.Table) -> bool:
    """Equal schemas and values, NaN equal to NaN (``Table.equals`` says NaN != NaN)."""
    if not got.schema.equals(want.schema) or got.num_rows != want.num_rows:
        return False
    for a, b in zip(got.columns, want.columns):
        if not a.equals(b) and _exact(a.to_pylist()) != _exact(b.to_pylist()):
            return False
    return True


def _expected(plan, i):
    return execute.to_table(restrict(plan, (plan_units(plan)[i],)), al.Options())


def plan_units(plan):
    from arrowload.plan.nodes import scans
    return [u.index for u in scans(plan)[0].selected_units()]


@pytest.mark.parametrize("optimizer", ["on", "off"])
@pytest.mark.parametrize("name", list(PLANS))
def test_every_decoder_returns_the_scanners_table(typed_lake, name, optimizer):
    d = al.dataset(typed_lake)
    if optimizer == "off":
        d = d.with_options(optimizer=OptimizerOptions.none())
    plan = PLANS[name](d).optimized_plan()
    units = plan_units(plan)
    assert units
    expected = [_expected(plan, i) for i in range(len(units))]
    assert sum(t.num_rows for t in expected) == PLANS[name](d).count()
    for dec in DECODERS:
        reader = UnitReader(plan, d.options, decoders=[dec])
        assert reader.candidates == (dec,)
        for i, want in enumerate(expected):
            got = reader.read(i)
            # str(): also the names of nested fields (a list's child), which equals() ignores
            assert got.schema.equals(want.schema) and str(got.schema) == str(want.schema), \
                (dec, i, got.schema, want.schema)
            assert same(got, want), (dec, i)
        assert reader.reads == len(units)
        assert [reader.count(i) for i in range(len(units))] == [t.num_rows for t in expected], dec


def test_polars_reads_where_it_can_and_hands_the_rest_on(typed_lake):
    """polars serves files whose columns it reads exactly; a file where a column's type
    differs from the unified one (``w`` int32 in k=1) is read by another decoder, with the
    same rows."""
    d = al.dataset(typed_lake).filter("i8 > 0").select("id", "w", "s")
    plan = d.optimized_plan()
    reader = UnitReader(plan, d.options, decoders=["polars", "pyarrow"])
    polars = reader._decoders["polars"]
    cols = frozenset(("id", "w", "s", "i8"))
    served = {u.file: polars.usable(u, cols) for u in reader.units}
    assert served == {0: True, 1: False}
    got = pa.concat_tables(reader.read(i) for i in range(reader.num_units))
    assert same(got, d.to_arrow())


def test_predicate_translated_for_polars_is_named(tmp_path):
    table = pa.table({"a": pa.array([1, None, 3, 4], pa.int32()), "f": [0.5, 1.5, 2.5, None],
                      "s": ["ab", "b", "b", "ad"]})
    path = str(tmp_path / "t.parquet")
    pq.write_table(table, path)
    d = al.dataset(path).filter("a > 1 AND f > 0.25 AND s LIKE '%a%d%'")
    reader = UnitReader(d.optimized_plan(), d.options, decoders=["polars"])
    described = reader.describe()
    assert described["decoder"] == "polars"
    # the LIKE conjunct stays with pyarrow
    assert described["polars_prefilter"] == '"a" > 1 AND "f" > 0.25'
    assert reader.read(0).to_pydict() == {"a": [], "f": [], "s": []}
    d = al.dataset(path).filter("a > 1 AND s LIKE '%a%d%'")
    reader = UnitReader(d.optimized_plan(), d.options, decoders=["polars"])
    assert reader.describe()["polars_prefilter"] == '"a" > 1'
    assert reader.read(0).to_pydict() == {"a": [4], "f": [None], "s": ["ad"]}


# ---------------------------------------------------------------------------
# the real-files corpus


def _corpus(tmp_path) -> list[str]:
    from test_real_files import _writers_table
    import duckdb
    import polars as pl
    paths = []
    t = _writers_table()
    for writer in ("pyarrow", "polars", "duckdb", "pandas"):
        path = str(tmp_path / f"{writer}.parquet")
        if writer == "pyarrow":
            pq.write_table(t, path, row_group_size=4)
        elif writer == "polars":
            pl.from_arrow(t).write_parquet(path, row_group_size=4)
        elif writer == "duckdb":
            con = duckdb.connect()
            con.register("t", t)
            con.execute(f"COPY (SELECT * FROM t) TO '{path}' (FORMAT parquet, ROW_GROUP_SIZE 4)")
            con.close()
        else:
            t.to_pandas().to_parquet(path)
        paths.append(path)
    half = str(tmp_path / "half.parquet")
    pq.write_table(pa.table({"h": pa.array(np.array([1.5, -2.25, 65504.0, np.nan], dtype=np.float16))}), half)
    far = 253402300800000000 * 10
    structs = str(tmp_path / "far.parquet")
    pq.write_table(pa.table({"st": pa.array([{"t": far, "d": 10}, None, {"t": -far, "d": None}],
                                            pa.struct([("t", pa.timestamp("us")), ("d", pa.date32())])),
                             "t2": pa.array([far, 0, None], pa.timestamp("us"))}), structs)
    import uuid
    types = str(tmp_path / "types.parquet")
    pq.write_table(pa.table({
        "id": [1, 2, 3],
        "u": pa.array([uuid.UUID(int=i * 7919).bytes for i in range(3)], pa.uuid()),
        "j": pa.array(['{"a": 1}', None, "[]"], pa.json_(pa.string())),
        "sv": pa.array(["a", None, "ccc"], pa.string_view()),
        "bv": pa.array([b"a", b"", None], pa.binary_view())}), types)
    int96 = str(tmp_path / "int96.parquet")
    pq.write_table(pa.table({"t": pa.array([dt.datetime(2020, 1, 1), None], pa.timestamp("ns"))}), int96,
                   use_deprecated_int96_timestamps=True)
    return paths + [half, structs, types, int96]


def test_every_decoder_reads_the_real_files_corpus_identically(tmp_path):
    for path in _corpus(tmp_path):
        d = al.dataset(path)
        for sel in (d, d.filter(f"{d.schema.names[0]} IS NOT NULL")):
            plan = sel.optimized_plan()
            n = len(plan_units(plan))
            expected = [_expected(plan, i) for i in range(n)]
            for dec in DECODERS:
                reader = UnitReader(plan, sel.options, decoders=[dec])
                for i, want in enumerate(expected):
                    got = reader.read(i)
                    assert same(got, want) and str(got.schema) == str(want.schema), (path, dec, i)


def test_damaged_and_corrupt_files_give_the_scanners_errors(tmp_path):
    """A footer arrowload's check refuses is never handed to a fast decoder, and a page
    that fails its checksum raises what the scanner raised: the same error type, naming
    the file."""
    from test_real_files import write_corrupt_page, write_damaged_type
    damaged = str(tmp_path / "damaged.parquet")
    write_damaged_type(damaged)
    corrupt = str(tmp_path / "corrupt.parquet")
    write_corrupt_page(corrupt)
    for path, options in ((damaged, al.Options()),
                          (corrupt, al.Options(scan=al.ScanOptions(page_checksums=True)))):
        base = al.dataset(path).with_options(scan=options.scan)
        for sel in (base, base.filter(f"{base.schema.names[0]} > 3")):
            plan = sel.optimized_plan()
            try:
                execute.to_table(restrict(plan, (plan_units(plan)[0],)), sel.options)
                want = None
            except al.ArrowloadError as exc:
                want = exc
            for dec in DECODERS:
                reader = UnitReader(plan, sel.options, decoders=[dec])
                if want is None:
                    reader.read(0)
                    continue
                with pytest.raises(type(want)) as info:
                    reader.read(0)
                assert os.path.basename(path) in str(info.value), (dec, info.value)


# ---------------------------------------------------------------------------
# compiled once; counting reads only the filter's columns; bytes


@pytest.mark.parametrize("stream", [False, True])
def test_a_loader_compiles_its_plan_once_never_per_unit(typed_lake, tmp_path, monkeypatch, stream):
    """Per-unit path: every unit read through the one compiled reader. Polars stream
    (``scan/stream.py``): no unit read by it, and nothing compiled per unit or per epoch."""
    monkeypatch.setenv("ARROWLOAD_STREAM", "1" if stream else "0")
    d = al.dataset(typed_lake).filter("i8 > 0").select("id", "s")
    loader = d.loader(64, output="arrow", cache_dir=str(tmp_path / str(stream)))
    src = loader._source
    assert src.compiles == 2  # the plan, and the count plan (counted once, by reading)
    units = len(src.counts)
    rows = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        rows.append(sum(b.num_rows for b in loader))
        if stream:
            assert loader.stats().decoders == {"polars-stream": sum(1 for c in src.counts if c)}
    assert rows == [d.count()] * 2
    assert src.compiles == 2
    assert src.reader.reads == (0 if stream else 2 * units)
    # a second loader finds the counts in the selection index: one compile
    again = d.loader(64, output="arrow", cache_dir=str(tmp_path / str(stream)))._source
    assert again.compiles == 1 and again.counts == src.counts


def test_counting_reads_only_the_filters_columns(tmp_path):
    """``_count_units`` decodes the predicate's column alone: the bytes read are the
    footers plus that column's chunks, far less than the selected columns'."""
    table = pa.table({"a": pa.array(np.arange(20_000) % 7, pa.int64()),
                      "big": pa.array(np.random.default_rng(0).random(20_000))})
    path = str(tmp_path / "t.parquet")
    pq.write_table(table, path, row_group_size=5_000)
    meta = pq.ParquetFile(path).metadata
    a_bytes = sum(meta.row_group(r).column(0).total_compressed_size for r in range(meta.num_row_groups))
    fs = CountingLocalFileSystem()
    d = al.dataset(path, filesystem=fs).filter("a = 3").select("a", "big")
    d.schema  # footers
    fs.stats.reset()
    loader = d.loader(100, cache_dir=str(tmp_path / "cache"))
    assert loader.num_rows == int(pc.sum(pc.equal(table["a"], 3)).as_py())
    assert fs.stats.bytes_read <= a_bytes + meta.serialized_size + 4096


@pytest.mark.parametrize("dec", ["pyarrow", "dataset"])
def test_late_materialization_reads_no_more_and_skips_empty_units(tmp_path, dec):
    """Predicate columns first: a unit without a surviving row never reads its other
    columns; a unit with survivors reads every column chunk once (no more bytes than the
    scanner reading them together)."""
    n = 8_000
    table = pa.table({"key": pa.array(np.where(np.arange(n) < 2_000, np.arange(n) % 3, 5), pa.int64()),
                      "payload": pa.array(np.random.default_rng(1).random(n))})
    path = str(tmp_path / "t.parquet")
    pq.write_table(table, path, row_group_size=2_000)
    fs = CountingLocalFileSystem()
    # statistics could prune the empty row groups: switched off, late materialization decides
    d = al.dataset(path, filesystem=fs).with_options(optimizer=OptimizerOptions(row_group_pruning=False)) \
        .filter("key = 1").select("payload")
    plan = d.optimized_plan()
    reader = UnitReader(plan, d.options, decoders=[dec])
    d.schema
    fs.stats.reset()
    got = pa.concat_tables(reader.read(i) for i in range(reader.num_units))
    read = fs.stats.bytes_read
    assert same(got, d.with_options(optimizer=OptimizerOptions.none()).to_arrow())
    meta = pq.ParquetFile(path).metadata
    key = sum(meta.row_group(r).column(0).total_compressed_size for r in range(4))
    payload0 = meta.row_group(0).column(1).total_compressed_size
    payload = sum(meta.row_group(r).column(1).total_compressed_size for r in range(4))
    if dec == "pyarrow":
        assert read <= key + payload0 + 4096 < key + payload
    else:  # the scanner reads the payload of every unit
        assert read >= key + payload


def test_open_files_are_bounded_and_closed(tmp_path):
    """The ParquetFile readers kept open are bounded (least recently used closed first)
    and ``ScanRowSource.close()`` closes them; reading again reopens."""
    for k in range(5):
        pq.write_table(pa.table({"a": np.arange(k * 10, k * 10 + 10)}), tmp_path / f"p{k}.parquet")
    d = al.dataset(str(tmp_path))
    reader = UnitReader(d.optimized_plan(), d.options, decoders=["pyarrow"])
    files = reader._decoders["pyarrow"]._files
    files.cap = 3
    got = [reader.read(i).column("a").to_pylist() for i in range(reader.num_units)]
    assert got == [list(range(k * 10, k * 10 + 10)) for k in range(5)]
    assert [f for f, _ in files._order] == [2, 3, 4]
    reader.close()
    assert files._order == [] and reader.read(0).column("a").to_pylist() == list(range(10))


# ---------------------------------------------------------------------------
# the choice by measurement


def test_chooser_measures_each_candidate_then_keeps_the_cheapest():
    c = Chooser(["a", "b"], warmup=1, trials=2, recheck=4)
    costs = {"a": 3.0, "b": 1.0}
    seen = []
    for _ in range(6):
        name, measure = c.pick()
        seen.append((name, measure))
        c.done(name, costs[name] if measure else None, 1)
    assert sorted(seen) == [("a", False), ("a", True), ("a", True), ("b", False), ("b", True), ("b", True)]
    picks = []
    for _ in range(8):
        name, measure = c.pick()
        picks.append(name)
        c.done(name, costs[name] if measure else None, 1)
    assert c.chosen == "b" and picks.count("b") >= 6  # rechecks measure the others now and then
    # the costs change: a recheck finds "a" cheaper, and the choice follows
    costs.update(a=0.1)
    for _ in range(40):
        name, measure = c.pick()
        c.done(name, costs[name] if measure else None, 1)
    assert c.chosen == "a"


@pytest.mark.parametrize("other, want", [(0.95, "a"), (0.91, "a"), (0.89, "b"), (1.2, "a")])
def test_chooser_leaves_the_first_candidate_only_for_one_cheaper_by_the_margin(other, want):
    # costs within MARGIN (10%) of the first candidate's are run-to-run spread: the first stays
    c = Chooser(["a", "b"], warmup=0, trials=1)
    for _ in range(2):
        name, measure = c.pick()
        c.done(name, {"a": 1.0, "b": other}[name] if measure else None, 1)
    assert c.chosen == want


def test_chooser_measures_an_exclusive_candidate_alone_and_drops_failures():
    c = Chooser(["p", "x"], warmup=0, trials=1, exclusive=["x"])
    picks = [c.pick() for _ in range(3)]
    # "x" is handed out (to be measured) once while it is in flight; "p" reads meanwhile
    assert picks.count(("x", True)) == 1 and all(n == "p" for n, m in picks if (n, m) != ("x", True))
    for name, measure in picks:
        c.done(name, 1.0 if measure else None, 1)
    c.fail("p")
    assert c.pick()[0] == "x"


def test_chooser_measures_a_candidate_added_later():
    c = Chooser(["a"], warmup=0, trials=1)
    assert c.pick() == ("a", False) and c.chosen == "a"
    c.done("a", None, 1)
    c.add("b")
    assert c.chosen is None
    picks = [c.pick() for _ in range(2)]
    assert sorted(picks) == [("a", True), ("b", True)]
    c.done("a", 2.0, 1)
    c.done("b", 1.0, 1)
    assert c.pick()[0] == "b" and c.chosen == "b"


def test_a_small_scan_does_not_import_polars(tmp_path):
    """polars joins the candidates only where its import pays (already imported, or
    enough bytes read): a small loader epoch in a fresh process never imports it."""
    from test_real_files import run_isolated
    path = str(tmp_path / "t.parquet")
    pq.write_table(pa.table({"a": np.arange(1000), "b": np.arange(1000) % 7}), path, row_group_size=100)
    out = run_isolated(f"""
        import json, sys
        import arrowload as al
        d = al.dataset({path!r}).filter("b = 3")
        loader = d.loader(64, cache_dir={str(tmp_path / 'cache')!r})
        rows = sum(len(b["a"]) for b in loader)
        print(json.dumps({{"rows": rows, "polars": "polars" in sys.modules,
                          "candidates": list(loader._source.reader.candidates)}}))
    """)
    assert out == {"rows": 1000 // 7 + (1 if 1000 % 7 > 3 else 0), "polars": False, "candidates": ["pyarrow"]}


def test_loader_names_the_decoder_it_chose(typed_lake, tmp_path, monkeypatch):
    monkeypatch.setenv("ARROWLOAD_STREAM", "0")  # every unit through the reader (not a polars stream)
    d = al.dataset(typed_lake).select("id", "f32", "i8")
    loader = d.loader(32, output="arrow", cache_dir=str(tmp_path))
    reader = loader._source.reader
    assert reader.decoder is None or len(reader.candidates) == 1  # measuring first
    for epoch in range(3):
        loader.set_epoch(epoch)
        for _ in loader:
            pass
    assert reader.decoder in reader.candidates
    described = reader.describe()
    assert described["decoder"] == reader.decoder and described["units_read"] == 3 * len(reader.units)
    assert set(described["cpu_per_byte"]) <= set(reader.candidates)
