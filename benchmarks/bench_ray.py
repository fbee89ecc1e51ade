#!/usr/bin/env python
"""A CPU-heavy Python transform: the threaded loader (1 and 2 threads) against executor="ray".

    python benchmarks/bench_ray.py                  # 200k rows, 3 timed epochs per contender
    python benchmarks/bench_ray.py --write          # ... and record the table in RESULTS.md
    python benchmarks/bench_ray.py --quick          # 20k rows, 1 epoch: a smoke run

The lake (``benchmarks/data/ray-<rows>/``, written once): ``id`` int64, ``label`` int8 and
``blob``, a binary column of UTF-8 text (about 120 words, ~0.8 KB a row), 8 files of row
groups of 8,192 rows. The transform is ``Dataset.map(tokenize)``: decode each row's bytes,
split into words and hash every word into a 32,768-word vocabulary in a Python loop (the
shape of real tokenization without a tokenizer package), giving ``tokens``
(fixed_size_list<int32>[64], padded / cut) and ``n_tokens``. It is Python bytecode holding
the GIL most of its time, so threads gain little running it side by side; Ray runs it in
worker processes (and pays for moving each unit's result through its object store).

Contenders, every one an epoch of ``loader(1024, shuffle="block", seed=0)`` (block
shuffle: the map runs per unit read, as it streams), numpy output, consumed without work:

- ``thread-1``: ``executor="thread", io_threads=1``;
- ``thread-2``: ``executor="thread", io_threads=2``;
- ``ray-<n>``: ``executor="ray"`` on ``ray.init(num_cpus=n)`` (``--ray-cpus``, default 2),
  whose start-up (seconds) is reported apart and not in the epochs;
- ``to_ray-<n>``: the same map through ``Dataset.to_ray()`` and Ray Data's
  ``iter_batches(batch_size=1024)`` (no shuffle: Ray Data's own order).

Each contender: one warm-up epoch (the OS page cache, Ray's worker processes), then
``--reps`` timed epochs; the table gives the median wall seconds, rows/s and the speed-up
over ``thread-1``. Every contender's epoch is checked: all rows, each once, and the same
token sums (the loaders' batches must equal ``thread-1``'s exactly).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import arrowload as al

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
BEGIN, END = "<!-- bench_ray:begin -->", "<!-- bench_ray:end -->"
VOCAB = 1 << 15
MAX_TOKENS = 64
WORDS = 120
BATCH = 1024


def write_lake(root: Path, rows: int, shards: int = 8, row_group_size: int = 8_192) -> Path:
    """The benchmark's lake (see the module doc); reused while its marker matches."""
    marker = root.with_suffix(".done")
    if marker.exists() and marker.read_text() == f"{rows}":
        return root
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    vocab = np.array([f"w{i:x}" for i in range(50_000)], dtype=object)
    per = -(-rows // shards)
    for k in range(shards):
        lo, hi = k * per, min(rows, (k + 1) * per)
        ids = np.arange(lo, hi, dtype=np.int64)
        words = rng.integers(0, len(vocab), size=(hi - lo, WORDS))
        blobs = [" ".join(vocab[w]).encode() for w in words]
        pq.write_table(pa.table({"id": ids, "label": (ids % 2).astype(np.int8),
                                 "blob": pa.array(blobs, pa.binary())}),
                       root / f"part-{k:05d}.parquet", row_group_size=row_group_size)
    marker.write_text(f"{rows}")
    return root


def tokenize(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Token ids of each row's text (GIL-bound Python, on purpose)."""
    out = np.zeros((batch.num_rows, MAX_TOKENS), dtype=np.int32)
    counts = np.zeros(batch.num_rows, dtype=np.int32)
    for r, blob in enumerate(batch.column("blob").to_pylist()):
        ids = [zlib.crc32(w.encode()) % VOCAB for w in blob.decode().split()]
        ids = [(i * 31 + len(ids)) % VOCAB for i in ids]
        counts[r] = len(ids)
        ids = ids[:MAX_TOKENS]
        out[r, :len(ids)] = ids
    tokens = pa.FixedSizeListArray.from_arrays(pa.array(out.reshape(-1)), MAX_TOKENS)
    return pa.RecordBatch.from_arrays([batch.column("id"), batch.column("label"), tokens, pa.array(counts)],
                                      names=["id", "label", "tokens", "n_tokens"])


def loader_epoch(ds, **kw) -> tuple[float, int, int, list]:
    ld = ds.loader(BATCH, shuffle="block", seed=0, **kw)
    t0 = time.perf_counter()
    rows, total, firsts = 0, 0, []
    for b in ld:
        rows += len(b["id"])
        total += int(b["tokens"].sum())
        firsts.append(int(b["id"][0]))
    wall = time.perf_counter() - t0
    ld.close()
    return wall, rows, total, firsts


def to_ray_epoch(ds) -> tuple[float, int, int, list]:
    rd = ds.to_ray()
    t0 = time.perf_counter()
    rows, total = 0, 0
    for b in rd.iter_batches(batch_size=BATCH, batch_format="pyarrow"):
        rows += b.num_rows
        total += int(pc.sum(pc.list_flatten(b.column("tokens"))).as_py() or 0)
    return time.perf_counter() - t0, rows, total, []


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=None, help="lake rows (default 200,000; 20,000 with --quick)")
    p.add_argument("--reps", type=int, default=None, help="timed epochs per contender (default 3; 1 with --quick)")
    p.add_argument("--ray-cpus", type=int, default=2, help="num_cpus of the local Ray (default 2)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--write", action="store_true", help="record the table in RESULTS.md")
    args = p.parse_args(argv)
    rows = args.rows if args.rows is not None else (20_000 if args.quick else 200_000)
    reps = args.reps or (1 if args.quick else 3)
    if rows < 1:
        raise SystemExit(f"--rows must be at least 1, got {rows}")
    lake = write_lake(HERE / "data" / f"ray-{rows}", rows)
    ds = al.dataset(str(lake)).map(tokenize, columns=["id", "label", "blob"], name="tokenize-v1")

    results: dict[str, list[float]] = {}
    checks: dict[str, tuple] = {}

    def measure(name: str, epoch) -> None:
        got = epoch()  # warm-up: page cache, worker processes
        checks[name] = got[1:]
        walls = [got[0]] if reps == 0 else []
        for _ in range(reps):
            walls.append(epoch()[0])
        results[name] = walls
        print(f"{name:>10}: median {statistics.median(walls):.2f} s over {len(walls)} epochs "
              f"({rows / statistics.median(walls):,.0f} rows/s)", flush=True)

    measure("thread-1", lambda: loader_epoch(ds, io_threads=1))
    measure("thread-2", lambda: loader_epoch(ds, io_threads=2))
    import ray
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    t0 = time.perf_counter()
    ray.init(num_cpus=args.ray_cpus, include_dashboard=False, log_to_driver=False)
    ray_start = time.perf_counter() - t0
    ray.data.DataContext.get_current().enable_progress_bars = False
    n = args.ray_cpus
    try:
        measure(f"ray-{n}", lambda: loader_epoch(ds, executor="ray"))
        measure(f"to_ray-{n}", lambda: to_ray_epoch(ds))
    finally:
        ray.shutdown()

    # every contender: all rows once, the same tokens; the loaders: thread-1's batch order
    base = checks["thread-1"]
    ok = True
    for name, (n_rows, total, firsts) in checks.items():
        if n_rows != rows or total != base[1] or (firsts and firsts != base[2]):
            print(f"MISMATCH: {name} gave {n_rows} rows, token sum {total} (thread-1: {base[0]}, {base[1]})",
                  file=sys.stderr)
            ok = False

    t1 = statistics.median(results["thread-1"])
    lines = [f"Lake: {rows:,} rows, `blob` ~0.8 KB of text a row, 8 files x row groups of 8,192; "
             f"`map(tokenize)` (GIL-bound Python), `loader({BATCH}, shuffle=\"block\")`, numpy output. "
             f"Machine: {platform.machine()}, {os.cpu_count()} cores; Ray {ray.__version__}, "
             f"`ray.init(num_cpus={n})` took {ray_start:.1f} s (not in the epochs). Medians of {reps} epochs "
             "after a warm-up; every contender checked (rows once each, token sums, the loaders' batch order).",
             "", "| contender | wall s | rows/s | vs thread-1 |", "|---|---:|---:|---:|"]
    for name, walls in results.items():
        w = statistics.median(walls)
        lines.append(f"| `{name}` | {w:.2f} | {rows / w:,.0f} | {t1 / w:.2f}x |")
    body = "\n".join(lines)
    print("\n" + body)
    if args.write:
        from bench_scan import replace_section
        replace_section(BEGIN, END, f"{BEGIN}\n## A CPU-heavy map: threads vs Ray (`bench_ray.py`)\n\n{body}\n{END}\n")
        print("recorded in benchmarks/RESULTS.md")
    return 0 if ok else 2


if __name__ == "__main__":
    sys.exit(main())
