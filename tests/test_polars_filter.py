"""Differential test: the predicates handed to polars (plan/polars_filter.py) keep exactly
the rows DuckDB keeps.

Hypothesis writes WHERE expressions over integer (signed, unsigned, at their limits),
string (with ``''``, ``é``, ``%``), boolean, date, decimal, timestamp (``ms``, ``us``,
``ns``: values a unit after midnight, just before the epoch) and float (``float32`` /
``float64`` with NaN, ``-0.0``, infinities and values literals round to) columns full of
nulls. It mixes the whitelisted shapes (comparisons with literals and with columns of the
same type, IN and NOT IN lists, BETWEEN, IS [NOT] NULL, [NOT] LIKE, bare booleans, TRUE /
FALSE) under AND / OR / NOT with shapes outside the whitelist (zoned timestamps, LIKE with
characters between ``%`` beside others, arithmetic, decimal literals their column does not
hold, float literals DuckDB rounds twice or compares in double precision). The float
columns' first row group holds no value above 0.5 but NaN, which writers leave out of its
statistics. For every expression:

- where the whole predicate translates, polars filtering the table with the translation
  keeps exactly DuckDB's rows (three-valued logic: a null keeps no row);
- a unit reader pinned to polars (the translated conjuncts prefilter inside polars'
  Parquet decoder, the others are evaluated after) returns exactly DuckDB's rows, unit
  by unit over a file of several row groups, and counts them.

The truth is DuckDB over the same rows handed to it as Arrow. Under ``CI=true`` the test
is derandomized and uses no example database.
"""

from __future__ import annotations

import datetime as dt
import decimal
import os

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import arrowload as al
from arrowload.plan.expr import SqlExpr
from arrowload.plan.polars_filter import split_for_polars, to_polars, translatable
from arrowload.scan.units import UnitReader

_CI = dict(derandomize=True, database=None) if os.environ.get("CI") == "true" else {}
EXAMPLES = int(os.environ.get("AL_POLARS_DIFF_EXAMPLES", 60))
PER_EXAMPLE = 10
ROWS = 240


def _table() -> pa.Table:
    rng = np.random.default_rng(5)

    def pick(values, typ, nulls=0.2):
        return pa.array([None if rng.random() < nulls else values[i] for i in rng.integers(0, len(values), ROWS)],
                        typ)

    i8 = [-128, -1, 0, 1, 2, 127]
    u64 = [0, 1, 2, 2**63, 2**64 - 1]
    i64 = [-(2**63), -5, 0, 1, 3, 2**53 + 1, 2**63 - 1]
    strs = ["", "a", "ab", "b", "é", "aé", "A", "ab%", "1", "2024-01-01", "aba", "abba", "ba", "xaby"]
    decs = [decimal.Decimal(x) for x in ("1.50", "-2.00", "0.00", "999.99", "1.51", "-999.99")]
    days = [dt.date(2024, 1, 1), dt.date(2024, 1, 2), dt.date(1970, 1, 1), dt.date(2023, 12, 31)]
    # values literals round to in either precision (0.9 is float32(0.9) in a float32 column,
    # the double 0.9 in a float64 one), their neighbours, NaN, signed zeros, infinities
    fl = [float("nan"), -0.0, 0.0, 0.5, 2.0, float("inf"), -float("inf"), 0.9, float(np.float32(0.9)),
          0.1, float(np.float32(0.1)), 1.005, float(np.float32(1.005)), 123456.7, float(np.float32(123456.7)),
          16777216.0, 16777218.0, 0.30000001192092896, 1e-46]

    def floats(typ):
        low = [float("nan"), -0.0, 0.0, 0.5, -float("inf"), 0.1]  # the first row group: NaN above 0.5 only
        values = [None if rng.random() < 0.2 else (low if k < ROWS // 4 else fl)[i]
                  for k, i in enumerate(rng.integers(0, len(fl), ROWS) % np.where(np.arange(ROWS) < ROWS // 4,
                                                                                      len(low), len(fl)))]
        return pa.array(values, pa.float64()).cast(typ)

    # nanoseconds since the epoch: midnight and a unit after it in each unit, noon, the
    # epoch and just before it; each column keeps what its unit holds (truncated)
    midnight = 1_704_067_200 * 10**9
    ns = [midnight, midnight + 1, midnight + 1_000, midnight + 1_000_000, midnight + 43_200 * 10**9, 0, -1_000,
          midnight - 10**9]

    def stamps(unit):
        per = {"ms": 10**6, "us": 10**3, "ns": 1}[unit]
        return pa.array([None if v is None else v // per for v in pick(ns, pa.int64()).to_pylist()],
                        pa.int64()).cast(pa.timestamp(unit))
    return pa.table({
        "id": pa.array(np.arange(ROWS), pa.int64()),
        "i8": pick(i8, pa.int8()), "i8b": pick(i8, pa.int8()),
        "u8": pick([0, 1, 200, 255], pa.uint8()), "i32": pick([-7, 0, 1, 2, 2**31 - 1], pa.int32()),
        "i64": pick(i64, pa.int64()), "i64b": pick(i64, pa.int64()), "u64": pick(u64, pa.uint64()),
        "s": pick(strs, pa.string()), "s2": pick(strs, pa.string()), "ls": pick(strs, pa.large_string()),
        "b": pick([True, False], pa.bool_()), "b2": pick([True, False], pa.bool_()),
        "d": pick(days, pa.date32()), "d2": pick(days, pa.date32()),
        "f": floats(pa.float64()), "f2": floats(pa.float64()), "g": floats(pa.float32()), "g2": floats(pa.float32()),
        "t": stamps("us"), "t2": stamps("us"), "tm": stamps("ms"), "tn": stamps("ns"),
        "dec": pick(decs, pa.decimal128(5, 2)), "dec2": pick(decs, pa.decimal128(5, 2)),
        "dwide": pick([decimal.Decimal("12345678901234567890.123456"), decimal.Decimal("-1.000001")],
                      pa.decimal128(38, 6)),
        # outside the whitelist
        "tz": pick([dt.datetime(2024, 1, 1), dt.datetime(2024, 1, 1, 12)], pa.timestamp("us", tz="UTC")),
    })


TABLE = _table()
SCHEMA = TABLE.schema
LITS = {
    "i8": ["0", "1", "-1", "127", "-128", "2", "128", "1.5", "NULL"],
    "u8": ["0", "1", "255", "200", "256", "-1"],
    "i32": ["0", "1", "-7", "2147483647", "2"],
    "i64": ["0", "3", "-9223372036854775808", "9223372036854775807", "9007199254740993", "-5", "1.0"],
    "u64": ["0", "1", "18446744073709551615", "9223372036854775808", "2"],
    "str": ["''", "'a'", "'ab'", "'b'", "'é'", "'A'", "'1'", "'2024-01-01'", "NULL"],
    "bool": ["true", "false", "NULL"],
    "date": ["'2024-01-01'", "DATE '2024-01-02'", "'1970-01-01'", "'2023-12-31'", "'2024-01-01 00:00:00'"],
    # held exactly by decimal(5, 2), more places than it keeps, beyond it, exponent form
    "dec": ["1", "1.5", "1.50", "-2", "0", "999.99", "-999.99", "1.51", "1.505", "1000", "1e0", "NULL",
            "0000000000000000000000000000000000000001.5"],
    "dwide": ["12345678901234567890.123456", "-1.000001", "0", "-1", "1.0000005"],
    "ts": ["'2024-01-01'", "'2024-01-01 00:00:00'", "TIMESTAMP '2024-01-01 12:00:00'", "DATE '2024-01-01'",
           "'2024-01-01 00:00:00.001'", "'2024-01-01 00:00:00.000001'", "'2024-01-01 00:00:00.000000001'",
           "'1970-01-01'", "'1969-12-31 23:59:59.999999'", "'2024-01-01T12:00:00'", "'3000-01-01'", "NULL"],
    # exact, rounded once (plain decimals), DOUBLE (exponent form), rounded twice, beyond float32
    "float": ["0", "-0.0", "0.5", "2", "0.9", "0.1", "1.005", "123456.7", "16777217", "0.300000001", "1e-1",
              "5e-1", "2e0", "1e-46", "0.00000000001", "1e39", "-1", "NULL",
              # a point and over 38 digits: DOUBLE, however plain it looks
              "0000000000000000000000000000000000000000.9", "0.90000000000000000000000000000000000000"],
}
COLS = {"i8": "i8", "i8b": "i8", "u8": "u8", "i32": "i32", "i64": "i64", "i64b": "i64", "u64": "u64",
        "s": "str", "s2": "str", "ls": "str", "b": "bool", "b2": "bool", "d": "date", "d2": "date",
        "f": "float", "f2": "float", "g": "float", "g2": "float", "t": "ts", "t2": "ts", "tm": "ts", "tn": "ts",
        "dec": "dec", "dec2": "dec", "dwide": "dwide"}
PAIRS = [("i8", "i8b"), ("i64", "i64b"), ("s", "s2"), ("b", "b2"), ("d", "d2"), ("f", "f2"), ("g", "g2"), ("t", "t2"), ("dec", "dec2")]
OUTSIDE = ["f = g", "g > 0.1e0", "g IN (0.9, 1e0)", "g BETWEEN 0.1 AND 1e0", "f > 0.12345678901234567", "dec > 1.505", "dec = dwide", "tz > '2024-01-01'", "t = tm", "s LIKE 'a_'", "s LIKE '%a%b%'", "s ILIKE 'a%'", "ls LIKE 'a%b%'", "i8 + 1 > 0", "length(s) > 1",
           "i8 = i32", "s = ls", "g = 0000000000000000000000000000000000000000.9",
           "dec = 0000000000000000000000000000000000000001.5"]
OPS = ["=", "<>", "<", "<=", ">", ">="]
# prefix, suffix, both (apart: 'ab%ba' is not 'aba'), between two %, none, empty, only %;
# and outside: '_', a character between % beside others, an escape
LIKES = ["'a%'", "'%b'", "'a%b'", "'ab%ba'", "'%a%'", "'%é'", "'ab'", "''", "'%'", "'%%'", "'a%%b'", "'A%'",
         "'%ab%%'", "'a_'", "'%a%b%'", "'a\\%'"]


@st.composite
def atom(draw):
    shape = draw(st.sampled_from(["cmp", "cmp", "flip", "cols", "in", "between", "null", "bool", "const", "like",
                                  "outside"]))
    col = draw(st.sampled_from(sorted(COLS)))
    lit = st.sampled_from(LITS[COLS[col]])
    if shape == "cols":
        a, b = draw(st.sampled_from(PAIRS))
        return f"{a} {draw(st.sampled_from(OPS))} {b}"
    if shape == "in":
        items = draw(st.lists(lit, min_size=1, max_size=3))
        return f"{col} {draw(st.sampled_from(['', 'NOT ']))}IN ({', '.join(items)})"
    if shape == "between":
        return f"{col} BETWEEN {draw(lit)} AND {draw(lit)}"
    if shape == "null":
        return f"{col} IS {draw(st.sampled_from(['', 'NOT ']))}NULL"
    if shape == "like":
        return f"{draw(st.sampled_from(['s', 's2', 'ls']))} {draw(st.sampled_from(['', 'NOT ']))}LIKE " \
               f"{draw(st.sampled_from(LIKES))}"
    if shape == "bool":
        return draw(st.sampled_from(["b", "NOT b", "b2"]))
    if shape == "const":
        return draw(st.sampled_from(["TRUE", "FALSE"]))
    if shape == "outside":
        return draw(st.sampled_from(OUTSIDE))
    if shape == "flip":
        return f"{draw(lit)} {draw(st.sampled_from(OPS))} {col}"
    return f"{col} {draw(st.sampled_from(OPS))} {draw(lit)}"


def predicate():
    return st.recursive(atom(), lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(["AND", "OR"]), inner).map(lambda t: f"({t[0]}) {t[1]} ({t[2]})"),
        inner.map(lambda e: f"NOT ({e})")), max_leaves=4)


@pytest.fixture(scope="module")
def con():
    c = duckdb.connect()
    c.register("t", TABLE)
    yield c
    c.close()


@pytest.fixture(scope="module")
def parquet(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("polars_filter") / "t.parquet")
    pq.write_table(TABLE, path, row_group_size=ROWS // 4)
    return path


def _duck_ids(con, expr: str):
    try:
        return sorted(con.sql(f"SELECT id FROM t WHERE {expr}").to_arrow_table().column(0).to_pylist())
    except duckdb.Error:
        return None


def check(con, parquet: str, text: str) -> str:
    """Compare; returns what polars took: "whole", "part" or "none"."""
    import polars as pl
    expected = _duck_ids(con, text)
    try:
        e = SqlExpr.parse(text, SCHEMA, "filter")
    except al.ExpressionError:
        return "none"
    took = "none"
    if translatable(e.tree, SCHEMA):
        took = "whole"
        got = pl.from_arrow(TABLE).filter(to_polars(e.tree, SCHEMA))["id"].to_list()
        assert expected is not None, f"{text!r}: translated, but DuckDB raises"
        assert sorted(got) == expected, (f"{text!r}: polars keeps other rows: extra "
                                         f"{sorted(set(got) - set(expected))[:5]}, missing "
                                         f"{sorted(set(expected) - set(got))[:5]}")
    if expected is None:
        return took  # errors are test_filters_differential's business
    d = al.dataset(parquet).filter(text)
    plan = d.optimized_plan()
    reader = UnitReader(plan, d.options, decoders=["polars"])
    if reader._polars is not None and took == "none":
        took = "part"
    got = [i for k in range(reader.num_units) for i in reader.read(k).column("id").to_pylist()]
    assert sorted(got) == expected, f"{text!r}: the polars reader keeps other rows"
    assert sum(reader.count(k) for k in range(reader.num_units)) == len(expected), f"{text!r}: count"
    return took


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          phases=[Phase.explicit, Phase.reuse, Phase.generate], **_CI)
@given(exprs=st.lists(predicate(), min_size=PER_EXAMPLE, max_size=PER_EXAMPLE))
def test_polars_prefilter_keeps_duckdbs_rows(con, parquet, exprs):
    for text in exprs:
        check(con, parquet, text)


WHITELIST_EXAMPLES = [
    "NOT (i8 = 1 OR s = 'a')", "i8 NOT IN (1, 2)", "NOT (b AND i8 > 0)", "b", "NOT b", "b = b2",
    "u64 = 18446744073709551615", "i64 = -9223372036854775808", "u64 > 9223372036854775807",
    "s < 'é'", "s >= 'A'", "ls = 'ab'", "s = s2", "d BETWEEN '2023-12-31' AND DATE '2024-01-01'",
    "d > '1970-01-01'", "TRUE", "FALSE", "NOT (i8 IS NULL)", "i8 = 1 AND s LIKE '%a%b%'",
    "NOT (b2 OR i32 BETWEEN 0 AND 1)", "i8 < i8b", "d <> d2",
    "u8 = 255 AND (s IS NULL OR NOT b)",
    # floats: NaN above every number and equal to itself, -0.0 = 0.0, literals rounded once
    "g > 0.9", "g >= 0.9", "g = 0.1", "f = 0.1", "f > 0.5", "g > 0.5", "NOT (g >= 0.5)", "f <= 1.005",
    "f = f2", "g <> g2", "g < g2", "g IN (0.9, 0.1, -0.0)", "f NOT IN (0.5, 2)", "f BETWEEN 0.1 AND 1e0",
    "g BETWEEN -0.0 AND 0.9", "f > 1e-1", "g > 5e-1", "0.9 < g", "g = 123456.7", "f IS NULL",
    "i8 = 1 AND g > 0.12345678901",
    # timestamps: counts of the column's unit; a date is its midnight
    "t > '2024-01-01'", "tn = '2024-01-01 00:00:00.000000001'", "tm < TIMESTAMP '2024-01-01 12:00:00'",
    "t IN ('2024-01-01', DATE '1970-01-01', '1969-12-31 23:59:59.999999')", "t >= DATE '2024-01-01'",
    "tn BETWEEN '1969-12-31 23:59:59.999999' AND '2024-01-01'", "t = t2", "NOT (tm <> '2024-01-01 00:00:00.001')",
    # LIKE: a prefix, a suffix, both apart, between two %, the string itself; NULL stays NULL
    "s LIKE 'a%'", "s NOT LIKE '%b'", "ls LIKE 'a%b'", "s2 LIKE 'ab%ba'", "s LIKE '%a%'", "s NOT LIKE '%'",
    "s LIKE ''", "s NOT LIKE 'ab'", "s LIKE '%é'", "s LIKE 'ab%%'",
]


@pytest.mark.parametrize("text", WHITELIST_EXAMPLES)
def test_whitelist_examples(con, parquet, text):
    took = check(con, parquet, text)
    assert took == ("part" if "%a%b%" in text or "0.12345678901" in text else "whole"), (text, took)


def test_what_is_left_to_arrowloads_evaluator():
    """Decimals, timestamps, LIKE, arithmetic, mixed types and float literals DuckDB rounds
    twice or compares in double precision are never handed to polars; a conjunction splits
    into the part polars takes and the rest."""
    for text in OUTSIDE + ["i8 = 128", "u8 = -1", "i8 IN (1, 1.5)", "tn < '3000-01-01'",
                           "t = '2024-01-01 00:00:00.000000001'"]:
        e = SqlExpr.parse(text, SCHEMA, "filter")
        assert not translatable(e.tree, SCHEMA), text
        assert split_for_polars(e, SCHEMA) is None, text
    seconds = pa.schema([("ts", pa.timestamp("s"))])  # polars has no seconds unit
    assert not translatable(SqlExpr.parse("ts > '2024-01-01'", seconds, "filter").tree, seconds)
    split = split_for_polars(SqlExpr.parse("i8 = 1 AND s2 LIKE '%a%b%' AND s = 'a'", SCHEMA, "filter"), SCHEMA)
    assert split.polars_columns == {"i8", "s"} and split.rest_columns == {"s2"}
    assert split_for_polars(SqlExpr.parse("i8 = 1 OR s LIKE '%a%b%'", SCHEMA, "filter"), SCHEMA) is None
