"""SQL filters and projections give exactly what DuckDB gives over the same files.

DuckDB is the independent truth: every predicate runs as
``SELECT * FROM read_parquet('<lake>/**/*.parquet', hive_partitioning=...) WHERE <pred>``
and arrowload's ``dataset(lake).filter(pred).to_arrow()`` must hold the same columns,
types and values (sorted by the unique ``id``), with every optimizer rule on and with
every rule off, and ``count()`` must equal DuckDB's ``count(*)``.

Normalisation (see ``conftest.normalize``) covers representation only: the ``emb``
fixed-size list reads as a plain LIST in DuckDB, and for computed decimal columns the
precision / scale DuckDB picks may differ from Arrow's while the values are equal
(checked value by value; see ``test_projection_matches_duckdb``).
"""

from __future__ import annotations

import os

import datetime as dt

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import arrowload as al

# (id, predicate). Ids make failures readable; the predicates are DuckDB SQL.
PREDICATES = [
    # comparisons
    ("int-lt", "id < 1000"),
    ("int-ge", "id >= 19500"),
    ("int-eq", "id = 12345"),
    ("int-ne", "id <> 5"),
    ("int-ne-bang", "id != 5"),
    ("int8-eq", "label = 1"),
    ("int8-ne", "label <> 0"),
    ("int8-vs-big-literal", "label < 1000"),
    ("int-gt", "user_id > 1900"),
    ("literal-left", "1000 > id"),
    ("float32-gt-decimal-literal", "f0 > 1.5"),
    ("float32-le-int-literal", "f0 <= -2"),
    ("float32-lt-inexact", "f1 < 0.1"),
    ("float32-exp-literal", "f2 > 1e-1"),
    ("float64-nulls", "score > 0.5"),
    ("float64-le", "score <= 0.01"),
    ("string-eq", "country = 'US'"),
    ("string-lt", "country < 'DE'"),
    ("string-ne", "country <> 'US'"),
    ("bool-literal", "true"),
    ("bool-false", "false"),
    ("null-compare", "id = NULL"),
    # AND / OR / NOT with three-valued logic
    ("and", "label = 1 AND country = 'US'"),
    ("or", "country = 'DE' OR country = 'FR'"),
    ("not", "NOT (label = 1)"),
    ("not-null-string", "NOT country = 'US'"),
    ("or-null", "label = 1 OR score > 0.9"),
    ("not-null-float", "NOT (score > 0.5)"),
    ("nested", "(label = 1 OR f0 > 1) AND NOT (country IN ('US', 'DE'))"),
    ("and-or-precedence", "label = 1 AND country = 'US' OR country = 'JP'"),
    # IN / NOT IN
    ("in-string", "country IN ('US', 'DE')"),
    ("not-in-string", "country NOT IN ('US', 'DE')"),
    ("in-with-null", "country IN ('US', NULL)"),
    ("not-in-with-null", "country NOT IN ('US', NULL)"),
    ("in-int", "id IN (1, 2, 3, 19999, 50000)"),
    ("in-int8", "label IN (1)"),
    ("not-in-int8", "label NOT IN (0)"),
    ("in-date", "day IN (DATE '2024-01-02', DATE '2024-01-05')"),
    ("in-date-strings", "day IN ('2024-01-02', '2024-01-05')"),
    ("not-in-parens", "NOT (country IN ('US'))"),
    ("in-float-nulls", "score IN (0.5, NULL)"),
    ("in-decimal", "price IN (12.5, 0.01, 99.99)"),
    # BETWEEN
    ("between-int", "id BETWEEN 100 AND 200"),
    ("not-between", "id NOT BETWEEN 100 AND 19900"),
    ("between-float", "f0 BETWEEN -0.5 AND 0.5"),
    ("between-date", "day BETWEEN DATE '2024-01-02' AND DATE '2024-01-03'"),
    ("between-ts", "ts BETWEEN TIMESTAMP '2024-01-02 00:00:00' AND TIMESTAMP '2024-01-02 12:00:00'"),
    ("between-strings-date", "day BETWEEN '2024-01-02' AND '2024-01-03'"),
    # LIKE / ILIKE
    ("like-prefix", "text LIKE 'alpha%'"),
    ("like-suffix", "text LIKE '%ta'"),
    ("like-underscore", "text LIKE '_eta%'"),
    ("ilike", "text ILIKE 'ALPHA%'"),
    ("not-like", "text NOT LIKE '%a%'"),
    ("like-nulls", "country LIKE 'U%'"),
    ("not-ilike", "text NOT ILIKE '%BETA%'"),
    ("ilike-exact", "country ILIKE 'us'"),
    ("not-like-nulls", "country NOT LIKE '%S'"),
    # IS [NOT] NULL
    ("is-null", "country IS NULL"),
    ("is-not-null", "country IS NOT NULL"),
    ("float-is-null", "score IS NULL"),
    ("is-not-null-and", "score IS NOT NULL AND label = 1"),
    ("is-true", "(score > 0.5) IS TRUE"),
    ("is-not-true", "(score > 0.5) IS NOT TRUE"),
    ("is-false", "(score > 0.5) IS FALSE"),
    # arithmetic: % truncates toward zero, / is true division
    ("mod", "id % 7 = 3"),
    ("mod-negative", "(id - 10000) % 7 = -3"),
    ("mod-negative-never-positive", "(id - 10000) % 7 = 4 AND id < 10000"),
    ("mod-negated", "-id % 5 = -2"),
    ("mod-negative-divisor", "(user_id - 1000) % -3 = -1"),
    ("mod-float", "f0 % 0.5 < -0.25"),
    ("div-true", "id / 3 > 6000.5"),
    ("div-half", "id / 2 = 10.5"),
    ("div-int8", "label / 2 = 0.5"),
    ("div-decimal", "price / 2 > 40"),
    ("mul-add-float", "f0 * 2 + 1 > 2"),
    ("sub-columns", "f0 - f1 > 1"),
    ("mul-int", "user_id * 2 = id"),
    ("add-int", "id + 1 = 100"),
    ("neg", "-id < -19990"),
    ("abs", "abs(f0 - f1) < 0.01"),
    ("decimal-mul", "price * 2 > 150"),
    ("decimal-add", "price + 1 < 2"),
    ("int8-mul-overflowing-literal", "label * 1000 = 1000"),
    ("int8-add-wide", "label + 200 > 200"),
    # CAST
    ("cast-float-int", "CAST(f0 AS INTEGER) = 1"),
    ("cast-decimal-int-rounds", "CAST(price AS INTEGER) = 10"),
    ("cast-to-varchar", "CAST(id AS VARCHAR) LIKE '%77'"),
    ("cast-to-boolean", "CAST(label AS BOOLEAN)"),
    ("cast-date-varchar", "CAST(day AS VARCHAR) = '2024-01-03'"),
    ("cast-ts-date", "CAST(ts AS DATE) = DATE '2024-01-04'"),
    ("cast-decimal-double", "CAST(price AS DOUBLE) > 99.5"),
    ("cast-tinyint", "CAST(label AS TINYINT) = 1"),
    ("cast-int8-is-bigint", "CAST(id AS INT8) > 19990"),
    ("cast-literal", "CAST('2024-01-03' AS DATE) = day"),
    ("cast-shorthand", "id::VARCHAR = '123'"),
    # DATE / TIMESTAMP literals
    ("date-eq", "day = DATE '2024-01-03'"),
    ("date-ge", "day >= DATE '2024-01-08'"),
    ("ts-lt", "ts < TIMESTAMP '2024-01-01 01:00:00'"),
    ("ts-ge", "ts >= TIMESTAMP '2024-01-08 12:34:56'"),
    ("ts-vs-date-literal", "ts > DATE '2024-01-08'"),
    ("date-vs-ts-literal", "day < TIMESTAMP '2024-01-02 12:00:00'"),
    ("date-eq-ts-literal", "day = TIMESTAMP '2024-01-02 00:00:00'"),
    # string literal compared with a date / timestamp column
    ("date-eq-string", "day = '2024-01-03'"),
    ("date-gt-string", "day > '2024-01-07'"),
    ("ts-lt-string", "ts < '2024-01-01 02:00:00'"),
    ("ts-ge-date-string", "ts >= '2024-01-08'"),
    # float literal against the DECIMAL(10, 2) price
    ("decimal-between", "price BETWEEN 0.05 AND 0.07"),
    ("decimal-eq", "price = 12.5"),
    ("decimal-gt-beyond-scale", "price > 99.995"),
    ("decimal-ge-beyond-scale", "price >= 99.985"),
    ("decimal-lt-beyond-scale", "price < 0.015"),
    ("decimal-le-beyond-scale", "price <= 0.005"),
    ("decimal-int-literal", "price > 50"),
    ("decimal-exp-literal", "price < 5e-1"),
    ("decimal-ne", "price <> 0.01 AND price < 0.03"),
    # column to column
    ("col-float-float", "f0 > f1"),
    ("col-float32-float64", "f0 < score"),
    ("col-int-int", "user_id < id"),
    ("col-int-expr", "user_id * 10 > id"),
    ("col-date-ts", "day < ts"),
    ("col-int8-int64", "label = user_id % 2"),
    ("col-decimal-float", "price < f0 + 1"),
    # unquoted identifiers are case-insensitive; quoted ones are exact
    ("upper-ident", "LABEL = 1"),
    ("mixed-ident", "Country = 'US' AND Id < 5000"),
    ("quoted-ident", '"label" = 1'),
    # functions
    ("lower", "lower(country) = 'us'"),
    ("length", "length(text) > 10"),
    ("coalesce", "coalesce(score, 0) < 0.01"),
    ("case", "CASE WHEN label = 1 THEN f0 ELSE f1 END > 1"),
]

LAKES = ["parquet_lake", "hive_lake"]
NO_OPT = al.OptimizerOptions.none()

# Every predicate runs on the plain lake. The hive lake (44 small files, slower to scan)
# gets every predicate that reads the partition column, where partition pruning and the
# typed partition column matter, and every fifth of the others.
CASES = [pytest.param("parquet_lake", p, id=f"parquet-{i}") for i, p in PREDICATES] + [
    pytest.param("hive_lake", p, id=f"hive-{i}") for n, (i, p) in enumerate(PREDICATES)
    if "country" in p.lower() or n % 5 == 0]


@pytest.mark.parametrize("lake_name,pred", CASES)
def test_filter_matches_duckdb(request, lake_name, pred, duck, parquet_scan, assert_tables_equal):
    path, hive = request.getfixturevalue(lake_name), lake_name == "hive_lake"
    expected = duck(f"SELECT * FROM {parquet_scan(path, hive)} WHERE {pred}")
    ds = al.dataset(path)

    got = ds.filter(pred).to_arrow()
    assert_tables_equal(got, expected)
    if not hive:  # source order: files by path, then row groups, then rows = id order here
        ids = got.column("id").to_numpy()
        assert (ids[1:] > ids[:-1]).all(), "rows are not in source order"

    unoptimized = ds.with_options(optimizer=NO_OPT).filter(pred)
    assert_tables_equal(unoptimized.to_arrow(), expected)

    assert ds.filter(pred).count() == expected.num_rows


def test_predicates_are_selective(parquet_lake, duck, parquet_scan):
    """Guard against a vacuous suite: most predicates keep some rows and drop others."""
    counts = ", ".join(f"count(*) FILTER (WHERE {p}) AS c{n}" for n, (_, p) in enumerate(PREDICATES))
    row = duck(f"SELECT count(*) AS total, {counts} FROM {parquet_scan(parquet_lake)}").to_pylist()[0]
    partial = [i for n, (i, _) in enumerate(PREDICATES) if 0 < row[f"c{n}"] < row["total"]]
    assert len(partial) >= len(PREDICATES) * 0.9, sorted(set(i for i, _ in PREDICATES) - set(partial))


# ---------------------------------------------------------------------------
# projections: values and result types

PROJECTION_SQL = ("user_id, f0, CAST(label AS TINYINT) AS label, f0 * 2 + 1 AS x, id % 7 AS m, "
                  "price * 2 AS d")

EXTRA_PROJECTIONS = {
    # name: SQL expression (compared with DuckDB's SELECT <expr> AS <name>)
    "q": "id / 3",
    "half_price": "price / 2",
    "i8": "CAST(id AS INT8)",
    "ci": "CAST(f0 AS INTEGER)",
    "cpi": "CAST(price AS INTEGER)",
    "cpd": "CAST(price AS DOUBLE)",
    "cpf": "CAST(price AS FLOAT)",
    "cv": "CAST(day AS VARCHAR)",
    "cts": "CAST(ts AS DATE)",
    "cdt": "CAST(day AS TIMESTAMP)",
    "lp": "label + 1",
    "lm": "label * 1000",
    "ll": "label + label",
    "lid": "label + id",
    "pp": "price + price",
    "pm": "price - 0.5",
    "pf": "price * 1.5",
    "ff": "f0 + f1",
    "fs": "f0 + score",
    "pf0": "price + f0",
    "fdiv": "f0 / f1",
    "neg": "-id",
    "negmod": "(id - 10000) % 7",
    "fmod": "f0 % 0.5",
    "absf": "abs(f0)",
    "low": "lower(country)",
    "co": "coalesce(score, -1)",
    "cw": "CASE WHEN label = 1 THEN 'yes' ELSE 'no' END",
    "cmp": "f0 > f1",
    "fdiv_int_literal": "f0 / 2",
    "fdiv_int_col": "f0 / id",
    "fmul_int_col": "f0 * id",
    "fdiv_decimal": "f0 / price",
    "decimal_div_float": "price / f0",
    "int_plus_decimal_literal": "id + 0.5",
    "int8_times_decimal_literal": "label * 1.5",
    "int8_plus_wide_literal": "label + 200",
    "pmod": "price % 3",
}


def _assert_projection_equal(got: pa.Table, expected: pa.Table) -> None:
    """Same names and values; types equal, except that two decimals may differ in
    precision / scale (Arrow and DuckDB size decimal results differently) as long as every
    value is the same number."""
    assert got.column_names == expected.column_names
    for name in got.column_names:
        g, e = got.column(name), expected.column(name)
        if pa.types.is_decimal(g.type) and pa.types.is_decimal(e.type):
            assert g.to_pylist() == e.to_pylist(), name  # Decimal('1.50') == Decimal('1.5')
            continue
        assert g.type.equals(e.type), f"{name}: arrowload {g.type} vs DuckDB {e.type}"
        assert g.equals(e), f"{name}: values differ: {g.slice(0, 5)} vs {e.slice(0, 5)}"


def test_projection_matches_duckdb(parquet_lake, duck, parquet_scan):
    ds = al.dataset(parquet_lake).select(
        "id", "user_id", "f0", label="CAST(label AS TINYINT)", x="f0 * 2 + 1", m="id % 7",
        d="price * 2")
    expected = duck(f"SELECT id, {PROJECTION_SQL} FROM {parquet_scan(parquet_lake)} ORDER BY id")
    got = ds.to_arrow().sort_by("id")
    _assert_projection_equal(got, expected)
    assert ds.schema.field("label").type == pa.int8()
    assert ds.schema.field("x").type == pa.float32()
    assert ds.schema.field("m").type == pa.int64()
    assert pa.types.is_decimal(ds.schema.field("d").type)
    assert ds.schema.equals(got.schema)
    unoptimized = ds.with_options(optimizer=NO_OPT).to_arrow().sort_by("id")
    assert unoptimized.equals(got)


@pytest.mark.parametrize("name", sorted(EXTRA_PROJECTIONS))
def test_projection_expression_matches_duckdb(parquet_lake, name, duck, parquet_scan):
    sql = EXTRA_PROJECTIONS[name]
    expected = duck(f"SELECT id, {sql} AS {name} FROM {parquet_scan(parquet_lake)} ORDER BY id")
    ds = al.dataset(parquet_lake).select("id", **{name: sql})
    got = ds.to_arrow().sort_by("id")
    _assert_projection_equal(got, expected)
    assert ds.schema.equals(got.schema), "schema promised before reading differs from the data"


def test_integer_literal_widens_like_duckdb():
    """``tinyint * 1000`` is INTEGER in DuckDB, so 100 * 1000 does not overflow."""
    table = pa.table({"id": pa.array([0, 1, 2], pa.int64()),
                      "x": pa.array([100, -100, None], pa.int8()),
                      "u": pa.array([200, 3, 255], pa.uint8())})
    exprs = {"a": "x * 1000", "b": "x + 200", "c": "1000 * x", "d": "x * 100000000000",
             "e": "u + 300", "f": "x - 1"}
    with duckdb.connect() as con:
        con.register("t", table)
        expected = con.sql("SELECT id, " + ", ".join(f"{v} AS {k}" for k, v in exprs.items())
                           + " FROM t ORDER BY id").to_arrow_table()
    got = al.dataset(table).select("id", **exprs).to_arrow().sort_by("id")
    _assert_projection_equal(got, expected)
    assert got.column("a").to_pylist() == [100_000, -100_000, None]


def test_filter_over_projection_matches_duckdb(parquet_lake, duck, parquet_scan, assert_tables_equal):
    """A filter on a computed column is pushed through the projection correctly."""
    ds = al.dataset(parquet_lake).select("id", m="id % 7", x="f0 * 2 + 1", c="country")
    got = ds.filter("m = 3 AND x > 1 AND c IN ('US', 'DE')").to_arrow()
    expected = duck(f"SELECT id, id % 7 AS m, f0 * 2 + 1 AS x, country AS c "
                    f"FROM {parquet_scan(parquet_lake)} "
                    "WHERE id % 7 = 3 AND f0 * 2 + 1 > 1 AND country IN ('US', 'DE')")
    assert_tables_equal(got, expected)
    assert_tables_equal(ds.with_options(optimizer=NO_OPT)
                        .filter("m = 3 AND x > 1 AND c IN ('US', 'DE')").to_arrow(), expected)


# ---------------------------------------------------------------------------
# pyarrow and polars expressions give the same rows as the SQL text

EQUIVALENT = [
    ("label = 1", pc.field("label") == 1, pl.col("label") == 1),
    ("country = 'US' AND f0 > 0.5",
     (pc.field("country") == "US") & (pc.field("f0") > pa.scalar(0.5, pa.float32())),
     (pl.col("country") == "US") & (pl.col("f0") > 0.5)),
    ("id < 100 OR id >= 19900", (pc.field("id") < 100) | (pc.field("id") >= 19900),
     (pl.col("id") < 100) | (pl.col("id") >= 19900)),
    ("score IS NULL", pc.field("score").is_null(), pl.col("score").is_null()),
    ("country IN ('DE', 'FR')", pc.field("country").isin(["DE", "FR"]),
     pl.col("country").is_in(["DE", "FR"])),
    ("day >= DATE '2024-01-05'", pc.field("day") >= pa.scalar(dt.date(2024, 1, 5)),
     pl.col("day") >= dt.date(2024, 1, 5)),
]


@pytest.mark.parametrize("sql,arrow_expr,polars_expr", EQUIVALENT, ids=[e[0] for e in EQUIVALENT])
@pytest.mark.parametrize("lake_name", LAKES)
def test_expression_kinds_agree(request, lake_name, sql, arrow_expr, polars_expr, duck,
                                parquet_scan, assert_tables_equal):
    path = request.getfixturevalue(lake_name)
    expected = duck(f"SELECT * FROM {parquet_scan(path, lake_name == 'hive_lake')} WHERE {sql}")
    assert expected.num_rows > 0
    ds = al.dataset(path)
    for pred in (sql, arrow_expr, polars_expr):
        assert_tables_equal(ds.filter(pred).to_arrow(), expected)
        assert ds.filter(pred).count() == expected.num_rows
        if lake_name == "parquet_lake":
            assert_tables_equal(ds.with_options(optimizer=NO_OPT).filter(pred).to_arrow(), expected)


def test_mixed_expression_kinds_conjoin(parquet_lake, duck, parquet_scan, assert_tables_equal):
    """SQL, pyarrow and polars filters chained on one dataset AND together."""
    ds = (al.dataset(parquet_lake).filter("label = 1").filter(pc.field("id") < 15000)
          .filter(pl.col("country") == "US"))
    expected = duck(f"SELECT * FROM {parquet_scan(parquet_lake)} "
                    "WHERE label = 1 AND id < 15000 AND country = 'US'")
    assert_tables_equal(ds.to_arrow(), expected)
    assert ds.count() == expected.num_rows


# ---------------------------------------------------------------------------
# random predicates

_INT_COLS = ["id", "user_id", "label"]
_FLOAT_COLS = ["f0", "f1", "score"]
_OPS = ["=", "<>", "<", "<=", ">", ">="]


def _atom() -> st.SearchStrategy[str]:
    ints = st.builds(lambda c, op, v: f"{c} {op} {v}", st.sampled_from(_INT_COLS),
                     st.sampled_from(_OPS), st.integers(-5, 21_000))
    floats = st.builds(lambda c, op, v: f"{c} {op} {v}", st.sampled_from(_FLOAT_COLS),
                       st.sampled_from(_OPS),
                       st.decimals(-3, 3, places=2, allow_nan=False).map(str))
    strings = st.builds(lambda op, v: f"country {op} '{v}'", st.sampled_from(_OPS),
                        st.sampled_from(["US", "DE", "IN", "ZZ", "A", ""]))
    dates = st.builds(lambda op, d: f"day {op} DATE '{d.isoformat()}'", st.sampled_from(_OPS),
                      st.dates(dt.date(2023, 12, 30), dt.date(2024, 1, 10)))
    nulls = st.builds(lambda c, neg: f"{c} IS {'NOT ' if neg else ''}NULL",
                      st.sampled_from(["country", "score"]), st.booleans())
    return st.one_of(ints, floats, strings, dates, nulls)


_predicate = st.recursive(
    _atom(),
    lambda inner: st.one_of(
        st.builds(lambda a, b: f"({a} AND {b})", inner, inner),
        st.builds(lambda a, b: f"({a} OR {b})", inner, inner),
        st.builds(lambda a: f"NOT ({a})", inner),
    ),
    max_leaves=4,
)


@settings(max_examples=50, deadline=None)
@given(pred=_predicate)
def test_random_predicates_match_duckdb(parquet_lake, duck, parquet_scan, assert_tables_equal, pred):
    expected = duck(f"SELECT id FROM {parquet_scan(parquet_lake)} WHERE {pred}")
    ds = al.dataset(parquet_lake).filter(pred)
    assert_tables_equal(ds.select("id").to_arrow(), expected)
    assert ds.count() == expected.num_rows


# ---------------------------------------------------------------------------
# Statistics are evidence only where sound (issue 11): NaN, corrupt, implausible.
#
# Each file below has statistics that a naive pruner (pyarrow's own, used before) trusts
# wrongly. The truth is DuckDB over the rows pyarrow reads without any filter (so no
# statistics are consulted); ``count()``, ``to_arrow()``, ``head()`` and a loader epoch
# must all agree with it, optimizer on and off.

import struct  # noqa: E402

import pyarrow.parquet as pq  # noqa: E402

from arrowload.options import OptimizerOptions  # noqa: E402


def _footer_bounds(data: bytes) -> tuple[int, int]:
    assert data[-4:] == b"PAR1"
    n = struct.unpack("<i", data[-8:-4])[0]
    return len(data) - 8 - n, len(data) - 8


def _raw(stats, value) -> bytes:
    kind = stats.physical_type
    if kind == "INT64":
        return struct.pack("<q", value)
    if kind == "INT32":
        return struct.pack("<i", value)
    if kind == "DOUBLE":
        return struct.pack("<d", value)
    if kind == "FLOAT":
        return struct.pack("<f", value)
    return bytes(value)


def _rewrite_footer(path, replacements: list[tuple[bytes, bytes]]) -> None:
    """Replace byte strings inside the Parquet footer (same lengths: the footer keeps its
    size, so the file stays readable). Every pattern must occur in the footer."""
    data = bytearray(open(path, "rb").read())
    lo, hi = _footer_bounds(bytes(data))
    footer = bytes(data[lo:hi])
    marks = []
    for i, (old, new) in enumerate(replacements):
        assert len(old) == len(new) and old in footer, (old, footer)
        mark = bytes([0xF0 + i]) * len(old)
        assert mark not in footer
        footer = footer.replace(old, mark)
        marks.append((mark, new))
    for mark, new in marks:
        footer = footer.replace(mark, new)
    data[lo:hi] = footer
    open(path, "wb").write(bytes(data))


def _swap_min_max(path, column: str, row_group: int = 0) -> None:
    md = pq.ParquetFile(path).metadata
    i = md.schema.names.index(column)
    st = md.row_group(row_group).column(i).statistics
    lo, hi = _raw(st, st.min_raw), _raw(st, st.max_raw)
    _rewrite_footer(path, [(lo, hi), (hi, lo)])


def _truth(path, where: str) -> list[int]:
    con = duckdb.connect()
    rows = pq.read_table(path)
    for i, f in enumerate(rows.schema):  # DuckDB reads Parquet FLOAT16 as FLOAT, but not Arrow's
        if pa.types.is_float16(f.type):
            rows = rows.set_column(i, f.name, rows.column(i).cast(pa.float32()))
    con.register("rows", rows)
    return sorted(r[0] for r in con.sql(f"SELECT id FROM rows WHERE {where}").fetchall())


def _agree(path, where: str) -> None:
    expected = _truth(path, where)
    for options in (OptimizerOptions(), OptimizerOptions.none()):
        sel = al.dataset(str(path)).with_options(optimizer=options).filter(where)
        assert sorted(sel.to_arrow().column("id").to_pylist()) == expected, (where, options)
        assert sel.count() == len(expected), (where, options)
        assert sel.head(1000).num_rows == len(expected), (where, options)
        for stream in ("0", "1"):  # the per-unit path and the polars stream (scan/stream.py)
            before = os.environ.get("ARROWLOAD_STREAM")
            os.environ["ARROWLOAD_STREAM"] = stream
            try:
                epoch = [i for b in sel.loader(batch_size=7, output="arrow") for i in b.column("id").to_pylist()]
            finally:
                if before is None:
                    del os.environ["ARROWLOAD_STREAM"]
                else:
                    os.environ["ARROWLOAD_STREAM"] = before
            assert sorted(epoch) == expected, (where, options, stream)


@pytest.fixture
def nan_in_stats(tmp_path):
    """A float column whose statistics hold NaN as max (as parquet-testing's
    nan_in_stats.parquet): written by pyarrow, then the max's 8 bytes set to NaN."""
    path = tmp_path / "nan_in_stats.parquet"
    pq.write_table(pa.table({"id": [0, 1, 2], "x": [1.0, 2.0, float("nan")]}), path)
    _rewrite_footer(path, [(struct.pack("<d", 2.0), struct.pack("<d", float("nan")))])
    st = pq.ParquetFile(path).metadata.row_group(0).column(1).statistics
    assert st.has_min_max and st.max != st.max  # the crafted file really has NaN in its statistics
    return path


@pytest.mark.parametrize("where", ["x >= 1.0", "x > 1.5", "x < 1.5", "x = 2.0", "x != 1.0", "x <= 100"])
def test_nan_in_statistics_counts_and_rows_agree(nan_in_stats, where):
    _agree(nan_in_stats, where)


@pytest.fixture
def nan_omitted_from_stats(tmp_path):
    """pyarrow leaves NaN out of min/max: row group 0 holds {1.0, NaN} with min = max = 1.0."""
    path = tmp_path / "nan_omitted.parquet"
    pq.write_table(pa.table({"id": list(range(6)), "f": [1.0, float("nan"), 7.0, 3.0, float("nan"), None],
                             "g": pa.array([1.0, float("nan"), 7.0, 3.0, 5.0, 6.0], pa.float32())}),
                   path, row_group_size=2)
    st = pq.ParquetFile(path).metadata.row_group(0).column(1).statistics
    assert st.has_min_max and st.min == st.max == 1.0
    return path


@pytest.mark.parametrize("where", ["f > 5", "f >= 1.0", "f != 1.0", "NOT (f < 2)", "f <> 3.0",
                                   "f < 2", "f = 1", "f BETWEEN 0 AND 10", "g > 5", "NOT (g <= 3)",
                                   "f IS NOT NULL", "f > 5 OR id = 0"])
def test_nan_left_out_of_statistics_is_not_pruned(nan_omitted_from_stats, where):
    _agree(nan_omitted_from_stats, where)


def test_duckdb_written_nan_floats(tmp_path):
    """Floats with NaN and infinities written by DuckDB's own ``COPY ... TO``."""
    path = tmp_path / "duck_nan.parquet"
    duckdb.sql(f"""COPY (SELECT i AS id, CASE i % 5 WHEN 0 THEN 'nan'::DOUBLE WHEN 1 THEN 'inf'::DOUBLE
                   WHEN 2 THEN -i ELSE i * 1.5 END AS f FROM range(40) t(i))
                   TO '{path}' (FORMAT parquet, ROW_GROUP_SIZE 8)""")
    for where in ("f > 5", "f >= 'inf'::DOUBLE", "f < 0", "f != f", "f = 'NaN'::DOUBLE", "f <= 3"):
        _agree(path, where)


@pytest.fixture
def min_above_max(tmp_path):
    """Row group 0 of an int64 column with its min and max swapped in the footer (min > max)."""
    path = tmp_path / "min_above_max.parquet"
    pq.write_table(pa.table({"id": list(range(1000, 1100)), "v": list(range(100))}), path, row_group_size=50)
    _swap_min_max(path, "id", 0)
    st = pq.ParquetFile(path).metadata.row_group(0).column(0).statistics
    assert st.min > st.max
    return path


@pytest.mark.parametrize("where", ["id = 1020", "id < 1010", "id > 1040 AND id < 1060", "id IN (1001, 1077)"])
def test_implausible_statistics_prune_nothing(min_above_max, where):
    _agree(min_above_max, where)
    sel = al.dataset(str(min_above_max)).filter(where)
    assert "statistics not used (NaN, implausible or unreadable): 'id' in 1 file" in sel.explain()


@pytest.fixture
def corrupt_decimal_stats(tmp_path):
    """A decimal column (fixed-length bytes) whose min and max are swapped in the footer."""
    path = tmp_path / "decimal_stats.parquet"
    import decimal
    vals = [decimal.Decimal(i) / 100 for i in range(100, 140)]
    pq.write_table(pa.table({"id": list(range(40)), "d": pa.array(vals, pa.decimal128(20, 2))}), path,
                   row_group_size=20)
    _swap_min_max(path, "d", 0)
    return path


@pytest.mark.parametrize("where", ["d = 1.05", "d < 1.10", "d BETWEEN 1.00 AND 1.02"])
def test_corrupt_decimal_statistics_keep_rows(corrupt_decimal_stats, where):
    _agree(corrupt_decimal_stats, where)


def test_sound_statistics_still_prune(tmp_path):
    """Pruning stays on where statistics are sound: the scan keeps 1 of 4 row groups."""
    path = tmp_path / "ok.parquet"
    pq.write_table(pa.table({"id": list(range(100)), "f": [float(i) for i in range(100)]}), path,
                   row_group_size=25)
    for where in ("id < 10", "f < 10.0", "f <= 3"):
        sel = al.dataset(str(path)).filter(where)
        assert "row groups 4 -> 1" in sel.explain(), where
        _agree(path, where)


# ---------------------------------------------------------------------------
# Filters stay expressions (issue 11, item 11): no queries, files, network, environment.

REFUSED = [
    "getenv('HOME') = 'x'",
    "current_setting('threads') = 1",
    "(SELECT 1) = 1",
    "id IN (SELECT 1)",
    "EXISTS (SELECT 1)",
    "length(CAST(read_blob('/etc/hostname') AS VARCHAR)) > 0",
    "(SELECT count(*) FROM read_text('/etc/hostname')) > 0",
    "id IN (SELECT id FROM read_parquet('x.parquet'))",
    "random() > 0.5",
    "sum(id) > 1",
    "row_number() OVER () > 1",
]


@pytest.mark.parametrize("text", REFUSED)
def test_filters_refuse_queries_and_outside_access(parquet_lake, text):
    ds = al.dataset(parquet_lake)
    with pytest.raises(al.ExpressionError) as info:
        ds.filter(text).count()
    assert "al.sql" in str(info.value)
    with pytest.raises(al.ExpressionError):
        ds.select("id", v=text).head(1)


def test_select_refuses_read_text(parquet_lake):
    with pytest.raises(al.ExpressionError) as info:
        al.dataset(parquet_lake).select(v="read_text('/etc/hostname')").head(1)
    assert "expressions over the row" in str(info.value)


def test_the_evaluating_connection_is_sandboxed():
    """The connection DuckDB filters run on cannot read files or re-enable access."""
    from arrowload.plan import duckeval
    con = duckeval.connection()
    with pytest.raises(duckdb.Error):
        con.sql("SELECT * FROM read_text('/etc/hostname')").fetchall()
    with pytest.raises(duckdb.Error):
        con.execute("SET enable_external_access = true")
    assert con.sql("SELECT current_setting('enable_external_access')").fetchall()[0][0] is False


# ---------------------------------------------------------------------------
# CAST to DuckDB's array / list types (issue 11, item 8)

@pytest.fixture
def lists_file(tmp_path):
    path = tmp_path / "lists.parquet"
    pq.write_table(pa.table({"id": [0, 1, 2], "emb": pa.array([[float(i)] * 16 for i in range(3)],
                                                                pa.list_(pa.float64())),
                             "ragged": pa.array([[1.0] * 16, [2.0] * 15, None], pa.list_(pa.float32()))}),
                   path)
    return str(path)


def test_cast_to_fixed_size_array(lists_file):
    t = al.dataset(lists_file).select("id", emb="CAST(emb AS FLOAT[16])").to_arrow()
    assert t.schema.field("emb").type == pa.list_(pa.float32(), 16)
    assert t.column("emb").to_pylist()[2] == [2.0] * 16
    batch = next(iter(al.dataset(lists_file).select(emb="CAST(emb AS FLOAT[16])").loader(3)))
    assert batch["emb"].shape == (3, 16)


def test_cast_to_list(lists_file):
    t = al.dataset(lists_file).select(l="CAST(emb AS FLOAT[])").to_arrow()
    assert t.schema.field("l").type == pa.list_(pa.float32())
    assert al.dataset(lists_file).filter("len(CAST(emb AS FLOAT[])) = 16").count() == 3


def test_cast_of_wrong_length_names_the_column(lists_file):
    with pytest.raises(al.ExpressionError) as info:
        al.dataset(lists_file).select(e="CAST(ragged AS FLOAT[16])").to_arrow()
    assert "ragged" in str(info.value) and "16" in str(info.value)


# ---------------------------------------------------------------------------
# The "raises where DuckDB answers" cases, and no pyarrow error escapes

def test_float16_column_filters(tmp_path):
    path = tmp_path / "half.parquet"
    pq.write_table(pa.table({"id": [0, 1, 2, 3], "h": pa.array([0.5, float("nan"), 3.0, None], pa.float16())}),
                   path, row_group_size=2)
    for where in ("h > 1", "h < 1", "h IS NULL", "h != h", "h = 0.5"):
        _agree(path, where)


def test_string_view_file_filters(tmp_path):
    import pyarrow.feather as feather
    path = tmp_path / "views.arrow"
    feather.write_feather(pa.table({"id": [0, 1, 2], "s": pa.array(["a", "b", None], pa.string_view())}),
                          path, compression="uncompressed")
    ds = al.dataset(str(path))
    assert ds.filter("id > 0").count() == 2
    assert ds.filter("s = 'b'").to_arrow().column("id").to_pylist() == [1]
    assert ds.filter("s LIKE 'a%' OR id = 2").to_arrow().column("id").to_pylist() == [0, 2]


def test_string_hive_partition_against_a_number(tmp_path):
    """``month = 1`` on a string partition column answers as DuckDB does."""
    for month in ("01", "02", "x"):
        (tmp_path / f"month={month}").mkdir()
        pq.write_table(pa.table({"id": [len(month) * 10 + ord(month[-1])]}), tmp_path / f"month={month}" / "a.parquet")
    ds = al.dataset(str(tmp_path))
    assert ds.schema.field("month").type == pa.string()
    scan = f"read_parquet('{tmp_path}/**/*.parquet', hive_partitioning=true)"
    for where in ("month = '01'", "month = 1", "month > '01'"):
        try:
            expected = sorted(r[0] for r in duckdb.sql(f"SELECT id FROM {scan} WHERE {where}").fetchall())
        except duckdb.Error:
            with pytest.raises(al.ExpressionError):
                ds.filter(where).to_arrow()
            continue
        assert sorted(ds.filter(where).to_arrow().column("id").to_pylist()) == expected, where
        assert ds.filter(where).count() == len(expected)


def test_pyarrow_errors_do_not_escape(parquet_lake):
    ds = al.dataset(parquet_lake)
    for bad in ("CAST(country AS INTEGER) = 1", "label + 1000000000000000000 * 100 > 0", "ln(-1) = 1 AND id // 0 = 1"):
        try:
            ds.filter(bad).count()
        except al.ArrowloadError:
            pass
    with pytest.raises(al.ArrowloadError):
        ds.filter(pc.field("country") > 5).count()
    with pytest.raises(al.ArrowloadError):
        ds.select(v=pc.divide(pc.field("id"), 0)).to_arrow()


def test_explain_says_where_each_part_runs(parquet_lake):
    text = al.dataset(parquet_lake).filter("label = 1 AND id + 1 > 5").select("id", z="id * 2").explain()
    assert 'filter="label" = 1' in text
    assert "Filter [duckdb]" in text and "z := \"id\" * 2 [duckdb]" in text


def test_sql_join_over_a_filtered_dataset_keeps_nan_rows(nan_omitted_from_stats):
    """A filtered dataset bound in al.sql (a join runs in DuckDB) keeps the rows the
    filter keeps: its pushed predicate is not handed to pyarrow as a dataset filter."""
    t = al.dataset(str(nan_omitted_from_stats)).filter("f > 5")
    got = al.sql("SELECT a.id FROM t a JOIN t b ON a.id = b.id", t=t).to_arrow().column("id").to_pylist()
    assert sorted(got) == _truth(nan_omitted_from_stats, "f > 5")


@pytest.mark.parametrize("where", ["id < 1000", "country IN ('US', 'DE')", "day >= '2024-01-10'",
                                   "label = 1 AND country = 'US'", "f0 < 0.5", "score > 0.5",
                                   "country LIKE 'U%'", "ts BETWEEN '2024-01-01' AND '2024-01-05'",
                                   "country IS NULL OR NOT (label = 0)"])
def test_simple_filters_stay_in_the_pyarrow_scan(parquet_lake, where):
    """The common, pushable filters run inside the pyarrow scan (pruning, no DuckDB call)."""
    plan = al.dataset(parquet_lake).filter(where).optimized_plan()
    assert type(plan).__name__ == "Scan" and plan.predicate is not None, where


def test_duckdb_filters_from_many_threads(parquet_lake, duck, parquet_scan):
    """Each thread evaluates on its own DuckDB connection; results are the same."""
    from concurrent.futures import ThreadPoolExecutor
    where = "id % 7 = 3 AND f0 * 2 > 0.5"
    expected = duck(f"SELECT count(*) AS n FROM {parquet_scan(parquet_lake)} WHERE {where}").column(0)[0].as_py()
    ds = al.dataset(parquet_lake).filter(where)
    with ThreadPoolExecutor(4) as pool:
        counts = list(pool.map(lambda _: ds.to_arrow().num_rows, range(8)))
    assert counts == [expected] * 8
    assert len(list(ds.loader(256, output="arrow"))) > 0


def test_unusual_column_types_answer_or_say_unsupported():
    """Interval, duration, UUID, map, dictionary and union columns: filters on other
    columns work; a filter on the column answers as DuckDB does or raises a typed
    UnsupportedError naming the type, never a pyarrow error."""
    import uuid
    union = pa.UnionArray.from_sparse(pa.array([0, 1], pa.int8()), [pa.array([1, 2]), pa.array(["a", "b"])])
    cols = {"iv": pa.array([pa.MonthDayNano([1, 2, 3]), None], pa.month_day_nano_interval()),
            "du": pa.array([1, 2], pa.duration("s")),
            "u": pa.array([uuid.uuid4().bytes, uuid.uuid4().bytes], pa.uuid()),
            "m": pa.array([[("a", 1)], None], pa.map_(pa.string(), pa.int64())),
            "dic": pa.array(["a", None]).dictionary_encode(), "un": union}
    for name, arr in cols.items():
        ds = al.dataset(pa.table({"id": [0, 1], name: arr}))
        assert ds.filter("id = 1").to_arrow().column("id").to_pylist() == [1], name
        assert ds.filter("id + 0 = 1").to_arrow().column("id").to_pylist() == [1], name
        try:
            ds.filter(f"{name} IS NULL").to_arrow()
        except al.UnsupportedError as e:
            assert str(arr.type).split("<")[0] in str(e), (name, e)


DUCKDB_SYNTAX = [
    "s ~ 'b'", "s !~ 'b'", "s ~~ 'a%'", "s !~~ 'a%'", "s ~~* 'A%'", "s GLOB 'a*'", "s SIMILAR TO 'a.*'",
    "s ^@ 'a'", "i // 2 = 0", "f ** 2 > 1", "i ^ 2 > 1", "l[-1] = 2", "len(l) = 2", "i & 1 = 1",
    "xor(i, 1) = 0", "f::INT = 3", "i IS NOT DISTINCT FROM 1", "IFNULL(s, 'z') = 'z'",
    "regexp_full_match(s, 'a.*')", "j->>'a' = '1'", "i / 2 = 0.5", "s LIKE 'a!%' ESCAPE '!'",
    "s COLLATE NOCASE = 'ABC'", "TRY_CAST(s AS INT) IS NULL", "l = [1, 2]", "{'a': i}.a = 1",
    "list_sum(l) = 3", "CASE WHEN i > 0 THEN true ELSE false END",
]


@pytest.mark.parametrize("where", DUCKDB_SYNTAX)
def test_duckdb_syntax_means_what_duckdb_says(tmp_path, where):
    """What DuckDB evaluates is the user's expression as sqlglot re-writes it; operators
    and functions peculiar to DuckDB keep their meaning through that round trip."""
    t = pa.table({"id": [0, 1, 2, 3], "s": ["abc", "b", None, "a%"], "i": [1, -3, None, 2],
                  "f": [2.5, -1.5, None, 3.4], "l": pa.array([[1, 2], [3], None, [2]]),
                  "j": ['{"a": 1}', '{"a": 2}', None, "{}"]})
    con = duckdb.connect()
    con.register("t", t)
    expected = sorted(r[0] for r in con.sql(f"SELECT id FROM t WHERE {where}").fetchall())
    assert sorted(al.dataset(t).filter(where).to_arrow().column("id").to_pylist()) == expected


def test_evaluation_connections_are_per_thread_and_closed_with_it():
    """DuckDB connections are not thread-safe: each thread has its own, closed when the
    thread ends."""
    import gc
    import threading
    from arrowload.plan import duckeval
    seen = []
    t = pa.table({"x": [1, 2, 3]})

    def work():
        assert al.dataset(t).filter("x + 1 > 2").count() == 2
        seen.append(duckeval.connection())

    threads = [threading.Thread(target=work) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    gc.collect()
    assert len(seen) == 2 and seen[0] is not seen[1] and seen[0] is not duckeval.connection()
    for con in seen:
        with pytest.raises(duckdb.Error):
            con.sql("SELECT 1").fetchall()


@pytest.mark.parametrize("sql", ["st.a > 10", "ST.A > 10", "st.inner.b = 'x3'", "st.a IS NULL", "st.a + 1 = 16",
                                 "st.inner.b LIKE 'x%' AND st.a < 15", "t.id = 2"])
def test_struct_fields_by_dots_as_duckdb_reads_them(tmp_path, sql):
    """``st.a`` where ``st`` is a struct column (no table of that name) is its field, as in
    DuckDB: ``st['a']``, names matched as columns are (unquoted: any case); nested
    (``st.inner.b``). A first part that names no column stays a qualifier (``t.id``).
    It raised ``ColumnNotFoundError`` (the field's name looked up as a column)."""
    import duckdb

    rows = [{"a": i * 5 if i % 4 else None, "inner": {"b": f"x{i}"}} if i % 7 else None for i in range(30)]
    path = tmp_path / "st.parquet"
    pq.write_table(pa.table({"id": list(range(30)), "st": rows}), path)
    got = sorted(al.dataset(str(path)).filter(sql).to_arrow()["id"].to_pylist())
    truth = sorted(r[0] for r in duckdb.sql(f"SELECT id FROM read_parquet('{path}') AS t WHERE {sql}").fetchall())
    assert got == truth and got, sql
    with pytest.raises(al.ColumnNotFoundError):
        al.dataset(str(path)).filter("st.nope > 1")


@pytest.mark.parametrize("where", [
    "(f IS NOT NULL) AND (date_diff(month, d, DATE '2024-01-01') < 0)",
    "id > 1 AND date_diff(month, d, DATE '2024-01-01') < 0 AND f < 10",
    "log2(x) = 3 AND id > 0",
    "(id BETWEEN 2 AND 5) AND log2(x) >= 2 AND date_diff(month, d, DATE '2024-01-01') <= 0",
    "id NOT BETWEEN 2 AND 3 AND (CASE WHEN id > 1 AND f > 1 THEN log2(x) ELSE 0 END) = 3",
    "((f > 0) AND (log2(x) = 3)) AND (id > 0 AND date_diff(month, d, DATE '2024-01-01') > -100)",
])
def test_split_conjuncts_are_evaluated_as_written(tmp_path, where):
    """The optimizer splits a filter at its ANDs and pushes the parts pyarrow can evaluate:
    the parts left for DuckDB were evaluated as sqlglot regenerates them, not as written
    (``date_diff(month, ...)`` over a column ``month`` read the unit 'MONTH'; ``log2(x)``
    became ``LOG(2, x)``, a different last bit): wrong rows, with the optimizer on only.
    Truth: DuckDB over the same file."""
    import datetime as dt
    path = str(tmp_path / "t.parquet")
    n = 64
    pq.write_table(pa.table({
        "id": pa.array(range(n), pa.int64()),
        "f": pa.array([None if i % 7 == 0 else float(i % 5) for i in range(n)]),
        "x": pa.array([float(2 ** (i % 6)) for i in range(n)]),
        "month": pa.array(["year", "day", "hour", "month"] * (n // 4)),
        "d": pa.array([dt.date(2023 + i % 3, 1 + i % 12, 1) for i in range(n)]),
    }), path)
    want = sorted(r[0] for r in duckdb.sql(f"SELECT id FROM read_parquet('{path}') WHERE {where}").fetchall())
    for optimizer in (None, al.OptimizerOptions.none()):
        ds = al.dataset(path) if optimizer is None else al.dataset(path).with_options(optimizer=optimizer)
        assert sorted(ds.filter(where).to_arrow()["id"].to_pylist()) == want, optimizer
        got = al.sql(f"SELECT id FROM t WHERE {where}", t=ds).to_arrow()["id"].to_pylist()
        assert sorted(got) == want, optimizer


@pytest.mark.parametrize("where", [
    "x = -12345678901234567890.123456789012345678",
    "x IN (-12345678901234567890.123456789012345678)",
    "x NOT IN (-12345678901234567890.123456789012345678)",
    "x < -12345678901234567890.12345678901234567",
    "-(x) = 12345678901234567890.123456789012345678",
])
def test_negative_decimal_literals_keep_all_their_digits(tmp_path, where):
    """Decimal's unary minus rounds to 28 digits: a negative DECIMAL(38, 18) literal lost
    its last digits, so '=' found no row and NOT IN kept the row it names. Truth: DuckDB."""
    from decimal import Decimal
    table = pa.table({"x": pa.array([Decimal("-12345678901234567890.123456789012345678"), Decimal("1.5"),
                                     Decimal("-12345678901234567890.123456789012345679")], pa.decimal128(38, 18))})
    pq.write_table(table, str(tmp_path / "t.parquet"))
    want = duckdb.sql(f"SELECT count(*) FROM '{tmp_path}/t.parquet' WHERE {where}").fetchall()[0][0]
    for ds in (al.dataset(str(tmp_path / "t.parquet")), al.dataset(table)):
        assert ds.filter(where).to_arrow().num_rows == want
        assert ds.filter(where).count() == want
    assert al.sql(f"SELECT x FROM t WHERE {where}", t=table).to_arrow().num_rows == want
