#!/usr/bin/env python
"""HuggingFace datasets: ``Dataset.from_parquet(files, columns=..., filters=...)``
(converted once into its Arrow cache under the harness's cache dir: kept between runs,
empty for W6 cold), ``with_format("torch")``, then ``Dataset.iter(batch_size=B)``; the
feature tensors of a batch are stacked to x[B, 16] (``torch.stack``).

- W3: ``Dataset.shuffle(seed)``: global (an indices mapping; reads gather rows).
- W5: ``Dataset.skip(n)``.
"""

from __future__ import annotations

import glob
import os
import sys

import datasets
import torch

from benchlib import WORKLOADS, main, pa_filter


def setup(spec, info):
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()


def batches(spec, info):
    w = WORKLOADS[spec["workload"]]
    if w.hive:
        files = sorted(glob.glob(os.path.join(spec["hive"], "**", "*.parquet"), recursive=True))
        info["notes"].append("hive folders read as plain files (no partition column)")
    else:
        files = sorted(glob.glob(os.path.join(spec["lake"], "*.parquet")))
    filt = pa_filter(spec)
    if w.hive and w.filter:
        raise NotImplementedError("HF from_parquet does not read hive partition columns")
    ds = datasets.Dataset.from_parquet(files, columns=w.columns, filters=filt,
                                       cache_dir=spec["cache_dir"])
    info["resume"] = "Dataset.skip(n)"
    if w.shuffle:
        info["shuffle"] = "global (Dataset.shuffle: indices mapping)"
        ds = ds.shuffle(seed=spec["seed"])
    if w.mode == "resume":
        ds = ds.skip(int(spec["resume_row"]))
    ds = ds.with_format("torch")
    for b in ds.iter(batch_size=w.batch):
        if w.x == ("emb",):
            x = b["emb"]
        else:
            x = torch.stack([b[c] for c in w.x], dim=1)
        yield x, b["label"]


if __name__ == "__main__":
    sys.exit(main())
