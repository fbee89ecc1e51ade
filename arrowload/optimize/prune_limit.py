"""Limit pruning: a scan with a limit and no predicate keeps only the leading units whose
row counts (from footers) reach the limit; ``head(5)`` then reads one row group."""

from __future__ import annotations

from ..plan.nodes import Plan, Scan, transform_up


def _prune(scan: Scan) -> Scan:
    if scan.limit is None or scan.predicate is not None:
        return scan
    units = scan.selected_units()
    kept, rows = [], 0
    for u in units:
        if rows >= scan.limit:
            break
        if u.num_rows is None:  # CSV / JSON: counts unknown until read
            return scan
        kept.append(u.index)
        rows += u.num_rows
    return scan.keep_units(tuple(kept), "limit_pushdown",
                           f"units {len(units)} -> {len(kept)} (limit {scan.limit})")


def prune_limit(plan: Plan) -> Plan:
    return transform_up(plan, lambda n: _prune(n) if isinstance(n, Scan) else n)
