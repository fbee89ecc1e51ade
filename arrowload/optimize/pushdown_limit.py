"""Limit pushdown: a limit moves below projections and into the scan.

``Limit(Project(x))`` becomes ``Project(Limit(x))``; nested limits take the smaller;
a limit directly over a scan becomes the scan's own ``limit`` (rows after its pushed
predicate), so reading stops once enough rows are out. Limits never cross a residual
Filter or a Map.
"""

from __future__ import annotations

from ..plan.nodes import Limit, Plan, Project, Scan, transform_up


def _push(node: Limit) -> Plan:
    child = node.child
    if isinstance(child, Limit):
        return _push(Limit(child.child, min(node.n, child.n)))
    if isinstance(child, Project):
        return Project(_push(Limit(child.child, node.n)), child.items)
    if isinstance(child, Scan):
        n = node.n if child.limit is None else min(node.n, child.limit)
        return child.replace(limit=n)
    return node


def pushdown_limit(plan: Plan) -> Plan:
    return transform_up(plan, lambda n: _push(n) if isinstance(n, Limit) else n)
