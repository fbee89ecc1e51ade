"""Projection pushdown: every scan decodes only the columns something above it uses.

Walks the tree top-down with the set of columns each node's parent needs, drops unused
projection items, and fuses a projection sitting directly on a scan into the scan itself
(pyarrow evaluates the computed columns while scanning).
"""

from __future__ import annotations

from ..plan.nodes import Filter, Limit, Map, Plan, Project, Scan


def _prune(node: Plan, required: set[str] | None) -> Plan:
    if isinstance(node, Project):
        items = node.items if required is None else tuple((n, e) for n, e in node.items if n in required)
        if required is not None and not items and node.items:
            items = ()
        needs: set[str] = set().union(*(e.columns for _, e in items)) if items else set()
        child = _prune(node.child, needs)
        if isinstance(child, Scan) and child.projection is None and all(e.projectable_on(child.source.schema) for _, e in items):
            names = child.source.schema.names
            return child.replace(projection=items,
                                 columns=tuple(n for n in names if n in needs))
        if isinstance(child, Scan) and child.projection is not None:
            # columns picked (or renamed) from a scan's projection: the projection, picked
            inner = dict(child.projection)
            picked = [(n, inner.get(e.column_name())) for n, e in items]
            if all(e is not None for _, e in picked):
                return child.replace(projection=tuple(picked))
        return node if child is node.child and items == node.items else Project(child, items)
    if isinstance(node, Filter):
        needs = None if required is None else required | set(node.predicate.columns)
        child = _prune(node.child, needs)
        return node if child is node.child else Filter(child, node.predicate)
    if isinstance(node, Limit):
        child = _prune(node.child, required)
        return node if child is node.child else Limit(child, node.n)
    if isinstance(node, Map):
        child = _prune(node.child, set(node.columns) if node.columns is not None else None)
        return node if child is node.child else node.with_children(child)
    if isinstance(node, Scan):
        if required is None or node.projection is not None:
            return node
        current = node.columns if node.columns is not None else tuple(node.source.schema.names)
        keep = tuple(c for c in current if c in required)
        return node if keep == current else node.replace(columns=keep)
    kids = tuple(_prune(c, None) for c in node.children)
    return node if all(k is c for k, c in zip(kids, node.children)) else node.with_children(*kids)


def pushdown_projection(plan: Plan) -> Plan:
    return _prune(plan, None)
