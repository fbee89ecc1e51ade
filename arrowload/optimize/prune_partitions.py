"""Partition pruning: drop files whose hive folders contradict the scan's predicate.

Uses only the ``key=value`` folder names (no file is opened for this decision): pyarrow
simplifies the predicate against each file's partition guarantee and skips the files
where it cannot be true.
"""

from __future__ import annotations

from ..plan.nodes import Plan, Scan, transform_up
from ..source import FileSource


def _prune(scan: Scan) -> Scan:
    src = scan.source
    if scan.predicate is None or not isinstance(src, FileSource) or len(src.partition_schema) == 0:
        return scan
    if not set(src.partition_schema.names) & scan.predicate.columns or src.in_memory_reads:
        return scan  # (files read whole into memory, IPC streams: the filter applies to the rows)
    units = scan.selected_units()
    files_before = sorted({u.file for u in units})
    expr = scan.predicate.to_arrow(src.schema, predicate=True)
    kept_paths = {f.path for f in src.statistics_dataset(scan.units, statistics=False).get_fragments(filter=expr)}
    kept = tuple(u.index for u in units if u.path in kept_paths)
    files_after = len({u.file for u in units if u.path in kept_paths})
    return scan.keep_units(kept, "partition_pruning", f"files {len(files_before)} -> {files_after}")


def prune_partitions(plan: Plan) -> Plan:
    return transform_up(plan, lambda n: _prune(n) if isinstance(n, Scan) else n)
