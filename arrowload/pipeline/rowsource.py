"""The random-access layer: rows grouped in units of exactly known counts.

Two kinds, one interface (``counts``, ``read_unit``, and for tables ``gather``):

- :class:`ScanRowSource` streams a plan's scan unit by unit (a Parquet row group, a
  file). With a filter, exact per-unit counts are computed once, reading only the
  filter's columns, and cached on disk keyed by the data snapshot and the predicate
  (``formats/selection_index``); the second run pays nothing.
- :class:`TableRowSource` holds the selected rows in memory or in a memory-mapped Arrow
  IPC cache (``formats/ra_cache``) and gathers any rows: what global shuffle needs.

Building the table (``materialize``): a plan over one scan is built at decode speed by
``rabuild`` (units read side by side, copied into preallocated buffers, ``stack=`` groups
held row-major); other plans (SQL, limits) stream through ``execute.iter_batches``.

Memory: the cache is written streaming from the scan, in record batches of a bounded
number of bytes (``budget.cache_chunk_rows``), never holding the selection; it is read
memory-mapped, so its pages are file-backed (the kernel drops and re-reads them), not
anonymous memory. Its units (``counts``) stay ``UNIT_ROWS`` rows whatever the file's
record batches, so the epoch order never depends on where the table lives.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa

from .. import progress as _progress
from ..errors import ArrowloadError, InternalError, MemoryBudgetError
from ..jsondoc import write_atomic
from ..options import Options, default_cache_dir, usable_cores  # noqa: F401 - re-exported
from ..optimize import optimize
from ..order.tasks import TaskKind
from ..plan.fingerprint import plan_fingerprint
from ..plan.nodes import Filter, Limit, Map, Plan, Project, Scan, SqlQuery, has_map, scans, transform_up, walk
from ..plan.rowselect import take_rows, with_views, without_views
from ..scan import execute
from ..scan.decoders import recoverable
from ..scan.stream import WINDOW_DECODER, forked_with_polars, polars_ready, polars_threads
from ..scan.units import UnitReader
from ..source.snapshot import changed_paths, files_changed_error, miscount_error
from . import rabuild
from .budget import cache_chunk_rows
from .documents import (FORMAT_VERSION, RA_FORMAT, SELECTION_FORMAT, load_json, read_ra_manifest,
                        read_selection_index)

UNIT_ROWS = 65_536


def restrict(plan: Plan, units: Sequence[int]) -> Plan:
    """The same plan reading only ``units`` of its scan."""
    return transform_up(plan, lambda n: n.replace(units=tuple(units)) if isinstance(n, Scan) else n)


def plan_key(plan: Plan) -> str:
    """What a plan computes, as its fingerprint without the data snapshot (cache keys and
    documents hold the snapshot separately): see ``plan/fingerprint.py``. Independent of how
    ``explain()`` prints the plan and of how paths were spelled."""
    return plan_fingerprint(plan, data=False)


def _digest(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


class ScanRowSource:
    """Units of a streaming scan with exact row counts after filtering."""

    kind = "scan"

    def __init__(self, plan: Plan, options: Options, cache_dir: str | None, io_threads: int,
                 remote: Any = None) -> None:
        """``remote``: where unit reads run when not here (``scaleout.executor.RayExecutor``:
        ``remote.unit_reads(plan, options)`` gives ``read(i)``); counting stays local."""
        found = scans(plan)
        if len(found) != 1:
            raise InternalError(f"a scan row source needs a plan over one scan, got {len(found)}; the "
                                "loader materializes other plans (a bug: please report it)")
        self.plan = plan
        self.options = options
        self.scan = found[0]
        self.source = self.scan.source
        self.snapshot = self.source.fingerprint()
        self.units = tuple(u.index for u in self.scan.selected_units())
        self._meta = {u.index: u for u in self.scan.selected_units()}
        self.cache_dir = cache_dir
        self.io_threads = io_threads
        # the plan compiled once: every unit read (and counting, below) goes through it
        self.reader = UnitReader(plan, options, cache_dir=cache_dir)
        self._read = remote.unit_reads(plan, options) if remote is not None else self.reader.read
        self.compiles = 1
        self._est: tuple[int, ...] | None = None
        self._read_columns: tuple[str, ...] | None = None
        #: decodes units ahead, together, where their reads share decodes (a mixture's
        #: ``UnitCache.warm_many``); None: each read decodes its unit
        self._warm: Callable[[Sequence[int]], None] | None = None
        #: block windows may be read by polars (``_window_tables``): set per epoch by the
        #: loader, by its rule for polars reads (``loader._stream_allowed``)
        self.polars_windows = False
        self._remote = remote
        self._stream: Any = False  # not compiled yet (stream_query)
        self.counts = self._counts()

    def __getstate__(self):
        """What a spawned process gets (a ``DataLoader`` worker over ``torch_dataset()``):
        the plan, its units, counts and settings. The compiled reader (locks, open files,
        decoders) and the polars query are compiled afresh there, once."""
        state = self.__dict__.copy()
        for name in ("reader", "_read", "_stream", "_warm"):
            del state[name]
        return state

    def __setstate__(self, state) -> None:
        self.__dict__.update(state)
        self.reader = UnitReader(self.plan, self.options, cache_dir=self.cache_dir)
        self._read = self._remote.unit_reads(self.plan, self.options) if self._remote is not None \
            else self.reader.read
        self._stream, self._warm = False, None

    # -- exact counts --------------------------------------------------------
    def _needs_counting(self) -> bool:
        if self.scan.predicate is not None:
            return True
        if any(not isinstance(n, (Scan, Project, Map)) for n in walk(self.plan)):
            return True  # a residual filter above the scan
        return any(self._meta[u].num_rows is None for u in self.units)

    def _counts(self) -> tuple[int, ...]:
        if not self._needs_counting():
            return tuple(int(self._meta[u].num_rows) for u in self.units)
        count_plan = optimize(Project(_strip_maps(self.plan), ()), self.options.optimizer)
        what = plan_key(count_plan)
        key = _versioned_key(what, [self.scan], self.snapshot, ",".join(map(str, self.units)))
        # in-memory data is counted afresh: its fingerprint samples it (``_volatile``)
        path = os.path.join(self.cache_dir, f"selection-{key}.json") \
            if self.cache_dir and not _volatile([self.scan]) else None
        if path and os.path.exists(path):
            try:
                index = read_selection_index(load_json(path), path)
                if index.snapshot == self.snapshot and index.plan == what and index.units == self.units:
                    return index.counts
            except (OSError, ArrowloadError):
                pass  # a damaged or foreign cache is rebuilt, never trusted
        counts = self._count_units(count_plan)
        if path:
            try:
                write_atomic(path, {"format": SELECTION_FORMAT, "version": FORMAT_VERSION,
                                    "snapshot": self.snapshot, "plan": what,
                                    "units": list(self.units), "counts": list(counts)})
            except OSError:
                pass  # a cache: an unwritable or full cache dir only means counting again
            else:
                _drop_versions(path)
        return counts

    def _count_units(self, count_plan: Plan) -> tuple[int, ...]:
        """Rows of each unit after the plan, reading only what the count plan needs (the
        filters' columns; footers where checked statistics decide): one reader compiled for
        the count plan over this source's units, one ``count`` per unit."""
        counter = UnitReader(restrict(count_plan, self.units), self.options, cache_dir=self.cache_dir)
        self.compiles += 1
        desc, n = "counting the selected rows", len(self.units)
        try:
            if len(self.units) <= 1 or self.io_threads <= 1:
                return tuple(_progress.track((counter.count(i) for i in range(n)), n, desc, "unit"))
            with ThreadPoolExecutor(self.io_threads, thread_name_prefix="arrowload-count") as pool:
                return tuple(_progress.track(pool.map(counter.count, range(n)), n, desc, "unit"))
        finally:
            counter.close()

    def close(self) -> None:
        """Close the Parquet files the reader keeps open (a later read opens them again)."""
        self.reader.close()

    def stream_query(self):
        """The polars streaming query that reads this scan's units in source order
        (``scan.stream.StreamQuery``), or None where it cannot (compiled once)."""
        if self._stream is False:
            from ..scan.stream import StreamQuery
            self._stream = None if self._remote is not None else StreamQuery.compile(self.plan, self.options)
        return self._stream

    # -- reading ---------------------------------------------------------------
    def est_bytes(self, i: int) -> int:
        """Bytes unit ``i`` holds once decoded (computed for every unit on first use): the
        exact size of its fixed-width columns read (rows x width: numbers, booleans, dates,
        fixed-size lists of them), 3x the footer's compressed bytes of the others (strings,
        lists, dictionaries), 64 bytes a row where the footer has no sizes. (3x the
        compressed bytes of every column overstated incompressible float features 3.6x.)"""
        if self._est is None:
            read = set(self.scan.read_columns)  # by name: a duplicated name counts each column
            fields = [f for f in self.source.schema if f.name in read]
            self._est = _decoded_bytes(self.scan.selected_units(), fields, self.counts)
        return self._est[i]

    def read_bytes(self, i: int) -> int:
        """The footer's compressed bytes of the columns unit ``i`` reads (0 where unknown)."""
        if self._read_columns is None:
            self._read_columns = self.scan.read_columns
        return int(self._meta[self.units[i]].bytes_for(self._read_columns) or 0)

    def check_read(self, units) -> None:
        """Units ``units`` (indices into ``units``) were read elsewhere (a polars stream):
        their files still as listed (``Source.check_read``)."""
        self.source.check_read(sorted({self._meta[self.units[i]].file for i in units}))

    def read_unit(self, i: int, picked: bool = False) -> pa.Table:
        """Rows of unit ``i`` (index into ``units``) after the whole plan, in order.
        ``picked``: rows a mixture's shared decode hands out as positions in the decoded
        unit (``rabuild.Picked``) are returned so, for a caller that writes them by
        position (``chunks.WindowLayout.put``); otherwise taken into a table."""
        try:
            table = self._read(i)
        except (ArrowloadError, OSError) as exc:
            changed = changed_paths(self.source)
            if changed:
                raise files_changed_error(changed, "the loader", "the loader was built",
                                          "build a new loader (its counts and order follow the new data)") from exc
            raise
        self.check_read((i,))  # (a local file rewritten meanwhile)
        if table.num_rows != self.counts[i]:
            meta = self._meta[self.units[i]]
            raise miscount_error(f"unit {i} ({meta.path}, row group {meta.row_group})", table.num_rows,
                                 self.counts[i], self.source, has_map(self.plan),
                                 "the loader")
        if not picked and isinstance(table, rabuild.Picked):
            return take_rows(table.table, pa.array(table.rows, pa.int64()))
        return table

    # -- one task of the pipeline (order.tasks) ----------------------------------------
    def read(self, task, order, conv=None, *, cache=None, map_units=None) -> tuple[list, float]:
        """Task ``task`` of the epoch ``order``: its rows in order, as a list of parts --
        host chunks converted here, on the reader thread, by ``conv`` (a
        ``chunks.ChunkConverter``), or Arrow batches without it -- and the seconds spent
        converting. A ``UNIT`` task is rows of one unit; a ``WINDOW`` task (block shuffle)
        reads its window's units (by polars at once where it can: ``_window_tables``; else
        side by side through ``map_units(fn, units)`` when given),
        each placed by the thread that read it (``chunks.WindowLayout``): scattered straight
        to its output positions when the task covers the whole window, else laid out in
        window order (shared through ``cache``) and its positions gathered; columns without
        host arrays (or no ``conv``) take with Arrow. ``cache(key, load)`` shares a unit or
        window read between tasks (DataLoader workers cut units between batches)."""
        cache = cache or _load
        if task.kind == TaskKind.UNIT:
            table = cache(("unit", task.unit), lambda: self.read_unit(task.unit))
            return _parts(table.slice(task.lo, task.hi - task.lo), conv)
        if task.kind == TaskKind.RUN:  # consecutive small units: their parts in order
            parts, seconds = [], 0.0
            for u, lo, hi in task.pieces():
                table = cache(("unit", u), functools.partial(self.read_unit, u))
                got, s = _parts(table.slice(lo, (self.counts[u] if hi < 0 else hi) - lo), conv)
                parts += got
                seconds += s
            return parts, seconds
        if task.kind != TaskKind.WINDOW:
            raise InternalError(f"a scan reads units and windows, not {task.kind} tasks (a bug: please report it)")

        units = [int(u) for u in order.windows[task.window]]
        size = sum(self.counts[u] for u in units)
        whole = task.lo == 0 and task.hi == size
        if conv is not None and whole:
            # the whole window: each unit's rows scattered to their places as it is read
            layout = self.placed(task.window, order, conv, map_units)
            if layout is not None:
                return [layout.result()], layout.take_seconds()
            # a unit did not convert: the same window would fail to lay out again, so it is
            # read once more, with Arrow, below (which raises, or converts what fill_null fixed)
        local = np.asarray(order.window_local(task.window, task.lo, task.hi), dtype=np.int64)
        if conv is not None and not whole:  # part of a window (a rank's ends, a resume, shared reads)
            layout = cache(("window", task.window), lambda: self._place(units, conv, map_units))
            if layout is not None:
                t0 = time.perf_counter()
                chunk = layout.gather(local)
                return [chunk], time.perf_counter() - t0 + layout.take_seconds()

        def load_window() -> pa.Table:
            parts = self._window_tables(units) or (map_units or _serial)(self.read_unit, units)
            # one contiguous chunk: Arrow's take over many chunks concatenates per call
            return without_views(pa.concat_tables(parts).combine_chunks())

        window, views = cache(("window-arrow", task.window), load_window)
        return _parts(with_views(take_rows(window, pa.array(local, pa.int64())), views), conv)

    def placed(self, window: int, order, conv, map_units=None):
        """Window ``window`` of ``order`` read into a ``chunks.WindowLayout`` in its shuffled
        order: each unit's rows scattered to their output places as it is read, so any
        positions ``[lo, hi)`` of the window are rows ``lo .. hi`` of ``result()``, no
        gather; None as ``_place``."""
        units = [int(u) for u in order.windows[window]]
        size = sum(self.counts[u] for u in units)
        positions = np.empty(size, dtype=np.int64)
        positions[order.window_permutation(window)] = np.arange(size, dtype=np.int64)
        return self._place(units, conv, map_units, positions)

    def _place(self, units: list[int], conv, map_units, positions: np.ndarray | None = None):
        """The window of ``units`` read into a ``chunks.WindowLayout`` (scattered to
        ``positions``, else laid out in window order): by polars a few units at a time where
        it can (``_window_tables``), each group placed side by side (``map_units``) before
        the next is read; else unit by unit side by side, each placed by the thread that
        read it (shared units decoded a few at a time first, ``_warm``). Each unit's rows
        are dropped once placed. ``None`` where the columns have no host arrays or a unit
        does not convert (nulls: Arrow's path raises per batch)."""
        starts = np.concatenate([[0], np.cumsum([self.counts[u] for u in units])]).astype(np.int64)
        layout = conv.window(self.plan.schema, int(starts[-1]), positions)
        if layout is None:
            return None
        run = map_units or _serial
        step = window_step()
        first = self._window_tables(units[:step])
        if first is not None:  # polars reads the window, a few row groups per polars thread at once
            tables: list = first
            for k0 in range(0, len(units), step):
                if k0:
                    tables = self._window_tables(units[k0:k0 + step]) or [self.read_unit(u, picked=True)
                                                                        for u in units[k0:k0 + step]]

                def put(k: int, k0: int = k0, tables: list = tables) -> None:
                    table, tables[k] = tables[k], None  # dropped once placed
                    layout.put(int(starts[k0 + k]), table)
                run(put, range(len(tables)))
        else:
            group = step if self._warm is not None else len(units)
            for k0 in range(0, len(units), group):
                if self._warm is not None:  # a few shared units decoded together, then placed
                    self._warm(units[k0:k0 + group])
                run(lambda k: layout.put(int(starts[k]), self.read_unit(units[k], picked=True)),
                    range(k0, min(len(units), k0 + group)))
        return None if layout.failed else layout

    def _window_tables(self, units: Sequence[int]) -> list[pa.Table] | None:
        """A block-shuffle window's units read at once by polars (``StreamQuery.unit_tables``:
        its queries side by side on polars' pool), where the loader allows it
        (``polars_windows``), the scan's polars query reads them as the unit decoders do and
        polars is imported (else its import starts in the background, for the next
        windows); else None: read per unit.
        A query that fails, or gives other counts, also reads per unit (whose answer or
        error decides); so does a process forked after polars was imported (a DataLoader
        worker: polars' pool did not survive the fork)."""
        if not self.polars_windows or self._read != self.reader.read or len(units) < 2 or forked_with_polars():
            return None
        if not polars_ready():  # its import started on a thread of its own: later windows
            return None
        query = self.stream_query()
        if query is None:
            return None
        try:
            tables = query.unit_tables(units)
        except BaseException as exc:  # noqa: BLE001 - polars panics are BaseExceptions
            if not recoverable(exc):
                raise
            return None
        if any(t.num_rows != self.counts[u] for t, u in zip(tables, units)):
            return None
        self.check_read(units)  # (a local file rewritten meanwhile)
        self.reader.count_decoded(WINDOW_DECODER, len(units))
        return tables


class TableRowSource:
    """Selected rows held in one table (memory or a memory-mapped IPC cache).

    Units are ``unit_rows``-row slices (zero-copy); they define the order of a block
    shuffle, not how much is read at once (the loader reads slices and gathers sized in
    bytes, see ``budget.read_rows``). ``gather`` takes arbitrary rows in the order given:
    one copy, into a fresh contiguous batch.

    ``table`` may hold ``stack=`` groups as fixed-size-list columns (fields with
    ``rabuild.STACK_KEY`` metadata, see ``rabuild``): ``chunks.ChunkConverter.gather``
    takes from them directly; ``read_unit`` and ``gather`` give the plan's own columns
    (``schema``) back.
    """

    kind = "table"

    def __init__(self, table: pa.Table, unit_rows: int = UNIT_ROWS, where: str = "memory",
                 snapshot: str = "", schema: pa.Schema | None = None) -> None:
        self.table = table
        self.unit_rows = unit_rows
        self.where = where
        self.snapshot = snapshot
        self.schema = schema if schema is not None else table.schema
        self._stacked = {f.name: rabuild.stacked_members(f) for f in table.schema
                         if rabuild.stacked_members(f) is not None}
        n = table.num_rows
        self.counts = tuple(min(unit_rows, n - s) for s in range(0, n, unit_rows))
        self.units = tuple(range(len(self.counts)))
        # what gathers take from: view-typed columns cast once (Arrow cannot take them)
        self._taken, self._views = without_views(table)
        chunks = [c.num_chunks for c in self._taken.columns]
        self._single = all(c <= 1 for c in chunks)
        if not self._single:
            lengths = [b.num_rows for b in self._taken.to_batches()]
            self._chunk_offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
            self._batches = self._taken.to_batches()

    @property
    def row_bytes(self) -> float:
        """Average bytes per row (what a read of ``n`` rows holds once copied)."""
        return self.table.nbytes / max(1, self.table.num_rows)

    def est_bytes(self, i: int) -> int:
        return max(1, int(self.row_bytes * self.counts[i]))

    def read_unit(self, i: int) -> pa.Table:
        return self._columns(self.table.slice(i * self.unit_rows, self.counts[i]))

    def _columns(self, table: pa.Table) -> pa.Table:
        """``table`` (rows of ``self.table``) with stacked groups split into the plan's columns
        (one copy of the group; the table-wide paths take from the stacked form)."""
        if not self._stacked:
            return table
        have = {}
        for name, members in self._stacked.items():
            col = table.column(name)
            k = len(members)
            if col.num_chunks == 1:
                arr = col.chunk(0)
            elif col.num_chunks == 0:
                arr = pa.array([], col.type)
            else:
                arr = pa.concat_arrays(col.chunks)
            values = arr.values.slice(arr.offset * k, len(arr) * k).to_numpy(zero_copy_only=True)
            values = values.reshape(len(arr), k)
            for j, m in enumerate(members):
                have[m] = pa.array(np.ascontiguousarray(values[:, j]), self.schema.field(m).type)
        arrays = [have[f.name] if f.name in have else table.column(f.name) for f in self.schema]
        return pa.Table.from_arrays(arrays, schema=self.schema)

    def gather(self, rows: np.ndarray) -> pa.Table:
        """Rows ``rows`` (source-order numbers) in that order, in the plan's columns."""
        if self._single:
            return self._columns(with_views(take_rows(self._taken, pa.array(rows, pa.int64())), self._views))
        # Chunked (memory-mapped cache): take within each chunk, then restore the order.
        which = np.searchsorted(self._chunk_offsets, rows, side="right") - 1
        order = np.argsort(which, kind="stable")
        pieces = []
        sorted_which = which[order]
        bounds = np.flatnonzero(np.diff(sorted_which)) + 1
        for part in np.split(order, bounds):
            if part.size == 0:
                continue
            c = int(which[part[0]])
            local = rows[part] - self._chunk_offsets[c]
            pieces.append(take_rows(self._batches[c], pa.array(local, pa.int64())))
        grouped = pa.Table.from_batches(pieces, schema=self._taken.schema).combine_chunks()
        inverse = np.empty_like(order)
        inverse[order] = np.arange(order.size)
        return self._columns(with_views(take_rows(grouped, pa.array(inverse, pa.int64())), self._views))

    # -- one task of the pipeline (order.tasks) ----------------------------------------
    def read(self, task, order, conv=None, *, cache=None, map_units=None) -> tuple[list, float]:
        """Task ``task`` of the epoch ``order``: its rows in order, as a list of parts (host
        chunks made by ``conv``, or Arrow batches without it) and the seconds spent
        converting. A ``UNIT`` task is a zero-copy slice of one unit; a ``GATHER`` task takes
        ``order.rows`` of its positions, straight into pooled buffers where ``conv`` can
        (``ChunkConverter.gather``), else with Arrow's take. ``cache(key, load)`` shares a
        unit between tasks; ``map_units`` is not needed (one read per task)."""
        if task.kind == TaskKind.UNIT:
            table = (cache or _load)(("unit", task.unit), lambda: self.read_unit(task.unit))
            return _parts(table.slice(task.lo, task.hi - task.lo), conv)
        if task.kind != TaskKind.GATHER:
            raise InternalError(f"a table reads slices and gathers, not {task.kind} tasks (a bug: please report it)")
        rows = order.rows(task.lo, task.hi)
        t0 = time.perf_counter()
        chunk = conv.gather(self.table, rows) if conv is not None else None
        if chunk is not None:  # gathered straight into pooled buffers
            return [chunk], time.perf_counter() - t0
        return _parts(self.gather(rows), conv)


def _build_streamed(units: ScanRowSource, schema: pa.Schema, stack, memory_budget: int, stream):
    """The random-access table read through one polars streaming query where ``stream``
    allows it (``rabuild.build_stream``), or ``rabuild.UNITS``: not eligible, not allowed, or the
    query failed (the per-unit build then reads everything again)."""
    if stream is None:  # (a remote source has no stream query)
        return rabuild.UNITS
    query = units.stream_query()
    rows = sum(units.counts)
    if query is None or rows == 0 or len(query.units) != len(units.counts):
        return rabuild.UNITS
    n = len(units.counts)
    if not stream(query, max(units.est_bytes(i) for i in range(n)),
                  lambda: sum(units.read_bytes(i) for i in range(n))):
        return rabuild.UNITS
    return rabuild.try_stream(lambda: rabuild.build_stream(query.batches(0, len(query.units) - 1, 0, rows), rows,
                                                          schema, stack=stack, memory_budget=memory_budget))


def materialize(plan: Plan, options: Options, *, memory_budget: int, cache_dir: str | None,
                reuse: bool, stack: Mapping[str, Any] | None = None, remote: Any = None,
                stream: Callable[..., bool] | None = None) -> TableRowSource:
    """Run ``plan`` once into a random-access table: in memory while it fits
    ``memory_budget`` bytes, else into an Arrow IPC cache file under ``cache_dir`` (reused
    by later loaders while the snapshot and plan are unchanged when ``reuse``).

    A plan over one scan (no SQL, no limit) is built in memory by ``rabuild`` (units read
    in parallel straight into preallocated buffers); ``stack`` (the loader's ``stack=``,
    passed where its batches are gathered into host arrays) holds those groups row-major.
    Other plans, and selections that do not fit, stream through ``execute.iter_batches``
    (the cache file always holds the plan's own columns). ``remote``: where a plan over one
    scan reads its units (see ``ScanRowSource``), as many side by side as it has CPUs.
    ``stream(query, unit_bytes, read_bytes)`` (``loader._stream_allowed``): whether to build
    from one polars streaming query over the units (``scan/stream.py``; decoded on polars'
    threads, written here) where the scan is eligible; its failure (a polars error, other
    rows than counted) falls back to the units."""
    found = scans(plan)
    snapshot, what, base = _cache_base(plan, cache_dir)
    volatile = _volatile(found)
    if base and reuse and not volatile:
        cached = _open_cache(base, snapshot, what)
        if cached is not None:
            return cached
    if _one_scan(plan) and not _surely_spills(found, memory_budget):
        threads = usable_cores()
        units = ScanRowSource(plan, options, cache_dir, threads, remote)
        if remote is not None:
            threads = max(threads, remote.parallelism)
        try:
            table = _build_streamed(units, plan.schema, stack, memory_budget, stream)
            if table is rabuild.UNITS:
                table = rabuild.build(units.read_unit, units.counts, plan.schema, stack=stack,
                                      memory_budget=memory_budget, threads=threads)
        finally:
            units.close()  # the files its decoders hold open
        if table is not None:
            return TableRowSource(table, where="memory", snapshot=snapshot, schema=plan.schema)
        if base is None:
            raise _over_budget(memory_budget)
        # over the budget: stream it to the disk cache below (read again, never held)
        options = _streaming(options, local=all(s.source.is_local for s in found))
    elif _surely_spills(found, memory_budget):
        options = _streaming(options, local=all(s.source.is_local for s in found))
    held: list[pa.RecordBatch] = []
    size = 0
    writer = None
    tmp_path = None
    schema = plan.schema
    try:
        for batch in _progress.track(execute.iter_batches(plan, options, ordered=True), _progress.expected_rows(plan),
                                     "building the random-access table", "rows", size=len):
            if writer is None:
                held.append(batch)
                size += batch.nbytes
                if size > memory_budget:
                    if base is None:
                        raise _over_budget(memory_budget)
                    tmp_path = _spill_file(base, memory_budget)
                    writer = _ChunkWriter(tmp_path, schema, memory_budget)
                    for b in held:
                        writer.write(b)
                    held = []
            else:
                writer.write(batch)
        if writer is None:
            return TableRowSource(_combine(held, schema), where="memory", snapshot=snapshot)
        writer.close()
        if volatile:  # this process's table only: mapped, then unlinked (gone with the map)
            where, spilled, tmp_path = tmp_path, _map_unlinked(tmp_path), None
            return TableRowSource(spilled, where=f"{where}, this process's, unlinked", snapshot=snapshot)
        os.replace(tmp_path, base + ".arrow")
        tmp_path = None
        write_atomic(base + ".json", {"format": RA_FORMAT, "version": FORMAT_VERSION,
                                            "snapshot": snapshot, "plan": what,
                                            "num_rows": writer.rows, "chunk_rows": writer.chunk_rows,
                                            "schema": schema.to_string(), "reusable": reuse})
        _drop_versions(base + ".json", ".arrow")
        opened = _open_cache(base, snapshot, what, reuse=False)
        assert opened is not None
        return opened
    finally:
        if writer is not None:
            writer.abort()  # (a build that failed: nothing pending is written)
        if tmp_path is not None and os.path.exists(tmp_path):
            os.remove(tmp_path)


def _cache_base(plan: Plan, cache_dir: str | None) -> tuple[str, str, str | None]:
    """The snapshot digest, plan key and cache path (without extension) of ``plan``'s table."""
    found = scans(plan)
    snapshot = _digest(*(s.source.fingerprint() for s in found)) if found else ""
    what = plan_key(plan)
    base = os.path.join(cache_dir, f"ra-{_versioned_key(what, found, snapshot)}") if cache_dir else None
    return snapshot, what, base


def cached_table(plan: Plan, cache_dir: str | None, reuse: bool) -> TableRowSource | None:
    """The disk cache of ``plan``'s random-access table that ``materialize`` would reuse, else None."""
    snapshot, what, base = _cache_base(plan, cache_dir)
    return _open_cache(base, snapshot, what) if base and reuse and not _volatile(scans(plan)) else None


#: a spill file this old with no table written from it: a build that died (killed) mid-way
_ABANDONED_S = 6 * 3600


def _versioned_key(what: str, found: Sequence[Scan], *version: str) -> str:
    """``<lineage>-<version>`` (16 hex digits each) of a cache document: the plan ``what``
    over these sources (their roots), then the data's ``version``, so that a new version's
    document replaces the old one's (``_drop_versions``) and never another lake's under
    the same plan."""
    lineage = _digest(what, *(f"{type(s.source).__name__}:{getattr(s.source, 'root', '')}" for s in found))
    return f"{lineage[:16]}-{_digest(*version, what)[:16]}"


def _drop_versions(path: str, companion: str | None = None) -> None:
    """Remove the other versions of the cache document ``path`` (``<kind>-<lineage>-*.json``
    beside it: the same selection of the same lake on older data), each with its
    ``companion`` file (the ``.arrow`` of a random-access table), and, where it has one,
    spill files untouched for ``_ABANDONED_S`` (builds that died). A loader resuming an
    older snapshot builds them again. Best effort: a table another process has mapped stays
    readable to it."""
    folder, mine = os.path.split(path)
    lineage = mine[:mine.index("-") + 18]  # "<kind>-<16 hex>-"
    now = time.time()
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        other = os.path.join(folder, name)
        try:
            if companion and name.startswith(".tmp-ra-") and now - os.path.getmtime(other) > _ABANDONED_S:
                os.remove(other)
            elif name != mine and name.startswith(lineage) and name.endswith(".json"):
                os.remove(other)  # the manifest first: no reader trusts a table going away
                if companion:
                    os.remove(other[:-len(".json")] + companion)
        except OSError:
            continue


def _spill_file(base: str, memory_budget: int) -> str:
    """A new temporary file beside ``base`` for a table over ``memory_budget``; a cache dir
    that cannot take it is a ``MemoryBudgetError`` saying so (not a bare ``OSError``)."""
    folder = os.path.dirname(base)
    try:
        os.makedirs(folder, exist_ok=True)
        fd, path = tempfile.mkstemp(dir=folder, prefix=".tmp-ra-", suffix=".arrow")
    except OSError as exc:
        raise MemoryBudgetError(f"the selection needs more than memory_budget={memory_budget} bytes for "
                                f"random access, and the cache dir {folder!r} cannot take it on disk ({exc}); "
                                "pass a writable cache_dir= or raise memory_budget") from exc
    os.close(fd)
    return path


def _volatile(found: Sequence[Scan]) -> bool:
    """Whether a plan reads in-memory data: its fingerprint samples it (the first and last
    slices), so what is kept on disk under it (selection counts, a random-access table) is
    never reused, by this process or a later one: a later process's table of the same
    shape and ends read the earlier one's counts and rows."""
    return any(s.source.kind == "memory" for s in found)


def _map_unlinked(path: str) -> pa.Table:
    """The IPC file at ``path`` memory-mapped and read, the file then removed: the mapping
    keeps its pages until the table is dropped, and nothing is left behind."""
    try:
        return pa.ipc.open_file(pa.memory_map(path, "r")).read_all()
    finally:
        os.remove(path)


def _over_budget(memory_budget: int) -> MemoryBudgetError:
    return MemoryBudgetError(f"the selection needs more than memory_budget={memory_budget} bytes for "
                             "random access and no cache_dir is set; pass cache_dir= or raise memory_budget")


def _one_scan(plan: Plan) -> bool:
    """Whether ``plan`` reads one scan unit by unit with exact counts (``ScanRowSource``):
    no SQL, no limit; the rest (maps, projections, filters) runs per unit."""
    found = scans(plan)
    return len(found) == 1 and not any(
        isinstance(n, (Limit, SqlQuery)) or (isinstance(n, Scan) and n.limit is not None) for n in walk(plan))


def _surely_spills(found: Sequence[Scan], memory_budget: int) -> bool:
    """Whether the selection cannot fit ``memory_budget``: the compressed bytes of the columns
    read already exceed it (footers know; a filter can only be sure to spill if it keeps
    enough rows, so only the scan's own bytes decide)."""
    total = 0
    for scan in found:
        for unit in scan.selected_units():
            b = unit.bytes_for(scan.read_columns)
            if b is None:
                return False
            total += b
    return bool(found) and total > memory_budget


def _streaming(options: Options, local: bool) -> Options:
    """``options`` with the scan reading one batch and one file ahead, and (local files) no
    pre-buffering of a file's column chunks: building the disk cache then holds a few
    batches, where the defaults (tuned for speed while the table is kept in memory anyway)
    hold several files' worth. Object storage keeps pre-buffering (one request per range)."""
    scan = dataclasses.replace(options.scan, batch_readahead=1, fragment_readahead=1,
                               pre_buffer=options.scan.pre_buffer and not local)
    return dataclasses.replace(options, scan=scan)


def _combine(held: list[pa.RecordBatch], schema: pa.Schema) -> pa.Table:
    """One chunk per column, built column by column, each column's pieces released as soon
    as they are copied (``held`` is emptied): the peak is the table plus one column, where
    ``Table.combine_chunks`` holds the pieces and the copy of every column at once."""
    pieces = [[b.column(i) for b in held] for i in range(len(schema))]
    held.clear()
    columns = []
    for i, field in enumerate(schema):
        parts, pieces[i] = pieces[i], None
        columns.append(pa.concat_arrays(parts) if parts else pa.array([], field.type))
        del parts
    return pa.Table.from_arrays(columns, schema=schema)


class _ChunkWriter:
    """Writes batches re-cut to exactly ``chunk_rows`` rows (the last may be shorter), where
    ``chunk_rows`` comes from the first batch's row width and the memory budget
    (``budget.cache_chunk_rows``). Holds at most one chunk's rows besides the batch being
    written; a chunk is written from zero-copy slices of the pending batches (one copy
    only where a chunk spans several of them)."""

    def __init__(self, path: str, schema: pa.Schema, memory_budget: int) -> None:
        self.path = path
        self._writer = pa.ipc.new_file(path, schema)
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        self._budget = memory_budget
        self.chunk_rows = 0
        self.rows = 0
        self.closed = False
        self.schema = schema

    def write(self, batch: pa.RecordBatch) -> None:
        try:
            self._write(batch)
        except OSError as exc:
            raise self._failed(exc) from exc

    def _failed(self, exc: OSError) -> MemoryBudgetError:
        """A spill the disk cannot take (full, a file size limit): the budget's error, saying where."""
        self.abort()
        return MemoryBudgetError(f"the selection needs more than memory_budget={self._budget} bytes for random "
                                 f"access, and writing it to {os.path.dirname(self.path)!r} failed after "
                                 f"{self.rows} rows ({exc}); free space there, pass another cache_dir= or raise "
                                 "memory_budget")

    def abort(self) -> None:
        """Close the file without writing what is pending (a failed build: it is removed)."""
        self._pending, self._pending_rows = [], 0
        if not self.closed:
            self.closed = True
            try:
                self._writer.close()
            except OSError:
                pass

    def _write(self, batch: pa.RecordBatch) -> None:
        if not batch.num_rows:
            return
        if not self.chunk_rows:
            self.chunk_rows = cache_chunk_rows(self._budget, batch.nbytes / batch.num_rows)
        self._pending.append(batch)
        self._pending_rows += batch.num_rows
        while self._pending_rows >= self.chunk_rows:
            self._write_rows(self.chunk_rows)

    def _write_rows(self, n: int) -> None:
        parts, got = [], 0
        while got < n:
            b = self._pending.pop(0)
            take = min(b.num_rows, n - got)
            parts.append(b.slice(0, take) if take < b.num_rows else b)
            if take < b.num_rows:
                self._pending.insert(0, b.slice(take))
            got += take
        self._writer.write_batch(parts[0] if len(parts) == 1 else pa.concat_batches(parts))
        self._pending_rows -= n
        self.rows += n
        # hand the written chunk's freed pages back now: mimalloc (pyarrow's default pool)
        # otherwise keeps them past the next chunks, and a 64 MiB build measured 38-94 MiB of
        # anonymous memory where it holds 25 (26-60 with this call; tests/test_memory.py)
        pa.default_memory_pool().release_unused()

    def close(self) -> None:
        try:
            if self._pending_rows:
                self._write_rows(self._pending_rows)
            self._writer.close()
        except OSError as exc:
            raise self._failed(exc) from exc
        self.closed = True


def _open_cache(base: str, snapshot: str, what: str, reuse: bool = True) -> TableRowSource | None:
    """The cache at ``base`` if it matches; ``reuse``: only if its manifest allows reuse (a
    cache of an unnamed map renders like a named one but must never be reused)."""
    try:
        doc = read_ra_manifest(load_json(base + ".json"), base + ".json")
        if doc.snapshot != snapshot or doc.plan != what or (reuse and not doc.reusable):
            return None
        source = pa.memory_map(base + ".arrow", "r")
        table = pa.ipc.open_file(source).read_all()
        if table.num_rows != doc.num_rows:
            return None
        return TableRowSource(table, where=base + ".arrow", snapshot=snapshot)
    except (OSError, ArrowloadError, pa.ArrowInvalid):
        return None


def window_step() -> int:
    """Row groups of a window polars decodes at once before they are placed: two per
    polars thread (its pool then stays busy), at least two; fewer decoded tables are held
    than a whole window's."""
    return max(2, 2 * polars_threads())


def _fixed_width(t: pa.DataType) -> float | None:
    """Bytes per value of a fixed-width type (a fixed-size list: its width times its
    values'), None for variable-width ones (strings, lists, dictionaries, structs)."""
    if pa.types.is_fixed_size_list(t):
        inner = _fixed_width(t.value_type)
        return None if inner is None else inner * t.list_size
    if isinstance(t, pa.BaseExtensionType):
        return _fixed_width(t.storage_type)
    if pa.types.is_dictionary(t) or pa.types.is_null(t):
        return None
    try:
        return t.bit_width / 8
    except ValueError:  # not fixed width
        return None


def _decoded_bytes(units, fields: Sequence[pa.Field], counts: Sequence[int]) -> tuple[int, ...]:
    """What a read of each of ``units`` holds decoded: ``ScanRowSource.est_bytes``. The
    footer's row count where it has one (a filter keeps fewer, but the read decodes all),
    else the unit's count."""
    widths = [(f.name, _fixed_width(f.type)) for f in fields]
    row_width = sum(w for _, w in widths if w is not None)
    varying = [n for n, w in widths if w is None]
    names = [f.name for f in fields]
    out = []
    for unit, count in zip(units, counts):
        rows = unit.num_rows if unit.num_rows is not None else count
        sizes = unit.column_bytes
        if sizes is None or not getattr(sizes, "known", True) or "*" in sizes:  # no per-column sizes: the old rule
            b = unit.bytes_for(names)
            out.append(int(b * 3) if b else count * 64)
            continue
        get = sizes.get
        out.append(max(1, int(rows * row_width + 3 * sum(get(n, 0) for n in varying))))
    return tuple(out)


def _strip_maps(plan: Plan) -> Plan:
    """Maps keep one row per row (checked when reading), so counting can skip them -- all
    but those a filter above reads through: a column a map adds or rewrites decides which
    rows a filter over it keeps. (Projections above that name a map's columns keep it too.)"""
    def strip(node: Plan, filtered: bool) -> Plan:
        filtered = filtered or isinstance(node, Filter)
        kids = [strip(c, filtered) for c in node.children]
        if isinstance(node, Map) and not filtered:
            return kids[0]
        return node if all(k is c for k, c in zip(kids, node.children)) else node.with_children(*kids)
    try:
        return strip(plan, False)
    except ArrowloadError:  # a projection names a column a stripped map made
        return plan


# -- helpers of the tasks' reads ---------------------------------------------------------

def _load(key, load):
    """No shared cache: every read loads."""
    return load()


def _serial(fn, items) -> list:
    return [fn(x) for x in items]


def slice_parts(parts: list, lo: int, hi: int) -> list:
    """Rows ``lo .. hi`` of consecutive ``parts`` (host chunks or record batches): the parts
    themselves or views of them, no copy."""
    out, at = [], 0
    for part in parts:
        n = part.num_rows
        a, b = max(lo, at), min(hi, at + n)
        if a < b:
            out.append(part if (a, b) == (at, at + n) else part.slice(a - at, b - a))
        at += n
        if at >= hi:
            break
    return out


def _parts(table: pa.Table, conv) -> tuple[list, float]:
    """A read's rows as parts: its non-empty record batches, each converted whole by
    ``conv`` where it can be (``ChunkConverter.chunk``); and the seconds converting took."""
    batches = [b for b in table.to_batches() if b.num_rows]
    if conv is None:
        return batches, 0.0
    t0 = time.perf_counter()
    items = [conv.chunk(b) for b in batches]
    return items, time.perf_counter() - t0
