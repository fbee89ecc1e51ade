"""The mixture's loader: each component read in its own order, drawn into batches at set
proportions, with the Loader's stages (reader threads, byte budget, conversion, devices).

Each component is bound as a :class:`~arrowload.pipeline.loader.Loader` binds a dataset
(exact counts, the shuffle kind its source allows, the random-access table for global
shuffle); its rows are read in passes, pass ``p`` of epoch ``e`` in the order
``ComponentOrder(counts, kind, component_key(seed, name), derive_key(e, p), ...)``: an
``EpochOrder`` whose block shuffle visits units in one order for every component
(``units_key(seed, e, p)``), so components over one lake share their decodes
(``mixture.shared``: each unit decoded once for all of them). The mixture's
block stream (``order.mixture.Schedule``) says which rows of each component every batch
holds; this rank reads the blocks ``order.mixture.rank_blocks`` deals it. A read (a
:class:`MixTask`) covers a few consecutive batches of this rank: per component the stream
positions they take, read through the component's row source (gathers of its table, units
or windows of its scan) -- or, unshuffled over one lake, taken from one polars query over the
union of the components (``mixture.stream``) -- then one ``take`` puts every batch's rows in
its interleaved order.

The state (``formats/mixture_state/v1``) is positions only: the epoch, the blocks every rank
consumed together, the epoch's phases (weights, and each component's rows drawn where a
phase starts) and what it was taken on. It loads at any world size: the remaining blocks
are dealt round-robin to the new ranks, each read once.
"""

from __future__ import annotations

import dataclasses
import functools
import time
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from ..convert.batches import concat_arrow
from ..errors import InvalidArgumentError, LoaderClosedError, StateMismatchError, UnsupportedError
from ..order import EpochOrder, ShuffleKind, TaskKind, derive_key, plan_tasks
from ..order.mixture import (MIXTURE_ORDER_SINCE, MIXTURE_ORDER_VERSION, ComponentOrder, Phase, Schedule,
                             component_key, rank_blocks, units_key)
from ..order.tasks import READ_SHARE, read_rows
from ..pipeline import arguments as _arguments
from ..plan.rowselect import take_rows
from ..convert.host import array_valued
from ..pipeline.board import Board, post, shared, torch_batches
from ..pipeline.chunks import _varlist
from ..pipeline.loader import STREAM_READERS, Loader, rank_and_world
from ..pipeline.rowsource import _parts, slice_parts
from ..pipeline.stages import (ENDED_BY_CLOSE, ENDED_BY_EPOCH, ENDED_BY_ITER, ENDED_BY_LOAD, EpochIterator, Settings,
                               SharedCache, Stages, end_iterations)
from ..options import default_cache_dir
from ..pipeline.options import reader_bound
from . import weights as _weights
from .shared import SharedSources
from .stream import MixStream, gather, queue_cap, stream_span

STATE_FORMAT = "arrowload.mixture_state"
STATE_VERSION = 1
#: strided blocks further apart than this (world sizes above it) are located one by one
_STEP_LIMIT = 32
#: reads of a component's units / windows kept for the next tasks (per component)
_KEPT_READS = 4
#: passes of one component a read task may span at most (``MixtureLoader._blocks_per_task``)
TASK_PASSES = 64


@dataclasses.dataclass(frozen=True)
class MixTask:
    """A read of this rank's batches ``[first, stop)`` (indices into its blocks)."""

    rows: int
    est_bytes: int
    first: int
    stop: int
    read_bytes: int = 0
    kind: str = "mix"


class MixtureLoader:
    """Batches of a :class:`~arrowload.mixture.Mixture`: every batch holds the floor or the
    ceiling of ``weight x batch_size`` rows of each component; each component's rows come
    in its own order and never repeat within one of its passes; ranks disjoint with equal
    batch counts; ``state_dict`` / ``load_state_dict`` resume exactly (same world size) or
    elastically (another), and ``load_state_dict(state, weights=...)`` continues with other
    weights without repeating a row of any component's current pass.

    Ranks: the epoch's batches (blocks) are dealt round-robin -- rank ``r`` of ``W`` takes
    blocks ``r, r + W, ...`` -- so a global step is ``W`` consecutive blocks and holds the
    proportions too. With a streaming (block / none) component, every rank reads each of
    its windows and keeps its share: global shuffle (local or cached sources, the default
    of ``shuffle=True`` there) reads no more than a rank needs.
    """

    def __init__(self, mixture, options, steps: int | None) -> None:
        self.mixture = mixture
        self.options = options
        self.rank, self.world_size = rank_and_world(options.rank, options.world_size)
        if steps is not None:
            steps = _arguments.integer("steps", steps, low=1, what="None or an integer >= 1 (batches per rank "
                                       "per epoch)", example="1000")
            if mixture.stopping != "cycle":
                raise InvalidArgumentError(f"steps= sets the epoch of a stopping='cycle' mixture; this one stops "
                                           f"at {mixture.stopping!r}: leave steps out", "steps")
        self.steps = steps
        sub = dataclasses.replace(options, rank=0, world_size=1)
        # components over one lake decode each unit once for all of them (mixture.shared)
        self._shared = SharedSources(mixture.datasets, sub, options.cache_dir or default_cache_dir(),
                                     reader_bound(options.io_threads))
        self._components = [Loader(ds, sub, sources=functools.partial(self._shared.source, c))
                            for c, ds in enumerate(mixture.datasets)]
        self.sizes = tuple(c.num_rows for c in self._components)
        mixture._sizes = self.sizes
        self.weights = mixture.weights
        _weights.refuse_empty(mixture.names, self.sizes, self.weights)
        first = self._components[0]
        self._output, self._chunks = first._output, first._chunks
        self._device_stage = first._device_stage
        self._transform = first._transform_stage()
        self.max_readers = max(c.max_readers for c in self._components)
        self._shapes = [c._source_shape() for c in self._components]
        self.epoch = 0
        self._lay_out()
        self._start = 0
        #: where ``state_dict(dataloader_batches=k)`` counts from: the loaded position, or
        #: where the last in-process pass began (a DataLoader without workers)
        self._dl_start = 0
        self._position = 0
        self._batches_done = 0
        self._loaded = False
        self._closed = False
        self._active: weakref.WeakSet = weakref.WeakSet()
        self._orders: dict = {}
        self._stream: MixStream | None = None  # the current iteration's (mixture.stream)
        #: the epoch DataLoader workers follow (``torch_dataset``), and the states loaded here
        self._board: Board | None = None
        self._loads = 0
        #: reads convert to host arrays on the reader threads where every column has them
        #: (decided from the schema: finding out from a read would read its task twice)
        self._host_ok = self._chunks is not None and all(
            array_valued(f.type) and not _varlist(f.type) for f in mixture.schema)

    # -- the epoch's block stream ------------------------------------------------------
    def _lay_out(self) -> None:
        """The epoch laid out afresh: one phase at the mixture's weights, its blocks."""
        self._phases = self._fresh_phases()
        self._blocks = self._epoch_blocks(self._schedule())

    def _fresh_phases(self) -> tuple[Phase, ...]:
        return (Phase(0, tuple(self.weights), (0,) * len(self.sizes)),)

    def _schedule(self, phases: tuple[Phase, ...] | None = None) -> Schedule:
        return Schedule(self.sizes, phases or self._phases, self.options.batch_size, self.options.seed, self.epoch,
                        self.mixture.stopping)

    def _epoch_blocks(self, sched: Schedule) -> int | None:
        if self.mixture.stopping == "cycle":
            return None if self.steps is None else self.steps * self.world_size
        return sched.num_blocks

    def __len__(self) -> int:
        """Batches of a fresh epoch for this rank."""
        if self._blocks is None:
            raise UnsupportedError("a stopping='cycle' mixture loader without steps= never ends: it has no "
                                   "length; pass steps=N (batches per rank per epoch)")
        return self._blocks // self.world_size

    @property
    def num_rows(self) -> int | None:
        """Rows one epoch draws on all ranks (None: endless)."""
        return None if self._blocks is None else self._blocks // self.world_size * self.world_size * \
            self.options.batch_size

    def set_epoch(self, epoch: int) -> None:
        epoch = _arguments.integer("epoch", epoch, low=0, what="an integer >= 0")
        if epoch != self.epoch:
            end_iterations(self._active, ENDED_BY_EPOCH)  # (its batches would move the new position)
            self.epoch = epoch
            self._lay_out()
            self._start = self._position = self._batches_done = 0
            self._dl_start = 0
            self._loaded = False
        post(self)

    def _order(self, c: int, p: int) -> EpochOrder:
        key = (c, self.epoch, p)
        found = self._orders.get(key)
        if found is None:
            comp = self._components[c]
            src = comp._source
            scan = getattr(src, "scan", None)  # a lake's row groups: numbered in their source
            found = ComponentOrder(tuple(src.counts), comp.shuffle_kind.value,
                                   component_key(self.options.seed, self.mixture.names[c]),
                                   derive_key(self.epoch, p), self.options.shuffle_window,
                                   units=tuple(src.units) if scan is not None else (),
                                   space=len(scan.source.units()) if scan is not None else 0,
                                   units_key=units_key(self.options.seed, self.epoch, p))
            if len(self._orders) > 4 * len(self.sizes):
                self._orders.pop(next(iter(self._orders)))
            self._orders[key] = found
        return found

    # -- iteration ---------------------------------------------------------------------
    def __iter__(self):
        recording = self._profiling
        if recording is not None:  # inside loader.profiling(): the iteration is timed
            return recording._wrap(self._iter_epoch)
        return self._iter_epoch()

    def _iter_epoch(self):
        if self._closed:
            raise LoaderClosedError("this loader is closed; build a new one with Mixture.loader()")
        end_iterations(self._active, ENDED_BY_ITER)
        if not self._loaded:
            self._lay_out()
        self._loaded = False
        position, self._start = self._start, 0
        self._position = self._dl_start = position
        self._batches_done = 0
        return self._iterate(rank_blocks(position, self._blocks, self.world_size, self.rank), self._advance)

    def _drop_resume(self) -> None:
        """In a DataLoader worker's copy: the loaded position was used by an earlier pass."""
        self._start, self._loaded = 0, False

    def _worker_iter(self, worker: int, workers: int):
        """Batches ``worker, worker + workers, ...`` of this rank's rest of the epoch (torch
        DataLoader workers, ``torch_dataset``); the loader's position stays."""
        if not self._loaded:
            self._lay_out()
        blocks = rank_blocks(self._start, self._blocks, self.world_size, self.rank)
        return self._iterate(blocks[worker::workers], lambda rows: None)

    def torch_dataset(self):
        """This loader as a ``torch.utils.data.IterableDataset`` of whole batches, as
        ``Loader.torch_dataset``: ``DataLoader(ds, batch_size=None, num_workers=n)`` gives
        the loader's batches in its order, each worker making every n-th; spawned workers
        build the loader again from the mixture (component sizes from the selection cache)."""
        return torch_batches(self)

    def __reduce__(self):
        """A copy for another process (a spawned DataLoader worker): the loader built again
        from the mixture and options, at this loader's epoch, phases and position."""
        at = {"epoch": self.epoch, "phases": self._phases, "blocks": self._blocks, "start": self._start,
              "loaded": self._loaded, "weights": self.weights, "loads": self._loads, "board": shared(self._board)}
        return _rebuilt, (self.mixture, self.options, self.steps, at)

    def _iterate(self, blocks: range, on_batch) -> EpochIterator:
        sched = self._schedule()
        o = self.options
        caches = [SharedCache(_KEPT_READS) for _ in self.sizes]
        self._shared.restart()
        self._allow_polars_decodes()
        stream, held = self._stream_of(sched, blocks)
        self._stream = stream
        stages = Stages(tasks=self._tasks(blocks), read=functools.partial(self._read, sched, blocks, caches,
                                                                          stream),
                        combine=self._chunks.combine if self._chunks is not None else concat_arrow,
                        finish=self._output, transform=self._transform,
                        deliver=self._device_stage.ready if self._device_stage is not None else None,
                        held=held, close=stream.close if stream is not None else None,
                        # as a single loader's stream (pipeline/loader.py STREAM_READERS)
                        readers=STREAM_READERS if stream is not None and o.io_threads is None else None)
        # the decoded-unit caches' (or the stream's queues') bytes are taken out of the
        # budget (stats() counts them)
        settings = Settings(batch_size=o.batch_size, prefetch=max(1, o.prefetch - self._shared.cache_bytes),
                            max_readers=self.max_readers)
        it = EpochIterator(stages, settings, on_batch=on_batch)
        self._stats = it.stats
        self._active.add(it)
        return it

    def _stream_of(self, sched: Schedule, blocks: range) -> tuple[MixStream | None, int]:
        """The epoch's rows from one polars query over the union of the components' reads
        (``mixture.stream``) and what polars holds ahead, or ``(None, 0)``: a component
        shuffled or not in the lake's one group, the union not streamable or not allowed by
        the loader's rule (``pipeline.loader._stream_allowed``), or queues over their bound."""
        from ..scan.stream import stream_setting
        m = len(self.sizes)
        if not blocks or stream_setting() is False or len(self._shared.members) != 1 or \
                sorted(self._shared.members[0]) != list(range(m)):
            return None, 0
        group = self._shared.groups[0]
        srcs = [comp._source for comp in self._components]
        if group is None or sorted(group.members) != list(range(m)) or any(
                comp.shuffle_kind is not ShuffleKind.NONE or src.kind != "scan" for comp, src in zip(self._components, srcs)):
            return None, 0
        query = group.union_stream()
        if query is None or not query.units or not self._union_allowed(query):
            return None, 0
        o = self.options
        shapes = self._shapes  # each source's footer-known bytes per unit (est_bytes, read_bytes)
        unit = max(max(s.unit_bytes, default=0) for s in shapes)
        last = blocks[-1] + 1
        i = sched.phase_index(blocks.start)
        if i + 1 < len(self._phases):
            return None, 0  # a phase starts inside the span: per unit
        phase, ap = self._phases[i], sched.apportions[i]
        cap = queue_cap(o.prefetch)
        # a queued row's bytes: a unit's decoded bytes over all its rows (the filter's rejects
        # too: the decode holds them)
        per_row = [sum(s.unit_bytes) / max(1, sum(u.num_rows if u.num_rows is not None else n
                                                  for u, n in zip(src.scan.selected_units(), src.counts)))
                   for s, src in zip(shapes, srcs)]
        stop = sched.stream_index(last)
        span = stream_span(tuple(u.index for u in query.units), [(src.units, src.counts) for src in srcs],
                           [max(1.0, b) for b in per_row], phase.start, phase.offsets, ap.q, o.batch_size, blocks.start, last,
                           sched.stream_index(blocks.start), stop)
        if span is None or span[2] > cap:
            return None, 0  # a second pass, or a lake whose order would queue too much (sorted)
        rows = span[0]
        last_unit = max(int(np.searchsorted(rows[1:, c], stop[c] - 1, side="right")) for c in range(m) if stop[c])
        from ..options import usable_cores
        held = query.held_bytes(unit)
        # at run time the queues may pass the estimate by a task's rows (a task fills each
        # component in turn) and a unit (a polars batch may span units)
        return MixStream(query, group, rows, stop, cap + o.prefetch // READ_SHARE + unit, usable_cores(), last_unit,
                         self._chunks if self._host_ok else None, wait_import=bool(stream_setting())), held

    def _union_allowed(self, query) -> bool:
        """Whether a group's union may be read through its polars ``query``: by the loader's
        rule (``pipeline.loader._stream_allowed``) over the components' footer-known bytes
        (the largest member's read: the union reads at least that)."""
        from ..pipeline.loader import _stream_allowed
        shapes = self._shapes
        unit = max(max(s.unit_bytes, default=0) for s in shapes)
        return _stream_allowed(query, unit, lambda: max(sum(s.read_bytes) for s in shapes),
                               prefetch=self.options.prefetch)

    def _allow_polars_decodes(self) -> None:
        """Whether each group's shared units may be decoded a few at once by polars
        (``Group.decode_many``) in this iteration: by the same rule as the union's stream."""
        for group in self._shared.groups:
            if group is not None:
                query = group.union_stream()
                group.polars_decodes = query is not None and self._union_allowed(query)

    def _advance(self, rows: int) -> None:
        self._position += self.world_size
        self._batches_done += 1

    def _row_bytes(self) -> float:
        out = []
        for s in self._shapes:
            if s.table:
                out.append(s.row_bytes)
            else:
                out.append(sum(s.unit_bytes) / max(1, sum(s.counts)))
        return max(1.0, float(np.dot(out, self.weights)))

    def _tasks(self, blocks: range) -> Iterator[MixTask]:
        b = self.options.batch_size
        row_bytes = self._row_bytes()
        per = min(max(1, read_rows(self.options.prefetch, row_bytes, b) // b), self._blocks_per_task())
        n = len(blocks)
        for i in range(0, n, per):
            j = min(n, i + per)
            yield MixTask(rows=(j - i) * b, est_bytes=max(1, int(3 * (j - i) * b * row_bytes)), first=i, stop=j)

    def _blocks_per_task(self) -> int:
        """The most blocks one read task may hold: a task reads each component's passes
        one by one (each its own order and reads), so a component much smaller than its
        share of a task (one row, drawn a few times a batch) would make the first batch,
        and every resume, wait for thousands of passes; at most ``TASK_PASSES`` of any
        component per task."""
        b = self.options.batch_size
        most = [max(w) for w in zip(*(p.weights for p in self._phases))]
        caps = [int(TASK_PASSES * n / (b * w)) for n, w in zip(self.sizes, most) if n and w > 0]
        return max(1, min(caps, default=1 << 62))

    def _locate(self, sched: Schedule, blocks: range) -> tuple[np.ndarray, np.ndarray]:
        """Stream index and rows of each component for each of ``blocks``."""
        if blocks.step <= _STEP_LIMIT:
            starts, counts = sched.blocks(blocks.start, blocks[-1] + 1)
            return starts[::blocks.step], counts[::blocks.step]
        parts = [sched.blocks(b, b + 1) for b in blocks]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def _by_pass(self, c: int, pieces: list[tuple[int, int]]) -> list[tuple[int, list]]:
        """Component ``c``'s stream indices ``pieces`` as ``(pass, position ranges in it)``."""
        n = self.sizes[c]
        by_pass: list[tuple[int, list]] = []
        for lo, hi in pieces:
            while lo < hi:
                p = lo // n
                end = min(hi, (p + 1) * n)
                if by_pass and by_pass[-1][0] == p:
                    ranges = by_pass[-1][1]
                    if ranges[-1][1] == lo - p * n:
                        ranges[-1] = (ranges[-1][0], end - p * n)
                    else:
                        ranges.append((lo - p * n, end - p * n))
                else:
                    by_pass.append((p, [(lo - p * n, end - p * n)]))
                lo = end
        return by_pass

    def _component_rows(self, c: int, pieces: list[tuple[int, int]], cache, map_units, conv=None,
                        wait=None) -> list:
        """Rows of component ``c`` at stream indices ``pieces`` (in order), as parts: host
        chunks converted by ``conv`` where its source can, else Arrow batches."""
        src = self._components[c]._source
        whole = conv is not None and src.kind == "scan"
        out = []
        for p, ranges in self._by_pass(c, pieces):
            order = self._order(c, p)
            get = functools.partial(_keyed, cache, p, wait=wait)
            for task in plan_tasks(order, ranges, self._shapes[c], self.options.batch_size, self.options.prefetch):
                if whole and task.kind == TaskKind.UNIT:
                    # a unit's rows converted once, whole, and kept for the next tasks (a task
                    # takes a component's rows for a few batches: a unit spans many tasks)
                    parts = get(("parts", task.unit), functools.partial(_converted, src, task.unit, conv))
                    out.extend(slice_parts(parts, task.lo, task.hi))
                    continue
                if whole and task.kind == TaskKind.WINDOW:
                    # a block window placed once in its shuffled order and kept for the next
                    # tasks: each takes its positions as a slice (the batch gather copies
                    # them), not a gather of a window laid out in source order
                    window = get(("placed", task.window), functools.partial(_placed, src, task.window, order, conv,
                                                                            map_units))
                    if window is not None:
                        out.append(window.slice(task.lo, task.hi - task.lo))
                        continue
                parts, _ = src.read(task, order, conv, cache=get, map_units=map_units)
                out.extend(parts)
        return out

    def _prewarm(self, pieces: list[list[tuple[int, int]]], map_units) -> None:
        """Decode the lake units that components read in source order (no shuffle) will take
        in this read, side by side on the reader threads (``map_units``), before the
        components take their rows one after the other (block-shuffle windows are read side
        by side already)."""
        if map_units is None:
            return
        wanted: dict[tuple[int, int], Any] = {}
        for c, comp in enumerate(self._components):
            g = self._shared.group_of.get(c)
            cache = self._shared.caches[g] if g is not None else None
            src = comp._source
            if cache is None or src.kind != "scan" or not pieces[c]:
                continue
            for p, ranges in self._by_pass(c, pieces[c]):
                order = self._order(c, p)
                if order.kind != ShuffleKind.NONE.value:
                    break
                for a, z in ranges:
                    for u, _, _ in order.unit_pieces(a, z):
                        wanted.setdefault((g, int(src.units[u])), cache)
        if len(wanted) > 1:
            map_units(lambda item: item[1].warm(item[0][1]), list(wanted.items()))

    def _read(self, sched: Schedule, blocks: range, caches: list, stream: MixStream | None, task: MixTask, *,
              cache=None, map_units=None) -> tuple[list, float]:
        mine = blocks[task.first:task.stop]
        starts, counts = self._locate(sched, mine)
        b = self.options.batch_size
        conv = self._chunks if self._host_ok else None
        # a reader waiting for a unit or window another task reads runs that task's sub-reads
        wait = getattr(getattr(map_units, "__self__", None), "wait", None)
        for cache in self._shared.caches:
            if cache is not None:
                cache.wait = wait
        pieces = [[(int(s), int(s + k)) for s, k in zip(starts[:, c], counts[:, c]) if k]
                  for c in range(len(self.sizes))]
        # every component a slice of one shared table (global shuffle over one lake): the
        # batch rows are gathered from it at once, straight into their places
        joint = self._shared.joint_table([c._source for c in self._components]) if conv is not None else None
        found: list[list] = []
        streamed = stream.take(task.first, task.stop, pieces, tuple(int(s) for s in starts[0])) \
            if stream is not None and len(starts) else None
        if joint is not None:
            sizes = [int(k) for k in counts.sum(axis=0)]
        elif streamed is not None:  # rows the stream's threads converted (mixture.stream.Rows)
            sizes = [sum(r.num_rows for r in rows) for rows in streamed]
        else:
            self._prewarm(pieces, map_units)
            for c in range(len(self.sizes)):
                found.append(self._component_rows(c, pieces[c], caches[c], map_units, conv, wait)
                             if pieces[c] else [])
            sizes = [sum(p.num_rows for p in parts) for parts in found]
        base = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        within = np.cumsum(counts, axis=0) - counts  # each block's first row in its component's rows
        # slot j of block i: component c's row (j - its first slot in the block) of that
        # block, components' slots in component order; then the block's interleave
        nb, m = counts.shape
        first_slot = np.cumsum(counts, axis=1) - counts
        shift = (base[None, :] + within - first_slot).ravel()
        owner = np.repeat(np.arange(nb * m, dtype=np.int64), counts.ravel()).reshape(nb, b)
        slots = np.arange(b, dtype=np.int64)[None, :] + shift[owner]
        # interleaved in every mode, shuffle=False too (documented: each component's rows
        # keep their order; the batch's slots are the block's seeded interleave)
        slots = np.take_along_axis(slots, sched.interleaves(mine), axis=1)
        idx = slots.ravel()
        if joint is not None:
            table, first = joint
            rows = [self._order(c, p).rows(a, z) + first[c]
                    for c in range(len(self.sizes)) for p, ranges in self._by_pass(c, pieces[c]) for a, z in ranges]
            t0 = time.perf_counter()
            chunk = conv.gather(table, np.concatenate(rows)[idx])
            if chunk is not None:
                return [chunk], time.perf_counter() - t0
            self._host_ok = False  # no host views (nulls): each component's path, Arrow from now on
            return self._read(sched, blocks, caches, None, task, cache=cache, map_units=map_units)
        if conv is not None:
            t0 = time.perf_counter()
            chunk = gather(streamed if streamed is not None else found, base, idx, conv.pool)
            if chunk is not None:  # each component's host rows copied once to their places
                chunk.columns = conv._finish(chunk.columns)  # numpy: read-only once a read, not a batch
                return [chunk], time.perf_counter() - t0
            # a part did not convert (nulls without fill_null): Arrow from now on, this task
            # again (its error is raised for the batch that holds the value)
            self._host_ok = False
            conv = None
            if streamed is None:
                return self._read(sched, blocks, caches, None, task, cache=cache, map_units=map_units)
        if streamed is not None:
            found = [[r.arrow() for r in rows] for rows in streamed]
        tables = [pa.Table.from_batches(parts) for parts in found if parts]
        target = tables[0].schema
        tables = [t if t.schema.equals(target) else t.cast(target) for t in tables]
        joined = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        return _parts(take_rows(joined, pa.array(idx, pa.int64())), conv)

    # -- state -------------------------------------------------------------------------
    def _identity(self) -> dict:
        comps = []
        for name, comp in zip(self.mixture.names, self._components):
            kind = comp.shuffle_kind
            comps.append({"name": name, "snapshot": comp.snapshot_id, "plan": comp._logical_key,
                          "rows": comp.num_rows, "shuffle": kind.value,
                          "window": self.options.shuffle_window if kind is ShuffleKind.BLOCK else None})
        return {"components": comps, "seed": self.options.seed, "batch_size": self.options.batch_size,
                "stopping": self.mixture.stopping, "order": MIXTURE_ORDER_VERSION}

    def state_dict(self, *, dataloader_batches: int | None = None) -> dict:
        """Small JSON-serializable state, the same on every rank that yielded the same number
        of batches (lockstep): the epoch, the blocks (batches) every rank consumed together,
        the epoch's phases and each component's rows drawn, and what it was taken on. Loads
        at any world size. See ``formats/mixture_state/v1/spec.md``.

        ``dataloader_batches=k``: the state after the first ``k`` batches a ``DataLoader``
        over :meth:`torch_dataset` gave in this epoch (its workers' batches do not move this
        loader), as :meth:`Loader.state_dict <arrowload.Loader.state_dict>`."""
        position = self._position
        if dataloader_batches is not None:
            start = self._dl_start
            if self._board is not None and self._board.afresh() == self._loads:
                start = 0  # a DataLoader pass after the resumed one started the epoch afresh
            left = len(rank_blocks(start, self._blocks, self.world_size, self.rank))
            k = _arguments.integer("dataloader_batches", dataloader_batches, low=0, high=left,
                                   what=f"the batches taken from the DataLoader this epoch (0 .. {left})")
            position = start + k * self.world_size
        sched = self._schedule()
        drawn = sched.stream_index(position)
        return {"format": STATE_FORMAT, "version": STATE_VERSION, **self._identity(),
                "epoch": self.epoch, "blocks": self._blocks, "position": position,
                "world_size": self.world_size,
                "phases": [{"start": p.start, "weights": list(p.weights), "offsets": list(p.offsets)}
                           for p in self._phases],
                "drawn": list(drawn)}

    def load_state_dict(self, state: Mapping[str, Any], *, weights: Any = None) -> None:
        """Resume where ``state`` was taken: the next iteration yields the rest of its epoch
        (at the same world size exactly the batches the uninterrupted run would; at another,
        the remaining batches dealt to the new ranks, each once). ``weights`` (a dict, a list
        or a weights query, as ``al.mix``) continue with other weights from there: no
        component repeats a row of its current pass, and the epoch's end follows the new
        weights. A state taken on other components, data, seed, batch size or stopping is
        refused with ``StateMismatchError`` saying what differs."""
        doc = read_state(state)
        mine = self._identity()
        kinds = [c["shuffle"] for c in mine["components"]]
        if doc["order"] != mine["order"] and (doc["order"] > mine["order"] or any(
                doc["order"] < MIXTURE_ORDER_SINCE.get(k, mine["order"]) for k in kinds)):
            raise StateMismatchError(f"order: the state was taken under the mixture order version {doc['order']}, "
                                     f"this arrowload's is {mine['order']} and its {'/'.join(sorted(set(kinds)))} "
                                     "order changed since; start the epoch afresh (set_epoch) instead of resuming")
        for key in ("seed", "batch_size", "stopping"):
            if doc[key] != mine[key]:
                raise StateMismatchError(f"{key}: the state was taken with {doc[key]!r}, this loader has "
                                         f"{mine[key]!r}; build the mixture loader as it was built")
        theirs, ours = doc["components"], mine["components"]
        if [c["name"] for c in theirs] != [c["name"] for c in ours]:
            raise StateMismatchError(f"components: the state names {[c['name'] for c in theirs]}, this mixture "
                                     f"has {[c['name'] for c in ours]}")
        for t, o in zip(theirs, ours):
            for key in ("snapshot", "plan", "rows", "shuffle", "window"):
                if t[key] != o[key]:
                    raise StateMismatchError(
                        f"component {o['name']!r}: {key} is {t[key]!r} in the state and {o[key]!r} here; a "
                        "mixture state resumes only on the same selections of the same data (reopen the "
                        "snapshot the state names)")
        phases = tuple(Phase(p["start"], tuple(float(w) for w in p["weights"]), tuple(p["offsets"]))
                       for p in doc["phases"])
        epoch = doc["epoch"]
        try:
            sched = Schedule(self.sizes, phases, self.options.batch_size, self.options.seed, epoch,
                             self.mixture.stopping)
            drawn = sched.stream_index(doc["position"])
        except ValueError as exc:
            raise StateMismatchError(f"phases: {exc}") from None
        for i, (a, b) in enumerate(zip(phases, phases[1:])):
            if tuple(b.offsets) != sched.stream_index(b.start):
                raise StateMismatchError(f"phases[{i + 1}].offsets {list(b.offsets)} are not the rows drawn at "
                                         f"block {b.start} ({list(sched.stream_index(b.start))})")
        if list(drawn) != list(doc["drawn"]):
            raise StateMismatchError(f"drawn: the state says {doc['drawn']}, its phases give {list(drawn)} at "
                                     f"position {doc['position']}")
        blocks = doc["blocks"]
        if self.mixture.stopping != "cycle" and blocks != sched.num_blocks:
            raise StateMismatchError(f"blocks: the state's epoch has {blocks} blocks, its phases give "
                                     f"{sched.num_blocks}")
        if blocks is not None and doc["position"] > blocks:
            raise StateMismatchError(f"position {doc['position']} is past the epoch's {blocks} blocks")
        position = doc["position"]
        end_iterations(self._active, ENDED_BY_LOAD)
        self.epoch = epoch
        if weights is not None:
            new = _weights.normalized(_weights.resolve(self.mixture.names, weights, None, lambda: self.sizes))
            _weights.refuse_empty(self.mixture.names, self.sizes, new)
            kept = tuple(p for p in phases if p.start < position)
            phases = kept + (Phase(position, new, tuple(drawn)),)
            self.weights = new
            sched = Schedule(self.sizes, phases, self.options.batch_size, self.options.seed, epoch,
                             self.mixture.stopping)
            if self.mixture.stopping != "cycle":
                blocks = sched.num_blocks
        else:
            self.weights = phases[-1].weights
        self._phases = phases
        self._blocks = blocks
        self._start = self._position = self._dl_start = position
        self._batches_done = 0
        self._loaded = True
        self._loads += 1
        post(self)

    # -- introspection -------------------------------------------------------------------
    def stats(self):
        """Counters of the current (or last) iteration; ``peak_prefetch_bytes`` includes the
        most the decoded-unit caches (``mixture.shared``) or the stream's queues
        (``mixture.stream``) held."""
        if self._stats is None:
            return None
        stream = self._stream
        return dataclasses.replace(self._stats, peak_prefetch_bytes=self._stats.peak_prefetch_bytes +
                                   self._shared.peak() + (stream.peak if stream is not None else 0))

    def passes(self) -> tuple[float, ...]:
        """Passes over each component this epoch draws (at this loader's batch size)."""
        if self._blocks is None:
            return tuple(float("inf") if w > 0 else 0.0 for w in self.weights)
        drawn = self._schedule().stream_index(self._blocks // self.world_size * self.world_size)
        return tuple(d / n if n else 0.0 for d, n in zip(drawn, self.sizes))

    @property
    def shuffle_kind(self) -> str:
        """The components' shuffle kinds: one (``"global"``) or each in turn (``"global/block"``)."""
        return "/".join(dict.fromkeys(c.shuffle_kind.value for c in self._components))

    # what profile() puts back: the position, and the epoch's lay-out (a loaded state's phases)
    _PROFILE_FIELDS = ("epoch", "_start", "_dl_start", "_position", "_batches_done", "_loaded", "_phases", "_blocks",
                       "_stats")
    _stats = None
    _profiling = None  # a profile.Profiling recording the next iteration
    _last_profile = None

    def _rows_done(self) -> int:
        return self._batches_done * self.options.batch_size  # every block is one full batch

    def _epoch_size(self) -> tuple[int, int]:
        if self._blocks is None:
            return 0, 0
        return len(self) * self.options.batch_size, len(self)

    def profile(self, n_batches: int | None = None, *, step_fn=None):
        """As :meth:`Loader.profile <arrowload.Loader.profile>`: ``n_batches`` batches (default
        the whole epoch; required for an endless ``stopping='cycle'`` mixture without
        ``steps=``) into an infinitely fast consumer, or beside ``step_fn(batch)``; the
        loader's position is the same afterwards."""
        from ..pipeline.profile import profile
        if n_batches is None and self._blocks is None:
            raise UnsupportedError("a stopping='cycle' mixture loader without steps= never ends: pass "
                                   "profile(n_batches=N)")
        return profile(self, n_batches, step_fn=step_fn)

    def profiling(self):
        """As :meth:`Loader.profiling <arrowload.Loader.profiling>`: ``with loader.profiling()
        as run: for batch in loader: step(batch)``, then ``run.profile``."""
        from ..pipeline.profile import Profiling
        return Profiling(self)

    def progress(self, desc: str | None = None, *, enabled: bool | None = None):
        """As :meth:`Loader.progress <arrowload.Loader.progress>`: this epoch under a
        progress bar; the batches and the resume state are those of ``iter(loader)``."""
        from ..progress import track_loader
        return track_loader(self, desc, enabled=enabled)

    def explain(self) -> str:
        o = self.options
        epoch = ("endless (cycle, no steps=)" if self._blocks is None else
                 f"{self._blocks} batches of {o.batch_size} rows in all; {len(self)} for rank {self.rank} of "
                 f"{self.world_size} (round-robin)")
        lines = ["== mixture loader ==", f"  stopping     {self.mixture.stopping} (seed {o.seed}, epoch {self.epoch})",
                 f"  epoch        {epoch}",
                 "  per batch    each component: floor or ceil of weight x batch_size rows, interleaved",
                 "", f"  {'component':<16} {'rows':>12} {'weight':>8} {'passes':>8} {'shuffle':>8} source"]
        for name, comp, w, p in zip(self.mixture.names, self._components, self.weights, self.passes()):
            lines.append(f"  {name:<16} {comp.num_rows:>12} {w:>8.4f} {p:>8.3f} {comp.shuffle_kind.value:>8} "
                         f"{comp.source_kind}")
        if len(self._phases) > 1:
            lines.append("  reweighted   at blocks " + ", ".join(str(p.start) for p in self._phases[1:]))
        return "\n".join(lines)

    def __repr__(self) -> str:
        n = "endless" if self._blocks is None else str(len(self))
        return (f"arrowload.MixtureLoader({len(self.sizes)} components, batch_size={self.options.batch_size}, "
                f"rank={self.rank}/{self.world_size}, batches={n}, stopping={self.mixture.stopping!r})")

    def _repr_html_(self) -> str:
        from ..display import html_pre
        return html_pre(self.explain())

    # -- lifecycle ---------------------------------------------------------------------
    def close(self) -> None:
        end_iterations(self._active, ENDED_BY_CLOSE)
        for c in self._components:
            c.close()
        self._shared.close()
        self._closed = True

    def __enter__(self) -> "MixtureLoader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _converted(src, unit: int, conv) -> list:
    """Unit ``unit`` of a scan's rows, read and converted into host chunks where it can be."""
    return _parts(src.read_unit(unit), conv)[0]


def _placed(src, window: int, order, conv, map_units):
    """Block window ``window`` of a scan's rows in its shuffled order, one host chunk (None:
    a unit did not convert; the task is read as any)."""
    layout = src.placed(window, order, conv, map_units)
    ahead = getattr(src, "_warm_ahead", None)
    if ahead is not None and window + 1 < len(order.windows):
        ahead([int(u) for u in order.windows[window + 1]])  # decoded while this one is read
    return layout.result() if layout is not None else None


def _keyed(cache: SharedCache, p: int, key, load, wait=None):
    return cache.get((p,) + tuple(key), load, wait)



def _int(doc: Mapping, key: str, low: int = 0, nullable: bool = False) -> Any:
    v = doc.get(key)
    if v is None and nullable and key in doc:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise StateMismatchError(f"{key}: expected an integer >= {low}{' or null' if nullable else ''}, got {v!r}")
    return v


def read_state(state: Mapping[str, Any]) -> dict:
    """``state`` checked field by field (``formats/mixture_state/v1``); ``StateMismatchError``
    naming the field otherwise."""
    if not isinstance(state, Mapping):
        raise StateMismatchError(f"a mixture state is a dict (MixtureLoader.state_dict()), got {type(state).__name__}")
    if state.get("format") != STATE_FORMAT:
        raise StateMismatchError(f"format: expected {STATE_FORMAT!r}, got {state.get('format')!r} (a loader "
                                 "state loads with Loader.load_state_dict)")
    if state.get("version") != STATE_VERSION:
        raise StateMismatchError(f"version: this arrowload reads mixture states of version {STATE_VERSION}, got "
                                 f"{state.get('version')!r}")
    fields = {"format", "version", "components", "seed", "batch_size", "stopping", "order", "epoch", "blocks",
              "position", "world_size", "phases", "drawn"}
    missing, extra = fields - set(state), set(state) - fields
    if missing or extra:
        raise StateMismatchError(f"fields: missing {sorted(missing)}, unknown {sorted(extra)}")
    for key, low in (("seed", 0), ("batch_size", 1), ("order", 1), ("epoch", 0), ("position", 0),
                     ("world_size", 1)):
        _int(state, key, low)
    _int(state, "blocks", 0, nullable=True)
    if not isinstance(state["stopping"], str):
        raise StateMismatchError(f"stopping: expected a string, got {state['stopping']!r}")
    comps = state["components"]
    if not isinstance(comps, list) or not comps:
        raise StateMismatchError("components: expected a non-empty list")
    for c in comps:
        if not isinstance(c, Mapping) or set(c) != {"name", "snapshot", "plan", "rows", "shuffle", "window"}:
            raise StateMismatchError(f"components: each is {{name, snapshot, plan, rows, shuffle, window}}, got {c!r}")
        _int(c, "rows")
        _int(c, "window", 1, nullable=True)
    phases = state["phases"]
    if not isinstance(phases, list) or not phases:
        raise StateMismatchError("phases: expected a non-empty list")
    for p in phases:
        if not isinstance(p, Mapping) or set(p) != {"start", "weights", "offsets"}:
            raise StateMismatchError(f"phases: each is {{start, weights, offsets}}, got {p!r}")
        _int(p, "start")
        ws, offs = p["weights"], p["offsets"]
        if not isinstance(ws, list) or len(ws) != len(comps) or any(
                isinstance(w, bool) or not isinstance(w, (int, float)) or not w >= 0 for w in ws):
            raise StateMismatchError(f"phases: weights must be {len(comps)} numbers >= 0, got {ws!r}")
        if not isinstance(offs, list) or len(offs) != len(comps) or any(
                isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in offs):
            raise StateMismatchError(f"phases: offsets must be {len(comps)} integers >= 0, got {offs!r}")
    drawn = state["drawn"]
    if not isinstance(drawn, list) or len(drawn) != len(comps) or any(
            isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in drawn):
        raise StateMismatchError(f"drawn: expected {len(comps)} integers >= 0, got {drawn!r}")
    return dict(state)


__all__ = ["MixTask", "MixtureLoader", "STATE_FORMAT", "STATE_VERSION", "read_state"]


def _rebuilt(mixture, options, steps, at: dict) -> MixtureLoader:
    """``MixtureLoader.__reduce__``: the loader built again, at the epoch, phases and
    position it was pickled at."""
    loader = MixtureLoader(mixture, options, steps)
    loader.epoch, loader._phases, loader._blocks = at["epoch"], at["phases"], at["blocks"]
    loader._start = loader._position = at["start"]
    loader._loaded, loader.weights, loader._loads, loader._board = at["loaded"], at["weights"], at["loads"], at["board"]
    return loader

