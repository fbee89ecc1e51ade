#!/usr/bin/env python
"""Time to the first batch after an elastic resume, against a fresh start.

A training job ran on 4 ranks and stopped at 90% of an epoch; it restarts on 2. Measured on
rank 0 of 2, from opening the dataset to the first batch in hand (building the loader, its
exact counts and, for the global shuffle, its random-access table from the warm cache dir,
included): a fresh start of the epoch, the elastic resume (the 4-rank state loaded at 2: the
rest of the epoch laid out anew, made of the unread tenth of each of the 4 old lanes), and a
resume at the same world size (2 -> 2 at 90%) for reference. Per shuffle kind (none, block,
global), columns f0..f15 + label, batch 1024. Target (issue 14): elastic <= 1.1x fresh.

Each timed run is a fresh Python process (imports before the clock), the three variants
rotated, after one warm-up of each (page cache and cache dir warm; what a restarted job on the
same machine sees). Medians of ``--reps``.

    python benchmarks/bench_elastic.py --quick     # 1M rows
    python benchmarks/bench_elastic.py --write     # 4M rows, recorded in RESULTS.md
"""

from __future__ import annotations

import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from _common import bench_args, bench_parser, emit  # noqa: E402
from bench_scan import FULL_ROWS, QUICK_ROWS, ensure_lake, machine  # noqa: E402

import arrowload as al  # noqa: E402

COLUMNS = [f"f{i}" for i in range(16)] + ["label"]
BATCH = 1024
KINDS = ("none", "block", "global")
BEGIN, END = "<!-- elastic:begin -->", "<!-- elastic:end -->"


def build(lake: Path, kind: str, cache: str, rank: int, world: int):
    return al.dataset(str(lake)).select(*COLUMNS).loader(BATCH, shuffle=kind, seed=0, rank=rank,
                                                         world_size=world, cache_dir=cache)


def state_at(lake: Path, kind: str, cache: str, world: int, fraction: float) -> dict:
    """The global state every rank of ``world`` writes after ``fraction`` of the epoch's
    batches (the batches are not read: a state is positions only)."""
    with build(lake, kind, cache, 0, world) as loader:
        state = loader.state_dict()
        k = int(len(loader) * fraction)
    rows = loader._lane_rows(())
    state.update(position=min(k * BATCH, rows), batches=k)
    return state


def first_batch(lake: Path, kind: str, cache: str, state: dict | None) -> float:
    """Seconds to the first batch in a fresh Python process (imports done before the clock
    starts, as in a training program that imported its libraries already)."""
    import json
    sys.path.insert(0, str(HERE / "peers"))
    from benchlib import run_fresh
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(state, f)
    try:
        return float(run_fresh(__file__, "--one", str(lake), kind, cache, f.name))
    finally:
        os.unlink(f.name)


def _one(lake: str, kind: str, cache: str, state_path: str) -> None:
    import json
    with open(state_path) as f:
        state = json.load(f)
    print(_first_batch_here(Path(lake), kind, cache, state))


def _first_batch_here(lake: Path, kind: str, cache: str, state: dict | None) -> float:
    t0 = time.perf_counter()
    with build(lake, kind, cache, 0, 2) as loader:
        if state is not None:
            loader.load_state_dict(state)
        it = iter(loader)
        next(it)
        seconds = time.perf_counter() - t0
        it.close()
    return seconds


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--one":  # one run, in the fresh process first_batch started
        _one(*argv[1:5])
        return 0
    p = bench_parser(__doc__, reps=7)
    p.add_argument("--quick", action="store_true", help=f"{QUICK_ROWS:,} rows instead of {FULL_ROWS:,}")
    p.add_argument("--kinds", default=",".join(KINDS), help="shuffle kinds, comma-separated")
    args = bench_args(p, argv)
    rows = QUICK_ROWS if args.quick else FULL_ROWS
    lake = ensure_lake(rows)
    command = shlex.join(["python", "benchmarks/bench_elastic.py", *argv])
    lines = machine() + [
        f"- command: `{command}`",
        f"- data: benchmarks/data/events-{rows} ({rows:,} rows), columns f0..f15 + label, batch {BATCH}",
        f"- method: rank 0 of 2, opening the dataset to the first batch, a fresh process per run (imports "
        f"before the clock); 1 warm-up + {args.reps} timed runs per variant, rotated; medians",
        "",
        "| shuffle | fresh start s | elastic 4 -> 2 at 90% s | ratio (target <= 1.1) | same world 2 -> 2 at 90% s |",
        "|---|---:|---:|---:|---:|",
    ]
    with tempfile.TemporaryDirectory(prefix="bench-elastic-") as cache:
        for kind in args.kinds.split(","):
            variants = {"fresh": None, "elastic": state_at(lake, kind, cache, 4, 0.9),
                        "same": state_at(lake, kind, cache, 2, 0.9)}
            times: dict[str, list[float]] = {v: [] for v in variants}
            for v, state in variants.items():  # warm-up
                first_batch(lake, kind, cache, state)
            for rep in range(args.reps):
                order = list(variants)[rep % 3:] + list(variants)[:rep % 3]
                for v in order:
                    times[v].append(first_batch(lake, kind, cache, variants[v]))
            med = {v: statistics.median(t) for v, t in times.items()}
            lines.append(f"| {kind} | {med['fresh']:.3f} | {med['elastic']:.3f} | "
                         f"{med['elastic'] / med['fresh']:.2f}x | {med['same']:.3f} |")
            print(lines[-1], flush=True)
    emit("\n".join(lines) + "\n", args.write, BEGIN, END,
         f"## Time to the first batch after an elastic resume (`bench_elastic.py`), {rows:,} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
