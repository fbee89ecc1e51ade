"""``import arrowload`` stays light, a simple filter does not load sqlglot at all
(``simplesql``) and other common filters do not load its DuckDB dialect: checked in fresh
interpreters (``sys.modules``), and the light parse is checked against the DuckDB dialect's
own parse (the trees must be identical, argument by argument).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlglot
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlglot import exp
from sqlglot.dialects.dialect import Dialect

import arrowload
from arrowload.plan.sqlexpr import DUCKDB_WORDS, _LIGHT_TOKENS, parse, parse_light

from _support import tree_data

REPO = Path(arrowload.__file__).resolve().parent.parent
HEAVY = ("sqlglot", "duckdb", "polars", "torch", "jax", "deltalake", "pyiceberg", "ray")


def fresh_modules(code: str) -> dict:
    """Run ``code`` in a fresh interpreter; the top-level packages (and sqlglot's dialect
    modules) in its ``sys.modules`` afterwards."""
    script = code + "\nimport json, sys\nprint(json.dumps({'top': sorted({m.split('.')[0] for m in sys.modules}), " \
                    "'dialects': sorted(m for m in sys.modules if m.startswith('sqlglot.dialects.'))}))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_arrowload_loads_no_heavy_package():
    got = fresh_modules("import arrowload as al\nassert al.dataset and al.sql and al.Dataset")
    assert not set(HEAVY) & set(got["top"]), got["top"]


def test_a_simple_filter_loads_no_sqlglot(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": [1, 2, 3], "country": ["US", "DE", "US"], "label": [1, 0, 1],
                             "f0": [0.5, 1.5, 2.5]}), path)
    got = fresh_modules(f"""
import arrowload as al
d = al.dataset({str(path)!r}).select("id", "country", "label", "f0")
sel = d.filter("country = 'US' AND label = 1").filter("id BETWEEN 1 AND 2 OR f0 IS NULL")
assert sel.to_arrow().column("id").to_pylist() == [1]
""")
    assert not {"sqlglot", "duckdb", "polars", "torch", "jax"} & set(got["top"]), got["top"]


def test_a_filter_outside_the_simple_grammar_loads_sqlglot_but_not_its_duckdb_dialect(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": [1, 2, 3], "country": ["US", "DE", "US"]}), path)
    got = fresh_modules(f"""
import arrowload as al
sel = al.dataset({str(path)!r}).filter("country = 'US' /* a comment: outside the simple grammar */ AND id > 1")
assert sel.to_arrow().column("id").to_pylist() == [3]
""")
    assert "sqlglot" in got["top"]
    assert "sqlglot.dialects.duckdb" not in got["dialects"], got["dialects"]
    assert not {"duckdb", "polars", "torch", "jax"} & set(got["top"]), got["top"]


def test_a_plain_selection_loads_no_sql_at_all(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"a": [1, 2, 3], "b": [0.5, 1.5, 2.5]}), path)
    got = fresh_modules(f"""
import arrowload as al
d = al.dataset({str(path)!r}).select("b", "a")
assert d.to_arrow().column("a").to_pylist() == [1, 2, 3] and d.count() == 3 and d.head(2).num_rows == 2
assert sum(len(b["a"]) for b in d.loader(2)) == 3
""")
    assert not set(HEAVY) & set(got["top"]), got["top"]


# ---------------------------------------------------------------------------
# the light parse gives the DuckDB dialect's tree


def duckdb_tree(text: str):
    return sqlglot.parse_one(text, read="duckdb", into=exp.Condition)


def test_the_word_list_holds_every_word_duckdb_reads_as_a_keyword():
    base = Dialect.get_or_raise(None).tokenizer_class.KEYWORDS
    duck = Dialect.get_or_raise("duckdb").tokenizer_class.KEYWORDS
    differ = {k for k in duck if (k not in base or duck[k] != base[k]) and k.replace("_", "a").isalnum()}
    assert differ <= DUCKDB_WORDS, sorted(differ - DUCKDB_WORDS)
    # the keywords of the light grammar mean the same to both tokenizers
    for word, kind in base.items():
        if kind.name in _LIGHT_TOKENS:
            assert duck.get(word) == kind, word


COMMON = [
    "country = 'US' AND label = 1", "id < 400000", "x IN (1, 2, 3)", "x NOT IN ('a', 'b')",
    "x BETWEEN 1 AND 5", "x IS NULL", "x IS NOT NULL", "NOT (a = 1 OR b <> 2)", "a LIKE 'x%'",
    "a NOT ILIKE '%Y'", '"My Col" >= -1.5e3', "a * 2 + b / 3 - c % 4 > 0", "flag", "a != 1",
    "a = 'it''s'", "a = TRUE OR b = FALSE", "x IS NULL AND y = 1", "(a = b) IS NULL",
    "a BETWEEN 1 AND 2 AND b IS NULL",
]


@pytest.mark.parametrize("text", COMMON)
def test_common_filters_parse_light_into_duckdbs_tree(text):
    tree = parse_light(text)
    assert tree is not None
    assert tree.dump() == duckdb_tree(text).dump()
    assert tree_data(parse(text)) == tree_data(duckdb_tree(text))  # most: simplesql's tree


@pytest.mark.parametrize("text", [
    "f(x) > 1", "a::INT = 1", "CAST(a AS INT) = 1", "day >= DATE '2024-01-01'", "a // 2 = 1",
    "a ^ 2 = 1", "a ** 2 = 1", "a = E'x'", "a = $$x$$", "row = 1", "summarize > 1", "a || 'x' = 'y'",
    "t.a = 1", "a = $1", "1 +", "a = 1_000", "a IS DISTINCT FROM b", "a = b IS NULL", "'a' 'b' = c",
])
def test_other_text_takes_the_duckdb_dialect(text):
    assert parse_light(text) is None


NAMES = st.sampled_from(["a", "b", "x_1", "Country", "row", "string", "summarize", "int8", "e", "date",
                         '"My Col"', '"a""b"', '"select"', "ts", "_x"])
NUMBERS = st.sampled_from(["0", "1", "-1", "42", "1.5", ".5", "1e3", "1.5E-3", "0x1F", "1_000", "00"])
STRINGS = st.sampled_from(["'US'", "''", "'it''s'", "'a\\b'", "'%x_'", "'é'", "E'x'", "$$y$$"])
ATOMS = st.one_of(NAMES, NUMBERS, STRINGS, st.sampled_from(["NULL", "TRUE", "FALSE"]))


def _expressions():
    def extend(inner):
        binary = st.tuples(inner, st.sampled_from(["=", "<>", "!=", "<", "<=", ">", ">=", "==", "+", "-", "*",
                                                   "/", "%", "AND", "OR", "||", "::", "^", "//", "LIKE",
                                                   "NOT LIKE", "ILIKE"]), inner) \
            .map(lambda t: f"{t[0]} {t[1]} {t[2]}")
        return st.one_of(
            binary,
            inner.map(lambda e: f"({e})"), inner.map(lambda e: f"NOT {e}"), inner.map(lambda e: f"-{e}"),
            st.tuples(inner, st.lists(ATOMS, min_size=1, max_size=3), st.booleans())
            .map(lambda t: f"{t[0]} {'NOT ' if t[2] else ''}IN ({', '.join(t[1])})"),
            st.tuples(inner, ATOMS, ATOMS).map(lambda t: f"{t[0]} BETWEEN {t[1]} AND {t[2]}"),
            st.tuples(inner, st.booleans()).map(lambda t: f"{t[0]} IS {'NOT ' if t[1] else ''}NULL"),
            st.tuples(NAMES, inner).map(lambda t: f"{t[0]}({t[1]})"),
        )
    return st.recursive(ATOMS, extend, max_leaves=8)


@settings(max_examples=400, deadline=None)
@given(_expressions())
def test_light_parse_equals_the_duckdb_dialect(text):
    tree = parse_light(text)
    if tree is None:
        return
    assert tree.dump() == duckdb_tree(text).dump(), text


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(ATOMS, st.sampled_from(["=", "<", "(", ")", ",", "+", "-", "AND", "OR", "NOT",
                                                  "IN", "IS", "BETWEEN", "LIKE", "--", "/*", "*/", "\n"])),
                min_size=1, max_size=9))
def test_light_parse_of_token_soup_equals_the_duckdb_dialect(parts):
    text = " ".join(parts)
    tree = parse_light(text)
    if tree is None:
        return
    assert tree.dump() == duckdb_tree(text).dump(), text


# ---------------------------------------------------------------------------
# a plain column without its tree says what its tree would


@pytest.mark.parametrize("name", ["a", "My Col", 'x"y', "é", "", "select", "1a", "a.b"])
def test_a_plain_column_without_its_tree_matches_the_tree(name):
    from arrowload.plan.expr import SqlExpr
    from arrowload.plan.fingerprint import _expr, sql_tree
    schema = pa.schema([(name, pa.int32()), ("flag", pa.bool_())])
    light = SqlExpr.column(name)
    built = SqlExpr(exp.column(name, quoted=True), name)
    assert not light.tree_built and built.tree_built
    assert str(light) == exp.column(name, quoted=True).sql("duckdb") == str(built)
    assert _expr(light) == {"sql": sql_tree(exp.column(name, quoted=True), resolved=True)} == _expr(built)
    assert light.column_name() == built.column_name() == name and light.columns == built.columns
    assert light.projectable_on(schema) == built.projectable_on(schema) is True
    assert light.pushable_on(schema) == built.pushable_on(schema) is False  # not a boolean
    assert light.output_type(schema) == built.output_type(schema) == pa.int32()
    assert light.to_arrow(schema).equals(built.to_arrow(schema))
    assert not light.tree_built  # none of the above needed the tree
    other = pa.schema([("other", pa.int8())])  # the column is missing: answered from the tree
    assert light.projectable_on(other) == built.projectable_on(other) is False
    assert light.pushable_on(other) == built.pushable_on(other) is False
    assert light.tree.dump() == built.tree.dump()
    flag = SqlExpr.column("flag")  # a boolean column is a predicate pyarrow evaluates
    assert flag.pushable_on(schema) == SqlExpr(exp.column("flag", quoted=True), "flag").pushable_on(schema) is True
