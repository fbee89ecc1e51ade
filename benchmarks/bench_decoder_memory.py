#!/usr/bin/env python
"""Does a wrong remembered decoder choice correct itself? (``formats/decoder_choice/v1``)

Builds a W1 loader (columns f0..f15 + label, batch 4096, torch, ``stack={"x": f0..f15}``,
one unshuffled epoch) over the 4M-row benchmark lake with a fresh cache dir; one fresh
process measures and writes the decoder_choice document; then the document is replaced by
a lie (``--lie polars``: polars 1.80e-9 s/B, pyarrow 2.24e-9 s/B, chosen polars -- the
document found on the benchmark machine; ``--lie pyarrow``: the other way round) and
``--processes`` fresh processes each run one epoch. Per process: the epoch's wall and
process CPU seconds (imports before the clock), the stats' "decoded by" line, the
measurements the unit reader took in that process, and the document's costs after it.

    python benchmarks/bench_decoder_memory.py                  # this checkout
    python benchmarks/bench_decoder_memory.py --code OLD_DIR   # another checkout's arrowload
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

EPOCH = r"""
import json, os, re, sys, time
import arrowload as al
lake, cache = sys.argv[1], sys.argv[2]
cols = [f"f{i}" for i in range(16)]
ld = al.dataset(lake).select(*cols, "label").loader(4096, output="torch", stack={"x": cols}, cache_dir=cache)
t0, c0 = time.perf_counter(), time.process_time()
for b in ld:
    pass
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
found = re.search(r"\(decoded by ([^)]*)\)", str(ld.stats()))
reader = getattr(ld._source, "reader", None)
described = reader.describe() if reader is not None else {}
print(json.dumps({"wall": wall, "cpu": cpu, "decoded": found.group(1) if found else None,
                  "measured": described.get("measured_in_process"), "file": al.__file__}))
"""

LIES = {"polars": ("polars", {"pyarrow": 2.24e-9, "polars": 1.80e-9}),
        "pyarrow": ("pyarrow", {"pyarrow": 1.38e-9, "polars": 3.0e-9})}


def epoch(code: str, lake: str, cache: str) -> dict:
    # run from the cache dir, so that the current directory's arrowload cannot shadow ``code``
    proc = subprocess.run([sys.executable, "-c", EPOCH, lake, cache], capture_output=True, text=True,
                          cwd=cache, env=dict(os.environ, PYTHONPATH=code))
    if proc.returncode:
        sys.exit(proc.stderr[-3000:])
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["file"].startswith(os.path.abspath(code)), out["file"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--code", default=str(HERE.parent), help="directory holding the arrowload package to run")
    ap.add_argument("--lake", default=str(HERE / "data" / "events-4000000"))
    ap.add_argument("--processes", type=int, default=5)
    ap.add_argument("--lie", choices=sorted(LIES), default="polars", help="the decoder the lie makes cheaper")
    args = ap.parse_args()
    if not os.path.isdir(args.lake):
        sys.exit(f"no lake at {args.lake}: run benchmarks/bench_scan.py once to make it")
    cache = tempfile.mkdtemp(prefix="arrowload-decoder-memory-")
    first = epoch(args.code, args.lake, cache)
    (path,) = glob.glob(os.path.join(cache, "decoders-*.json"))
    with open(path) as f:
        doc = json.load(f)
    print(f"measured afresh: decoded by {first['decoded']}; document: chosen {doc['chosen']}, {doc['costs']}")
    doc["chosen"], doc["costs"] = LIES[args.lie]
    with open(path, "w") as f:
        json.dump(doc, f)
    print(f"planted: chosen {doc['chosen']}, {doc['costs']}")
    for i in range(args.processes):
        r = epoch(args.code, args.lake, cache)
        with open(path) as f:
            after = json.load(f)
        costs = ", ".join(f"{k} {v:.3g}" for k, v in sorted(after["costs"].items()))
        print(f"process {i + 1}: wall {r['wall']:.3f} s, CPU {r['cpu']:.3f} s, decoded by {r['decoded']}; "
              f"measured here {r['measured']}; document after: chosen {after['chosen']}, {costs}")


if __name__ == "__main__":
    main()
