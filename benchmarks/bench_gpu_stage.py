#!/usr/bin/env python
"""Where the device path's time goes, on a CUDA GPU: the Load stage's settings side by side.

    python benchmarks/bench_gpu_stage.py [--rows 2000000] [--batch 4096] [--lake]

One process, every case interleaved, 4 rounds, the medians of the last 3 (GB/s of the
batches' array bytes, wall and CPU milliseconds of the process):

- ``plain_pinned``: ``.to("cuda", non_blocking=True)`` of arrays already pinned (the ceiling
  ``bench_gpu.py`` compares against);
- ``host_copy_only``: one host copy of the same arrays on one thread (what staging costs);
- ``mem_torch_cpu``: arrowload's loader over the selection in memory, host batches only;
- ``mem_cuda_whole``: the same loader with ``device="cuda"`` as it runs by default: whole
  reads to the device (the in-memory table page-locked in place), batches cut there;
- ``mem_cuda_pinned``: the same with ``ARROWLOAD_PIN_TABLES=1`` (the table page-locked in
  place: its columns go to the device with no host copy);
- ``mem_cuda_inline`` / ``mem_cuda_threads_<k>``: the same with whole reads off
  (``device.WHOLE_READS = False``), every batch staged on the producer thread, or on ``k``
  staging threads;
- with ``--lake``: ``_torch_cpu``, ``_cuda_whole`` and ``_cuda_inline`` from the Parquet lake
  (decode included).

The lake is ``ensure_lake(rows)`` of _common.py. Prints a table; records nothing. Exits
with status 3 when no CUDA device is available.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import arrowload as al
from arrowload.pipeline import device as stage

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--lake", action="store_true", help="also read from the Parquet lake")
    args = p.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("no CUDA device available: nothing to measure", file=sys.stderr)
        return 3
    import pyarrow.dataset as pads
    from _common import ensure_lake
    lake = ensure_lake(args.rows)
    feats = [f"f{i}" for i in range(16)]
    cols = [*feats, "emb", "label"]
    in_memory = al.dataset(pads.dataset(str(lake), format="parquet").to_table(columns=cols))
    from_lake = al.dataset(str(lake)).select(*cols)
    cache = tempfile.mkdtemp(prefix="arrowload-gpu-cache-")
    dev = torch.device("cuda")
    host = [{k: np.array(v) for k, v in b.items()}
            for b in in_memory.loader(args.batch, output="numpy", stack={"x": feats}, cache_dir=cache)]
    pinned = [{k: torch.from_numpy(v).pin_memory() for k, v in b.items()} for b in host]
    nbytes = sum(v.nbytes for b in host for v in b.values())

    def plain_pinned():
        for b in pinned:
            for v in b.values():
                v.to(dev, non_blocking=True)

    scratch = {}

    def host_copy_only():
        for b in host:
            for k, v in b.items():
                np.copyto(scratch.setdefault((k, v.shape), np.empty_like(v)), v)

    default_threads, thread_bytes = stage.default_copy_threads, stage.THREAD_BYTES

    def loader(source, threads=None, pin=False, **kw):
        def run():
            os.environ["ARROWLOAD_PIN_TABLES"] = "1" if pin else "0"  # pin: the opt-in page-locking
            stage.WHOLE_READS = threads is None  # None: whole reads (the default)
            stage.default_copy_threads, stage.THREAD_BYTES = default_threads, thread_bytes
            if threads is not None:  # 0: inline; k: every batch on k staging threads
                stage.default_copy_threads = lambda: threads
                stage.THREAD_BYTES = 0
            with source.loader(args.batch, stack={"x": feats}, cache_dir=cache, **kw) as ld:
                for _ in ld:
                    pass
        return run

    cases = {"plain_pinned": plain_pinned, "host_copy_only": host_copy_only,
             "mem_torch_cpu": loader(in_memory, output="torch"),
             "mem_cuda_whole": loader(in_memory, output="torch", device="cuda"),
             "mem_cuda_pinned": loader(in_memory, pin=True, output="torch", device="cuda"),
             "mem_cuda_inline": loader(in_memory, 0, output="torch", device="cuda")}
    for k in (1, 2):
        cases[f"mem_cuda_threads_{k}"] = loader(in_memory, k, output="torch", device="cuda")
    if args.lake:
        cases.update({"lake_torch_cpu": loader(from_lake, output="torch"),
                      "lake_cuda_whole": loader(from_lake, output="torch", device="cuda"),
                      "lake_cuda_inline": loader(from_lake, 0, output="torch", device="cuda")})
    got = {name: [] for name in cases}
    for _ in range(4):
        for name, fn in cases.items():
            torch.cuda.synchronize()
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            torch.cuda.synchronize()
            got[name].append((time.perf_counter() - t0, time.process_time() - c0))
    print(f"{torch.cuda.get_device_name(0)}, batch {args.batch}: {nbytes / 1e6:.0f} MB an epoch, "
          f"{len(host)} batches of {nbytes / len(host) / 2**20:.1f} MiB")
    for name, r in got.items():
        wall = statistics.median(w for w, _ in r[1:])
        cpu = statistics.median(c for _, c in r[1:])
        print(f"{name:22s} {nbytes / wall / 1e9:7.2f} GB/s  wall {wall * 1e3:8.1f} ms  cpu {cpu * 1e3:8.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
