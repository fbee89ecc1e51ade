"""What the harness (``benchmarks/run.py``) and every peer (``benchmarks/peers/*.py``) share.

A *run* is one (peer, workload, mode) in a fresh process, described by a JSON *spec*.
The peer module turns the spec into a stream of batches; :func:`run_spec` times that
stream into an infinitely fast consumer and returns a JSON-able result::

    python benchmarks/peers/duckdb_reader.py '{"workload": "W1", "lake": "...", ...}'
    @@RESULT {"rows": 1000000, "label_sum": 199911, "x0_sum": -602.25, "seconds": 0.41, ...}

The result line (prefixed ``@@RESULT``, since libraries print to stdout too) is the last
line of stdout. The harness normally forks runs from a pre-imported server process
(``--serve``, below) instead of starting Python each time: on a loaded 2-core machine
``import torch`` alone costs seconds, which would otherwise dominate a quick run. Each
run is still its own process, forked from a server that has imported modules and done
nothing else, so it starts without threads, caches or data.

Peer module contract (all functions but ``batches`` optional)::

    def setup(spec, info): ...        # once-per-process start-up (ray.init); timed apart
    def batches(spec, info): ...      # iterator of (x, y) torch tensors or Sums
    def teardown(spec, info): ...     # after the measurement (ray.shutdown)

``info`` is a dict the peer fills: ``shuffle`` (the kind it gives, named honestly),
``resume`` (how it resumes mid-epoch), ``notes`` (list of strings), ``tree`` (True when
it runs helper processes whose memory belongs to it).

Only the standard library is imported at module level: the harness imports this file.
"""

from __future__ import annotations

import json
import math
import os
import resource
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FEATURES = [f"f{i}" for i in range(16)]
FILTER_SQL = "country = 'US' AND label = 1"
#: The filters of the workloads, by key. ``us1`` keeps ~7% of rows spread over every row
#: group (statistics cannot prune it); ``id10`` keeps the first 10% of ids (``id < 400000``
#: on the 4M-row lake), whole row groups that footers' statistics prune; ``f90`` keeps ~4%
#: of rows by a float32 feature against a literal DuckDB rounds to float32 (``0.9``).
FILTERS = {"us1": FILTER_SQL, "id10": "id < {bound}", "f90": "f0 > 0.9 AND label = 1"}
#: The columns each filter reads besides the selection's.
FILTER_COLUMNS = {"us1": ("country", "label"), "id10": ("id",), "f90": ("f0", "label")}
RESULT_PREFIX = "@@RESULT "
HERE = os.path.dirname(os.path.abspath(__file__))

# Tuned pyarrow scan (the reference of the "x tuned pyarrow" column; same settings as
# benchmarks/bench_scan.py): row-group sized batches, pre_buffer, readahead.
TUNED = dict(batch_size=65_536, batch_readahead=4, fragment_readahead=2)


# -- workloads -------------------------------------------------------------------------

@dataclass(frozen=True)
class Workload:
    key: str
    title: str
    x: tuple[str, ...]          # stacked into x: [B, len(x)] (or emb: [B, 64])
    batch: int
    filter: str | None = None   # a key of FILTERS
    shuffle: bool = False
    hive: bool = False          # read the hive-partitioned copy
    mode: str = "epoch"         # "epoch" | "first" (cold / warm start) | "resume"

    @property
    def columns(self) -> list[str]:
        return [*self.x, "label"]


def filter_sql(spec: dict) -> str | None:
    """The SQL text of the spec's filter (arrowload, DuckDB, Lance spell it so), or None."""
    w = WORKLOADS[spec["workload"]]
    if not w.filter:
        return None
    return FILTERS[w.filter].format(bound=id_bound(spec["lake_rows"]))


def id_bound(lake_rows: int) -> int:
    """W2i's bound: the first 10% of ids (ids run 0..rows-1 in path order)."""
    return lake_rows // 10


def pa_filter(spec: dict):
    """The spec's filter as a pyarrow compute expression, or None."""
    w = WORKLOADS[spec["workload"]]
    if not w.filter:
        return None
    import pyarrow.compute as pc
    if w.filter == "us1":
        return (pc.field("country") == "US") & (pc.field("label") == 1)
    if w.filter == "f90":
        import pyarrow as pa
        return (pc.field("f0") > pa.scalar(0.9, pa.float32())) & (pc.field("label") == 1)
    return pc.field("id") < id_bound(spec["lake_rows"])


def pl_filter(spec: dict):
    """The spec's filter as a polars expression, or None."""
    w = WORKLOADS[spec["workload"]]
    if not w.filter:
        return None
    import polars as pl
    if w.filter == "us1":
        return (pl.col("country") == "US") & (pl.col("label") == 1)
    if w.filter == "f90":
        return (pl.col("f0") > pl.lit(0.9, dtype=pl.Float32)) & (pl.col("label") == 1)
    return pl.col("id") < id_bound(spec["lake_rows"])


WORKLOADS: dict[str, Workload] = {w.key: w for w in [
    Workload("W1", "projection f0..f15 -> x[B,16] + label, batch 4096, no shuffle", tuple(FEATURES), 4096),
    Workload("W2", f"W1 + filter `{FILTER_SQL}` (~7% of rows, in every row group)", tuple(FEATURES), 4096,
             filter="us1"),
    Workload("W2i", "W1 + filter `id < rows/10` (`id < 400000` on the 4M-row lake: 10% of rows, "
             "row groups prunable by statistics)", tuple(FEATURES), 4096, filter="id10"),
    Workload("W2f", "W1 + filter `f0 > 0.9 AND label = 1` (~4% of rows, a float32 column against a "
             "decimal literal)", tuple(FEATURES), 4096, filter="f90"),
    Workload("W2h", "W2 on the hive copy (country=.../ folders)", tuple(FEATURES), 4096, filter="us1",
             hive=True),
    Workload("W3", "W1 shuffled (global where the peer can), batch 1024", tuple(FEATURES), 1024,
             shuffle=True),
    Workload("W4", "emb -> x[B,64] float32 + label, batch 1024, no shuffle", ("emb",), 1024),
    Workload("W5", "time to first batch after resuming at 90% of a W1 epoch (fresh process)",
             tuple(FEATURES), 4096, mode="resume"),
    Workload("W6", "time to first batch, cold: fresh process, empty library caches (W1)",
             tuple(FEATURES), 4096, mode="first"),
    Workload("W6w", "time to first batch, warm: fresh process, library caches kept (W1)",
             tuple(FEATURES), 4096, mode="first"),
]}


# -- peers -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Peer:
    key: str
    module: str                  # file benchmarks/peers/<module>.py
    label: str                   # how the tables name it
    options: dict = field(default_factory=dict)
    role: str = "peer"           # "decode" (bare decode: the limit) | "tuned" | "arrowload" | "peer"
    workloads: tuple[str, ...] = ("W1", "W2", "W2i", "W2f", "W2h", "W3", "W4", "W5", "W6", "W6w")
    #: lake size cap per mode ("quick" / "full"), per workload or "*": slow peers run on a
    #: smaller lake of the same generator (flagged in the tables); None = the main lake.
    caps: dict = field(default_factory=dict)
    #: the workloads it runs in --quick (None: all of its own; (): left out, and said so)
    quick: tuple[str, ...] | None = None
    why_not_quick: str = ""
    heavy: bool = False          # seconds per run: at most 3 timed runs (run.HEAVY_REPS)

    def cap(self, size: str, workload: str) -> int | None:
        by = self.caps.get(size) or {}
        return by.get(workload, by.get("*"))


#: Smaller lakes for peers that would take minutes on the main one (flagged in the tables).
SMALL, TINY = 250_000, 20_000
PEERS: dict[str, Peer] = {p.key: p for p in [
    Peer("decode-pyarrow", "bare_decode", "bare decode: pyarrow tuned Scanner (no conversion)",
         {"engine": "pyarrow"}, role="decode", workloads=("W1", "W2", "W2i", "W2f", "W2h", "W3", "W4")),
    Peer("decode-polars", "bare_decode", "bare decode: polars streaming collect()",
         {"engine": "polars"}, role="decode", workloads=("W1", "W2", "W2i", "W2f", "W2h", "W3", "W4")),
    Peer("arrowload", "arrowload_loader", "arrowload Dataset.loader(output='torch')", role="arrowload"),
    Peer("arrowload-block", "arrowload_loader", "arrowload loader, shuffle='block'",
         {"shuffle": "block"}, role="arrowload", workloads=("W3",)),
    Peer("pyarrow", "pyarrow_scan", "pyarrow tuned Scanner -> tensors", role="tuned"),
    Peer("duckdb", "duckdb_reader", "DuckDB to_arrow_reader (fetch_record_batch)"),
    Peer("polars", "polars_stream", "polars streaming collect_batches"),
    Peer("polars-hashsort", "polars_stream", "polars streaming hash-sort shuffle -> collect_batches",
         {"shuffle": "hashsort"}, workloads=("W3",)),
    Peer("torch-batched", "torch_dataloader", "torch DataLoader, batched sampler, map-style",
         {"rows": False, "workers": 0}),
    Peer("torch-rows-w0", "torch_dataloader", "torch DataLoader, per-row __getitem__, workers=0",
         {"rows": True, "workers": 0}, workloads=("W1", "W3", "W4"),
         caps={"quick": {"*": SMALL}, "full": {"*": 1_000_000}}, quick=("W1",), heavy=True),
    Peer("torch-rows-w2", "torch_dataloader", "torch DataLoader, per-row __getitem__, workers=2",
         {"rows": True, "workers": 2}, workloads=("W1", "W3"),
         caps={"full": {"*": 1_000_000}}, quick=(), heavy=True,
         why_not_quick="forks 2 workers per epoch on 2 cores; per-row like workers=0"),
    Peer("hf", "hf_datasets", "HuggingFace datasets with_format('torch')",
         workloads=("W1", "W2", "W3", "W4", "W5", "W6"),
         caps={"quick": {"*": SMALL, "W3": TINY}, "full": {"*": 1_000_000, "W3": SMALL}},
         quick=("W1", "W3", "W6"), heavy=True),
    Peer("ray", "ray_data", "Ray Data read_parquet -> iter_torch_batches (local)",
         workloads=("W1", "W2", "W2h", "W3", "W4", "W5"),
         caps={"full": {"*": 1_000_000}}, quick=(), heavy=True,
         why_not_quick="ray.init and the first batch take seconds in every run (fresh process)"),
    Peer("lance", "lance_scanner", "Lance (converted copy) scanner / take",
         workloads=("W1", "W2", "W2i", "W2f", "W3", "W4", "W5"),
         caps={"quick": {"W3": TINY}, "full": {"W3": SMALL}}),
    Peer("petastorm", "petastorm_reader", "Petastorm make_batch_reader", workloads=("W1",)),
]}


# -- batches -----------------------------------------------------------------------------

@dataclass
class Sums:
    """A piece of stream already reduced (bare decode references yield these): rows and
    the two checksums, computed from Arrow / polars without building tensors."""

    rows: int
    label_sum: int
    x0_sum: float


class Unusable(Exception):
    """The peer cannot run here (fails to import, API gone): reported, not fatal."""


def rebatch(batches, size: int):
    """Exact ``size``-row pyarrow RecordBatches from a stream of any sizes: zero-copy
    slices, one concatenation where a batch straddles two inputs (what a loader must do)."""
    import pyarrow as pa
    pending: deque = deque()
    have = 0
    for b in batches:
        if not b.num_rows:
            continue
        pending.append(b)
        have += b.num_rows
        while have >= size:
            yield _take(pending, size, pa)
            have -= size
    if have:
        yield _take(pending, have, pa)


def _take(pending: deque, n: int, pa):
    parts, got = [], 0
    while got < n:
        b = pending.popleft()
        k = min(b.num_rows, n - got)
        if k < b.num_rows:
            pending.appendleft(b.slice(k))
            b = b.slice(0, k)
        parts.append(b)
        got += k
    return parts[0] if len(parts) == 1 else pa.concat_batches(parts)


def arrow_xy(batch, x: tuple[str, ...]):
    """(x, y) torch tensors from an Arrow RecordBatch / Table: x is [B, 16] float32 stacked
    from the feature columns (one copy, np.stack), or the emb fixed-size list as [B, 64]
    (zero-copy view of its values); y the label column (zero-copy)."""
    import numpy as np
    import torch
    if x == ("emb",):
        col = batch.column("emb")
        if hasattr(col, "combine_chunks"):
            col = col.combine_chunks()
        xs = torch.from_numpy(col.flatten().to_numpy().reshape(len(col), -1))
    else:
        xs = torch.from_numpy(np.stack([_np(batch.column(c)) for c in x], axis=1))
    return xs, torch.from_numpy(_np(batch.column("label")))


def _np(col):
    if hasattr(col, "combine_chunks"):          # ChunkedArray (a Table slice)
        return col.to_numpy()
    return col.to_numpy(zero_copy_only=False)


# -- the measurement ------------------------------------------------------------------------

def read_bytes() -> int | None:
    """Bytes this process has read through read syscalls so far (``rchar`` of
    ``/proc/self/io``: read / pread / readv, page cache or not); None where there is no
    /proc (macOS). pyarrow, arrowload and DuckDB read local files so; polars 2.x preads the
    column chunks too (its rchar covers the footer floor), though it also maps some files,
    so for polars rchar is a lower bound. Reads through a memory map or in helper processes
    do not show here (the report compares with the footers' bytes and flags it)."""
    try:
        with open("/proc/self/io", "rb") as f:
            for line in f:
                if line.startswith(b"rchar:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _maxrss_bytes() -> int:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if sys.platform == "darwin" else r * 1024


class TreeSampler:
    """Peak of the summed RSS of this process and its descendants, sampled every 50 ms
    (for peers that work in helper processes: DataLoader workers, Ray). Shared pages are
    counted once per process, so this overstates Ray's shared-memory object store."""

    def __init__(self) -> None:
        import psutil
        self.proc = psutil.Process()
        self.peak = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _sample(self) -> int:
        total = 0
        try:
            procs = [self.proc, *self.proc.children(recursive=True)]
        except Exception:  # noqa: BLE001 - a vanished process is not an error
            return 0
        for p in procs:
            try:
                total += p.memory_info().rss
            except Exception:  # noqa: BLE001
                pass
        return total

    def _loop(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, self._sample())
            self.stop.wait(0.05)

    def close(self) -> int:
        self.peak = max(self.peak, self._sample())
        self.stop.set()
        self.thread.join()
        return self.peak


def load_peer(module: str):
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    import importlib
    return importlib.import_module(module)


def run_spec(spec: dict) -> dict:
    """Run one spec in this process and return its result (see the module docstring)."""
    w = WORKLOADS[spec["workload"]]
    info: dict[str, Any] = {"shuffle": "none", "resume": None, "notes": [], "tree": False}
    out: dict[str, Any] = {"peer": spec["peer"], "workload": w.key, "mode": w.mode,
                           "lake_rows": spec["lake_rows"], "pid": os.getpid()}
    import numpy  # noqa: F401 - every peer's batches end as numpy / torch: imported untimed
    import torch
    # torch ops single-threaded, as in DataLoader workers: on a shared 2-core machine
    # OpenMP's spinning threads made a 4096-row gather 10x slower than one thread.
    torch.set_num_threads(1)
    try:
        mod = load_peer(spec["module"])
    except Unusable as exc:
        return {**out, "unusable": str(exc)}
    t = time.perf_counter()
    try:
        if hasattr(mod, "setup"):
            mod.setup(spec, info)
    except Unusable as exc:
        return {**out, "unusable": str(exc)}
    out["setup_s"] = time.perf_counter() - t
    base_rss = _maxrss_bytes()
    sampler = TreeSampler() if spec.get("tree_rss") else None
    rows = label_sum = 0
    x0_sum = 0.0
    ttfb = None
    batches = 0
    try:
        r0 = read_bytes()
        c0 = time.process_time()
        t0 = time.perf_counter()
        it = iter(mod.batches(spec, info))
        for item in it:
            if ttfb is None:
                ttfb = time.perf_counter() - t0
            if isinstance(item, Sums):
                rows += item.rows
                label_sum += item.label_sum
                x0_sum += item.x0_sum
            else:
                # The infinitely fast consumer: a C-contiguous float32 x[B, k] (made so here,
                # for every peer alike) and y; it touches both to take the checksums.
                x, y = item
                if not x.is_contiguous():
                    x = x.contiguous()
                rows += int(x.shape[0])
                batches += 1
                label_sum += int(y.sum())
                x0_sum += float(x[:, 0].sum(dtype=_f64()))
                if x.dtype != _f32() or x.ndim != 2:
                    raise TypeError(f"peer yielded x of {x.dtype} {tuple(x.shape)}, want float32 [B, k]")
            if w.mode == "first":
                break
        seconds = time.perf_counter() - t0
        cpu = time.process_time() - c0
        r1 = read_bytes()
        if hasattr(it, "close"):
            it.close()
    except Unusable as exc:
        return {**out, "unusable": str(exc)}
    finally:
        tree_peak = sampler.close() if sampler else None
    if hasattr(mod, "teardown"):
        try:
            mod.teardown(spec, info)
        except Exception as exc:  # noqa: BLE001 - recorded, the measurement stands
            info["notes"].append(f"teardown failed: {exc!r}")
    out.update(rows=rows, label_sum=label_sum, x0_sum=x0_sum, seconds=seconds, cpu_s=cpu,
               read_bytes=None if r0 is None or r1 is None else r1 - r0,
               ttfb=ttfb, batches=batches, peak_rss=_maxrss_bytes(), base_rss=base_rss,
               tree_peak_rss=tree_peak, shuffle=info["shuffle"], resume=info["resume"],
               notes=info["notes"], exact_batches=_exact(rows, batches, w.batch))
    out.update({k: v for k, v in info.items() if k not in ("shuffle", "resume", "notes", "tree")})
    return out


def _exact(rows: int, batches: int, size: int) -> bool | None:
    if not batches:
        return None
    return batches == math.ceil(rows / size)


def _f64():
    import torch
    return torch.float64


def _f32():
    import torch
    return torch.float32


def emit(result: dict) -> None:
    sys.stdout.flush()
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def main(argv: list[str] | None = None) -> int:
    """``python benchmarks/peers/<peer>.py SPEC_JSON``: one run, result on stdout."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(__doc__)
        return 2
    spec = json.loads(argv[0])
    try:
        result = run_spec(spec)
    except Exception as exc:  # noqa: BLE001 - reported to the harness as a failed run
        import traceback
        result = {"peer": spec.get("peer"), "workload": spec.get("workload"),
                  "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    emit(result)
    return 0


def bench_env(**extra: str) -> dict:
    """The environment of every benchmark subprocess: bytecode cached (under
    ``benchmarks/out/pycache``) as in any installed package, even where the shell sets
    ``PYTHONDONTWRITEBYTECODE`` (which made every run recompile the library modules it
    imports lazily: ~0.04 s of a cold first batch that no user pays)."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(Path(__file__).resolve().parent.parent / "out" / "pycache")
    env.update(extra)
    return env


def run_fresh(script: str, *args: str) -> str:
    """The last line ``python script *args`` prints, run in a fresh Python process with the
    benchmarks' environment (``bench_env``): one timed run of a script's ``--one`` mode."""
    import subprocess
    out = subprocess.run([sys.executable, script, *args], check=True, capture_output=True, text=True,
                         env=bench_env())
    return out.stdout.strip().splitlines()[-1]


# -- the fork server ------------------------------------------------------------------------

PRELOAD = ("numpy", "pyarrow", "pyarrow.compute", "pyarrow.dataset", "pyarrow.parquet", "torch",
           "psutil", "arrowload")


def serve() -> int:
    """Read one JSON request per line on stdin ({"spec": ..., "result": path, "log": path});
    fork a child per request (new process group, stdout/stderr to ``log``) that runs the
    spec and writes its result JSON to ``result``; answer ``{"pid": ...}`` when started and
    ``{"pid": ..., "status": ...}`` when it ended. Only imports happen here, never work,
    so every child starts clean (no threads, no caches)."""
    import importlib
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    reply = sys.stdout
    print(json.dumps({"ready": True, "preloaded": list(PRELOAD)}), file=reply, flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:                                    # the run
            code = 0
            try:
                os.setpgid(0, 0)
                fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                sys.stdin.close()
                try:
                    result = run_spec(req["spec"])
                except Exception as exc:  # noqa: BLE001
                    import traceback
                    result = {"peer": req["spec"].get("peer"), "workload": req["spec"].get("workload"),
                              "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
                tmp = req["result"] + ".tmp"
                with open(tmp, "w") as f:
                    json.dump(result, f)
                os.replace(tmp, req["result"])
                sys.stdout.flush()
                sys.stderr.flush()
            except BaseException:  # noqa: BLE001
                code = 1
            finally:
                os._exit(code)
        print(json.dumps({"pid": pid}), file=reply, flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"pid": pid, "status": status}), file=reply, flush=True)
    return 0


if __name__ == "__main__":
    # Import this file as ``benchlib`` (the name the peers import) so that there is one
    # ``Sums`` class, not a second copy under ``__main__``.
    sys.path.insert(0, HERE)
    import benchlib
    sys.exit(benchlib.serve() if sys.argv[1:2] == ["--serve"] else benchlib.main())
