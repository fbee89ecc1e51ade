#!/usr/bin/env python
"""polars: ``pl.scan_parquet(...).filter(...).select(...).collect_batches(chunk_size=B,
engine="streaming")`` (exact B-row DataFrames, in order), each turned into x[B, 16] by
polars' own ``DataFrame.to_numpy()`` (Fortran order: made C-contiguous by the common
consumer, as for every peer) or ``Series.to_numpy()`` of the emb Array column [B, 64].

- W3: global shuffle: ``collect()`` then ``sample(fraction=1, shuffle=True)``, sliced;
  the ``polars-hashsort`` variant (``{"shuffle": "hashsort"}``) is polars' streaming
  hash-sort shuffle: ``lf.sort(pl.int_range(pl.len()).hash(seed))`` then
  ``collect_batches`` (every row keyed by a seeded hash of its index, no collect first).
- W5: ``LazyFrame.slice(n)`` pushed into the streaming scan.
"""

from __future__ import annotations

import sys

import polars as pl
import torch

from benchlib import WORKLOADS, main, pl_filter


def batches(spec, info):
    w = WORKLOADS[spec["workload"]]
    if w.hive:
        lf = pl.scan_parquet(spec["hive"] + "/**/*.parquet", hive_partitioning=True)
    else:
        lf = pl.scan_parquet(spec["lake"] + "/*.parquet")
    if w.filter:
        lf = lf.filter(pl_filter(spec))
    lf = lf.select(w.columns)
    info["resume"] = "LazyFrame.slice(n) in the streaming scan"

    def xy(df):
        if w.x == ("emb",):
            x = df["emb"].to_numpy()
        else:
            x = df.select(w.x).to_numpy()
        return torch.from_numpy(x), torch.from_numpy(df["label"].to_numpy())

    if w.shuffle and spec["options"].get("shuffle") == "hashsort":
        # Every row keyed by a seeded hash of its row index, sorted by the key in the
        # streaming engine: a global pseudo-random order without collecting first.
        info["shuffle"] = "global (streaming sort by int_range(len()).hash(seed))"
        lf = lf.sort(pl.int_range(pl.len()).hash(spec["seed"]))
        for df in lf.collect_batches(chunk_size=w.batch, engine="streaming"):
            yield xy(df)
        return
    if w.shuffle:
        info["shuffle"] = "global (collect + sample(fraction=1, shuffle=True))"
        df = lf.collect(engine="streaming").sample(fraction=1.0, shuffle=True, seed=spec["seed"])
        for part in df.iter_slices(w.batch):
            yield xy(part)
        return
    if w.mode == "resume":
        lf = lf.slice(int(spec["resume_row"]))
    for df in lf.collect_batches(chunk_size=w.batch, engine="streaming"):
        yield xy(df)


if __name__ == "__main__":
    sys.exit(main())
