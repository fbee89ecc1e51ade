"""Peak memory of one loader epoch per mode, on a lake of wide rows.

Each mode runs in a fresh process (``python benchmarks/bench_memory.py --child MODE``) that
builds the loader and runs one epoch into a consumer holding one batch at a time (after a
100-row warm-up loader, so imports are not counted). Reported, in MiB above the process's
footprint just before the loader is built:

- ``peak RSS``: the kernel's high-water mark (``VmHWM``): anonymous memory plus the
  file-backed pages mapped in (the memory-mapped random-access cache is file-backed: the
  kernel can drop and re-read those pages, they are page cache rather than the loader's);
- ``peak anon``: the highest ``RssAnon`` seen by a thread sampling ``/proc/self/status``
  every millisecond (memory only this process holds; a short spike may be missed), or the
  build's ``VmHWM`` if higher (no file is mapped while building: all of it is anonymous);
- ``build`` / ``epoch``: the same high-water mark for building the loader (counts, the
  random-access table or its cache) and for the epoch alone (``VmHWM`` reset through
  ``/proc/self/clear_refs`` in between);
- ``Arrow pool``: ``pa.default_memory_pool().max_memory()`` (Arrow's allocations only);
- ``peak prefetch``: the loader's own account of bytes in flight (``LoaderStats``).

Modes: ``memory`` (global shuffle, the random-access table in memory), ``disk`` (global
shuffle, ``memory_budget=1``: the table streamed to the memory-mapped cache), ``block``,
``none`` (unshuffled). Linux only (``/proc``).

    python benchmarks/bench_memory.py                   # 72,000 rows of 4 KiB (281 MiB)
    python benchmarks/bench_memory.py --prefetch 1      # the smallest budget
    python benchmarks/bench_loader.py --memory          # the same, from the loader benchmark
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
MODES = ("memory", "disk", "block", "none")
DIM = 1024


def ensure_wide_lake(rows: int, log=print) -> Path:
    """``wide-<rows>``: id (int64) and emb (fixed_size_list<float32>[1024], 4 KiB a row),
    4 shards of 4,096-row groups, uncompressed (random floats do not compress)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    lake, marker = DATA / f"wide-{rows}", DATA / f"wide-{rows}.json"
    if marker.is_file() and json.loads(marker.read_text()).get("rows") == rows:
        log(f"data: reusing {lake.relative_to(HERE.parent)} ({rows:,} rows)")
        return lake
    shutil.rmtree(lake, ignore_errors=True)
    lake.mkdir(parents=True)
    rng = np.random.default_rng(0)
    per = -(-rows // 4)
    for i, start in enumerate(range(0, rows, per)):
        n = min(per, rows - start)
        emb = rng.standard_normal((n, DIM), dtype=np.float32)
        table = pa.table({"id": pa.array(np.arange(start, start + n, dtype=np.int64)),
                          "emb": pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), DIM)})
        pq.write_table(table, lake / f"part-{i:05d}.parquet", row_group_size=4096, compression="none")
    marker.write_text(json.dumps({"rows": rows}))
    log(f"data: wrote {lake.relative_to(HERE.parent)} ({rows:,} rows)")
    return lake


def _status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) * 1024
    return out


class _AnonSampler:
    """Highest RssAnon seen, sampled every millisecond on a thread."""

    def __init__(self) -> None:
        self.peak = _status()["RssAnon"]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _status()["RssAnon"])
            time.sleep(0.001)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, _status()["RssAnon"])


def child(mode: str, lake: str, cache: str, prefetch: int | None, batch: int) -> dict:
    import numpy as np
    import pyarrow as pa

    import arrowload as al
    ds = al.dataset(lake).select("id", "emb")
    kw = {"memory": dict(shuffle="global"), "disk": dict(shuffle="global", memory_budget=1),
          "block": dict(shuffle="block"), "none": dict(shuffle=False)}[mode]
    if prefetch is not None:
        kw["prefetch"] = prefetch
    import gc
    for _ in ds.limit(100).loader(10, cache_dir=cache + "-warm", **kw):
        pass  # imports and one-time setup, outside the measure
    gc.collect()
    base = _status()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    sampler = _AnonSampler()
    pool0 = pa.default_memory_pool().max_memory()
    loader = ds.loader(batch, output="numpy", cache_dir=cache, **kw)
    built = _status()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    rows = 0
    ids = np.zeros(loader.num_rows, dtype=bool)
    for b in loader:
        rows += len(b["id"])
        ids[b["id"]] = True
        b = None
    end = _status()
    anon = sampler.stop()
    stats = loader.stats()
    assert rows == loader.num_rows and ids.all(), "every row exactly once"
    mib = 1 << 20
    return {"mode": mode, "rows": rows, "source": loader.source_kind.split(" (")[0],
            "peak_rss": (max(built["VmHWM"], end["VmHWM"]) - base["VmRSS"]) / mib,
            "peak_anon": max(anon - base["RssAnon"], built["VmHWM"] - base["VmRSS"]) / mib,
            "build": (built["VmHWM"] - base["VmRSS"]) / mib,
            "epoch": (end["VmHWM"] - base["VmRSS"]) / mib,
            "arrow_pool": (pa.default_memory_pool().max_memory() - pool0) / mib,
            "peak_prefetch": stats.peak_prefetch_bytes / mib,
            "table": loader.num_rows * (8 + 4 * DIM) / mib}


def run_modes(rows: int, prefetch: int | None, batch: int, modes=MODES, log=print) -> list[dict]:
    lake = ensure_wide_lake(rows, log)
    results = []
    scratch = tempfile.mkdtemp(prefix="arrowload-mem-")
    try:
        for mode in modes:
            cache = os.path.join(scratch, mode)  # a fresh cache: every mode builds what it needs
            cmd = [sys.executable, __file__, "--child", mode, "--lake", str(lake), "--cache", cache,
                   "--batch", str(batch)] + (["--prefetch", str(prefetch)] if prefetch is not None else [])
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            results.append(json.loads(out.strip().splitlines()[-1]))
            log(f"  {mode}: {results[-1]}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return results


def table(results: list[dict]) -> str:
    lines = ["| mode | source | peak RSS | peak anon | build | epoch | Arrow pool | peak prefetch (own account) |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['mode']} | {r['source']} | {r['peak_rss']:,.0f} | {r['peak_anon']:,.0f} | "
                     f"{r['build']:,.0f} | {r['epoch']:,.0f} | {r['arrow_pool']:,.0f} | {r['peak_prefetch']:,.1f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=72_000)
    p.add_argument("--prefetch", type=int, help="the loader's prefetch budget in bytes (default: its own)")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--modes", nargs="*", choices=MODES, default=list(MODES))
    p.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--lake", help=argparse.SUPPRESS)
    p.add_argument("--cache", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.lake, args.cache, args.prefetch, args.batch)))
        return 0
    results = run_modes(args.rows, args.prefetch, args.batch, args.modes)
    print(f"\n{args.rows:,} rows of id + fixed_size_list<float32>[{DIM}] "
          f"({results[0]['table']:,.0f} MiB), batch {args.batch}, "
          f"prefetch {'default' if args.prefetch is None else f'{args.prefetch:,} B'}; MiB\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
