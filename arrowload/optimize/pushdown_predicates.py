"""Predicate pushdown: move filters down through projections and into the scan.

A filter over a projection is rewritten in terms of the projection's inputs (SQL
expressions substitute exactly; pyarrow / polars expressions pass only through columns
that keep their names). Conjuncts pyarrow evaluates exactly as DuckDB does
(``plan.pushable``) enter the Scan, where they also drive partition and row-group
pruning; the rest stay as a Filter right above it, evaluated by DuckDB per batch.
Filters never cross a Limit or a Map.
"""

from __future__ import annotations

from ..plan.expr import conjoin, conjuncts
from ..plan.nodes import Filter, Plan, Project, Scan, transform_up


def _push(node: Filter) -> Plan:
    child = node.child
    if isinstance(child, Filter):
        return _push(Filter(child.child, conjoin(conjuncts(child.predicate) + conjuncts(node.predicate))))
    if isinstance(child, Project):
        mapping = child.mapping
        moved, kept = [], []
        for c in conjuncts(node.predicate):
            sub = c.substitute(mapping)
            (moved if sub is not None else kept).append(sub if sub is not None else c)
        if not moved:
            return node
        inner = _push(Filter(child.child, conjoin(moved)))
        out: Plan = Project(inner, child.items)
        rest = conjoin(kept)
        return Filter(out, rest) if rest is not None else out
    if isinstance(child, Scan) and child.limit is None and child.projection is None:
        parts = conjuncts(node.predicate)
        schema = child.source.schema
        pushable = [c for c in parts if c.pushable_on(schema)]
        if not pushable:
            return node
        existing = conjuncts(child.predicate) if child.predicate is not None else []
        scan = child.replace(predicate=conjoin(existing + pushable))
        rest = conjoin([c for c in parts if not c.pushable_on(schema)])
        return Filter(scan, rest) if rest is not None else scan
    return node


def pushdown_predicates(plan: Plan) -> Plan:
    return transform_up(plan, lambda n: _push(n) if isinstance(n, Filter) else n)
