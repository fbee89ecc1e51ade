#!/usr/bin/env python
"""torch ``DataLoader`` over a map-style Dataset: the common way to feed a model from
Parquet. The selection is read once into memory (pyarrow ``to_table`` with the filter
and projection pushed down, features stacked to one [N, k] tensor), inside the timed
region, since every epoch of a fresh job pays it; then:

- ``rows=True``: ``__getitem__(i)`` returns one row (x[i], y[i]) and the default collate
  stacks B of them (``num_workers`` 0 or 2, workers forked per epoch);
- ``rows=False``: a batched sampler (``BatchSampler`` as the ``sampler``,
  ``batch_size=None``): ``__getitem__(indices)`` gathers B rows at once.

- W3: ``RandomSampler`` (global: a uniform permutation of all rows).
- W5: the sampler starts at the resume row (O(1) on a map-style dataset; the data load
  before it is still paid).
"""

from __future__ import annotations

import sys

import numpy as np
import pyarrow.dataset as pads
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler

from benchlib import WORKLOADS, main, pa_filter


def setup(spec, info):
    info["tree"] = spec["options"]["workers"] > 0


def _load(spec, w):
    d = pads.dataset(spec["hive"] if w.hive else spec["lake"], format="parquet",
                     partitioning="hive" if w.hive else None)
    t = d.to_table(columns=w.columns, filter=pa_filter(spec))
    if w.x == ("emb",):
        col = t.column("emb").combine_chunks()
        x = col.flatten().to_numpy().reshape(len(col), -1)
    else:
        x = np.stack([t.column(c).to_numpy() for c in w.x], axis=1)
    return torch.from_numpy(x), torch.from_numpy(t.column("label").to_numpy())


class _Rows:
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class _Gather(_Rows):
    def __getitem__(self, idx):
        idx = torch.as_tensor(idx)
        return self.x[idx], self.y[idx]


def batches(spec, info):
    w = WORKLOADS[spec["workload"]]
    opt = spec["options"]
    x, y = _load(spec, w)
    n = len(y)
    if w.shuffle:
        info["shuffle"] = "global (RandomSampler)"
        order = RandomSampler(range(n), generator=torch.Generator().manual_seed(spec["seed"]))
    elif w.mode == "resume":
        order = range(int(spec["resume_row"]), n)
    else:
        order = SequentialSampler(range(n))
    info["resume"] = "sampler starts at the row (map-style: O(1), after loading the data)"
    kw = dict(num_workers=opt["workers"])
    if opt["workers"]:
        kw["persistent_workers"] = False
    if opt["rows"]:
        dl = DataLoader(_Rows(x, y), batch_size=w.batch, sampler=order, **kw)
    else:
        dl = DataLoader(_Gather(x, y), batch_size=None,
                        sampler=BatchSampler(order, w.batch, drop_last=False), **kw)
    for xb, yb in dl:
        yield xb, yb


if __name__ == "__main__":
    sys.exit(main())
