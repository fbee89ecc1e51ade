#!/usr/bin/env python
"""Ray Data, a local cluster started by ``ray.init`` (its start-up is timed apart, as
``setup``): ``read_parquet(lake, columns=...)``, ``.filter(expr=...)`` (pushed into the
Parquet scan), ``.select_columns(...)``, then ``iter_torch_batches(batch_size=B)``; the
feature tensors of a batch are stacked to x[B, 16] (``torch.stack``).

- W3: ``random_shuffle(seed)``: global (an all-to-all exchange).
- W5: Ray Data has no mid-epoch resume: the rows before the resume row are read and
  discarded (order preserved for this run: ``preserve_order=True``).
Peak RSS counts Ray's worker processes (sampled); shared object-store pages are counted
in each process that maps them, so it overstates.
"""

from __future__ import annotations

import os
import sys

import ray
import torch
from ray.data.expressions import col, lit

from benchlib import WORKLOADS, main


def setup(spec, info):
    info["tree"] = True
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
             object_store_memory=1 << 30, logging_level="ERROR",
             _temp_dir=spec.get("ray_tmp") or None)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    if WORKLOADS[spec["workload"]].mode == "resume":
        ctx.execution_options.preserve_order = True


def batches(spec, info):
    w = WORKLOADS[spec["workload"]]
    read = [*w.columns, "country"] if w.filter else w.columns
    if w.hive:
        ds = ray.data.read_parquet(spec["hive"], columns=[c for c in read if c != "country"] + ["country"])
    else:
        ds = ray.data.read_parquet(spec["lake"], columns=read)
    if w.filter:
        assert w.filter == "us1", "ray_data spells only W2's filter"
        ds = ds.filter(expr=(col("country") == lit("US")) & (col("label") == lit(1)))
    ds = ds.select_columns(w.columns)
    info["resume"] = "none: reads and discards the rows before the resume row"
    if w.shuffle:
        info["shuffle"] = "global (random_shuffle)"
        ds = ds.random_shuffle(seed=spec["seed"])
    skip = int(spec["resume_row"]) if w.mode == "resume" else 0
    for b in ds.iter_torch_batches(batch_size=w.batch):
        if skip:
            skip -= len(b["label"])
            continue
        if w.x == ("emb",):
            x = b["emb"]
        else:
            x = torch.stack([b[c] for c in w.x], dim=1)
        yield x, b["label"]


def teardown(spec, info):
    ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
