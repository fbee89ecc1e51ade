"""The Loader: the order layer (which rows, in which order, for this rank) feeding a
threaded sequential pipeline (read -> transform -> batch -> convert -> prefetch).

Threads, not processes: pyarrow decodes with the GIL released; a small pool reads
several units ahead, a producer thread batches and converts, and a byte budget bounds
everything held in flight. Batches come out in an order that is a pure function of
(data snapshot, plan, seed, epoch, world_size, rank), whatever the thread timing.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import InternalError, InvalidArgumentError, LoaderClosedError
from ..order import EpochOrder, ShuffleKind, num_batches, rank_range
from ..plan.fingerprint import plan_fingerprint
from ..plan.nodes import Limit, Map, Scan, SqlQuery, scans, walk
from ..scan.execute import as_record_batch
from . import arguments as _arguments
from . import preflight
from .budget import ByteBudget, read_rows
from .chunks import ChunkConverter, HostChunk
from .collate import BufferPool, resolve_stack, stack_batch
from .device import DeviceBatch, TorchDeviceStage, jax_place, wants_cuda
from .rowsource import ScanRowSource, TableRowSource, default_cache_dir, materialize
from .state import Position, batches_for, make_state, read_state



@dataclass(frozen=True)
class LoaderOptions:
    """Everything that shapes a Loader. See ``Dataset.loader`` for the meaning of each."""

    batch_size: int
    shuffle: bool | str = False
    seed: int = 0
    drop_last: bool = False
    rank: int | None = None
    world_size: int | None = None
    output: str = "numpy"
    device: Any = None
    prefetch: int = 256 << 20
    io_threads: int = 4
    shuffle_window: int = 8
    transform: Callable | None = None
    pad_lists: bool | tuple[str, ...] = False
    pad_value: Any = 0
    pad_to: int | None = None
    fill_null: Mapping[str, Any] | None = None
    cache_dir: str | None = None
    memory_budget: int | None = None
    stack: Mapping[str, Any] | None = None
    devices: tuple | None = None
    sharding: Any = None

    def __post_init__(self) -> None:
        """Every argument checked (and integers normalized to ``int``) now, so a bad value
        fails at ``Dataset.loader(...)``, never at the first batch; see ``arguments``."""
        from ..convert.options import OUTPUTS
        a = _arguments
        put = object.__setattr__.__get__(self)  # frozen: normalize in place, once
        put("batch_size", a.positive_int("batch_size", self.batch_size, "1024"))
        put("shuffle", a.shuffle_kind(self.shuffle))
        put("seed", a.integer("seed", self.seed, low=0, high=a.MAX_SEED,
                              what="an integer in 0 .. 2**64 - 1", example="0"))
        put("drop_last", a.boolean("drop_last", self.drop_last))
        if self.world_size is not None:
            put("world_size", a.integer("world_size", self.world_size, low=1,
                                        what="a positive integer (the number of ranks)"))
        if self.rank is not None:
            put("rank", a.integer("rank", self.rank, low=0, what="an integer >= 0 (this process's rank)"))
        if self.rank is not None and self.world_size is not None:
            a.rank_and_world(self.rank, self.world_size)
        put("output", a.output(self.output, OUTPUTS))
        put("prefetch", a.positive_int("prefetch", self.prefetch, "256 << 20 (bytes held in flight)"))
        put("io_threads", a.integer("io_threads", self.io_threads, low=1, high=1024,
                                    what="an integer in 1 .. 1024 (reader threads)", example="4"))
        put("shuffle_window", a.positive_int("shuffle_window", self.shuffle_window, "8 (row groups)"))
        a.optional_callable("transform", self.transform)
        put("pad_to", a.optional_int("pad_to", self.pad_to, low=0, what="None or an integer >= 0 "
                                     "(the padded length)", example="128"))
        put("cache_dir", a.optional_path("cache_dir", self.cache_dir))
        put("memory_budget", a.optional_int("memory_budget", self.memory_budget, low=0,
                                            what="None or an integer >= 0 (bytes)", example="8 << 30"))
        a.pad_lists(self.pad_lists)
        a.scalar("pad_value", self.pad_value)
        a.fill_null(self.fill_null)
        a.stack_spec(self.stack)
        put("devices", a.device_list(self.devices))


def _distributed_defaults() -> tuple[int, int]:
    """rank / world_size from torch.distributed when initialized, else RANK / WORLD_SIZE,
    else 0 / 1. torch is only consulted if the program already imported it."""
    if "torch" in sys.modules:
        try:
            import torch.distributed as dist
            if dist.is_available() and dist.is_initialized():
                return dist.get_rank(), dist.get_world_size()
        except Exception:  # noqa: BLE001 - a broken torch install must not break loading
            pass
    rank = os.environ.get("RANK")
    world = os.environ.get("WORLD_SIZE")
    if world is not None:
        return _arguments.env_int("RANK", rank or "0"), _arguments.env_int("WORLD_SIZE", world)
    return 0, 1


def _total_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


@dataclass
class LoaderStats:
    """Where the loader spends its time; the first answer to "is my loader the bottleneck?".

    Seconds are summed over threads (``read_s`` may exceed wall time with several readers).
    ``wait_s`` is the time the consumer spent waiting for a batch: near zero means the
    loader keeps up; close to the wall time means training waits on data.
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
    wait_s: float = 0.0
    wall_s: float = 0.0
    peak_prefetch_bytes: int = 0

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        rate = self.rows / self.wall_s if self.wall_s else 0.0
        return (f"{self.rows} rows in {self.batches} batches, {self.wall_s:.3f}s wall "
                f"({rate:,.0f} rows/s); read {self.read_s:.3f}s, transform {self.transform_s:.3f}s, "
                f"collate {self.collate_s:.3f}s, convert {self.convert_s:.3f}s, consumer waited "
                f"{self.wait_s:.3f}s; {self.units_read} units, ~{self.bytes_read / 2**20:.1f} MiB read, "
                f"{self.bytes_decoded / 2**20:.1f} MiB decoded, peak prefetch "
                f"{self.peak_prefetch_bytes / 2**20:.1f} MiB")


@dataclass(frozen=True)
class _Task:
    kind: str            # "unit" | "window" | "gather"
    rows: int
    est_bytes: int
    unit: int = -1
    lo: int = 0
    hi: int = 0
    window: int = -1
    gather_rows: Any = None


class Loader:
    """Iterate exact, shuffled, sharded, resumable batches of a Dataset.

    Built by ``Dataset.loader(...)``. ``len(loader)`` is the number of batches per epoch
    for this rank; ``set_epoch`` picks the epoch (its order); ``state_dict`` /
    ``load_state_dict`` save and resume mid-epoch at the cost of starting an epoch.
    One iteration runs at a time per loader; ``close()`` (or the context manager, or
    garbage collection) stops its threads.
    """

    def __init__(self, dataset, options: LoaderOptions) -> None:
        from ..convert import ConvertOptions
        self._dataset = dataset
        self.options = options
        rank, world = options.rank, options.world_size
        if rank is None or world is None:
            d_rank, d_world = _distributed_defaults()
            rank = d_rank if rank is None else rank
            world = d_world if world is None else world
        where = "" if options.rank is not None and options.world_size is not None else \
            "torch.distributed or the RANK / WORLD_SIZE environment variables"
        self.rank, self.world_size = _arguments.rank_and_world(rank, world, where)
        # import the framework now (seconds for torch / jax), not inside the first batch's timing
        if options.output == "torch":
            from ..convert.torch_out import import_torch
            import_torch()
        elif options.output == "jax":
            from ..convert.jax_out import import_jax
            import_jax()
        # CUDA copies go through the pinned, stream-ordered device stage, not convert's .to()
        self._device_stage = None
        if wants_cuda(options.output, options.device, options.devices):
            self._device_stage = TorchDeviceStage(list(options.devices or [options.device]))
        elif options.devices:
            raise InvalidArgumentError("devices= splits batches across CUDA devices (output='torch'); "
                                       "for jax, pass sharding=jax.sharding.NamedSharding(...)", "devices")
        if options.sharding is not None and options.output != "jax":
            raise InvalidArgumentError(f"sharding= places jax arrays; it needs output='jax' "
                                       f"(got output={options.output!r})", "sharding")
        self._convert = ConvertOptions(output=options.output, pad_lists=options.pad_lists,
                                       pad_value=options.pad_value, pad_to=options.pad_to,
                                       fill_null=options.fill_null,
                                       device=None if self._device_stage or options.sharding is not None
                                       else options.device)
        if self._convert.device is not None and options.output in ("torch", "jax"):
            from ..convert import _backend
            _backend(self._convert)  # a bad or missing device fails here, not at the first batch
        self._cache_dir = options.cache_dir or default_cache_dir()
        self._plan = dataset.optimized_plan()
        self._logical_key = plan_fingerprint(dataset.plan, data=False)
        # what the first batches would refuse (stack names, ragged lists, nulls) fails here:
        # from the schema and footers before reading, from the random-access table once built
        checked = options.transform is None  # a transform reshapes batches: per-batch checks only
        if checked:
            preflight.check_plan(self._plan.schema, self._plan, self._convert, options.stack)
        self.shuffle_kind, self._source = self._build_source()
        self._widths = None
        if checked:
            known = preflight.check_source(self._source, self._convert)
            lists = preflight.unpadded_lists(self._plan.schema, self._convert)
            if lists and options.output != "arrow":
                self._widths = preflight.ListWidths(lists, known)
        self.epoch = 0
        self._start = 0
        self._position = 0
        self._batches_done = 0
        self._closed = False
        self._active: weakref.WeakSet = weakref.WeakSet()
        self._stats = LoaderStats()
        self._pool = BufferPool(max_bytes=max(options.prefetch, 64 << 20))
        self._stack_spec = None
        # reads are converted whole on the reader threads unless batches must stay Arrow
        self._chunks = (ChunkConverter(self._convert, options.stack, self._pool)
                        if options.output != "arrow" and options.transform is None else None)

    # -- random-access layer -------------------------------------------------
    def _needs_table(self) -> bool:
        return any(isinstance(n, (Limit, SqlQuery)) or (isinstance(n, Scan) and n.limit is not None)
                   for n in walk(self._plan)) or len(scans(self._plan)) != 1

    def _build_source(self):
        opts = self.options
        kind = opts.shuffle
        found = scans(self._plan)
        local = all(s.source.is_local for s in found)
        needs_table = self._needs_table()
        if kind is None:  # shuffle=True / "auto": the best kind the source allows
            kind = ShuffleKind.GLOBAL if (local or needs_table) else ShuffleKind.BLOCK
        kind = ShuffleKind(kind).value
        budget = opts.memory_budget if opts.memory_budget is not None else _total_memory() // 4
        reuse = all(not isinstance(n, Map) or bool(n.name) for n in walk(self._plan))
        if kind == "global" or needs_table:
            src = materialize(self._plan, self._dataset.options, memory_budget=budget,
                              cache_dir=self._cache_dir, reuse=reuse,
                              stack=opts.stack if opts.output != "arrow" and opts.transform is None else None)
        else:
            src = ScanRowSource(self._plan, self._dataset.options, self._cache_dir, opts.io_threads)
        return kind, src

    @property
    def source_kind(self) -> str:
        s = self._source
        return "scan" if isinstance(s, ScanRowSource) else f"table ({s.where})"

    @property
    def num_rows(self) -> int:
        """Selected rows in the whole dataset (all ranks)."""
        return int(sum(self._source.counts))

    def _order(self, epoch: int) -> EpochOrder:
        return EpochOrder(tuple(self._source.counts), self.shuffle_kind, self.options.seed, epoch,
                          self.options.shuffle_window)

    def _rank_rows(self) -> tuple[int, int]:
        """This rank's positions in the epoch sequence, trimmed for drop_last."""
        start, stop = rank_range(self.num_rows, self.rank, self.world_size)
        if self.options.drop_last:
            stop = start + (stop - start) // self.options.batch_size * self.options.batch_size
        return start, stop

    def __len__(self) -> int:
        start, stop = rank_range(self.num_rows, self.rank, self.world_size)
        return num_batches(stop - start, self.options.batch_size, self.options.drop_last)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch the next iteration runs (each epoch has its own order). Setting the
        epoch a loaded state was taken in keeps that state's position."""
        epoch = _arguments.integer("epoch", epoch, low=0, what="an integer >= 0")
        if epoch != self.epoch:
            self.epoch = epoch
            self._start = 0
            self._position = 0
            self._batches_done = 0

    # -- tasks -------------------------------------------------------------------
    def _tasks(self, order: EpochOrder, ranges: list[tuple[int, int]]) -> Iterator[_Task]:
        """The reads of positions ``ranges``, in order, each with the bytes it will hold.

        A random-access table is read in pieces sized in bytes (``budget.read_rows``: a
        whole number of batches within a share of ``prefetch``, at least one batch):
        slices in source order, gathers for both shuffles (a block shuffle's rows are
        ``order.rows``, the same sequence its windows give). A scan is read per unit (a
        row group) or per window of units, the smallest reads it allows."""
        src = self._source
        table = isinstance(src, TableRowSource)
        if table:
            row_bytes = src.row_bytes
            step = read_rows(self.options.prefetch, row_bytes, self.options.batch_size)
        for a, b in ranges:
            if order.kind == "none":
                for u, lo, hi in order.unit_pieces(a, b):
                    if table:
                        for p in range(lo, hi, step):
                            q = min(hi, p + step)
                            yield _Task("unit", q - p, max(1, int((q - p) * row_bytes)), unit=u, lo=p, hi=q)
                        continue
                    est = src.est_bytes(u) * (hi - lo) // max(1, src.counts[u])
                    yield _Task("unit", hi - lo, est, unit=u, lo=lo, hi=hi)
            elif order.kind == "block" and not table:
                # one task per window: splitting it into gathers shared through the task
                # cache was measured slower (they wait on the window's read)
                for w, lo, hi in order.window_pieces(a, b):
                    est = sum(src.est_bytes(int(u)) for u in order.windows[w])
                    yield _Task("window", hi - lo, est, window=w, lo=lo, hi=hi)
            else:
                for p in range(a, b, step):
                    q = min(b, p + step)
                    yield _Task("gather", q - p, max(1, int((q - p) * row_bytes)), lo=p, hi=q)

    def _run_task(self, task: _Task, order: EpochOrder, cache: "_SharedCache") -> tuple[list, float]:
        """Read one task: its rows as a list of HostChunks (converted here, on the reader
        thread) or Arrow batches (converted per batch later), and the seconds spent converting."""
        src = self._source
        conv = self._chunks
        if task.kind == "unit":
            table = cache.get(("unit", task.unit), lambda: src.read_unit(task.unit))
            table = table.slice(task.lo, task.hi - task.lo)
        elif task.kind == "window":
            def load_window():
                units = [int(u) for u in order.windows[task.window]]
                workers = min(len(units), self.options.io_threads)
                if workers > 1:  # a window is many units: read them side by side
                    with ThreadPoolExecutor(workers, thread_name_prefix="arrowload-window") as pool:
                        parts = list(pool.map(src.read_unit, units))
                else:
                    parts = [src.read_unit(u) for u in units]
                # one contiguous chunk: Arrow's take over many chunks concatenates per call
                return pa.concat_tables(parts).combine_chunks()
            window = cache.get(("window", task.window), load_window)
            local = np.asarray(order.window_local(task.window, task.lo, task.hi), dtype=np.int64)
            t0 = time.perf_counter()
            chunk = conv.gather(window, local, keep=False) if conv is not None else None
            if chunk is not None:
                return [chunk], time.perf_counter() - t0
            table = window.take(pa.array(local, pa.int64()))
        else:
            rows = order.rows(task.lo, task.hi)
            t0 = time.perf_counter()
            chunk = conv.gather(src.table, rows) if conv is not None else None
            if chunk is not None:  # gathered straight into pooled buffers
                return [chunk], time.perf_counter() - t0
            table = src.gather(rows)
        batches = [b for b in table.to_batches() if b.num_rows]
        if conv is None:
            return batches, 0.0
        t0 = time.perf_counter()
        items = [conv.chunk(b) for b in batches]
        return items, time.perf_counter() - t0

    # -- iteration -----------------------------------------------------------------
    def __iter__(self) -> "_EpochIterator":
        if self._closed:
            raise LoaderClosedError("this loader is closed; build a new one with Dataset.loader()")
        for it in list(self._active):
            it.close()
        start, stop = self._rank_rows()
        begin = min(start + self._start, stop)
        self._position = begin - start
        self._batches_done = batches_for(self._start, self.options.batch_size)
        self._start = 0
        ranges = [(begin, stop)] if begin < stop else []
        it = _EpochIterator(self, self._order(self.epoch), ranges, start)
        self._active.add(it)
        return it

    def _worker_iter(self, worker: int, workers: int) -> "_EpochIterator":
        """Batches ``worker, worker + workers, ...`` of this epoch (for torch DataLoader workers)."""
        start, stop = self._rank_rows()
        b = self.options.batch_size
        begin = min(start + self._start, stop)  # a loaded resume position applies here too
        ranges = [(p, min(stop, p + b)) for p in range(begin + worker * b, stop, workers * b)]
        it = _EpochIterator(self, self._order(self.epoch), ranges, start, track=False)
        self._active.add(it)
        return it

    def _advance(self, rows: int) -> None:
        self._position += rows
        self._batches_done += 1

    def _collate(self, batch: pa.RecordBatch):
        """Convert one Arrow batch (the per-batch path: ``transform=``, ``output="arrow"``, padded
        lists, a chunk that did not convert whole); with ``stack=``, the stacked columns are
        written once into pooled buffers (see ``collate``), padded lists too."""
        from ..convert.host import to_host
        if self.options.output == "arrow" and not self.options.stack:
            from ..convert import convert_batch
            return convert_batch(batch, self._convert)
        if self.options.stack:
            spec = self._stack_spec
            if spec is None or not spec.stacked <= set(batch.schema.names):
                spec = self._stack_spec = resolve_stack(self.options.stack, batch.schema)
            host = stack_batch(batch, spec, self._pool, self._convert)
        else:
            host = to_host(batch, self._convert, self._pool.take)
        if self.options.output == "arrow":
            return _host_to_arrow(host)
        return self._finish(host)

    def _finish(self, host: dict):
        """Host arrays of one batch -> what the user gets; with a CUDA device the copies start
        here (see ``device``), with ``sharding=`` the jax placement."""
        from ..convert import convert_host
        if self._widths is not None:
            self._widths.check(host)
        if self._device_stage is not None:
            return self._device_stage.to_device(host)
        out = convert_host(host, self._convert)
        if self.options.sharding is not None:
            out = jax_place(out, self.options.sharding)
        return out

    # -- state -------------------------------------------------------------------
    def _identity(self) -> dict:
        return {
            "snapshot": self._source_snapshot(),
            "plan": self._logical_key,
            "seed": self.options.seed,
            "shuffle": self.shuffle_kind,
            "window": self.options.shuffle_window if self.shuffle_kind == "block" else None,
            "world_size": self.world_size,
            "rank": self.rank,
            "batch_size": self.options.batch_size,
            "drop_last": self.options.drop_last,
            "num_rows": self.num_rows,
        }

    def _source_snapshot(self) -> str:
        return "+".join(s.source.fingerprint() for s in scans(self._dataset.plan)) or "sql"

    def state_dict(self) -> dict:
        """Small JSON-serializable state: where this rank is in which epoch, plus what it was
        taken on (snapshot and plan fingerprints, seed, shuffle, world). No pickles. See
        ``formats/loader_state/v1/spec.md``."""
        return make_state(self._identity(), Position(self.epoch, self._position, self._batches_done))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume: the next iteration yields exactly the batches after ``state``'s position
        in its epoch. Every field is checked (type, range, this rank's own rows); a state
        taken on other data, another plan or another setup is refused with
        ``StateMismatchError`` saying what differs."""
        start, stop = self._rank_rows()
        at = read_state(state, self._identity(), stop - start)
        self.epoch = at.epoch
        self._start = at.position
        self._position = at.position
        self._batches_done = at.batches

    # -- introspection -------------------------------------------------------------
    def stats(self) -> LoaderStats:
        """Counters of the current (or last) iteration."""
        return dataclasses.replace(self._stats)

    def explain(self) -> str:
        return self._dataset.explain() + "\n\n" + self._describe()

    def _describe(self) -> str:
        o = self.options
        window = f", window {o.shuffle_window} units" if self.shuffle_kind == "block" else ""
        return "\n".join([
            "== loader ==",
            f"  shuffle      {self.shuffle_kind}{window} (seed {o.seed}, epoch {self.epoch})",
            f"  rows         {self.num_rows} selected; rank {self.rank} of {self.world_size}",
            f"  batches      {len(self)} of {o.batch_size} rows (drop_last={o.drop_last})",
            f"  source       {self.source_kind}, {len(self._source.counts)} units",
            f"  output       {o.output} (device {o.device})",
            f"  prefetch     {o.prefetch / 2**20:.0f} MiB budget, {o.io_threads} reader threads",
        ])

    def __repr__(self) -> str:
        from ..display import loader_text
        return loader_text(self, (
            f"arrowload.Loader(batch_size={self.options.batch_size}, shuffle={self.shuffle_kind!r}, "
            f"rank={self.rank}/{self.world_size}, rows={self.num_rows}, batches={len(self)}, "
            f"output={self.options.output!r}, source={self.source_kind})"))

    def _repr_html_(self) -> str:
        from ..display import loader_html
        return loader_html(self)

    def profile(self, n_batches: int | None = None):
        """Run ``n_batches`` batches (default: the whole epoch) into an infinitely fast
        consumer and return a :class:`~arrowload.pipeline.profile.Profile`: seconds per stage
        (read, collate, transform, convert, consumer wait), rows/s over time, the bottleneck,
        and ``.plot()`` (matplotlib). The loader's position is the same afterwards."""
        from .profile import profile
        return profile(self, n_batches)

    def progress(self, desc: str | None = None, *, enabled: bool | None = None):
        """Iterate this epoch under a progress bar (tqdm; shown where ``al.set_progress``
        allows, or always with ``enabled=True``): ``for batch in loader.progress(): ...``.
        The batches and the resume state are exactly those of ``iter(loader)``."""
        from ..progress import track_loader
        return track_loader(self, desc, enabled=enabled)

    # -- lifecycle -----------------------------------------------------------------
    def close(self) -> None:
        """Stop every thread this loader started. Idempotent."""
        for it in list(self._active):
            it.close()
        self._closed = True

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_active"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._active = weakref.WeakSet()

    # -- torch ---------------------------------------------------------------------
    def torch_dataset(self):
        """This loader as a ``torch.utils.data.IterableDataset`` yielding whole batches, for
        code that insists on ``DataLoader(ds, batch_size=None, num_workers=n)``. Each worker
        produces batches ``w, w+n, ...`` of the epoch, so rows are never duplicated and the
        DataLoader's round-robin gives back the loader's own order."""
        from .torch_compat import TorchBatches
        return TorchBatches(self)


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


_DONE = object()


class _Pipeline:
    """The threads of one epoch iteration. Owned by an _EpochIterator; never references it."""

    def __init__(self, loader: Loader, order: EpochOrder, ranges: list[tuple[int, int]]) -> None:
        self.loader = loader
        self.order = order
        self.ranges = ranges
        self.stop = threading.Event()
        self.budget = ByteBudget(loader.options.prefetch, self.stop)
        self.out: queue.Queue = queue.Queue()
        self.stats = LoaderStats()
        self.pool = ThreadPoolExecutor(loader.options.io_threads, thread_name_prefix="arrowload-read")
        self.thread = threading.Thread(target=self._run, name="arrowload-loader", daemon=True)
        self.started = time.perf_counter()
        self.thread.start()

    # producer ------------------------------------------------------------------
    def _read(self, task: _Task, cache: "_SharedCache") -> tuple[list, float, float]:
        t0 = time.perf_counter()
        items, convert_s = self.loader._run_task(task, self.order, cache)
        return items, time.perf_counter() - t0, convert_s

    def _run(self) -> None:
        try:
            self._produce()
            self.out.put(_DONE)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, re-raised there
            self.out.put(_Failure(exc))

    def _produce(self) -> None:
        loader = self.loader
        bsize = loader.options.batch_size
        tasks = loader._tasks(self.order, self.ranges)
        # Units are shared between tasks only when ranges are cut per batch (DataLoader workers).
        cache = _SharedCache(loader.options.io_threads + 1 if len(self.ranges) > 1 else 0)
        inflight: deque[tuple[Future, _Task]] = deque()
        max_inflight = loader.options.io_threads * 2
        pending: deque = deque()  # HostChunks / Arrow batches, in order
        conv = loader._chunks
        combine = conv.combine if conv is not None else _concat_batches
        pending_rows = 0
        carried = 0  # bytes of read rows still in `pending`, counted in the budget (see below)
        next_task: _Task | None = None
        while True:
            while len(inflight) < max_inflight:
                if next_task is None:
                    next_task = next(tasks, None)
                    if next_task is None:
                        break
                if not self.budget.acquire(next_task.est_bytes, block=not inflight, own=carried):
                    if self.stop.is_set():
                        return
                    break  # over budget: let in-flight work drain first
                inflight.append((self.pool.submit(self._read, next_task, cache), next_task))
                next_task = None
            if not inflight or self.stop.is_set():
                break
            fut, task = inflight.popleft()
            items, secs, convert_s = fut.result()
            self.stats.read_s += secs - convert_s
            self.stats.convert_s += convert_s
            self.stats.units_read += 1
            self.stats.bytes_read += task.est_bytes // 3 if task.kind != "gather" else 0
            t0 = time.perf_counter()
            added = 0
            for b in items:
                pending.append(b)
                pending_rows += b.num_rows
                added += b.nbytes
            self.stats.bytes_decoded += added
            del items
            # The task's rows now wait in ``pending`` until cut into batches: its estimate
            # is replaced by the bytes it actually holds ("carried"), which pass to each
            # batch as it is emitted; the budget counts every byte read and not yet
            # consumed. Waits are only on the consumer, never on bytes this thread holds
            # itself (``own``), so a read larger than the whole budget still flows.
            self.budget.release(task.est_bytes)
            carried += self.budget.charge(added)
            reserved = sum(t.est_bytes for _, t in inflight)
            while pending_rows >= bsize:
                batch = combine(_take_rows(pending, bsize))
                pending_rows -= bsize
                self.stats.collate_s += time.perf_counter() - t0
                give = min(carried, batch.nbytes)
                self.budget.release(give)
                carried -= give
                if not self._emit(batch, reserved + carried):
                    return
                t0 = time.perf_counter()
            held = sum(b.nbytes for b in pending)
            if carried > held:  # estimates of slices drift: never carry more than is held
                self.budget.release(carried - held)
                carried = held
            self.stats.collate_s += time.perf_counter() - t0
        if pending_rows and not self.stop.is_set():
            batch = combine(_take_rows(pending, pending_rows))
            self.budget.release(carried)
            self._emit(batch)

    def _emit(self, batch: "HostChunk | pa.RecordBatch", reserved: int = 0) -> bool:
        loader = self.loader
        if isinstance(batch, HostChunk):
            t0 = time.perf_counter()
            out = loader._finish(batch.columns)
        else:
            fn = loader.options.transform
            if fn is not None:
                t0 = time.perf_counter()
                batch = as_record_batch(fn(batch), "transform")
                self.stats.transform_s += time.perf_counter() - t0
            t0 = time.perf_counter()
            out = loader._collate(batch)
        self.stats.convert_s += time.perf_counter() - t0
        nbytes = batch.nbytes
        # Wait only while the consumer holds batches (it will release them), never on the
        # reads this thread has in flight.
        if not self.budget.acquire(nbytes, own=reserved):
            return False
        self.out.put((out, batch.num_rows, nbytes))
        return True

    # consumer ------------------------------------------------------------------
    def next(self):
        t0 = time.perf_counter()
        while True:
            try:
                item = self.out.get(timeout=0.1)
                break
            except queue.Empty:
                if not self.thread.is_alive() and self.out.empty():
                    raise InternalError("the loader's producer thread died without a result (a bug: "
                                        "please report it with the traceback)") from None
        self.stats.wait_s += time.perf_counter() - t0
        if item is _DONE:
            self.close()
            raise StopIteration
        if isinstance(item, _Failure):
            self.close()
            raise item.exc
        out, rows, nbytes = item
        self.budget.release(nbytes)
        self.stats.rows += rows
        self.stats.batches += 1
        self.stats.peak_prefetch_bytes = self.budget.peak
        self.stats.wall_s = time.perf_counter() - self.started
        return out, rows

    def close(self) -> None:
        self.stop.set()
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join()
        self.pool.shutdown(wait=True, cancel_futures=True)
        while not self.out.empty():
            try:
                self.out.get_nowait()
            except queue.Empty:
                break


def _host_to_arrow(host: dict) -> pa.RecordBatch:
    arrays, names = [], []
    for name, value in host.items():
        if isinstance(value, np.ndarray) and value.ndim == 2:
            arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(value.reshape(-1)), value.shape[1]))
        else:
            arrays.append(pa.array(value))
        names.append(name)
    return pa.RecordBatch.from_arrays(arrays, names=names)


def _take_rows(pending: deque, n: int) -> list:
    """Pop the first ``n`` rows of ``pending`` (HostChunks or Arrow batches): the parts of one
    batch, zero-copy slices; a combine step makes them one (a copy only when there are several)."""
    parts, got = [], 0
    while got < n:
        b = pending.popleft()
        take = min(b.num_rows, n - got)
        parts.append(b.slice(0, take) if take < b.num_rows else b)
        got += take
        if take < b.num_rows:
            pending.appendleft(b.slice(take))
    return parts


def _concat_batches(parts: list) -> pa.RecordBatch:
    return parts[0] if len(parts) == 1 else pa.concat_batches(parts)


class _SharedCache:
    """The last few units / windows read, shared by the reader threads, so consecutive
    tasks over one unit (a unit split between batches of DataLoader workers) read it once.
    A key being read by one thread is waited for, not read twice."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._items: dict = {}

    def get(self, key, load: Callable[[], Any]):
        if self.capacity == 0:
            return load()
        with self._lock:
            fut = self._items.get(key)
            owner = fut is None
            if owner:
                fut = Future()
                self._items[key] = fut
                while len(self._items) > self.capacity:
                    self._items.pop(next(iter(self._items)))
        if owner:
            try:
                fut.set_result(load())
            except BaseException as exc:  # noqa: BLE001 - waiters re-raise it
                fut.set_exception(exc)
                with self._lock:
                    self._items.pop(key, None)
        return fut.result()


class _EpochIterator:
    """What ``iter(loader)`` returns. Dropping it (or ``close()``) stops its threads."""

    def __init__(self, loader: Loader, order: EpochOrder, ranges, rank_start: int, track: bool = True) -> None:
        self._loader = loader
        self._track = track
        self._pipeline = _Pipeline(loader, order, ranges)
        self._finalizer = weakref.finalize(self, self._pipeline.close)
        if track:
            loader._stats = self._pipeline.stats

    def __iter__(self):
        return self

    def __next__(self):
        out, rows = self._pipeline.next()
        if isinstance(out, DeviceBatch):
            out = out.stage.ready(out)
        if self._track:
            self._loader._advance(rows)
        return out

    def close(self) -> None:
        self._finalizer()
