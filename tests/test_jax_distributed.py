"""jax as the source of rank and world size, and ``sharding=`` over several devices.

Two real processes join a ``jax.distributed`` job on loopback (CPU; 4 host devices each,
``XLA_FLAGS=--xla_force_host_platform_device_count=4`` set before jax is imported). The
environment says ``RANK=0`` / ``WORLD_SIZE=1`` in both, so a loader that ignored jax would
give both processes every row. Truth: pyarrow's read of the lake.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow.dataset as pds
import pytest

from arrowload.datagen import write_lake

from _support import free_port

pytest.importorskip("jax")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    base = tmp_path_factory.mktemp("jax_distributed")
    lake, out = str(base / "lake"), str(base / "out")
    os.makedirs(out)
    write_lake(lake, rows=1_001, shards=2, row_group_size=100, features=1, emb_dim=2)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
               XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu",
               RANK="0", WORLD_SIZE="1")
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "jax_worker.py"), port, str(i), "2", lake, out],
                              env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=180)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-4000:] for log in logs)
    results = []
    for i in range(2):
        with open(os.path.join(out, f"jax-{i}.json")) as f:
            results.append(json.load(f))
    truth = pds.dataset(lake).to_table(columns=["id", "f0"])
    return truth, results


def test_rank_and_world_size_come_from_jax_distributed(job):
    truth, results = job
    assert [(r["rank"], r["world_size"]) for r in results] == [(0, 2), (1, 2)]
    ids = [i for r in results for b in r["host"] for i in b["id"]]
    assert len(ids) == len(set(ids)) and set(ids) <= set(truth.column("id").to_pylist())
    per_rank = [sum(len(b["id"]) for b in r["host"]) for r in results]
    assert per_rank[0] == per_rank[1] == truth.num_rows // 2 // 64 * 64  # drop_last
    assert results[0]["state"] == results[1]["state"] and "rank" not in results[0]["state"]


def test_a_batch_is_placed_across_the_local_devices_by_its_sharding(job):
    _, results = job
    for r in results:
        assert len(r["local_devices"]) == 4
        assert len(r["placed"]) == len(r["host"]) > 0
        for placed, host in zip(r["placed"], r["host"]):
            assert placed["sharding"]
            assert placed["devices"] == sorted(r["local_devices"])
            assert placed["shard_rows"] == [16, 16, 16, 16]  # 64 rows over 4 devices
            assert placed["f0"] == pytest.approx(host["f0"])


def test_a_sharding_over_every_process_makes_one_global_array_per_batch(job):
    """``sharding=`` over a mesh of both processes' devices: each batch is one global
    ``jax.Array`` of both ranks' batches (2 x 64 rows over 8 devices), not fully addressable
    from either process, each process holding exactly its own rank's rows; gathered back it
    is rank 0's host batch then rank 1's."""
    _, results = job
    assert len(results[0]["global"]) == len(results[1]["global"]) == len(results[0]["host"]) > 0
    for j, (g0, g1) in enumerate(zip(results[0]["global"], results[1]["global"])):
        h0, h1 = results[0]["host"][j], results[1]["host"][j]
        for r, g, h in ((0, g0, h0), (1, g1, h1)):
            assert g["shape"] == [128] and not g["fully_addressable"] and g["sharding"], (r, g["shape"])
            assert g["local_ids"] == h["id"]
            assert g["ids"] == h0["id"] + h1["id"]
            assert g["f0"] == pytest.approx(h0["f0"] + h1["f0"])
