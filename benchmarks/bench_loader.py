#!/usr/bin/env python
"""One epoch of arrowload's Loader against the bare decode of the same columns.

Workloads (each one epoch into an infinitely fast consumer that touches every batch):

  proj      f0..f15 + label, batch 4096, no shuffle
  filter    proj + ``country = 'US' AND label = 1``
  global    proj, batch 1024, global shuffle (gathered from the in-memory random-access table)
  block     proj, batch 1024, block shuffle (row groups permuted, rows mixed in windows of 8)
  emb       emb (fixed-size list of 64 float32) + label, batch 1024, no shuffle
  proj_stack, global_stack
            proj / global with f0..f15 stacked into one [B, 16] array (planned buffers):
            against proj / global they show what the one collation copy costs
  proj_1024 proj at batch 1024: the zero-copy reference for global (same bytes, same batches)
  emb_ref, tok_pad
            a second lake (``tokens-<rows>``) with ``emb`` (fixed-size list of 64 float32)
            and ``tok`` (list<float32> of 1..64 values): ``emb`` read zero-copy against
            ``tok`` padded to ``[B, 64]`` (``pad_lists=True, pad_to=64``), the same output bytes

Each runs with ``output="numpy"`` and ``output="torch"``, one epoch of an already built
loader per timed run (steady state; a new epoch each time). References in the same run, over
the same columns and filter: the tuned pyarrow scan (row-group sized batches,
``pre_buffer``, readahead) sliced into the same batch size and converted to numpy, and
polars' streaming reader (decode only). Ratios are medians of ``--reps`` interleaved runs
after a warm-up. Time to first batch is measured cold (empty cache dir: exact counts and,
for global shuffle, the random-access table are built), warm (cache present) and after
resuming at 90% of the epoch.

    python benchmarks/bench_loader.py --quick          # 1M rows
    python benchmarks/bench_loader.py --write          # 4M rows, recorded in RESULTS.md
    python benchmarks/bench_loader.py --memory         # peak memory per mode (bench_memory.py)
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_scan import DATA, FULL_ROWS, QUICK_ROWS, ensure_lake, replace_section  # noqa: E402

import arrowload as al  # noqa: E402

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS.md"
FEATURES = [f"f{i}" for i in range(16)]
FILTER_SQL = "country = 'US' AND label = 1"
FILTER_PA = (pc.field("country") == "US") & (pc.field("label") == 1)
FILTER_PL = (pl.col("country") == "US") & (pl.col("label") == 1)

WORKLOADS = {
    "proj": dict(columns=FEATURES + ["label"], filter=False, batch=4096, shuffle=False),
    "filter": dict(columns=FEATURES + ["label"], filter=True, batch=4096, shuffle=False),
    "global": dict(columns=FEATURES + ["label"], filter=False, batch=1024, shuffle="global"),
    "block": dict(columns=FEATURES + ["label"], filter=False, batch=1024, shuffle="block"),
    "emb": dict(columns=["emb", "label"], filter=False, batch=1024, shuffle=False),
    # planned-memory collation: the same bytes stacked into one [B, 16] array (one copy)
    "proj_stack": dict(columns=FEATURES + ["label"], filter=False, batch=4096, shuffle=False,
                       stack={"x": FEATURES}),
    "global_stack": dict(columns=FEATURES + ["label"], filter=False, batch=1024, shuffle="global",
                         stack={"x": FEATURES}),
    "proj_1024": dict(columns=FEATURES + ["label"], filter=False, batch=1024, shuffle=False),
    "emb_ref": dict(columns=["emb", "label"], filter=False, batch=1024, shuffle=False, lake="tokens"),
    "tok_pad": dict(columns=["tok", "label"], filter=False, batch=1024, shuffle=False, lake="tokens",
                    pad=64),
}
# (collated workload, zero-copy reference): the planned-memory target is >= 0.8x
COLLATION_PAIRS = (("proj_stack", "proj"), ("global_stack", "global"), ("global", "proj_1024"),
                   ("tok_pad", "emb_ref"))


def ensure_tokens_lake(rows: int, log=print) -> Path:
    """``tokens-<rows>``: id, label, emb (fixed-size list<float32>[64]) and tok (the first 1..64
    values of emb, a variable-length list), 8 shards of 65,536-row groups; written once."""
    import json

    import pyarrow.parquet as pq
    lake, marker = DATA / f"tokens-{rows}", DATA / f"tokens-{rows}.json"
    if marker.is_file() and json.loads(marker.read_text()).get("rows") == rows:
        log(f"data: reusing {lake.relative_to(HERE.parent)} ({rows:,} rows)")
        return lake
    shutil.rmtree(lake, ignore_errors=True)
    lake.mkdir(parents=True)
    rng = np.random.default_rng(0)
    per = -(-rows // 8)
    for i, start in enumerate(range(0, rows, per)):
        n = min(per, rows - start)
        emb = rng.standard_normal((n, 64), dtype=np.float32)
        lengths = rng.integers(1, 65, n)
        keep = np.arange(64) < lengths[:, None]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        table = pa.table({
            "id": pa.array(np.arange(start, start + n, dtype=np.int64)),
            "label": pa.array(rng.integers(0, 2, n).astype(np.int8)),
            "emb": pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), 64),
            "tok": pa.ListArray.from_arrays(pa.array(offsets), pa.array(emb[keep])),
        })
        pq.write_table(table, lake / f"part-{i:05d}.parquet", row_group_size=65_536, compression="zstd")
    marker.write_text(json.dumps({"rows": rows}))
    return lake


def touch(batch) -> int:
    """The infinitely fast consumer: look at every array once, count rows."""
    n = 0
    for v in batch.values():
        n = len(v)
    return n


def loader_args(w: dict) -> dict:
    pad = w.get("pad")
    return dict(shuffle=w["shuffle"], stack=w.get("stack"), pad_lists=bool(pad), pad_to=pad)


def make_loader(lake: Path, w: dict, output: str, cache: str):
    ds = al.dataset(str(lake))
    if w["filter"]:
        ds = ds.filter(FILTER_SQL)
    ds = ds.select(*w["columns"])
    return ds.loader(w["batch"], output=output, cache_dir=cache, **loader_args(w))


def run_epoch(loader, epoch: int) -> int:
    """One epoch of an already built loader (steady state: the selection index and, for
    global shuffle, the random-access table exist; their cost is in time-to-first-batch)."""
    loader.set_epoch(epoch)
    rows = 0
    for b in loader:
        rows += touch(b)
    return rows


def run_tuned(lake: Path, w: dict) -> int:
    """The tuned pyarrow scan, sliced into the same batches and converted to numpy."""
    d = pads.dataset(str(lake), format="parquet")
    scanner = d.scanner(columns=w["columns"], filter=FILTER_PA if w["filter"] else None,
                        batch_size=65_536, batch_readahead=4, fragment_readahead=2,
                        fragment_scan_options=pads.ParquetFragmentScanOptions(pre_buffer=True))
    rows = 0
    size = w["batch"]
    for rb in scanner.to_batches():
        for s in range(0, rb.num_rows, size):
            part = rb.slice(s, size)
            for col in part.columns:
                if pa.types.is_fixed_size_list(col.type):
                    col.flatten().to_numpy().reshape(len(col), -1)
                elif pa.types.is_list(col.type):  # pad to w["pad"] with numpy, as a user would
                    offsets = col.offsets.to_numpy()
                    lengths = np.diff(offsets)
                    out = np.zeros((len(col), w["pad"]), dtype=np.float32)
                    out[np.arange(w["pad"]) < lengths[:, None]] = \
                        col.values.slice(offsets[0], offsets[-1] - offsets[0]).to_numpy()
                else:
                    col.to_numpy()
            rows += part.num_rows
    return rows


def run_polars(lake: Path, w: dict) -> int:
    q = pl.scan_parquet(str(lake / "*.parquet"))
    if w["filter"]:
        q = q.filter(FILTER_PL)
    return q.select(w["columns"]).collect(engine="streaming").height


def first_batch(lake: Path, w: dict, cache: str, resume_at: float | None = None) -> float:
    t0 = time.perf_counter()
    ds = al.dataset(str(lake))
    if w["filter"]:
        ds = ds.filter(FILTER_SQL)
    ds = ds.select(*w["columns"])
    with ds.loader(w["batch"], output="numpy", cache_dir=cache, **loader_args(w)) as loader:
        if resume_at is not None:
            state = loader.state_dict()
            state["position"] = int(len(loader) * resume_at) * w["batch"]
            state["batches"] = int(len(loader) * resume_at)
            loader.load_state_dict(state)
        next(iter(loader))
    return time.perf_counter() - t0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help=f"{QUICK_ROWS:,} rows instead of {FULL_ROWS:,}")
    p.add_argument("--rows", type=int)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--only", nargs="*", choices=list(WORKLOADS))
    p.add_argument("--write", action="store_true", help="record the tables in benchmarks/RESULTS.md")
    p.add_argument("--memory", action="store_true",
                   help="instead: peak memory per mode on wide rows, each mode a fresh process "
                        "(bench_memory.py; pass its options after --)")
    args, rest = p.parse_known_args(argv)
    if args.memory:
        import bench_memory
        return bench_memory.main([a for a in rest if a != "--"])
    if rest:
        p.error(f"unrecognized arguments: {' '.join(rest)}")
    rows = args.rows if args.rows is not None else (QUICK_ROWS if args.quick else FULL_ROWS)
    lakes = {"events": ensure_lake(rows)}
    scratch = Path(tempfile.mkdtemp(prefix="arrowload-bench-"))
    cache = str(scratch / "cache")
    names = args.only or list(WORKLOADS)
    lines = []
    rates: dict[str, float] = {}
    try:
        for name in names:
            w = WORKLOADS[name]
            lake = lakes.get(w.get("lake", "events"))
            if lake is None:
                lake = lakes["tokens"] = ensure_tokens_lake(rows)
            first_line = len(lines)
            loaders = {out: make_loader(lake, w, out, cache) for out in ("numpy", "torch")}
            epochs = iter(range(1, 1_000_000))
            contenders = {
                "arrowload numpy": lambda: run_epoch(loaders["numpy"], next(epochs)),
                "arrowload torch": lambda: run_epoch(loaders["torch"], next(epochs)),
                "pyarrow tuned scan -> numpy": lambda: run_tuned(lake, w),
                "polars streaming (decode only)": lambda: run_polars(lake, w),
            }
            counts = {k: fn() for k, fn in contenders.items()}  # warm-up + correctness
            expect = counts["pyarrow tuned scan -> numpy"]
            for k, v in counts.items():
                if v != expect:
                    print(f"MISMATCH in {name}: {k} gave {v} rows, tuned scan {expect}", file=sys.stderr)
                    return 2
            times = {k: [] for k in contenders}
            keys = list(contenders)
            for rep in range(args.reps):
                for k in keys[rep % len(keys):] + keys[:rep % len(keys)]:
                    t0 = time.perf_counter()
                    contenders[k]()
                    times[k].append(time.perf_counter() - t0)
            med = {k: statistics.median(v) for k, v in times.items()}
            rates[name] = expect / med["arrowload numpy"]
            fastest_decode = min(med["pyarrow tuned scan -> numpy"], med["polars streaming (decode only)"])
            lines.append(f"\n#### {name}: {w['columns'][0]}.. ({len(w['columns'])} columns), "
                         f"batch {w['batch']}, shuffle={w['shuffle']}, filter={w['filter']} "
                         f"-- {expect:,} rows\n")
            lines.append("| contender | median s | rows/s | x tuned scan | x fastest decode |")
            lines.append("|---|---:|---:|---:|---:|")
            for k in keys:
                lines.append(f"| {k} | {med[k]:.3f} | {expect / med[k]:,.0f} | "
                             f"{med['pyarrow tuned scan -> numpy'] / med[k]:.2f} | {fastest_decode / med[k]:.2f} |")
            for ld in loaders.values():
                ld.close()
            shutil.rmtree(cache, ignore_errors=True)
            cold = first_batch(lake, w, cache)
            warm = statistics.median(first_batch(lake, w, cache) for _ in range(args.reps))
            resume = statistics.median(first_batch(lake, w, cache, 0.9) for _ in range(args.reps))
            lines.append(f"\ntime to first batch: cold {cold:.3f}s, warm {warm:.3f}s, "
                         f"resume at 90% {resume:.3f}s ({resume / cold:.2f}x cold)")
            print("\n".join(lines[first_line:]), flush=True)
        pairs = [(a, b) for a, b in COLLATION_PAIRS if a in rates and b in rates]
        if pairs:
            lines.append("\ncollation (numpy): " + "; ".join(
                f"{a} at {rates[a] / rates[b]:.2f}x the rows/s of {b}" for a, b in pairs)
                + " (target >= 0.8x: the collated path against the zero-copy path, same bytes)")
            print(lines[-1])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if args.write:
        header = (f"\n## Loader epoch (`bench_loader.py`), {dt.date.today()}\n\n"
                  f"Command: `{' '.join(shlex.quote(a) for a in ['python', 'benchmarks/bench_loader.py'] + (argv or sys.argv[1:]))}`  \n"
                  f"Machine: {os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}, "
                  f"pyarrow {pa.__version__}, polars {pl.__version__}, numpy {np.__version__}; {rows:,} rows.\n")
        begin, end = f"<!-- bench_loader rows={rows} -->", f"<!-- /bench_loader rows={rows} -->"
        replace_section(begin, end, begin + "\n" + header.lstrip("\n") + "\n".join(lines) + "\n" + end + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
