#!/usr/bin/env python
"""Fixed costs of a cold process: what a training script pays before its first batch.

Each measurement runs in a fresh interpreter (``python -c``), the contenders interleaved,
and reports medians of CPU seconds (``resource.getrusage``, the process's user + system
time) beside wall seconds. Phases:

- ``import``: ``import arrowload`` / ``import polars``;
- ``plan``: opening and planning ``dataset(lake).select(f0..f15, label)``: listing,
  footers, schema, optimizer, splits with their bytes, the row count from footers (after
  a ``gc.collect()``, so an earlier import's garbage is not charged here);
- ``filter``: the first ``filter("country = 'US' AND label = 1")`` of the process (``--filter``
  gives another text);
- ``first``: building ``loader(4096, stack={"x": f0..f15})`` and taking its first batch,
  against polars ``scan_parquet(...).select(...).collect_batches(chunk_size=4096)``'s first
  batch as the same ``[4096, 16]`` numpy array.

``--against PATH`` adds a second arrowload checkout (its repository root) as a contender,
for before / after figures in one run. Profiles: ``--profile`` prints a cProfile of the
``plan`` phase.

    python benchmarks/bench_fixed.py --lake benchmarks/data/events-4000000 --reps 7
    python benchmarks/bench_fixed.py --lake /tmp/lake64 --against /path/to/other/checkout
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks" / "peers"))
from benchlib import bench_env  # noqa: E402

_CLOCK = """
import gc, json, resource, sys, time
def _now():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, time.perf_counter()
"""

PHASES = {
    "import": _CLOCK + """
c0, w0 = _now()
import arrowload
c1, w1 = _now()
print(json.dumps({"cpu": c1 - c0, "wall": w1 - w0}))
""",
    "plan": _CLOCK + """
import arrowload as al
gc.collect()
cols = [f"f{i}" for i in range(16)]
c0, w0 = _now()
s = al.dataset(LAKE).select(*cols, "label")
s.optimized_plan(); s.splits(); n = s.count()
c1, w1 = _now()
assert n > 0
print(json.dumps({"cpu": c1 - c0, "wall": w1 - w0}))
""",
    "filter": _CLOCK + """
import arrowload as al
d = al.dataset(LAKE); d.schema
gc.collect()
c0, w0 = _now()
d.filter(FILTER)
c1, w1 = _now()
print(json.dumps({"cpu": c1 - c0, "wall": w1 - w0}))
""",
    "first": _CLOCK + """
import arrowload as al
gc.collect()
cols = [f"f{i}" for i in range(16)]
c0, w0 = _now()
loader = al.dataset(LAKE).select(*cols, "label").loader(4096, stack={"x": cols})
b = next(iter(loader))
c1, w1 = _now()
assert b["x"].shape == (4096, 16)
loader.close()
print(json.dumps({"cpu": c1 - c0, "wall": w1 - w0}))
""",
}

POLARS = {
    "import": _CLOCK + """
c0, w0 = _now()
import polars
c1, w1 = _now()
print(json.dumps({"cpu": c1 - c0, "wall": w1 - w0}))
""",
    "first": _CLOCK + """
import glob
import polars as pl
gc.collect()
cols = [f"f{i}" for i in range(16)]
c0, w0 = _now()
lf = pl.scan_parquet(sorted(glob.glob(LAKE + "/*.parquet"))).select(*cols, "label")
b = next(iter(lf.collect_batches(chunk_size=4096)))
x = b.select(cols).to_numpy()
c1, w1 = _now()
assert x.shape[1] == 16
print(json.dumps({"cpu": c1 - c0, "wall": w1 - w0}))
""",
}


def run(code: str, lake: str, root: Path | None, filter_text: str = "country = 'US' AND label = 1") -> dict:
    env = bench_env()
    if root is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    # from a neutral folder: ``python -c`` puts the working directory first on sys.path
    out = subprocess.run([sys.executable, "-c", f"LAKE = {lake!r}\nFILTER = {filter_text!r}\n" + code],
                         capture_output=True, text=True, env=env, timeout=600, cwd=tempfile.gettempdir())
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lake", default=str(REPO / "benchmarks" / "data" / "events-4000000"))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--against", help="another arrowload checkout (repository root) to compare with")
    ap.add_argument("--phases", default="import,plan,filter,first")
    ap.add_argument("--no-polars", action="store_true")
    ap.add_argument("--filter", default="country = 'US' AND label = 1", help="the filter phase's SQL text")
    ap.add_argument("--profile", action="store_true", help="print a cProfile of the plan phase")
    args = ap.parse_args(argv)
    lake = os.path.abspath(args.lake)
    contenders = {"arrowload": (PHASES, REPO)}
    if args.against:
        contenders["arrowload@" + Path(args.against).name] = (PHASES, Path(args.against).resolve())
    if not args.no_polars:
        contenders["polars"] = (POLARS, None)
    if args.profile:
        code = PHASES["plan"].replace("c0, w0 = _now()", "import cProfile, pstats\npr = cProfile.Profile()\n"
                                      "pr.enable()\nc0, w0 = _now()").replace(
            "c1, w1 = _now()", "c1, w1 = _now()\npr.disable()\n"
            "pstats.Stats(pr, stream=sys.stderr).sort_stats('cumulative').print_stats(25)")
        env = bench_env(PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        out = subprocess.run([sys.executable, "-c", f"LAKE = {lake!r}\n" + code], capture_output=True,
                             text=True, env=env, cwd=tempfile.gettempdir())
        print(out.stderr)
    results: dict[tuple[str, str], list[dict]] = {}
    for _ in range(args.reps):
        for phase in args.phases.split(","):
            for name, (codes, root) in contenders.items():
                if phase in codes:
                    results.setdefault((name, phase), []).append(run(codes[phase], lake, root, args.filter))
    print(f"lake {lake}, {args.reps} fresh processes per cell, interleaved; medians")
    print(f"| phase | {' | '.join(contenders)} |")
    print("|---|" + "---:|" * len(contenders))
    for phase in args.phases.split(","):
        cells = []
        for name in contenders:
            runs = results.get((name, phase))
            if not runs:
                cells.append("—")
                continue
            cpu = statistics.median(r["cpu"] for r in runs)
            wall = statistics.median(r["wall"] for r in runs)
            cells.append(f"{cpu:.3f} CPU s / {wall:.3f} s")
        print(f"| {phase} | {' | '.join(cells)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
