"""Render plans as text: the tree, and per scan what pushdown and pruning kept, from
footers alone (no data page is read to explain). A scan's ``filter=`` / ``project=``
run in pyarrow inside the scan; a Filter or computed column marked ``[duckdb]`` is
evaluated by DuckDB over each batch."""

from __future__ import annotations

from .nodes import Filter, Limit, Map, Plan, Project, Scan, SqlQuery


def _fmt_bytes(n: int | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def _engine(e, schema, predicate: bool) -> str:
    """`` [duckdb]`` where DuckDB evaluates the expression (pyarrow and polars unmarked)."""
    try:
        where = e.runs_in(schema, predicate)
    except Exception:  # noqa: BLE001 - explain never fails on an expression
        return ""
    return " [duckdb]" if "duckdb" in where else ""


def _items(items, schema=None) -> str:
    out = []
    for name, e in items:
        ref = e.column_name()
        mark = _engine(e, schema, False) if schema is not None and ref is None else ""
        out.append(name if ref == name else f"{name} := {e}{mark}")
    return ", ".join(out)


def scan_stats(scan: Scan) -> dict:
    """Files / units / columns / estimated bytes kept vs total, from footer metadata."""
    src = scan.source
    all_units = src.units()
    kept = scan.selected_units()
    read = scan.read_columns
    names = src.schema.names
    src.prefetch_checks(range(src.num_files))  # every file's sizes are footer-checked
    total_bytes = [u.bytes_for(None) for u in all_units]
    kept_bytes = [u.bytes_for(read) for u in kept]
    known = all(b is not None for b in total_bytes + kept_bytes)
    return {
        "files": (len({u.file for u in kept}), src.num_files),
        "units": (len(kept), len(all_units)),
        "columns": (len(read), len(names)),
        "bytes": (sum(kept_bytes) if known else None, sum(total_bytes) if known else None),
        "rows": (sum(u.num_rows or 0 for u in kept) if all(u.num_rows is not None for u in kept) else None),
    }


def unreadable_footers(src) -> list[str]:
    """One line per Parquet file whose column chunk metadata cannot be read (encrypted or
    damaged; see source/footer.py), from checks already made or made now (footers only)."""
    check = getattr(src, "footer_check", None)
    if check is None or src.kind != "parquet":
        return []
    src.prefetch_checks(range(src.num_files))
    out = []
    for f in range(src.num_files):
        c = check(f)
        if not c.ok:
            out.append(f"{c.path}: {c.reason()}")
    return out


def describe_node(node: Plan) -> str:
    if isinstance(node, Scan):
        parts = [f"Scan {node.source.kind} {node.source.display}"]
        if node.columns is not None and node.projection is None:
            parts.append(f"columns=[{', '.join(node.columns)}]")
        if node.projection is not None:
            parts.append(f"project=[{_items(node.projection)}]")
        if node.predicate is not None:
            parts.append(f"filter={node.predicate}")
        if node.limit is not None:
            parts.append(f"limit={node.limit}")
        return " ".join(parts)
    if isinstance(node, Filter):
        return f"Filter{_engine(node.predicate, node.child.schema, True)} {node.predicate}"
    if isinstance(node, Project):
        return f"Project [{_items(node.items, node.child.schema)}]"
    if isinstance(node, Map):
        cols = f" columns=[{', '.join(node.columns)}]" if node.columns is not None else ""
        return f"Map {node.name or getattr(node.fn, '__name__', 'fn')}{cols}"
    if isinstance(node, Limit):
        return f"Limit {node.n}"
    if isinstance(node, SqlQuery):
        sandbox = "" if node.external_access else ", external_access=False"
        return f"Sql [duckdb, tables: {', '.join(node.names)}{sandbox}] {node.query}"
    return type(node).__name__


def render_tree(plan: Plan, indent: int = 0) -> list[str]:
    lines = ["  " * indent + describe_node(plan)]
    for c in plan.children:
        lines.extend(render_tree(c, indent + 1))
    return lines


def render_scan_stats(scan: Scan) -> list[str]:
    s = scan_stats(scan)
    kb, tb = s["bytes"]
    pct = f" ({100.0 * kb / tb:.1f}%)" if kb is not None and tb else ""
    unit_name = "row groups" if scan.source.kind == "parquet" else "units"
    lines = [
        f"  files       {s['files'][0]:,} of {s['files'][1]:,}",
        f"  {unit_name:<11} {s['units'][0]:,} of {s['units'][1]:,}",
        f"  columns     {s['columns'][0]:,} of {s['columns'][1]:,} read: {', '.join(scan.read_columns)}",
        f"  bytes       ~{_fmt_bytes(kb)} of {_fmt_bytes(tb)}{pct} "
        + ("(compressed column chunks, from footers)" if scan.source.kind == "parquet" else "(whole files)"),
    ]
    if s["rows"] is not None:
        lines.append(f"  rows        {s['rows']:,} before the filter" if scan.predicate is not None
                     else f"  rows        {s['rows']:,}")
    table_line = getattr(scan.source, "table_line", None)
    if table_line is not None:
        lines.append(f"  table       {table_line(scan.selected_units())}")
    for rule, what in scan.notes:
        lines.append(f"  {rule:<18} {what}")
    for what in unreadable_footers(scan.source):
        lines.append(f"  unreadable  {what} (sizes and statistics unknown; reading it fails)")
    return lines

