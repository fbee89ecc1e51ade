#!/usr/bin/env python
"""Is arrowload the fastest way to feed a model from a lake, and how close to the limit is it?

One command, one lake, every peer, interleaved:

    pip install -e ".[bench]"
    python benchmarks/run.py --quick          # 1M rows, a few minutes; prints the tables
    python benchmarks/run.py --write          # 4M rows; records RESULTS.md and results.png

Each workload is one epoch into an infinitely fast consumer that takes a C-contiguous
float32 x[B, k] and the label and touches both (checksums). Peers are the files in
benchmarks/peers/: every run of a (peer, workload) is its own process (forked from a
server that has only imported numpy, pyarrow, torch and arrowload, so no run pays those
imports and none inherits threads, caches or data; ``--spawn`` starts a fresh Python per
run instead). A verifying warm-up runs every cell once; then ``--reps`` repetitions run
every cell once each, in an order rotated each repetition; figures are medians.

Correctness: per workload and lake, every peer must return the same rows, sum of label
and sum of x[:, 0] (float64, relative 1e-9) as the bare pyarrow decode; a mismatch
prints both and exits with status 2.

The *limit* of a workload is the fastest bare decode of its columns in the same run
(pyarrow's tuned Scanner or polars' streaming collect, no conversion). See README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata as md
import json
import math
import os
import select
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "peers"))

from benchlib import FILTER_COLUMNS, PEERS, RESULT_PREFIX, WORKLOADS, Peer, Workload, bench_env, id_bound  # noqa: E402
from bench_scan import DATA, ensure_lake, load  # noqa: E402

OUT = HERE / "out"
RESULTS = HERE / "RESULTS.md"
CHART = HERE / "results.png"
QUICK_ROWS, FULL_ROWS = 1_000_000, 4_000_000
THROUGHPUT = ("W1", "W2", "W2i", "W2f", "W2h", "W3", "W4")
#: Workloads left out of --quick (the hive copy takes longer to write than they take to run).
QUICK_SKIP = ("W2h",)
#: Bare decode does not depend on the order a loader wants: W3's limit is W1's decode.
SAME_ROWS = {"W3": "W1", "W2h": "W2", "W6w": "W1"}
#: Peers with a library cache (cache_dir): the only ones W6 cold needs its own runs for;
#: for the others a fresh process *is* a cold start, and W6 is the first batch of W1.
CACHED = ("arrowload", "hf")
PREFETCH_BUDGET = 256 << 20     # Dataset.loader(prefetch=...) default
#: Peers that take seconds per run (start-up or per-row Python) get at most this many runs.
HEAVY_REPS = 3


# -- cells and runs ------------------------------------------------------------------------

@dataclasses.dataclass
class Cell:
    peer: Peer
    workload: Workload
    lake_rows: int
    capped: bool
    runs: list = dataclasses.field(default_factory=list)      # timed results
    warm: dict | None = None                                   # the warm-up result
    verify_only: bool = False

    @property
    def key(self) -> str:
        return f"{self.peer.key}/{self.workload.key}@{self.lake_rows}"

    def ok_runs(self) -> list[dict]:
        return [r for r in self.runs if "error" not in r and "unusable" not in r]

    def median(self, field: str) -> float | None:
        vals = [r[field] for r in self.ok_runs() if r.get(field) is not None]
        return statistics.median(vals) if vals else None


class Mismatch(Exception):
    pass


def build_cells(args, rows: int) -> list[Cell]:
    size = "quick" if args.quick else "full"
    peers = [PEERS[k] for k in (args.peers or PEERS)]
    wanted = args.workloads or [w for w in WORKLOADS if not (args.quick and w in QUICK_SKIP)]
    cells = []
    for p in peers:
        for wk in p.workloads:
            if wk not in wanted:
                continue
            if args.quick and not args.peers and p.quick is not None and wk not in p.quick:
                continue
            if p.role == "decode" and wk == "W3":
                continue                         # W3's limit is W1's decode (same columns)
            if wk == "W6w":
                continue                         # the first batch of every W1 epoch run
            if wk == "W6" and p.key not in CACHED:
                continue                         # no library cache: W6 cold = W1's first batch
            cap = p.cap(size, wk)
            n = min(rows, cap) if cap else rows
            cells.append(Cell(p, WORKLOADS[wk], n, capped=n < rows))
    # Capped lakes need their own truth: the bare pyarrow decode, verification only.
    ref = PEERS["decode-pyarrow"]
    have = {(c.peer.key, c.workload.key, c.lake_rows) for c in cells}
    for c in list(cells):
        fam = SAME_ROWS.get(c.workload.key, c.workload.key)
        if fam in THROUGHPUT and ("decode-pyarrow", fam, c.lake_rows) not in have:
            cells.append(Cell(ref, WORKLOADS[fam], c.lake_rows, capped=c.lake_rows < rows,
                              verify_only=True))
            have.add(("decode-pyarrow", fam, c.lake_rows))
    order = {k: i for i, k in enumerate(WORKLOADS)}
    roles = {"decode": 0, "tuned": 1, "arrowload": 2, "peer": 3}
    cells.sort(key=lambda c: (not c.verify_only, order[c.workload.key], roles[c.peer.role]))
    return cells


# -- data ------------------------------------------------------------------------------------

def lance_copy(rows: int, lake: Path, log) -> Path:
    """The Lance copy of a lake (benchmarks/data/events-<rows>.lance), converted once in a
    subprocess; a marker written last makes an interrupted conversion redo itself."""
    uri = DATA / f"events-{rows}.lance"
    marker = DATA / f"events-{rows}.lance.json"
    src_marker = json.loads((DATA / f"events-{rows}.json").read_text())
    if marker.is_file() and uri.is_dir():
        try:
            if json.loads(marker.read_text()).get("source") == src_marker:
                log(f"data: reusing {uri.relative_to(REPO)}")
                return uri
        except ValueError:
            pass
    shutil.rmtree(uri, ignore_errors=True)
    log(f"data: converting {lake.relative_to(REPO)} to Lance ...")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, str(HERE / "peers" / "lance_scanner.py"), "--prepare", str(lake),
                    str(uri)], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seconds = time.perf_counter() - t0
    marker.write_text(json.dumps({"source": src_marker, "seconds": round(seconds, 1)}, indent=1) + "\n")
    log(f"data: converted in {seconds:.0f} s")
    return uri


def prepare_data(cells: list[Cell], log) -> dict:
    lakes: dict[int, dict] = {}
    t0 = time.perf_counter()
    for n in sorted({c.lake_rows for c in cells}):
        lakes[n] = {"lake": str(ensure_lake(n, log=log))}
    for n in sorted({c.lake_rows for c in cells if c.workload.hive}):
        lakes[n]["hive"] = str(ensure_lake(n, partition_by="country", log=log))
    for n in sorted({c.lake_rows for c in cells if c.peer.module == "lance_scanner"}):
        try:
            lakes[n]["lance"] = str(lance_copy(n, Path(lakes[n]["lake"]), log))
        except (subprocess.CalledProcessError, OSError) as exc:
            log(f"data: Lance conversion failed ({exc}); the Lance peer will report it")
    log(f"data: ready in {time.perf_counter() - t0:.0f} s")
    return lakes


def floors(cells: list[Cell], lakes: dict) -> dict[str, dict]:
    """``footer_floor`` of every throughput workload and lake size of the run, keyed
    ``"<workload>@<rows>"``."""
    out: dict[str, dict] = {}
    for c in cells:
        key = f"{c.workload.key}@{c.lake_rows}"
        if c.workload.key in THROUGHPUT and key not in out:
            lk = lakes[c.lake_rows]
            out[key] = footer_floor(lk["hive"] if c.workload.hive else lk["lake"], c.workload, c.lake_rows)
    return out


def footer_floor(lake: str, w: Workload, rows: int) -> dict:
    """What a reader of workload ``w`` cannot avoid reading, per the Parquet footers: the
    compressed bytes of the column chunks (the selection's and the filter's columns) of the
    row groups that the footers' min/max statistics cannot prune, plus every footer read.
    The same figure for every peer: the floor the measured bytes (rchar) are judged by."""
    import pyarrow.parquet as pq
    need = set(w.columns) | set(FILTER_COLUMNS.get(w.filter, ()))
    files = sorted(Path(lake).rglob("*.parquet"))
    if w.hive and w.filter == "us1":             # partition pruning: only country=US folders
        files = [f for f in files if "country=US" in f.parts]
        need.discard("country")
    total, kept, groups = 0, 0, 0
    for f in files:
        md = pq.ParquetFile(f).metadata
        total += md.serialized_size + 8           # the footer and its length + magic
        names = [md.schema.column(i).path for i in range(md.num_columns)]
        for g in range(md.num_row_groups):
            rg = md.row_group(g)
            groups += 1
            stats = {names[i]: rg.column(i).statistics for i in range(rg.num_columns)}
            if _pruned(w, stats, rows):
                continue
            kept += 1
            for i, name in enumerate(names):
                if name in need or name.split(".")[0] in need:
                    total += rg.column(i).total_compressed_size
    return {"bytes": total, "row_groups": kept, "of": groups}


def _pruned(w: Workload, stats: dict, rows: int) -> bool:
    """Whether min/max statistics prove that a row group holds no row of ``w``'s filter."""
    def rng(col):
        st = stats.get(col)
        return (st.min, st.max) if st is not None and st.has_min_max else None
    if w.filter == "id10":
        r = rng("id")
        return r is not None and r[0] >= id_bound(rows)
    if w.filter == "f90":
        f, lab = rng("f0"), rng("label")
        return (f is not None and f[1] <= 0.9) or (lab is not None and not (lab[0] <= 1 <= lab[1]))
    if w.filter == "us1":
        c, lab = rng("country"), rng("label")
        return (c is not None and not (c[0] <= "US" <= c[1])) or (lab is not None and not (lab[0] <= 1 <= lab[1]))
    return False


# -- running ---------------------------------------------------------------------------------

class ForkServer:
    """Runs specs in processes forked from ``benchlib.py --serve`` (see its docstring)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, str(HERE / "peers" / "benchlib.py"), "--serve"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
                                     env=bench_env())
        first = json.loads(self.proc.stdout.readline())
        assert first.get("ready"), first

    def _line(self, timeout: float | None) -> dict | None:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the fork server died")
        return json.loads(line)

    def run(self, spec: dict, timeout: float) -> dict:
        tag = uuid.uuid4().hex[:12]
        result, logf = OUT / "runs" / f"{tag}.json", OUT / "runs" / f"{tag}.log"
        self.proc.stdin.write(json.dumps({"spec": spec, "result": str(result), "log": str(logf)}) + "\n")
        self.proc.stdin.flush()
        pid = self.current = self._line(None)["pid"]
        done = self._line(timeout)
        if done is None:
            _killpg(pid)
            self._line(None)
        self.current = None
        if done is None:
            return {"error": f"timed out after {timeout:.0f} s", "log": _tail(logf)}
        if not result.is_file():
            return {"error": f"the run died (status {done['status']})", "log": _tail(logf)}
        out = json.loads(result.read_text())
        result.unlink()
        if "error" in out:
            out["log"] = _tail(logf)
        logf.unlink(missing_ok=True)
        return out

    current: int | None = None

    def close(self) -> None:
        if self.current:
            _killpg(self.current)
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class Spawner:
    """Runs each spec as ``python benchmarks/peers/<module>.py SPEC``: a fresh interpreter."""

    def run(self, spec: dict, timeout: float) -> dict:
        cmd = [sys.executable, str(HERE / "peers" / f"{spec['module']}.py"), json.dumps(spec)]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True, env=bench_env())
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _killpg(p.pid)
            p.communicate()
            return {"error": f"timed out after {timeout:.0f} s"}
        lines = [ln for ln in out.splitlines() if ln.startswith(RESULT_PREFIX)]
        if not lines:
            return {"error": f"no result (exit {p.returncode})", "log": err[-2000:]}
        return json.loads(lines[-1][len(RESULT_PREFIX):])

    def close(self) -> None:
        pass


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(path: Path, n: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def spec_for(cell: Cell, lakes: dict, seed: int, cold: bool) -> dict:
    lk = lakes[cell.lake_rows]
    w = cell.workload
    resume_row = 0
    if w.mode == "resume":
        batches = math.ceil(cell.lake_rows / w.batch)
        resume_row = int(batches * 0.9) * w.batch
    if cold:
        cache = OUT / "cache" / f"cold-{uuid.uuid4().hex[:8]}"
    else:
        cache = OUT / "cache" / f"{cell.peer.key}-{cell.lake_rows}"
    return {"peer": cell.peer.key, "module": cell.peer.module, "options": cell.peer.options,
            "workload": w.key, "lake": lk["lake"], "hive": lk.get("hive"), "lance": lk.get("lance"),
            "lake_rows": cell.lake_rows, "resume_row": resume_row, "seed": seed,
            "cache_dir": str(cache),
            "tree_rss": cell.peer.key == "ray" or cell.peer.options.get("workers", 0) > 0}


def truth_key(cell: Cell) -> tuple:
    return (SAME_ROWS.get(cell.workload.key, cell.workload.key), cell.lake_rows)


def check(cell: Cell, r: dict, truths: dict, when: str) -> None:
    if "error" in r or "unusable" in r:
        return
    key = truth_key(cell)
    if cell.workload.mode == "first":
        if r["rows"] != min(cell.workload.batch, r["rows"]) or r["rows"] == 0:
            raise Mismatch(f"{cell.key} ({when}): first batch has {r['rows']} rows")
    got = (r["rows"], r["label_sum"], r["x0_sum"])
    if key not in truths:
        truths[key] = (got, cell.key)
        return
    (rows, lab, x0), who = truths[key]
    if got[0] != rows or got[1] != lab or not math.isclose(got[2], x0, rel_tol=1e-9, abs_tol=1e-6):
        raise Mismatch(f"{cell.key} ({when}) returned rows={got[0]} sum(label)={got[1]} "
                       f"sum(x[:,0])={got[2]!r}, but {who} returned rows={rows} sum(label)={lab} "
                       f"sum(x[:,0])={x0!r}")


def measure(cells: list[Cell], lakes: dict, args, log) -> None:
    runner = Spawner() if args.spawn else ForkServer()
    truths: dict = {}
    shutil.rmtree(OUT / "cache", ignore_errors=True)
    (OUT / "runs").mkdir(parents=True, exist_ok=True)
    (OUT / "cache").mkdir(parents=True, exist_ok=True)

    def one(cell: Cell, when: str) -> dict:
        lk = lakes[cell.lake_rows]
        if not Path(lk["lake"]).is_dir() or (lk.get("hive") and not Path(lk["hive"]).is_dir()):
            log(f"data: {cell.lake_rows:,}-row lake vanished (removed by another process?); rewriting")
            lk["lake"] = str(ensure_lake(cell.lake_rows, log=log))
            if lk.get("hive"):
                lk["hive"] = str(ensure_lake(cell.lake_rows, partition_by="country", log=log))
        cold = cell.workload.mode == "first"
        spec = spec_for(cell, lakes, args.seed, cold)
        t0 = time.perf_counter()
        r = runner.run(spec, args.timeout)
        if cold:
            shutil.rmtree(spec["cache_dir"], ignore_errors=True)
        r["wall_s"] = time.perf_counter() - t0
        check(cell, r, truths, when)
        return r

    try:
        t0 = time.perf_counter()
        for cell in cells:
            cell.warm = one(cell, "warm-up")
            r = cell.warm
            state = r.get("unusable") and "unusable" or r.get("error") and "FAILED" or "ok"
            log(f"warm-up {cell.key:<34} {state:<8} {r['wall_s']:6.1f} s"
                + (f"  ({(r.get('error') or r.get('unusable'))[:160]})" if state != "ok" else ""))
        log(f"warm-up and verification: {time.perf_counter() - t0:.0f} s")
        timed = [c for c in cells if not c.verify_only and "error" not in c.warm and "unusable" not in c.warm]
        for rep in range(args.reps):
            t0 = time.perf_counter()
            k = rep * max(1, len(timed) // args.reps)
            for cell in timed[k:] + timed[:k]:
                if cell.peer.heavy and rep >= HEAVY_REPS:
                    continue
                cell.runs.append(one(cell, f"repetition {rep + 1}"))
            log(f"repetition {rep + 1}/{args.reps}: {time.perf_counter() - t0:.0f} s")
    finally:
        runner.close()


# -- report ------------------------------------------------------------------------------------

def _rate(r: float | None) -> str:
    if r is None:
        return "—"
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if r >= div:
            return f"{r / div:.2f}{unit}" if r / div < 10 else f"{r / div:.1f}{unit}"
    return f"{r:.0f}"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a and b else "—"


def _s(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:.3f}" if x < 10 else f"{x:.1f}"


def _mib(b: float | None) -> str:
    return "—" if b is None else f"{b / 2**20:,.0f}"


def rate(cell: Cell) -> float | None:
    runs = cell.ok_runs()
    if not runs:
        return None
    return statistics.median(r["rows"] / r["seconds"] for r in runs if r["seconds"] > 0)


def cpu_per_m(cell: Cell) -> float | None:
    """Median over runs of process CPU seconds (user + system, all threads) per million
    rows delivered."""
    vals = [r["cpu_s"] / r["rows"] * 1e6 for r in cell.ok_runs() if r.get("cpu_s") is not None and r["rows"]]
    return statistics.median(vals) if vals else None


def rss(cell: Cell) -> tuple[float | None, float | None, bool]:
    """(peak, peak - base) medians; tree=True when helper processes are counted."""
    runs = cell.ok_runs()
    if not runs:
        return None, None, False
    tree = any(r.get("tree_peak_rss") for r in runs)
    peaks = [max(r["peak_rss"], r.get("tree_peak_rss") or 0) for r in runs]
    return statistics.median(peaks), statistics.median(p - r["base_rss"] for p, r in zip(peaks, runs)), tree


def find(cells, peer: str, wk: str, rows: int | None = None) -> Cell | None:
    for c in cells:
        if c.peer.key == peer and c.workload.key == wk and not c.verify_only and \
                (rows is None or c.lake_rows == rows):
            return c
    return None


def limit_of(cells, wk: str, rows: int) -> tuple[float | None, str]:
    fam = SAME_ROWS.get(wk, wk)
    best, who = None, "—"
    for p in ("decode-pyarrow", "decode-polars"):
        c = find(cells, p, fam, rows)
        r = rate(c) if c else None
        if r and (best is None or r > best):
            best, who = r, c.peer.label
    return best, who


def workload_table(cells, wk: str, rows: int, floor: dict | None = None) -> list[str]:
    w = WORKLOADS[wk]
    mine = [c for c in cells if c.workload.key == wk and not c.verify_only]
    if not mine:
        return []
    if wk == "W3":
        mine += [c for c in cells if c.workload.key == "W1" and c.peer.role == "decode"
                 and not c.verify_only and c.lake_rows == rows]
    if not mine:
        return []
    lim, lim_who = limit_of(cells, wk, rows)
    tuned = find(cells, "pyarrow", wk, rows)
    tuned_rate = rate(tuned) if tuned else None
    truth = next((c.warm for c in cells if c.workload.key == SAME_ROWS.get(wk, wk) and c.lake_rows == rows
                  and c.peer.key == "decode-pyarrow" and c.warm and "rows" in c.warm), None)
    out = [f"### {wk}: {w.title}", ""]
    if truth:
        out.append(f"{truth['rows']:,} rows per epoch (sum of label {truth['label_sum']:,}). "
                   f"Limit: {_rate(lim)} rows/s ({lim_who}"
                   f"{', measured on W1: decoding does not depend on order' if wk == 'W3' else ''}). "
                   f"Tuned pyarrow: {_rate(tuned_rate)} rows/s.")
        if floor:
            out[-1] += (f" Footer floor: {_mib(floor['bytes'])} MiB (the needed column chunks of the "
                        f"{floor['row_groups']} of {floor['of']} row groups statistics cannot prune, "
                        "and the footers).")
        out.append("")
    out += ["| peer | shuffle | rows/s | × limit | × tuned pyarrow | median s (min–max) | CPU s "
            "| CPU s / M rows | read MiB | first batch s | peak RSS MiB (Δ) |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def sort_key(c):
        r = rate(c)
        return (c.peer.role != "decode", -(r or -1))

    for c in sorted(mine, key=sort_key):
        name = f"**{c.peer.label}**" if c.peer.role == "arrowload" else c.peer.label
        if c.capped:
            name += f" †{c.lake_rows // 1000:,}k-row lake"
        if c.warm and "unusable" in c.warm:
            out.append(f"| {name} | — | unusable: {c.warm['unusable']} | | | | | | | | |")
            continue
        if c.warm and "error" in c.warm:
            out.append(f"| {name} | — | failed: {c.warm['error'][:200]} | | | | | | | | |")
            continue
        r = rate(c)
        runs = c.ok_runs()
        if not runs or not r:
            out.append(f"| {name} | — | no timed run | | | | | | | | |")
            continue
        secs = [x["seconds"] for x in runs]
        peak, delta, tree = rss(c)
        shuffle = runs[0].get("shuffle") or "none"
        if c.workload.key == "W1" and wk == "W3":
            shuffle = "(W1 decode)"
        got = c.median("read_bytes")
        unseen = floor and got is not None and got < 0.9 * floor["bytes"] and c.workload.key == wk
        out.append(
            f"| {name} | {shuffle} | {_rate(r)} | {_ratio(r, lim)} | {_ratio(r, tuned_rate)} "
            f"| {_s(statistics.median(secs))} ({_s(min(secs))}–{_s(max(secs))}) | {_s(c.median('cpu_s'))} "
            f"| {_s(cpu_per_m(c))} | {_mib(got)}{'§' if unseen else ''} | {_s(c.median('ttfb'))} "
            f"| {_mib(peak)} ({'+' if delta >= 0 else ''}{_mib(delta)}){'‡' if tree else ''} |")
    return out + [""]


def ttfb_table(cells, rows: int) -> list[str]:
    peers = []
    for c in cells:
        if c.workload.key in ("W1", "W5", "W6") and c.peer.role != "decode" and not c.verify_only \
                and c.peer.key not in peers and not (c.warm and "unusable" in c.warm):
            peers.append(c.peer.key)
    out = ["### W5 / W6: time to first batch (W1 selection, batch 4096), seconds", "",
           "Every run is a fresh process with the OS page cache warm. *Cold* (W6): the library's "
           "own caches empty (arrowload's cache_dir, HF's Arrow cache); for peers without such a "
           "cache a fresh process is a cold start, so W6 is their W1 first batch. *Warm*: the "
           "first batch of the W1 epoch runs (caches kept). *Resume* (W5): a fresh process "
           "resuming at 90% of the epoch (caches kept, as a restarted job finds them); the rows "
           "after the resume point are checked across peers. *Start-up*: process-level set-up "
           "timed apart (ray.init).", "",
           "| peer | cold (W6) | warm | resume at 90% (W5) | W5 ÷ W6 | how it resumes | start-up s |",
           "|---|---:|---:|---:|---:|---|---:|"]
    for key in peers:
        w1, w5, w6 = find(cells, key, "W1"), find(cells, key, "W5"), find(cells, key, "W6")
        warm = w1.median("ttfb") if w1 else None
        cold = w6.median("ttfb") if w6 else warm
        res = w5.median("ttfb") if w5 else None
        how = next((r.get("resume") for c in (w5, w1) if c for r in c.ok_runs() if r.get("resume")), None)
        setup = statistics.median([r.get("setup_s") or 0 for c in (w1, w5, w6) if c for r in c.ok_runs()] or [0])
        label = PEERS[key].label
        label = f"**{label}**" if PEERS[key].role == "arrowload" else label
        capped = next((c for c in (w1, w5, w6) if c and c.capped), None)
        if capped:
            label += f" †{capped.lake_rows // 1000:,}k-row lake"
        ratio = f"{res / cold:.2f}" if res is not None and cold else "—"
        out.append(f"| {label} | {_s(cold)}{'' if w6 else '*'} | {_s(warm)} | {_s(res)} | {ratio} | "
                   f"{how or '—'} | {_s(setup) if setup > 0.05 else '—'} |")
    out += ["", "\\* no library cache: a fresh process is the cold start (the W1 first batch).", ""]
    return out


def _vs(a: Cell, b: Cell) -> tuple[float, str]:
    """rows/s of ``a`` over ``b`` (the verdict's ratio) and its evidence, with the same
    ratio taken by CPU time (rows per CPU second) beside it."""
    ra, rb = rate(a), rate(b)
    ev = f"{_rate(ra)} vs {_rate(rb)} rows/s = **{ra / rb:.2f}×**"
    ca, cb = cpu_per_m(a), cpu_per_m(b)
    if ca and cb:
        ev += f" (by CPU time {cb / ca:.2f}×: {ca:.3f} vs {cb:.3f} CPU s / M rows)"
    return ra / rb, ev


def table_bytes(cells, rows: int) -> int:
    """Bytes of W1's decoded selection (16 float32 features + the int8 label per row)."""
    t = next((x.warm for x in cells if x.peer.key == "decode-pyarrow" and x.workload.key == "W1"
              and x.lake_rows == rows and x.warm and "rows" in x.warm), None)
    return t["rows"] * (16 * 4 + 1) if t else rows * (16 * 4 + 1)


def targets_i12(cells, rows: int) -> list[tuple[str, bool | None, str]]:
    """The targets of issue 12 (the read path at the decode limit), met or missed. Rates are
    compared by wall-clock medians (the verdict); the CPU-time ratio is given beside."""
    out: list[tuple[str, bool | None, str]] = []

    def get(wk: str, peer: str = "arrowload") -> Cell | None:
        c = find(cells, peer, wk, rows)
        return c if c and rate(c) else None

    a1, p1, d1 = get("W1"), get("W1", "polars"), get("W1", "decode-polars")
    a3, b3, h3 = get("W3"), get("W3", "arrowload-block"), get("W3", "polars-hashsort")

    def ratio_target(statement: str, a, b, at_least: float) -> None:
        if a and b:
            r, ev = _vs(a, b)
            out.append((statement, r >= at_least, ev))

    ratio_target("unshuffled (W1) ≥ 1.0× polars `collect_batches` → the same tensors", a1, p1, 1.0)
    ratio_target("unshuffled (W1) ≥ 0.75× polars' bare decode (goal 1.0×)", a1, d1, 0.75)
    ratio_target("global shuffle (W3), table build included, ≥ 0.5× polars' bare decode (of W1)", a3, d1, 0.5)
    ratio_target("global shuffle (W3) ≥ 1.0× polars' streaming hash-sort shuffle", a3, h3, 1.0)
    ratio_target("block shuffle (W3, arrowload-block) ≥ 0.7× polars' bare decode (of W1)", b3, d1, 0.7)
    for wk in ("W2", "W2i", "W2f"):
        a, p = get(wk), get(wk, "polars")
        if a and p:
            r, ev = _vs(a, p)
            ba, bp = a.median("read_bytes"), p.median("read_bytes")
            ok = r >= 1.0 and ba is not None and bp is not None and ba <= bp
            out.append((f"filter {wk} ≥ 1.0× polars batches, with no more bytes read", ok,
                        f"{ev}; read {_mib(ba)} vs {_mib(bp)} MiB"))
    a6 = find(cells, "arrowload", "W6", rows)
    if a6 and a6.median("ttfb") is not None and p1 and p1.median("ttfb") is not None:
        ta, tp = a6.median("ttfb"), p1.median("ttfb")
        out.append(("time to first batch, cold (W6), within 0.3 s of polars batches' (a fresh process: "
                    "polars has no cache)", ta <= tp + 0.3, f"{_s(ta)} s vs {_s(tp)} s = **{ta - tp:+.3f} s**"))
    a5 = find(cells, "arrowload", "W5", rows)
    if a5 and a5.median("ttfb") is not None and a1 and a1.median("ttfb"):
        t5, t0 = a5.median("ttfb"), a1.median("ttfb")
        out.append(("first batch after resuming at 90% (W5) ≤ 1.1× the first batch at 0% (W1, same caches)",
                    t5 <= 1.1 * t0, f"{_s(t5)} s vs {_s(t0)} s = **{t5 / t0:.2f}×**"))
    modes = [("unshuffled (W1)", a1, p1, "polars batches'"),
             ("filter W2", get("W2"), get("W2", "polars"), "polars batches'"),
             ("filter W2i", get("W2i"), get("W2i", "polars"), "polars batches'"),
             ("filter W2f", get("W2f"), get("W2f", "polars"), "polars batches'"),
             ("global shuffle (W3)", a3, h3, "polars' hash-sort shuffle's"),
             ("block shuffle (W3)", b3, h3, "polars' hash-sort shuffle's"),
             ("emb (W4)", get("W4"), get("W4", "polars"), "polars batches'")]
    for mode, a, p, who in modes:
        ca, cp = (cpu_per_m(a), cpu_per_m(p)) if a and p else (None, None)
        if ca and cp:
            out.append((f"{mode}: CPU s per million rows ≤ {who}", ca <= cp,
                        f"{ca:.3f} vs {cp:.3f} = **{ca / cp:.2f}×**"))
    table = table_bytes(cells, rows)
    for who, c in (("global", a3), ("block", b3)):
        if c:
            peak, delta, _ = rss(c)
            bound = table + PREFETCH_BUDGET if who == "global" else PREFETCH_BUDGET
            what = (f"the decoded table ({table >> 20} MiB) + the prefetch budget ({PREFETCH_BUDGET >> 20} MiB)"
                    if who == "global" else f"the prefetch budget ({PREFETCH_BUDGET >> 20} MiB)")
            out.append((f"{who} shuffle (W3): peak RSS over the process at start ≤ {what} + 10%",
                        delta <= 1.1 * bound, f"peak {_mib(peak)} MiB, **+{_mib(delta)} MiB** "
                                              f"(bound {_mib(1.1 * bound)} MiB)"))
    return out


def targets(cells, rows: int) -> list[tuple[str, bool | None, str]]:
    out = []
    for wk in ("W1", "W2"):
        a, t = find(cells, "arrowload", wk, rows), find(cells, "pyarrow", wk, rows)
        lim, who = limit_of(cells, wk, rows)
        if not (a and t and rate(a) and rate(t) and lim):
            continue
        ra, rt = rate(a), rate(t)
        out.append((f"{wk}: arrowload ≥ 0.9× the tuned pyarrow scan", ra / rt >= 0.9,
                    f"{_rate(ra)} vs {_rate(rt)} rows/s = **{ra / rt:.2f}×**"))
        out.append((f"{wk} (goal): arrowload on par with the fastest bare decode (≥ 0.9×)", ra / lim >= 0.9,
                    f"{_rate(ra)} vs {_rate(lim)} rows/s ({who}) = **{ra / lim:.2f}×**"))
    a = find(cells, "arrowload", "W3", rows)
    if a and rate(a):
        kind = a.ok_runs()[0].get("shuffle")
        same = [c for c in cells if c.workload.key == "W3" and c.peer.role not in ("arrowload", "decode")
                and rate(c) and (c.ok_runs()[0].get("shuffle") or "").split(" ")[0] == kind]
        if same:
            best = max(same, key=rate)
            ra, rb = rate(a), rate(best)
            flag = f" (on the {best.lake_rows // 1000:,}k-row lake)" if best.capped else ""
            out.append((f"W3: arrowload ({kind} shuffle) ≥ 2× the fastest peer with a {kind} shuffle",
                        ra / rb >= 2, f"{_rate(ra)} vs {_rate(rb)} rows/s, {best.peer.label}{flag} = "
                                      f"**{ra / rb:.2f}×**"))
    w5, w6, w1 = find(cells, "arrowload", "W5", rows), find(cells, "arrowload", "W6", rows), \
        find(cells, "arrowload", "W1", rows)
    if w5 and w6 and w5.median("ttfb") and w6.median("ttfb"):
        r5, r6 = w5.median("ttfb"), w6.median("ttfb")
        warm = w1.median("ttfb") if w1 else None
        out.append(("W5 ≤ 2× W6: resuming at 90% costs at most twice a cold first batch", r5 <= 2 * r6,
                    f"{_s(r5)} s vs {_s(r6)} s cold = **{r5 / r6:.2f}×**"
                    + (f" ({r5 / warm:.2f}× a warm first batch, {_s(warm)} s)" if warm else "")))
    for wk in ("W1", "W2", "W3", "W4"):
        c = find(cells, "arrowload", wk, rows)
        if not (c and c.ok_runs()):
            continue
        peak, delta, _ = rss(c)
        bound, what = PREFETCH_BUDGET, f"the prefetch budget ({PREFETCH_BUDGET >> 20} MiB)"
        if wk == "W3":
            t = next((x.warm for x in cells if x.peer.key == "decode-pyarrow" and x.workload.key == "W1"
                      and x.lake_rows == rows and x.warm), None)
            table = (t["rows"] * (16 * 4 + 1)) if t else 0
            bound += table
            what += f" + the in-memory random-access table ({table >> 20} MiB: rows × 65 bytes)"
        out.append((f"{wk}: arrowload peak RSS over its start ≤ {what}", delta <= bound,
                    f"peak {_mib(peak)} MiB, **+{_mib(delta)} MiB** over the process at start"))
    return out


def machine_lines(rows: int, args, command: str, loads: tuple[str, str], prep: dict) -> list[str]:
    from bench_scan import machine
    lines = machine()
    vers = []
    for dist in ("torch", "ray", "datasets", "pylance", "petastorm", "psutil"):
        try:
            vers.append(f"{dist} {md.version(dist)}")
        except md.PackageNotFoundError:
            vers.append(f"{dist} not installed")
    lines.append("- peers: " + ", ".join(vers))
    lines += [
        f"- command: `{command}`",
        f"- data: `write_lake(rows={rows:_}, shards=8, row_group_size=65_536, emb_dim=64)` (seed 0, "
        f"zstd; benchmarks/data/events-{rows}), its hive copy partitioned by country, a Lance copy; "
        "all read from the OS page cache",
        f"- method: 1 verifying warm-up + {args.reps} timed runs per cell ({min(args.reps, HEAVY_REPS)} for "
        "the per-row torch loaders, HF datasets and Ray), each a fresh process "
        f"({'spawned' if args.spawn else 'forked from a pre-imported server'}), rotated across "
        "cells every repetition; medians",
        f"- load average (1 / 5 / 15 min) at start {loads[0]}, at end {loads[1]} "
        f"(above {os.cpu_count()}: other processes competed for the cores)",
        f"- wall time of the whole run: {prep.get('total_s', 0):.0f} s",
    ]
    return lines


NOTES = """\
How to read the tables:
- **rows/s** is the median over runs of rows ÷ seconds, where seconds run from opening the
  dataset (listing, footers, planning, any load into memory) to the last batch of the epoch,
  in a fresh process, imports and process start-up (ray.init) excluded.
- **× limit**: rows/s ÷ the limit's (1.00 = as fast as decoding the columns alone).
  **× tuned pyarrow**: rows/s ÷ the tuned pyarrow scan turned into the same batches.
- Every peer hands the consumer x as a C-contiguous float32 tensor [B, 16] (or [B, 64]) and
  the label: where a peer yields columns, they are stacked in the timed region
  (`np.stack` / `torch.stack`), the same for all; arrowload stacks in the loader
  (`stack={"x": [...]}`).
- **CPU s**: median process CPU seconds (user + system, all threads) over the same timed
  region; **CPU s / M rows**: CPU seconds per million rows delivered, median over runs (the
  cost beside a training step that shares the cores).
- **read MiB**: bytes the run's process read through read syscalls in the timed region
  (`rchar` of `/proc/self/io`, page cache or not), median. The **footer floor** above each
  table is what any reader must read per the Parquet footers: the needed column chunks of the
  row groups min/max statistics cannot prune, plus the footers. § fewer bytes than 0.9× the
  floor: the peer reads part of the data in helper processes or through memory maps, which
  rchar does not see.
- † the peer ran on a smaller lake of the same generator (it would take minutes on the full
  one); its rows/s is comparable, its checksums are checked against that lake's bare decode.
- **peak RSS**: `ru_maxrss` of the run's process (MiB), and in brackets its growth over the
  process at the start of the measurement (after imports); ‡ the summed RSS of the process
  and its helper processes (DataLoader workers, Ray), sampled every 50 ms, which counts
  shared pages once per process.
"""


def left_out(args) -> list[str]:
    """What --quick (or --peers / --workloads) left out of this run, to say so in the report."""
    out = []
    if args.workloads:
        out.append("workloads not run: " + ", ".join(w for w in WORKLOADS if w not in args.workloads))
    if args.peers:
        out.append("peers not run: " + ", ".join(p for p in PEERS if p not in args.peers))
    elif args.quick:
        out.append("workloads left out of --quick: " + ", ".join(QUICK_SKIP) + " (run without --quick)")
        for p in PEERS.values():
            if p.quick == ():
                out.append(f"{p.label}: left out of --quick ({p.why_not_quick})")
            elif p.quick is not None:
                out.append(f"{p.label}: only {', '.join(p.quick)} in --quick")
    return out


def render(cells, rows: int, meta: dict) -> str:
    lines = meta["machine"] + [""]
    if meta.get("left_out"):
        lines += ["Left out of this run:", ""] + [f"- {x}" for x in meta["left_out"]] + [""]
    lines += [NOTES]
    fl = meta.get("floor") or {}
    for wk in THROUGHPUT:
        lines += workload_table(cells, wk, rows, fl.get(f"{SAME_ROWS.get(wk, wk)}@{rows}"))
    lines += ttfb_table(cells, rows)
    unusable = [c for c in cells if c.warm and "unusable" in c.warm]
    lines += ["### Targets of issue 12 (the read path at the decode limit)", "",
              "Ratios of rows/s medians in this run decide (wall clock); the same ratio by CPU time is "
              "given beside. The training-loop target is `bench_train.py`'s, the GPU ones "
              "`bench_gpu.py`'s.", ""]
    for statement, met, evidence in targets_i12(cells, rows):
        lines.append(f"- {'**met**' if met else '**missed**'}: {statement}: {evidence}")
    lines += ["", "### Earlier targets", ""]
    for statement, met, evidence in targets(cells, rows):
        lines.append(f"- {'**met**' if met else '**missed**'}: {statement}: {evidence}")
    prof = arrowload_profile(cells, rows)
    if prof:
        lines += ["", "arrowload's own counters (`Loader.stats()`, median run of each workload):", ""]
        lines += prof
    if unusable:
        lines += ["", "### Peers that could not run", ""]
        seen = set()
        for c in unusable:
            if c.peer.key not in seen:
                seen.add(c.peer.key)
                lines.append(f"- {c.peer.label}: {c.warm['unusable']}")
    lines.append("")
    return "\n".join(lines)


def arrowload_profile(cells, rows: int) -> list[str]:
    out = []
    for c in cells:
        if c.peer.role == "arrowload" and c.workload.mode == "epoch" and not c.verify_only:
            runs = sorted(c.ok_runs(), key=lambda r: r["seconds"])
            if runs:
                r = runs[len(runs) // 2]
                if r.get("stats"):
                    out.append(f"- {c.peer.key} {c.workload.key}: build {_s(r.get('build_s'))} s; {r['stats']}")
    return out


def chart(cells, rows: int, path: Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    wks = [wk for wk in ("W1", "W2", "W2i", "W2f", "W3", "W4") if any(c.workload.key == wk for c in cells)]
    fig, axes = plt.subplots(len(wks), 1, figsize=(8, 2.1 + 2.0 * len(wks)), squeeze=False)
    for ax, wk in zip(axes[:, 0], wks):
        mine = [c for c in cells if c.workload.key == wk and not c.verify_only and rate(c)]
        if wk == "W3":
            mine += [c for c in cells if c.workload.key == "W1" and c.peer.role == "decode" and rate(c)
                     and not c.verify_only and c.lake_rows == rows]
        mine.sort(key=rate)
        names = [c.peer.key + (" †" if c.capped else "") for c in mine]
        vals = [rate(c) / 1e6 for c in mine]
        colors = ["#d62728" if c.peer.role == "arrowload" else "#7f7f7f" if c.peer.role == "decode"
                  else "#1f77b4" for c in mine]
        ax.barh(names, vals, color=colors)
        ax.set_xscale("log")
        ax.set_title(f"{wk}: {WORKLOADS[wk].title}", fontsize=8, loc="left")
        ax.tick_params(labelsize=7)
        for y, v in enumerate(vals):
            ax.text(v, y, f" {v:.2f}M", va="center", fontsize=6)
        ax.set_xlim(min(vals) / 2 if vals else 0.01, max(vals) * 4 if vals else 1)
    axes[-1, 0].set_xlabel("million rows / s (log scale); red: arrowload, grey: bare decode (the limit)",
                           fontsize=7)
    fig.suptitle(f"One epoch into an infinitely fast consumer, {rows:,}-row lake", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)
    return True


def write_results(rows: int, body: str, with_chart: bool) -> None:
    size = "quick" if rows == QUICK_ROWS else "full" if rows == FULL_ROWS else "custom"
    begin, end = f"<!-- run:rows={rows}:begin -->", f"<!-- run:rows={rows}:end -->"
    title = f"## Feeding a model: arrowload vs peers (`run.py`), {rows:,} rows ({size})"
    pic = f"\n![rows/s per workload]({CHART.name})\n" if with_chart else ""
    from bench_scan import replace_section
    replace_section(begin, end, f"{begin}\n{title}\n{pic}\n{body}\n{end}\n")


# -- archive -----------------------------------------------------------------------------------

def save(cells, rows: int, meta: dict) -> Path:
    path = OUT / f"results-{rows}.json"
    data = {"rows": rows, "meta": meta,
            "cells": [{"peer": c.peer.key, "workload": c.workload.key, "lake_rows": c.lake_rows,
                       "capped": c.capped, "verify_only": c.verify_only, "warm": c.warm, "runs": c.runs}
                      for c in cells]}
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def restore(path: Path) -> tuple[list[Cell], int, dict]:
    data = json.loads(path.read_text())
    cells = []
    for d in data["cells"]:
        c = Cell(PEERS[d["peer"]], WORKLOADS[d["workload"]], d["lake_rows"], d["capped"],
                 runs=d["runs"], warm=d["warm"], verify_only=d["verify_only"])
        cells.append(c)
    return cells, data["rows"], data["meta"]


# -- main ----------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--quick", action="store_true",
                   help=f"{QUICK_ROWS:,} rows, 3 runs, W2h and the slowest peers left out or "
                        "run on smaller lakes (all flagged in the tables)")
    p.add_argument("--rows", type=int, help=f"lake size (default {FULL_ROWS:,}; {QUICK_ROWS:,} with --quick)")
    p.add_argument("--reps", type=int, help="timed runs per cell after the warm-up (default 3 quick, 5 full)")
    p.add_argument("--peers", type=lambda s: s.split(","), help=f"comma-separated subset of: {', '.join(PEERS)}")
    p.add_argument("--workloads", type=lambda s: s.split(","),
                   help=f"comma-separated subset of: {', '.join(WORKLOADS)}")
    p.add_argument("--write", action="store_true", help="record the tables in RESULTS.md and the chart "
                                                        "in results.png")
    p.add_argument("--spawn", action="store_true", help="a fresh Python per run instead of forking")
    p.add_argument("--timeout", type=float, default=None, help="seconds per run (default 180 quick, 900 full)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--render", type=Path, help="re-render a saved benchmarks/out/results-N.json, run nothing")
    args = p.parse_args(argv)
    for k in args.peers or []:
        if k not in PEERS:
            p.error(f"unknown peer {k!r}; choose from {', '.join(PEERS)}")
    for k in args.workloads or []:
        if k not in WORKLOADS:
            p.error(f"unknown workload {k!r}; choose from {', '.join(WORKLOADS)}")
    log = lambda m: print(m, flush=True)  # noqa: E731

    if args.render:
        cells, rows, meta = restore(args.render)
        body = render(cells, rows, meta)
        print(body)
        if args.write:
            write_results(rows, body, chart(cells, rows, CHART))
        return 0

    def _term(*_):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, _term)
    rows = args.rows if args.rows is not None else (QUICK_ROWS if args.quick else FULL_ROWS)
    args.reps = args.reps or (3 if args.quick else 5)
    if args.reps < 3:
        p.error("--reps must be at least 3 (medians of fewer runs are noise)")
    args.timeout = args.timeout or (180 if args.quick else 900)
    argv_used = sys.argv[1:] if argv is None else argv
    command = shlex.join(["python", "benchmarks/run.py", *argv_used])
    t_start = time.perf_counter()
    cells = build_cells(args, rows)
    log(f"{len([c for c in cells if not c.verify_only])} cells ({len(cells)} with verification-only "
        f"references), {args.reps} timed runs each after a warm-up; lake {rows:,} rows")
    lakes = prepare_data(cells, log)
    floor = floors(cells, lakes)
    load_start = load()
    status = 0
    try:
        measure(cells, lakes, args, log)
    except Mismatch as exc:
        print(f"CORRECTNESS FAILURE: {exc}", file=sys.stderr)
        status = 2
    prep = {"total_s": time.perf_counter() - t_start}
    meta = {"machine": machine_lines(rows, args, command, (load_start, load()), prep), "command": command,
            "left_out": left_out(args), "floor": floor}
    saved = save(cells, rows, meta)
    if status:
        log(f"raw results so far: {saved.relative_to(REPO)}")
        return status
    body = render(cells, rows, meta)
    print()
    print(body)
    failed = [c.key for c in cells if c.warm and "error" in c.warm]
    if failed:
        log("runs that failed (see the tables): " + ", ".join(failed))
        for c in cells:
            if c.warm and "error" in c.warm:
                log(f"--- {c.key}: {c.warm['error']}\n{c.warm.get('log', '')[-800:]}")
    if args.write:
        write_results(rows, body, chart(cells, rows, CHART))
        log(f"recorded in {RESULTS.relative_to(REPO)} and {CHART.relative_to(REPO)}")
    log(f"run.py finished in {time.perf_counter() - t_start:.0f} s (raw results: {saved.relative_to(REPO)})")
    if any(c.peer.role in ("arrowload", "decode", "tuned") for c in cells if c.warm and "error" in c.warm):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
