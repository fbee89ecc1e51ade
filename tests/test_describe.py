"""``Dataset.describe()``: per-column statistics from footers, or from one scan.

Truths: DuckDB's min / max / null counts over the same files, pyarrow's own reading of
the footers for sizes, and the counting filesystem for "footers only".
"""

from __future__ import annotations

import glob
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import arrowload as al
from arrowload.describe import RESULT_COLUMNS, format_value
from _support import CountingLocalFileSystem, footer_size
from conftest import ROWS, duck, parquet_scan

PLAIN = ["id", "ts", "day", "user_id", "country", "label", "f0", "f15", "price", "text", "score"]


def _duck_stats(source_sql: str, columns, types) -> dict[str, tuple]:
    parts = []
    for c in columns:
        parts.append(f'min("{c}") AS "lo_{c}", max("{c}") AS "hi_{c}", '
                     f'count(*) - count("{c}") AS "nulls_{c}"')
    row = duck(f"SELECT count(*) AS n, {', '.join(parts)} FROM {source_sql}").to_pylist()[0]
    return {c: (format_value(row[f"lo_{c}"], types[c]), format_value(row[f"hi_{c}"], types[c]),
                row[f"nulls_{c}"], row["n"]) for c in columns}


def _by_column(frame) -> dict[str, dict]:
    return {r["column"]: r for r in frame.to_dicts()}


def test_footer_statistics_equal_duckdb(parquet_lake):
    ds = al.dataset(parquet_lake)
    desc = ds.describe()
    assert tuple(desc.columns) == RESULT_COLUMNS
    assert desc["column"].to_list() == ds.schema.names
    rows = _by_column(desc)
    types = {f.name: f.type for f in ds.schema}
    truth = _duck_stats(parquet_scan(parquet_lake), PLAIN, types)
    for c in PLAIN:
        lo, hi, nulls, n = truth[c]
        r = rows[c]
        assert (r["min"], r["max"], r["null_count"], r["rows"]) == (lo, hi, nulls, n), c
        assert r["source"] == "footer"
    assert rows["country"]["null_count"] > 0 and rows["score"]["null_count"] > 0  # the lake has nulls
    # a nested column: sizes yes, row-level min / max / nulls not from leaf statistics
    assert rows["emb"]["min"] is None and rows["emb"]["null_count"] is None
    assert rows["emb"]["compressed_bytes"] > 0


def test_footer_sizes_equal_pyarrow_metadata(parquet_lake):
    compressed: dict[str, int] = {}
    uncompressed: dict[str, int] = {}
    for path in glob.glob(os.path.join(parquet_lake, "*.parquet")):
        meta = pq.ParquetFile(path).metadata
        for rg in range(meta.num_row_groups):
            for c in range(meta.num_columns):
                col = meta.row_group(rg).column(c)
                top = col.path_in_schema.split(".")[0]
                compressed[top] = compressed.get(top, 0) + col.total_compressed_size
                uncompressed[top] = uncompressed.get(top, 0) + col.total_uncompressed_size
    rows = _by_column(al.dataset(parquet_lake).describe())
    for name in compressed:
        assert rows[name]["compressed_bytes"] == compressed[name]
        assert rows[name]["uncompressed_bytes"] == uncompressed[name]


def test_footers_only_reads_nothing_but_footers(parquet_lake):
    fs = CountingLocalFileSystem()
    ds = al.dataset(parquet_lake, filesystem=fs)
    ds.describe()
    assert fs.stats.read_calls > 0
    sizes = {p: os.path.getsize(p) for p in glob.glob(os.path.join(parquet_lake, "*.parquet"))}
    for r in fs.stats.reads:  # every read lies in the file's tail (footer plus pyarrow's tail read)
        size = sizes[os.path.normpath(r.path)]
        tail = max(footer_size(os.path.normpath(r.path)), 64 << 10)
        assert r.offset >= size - tail, r
    fs.reset()
    ds.describe()                      # footers are cached: nothing at all now
    ds.describe(["f0", "label"])
    assert fs.stats.bytes_read == 0
    ds.describe(["label"], exact=True)  # a scan reads data pages
    assert fs.stats.bytes_read > 0


def test_exact_scan_equals_duckdb(parquet_lake):
    ds = al.dataset(parquet_lake)
    cols = ["id", "country", "label", "f0", "price", "score", "emb"]
    rows = _by_column(ds.describe(cols, exact=True))
    types = {f.name: f.type for f in ds.schema}
    truth = _duck_stats(parquet_scan(parquet_lake), [c for c in cols if c != "emb"], types)
    for c, (lo, hi, nulls, n) in truth.items():
        assert (rows[c]["min"], rows[c]["max"], rows[c]["null_count"], rows[c]["rows"]) == (lo, hi, nulls, n)
        assert rows[c]["source"] == "scan"
    assert rows["emb"]["null_count"] == 0 and rows["emb"]["rows"] == ROWS
    distinct = duck(f"SELECT count(DISTINCT country) AS c, count(DISTINCT label) AS l "
                    f"FROM {parquet_scan(parquet_lake)}").to_pylist()[0]
    assert rows["country"]["approx_distinct"] == distinct["c"]   # HyperLogLog is exact this small
    assert rows["label"]["approx_distinct"] == distinct["l"]
    assert abs(rows["id"]["approx_distinct"] - ROWS) <= 0.1 * ROWS


def test_filtered_selection_footer_values_bound_the_rows(parquet_lake):
    sel = al.dataset(parquet_lake).filter("id >= 7000 AND label = 1").select("id", "f0")
    footer = _by_column(sel.describe())
    exact = _by_column(sel.describe(exact=True))
    truth = duck(f"SELECT count(*) AS n, min(id) AS lo, max(id) AS hi FROM {parquet_scan(parquet_lake)} "
                 "WHERE id >= 7000 AND label = 1").to_pylist()[0]
    assert exact["id"]["rows"] == truth["n"]
    assert (exact["id"]["min"], exact["id"]["max"]) == (str(truth["lo"]), str(truth["hi"]))
    assert footer["id"]["source"] == "footer, before filter"
    assert int(footer["id"]["min"]) <= truth["lo"] and int(footer["id"]["max"]) >= truth["hi"]
    assert footer["id"]["rows"] >= truth["n"]
    assert float(footer["f0"]["min"]) <= float(exact["f0"]["min"])


def test_partition_column_from_folder_names(hive_lake):
    rows = _by_column(al.dataset(hive_lake).describe(["country", "id"]))
    truth = duck(f"SELECT min(country) AS lo, max(country) AS hi, count(*) - count(country) AS nulls "
                 f"FROM {parquet_scan(hive_lake, hive=True)}").to_pylist()[0]
    assert (rows["country"]["min"], rows["country"]["max"]) == (truth["lo"], truth["hi"])
    assert rows["country"]["null_count"] == truth["nulls"] > 0
    assert rows["country"]["source"] == "partition folders" and rows["id"]["source"] == "footer"
    assert (rows["id"]["min"], rows["id"]["max"]) == ("0", str(ROWS - 1))


def test_no_statistics_and_computed_columns(ipc_lake, parquet_lake):
    rows = _by_column(al.dataset(ipc_lake).describe(["id"]))
    assert rows["id"]["rows"] == ROWS and rows["id"]["min"] is None
    assert rows["id"]["source"] == "no statistics"
    assert _by_column(al.dataset(ipc_lake).describe(["id"], exact=True))["id"]["max"] == str(ROWS - 1)
    sel = al.dataset(parquet_lake).select("id", double="id * 2")
    rows = _by_column(sel.describe())
    assert rows["double"]["source"] == "no statistics" and rows["double"]["min"] is None
    assert rows["id"]["source"] == "footer"
    assert _by_column(sel.describe(exact=True))["double"]["max"] == str(2 * (ROWS - 1))
    mem = _by_column(al.dataset(pa.table({"x": [3, 1, None]})).describe(exact=True))["x"]
    assert (mem["min"], mem["max"], mem["null_count"], mem["rows"]) == ("1", "3", 1, 3)


def test_unknown_column_is_a_key_error(parquet_lake):
    with pytest.raises(KeyError, match="nope"):
        al.dataset(parquet_lake).describe(["nope"])
    with pytest.raises(al.ColumnNotFoundError):
        al.dataset(parquet_lake).describe("nope")


# -- the displays: every column, typed bounds, units, the HTML bar ----------------------------

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden", "display")


def _golden(name: str, text: str) -> None:
    path = os.path.join(GOLDEN, name)
    if os.environ.get("ARROWLOAD_UPDATE_GOLDEN") == "1":
        os.makedirs(GOLDEN, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    with open(path, encoding="utf-8") as f:
        assert text == f.read(), f"{name} differs from its golden snapshot (ARROWLOAD_UPDATE_GOLDEN=1 rewrites)"


def test_describe_stays_a_polars_frame_with_typed_bounds(parquet_lake):
    import polars as pl
    ds = al.dataset(parquet_lake)
    desc = ds.describe()
    assert isinstance(desc, pl.DataFrame) and desc["min"].dtype == pl.String  # the contract holds
    assert type(desc.select("column")) is pl.DataFrame                         # derived frames are plain
    truth = duck(f"SELECT min(id) AS a, max(id) AS b, min(f0) AS c, max(f0) AS d, min(ts) AS e, "
                 f"max(price) AS f FROM {parquet_scan(parquet_lake)}").to_pylist()[0]
    assert desc.bounds["id"] == (truth["a"], truth["b"]) and isinstance(desc.bounds["id"][0], int)
    assert desc.bounds["f0"] == pytest.approx((truth["c"], truth["d"]))
    assert desc.bounds["ts"][0] == truth["e"] and desc.bounds["price"][1] == truth["f"]
    assert desc.bounds["emb"] == (None, None)
    exact = ds.describe(["label", "score"], exact=True)
    assert exact.bounds["label"] == (0, 1) and isinstance(exact.bounds["score"][0], float)


def test_footer_bounds_are_typed_and_rendered_as_the_exact_scans(tmp_path):
    """An int64 file under a column unified to double, and a zero in a double column
    (writers store -0.0 as its min): footer bounds of the column's type, as the scan's
    ("1.0", not "1"; "0.0", not "-0.0")."""
    pq.write_table(pa.table({"x": pa.array([1, 5], pa.int64()), "f": [0.0, 1.0]}), str(tmp_path / "a.parquet"))
    pq.write_table(pa.table({"x": [2.5, 3.5], "f": [2.0, 0.5]}), str(tmp_path / "b.parquet"))
    ds = al.dataset(str(tmp_path))
    footer, exact = ds.describe(), ds.describe(exact=True)
    for c in ("x", "f"):
        assert [repr(v) for v in footer.bounds[c]] == [repr(v) for v in exact.bounds[c]], c
    assert footer["min"].to_list() == exact["min"].to_list() and footer["max"].to_list() == exact["max"].to_list()


def test_an_empty_file_leaves_the_footer_statistics_of_the_others(tmp_path):
    """pyarrow writes a 0-row file as one empty row group without statistics: it blanked
    null_count, min and max of every column of the whole lake. It holds no row, so it adds
    nothing. Truth: DuckDB over the same files."""
    t = pa.table({"id": [1, 2, 3], "s": ["a", None, "c"]})
    pq.write_table(t, str(tmp_path / "a.parquet"))
    pq.write_table(t.slice(0, 0), str(tmp_path / "b.parquet"))
    assert pq.ParquetFile(str(tmp_path / "b.parquet")).metadata.num_row_groups == 1
    rows = _by_column(al.dataset(str(tmp_path)).describe())
    truth = duck(f"SELECT min(id)::VARCHAR, max(id)::VARCHAR, count(*) - count(id), min(s), max(s), "
                 f"count(*) - count(s), count(*) FROM read_parquet('{tmp_path}/*.parquet')").to_pylist()[0]
    lo_id, hi_id, nulls_id, lo_s, hi_s, nulls_s, n = truth.values()
    assert (rows["id"]["min"], rows["id"]["max"], rows["id"]["null_count"], rows["id"]["rows"]) == \
        (lo_id, hi_id, nulls_id, n)
    assert (rows["s"]["min"], rows["s"]["max"], rows["s"]["null_count"]) == (lo_s, hi_s, nulls_s)
    assert rows["s"]["source"] == "footer"


def test_bounds_of_a_duration_are_its_durations_in_both_modes(tmp_path):
    """DuckDB reads a duration as an INTERVAL of microseconds: describe(exact=True) gave
    pyarrow MonthDayNano bounds (their repr as text), and for duration[ns] lost the
    nanoseconds (1501 ns as 1 us); footer bounds were the raw int64 counts. Both modes give
    the column's own values now, as to_pylist gives them."""
    import datetime as dt
    values = {"s": [1, -3 * 3600, None], "ms": [1_000, -3 * 3600_000, None], "us": [1_000_000, -3 * 3600 * 10**6, None],
              "ns": [1501, -2999, 4000, None]}
    for unit, counts in values.items():
        arr = pa.array(counts, pa.duration(unit))
        want = (min(v for v in arr.to_pylist() if v is not None), max(v for v in arr.to_pylist() if v is not None))
        path = str(tmp_path / f"{unit}.parquet")
        pq.write_table(pa.table({"dur": arr}), path)
        for d in (al.dataset(pa.table({"dur": arr})).describe(exact=True), al.dataset(path).describe(exact=True),
                  al.dataset(path).describe()):
            assert d.bounds["dur"] == want, (unit, d.bounds["dur"], want)
            assert d["min"].to_list() == [str(want[0])] and d["max"].to_list() == [str(want[1])], unit
    assert al.dataset(pa.table({"dur": pa.array(values["us"], pa.duration("us"))})).describe(exact=True) \
        .bounds["dur"] == (dt.timedelta(hours=-3), dt.timedelta(seconds=1))


def test_describe_text_shows_every_column_whatever_polars_limits(parquet_lake, monkeypatch):
    import polars as pl
    monkeypatch.setenv("COLUMNS", "100")
    ds = al.dataset(parquet_lake)
    with pl.Config(tbl_rows=5):                    # polars' own display would hide 21 of 26
        text = repr(ds.describe())
    lines = text.splitlines()
    assert max(map(len, lines)) <= 100
    rows = [ln for ln in lines if ln.startswith("│ ") and not ln.startswith("│ column")]
    assert [r.split("┆")[0].strip("│ ") for r in rows] == ds.schema.names
    assert lines[0] == f"{ROWS:,} rows, {len(ds.schema.names)} columns described from footers"
    assert '"' not in "".join(rows)                # values, not quoted strings


def test_describe_html_bars_are_shares_of_bytes_read(parquet_lake):
    import re

    from test_display import StrictHTML
    ds = al.dataset(parquet_lake)
    desc = ds.describe()
    markup = desc._repr_html_()
    parsed = StrictHTML.check(markup)
    for name in ds.schema.names:
        assert f">{name}<" in markup
    sizes = {f: pq.read_metadata(f) for f in glob.glob(os.path.join(parquet_lake, "*.parquet"))}
    per_col: dict[str, int] = {}
    for meta in sizes.values():
        for rg in range(meta.num_row_groups):
            for i in range(meta.num_columns):
                ch = meta.row_group(rg).column(i)
                top = ch.path_in_schema.split(".")[0]
                per_col[top] = per_col.get(top, 0) + ch.total_compressed_size
    total = sum(per_col.values())
    shares = [float(s) for s in re.findall(r"</span>([\d.]+)%</td>", markup)]
    assert len(shares) == len(ds.schema.names)
    for name, share in zip(ds.schema.names, shares):
        assert share == pytest.approx(100 * per_col[name] / total, abs=0.06), name
    assert re.search(r"\d KiB|\d MiB", parsed.all_text) and f"{ROWS:,}" in parsed.all_text
    assert "&quot;" not in markup


def test_describe_golden_html_and_text(monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    table = pa.table({"id": pa.array([1, 2, 3, None], pa.int64()), "name": ["a<b", "c", None, "d"],
                      "x": pa.array([0.5, -1.25, 3.0, 2.0], pa.float32())})
    desc = al.dataset(table).describe(exact=True)
    _golden("describe-exact.html", desc._repr_html_())
    _golden("describe-exact.txt", repr(desc))


def test_describe_exact_draws_no_bogus_bar(parquet_lake, monkeypatch):
    from arrowload import progress
    made = []

    class Bar:
        def __init__(self, total=None, desc="", unit="it", **kwargs):
            self.total, self.n = total, 0
            made.append(self)

        def update(self, n=1):
            self.n += n

        def set_postfix_str(self, *a, **k):
            pass

        def close(self):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

    monkeypatch.setattr(progress, "_TQDM", Bar)
    monkeypatch.setenv("ARROWLOAD_PROGRESS", "1")
    al.dataset(parquet_lake).describe(["country", "label"], exact=True)
    assert len(made) <= 1 and all(b.total is not None and b.n == b.total for b in made)


def test_columns_whose_names_hold_a_dot_are_described_from_their_own_chunks(tmp_path):
    """A top-level column named ``a.b`` beside a struct ``a`` with a field ``b``: both leaf
    paths read ``a.b``. Each column's footer facts are its own chunks' (before: ``a.b`` was
    taken for a field of ``a``, described as all null with 0 bytes, and ``a`` got its bytes)."""
    t = pa.table({"a.b": pa.array([1, 2, None, 4]), "a": pa.array([{"b": 7}, None, {"b": 9}, {"b": 8}]),
                  "x y": pa.array([None, None, 3, 5]), "x": pa.array([1.5, 2.5, 3.5, None])})
    path = str(tmp_path / "f.parquet")
    pq.write_table(t, path)
    rg = pq.ParquetFile(path).metadata.row_group(0)
    sizes = {}
    for j in range(rg.num_columns):
        top = t.schema.names[j]  # one leaf per column here, in order
        sizes[top] = rg.column(j).total_compressed_size
    ds = al.dataset(path)
    got = {r["column"]: r for r in ds.describe().to_dicts()}
    assert (got["a.b"]["null_count"], got["a.b"]["min"], got["a.b"]["max"]) == (1, "1", "4")
    assert (got["x y"]["null_count"], got["x y"]["min"], got["x y"]["max"]) == (2, "3", "5")
    assert (got["x"]["null_count"], got["x"]["min"], got["x"]["max"]) == (1, "1.5", "3.5")
    assert {c: got[c]["compressed_bytes"] for c in sizes} == sizes
    with pytest.raises(al.ConversionError, match="'a.b'"):  # its footer's null count, before any read
        next(iter(ds.select("a.b").loader(2, output="numpy")))
