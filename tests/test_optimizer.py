"""The optimizer, rule by rule: golden before/after plans, identity where a rule does not
apply, and the same rows whichever rules run.

Each rule in ``arrowload.optimize.RULES`` is applied alone to a hand-built plan; the
golden form is ``arrowload.plan.explain.render_tree`` (plus, for the pruning rules, the
files / row groups each scan keeps and the rule's note). Every golden case is also
executed before and after the rewrite and must give the same rows; at the Dataset level
every query gives the same rows as the unoptimized plan with every rule on and with each
rule switched off alone.
"""

from __future__ import annotations

import dataclasses
import importlib
import re

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds
import pytest

import arrowload as al
from arrowload.datagen import write_lake
from arrowload.optimize import (RULES, prune_limit, prune_partitions, prune_row_groups,
                                pushdown_limit, pushdown_predicates, pushdown_projection)
from arrowload.options import Options
from arrowload.plan.explain import render_scan_stats, render_tree
from arrowload.plan.expr import PolarsExpr, SqlExpr, make_expr
from arrowload.plan.nodes import Filter, Limit, Map, Project, Scan, scans
from arrowload.scan import execute
from arrowload.source import open_source
from _support import CountingLocalFileSystem, lake_facts

TABLE = pa.table({"a": pa.array([1, 2, 3, 4, 5, 6], pa.int64()),
                  "b": [10.0, 20.0, 30.0, 40.0, 50.0, 60.0],
                  "c": ["x", "y", "z", "x", "y", "z"]})
MEM = "Scan memory memory table (6 rows)"


def mem_scan(**kw) -> Scan:
    return Scan(open_source(TABLE), **kw)


def sql(text: str, plan) -> object:
    return make_expr(text, plan.schema)


def cols(*names):
    return tuple((n, SqlExpr.column(n)) for n in names)


def udf_filter(schema):
    """A polars predicate arrowload cannot translate to SQL (a Python UDF): it must run
    in polars above the scan."""
    e = make_expr(pl.col("b").map_batches(lambda s: s, return_dtype=pl.Float64) > 15,
                  schema, "filter")
    assert isinstance(e, PolarsExpr) and not e.pushable
    return e


def udf_column(schema):
    e = make_expr(pl.col("b").map_batches(lambda s: s * 2, return_dtype=pl.Float64),
                  schema, "select(p=...)")
    assert isinstance(e, PolarsExpr)
    return e


def identity_map(batch):
    return batch


def golden(plan, lake: str | None = None, *, stats: bool = False) -> str:
    """The golden text: the tree, polars expressions shown as ``<polars>``, a lake's path
    as ``<lake>``; with ``stats``, each scan's kept files / row groups / columns and the
    pruning rules' notes (byte figures left out: they depend on the compressor)."""
    lines = render_tree(plan)
    if stats:
        for s in scans(plan):
            lines += [ln for ln in render_scan_stats(s)
                      if not ln.lstrip().startswith(("bytes", "rows"))]
    text = "\n".join(lines)
    text = re.sub(r"polars\(.*\)", "<polars>", text)
    if lake is not None:
        text = text.replace(lake, "<lake>")
    return text


def rows(plan) -> pa.Table:
    """Execute a plan as it is (no optimization)."""
    return execute.to_table(plan, Options())


def assert_same_rows(before, after):
    a, b = rows(before), rows(after)
    assert a.schema.equals(b.schema), f"{a.schema}\n--- vs ---\n{b.schema}"
    assert a.equals(b), f"rewrite changed the rows:\n{a}\n--- vs ---\n{b}"


# ---------------------------------------------------------------------------
# golden cases over an in-memory table: (rule, before, golden after)


def _cases():
    s = mem_scan()
    sch = s.schema
    computed = Project(s, cols("a") + (("d", make_expr("a * 2", sch)),))
    flagged = Project(s, cols("a") + (("big", make_expr("a > 2", sch)),))
    renamed = Project(s, (("x", make_expr("a", sch)),))
    with_udf = Project(s, cols("a") + (("p", udf_column(sch)),))
    return [
        # -- predicate pushdown
        ("filter through a computed column (SQL substitution)", pushdown_predicates,
         Filter(computed, sql("d > 4", computed)),
         f'Project [a, d := "a" * 2 [duckdb]]\n  Filter [duckdb] ("a" * 2) > 4\n    {MEM}'),
        ("filter through a computed boolean column goes into the scan", pushdown_predicates,
         Filter(flagged, sql("big", flagged)),
         f'Project [a, big := "a" > 2]\n  {MEM} filter=("a" > 2)'),
        ("filter through a rename", pushdown_predicates,
         Filter(renamed, sql("x > 2", renamed)),
         f'Project [x := "a"]\n  {MEM} filter="a" > 2'),
        ("stacked filters merge into the scan", pushdown_predicates,
         Filter(Filter(s, sql("a > 1", s)), sql("b < 50", s)),
         f'{MEM} filter=("a" > 1) AND ("b" < 50)'),
        ("polars filter stays above the scan, the SQL conjunct goes in", pushdown_predicates,
         Filter(Filter(s, udf_filter(sch)), sql("a < 5", s)),
         f'Filter <polars>\n  {MEM} filter="a" < 5'),
        ("pyarrow expression pushed into the scan", pushdown_predicates,
         Filter(s, make_expr(pc.field("a") > 2, sch)),
         f"{MEM} filter=(a > 2)"),
        ("conjunct over a polars-computed column stays above the projection",
         pushdown_predicates,
         Filter(with_udf, sql("a > 1 AND p > 50", with_udf)),
         f'Filter "p" > 50\n  Project [a, p := <polars>]\n    {MEM} filter="a" > 1'),
        # -- limit pushdown
        ("limit through a projection", pushdown_limit,
         Limit(Project(s, cols("a", "b")), 3),
         f"Project [a, b]\n  {MEM} limit=3"),
        ("nested limits take the smallest", pushdown_limit,
         Limit(Limit(Limit(s, 5), 2), 4),
         f"{MEM} limit=2"),
        ("limit over a project over a limit", pushdown_limit,
         Limit(Project(Limit(s, 5), cols("c")), 2),
         f"Project [c]\n  {MEM} limit=2"),
        ("limit after a pushed filter counts filtered rows", pushdown_limit,
         Limit(mem_scan(predicate=sql("a > 2", s)), 2),
         f'{MEM} filter="a" > 2 limit=2'),
        # -- projection pushdown
        ("projection fused into the scan", pushdown_projection,
         Project(s, cols("c", "a")),
         f"{MEM} project=[c, a]"),
        ("unused columns dropped, computed column fused", pushdown_projection,
         Project(Project(s, cols("a", "b") + (("e", make_expr("b > 1", sch)),)), cols("e")),
         f'{MEM} project=[e := "b" > 1]'),  # (the picked column folded into the scan's projection)
        ("a column DuckDB computes stays above the scan", pushdown_projection,
         Project(Project(s, cols("a", "b") + (("e", make_expr("b + 1", sch)),)), cols("e")),
         f'Project [e]\n  Project [e := "b" + 1 [duckdb]]\n    {MEM} columns=[b]'),
        ("the scan reads what a filter above it needs", pushdown_projection,
         Project(Filter(s, udf_filter(sch)), cols("a")),
         f"Project [a]\n  Filter <polars>\n    {MEM} columns=[a, b]"),
        ("a map's declared columns", pushdown_projection,
         Map(s, identity_map, ("b",), pa.schema([("b", pa.float64())])),
         f"Map identity_map columns=[b]\n  {MEM} columns=[b]"),
        ("a polars column stays above, its inputs are read", pushdown_projection,
         with_udf,
         f"Project [a, p := <polars>]\n  {MEM} columns=[a, b]"),
    ]


CASES = _cases()


@pytest.mark.parametrize("name, rule, before, after", CASES, ids=[c[0] for c in CASES])
def test_golden_rewrite(name, rule, before, after):
    out = rule(before)
    assert golden(out) == after
    assert out is not before
    assert_same_rows(before, out)


def _identity_cases():
    s = mem_scan()
    sch = s.schema
    mapped = Map(s, identity_map, None, TABLE.schema)
    return [
        ("filter not pushed past a limit", pushdown_predicates,
         Filter(Limit(s, 3), sql("a > 1", s))),
        ("filter not pushed past a map", pushdown_predicates,
         Filter(mapped, sql("a > 1", s))),
        ("filter not pushed into a scan with a limit", pushdown_predicates,
         Filter(mem_scan(limit=3), sql("a > 1", s))),
        ("only a polars filter: nothing to push", pushdown_predicates,
         Filter(s, udf_filter(sch))),
        ("no filter", pushdown_predicates, Project(s, cols("a"))),
        ("limit not pushed past a residual filter", pushdown_limit,
         Limit(Filter(s, udf_filter(sch)), 2)),
        ("limit not pushed past a map", pushdown_limit, Limit(mapped, 2)),
        ("no limit", pushdown_limit, Filter(s, sql("a > 1", s))),
        ("bare scan: nothing to prune", pushdown_projection, s),
        ("a map reading every column", pushdown_projection, mapped),
        ("filter and limit over a map reading every column", pushdown_projection,
         Limit(Filter(mapped, sql("a > 1", s)), 2)),
        ("a scan already reading exactly what a map needs", pushdown_projection,
         Map(mem_scan(columns=("b",)), identity_map, ("b",), pa.schema([("b", pa.float64())]))),
        ("a filter over a scan reading every column", pushdown_projection,
         Filter(s, sql("a > 1", s))),
    ]


IDENTITY = _identity_cases()


@pytest.mark.parametrize("name, rule, plan", IDENTITY, ids=[c[0] for c in IDENTITY])
def test_rule_that_does_not_apply_returns_its_input(name, rule, plan):
    assert rule(plan) is plan


def test_every_rule_is_identity_on_a_bare_scan():
    s = mem_scan()
    for _, rule in RULES:
        assert rule(s) is s, rule.__name__


# ---------------------------------------------------------------------------
# pruning rules over real files


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    """2 shards x 4 row groups of 500 rows, ids ascending."""
    path = str(tmp_path_factory.mktemp("opt_lake"))
    write_lake(path, rows=4000, shards=2, row_group_size=500, emb_dim=4, features=2)
    return path


@pytest.fixture(scope="module")
def hive(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("opt_hive"))
    write_lake(path, rows=4000, shards=2, row_group_size=500, emb_dim=4, features=2,
               partition_by="country")
    return path


def file_scan(root, **kw):
    src = open_source(root)
    fixed = {k: (make_expr(v, src.schema, "filter") if k == "predicate" else v)
             for k, v in kw.items()}
    return Scan(src, **fixed)


def test_prune_row_groups_golden(lake):
    before = file_scan(lake, predicate="id < 700")
    after = prune_row_groups(before)
    n = len(before.source.schema)
    assert golden(after, lake, stats=True) == "\n".join([
        'Scan parquet <lake> filter="id" < 700',
        "  files       1 of 2",
        "  row groups  2 of 8",
        f"  columns     {n} of {n} read: " + ", ".join(before.source.schema.names),
        "  row_group_pruning  row groups 8 -> 2",
    ])
    # the truth: row groups whose id statistics admit id < 700
    facts = lake_facts(lake)
    truth = [(p, rg) for p, f in facts.items() for rg in range(f.num_row_groups)
             if f.stats("id", rg).min < 700]
    assert [(u.path, u.row_group) for u in after.selected_units()] == truth
    assert_same_rows(before, after)


def test_prune_row_groups_keeps_null_rows_for_is_null(lake):
    before = file_scan(lake, predicate="score IS NULL")
    after = prune_row_groups(before)
    assert_same_rows(before, after)
    assert rows(after).num_rows > 0


def test_prune_partitions_golden(hive):
    before = file_scan(hive, predicate="country IN ('DE', 'FR') AND label = 1")
    after = prune_partitions(before)
    n_files = len(lake_facts(hive))
    text = golden(after, hive, stats=True)
    assert text.splitlines()[0] == \
        "Scan parquet <lake> filter=\"country\" IN ('DE', 'FR') AND \"label\" = 1"
    assert f"  files       4 of {n_files}" in text
    assert f"  partition_pruning  files {n_files} -> 4" in text
    kept = {u.path for u in after.selected_units()}
    assert kept == {p for p in lake_facts(hive) if "/country=DE/" in p or "/country=FR/" in p}
    assert_same_rows(before, after)


def test_prune_partitions_null_partition(hive):
    before = file_scan(hive, predicate="country IS NULL")
    after = prune_partitions(before)
    kept = {u.path for u in after.selected_units()}
    assert kept and all("__HIVE_DEFAULT_PARTITION__" in p for p in kept)
    assert_same_rows(before, after)


def test_prune_limit_golden(lake):
    before = file_scan(lake, limit=600)
    after = prune_limit(before)
    assert golden(after, lake, stats=True).splitlines()[1:3] == [
        "  files       1 of 2", "  row groups  2 of 8"]
    assert ("limit_pushdown", "units 8 -> 2 (limit 600)") in after.notes
    assert_same_rows(before, after)


@pytest.mark.parametrize("where", ["id < 700", "id >= 0", "label = 1"])
def test_a_loader_prunes_row_groups_once(lake, tmp_path, monkeypatch, where):
    """Building a loader optimizes its plan, then its count plan (the optimized plan again,
    under an empty projection): the footers' statistics are evaluated once, and the second
    pruning gives what the first did."""
    prg = importlib.import_module("arrowload.optimize.prune_row_groups")  # the module, not the rule
    calls = []
    kept = prg._kept
    monkeypatch.setattr(prg, "_kept", lambda scan, units: calls.append(len(units)) or kept(scan, units))
    ds = al.dataset(lake).filter(where)
    with ds.loader(64, cache_dir=str(tmp_path)) as loader:
        rows = loader.num_rows
        units = loader._source.units
    assert calls == [8]
    want = pds.dataset(lake).to_table(filter=SqlExpr.parse(where, ds.schema).to_arrow(ds.schema, predicate=True))
    assert rows == want.num_rows
    assert len(units) == len(prune_row_groups(file_scan(lake, predicate=where)).selected_units())


def test_pruning_rules_identity(lake, hive):
    cases = [
        (prune_partitions, file_scan(hive, predicate="label = 1")),    # not a partition column
        (prune_partitions, file_scan(lake, predicate="id < 700")),     # no partitions
        (prune_partitions, file_scan(hive, predicate="country <> 'ZZ' OR country IS NULL")),
        (prune_row_groups, file_scan(lake, predicate="id >= 0")),      # keeps all
        (prune_row_groups, file_scan(lake)),                          # no predicate
        (prune_row_groups, mem_scan(predicate=sql("a > 1", mem_scan()))),  # no statistics
        (prune_limit, file_scan(lake, limit=4000)),                   # needs every unit
        (prune_limit, file_scan(lake, predicate="id > 5", limit=3)),  # filter: unknown counts
        (prune_limit, file_scan(lake)),                               # no limit
    ]
    for rule, plan in cases:
        assert rule(plan) is plan, (rule.__name__, golden(plan))


# ---------------------------------------------------------------------------
# optimized vs unoptimized over the Dataset API, each rule switched off alone

FLAGS = sorted({flag for flag, _ in RULES} | {"metadata_count"})


def queries(ds, hive_ds):
    return {
        "filter+select": ds.filter("id BETWEEN 900 AND 2600 AND label = 1").select(
            "id", "f1", twice="f0 * 2"),
        "computed filter": ds.select("id", d="id * 3").filter("d < 1500"),
        "limit through select": ds.select("id", "country").limit(777),
        "nested limits": ds.limit(1200).limit(600).select("id"),
        "filter over limit": ds.limit(1000).filter("id > 400"),
        "polars udf + sql": ds.filter(pl.col("f0").map_batches(lambda s: s, return_dtype=pl.Float32) > 0)
                              .filter("id < 2000").select("id", "f0"),
        "map": ds.select("id", "f0").map(lambda b: b, name="ident").filter("id < 100"),
        "partitions": hive_ds.filter("country = 'DE' AND id < 3000").select("id", "country"),
        "partition null": hive_ds.filter("country IS NULL").select("id"),
        "head-like": ds.filter("id >= 3900").limit(5),
    }


@pytest.mark.parametrize("flag", FLAGS)
def test_each_rule_off_gives_the_same_rows(lake, hive, flag):
    ds, hive_ds = al.dataset(lake), al.dataset(hive)
    none = al.OptimizerOptions.none()
    off = al.OptimizerOptions(**{flag: False})
    for name, q in queries(ds, hive_ds).items():
        full = q.to_arrow()
        assert full.equals(q.with_options(optimizer=none).to_arrow()), name
        assert full.equals(q.with_options(optimizer=off).to_arrow()), (name, flag)
        assert q.count() == q.with_options(optimizer=off).count() \
            == q.with_options(optimizer=none).count() == full.num_rows, (name, flag)


def test_queries_match_plain_pyarrow(lake, hive):
    ds, hive_ds = al.dataset(lake), al.dataset(hive)
    q = queries(ds, hive_ds)
    base = pds.dataset(lake, format="parquet")
    t = base.to_table(filter=pc.field("id").isin(list(range(900, 2601))) & (pc.field("label") == 1),
                      columns=["id", "f1", "f0"])
    got = q["filter+select"].to_arrow()
    assert got.column("id").equals(t.column("id"))
    assert got.column("twice").equals(pc.multiply(t.column("f0"), pa.scalar(2, pa.float32())))
    assert q["limit through select"].to_arrow().equals(base.head(777, columns=["id", "country"]))
    assert q["filter over limit"].to_arrow().equals(
        base.head(1000).filter(pc.field("id") > 400))
    h = pds.dataset(hive, format="parquet", partitioning="hive").to_table(
        filter=(pc.field("country") == "DE") & (pc.field("id") < 3000), columns=["id", "country"])
    assert q["partitions"].to_arrow().sort_by("id").equals(h.sort_by("id"))


# ---------------------------------------------------------------------------
# explain


def test_explain_shows_before_after_rules_and_kept_vs_total(lake):
    facts = lake_facts(lake)
    fs = CountingLocalFileSystem()
    ds = al.dataset(lake, filesystem=fs)
    sel = ds.filter("id < 700").select("id", "f0")
    text = sel.explain()

    # computing explain read footers only: two tail reads per file (pyarrow's, and the
    # footer check's: arrowload/source/footer.py), no data page
    for r in fs.stats.reads:
        assert facts[r.path].is_footer_read(r), r
    assert sorted(r.path for r in fs.stats.reads) == sorted(2 * list(facts))

    before = text.split("== optimized plan ==")[0]
    assert before.splitlines()[1:] == [
        "Project [id, f0]", '  Filter "id" < 700', f"    Scan parquet {lake}", ""]
    assert f'Scan parquet {lake} project=[id, f0] filter="id" < 700' in text
    assert "  applied: predicate_pushdown, projection_pushdown, row_group_pruning" in text
    assert "switched off" not in text

    kept = [(f, rg) for f in facts.values() for rg in range(f.num_row_groups)
            if f.stats("id", rg).min < 700]
    total_rgs = sum(f.num_row_groups for f in facts.values())
    assert f"  files       1 of {len(facts)}" in text
    assert f"  row groups  {len(kept)} of {total_rgs}" in text
    assert f"  columns     2 of {len(ds.schema)} read: id, f0" in text
    kept_b = sum(f.chunk_bytes({"id", "f0"}, [rg]) for f, rg in kept)
    total_b = sum(f.chunk_bytes() for f in facts.values())
    m = re.search(r"bytes\s+~([\d.]+) (B|KiB|MiB) of ([\d.]+) (B|KiB|MiB) ", text)
    assert m, text
    scale = {"B": 1, "KiB": 1024, "MiB": 1024 ** 2}
    assert float(m.group(1)) * scale[m.group(2)] == pytest.approx(kept_b, rel=0.01, abs=1)
    assert float(m.group(3)) * scale[m.group(4)] == pytest.approx(total_b, rel=0.01)
    assert f"  rows        {500 * len(kept):,} before the filter" in text

    # running the query reads the kept row groups' id and f0 chunks (pyarrow's pre_buffer
    # also reads across holes of up to 8 KiB between them), inside those row groups only
    fs.reset()
    sel.to_arrow()
    spans = [(f.path, *f.row_group_range(rg)) for f, rg in kept]
    for r in fs.stats.reads:
        assert any(p == r.path and s <= r.offset and r.offset + r.nbytes <= e
                   for p, s, e in spans), r
    assert kept_b <= fs.stats.bytes_read <= sum(f.pre_buffer_bytes({"id", "f0"}, [rg])
                                                 for f, rg in kept)


def test_explain_names_switched_off_rules(lake):
    ds = al.dataset(lake).with_options(
        optimizer=al.OptimizerOptions(row_group_pruning=False, limit_pushdown=False))
    text = ds.filter("id < 700").limit(3).explain()
    assert "  switched off: limit_pushdown, row_group_pruning" in text
    assert "  row_group_pruning " not in text and "  limit_pushdown " not in text  # no notes of theirs
    assert "  row groups  8 of 8" in text
    assert "  applied: predicate_pushdown" in text
    # the limit stays a node of its own when its pushdown is off
    after = text.split("== optimized plan ==")[1].split("==")[0]
    assert after.splitlines()[1:3] == ["Limit 3", f'  Scan parquet {lake} filter="id" < 700']


def test_explain_everything_off(lake):
    ds = al.dataset(lake).with_options(optimizer=al.OptimizerOptions.none())
    text = ds.filter("id < 700").select("id").explain()
    assert "  applied: none" in text
    assert "switched off: " + ", ".join(f.name for f in dataclasses.fields(al.OptimizerOptions)) in text
    before, after = text.split("== optimized plan ==")
    assert before.split("\n", 1)[1].strip() == after.split("==")[0].strip()


def test_explain_of_head_shows_limit_pruning(lake):
    text = al.dataset(lake).limit(5).explain()
    assert "limit_pushdown     units 8 -> 1 (limit 5)" in text
    assert "  row groups  1 of 8" in text
    assert "applied: limit_pushdown" in text
