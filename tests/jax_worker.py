"""One process of a ``jax.distributed`` job for ``test_jax_distributed.py`` (CPU, loopback).

Usage: ``XLA_FLAGS=--xla_force_host_platform_device_count=4 python tests/jax_worker.py PORT
PROCESS_ID NUM_PROCESSES LAKE OUT``. After ``jax.distributed.initialize`` the loaders get
no rank arguments (rank and world size must come from ``jax.process_index()`` /
``jax.process_count()``). Writes ``OUT/jax-<PROCESS_ID>.json``: the rank and world size the
loader chose, the ids it yielded, its state, and for a ``sharding=`` loader over this
process's 4 CPU devices how each batch was placed; for a ``sharding=`` over both processes'
8 devices, each global batch (gathered back) and this process's rows in it.
"""

from __future__ import annotations

import json
import os
import sys

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import arrowload as al


def main() -> None:
    port, pid, n, lake, out = sys.argv[1:6]
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=int(n),
                               process_id=int(pid))
    ds = al.dataset(lake).select("id", "f0")
    loader = ds.loader(64, shuffle="global", seed=3, drop_last=True, cache_dir=os.path.join(out, f"cache-{pid}"))
    host = [{"id": b["id"].tolist(), "f0": b["f0"].tolist()} for b in loader]
    mesh = Mesh(np.array(jax.local_devices()), ("batch",))
    sharding = NamedSharding(mesh, PartitionSpec("batch"))
    placed = []
    with ds.loader(64, shuffle="global", seed=3, drop_last=True, output="jax", sharding=sharding,
                   cache_dir=os.path.join(out, f"cache-{pid}")) as jl:
        for b in jl:
            x = b["f0"]
            placed.append({
                "sharding": x.sharding == sharding,
                "devices": sorted(str(s.device) for s in x.addressable_shards),
                "shard_rows": [int(s.data.shape[0]) for s in x.addressable_shards],
                "f0": np.asarray(x).tolist(),
            })
    # a mesh over every process's devices: each batch is one global array, this process's
    # rows its slice (gathered back to compare with the host batches of both ranks)
    from jax.experimental import multihost_utils
    gsharding = NamedSharding(Mesh(np.array(jax.devices()), ("batch",)), PartitionSpec("batch"))
    global_batches = []
    with ds.loader(64, shuffle="global", seed=3, drop_last=True, output="jax", sharding=gsharding,
                   cache_dir=os.path.join(out, f"cache-{pid}")) as gl:
        for b in gl:
            x, ids = b["f0"], b["id"]
            global_batches.append({
                "shape": list(x.shape), "fully_addressable": bool(x.is_fully_addressable),
                "sharding": x.sharding == gsharding,
                "local_ids": [int(v) for s in sorted(ids.addressable_shards, key=lambda s: s.index[0].start or 0)
                              for v in np.asarray(s.data)],
                "ids": np.asarray(multihost_utils.process_allgather(ids, tiled=True)).tolist(),
                "f0": np.asarray(multihost_utils.process_allgather(x, tiled=True)).tolist(),
            })
    result = {"rank": loader.rank, "world_size": loader.world_size, "host": host, "placed": placed,
              "global": global_batches,
              "local_devices": [str(d) for d in jax.local_devices()], "state": loader.state_dict()}
    with open(os.path.join(out, f"jax-{pid}.json"), "w") as f:
        json.dump(result, f)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
