#!/usr/bin/env python
"""A mixture epoch's rows/s against a single-selection loader's over the same lake.

The selection: ``country IN ('US', 'DE', 'IN')``, columns f0..f15 + label, batch 1024, one
epoch, as one loader (``ds.filter(...).select(...).loader(...)``) and as a mixture of its
three countries (``al.mix({"us": ..., "de": ..., "in": ...}, temperature=1.0)``: weights
proportional to the sizes, so the ``first_exhausted`` epoch draws nearly every selected row
once, like the single loader's). Per shuffle kind (global, block, none). Timed: building
the loader (exact counts and the random-access tables from the warm cache dir) and
iterating the epoch into an infinitely fast consumer; rows/s = rows yielded / seconds; CPU s:
the process's CPU time over the same span (on a shared machine the steadier figure).
Target (issue 15): mixture >= 0.9x the single selection's rows/s.

Each run is a fresh Python process (imports before the clock: arrowload, its mixture
loader module, polars), the two variants rotated,
after one warm-up of each; medians of ``--reps``.

    python benchmarks/bench_mix.py --quick     # 1M rows
    python benchmarks/bench_mix.py --write     # 4M rows, recorded in RESULTS.md
"""

from __future__ import annotations

import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from _common import bench_args, bench_parser, emit, rotated  # noqa: E402
from bench_scan import FULL_ROWS, QUICK_ROWS, ensure_lake, machine  # noqa: E402

import arrowload as al  # noqa: E402
# Imports before the clock for both variants: `import arrowload` brings the single
# selection's loader module; a mixture's (arrowload.mixture.loader, 14 ms) is imported on
# first use, so it is imported here too (polars comes with bench_scan).
import arrowload.mixture.loader  # noqa: E402, F401

COLUMNS = [f"f{i}" for i in range(16)] + ["label"]
COUNTRIES = ("US", "DE", "IN")
BATCH = 1024
KINDS = ("global", "block", "none")
BEGIN, END = "<!-- mix:begin -->", "<!-- mix:end -->"


def build(lake: str, variant: str, kind: str, cache: str):
    ds = al.dataset(lake)
    shuffle = False if kind == "none" else kind
    if variant == "single":
        where = "country IN (" + ", ".join(f"'{c}'" for c in COUNTRIES) + ")"
        return ds.filter(where).select(*COLUMNS).loader(BATCH, shuffle=shuffle, seed=0, cache_dir=cache)
    comps = {c.lower(): ds.filter(f"country = '{c}'").select(*COLUMNS) for c in COUNTRIES}
    return al.mix(comps, temperature=1.0, cache_dir=cache).loader(BATCH, shuffle=shuffle, cache_dir=cache)


def _epoch_here(lake: str, variant: str, kind: str, cache: str) -> dict:
    t0 = time.perf_counter()
    c0 = time.process_time()
    loader = build(lake, variant, kind, cache)
    built = time.perf_counter() - t0
    rows = 0
    for batch in loader:
        rows += len(batch["label"])
    seconds = time.perf_counter() - t0
    cpu = time.process_time() - c0
    loader.close()
    return {"rows": rows, "seconds": seconds, "build": built, "cpu": cpu}


def epoch(lake: Path, variant: str, kind: str, cache: str) -> dict:
    sys.path.insert(0, str(HERE / "peers"))
    from benchlib import run_fresh
    return json.loads(run_fresh(__file__, "--one", str(lake), variant, kind, cache))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--one":
        print(json.dumps(_epoch_here(*argv[1:5])))
        return 0
    p = bench_parser(__doc__)
    p.add_argument("--quick", action="store_true", help=f"{QUICK_ROWS:,} rows instead of {FULL_ROWS:,}")
    p.add_argument("--kinds", default=",".join(KINDS), help="shuffle kinds, comma-separated")
    args = bench_args(p, argv)
    rows = QUICK_ROWS if args.quick else FULL_ROWS
    lake = ensure_lake(rows)
    command = shlex.join(["python", "benchmarks/bench_mix.py", *argv])
    lines = machine() + [
        f"- command: `{command}`",
        f"- data: benchmarks/data/events-{rows} ({rows:,} rows), `country IN ('US', 'DE', 'IN')`, columns "
        f"f0..f15 + label, batch {BATCH}; mixture: the three countries, temperature=1.0 (first_exhausted)",
        f"- method: loader build + one epoch into an infinitely fast consumer, a fresh process per run "
        f"(imports before the clock); 1 warm-up + {args.reps} timed runs per variant, rotated; medians",
        "",
        "| shuffle | single rows | single rows/s | mixture rows | mixture rows/s | ratio (target >= 0.9) | "
        "mixture build s | single CPU s | mixture CPU s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    with tempfile.TemporaryDirectory(prefix="bench-mix-") as cache:
        for kind in args.kinds.split(","):
            # a warm-up of each first: counts, random-access tables, page cache
            runs = rotated(("single", "mixture"), args.reps, lambda v: epoch(lake, v, kind, cache))
            rate = {v: statistics.median(r["rows"] / r["seconds"] for r in rs) for v, rs in runs.items()}
            n = {v: rs[0]["rows"] for v, rs in runs.items()}
            build_s = statistics.median(r["build"] for r in runs["mixture"])
            cpu = {v: statistics.median(r["cpu"] for r in rs) for v, rs in runs.items()}
            lines.append(f"| {kind} | {n['single']:,} | {rate['single']:,.0f} | {n['mixture']:,} | "
                         f"{rate['mixture']:,.0f} | {rate['mixture'] / rate['single']:.2f}x | {build_s:.2f} | "
                         f"{cpu['single']:.2f} | {cpu['mixture']:.2f} |")
            print(lines[-1], flush=True)
    emit("\n".join(lines) + "\n", args.write, BEGIN, END,
         f"## A mixture epoch against a single selection (`bench_mix.py`), {rows:,} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
