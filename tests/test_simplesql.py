"""Simple filters parsed without sqlglot (``arrowload.plan.simplesql``) mean exactly what
sqlglot's DuckDB parse of the same text means.

Truths outside arrowload: sqlglot's own parse (the trees must be equal, argument by
argument), DuckDB's answer over the same Parquet file, and the plan built from sqlglot's
tree, whose fingerprint (a cache key) and pushability the simple tree must reproduce.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlglot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlglot import exp
from sqlglot.dialects.dialect import Dialect

import arrowload as al
from arrowload.errors import ExpressionError
from arrowload.plan import polars_filter, simplesql, sqlexpr
from arrowload.plan.expr import SqlExpr, conjoin, conjuncts, disjoin
from arrowload.plan.fingerprint import plan_fingerprint
from arrowload.plan.nodes import Filter

from _support import sorted_rows, tree_data

REPO = Path(al.__file__).resolve().parent.parent


def duckdb_parse(text: str):
    return sqlglot.parse_one(text, read="duckdb", into=exp.Condition)


def duck(query: str) -> pa.Table:
    out = duckdb.sql(query).arrow()
    return out.read_all() if isinstance(out, pa.RecordBatchReader) else out


def duckdb_parse_or_none(text: str):
    try:
        return duckdb_parse(text)
    except (sqlglot.errors.SqlglotError, ValueError):
        return None


# ---------------------------------------------------------------------------
# the parse: sqlglot's tree, or None


def test_the_word_list_holds_every_word_the_duckdb_dialect_reads_specially():
    duck = Dialect.get_or_raise("duckdb")
    plain = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
    words = {k.upper() for k in duck.tokenizer_class.KEYWORDS if plain.match(k)}
    words |= {k.upper() for k in duck.parser_class.NO_PAREN_FUNCTION_PARSERS if plain.match(k)}
    assert words <= simplesql.SQL_WORDS, sorted(words - simplesql.SQL_WORDS)


SIMPLE = [
    "id < 400000", "country = 'US' AND label = 1", "x IN (1, 2, 3)", "x NOT IN ('a', 'b')",
    "x BETWEEN 1 AND 5", "x NOT BETWEEN -1 AND .5", "x IS NULL", "x IS NOT NULL",
    "NOT (a = 1 OR b <> 2)", '"My Col" >= -1.5e3', "flag", "a != 1", "a == 1", "a = 'it''s'",
    "a = TRUE OR b = FALSE", "x IS NULL AND y = 1", "(a = b) IS NULL", "NOT NOT a",
    "a BETWEEN 1 AND 2 AND b IS NULL", "day >= DATE '2024-01-01'", "day < date '2024-02-30'",
    "ts < TIMESTAMP '2024-01-01 10:00:00'", "ts < TIMESTAMP '2024-01-01 10:00:00+02'",
    '"a""b" = 2', "((a))", "x = NULL", "-x < -(1)", "x = 1e+03", "x = 00", "a <> 'é'",
    "a = 'a\\b'", "A = 1 and b = 2 or NOT c", "x IN (-1)", "x in (1, NULL)", "\n a\t=\r\n1 ",
    "(x = 1) = TRUE", "_x1 > 0", "a = ''",
    "a LIKE 'x%'", "a NOT LIKE '%y' AND b = 1", "NOT a LIKE 'x'", "(a NOT LIKE 'x%') OR a LIKE '%é%'",
    "'x' LIKE a", "a LIKE b", "a LIKE NULL", "a like 'it''s%'",
]


@pytest.mark.parametrize("text", SIMPLE)
def test_simple_filters_parse_into_duckdbs_tree(text):
    node = simplesql.parse(text)
    assert node is not None and simplesql.is_simple(node)
    assert tree_data(node) == tree_data(duckdb_parse(text))
    assert node.sql("duckdb") == duckdb_parse(text).sql("duckdb")
    assert tree_data(sqlexpr.parse(text)) == tree_data(duckdb_parse(text))


OUTSIDE = [
    "f(x) > 1", "a + 1 > 2", "a * 2 = 4", "a NOT ILIKE '%y'", "a::INT = 1", "a LIKE 'x!%' ESCAPE '!'",
    "a LIKE 'x' = TRUE", "a NOT LIKE 'x' IS NULL", "a LIKE 'x' IN (TRUE)", "a NOT LIKE", "a LIKE",
    "CAST(a AS INT) = 1", "CASE WHEN a THEN 1 END = 1", "a = 1 -- note", "a = /* c */ 1",
    "date = 1", "row = 1", "t.a = 1", "a = $1", "a = ?", "a = E'x'", "a = 1_000", "a = 1.",
    "a = 0x1F", "a IS DISTINCT FROM b", "a = b = c", "a < b < c", "a = b IS NULL",
    "a IS TRUE", "a = NOT b", "-NOT a", "x IN ()", "x IN (1,)", "x IN (SELECT 1)",
    "'a' 'b' = c", "a || 'x' = 'y'", "a = +1", "a = 'x' COLLATE nocase", "é = 1", '"" = 1',
    "a IN [1, 2]", "a = 1;", "(a = 1", "a = 1)", "a =", "AND", "x BETWEEN 1 AND",
    "interval = 1", "a = INTERVAL '1 day'", "a = TIME '10:00'", "a = TIMESTAMPTZ '2024-01-01'",
    "a = @b", "a = 1 AT TIME ZONE 'UTC'", "a.b", "a[1] = 2", "x IN (1, 2) IN (TRUE)",
]


@pytest.mark.parametrize("text", OUTSIDE)
def test_other_text_is_left_to_sqlglot(text):
    assert simplesql.parse(text) is None
    try:
        ours = sqlexpr.parse(text)
    except ExpressionError as e:  # the error sqlglot's parse gives (as before simplesql)
        assert duckdb_parse_or_none(text) is None or "empty" in str(e) or e.line is not None \
            or "incomplete" in str(e) or "expected" in str(e), e
        return
    assert not simplesql.is_simple(ours)
    assert tree_data(ours) == tree_data(duckdb_parse(text))


NAMES = st.sampled_from(["a", "b", "x_1", "Country", "_x", "e", "id", "row", "date", "string", "summarize",
                         "int8", "ts", "select", "if", "any", "map", "next", "value", "year", "key", "name",
                         '"My Col"', '"a""b"', '"select"', '"Date"', '"é"'])
NUMBERS = st.sampled_from(["0", "1", "42", "1.5", ".5", "1e3", "1.5E-3", "1e+3", "00", "007", "1.", "0x1F",
                           "1_000", "1e", "12345678901234567890123", "3.25"])
STRINGS = st.sampled_from(["'US'", "''", "'it''s'", "'a\\b'", "'%x_'", "'é'", "E'x'", "$$y$$", "'2024-01-31'",
                           "'2024-01-01 10:00:00'", "'2024-01-01 10:00:00+02'", "'a\nb'", "'\"'"])
TYPED = st.tuples(st.sampled_from(["DATE", "date", "TIMESTAMP", "Timestamp", "TIME", "INTERVAL"]), STRINGS) \
    .map(lambda t: f"{t[0]} {t[1]}")
ATOMS = st.one_of(NAMES, NUMBERS, STRINGS, TYPED, st.sampled_from(["NULL", "TRUE", "FALSE", "null", "true"]))
OPS = ["=", "==", "<>", "!=", "<", "<=", ">", ">=", "AND", "OR", "and", "or", "+", "*", "||", "::", "LIKE",
       "IS", "<=>", "=>", "->"]


def _expressions():
    def extend(inner):
        return st.one_of(
            st.tuples(inner, st.sampled_from(OPS), inner).map(lambda t: f"{t[0]} {t[1]} {t[2]}"),
            inner.map(lambda e: f"({e})"), inner.map(lambda e: f"NOT {e}"), inner.map(lambda e: f"-{e}"),
            inner.map(lambda e: f"- {e}"),
            st.tuples(inner, st.lists(ATOMS, min_size=0, max_size=3), st.booleans())
            .map(lambda t: f"{t[0]} {'NOT ' if t[2] else ''}IN ({', '.join(t[1])})"),
            st.tuples(inner, ATOMS, ATOMS, st.booleans())
            .map(lambda t: f"{t[0]} {'NOT ' if t[3] else ''}BETWEEN {t[1]} AND {t[2]}"),
            st.tuples(inner, st.booleans()).map(lambda t: f"{t[0]} IS {'NOT ' if t[1] else ''}NULL"),
            st.tuples(inner, ATOMS, st.booleans()).map(lambda t: f"{t[0]} {'NOT ' if t[2] else ''}LIKE {t[1]}"),
            st.tuples(NAMES, inner).map(lambda t: f"{t[0]}({t[1]})"),
        )
    return st.recursive(ATOMS, extend, max_leaves=8)


@settings(max_examples=600, deadline=None)
@given(_expressions())
def test_a_simple_parse_is_duckdbs_tree(text):
    node = simplesql.parse(text)
    if node is None:
        return
    ref = duckdb_parse_or_none(text)
    assert ref is not None, text  # never accepts what sqlglot refuses
    assert tree_data(node) == tree_data(ref), text


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(ATOMS, st.sampled_from(["=", "<", "<=", "(", ")", ",", "-", "AND", "OR", "NOT", "IN",
                                                  "IS", "NULL", "BETWEEN", "LIKE", "--", "/*", "*/", "\n", "'", '"'])),
                min_size=1, max_size=9))
def test_a_simple_parse_of_token_soup_is_duckdbs_tree(parts):
    text = " ".join(parts)
    node = simplesql.parse(text)
    if node is None:
        return
    ref = duckdb_parse_or_none(text)
    assert ref is not None, text
    assert tree_data(node) == tree_data(ref), text


# ---------------------------------------------------------------------------
# typed filters over a small file: rows (DuckDB's), fingerprints and pushability (sqlglot's)

N = 60
TABLE = pa.table({
    "id": pa.array(range(N), pa.int64()),
    "small": pa.array([(i * 7) % 11 - 5 if i % 9 else None for i in range(N)], pa.int8()),
    "u": pa.array([i % 4 for i in range(N)], pa.uint16()),
    "f": pa.array([i / 4 if i % 13 else (float("nan") if i % 2 else None) for i in range(N)], pa.float64()),
    "country": pa.array([["US", "DE", "it's", "", None][i % 5] for i in range(N)], pa.string()),
    "flag": pa.array([None if i % 7 == 0 else i % 3 == 0 for i in range(N)], pa.bool_()),
    "day": pa.array([dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in range(N)], pa.date32()),
    "ts": pa.array([dt.datetime(2024, 1, 1) + dt.timedelta(hours=7 * i) for i in range(N)], pa.timestamp("us")),
    "price": pa.array([Decimal(i * 37 % 1000) / 100 for i in range(N)], pa.decimal128(6, 2)),
    "My Col": pa.array([i % 5 for i in range(N)], pa.int32()),
})
LIKES = ["'U%'", "'%S'", "'%E%'", "'U%S'", "'US'", "''", "'%'", "'it''s%'", "'_S'", "'%U%S%'", "'u%'"]
COLUMN_TEXT = {"id": ["id", "ID", '"id"'], "small": ["small"], "u": ["u"], "f": ["f"], "country": ["country", "Country"],
               "flag": ["flag"], "day": ["day"], "ts": ["ts"], "price": ["price"], "My Col": ['"My Col"']}
LITERALS = {
    "id": ["0", "10", "59", "-1", "30", "1e1", "10.5", "400000"],
    "small": ["0", "-5", "3", "200", "-3"],
    "u": ["0", "1", "3", "-1"],
    "f": ["0", "2.5", "7.25", "1e1", "-1", "0.1"],
    "country": ["'US'", "'DE'", "'it''s'", "''", "'us'"],
    "flag": ["TRUE", "FALSE"],
    "day": ["'2024-01-15'", "DATE '2024-02-01'", "DATE '2024-01-01'", "'2024-03-01'"],
    "ts": ["'2024-01-05 07:00:00'", "TIMESTAMP '2024-01-10 00:00:00'", "'2024-01-02'"],
    "price": ["1.5", "3.70", "0", "9.99", "5"],
    "My Col": ["0", "2", "4"],
}


@pytest.fixture(scope="module")
def small_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("simplesql") / "t.parquet"
    pq.write_table(TABLE, path, row_group_size=7)
    return str(path)


def _atoms():
    column = st.sampled_from(sorted(LITERALS))

    def atom(c):
        name = st.sampled_from(COLUMN_TEXT[c])
        lit = st.sampled_from(LITERALS[c])
        op = st.sampled_from(["=", "<>", "!=", "<", "<=", ">", ">=", "=="])
        shapes = [
            st.tuples(name, op, lit).map(lambda t: f"{t[0]} {t[1]} {t[2]}"),
            st.tuples(lit, op, name).map(lambda t: f"{t[0]} {t[1]} {t[2]}"),
            st.tuples(name, st.lists(lit, min_size=1, max_size=3), st.booleans())
            .map(lambda t: f"{t[0]} {'NOT ' if t[2] else ''}IN ({', '.join(t[1])})"),
            st.tuples(name, lit, lit, st.booleans())
            .map(lambda t: f"{t[0]} {'NOT ' if t[3] else ''}BETWEEN {t[1]} AND {t[2]}"),
            st.tuples(name, st.booleans()).map(lambda t: f"{t[0]} IS {'NOT ' if t[1] else ''}NULL"),
        ]
        if c == "country":
            shapes.append(st.tuples(name, st.sampled_from(LIKES), st.booleans())
                          .map(lambda t: f"{t[0]} {'NOT ' if t[2] else ''}LIKE {t[1]}"))
        return st.one_of(*shapes)
    return column.flatmap(atom) | st.sampled_from(["flag", "NOT flag", "TRUE", "id = small", "day = day"])


def _filters():
    def extend(inner):
        return st.one_of(
            st.tuples(inner, st.sampled_from(["AND", "OR", "and"]), inner).map(lambda t: f"{t[0]} {t[1]} {t[2]}"),
            inner.map(lambda e: f"({e})"), inner.map(lambda e: f"NOT ({e})"))
    return st.recursive(_atoms(), extend, max_leaves=4)


def twins(ds, text):
    """The filter as arrowload builds it (a simple tree) and as sqlglot's tree of the text."""
    simple = SqlExpr.parse(text, ds.schema, "filter")
    assert simplesql.is_simple(simple.node) and not simple.tree_built, text
    built = SqlExpr.bind(duckdb_parse(text), ds.schema, text)
    return simple, built


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_filters())
def test_simple_filters_select_duckdbs_rows_and_match_sqlglots_plan(small_file, text):
    ds = al.dataset(small_file)
    simple, built = twins(ds, text)
    schema = ds.schema
    # pushability, compiled pyarrow expression, polars translation: the same
    assert simple.pushable_on(schema) == built.pushable_on(schema), text
    assert simple.projectable_on(schema) == built.projectable_on(schema), text
    assert polars_filter.translatable(simple.node, schema) == polars_filter.translatable(built.tree, schema)
    if simple.pushable_on(schema):
        assert simple.to_arrow(schema, predicate=True).equals(built.to_arrow(schema, predicate=True)), text
    # the plan's fingerprint (cache keys, loader states), before and after the optimizer
    ours, theirs = ds.filter(text), al.Dataset(Filter(ds.plan, built), ds.options)
    assert plan_fingerprint(ours.plan) == plan_fingerprint(theirs.plan), text
    assert plan_fingerprint(ours.optimized_plan()) == plan_fingerprint(theirs.optimized_plan()), text
    assert [(s.unit, s.row_group, s.predicate) for s in ours.splits()] == \
        [(s.unit, s.row_group, s.predicate) for s in theirs.splits()]
    # the rows: DuckDB's answer over the same file
    # over the file's rows as a table: DuckDB 2.0's Parquet scan drops NaN in a pushed
    # ``f >= 7.25`` that its own expression (and a table) keep -- NaN is its largest float
    con = duckdb.connect()
    con.register("rows", pq.read_table(small_file))
    want = con.sql(f"SELECT * FROM rows WHERE {text}").arrow()
    want = want.read_all() if isinstance(want, pa.RecordBatchReader) else want
    got = ours.to_arrow()
    assert sorted_rows(got) == sorted_rows(want), text
    assert str(simple) == str(built)  # the SQL text DuckDB is given, where it evaluates it


@pytest.mark.parametrize("texts", [
    ["id < 30", "country = 'US'"], ["id < 30 AND (flag OR day > '2024-01-20')", "NOT flag", "u IN (1, 2)"],
    ["f > 1 OR f IS NULL", "price BETWEEN 1 AND 5"],
])
def test_conjuncts_and_conjoin_build_sqlglots_trees(small_file, texts):
    ds = al.dataset(small_file)
    pairs = [twins(ds, t) for t in texts]
    ours, theirs = conjoin([p[0] for p in pairs]), conjoin([p[1] for p in pairs])
    assert simplesql.is_simple(ours.node) and not ours.tree_built
    assert tree_data(ours.node) == tree_data(theirs.tree)
    either, either_sqlglot = disjoin([p[0] for p in pairs]), disjoin([p[1] for p in pairs])
    assert simplesql.is_simple(either.node) and not either.tree_built
    assert tree_data(either.node) == tree_data(either_sqlglot.tree)
    parts = conjuncts(ours)
    assert [tree_data(p.node) for p in parts] == [tree_data(p.tree) for p in conjuncts(theirs)]
    assert all(simplesql.is_simple(p.node) for p in parts)
    # the chain of filters moved through a projection and merged by the optimizer
    base = ds.select("id", "country", "flag", "day", "u", "f", "price")
    chained, rebuilt = base, base.plan
    for t, (_, built) in zip(texts, pairs):
        chained, rebuilt = chained.filter(t), Filter(rebuilt, built)
    theirs_ds = al.Dataset(rebuilt, ds.options)
    assert plan_fingerprint(chained.plan) == plan_fingerprint(theirs_ds.plan)
    assert plan_fingerprint(chained.optimized_plan()) == plan_fingerprint(theirs_ds.optimized_plan())
    assert sorted_rows(chained.to_arrow()) == sorted_rows(theirs_ds.to_arrow())


def test_a_filter_through_a_computed_column_is_rewritten_in_sqlglot(small_file):
    ds = al.dataset(small_file)
    sel = ds.select("id", big="id * 2").filter("big > 10 AND id < 20")
    want = duck(f"SELECT id, id * 2 AS big FROM read_parquet('{small_file}') WHERE id * 2 > 10 AND id < 20")
    assert sorted_rows(sel.to_arrow()) == sorted_rows(want)


def test_errors_are_sqlglots(small_file):
    ds = al.dataset(small_file)
    with pytest.raises(ExpressionError) as e:
        ds.filter("id <")
    assert e.value.line == 1
    with pytest.raises(KeyError):
        ds.filter("nope = 1")
    with pytest.raises(KeyError):
        ds.filter('"nope" = 1')
    with pytest.raises(ExpressionError, match="not boolean"):
        ds.filter("id")


def test_a_quoted_name_matches_case_insensitively_as_in_duckdb(small_file):
    """A quoted name matched only exactly ('"ID" = 1' raised ColumnNotFoundError, and
    al.sql left such a query unlowered); DuckDB's identifiers, quoted or not, match
    case-insensitively. Truth: DuckDB on the same file."""
    import duckdb
    ds = al.dataset(small_file)
    want = duckdb.sql(f"SELECT count(*) FROM '{small_file}' WHERE \"ID\" < 40").fetchall()[0][0]
    assert ds.filter('"ID" < 40').count() == want
    q = al.sql('SELECT "Id" FROM t WHERE "ID" < 40', t=ds)
    assert q.count() == want and "Sql" not in q.explain()  # lowered to the plan


# ---------------------------------------------------------------------------
# a loader epoch with a simple filter never imports sqlglot


def test_a_loader_epoch_with_a_simple_filter_never_imports_sqlglot(small_file, tmp_path):
    code = f"""
import json, sys
import arrowload as al
ds = al.dataset({small_file!r})
sel = ds.filter("id < 40 AND country IN ('US', 'it''s') AND NOT flag").filter("day >= DATE '2024-01-02'")
sel = sel.filter("country NOT LIKE '%x%'")
sel = sel.select("id", "u", "day", "flag")
n = sel.count()
with sel.loader(4, shuffle=True, seed=1, cache_dir={str(tmp_path / "cache")!r}) as loader:
    ids = [int(i) for b in loader for i in b["id"]]
    state = loader.state_dict()
with sel.loader(4, shuffle="block", seed=1) as loader:
    ids2 = [int(i) for b in loader for i in b["id"]]
print(json.dumps({{"n": n, "ids": sorted(ids), "ids2": sorted(ids2), "plan": state["plan"],
                  "sqlglot": sorted(m for m in sys.modules if m.split(".")[0] == "sqlglot")}}))
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["sqlglot"] == []
    want = duckdb.sql(f"SELECT id FROM read_parquet('{small_file}') WHERE id < 40 AND country IN ('US', 'it''s') "
                      "AND NOT flag AND day >= DATE '2024-01-02' AND country NOT LIKE '%x%'").fetchall()
    assert got["ids"] == got["ids2"] == sorted(r[0] for r in want) and got["n"] == len(want) > 0
    # the plan fingerprint in the state is the one sqlglot's trees give
    ds = al.dataset(small_file)
    plan = ds.plan
    for text in ("id < 40 AND country IN ('US', 'it''s') AND NOT flag", "day >= DATE '2024-01-02'",
                 "country NOT LIKE '%x%'"):
        plan = Filter(plan, SqlExpr.bind(duckdb_parse(text), ds.schema, text))
    theirs = al.Dataset(plan, ds.options).select("id", "u", "day", "flag")
    with theirs.loader(4, shuffle=True, seed=1) as loader:
        assert loader.state_dict()["plan"] == got["plan"]
