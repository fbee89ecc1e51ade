#!/usr/bin/env python
"""arrowload: ``al.dataset(lake).filter(...).select(...).loader(B, output="torch", ...)``.

x[B, 16] is stacked by the loader when ``Dataset.loader`` takes ``stack=``; until then it
is stacked here, in the timed region, from the loader's per-column tensors
(``torch.stack``), as for every other peer that yields columns. emb arrives as [B, 64].

- W3: ``shuffle="global"`` (a uniform permutation of all rows: the selection is gathered
  from an in-memory random-access table); the ``arrowload-block`` variant uses
  ``shuffle="block"`` (row groups permuted, rows mixed within windows of 8 row groups).
- W5: ``load_state_dict`` of a state at 90% of the epoch (a documented, JSON state;
  the position is set in it as a checkpoint taken there would hold it).
- ``cache_dir`` is the harness's: kept between runs (warm), empty for W6 (cold).
- polars is imported here, with the peer's other imports, outside the clock: arrowload
  imports it lazily for its stream reads (about 0.15 s), and every other peer's imports,
  polars' own included, are outside the clock (README, "Method").
"""

from __future__ import annotations

import inspect
import sys
import time

import arrowload as al
import polars  # noqa: F401 - see below
import torch

from benchlib import WORKLOADS, filter_sql, main


def batches(spec, info):
    t0 = time.perf_counter()
    w = WORKLOADS[spec["workload"]]
    d = al.dataset(spec["hive"] if w.hive else spec["lake"])
    if w.filter:
        d = d.filter(filter_sql(spec))
    d = d.select(*w.columns)
    shuffle = spec["options"].get("shuffle", "global") if w.shuffle else False
    kwargs = dict(shuffle=shuffle, seed=spec["seed"], output="torch", cache_dir=spec["cache_dir"])
    stacked = w.x != ("emb",) and "stack" in inspect.signature(d.loader).parameters
    if stacked:
        kwargs["stack"] = {"x": list(w.x)}
        info["notes"].append("x stacked by the loader (stack=)")
    elif w.x != ("emb",):
        info["notes"].append("x stacked in the consumer (torch.stack)")
    info["resume"] = "load_state_dict (O(1) seek by row-group counts)"
    with d.loader(w.batch, **kwargs) as loader:
        info["build_s"] = time.perf_counter() - t0       # counts (cached) and, for global, the table
        info["shuffle"] = loader.shuffle_kind
        if w.mode == "resume":
            state = loader.state_dict()
            state["position"] = spec["resume_row"]
            state["batches"] = spec["resume_row"] // w.batch
            loader.load_state_dict(state)
        try:
            for b in loader:
                if w.x == ("emb",):
                    yield b["emb"], b["label"]
                elif stacked:
                    yield b["x"], b["label"]
                else:
                    yield torch.stack([b[c] for c in w.x], dim=1), b["label"]
        finally:
            info["stats"] = str(loader.stats())


if __name__ == "__main__":
    sys.exit(main())
