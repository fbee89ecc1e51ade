"""Row-group pruning: skip Parquet row groups whose min/max/null-count statistics prove
the scan's predicate false for every row (footers only; no data page is read)."""

from __future__ import annotations

from ..plan.nodes import Plan, Scan, transform_up


def _prune(scan: Scan) -> Scan:
    src = scan.source
    if scan.predicate is None or not src.has_statistics:
        return scan
    units = scan.selected_units()
    if not units:
        return scan
    expr = scan.predicate.to_arrow(src.schema, predicate=True)
    # files whose column metadata cannot be read (encrypted, damaged: source/footer.py)
    # are kept whole, unpruned: explain() still works, and reading them raises
    check = getattr(src, "footer_check", None)
    bad = {f for f in {u.file for u in units} if check is not None and not check(f).ok}
    keep: set[tuple[str, int]] = {(u.path, u.row_group) for u in units if u.file in bad}
    prunable = tuple(u.index for u in units if u.file not in bad)
    dataset = src.dataset(scan.units if not bad else prunable)
    for frag in (dataset.get_fragments() if prunable else ()):
        sub = frag.subset(filter=expr, schema=src.schema)
        keep.update((frag.path, rg.id) for rg in sub.row_groups)
    kept = tuple(u.index for u in units if (u.path, u.row_group) in keep)
    return scan.keep_units(kept, "prune_row_groups", f"row groups {len(units)} -> {len(kept)}")


def prune_row_groups(plan: Plan) -> Plan:
    return transform_up(plan, lambda n: _prune(n) if isinstance(n, Scan) else n)
