"""Host chunks: the rows of one read converted to host arrays once, on a reader thread.

The loader reads in units (a row group, a 64 Ki-row slice of the random-access table, a
gathered run of shuffled rows). Converting every batch on its own costs microseconds per
column per batch of Python work (wrapping Arrow arrays, making views) on the one thread
that orders batches. Instead, the reader thread that made a read converts it whole:

- a read from the scan (or a slice of the random-access table) becomes zero-copy views
  of its Arrow buffers, and ``stack=`` columns are written once into a pooled
  ``[rows, k]`` buffer;
- a shuffled gather goes straight into pooled buffers: ``np.take`` from host views of the
  random-access table (made once per table) into a buffer from the pool, a stacked column
  into its column of the ``[rows, k]`` buffer. No Arrow ``take``, no second copy. A
  ``stack=`` group the table already holds row-major (``rabuild``: a fixed-size-list
  column named for the group) is one ``np.take`` along rows;
- a block-shuffle window of a scan is placed unit by unit as its units are read
  (:class:`WindowLayout`): scattered to its shuffled positions, or laid out and gathered.

A batch is then a set of views ``arr[lo:hi]`` of one chunk; a batch that straddles two
chunks is concatenated into a pooled buffer (the one planned copy).

What has to be decided per batch stays on the per-batch Arrow path (``Loader._collate``):
a variable-length list padded to the longest list of its batch (with ``pad_to`` its
width is fixed and it is padded per read, into a pooled buffer; unpadded, its lists of
one length ``k`` are ``[rows, k]`` views like a fixed-size list's), a ``transform=``
(it sees Arrow batches), ``output="arrow"``. A chunk that cannot convert (a null without
``fill_null``) is kept as Arrow and converted when its batches are cut, so the error is
raised for the batch that holds the bad value, after the batches before it.

Lifetime: a chunk's arrays are pooled buffers or views of Arrow memory; each batch view
keeps its buffer's owner referenced, and the pool (``collate.BufferPool``) reuses a buffer
only when nothing outside it refers to the owner. A batch the user holds keeps the whole
chunk buffer it came from (at most one read's rows) alive, never overwritten.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from .._pickle import PicklableLock
from ..convert import convert_host
from ..convert.host import array_valued, to_host
from ..convert.options import ConvertOptions
from ..errors import ConversionError
from ..plan.rowselect import take_rows
from .collate import BufferPool, StackSpec, member_view, resolve_stack, stack_batch, write_by_row_blocks
from .rabuild import stacked_members


class ColumnRows:
    """``num_rows`` rows as columns (first axis = rows), keyed in output order, of
    ``row_bytes`` each: :class:`HostChunk` on the host, ``device.DeviceChunk`` on a GPU."""

    __slots__ = ("columns", "num_rows", "row_bytes")

    def __init__(self, columns: dict, num_rows: int, row_bytes: float) -> None:
        self.columns = columns
        self.num_rows = num_rows
        self.row_bytes = row_bytes

    @property
    def nbytes(self) -> int:
        return int(self.row_bytes * self.num_rows)

    def slice(self, offset: int, length: int | None = None):
        """Rows ``offset .. offset + length``: views of the same columns (lists are sliced)."""
        if length is None:
            length = self.num_rows - offset
        stop = offset + length
        return self._with({k: v[offset:stop] for k, v in self.columns.items()}, length)

    def _with(self, columns: dict, num_rows: int):
        """A chunk like this one holding ``columns``."""
        return type(self)(columns, num_rows, self.row_bytes)


#: bytes a Python object in a converted column costs beyond its Arrow bytes: a short str
#: (49-byte header) and its list slot (8), rounded up (a Decimal or datetime is about as much)
PY_OBJECT_BYTES = 64


#: numpy dtype kinds a read may go to a device whole as (bool, integers, floats, complex,
#: datetimes as their int64 counts)
NUMERIC_KINDS = frozenset("biufcmM")


class HostChunk(ColumnRows):
    """Host arrays (first axis = rows) or Python lists of ``num_rows`` rows, keyed in output order."""

    __slots__ = ()


def goes_whole(columns: Mapping) -> bool:
    """Whether a read's converted ``columns`` can go to a device whole: every one a numeric
    host array or a :class:`StackParts` (not Python lists: strings, decimals, ...)."""
    return all((isinstance(v, np.ndarray) and v.dtype.kind in NUMERIC_KINDS) or isinstance(v, StackParts)
               for v in columns.values())


class StackParts:
    """A ``stack=`` group of one read left as its columns: 1-D arrays of one dtype (views
    of Arrow buffers), for a CUDA stage to stack on the device (``device.TorchDeviceStage``)
    rather than by a strided host copy. Only the reads a CUDA stage copies whole hold one
    (:class:`DeviceReads`); :meth:`stacked` is the host array, should one be needed."""

    __slots__ = ("dtype", "members", "nbytes", "shape")

    def __init__(self, members: Sequence[np.ndarray]) -> None:
        self.members = tuple(members)
        first = self.members[0]
        self.dtype = first.dtype
        self.shape = (len(first), len(self.members))
        self.nbytes = first.nbytes * len(self.members)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows: slice) -> "StackParts":
        return StackParts([m[rows] for m in self.members])

    def stacked(self, take) -> np.ndarray:
        """The ``[rows, k]`` host array, written into ``take(shape, dtype)``."""
        n, _ = self.shape
        out = take(self.shape, self.dtype)
        write_by_row_blocks(out, list(enumerate(self.members)), n)
        return out


def _varlist(t: pa.DataType) -> bool:
    """A column whose array form depends on the batch (padded to the batch's longest list)."""
    while True:
        if pa.types.is_dictionary(t):
            t = t.value_type
        elif isinstance(t, pa.BaseExtensionType):
            t = t.storage_type
        else:
            break
    return (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t)
            or pa.types.is_large_list_view(t))


class ChunkConverter(PicklableLock):
    """Converts one loader's reads into :class:`HostChunk` (thread-safe)."""

    def __init__(self, opts: ConvertOptions, stack: Mapping[str, Any] | None, pool: BufferPool) -> None:
        self.opts = opts
        self.stack = stack
        self.pool = pool
        self._lock = threading.Lock()
        self._specs: dict[pa.Schema, tuple[bool, StackSpec | None]] = {}
        self._widths: dict[pa.Schema, float] = {}  # _row_bytes: 0.0 where not fixed-width
        self._views: tuple[Any, ...] | None = None  # (table, its views or None): the last table gathered from

    def __getstate__(self):
        state = super().__getstate__()
        state["_views"] = None  # never pickle a table; rebuilt on first use
        state["_specs"] = {}
        state["_widths"] = {}
        return state

    # -- layout ------------------------------------------------------------------
    def _layout(self, schema: pa.Schema) -> tuple[bool, StackSpec | None]:
        """(whether reads of this schema convert whole, the stacking to apply)."""
        found = self._specs.get(schema)
        if found is None:
            # a padded list converts whole only at a fixed width (pad_to): padded to the longest
            # list of its batch, its shape depends on the batch
            # (an unpadded one converts as [rows, k] when its lists have one length k, else errors)
            fixed = self.opts.pad_to is not None
            whole = all(not _varlist(f.type) or fixed or not self.opts.pads(f.name) for f in schema)
            stack = self.stack
            held = {f.name for f in schema if stacked_members(f) is not None}
            if stack and held:  # groups the table holds stacked already (rabuild)
                stack = {out: cols for out, cols in stack.items() if out not in held}
            spec = resolve_stack(stack, schema) if stack else None
            found = self._specs[schema] = (whole, spec)
        return found

    def host(self, batch: pa.RecordBatch) -> dict:
        """``batch`` as host arrays, stacked as asked; raises ``ConversionError``."""
        _, spec = self._layout(batch.schema)
        if spec is not None:
            host = stack_batch(batch, spec, self.pool, self.opts)
        else:
            host = to_host(batch, self.opts, self.pool.take)
        return self._finish(host)

    def _finish(self, host: dict) -> dict:
        """numpy output: read-only arrays, as ``convert_host`` makes them (torch / jax wrap each
        batch's views as they leave: a torch tensor per chunk sliced per batch was measured
        slower -- every torch call releases and retakes the GIL, contended by the readers)."""
        return convert_host(host, self.opts) if self.opts.output == "numpy" else host

    def _host_chunk(self, batch: pa.RecordBatch, host: dict | None = None) -> HostChunk:
        """``batch`` converted (or its conversion ``host``, made by the caller) as a chunk."""
        if host is None:
            host = self.host(batch)
        # a column converted to Python objects (strings, decimals, ...) holds an object and a
        # list slot per row beside its Arrow bytes: counted, or the prefetch budget saw a
        # short-string column's 9 bytes a row where it held about 70 (a block shuffle of one
        # such column: 189 MiB resident at prefetch 4 MiB, the budget's peak 7 MiB)
        objects = sum(1 for v in host.values() if isinstance(v, list))
        return HostChunk(host, batch.num_rows, self._row_bytes(batch) + objects * PY_OBJECT_BYTES)

    def _row_bytes(self, batch: pa.RecordBatch) -> float:
        """Bytes per row of ``batch``, for the prefetch budget: of a schema of fixed-width
        columns, their widths and a validity bit each (worked out once per schema: Arrow's
        ``nbytes`` walks every buffer, 27 us for 17 columns, as long as converting them);
        else ``nbytes`` over the rows."""
        schema = batch.schema
        width = self._widths.get(schema)
        if width is None:
            try:
                if any(pa.types.is_dictionary(f.type) or isinstance(f.type, pa.BaseExtensionType) for f in schema):
                    raise ValueError  # a dictionary's width is its indices'
                width = sum(f.type.bit_width + 1 for f in schema) / 8
            except ValueError:  # a variable-width, nested or dictionary column
                width = 0.0
            self._widths[schema] = width
        return width if width else batch.nbytes / max(1, batch.num_rows)

    def chunk(self, batch: pa.RecordBatch) -> "HostChunk | pa.RecordBatch":
        """``batch`` converted whole, or the batch itself where its batches must convert one by one."""
        if not self._layout(batch.schema)[0]:
            return batch
        try:
            return self._host_chunk(batch)
        except ConversionError:
            return batch  # converted when its batches are cut: the error names that batch

    def device_chunk(self, batch: pa.RecordBatch) -> "HostChunk | pa.RecordBatch":
        """As :meth:`chunk`, for a read a CUDA stage copies whole: a ``stack=`` group whose
        columns are null-free numbers of the group's dtype stays as its columns
        (:class:`StackParts`, views of the Arrow buffers), stacked on the device instead of
        by a host copy. Only where every other column is a numeric host array too, so the
        stage takes the whole read (``device._whole``); else as :meth:`chunk`."""
        whole, spec = self._layout(batch.schema)
        if whole and spec is not None:
            groups = []
            for (out, cols), dtype in zip(spec.groups, spec.dtypes):
                members = []
                for c in cols:
                    view = member_view(batch.column(c), dtype)
                    if view is None or view.dtype != dtype:
                        return self.chunk(batch)
                    members.append(view)
                groups.append((out, StackParts(members)))
            try:
                host = stack_batch(batch, spec, self.pool, self.opts, groups)
            except ConversionError:
                return batch
            if goes_whole(host):
                return HostChunk(host, batch.num_rows, self._row_bytes(batch))
            # a column the stage will not take whole (strings, ...): the groups stacked here,
            # the rest as converted already
            host = {k: v.stacked(self.pool.take) if isinstance(v, StackParts) else v for k, v in host.items()}
            return self._host_chunk(batch, self._finish(host))
        return self.chunk(batch)

    # -- cutting batches -------------------------------------------------------------
    def combine(self, parts: Sequence["HostChunk | pa.RecordBatch"]) -> "HostChunk | pa.RecordBatch":
        """One batch from consecutive parts: a part itself when there is one, else the parts'
        arrays concatenated into pooled buffers. Arrow parts between host chunks are
        converted here (raising for this batch if they cannot be)."""
        if all(isinstance(p, pa.RecordBatch) for p in parts):
            return parts[0] if len(parts) == 1 else pa.concat_batches(parts)
        chunks = [p if isinstance(p, HostChunk) else self._host_chunk(p) for p in parts]
        if len(chunks) == 1:
            return chunks[0]
        n = sum(c.num_rows for c in chunks)
        columns = {}
        for name, first in chunks[0].columns.items():
            values = [c.columns[name] for c in chunks]
            if isinstance(first, np.ndarray):
                check_widths(name, values)
                out = self.pool.take((n, *first.shape[1:]), first.dtype)
                np.concatenate(values, out=out)
                columns[name] = out
            else:
                columns[name] = [x for v in values for x in v]
        return HostChunk(self._finish(columns), n, sum(c.nbytes for c in chunks) / n)

    # -- gathers ------------------------------------------------------------------------
    def window(self, schema: pa.Schema, rows: int, positions: np.ndarray | None = None) -> "WindowLayout | None":
        """A :class:`WindowLayout` for ``rows`` rows of ``schema`` (a block-shuffle window
        of a scan; ``positions``: each row's place in the output, to scatter), or ``None``
        when its columns have no host arrays (strings ...) or must convert per batch
        (padded lists): the caller then gathers with Arrow."""
        whole, _ = self._layout(schema)
        if not whole or not all(array_valued(f.type) and not (_varlist(f.type) and self.opts.pads(f.name))
                                for f in schema):
            return None
        return WindowLayout(self, schema, rows, positions)

    def _table_views(self, table: pa.Table, keep: bool):
        """(chunk start offsets, host views of each chunk's columns) of ``table``, or ``None``
        when a column has no array form (strings ...) or does not convert (nulls)."""
        with self._lock:
            if self._views is not None and self._views[0] is table:
                return self._views[1]
            views = None
            opts = self.opts
            members = {m for f in table.schema for m in (stacked_members(f) or ())}
            if members and opts.fill_null:  # held stacked only without nulls: nothing to fill
                opts = dataclasses.replace(opts, fill_null={k: v for k, v in opts.fill_null.items()
                                                            if k not in members})
            if all(array_valued(f.type) and not (_varlist(f.type) and self.opts.pads(f.name))
                   for f in table.schema):
                try:
                    batches = table.to_batches()
                    parts = [to_host(b, opts) for b in batches]
                    lengths = [b.num_rows for b in batches]
                    views = (np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64), parts)
                except ConversionError:
                    views = None
            if keep:
                self._views = (table, views)
            return views

    def gather(self, table: pa.Table, rows: np.ndarray, keep: bool = True) -> HostChunk | None:
        """Rows ``rows`` of ``table``, in that order, gathered into pooled buffers; ``None`` when
        the table's columns have no host views (the caller then gathers with Arrow).
        ``keep``: cache the table's views for the next gather (the random-access table).

        A gather of at least half of a table of several chunks first lays each output out contiguously -- a stack group row-major
        ``[rows, k]``, a column concatenated -- with sequential copies into a temporary
        (freed at once, never pooled), then takes it along rows: the copy Arrow's
        ``combine_chunks`` would have made, and then one random access per row where ``k``
        takes make ``k`` (524,288-row window, 16 float32: 0.024 s against 0.058 s).
        Otherwise (one chunk, or a global shuffle's smaller gathers) each column is taken
        from the table's own views; into a stack group's column through a contiguous
        temporary (a take with a strided ``out`` is 1.5x slower)."""
        found = self._table_views(table, keep)
        if found is None:
            return None
        offsets, parts = found
        total = int(offsets[-1])
        n = len(rows)
        if n and (rows.min() < 0 or rows.max() >= total):
            raise IndexError(f"gather rows out of range 0..{total}")
        _, spec = self._layout(table.schema)
        stacked = spec.stacked if spec is not None else frozenset()
        first = spec.first if spec is not None else {}
        dense = len(parts) > 1 and 2 * n >= total
        groups = None if dense else _chunk_groups(offsets, rows, len(parts))
        columns = {}
        for name in table.schema.names:
            g = first.get(name)
            if g is not None:
                out_name, cols = spec.groups[g]
                buf = self.pool.take((n, len(cols)), spec.dtypes[g])
                if dense:
                    whole = np.empty((total, len(cols)), spec.dtypes[g])  # freed at once: never pooled
                    for c, p in enumerate(parts):
                        lo, hi = offsets[c], offsets[c + 1]
                        for j, col in enumerate(cols):
                            whole[lo:hi, j] = p[col]
                    np.take(whole, rows, axis=0, out=buf, mode="clip")  # rows checked above
                    del whole
                else:
                    for j, c in enumerate(cols):
                        _take_into(buf[:, j], [p[c] for p in parts], groups)
                columns[out_name] = buf
            elif name not in stacked:
                sample = parts[0][name]
                buf = self.pool.take((n, *sample.shape[1:]), sample.dtype)
                if dense:
                    whole = np.empty((total, *sample.shape[1:]), sample.dtype)
                    np.concatenate([p[name] for p in parts], out=whole)
                    np.take(whole, rows, axis=0, out=buf, mode="clip")
                    del whole
                else:
                    _take_into(buf, [p[name] for p in parts], groups)
                columns[name] = buf
        return HostChunk(self._finish(columns), n, table.nbytes / max(1, table.num_rows))


class DeviceReads:
    """A loader's converter for the reads a CUDA stage copies whole (``Loader._stages``):
    reads convert by :meth:`ChunkConverter.device_chunk`; all else is the converter's own.
    The converter itself stays as it is: a mixture shares it with no device stage."""

    __slots__ = ("conv",)

    def __init__(self, conv: ChunkConverter) -> None:
        self.conv = conv

    def chunk(self, batch: pa.RecordBatch) -> "HostChunk | pa.RecordBatch":
        return self.conv.device_chunk(batch)

    def __getattr__(self, name: str) -> Any:
        if name == "conv":  # not set yet (a copy being made): no recursion through it
            raise AttributeError(name)
        return getattr(self.conv, name)


class WindowLayout:
    """The rows of a block-shuffle window, placed as its units are read (thread-safe ``put``).

    Each unit of the window is copied into pooled buffers as soon as it is read (``put``, on
    the reader thread that read it; the unit's Arrow table is then dropped): a ``stack=``
    group as ``[rows, k]`` rows, every other column as is. Two ways, made by
    :meth:`ChunkConverter.window`:

    - ``positions`` given (a task covering its whole window): each unit's rows go straight
      to their places in the output (``positions[row]``: the inverse of the window's
      permutation), a stack group laid out row-major per unit first (a small temporary)
      and scattered one row at a time; ``result()`` is the window, shuffled. The window
      holds its rows once.
    - no ``positions`` (part of a window, a read shared between tasks): the units are laid
      out in window order and ``gather(local)`` takes any positions along rows; the window
      then holds its rows twice at most (laid out, gathered: ``order.tasks.WINDOW_COPIES``).

    Measured on one 524,288-row window of 16 float32 + an int8 label (CPU seconds): scatter
    0.022; lay out 0.009 + take 0.021; concatenating the units into one chunk and taking
    each column (through a temporary per stacked column, the previous way) 0.047-0.052."""

    def __init__(self, conv: "ChunkConverter", schema: pa.Schema, rows: int,
                 positions: np.ndarray | None = None) -> None:
        self.conv = conv
        self.schema = schema
        self.rows = rows
        self.positions = positions
        self.seconds = 0.0  # time spent placing rows (the reads' convert time), see take_seconds
        self.failed = False  # a unit did not convert (nulls): the caller gathers with Arrow
        self._lock = threading.Lock()
        self._buffers: dict | None = None  # output name -> (buffer, stacked columns or None)
        self._row_bytes = 0.0

    def _allocate(self, host: dict) -> dict:
        _, spec = self.conv._layout(self.schema)
        first = spec.first if spec is not None else {}
        stacked = spec.stacked if spec is not None else frozenset()
        buffers = {}
        for name in self.schema.names:
            g = first.get(name)
            if g is not None:
                out_name, cols = spec.groups[g]
                buffers[out_name] = (self.conv.pool.take((self.rows, len(cols)), spec.dtypes[g]), cols)
            elif name not in stacked:
                v = host[name]
                buffers[name] = (self.conv.pool.take((self.rows, *v.shape[1:]), v.dtype), None)
        return buffers

    def put(self, offset: int, table) -> None:
        """Place ``table`` (a unit's rows: window rows ``offset ..``): a table, or rows by
        position in one (``rabuild.Picked``: a mixture's shared decode), each taken once
        into its place."""
        if self.failed or not table.num_rows:
            return
        t0 = time.perf_counter()
        rows = getattr(table, "rows", None)
        if rows is not None:  # a Picked: its rows by position in the decoded unit's arrays
            table = table.table
            try:
                host = to_host(table, self.conv.opts)
            except ConversionError:  # a null among rows it does not pick: its rows taken first
                table, rows = take_rows(table, pa.array(rows, pa.int64())), None
        if rows is None:
            try:
                host = to_host(table, self.conv.opts)
            except ConversionError:
                self.failed = True
                return
        with self._lock:
            if self._buffers is None:
                self._buffers = self._allocate(host)
                self._row_bytes = table.nbytes / table.num_rows
            buffers = self._buffers
        m = table.num_rows if rows is None else len(rows)
        stop = offset + m
        pos = None if self.positions is None else self.positions[offset:stop]
        for name, (buf, cols) in buffers.items():
            if cols is None:
                v = host[name]
                if v.shape[1:] != buf.shape[1:]:  # lists of another length in this unit
                    self.failed = True
                    return
                if pos is None:
                    if rows is None:
                        buf[offset:stop] = v
                    elif v.dtype == buf.dtype:
                        np.take(v, rows, axis=0, out=buf[offset:stop], mode="clip")  # rows: in range
                    else:
                        buf[offset:stop] = v[rows]
                else:
                    _scatter_rows(buf, pos, np.ascontiguousarray(v if rows is None else v[rows], dtype=buf.dtype))
            else:  # a stack group, written by row blocks
                members = [(j, host[c] if rows is None else host[c][rows]) for j, c in enumerate(cols)]
                if pos is None:
                    write_by_row_blocks(buf[offset:stop], members, m)
                else:
                    unit = self.conv.pool.take((m, len(cols)), buf.dtype)  # the unit row-major
                    write_by_row_blocks(unit, members, m)
                    _scatter_rows(buf, pos, unit)
                    del unit
        with self._lock:
            self.seconds += time.perf_counter() - t0

    def result(self) -> HostChunk:
        """The whole window in its shuffled order (``positions`` given, every unit put)."""
        columns = {name: buf for name, (buf, _) in (self._buffers or {}).items()}
        return HostChunk(self.conv._finish(columns), self.rows, self._row_bytes)

    def gather(self, local: np.ndarray) -> HostChunk:
        """Rows ``local`` (indices into the window's rows) in that order, in pooled buffers."""
        n = len(local)
        if n and (local.min() < 0 or local.max() >= self.rows):
            raise IndexError(f"gather rows out of range 0..{self.rows}")
        columns = {}
        for name, (buf, _) in (self._buffers or {}).items():
            out = self.conv.pool.take((n, *buf.shape[1:]), buf.dtype)
            np.take(buf, local, axis=0, out=out, mode="clip")  # rows checked above
            columns[name] = out
        return HostChunk(self.conv._finish(columns), n, self._row_bytes)

    def take_seconds(self) -> float:
        """The seconds spent placing rows, once (the first task reading the window reports them)."""
        with self._lock:
            secs, self.seconds = self.seconds, 0.0
        return secs


def _row_items(a: np.ndarray) -> np.ndarray | None:
    """``a`` (C-contiguous ``[n, k, ...]``) as a 1-D view of ``n`` opaque items, one a row;
    None for a 1-D, strided, rowless or empty-row array."""
    if a.ndim == 1 or not a.flags.c_contiguous or len(a) == 0:
        return None
    width = a.dtype.itemsize * math.prod(a.shape[1:])  # (np.prod of a shape: 3 us a call, here per column)
    if width == 0:
        return None
    return a.reshape(len(a), -1).view(np.dtype((np.void, width))).reshape(-1)


def _scatter_rows(out: np.ndarray, pos: np.ndarray, rows: np.ndarray) -> None:
    """``out[pos] = rows`` along the first axis, each row moved as one opaque item
    (numpy's fancy assignment of ``[n, k]`` rows is about 2x slower)."""
    items, moved = _row_items(out), _row_items(rows)
    if items is None or moved is None:
        out[pos] = rows
        return
    np.put(items, pos, moved)


def _take_rows(src: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``src[rows]`` along the first axis, each row moved as one opaque item where ``src``
    is C-contiguous ``[n, k, ...]`` (numpy's fancy indexing of such rows is about 2x
    slower)."""
    items = _row_items(src)
    if items is None:
        return src[rows]
    return items[rows].view(src.dtype).reshape(len(rows), *src.shape[1:])


def _chunk_groups(offsets: np.ndarray, rows: np.ndarray, chunks: int) -> list:
    """(positions in the output, rows within the chunk) of each chunk (``None`` positions:
    one chunk, all rows in order)."""
    if chunks == 1:
        return [(None, rows)]
    which = np.searchsorted(offsets, rows, side="right") - 1
    if chunks <= 1 << 16:  # numpy radix-sorts 16-bit keys: O(n) where int64 keys take timsort
        which = which.astype(np.uint16)
    order = np.argsort(which, kind="stable")
    bounds = np.searchsorted(which[order], np.arange(chunks + 1))
    return [(order[bounds[c]:bounds[c + 1]], rows[order[bounds[c]:bounds[c + 1]]] - offsets[c])
            for c in range(chunks)]


def _take_into(out: np.ndarray, views: list[np.ndarray], groups) -> None:
    """``out[i] = concat(views)[row i]`` per group of (output positions, rows of one view)."""
    for (pos, local), view in zip(groups, views):
        if pos is None:
            if view.dtype == out.dtype and out.flags.c_contiguous:
                np.take(view, local, axis=0, out=out, mode="clip")  # rows checked by the caller
            else:  # a column of a stack group: take contiguously, then one strided copy
                out[...] = np.take(view, local, axis=0, mode="clip")
        elif len(pos):
            out[pos] = np.take(view, local, axis=0, mode="clip")


def check_widths(name: str, values: Sequence) -> None:
    """Refuse joining the parts ``values`` (arrays or tensors) of column ``name`` into one
    batch where their rows differ in shape: lists of other widths (``_widths_differ``)."""
    first = values[0]
    for v in values[1:]:
        if v.shape[1:] != first.shape[1:]:
            _widths_differ(name, tuple(first.shape), tuple(v.shape))


def _widths_differ(name: str, a: tuple, b: tuple) -> None:
    """Refuse a batch whose parts' lists of column ``name`` have other widths (shapes ``a``,
    ``b``): the same error as between batches (``preflight.ListWidths``)."""
    raise ConversionError(f"column {name!r} is a variable-length list whose lists have {b[1]} values in one "
                          f"part of this batch and {a[1]} in another, which gives no rectangular batch; "
                          f"{pad_fix(name, max(a[1], b[1]))}", column=name)


def pad_fix(name: str, longest: int | None = None) -> str:
    """What to do about list column ``name`` whose lists differ in length (or are null)."""
    width = str(longest) if longest else "N"
    return (f"pass pad_lists=True, pad_to={width} (or pad_lists=({name!r},)) to pad it with pad_value "
            f"and get '{name}_lengths', or make it a fixed-size list in the plan")
