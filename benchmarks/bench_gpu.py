#!/usr/bin/env python
"""The Load stage on a CUDA GPU: host-to-device throughput and overlap with compute.

    python benchmarks/bench_gpu.py [--rows 2000000] [--batch 4096] [--write]

1. H2D bandwidth: arrowload's device path (whole reads copied to the device on its own
   stream, batches cut there) against a plain ``pinned_tensor.to("cuda", non_blocking=True)``
   of the same bytes, already pinned (the hardware ceiling for this copy size). Target
   >= 0.8x. The verdict takes arrowload's loader over the selection already in memory (an
   Arrow table: no decode, so the figure is the device path's, collation + staging + copy);
   beside it, the same with the opt-in ``ARROWLOAD_PIN_TABLES=1`` (the table page-locked in
   place; a loader's second epoch, its first timed apart), and the same loader over the
   Parquet lake (decode included).
2. Overlap: a synthetic training step (a few matmuls on the batch) consuming batches from
   arrowload (``device="cuda"``, stacked [B,16] features + an embedding, from the lake)
   against the same step over the same batches already resident on the GPU. Target:
   input-bound step time <= 1.1x the data-resident one.

The lake is ``ensure_lake(rows)`` of _common.py (benchmarks/data/events-<rows>), or
``--dir``. ``--write`` records the figures in RESULTS.md. Exits with status 3 and a message
when no CUDA device is available (CI never has one): nothing is measured or written.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import arrowload as al
from arrowload.datagen import write_lake

sys.path.insert(0, str(Path(__file__).resolve().parent))
BEGIN, END = "<!-- bench_gpu:begin -->", "<!-- bench_gpu:end -->"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--dir", default=None, help="lake directory (generated if missing; default: "
                                               "benchmarks/data/events-<rows>)")
    p.add_argument("--write", action="store_true", help="record the figures in RESULTS.md")
    args = p.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("no CUDA device available: nothing to measure", file=sys.stderr)
        return 3
    dev = torch.device("cuda")
    if args.dir:
        lake = Path(args.dir)
        if not lake.exists():
            write_lake(lake, rows=args.rows, shards=8, row_group_size=65_536, emb_dim=64)
    else:
        from _common import ensure_lake
        lake = ensure_lake(args.rows)
    feats = [f"f{i}" for i in range(16)]
    ds = al.dataset(str(lake)).select(*feats, "emb", "label")
    import pyarrow.dataset as pads
    in_memory = al.dataset(pads.dataset(str(lake), format="parquet").to_table(columns=[*feats, "emb", "label"]))
    cache = tempfile.mkdtemp(prefix="arrowload-gpu-cache-")
    lines = [f"- {torch.cuda.get_device_name(0)}, torch {torch.__version__}, {args.rows:,} rows, "
             f"batch {args.batch}, {args.reps} runs each after a warm-up, medians",
             "- command: `" + shlex.join(["python", "benchmarks/bench_gpu.py",
                                          *(sys.argv[1:] if argv is None else argv)]) + "`"]
    print("\n".join(lines))

    # -- 1. H2D throughput -------------------------------------------------------------
    copied = {}  # case -> (bytes copied with no host copy, bytes staged) in its last epoch

    def loader_of(source):
        return source.loader(args.batch, output="torch", device="cuda", stack={"x": feats},
                             cache_dir=cache, prefetch=512 << 20)

    def timed(loader) -> tuple[float, int]:
        """One epoch of ``loader`` to its last copy: (seconds, the batches' array bytes)."""
        torch.cuda.synchronize()
        t0, nbytes = time.perf_counter(), 0
        for b in loader:
            nbytes += sum(t.numel() * t.element_size() for t in b.values() if torch.is_tensor(t))
        torch.cuda.synchronize()
        return time.perf_counter() - t0, nbytes

    def copies(loader) -> tuple[int, int]:
        device = loader.stats().device
        return device.get("direct_bytes", 0), device.get("staged_bytes", 0)

    def arrowload_epoch(source=ds) -> tuple[float, int]:
        with loader_of(source) as loader:
            got = timed(loader)
            copied["lake" if source is ds else "in_memory"] = copies(loader)
            return got

    first_pinned = []  # seconds of a pinned loader's first epoch (it page-locks the table)

    def pinned_epoch() -> tuple[float, int]:   # the same, ARROWLOAD_PIN_TABLES=1 (opt-in)
        """A loader's second epoch: the first page-locks the table (once per loader),
        timed apart."""
        before = os.environ.get("ARROWLOAD_PIN_TABLES")
        os.environ["ARROWLOAD_PIN_TABLES"] = "1"
        try:
            with loader_of(in_memory) as loader:
                first_pinned.append(timed(loader)[0])
                got = timed(loader)
                copied["in_memory_pinned"] = copies(loader)
                return got
        finally:
            if before is None:
                del os.environ["ARROWLOAD_PIN_TABLES"]
            else:
                os.environ["ARROWLOAD_PIN_TABLES"] = before

    host = [{k: torch.from_numpy(np.array(v)).pin_memory() for k, v in b.items()}
            for b in ds.loader(args.batch, output="numpy", stack={"x": feats}, cache_dir=cache)]
    def plain_pinned() -> tuple[float, int]:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        nbytes = 0
        for b in host:
            for t in b.values():
                t.to(dev, non_blocking=True)
                nbytes += t.numel() * t.element_size()
        torch.cuda.synchronize()
        return time.perf_counter() - t0, nbytes

    # context: where the time of the device path goes
    def host_only() -> tuple[float, int]:      # the same loader, host batches only (no device)
        t0, nbytes = time.perf_counter(), 0
        for bt in in_memory.loader(args.batch, output="torch", stack={"x": feats}, cache_dir=cache):
            nbytes += sum(t.numel() * t.element_size() for t in bt.values() if torch.is_tensor(t))
        return time.perf_counter() - t0, nbytes

    unpinned = [{k: v.clone() for k, v in bt.items()} for bt in host]
    scratch = {}

    def host_memcpy() -> tuple[float, int]:    # one host copy of every array, on one thread
        t0, nbytes = time.perf_counter(), 0
        for bt in unpinned:
            for k, v in bt.items():
                out = scratch.setdefault((k, v.shape), torch.empty_like(v))
                np.copyto(out.numpy(), v.numpy())
                nbytes += v.numel() * v.element_size()
        return time.perf_counter() - t0, nbytes

    def pin_each() -> tuple[float, int]:       # DataLoader(pin_memory=True) + .to(non_blocking=True)
        torch.cuda.synchronize()
        t0, nbytes = time.perf_counter(), 0
        for bt in unpinned:
            for v in bt.values():
                v.pin_memory().to(dev, non_blocking=True)
                nbytes += v.numel() * v.element_size()
        torch.cuda.synchronize()
        return time.perf_counter() - t0, nbytes

    runs = {"in_memory": lambda: arrowload_epoch(in_memory), "in_memory_pinned": pinned_epoch,
            "lake": arrowload_epoch, "pinned": plain_pinned,
            "host_only": host_only, "memcpy": host_memcpy, "pin_each": pin_each}
    for fn in runs.values():                     # warm-up
        fn()
    got = {name: [] for name in runs}
    for _ in range(args.reps):                   # interleaved
        for name, fn in runs.items():
            got[name].append(fn())
    gbs = {name: statistics.median(n / s for s, n in r) / 1e9 for name, r in got.items()}
    a_gbs, e_gbs, b_gbs = gbs["in_memory"], gbs["lake"], gbs["pinned"]
    h2d = a_gbs / b_gbs
    lines.append(f"- {'**met**' if h2d >= 0.8 else '**missed**'}: host-to-device ≥ 80% of pinned `tensor.to`: "
                 f"arrowload's device path (in-memory table, no decode) {a_gbs:.2f} GB/s vs plain pinned "
                 f"`.to(non_blocking=True)` {b_gbs:.2f} GB/s = **{h2d:.2f}×**; from the Parquet lake "
                 f"(decode included) {e_gbs:.2f} GB/s = {e_gbs / b_gbs:.2f}×")
    print(lines[-1])
    direct, staged = copied["in_memory_pinned"]
    lines.append(f"- opt-in, `ARROWLOAD_PIN_TABLES=1` (the table page-locked in place): a loader's second epoch "
                 f"{gbs['in_memory_pinned']:.2f} GB/s = **{gbs['in_memory_pinned'] / b_gbs:.2f}×**, "
                 f"{direct / max(1, direct + staged):.0%} of its bytes with no host copy; its first epoch, "
                 f"which page-locks the table, {statistics.median(first_pinned):.3f} s")
    print(lines[-1])
    direct, staged = copied["in_memory"]
    pin = "on" if os.environ.get("ARROWLOAD_PIN_TABLES", "").strip() == "1" else "off"
    lines.append(f"- where it goes: whole reads go to the device; {direct / max(1, direct + staged):.0%} of "
                 f"the in-memory table's bytes went with no host copy (`ARROWLOAD_PIN_TABLES={pin}`: "
                 f"page-locked in place when on; a `stack=` group of one type is stacked on the GPU, "
                 f"its columns staged row by row or, page-locked, copied as they are); the same loader "
                 f"with host batches only "
                 f"{gbs['host_only']:.2f} GB/s; one host copy of the same arrays on one thread "
                 f"{gbs['memcpy']:.2f} GB/s; torch's `pin_memory()` + `.to(non_blocking=True)` per array "
                 f"(what `DataLoader(pin_memory=True)` does) {gbs['pin_each']:.2f} GB/s")
    print(lines[-1])

    # -- 2. overlap with a training step ---------------------------------------------------
    w1 = torch.randn(16 + 64, 4096, device=dev)
    w2 = torch.randn(4096, 4096, device=dev)

    def step(x, emb):
        h = torch.cat([x, emb], dim=1) @ w1
        for _ in range(4):
            h = torch.tanh(h @ w2)
        return h.sum()

    resident = [(torch.from_numpy(np.asarray(b["x"])).to(dev), torch.from_numpy(np.asarray(b["emb"])).to(dev))
                for b in ds.loader(args.batch, output="numpy", stack={"x": feats}, cache_dir=cache)]

    def resident_epoch() -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for x, e in resident:
            step(x, e)
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / len(resident)

    def loader_epoch() -> float:
        with ds.loader(args.batch, output="torch", device="cuda", stack={"x": feats}, cache_dir=cache) as ld:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            n = 0
            for bt in ld:
                step(bt["x"], bt["emb"])
                n += 1
            torch.cuda.synchronize()
            return (time.perf_counter() - t0) / n

    resident_epoch(), loader_epoch()
    rs, ls = [], []
    for _ in range(args.reps):                           # interleaved
        rs.append(resident_epoch())
        ls.append(loader_epoch())
    r, lo = statistics.median(rs), statistics.median(ls)
    lines.append(f"- {'**met**' if lo <= 1.1 * r else '**missed**'}: input-bound step ≤ 1.1× the data-resident "
                 f"step: fed by arrowload {lo * 1e3:.2f} ms vs resident {r * 1e3:.2f} ms = **{lo / r:.2f}×**")
    print(lines[-1])
    if args.write:
        from _common import replace_section
        body = "\n".join(lines)
        replace_section(BEGIN, END, f"{BEGIN}\n## The device hand-off on a GPU (`bench_gpu.py`)\n\n{body}\n{END}\n")
        print("recorded in benchmarks/RESULTS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
