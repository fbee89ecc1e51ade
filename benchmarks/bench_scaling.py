#!/usr/bin/env python
"""How do arrowload's costs grow with the lake, beside polars'? Fixed + per-row CPU.

    python benchmarks/bench_scaling.py                 # 1M / 4M / 16M rows (16M: ~5.5 GB, written once)
    python benchmarks/bench_scaling.py --write         # ... and record the tables in RESULTS.md
    python benchmarks/bench_scaling.py --quick         # 200k / 500k / 1M rows: a smoke run

Workloads of ``run.py``, on lakes of every size (``ensure_lake``, the same generator):
W1 (unshuffled, x[4096, 16] + label) for arrowload, polars ``collect_batches`` and polars'
bare decode; W3 (shuffled, batch 1024) for arrowload's global shuffle (table build
included) and polars' streaming hash-sort shuffle. Each run is a fresh process (run.py's
fork server), interleaved, a verifying warm-up first, medians of ``--reps`` runs.

Per (peer, workload) the median CPU seconds (process user + system, all threads) and wall
seconds at each size are fitted by least squares as ``fixed + per_million x rows / 1e6``:
the fixed cost (opening, footers, planning, thread start-up, imports done lazily) and the
cost per million rows, arrowload's beside polars'.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "peers"))

import run  # noqa: E402
from benchlib import PEERS, WORKLOADS  # noqa: E402

SIZES = (1_000_000, 4_000_000, 16_000_000)
QUICK_SIZES = (200_000, 500_000, 1_000_000)
#: (peer, workload) pairs measured at every size, in the order of the tables.
CELLS = (("arrowload", "W1"), ("polars", "W1"), ("decode-polars", "W1"),
         ("arrowload", "W3"), ("arrowload-block", "W3"), ("polars-hashsort", "W3"))
MODES = {"W1": "unshuffled", "W3": "shuffled (global unless named)"}
BEGIN, END = "<!-- scaling:begin -->", "<!-- scaling:end -->"


def fit(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """Least squares ``y = a + b x`` over (x, y) points: (a, b), or None for fewer than two
    distinct x."""
    xs = [x for x, _ in points]
    if len(set(xs)) < 2:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(y for _, y in points)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - b * mx, b


def build(sizes, pairs) -> list[run.Cell]:
    cells = []
    for n in sizes:
        for peer, wk in pairs:
            cells.append(run.Cell(PEERS[peer], WORKLOADS[wk], n, capped=False))
    return cells


def medians(cells: list[run.Cell], field: str) -> dict[tuple[str, str], dict[int, float]]:
    out: dict[tuple[str, str], dict[int, float]] = {}
    for c in cells:
        m = c.median(field)
        if m is not None:
            out.setdefault((c.peer.key, c.workload.key), {})[c.lake_rows] = m
    return out


def render(cells: list[run.Cell], sizes, meta: list[str]) -> str:
    cpu, wall = medians(cells, "cpu_s"), medians(cells, "seconds")
    lines = meta + ["", "Fitted by least squares over the per-size medians: seconds = fixed + per-M × "
                    "rows / 1e6. CPU: process user + system seconds, all threads. Wall seconds run from "
                    "opening the dataset to the last batch (table build included for the global "
                    "shuffle).", "",
                    "| mode | peer | CPU fixed s | CPU s / M rows | wall fixed s | wall s / M rows "
                    "| CPU s / M rows ÷ polars' |", "|---|---|---:|---:|---:|---:|---:|"]
    fits = {}
    for key in cpu:
        fc = fit(sorted((n / 1e6, s) for n, s in cpu[key].items()))
        fw = fit(sorted((n / 1e6, s) for n, s in wall.get(key, {}).items()))
        fits[key] = (fc, fw)
    ref = {"W1": ("polars", "W1"), "W3": ("polars-hashsort", "W3")}
    for peer, wk in CELLS:
        if (peer, wk) not in fits:
            continue
        fc, fw = fits[(peer, wk)]
        r = fits.get(ref[wk], (None, None))[0]
        name = f"**{PEERS[peer].label}**" if PEERS[peer].role == "arrowload" else PEERS[peer].label
        rel = f"{fc[1] / r[1]:.2f}" if fc and r and r[1] > 0 and (peer, wk) != ref[wk] else "—"
        lines.append(f"| {wk} {MODES[wk]} | {name} | {_f(fc, 0)} | {_f(fc, 1)} | {_f(fw, 0)} | {_f(fw, 1)} "
                     f"| {rel} |")
    lines += ["", "Medians per lake size: rows/s, CPU s and wall s, peak RSS growth over the process "
              "at start (MiB).", "",
              "| mode | peer | " + " | ".join(f"{n / 1e6:g}M rows/s | CPU s | wall s | ΔRSS" for n in sizes) + " |",
              "|---|---|" + "---:|---:|---:|---:|" * len(sizes)]
    for peer, wk in CELLS:
        mine = {c.lake_rows: c for c in cells if c.peer.key == peer and c.workload.key == wk}
        if not mine:
            continue
        row = [f"{wk}", PEERS[peer].label]
        for n in sizes:
            c = mine.get(n)
            if c is None or not c.ok_runs():
                row += ["—"] * 4
                continue
            _, delta, _ = run.rss(c)
            row += [run._rate(run.rate(c)), run._s(c.median("cpu_s")), run._s(c.median("seconds")),
                    run._mib(delta)]
        lines.append("| " + " | ".join(row) + " |")
    failed = [c.key + ": " + (c.warm.get("error") or c.warm.get("unusable"))[:200] for c in cells
              if c.warm and ("error" in c.warm or "unusable" in c.warm)]
    if failed:
        lines += ["", "Runs that failed:", ""] + [f"- {f}" for f in failed]
    return "\n".join(lines) + "\n"


def _f(ab: tuple[float, float] | None, i: int) -> str:
    return "—" if ab is None else f"{ab[i]:.3f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--quick", action="store_true", help=f"lakes of {', '.join(f'{n:,}' for n in QUICK_SIZES)} rows")
    p.add_argument("--sizes", type=lambda s: [int(float(x)) for x in s.split(",")],
                   help="comma-separated lake sizes in rows (default 1e6,4e6,16e6)")
    p.add_argument("--reps", type=int, default=3, help="timed runs per cell after the warm-up (default 3)")
    p.add_argument("--write", action="store_true", help="record the tables in RESULTS.md")
    p.add_argument("--spawn", action="store_true", help="a fresh Python per run instead of forking")
    p.add_argument("--timeout", type=float, default=600, help="seconds per run (default 600)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.reps < 3:
        p.error("--reps must be at least 3 (medians of fewer runs are noise)")
    sizes = tuple(args.sizes or (QUICK_SIZES if args.quick else SIZES))
    log = lambda m: print(m, flush=True)  # noqa: E731

    def _term(*_):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, _term)
    command = shlex.join(["python", "benchmarks/bench_scaling.py", *(sys.argv[1:] if argv is None else argv)])
    t0 = time.perf_counter()
    cells = build(sizes, CELLS)
    log(f"{len(cells)} cells at {', '.join(f'{n:,}' for n in sizes)} rows, {args.reps} timed runs each")
    lakes = run.prepare_data(cells, log)
    load_start = run.load()
    try:
        run.measure(cells, lakes, args, log)
    except run.Mismatch as exc:
        print(f"CORRECTNESS FAILURE: {exc}", file=sys.stderr)
        return 2
    from bench_scan import machine
    meta = machine() + [
        f"- command: `{command}`",
        f"- data: `write_lake(rows=N, shards=8, row_group_size=65_536, emb_dim=64)` for N in "
        f"{', '.join(f'{n:_}' for n in sizes)} (benchmarks/data/events-N), read from the OS page cache",
        f"- method: 1 verifying warm-up + {args.reps} timed runs per cell, each a fresh process, rotated; medians",
        f"- load average at start {load_start}, at end {run.load()}",
        f"- wall time of the whole run: {time.perf_counter() - t0:.0f} s",
    ]
    body = render(cells, sizes, meta)
    print()
    print(body)
    if args.write:
        from bench_scan import replace_section
        title = "## Scaling: fixed and per-row cost, arrowload vs polars (`bench_scaling.py`)"
        replace_section(BEGIN, END, f"{BEGIN}\n{title}\n\n{body}\n{END}\n")
        log(f"recorded in {run.RESULTS.relative_to(run.REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
