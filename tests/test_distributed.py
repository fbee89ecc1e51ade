"""Real multi-process training jobs: ``torchrun`` on CPU with the gloo backend on loopback.

Three launches of ``tests/dist_worker.py`` over one small lake: 4 processes, then 2 (from
the 4-process state), then 3 (from the 2-process one). Rank and world size come from
``torch.distributed`` (the loaders get no rank arguments); ids are all-gathered and rank 0
writes them out. The truth is pyarrow's own filtered read of the lake. Checked: every
epoch reads each selected row exactly once across ranks (but the remainder, fewer than the
world size), ranks get equal counts, every rank writes the same ``state_dict()``, a state
saved at 4 resumes the exact rest at 4, and resumed at 2 (then at 3) the rest of the epoch
is every row no rank had read, each once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pyarrow.compute as pc
import pyarrow.dataset as pds
import pytest

from arrowload.datagen import write_lake

from _support import free_port

pytest.importorskip("torch.distributed")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import dist_worker  # noqa: E402 - its constants (K, J, BATCH)


def _launch(step: str, nproc: int, lake: str, out: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
               GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1")
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(var, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--nnodes", "1",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
           os.path.join(HERE, "dist_worker.py"), step, lake, out]
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    with open(os.path.join(out, f"{step}.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    base = tmp_path_factory.mktemp("distributed")
    lake, out = str(base / "lake"), str(base / "out")
    os.makedirs(out)
    write_lake(lake, rows=3_001, shards=3, row_group_size=128, features=2, emb_dim=4)
    table = pds.dataset(lake).to_table(filter=(pc.field("label") == 0) | (pc.field("f0") > 0.5),
                                       columns=["id"])
    truth = table.column("id").to_pylist()
    assert len(truth) == len(set(truth)) > 1_000
    runs = {step: _launch(step, n, lake, out) for step, n in (("first", 4), ("second", 2), ("third", 3))}
    return truth, runs


def _flat(per_rank) -> list[int]:
    return [i for batches in per_rank for b in batches for i in b]


def _exactly_once(ids: list[int], truth: list[int], world: int) -> None:
    counts = Counter(ids)
    assert max(counts.values()) == 1, "a row was read twice"
    assert set(counts) <= set(truth), "a row that is not selected"
    assert 0 <= len(truth) - len(ids) < world, (len(truth), len(ids), world)


def test_rank_and_world_size_come_from_torch_distributed(job):
    _, runs = job
    for step, n in (("first", 4), ("second", 2), ("third", 3)):
        assert runs[step]["world_size"] == n and runs[step]["ranks"] == list(range(n))


@pytest.mark.parametrize("step,world", [("first", 4), ("second", 2)])
def test_an_epoch_reads_each_selected_row_exactly_once_across_processes(job, step, world):
    truth, runs = job
    epoch0 = runs[step]["epoch0"]
    _exactly_once(_flat(epoch0), truth, world)
    rows = [sum(len(b) for b in batches) for batches in epoch0]
    assert len(set(rows)) == 1 and rows[0] == len(truth) // world
    assert len(set(runs[step]["lengths"])) == 1 and runs[step]["lengths"][0] == len(epoch0[0])
    assert all(s == runs[step]["epoch0_states"][0] for s in runs[step]["epoch0_states"])
    if step == "first":
        _exactly_once(_flat(runs[step]["epoch1"]), truth, world)


def test_every_rank_writes_the_same_state(job):
    _, runs = job
    for step in ("first", "second", "third"):
        key = "states" if step != "third" else "end_states"
        states = runs[step][key]
        assert len(states) == runs[step]["world_size"]
        assert all(s == states[0] for s in states), step
        assert "rank" not in states[0]
    first = runs["first"]["states"][0]
    assert first["world_size"] == 4 and first["batches"] == dist_worker.K and first["segments"] == []
    second = runs["second"]["states"][0]
    assert second["world_size"] == 2 and second["batches"] == dist_worker.J
    assert second["segments"] == [{"world_size": 4, "position": dist_worker.K * dist_worker.BATCH}]


def test_a_state_saved_at_4_resumes_the_exact_rest_at_4(job):
    _, runs = job
    first = runs["first"]
    k = dist_worker.K
    for rank in range(4):
        assert first["consumed"][rank] == first["epoch1"][rank][:k]
        assert first["rest_same_world"][rank] == first["epoch1"][rank][k:]


def test_saved_at_4_resumed_at_2_then_at_3_reads_every_remaining_row_once(job):
    truth, runs = job
    first, second, third = runs["first"], runs["second"], runs["third"]
    consumed4 = _flat(first["consumed"])
    # 4 -> 2: the rest of the epoch on 2 processes, equal shares
    rest2 = [_flat([c]) + _flat([r]) for c, r in zip(second["consumed"], second["rest"])]
    assert len({len(r) for r in rest2}) == 1
    _exactly_once(consumed4 + sum(rest2, []), truth, 2)
    # 4 -> 2 -> 3: what 2 processes read before their state, then 3 processes the rest
    rest3 = [_flat([r]) for r in third["rest"]]
    assert len({len(r) for r in rest3}) == 1
    _exactly_once(consumed4 + _flat(second["consumed"]) + sum(rest3, []), truth, 3)
    assert third["end_states"][0]["segments"] == second["states"][0]["segments"] + [
        {"world_size": 2, "position": dist_worker.J * dist_worker.BATCH}]
