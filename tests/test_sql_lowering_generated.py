"""Differential test: ``al.sql``'s lowering of select-project-filter queries against DuckDB.

``al.sql`` lowers a query of one table with a select list, an optional WHERE and LIMIT
(``sql/builder.py``: ``_is_simple``, ``_lower_simple``) into arrowload's own Filter /
Project / Limit plan, whose expressions pyarrow, polars or DuckDB (per batch, over the
text as written, ``_written``) evaluate; everything else DuckDB runs whole. Hypothesis
writes such queries over one table ``t`` (two hive partitions ``k=0`` / ``k=1``, three row
groups each) of every kind of column: ints with nulls (an int64 at its limits, an int16
named ``Cap``), float64 / float32 with NaN, infinities and -0.0, a decimal, strings with
unicode, empty strings and nulls, booleans, a date, timestamps with and without a zone,
three structs whose fields are named like the table's columns (one of them named ``t``,
like the table), a list, and columns named ``month`` (a date part), ``x y`` and ``Été``.
Select lists hold columns (bare, qualified ``t.a`` / ``q.a`` under ``FROM t q``, upper-
cased, quoted, quoted in another case, struct fields), aliases (new names, names of other
columns, case variants, quoted, without ``AS``), arithmetic, comparisons, CASE, COALESCE,
CAST, string, list (lambdas, comprehensions) and date functions, ``*``, ``t.*``,
``* EXCLUDE``, repeated names, values that raise on the rows a WHERE drops, comments,
line breaks and a trailing comma between items; plus an optional WHERE from a grammar of
predicates (which may name a select alias, as DuckDB allows) and LIMIT.

The truth: DuckDB running the same text over a view ``t`` of ``read_parquet`` of the same
files (its Parquet reader's statistics off, as in test_filters_differential). For every
query:

* if DuckDB raises, arrowload must not answer rows (under LIMIT, a value's error such as a
  failed cast may meet either side alone);
* if DuckDB answers, arrowload must answer (a typed arrowload error is accepted only where
  README documents the refusal: none of this grammar's shapes is) with the same column
  names in order, the same Arrow types after ``conftest.normalize`` (list / string /
  timestamp-unit representation only; a UTC zone named ``UTC`` or ``Etc/UTC`` alike), and
  the same rows as multisets, compared exactly: NaN equals NaN only, -0.0 differs from
  0.0, null is null; with LIMIT n (no ORDER BY: no order is promised) as many rows as
  DuckDB, every one of them a row of the query without LIMIT;
* ``schema`` (from the plan, read by loaders) names and types what ``to_arrow()`` returns,
  ``count()`` its rows, and ``head(3)`` is three of them;
* the lowering path is really taken: a query ``_is_simple`` accepts is the lazy plan (no
  ``SqlQuery`` node, and ``explain()`` has no ``Sql [duckdb`` line), except for the shapes
  README or the builder send to DuckDB (repeated output names, ``st.*``, a select alias
  named in the query, ``* REPLACE`` / ``RENAME``, TRY_CAST, ``COLUMNS``), each known from
  the generator, not guessed from the result. Every 3rd query also runs with the
  optimizer off.

Each hypothesis example checks ``PER_EXAMPLE`` queries. ``AL_SQL_LOWERING_EXAMPLES`` sets
the number of examples (default 64: 512 queries, ~40 s); the test is derandomized, so a
run is reproducible. ``FOUND`` holds the disagreements the generated queries found, as
explicit cases.

Only the lowering is compared: a query DuckDB runs whole is sent as sqlglot regenerates it
(left alone, see CHANGELOG), and the grammar leaves out the shapes whose disagreements are
left alone (listed above ``FOUND``).
"""

from __future__ import annotations

import datetime as dt
import decimal
import os
import re
from collections import Counter

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import arrowload as al
from arrowload.plan.nodes import SqlQuery, walk
from arrowload.sql.builder import _is_simple, parse_query
from conftest import normalize

EXAMPLES = int(os.environ.get("AL_SQL_LOWERING_EXAMPLES", 64))
PER_EXAMPLE = 8
ROWS_PER_FILE = 40
ROW_GROUP = 16

# ---------------------------------------------------------------------------
# the table: two hive partitions (k=0, k=1), one file of three row groups in each

COLUMNS = ["id", "a", "b", "Cap", "f", "g", "dec", "s", "s2", "flag", "d", "ts", "tz", "st", "q", "l", "t", "month",
           "x y", "Été", "k"]


def _table(rng: np.random.Generator, start: int) -> pa.Table:
    n = ROWS_PER_FILE

    def pick(values, typ, nulls=0.15):
        vals = [values[i] for i in rng.integers(0, len(values), n)]
        return pa.array([None if rng.random() < nulls else v for v in vals], typ)

    strs = ["", "a", "ab", "abc", "A", "é", "Ünïcödé", "日本語", "🙂x", "a b", " pad ", "%_\\", "NULL", "1", "42",
            "-7", "1.5", "2024-01-01", "true"]
    times = [dt.datetime(2024, 1, 1), dt.datetime(2024, 2, 29, 12, 30, 0, 500), dt.datetime(1969, 12, 31, 23, 59, 59),
             dt.datetime(2023, 12, 31, 23, 59, 59, 999999), dt.datetime(1970, 1, 1)]
    return pa.table({
        "id": pa.array(np.arange(start, start + n), pa.int64()),
        "a": pick([-7, -1, 0, 1, 2, 3, 5, 100], pa.int32()),
        "b": pick([-(2**63), 2**63 - 1, -(2**31), 0, 1, 2, 10, 2**53 + 1], pa.int64()),
        "Cap": pick([0, 1, 2, 3], pa.int16()),
        "f": pick([float("nan"), float("inf"), float("-inf"), -0.0, 0.0, 0.1, 1.5, 2.5, -3.25, 1e300, 7.0],
                  pa.float64()),
        "g": pick([float("nan"), -0.0, 0.1, 1.5, 3.0, -2.5], pa.float32()),
        "dec": pick([decimal.Decimal(x) for x in ("-1.50", "0.00", "0.10", "1.00", "2.55", "99999999.99")],
                    pa.decimal128(10, 2)),
        "s": pick(strs, pa.string()),
        "s2": pick(strs, pa.string(), nulls=0.3),
        "flag": pick([True, False], pa.bool_()),
        "d": pick([dt.date(2024, 1, 1), dt.date(2024, 2, 29), dt.date(1970, 1, 1), dt.date(1969, 12, 31),
                   dt.date(2023, 12, 31)], pa.date32()),
        "ts": pick(times, pa.timestamp("us")),
        "tz": pick(times, pa.timestamp("us")).cast(pa.timestamp("us", tz="UTC")),
        # fields named like the table's columns: ``st.a`` is not ``a``, ``q.a`` is under ``FROM t q``
        "st": pick([{"a": 1, "s": "x"}, {"a": None, "s": "é"}, {"a": -3, "s": None}, {"a": 7, "s": ""}],
                   pa.struct([("a", pa.int64()), ("s", pa.string())])),
        "q": pick([{"a": 0.5, "id": 1}, {"a": float("nan"), "id": None}, {"a": None, "id": 3}],
                  pa.struct([("a", pa.float64()), ("id", pa.int64())])),
        "l": pick([[], [1], [1, 2], [2, None], [3, 4, 5], [None]], pa.list_(pa.int64())),
        # named like the table: ``t.a`` is the column ``a`` under ``FROM t``, the field under ``FROM t u``
        "t": pick([{"a": 10, "s": "f"}, {"a": None, "s": "g"}, {"a": 30, "s": None}],
                  pa.struct([("a", pa.int64()), ("s", pa.string())])),
        "month": pick(["year", "month", "day", "hour"], pa.string()),   # a column named like a date part
        "x y": pick([0.5, -1.0, 2.0], pa.float64()),                     # names that need quotes
        "Été": pick([1, 2, 3], pa.int64()),
    })


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    root = tmp_path_factory.mktemp("sql_lowering")
    rng = np.random.default_rng(23)
    for k in range(2):  # a hive partition column ``k`` (BIGINT, as DuckDB types it)
        (root / f"k={k}").mkdir()
        pq.write_table(_table(rng, k * ROWS_PER_FILE), root / f"k={k}" / "part-0.parquet", row_group_size=ROW_GROUP)
    return str(root)


@pytest.fixture(scope="module")
def con(lake):
    c = duckdb.connect()
    # DuckDB's semantics without its Parquet reader's statistics, as in
    # test_filters_differential: row groups holding NaN are pruned by min/max that leave NaN
    # out (``q.a BETWEEN 2.5 AND 'NaN'::DOUBLE`` kept no row), which arrowload must not repeat
    c.execute("SET disabled_optimizers = 'filter_pushdown,statistics_propagation'")
    c.execute(f"CREATE VIEW t AS SELECT * FROM read_parquet('{lake}/*/*.parquet', hive_partitioning=true)")
    yield c
    c.close()


# ---------------------------------------------------------------------------
# the grammar. Every generator takes the query's context ``cx``: the table's alias (None:
# ``FROM t``) and the select aliases a WHERE may name.

NUM_COLS = ["a", "b", "Cap", "f", "g", "dec", "id", "k"]
SAFE_NUM_COLS = ["a", "Cap", "f", "g", "dec", "id", "k"]   # no overflow in +, -, * by small literals
STR_COLS = ["s", "s2"]
TIME_COLS = ["d", "ts", "tz"]
NUM_LITS = ["0", "1", "-1", "2", "3", "1.5", "0.1", "-0.0", "1e3", "2147483647", "NULL", "'NaN'::DOUBLE",
            "CAST(2 AS TINYINT)", "2.50", "1_000", "2::INT8", "(3)"]
SAFE_NUM_LITS = ["0", "1", "-1", "2", "3", "1.5", "0.1", "-0.0", "NULL", "'NaN'::DOUBLE", "2.50"]
STR_LITS = ["''", "'a'", "'ab'", "'é'", "'A'", "'x y'", "'日本語'", "NULL", "'1'", "'x, y'", "'(FROM t)'", "'it''s'",
            "' WHERE '", "'--'"]
TIME_LITS = ["DATE '2024-01-01'", "TIMESTAMP '2024-02-29 12:30:00'", "'2024-01-01'", "DATE '1970-01-01'", "NULL"]
TYPES = ["INTEGER", "BIGINT", "DOUBLE", "FLOAT", "VARCHAR", "DECIMAL(12,3)", "TINYINT", "SMALLINT", "BOOLEAN",
         "HUGEINT", "UBIGINT", "INT8", "TEXT", "REAL", "DATE", "TIMESTAMP", "INT[]", "VARCHAR[]"]


def colref(draw, cx, name: str) -> str:
    """``name`` as a query may spell it: bare, qualified by the table (or its alias; now and
    then by ``t`` although an alias hides it, which DuckDB refuses), upper-cased, quoted."""
    qual = cx["alias"] or "t"
    if not re.fullmatch(r"[A-Za-z_]\w*", name):  # a space: always quoted; non-ASCII letters: quoted or not
        if " " in name or draw(st.booleans()):
            name = f'"{name}"'
        way = draw(st.sampled_from(["bare", "bare", "qual", "upper"]))
        if way == "qual":
            return f"{qual}.{name}"
        return name  # (upper-cased: DuckDB folds ASCII only, arrowload any letter; left alone)
    way = draw(st.sampled_from(["bare"] * 5 + ["qual"] * 3 + ["upper", "quoted", "qual_quoted", "qual_upper",
                                                              "stale"]))
    if way == "qual":
        return f"{qual}.{name}"
    if way == "qual_upper":
        return f"{qual.upper()}.{name}"
    if way == "upper":
        return name.upper()
    if way == "quoted":
        return f'"{name}"'
    if way == "quoted_upper":  # DuckDB matches quoted names case-insensitively too
        return f'"{name.upper()}"'
    if way == "qual_quoted":
        return f'"{qual}"."{name}"' if draw(st.booleans()) else f'{qual}."{name}"'
    if way == "stale" and cx["alias"]:
        return f"t.{name}"
    return name


def field(draw, cx, struct: str, name: str) -> str:
    way = draw(st.sampled_from(["dot", "dot", "qual", "bracket", "extract"]))
    if way == "qual":
        return f"{cx['alias'] or 't'}.{struct}.{name}"
    if way == "bracket":
        return f"{struct}['{name}']"
    if way == "extract":
        return f"struct_extract({struct}, '{name}')"
    return f"{struct}.{name}"


@st.composite
def num(draw, cx, depth: int = 2, safe: bool = False):
    cols = SAFE_NUM_COLS if safe else NUM_COLS
    lits = SAFE_NUM_LITS if safe else NUM_LITS
    leaf = draw(st.sampled_from(["col"] * 4 + ["lit", "field", "len", "date"]))
    if depth <= 0 or draw(st.integers(0, 2)) == 0:
        if leaf == "lit":
            return draw(st.sampled_from(lits))
        if leaf == "field":
            return draw(st.sampled_from([field(draw, cx, "st", "a"), field(draw, cx, "q", "a"),
                                         field(draw, cx, "q", "id"), field(draw, cx, "t", "a")]))
        if leaf == "len":
            return draw(st.sampled_from([f"length({colref(draw, cx, 's')})", f"len({colref(draw, cx, 'l')})",
                                         f"{colref(draw, cx, 'l')}[1]", f"strlen({colref(draw, cx, 's2')})",
                                         f"array_length({colref(draw, cx, 'l')})"]))
        if leaf == "date":
            c = colref(draw, cx, draw(st.sampled_from(TIME_COLS)))
            return draw(st.sampled_from([f"year({c})", f"month({c})", f"dayofweek({c})", f"epoch({c})",
                                         f"date_part({colref(draw, cx, 'month')}, {c})",
                                         f"date_diff(month, {c}, DATE '2024-01-01')",
                                         f"date_diff('day', {c}, DATE '2024-01-01')", f"extract(day FROM {c})"]))
        return colref(draw, cx, draw(st.sampled_from(cols)))
    x = draw(num(cx, depth - 1, safe))
    shape = draw(st.sampled_from(["bin"] * 4 + ["unary", "fn", "case", "coalesce", "cast", "if", "nullif"]))
    if shape == "bin":
        op = draw(st.sampled_from(["+", "-", "*", "/", "//", "%"] + ([] if safe else ["^"])))
        y = draw(num(cx, depth - 1, safe))
        return f"({x} {op} {y})" if draw(st.booleans()) else f"{x} {op} {y}"
    if shape == "unary":
        return draw(st.sampled_from([f"-{x}", f"abs({x})", f"-({x})"]))
    if shape == "fn":
        fns = ["round({}, 1)", "floor({})", "ceil({})", "sign({})", "greatest({}, 1)", "least({}, 0)",
               "isnan({})::INTEGER"]
        if not safe:
            fns += ["sqrt({})", "ln({})", "exp({})", "round({})", "{} // 0", "cbrt({})", "log2(abs({}) + 1)"]
        return draw(st.sampled_from(fns)).format(x)
    if shape == "case":
        p = draw(pred(cx, depth - 1, safe))
        y = draw(num(cx, depth - 1, safe))
        if draw(st.booleans()):
            return f"CASE WHEN {p} THEN {x} ELSE {y} END"
        return f"CASE WHEN {p} THEN {x} WHEN {draw(pred(cx, 0, safe))} THEN {y} END"
    if shape == "coalesce":
        return f"coalesce({x}, {draw(num(cx, depth - 1, safe))}, {draw(st.sampled_from(['0', '-1', '1.5']))})"
    if shape == "cast":
        typ = draw(st.sampled_from(["INTEGER", "BIGINT", "DOUBLE", "FLOAT", "DECIMAL(12,3)"] +
                                   ([] if safe else ["TINYINT", "SMALLINT", "HUGEINT", "UBIGINT"])))
        return f"CAST({x} AS {typ})" if draw(st.booleans()) else f"({x})::{typ}"
    if shape == "if":
        return f"if({draw(pred(cx, depth - 1, safe))}, {x}, {draw(num(cx, depth - 1, safe))})"
    return f"nullif({x}, {draw(st.sampled_from(lits))})"


@st.composite
def text(draw, cx, depth: int = 2, safe: bool = False):
    if depth <= 0 or draw(st.integers(0, 2)) == 0:
        kind = draw(st.sampled_from(["col"] * 4 + ["lit", "field", "cast"]))
        if kind == "lit":
            return draw(st.sampled_from(STR_LITS))
        if kind == "field":
            return field(draw, cx, draw(st.sampled_from(["st", "t"])), "s")
        if kind == "cast":
            src = draw(st.sampled_from(["a", "f", "g", "dec", "flag", "d", "ts", "l", "st"]))
            c = colref(draw, cx, src)
            return f"CAST({c} AS VARCHAR)" if draw(st.booleans()) else f"{c}::VARCHAR"
        return colref(draw, cx, draw(st.sampled_from(STR_COLS)))
    x = draw(text(cx, depth - 1, safe))
    shape = draw(st.sampled_from(["fn"] * 4 + ["concat", "case", "coalesce", "date"]))
    if shape == "fn":
        return draw(st.sampled_from([
            "lower({})", "upper({})", "trim({})", "ltrim({})", "reverse({})", "substr({}, 2, 2)",
            "substring({}, 1, 1)", "left({}, 2)", "right({}, 1)", "replace({}, 'a', 'Z')", "repeat({}, 2)",
            "lpad({}, 4, '*')", "split_part({}, ' ', 1)", "({})[1:2]", "concat_ws('-', {}, 'k')",
            "regexp_replace({}, '[aé]', '_')"])).format(x)
    if shape == "concat":
        y = draw(text(cx, depth - 1, safe))
        return f"{x} || {y}" if draw(st.booleans()) else f"concat({x}, {y})"
    if shape == "case":
        return f"CASE WHEN {draw(pred(cx, depth - 1, safe))} THEN {x} ELSE {draw(text(cx, depth - 1, safe))} END"
    if shape == "coalesce":
        return f"coalesce({x}, {draw(st.sampled_from(STR_LITS))})"
    c = colref(draw, cx, draw(st.sampled_from(TIME_COLS)))
    return draw(st.sampled_from([f"strftime({c}, '%Y-%m')", f"dayname({c})", f"monthname({c})",
                                 f"CAST(date_trunc({colref(draw, cx, 'month')}, {c}) AS VARCHAR)"]))


@st.composite
def moment(draw, cx, depth: int = 1, safe: bool = False):
    c = colref(draw, cx, draw(st.sampled_from(TIME_COLS)))
    if depth <= 0 or draw(st.booleans()):
        return c if draw(st.integers(0, 3)) else draw(st.sampled_from(TIME_LITS[:2] + ["DATE '1970-01-01'"]))
    d = colref(draw, cx, "d")
    return draw(st.sampled_from([
        f"CAST({c} AS DATE)", f"CAST({d} AS TIMESTAMP)", f"date_trunc('month', {c})", f"{d} + 1",
        f"{d} + INTERVAL 1 DAY", f"{c} - INTERVAL '1 hour'", f"coalesce({c}, TIMESTAMP '2000-01-01 00:00:00')",
        f"greatest({d}, DATE '2024-01-01')", f"CASE WHEN {draw(pred(cx, 0, safe))} THEN {c} END",
        "make_date(2024, 1, 1)", f"last_day({d})", f"date_trunc(month, {c})"]))


@st.composite
def nested(draw, cx, depth: int = 1, safe: bool = False):
    l_, st_ = colref(draw, cx, "l"), colref(draw, cx, "st")
    return draw(st.sampled_from([
        st_, colref(draw, cx, "q"), l_, f"[{draw(num(cx, 0, True))}, 1]", f"list_value({colref(draw, cx, 'a')}, 2)",
        f"{{'x': {colref(draw, cx, 'a')}, 'y': {colref(draw, cx, 's')}}}",
        f"struct_pack(k := {colref(draw, cx, 'id')})",
        f"list_concat({l_}, [{colref(draw, cx, 'a')}])", f"{l_}[1:2]", f"list_sort({l_})",
        f"list_reverse({l_})", f"[x * 2 FOR x IN {l_}]", f"list_filter({l_}, lambda x: x > 1)",
        f"[x + {colref(draw, cx, 'a')} FOR x IN {l_}]",
        f"[a * 2 FOR a IN {l_} IF a > {colref(draw, cx, 'Cap')}]", f"list_transform({l_}, lambda a: a + 1)",
        f"list_filter({l_}, lambda x: x > {colref(draw, cx, 'a')})", f"list_transform({l_}, lambda st: st * 2)",
        f"list_transform({l_}, lambda x, i: x + i)", f"[{{'a': x, 'id': {colref(draw, cx, 'id')}}} FOR x IN {l_}]"]))


# literals per column for predicates of the shape pyarrow evaluates in a projection
# (``pushable.projection_equivalent``): near the type's limits, NaN, -0.0, 0.1 in float32,
# fractional seconds, ``%`` patterns; NULL in IN lists
TYPED_LITS = {
    "a": ["0", "1", "-7", "2147483647", "2147483648", "-2147483649", "1.5", "'3'", "100"],
    "b": ["0", "9223372036854775807", "-9223372036854775808", "9007199254740993", "9007199254740992.5",
          "18446744073709551615", "2"],
    "Cap": ["0", "1", "3", "32767", "32768", "-1"],
    "id": ["0", "40", "79", "-1"],
    "k": ["0", "1", "'1'", "1.5", "-1"],
    "f": ["0.1", "-0.0", "0", "1.5", "1e300", "'NaN'::DOUBLE", "'inf'::DOUBLE", "7", "1e-1", "2.5"],
    "g": ["0.1", "-0.0", "1.5", "1e-1", "'NaN'::FLOAT", "3", "-2.5", "16777217"],
    "dec": ["0.1", "0.10", "2.55", "-1.5", "99999999.99", "1", "0.001", "2.555"],
    "s": ["''", "'a'", "'ab'", "'é'", "'日本語'", "'A'", "'1'", "' pad '"],
    "s2": ["''", "'a'", "'NULL'", "'true'", "'42'"],
    "flag": ["true", "false"],
    "d": ["'2024-01-01'", "DATE '2024-02-29'", "'1969-12-31'", "TIMESTAMP '2024-01-01 00:00:00'",
          "'2024-01-01 00:00:01'"],
    "ts": ["'2024-01-01'", "TIMESTAMP '2024-02-29 12:30:00.0005'", "'2024-02-29 12:30:00.000500'",
           "'1969-12-31 23:59:59'", "DATE '1970-01-01'", "'2023-12-31 23:59:59.999999'",
           "'2023-12-31 23:59:59.9999999'"],
    "tz": ["'2024-01-01'", "TIMESTAMP '2024-01-01 00:00:00'", "'1970-01-01 00:00:00+00'", "'2024-01-01 01:00:00+01'"],
}
SAME_TYPE = [("a", "a"), ("f", "f"), ("g", "g"), ("s", "s2"), ("d", "d"), ("ts", "ts"), ("flag", "flag"),
             ("dec", "dec"), ("id", "b"), ("f", "g"), ("a", "Cap")]


@st.composite
def simple_pred(draw, cx):
    """A predicate of pushable's grammar (col <op> literal, IN, BETWEEN, IS NULL, LIKE 'a%',
    col <op> col of one type), combined with AND / OR / NOT."""
    name = draw(st.sampled_from(sorted(TYPED_LITS)))
    c, lits = colref(draw, cx, name), TYPED_LITS[name]
    shape = draw(st.sampled_from(["cmp"] * 4 + ["flip", "in", "between", "null", "colcol", "like", "bool"]))
    if shape == "cmp":
        return f"{c} {draw(st.sampled_from(['=', '<>', '<', '<=', '>', '>=']))} {draw(st.sampled_from(lits))}"
    if shape == "flip":
        return f"{draw(st.sampled_from(lits))} {draw(st.sampled_from(['=', '<', '>=']))} {c}"
    if shape == "in":
        items = draw(st.lists(st.sampled_from(lits + ["NULL"]), min_size=1, max_size=3))
        return f"{c} {draw(st.sampled_from(['', 'NOT ']))}IN ({', '.join(items)})"
    if shape == "between":
        return f"{c} {draw(st.sampled_from(['', 'NOT ']))}BETWEEN {draw(st.sampled_from(lits))} AND " \
               f"{draw(st.sampled_from(lits))}"
    if shape == "null":
        return f"{c} IS {draw(st.sampled_from(['', 'NOT ']))}NULL"
    if shape == "colcol":
        x, y = draw(st.sampled_from(SAME_TYPE))
        return f"{colref(draw, cx, x)} {draw(st.sampled_from(['=', '<>', '<', '>=']))} {colref(draw, cx, y)}"
    if shape == "like":
        pat = draw(st.sampled_from(["'a%'", "'%b'", "'%'", "'é%'", "'A%'", "''", "'%a%'"]))
        op = draw(st.sampled_from(["LIKE", "NOT LIKE"]))
        return f"{colref(draw, cx, draw(st.sampled_from(STR_COLS)))} {op} {pat}"
    x = colref(draw, cx, "flag")
    return draw(st.sampled_from([x, f"NOT {x}", f"({x}) AND ({colref(draw, cx, 'a')} > 0)",
                                 f"({x}) OR ({colref(draw, cx, 'f')} < 1.5)"]))


@st.composite
def pred(draw, cx, depth: int = 2, safe: bool = False):
    """A boolean. ``safe``: no term that raises on some row (overflow, a failed cast), so a
    WHERE's error never depends on evaluation order."""
    if depth <= 0 or draw(st.integers(0, 2)) == 0:
        kind = draw(st.sampled_from(["cmp"] * 4 + ["simple"] * 3 + ["str", "null", "in", "between", "like", "misc",
                                                                   "time", "alias"]))
        if kind == "simple":
            return draw(simple_pred(cx))
        if kind == "cmp":
            op = draw(st.sampled_from(["=", "<>", "<", "<=", ">", ">=", "!=", "IS DISTINCT FROM",
                                       "IS NOT DISTINCT FROM"]))
            return f"{draw(num(cx, 0, safe))} {op} {draw(num(cx, 0, safe))}"
        if kind == "str":
            op = draw(st.sampled_from(["=", "<>", "<", ">="]))
            return f"{draw(text(cx, 1 if not safe else 0, safe))} {op} {draw(text(cx, 0, safe))}"
        if kind == "null":
            e = draw(st.one_of(num(cx, 0, safe), text(cx, 0, safe), moment(cx, 0, safe)))
            return f"{e} IS {draw(st.sampled_from(['', 'NOT ']))}NULL"
        if kind == "in":
            items = draw(st.lists(st.sampled_from(SAFE_NUM_LITS), min_size=1, max_size=3))
            return f"{draw(num(cx, 0, safe))} {draw(st.sampled_from(['', 'NOT ']))}IN ({', '.join(items)})"
        if kind == "between":
            return f"{draw(num(cx, 0, safe))} BETWEEN {draw(st.sampled_from(SAFE_NUM_LITS))} AND " \
                   f"{draw(st.sampled_from(SAFE_NUM_LITS))}"
        if kind == "like":
            op = draw(st.sampled_from(["LIKE", "NOT LIKE", "ILIKE"]))
            return f"{draw(text(cx, 0, safe))} {op} {draw(st.sampled_from(['%a%', 'a%', '_', '', '%é', 'A%']))!r}"
        if kind == "time":
            op = draw(st.sampled_from(["=", "<", ">=", "<>"]))
            return f"{colref(draw, cx, draw(st.sampled_from(TIME_COLS)))} {op} {draw(st.sampled_from(TIME_LITS))}"
        if kind == "alias" and cx["aliases"]:
            a = draw(st.sampled_from(cx["aliases"]))
            if a.strip('"').lower() not in {c.lower() for c in COLUMNS}:
                cx["alias_ref"] = True  # DuckDB binds the select alias: DuckDB runs the query
            return f"{a} IS NOT NULL"
        f, s, l_ = colref(draw, cx, "flag"), colref(draw, cx, "s"), colref(draw, cx, "l")
        return draw(st.sampled_from([
            f, f"NOT {f}", f"{f} IS TRUE", "true", "false", "NULL", f"starts_with({s}, 'a')",
            f"contains({s}, 'b')", f"list_contains({l_}, 1)", f"isnan({colref(draw, cx, 'f')})",
            f"{field(draw, cx, 'st', 'a')} > 0", f"{field(draw, cx, 'q', 'a')} = {field(draw, cx, 'q', 'a')}",
            f"{colref(draw, cx, 'f')} = {colref(draw, cx, 'g')}", f"len({l_}) > 1",
            f"{colref(draw, cx, 'a')} = {colref(draw, cx, 'Cap')}"]))
    shape = draw(st.sampled_from(["and", "or", "not", "paren"]))
    x = draw(pred(cx, depth - 1, safe))
    if shape == "not":
        return f"NOT ({x})"
    if shape == "paren":
        return f"({x})"
    return f"({x}) {shape.upper()} ({draw(pred(cx, depth - 1, safe))})"


NEW_NAMES = ["x", "y", "v", "X", '"my col"', '"é"', '"Sum"', "total", '"from"', '"a,b"', '"x""y"', "value", "month",
             '"t.a"', "a2"]


@st.composite
def item(draw, cx):
    """One select item and whether it forces DuckDB by a documented rule (None: it may be
    lowered)."""
    kind = draw(st.sampled_from(["col"] * 6 + ["num"] * 5 + ["text"] * 3 + ["pred"] * 3 +
                                ["moment", "nested", "field", "star", "lit", "cast", "rare"]))
    qual = cx["alias"] or "t"
    forced = None
    if kind == "star":
        star = draw(st.sampled_from(["*", "*", f"{qual}.*"]))
        if draw(st.booleans()):
            cut = draw(st.lists(st.sampled_from(COLUMNS), min_size=1, max_size=3, unique=True))
            cut = [c if draw(st.integers(0, 3)) else c.upper() for c in cut]
            star += f" EXCLUDE ({', '.join(cut)})"
        return star, None
    if kind == "rare":
        e = draw(st.sampled_from(["st.*", "* REPLACE (a + 1 AS a)", "TRY_CAST(s AS INTEGER)",
                                  "COLUMNS('^s')", "q.*", "* RENAME (a AS a2)", "* EXCLUDE (t.a)"]))
        alias = (cx["alias"] or "").lower()
        forced = {"st.*": None if alias == "st" else "a struct's fields", "* REPLACE (a + 1 AS a)": "REPLACE",
                  "TRY_CAST(s AS INTEGER)": "TRY_CAST", "COLUMNS('^s')": "COLUMNS",
                  "q.*": None if alias == "q" else "a struct's fields", "* RENAME (a AS a2)": "RENAME",
                  "* EXCLUDE (t.a)": None}[e]
        return e, forced
    if kind == "col":
        e = colref(draw, cx, draw(st.sampled_from(COLUMNS)))
    elif kind == "field":
        e = field(draw, cx, draw(st.sampled_from(["st", "q", "t"])), "a")
    elif kind == "num":
        e = draw(num(cx))
    elif kind == "text":
        e = draw(text(cx))
    elif kind == "pred":
        e = draw(pred(cx, 1))
    elif kind == "moment":
        e = draw(moment(cx))
    elif kind == "nested":
        e = draw(nested(cx))
    elif kind == "lit":
        e = draw(st.sampled_from(NUM_LITS + STR_LITS + ["true", "DATE '2024-01-01'", "[1, 2]", "{'k': 1}"]))
    else:
        src = draw(st.one_of(num(cx, 1), text(cx, 1), st.just(colref(draw, cx, draw(st.sampled_from(COLUMNS))))))
        typ = draw(st.sampled_from(TYPES))
        e = f"CAST({src} AS {typ})" if draw(st.booleans()) else f"{src}::{typ}"
    if draw(st.integers(0, 7)) == 0:
        e = f"({e})"
    how = draw(st.sampled_from(["none", "none", "as", "as"]))
    if how == "none":
        return e, forced
    alias = draw(st.sampled_from(NEW_NAMES + COLUMNS + ["A", "S", "id"]))
    alias = alias if re.fullmatch(r'[A-Za-z_]\w*|".*"', alias) else f'"{alias}"'
    cx["aliases"].append(alias)
    return (f"{e} AS {alias}" if how == "as" else f"{e} {alias}"), forced


# (item, WHERE): the item raises on some rows, which the WHERE drops first (DuckDB never
# computes the select list of a filtered row, nor may arrowload)
GUARDED = [("CAST(s AS INTEGER)", "s IN ('1', '42', '-7')"), ("s::DOUBLE * 2", "s IN ('1', '42', '-7', '1.5')"),
           ("b + 1", "b < 100"), ("CAST(b AS INTEGER)", "b BETWEEN -10 AND 10"), ("100 // a", "a <> 0"),
           ("f::BIGINT", "f BETWEEN -10 AND 10"), ("CAST(s AS DATE)", "s = '2024-01-01'"),
           ("make_date(2024, 1, a)", "a BETWEEN 1 AND 28"), ("CAST(s2 AS BOOLEAN)", "s2 IN ('true', '1')"),
           ("1 / (a - a) + 1", "a IS NULL")]


@st.composite
def query(draw):
    alias = draw(st.sampled_from([None, None, None, "q", "u", "st", "Q"]))
    cx = {"alias": alias, "aliases": [], "alias_ref": False}
    items = draw(st.lists(item(cx), min_size=1, max_size=5))
    guard = draw(st.sampled_from(GUARDED)) if draw(st.integers(0, 7)) == 0 else None
    if guard is not None:
        items.insert(draw(st.integers(0, len(items))), (guard[0], None))
    table = {None: draw(st.sampled_from(["t", "t", "T", '"t"'])),
             "q": draw(st.sampled_from(["t q", "t AS q", "T AS q"])), "u": "t AS u", "st": "t AS st", "Q": "t AS Q"}[alias]
    # separators, comments and a trailing comma that the query's own text (``_written``) must survive
    seps = [draw(st.sampled_from([", ", ", ", ", ", ",\n  ", " ,\t"])) for _ in items[1:]]
    listed = items[0][0] + "".join(sep + e for sep, (e, _) in zip(seps, items[1:]))
    if draw(st.integers(0, 9)) == 0:
        listed += ","
    sql = f"SELECT {listed} FROM {table}"
    if guard is not None:
        sql += f" WHERE {guard[1]}" + (f" AND ({draw(pred(cx, 1, safe=True))})" if draw(st.booleans()) else "")
    elif draw(st.integers(0, 2)):
        where = draw(pred(cx, 2, safe=True))
        if draw(st.booleans()):  # a conjunct pushdown takes into the scan, the rest left to DuckDB
            where = f"({draw(simple_pred(cx))}) AND ({where})"
        sql += f" WHERE {where}"
    if draw(st.integers(0, 5)) == 0:
        sql += f" LIMIT {draw(st.sampled_from([0, 1, 7, 100]))}"
    forced = [f for _, f in items if f]
    return sql, forced, cx["alias_ref"]


# ---------------------------------------------------------------------------
# the comparison


def _canon(v):
    """A hashable, exact form of a value: NaN is NaN, -0.0 is not 0.0, None is None."""
    if v is None:
        return ("null",)
    if isinstance(v, float):
        return ("f", "nan" if v != v else v.hex())
    if isinstance(v, bool):
        return ("b", v)
    if isinstance(v, (list, tuple)):
        return ("l", tuple(_canon(x) for x in v))
    if isinstance(v, dict):
        return ("d", tuple((k, _canon(x)) for k, x in v.items()))
    if isinstance(v, decimal.Decimal):
        return ("dec", str(v))
    if isinstance(v, dt.datetime) and v.tzinfo is not None:  # the instant (zone names: _UTC)
        return ("tstz", v.astimezone(dt.timezone.utc).isoformat())
    return (type(v).__name__, repr(v))


def _rows(table: pa.Table) -> Counter:
    """Rows as a multiset of exact tuples (repeated column names survive)."""
    cols = [c.to_pylist() for c in table.columns]
    return Counter(tuple(_canon(v) for v in row) for row in zip(*cols)) if cols else Counter()


# DuckDB gives a TIMESTAMPTZ the session's zone name (``Etc/UTC`` here); a lowered query
# keeps the file's (``UTC``): the same zone, the same instants (see the report)
_UTC = {"UTC", "Etc/UTC", "+00:00", "Etc/UCT", "UCT", "GMT", "Etc/GMT", "Z"}


def _normalized_type(t: pa.DataType) -> pa.DataType:
    t = normalize(pa.table({"x": pa.array([], t)})).schema.field(0).type
    if pa.types.is_timestamp(t) and t.tz in _UTC:
        return pa.timestamp(t.unit, "UTC")
    return t


def _same_types(got: pa.Schema, want: pa.Schema) -> str | None:
    for g, w in zip(got, want):
        if not _normalized_type(g.type).equals(_normalized_type(w.type)):
            return f"type of {g.name!r}: {g.type} vs DuckDB's {w.type}"
    return None


def _forced_reason(forced: list[str], alias_ref: bool, duck_names: list[str]) -> str | None:
    """Why a simple query may run in DuckDB whole, from the query itself."""
    if forced:
        return ", ".join(forced)
    if alias_ref:
        return "a select alias named in WHERE or the select list"
    if len(set(duck_names)) < len(duck_names):
        return "repeated output names"
    return None


def _truth(con, sql: str):
    try:
        return con.sql(sql).to_arrow_table(), None
    except duckdb.Error as e:
        return None, e


# DuckDB's errors that come from a value (a failed cast, an overflow, a division by zero):
# which rows raise depends on the rows read, so under LIMIT either side may meet one first
_VALUE_ERRORS = (duckdb.ConversionException, duckdb.OutOfRangeException, duckdb.InvalidInputException)


def _raises_on_some_row(con, sql: str) -> bool:
    """Under LIMIT: does DuckDB raise a value's error reading every row?"""
    err = _truth(con, re.sub(r" LIMIT \d+$", "", sql))[1]
    return isinstance(err, _VALUE_ERRORS)


def check(opened, con, sql: str, forced: list[str], alias_ref: bool, optimizer_off: bool) -> str:
    """Compare one query; returns the path it took (``lowered`` / ``duckdb`` / ``error``)."""
    want, duck_error = _truth(con, sql)
    limited = re.search(r" LIMIT \d+$", sql) is not None
    path = "error"
    for ds, name in ((opened[0], "optimizer on"), (opened[1], "optimizer off"))[:2 if optimizer_off else 1]:
        try:
            r = al.sql(sql, t=ds)
            got = r.to_arrow()
        except al.ArrowloadError as e:
            if duck_error is not None:
                continue
            if limited and _raises_on_some_row(con, sql):
                continue  # a row past DuckDB's LIMIT raised where arrowload read it
            pytest.fail(f"{sql!r} ({name}): arrowload raised {type(e).__name__}: {e} where DuckDB answers "
                        f"{want.num_rows} rows")
        except Exception as e:  # noqa: BLE001 - anything untyped is a bug
            pytest.fail(f"{sql!r} ({name}): untyped error {type(e).__name__}: {e}")
        lowered = not any(isinstance(n, SqlQuery) for n in walk(r.plan))
        path = "lowered" if lowered else "duckdb"
        if path == "duckdb":
            return path  # DuckDB runs sqlglot's regenerated SQL whole: not this test's (left alone)
        if duck_error is not None:
            if not (limited and isinstance(duck_error, _VALUE_ERRORS)):  # else: DuckDB read a row arrowload did not
                pytest.fail(f"{sql!r} ({name}, {path}): DuckDB raises {type(duck_error).__name__}: "
                            f"{str(duck_error).splitlines()[0]} but arrowload answered {got.num_rows} rows "
                            f"{got.column_names}")
            continue
        assert got.column_names == want.column_names, \
            f"{sql!r} ({name}, {path}): names {got.column_names} vs DuckDB's {want.column_names}"
        assert r.schema.names == got.column_names, \
            f"{sql!r} ({name}, {path}): schema names {r.schema.names} vs to_arrow()'s {got.column_names}"
        bad = _same_types(r.schema, got.schema)
        assert bad is None, f"{sql!r} ({name}, {path}): schema vs to_arrow(): {bad}"
        bad = _same_types(got.schema, want.schema)
        assert bad is None, f"{sql!r} ({name}, {path}): {bad}"
        rows, expected = _rows(got), _rows(want)
        if limited:
            assert got.num_rows == want.num_rows, \
                f"{sql!r} ({name}, {path}): {got.num_rows} rows vs DuckDB's {want.num_rows}"
            full, err = _truth(con, re.sub(r" LIMIT \d+$", "", sql))
            extra = Counter() if err is not None else rows - _rows(full)  # no full answer to hold them to
        else:
            extra = rows - expected
        missing = Counter() if limited else expected - rows
        assert not extra and not missing, (
            f"{sql!r} ({name}, {path}): rows differ from DuckDB's: extra {list(extra.elements())[:3]}, "
            f"missing {list(missing.elements())[:3]}")
        if name == "optimizer on":
            assert r.count() == got.num_rows, f"{sql!r}: count() {r.count()} != {got.num_rows} rows read"
            head = r.head(3)  # reads as little as it can: its own path through the plan
            assert head.column_names == got.column_names and head.num_rows == min(3, got.num_rows) and \
                not _rows(head) - rows, f"{sql!r}: head(3) is not 3 rows of the result: {head.to_pylist()}"
        if not lowered and _is_simple(parse_query(sql)):
            reason = _forced_reason(forced, alias_ref, want.column_names)
            assert reason is not None, \
                f"{sql!r}: a select-project-filter query ran in DuckDB whole (not lowered)"
        if lowered:
            assert "Sql [duckdb" not in r.explain(), f"{sql!r}: lowered, but explain() shows DuckDB's query"
    return path


_seen = Counter()


@pytest.fixture(scope="module", autouse=True)
def _report_paths():
    yield
    if _seen:  # shown with -s / -rA: how many queries took each path
        print(f"\nal.sql lowering differential: {dict(_seen)}")


# no shrinking: each failure names its query, and shrinking 8 at a time is slow
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
          phases=[Phase.explicit, Phase.generate])
@given(queries=st.lists(query(), min_size=PER_EXAMPLE, max_size=PER_EXAMPLE))
def test_generated_select_queries_match_duckdb(opened, con, queries):
    for sql, forced, alias_ref in queries:
        _seen["queries"] += 1
        _seen[check(opened, con, sql, forced, alias_ref, optimizer_off=_seen["queries"] % 3 == 0)] += 1


# ---------------------------------------------------------------------------
# what the generated queries found, as explicit cases over the same table (each was the
# first disagreement of a run; the report names the generator parts that produce them)

FOUND = [
    # a table alias hides the table's name: ``t.a`` is then the struct column ``t``'s field
    # (found at babb8e5; fixed in 9c73b79, as the next two)
    ("alias-hides-table-name", "SELECT t.a FROM t AS u"),
    ("alias-hides-table-name-where", "SELECT u.id FROM t AS u WHERE t.a > 15"),
    ("alias-hides-table-name-error", "SELECT t.b FROM t AS u"),
    ("exclude-qualifier-unchecked", "SELECT * EXCLUDE (nope.a) FROM t"),
    # every column twice (lowered as once; fixed in 9c73b79)
    ("star-twice", "SELECT *, * FROM t"),
    ("qualified-star-twice", "SELECT t.*, t.* FROM t WHERE a > 1"),
    # a trailing comma: the expressions as sqlglot regenerated them (``month`` the unit;
    # fixed in 3d162e3)
    ("trailing-comma", "SELECT id, date_diff(month, d, DATE '2024-01-01') AS v, FROM t"),
    # pushdown splits the WHERE: the conjunct left to DuckDB was regenerated (wrong rows at
    # babb8e5; fixed in ea95e3c)
    ("pushdown-residual", "SELECT id FROM t WHERE (f IS NOT NULL) AND (date_diff(month, d, DATE '2024-01-01') < 0)"),
    # (left alone, so not generated here: queries DuckDB runs whole get sqlglot's regenerated
    # SQL; ``.5`` reaches DuckDB as ``0.5``; a comment after an unaliased item; quoted names
    # in another case are not lowered; non-ASCII names fold in any case; the deprecated
    # ``x -> x + 1`` lambda, ``f::VARCHAR[1:2]``, ``nvl()`` and a bare alias answered where
    # DuckDB refuses; ``+i`` is named ``i``)
    # shapes near those that agree (regressions of earlier fixes)
    ("table-qualifier", "SELECT t.a, t.t.a AS f FROM t WHERE t.a > 1"),
    ("alias-named-like-struct", "SELECT q.a, q.q.a AS f FROM t AS q WHERE q.q.a > 0"),
    ("struct-star", "SELECT st.* FROM t"),
    ("guarded-cast", "SELECT CAST(s AS INTEGER) AS v FROM t WHERE s IN ('1', '42', '-7')"),
    ("written-date-part", "SELECT id, date_diff(month, d, DATE '2024-01-01') AS v FROM t"),
]


@pytest.mark.parametrize("sql", [f[1] for f in FOUND], ids=[f[0] for f in FOUND])
def test_found_queries_match_duckdb(opened, con, sql):
    check(opened, con, sql, [a for a in ("a struct's fields",) if "st.*" in sql], False, optimizer_off=True)


def test_most_generated_queries_are_lowered(opened):
    """The grammar exercises the lowering, not only DuckDB run whole: of 60 queries drawn,
    at least a third are the lazy plan (over 10,000 queries: about 45% lowered, 25% DuckDB
    whole, 10% refused by both, the rest disagreements at the time of writing)."""
    paths = Counter()

    @settings(max_examples=60, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow], phases=[Phase.generate])
    @given(q=query())
    def draw(q):
        sql = q[0]
        try:
            r = al.sql(sql, t=opened[0])
        except al.ArrowloadError:
            paths["error"] += 1
            return
        paths["lowered" if not isinstance(r.plan, SqlQuery) and
              not any(isinstance(n, SqlQuery) for n in walk(r.plan)) else "duckdb"] += 1

    draw()
    assert paths["lowered"] >= sum(paths.values()) / 3, paths
