"""One process of a ``torchrun`` job for ``test_distributed.py`` (CPU, gloo, loopback).

Usage: ``python -m torch.distributed.run --nproc_per_node N ... tests/dist_worker.py STEP LAKE OUT``.
The loaders take rank and world size from ``torch.distributed`` (no rank arguments); every
rank all-gathers what it yielded and its ``state_dict()``, and rank 0 writes them to
``OUT/STEP.json`` for the test to check against pyarrow. Steps:

- ``first`` (4 processes): epoch 0 with a global shuffle to its end; epoch 1 with a block
  shuffle, uninterrupted; the same epoch stopped after ``K`` batches, its state saved to
  ``OUT/state-first.json``; that state resumed in fresh loaders at the same world size.
- ``second`` (2 processes): epoch 0 with a global shuffle; the 4-process state resumed,
  ``J`` batches, the state saved to ``OUT/state-second.json``, then the rest of the epoch.
- ``third`` (3 processes): the state of ``second`` resumed to the end of the epoch.
"""

from __future__ import annotations

import itertools
import json
import os
import sys

import torch.distributed as dist

import arrowload as al

PREDICATE = "label = 0 OR f0 > 0.5"
BATCH = 32
K = 5  # batches each of 4 ranks yields before the first state is saved
J = 3  # batches each of 2 ranks yields after resuming, before the second state is saved


def gather(value):
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def ids(batches) -> list[list[int]]:
    return [b["id"].tolist() for b in batches]


def main() -> None:
    step, lake, out = sys.argv[1:4]
    dist.init_process_group("gloo")
    ds = al.dataset(lake).filter(PREDICATE).select("id", "f0")
    cache = os.path.join(out, "cache")

    def build(kind: str):
        return ds.loader(BATCH, shuffle=kind, seed=7, shuffle_window=2, cache_dir=cache)

    results = {"world_size": dist.get_world_size(), "ranks": gather(dist.get_rank())}
    if step in ("first", "second"):
        loader = build("global")
        results["lengths"] = gather(len(loader))
        results["epoch0"] = gather(ids(loader))
        results["epoch0_states"] = gather(loader.state_dict())
    if step == "first":
        loader = build("block")
        loader.set_epoch(1)
        results["epoch1"] = gather(ids(loader))
        loader = build("block")
        loader.set_epoch(1)
        it = iter(loader)
        results["consumed"] = gather(ids(itertools.islice(it, K)))
        it.close()
        state = loader.state_dict()
        results["states"] = gather(state)
        if dist.get_rank() == 0:
            with open(os.path.join(out, "state-first.json"), "w") as f:
                json.dump(state, f)
        dist.barrier()
        with open(os.path.join(out, "state-first.json")) as f:
            saved = json.load(f)
        same = build("block")
        same.load_state_dict(saved)
        results["rest_same_world"] = gather(ids(same))
    elif step in ("second", "third"):
        before = "state-first.json" if step == "second" else "state-second.json"
        with open(os.path.join(out, before)) as f:
            saved = json.load(f)
        loader = build("block")
        loader.load_state_dict(saved)
        it = iter(loader)
        if step == "second":
            results["consumed"] = gather(ids(itertools.islice(it, J)))
            state = loader.state_dict()
            results["states"] = gather(state)
            if dist.get_rank() == 0:
                with open(os.path.join(out, "state-second.json"), "w") as f:
                    json.dump(state, f)
        results["rest"] = gather(ids(it))
        results["end_states"] = gather(loader.state_dict())
    if dist.get_rank() == 0:
        with open(os.path.join(out, f"{step}.json"), "w") as f:
            json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
