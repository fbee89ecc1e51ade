#!/usr/bin/env python
"""Bare decode of the workload's columns: the *limit* the tables compare against.

``engine=pyarrow``: the tuned pyarrow Scanner (row-group batches of 65,536 rows,
``pre_buffer``, batch / fragment readahead), filter and projection pushed down; each
decoded RecordBatch is only reduced to the checksums (no conversion, no re-batching).
``engine=polars``: ``pl.scan_parquet(...).filter(...).select(...).collect(engine="streaming")``,
the whole selection decoded into one DataFrame, then reduced to the checksums.
Neither shuffles: decoding the columns costs the same whatever order a loader wants, so
the same bare decode is the limit of W1 and W3.
"""

from __future__ import annotations

import sys

import polars as pl
import pyarrow.dataset as pads

from benchlib import TUNED, WORKLOADS, Sums, main, pa_filter, pl_filter


def batches(spec, info):
    w = WORKLOADS[spec["workload"]]
    info["shuffle"] = "n/a (decode only)"
    if spec["options"]["engine"] == "pyarrow":
        yield from _pyarrow(spec, w)
    else:
        yield from _polars(spec, w)


def _sums_np(x0, label) -> Sums:
    return Sums(len(label), int(label.sum(dtype="int64")), float(x0.sum(dtype="float64")))


def _pyarrow(spec, w):
    src = spec["hive"] if w.hive else spec["lake"]
    d = pads.dataset(src, format="parquet", partitioning="hive" if w.hive else None)
    filt = pa_filter(spec)
    scanner = d.scanner(columns=w.columns, filter=filt, batch_size=TUNED["batch_size"],
                        batch_readahead=TUNED["batch_readahead"],
                        fragment_readahead=TUNED["fragment_readahead"],
                        fragment_scan_options=pads.ParquetFragmentScanOptions(pre_buffer=True))
    for b in scanner.to_batches():
        if not b.num_rows:
            continue
        if w.x == ("emb",):
            x0 = b.column("emb").flatten().to_numpy()[::64]
        else:
            x0 = b.column(w.x[0]).to_numpy()
        yield _sums_np(x0, b.column("label").to_numpy())


def _polars(spec, w):
    if w.hive:
        lf = pl.scan_parquet(spec["hive"] + "/**/*.parquet", hive_partitioning=True)
    else:
        lf = pl.scan_parquet(spec["lake"] + "/*.parquet")
    if w.filter:
        lf = lf.filter(pl_filter(spec))
    df = lf.select(w.columns).collect(engine="streaming")
    if w.x == ("emb",):
        x0 = df["emb"].arr.first().to_numpy()
    else:
        x0 = df[w.x[0]].to_numpy()
    yield _sums_np(x0, df["label"].to_numpy())


if __name__ == "__main__":
    sys.exit(main())
