"""The Loader: the facade that wires the stages of an epoch and keeps what outlives one.

Stages, each readable alone: the random-access layer (``rowsource``: which rows exist,
in units of exact counts), the order (``order``: which rows, in which order, for this rank;
``order.tasks``: the reads of those positions, each with the bytes it holds), the reads
(``ScanRowSource.read`` / ``TableRowSource.read``), the threads that run them ahead under a
byte budget and cut batches in order (``stages``), and one batch's conversion
(``convert.batches``). The Loader holds the options, the position and the resume state,
and describes itself; it hands the stages plain callables.

Decoders: each unit is decoded by pyarrow or polars (``scan/units.py`` measures which is
cheaper); an unshuffled epoch over local Parquet polars can read whole may instead run one
polars streaming query per range of positions, its tasks taking their rows from it in order
(``scan/stream.py``, ``streamreads.py``, ``STREAM_DEFAULT``): same batches, order and
resume, named ``polars-stream`` in ``stats()``.

Threads, not processes: pyarrow decodes with the GIL released; reader threads sized to
the machine read ahead, a producer thread batches and converts, and a byte budget bounds
everything held in flight. Batches come out in an order that is a pure function of
(data snapshot, plan, seed, epoch, world_size, rank), whatever the thread timing.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from ..convert.batches import BatchOutput, concat_arrow
from ..convert.host import restricted
from ..errors import (ColumnNotFoundError, ConversionError, InvalidArgumentError, LoaderClosedError,
                      StateMismatchError)
from ..options import default_cache_dir
from ..order import (EpochOrder, ShuffleKind, SourceShape, free_ranges, lane_rows, num_batches, plan_tasks,
                     rank_range, resume_ranges)
from ..order.elastic import Ranges, take
from ..order.tasks import MAX_READ_ROWS
from ..plan.explain import _fmt_bytes
from ..plan.fingerprint import plan_fingerprint
from ..plan.nodes import Map, scans, walk, with_sources
from ..scan.execute import as_record_batch
from ..scan.stream import forked_with_polars, import_polars_in_background, stream_setting
from ..source.footer import keep_checks, recall_checks
from . import arguments as _arguments
from . import preflight
from .board import Board, post, shared, torch_batches
from .chunks import ChunkConverter, DeviceReads
from .collate import BufferPool
from .device import TorchDeviceStage, check_sharding, jax_place, pin_tables_setting, wants_cuda
from .options import LoaderOptions, reader_bound
from .rowsource import ScanRowSource, TableRowSource, _one_scan, materialize, window_step
from .stages import (ENDED_BY_CLOSE, ENDED_BY_EPOCH, ENDED_BY_ITER, ENDED_BY_LOAD, EpochIterator, Settings, Stages,
                     end_iterations)
from .streamreads import StreamReads
from .state import (DATA, STATE_VERSION, Position, batches_for, check_identity, identity_keys, make_state,
                    read_state, state_version)
from .stats import LoaderStats

__all__ = ["Loader", "LoaderOptions", "LoaderStats"]

#: Unshuffled epochs over an eligible local Parquet scan read through one polars streaming
#: query per range (``scan/stream.py``) unless the environment says otherwise
#: (``stream.stream_setting``) -- by default where polars is imported already, or with a
#: filter polars evaluates where the unit reader chose polars (it imports it anyway); else
#: only for epochs reading at least ``STREAM_FILTER_IMPORT_BYTES``
#: (compressed) with a filter polars evaluates, ``STREAM_IMPORT_BYTES`` without one. On the
#: 4M-row benchmark lake (341 MiB; process CPU s, fresh processes): W1 with polars imported
#: 0.54-0.58 streamed vs 0.62-0.76 per unit, but importing polars costs 0.085 CPU s and
#: 0.15 s before the first batch (W1 paying it: 0.69-0.73 vs 0.64-0.73); W2 (a filter)
#: 0.61-0.66 streamed, import included, vs 0.73-0.80 per unit; W2i (41 MiB) 0.24 vs 0.08.
#: Without a filter, where the unit reader chose polars, the stream paying the import lost
#: (benchmarks/run.py W1: 0.795 CPU s vs 0.63-0.67 per unit); on a 16M-row lake (1.3 GiB read)
#: W1 streamed 2.18-2.25 CPU s, import included, vs 2.56-2.59 per unit.
STREAM_DEFAULT = True
STREAM_IMPORT_BYTES = 1 << 30
STREAM_FILTER_IMPORT_BYTES = 256 << 20
#: ... or reading at least this many units: per unit the loader costs 0.15-0.25 ms of CPU
#: (a read and a hand-off), the stream's runs a few us, so many small units pay the import
#: whatever their bytes (fresh processes, polars not imported, 4 float / int columns, per
#: unit vs streamed import included: 1,000 row groups of 200 rows 0.22-0.30 vs 0.16 s;
#: 2,000 files of 500 rows 0.83-0.99 vs 0.55-0.61 s; 10,000 row groups of 100 rows
#: 2.3-2.6 vs 0.83-0.85 s)
STREAM_IMPORT_UNITS = 512
#: rows under which consecutive units of an unshuffled epoch read through a polars stream
#: are taken as one task (``order.tasks.plan_tasks``): small files and tiny row groups cost
#: a task each otherwise
RUN_ROWS = MAX_READ_ROWS
#: reader threads of a streamed epoch where ``io_threads`` is not given (``_stages``)
STREAM_READERS = 1


def _stream_allowed(query, unit_bytes: int, read_bytes: Callable[[], int], *, prefetch: int,
                    polars_chosen: bool = False, units: Callable[[], int] = lambda: 0) -> bool:
    """Whether to read through ``query`` (one polars streaming query, ``scan/stream.py``)
    rather than per unit: an unshuffled epoch (``Loader._stream_query``) and a random-access
    table's build (``rowsource.materialize``, ``mixture.shared``) alike. What the
    environment says (``stream.stream_setting``) where it says it; else only where what
    polars decodes ahead (``StreamQuery.held_bytes`` of units of ``unit_bytes``) fits half
    of ``prefetch``, and polars is imported already, or the unit reader chose it to
    prefilter (``polars_chosen``: it imports it anyway), or the read (``read_bytes()``,
    compressed) pays its import: ``STREAM_FILTER_IMPORT_BYTES`` with a filter polars
    evaluates, ``STREAM_IMPORT_BYTES`` without, or it reads ``STREAM_IMPORT_UNITS`` units
    (``units()``) or more (see there). On the 4M-row benchmark lake,
    with polars imported, W3 (a global epoch, build included; ``benchmarks/run.py``,
    ``ARROWLOAD_STREAM=0`` for the units): 0.435 s streamed against 0.478-0.494 s from
    the units (pyarrow)."""
    setting = stream_setting()
    if setting is not None or not STREAM_DEFAULT:
        return bool(setting)
    if query.held_bytes(unit_bytes) > prefetch // 2:
        return False  # what polars decodes ahead would not fit the budget: reads stay per unit
    if "polars" in sys.modules or polars_chosen:
        return True  # its import is paid already, or will be
    # else its import (0.085 CPU s, before the first batch) only pays on a long read, or
    # one of many small units
    return read_bytes() >= (STREAM_FILTER_IMPORT_BYTES if query.predicate is not None else STREAM_IMPORT_BYTES) \
        or units() >= STREAM_IMPORT_UNITS


def _distributed_defaults() -> tuple[int, int]:
    """rank / world_size from torch.distributed when initialized, else from jax
    (``jax.process_index()`` / ``jax.process_count()``) when ``jax.distributed`` is
    initialized, else RANK / WORLD_SIZE, else 0 / 1. torch and jax are only consulted if
    the program already imported them; jax only once ``jax.distributed.is_initialized()``
    (asking for the process count earlier would start jax's backends as a side effect)."""
    if "torch" in sys.modules:
        try:
            import torch.distributed as dist
            if dist.is_available() and dist.is_initialized():
                return dist.get_rank(), dist.get_world_size()
        except Exception:  # noqa: BLE001 - a broken torch install must not break loading
            pass
    if "jax" in sys.modules:
        try:
            import jax
            if jax.distributed.is_initialized():
                return jax.process_index(), jax.process_count()
        except Exception:  # noqa: BLE001 - a broken jax install must not break loading
            pass
    rank = os.environ.get("RANK")
    world = os.environ.get("WORLD_SIZE")
    if (rank is None) != (world is None):
        # one without the other: every process would read as rank 0 (WORLD_SIZE alone: the
        # same rows in each) or as the only one (RANK alone)
        have, missing = ("RANK", "WORLD_SIZE") if world is None else ("WORLD_SIZE", "RANK")
        raise InvalidArgumentError(f"the environment sets {have}={os.environ[have]} but not {missing}; set "
                                   f"both (torchrun does), or pass rank= and world_size= to loader()", missing)
    if world is not None:
        return _arguments.env_int("RANK", rank), _arguments.env_int("WORLD_SIZE", world)
    return 0, 1


def rank_and_world(rank: int | None, world: int | None) -> tuple[int, int]:
    """``rank`` / ``world_size`` as given, else from torch.distributed, jax.distributed or
    the RANK / WORLD_SIZE environment variables (``_distributed_defaults``), checked."""
    where = "" if rank is not None and world is not None else \
        "torch.distributed, jax.distributed or the RANK / WORLD_SIZE environment variables"
    if rank is None or world is None:
        d_rank, d_world = _distributed_defaults()
        rank = d_rank if rank is None else rank
        world = d_world if world is None else world
    return _arguments.rank_and_world(rank, world, where)


def _total_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def _transformed(fn, batch):
    return as_record_batch(fn(batch), "transform")


@dataclasses.dataclass(frozen=True)
class _Binding:
    """What a loader derives from the dataset it reads (see ``Loader._bind``)."""

    dataset: Any
    plan: Any
    logical_key: str
    shuffle_kind: ShuffleKind
    source: Any
    widths: Any


class Loader:
    """Iterate exact, shuffled, sharded, resumable batches of a Dataset.

    Built by ``Dataset.loader(...)``. ``len(loader)`` is the number of batches per epoch
    for this rank; ``set_epoch`` picks the epoch (its order); ``state_dict`` /
    ``load_state_dict`` save and resume mid-epoch at the cost of starting an epoch.
    One iteration runs at a time per loader; ``close()`` (or the context manager, or
    garbage collection) stops its threads.
    """

    def __init__(self, dataset, options: LoaderOptions, *, sources=None) -> None:
        """``sources(dataset, plan, kind)`` (optional; a data mixture's shared reads,
        ``mixture.shared``): the row source to bind for ``dataset``, or None to build it here."""
        from ..convert import ConvertOptions
        self._sources = sources
        self._dataset = dataset
        self.options = options
        self.rank, self.world_size = rank_and_world(options.rank, options.world_size)
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
            self._device_stage = TorchDeviceStage(list(options.devices or [options.device]),
                                                  pool_bytes=max(options.prefetch, 64 << 20))
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
        self._convert_given = self._convert  # (a loaded state's older snapshot may lack a named column)
        if self._convert.device is not None and options.output in ("torch", "jax"):
            from ..convert import _backend
            try:
                _backend(self._convert)  # a bad or missing device fails here, not at the first batch
            except ConversionError as exc:  # not a device name: an argument's value
                raise InvalidArgumentError(str(exc), "device") from None
        self._cache_dir = options.cache_dir or default_cache_dir()
        #: the most reader threads: io_threads, or the cores this process may run on
        self.max_readers = reader_bound(options.io_threads)
        self._remote = None  # executor="ray": reads and transforms as Ray tasks (scaleout.executor)
        if options.executor == "ray":
            from ..scaleout.executor import RayExecutor
            self._remote = RayExecutor()
            if options.io_threads is None:  # a reader thread waits on each Ray read
                self.max_readers = max(self.max_readers, self._remote.parallelism)
        dataset._verify()  # a pinned dataset's files, as they were
        self._origin = dataset  # the dataset built on; a loaded state may bind another snapshot of it
        self._adopt(self._bind(dataset))
        if options.sharding is not None:
            start, stop = self._rank_rows()
            check_sharding(options.sharding, [options.batch_size] + [(stop - start) % options.batch_size or
                                                                      options.batch_size])
        self.epoch = 0
        self._start = 0
        #: where the DataLoader batches ``state_dict(dataloader_batches=k)`` counts start: the
        #: loaded position (and its segments), or where the last in-process pass began
        self._dl_base: tuple[int, tuple] = (0, ())
        self._position = 0
        self._batches_done = 0
        #: the earlier segments of this epoch the current (or last) iteration is laid out after,
        #: and those the next one will be (a loaded state's; order.elastic)
        self._segments: tuple = ()
        self._next_segments: tuple = ()
        self._closed = False
        self._active: weakref.WeakSet = weakref.WeakSet()
        #: the epoch DataLoader workers follow (``torch_dataset``), and the states loaded here
        self._board: Board | None = None
        self._loads = 0
        self._stats = LoaderStats()
        self._profiling = None  # a profile.Profiling recording the next iteration
        self._last_profile = None  # the last Profile taken of this loader (its rate: the epoch estimate)
        self._pool = BufferPool(max_bytes=options.prefetch)  # idle buffers within the budget
        # reads are converted whole on the reader threads unless batches must stay Arrow
        self._chunks = (ChunkConverter(self._convert, options.stack, self._pool)
                        if options.output != "arrow" and options.transform is None else None)
        place = (functools.partial(jax_place, placement=options.sharding)
                 if options.sharding is not None else None)
        self._output = BatchOutput(self._convert, options.stack, self._pool, widths=self._widths,
                                   to_device=self._device_stage.to_device if self._device_stage else None,
                                   place=place,
                                   on_device=self._device_stage.batch if self._device_stage else None)
        self._warm_stream()

    def _warm_stream(self) -> None:
        """Where this loader's epochs will stream by the default rule (``_stream_query``), or
        its block windows be read by polars (``_polars_windows``), and polars is not
        imported yet, its import starts now on a thread of its own: a program
        that builds its model between making the loader and iterating it finds polars
        imported, and no task of the first epoch reads per unit waiting for it. (Not for a
        mixture's components: the mixture reads them, per unit.)"""
        if self._sources is not None or "polars" in sys.modules:
            return
        try:
            if self.shuffle_kind is ShuffleKind.BLOCK:
                if self._polars_windows():
                    import_polars_in_background()
                return
            if self.shuffle_kind is not ShuffleKind.NONE:
                return
            start, stop = self._rank_rows()
            if stop > start and self._stream_query(self._order(self.epoch), [(start, stop)]) is not None:
                import_polars_in_background()
        except Exception:  # noqa: BLE001 - only a head start: the first epoch decides again
            pass

    # -- what the loader reads: a dataset, bound ------------------------------------
    def _bind(self, dataset) -> _Binding:
        """Everything the loader derives from its dataset: the optimized plan, its
        fingerprint, the checks the first batches would make, the shuffle kind and the
        random-access layer (counts; the table for global shuffle). Nothing is assigned."""
        options = self.options
        recall_checks(self._cache_dir)  # footer checks passed in earlier processes (footer.py)
        plan = dataset.optimized_plan()
        # what the first batches would refuse (stack names, ragged lists, nulls) fails here:
        # from the schema and footers before reading, from the random-access table once built
        checked = options.transform is None  # a transform reshapes batches: per-batch checks only
        if checked:
            preflight.check_plan(plan.schema, plan, self._convert, options.stack)
        kind, source = self._build_source(dataset, plan)
        versions = [v for s in scans(plan) for v in getattr(s.source, "footer_versions", list)()]
        keep_checks(self._cache_dir, versions)
        if self._cache_dir != default_cache_dir():
            # also where a dataset looks when it opens (before any loader names its cache
            # dir): a later process then reads no footer twice there either
            keep_checks(default_cache_dir(), versions)
        widths = None
        if checked:
            known = preflight.check_source(source, self._convert)
            lists = preflight.unpadded_lists(plan.schema, self._convert)
            if lists and options.output != "arrow":
                widths = preflight.ListWidths(lists, known)
        return _Binding(dataset, plan, plan_fingerprint(dataset.plan, data=False), kind, source, widths)

    def _adopt(self, bound: _Binding) -> None:
        old = getattr(self, "_source", None)
        self._dataset, self._plan, self._logical_key = bound.dataset, bound.plan, bound.logical_key
        self.shuffle_kind, self._source, self._widths = bound.shuffle_kind, bound.source, bound.widths
        self._shape = None
        if hasattr(self, "_output"):
            self._output.widths = bound.widths
        close = getattr(old, "close", None)
        if old is not None and old is not bound.source and close is not None:
            close()

    # -- random-access layer -------------------------------------------------
    def _needs_table(self) -> bool:
        return not _one_scan(self._plan)

    def _shuffle_kind(self, plan) -> ShuffleKind:
        if self.options.auto_shuffle:  # shuffle=True / "auto": the best kind the source allows
            local = all(s.source.is_local for s in scans(plan))
            return ShuffleKind.GLOBAL if (local or not _one_scan(plan)) else ShuffleKind.BLOCK
        return ShuffleKind(self.options.shuffle)

    def _build_source(self, dataset, plan) -> tuple[ShuffleKind, ScanRowSource | TableRowSource]:
        opts = self.options
        needs_table = not _one_scan(plan)
        kind = self._shuffle_kind(plan)
        budget = opts.memory_budget if opts.memory_budget is not None else _total_memory() // 4
        reuse = all(not isinstance(n, Map) or bool(n.name) for n in walk(plan))
        given = self._sources(dataset, plan, kind) if self._sources is not None else None
        if given is not None:
            return kind, given
        if kind is ShuffleKind.GLOBAL or needs_table:
            src = materialize(plan, dataset.options, memory_budget=budget,
                              cache_dir=self._cache_dir, reuse=reuse,
                              stack=opts.stack if opts.output != "arrow" and opts.transform is None else None,
                              remote=self._remote, stream=functools.partial(_stream_allowed, prefetch=opts.prefetch))
        else:
            src = ScanRowSource(plan, dataset.options, self._cache_dir, self.max_readers, self._remote)
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
        return EpochOrder(tuple(self._source.counts), self.shuffle_kind.value, self.options.seed, epoch,
                          self.options.shuffle_window)

    def _rank_rows(self) -> tuple[int, int]:
        """This rank's positions in a fresh epoch's sequence, trimmed for drop_last."""
        start, stop = rank_range(self.num_rows, self.rank, self.world_size)
        if self.options.drop_last:
            stop = start + (stop - start) // self.options.batch_size * self.options.batch_size
        return start, stop

    def _rest(self, segments: tuple, position: int) -> Ranges:
        """The positions this rank reads in an epoch laid out after ``segments`` (a fresh
        epoch: none), from ``position`` rows into its lane (``order.elastic``)."""
        o = self.options
        if not segments:  # a fresh epoch's lane: one range
            start, stop = self._rank_rows()
            begin = min(start + position, stop)
            return ((begin, stop),) if begin < stop else ()
        return resume_ranges(self.num_rows, segments, self.world_size, self.rank, position,
                             o.batch_size, o.drop_last)

    def __len__(self) -> int:
        start, stop = rank_range(self.num_rows, self.rank, self.world_size)
        return num_batches(stop - start, self.options.batch_size, self.options.drop_last)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch the next iteration runs (each epoch has its own order). Setting the
        epoch a loaded state was taken in keeps that state's position."""
        epoch = _arguments.integer("epoch", epoch, low=0, what="an integer >= 0")
        if epoch != self.epoch:
            end_iterations(self._active, ENDED_BY_EPOCH)  # (its batches would move the new position)
            self.epoch = epoch
            self._start = 0
            self._position = 0
            self._batches_done = 0
            self._segments = self._next_segments = ()
            self._dl_base = (0, ())
        post(self)

    # -- wiring the stages -------------------------------------------------------------
    def _source_shape(self) -> SourceShape:
        """The source as the task planner sees it (footer-known bytes per unit, once)."""
        if self._shape is None:
            src = self._source
            counts = tuple(src.counts)
            if isinstance(src, TableRowSource):
                self._shape = SourceShape(counts, table=True, row_bytes=src.row_bytes)
            else:
                self._shape = SourceShape(counts, unit_bytes=tuple(src.est_bytes(u) for u in range(len(counts))),
                                          read_bytes=tuple(src.read_bytes(u) for u in range(len(counts))))
        return self._shape

    def _stages(self, order: EpochOrder, ranges: list[tuple[int, int]], stream: bool = True) -> Stages:
        opts = self.options
        conv = self._chunks
        shape = self._source_shape()
        if order.kind == ShuffleKind.BLOCK.value and isinstance(self._source, ScanRowSource):
            self._source.polars_windows = self._polars_windows()
            if self._source.polars_windows:  # a few units decoded at once beside the window
                shape = dataclasses.replace(shape, units_at_once=window_step())
        query = self._stream_query(order, ranges) if stream else None
        # read through one polars query, tasks only take rows from it: small units (small
        # files, tiny row groups) are taken in runs, not a task each. Per unit, each stays a
        # task of its own: a run would read its units one after another on one thread (an
        # object store's latency no longer hidden by reads side by side)
        tasks = plan_tasks(order, ranges, shape, opts.batch_size, opts.prefetch,
                           run_rows=RUN_ROWS if query is not None else 0)
        stage = self._device_stage
        whole = stage is not None and stage.chunks and conv is not None  # whole reads to the device
        if whole:  # stack= groups of reads stacked on the device, not on the host
            conv = DeviceReads(conv)
        read = functools.partial(self._source.read, order=order, conv=conv)
        held, close, readers = 0, None, None
        if query is not None:  # one polars query per range; the tasks take their rows from it
            reads = StreamReads(query, self._source, order, ranges, conv, self._source.reader.count_decoded,
                                wait_import=bool(stream_setting()))
            read, close = reads.read, reads.close
            held = query.held_bytes(max(shape.unit_bytes, default=0))
            if opts.io_threads is None:
                # the tasks take their rows one at a time while polars decodes on every core:
                # a second reader only converts beside them, competing with polars' pool for
                # the cores and with the first reader for the GIL (W2 epoch, 7 fresh
                # processes: 0.241 s with two readers, 0.219 s with one; W1 equal, less CPU)
                readers = STREAM_READERS
        combine, place = (conv.combine if conv is not None else concat_arrow), None
        if whole:
            table = (self._table_in_memory() if order.kind == ShuffleKind.NONE.value and pin_tables_setting()
                     else None)
            if table is not None:
                stage.pin(table)  # read in place: its pages locked, no host copy
            combine, place = functools.partial(stage.combine, host=conv.combine), stage.place
        return Stages(tasks=tasks, read=read, combine=combine, place=place,
                      device=stage.counts if place is not None else None,
                      finish=self._output,
                      transform=self._transform_stage(),
                      deliver=self._device_stage.ready if self._device_stage is not None else None,
                      decoded=self._decoded_by, held=held, close=close, readers=readers)

    def _table_in_memory(self):
        """The in-memory Arrow table this loader's reads are slices of (a dataset made from a
        table, unshuffled), or None."""
        src = self._source
        if isinstance(src, TableRowSource):
            return src.table if src.where == "memory" else None
        inner = getattr(src, "source", None)
        return inner.arrow_table() if getattr(inner, "kind", None) == "memory" else None

    def _stream_query(self, order: EpochOrder, ranges: list[tuple[int, int]]):
        """The polars stream an unshuffled epoch over a scan reads from (``scan/stream.py``),
        or None: shuffled, a table, not eligible, or not allowed by ``_stream_allowed`` (the
        epoch's ranges read, the unit reader's choice of polars). Forced on, the stream's
        read-ahead is counted even where it exceeds ``prefetch``."""
        src = self._source
        if order.kind != ShuffleKind.NONE.value or not isinstance(src, ScanRowSource):
            return None
        if stream_setting() is False or forked_with_polars():
            return None  # forced off (not even compiled), or polars' pool lost in a fork
        query = src.stream_query()
        if query is None:
            return None
        shape = self._source_shape()

        def read() -> int:
            return sum(shape.read_bytes[u] * (hi - lo) // max(1, shape.counts[u])
                       for a, b in ranges for u, lo, hi in order.unit_pieces(a, b))

        chosen = query.predicate is not None and src.reader.decoder == "polars"
        allowed = _stream_allowed(query, max(shape.unit_bytes, default=0), read, prefetch=self.options.prefetch,
                                  polars_chosen=chosen,
                                  units=lambda: sum(len(order.unit_pieces(a, b)) for a, b in ranges))
        return query if allowed else None

    def _polars_windows(self) -> bool:
        """Whether a block epoch's windows may be read by polars (``rowsource._window_tables``):
        by the rule for any polars read of the scan (``_stream_allowed``: polars imported,
        or an epoch long enough to pay its import), over the epoch's footer-known bytes."""
        src = self._source
        if not isinstance(src, ScanRowSource):
            return False
        query = src.stream_query()
        if query is None:
            return False
        shape = self._source_shape()
        return _stream_allowed(query, max(shape.unit_bytes, default=0), lambda: sum(shape.read_bytes),
                               prefetch=self.options.prefetch)

    def _decoded_by(self) -> dict[str, int]:
        reader = getattr(self._source, "reader", None)
        return reader.decoded_counts() if reader is not None else {}

    def _transform_stage(self):
        """``transform=`` on the producer thread, or as Ray tasks (``executor="ray"``)."""
        fn = self.options.transform
        if fn is None:
            return None
        if self._remote is not None:
            return self._remote.transforms(fn)
        return functools.partial(_transformed, fn)

    def _iterate(self, ranges: list[tuple[int, int]], track: bool) -> EpochIterator:
        settings = Settings(batch_size=self.options.batch_size, prefetch=self.options.prefetch,
                            max_readers=self.max_readers, share_units=len(ranges) > 1)
        # a DataLoader worker's ranges are single batches: a query each would cost more than it saves
        it = EpochIterator(self._stages(self._order(self.epoch), ranges, stream=track), settings,
                           on_batch=self._advance if track else None)
        if track:
            self._stats = it.stats
        self._active.add(it)
        return it

    # -- iteration -----------------------------------------------------------------
    def __iter__(self) -> EpochIterator:
        recording = getattr(self, "_profiling", None)
        if recording is not None:  # inside loader.profiling(): the iteration is timed
            return recording._wrap(self._iter_epoch)
        return self._iter_epoch()

    def _iter_epoch(self) -> EpochIterator:
        if self._closed:
            raise LoaderClosedError("this loader is closed; build a new one with Dataset.loader()")
        end_iterations(self._active, ENDED_BY_ITER)
        # a loaded state applies to this iteration; the next one starts the epoch afresh
        self._segments, self._next_segments = self._next_segments, ()
        self._position = min(self._start, self._lane_rows(self._segments))
        ranges = self._rest(self._segments, self._position)
        self._batches_done = batches_for(self._position, self.options.batch_size)
        self._start = 0
        # a DataLoader without workers iterates this loader itself: its batches count from here
        self._dl_base = (self._position, self._segments)
        return self._iterate(list(ranges), track=True)

    def _lane_rows(self, segments: tuple) -> int:
        """Rows of this rank's lane in the epoch laid out after ``segments``."""
        o = self.options
        if not segments:
            start, stop = self._rank_rows()
            return stop - start
        free = sum(b - a for a, b in free_ranges(self.num_rows, segments, o.batch_size, o.drop_last))
        return lane_rows(free, self.world_size, o.batch_size, o.drop_last)

    def _drop_resume(self) -> None:
        """In a DataLoader worker's copy: the loaded position was used by an earlier pass."""
        self._start, self._next_segments = 0, ()

    def _worker_iter(self, worker: int, workers: int) -> EpochIterator:
        """Batches ``worker, worker + workers, ...`` of this epoch (for torch DataLoader workers)."""
        b = self.options.batch_size
        rest = self._rest(self._next_segments, self._start)  # a loaded resume position applies here too
        n = sum(q - p for p, q in rest)
        ranges = [r for p in range(worker * b, n, workers * b) for r in take(rest, p, min(n, p + b))]
        return self._iterate(ranges, track=False)

    def _advance(self, rows: int) -> None:
        self._position += rows
        self._batches_done += 1

    # -- state -------------------------------------------------------------------
    def _identity(self, version: int = STATE_VERSION) -> dict:
        return {
            "snapshot": self._dataset.snapshot_id if version >= 3 else self._source_snapshot(),
            **self._setup(self._logical_key, self.shuffle_kind),
            "num_rows": self.num_rows,
        }

    def _setup(self, plan_key: str, kind: ShuffleKind) -> dict:
        """The identity fields that name the plan and the loader's setup (not the data; the
        rank and world of per-rank states of versions 1 to 3 included)."""
        return {
            "plan": plan_key,
            "seed": self.options.seed,
            "shuffle": kind.value,
            "window": self.options.shuffle_window if kind is ShuffleKind.BLOCK else None,
            "batch_size": self.options.batch_size,
            "drop_last": self.options.drop_last,
            "world_size": self.world_size,
            "rank": self.rank,
        }

    def _source_snapshot(self) -> str:
        """The data's identity as states of versions 1 and 2 name it."""
        return "+".join(s.source.fingerprint() for s in scans(self._dataset.plan)) or "sql"

    @property
    def snapshot_id(self) -> str:
        """The snapshot this loader reads: its dataset's, or, after ``load_state_dict`` of a
        state taken on other files of the same folder, the state's."""
        return self._dataset.snapshot_id

    def state_dict(self, *, dataloader_batches: int | None = None) -> dict:
        """Small JSON-serializable state, **the same on every rank** that yielded the same
        number of batches of the epoch (lockstep training): the epoch, the rows each rank
        yielded in it at this world size, the world sizes and positions of the epoch's
        earlier elastic segments, and what it was taken on (the snapshot id and, per source,
        what reopens that snapshot: for files the compact file list; the plan fingerprint,
        seed, shuffle). No rank, no pickles: save it from any rank, load it on every rank, at
        any world size. See ``formats/loader_state/v4/spec.md``.

        ``dataloader_batches=k``: the state after the first ``k`` batches a ``DataLoader``
        over :meth:`torch_dataset` gave in this epoch. Its workers read in other processes,
        so their batches do not move this loader: pass the batches your loop took from the
        DataLoader since it started the epoch (from the loaded state, where one was)."""
        sources = [s.source.state_snapshot() for s in scans(self._dataset.plan)]
        if dataloader_batches is None:
            at = Position(self.epoch, self._position, self._batches_done, self._segments)
        else:
            at = self._after_dataloader(dataloader_batches)
        return make_state(self._identity(), self.world_size, at, sources)

    def _after_dataloader(self, k: int) -> Position:
        """The position after ``k`` batches of the DataLoader iteration ``_worker_iter``
        lays out (from the loaded position, batch by batch of the rest of the lane)."""
        b = self.options.batch_size
        base, segments = self._dl_base
        if self._board is not None and self._board.afresh() == self._loads:
            base, segments = 0, ()  # a DataLoader pass after the resumed one started the epoch afresh
        start = min(base, self._lane_rows(segments))
        n = sum(q - p for p, q in self._rest(segments, start))
        k = _arguments.integer("dataloader_batches", k, low=0, high=-(-n // b),
                               what=f"the batches taken from the DataLoader this epoch (0 .. {-(-n // b)})")
        position = start + min(k * b, n)
        return Position(self.epoch, position, batches_for(position, b), segments)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume: the next iteration yields exactly the batches after ``state``'s position
        in its epoch. Every field is checked (type, range, position on a batch boundary of
        the lanes); a state taken with another plan or another setup is refused with
        ``StateMismatchError`` saying what differs.

        Elastic: a state (version 4, what ``state_dict`` writes) loads on every rank at any
        world size. At the world size it was taken at, each rank continues its lane: exactly
        the rest of the uninterrupted epoch. At another, the rows no rank has yielded yet in
        this epoch are laid out for the new world (``order.elastic``): each rank gets the same
        number of them, each row once; fewer than ``world_size`` rows (plus, with
        ``drop_last``, a short last batch per rank) are left out, as in any epoch. The
        iteration after that one, and ``set_epoch``, start epochs laid out for this world.
        Per-rank states of versions 1 to 3 load only on the rank and world size they name.

        A state holds its snapshot. Where this loader's dataset now lists other files than
        the state was taken on (files appended to the folder since, even ones a filter drops),
        the loader switches to the state's files: each must be there and unchanged (size,
        modification time, identity), else ``SnapshotChangedError`` names it. The loader then
        stays on that snapshot, for this epoch and the next ones (``set_epoch``), until a new
        loader is built; ``snapshot_id`` says which it reads. States of versions 1 and 2 hold
        no file list and resume only on the data they were taken on."""
        version = state_version(state)
        if version >= 3 and not self._reads_as(state):
            self._go_to_snapshot(state, version)
        at = read_state(state, self._identity(version), self.world_size, self.rank)
        if self.options.sharding is not None and at.segments:
            # an elastic resume lays out the rest of the epoch anew: its last batch, checked
            # as the built loader's was (jax refused it mid-epoch)
            b = self.options.batch_size
            rest = sum(q - p for p, q in self._rest(at.segments, min(at.position, self._lane_rows(at.segments))))
            check_sharding(self.options.sharding, [b] + ([rest % b or b] if rest else []))
        end_iterations(self._active, ENDED_BY_LOAD)  # (its batches would move the loaded position)
        self.epoch = at.epoch
        self._start = at.position
        self._dl_base = (at.position, at.segments)
        self._position = at.position
        self._batches_done = at.batches
        self._segments = self._next_segments = at.segments
        self._loads += 1
        post(self)

    def _reads_as(self, state: Mapping[str, Any]) -> bool:
        """Whether this loader reads the snapshot of ``state`` (version 3 and later) as the
        state's loader read it."""
        if state["snapshot"] != self._dataset.snapshot_id:
            return False
        found = scans(self._dataset.plan)
        sources = state.get("sources")
        return not isinstance(sources, list) or len(sources) != len(found) or all(
            not isinstance(doc, Mapping) or s.source.reads_as(doc) for s, doc in zip(found, sources))

    def _go_to_snapshot(self, state: Mapping[str, Any], version: int) -> None:
        """Rebind this loader to the snapshot of ``state`` (checked first: the plan and
        setup must be the state's, every file of it unchanged)."""
        origin = self._origin
        found = scans(origin.plan)
        sources = state["sources"]
        if len(sources) != len(found):
            raise StateMismatchError(f"sources: the state names {len(sources)} source(s), this loader reads "
                                     f"{len(found)}; build the loader over the same datasets")
        try:
            plan = with_sources(origin.plan, lambda i, src: src.at_snapshot(sources[i]))
        except LookupError as exc:
            raise StateMismatchError(f"snapshot: the data is not the data the state was taken on, and this "
                                     f"loader cannot go back to it: {exc.args[0] if exc.args else exc}. Build "
                                     "the loader over the data the state was taken on, or start without "
                                     "the state") from None
        dataset = origin._with(plan)
        check_identity(state, self._setup(plan_fingerprint(plan, data=False),
                                          self._shuffle_kind(dataset.optimized_plan())),
                       [k for k in identity_keys(version) if k not in DATA])
        end_iterations(self._active, ENDED_BY_LOAD)
        # fill_null / pad_lists entries naming columns added to the data after the state's
        # snapshot have nothing to fill there: left out while the loader reads that snapshot
        previous = self._convert
        self._use_convert(restricted(self._convert_given, dataset.schema.names))
        try:
            bound = self._bind(dataset)
        except ColumnNotFoundError as exc:
            self._use_convert(previous)
            raise StateMismatchError(f"snapshot: the state's data has no column the loader's options name "
                                     f"({exc}); it was added since. Build the loader without naming it "
                                     "to resume the state") from None
        except BaseException:
            self._use_convert(previous)
            raise
        self._adopt(bound)

    def _use_convert(self, conv) -> None:
        """Convert batches by ``conv`` from now on (what a rebind to another snapshot needs)."""
        if conv is self._convert:
            return
        self._convert = conv
        self._output.convert = conv
        if self._chunks is not None:
            self._chunks = ChunkConverter(conv, self.options.stack, self._pool)

    # -- introspection -------------------------------------------------------------
    def stats(self) -> LoaderStats:
        """Counters of the current (or last) iteration."""
        return dataclasses.replace(self._stats)

    def explain(self) -> str:
        return self._dataset.explain() + "\n\n" + self._describe()

    def _describe(self) -> str:
        from ..display import loader_epoch_text, loader_layout
        from ..tables import fmt_count
        o = self.options
        window = f", window {fmt_count(o.shuffle_window, 'unit')}" if self.shuffle_kind is ShuffleKind.BLOCK else ""
        resumed = " (a loaded state's files)" if self._dataset is not self._origin else ""
        layout = [k.text() for k in loader_layout(self)] or ["(unknown until the first batch)"]
        lines = [
            "== loader ==",
            f"  shuffle      {self.shuffle_kind}{window} (seed {o.seed}, epoch {self.epoch})",
            f"  rows         {self.num_rows:,} selected; rank {self.rank} of {self.world_size}",
            f"  batches      {len(self):,} of {o.batch_size:,} rows (drop_last={o.drop_last})",
            f"  layout       {layout[0]}",
            *(f"               {t}" for t in layout[1:]),
            f"  epoch        {loader_epoch_text(self)}",
            *self._elastic_lines(),
            f"  source       {self.source_kind}, {fmt_count(len(self._source.counts), 'unit')}",
            f"  snapshot     {self.snapshot_id}{resumed}",
            f"  output       {o.output} (device {o.device})",
            *([f"  to device    {self._device_stage.describe()}"] if self._device_stage is not None else []),
            f"  executor     {o.executor}" + (f" ({self._remote.cpus} Ray CPUs: unit reads, maps and "
                                               "transform= as Ray tasks)" if self._remote is not None else ""),
            f"  prefetch     {_fmt_bytes(o.prefetch)} budget, {self.readers_text()}",
        ]
        stats = self._stats
        if stats.batches:
            lines.append(f"  last run     {stats.rows:,} rows in {stats.wall_s:.3f}s, consumer waited "
                         f"{stats.wait_s:.3f}s; {stats.settings_text()}")
            lines.append(f"  cpu          {stats.cpu_text()}")
        return "\n".join(lines)

    def _elastic_lines(self) -> list[str]:
        if not self._segments:
            return []
        before = "; then ".join(f"{g.world_size} ranks x {g.position} rows" for g in self._segments)
        return [f"  elastic      this epoch resumed after {before}: rank {self.rank} reads "
                f"{self._lane_rows(self._segments)} of the rows left"]

    def readers_text(self) -> str:
        """How the reader threads are sized, in words."""
        if self.options.io_threads is None:
            return (f"reader threads autotuned, at most {self.max_readers} (the cores this process may "
                    "run on; io_threads= sets the bound)")
        return f"reader threads autotuned, at most io_threads={self.max_readers}"

    def __repr__(self) -> str:
        from ..display import loader_text
        return loader_text(self, (
            f"arrowload.Loader(batch_size={self.options.batch_size}, shuffle={self.shuffle_kind.value!r}, "
            f"rank={self.rank}/{self.world_size}, rows={self.num_rows:_}, batches={len(self):_}, "
            f"output={self.options.output!r}, source={self.source_kind})"))

    def _repr_html_(self) -> str:
        from ..display import loader_html
        return loader_html(self)

    def profile(self, n_batches: int | None = None, *, step_fn=None):
        """Run ``n_batches`` batches (default: the whole epoch) and return a
        :class:`~arrowload.pipeline.profile.Profile`: a verdict naming the bottleneck and
        the setting to change, each thread group's share of the wall (adding up to 100%),
        the CPU the process and your step used, rows/s over time, the batch layout and
        ``.plot()`` (matplotlib). Without ``step_fn`` the consumer is infinitely fast (the
        loader's ceiling); with ``step_fn(batch)`` it is your step, timed. The loader's
        position is the same afterwards. To profile the real loop instead, see
        :meth:`profiling`."""
        from .profile import profile
        return profile(self, n_batches, step_fn=step_fn)

    def profiling(self):
        """A context that records the first iteration of this loader started in it (the
        training loop as it runs; its body is the step): ``with loader.profiling() as run:
        for batch in loader: step(batch)``, then ``run.profile``. Batches, order and state
        are those of a plain iteration."""
        from .profile import Profiling
        return Profiling(self)

    def progress(self, desc: str | None = None, *, enabled: bool | None = None):
        """Iterate this epoch under a progress bar (tqdm; shown where ``al.set_progress``
        allows, or always with ``enabled=True``): ``for batch in loader.progress(): ...``.
        The batches and the resume state are exactly those of ``iter(loader)``."""
        from ..progress import track_loader
        return track_loader(self, desc, enabled=enabled)

    # -- lifecycle -----------------------------------------------------------------
    def close(self) -> None:
        """Stop every thread this loader started. Idempotent."""
        end_iterations(self._active, ENDED_BY_CLOSE)
        close = getattr(self._source, "close", None)
        if close is not None:  # the files a scan's decoders hold open
            close()
        if self._device_stage is not None:
            self._device_stage.close()
        self._closed = True

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_active"] = None
        state["_profiling"] = None
        state["_sources"] = None
        state["_board"] = shared(self._board)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._active = weakref.WeakSet()

    # -- torch ---------------------------------------------------------------------
    def torch_dataset(self):
        """This loader as a ``torch.utils.data.IterableDataset`` yielding whole batches, for
        code that insists on ``DataLoader(ds, batch_size=None, num_workers=n)``. Each worker
        produces batches ``w, w+n, ...`` of the epoch, so rows are never duplicated and the
        DataLoader's round-robin gives back the loader's own order. Workers kept from one
        epoch to the next (``persistent_workers=True``) follow ``set_epoch``; a state loaded
        after they started is refused there (build the DataLoader after it)."""
        return torch_batches(self)
