"""``al.sql`` gives what DuckDB gives when it runs the same query directly over the same files.

The truth: a fresh DuckDB connection with views ``events`` and ``users`` over
``read_parquet('<dir>/**/*.parquet')`` runs the query text unchanged. arrowload runs it
through ``al.sql(query, events=..., users=...)``: select-project-filter queries become the
lazy ``Filter / Project / Limit`` plan, everything else runs in DuckDB over arrowload's
scans. Results must hold the same column names, the same Arrow types (after
``conftest.normalize``: list / string / timestamp-unit representation only) and the same
rows: in order for queries with a total ORDER BY, as multisets otherwise. Floats compare
to 1e-9 relative (DuckDB's parallel float aggregates may sum in a different order);
everything else, decimals included, compares exactly.

Tables: ``events`` is the shared ``parquet_lake`` (20k rows, 4 shards, 10 row groups of
2k rows); ``users`` is written here (user_id 0..449 with events, 1000..1049 without; a few
null segments and credits; two files sorted by user_id, several row groups each).

Bytes read are measured through ``tests/_support.CountingLocalFileSystem`` passed as
``al.dataset(dir, filesystem=fs)``: every byte pyarrow reads for DuckDB's scans is counted.
"""

from __future__ import annotations

import gc
import math
import os
import subprocess
import sys
import textwrap
import threading
from decimal import Decimal

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import arrowload as al
from _support import CountingLocalFileSystem
from conftest import ROWS, normalize, parquet_scan

# ---------------------------------------------------------------------------
# fixtures and the independent truth

USER_IDS = list(range(450)) + list(range(1000, 1050))
SEGMENTS = ["gold", "silver", "bronze", "free"]


def _users_table() -> pa.Table:
    rng = np.random.default_rng(7)
    n = len(USER_IDS)
    seg = [SEGMENTS[i] for i in rng.integers(0, len(SEGMENTS), n)]
    seg_null = rng.random(n) < 0.03
    signup = np.datetime64("2022-01-01") + rng.integers(0, 900, n).astype("timedelta64[D]")
    cents = rng.integers(0, 500_000, n)
    credit_null = rng.random(n) < 0.03
    return pa.table({
        "user_id": pa.array(USER_IDS, pa.int64()),
        "segment": pa.array(seg, pa.string(), mask=seg_null),
        "signup": pa.array(signup, pa.date32()),
        "credit": pa.array([Decimal(int(c)).scaleb(-2) for c in cents], pa.decimal128(12, 2),
                           mask=credit_null),
    })


@pytest.fixture(scope="module")
def users_dir(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("users")
    table = _users_table()
    half = table.num_rows // 2
    for k, part in enumerate([table.slice(0, half), table.slice(half)]):
        pq.write_table(part, str(path / f"part-{k}.parquet"), row_group_size=50)
    return str(path)


@pytest.fixture(scope="module")
def events_dir(parquet_lake) -> str:
    return parquet_lake


@pytest.fixture(scope="module")
def events(events_dir) -> al.Dataset:
    return al.dataset(events_dir)


@pytest.fixture(scope="module")
def users(users_dir) -> al.Dataset:
    return al.dataset(users_dir)


@pytest.fixture(scope="module")
def truth(events_dir, users_dir):
    """``truth(query)``: DuckDB over the same files, the query text unchanged."""
    def run(query: str) -> pa.Table:
        con = duckdb.connect()
        try:
            con.execute(f"CREATE VIEW events AS SELECT * FROM {parquet_scan(events_dir)}")
            con.execute(f"CREATE VIEW users AS SELECT * FROM {parquet_scan(users_dir)}")
            return con.sql(query).to_arrow_table()
        finally:
            con.close()
    return run


def _rows(table: pa.Table) -> list[tuple]:
    """Rows as tuples (duplicate column names survive, unlike to_pylist's dicts)."""
    return list(zip(*[c.to_pylist() for c in table.columns])) if table.num_columns else []


def _sort_key(row: tuple):
    out = []
    for v in row:
        if v is None:
            out.append((0, ""))
        elif isinstance(v, float):
            out.append((1, "nan" if v != v else f"{v:.6e}"))
        else:
            out.append((1, repr(v)))
    return tuple(out)


def _same_value(a, e) -> bool:
    if isinstance(a, float) and isinstance(e, float):
        if a != a or e != e:
            return a != a and e != e
        return math.isclose(a, e, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(a, (list, tuple)) and isinstance(e, (list, tuple)):
        return len(a) == len(e) and all(_same_value(x, y) for x, y in zip(a, e))
    return type(a) is type(e) and a == e if a is not None and e is not None else a is e


def assert_same_result(actual: pa.Table, expected: pa.Table, *, ordered: bool,
                       decimal_precision: bool = True) -> None:
    """Same names, same (normalised) types, same rows (in order when ``ordered``).
    ``decimal_precision=False`` allows a different decimal precision (never scale)."""
    a, e = normalize(actual), normalize(expected)
    assert a.column_names == e.column_names, f"names differ:\n  {a.column_names}\n  {e.column_names}"
    for fa, fe in zip(a.schema, e.schema):
        if not decimal_precision and pa.types.is_decimal(fa.type) and pa.types.is_decimal(fe.type):
            assert fa.type.scale == fe.type.scale, f"{fa.name}: {fa.type} vs {fe.type}"
            continue
        assert fa.type.equals(fe.type), f"type of {fa.name!r}: {fa.type} vs {fe.type} (DuckDB)"
    ra, re_ = _rows(a), _rows(e)
    assert len(ra) == len(re_), f"{len(ra)} rows vs {len(re_)} from DuckDB"
    if not ordered:
        ra, re_ = sorted(ra, key=_sort_key), sorted(re_, key=_sort_key)
    for i, (x, y) in enumerate(zip(ra, re_)):
        assert _same_value(list(x), list(y)), f"row {i} differs:\n  {x}\n  {y} (DuckDB)"


# ---------------------------------------------------------------------------
# the analytic queries (all run in DuckDB over arrowload scans)

# (id, ordered?, query). Every ORDER BY is total, so "ordered" comparisons are exact.
QUERIES = [
    ("grouped-decimal", True, """
        SELECT country, sum(price * 2) AS revenue2, avg(price) AS avg_price, count(*) AS n,
               min(price) AS lo, max(price) AS hi
        FROM events WHERE day >= DATE '2024-01-03'
        GROUP BY country ORDER BY country NULLS LAST"""),
    ("having", False, """
        SELECT label, country, sum(price) AS total, count(*) AS n
        FROM events GROUP BY label, country
        HAVING count(*) > 100 AND sum(price) > 5000"""),
    ("decimal-arith-per-day", True, """
        SELECT day, sum(price * label) AS labelled, sum(price) - sum(price * 0.5) AS half,
               CAST(sum(price) AS DOUBLE) AS total_f, sum(price) / count(*) AS mean
        FROM events GROUP BY day ORDER BY day"""),
    ("inner-join-date-string", False, """
        SELECT e.id, e.price, u.segment, u.signup
        FROM events e JOIN users u ON e.user_id = u.user_id
        WHERE u.signup >= DATE '2023-01-01' AND e.country IN ('US', 'DE')
          AND e.text LIKE 'alpha%'"""),
    ("left-join-aggregate", False, """
        SELECT u.user_id, u.segment, count(e.id) AS n_events,
               coalesce(sum(e.price), 0) AS spent, u.credit - coalesce(sum(e.price), 0) AS left_over
        FROM users u LEFT JOIN events e ON e.user_id = u.user_id AND e.label = 1
        GROUP BY u.user_id, u.segment, u.credit"""),
    ("three-way-join", False, """
        SELECT e.id, u.segment, f.first_day
        FROM events e
        JOIN users u USING (user_id)
        JOIN (SELECT user_id, min(day) AS first_day FROM events GROUP BY user_id) f USING (user_id)
        WHERE e.day = f.first_day AND u.segment <> 'free' AND e.ts < TIMESTAMP '2024-01-01 12:00:00'"""),
    ("join-decimal-by-segment", True, """
        SELECT u.segment, sum(e.price * 2) AS p2, sum(e.price) / count(*) AS mean,
               max(u.credit - e.price) AS headroom, count(DISTINCT e.user_id) AS buyers
        FROM events e JOIN users u ON e.user_id = u.user_id
        WHERE e.ts < TIMESTAMP '2024-01-05 00:00:00' AND e.country <> 'US'
        GROUP BY u.segment ORDER BY u.segment NULLS FIRST"""),
    ("window-row-number", False, """
        SELECT id, country, price,
               row_number() OVER (PARTITION BY country ORDER BY price DESC, id) AS rn
        FROM events WHERE id < 5000
        QUALIFY rn <= 3"""),
    ("window-running-sum", True, """
        SELECT id, day, price,
               sum(price) OVER (PARTITION BY day ORDER BY id
                                ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS running
        FROM events WHERE user_id < 40 ORDER BY id"""),
    ("window-rank-lag", False, """
        SELECT user_id, id, rank() OVER (PARTITION BY user_id ORDER BY price DESC) AS r,
               id - lag(id) OVER (PARTITION BY user_id ORDER BY id) AS gap
        FROM events WHERE user_id BETWEEN 10 AND 30"""),
    ("in-subquery", False, """
        SELECT id, price FROM events
        WHERE user_id IN (SELECT user_id FROM users WHERE segment = 'gold' AND credit > 2500)
          AND day BETWEEN DATE '2024-01-02' AND DATE '2024-01-04'"""),
    ("scalar-subquery", False, """
        SELECT id, price, price - (SELECT avg(price) FROM events) AS delta
        FROM events WHERE price > (SELECT avg(price) * 1.9 FROM events)"""),
    ("not-exists", False, """
        SELECT u.user_id, u.segment FROM users u
        WHERE NOT EXISTS (SELECT 1 FROM events e WHERE e.user_id = u.user_id AND e.label = 1)"""),
    ("union-all", False, """
        SELECT 'event' AS kind, user_id, price AS amount FROM events WHERE id < 300
        UNION ALL
        SELECT 'credit' AS kind, user_id, credit FROM users WHERE signup < DATE '2022-03-01'"""),
    ("order-limit", True, """
        SELECT id, ts, price, text FROM events WHERE text LIKE '%gamma%'
        ORDER BY price DESC, id LIMIT 25"""),
    ("order-limit-offset", True, """
        SELECT id, user_id FROM events WHERE label = 1 ORDER BY user_id, id LIMIT 10 OFFSET 5"""),
    ("distinct", False, """
        SELECT DISTINCT country, label FROM events WHERE score > 0.5"""),
    ("cte-window-share", True, """
        WITH daily AS (SELECT day, country, sum(price) AS rev FROM events GROUP BY ALL)
        SELECT d.day, d.country, d.rev, d.rev / sum(d.rev) OVER (PARTITION BY d.day) AS share
        FROM daily d WHERE d.country IS NOT NULL ORDER BY d.day, d.country"""),
    ("count-distinct", False, """
        SELECT country, count(DISTINCT user_id) AS users, count(DISTINCT day) AS days
        FROM events GROUP BY country"""),
    ("dates-grouped", True, """
        SELECT year(signup) AS yr, month(signup) AS mo, count(*) AS n, sum(credit) AS credit
        FROM users WHERE signup BETWEEN DATE '2022-06-01' AND DATE '2023-06-30'
        GROUP BY ALL ORDER BY yr, mo"""),
    ("strings-grouped", True, """
        SELECT split_part(text, ' ', 1) AS w, count(*) AS n, avg(score) AS s, max(upper(country)) AS c
        FROM events WHERE country <> 'US' AND text NOT LIKE '%eps%'
        GROUP BY w ORDER BY w"""),
    ("case-cast", False, """
        SELECT CASE WHEN price >= 50 THEN 'high' ELSE 'low' END AS band,
               CAST(label AS DOUBLE) AS lab,
               sum(CAST(price AS DECIMAL(18, 4)) * 1.5) AS x, count(*) AS n
        FROM events GROUP BY ALL"""),
]


@pytest.mark.parametrize("ordered,query", [q[1:] for q in QUERIES], ids=[q[0] for q in QUERIES])
def test_query_matches_duckdb(events, users, truth, ordered, query):
    result = al.sql(query, events=events, users=users)
    assert type(result.plan).__name__ == "SqlQuery", "expected the query to run in DuckDB"
    expected = truth(query)
    assert expected.num_rows > 0, "the query should select something"
    actual = result.to_arrow()
    assert_same_result(actual, expected, ordered=ordered)
    # the declared schema is what the stream delivers
    assert normalize(actual).schema.equals(normalize(result.schema.empty_table()).schema)
    assert result.count() == expected.num_rows


def test_result_types_follow_sql(events, users):
    """Decimals stay decimals, dates stay dates, CAST(.. AS DOUBLE) is float64, in both
    the DuckDB path and the lazy-plan path."""
    grouped = al.sql("""
        SELECT day, sum(price) AS s, sum(price * 2) AS s2, min(price) AS lo,
               CAST(sum(price) AS DOUBLE) AS f, max(signup) AS latest, CAST(count(*) AS INTEGER) AS n
        FROM events JOIN users USING (user_id) GROUP BY day""", events=events, users=users)
    t = grouped.schema
    assert t.field("day").type == pa.date32()
    assert pa.types.is_decimal(t.field("s").type) and t.field("s").type.scale == 2
    assert pa.types.is_decimal(t.field("s2").type) and t.field("s2").type.scale == 2
    assert t.field("lo").type == pa.decimal128(10, 2)
    assert t.field("f").type == pa.float64()
    assert t.field("latest").type == pa.date32()
    assert t.field("n").type == pa.int32()
    assert grouped.to_arrow().schema.equals(t)

    simple = al.sql("SELECT day, price, price * 2 AS p2, CAST(label AS DOUBLE) AS l, ts "
                    "FROM events WHERE id < 10", events=events)
    s = simple.to_arrow().schema
    assert type(simple.plan).__name__ != "SqlQuery"
    assert s.field("day").type == pa.date32()
    assert s.field("price").type == pa.decimal128(10, 2)
    assert pa.types.is_decimal(s.field("p2").type) and s.field("p2").type.scale == 2
    assert s.field("l").type == pa.float64()
    assert s.field("ts").type == pa.timestamp("us")


def test_head_count_and_order(events, users, truth):
    q = """SELECT e.id, e.price, u.segment FROM events e JOIN users u USING (user_id)
           WHERE e.label = 1 ORDER BY e.price DESC, e.id"""
    r = al.sql(q, events=events, users=users)
    expected = truth(q)
    assert_same_result(r.head(3), expected.slice(0, 3), ordered=True)
    assert r.head(3).num_rows == 3
    assert r.count() == expected.num_rows
    assert r.limit(5).count() == 5
    assert_same_result(r.limit(5).to_arrow(), expected.slice(0, 5), ordered=True)


def test_result_streams_as_batches(events, truth):
    """A 200k-row ordered result arrives as several record batches, not one table."""
    q = """SELECT e.id, e.price, r.k FROM events e
           CROSS JOIN (VALUES (0), (1), (2), (3), (4), (5), (6), (7), (8), (9)) r(k)
           ORDER BY e.id DESC, r.k"""
    r = al.sql(q, events=events)
    batches = list(r.to_batches())
    total = sum(b.num_rows for b in batches)
    assert total == ROWS * 10
    assert len(batches) > 1, "the result came back as one batch"
    assert max(b.num_rows for b in batches) < total
    assert all(isinstance(b, pa.RecordBatch) for b in batches)
    got, expected = normalize(pa.Table.from_batches(batches)), normalize(truth(q))
    assert got.schema.equals(expected.schema) and got.equals(expected)


def _plan_boxes(text: str) -> list[str]:
    """The operator boxes of DuckDB's rendered plan (boxes may sit side by side), each
    as one line of text."""
    lines = text.splitlines()
    boxes = []
    for i, line in enumerate(lines):
        start = line.find("╭")
        while start != -1:
            end = line.find("╮", start)
            body = [line[start:end + 1]]
            for nxt in lines[i + 1:]:
                seg = nxt[start:end + 1]
                body.append(seg)
                if seg.startswith("╰"):
                    break
            boxes.append(" ".join(" ".join(body).replace("│", " ").replace("─", " ").split()))
            start = line.find("╭", end)
    return boxes


def test_explain_shows_sql_scans_and_duckdb_pushdown(events, users):
    q = """SELECT u.segment, sum(e.price) AS s FROM events e JOIN users u ON e.user_id = u.user_id
           WHERE e.id < 2000 AND u.signup >= DATE '2022-06-01' GROUP BY u.segment"""
    text = al.sql(q, events=events, users=users).explain()
    assert "Sql [duckdb, tables: events, users]" in text
    assert "== scan 0 (parquet:" in text and "== scan 1 (parquet:" in text
    assert "== duckdb physical plan" in text
    plan = text.split("== duckdb physical plan", 1)[1]
    flat = [b for b in _plan_boxes(plan) if "ARROW_SCAN" in b.upper()]
    assert len(flat) == 2, plan
    ev_box = next(b for b in flat if "price" in b)
    us_box = next(b for b in flat if "segment" in b)
    assert "Filters:" in ev_box and "2000" in ev_box and "id" in ev_box, ev_box
    assert "Filters:" in us_box and "2022-06-01" in us_box, us_box
    # projections pushed into the scans: only the columns the query needs
    assert "Projections:" in ev_box and "Projections:" in us_box
    for unused in ("emb", "text", "f0", "score", "country"):
        assert unused not in ev_box, (unused, ev_box)
    assert "credit" not in us_box, us_box
    # the scans' figures are what the plan keeps: each says DuckDB prunes further as it runs
    # (a reader saw "files 40 of 40, applied: none" and took it for no pruning at all)
    for part in text.split("== scan ")[1:3]:
        assert "DuckDB pushes the query's own filters" in part.split("==", 1)[0] + part, part


# ---------------------------------------------------------------------------
# select-project-filter queries: the same lazy plan as .filter().select()

SIMPLE = [
    ("project-filter-limit",
     "SELECT id, price * 2 AS c, CAST(label AS DOUBLE) AS l FROM events "
     "WHERE country = 'US' AND id < 5000 LIMIT 700",
     lambda ds: ds.filter("country = 'US' AND id < 5000")
     .select("id", c="price * 2", l="CAST(label AS DOUBLE)").limit(700)),
    ("star",
     "SELECT * FROM events WHERE day = DATE '2024-01-02'",
     lambda ds: ds.filter("day = DATE '2024-01-02'")),
    ("star-exclude",
     "SELECT * EXCLUDE (emb, text) FROM events WHERE text LIKE 'beta%' AND score > 0.5",
     lambda ds: ds.filter("text LIKE 'beta%' AND score > 0.5")
     .select(*[n for n in ds.columns if n not in ("emb", "text")])),
    ("qualified",
     "SELECT events.id, events.f0 * 2 AS g FROM events WHERE events.label = 1 AND events.id >= 15000",
     lambda ds: ds.filter("label = 1 AND id >= 15000").select("id", g="f0 * 2")),
    ("alias-qualified",
     "SELECT e.id, e.user_id FROM events AS e WHERE e.ts < TIMESTAMP '2024-01-02 00:00:00'",
     lambda ds: ds.filter("ts < TIMESTAMP '2024-01-02 00:00:00'").select("id", "user_id")),
    ("case-insensitive",
     "SELECT ID, Country, PRICE FROM EVENTS WHERE LABEL = 1 AND Id < 3000",
     lambda ds: ds.filter("label = 1 AND id < 3000").select("id", "country", "price")),
]


@pytest.mark.parametrize("query,equivalent", [s[1:] for s in SIMPLE], ids=[s[0] for s in SIMPLE])
def test_simple_query_is_the_lazy_plan(events, truth, query, equivalent):
    r = al.sql(query, events=events)
    twin = equivalent(events)
    assert "Sql [duckdb" not in r.explain()
    assert r.explain() == twin.explain()
    assert r.splits() == twin.splits()
    assert r.splits(), "expected scan tasks"
    expected = truth(query)
    assert expected.num_rows > 0
    # arrowload's decimal arithmetic may pick another precision than DuckDB (same scale, values)
    assert_same_result(r.to_arrow(), expected, ordered=False, decimal_precision=False)
    assert r.count() == expected.num_rows


def test_simple_query_pushdown_reads_few_row_groups(events):
    r = al.sql("SELECT id, f0 FROM events WHERE id >= 19000", events=events)
    splits = r.splits()
    assert len(splits) == 1 and splits[0].columns == ("id", "f0")
    assert "row groups  1 of 12" in r.explain()


def test_loader_over_simple_query(events, truth, tmp_path):
    q = "SELECT id, f0 * 2 AS g, CAST(label AS DOUBLE) AS l FROM events WHERE country = 'DE' AND id < 12000"
    expected = truth(q + " ORDER BY id")
    loader = al.sql(q, events=events).loader(batch_size=256, shuffle=False, cache_dir=str(tmp_path))
    with loader:
        batches = list(loader)
    ids = np.concatenate([b["id"] for b in batches])
    assert ids.dtype == np.int64
    np.testing.assert_array_equal(ids, np.asarray(expected.column("id")))  # source order = id order
    g = np.concatenate([b["g"] for b in batches])
    assert g.dtype == np.float32
    np.testing.assert_array_equal(g, np.asarray(expected.column("g")))
    lab = np.concatenate([b["l"] for b in batches])
    assert lab.dtype == np.float64
    np.testing.assert_array_equal(lab, np.asarray(expected.column("l")))
    assert all(len(b["id"]) == 256 for b in batches[:-1])


def test_loader_over_duckdb_query(events, users, truth, tmp_path):
    q = """SELECT e.user_id, count(*) AS n, CAST(sum(e.price) AS DOUBLE) AS spent
           FROM events e JOIN users u USING (user_id) WHERE u.segment = 'gold' GROUP BY e.user_id"""
    expected = truth(q).sort_by("user_id")
    loader = al.sql(q, events=events, users=users).loader(batch_size=16, shuffle=True, seed=3,
                                                          cache_dir=str(tmp_path))
    with loader:
        batches = list(loader)
    uid = np.concatenate([b["user_id"] for b in batches])
    n = np.concatenate([b["n"] for b in batches])
    spent = np.concatenate([b["spent"] for b in batches])
    order = np.argsort(uid)
    np.testing.assert_array_equal(uid[order], np.asarray(expected.column("user_id")))
    np.testing.assert_array_equal(n[order], np.asarray(expected.column("n")))
    np.testing.assert_allclose(spent[order], np.asarray(expected.column("spent")), rtol=1e-12)
    assert not np.array_equal(uid, np.sort(uid)), "shuffle=True left the rows in order"


def test_unaliased_expressions_named_like_duckdb(events, truth):
    """Column names of unaliased expressions and differently-cased columns are DuckDB's."""
    for q in ["SELECT Id, price * 2, CAST(label AS DOUBLE), upper(country) FROM events WHERE id < 50",
              "SELECT Id, price * 2, CAST(label AS DOUBLE), upper(country) FROM events WHERE id < 50 "
              "ORDER BY id"]:
        assert al.sql(q, events=events).schema.names == truth(q).schema.names


def test_expression_arrowload_cannot_compute_runs_in_duckdb(events, truth):
    q = "SELECT id, day + 1 AS next_day, ts + INTERVAL 1 HOUR AS later FROM events WHERE id < 100"
    r = al.sql(q, events=events)
    assert_same_result(r.to_arrow(), truth(q), ordered=False)


# (id, query): shapes near the select-project-filter boundary. Each either is the lazy plan
# or runs in DuckDB; either way the result is DuckDB's.
EDGE = [
    ("cte-over-filter", "WITH d AS (SELECT * FROM events WHERE id < 10) SELECT id, price FROM d"),
    ("repeated-name", "SELECT id, id FROM events WHERE id < 5"),
    ("star-replace", "SELECT * EXCLUDE (emb) REPLACE (id * 10 AS id) FROM events WHERE id < 5"),
    ("join-repeated-names", "SELECT e.user_id, u.user_id, e.id FROM events e JOIN users u "
                            "ON e.user_id = u.user_id WHERE e.id < 50"),
    ("where-arrowload-cannot-compute", "SELECT id FROM events WHERE day + 1 = DATE '2024-01-02' AND id < 20"),
    ("unknown-to-arrowload-aggregate",
     "SELECT list_sort(list(DISTINCT country)) AS cs FROM events WHERE id < 100"),
    ("qualified-star-exclude", "SELECT e.* EXCLUDE (emb, text) FROM events e WHERE e.id < 3"),
]


@pytest.mark.parametrize("query", [e[1] for e in EDGE], ids=[e[0] for e in EDGE])
def test_select_shapes_match_duckdb(events, users, truth, query):
    expected = truth(query)
    assert expected.num_rows > 0
    r = al.sql(query, events=events, users=users)
    assert r.schema.names == expected.schema.names
    assert_same_result(r.to_arrow(), expected, ordered=False)
    assert r.count() == expected.num_rows


def test_table_sample_is_not_ignored(events):
    for q in ["SELECT id FROM events TABLESAMPLE reservoir(10 ROWS)",
              "SELECT id FROM events USING SAMPLE 10 ROWS"]:
        r = al.sql(q, events=events)
        assert r.to_arrow().num_rows == 10
        assert r.count() == 10


# ---------------------------------------------------------------------------
# bytes read: pushdown inside joins and aggregates


@pytest.fixture
def counted(events_dir, users_dir):
    fs = CountingLocalFileSystem()
    ev = al.dataset(events_dir, filesystem=fs)
    us = al.dataset(users_dir, filesystem=fs)

    def measure(query: str) -> tuple[int, pa.Table]:
        fs.reset()
        out = al.sql(query, events=ev, users=us).to_arrow()
        return fs.stats.bytes_read, out

    fs.reset()
    ev.to_arrow()
    us.to_arrow()
    full = fs.stats.bytes_read
    return measure, full, fs


JOIN_AGG = """SELECT u.segment, sum(e.price) AS s, count(*) AS n
              FROM events e JOIN users u ON e.user_id = u.user_id {where} GROUP BY u.segment"""


def test_pushdown_inside_join_and_aggregate_reads_few_bytes(counted, truth, events_dir):
    measure, full, fs = counted
    q = JOIN_AGG.format(where="WHERE e.id < 2000")
    got, out = measure(q)
    assert_same_result(out, truth(q), ordered=False)
    assert full > 1_000_000
    assert got < 0.05 * full, f"{got} bytes of {full} for a full scan"
    # the events shards other than the first are pruned by the id filter: footers only
    by_path = fs.stats.bytes_by_path()
    fs.reset()
    for name in sorted(os.listdir(events_dir))[1:]:
        path = os.path.join(events_dir, name)
        read = sum(n for p, n in by_path.items() if os.path.basename(p) == name)
        assert read < 0.2 * os.path.getsize(path), (name, read, os.path.getsize(path))


def test_filter_reduces_bytes_in_join_and_aggregate(counted, truth):
    measure, full, _ = counted
    with_filter, out1 = measure(JOIN_AGG.format(where="WHERE e.id < 2000"))
    without, out2 = measure(JOIN_AGG.format(where=""))
    assert_same_result(out2, truth(JOIN_AGG.format(where="")), ordered=False)
    assert with_filter < 0.5 * without, (with_filter, without)
    # projection pushdown alone: the unfiltered aggregate still reads a few columns only
    assert without < 0.25 * full, (without, full)

    agg = "SELECT country, sum(price) AS s FROM events {where} GROUP BY country"
    a_with, _ = measure(agg.format(where="WHERE id >= 18000"))
    a_without, _ = measure(agg.format(where=""))
    assert a_with < 0.5 * a_without, (a_with, a_without)
    assert a_without < 0.1 * full, (a_without, full)


# ---------------------------------------------------------------------------
# bindings


AGG = "SELECT country, count(*) AS n, sum(price) AS s FROM {t} WHERE id < 7000 GROUP BY country"


def _bindings(events_dir, lake_table):
    no_emb = lake_table.drop_columns(["emb"])
    return {
        "dataset": al.dataset(events_dir),
        "path": events_dir,
        "pyarrow": lake_table,
        "polars": pl.from_arrow(lake_table),
        "pandas": no_emb.to_pandas(),
    }


@pytest.mark.parametrize("kind", ["dataset", "path", "pyarrow", "polars", "pandas"])
def test_bindings(kind, events_dir, lake_table, truth):
    value = _bindings(events_dir, lake_table)[kind]
    expected = truth(AGG.format(t="events"))
    # a pandas frame of Decimal objects declares no precision: pyarrow infers one (scale kept)
    exact = kind != "pandas"
    got = al.sql(AGG.format(t="t"), t=value)
    assert_same_result(got.to_arrow(), expected, ordered=False, decimal_precision=exact)
    q = "SELECT id, price, day FROM t WHERE id BETWEEN 100 AND 140"
    simple = al.sql(q, t=value)
    assert type(simple.plan).__name__ != "SqlQuery"
    assert_same_result(simple.to_arrow(), truth(q.replace("FROM t", "FROM events")), ordered=False,
                       decimal_precision=exact)


def test_dataset_sql_self(events, users, truth):
    q = "SELECT label, count(*) AS n, avg(price) AS a FROM {} WHERE day < DATE '2024-01-04' GROUP BY label"
    assert_same_result(events.sql(q.format("self")).to_arrow(), truth(q.format("events")), ordered=False)
    j = "SELECT s.id, u.segment FROM self s JOIN users u USING (user_id) WHERE s.id < 500"
    assert_same_result(events.sql(j, users=users).to_arrow(),
                       truth(j.replace("self s", "events s")), ordered=False)
    simple = events.sql("SELECT id, f1 FROM self WHERE id < 10")
    assert simple.explain() == events.filter("id < 10").select("id", "f1").explain()


def test_bound_selection_used_twice(events, truth):
    """A bound Dataset that is itself a selection with a computed column (it streams into
    DuckDB) can be scanned twice in one query: self-joins, subqueries."""
    sel = events.filter("id < 3000").select("id", "user_id", p2="price * 2")
    q = """SELECT a.id, b.id AS other FROM s a JOIN s b ON a.user_id = b.user_id AND a.id < b.id
           WHERE a.p2 > (SELECT avg(p2) FROM s)"""
    expected = truth(q.replace("FROM s a JOIN s b", "FROM ev a JOIN ev b").replace("FROM s)", "FROM ev)")
                     .replace("SELECT a.id", "WITH ev AS (SELECT id, user_id, price * 2 AS p2 FROM events "
                              "WHERE id < 3000) SELECT a.id"))
    assert expected.num_rows > 0
    assert_same_result(al.sql(q, s=sel).to_arrow(), expected, ordered=False)


# ---------------------------------------------------------------------------
# errors


def test_unknown_table_lists_bound_names(events, users):
    with pytest.raises(al.TableNotFoundError) as info:
        al.sql("SELECT * FROM purchases p JOIN users u USING (user_id)", events=events, users=users)
    assert isinstance(info.value, KeyError) and isinstance(info.value, al.ArrowloadError)
    msg = str(info.value)
    assert "purchases" in msg and "events" in msg and "users" in msg


@pytest.mark.parametrize("query,column", [
    ("SELECT idd, price FROM events", "idd"),
    ("SELECT id FROM events WHERE bogus > 1", "bogus"),
    ("SELECT country, sum(bogus) AS s FROM events GROUP BY country", "bogus"),
    ("SELECT e.nope FROM events e JOIN users u USING (user_id)", "nope"),
    ("SELECT u.segment FROM events e JOIN users u ON e.user_id = u.missing_col", "missing_col"),
    ("SELECT id, sum(price) OVER (PARTITION BY zzz) AS w FROM events", "zzz"),
], ids=["simple-select", "simple-where", "aggregate", "join-qualified", "join-on", "window"])
def test_unknown_column(events, users, query, column):
    with pytest.raises(al.ColumnNotFoundError) as info:
        al.sql(query, events=events, users=users).to_arrow()
    e = info.value
    assert isinstance(e, KeyError) and not isinstance(e, duckdb.Error)
    assert e.column == column and column in str(e)


def test_syntax_error_has_line_and_column(events):
    with pytest.raises(al.ExpressionError) as info:
        al.sql("SELECT id,\n  price\nFROM events WHERE (", events=events)
    e = info.value
    assert isinstance(e, ValueError)
    assert e.line == 3 and e.col is not None
    assert "line 3" in str(e) and "column" in str(e)


@pytest.mark.parametrize("query", [
    "SELECT CAST(text AS INTEGER) AS x FROM events ORDER BY id",
    "SELECT country, sum(id) // 0 AS x FROM events GROUP BY country",
    "SELECT CAST(sum(id) AS TINYINT) AS x FROM events",
    "SELECT country, error('boom') AS x FROM events GROUP BY country",
], ids=["cast", "int-division-by-zero", "overflow", "error-function"])
def test_duckdb_runtime_errors_are_arrowload_errors(events, query):
    with pytest.raises(al.ArrowloadError) as info:
        al.sql(query, events=events).to_arrow()
    e = info.value
    assert not isinstance(e, duckdb.Error)
    assert isinstance(e, al.ExpressionError)


def test_failed_cast_in_lazy_plan_is_not_blamed_on_the_file(events):
    with pytest.raises(al.ArrowloadError) as info:
        al.sql("SELECT id, CAST(text AS INTEGER) AS x FROM events", events=events).to_arrow()
    assert not isinstance(info.value, al.CorruptFileError), str(info.value)
    assert isinstance(info.value, al.ExpressionError)


def test_division_follows_duckdb(events, truth):
    q = "SELECT country, sum(price) / 0 AS d, count(*) / 0 AS z, 7 / 2 AS h FROM events GROUP BY country"
    assert_same_result(al.sql(q, events=events).to_arrow(), truth(q), ordered=False)


# ---------------------------------------------------------------------------
# resources: connections and threads


def test_no_threads_linger(events, users):
    before = set(threading.enumerate())
    al.sql("SELECT country, count(*) FROM events GROUP BY country", events=events).to_arrow()
    al.sql("SELECT * FROM events e JOIN users u USING (user_id) ORDER BY id", events=events,
           users=users).head(2)
    gen = iter(al.sql("SELECT * FROM events ORDER BY id DESC", events=events).to_batches())
    assert next(gen).num_rows > 0
    del gen
    with pytest.raises(al.ArrowloadError):
        al.sql("SELECT CAST(text AS INTEGER) FROM events ORDER BY id", events=events).to_arrow()
    gc.collect()
    extra = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    assert not extra, extra


_EXIT_SCRIPT = """
import arrowload as al
ev = al.dataset({events!r})
us = al.dataset({users!r})
t = al.sql("SELECT u.segment, sum(e.price) AS s FROM events e JOIN users u USING (user_id) "
           "GROUP BY u.segment", events=ev, users=us).to_arrow()
assert t.num_rows > 0
stream = iter(al.sql("SELECT * FROM events ORDER BY id", events=ev).to_batches())
first = next(stream)            # abandoned mid-stream, still referenced at exit
try:
    al.sql("SELECT CAST(text AS INTEGER) AS x FROM events ORDER BY id", events=ev).to_arrow()
except al.ArrowloadError as e:
    kept = e                    # the error (and its traceback) alive at exit
try:
    al.sql("SELECT nope FROM events ORDER BY id", events=ev)
except al.ColumnNotFoundError as e:
    kept2 = e
sel = ev.filter("id < 5000").select("id", "user_id", p2="price * 2")   # streams into DuckDB
half = iter(al.sql("SELECT a.id FROM s a JOIN s b USING (user_id) ORDER BY a.id", s=sel).to_batches())
next(half)                      # abandoned too
head = al.sql("SELECT id FROM events ORDER BY id", events=ev).head(3)
print("done", t.num_rows, first.num_rows, head.num_rows)
"""


def test_nothing_printed_at_interpreter_exit(events_dir, users_dir):
    script = _EXIT_SCRIPT.format(events=events_dir, users=users_dir)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("done"), proc.stdout
    assert proc.stderr == "", proc.stderr


# ---------------------------------------------------------------------------
# external_access=False: the bound tables and nothing else


@pytest.fixture()
def outside(tmp_path):
    """A file the query must not read, a folder it must not write to, an environment variable."""
    notes = tmp_path / "notes.txt"
    notes.write_text("secret line\n")
    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "other.parquet")
    os.environ["ARROWLOAD_TEST_SECRET"] = "hunter2"
    try:
        yield tmp_path
    finally:
        os.environ.pop("ARROWLOAD_TEST_SECRET", None)


def test_default_keeps_duckdb_full_access(events, outside):
    """The documented default: DuckDB's reach, as when one runs DuckDB oneself."""
    q = f"SELECT count(*) AS n FROM events, read_text('{outside / 'notes.txt'}')"
    got = al.sql(q, events=events).to_arrow()
    assert got["n"].to_pylist() == [events.count()]
    q = (f"SELECT sum(x) AS s FROM (SELECT x FROM read_parquet('{outside / 'other.parquet'}') "
         "UNION ALL SELECT 0 FROM events)")
    assert al.sql(q, events=events).to_arrow()["s"].to_pylist() == [3]


def test_a_quoted_file_path_beside_a_bound_table_is_read_as_duckdb_reads_it(events, outside, tmp_path):
    """FROM 'file.parquet' (DuckDB's replacement scan, as read_parquet) beside a bound table:
    it was taken for a table name and refused (TableNotFoundError). DuckDB's answer now; the
    sandbox refuses it; a cache needs key= (the query reads data by itself); a query that
    reads no bound table at all is refused, saying al.sql needs one."""
    other = outside / "other.parquet"
    for spelled in (f"'{other}'", f'"{other}"'):
        q = f"SELECT sum(x) AS s, count(*) AS n FROM {spelled} CROSS JOIN (SELECT 1 FROM events LIMIT 2)"
        want = duckdb.sql(f"SELECT sum(x) AS s, count(*) AS n FROM {spelled} CROSS JOIN (SELECT 1 FROM range(2))")
        assert al.sql(q, events=events).to_arrow().to_pylist() == want.to_arrow_table().to_pylist() == \
            [{"s": 6, "n": 4}], spelled
        with pytest.raises(al.ExternalAccessError):
            al.sql(q, events=events, external_access=False).to_arrow()
        with pytest.raises(al.UncacheablePlanError, match="reads data by itself"):
            al.sql(q, events=events).cache(str(tmp_path / "cache"))
    with pytest.raises(al.TableNotFoundError):  # a name that is no path is still a table
        al.sql("SELECT * FROM evnts", events=events)
    with pytest.raises(al.ExpressionError, match="at least one bound table"):
        al.sql(f"SELECT * FROM '{other}'", events=events)


def test_sandbox_still_runs_queries_over_bound_tables(events, users, truth):
    query = ("SELECT u.segment, count(*) AS n, sum(e.price) AS revenue FROM events e "
             "JOIN users u USING (user_id) WHERE e.label = 1 GROUP BY u.segment ORDER BY u.segment")
    got = al.sql(query, events=events, users=users, external_access=False)
    assert "external_access=False" in got.explain()
    assert_same_result(got.to_arrow(), truth(query), ordered=True)
    simple = "SELECT id, price FROM events WHERE country = 'US' AND label = 1"
    assert_same_result(al.sql(simple, events=events, external_access=False).to_arrow(),
                       truth(simple), ordered=False)
    # Dataset.sql too, and a frame bound by keyword
    frame = pa.table({"segment": SEGMENTS[:2], "w": [1.0, 2.0]})
    got = users.sql("SELECT s.segment, w FROM self s JOIN f USING (segment) ORDER BY 1", f=frame,
                    external_access=False).to_arrow()
    kept = ", ".join(f"'{seg}'" for seg in SEGMENTS[:2])
    expected = truth(f"SELECT count(*) AS n FROM users WHERE segment IN ({kept})")["n"][0].as_py()
    assert got.num_rows == expected > 0


REFUSED = {
    "read_text in a scalar subquery": "SELECT id, (SELECT count(*) FROM read_text('{notes}')) AS n FROM events",
    "read_csv joined": "SELECT count(*) AS n FROM events, read_csv('{notes}')",
    "read_parquet in a union": "SELECT x FROM read_parquet('{other}') UNION ALL SELECT id FROM events",
    "glob": "SELECT count(*) AS n FROM events, glob('{dir}/*')",
    # getenv exists only in DuckDB's CLI; refused all the same
    "getenv": "SELECT getenv('ARROWLOAD_TEST_SECRET') AS s FROM events",
    "getenv in a where": "SELECT id FROM events WHERE getenv('ARROWLOAD_TEST_SECRET') = 'hunter2' ORDER BY id",
    "parquet_metadata": "SELECT count(*) AS n FROM events, parquet_metadata('{other}')",
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_sandbox_refuses_files_and_environment(events, outside, name):
    query = REFUSED[name].format(notes=outside / "notes.txt", other=outside / "other.parquet", dir=outside)
    with pytest.raises(al.ExternalAccessError) as info:
        al.sql(query, events=events, external_access=False).to_arrow()
    err = info.value
    assert isinstance(err, PermissionError) and isinstance(err, al.ArrowloadError)
    assert "external_access=False" in str(err) and "events" in str(err)
    assert "hunter2" not in str(err) and "secret line" not in str(err)


@pytest.mark.parametrize("statement", [
    "COPY (SELECT * FROM events) TO '{dir}/out.csv'",
    "ATTACH '{dir}/x.db'",
    "INSTALL httpfs",
    "LOAD httpfs",
    "SET enable_external_access = true",
    "EXPORT DATABASE '{dir}/db'",
])
def test_statements_are_refused_and_write_nothing(events, outside, statement):
    before = sorted(os.listdir(outside))
    for access in (False, True):
        with pytest.raises(al.ArrowloadError):
            al.sql(statement.format(dir=outside), events=events, external_access=access).to_arrow()
    assert sorted(os.listdir(outside)) == before


def test_sandbox_cannot_be_switched_off_from_sql(events, outside):
    """A query cannot lift the sandbox: the configuration is locked (its connection's setting
    says so; a sandboxed query may not read settings at all)."""
    from arrowload.scan import duck
    con = duck.connect(external_access=False)
    assert con.sql("SELECT current_setting('enable_external_access')").fetchall() == [(False,)]
    con.close()
    with pytest.raises(al.ExternalAccessError):
        al.sql("SELECT current_setting('enable_external_access') AS on FROM events LIMIT 1",
               events=events, external_access=False)
    with pytest.raises(al.ArrowloadError):
        al.sql("SELECT set_config('enable_external_access', 'true') AS s FROM events",
               events=events, external_access=False).to_arrow()


def test_external_access_must_be_a_bool(events):
    with pytest.raises(al.ArgumentTypeError):
        al.sql("SELECT id FROM events", events=events, external_access="no")


@pytest.fixture(scope="module")
def many_groups(tmp_path_factory) -> str:
    """200,000 ids in 4 files: enough groups that DuckDB aggregates and joins on several
    threads, and returns them in an order that changes from run to run."""
    d = tmp_path_factory.mktemp("many-groups")
    for f in range(4):
        ids = np.arange(f * 50_000, (f + 1) * 50_000)
        pq.write_table(pa.table({"id": ids, "x": (ids % 7).astype(np.float32)}), str(d / f"p{f}.parquet"),
                       row_group_size=20_000)
    return str(d)


@pytest.mark.parametrize("query, key", [
    ("SELECT id % 50000 AS k, count(*) AS n FROM t GROUP BY 1", "k"),
    ("SELECT a.id AS k, b.x FROM t a JOIN t b ON a.id = b.id + 1 WHERE a.id % 3 = 0", "k"),
    ("SELECT DISTINCT id % 40000 AS k FROM t", "k"),
    ("SELECT id % 20000 AS k FROM t UNION SELECT id % 30000 FROM t", "k"),
])
@pytest.mark.parametrize("shuffle", ["none", "global"])
def test_loader_over_unordered_query_has_one_order(many_groups, tmp_path, query, key, shuffle):
    """A loader over a query DuckDB answers in no fixed order (GROUP BY, a join, DISTINCT,
    UNION) reads the same rows in the same places in every build: two ranks (built apart, as
    in two processes) are disjoint and cover DuckDB's answer, a rebuild gives the same
    batches, and a resume in a new loader goes on exactly. Without one order the ranks of
    the GROUP BY overlapped by about 12,000 of its 50,000 rows."""
    con = duckdb.connect()
    con.execute(f"CREATE VIEW t AS SELECT * FROM read_parquet('{many_groups}/*.parquet')")
    expected = np.sort(con.sql(query).fetchnumpy()[key])

    def keys(rank: int, world: int, state=None, stop=None) -> tuple[np.ndarray, dict]:
        loader = al.sql(query, t=al.dataset(many_groups)).loader(
            1000, shuffle=shuffle, seed=0, rank=rank, world_size=world, cache_dir=str(tmp_path))
        if state is not None:
            loader.load_state_dict(state)
        out = []
        with loader:
            for i, b in enumerate(loader, 1):
                out.append(b[key])
                if i == stop:
                    return np.concatenate(out), loader.state_dict()
        return np.concatenate(out), loader.state_dict()

    r0, _ = keys(0, 2)
    r1, _ = keys(1, 2)
    assert len(np.intersect1d(r0, r1)) == 0, "two ranks read the same rows"
    np.testing.assert_array_equal(np.sort(np.concatenate([r0, r1])), expected)
    np.testing.assert_array_equal(keys(0, 2)[0], r0)  # a rebuild: the same order
    whole, _ = keys(0, 1)
    head, state = keys(0, 1, stop=7)
    rest, _ = keys(0, 1, state=state)
    np.testing.assert_array_equal(np.concatenate([head, rest]), whole)


def test_ordered_query_keeps_its_own_order_first(many_groups, tmp_path):
    """The query's ORDER BY leads (ties broken by every column), and a LIMIT without ORDER
    BY keeps the same rows in every build."""
    q = "SELECT id % 997 AS k, count(*) AS n, min(id) AS m FROM t GROUP BY 1 ORDER BY n"
    got = [b["k"] for b in al.sql(q, t=al.dataset(many_groups)).loader(
        100, shuffle="none", cache_dir=str(tmp_path))]
    # a k has 201 or 200 rows: n ties hundreds of times, broken by k
    truth = duckdb.sql(f"SELECT id % 997 AS k, count(*) AS n FROM read_parquet('{many_groups}/*.parquet') "
                       "GROUP BY 1 ORDER BY n, k").fetchnumpy()["k"]
    assert (np.diff(truth) < 0).sum() == 1  # the 200s in k order, then the 201s
    np.testing.assert_array_equal(np.concatenate(got), truth)
    lim = "SELECT id % 50000 AS k, count(*) AS n FROM t GROUP BY 1 LIMIT 5000"
    runs = [np.concatenate([b["k"] for b in al.sql(lim, t=al.dataset(many_groups)).loader(
        1000, shuffle="none", cache_dir=str(tmp_path))]) for _ in range(3)]
    for r in runs[1:]:
        np.testing.assert_array_equal(r, runs[0])


# -- queries the select-project-filter path must leave to DuckDB ------------------------

def _nested_table() -> pa.Table:
    return pa.table({"id": [1, 2, 3, 4], "lst": [[1, 2], [], None, [3, 4, 5]],
                     "st": [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}, None, {"a": 4, "b": "z"}],
                     "k": [10, 20, 30, 40]})


@pytest.mark.parametrize("query", [
    "SELECT id, st.b FROM t",                                    # a struct field, unaliased
    "SELECT id, unnest(lst) AS x FROM t",                        # rows of its own
    "SELECT id, unnest(lst) AS x FROM t WHERE id > 1",
    "SELECT id, generate_subscripts(lst, 1) AS i FROM t",
    "SELECT id, unnest(st) FROM t",                              # a struct's fields as columns
    "SELECT COLUMNS(*) FROM t",                                  # every column
    "SELECT COLUMNS('i.*')::VARCHAR FROM t",
    "SELECT k FROM t LIMIT 50%",                                 # a share of the rows
    "SELECT k FROM t LIMIT 1 PERCENT",
    "SELECT id, [x + 1 FOR x IN lst] AS y FROM t",               # a comprehension's variable
    "SELECT id, [x * i FOR x, i IN lst IF x > 1] AS y FROM t WHERE len(lst) > 0",
])
def test_sql_queries_the_plan_cannot_hold_give_duckdbs_rows(query):
    """Each of these looks like select-project-filter; lowered to arrowload's plan they gave
    an error, one column for several, the input's row count or 50 rows for 50%."""
    t = _nested_table()
    con = duckdb.connect()
    con.register("t", t)
    want = con.sql(query).to_arrow_table()
    got = al.sql(query, t=t)
    table = got.to_arrow()
    assert table.column_names == want.column_names == got.schema.names
    assert sorted(_rows(table), key=_sort_key) == sorted(_rows(want), key=_sort_key)
    assert got.count() == want.num_rows


@pytest.mark.parametrize("expr", ["unnest(lst)", "generate_subscripts(lst, 1)", "unnest(st)", "COLUMNS(*)"])
def test_computed_columns_refuse_expressions_of_several_rows_or_columns(expr):
    """``select(y=...)`` computes one value per row; these were refused only when read, and
    ``count()`` gave the input's rows."""
    ds = al.dataset(_nested_table())
    with pytest.raises(al.ExpressionError, match="al.sql"):
        ds.select("id", y=expr)


def test_list_comprehensions_in_filters_and_computed_columns():
    t = _nested_table()
    ds = al.dataset(t)
    got = ds.filter("len([x FOR x IN lst IF x > 2]) > 0").select("id", y="[x + 1 FOR x IN lst]").to_arrow()
    want = duckdb.sql("SELECT id, [x + 1 FOR x IN lst] AS y FROM t "
                      "WHERE len([x FOR x IN lst IF x > 2]) > 0").to_arrow_table()
    assert got.to_pylist() == want.to_pylist() == [{"id": 4, "y": [4, 5, 6]}]


@pytest.mark.parametrize("order", ["ORDER BY ALL", "ORDER BY ALL DESC"])
def test_order_by_all_feeds_loaders_and_caches(order, tmp_path):
    """A loader's and a cache's query orders its rows fully; ``ORDER BY ALL`` already does,
    and appending keys to it was a syntax error."""
    t = pa.table({"k": [3, 1, 2, 1], "v": [1.0, 2.0, 3.0, 4.0]})
    q = al.sql(f"SELECT k, v FROM t {order}", t=t)
    want = duckdb.sql(f"SELECT k, v FROM t {order}").to_arrow_table().to_pylist()
    assert q.to_arrow().to_pylist() == want
    assert [r for b in q.loader(2, output="arrow") for r in b.to_pylist()] == want
    assert q.cache(tmp_path / "c").to_arrow().to_pylist() == want


def test_a_value_failing_while_the_result_streams_is_an_arrowload_error():
    """DuckDB's error for a cast that fails past its first batches came through pyarrow's
    stream reader as a bare OSError."""
    n = 300_000
    t = pa.table({"k": list(range(n)), "s": ["1"] * (n - 1) + ["x"]})
    with pytest.raises(al.ExpressionError, match="Could not convert string 'x'"):
        al.sql("SELECT k, TRY_CAST(k AS INTEGER) AS k2, CAST(s AS INTEGER) AS v FROM t", t=t).to_arrow()


def test_a_bound_tables_page_checksums_hold_in_queries_duckdb_runs(tmp_path):
    """``with_options(scan=ScanOptions(page_checksums=True))`` after opening: DuckDB read the
    table through datasets built without verification and summed corrupt values."""
    n = 200_000
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"k": np.arange(n), "v": np.arange(n, dtype=np.float64)}), path,
                   compression="none", write_page_checksum=True, row_group_size=50_000)
    data = bytearray(path.read_bytes())
    for off in range(len(data) // 2, len(data) // 2 + 3):
        data[off] ^= 0xFF
    path.write_bytes(bytes(data))
    checked = al.dataset(str(tmp_path)).with_options(scan=al.ScanOptions(page_checksums=True))
    for query in ("SELECT sum(k) AS s FROM t", "SELECT a.k FROM t a JOIN t b USING (k)"):
        with pytest.raises(al.CorruptFileError):
            al.sql(query, t=checked).to_arrow()


@pytest.mark.parametrize("query", ["SELECT k, current_setting('temp_directory') AS d FROM t",
                                   "SELECT t.k, s.name FROM t, duckdb_settings() s"])
def test_the_sandbox_refuses_reading_settings(query):
    """DuckDB's sandbox answers ``current_setting`` and ``duckdb_settings`` (the paths of its
    directories ...); README promises no settings access under ``external_access=False``."""
    t = pa.table({"k": [1]})
    assert al.sql(query, t=t).count() >= 1  # DuckDB's full reach by default
    with pytest.raises(al.ExternalAccessError, match="settings"):
        al.sql(query, external_access=False, t=t)


# -- DuckDB evaluates an expression as it is written ----------------------------------------

def _written_table() -> pa.Table:
    rng = np.random.default_rng(3)
    return pa.table({
        "id": [1, 2, 3],
        "month": ["year", "month", "day"],       # a column named like a date part
        "d1": pa.array([0, 400, 10], pa.int32()).cast(pa.date32()),
        "d2": pa.array([1200, 420, 10], pa.int32()).cast(pa.date32()),
        "s1": ["hello", "abcd", "Ämbar"], "s2": ["HELLO", "abce", "ämbar"],
        "x": rng.random(3) * 100,
        "a": [100, 200, 300],                    # a column named like a struct field
        "ls": [[{"a": 1}, {"a": 2}], [{"a": 3}], []],
    })


@pytest.mark.parametrize("expr", [
    "date_diff(month, d1, d2)",                  # sqlglot made the column the unit 'MONTH'
    "date_trunc(month, d1)",
    "jaro_winkler_similarity(s1, s2, 0.95)",     # the cutoff was dropped, strings upper-cased
    "log2(x)",                                   # became LOG(2, x): last bits differ
    "[e.a FOR e IN ls]",                         # e.a read the column a
])
def test_duckdb_evaluates_what_was_written(expr):
    """Filters, computed columns and al.sql's lowered expressions used to reach DuckDB as
    sqlglot regenerated them, which can mean something else to DuckDB."""
    t = _written_table()
    con = duckdb.connect()
    con.register("t", t)
    want = con.sql(f"SELECT id, {expr} AS v FROM t ORDER BY id").to_arrow_table()
    got = al.dataset(t).select("id", v=expr).to_arrow()
    assert got.column("v").to_pylist() == want.column("v").to_pylist()
    got = al.sql(f"SELECT id, {expr} AS v FROM t WHERE id > 0", t=t).to_arrow().sort_by("id")
    assert got.column("v").to_pylist() == want.column("v").to_pylist()
    first = want.column("v")[0].as_py()
    if isinstance(first, (int, float)):
        kept = al.dataset(t).filter(f"{expr} = {first!r}").to_arrow()["id"].to_pylist()
        assert kept == con.sql(f"SELECT id FROM t WHERE {expr} = {first!r} ORDER BY id").fetchnumpy()["id"].tolist()


@pytest.mark.parametrize("query", [
    "SELECT st.* FROM t",                        # the struct's fields, not every column
    "SELECT t.a FROM t",                         # the table's column a, not the struct t's field
    "SELECT a FROM t WHERE t.a = 10",
    "SELECT q.a, q.t.a AS f FROM t q WHERE q.t.a > 10",
    "SELECT t.a, t.t.a AS f FROM t",
])
def test_qualified_names_resolve_as_in_duckdb(query):
    """A table ``t`` with a column ``a`` and a struct column ``t`` holding a field ``a``."""
    t = pa.table({"a": [1, 2, 3], "t": [{"a": 10}, {"a": 20}, None],
                  "st": [{"x": 1, "y": "p"}, {"x": 2, "y": "q"}, {"x": 3, "y": "r"}]})
    con = duckdb.connect()
    con.register("t", t)
    want = con.sql(query).to_arrow_table()
    got = al.sql(query, t=t)
    table = got.to_arrow()
    assert table.column_names == want.column_names
    assert sorted(_rows(table), key=_sort_key) == sorted(_rows(want), key=_sort_key)
    assert got.count() == want.num_rows


@pytest.mark.parametrize("expr", ["i ^ 2", "s IS NOT NULL", "len(s)", "CAST(i AS VARCHAR)", "i::INT8",
                                  "INTERVAL '1 hour'", "1_000", "substr(s, 1, 1)"])
def test_unaliased_expressions_are_named_as_duckdb_names_them(expr):
    """They were named by binding sqlglot's SQL: ``length(s)`` for ``len(s)``,
    ``CAST(i AS TEXT)`` for ``CAST(i AS VARCHAR)``, ``power(i, 2)`` for ``i ^ 2``."""
    t = pa.table({"i": [1, 2], "s": ["a", None]})
    con = duckdb.connect()
    con.register("t", t)
    query = f"SELECT i, {expr} FROM t"
    assert al.sql(query, t=t).schema.names == con.sql(query).columns


def test_a_union_typed_expression_reads_as_duckdb_gives_it():
    """Arrow cannot concatenate unions: a bare ArrowNotImplementedError('sparse_union')."""
    t = pa.table({"id": [1, 2], "i": pa.array([1, 2], pa.int32())})
    e = "CAST(i AS UNION(a INT, b VARCHAR))"
    want = duckdb.sql(f"SELECT {e} AS v FROM t").to_arrow_table().column("v")
    got = al.dataset(t).select("id", v=e)
    assert got.schema.field("v").type == want.type
    assert got.to_arrow().column("v").to_pylist() == want.to_pylist()


@pytest.mark.parametrize("query", [
    "SELECT *, * FROM t",
    "SELECT t.*, t.* FROM t WHERE a > 1",
    "SELECT *, u.* FROM t AS u",
    "SELECT t.a FROM t AS u",
    "SELECT u.a FROM t AS u WHERE t.a > 15",
    "SELECT u.b, t.a FROM t AS u",
    "SELECT * EXCLUDE (t.a) FROM t AS u",
    "SELECT * EXCLUDE (u.a) FROM t AS u",
])
@pytest.mark.parametrize("struct", [False, True])
def test_stars_and_qualifiers_as_duckdb_binds_them(tmp_path, query, struct):
    """Found by generated queries against DuckDB (review helper): ``SELECT *, *`` gave the
    columns once; under ``FROM t AS u`` the alias hides the table's name, so ``t.a`` is a
    struct column ``t``'s field or an error, where the lowering read the table's ``a``.
    Truth: DuckDB over the same file (its answer, or its refusal)."""
    import pyarrow.parquet as pq
    cols = {"a": pa.array([1, 2, 30], pa.int32()), "b": ["x", "y", "z"]}
    if struct:
        cols["t"] = [{"a": 10}, {"a": 20}, {"a": 5}]
    path = str(tmp_path / "t.parquet")
    pq.write_table(pa.table(cols), path)
    con = duckdb.connect()
    con.execute(f"CREATE VIEW t AS SELECT * FROM read_parquet('{path}')")
    try:
        want = con.sql(query).arrow()
    except duckdb.Error:
        with pytest.raises(al.ArrowloadError):
            al.sql(query, t=al.dataset(path)).to_arrow()
        return
    if hasattr(want, "read_all"):
        want = want.read_all()
    got = al.sql(query, t=al.dataset(path)).to_arrow()
    assert got.column_names == want.column_names
    assert sorted(map(str, got.to_pylist())) == sorted(map(str, want.to_pylist()))


@pytest.mark.parametrize("query", [
    "SELECT id, date_diff(month, d, DATE '2024-01-01') AS v, FROM t",
    "SELECT id, FROM t WHERE date_diff(month, d, DATE '2024-01-01') < 0",
])
def test_a_trailing_comma_keeps_the_expressions_as_written(tmp_path, query):
    """DuckDB accepts a trailing comma in the select list; the lowering then lost every
    expression's text as written and evaluated sqlglot's regenerated SQL, where
    ``date_diff(month, ...)`` over a column ``month`` reads the unit 'MONTH'. Truth: DuckDB."""
    import datetime as dt

    import pyarrow.parquet as pq
    path = str(tmp_path / "t.parquet")
    pq.write_table(pa.table({"id": [1, 2, 3], "month": ["year", "day", "hour"],
                             "d": [dt.date(2024, 3, 1), dt.date(2023, 1, 1), dt.date(2024, 1, 2)]}), path)
    con = duckdb.connect()
    con.execute(f"CREATE VIEW t AS SELECT * FROM read_parquet('{path}')")
    want = sorted(con.sql(query).fetchall())
    got = al.sql(query, t=al.dataset(path)).to_arrow()
    assert sorted(tuple(r.values()) for r in got.to_pylist()) == want


def test_types_duckdb_reads_only_cast_or_not_at_all(tmp_path):
    """float16 columns reach DuckDB as float (exact, as DuckDB reads Parquet FLOAT16); a
    filter on a UUID column runs in DuckDB, not as a pyarrow expression pushed into a
    dataset (no kernel for the extension type); decimal256, which DuckDB cannot read, is
    an UnsupportedError naming the column. All three leaked DuckDB's or pyarrow's own
    exceptions."""
    import uuid
    import duckdb
    import numpy as np
    ids = [uuid.UUID(int=i * 7919 + 1) for i in range(6)]
    table = pa.table({"id": pa.array(range(6), pa.int64()),
                      "h": pa.array(np.array([1.5, -2.0, 7.25, 65504, 0.099975586, 3], np.float16)),
                      "u": pa.array([None if i == 2 else ids[i].bytes for i in range(6)], pa.uuid())})
    path = str(tmp_path / "t.parquet")
    pq.write_table(table, path)
    truth = table.set_column(1, "h", table["h"].cast(pa.float32()))
    con = duckdb.connect()
    con.register("truth", truth)
    d = al.dataset(path)
    for q in ["SELECT id, h FROM t WHERE h > 1 ORDER BY id", "SELECT sum(h) AS s, count(u) AS n FROM t",
              "SELECT id FROM t WHERE u IS NOT NULL AND id > 0 ORDER BY id", "SELECT u FROM t ORDER BY id"]:
        got = al.sql(q, t=d).to_arrow()
        want = con.sql(q.replace("FROM t", "FROM truth")).to_arrow_table()
        assert got.to_pylist() == want.to_pylist(), q
    wide = str(tmp_path / "wide.parquet")
    import decimal
    pq.write_table(pa.table({"id": [0, 1], "x": pa.array([decimal.Decimal(1), None], pa.decimal256(50, 2))}), wide)
    assert al.sql("SELECT x FROM t", t=al.dataset(wide)).to_arrow().equals(pq.read_table(wide).select(["x"]))
    for q in ["SELECT max(x) AS m FROM t", "SELECT count(*) FROM t WHERE x IS NOT NULL"]:  # run in DuckDB
        with pytest.raises(al.UnsupportedError, match=r"t\.x \(decimal256\(50, 2\)\)"):
            al.sql(q, t=al.dataset(wide)).to_arrow()
    assert al.sql("SELECT id FROM t", t=al.dataset(wide).select("id")).to_arrow()["id"].to_pylist() == [0, 1]
