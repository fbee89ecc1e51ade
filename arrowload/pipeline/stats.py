"""``LoaderStats``: what one iteration of a loader did, where its time went, and what CPU it
took from the program around it.

Filled by the pipeline's threads (``stages``) while an epoch runs; read by
``Loader.stats()``, ``profile()``, ``repr(loader)`` and ``Loader.explain()``. Plain data,
no reference to the loader (so ``profile`` and ``display`` import it without importing the
loader).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..plan.explain import _fmt_bytes


@dataclass
class LoaderStats:
    """Where the loader spends its time; the first answer to "is my loader the bottleneck?".

    Seconds are summed over threads: ``read_s`` (reads: I/O and decode) and
    ``reader_convert_s`` (reads converted or gathered into host buffers, on the reader
    threads) over the reader threads, so they may exceed the wall time with several
    readers; ``collate_s``, ``transform_s`` and ``convert_s`` (the hand-off of each batch to
    the output type) are the producer thread's, one thread, never more than the wall time.
    ``wait_s`` is the time the consumer spent waiting for a batch: near zero means the
    loader keeps up; close to the wall time means training waits on data.

    The loader can also slow training without making it wait: its threads share the cores
    with the training step. ``cpu_s`` is the whole process's CPU time during the iteration;
    ``consumer_cpu_s`` the part on the thread that iterates, between batches (the training
    step's own thread); ``loader_cpu_s`` the loader's threads (readers and producer,
    ``time.thread_time`` per thread); ``native_cpu_s`` threads Python does not know (Linux
    only): pyarrow's decode and I/O pools, which do most of the decoding -- and BLAS /
    OpenMP pools of the training step, where it has them. When ``cpu_s`` is close to
    ``cores * wall_s`` the cores are saturated, and every CPU second outside the consumer
    (``loader_share``) is one the training step competed for. Settings chosen for the run:
    ``decoders`` (units each decoder read: ``pyarrow``, ``polars``, ``dataset``; see
    ``scan/decoders.py``; ``polars-stream``: unit tasks taken from an unshuffled epoch's
    polars streaming query, ``scan/stream.py``; ``polars-window``: row groups of
    block-shuffle windows read by polars at once), ``readers`` (reader threads the
    autotuner settled on, at most the threads it started), ``readers_peak`` (most busy at once), ``readers_max`` (the
    bound: ``io_threads``, or the cores), ``prefetch`` (the byte budget). With ``device="cuda"``, ``device`` counts what went to the GPU whole
    (``pipeline/device.py``): ``reads``, ``direct_bytes`` (from page-locked memory, no host
    copy) and ``staged_bytes`` (one host copy into pinned staging); empty otherwise.
    """

    rows: int = 0
    batches: int = 0
    units_read: int = 0
    bytes_read: int = 0
    bytes_decoded: int = 0
    read_s: float = 0.0
    transform_s: float = 0.0
    collate_s: float = 0.0
    convert_s: float = 0.0
    reader_convert_s: float = 0.0
    wait_s: float = 0.0
    wall_s: float = 0.0
    peak_prefetch_bytes: int = 0
    readers: int = 0
    readers_peak: int = 0
    readers_max: int = 0
    prefetch: int = 0
    cores: int = 0
    cpu_s: float = 0.0
    loader_cpu_s: float = 0.0
    native_cpu_s: float = 0.0
    consumer_cpu_s: float = 0.0
    decoders: dict = field(default_factory=dict)
    device: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def loader_share(self) -> float:
        """The share of the process's CPU time spent outside the consumer's thread: the
        loader's threads and the native pools (see the class docstring)."""
        return max(0.0, self.cpu_s - self.consumer_cpu_s) / self.cpu_s if self.cpu_s > 0 else 0.0

    @property
    def cores_busy(self) -> float:
        """Cores the process kept busy on average (``cpu_s / wall_s``)."""
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def cpu_saturated(self) -> bool:
        """Whether the process used (nearly) every core it may run on during the iteration:
        then the loader's CPU is CPU the training step did not get."""
        return bool(self.cores) and self.cores_busy >= 0.85 * self.cores

    def cpu_text(self) -> str:
        """The CPU figures in words (empty before an iteration)."""
        if not self.wall_s:
            return ""
        text = (f"CPU {self.cpu_s:.3f}s in the process ({self.cores_busy:.1f} of {self.cores} cores busy): "
                f"loader threads {self.loader_cpu_s:.3f}s, native pools {self.native_cpu_s:.3f}s "
                f"(decoding), consumer {self.consumer_cpu_s:.3f}s")
        if self.cpu_saturated:
            text += (f"; the cores are saturated and {self.loader_share:.0%} of the CPU went outside the "
                     "consumer's thread: the loader competes with the training step even where the consumer "
                     "does not wait (a smaller io_threads or prefetch leaves it more)")
        return text

    def settings_text(self) -> str:
        return (f"{self.readers} reader thread{'s' if self.readers != 1 else ''} "
                f"(peak {self.readers_peak} busy, at most {self.readers_max}), "
                f"prefetch {_fmt_bytes(self.prefetch)}")

    def _decoders_text(self) -> str:
        used = {k: v for k, v in self.decoders.items() if v}
        if not used:
            return ""
        return " (decoded by " + ", ".join(f"{k} {v}" for k, v in sorted(used.items(), key=lambda kv: -kv[1])) + ")"

    def __str__(self) -> str:
        rate = self.rows / self.wall_s if self.wall_s else 0.0
        from ..plan.explain import _fmt_bytes as size
        from ..tables import fmt_count
        text = (f"{fmt_count(self.rows, 'row')} in {fmt_count(self.batches, 'batch')}, {self.wall_s:.3f}s wall "
                f"({rate:,.0f} rows/s); read {self.read_s:.3f}s, transform {self.transform_s:.3f}s, "
                f"collate {self.collate_s:.3f}s, convert {self.convert_s:.3f}s (+{self.reader_convert_s:.3f}s on "
                f"the readers), consumer waited "
                f"{self.wait_s:.3f}s; {fmt_count(self.units_read, 'unit')}{self._decoders_text()}, "
                f"{'~' + size(self.bytes_read) if self.bytes_read else 'no file bytes'} read, "
                f"{size(self.bytes_decoded)} decoded, peak prefetch "
                f"{size(self.peak_prefetch_bytes)}")
        if self.device.get("reads"):
            d = self.device
            text += (f"; {fmt_count(d['reads'], 'read')} to the device whole, "
                     f"{size(d.get('direct_bytes', 0))} with no host copy, {size(d.get('staged_bytes', 0))} staged")
        if self.readers_max:
            text += f"; {self.settings_text()}"
        cpu = self.cpu_text()
        return f"{text}; {cpu}" if cpu else text



def fmt_rate(per_s: float, unit: str = "rows") -> str:
    """``1.25M rows/s``, ``820k rows/s``, ``12 rows/s``: three significant figures."""
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if per_s >= div:
            v = per_s / div
            return f"{v:.3g}{suffix} {unit}/s" if v < 1000 else f"{v:,.0f}{suffix} {unit}/s"
    return f"{per_s:.3g} {unit}/s"


def fmt_seconds(s: float) -> str:
    """``0.012 s``, ``3.2 s``, ``1 min 05 s``."""
    if s < 10:
        return f"{s:.3f} s" if s < 1 else f"{s:.2f} s"
    if s < 120:
        return f"{s:.1f} s"
    m, sec = divmod(int(round(s)), 60)
    return f"{m} min {sec:02d} s" if m < 60 else f"{m // 60} h {m % 60:02d} min"


__all__ = ["LoaderStats", "fmt_rate", "fmt_seconds"]
