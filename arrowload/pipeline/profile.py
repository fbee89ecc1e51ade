"""``loader.profile(n_batches)``: where does the input pipeline spend its time?

Runs the loader against an infinitely fast consumer (each batch is dropped the moment
it arrives), the "infinitely fast model" benchmark of the Nx input-pipeline proposal:
what comes out is the loader's own ceiling. The result holds the loader's
:class:`LoaderStats` for the run, when each batch arrived, and a verdict naming the
stage that limits throughput; ``plot()`` draws the stage breakdown and the throughput
over time (matplotlib, imported only then).

Profiling never moves the loader: its epoch, position, resume state and ``stats()`` are
the same afterwards as before. Like any new iteration (one runs at a time per loader) it
ends an iteration still in progress; a state loaded with ``load_state_dict`` and not yet
iterated is kept, and the profile starts from it.
"""

from __future__ import annotations

import base64
import importlib
import io
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ArgumentTypeError, InvalidArgumentError
from .stats import LoaderStats

#: The stages of :meth:`Profile.stages`, in pipeline order.
STAGES = ("read", "collate", "transform", "convert", "producer idle", "consumer wait")


@dataclass(frozen=True)
class Profile:
    """One profiled run. Seconds throughout; ``arrivals[i]`` is when batch ``i`` reached
    the consumer, counted from the moment iteration started."""

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

    # ``io_threads`` is the most reader threads the run could use (``io_threads=``, or the
    # cores); ``stats.readers`` / ``stats.readers_peak`` are what the autotuner used.

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

    def stages(self) -> dict[str, float]:
        """Seconds per stage. ``read`` is summed over the ``io_threads`` reader threads (it
        may exceed the wall time); ``collate``, ``transform`` and ``convert`` run on the
        producer thread, and ``producer idle`` is the rest of its wall time (waiting for
        reads, start-up, scheduling), so those four add up to ``wall_s``. ``consumer
        wait`` is how long the (infinitely fast) consumer waited for batches."""
        s = self.stats
        return {
            "read": s.read_s,
            "collate": s.collate_s,
            "transform": s.transform_s,
            "convert": s.convert_s,
            "producer idle": max(0.0, self.wall_s - self.producer_s),
            "consumer wait": s.wait_s,
        }

    @property
    def producer_s(self) -> float:
        """Busy time of the producer thread (collate + transform + convert)."""
        s = self.stats
        return s.collate_s + s.transform_s + s.convert_s

    @property
    def read_parallelism(self) -> float:
        """Reads in flight on average over the run (``read`` seconds / wall seconds)."""
        return self.stats.read_s / self.wall_s if self.wall_s > 0 else 0.0

    def bottleneck(self) -> str:
        """Which stage limits throughput, in words, with what to try."""
        if self.batches == 0 or self.wall_s <= 0:
            return "no batches were produced"
        st = self.stages()
        busy = self.producer_s / self.wall_s
        if busy >= 0.5:
            worst = max(("collate", "transform", "convert"), key=lambda k: st[k])
            hint = {"convert": "convert (the hand-off to the output type)",
                    "transform": "transform (the per-batch function)",
                    "collate": "collate (cutting and concatenating batches)"}[worst]
            return (f"the producer thread: busy {busy:.0%} of the wall time, mostly {hint}, "
                    f"{st[worst] / self.wall_s:.0%}")
        par, n = self.read_parallelism, self.io_threads
        if par >= 0.8 * n:
            more = ("read fewer columns or bytes (the readers already use every core)"
                    if self.stats.cores and n >= self.stats.cores else "read fewer columns or bytes, or raise io_threads")
            return (f"reading (I/O + decode): the producer waits for reads {1 - busy:.0%} of the time "
                    f"with all {n} reader threads busy; {more}")
        if par >= 0.5:
            hint = {"block": "each block-shuffle window is one read task; a smaller shuffle_window "
                             "spreads the reads over the threads",
                    "global": "each gather from the random-access table is one read task of up to "
                              "65,536 rows",
                    }.get(self.shuffle, "the row groups are few and large for this run; smaller row "
                                        "groups spread the reads over the threads")
            return (f"reading (I/O + decode): the producer waits for reads {1 - busy:.0%} of the time, "
                    f"but only {par:.1f} of {n} reader threads are busy on average: {hint}")
        return (f"no stage is saturated (producer busy {busy:.0%}, {par:.1f} reads in flight on average): "
                f"start-up ({self.first_batch_s:.3f}s to the first batch) and per-batch overhead "
                "dominate; larger batches amortize it")

    def throughput(self, bins: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(bin start times, rows/s in each bin): the run cut into ``bins`` equal time bins
        (default: about one per four batches, 5 to 50), rows counted when their batch
        arrived."""
        n = len(self.arrivals)
        if n == 0 or self.wall_s <= 0:
            return np.zeros(0), np.zeros(0)
        k = bins or int(min(50, max(5, n // 4)))
        edges = np.linspace(0.0, self.wall_s, k + 1)
        rows, _ = np.histogram(self.arrivals, bins=edges, weights=self.batch_rows)
        return edges[:-1], rows / (edges[1] - edges[0])

    def as_dict(self) -> dict[str, Any]:
        return {"batches": self.batches, "rows": self.rows, "wall_s": self.wall_s,
                "first_batch_s": self.first_batch_s, "rows_per_s": self.rows_per_s,
                "decoded_mb_per_s": self.decoded_mb_per_s, "stages": self.stages(),
                "bottleneck": self.bottleneck(), "stats": self.stats.as_dict()}

    # -- display -----------------------------------------------------------------
    def __str__(self) -> str:
        lines = [f"{self.batches} batches, {self.rows:,} rows in {self.wall_s:.3f}s: "
                 f"{self.rows_per_s:,.0f} rows/s, {self.decoded_mb_per_s:,.1f} MB/s decoded "
                 f"(first batch after {self.first_batch_s:.3f}s; output {self.output}, shuffle {self.shuffle})"]
        for name, secs in self.stages().items():
            share = secs / self.wall_s if self.wall_s > 0 else 0.0
            note = f" (summed over {self.io_threads} reader threads)" if name == "read" else ""
            lines.append(f"  {name:<14} {secs:8.3f}s  {share:6.1%} of wall{note}")
        lines.append(f"  bottleneck     {self.bottleneck()}")
        lines.append(f"  settings       {self.stats.settings_text()}")
        cpu = self.stats.cpu_text()
        if cpu:
            lines.append(f"  cpu            {cpu}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"arrowload.Profile\n{self}"

    def _repr_html_(self) -> str:
        from ..display import esc, html_box, html_table
        rows = [(name, f"{secs:.3f}s", f"{secs / self.wall_s:.1%}" if self.wall_s > 0 else "-")
                for name, secs in self.stages().items()]
        body = html_table(("stage", "seconds", "of wall"), rows)
        body += f"<div>bottleneck: {esc(self.bottleneck())}</div>"
        body += f"<div>settings: {esc(self.stats.settings_text())}</div>"
        if self.stats.cpu_text():
            body += f"<div>cpu: {esc(self.stats.cpu_text())}</div>"
        try:
            buf = io.BytesIO()
            self.plot().savefig(buf, format="png", dpi=80)
            data = base64.b64encode(buf.getvalue()).decode("ascii")
            body += f'<img alt="loader profile" src="data:image/png;base64,{data}"/>'
        except ImportError:
            body += "<div>(install matplotlib for the plot: pip install 'arrowload[plot]')</div>"
        sub = (f"{self.batches} batches, {self.rows:,} rows in {self.wall_s:.3f}s, "
               f"{self.rows_per_s:,.0f} rows/s")
        return html_box("arrowload.Profile", sub, body)

    def plot(self, *, figsize: tuple[float, float] = (10.0, 3.6)):
        """A ``matplotlib.figure.Figure``: seconds per stage against the wall time (left) and
        rows/s over the run (right). Built without pyplot (no global state, any backend)."""
        try:
            from matplotlib.figure import Figure
        except ImportError as exc:  # pragma: no cover - depends on the environment
            from ..errors import MissingDependencyError
            raise MissingDependencyError("Profile.plot() needs matplotlib: "
                                         "pip install 'arrowload[plot]'") from exc
        fig = Figure(figsize=figsize, layout="constrained")
        ax1, ax2 = fig.subplots(1, 2, width_ratios=(1, 1.4))
        stages = self.stages()
        names = list(stages)[::-1]
        values = [stages[n] for n in names]
        colors = ["#9e9e9e" if n in ("consumer wait", "producer idle") else "#4c72b0" for n in names]
        ax1.barh(names, values, color=colors)
        ax1.axvline(self.wall_s, color="#c44e52", linestyle="--", label=f"wall {self.wall_s:.2f}s")
        ax1.set_xlabel(f"seconds (read: summed over {self.io_threads} threads)")
        ax1.set_title("time per stage")
        ax1.legend(loc="lower right", fontsize="small")
        t, rate = self.throughput()
        ax2.step(t, rate, where="post", color="#4c72b0", label="rows/s per time bin")
        ax2.axvline(self.first_batch_s, color="#8c8c8c", linestyle="--", linewidth=0.8,
                    label=f"first batch {self.first_batch_s:.3f}s")
        ax2.axhline(self.rows_per_s, color="#55a868", linestyle=":", label=f"mean {self.rows_per_s:,.0f} rows/s")
        ax2.set_xlabel("seconds since start")
        ax2.set_ylabel("rows/s")
        ax2.set_ylim(bottom=0)
        ax2.set_title("throughput with an infinitely fast consumer")
        ax2.legend(loc="best", fontsize="small")
        return fig


_POSITION_FIELDS = ("epoch", "_start", "_position", "_batches_done", "_segments", "_next_segments", "_stats")


def profile(loader, n_batches: int | None = None, *, warm_imports: bool = True) -> Profile:
    """Run ``n_batches`` batches of ``loader``'s current epoch (all of them when None)
    into an infinitely fast consumer and return a :class:`Profile`. The loader's position
    and resume state are restored afterwards. ``warm_imports`` imports torch / jax first
    (as a training program already has), so their import time is not counted as
    conversion time."""
    if n_batches is not None:
        import operator
        given = n_batches
        try:
            n_batches = None if isinstance(given, bool) else operator.index(given)
        except TypeError:
            n_batches = None
        if n_batches is None:
            raise ArgumentTypeError(f"profile(n_batches=...) takes an integer >= 1 or None (a whole epoch), "
                                    f"got {given!r} ({type(given).__name__})", "n_batches")
        if n_batches < 1:
            raise InvalidArgumentError(f"profile(n_batches=...) must be >= 1 (or None for a whole epoch), "
                                       f"got {n_batches}", "n_batches")
    if warm_imports and loader.options.output in ("torch", "jax"):
        try:
            importlib.import_module(loader.options.output)
        except ImportError:
            pass  # conversion raises the helpful error itself
    saved = {f: getattr(loader, f) for f in _POSITION_FIELDS}
    arrivals: list[float] = []
    batch_rows: list[int] = []
    stats = LoaderStats()
    wall = 0.0
    t0 = time.perf_counter()
    it = iter(loader)
    try:
        last = loader._position  # where this iteration starts (a resumed state: mid-epoch)
        for _ in it:
            now = time.perf_counter()
            arrivals.append(now - t0)
            position = loader._position
            batch_rows.append(position - last)
            last = position
            if n_batches is not None and len(arrivals) >= n_batches:
                break
        stats = loader.stats()  # first: everything it counts happened before `wall` ends
        wall = time.perf_counter() - t0
    finally:
        it.close()
        for f, v in saved.items():
            setattr(loader, f, v)
    return Profile(stats=stats, batches=len(arrivals), rows=int(sum(batch_rows)), wall_s=wall,
                   first_batch_s=arrivals[0] if arrivals else wall, arrivals=np.asarray(arrivals, dtype=float),
                   batch_rows=np.asarray(batch_rows, dtype=np.int64), io_threads=loader.max_readers,
                   output=loader.options.output, shuffle=str(loader.shuffle_kind))


__all__ = ["Profile", "STAGES", "profile"]
