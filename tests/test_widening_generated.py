"""Generated lakes whose files disagree on column types, read as one: arrowload against
DuckDB's ``read_parquet(..., union_by_name=true)`` over the same files.

Each example writes 2-4 Parquet files (pyarrow or polars, some empty, some with small row
groups); every file has a unique ``id`` (int64) and a random subset of a pool of columns,
each of a type drawn from one family per column:

``i``   integers of any width and signedness (or the null type);
``f``   integers and float32 / float64 (integers read as double, rounded as DuckDB rounds);
``s``   string / large_string / string_view;   ``b``  binary / large_binary / binary_view;
``l``   list / large_list of integers;         ``ls`` list / large_list of text;
``st``  struct<a: integer, b: text>, field types drawn per file;
``t``   timestamp[s|ms|us|ns], naive or in UTC / New York / Tokyo.

Values (nulls, NaN, extreme integers, dates far outside the nanosecond range) are random.
The lake is read with ``to_arrow()`` and through the loader, a filter on ``id`` and one on
``i``, under a drawn decoder; each must give DuckDB's rows (values, not types: ``normalize``
below), or raise ``SchemaMismatchError`` where DuckDB refuses the lake (a value that does
not fit the widened type).

Where arrowload legitimately differs from DuckDB the test says so (``_documented_refusal``):

* types of different families (string beside int): DuckDB casts to VARCHAR; arrowload
  refuses (``merge_types``: only safe widenings). Struct fields in another order or set
  are merged by name on both sides.
* a signed integer beside uint64: DuckDB reads HUGEINT (128 bits), which Arrow lacks;
  arrowload refuses.
* tz-naive beside tz-aware timestamps: DuckDB reads TIMESTAMPTZ (the naive values taken in
  the session's time zone); arrowload refuses (``merge_types``: both or neither zoned).
* integers beside float32 (no float64): DuckDB reads FLOAT (integers past 2**24 lose
  digits), arrowload ``double`` (README: "integers and floats as double"): checked against
  DuckDB reading each file alone with ``CAST(f AS DOUBLE)`` instead.
"""

from __future__ import annotations

import math
import os
import tempfile

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pyarrow.types as pat
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import arrowload as al
from _support import PER_SECOND, int_range, pinned_decoder, timestamp_ticks

INTS = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()]
TEXTS = [pa.string(), pa.large_string(), pa.string_view()]
BINS = [pa.binary(), pa.large_binary(), pa.binary_view()]
ZONES = ["UTC", "America/New_York", "Asia/Tokyo"]
UNITS = ["s", "ms", "us", "ns"]
POOL = ["i", "f", "s", "b", "l", "ls", "st", "t"]


# ---------------------------------------------------------------------------
# drawing types

@st.composite
def _column_type(draw, name: str, lake: dict) -> pa.DataType:
    """One file's type of column ``name``; ``lake`` holds the lake-wide draws (zoned or not)."""
    if draw(st.integers(0, 24)) == 0:
        return pa.null()  # a column of nulls only, typed null (pyarrow writes it, DuckDB reads it)
    if lake["clash"] == name and draw(st.booleans()):  # a type of another family
        return draw(st.sampled_from([pa.string(), pa.int32(), pa.list_(pa.float64()), pa.timestamp("us"),
                                     pa.struct([("b", pa.string()), ("a", pa.int8())]),
                                     pa.struct([("a", pa.int8())])]))
    ints = st.sampled_from(INTS + [pa.uint64(), pa.int64()])  # the widest ones a little more often
    if name == "i":
        return draw(ints)
    if name == "f":
        return draw(st.one_of(ints, st.sampled_from([pa.float32(), pa.float64()])))
    if name == "s":
        return draw(st.sampled_from(TEXTS))
    if name == "b":
        return draw(st.sampled_from(BINS))
    if name in ("l", "ls"):
        kind = draw(st.sampled_from([pa.list_, pa.large_list]))
        return kind(draw(ints) if name == "l" else draw(st.sampled_from(TEXTS)))
    if name == "st":
        return pa.struct([("a", draw(ints)), ("b", draw(st.sampled_from(TEXTS)))])
    assert name == "t"
    zoned = lake["zoned"] if lake["zoned"] is not None else draw(st.booleans())
    return pa.timestamp(draw(st.sampled_from(UNITS)), draw(st.sampled_from(ZONES)) if zoned else None)


# ---------------------------------------------------------------------------
# drawing values

def _values(t: pa.DataType, wide_dates: bool) -> st.SearchStrategy:
    """Python values of type ``t`` (nulls among them)."""
    if pat.is_null(t):
        return st.none()
    if pat.is_integer(t):
        lo, hi = int_range(t)
        inner = st.integers(lo, hi)
    elif pat.is_floating(t):
        inner = st.floats(width=t.bit_width)
    elif t in TEXTS:
        inner = st.text(st.characters(codec="utf-8"), max_size=4)
    elif t in BINS:
        inner = st.binary(max_size=4)
    elif pat.is_list(t) or pat.is_large_list(t):
        inner = st.lists(_values(t.value_type, wide_dates), max_size=3)
    elif pat.is_struct(t):
        inner = st.fixed_dictionaries({f.name: _values(f.type, wide_dates) for f in t})
    else:
        assert pat.is_timestamp(t), t
        inner = timestamp_ticks(t.unit, wide_dates, more_ns_edges=True)
    return st.one_of(st.none(), inner)


@st.composite
def lakes(draw):
    """A list of files: (writer, row_group_size, pyarrow.Table)."""
    lake = {"clash": draw(st.sampled_from(POOL + [None] * 8)),
            "zoned": draw(st.sampled_from([True, False, True, False, None]))}
    wide_dates = draw(st.booleans())  # dates outside the ns range in s/ms/us files
    focus = draw(st.lists(st.sampled_from(POOL), min_size=1, max_size=3, unique=True))
    files, next_id = [], 0
    for _ in range(draw(st.integers(2, 4))):
        names = [n for n in focus if draw(st.sampled_from([True, True, True, False]))]
        rows = draw(st.sampled_from([0, 1, 2, 3, 5, 8]))
        columns = {"id": pa.array(range(next_id, next_id + rows), pa.int64())}
        next_id += rows + 100
        for name in sorted(names, key=POOL.index):
            t = draw(_column_type(name, lake))
            columns[name] = pa.array(draw(st.lists(_values(t, wide_dates), min_size=rows, max_size=rows)), t)
        writer = draw(st.sampled_from(["pyarrow", "pyarrow", "polars"]))
        files.append((writer, draw(st.sampled_from([None, 2])), pa.table(columns)))
    return files


def _write(folder: str, files) -> list[str]:
    paths = []
    for k, (writer, row_group_size, table) in enumerate(files):
        path = os.path.join(folder, f"part-{k}.parquet")
        if writer == "polars":
            import polars as pl
            try:
                frame = pl.from_arrow(table)
            except Exception:  # noqa: BLE001 - a type polars does not take (e.g. timestamp[s]): pyarrow
                frame = None
            if frame is not None:
                frame.write_parquet(path)
                paths.append(path)
                continue
        try:
            pq.write_table(table, path, row_group_size=row_group_size)
        except pa.ArrowNotImplementedError:  # pyarrow cannot slice a string_view inside a struct
            pq.write_table(table, path)
        paths.append(path)
    return paths


# ---------------------------------------------------------------------------
# what to expect

def _family(t: pa.DataType) -> str:
    if pat.is_integer(t) or pat.is_floating(t):
        return "number"
    if str(t) in {"string", "large_string", "string_view"}:
        return "text"
    if str(t) in {"binary", "large_binary", "binary_view"}:
        return "bytes"
    if pat.is_list(t) or pat.is_large_list(t):
        return "list"
    if pat.is_struct(t):
        return "struct"
    if pat.is_timestamp(t):
        return "timestamp"
    return str(t)


def _documented_refusal(types: list[pa.DataType]) -> str | None:
    """Why arrowload refuses a column of these file types where DuckDB may read it (see the
    module doc), or None. Checked over every pair, not in file order: a lake is refused
    whatever its files are named."""
    types = [t for t in types if not pat.is_null(t)]
    if len({_family(t) for t in types}) > 1:
        return "types of different families"
    if not types:
        return None
    if pat.is_integer(types[0]) or pat.is_floating(types[0]):
        if _signed_beside_uint64(types) and not any(pat.is_floating(t) for t in types):
            return "a signed integer beside uint64 (DuckDB: HUGEINT)"
        return None
    if pat.is_timestamp(types[0]):
        if len({t.tz is None for t in types}) > 1:
            return "tz-naive beside tz-aware timestamps (DuckDB: TIMESTAMPTZ)"
        return None
    if _family(types[0]) == "list":
        return _documented_refusal([t.value_type for t in types])
    if pat.is_struct(types[0]):  # fields by name, as both sides merge them
        for n in dict.fromkeys(n for t in types for n in t.names):
            why = _documented_refusal([t.field(n).type for t in types if n in t.names])
            if why:
                return why
    return None


def _signed_beside_uint64(types: list[pa.DataType]) -> bool:
    return pa.uint64() in types and any(pat.is_signed_integer(t) for t in types)


def _float32_beside_ints(types: list[pa.DataType]) -> bool:
    """Integers and float32 with no float64: DuckDB reads FLOAT, arrowload double."""
    return (pa.float32() in types and pa.float64() not in types and any(pat.is_integer(t) for t in types))


# ---------------------------------------------------------------------------
# comparing values

def _canon(col: pa.ChunkedArray) -> list:
    """Values, not types: timestamps as integer nanoseconds since the epoch (UTC), NaN as a
    marker (NaN equals NaN), everything else as ``to_pylist`` gives it."""
    t = col.type
    if pat.is_timestamp(t):
        scale = 1_000_000_000 // PER_SECOND[t.unit]
        return [None if v is None else v * scale for v in col.cast(pa.int64()).to_pylist()]
    if pat.is_dictionary(t):
        col = col.cast(t.value_type)
    return [_nan(v) for v in col.to_pylist()]


def _nan(v):
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    if isinstance(v, list):
        return [_nan(x) for x in v]
    if isinstance(v, dict):
        return {k: _nan(x) for k, x in v.items()}
    return v


def _rows(table: pa.Table) -> dict[int, dict]:
    cols = {n: _canon(table.column(n)) for n in table.column_names}
    rows = {i: {n: cols[n][k] for n in cols} for k, i in enumerate(cols["id"])}
    assert len(rows) == table.num_rows, "an id read twice"
    return rows


def _assert_same(got: pa.Table, columns: list[str], want: dict[int, dict], what) -> None:
    rows = _rows(got)
    assert sorted(got.column_names) == sorted(columns), (what, got.column_names, columns)
    assert rows.keys() == want.keys(), (what, sorted(rows), sorted(want))
    for i, row in rows.items():
        assert row == want[i], (what, i, row, want[i])


def _duckdb(con, paths: list[str], folder: str, types: dict[str, list[pa.DataType]]):
    """DuckDB's rows by id (union_by_name), or the exception it raised. Columns of integers
    beside float32: each file read alone and cast to DOUBLE (see the module doc)."""
    scan = f"read_parquet('{folder}/*.parquet', union_by_name=true)"
    try:
        table = con.sql(f"SELECT * FROM {scan}").to_arrow_table()
    except duckdb.Error as exc:
        return None, exc
    want = _rows(table)
    for name, ts in types.items():
        if not _float32_beside_ints(ts):
            continue
        own = {}
        for p in paths:
            if name in pq.read_schema(p).names:
                t = con.sql(f"SELECT id, CAST(\"{name}\" AS DOUBLE) AS v FROM read_parquet('{p}')").to_arrow_table()
                own.update(zip(t.column("id").to_pylist(), _canon(t.column("v"))))
        for i, row in want.items():
            row[name] = own.get(i)
    return table.column_names, want


# ---------------------------------------------------------------------------
# the test

@settings(max_examples=int(os.environ.get("WIDENING_EXAMPLES", "120")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(files=lakes(), decoder=st.sampled_from([None, "pyarrow", "polars", "dataset"]),
       batch=st.integers(1, 9))
def test_generated_lakes_read_as_duckdb_union_by_name_reads_them(files, decoder, batch):
    with tempfile.TemporaryDirectory(prefix="widen-") as folder, duckdb.connect() as con, pinned_decoder(decoder):
        con.execute("SET TimeZone = 'UTC'")
        lake = os.path.join(folder, "lake")
        os.mkdir(lake)
        paths = _write(lake, files)
        types: dict[str, list[pa.DataType]] = {}
        for p in paths:  # the types as written (polars picks its own)
            for f in pq.read_schema(p):
                types.setdefault(f.name, []).append(f.type)
        refused = {n: why for n, ts in types.items() if (why := _documented_refusal(ts))}
        columns, want = _duckdb(con, paths, lake, types)
        ds = al.dataset(lake)
        cache = os.path.join(folder, "cache")
        reads = {
            "to_arrow": lambda: ds.to_arrow(),
            "loader": lambda: pa.Table.from_batches(list(ds.loader(
                batch, shuffle=False, output="arrow", drop_last=False, cache_dir=cache)), schema=ds.schema),
            "filter id": lambda: ds.filter("id % 3 <> 1").to_arrow(),
        }
        if refused or isinstance(want, Exception):
            why = refused or f"DuckDB refuses the lake: {want}"
            event("refused: " + (", ".join(sorted(set(refused.values()))) if refused else "by DuckDB too"))
            for what, read in reads.items():
                with pytest.raises(al.SchemaMismatchError):
                    read()
                    pytest.fail(f"{what}: read, where {why} ({types})")
            return
        event("compared" + (" (a widened column)" if any(len({str(t) for t in ts}) > 1 for ts in types.values()) else ""))
        for what, read in reads.items():
            got = read()
            expect = want if what != "filter id" else {i: r for i, r in want.items() if i % 3 != 1}
            _assert_same(got, columns, expect, (what, types))
        if "i" in types and pat.is_integer(ds.schema.field("i").type):
            present = sorted(r["i"] for r in want.values() if r["i"] is not None)
            cut = present[len(present) // 2] if present else 0  # a value of the lake: rows on both sides
            got = ds.filter(f"i > {cut}").to_arrow()
            expect = {i: r for i, r in want.items() if r["i"] is not None and r["i"] > cut}
            _assert_same(got, columns, expect, ("i >", cut, types))


@pytest.mark.parametrize("order", [("int8", "uint64", "float64"), ("int8", "float64", "uint64"),
                                   ("uint64", "int8", "float32")])
def test_signed_and_uint64_beside_a_float_read_in_any_file_order(tmp_path, order):
    """A lake's type does not depend on its files' names: DuckDB reads int8, uint64 and
    float files as one floating column in any order (before: types merged pairwise in file
    order refused int8 beside uint64 before a later float file could widen them)."""
    values = {"int8": [-1], "uint64": [2**64 - 1], "float64": [0.5], "float32": [0.5]}
    for k, name in enumerate(order):
        pq.write_table(pa.table({"id": [k], "x": pa.array(values[name], getattr(pa, name)())}),
                       str(tmp_path / f"part-{k}.parquet"))
    with duckdb.connect() as con:
        want = con.sql(f"SELECT id, x FROM read_parquet('{tmp_path}/*.parquet', union_by_name=true) ORDER BY id").fetchall()
    got = al.dataset(str(tmp_path)).to_arrow().sort_by("id")
    assert list(zip(got["id"].to_pylist(), got["x"].to_pylist())) == want


def test_struct_fields_in_another_order_or_set_merge_by_name_as_duckdb(tmp_path):
    """Struct fields that differ in order or set across files (a writer adding a field, one
    ordering them otherwise), also inside a list: merged by name in first-seen order, a
    field a file lacks null there, as DuckDB's union_by_name reads them (before: refused
    with SchemaMismatchError). Types and values against DuckDB, through every read path."""
    s_ab = pa.struct([("a", pa.int64()), ("b", pa.string())])
    s_ba = pa.struct([("b", pa.string()), ("a", pa.int64())])
    s_a8 = pa.struct([("a", pa.int8())])
    s_ca = pa.struct([("c", pa.float64()), ("a", pa.int32())])
    files = [(s_ab, [{"a": 1, "b": "x"}, None]), (s_ba, [{"b": "y", "a": 2}]), (s_a8, [{"a": 3}]),
             (s_ca, [{"c": 1.5, "a": None}, {"c": 2.5, "a": 7}])]
    at = 0
    for k, (t, values) in enumerate(files):
        n = len(values)
        pq.write_table(pa.table({"id": pa.array(range(at, at + n), pa.int64()), "s": pa.array(values, t),
                                 "l": pa.array([[v] for v in values], pa.list_(t))}),
                       str(tmp_path / f"part-{k}.parquet"))
        at += n
    with duckdb.connect() as con:
        want = con.sql(f"SELECT * FROM read_parquet('{tmp_path}/*.parquet', union_by_name=true) ORDER BY id")
        types = [str(t) for t in want.types]
        rows = want.fetchall()
    assert types == ["BIGINT", "STRUCT(a BIGINT, b VARCHAR, c DOUBLE)", "STRUCT(a BIGINT, b VARCHAR, c DOUBLE)[]"]
    ds = al.dataset(str(tmp_path))
    assert ds.schema.field("s").type.names == ["a", "b", "c"]
    for decoder in (None, "pyarrow", "polars", "dataset"):
        with pinned_decoder(decoder):
            got = ds.to_arrow().sort_by("id")
            assert [tuple(r.values()) for r in got.to_pylist()] == rows, decoder
            epoch = pa.Table.from_batches(list(ds.loader(2, shuffle=False, output="arrow")), schema=ds.schema)
            assert [tuple(r.values()) for r in epoch.to_pylist()] == rows, decoder
            for predicate in ("s.a >= 2", "s.c IS NOT NULL", "s.b IS NULL"):
                count = duckdb.sql(f"SELECT count(*) FROM read_parquet('{tmp_path}/*.parquet', union_by_name=true) "
                                   f"WHERE {predicate}").fetchall()[0][0]
                assert ds.filter(predicate).count() == count, (decoder, predicate)


def test_map_columns_from_different_writers_merge_as_duckdb(tmp_path):
    """Map columns whose keys or items differ across files as writers make them: a value
    field one writer marks non-nullable (Spark's ``valueContainsNull=false``), integer
    items of another width, struct items with their fields in another order and a large
    string (polars): keys and items merged as a list's values (before: refused with a
    SchemaMismatchError that printed the same type twice). Values against DuckDB, through
    every read path."""
    s_xy = pa.struct([("x", pa.int64()), ("y", pa.string())])
    s_yx = pa.struct([("y", pa.large_string()), ("x", pa.int32())])
    files = [
        (pa.map_(pa.string(), pa.int32()), pa.map_(pa.string(), s_xy), [[("a", 1)], None], [[("p", {"x": 1, "y": "u"})], []]),
        (pa.map_(pa.string(), pa.field("value", pa.int64(), nullable=False)), pa.map_(pa.string(), s_yx),
         [[("b", 2 ** 40), ("c", 3)]], [[("q", {"y": "v", "x": 2}), ("r", None)]]),
        (pa.map_(pa.large_string(), pa.int8()), pa.map_(pa.string(), s_xy), [[("d", None)]], [None]),
    ]
    at = 0
    for k, (tm, ts, m, s) in enumerate(files):
        n = len(m)
        pq.write_table(pa.table({"id": pa.array(range(at, at + n), pa.int64()), "m": pa.array(m, tm),
                                 "s": pa.array(s, ts)}), str(tmp_path / f"part-{k}.parquet"))
        at += n
    with duckdb.connect() as con:
        want = con.sql(f"SELECT id, map_entries(m), map_entries(s) FROM read_parquet('{tmp_path}/*.parquet', "
                       "union_by_name=true) ORDER BY id").fetchall()
    rows = [(i, None if m is None else [(e["key"], e["value"]) for e in m],
             None if s is None else [(e["key"], e["value"]) for e in s]) for i, m, s in want]
    ds = al.dataset(str(tmp_path))
    assert ds.schema.field("m").type.item_type == pa.int64() and ds.schema.field("s").type.item_type.names == ["x", "y"]
    for decoder in (None, "pyarrow", "polars", "dataset"):
        with pinned_decoder(decoder):
            for got in (ds.to_arrow().sort_by("id"),
                        pa.Table.from_batches(list(ds.loader(2, shuffle=False, output="arrow")), schema=ds.schema)):
                assert [(r["id"], r["m"], r["s"]) for r in got.to_pylist()] == rows, decoder
            assert ds.filter("m['b'] = 1099511627776").count() == 1, decoder
            assert ds.filter("s['q'].x = 2").count() == 1, decoder


def test_fixed_size_lists_beside_lists_merge_as_duckdb(tmp_path):
    """Embeddings written as fixed-size lists by one writer (pyarrow keeps the size in its
    stored Arrow schema) and as lists by another, or of another size or value type: a list
    of the merged values, as DuckDB reads ARRAY beside LIST (before: refused); fixed-size
    lists of one size stay fixed-size, their integers rounding into doubles as DuckDB
    rounds them. Values against DuckDB, through every read path; the loader gives 2-D
    arrays where every list has one length."""
    files = [
        [("e", pa.array([[1.5, 2.5], [3.0, 4.0]], pa.list_(pa.float32(), 2))),
         ("f", pa.array([[1, 2 ** 53 + 1], None], pa.list_(pa.int64(), 2)))],
        [("e", pa.array([[5.0, 6.0]], pa.list_(pa.float64()))), ("f", pa.array([[0.5, 1.5]], pa.list_(pa.float64(), 2)))],
        [("e", pa.array([[7.0, 8.0]], pa.list_(pa.float32(), 2))), ("f", pa.array([[9, 10]], pa.list_(pa.int32(), 2)))],
    ]
    at = 0
    for k, cols in enumerate(files):
        n = len(cols[0][1])
        pq.write_table(pa.table({"id": pa.array(range(at, at + n), pa.int64()), **dict(cols)}),
                       str(tmp_path / f"part-{k}.parquet"))
        at += n
    with duckdb.connect() as con:
        rows = con.sql(f"SELECT id, e, f FROM read_parquet('{tmp_path}/*.parquet', union_by_name=true) "
                       "ORDER BY id").fetchall()
    rows = [(i, e, None if f is None else list(f)) for i, e, f in rows]
    ds = al.dataset(str(tmp_path))
    assert ds.schema.field("e").type == pa.list_(pa.float64()) and ds.schema.field("f").type == pa.list_(pa.float64(), 2)
    for decoder in (None, "pyarrow", "polars", "dataset"):
        with pinned_decoder(decoder):
            for got in (ds.to_arrow().sort_by("id"),
                        pa.Table.from_batches(list(ds.loader(2, shuffle=False, output="arrow")), schema=ds.schema)):
                assert [(r["id"], r["e"], r["f"]) for r in got.to_pylist()] == rows, decoder
            x = next(iter(ds.select("id", "e").loader(4, shuffle=False, output="numpy")))["e"]
            assert x.shape == (4, 2) and x.tolist() == [r[1] for r in rows], decoder
            assert ds.filter("e[1] > 4").count() == 2, decoder


def _lake_rows(tmp_path, files) -> tuple[list, list]:
    """``files`` (tables) written in order; DuckDB's ``union_by_name`` rows and arrowload's
    under every decoder (``to_arrow`` and a loader epoch), by ``id``."""
    for k, table in enumerate(files):
        pq.write_table(table, str(tmp_path / f"part-{k}.parquet"))
    with duckdb.connect() as con:
        want = con.sql(f"SELECT * FROM read_parquet('{tmp_path}/*.parquet', union_by_name=true) ORDER BY id")
        rows = want.fetchall()
    ds = al.dataset(str(tmp_path))
    got = []
    for decoder in (None, "pyarrow", "polars", "dataset"):
        with pinned_decoder(decoder):
            got.append([tuple(r.values()) for r in ds.to_arrow().sort_by("id").to_pylist()])
            epoch = pa.Table.from_batches(list(ds.loader(2, shuffle=False, output="arrow")), schema=ds.schema)
            got.append([tuple(r.values()) for r in epoch.sort_by("id").to_pylist()])
    return [tuple(r) for r in rows], got


def test_non_nullable_fields_under_a_null_parent_read_as_duckdb(tmp_path):
    """A struct holding a fixed-size list of non-nullable items, and a fixed-size list of
    structs with a non-nullable field, null in some rows, beside files of another shape
    (Spark marks such fields required): pyarrow's cast checks the slots under a null parent
    too, so the lake was refused ("its values there do not fit"). Fields inside a column
    that is cast are nullable in the unified type, as DuckDB has no NOT NULL inside one."""
    s0 = pa.struct([pa.field("c", pa.list_(pa.field("element", pa.int8(), nullable=False), 3)),
                    pa.field("b", pa.list_(pa.int64()), nullable=False)])
    l0 = pa.list_(pa.struct([pa.field("b", pa.int8(), nullable=False)]), 1)
    files = [pa.table({"id": pa.array([0, 1], pa.int64()), "n": pa.array([None, {"c": [1, 2, 3], "b": [4]}], s0),
                       "m": pa.array([None, [{"b": 3}]], l0)}),
             pa.table({"id": pa.array([2], pa.int64()), "n": pa.array([{"b": []}], pa.struct([("b", pa.list_(pa.null()))])),
                       "m": pa.array([[{"a": 7}]], pa.list_(pa.struct([("a", pa.int64())])))})]
    want, got = _lake_rows(tmp_path, files)
    assert all(g == want for g in got)


@pytest.mark.parametrize("order", ["float-first", "float-last"])
def test_nested_integers_no_integer_holds_read_as_doubles_in_any_file_order(tmp_path, order):
    """int8 and uint64 in a struct field, a float file of it: every file holds a float in
    another field, so sorting the files by "holds a float" did not help, and the lake read
    or was refused by its file names. A file that does not merge yet is taken again after
    the others."""
    t = [pa.table({"id": pa.array([i], pa.int64()), "s": pa.array([{"x": v, "f": 0.5}], pa.struct([("x", xt), ("f", pa.float32())]))})
         for i, (v, xt) in enumerate([(-1, pa.int8()), (2 ** 64 - 1, pa.uint64()), (0.25, pa.float64())])]
    want, got = _lake_rows(tmp_path, t if order == "float-last" else t[::-1])
    assert all(g == want for g in got)


def test_struct_fields_inside_fixed_size_lists_and_maps_keep_duckdbs_order(tmp_path):
    """Struct fields inside a fixed-size list or a map come in the order the files first
    show them, as DuckDB gives them (they came in the merge's order)."""
    files = [pa.table({"id": pa.array([0], pa.int64()),
                       "l": pa.array([[{"b": 1, "a": 2}]], pa.list_(pa.struct([("b", pa.int64()), ("a", pa.int64())]), 1)),
                       "m": pa.array([[("k", {"b": 1, "a": 2})]], pa.map_(pa.string(), pa.struct([("b", pa.int64()), ("a", pa.int64())])))}),
             pa.table({"id": pa.array([1], pa.int64()),
                       "l": pa.array([[{"a": 3, "b": 4}]], pa.list_(pa.struct([("a", pa.int64()), ("b", pa.int64())]))),
                       "m": pa.array([[("k", {"a": 0.5, "b": 4})]], pa.map_(pa.string(), pa.struct([("a", pa.float64()), ("b", pa.int64())])))})]
    want, got = _lake_rows(tmp_path, files)
    assert all([(i, l, dict(m)) for i, l, m in g] == want for g in got)  # (DuckDB gives a map as a dict)
    ds = al.dataset(str(tmp_path))
    assert ds.schema.field("l").type.value_type.names == ["b", "a"]
    assert ds.schema.field("m").type.item_type.names == ["b", "a"]


def test_a_column_every_file_shares_keeps_its_exact_type(tmp_path):
    """A map with sorted keys and non-null items, the same in every file, beside a column
    that differs: its type is the files' own (the rebuild for the field order, then the
    nullable fields inside, dropped keys_sorted and the non-null item)."""
    m = pa.map_(pa.string(), pa.field("value", pa.int64(), nullable=False), keys_sorted=True)
    for k, yt in enumerate([pa.int32(), pa.int64()]):
        pq.write_table(pa.table({"m": pa.array([[("a", 1), ("b", 2)]], m), "y": pa.array([k], yt)}),
                       str(tmp_path / f"part-{k}.parquet"))
    single = pq.read_table(str(tmp_path / "part-0.parquet")).schema.field("m").type
    ds = al.dataset(str(tmp_path))
    assert single.keys_sorted and ds.schema.field("m").type.equals(single)
    assert ds.to_arrow().column("m").type.equals(single)
