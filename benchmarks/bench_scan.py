#!/usr/bin/env python
"""How close is arrowload's selection path to the bare decode of the same columns?

One run, one lake, every contender: arrowload (``to_arrow``, ``to_batches``, ``head``,
``count``) against polars streaming, a tuned pyarrow Scanner, pyarrow.dataset with its
defaults and DuckDB, over five workloads. Contenders run round-robin (each repetition
runs every contender once, in a seeded shuffled order) after a warm-up pass that also
checks that every contender returns the same rows (row count, sum of ``f0``, sum of
``label``); a disagreement exits with status 2. Reported figures are medians of the
timed repetitions, wall clock and process CPU time.

    python benchmarks/bench_scan.py --quick          # 1M rows, 3 repetitions: 1-3 minutes
    python benchmarks/bench_scan.py --write          # 4M rows; records into RESULTS.md

Every timing is end to end from the directory path to the result: opening the dataset
(listing, footers, planning) is inside the timed region for every contender, as a user
pays for it. Data is read from the OS page cache after the warm-up (not a cold disk).
See benchmarks/README.md for the meaning of each column.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import gc
import json
import math
import os
import platform
import random
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

import arrowload as al

from _common import DATA, LAKE_PARAMS, REPO, RESULTS, ensure_lake, replace_section  # noqa: F401

QUICK_ROWS = 1_000_000
FULL_ROWS = 4_000_000

COLUMNS = [f"f{i}" for i in range(16)] + ["label"]
FILTER_SQL = "country = 'US' AND label = 1"
FILTER_PA = (pc.field("country") == "US") & (pc.field("label") == 1)
FILTER_PL = (pl.col("country") == "US") & (pl.col("label") == 1)
HEAD_N = 5

#: Threshold of the issue's target: a projected, filtered scan within 5% of raw pyarrow.dataset.
WITHIN = 1.05
#: "Far faster" for head / count: at most this fraction of a full read of the same selection.
FAR = 0.10


# -- results and their checks --------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Check:
    """What every contender of a workload must agree on. ``f0`` / ``label`` are None when
    a timed (not verified) streaming run only counted rows."""

    rows: int
    f0: float | None = None
    label: int | None = None

    def agrees(self, other: "Check") -> bool:
        if self.rows != other.rows:
            return False
        if self.f0 is not None and other.f0 is not None and \
                not math.isclose(self.f0, other.f0, rel_tol=1e-9, abs_tol=1e-6):
            return False
        if self.label is not None and other.label is not None and self.label != other.label:
            return False
        return True

    def __str__(self) -> str:
        out = f"rows={self.rows}"
        if self.f0 is not None:
            out += f" sum(f0)={self.f0:.6f} sum(label)={self.label}"
        return out


def _column_sums(cols: dict[str, Any]) -> tuple[float, int]:
    f0 = pc.sum(pc.cast(cols["f0"], pa.float64())).as_py() or 0.0
    label = pc.sum(pc.cast(cols["label"], pa.int64())).as_py() or 0
    return f0, label


def tally(batches, verify: bool) -> Check:
    """Consume a stream of record batches. Timed runs only touch each batch (``num_rows``);
    the verifying warm-up run also sums ``f0`` and ``label``."""
    rows, f0, label = 0, 0.0, 0
    for b in batches:
        rows += b.num_rows
        if verify:
            s0, sl = _column_sums({"f0": b.column("f0"), "label": b.column("label")})
            f0 += s0
            label += sl
    return Check(rows, f0, label) if verify else Check(rows)


def summarize(out: Any) -> Check:
    """A contender's output (Table, polars DataFrame, int count or an already taken Check)."""
    if isinstance(out, Check):
        return out
    if isinstance(out, int):
        return Check(out)
    if isinstance(out, pl.DataFrame):
        out = out.to_arrow()
    if isinstance(out, pa.Table):
        if "f0" in out.column_names:
            return Check(out.num_rows, *_column_sums({"f0": out["f0"], "label": out["label"]}))
        return Check(out.num_rows)
    raise TypeError(f"unexpected contender output {type(out).__name__}")


# -- contenders --------------------------------------------------------------------------

@dataclasses.dataclass
class Contender:
    name: str
    run: Callable[[bool], Any]          # run(verify) -> output, timed as a whole
    arrowload: bool = False
    shape: str = "table"                # "table" | "stream" | "head" | "count": matched for "x tuned"
    tuned: bool = False                 # the tuned pyarrow scan of its shape
    raw: bool = False                   # pyarrow.dataset with its defaults
    times: list[float] = dataclasses.field(default_factory=list)   # wall seconds per repetition
    cpu: list[float] = dataclasses.field(default_factory=list)     # process CPU seconds (all threads)

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu)


@dataclasses.dataclass
class Workload:
    key: str
    title: str
    contenders: list[Contender]
    truth: Check | None = None


def _duck(rel, method_new: str, method_old: str, *args):
    fn = getattr(rel, method_new, None) or getattr(rel, method_old)
    return fn(*args)


def build_workloads(lake: Path, tuning: argparse.Namespace) -> list[Workload]:
    path = str(lake)
    glob = f"{path}/*.parquet"
    duck_src = "read_parquet('" + glob.replace("'", "''") + "')"
    cols_sql = ", ".join(COLUMNS)

    def tuned_scanner(columns, filt):
        return pads.dataset(path, format="parquet").scanner(
            columns=columns, filter=filt, batch_size=tuning.batch_size,
            fragment_scan_options=pads.ParquetFragmentScanOptions(pre_buffer=True),
            batch_readahead=tuning.batch_readahead, fragment_readahead=tuning.fragment_readahead)

    def raw():
        return pads.dataset(path, format="parquet")

    def sel(filtered: bool):
        d = al.dataset(path)
        if filtered:
            d = d.filter(FILTER_SQL)
        return d.select(*COLUMNS)

    def scan_contenders(filtered: bool) -> list[Contender]:
        filt = FILTER_PA if filtered else None
        where = f" WHERE {FILTER_SQL}" if filtered else ""
        query = f"SELECT {cols_sql} FROM {duck_src}{where}"

        def polars_lazy():
            lf = pl.scan_parquet(glob)
            if filtered:
                lf = lf.filter(FILTER_PL)
            return lf.select(COLUMNS)

        return [
            Contender("arrowload to_arrow()", lambda v: sel(filtered).to_arrow(), arrowload=True),
            Contender("arrowload to_batches()", lambda v: tally(sel(filtered).to_batches(), v),
                      arrowload=True, shape="stream"),
            Contender("pyarrow tuned Scanner.to_table()",
                      lambda v: tuned_scanner(COLUMNS, filt).to_table(), tuned=True),
            Contender("pyarrow tuned Scanner.to_batches()",
                      lambda v: tally(tuned_scanner(COLUMNS, filt).to_batches(), v),
                      shape="stream", tuned=True),
            Contender("pyarrow.dataset default to_table()",
                      lambda v: raw().to_table(columns=COLUMNS, filter=filt), raw=True),
            Contender("pyarrow.dataset default to_batches()",
                      lambda v: tally(raw().to_batches(columns=COLUMNS, filter=filt), v),
                      shape="stream", raw=True),
            Contender("polars streaming collect()",
                      lambda v: polars_lazy().collect(engine="streaming")),
            Contender("duckdb to_arrow_table()",
                      lambda v: _duck(duckdb.sql(query), "to_arrow_table", "fetch_arrow_table")),
            Contender("duckdb to_arrow_reader()",
                      lambda v: tally(_duck(duckdb.sql(query), "to_arrow_reader", "fetch_record_batch",
                                            tuning.batch_size), v), shape="stream"),
        ]

    def count_contenders(filtered: bool) -> list[Contender]:
        filt = FILTER_PA if filtered else None
        where = f" WHERE {FILTER_SQL}" if filtered else ""

        def al_count():
            d = al.dataset(path)
            return (d.filter(FILTER_SQL) if filtered else d).count()

        def pl_count():
            lf = pl.scan_parquet(glob)
            if filtered:
                lf = lf.filter(FILTER_PL)
            return int(lf.select(pl.len()).collect(engine="streaming").item())

        return [
            Contender("arrowload count()", lambda v: al_count(), arrowload=True, shape="count"),
            Contender("pyarrow tuned Scanner.count_rows()",
                      lambda v: tuned_scanner(["label"] if filtered else [], filt).count_rows(),
                      shape="count", tuned=True),
            Contender("pyarrow.dataset default count_rows()",
                      lambda v: raw().count_rows(filter=filt), shape="count", raw=True),
            Contender("polars streaming select(pl.len())", lambda v: pl_count(), shape="count"),
            Contender("duckdb count(*)",
                      lambda v: int(duckdb.sql(f"SELECT count(*) FROM {duck_src}{where}").fetchall()[0][0]),
                      shape="count"),
        ]

    head_query = f"SELECT {cols_sql} FROM {duck_src} LIMIT {HEAD_N}"
    head = [
        Contender(f"arrowload head({HEAD_N})", lambda v: sel(False).head(HEAD_N), arrowload=True,
                  shape="head"),
        Contender(f"pyarrow tuned Scanner.head({HEAD_N})",
                  lambda v: tuned_scanner(COLUMNS, None).head(HEAD_N), shape="head", tuned=True),
        Contender(f"pyarrow.dataset default head({HEAD_N})",
                  lambda v: raw().head(HEAD_N, columns=COLUMNS), shape="head", raw=True),
        Contender(f"polars streaming head({HEAD_N})",
                  lambda v: pl.scan_parquet(glob).select(COLUMNS).head(HEAD_N).collect(engine="streaming"),
                  shape="head"),
        Contender(f"duckdb LIMIT {HEAD_N}",
                  lambda v: _duck(duckdb.sql(head_query), "to_arrow_table", "fetch_arrow_table"),
                  shape="head"),
    ]
    return [
        Workload("scan", "1. projection f0..f15 + label, no filter", scan_contenders(False)),
        Workload("scan_filter", f"2. projection f0..f15 + label, filter `{FILTER_SQL}`",
                 scan_contenders(True)),
        Workload("head", f"3. head({HEAD_N}) of the projection", head),
        Workload("count", "4. count(), no filter", count_contenders(False)),
        Workload("count_filter", f"5. count() with filter `{FILTER_SQL}`", count_contenders(True)),
    ]


# -- measuring ----------------------------------------------------------------------------

class Mismatch(Exception):
    pass


def _once(c: Contender, verify: bool) -> tuple[float, float, Check]:
    gc.collect()
    c0, t0 = time.process_time(), time.perf_counter()
    out = c.run(verify)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    check = summarize(out)
    del out
    return seconds, cpu, check


def verify(workloads: list[Workload], log=print) -> None:
    """Warm-up pass: run every contender once (untimed) and compare full checksums."""
    for w in workloads:
        for c in w.contenders:
            _, _, check = _once(c, True)
            if w.truth is None:
                w.truth = check
            elif not w.truth.agrees(check):
                raise Mismatch(f"workload {w.key!r}: {c.name} returned {check}, but "
                               f"{w.contenders[0].name} returned {w.truth}")
        log(f"verified {w.key}: {len(w.contenders)} contenders agree on {w.truth}")


def measure(workloads: list[Workload], reps: int, log=print) -> None:
    """Round-robin: each repetition runs every workload's contenders once, in an order
    shuffled per repetition (seeded, so reruns use the same orders): slow drift of the
    machine spreads over all contenders, and no contender always follows the same one
    (whose threads or freed memory could weigh on the next)."""
    for rep in range(reps):
        t0 = time.perf_counter()
        for i, w in enumerate(workloads):
            for c in random.Random(f"{rep}/{i}").sample(w.contenders, len(w.contenders)):
                seconds, cpu, check = _once(c, False)
                if not w.truth.agrees(check):
                    raise Mismatch(f"workload {w.key!r} repetition {rep + 1}: {c.name} returned "
                                   f"{check}, expected {w.truth}")
                c.times.append(seconds)
                c.cpu.append(cpu)
        log(f"repetition {rep + 1}/{reps}: {time.perf_counter() - t0:.1f} s")


# -- planning vs scanning ----------------------------------------------------------------

def phases(lake: Path, reps: int) -> dict[str, dict[str, tuple[float, float]]]:
    """Where arrowload's time goes on the filtered projected scan, against raw pyarrow,
    interleaved, medians of ``reps`` (wall, CPU seconds): listing, footers (every file's
    metadata, row-group facts, schema unification), building the selection (SQL parse),
    optimizing, then the scan of the optimized plan."""
    from arrowload.scan import execute  # internal: diagnostics only

    path = str(lake)
    rows: dict[str, list[tuple[float, float]]] = {}

    def clock() -> tuple[float, float]:
        return time.perf_counter(), time.process_time()

    def record(who: str, names: list[str], marks: list[tuple[float, float]]) -> None:
        for key, (w0, c0), (w1, c1) in zip(names, marks, marks[1:]):
            rows.setdefault(f"{who}|{key}", []).append((w1 - w0, c1 - c0))
        (w0, c0), (w1, c1) = marks[0], marks[-1]
        rows.setdefault(f"{who}|total", []).append((w1 - w0, c1 - c0))

    for _ in range(reps):
        gc.collect()
        t = [clock()]
        d = al.dataset(path); t.append(clock())
        d.schema; t.append(clock())
        s = d.filter(FILTER_SQL).select(*COLUMNS); t.append(clock())
        plan = s.optimized_plan(); t.append(clock())
        out = execute.to_table(plan, s.options); t.append(clock())
        record("arrowload", list(PHASES), t)
        del out
        gc.collect()
        t = [clock()]
        r = pads.dataset(path, format="parquet"); t.append(clock())
        out = r.to_table(columns=COLUMNS, filter=FILTER_PA); t.append(clock())
        record("pyarrow default", ["open (list files)", "scan (execute.to_table)"], t)
        del out
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for key, values in rows.items():
        who, what = key.split("|")
        out.setdefault(who, {})[what] = (statistics.median(v[0] for v in values),
                                         statistics.median(v[1] for v in values))
    return out


PHASES = {
    "open (list files)": "`al.dataset(dir)` / `pads.dataset(dir)` (pyarrow also reads the first footer)",
    "footers (schema, row groups)": "every file's footer, row-group facts, schema unification",
    "filter/select (parse)": "SQL text to expression, projection",
    "optimize": "the optimizer's rules (pushdown, pruning from statistics)",
    "scan (execute.to_table)": "the pyarrow scan of the optimized plan (pyarrow: footers + scan)",
}


def profile(call: Callable[[], Any], limit: int = 25) -> str:
    """cProfile of one call, by cumulative time, with machine paths cut off."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    call()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(limit)
    text = buf.getvalue().replace(str(REPO) + os.sep, "")
    return re.sub(r"(\S*/)(site-packages|lib/python[0-9.]+|arrowload)/", r"\2/", text)


# -- report ------------------------------------------------------------------------------

def _fmt_s(s: float) -> str:
    return f"{s:.4f}" if s < 1 else f"{s:.3f}"


def _fmt_rate(r: float) -> str:
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if r >= div:
            return f"{r / div:.1f}{unit}"
    return f"{r:.0f}"


def limit_of(w: Workload) -> Contender:
    return min((c for c in w.contenders if not c.arrowload), key=lambda c: c.median)


def table(w: Workload, lake_rows: int) -> str:
    limit = limit_of(w)
    tuned = {c.shape: c for c in w.contenders if c.tuned}
    lines = [f"### {w.title}", "",
             f"Output: {w.truth}. Limit (fastest bare decode): {limit.name}.", "",
             "| contender | median s | min–max s | CPU s | lake rows/s | × limit | × tuned pyarrow |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for c in sorted(w.contenders, key=lambda c: c.median):
        ref = tuned.get(c.shape) or tuned.get("table")
        name = f"**{c.name}**" if c.arrowload else c.name
        lines.append(f"| {name} | {_fmt_s(c.median)} | {_fmt_s(min(c.times))}–{_fmt_s(max(c.times))} "
                     f"| {_fmt_s(c.cpu_median)} | {_fmt_rate(lake_rows / c.median)} | {c.median / limit.median:.2f} "
                     f"| {c.median / ref.median:.2f} |")
    return "\n".join(lines)


def _find(workloads, key, pred) -> Contender:
    w = next(w for w in workloads if w.key == key)
    return next(c for c in w.contenders if pred(c))


def paired(a: Contender, b: Contender) -> float:
    """Median over repetitions of a's time / b's time in the same repetition: robust to
    load that drifts between repetitions (other processes on a shared machine)."""
    return statistics.median(x / y for x, y in zip(a.times, b.times))


def _ratios(a: Contender, b: Contender) -> str:
    return (f"{_fmt_s(a.median)} s vs {_fmt_s(b.median)} s = **{a.median / b.median:.3f}×** "
            f"(paired per repetition {paired(a, b):.3f}×; CPU {a.cpu_median / b.cpu_median:.3f}×)")


def _verdict(conditions: list[tuple[Contender, Contender, float]]) -> str:
    """``met`` when every ``a / b <= limit`` holds on the ratio of medians and on the paired
    per-repetition ratio, ``missed`` when both fail for one of them, else ``inconclusive``:
    the run was too noisy to decide (rerun on a quieter machine or with more --reps)."""
    medians = [a.median / b.median <= lim for a, b, lim in conditions]
    pairs = [paired(a, b) <= lim for a, b, lim in conditions]
    if all(medians) and all(pairs):
        return "met"
    if any(not m and not p for m, p in zip(medians, pairs)):
        return "missed"
    return "inconclusive"


def targets(workloads: list[Workload]) -> list[tuple[str, str, str]]:
    """The issue's targets, each (statement, verdict, evidence); see ``_verdict``. CPU
    ratios are printed as a third view of the same comparison."""
    out = []
    for shape, method in (("table", "to_arrow()"), ("stream", "to_batches()")):
        a = _find(workloads, "scan_filter", lambda c: c.arrowload and c.shape == shape)
        r = _find(workloads, "scan_filter", lambda c: c.raw and c.shape == shape)
        out.append((f"filtered projected `{method}` within {WITHIN - 1:.0%} of raw pyarrow.dataset "
                    f"`{r.name.split()[-1]}`", _verdict([(a, r, WITHIN)]), _ratios(a, r)))
    full = {k: _find(workloads, k, lambda c: c.raw and c.shape == "table") for k in ("scan", "scan_filter")}
    for key, base, what in (("head", "scan", f"head({HEAD_N})"), ("count", "scan", "count()"),
                            ("count_filter", "scan_filter", "count() with filter")):
        a = _find(workloads, key, lambda c: c.arrowload)
        r = _find(workloads, key, lambda c: c.raw)
        op = r.name.split()[-1]
        evidence = (f"{_fmt_s(a.median)} s = **{a.median / full[base].median:.3f}×** raw pyarrow.dataset's "
                    f"full read `to_table()` ({_fmt_s(full[base].median)} s); vs raw `{op}`: " + _ratios(a, r))
        if key == "count_filter":
            # The filter's columns must be decoded (statistics cannot decide this predicate),
            # so raw count_rows(filter), which decodes only those, is the floor to match.
            out.append((f"`{what}` within {WITHIN - 1:.0%} of raw pyarrow's `{op}` (which decodes only "
                        "the filter's columns: statistics cannot decide this filter) and faster than "
                        "the full read", _verdict([(a, r, WITHIN), (a, full[base], 1.0)]), evidence))
        else:
            out.append((f"`{what}` far faster than raw: ≤ {FAR:.0%} of raw pyarrow.dataset's full read "
                        f"of the same selection, and within {WITHIN - 1:.0%} of raw pyarrow's own `{op}`",
                        _verdict([(a, full[base], FAR), (a, r, WITHIN)]), evidence))
    return out


def load() -> str:
    try:
        return " / ".join(f"{x:.1f}" for x in os.getloadavg())
    except (OSError, AttributeError):
        return "?"


def machine() -> list[str]:
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    except OSError:
        pass
    try:
        ram = f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB"
    except (ValueError, OSError, AttributeError):
        ram = "?"
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    commit = "?"
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, check=True).stdout.strip()
        commit += " (with uncommitted changes)" if dirty else ""
    except (OSError, subprocess.CalledProcessError):
        pass
    threads = duckdb.sql("SELECT current_setting('threads')").fetchall()[0][0]
    return [
        f"- date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- machine: {usable} usable cores ({os.cpu_count()} online, {cpu}), {ram} RAM, "
        f"{platform.system()} {platform.machine()}",
        f"- threads: pyarrow cpu {pa.cpu_count()} / io {pa.io_thread_count()}, "
        f"polars {pl.thread_pool_size()}, duckdb {threads}",
        f"- python {platform.python_version()}, pyarrow {pa.__version__}, polars {pl.__version__}, "
        f"duckdb {duckdb.__version__}, numpy {np.__version__}, arrowload {getattr(al, '__version__', '?')} "
        f"at commit {commit}",
    ]


def report(workloads, lake: Path, args, reps: int, phase: dict, command: str,
           loads: tuple[str, str]) -> str:
    marker = json.loads((lake.parent / f"{lake.name}.json").read_text())
    nbytes = sum(marker["files"].values())
    rows = marker["params"]["rows"]
    lines = machine() + [
        f"- command: `{command}`",
        f"- data: `write_lake(rows={rows:_}, shards={LAKE_PARAMS['shards']}, "
        f"row_group_size={LAKE_PARAMS['row_group_size']:_}, emb_dim={LAKE_PARAMS['emb_dim']})`, "
        f"{len(marker['files'])} zstd Parquet files, {nbytes / 2**20:.0f} MiB; read from the page cache",
        f"- method: 1 verifying warm-up + {reps} timed repetitions, round-robin in a shuffled order; medians",
        f"- load average (1 / 5 / 15 min) at start {loads[0]}, at end {loads[1]} "
        f"(above {os.cpu_count()} means other processes competed for the cores)",
        f"- tuned pyarrow: batch_size={args.batch_size:_}, batch_readahead={args.batch_readahead}, "
        f"fragment_readahead={args.fragment_readahead}, pre_buffer=True",
        "",
    ]
    for w in workloads:
        lines += [table(w, rows), ""]
    lines += ["### Targets", ""]
    for statement, verdict, evidence in targets(workloads):
        lines.append(f"- **{verdict}**: {statement}: {evidence}")
    lines += ["", f"### Where the time goes: workload 2 (`to_arrow()`), medians of {reps} runs", "",
              "| phase | what | arrowload wall s | arrowload CPU s | pyarrow.dataset default wall s "
              "| pyarrow.dataset default CPU s |",
              "|---|---|---:|---:|---:|---:|"]
    a, r = phase["arrowload"], phase["pyarrow default"]

    def cells(v):
        return f"{_fmt_s(v[0])} | {_fmt_s(v[1])}" if v is not None else "— | —"

    for k, what in PHASES.items():
        lines.append(f"| {k} | {what} | {cells(a[k])} | {cells(r.get(k))} |")
    plan_a = tuple(sum(a[k][i] for k in PHASES if k != "scan (execute.to_table)") for i in (0, 1))
    lines.append(f"| planning | all but the scan | {cells(plan_a)} | {cells(r['open (list files)'])} |")
    lines.append(f"| total | | {cells(a['total'])} | {cells(r['total'])} |")
    return "\n".join(lines)


def write_results(section_key: str, title: str, body: str) -> None:
    begin, end = f"<!-- bench_scan:{section_key}:begin -->", f"<!-- bench_scan:{section_key}:end -->"
    replace_section(begin, end, f"{begin}\n## {title}\n\n{body}\n{end}\n")


# -- main ----------------------------------------------------------------------------------

def checksum_cost(rows: int, reps: int) -> str:
    """Page checksum verification on vs off: one lake written with
    ``write_page_checksum=True`` (same table and layout as the main lake), arrowload
    ``to_arrow()`` of every column, both settings interleaved in each repetition (order
    alternating), after one warm-up of each; medians of wall clock and process CPU."""
    import pyarrow.parquet as pq

    from arrowload.datagen import events_table

    lake = DATA / f"checksums-{rows}"
    if not lake.exists():
        tmp = lake.with_name(lake.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        per = -(-rows // LAKE_PARAMS["shards"])
        for s in range(LAKE_PARAMS["shards"]):
            lo, hi = s * per, min(rows, (s + 1) * per)
            t = events_table(hi - lo, start_id=lo, emb_dim=LAKE_PARAMS["emb_dim"])
            pq.write_table(t, tmp / f"part-{s:05d}.parquet", row_group_size=LAKE_PARAMS["row_group_size"],
                           compression="zstd", write_page_checksum=True)
        tmp.rename(lake)
    settings = {"on": al.ScanOptions(page_checksums=True), "off": al.ScanOptions(page_checksums=False)}

    def run(setting: str) -> tuple[float, float, int]:
        gc.collect()
        w0, c0 = time.perf_counter(), time.process_time()
        n = al.dataset(str(lake)).with_options(scan=settings[setting]).to_arrow().num_rows
        return time.perf_counter() - w0, time.process_time() - c0, n

    for k in settings:
        run(k)  # warm-up: page cache, imports
    samples: dict[str, list[tuple[float, float]]] = {k: [] for k in settings}
    for r in range(reps):
        for k in (("on", "off") if r % 2 == 0 else ("off", "on")):
            wall, cpu, n = run(k)
            assert n == rows, (n, rows)
            samples[k].append((wall, cpu))
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in samples.items()}
    wall_pct = 100.0 * (med["on"][0] / med["off"][0] - 1)
    cpu_pct = 100.0 * (med["on"][1] / med["off"][1] - 1)
    lines = [f"page checksum verification, arrowload to_arrow() of {rows:,} rows "
             f"({LAKE_PARAMS['shards']} files, zstd, write_page_checksum=True), {reps} interleaved reps, medians:",
             "| verification | wall s | CPU s |", "|---|---:|---:|"]
    for k in ("off", "on"):
        lines.append(f"| {k} | {med[k][0]:.3f} | {med[k][1]:.3f} |")
    lines.append(f"cost of verification: wall {wall_pct:+.1f}%, CPU {cpu_pct:+.1f}%")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help=f"{QUICK_ROWS:,} rows instead of {FULL_ROWS:,}")
    p.add_argument("--rows", type=int, help="lake size in rows (overrides --quick)")
    p.add_argument("--reps", type=int, default=None,
                   help="timed repetitions after the warm-up (default 3 with --quick, else 7; at least 3)")
    p.add_argument("--write", action="store_true", help="record the run in benchmarks/RESULTS.md")
    p.add_argument("--profile", action="store_true",
                   help="also print cProfiles of one arrowload filtered to_arrow() and count()")
    p.add_argument("--batch-size", type=int, default=65_536, help="tuned pyarrow Scanner batch_size")
    # Defaults: arrowload's own ScanOptions, so "x tuned pyarrow" isolates arrowload's overhead.
    p.add_argument("--batch-readahead", type=int, default=4, help="tuned pyarrow Scanner batch_readahead")
    p.add_argument("--fragment-readahead", type=int, default=2,
                   help="tuned pyarrow Scanner fragment_readahead")
    p.add_argument("--checksums", action="store_true",
                   help="only measure Parquet page checksum verification: a lake written with "
                        "page checksums, arrowload to_arrow() with verification on vs off")
    args = p.parse_args(argv)
    rows = args.rows if args.rows is not None else (QUICK_ROWS if args.quick else FULL_ROWS)
    reps = args.reps if args.reps is not None else (3 if args.quick else 7)
    if reps < 3:
        p.error("--reps must be at least 3 (medians of fewer runs are noise)")
    argv_used = sys.argv[1:] if argv is None else argv
    command = shlex.join(["python", os.path.relpath(Path(__file__).resolve(), REPO), *argv_used])

    if args.checksums:
        print(checksum_cost(rows, max(reps, 7)))
        return 0

    t_start = time.perf_counter()
    lake = ensure_lake(rows)
    load_start = load()
    workloads = build_workloads(lake, args)
    try:
        verify(workloads)
        measure(workloads, reps)
    except Mismatch as exc:
        print(f"CORRECTNESS FAILURE: {exc}", file=sys.stderr)
        return 2
    phase = phases(lake, reps)
    body = report(workloads, lake, args, reps, phase, command, (load_start, load()))
    print()
    print(body)
    if args.profile:
        path = str(lake)
        for what, call in (("filtered to_arrow()",
                            lambda: al.dataset(path).filter(FILTER_SQL).select(*COLUMNS).to_arrow()),
                           ("count()", lambda: al.dataset(path).count())):
            print(f"\n### cProfile: arrowload {what}, by cumulative time\n")
            print("```\n" + profile(call).strip() + "\n```")
    if args.write:
        size = "quick" if rows == QUICK_ROWS else ("full" if rows == FULL_ROWS else "custom")
        write_results(f"rows={rows}", f"bench_scan: {rows:,} rows ({size})", body)
        print(f"\nrecorded in {RESULTS.relative_to(REPO)}")
    print(f"\nbench_scan finished in {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
