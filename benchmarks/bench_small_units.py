#!/usr/bin/env python
"""An unshuffled epoch over small units (many small files, tiny row groups) against polars.

Lakes whose units hold a few hundred rows: streaming ingestion leaves many small files,
some writers flush tiny row groups. Per unit, the loader has fixed costs (a task, its
hand-off between threads); polars' streaming scan has far smaller ones. Two lakes of
1,000,000 rows (columns ``id`` int64, ``x`` / ``y`` float32, ``label`` int8):

- ``files``: 2,000 files of 500 rows each;
- ``groups``: one file of 10,000 row groups of 100 rows.

Variants, each a fresh Python process (imports before the clock: arrowload and polars), the
two rotated after a warm-up of each, medians of ``--reps``:

- ``arrowload``: ``al.dataset(lake).select(...).loader(4096, shuffle=False, output="numpy")``,
  built and iterated (the build reads every footer: included);
- ``polars``: ``pl.scan_parquet(...).select(...).collect_batches(chunk_size=4096,
  engine="streaming")``, each batch to numpy (``DataFrame.to_numpy`` per column).

rows/s = rows / wall seconds; CPU s is the process's over the same span (on a shared
machine the steadier figure).

    python benchmarks/bench_small_units.py            # both lakes
    python benchmarks/bench_small_units.py --write    # recorded in RESULTS.md
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
from bench_scan import machine  # noqa: E402

ROWS = 1_000_000
COLUMNS = ["id", "x", "y", "label"]
BATCH = 4096
LAKES = {"files": "2,000 files of 500 rows", "groups": "1 file, 10,000 row groups of 100 rows"}
BEGIN, END = "<!-- small-units:begin -->", "<!-- small-units:end -->"


def ensure_lake(kind: str) -> Path:
    """The lake ``kind`` under benchmarks/data (written once)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    path = HERE / "data" / f"small-units-{kind}-{ROWS}"
    done = path / "_done"
    if done.exists():
        return path
    path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    table = pa.table({"id": np.arange(ROWS, dtype=np.int64),
                      "x": rng.standard_normal(ROWS).astype(np.float32),
                      "y": rng.standard_normal(ROWS).astype(np.float32),
                      "label": rng.integers(0, 2, ROWS).astype(np.int8)})
    if kind == "files":
        for k in range(2000):
            pq.write_table(table.slice(k * 500, 500), path / f"part-{k:05d}.parquet")
    else:
        pq.write_table(table, path / "part-00000.parquet", row_group_size=100)
    done.touch()
    return path


def _epoch_here(lake: str, variant: str, cache: str) -> dict:
    import arrowload as al
    import polars as pl  # noqa: F401 - imported before the clock for both variants
    t0 = time.perf_counter()
    c0 = time.process_time()
    rows = 0
    if variant == "arrowload":
        with al.dataset(lake).select(*COLUMNS).loader(BATCH, shuffle=False, output="numpy",
                                                     cache_dir=cache) as loader:
            for batch in loader:
                rows += len(batch["id"])
    else:
        frames = pl.scan_parquet(lake + "/*.parquet").select(COLUMNS).collect_batches(
            chunk_size=BATCH, engine="streaming")
        for df in frames:
            cols = {c: df[c].to_numpy() for c in COLUMNS}
            rows += len(cols["id"])
    return {"rows": rows, "seconds": time.perf_counter() - t0, "cpu": time.process_time() - c0}


def epoch(lake: Path, variant: str, cache: str) -> dict:
    sys.path.insert(0, str(HERE / "peers"))
    from benchlib import run_fresh
    return json.loads(run_fresh(__file__, "--one", str(lake), variant, cache))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--one":
        print(json.dumps(_epoch_here(*argv[1:4])))
        return 0
    p = bench_parser(__doc__)
    p.add_argument("--lakes", default=",".join(LAKES), help="lakes, comma-separated (files, groups)")
    args = bench_args(p, argv)
    command = shlex.join(["python", "benchmarks/bench_small_units.py", *argv])
    lines = machine() + [
        f"- command: `{command}`",
        f"- data: {ROWS:,} rows, columns {', '.join(COLUMNS)}; batch {BATCH}, unshuffled, numpy output",
        f"- method: build + one epoch, a fresh process per run (imports before the clock); 1 warm-up + "
        f"{args.reps} timed runs per variant, rotated; medians",
        "",
        "| lake | arrowload rows/s | polars batches rows/s | ratio | arrowload CPU s | polars CPU s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    with tempfile.TemporaryDirectory(prefix="bench-small-") as cache:
        for kind in args.lakes.split(","):
            lake = ensure_lake(kind)
            runs = rotated(("arrowload", "polars"), args.reps, lambda v: epoch(lake, v, cache))
            rows = {v: rs[0]["rows"] for v, rs in runs.items()}
            if rows["arrowload"] != rows["polars"] or rows["polars"] != ROWS:
                raise SystemExit(f"row counts differ: {rows}")
            rate = {v: statistics.median(r["rows"] / r["seconds"] for r in rs) for v, rs in runs.items()}
            cpu = {v: statistics.median(r["cpu"] for r in rs) for v, rs in runs.items()}
            lines.append(f"| {LAKES[kind]} | {rate['arrowload']:,.0f} | {rate['polars']:,.0f} | "
                         f"{rate['arrowload'] / rate['polars']:.2f}x | {cpu['arrowload']:.2f} | {cpu['polars']:.2f} |")
            print(lines[-1], flush=True)
    emit("\n".join(lines) + "\n", args.write, BEGIN, END,
         "## Small units: many small files, tiny row groups (`bench_small_units.py`)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
