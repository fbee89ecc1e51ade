#!/usr/bin/env python
"""DuckDB: ``SELECT f0..f15, label FROM read_parquet(...) [WHERE ...]`` streamed as Arrow
RecordBatches of B rows (``to_arrow_reader(B)``, called ``fetch_record_batch`` before
DuckDB 2.0), re-cut to exact B-row batches, stacked to x[B, 16] (``np.stack``).

- W3: global shuffle by ``ORDER BY random()`` (after ``setseed``): a full sort.
- W5: ``OFFSET n`` (DuckDB reads and discards the rows before it).
"""

from __future__ import annotations

import sys

import duckdb

from benchlib import WORKLOADS, arrow_xy, filter_sql, main, rebatch


def batches(spec, info):
    w = WORKLOADS[spec["workload"]]
    if w.hive:
        src = f"read_parquet('{_q(spec['hive'])}/**/*.parquet', hive_partitioning = true)"
    else:
        src = f"read_parquet('{_q(spec['lake'])}/*.parquet')"
    query = f"SELECT {', '.join(w.columns)} FROM {src}"
    if w.filter:
        query += f" WHERE {filter_sql(spec)}"
    con = duckdb.connect()
    info["resume"] = "OFFSET n (reads and discards the rows before it)"
    if w.shuffle:
        info["shuffle"] = "global (ORDER BY random())"
        con.execute(f"SELECT setseed({(spec['seed'] % 1000) / 1000})").fetchall()
        query += " ORDER BY random()"
    if w.mode == "resume":
        query += f" OFFSET {int(spec['resume_row'])}"
    rel = con.sql(query)
    fn = getattr(rel, "to_arrow_reader", None) or rel.fetch_record_batch
    for b in rebatch(fn(w.batch), w.batch):
        yield arrow_xy(b, w.x)


def _q(path: str) -> str:
    return path.replace("'", "''")


if __name__ == "__main__":
    sys.exit(main())
