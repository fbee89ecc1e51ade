"""The physical result of planning: splits, the unit of parallelism, sharding,
shuffling and resumption.

A split is one readable unit (a Parquet row group, a whole IPC / CSV / JSON file, an
in-memory slice) with the columns to decode, the residual predicate and its row count
before that predicate. Splits come out in source order: files sorted by path, then
row groups.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UnsupportedError
from ..plan.nodes import Plan, Scan, scans


@dataclass(frozen=True)
class Split:
    """One scan task. ``num_rows`` counts rows before ``predicate`` (None if unknown,
    as for CSV / JSON); ``est_bytes`` is the compressed size of ``columns`` from footers."""

    path: str
    file: int
    row_group: int | None
    unit: int
    columns: tuple[str, ...]
    predicate: str | None
    num_rows: int | None
    est_bytes: int | None


def plan_splits(plan: Plan) -> list[Split]:
    """Splits of the (single) scan under an optimized plan."""
    found = scans(plan)
    if len(found) != 1:
        raise UnsupportedError(f"splits() divides the units of one scan; this selection reads {len(found)} "
                               "scans (a SQL query over several tables). Split each bound table instead "
                               "(al.dataset(...).splits()), or write the result to Parquet first "
                               "(pyarrow.parquet.write_table(ds.to_arrow(), 'out.parquet')) and split that")
    return scan_splits(found[0])


def scan_splits(scan: Scan) -> list[Split]:
    cols = scan.read_columns
    pred = str(scan.predicate) if scan.predicate is not None else None
    return [Split(u.path, u.file, u.row_group, u.index, cols, pred, u.num_rows, u.bytes_for(cols))
            for u in scan.selected_units()]
