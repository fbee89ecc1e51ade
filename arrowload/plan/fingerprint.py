"""The plan fingerprint: a digest of what a plan computes, from the plan's data.

Loader states and the loader's caches (selection index, random-access cache) are keyed by
it, so it must not change when nothing that matters changed: not with how ``explain()``
prints plans, not with how a path was spelled (``lake/``, ``/abs/lake/``, ``/abs//lake``),
not with the spelling of SQL (case of keywords and unquoted names, spaces, parentheses
sqlglot drops). It changes when the data or the computation change. Specified in
``formats/plan_fingerprint/v1/spec.md``, pinned by the golden vectors next to it: a change
in the digest is a deliberate version bump, never an accident.

The digest is SHA-256 over a canonical JSON document (sorted keys, no whitespace, ASCII)
built from each node's kind and fields:

- expressions: SQL as its sqlglot syntax tree (DuckDB dialect) with identifiers normalized
  and parentheses dropped (the tree's shape holds the precedence); a simple filter's tree
  (``simplesql``, parsed without sqlglot) has the same shape and gives the same data; pyarrow and polars
  expressions as their libraries print them and the SHA-256 of their serialized bytes
  (the printed form elides long value lists);
- sources: format (``kind``), schema and hive partition schema; with ``data=True`` also the
  source's own snapshot identity (``Source.fingerprint()``: for files the canonical
  absolute paths with sizes and modification times, and what else the filesystem offers);
- maps: the ``name`` given to ``Dataset.map`` (or the function's qualified name when there
  is none: unnamed maps are never reused from a cache), their columns and output schema.

No ``hash()``, no ``repr`` of objects: the same plan gives the same digest in every
process and Python version.

>>> import pyarrow as pa, arrowload as al
>>> a = al.dataset(pa.table({"x": [1, 2]})).filter("X > 1")
>>> b = al.dataset(pa.table({"x": [3]})).filter("x>1")
>>> plan_fingerprint(a.plan, data=False) == plan_fingerprint(b.plan, data=False)
True
"""

from __future__ import annotations

import hashlib
import json
import pickle
from typing import Any

import pyarrow as pa

from .expr import AndExpr, ArrowExpr, Expr, PolarsExpr, SqlExpr
from .nodes import Filter, Limit, Map, Plan, Project, Scan, SqlQuery
from .simplesql import isa

FORMAT = "arrowload.plan_fingerprint"
VERSION = 1
_DIALECT = "duckdb"


def plan_fingerprint(plan: Plan, *, data: bool = True) -> str:
    """32 hex digits identifying what ``plan`` computes. ``data=False`` leaves the sources'
    snapshot identity out (the digest then names the computation over sources of that
    format and schema; loader states keep the snapshot in a field of its own)."""
    return digest(canonical(plan, data=data))


def digest(doc: Any) -> str:
    """SHA-256 (first 32 hex digits) of ``doc`` as canonical JSON."""
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(f"{FORMAT}/v{VERSION}\n{text}".encode()).hexdigest()[:32]


def canonical(plan: Plan, *, data: bool = True) -> dict:
    """The plan as plain JSON data: what the digest is computed from."""
    if isinstance(plan, Scan):
        return {"node": "scan", "source": source_doc(plan.source, data=data),
                "columns": _names(plan.columns), "predicate": _expr(plan.predicate),
                "projection": _items(plan.projection), "limit": plan.limit,
                "units": list(plan.units) if plan.units is not None else None}
    if isinstance(plan, Filter):
        return {"node": "filter", "predicate": _expr(plan.predicate), "child": canonical(plan.child, data=data)}
    if isinstance(plan, Project):
        return {"node": "project", "items": _items(plan.items), "child": canonical(plan.child, data=data)}
    if isinstance(plan, Map):
        fn = plan.fn
        qualname = getattr(fn, "__qualname__", type(fn).__name__)
        code = None if plan.name else f"{getattr(fn, '__module__', '')}.{qualname}"
        return {"node": "map", "name": plan.name or None, "fn": code, "columns": _names(plan.columns),
                "output_schema": _schema(plan.output_schema) if plan.output_schema is not None else None,
                "child": canonical(plan.child, data=data)}
    if isinstance(plan, Limit):
        return {"node": "limit", "n": int(plan.n), "child": canonical(plan.child, data=data)}
    if isinstance(plan, SqlQuery):
        return {"node": "sql", "query": canonical_sql(plan.query),
                "tables": [[n.lower(), canonical(t, data=data)] for n, t in zip(plan.names, plan.tables)]}
    # A node kind this version does not know: its printed form (documented fallback).
    from .explain import describe_node
    return {"node": type(plan).__name__, "text": describe_node(plan),
            "children": [canonical(c, data=data) for c in plan.children]}


def source_doc(source, *, data: bool = True) -> dict:
    doc = {"kind": source.kind, "schema": _schema(source.schema),
           "partitions": _schema(source.partition_schema)}
    if data:
        doc["snapshot"] = source.fingerprint()
    return doc


def canonical_sql(text: str) -> Any:
    """SQL text as its syntax tree (see ``sql_tree``): ``select A from T`` and
    ``SELECT a FROM (t)`` give the same data. Text sqlglot cannot parse is kept as it is."""
    from sqlglot import parse_one
    from sqlglot.errors import SqlglotError
    try:
        tree = parse_one(text, dialect=_DIALECT)
    except (SqlglotError, ValueError):
        return text
    return sql_tree(tree)


def sql_tree(tree, resolved: bool = False) -> Any:
    """A sqlglot tree (or a simple one, ``simplesql``: the same data) as plain data:
    ``[kind, {arg: value}]`` with arguments sorted, quoting and parentheses dropped (the
    tree's shape already holds the precedence they spelled). Unless ``resolved`` (names
    already bound to real column names), identifiers are normalized as DuckDB resolves
    them (case-insensitively: lower case), except output aliases, whose case names the
    result's columns."""
    if resolved:  # names already bound to the schema's columns: exact, nothing to normalize
        return _node(tree)  # read only: no copy, and no sqlglot for a simple tree
    from sqlglot import exp
    from sqlglot.optimizer.normalize_identifiers import normalize_identifiers
    tree = tree.copy()
    for alias in tree.find_all(exp.Alias):  # an alias names an output column: its case stays
        ident = alias.args.get("alias")
        if isinstance(ident, exp.Identifier):
            ident.meta["case_sensitive"] = True
    return _node(normalize_identifiers(tree, dialect=_DIALECT))


def _node(node: Any) -> Any:
    if isa(node, "Paren"):
        return _node(node.this)
    if isa(node, "Expression"):  # sqlglot's nodes and simplesql's alike
        args = {}
        for key in sorted(node.args):
            if key == "quoted" and isa(node, "Identifier"):
                continue
            value = node.args[key]
            if value is None or value is False or (isinstance(value, list) and not value):
                continue
            args[key] = _node(value)
        return [node.key, args]
    if isinstance(node, list):
        return [_node(v) for v in node]
    if isinstance(node, (bool, int, str)):
        return node
    return str(node)


def _expr(e: Expr | None) -> Any:
    if e is None:
        return None
    if isinstance(e, AndExpr):
        return {"and": [_expr(p) for p in e.parts]}
    if isinstance(e, SqlExpr):  # the planner's tree: simple or sqlglot's, the same data
        return {"sql": sql_tree(e.node, resolved=True)}
    tree = getattr(e, "tree", None)
    if tree is not None and isa(tree, "Expression"):
        return {"sql": sql_tree(tree, resolved=True)}
    if isinstance(e, ArrowExpr):
        return {"arrow": str(e.expr), "exact": _exact(lambda: pickle.dumps(e.expr))}
    if isinstance(e, PolarsExpr):
        return {"polars": str(e.expr), "exact": _exact(lambda: e.expr.meta.serialize(format="json").encode())}
    return {type(e).__name__: str(e)}


def expr_key(e: Expr | None) -> str:
    """32 hex digits naming what expression ``e`` computes (as in the fingerprint): equal
    for the same SQL spelled differently, different for different expressions -- pyarrow
    and polars expressions included, whose printed forms elide long value lists."""
    return digest(_expr(e))


def _exact(dump) -> str | None:
    """SHA-256 of a pyarrow / polars expression's serialized bytes: what the printed form
    leaves out (``is_in`` prints the first and last 10 of a longer value set); None where
    the library cannot serialize it."""
    try:
        return hashlib.sha256(dump()).hexdigest()
    except Exception:  # noqa: BLE001 - an expression its library does not serialize (a UDF)
        return None


def _items(items) -> list | None:
    return None if items is None else [[name, _expr(e)] for name, e in items]


def _names(names) -> list | None:
    return None if names is None else list(names)


def _schema(schema: pa.Schema) -> list:
    return [[f.name, str(f.type), bool(f.nullable)] for f in schema]
