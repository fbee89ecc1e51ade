"""``loader.profile()``: is the input pipeline the bottleneck, and what setting changes that?

Two ways to profile, one :class:`Profile`:

- ``loader.profile(n_batches)`` runs the loader into an infinitely fast consumer (each batch
  dropped the moment it arrives, the "infinitely fast model" benchmark of the Nx
  input-pipeline proposal): the loader's own ceiling. ``loader.profile(n, step_fn=train_step)``
  calls ``step_fn(batch)`` per batch and times it: the loader beside the real step.
  Either way the loader does not move: its epoch, position, resume state and ``stats()``
  are the same afterwards (a state loaded and not yet iterated is kept, and the profile
  starts from it).
- ``with loader.profiling() as run: for batch in loader: train_step(batch)`` records the
  real training loop (the first iteration started in the block; the loop body is the step)
  and ``run.profile`` holds the result; this iteration moves the loader as any does.

Every share is of the wall time and bounded by construction: each thread group's parts add
up to 100% of it (the producer thread: collate, transform, convert, idle; the consumer's
thread: start-up, waiting, step, other), and the reader threads show as thread counts
("1.8 of 4 readers busy"), seconds summed over threads never shown as a share of one
thread's time. Conversions and gathers that run on the reader threads count there.

The verdict (:meth:`Profile.verdict`) names the bottleneck and the setting to change, with
the code; :meth:`Profile.warnings` says when the run is too short or the first batch
dominates, and the verdict is then marked tentative. CPU contention -- the loader slowing
a training step that shares the cores without making it wait -- is judged from the
process's CPU time against the wall and the cores, and from the CPU the step's own thread
got while it ran (a step that computes but gets less than a core was kept off it).
"""

from __future__ import annotations

import base64
import importlib
import io
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ArgumentTypeError, InvalidArgumentError, UnsupportedError
from .layout import KeyLayout, of_batch
from .stats import LoaderStats, fmt_rate, fmt_seconds

#: The seconds of :meth:`Profile.stages`: the reader threads' (summed over them), the
#: producer thread's, the consumer thread's.
STAGES = ("read", "reader convert", "collate", "transform", "convert", "producer idle",
          "start-up", "consumer wait", "consumer step", "consumer other")

#: A run shorter than either is too short to judge.
MIN_BATCHES = 10
MIN_WALL_S = 0.5
#: The consumer waits less than this share of the steady wall: the loader keeps up.
KEEPS_UP = 0.25
#: A thread group busier than this share of its capacity is saturated.
SATURATED = 0.7


@dataclass(frozen=True)
class Verdict:
    """``kind`` (one word, for programs: ``consumer``, ``contention``, ``transform``,
    ``convert``, ``collate``, ``reading-io``, ``reading-cpu``, ``reading-parallelism``,
    ``start-up``, ``overhead``, ``ceiling``, ``none``), ``finding`` (what the numbers
    say), ``advice`` (the setting to change, with the code), ``tentative`` (the run was too
    short or the first batch dominated: see :meth:`Profile.warnings`)."""

    kind: str
    finding: str
    advice: str
    tentative: bool = False

    def __str__(self) -> str:
        return ("(tentative) " if self.tentative else "") + f"{self.finding} -> {self.advice}"


@dataclass(frozen=True)
class Profile:
    """One profiled run. Seconds throughout; ``arrivals[i]`` is when batch ``i`` reached
    the consumer, counted from the moment iteration started; ``waits[i]`` how long the
    consumer waited for it (inside ``next()``), ``steps[i]`` how long the consumer spent on
    it before asking for the next one (the step; ~0 for the infinitely fast consumer);
    ``setup_s`` the time ``iter(loader)`` took; ``step_cpu_s`` the CPU the consumer's thread
    used during the steps; ``step_runqueue_s`` how long it was runnable but waited for a
    core during them (Linux schedstat; None elsewhere); ``step_timed``: a step ran (``step_fn`` or ``profiling()``).
    ``layout``: the first batch's keys (dtype, shape, device); ``rows_per_rank`` /
    ``batches_per_rank``: a whole epoch of this rank, for the epoch-time estimate."""

    stats: LoaderStats
    batches: int
    rows: int
    wall_s: float
    first_batch_s: float
    arrivals: np.ndarray
    batch_rows: np.ndarray
    io_threads: int
    output: str
    shuffle: str
    setup_s: float = 0.0
    waits: np.ndarray = field(default_factory=lambda: np.zeros(0))
    steps: np.ndarray = field(default_factory=lambda: np.zeros(0))
    step_cpu_s: float = 0.0
    step_timed: bool = False
    step_runqueue_s: float | None = None
    layout: tuple[KeyLayout, ...] = ()
    rows_per_rank: int = 0
    batches_per_rank: int = 0
    batch_size: int = 0

    # -- numbers -----------------------------------------------------------------
    @property
    def rows_per_s(self) -> float:
        return self.rows / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def batches_per_s(self) -> float:
        return self.batches / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def decoded_mb_per_s(self) -> float:
        """Decoded Arrow bytes per second, in MB (10^6 bytes)."""
        return self.stats.bytes_decoded / 1e6 / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def readers_max(self) -> int:
        """The most reader threads the run could use (``io_threads=``, or the cores)."""
        return max(1, self.stats.readers_max or self.io_threads)

    @property
    def readers_busy(self) -> float:
        """Reader threads busy on average over the run (reader seconds / wall), at most
        :attr:`readers_max`."""
        s = self.stats
        busy = (s.read_s + s.reader_convert_s) / self.wall_s if self.wall_s > 0 else 0.0
        return min(busy, float(self.readers_max))

    @property
    def producer_s(self) -> float:
        """Busy time of the producer thread (collate + transform + convert)."""
        s = self.stats
        return s.collate_s + s.transform_s + s.convert_s

    @property
    def step_s(self) -> float:
        return float(self.steps.sum()) if len(self.steps) else 0.0

    def stages(self) -> dict[str, float]:
        """Seconds per stage (:data:`STAGES`). ``read`` and ``reader convert`` are summed
        over the reader threads (together at most ``readers_max`` times the wall); the
        producer's four add up to the wall time, and so do the consumer's four."""
        s, wall = self.stats, self.wall_s
        first_wait = float(self.waits[0]) if len(self.waits) else 0.0
        start = min(wall, self.setup_s + first_wait)
        wait = min(wall - start, float(self.waits[1:].sum()) if len(self.waits) > 1 else 0.0)
        step = min(wall - start - wait, self.step_s)
        return {
            "read": s.read_s,
            "reader convert": s.reader_convert_s,
            "collate": s.collate_s,
            "transform": s.transform_s,
            "convert": s.convert_s,
            "producer idle": max(0.0, wall - self.producer_s),
            "start-up": start,
            "consumer wait": wait,
            "consumer step": step,
            "consumer other": max(0.0, wall - start - wait - step),
        }

    def shares(self) -> dict[str, dict[str, float]]:
        """Each thread group's time as shares of its capacity over the wall: ``readers``
        (``readers_max`` threads: read, convert, idle), ``producer`` (one thread: collate,
        transform, convert, idle), ``consumer`` (one thread: start-up, waiting, step,
        other). Each group's shares are in 0..1 and add up to 1."""
        st = self.stages()
        wall = self.wall_s

        def group(parts: dict[str, float], capacity: float, rest: str) -> dict[str, float]:
            if capacity <= 0:
                return {**{k: 0.0 for k in parts}, rest: 1.0}
            raw = {k: max(0.0, v) / capacity for k, v in parts.items()}
            total = sum(raw.values())
            if total > 1.0:  # timer skew between threads: never more than the capacity
                raw = {k: v / total for k, v in raw.items()}
                total = 1.0
            return {**raw, rest: 1.0 - total}

        return {
            "readers": group({"read": st["read"], "convert": st["reader convert"]},
                             self.readers_max * wall, "idle"),
            "producer": group({"collate": st["collate"], "transform": st["transform"],
                               "convert": st["convert"]}, wall, "idle"),
            "consumer": group({"start-up": st["start-up"], "waiting": st["consumer wait"],
                               "step": st["consumer step"]}, wall, "other"),
        }

    def _steady_wait_share(self) -> float:
        """The consumer's waits for batches after the first, as a share of the wall after
        the first batch arrived (the whole run's when there is one batch)."""
        if self.batches > 1:
            span = self.wall_s - float(self.arrivals[0])
            return min(1.0, float(self.waits[1:].sum()) / span) if span > 0 else 0.0
        return min(1.0, float(self.waits.sum()) / self.wall_s) if self.wall_s > 0 else 0.0

    @property
    def epoch_s(self) -> float | None:
        """A whole epoch of this rank: the time to the first batch, then the other rows at
        the rate after it (the whole run's rate when it had one batch); None without one."""
        if not self.rows_per_rank or self.rows_per_s <= 0:
            return None
        if self.batches > 1:
            span = self.wall_s - self.first_batch_s
            rest = self.rows - int(self.batch_rows[0])
            if span > 0 and rest > 0:
                return self.first_batch_s + max(0, self.rows_per_rank - int(self.batch_rows[0])) * span / rest
        return self.rows_per_rank / self.rows_per_s

    # -- judgement -------------------------------------------------------------------
    def warnings(self) -> list[str]:
        """Why the figures may not describe a steady epoch (empty: nothing to warn about)."""
        out = []
        if self.batches and (self.batches < MIN_BATCHES or self.wall_s < MIN_WALL_S):
            out.append(f"a short run ({self.batches} batches in {fmt_seconds(self.wall_s)}) is too short to judge "
                       f"reliably: profile more batches (at least {MIN_BATCHES} and {MIN_WALL_S} s; "
                       "loader.profile() runs the whole epoch)")
        if self.batches and self.wall_s > 0 and self.first_batch_s >= 0.5 * self.wall_s:
            out.append(f"the first batch took {fmt_seconds(self.first_batch_s)}, "
                       f"{self.first_batch_s / self.wall_s:.0%} of the run: start-up dominates these figures")
        return out

    def verdict(self) -> Verdict:
        """The bottleneck in words and the setting to change (see the module docstring)."""
        if self.batches == 0 or self.wall_s <= 0:
            return Verdict("none", "no batches were produced", "check the filter and the rank's share of rows")
        tentative = bool(self.warnings())
        wall = self.wall_s
        if self.first_batch_s >= 0.8 * wall:
            return Verdict("start-up", *self._startup(), tentative=tentative)
        wait = self._steady_wait_share()
        step_share = self.step_s / wall
        if self.step_timed and wait < KEEPS_UP and step_share >= 0.5:
            contention = self._contention()
            if contention is not None:
                return Verdict("contention", *contention, tentative=tentative)
            return Verdict("consumer", f"the consumer: your step took {step_share:.0%} of the wall and waited "
                           f"for batches {wait:.0%} of the time after the first",
                           "the loader is not the bottleneck; a faster step is (the loader keeps up at "
                           f"{fmt_rate(self.rows_per_s)})", tentative)
        n = self.readers_max
        busy = self.readers_busy
        producer = min(1.0, self.producer_s / wall)
        waited = f"the consumer waited {wait:.0%} of the time after the first batch"
        if producer >= SATURATED and producer >= busy / n:
            sh = self.shares()["producer"]
            worst = max(("collate", "transform", "convert"), key=lambda k: sh[k])
            return Verdict(worst, *self._producer_advice(worst, sh[worst], waited), tentative=tentative)
        if busy >= SATURATED * n:
            return Verdict(*self._reading(busy, n, waited), tentative=tentative)
        if wait >= KEEPS_UP and busy >= 0.35 * n and n > 1:
            hint = {"block": "each block-shuffle window is one read task: a smaller window spreads it over "
                             "the threads: .loader(..., shuffle_window=2)",
                    "global": "each gather from the random-access table is one read task: a larger "
                              "prefetch lets more run at once: .loader(..., prefetch=512 << 20)",
                    }.get(self.shuffle, "few, large row groups for this run: write smaller row groups "
                                        "(pyarrow.parquet.write_table(..., row_group_size=65_536))")
            return Verdict("reading-parallelism", f"reading: only {busy:.1f} of {n} readers busy on average, {waited}",
                           hint, tentative)
        if wait >= KEEPS_UP:
            return Verdict("overhead", f"per-batch overhead: no stage is saturated ({busy:.1f} of {n} readers, "
                           f"the producer {producer:.0%} busy), {waited}",
                           f"larger batches amortize it: .loader(batch_size={2 * max(1, self.batch_size)})",
                           tentative)
        return Verdict("ceiling", f"the loader keeps ahead: {fmt_rate(self.rows_per_s)} with {busy:.1f} of {n} "
                       f"readers busy, {waited}", "this is its ceiling on this machine; nothing to change",
                       tentative)

    def bottleneck(self) -> str:
        """The verdict as one line (``str(self.verdict())``)."""
        return str(self.verdict())

    def _startup(self) -> tuple[str, str]:
        share = self.first_batch_s / self.wall_s
        finding = f"start-up: the first batch took {fmt_seconds(self.first_batch_s)}, {share:.0%} of the run"
        if self.shuffle == "global":
            advice = ("the random-access table is built before the first batch (once: later loaders reuse it "
                      "from cache_dir); profile a whole epoch to see the steady rate: loader.profile()")
        elif self.shuffle == "block":
            advice = ("the first shuffle window is read whole before its first batch: a smaller window "
                      "starts sooner (.loader(..., shuffle_window=2)); loader.profile() shows the steady rate")
        else:
            advice = "profile more batches to see the steady rate: loader.profile() runs the whole epoch"
        return finding, advice

    def _producer_advice(self, worst: str, share: float, waited: str) -> tuple[str, str]:
        finding = f"the {worst} on the producer thread: {share:.0%} of the wall, {waited}"
        if worst == "transform":
            return finding, ("transform= runs on one thread: make it cheaper (vectorized Arrow compute), move "
                             "it into Dataset.map(...), which runs on the reader threads, or run it as Ray "
                             "tasks: .loader(..., executor='ray')")
        if worst == "convert":
            return finding, (f"the hand-off to {self.output} is per batch: larger batches amortize it "
                             f"(.loader(batch_size={2 * max(1, self.batch_size)})), stack= puts feature "
                             "columns in one array, and without transform= conversion moves to the readers")
        return finding, (f"cutting batches out of small reads: larger batches "
                         f"(.loader(batch_size={2 * max(1, self.batch_size)})) or larger row groups")

    def _reading(self, busy: float, n: int, waited: str) -> tuple[str, str, str]:
        s = self.stats
        busy_s = s.read_s + s.reader_convert_s + self.producer_s
        cpu = (s.loader_cpu_s + s.native_cpu_s) / busy_s if busy_s > 0 else 0.0
        finding = f"reading: {busy:.1f} of {n} readers busy, {waited}"
        cores = s.cores or n
        if cpu < 0.5:  # the readers mostly wait: on storage, not on a core
            return ("reading-io", finding + f"; the reads wait on storage ({cpu:.2f} CPU s per busy second)",
                    f"more reads in flight help: .loader(..., io_threads={2 * n})")
        if n >= cores:
            return ("reading-cpu", finding, f"more io_threads won't help on {cores} cores; the decode is "
                    "CPU-bound: select fewer columns / filter earlier (.select(...), .filter(...))")
        return ("reading-cpu", finding, f"the decode is CPU-bound and {cores - n} more cores are free: "
                f".loader(..., io_threads={cores})")

    def _contention(self) -> tuple[str, str] | None:
        """CPU contention: the step computes (its thread ran or waited to run a quarter of
        its time or more) and was kept off the core (runnable but waiting for one 15% of its
        time, from Linux schedstat; elsewhere: it got less than 0.8 of a core), or the process
        kept (nearly) every core busy; and the loader's threads took a real part of the CPU (a
        tenth of the process's, and a twentieth of a core at least)."""
        s = self.stats
        step_s = self.step_s
        if step_s <= 0 or s.cpu_s <= 0:
            return None
        got = self.step_cpu_s / step_s
        saturated = bool(s.cores) and s.cpu_s / self.wall_s >= 0.85 * s.cores
        if self.step_runqueue_s is not None:  # the truth: runnable, and off the core
            off = self.step_runqueue_s / step_s
            starved = off >= 0.15
            computes = got + off >= 0.25  # a step that sleeps (GPU sync, I/O) neither runs nor queues
        else:
            off = None
            starved = 0.25 <= got < 0.8
            computes = got >= 0.25
        loader_cpu = min(s.cpu_s, s.loader_cpu_s + s.native_cpu_s)
        loader_cores = loader_cpu / self.wall_s
        if not (saturated or starved) or not computes or loader_cores < 0.05 or loader_cpu < 0.1 * s.cpu_s:
            return None
        queued = f", waiting for a core {off:.0%} of its time" if off is not None else ""
        used = s.cpu_s / self.wall_s
        if saturated:
            finding = (f"CPU contention: the process used {used:.1f} of {s.cores} cores and "
                       f"{loader_cpu / s.cpu_s:.0%} went to loader threads ({loader_cores:.2f} cores) while your "
                       f"step ran, getting {got:.2f} of a core{queued}")
        else:
            finding = (f"CPU contention: your step got {got:.2f} of a core while it ran{queued}; the process used "
                       f"{used:.1f} of {s.cores} cores (other processes took the rest) and "
                       f"{loader_cpu / s.cpu_s:.0%} of it went to loader threads ({loader_cores:.2f} cores)")
        if s.transform_s >= 0.5 * self.producer_s and s.transform_s > 0.1 * self.wall_s:
            return finding, "transform= takes most of it: make it cheaper, or run it elsewhere (executor='ray')"
        return finding, ".loader(..., io_threads=1, prefetch=64 << 20) leaves the step more of the cores"

    # -- plain data --------------------------------------------------------------------
    def as_dict(self) -> dict[str, Any]:
        v = self.verdict()
        return {"batches": self.batches, "rows": self.rows, "wall_s": self.wall_s,
                "first_batch_s": self.first_batch_s, "rows_per_s": self.rows_per_s,
                "decoded_mb_per_s": self.decoded_mb_per_s, "stages": self.stages(), "shares": self.shares(),
                "readers_busy": self.readers_busy, "readers_max": self.readers_max,
                "step_s": self.step_s, "step_cpu_s": self.step_cpu_s, "step_timed": self.step_timed,
                "step_runqueue_s": self.step_runqueue_s,
                "verdict": {"kind": v.kind, "finding": v.finding, "advice": v.advice, "tentative": v.tentative},
                "warnings": self.warnings(), "layout": [k.text() for k in self.layout],
                "epoch_s": self.epoch_s, "stats": self.stats.as_dict()}

    # -- display -----------------------------------------------------------------
    def _share_lines(self) -> list[tuple[str, str]]:
        sh = self.shares()
        r = sh["readers"]
        n = self.readers_max
        s = self.stats
        readers = (f"{self.readers_busy:.1f} of {n} busy on average: read (I/O + decode) {r['read'] * n:.1f}, "
                   f"convert into batches {r['convert'] * n:.1f} (peak {s.readers_peak} busy, "
                   f"autotuned to {s.readers})")

        def pct(group: dict[str, float]) -> str:
            return ", ".join(f"{k} {v:.0%}" for k, v in group.items())

        return [("readers", readers),
                ("producer", pct(sh["producer"]) + " (one thread)"),
                ("consumer", pct(sh["consumer"]) + ("" if self.step_timed else " (infinitely fast: no step)"))]

    def summary(self) -> str:
        return (f"{self.batches:,} batches, {self.rows:,} rows in {fmt_seconds(self.wall_s)}: "
                f"{fmt_rate(self.rows_per_s)}, {self.decoded_mb_per_s:,.1f} MB/s decoded (first batch after "
                f"{fmt_seconds(self.first_batch_s)}; output {self.output}, shuffle {self.shuffle})")

    def _epoch_text(self) -> str:
        text = f"{self.batches_per_rank:,} batches, {self.rows_per_rank:,} rows per rank"
        if self.epoch_s is not None:
            steady = f"{fmt_rate(self.rows_per_s)}" if self.batches < 2 else \
                f"{fmt_seconds(self.first_batch_s)} to the first batch, then this run's rate after it"
            text += f"; epoch ~{fmt_seconds(self.epoch_s)} ({steady}" + \
                (", tentative)" if self.warnings() else ")")
        return text

    def lines(self) -> list[tuple[str, str]]:
        """(label, text) pairs of the display, verdict first."""
        out = [("bottleneck", str(self.verdict()))]
        out += [("warning", w) for w in self.warnings()]
        out += self._share_lines()
        s = self.stats
        if s.wall_s:
            cpu = (f"{s.cores_busy:.1f} of {s.cores} cores busy: loader threads {s.loader_cpu_s:.3f} s, native "
                   f"pools {s.native_cpu_s:.3f} s (decoding), consumer {s.consumer_cpu_s:.3f} s")
            if self.step_timed and self.step_s > 0:
                cpu += (f"; your step {fmt_seconds(self.step_s)} wall, {self.step_cpu_s:.3f} s CPU "
                        f"({self.step_cpu_s / self.step_s:.2f} of a core)")
            out.append(("cpu", cpu))
        used = {k: v for k, v in s.decoders.items() if v}
        if used:  # who decoded: pyarrow / polars / dataset per unit, or one polars stream per range
            out.append(("decoders", ", ".join(f"{k} {v:,} unit{'s' if v != 1 else ''}" for k, v in
                                              sorted(used.items(), key=lambda kv: -kv[1]))))
        out.append(("settings", self.stats.settings_text()))
        if self.layout:
            out.append(("layout", "; ".join(k.text() for k in self.layout)))
        if self.rows_per_rank:
            out.append(("epoch", self._epoch_text()))
        return out

    def __str__(self) -> str:
        pairs = self.lines()
        width = max(len(k) for k, _ in pairs)
        return "\n".join([self.summary()] + [f"  {k:<{width}}  {v}" for k, v in pairs])

    def __repr__(self) -> str:
        return f"arrowload.Profile: {self}"

    def _repr_html_(self) -> str:
        from ..display import esc, html_box, html_table
        v = self.verdict()
        body = f'<div style="font-size:13px;margin:4px 0"><strong>{esc(v.finding)}</strong> &rarr; {esc(v.advice)}'
        body += " (tentative)</div>" if v.tentative else "</div>"
        body += html_table(None, self.lines()[1:])
        try:
            buf = io.BytesIO()
            self.plot().savefig(buf, format="png", dpi=80)
            data = base64.b64encode(buf.getvalue()).decode("ascii")
            body += f'<img alt="loader profile" src="data:image/png;base64,{data}"/>'
        except ImportError:
            body += "<div>(install matplotlib for the plot: pip install 'arrowload[plot]')</div>"
        return html_box("arrowload.Profile", self.summary(), body)

    def throughput(self, bins: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(bin edges, rows/s in each bin): the run from 0 to ``wall_s`` cut into ``bins``
        bins of equal width (``len(edges) == bins + 1``; default: about one per five
        batches, 4 to 40), rows counted when their batch arrived. ``sum(rate * width)`` is
        the rows of the run."""
        n = len(self.arrivals)
        if n == 0 or self.wall_s <= 0:
            return np.zeros(1), np.zeros(0)
        k = bins or int(min(40, max(4, n // 5)))
        edges = np.linspace(0.0, self.wall_s, k + 1)
        at = np.clip(self.arrivals, 0.0, self.wall_s)  # the last arrival is on the last edge: counted in
        rows, _ = np.histogram(at, bins=edges, weights=self.batch_rows)
        return edges, rows / (edges[1] - edges[0])

    def plot(self, *, figsize: tuple[float, float] = (10.0, 4.4)):
        """A ``matplotlib.figure.Figure`` titled with the verdict: each thread group's time
        as shares of the wall (left; each bar adds up to 100%) and rows/s over the run in
        bins of equal width from 0 to the end, with each batch's arrival marked (right).
        Built without pyplot (no global state, any backend)."""
        try:
            from matplotlib.figure import Figure
            from matplotlib.ticker import FuncFormatter, PercentFormatter
        except ImportError as exc:  # pragma: no cover - depends on the environment
            from ..errors import MissingDependencyError
            raise MissingDependencyError("Profile.plot() needs matplotlib: "
                                         "pip install 'arrowload[plot]'") from exc
        fig = Figure(figsize=figsize, layout="constrained")
        ax1, ax2 = fig.subplots(1, 2, width_ratios=(1, 1.4))
        fig.suptitle("\n".join(textwrap.wrap(str(self.verdict()), 110)), fontsize="medium")
        sh = self.shares()
        groups = [("consumer", "consumer"), ("producer", "producer"), ("readers", f"{self.readers_max} readers")]
        palette = {"read": "#4c72b0", "convert": "#dd8452", "collate": "#8172b3", "transform": "#c44e52",
                   "start-up": "#937860", "waiting": "#bdbdbd", "step": "#55a868", "idle": "#e5e5e5",
                   "other": "#e5e5e5"}
        seen: set[str] = set()
        for y, (key, label) in enumerate(groups):
            left = 0.0
            for part, share in sh[key].items():
                name = (f"convert ({key})" if part == "convert" else
                        "idle / other" if part in ("idle", "other") else part)
                ax1.barh(label, share, left=left, color=palette[part], edgecolor="white", linewidth=0.5,
                         label=None if name in seen or share <= 0 else name)
                if share >= 0.12:
                    ax1.text(left + share / 2, y, f"{part}\n{share:.0%}", ha="center", va="center", fontsize=7)
                seen.add(name)
                left += share
        ax1.set_xlim(0, 1)
        ax1.xaxis.set_major_formatter(PercentFormatter(1.0))
        ax1.set_xlabel("share of the wall time (each bar adds up to 100%)")
        ax1.set_title("where the time went", fontsize="small")
        edges, rate = self.throughput()
        if len(rate):
            ax2.stairs(rate, edges, fill=True, color="#4c72b0", alpha=0.35, label="rows/s per time bin")
            ax2.stairs(rate, edges, color="#4c72b0")
        top = max(float(rate.max()) if len(rate) else 0.0, self.rows_per_s) * 1.15 or 1.0
        if 0 < len(self.arrivals) <= 400:
            ax2.plot(self.arrivals, np.full(len(self.arrivals), top * 0.97), "|", color="#333333", markersize=6,
                     label="a batch arrives", clip_on=False)
        ax2.axvline(self.first_batch_s, color="#c44e52", linestyle="--", linewidth=1,
                    label=f"first batch {fmt_seconds(self.first_batch_s)}")
        ax2.axhline(self.rows_per_s, color="#55a868", linestyle=":", label=f"mean {fmt_rate(self.rows_per_s)}")
        ax2.set_xlim(0, 1.02 * self.wall_s if self.wall_s > 0 else 1.0)  # room for marks at the end
        ax2.set_ylim(0, top)
        ax2.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: fmt_rate(v).removesuffix(" rows/s")))
        ax2.set_xlabel("seconds since iteration started")
        ax2.set_ylabel("rows/s")
        who = "your step" if self.step_timed else "an infinitely fast consumer"
        ax2.set_title(f"throughput with {who}", fontsize="small")
        handles, labels = [], []
        for ax in (ax1, ax2):
            h, lab = ax.get_legend_handles_labels()
            handles += h
            labels += lab
        fig.legend(handles, labels, loc="outside lower center", ncol=7, fontsize="x-small", frameon=False,
                   columnspacing=1.0)
        return fig


# -- recording -------------------------------------------------------------------------


def _runqueue_s() -> float | None:
    """Seconds the calling thread has spent runnable but waiting for a core (Linux
    ``/proc/thread-self/schedstat``, second field); None where it is not available."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


class _Recorder:
    """Times one iteration from the consumer's side: ``iter()``, each ``next()`` (the wait)
    and the time from a batch's arrival to the next ``next()`` (the step)."""

    def __init__(self, loader) -> None:
        self.loader = loader
        self.t0 = time.perf_counter()
        self.setup_s = 0.0
        self.waits: list[float] = []
        self.steps: list[float] = []
        self.arrivals: list[float] = []
        self.rows: list[int] = []
        self.step_cpu = 0.0
        self.layout: tuple[KeyLayout, ...] = ()
        self.end: float | None = None
        self.stats: LoaderStats | None = None
        self._last_pos = 0
        self._arrived: float | None = None
        self._cpu_mark = 0.0
        self.runq: float | None = 0.0 if _runqueue_s() is not None else None
        self._runq_mark = 0.0

    def _rows_done(self) -> int:
        """Rows this rank's iteration has yielded so far (a loader's position in rows; a
        mixture loader's, whose position counts blocks, says it)."""
        rows_done = getattr(self.loader, "_rows_done", None)
        return rows_done() if rows_done is not None else self.loader._position

    def started(self) -> None:
        self.setup_s = time.perf_counter() - self.t0
        self._last_pos = self._rows_done()

    def before_next(self) -> float:
        now = time.perf_counter()
        if self._arrived is not None:
            self.steps.append(now - self._arrived)
            self.step_cpu += time.thread_time() - self._cpu_mark
            if self.runq is not None:
                self.runq += (_runqueue_s() or 0.0) - self._runq_mark
            self._arrived = None
        return now

    def arrived(self, asked: float, batch: Any) -> None:
        now = time.perf_counter()
        self.waits.append(now - asked)
        self.arrivals.append(now - self.t0)
        pos = self._rows_done()
        self.rows.append(pos - self._last_pos)
        self._last_pos = pos
        if not self.layout:
            try:
                self.layout = tuple(of_batch(batch))
            except Exception:  # noqa: BLE001 - a display never raises
                self.layout = ()
        self._arrived = now
        self._cpu_mark = time.thread_time()
        if self.runq is not None:
            self._runq_mark = _runqueue_s() or 0.0

    def finish(self) -> None:
        if self.end is None:
            self.before_next()
            self.stats = self.loader.stats()  # first: everything it counts happened before the end
            self.end = time.perf_counter()

    def result(self, step_timed: bool) -> Profile:
        self.finish()
        loader = self.loader
        o = loader.options
        wall = self.end - self.t0
        arrivals = np.asarray(self.arrivals, dtype=float)
        per_rank, batches = _epoch_of(loader)
        steps = np.asarray(self.steps[:len(self.arrivals)], dtype=float)
        return Profile(stats=self.stats or LoaderStats(), batches=len(arrivals), rows=int(sum(self.rows)),
                       wall_s=wall, first_batch_s=float(arrivals[0]) if len(arrivals) else wall,
                       arrivals=arrivals, batch_rows=np.asarray(self.rows, dtype=np.int64),
                       io_threads=loader.max_readers, output=o.output, shuffle=str(loader.shuffle_kind),
                       setup_s=self.setup_s, waits=np.asarray(self.waits, dtype=float),
                       steps=steps, step_cpu_s=self.step_cpu, step_timed=step_timed,
                       step_runqueue_s=self.runq,
                       layout=self.layout, rows_per_rank=per_rank, batches_per_rank=batches,
                       batch_size=o.batch_size)


def _epoch_of(loader) -> tuple[int, int]:
    """Rows and batches of a whole epoch of ``loader``'s rank; ``(0, 0)`` for an endless
    one (a ``stopping='cycle'`` mixture without ``steps=``): no epoch estimate."""
    epoch = getattr(loader, "_epoch_size", None)
    if epoch is not None:
        return epoch()
    from ..order import rank_range
    o = loader.options
    start, stop = rank_range(loader.num_rows, loader.rank, loader.world_size)
    per_rank = stop - start
    if o.drop_last:
        per_rank = per_rank // o.batch_size * o.batch_size
    return per_rank, len(loader)


class _RecordedIterator:
    """``iter(loader)`` inside ``loader.profiling()``: the loader's iterator, timed."""

    def __init__(self, it, recorder: _Recorder) -> None:
        self._it = it
        self._rec = recorder

    def __iter__(self):
        return self

    def __next__(self):
        asked = self._rec.before_next()
        try:
            batch = next(self._it)
        except StopIteration:
            self._rec.finish()
            raise
        self._rec.arrived(asked, batch)
        return batch

    def close(self) -> None:
        self._it.close()

    def __getattr__(self, name: str):
        return getattr(self._it, name)


class Profiling:
    """``with loader.profiling() as run:`` records the first iteration of ``loader`` started
    in the block -- the real training loop, whose body is the step -- and on leaving it
    ``run.profile`` holds the :class:`Profile`. Nothing is changed in the batches, the order
    or the resume state; the iteration moves the loader as any does.

    >>> with loader.profiling() as run:            # doctest: +SKIP
    ...     for batch in loader:
    ...         train_step(batch)
    >>> print(run.profile)                         # doctest: +SKIP
    """

    def __init__(self, loader) -> None:
        self.loader = loader
        self.profile: Profile | None = None
        self._recorder: _Recorder | None = None

    def _wrap(self, make_iter: Callable[[], Any]):
        if self._recorder is not None:  # one iteration is recorded: later ones run plain
            return make_iter()
        rec = self._recorder = _Recorder(self.loader)
        it = make_iter()
        rec.started()
        return _RecordedIterator(it, rec)

    def __enter__(self) -> Profiling:
        self.loader._profiling = self
        return self

    def __exit__(self, *exc) -> None:
        if getattr(self.loader, "_profiling", None) is self:
            self.loader._profiling = None
        if self._recorder is not None:
            self.profile = self._recorder.result(step_timed=True)
            self.loader._last_profile = self.profile


def _batches_argument(given: Any) -> int | None:
    if given is None:
        return None
    import operator
    try:
        n = None if isinstance(given, bool) else operator.index(given)
    except TypeError:
        n = None
    if n is None:
        raise ArgumentTypeError(f"profile(n_batches=...) takes an integer >= 1 or None (a whole epoch), "
                                f"got {given!r} ({type(given).__name__})", "n_batches")
    if n < 1:
        raise InvalidArgumentError(f"profile(n_batches=...) must be >= 1 (or None for a whole epoch), "
                                   f"got {n}", "n_batches")
    return n


_POSITION_FIELDS = ("epoch", "_start", "_dl_base", "_position", "_batches_done", "_segments", "_next_segments", "_stats")


def profile(loader, n_batches: int | None = None, *, step_fn: Callable[[Any], Any] | None = None,
            warm_imports: bool = True) -> Profile:
    """Run ``n_batches`` batches of ``loader``'s current epoch (all of them when None) and
    return a :class:`Profile`: into an infinitely fast consumer, or with ``step_fn(batch)``
    called on each batch and timed (the training step). The loader's position and resume
    state are restored afterwards. ``warm_imports`` imports torch / jax first (as a
    training program already has), so their import time is not counted as conversion."""
    n_batches = _batches_argument(n_batches)
    if step_fn is not None and not callable(step_fn):
        raise ArgumentTypeError(f"profile(step_fn=...) takes a function of one batch, got {step_fn!r}", "step_fn")
    if warm_imports and loader.options.output in ("torch", "jax"):
        try:
            importlib.import_module(loader.options.output)
        except ImportError:
            pass  # conversion raises the helpful error itself
    running = [it for it in loader._active if it.running]
    if running:
        raise UnsupportedError("profile() runs an iteration of its own, which would end the one in "
                               "progress: finish or close that iterator first, or time the running "
                               "loop itself with loader.profiling()")
    saved = {f: getattr(loader, f) for f in getattr(loader, "_PROFILE_FIELDS", _POSITION_FIELDS)}
    rec = _Recorder(loader)
    it = iter(loader)
    if isinstance(it, _RecordedIterator):  # inside loader.profiling(): profile the plain iterator
        it = it._it
    rec.started()
    try:
        while True:
            asked = rec.before_next()
            try:
                batch = next(it)
            except StopIteration:
                break
            rec.arrived(asked, batch)
            if step_fn is not None:
                step_fn(batch)
            del batch
            if n_batches is not None and len(rec.arrivals) >= n_batches:
                break
        rec.finish()
    finally:
        it.close()
        for f, v in saved.items():
            setattr(loader, f, v)
    result = rec.result(step_timed=step_fn is not None)
    loader._last_profile = result
    return result


__all__ = ["Profile", "Profiling", "STAGES", "Verdict", "profile"]
