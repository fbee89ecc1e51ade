#!/usr/bin/env python
"""An unshuffled filtered epoch per kind of filter: arrowload against polars batches.

One filter per column type a lake filters on: a string equality (W2's), an integer range
that prunes row groups (W2i's), a float32 feature against a decimal literal, a timestamp
range, a ``LIKE`` prefix, a decimal, and a float ``IN`` list. Each as an arrowload loader
(``al.dataset(lake).filter(sql).select(f0..f15, label).loader(4096, output="torch",
stack={"x": f0..f15})``) and as polars' ``scan_parquet(...).filter(...).select(...)
.collect_batches(chunk_size=4096)`` turned into the same tensors (``to_numpy`` of the 16
features made C-contiguous, and the label). Timed from ``al.dataset`` / ``pl.scan_parquet``
to the end of the epoch, into an infinitely fast consumer; CPU s: the process's CPU time
over the same span. Both must yield the same rows (checked: the count and the label's sum).

Each run is a fresh Python process (imports before the clock), the two variants rotated,
after one warm-up of each; medians of ``--reps``. The loader's cache dir is kept between
runs (counts and decoder choices warm, as in a training job's second process).

    python benchmarks/bench_filters.py --quick     # 1M rows
    python benchmarks/bench_filters.py --write     # 4M rows, recorded in RESULTS.md
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

from _common import bench_args, bench_parser, emit, rotated  # noqa: E402
from bench_scan import FULL_ROWS, QUICK_ROWS, ensure_lake, machine  # noqa: E402

FEATURES = [f"f{i}" for i in range(16)]
BATCH = 4096
#: name -> (SQL for arrowload, polars expression as Python text over ``pl``; ``{bound}``:
#: a tenth of the lake's ids)
FILTERS = {
    "string": ("country = 'US' AND label = 1", "(pl.col('country') == 'US') & (pl.col('label') == 1)"),
    "int range": ("id < {bound}", "pl.col('id') < {bound}"),
    "float32": ("f0 > 0.9 AND label = 1", "(pl.col('f0') > pl.lit(0.9, dtype=pl.Float32)) & (pl.col('label') == 1)"),
    "timestamp": ("country = 'US' AND ts >= '2024-03-01 00:00:00'",
                  "(pl.col('country') == 'US') & (pl.col('ts') >= pl.datetime(2024, 3, 1))"),
    "LIKE prefix": ("country LIKE 'U%' AND label = 1", "pl.col('country').str.starts_with('U') & (pl.col('label') == 1)"),
    "decimal": ("price > 50 AND label = 1", "(pl.col('price') > 50) & (pl.col('label') == 1)"),
    "float IN": ("score IN (0.5, 0.25, 0.75) OR label = 1",
                 "pl.col('score').is_in([0.5, 0.25, 0.75]) | (pl.col('label') == 1)"),
}
BEGIN, END = "<!-- filters:begin -->", "<!-- filters:end -->"


def _epoch_here(lake: str, variant: str, name: str, cache: str, bound: str) -> dict:
    import numpy as np
    import polars as pl
    import torch
    import arrowload as al
    sql, expr = (f.format(bound=bound) for f in FILTERS[name])
    t0, c0 = time.perf_counter(), time.process_time()
    rows, labels = 0, 0
    if variant == "arrowload":
        d = al.dataset(lake).filter(sql).select(*FEATURES, "label")
        with d.loader(BATCH, output="torch", stack={"x": FEATURES}, cache_dir=cache) as loader:
            for b in loader:
                rows += len(b["label"])
                labels += int(b["label"].sum())
    else:
        lf = pl.scan_parquet(lake + "/*.parquet").filter(eval(expr, {"pl": pl})).select(FEATURES + ["label"])
        for df in lf.collect_batches(chunk_size=BATCH, engine="streaming"):
            x = torch.from_numpy(np.ascontiguousarray(df.select(FEATURES).to_numpy()))
            y = torch.from_numpy(df["label"].to_numpy().copy())
            assert x.shape == (len(y), len(FEATURES))
            rows += len(y)
            labels += int(y.sum())
    return {"rows": rows, "labels": labels, "seconds": time.perf_counter() - t0, "cpu": time.process_time() - c0}


def epoch(lake: Path, variant: str, name: str, cache: str, bound: int) -> dict:
    sys.path.insert(0, str(HERE / "peers"))
    from benchlib import run_fresh
    return json.loads(run_fresh(__file__, "--one", str(lake), variant, name, cache, str(bound)))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--one":
        print(json.dumps(_epoch_here(*argv[1:6])))
        return 0
    p = bench_parser(__doc__)
    p.add_argument("--quick", action="store_true", help=f"{QUICK_ROWS:,} rows instead of {FULL_ROWS:,}")
    p.add_argument("--filters", default=",".join(FILTERS), help="filter names, comma-separated")
    args = bench_args(p, argv)
    names = args.filters.split(",")
    unknown = [n for n in names if n not in FILTERS]
    if unknown:
        p.error(f"unknown filter {unknown[0]!r}; use some of: {', '.join(FILTERS)}")
    rows = QUICK_ROWS if args.quick else FULL_ROWS
    lake = ensure_lake(rows)
    bound = rows // 10
    command = shlex.join(["python", "benchmarks/bench_filters.py", *argv])
    lines = machine() + [
        f"- command: `{command}`",
        f"- data: benchmarks/data/events-{rows} ({rows:,} rows), columns f0..f15 (stacked to x[B, 16]) + label, "
        f"batch {BATCH}, no shuffle",
        f"- method: al.dataset / pl.scan_parquet to the epoch's end, a fresh process per run (imports before "
        f"the clock); 1 warm-up + {args.reps} timed runs per variant, rotated; medians",
        "",
        "| filter | SQL | rows | arrowload s | polars batches s | ratio (rows/s) | arrowload CPU s | polars CPU s |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    with tempfile.TemporaryDirectory(prefix="bench-filters-") as cache:
        for name in names:
            # a warm-up of each first: counts, decoder choices, page cache
            runs = rotated(("arrowload", "polars"), args.reps, lambda v: epoch(lake, v, name, cache, bound))
            got = {(r["rows"], r["labels"]) for rs in runs.values() for r in rs}
            if len(got) != 1:
                raise SystemExit(f"{name}: arrowload and polars yield other rows: {sorted(got)}")
            s = {v: statistics.median(r["seconds"] for r in rs) for v, rs in runs.items()}
            cpu = {v: statistics.median(r["cpu"] for r in rs) for v, rs in runs.items()}
            sql = FILTERS[name][0].format(bound=bound)
            lines.append(f"| {name} | `{sql}` | {runs['arrowload'][0]['rows']:,} | {s['arrowload']:.3f} | "
                         f"{s['polars']:.3f} | {s['polars'] / s['arrowload']:.2f}x | {cpu['arrowload']:.3f} | "
                         f"{cpu['polars']:.3f} |")
            print(lines[-1], flush=True)
    emit("\n".join(lines) + "\n", args.write, BEGIN, END,
         f"## Filtered epochs by kind of filter (`bench_filters.py`), {rows:,} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
