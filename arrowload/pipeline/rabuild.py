"""Building the random-access table at decode speed (what a global shuffle gathers from).

For a plan over one scan every unit's row count is known before anything is read
(``ScanRowSource.counts``), so the table's layout is too. Units are read side by side
(threads, never more than the cores) through ``ScanRowSource.read_unit`` and each is
copied straight to its row offset, column by column, then dropped:

- fixed-width columns (integers, floats, dates, times, timestamps, durations, and
  fixed-size lists of them) go into one preallocated buffer each, wrapped zero-copy as an
  Arrow array at the end; nulls are kept (a byte mask made only for a column that has
  some, packed into its validity bitmap at the end), so the table equals the scan's;
- a ``stack=`` group (``{"x": ["f0", ..., "f15"]}``) whose columns all have the group's
  dtype and no nulls, in a table whose other columns are fixed-width or booleans (its
  batches are then gathered into host arrays), is written row-major into one
  ``[rows, k]`` buffer and held as a fixed-size-list column named for the group (the
  member columns are not kept twice): a shuffled batch is then one ``np.take`` along
  rows (see ``chunks.ChunkConverter.gather``).
  The field carries ``STACK_KEY`` metadata naming its columns; a group with nulls is
  split back into its columns at the end (the null checks and fills then see them);
- other columns (strings, booleans, variable-length lists, structs, decimals) keep each
  unit's arrays and are concatenated column by column at the end.

No concatenation of whole tables, no copy of the table: the peak is the table plus the
units being read (one per thread) plus, at the end, one variable-width column's copy.

``build_stream`` fills the same layout from one polars streaming query's record batches
(``scan/stream.py``: polars decodes the units in order on its own threads, ahead by a
few row groups), each written at its running row offset on the calling thread.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from .. import progress as _progress
from ..convert.host import valid_bits
from ..errors import ArrowloadError
from ..options import usable_cores
from ..plan.rowselect import take_rows
from ..scan.decoders import recoverable
from ..scan.stream import polars_ready
from .collate import resolve_stack, write_by_row_blocks

#: field metadata of a stacked column: JSON list of the columns it holds, in order
STACK_KEY = b"arrowload.stack"

_RAW = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _fixed_leaf(t: pa.DataType) -> bool:
    return ((pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_temporal(t))
            and getattr(t, "bit_width", 0) in (8, 16, 32, 64))


def stacked_members(f: pa.Field) -> tuple[str, ...] | None:
    """The columns a stacked field holds (``STACK_KEY`` metadata), or None."""
    meta = f.metadata
    if not meta or STACK_KEY not in meta:
        return None
    return tuple(json.loads(meta[STACK_KEY]))


# ---------------------------------------------------------------------------
# the layout


class _Fixed:
    """One fixed-width column: ``width`` leaf values per row in one buffer, validity masks
    made on the first null seen."""

    def __init__(self, name: str, t: pa.DataType, rows: int) -> None:
        self.name, self.type, self.rows = name, t, rows
        self.list = pa.types.is_fixed_size_list(t)
        self.leaf = t.value_type if self.list else t
        self.width = t.list_size if self.list else 1
        self.raw = np.dtype(_RAW[self.leaf.bit_width // 8])
        self.values = _allocate(rows * self.width, self.raw)
        self.buffer = pa.py_buffer(self.values)
        self.valid: np.ndarray | None = None        # rows
        self.leaf_valid: np.ndarray | None = None   # rows * width (lists' values)
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return self.buffer.size

    def _mask(self, attr: str, size: int) -> np.ndarray:
        with self._lock:
            mask = getattr(self, attr)
            if mask is None:
                mask = np.ones(size, dtype=bool)
                setattr(self, attr, mask)
            return mask

    def put(self, arr: pa.Array, at: int, rows: np.ndarray | None = None) -> None:
        """``arr``'s rows (or its rows ``rows``, positions in order: ``np.take`` straight
        into the buffer) written from row ``at`` on."""
        n = len(arr) if rows is None else len(rows)
        if n == 0:
            return
        if arr.null_count:
            valid = valid_bits(arr)
            self._mask("valid", self.rows)[at:at + n] = valid if rows is None else valid[rows]
        w = self.width
        if self.list:
            values = arr.values.slice(arr.offset * w, len(arr) * w)
            if values.null_count:
                leaf = valid_bits(values)
                self._mask("leaf_valid", self.rows * w)[at * w:(at + n) * w] = \
                    leaf if rows is None else leaf.reshape(-1, w)[rows].reshape(-1)
        else:
            values = arr
        raw = _raw_view(values, self.raw)
        dest = self.values[at * w:(at + n) * w]
        if rows is None or isinstance(raw, int):  # an int: nulls without a data buffer
            dest[...] = raw
        elif w == 1:
            np.take(raw, rows, out=dest)
        else:
            np.take(raw.reshape(-1, w), rows, axis=0, out=dest.reshape(n, w))

    def array(self) -> pa.Array:
        leaf = pa.Array.from_buffers(self.leaf, self.rows * self.width,
                                     [_bitmap(self.leaf_valid) if self.list else _bitmap(self.valid),
                                      self.buffer])
        if not self.list:
            return leaf
        return pa.Array.from_buffers(self.type, self.rows, [_bitmap(self.valid)], children=[leaf])


class _Group:
    """A ``stack=`` group: its columns' values row-major in one ``[rows, k]`` buffer."""

    def __init__(self, out: str, members: tuple[str, ...], dtype: np.dtype, rows: int) -> None:
        self.out, self.members, self.dtype, self.rows = out, members, np.dtype(dtype), rows
        k = len(members)
        self.values = _allocate(rows * k, self.dtype).reshape(rows, k)
        self.buffer = pa.py_buffer(self.values)
        self.valid: dict[int, np.ndarray] = {}  # member -> mask, made on its first null
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return self.buffer.size

    def put(self, j: int, arr: pa.Array, at: int) -> None:
        self.put_many([(j, arr)], at)

    def put_many(self, columns: list[tuple[int, pa.Array]], at: int) -> None:
        """Members ``j`` of rows ``at ..``: arrays of one length, written row block by row
        block (``collate.write_by_row_blocks``: the block stays in cache across the columns)."""
        n = len(columns[0][1])
        if n == 0:
            return
        views = []
        for j, arr in columns:
            if arr.null_count:
                with self._lock:
                    mask = self.valid.get(j)
                    if mask is None:  # allocated once per column, not per chunk with nulls
                        mask = self.valid[j] = np.ones(self.rows, dtype=bool)
                mask[at:at + n] = valid_bits(arr)
            raw = _raw_view(arr, self.dtype)
            if isinstance(raw, int):  # nulls without a data buffer
                self.values[at:at + n, j] = raw
            else:
                views.append((j, raw))
        write_by_row_blocks(self.values[at:at + n], views, n)

    def arrays(self, schema: pa.Schema) -> list[tuple[pa.Field, pa.Array]]:
        """The group as one fixed-size-list column, or (it has nulls) its columns again."""
        k = len(self.members)
        if not self.valid:
            leaf_type = pa.from_numpy_dtype(self.dtype)
            leaf = pa.Array.from_buffers(leaf_type, self.rows * k, [None, self.buffer])
            t = pa.list_(leaf_type, k)
            f = pa.field(self.out, t, nullable=False,
                         metadata={STACK_KEY: json.dumps(list(self.members)).encode()})
            return [(f, pa.Array.from_buffers(t, self.rows, [None], children=[leaf]))]
        out = []
        for j, name in enumerate(self.members):
            f = schema.field(name)
            data = np.ascontiguousarray(self.values[:, j])
            out.append((f, pa.Array.from_buffers(f.type, self.rows, [_bitmap(self.valid.get(j)),
                                                                      pa.py_buffer(data)])))
        return out


#: Stride of the first touch ``_allocate`` gives a table's memory (a page).
_TOUCH = 4096
#: Memory at least this large is touched by one thread per core, a slice each: the kernel
#: handles their page faults side by side. On the 2-core benchmark VM, whose host takes
#: back memory freed a few seconds before, touching 1 GiB took 1.6-2.5 s on one thread
#: and 0.82-0.84 s on two (less CPU too: 1.3-1.6 against 1.7-2.5 s).
_TOUCH_PARALLEL = 64 << 20


def _allocate(count: int, dtype: np.dtype) -> np.ndarray:
    """A 64-byte aligned array from numpy's allocator, which asks the kernel for
    transparent huge pages on large arrays: filling 256 MiB of fresh memory costs about
    0.08 s of page faults and copies this way, 0.3-0.6 s from Arrow's pool.

    Its pages are touched here, once each (``_TOUCH``), before any row is written: the
    kernel maps them in one sweep (one thread per core on large tables: ``_touch``). Left to
    the writes, the faults came while the build's other threads (the decode, the split of a
    mixture's rows) allocated and freed memory, and contended with them: a mixture's global
    build spent 0.11-0.23 s of system time in its writes against 0.003-0.014 s for the
    single selection's, and builds of either often took half again as long (the kernel's
    huge-page faults, contended). Touched first, interleaved fresh processes (4M-row lake):
    a global epoch of W1's columns, build included, 0.397-0.741 s (median 0.587) ->
    0.392-0.417 s (median 0.397), 5 each; run.py's W3 global 0.495 -> 0.446 s; a mixture's
    build 0.40-0.68 -> 0.39-0.40 s."""
    dtype = np.dtype(dtype)
    raw = np.empty(count * dtype.itemsize + 64, dtype=np.uint8)
    _touch(raw)
    skip = -raw.ctypes.data % 64
    return raw[skip:skip + count * dtype.itemsize].view(dtype)


def _touch(raw: np.ndarray) -> None:
    """Write a zero every ``_TOUCH`` bytes of ``raw`` (1-D uint8), from its first byte: one
    thread, or one per core on slices of whole pages where it is ``_TOUCH_PARALLEL`` or
    more (numpy releases the GIL for the fill)."""
    threads = min(usable_cores(), raw.size // _TOUCH_PARALLEL)
    if threads <= 1:
        raw[::_TOUCH] = 0
        return
    step = -(-raw.size // threads)
    step += -step % _TOUCH  # each slice starts on a touched byte
    with ThreadPoolExecutor(threads, thread_name_prefix="arrowload-touch") as pool:
        list(pool.map(lambda i: raw[i * step:(i + 1) * step:_TOUCH].fill(0), range(threads)))


def _raw_view(arr: pa.Array, dtype: np.dtype) -> np.ndarray | int:
    """The data buffer of a fixed-width array as ``dtype`` (same item size), at its offset;
    0 for an array of nulls without one (its values are never read)."""
    buf = arr.buffers()[1]
    if buf is None:
        return 0
    return np.frombuffer(buf, dtype=dtype, count=arr.offset + len(arr))[arr.offset:]


def _bitmap(mask: np.ndarray | None) -> pa.Buffer | None:
    if mask is None or mask.all():
        return None
    return pa.py_buffer(np.packbits(mask, bitorder="little"))


@dataclass
class Layout:
    """Where each output column goes: ``fixed`` buffers, stacked ``groups``, ``other``."""

    schema: pa.Schema
    rows: int
    fixed: dict[str, _Fixed] = field(default_factory=dict)
    groups: list[_Group] = field(default_factory=list)
    member: dict[str, tuple[_Group, int]] = field(default_factory=dict)
    other: list[str] = field(default_factory=list)

    @property
    def preallocated(self) -> int:
        return sum(c.nbytes for c in self.fixed.values()) + sum(g.nbytes for g in self.groups)


def fixed_bytes(schema: pa.Schema, rows: int) -> int:
    """Bytes of the fixed-width columns of ``rows`` rows (what the layout preallocates)."""
    total = 0
    for f in schema:
        t = f.type
        if pa.types.is_fixed_size_list(t) and _fixed_leaf(t.value_type):
            total += rows * t.list_size * t.value_type.bit_width // 8
        elif _fixed_leaf(t):
            total += rows * t.bit_width // 8
    return total


def _stack_groups(stack: Mapping[str, Any] | None, schema: pa.Schema) -> list[tuple[str, tuple[str, ...], np.dtype]]:
    """The ``stack=`` groups that can be held stacked: every column of the group of the
    group's dtype (so the stacked values are exactly the columns'), numbers only."""
    if not stack:
        return []
    try:
        spec = resolve_stack(stack, schema)
    except ArrowloadError:
        return []  # refused at the loader's checks; never here
    groups = []
    for (out, cols), dtype in zip(spec.groups, spec.dtypes):
        types = [schema.field(c).type for c in cols]
        if dtype.kind in "iuf" and all((pa.types.is_integer(t) or pa.types.is_floating(t))
                                       and np.dtype(t.to_pandas_dtype()) == dtype for t in types):
            groups.append((out, tuple(cols), dtype))
    return groups


def _fixed_type(t: pa.DataType) -> bool:
    return _fixed_leaf(t) or (pa.types.is_fixed_size_list(t) and _fixed_leaf(t.value_type) and t.list_size > 0)


def make_layout(schema: pa.Schema, rows: int, stack: Mapping[str, Any] | None) -> Layout:
    """Where each column of ``schema`` goes. Groups are held stacked only where every other
    column has an array form of fixed width too (numbers, temporals, booleans, fixed-size
    lists): otherwise batches are gathered with Arrow, from the plan's own columns."""
    layout = Layout(schema, rows)
    groups = _stack_groups(stack, schema)
    members = {c for _, cols, _ in groups for c in cols}
    if not all(_fixed_type(f.type) or pa.types.is_boolean(f.type) for f in schema if f.name not in members):
        groups = []
    for out, cols, dtype in groups:
        g = _Group(out, cols, dtype, rows)
        layout.groups.append(g)
        for j, c in enumerate(cols):
            layout.member[c] = (g, j)
    for f in schema:
        if f.name in layout.member:
            continue
        if _fixed_type(f.type):
            layout.fixed[f.name] = _Fixed(f.name, f.type, rows)
        else:
            layout.other.append(f.name)
    return layout


# ---------------------------------------------------------------------------
# the build


class _OverBudget(Exception):
    pass


def build(read_unit, counts: Sequence[int], schema: pa.Schema, *, stack: Mapping[str, Any] | None,
          memory_budget: int, threads: int | None = None) -> pa.Table | None:
    """The rows of units ``0 .. len(counts) - 1`` (``read_unit(i)`` gives unit ``i``'s
    ``counts[i]`` rows as a table of ``schema``) as one table, built as the module says;
    ``None`` when it does not fit ``memory_budget`` bytes (the fixed-width columns are
    known before reading; the others are counted as they come, and the build stops at
    the unit that crosses the budget). Threads: ``threads`` or the cores, at most one per unit."""
    got = build_many(lambda k: [(0, k, read_unit(k))], len(counts), [counts], [schema], stack=stack,
                     memory_budget=memory_budget, threads=threads)
    return None if got is None else got[0]


def build_many(read, items: int, counts: Sequence[Sequence[int]], schemas: Sequence[pa.Schema], *,
               stack: Mapping[str, Any] | None, memory_budget: int,
               threads: int | None = None) -> list[pa.Table] | None:
    """Several tables in one pass: ``read(k)`` (``k < items``: one read, e.g. one decoded
    unit of a lake) gives ``(t, i, table)`` triples: ``table`` is unit ``i`` of target
    ``t``, whose units hold ``counts[t]`` rows (a read may fill units of several targets,
    or several units of one). The targets' tables as ``build`` makes each (``None`` when
    together they do not fit ``memory_budget`` bytes); reads run side by side on
    ``threads`` (default: the cores)."""
    counts = [[int(c) for c in cs] for cs in counts]
    rows = [sum(cs) for cs in counts]
    if sum(fixed_bytes(s, r) for s, r in zip(schemas, rows)) > memory_budget:
        return None
    layouts = [make_layout(s, r, stack) for s, r in zip(schemas, rows)]
    offsets = [np.concatenate([[0], np.cumsum(cs, dtype=np.int64)]).astype(np.int64) for cs in counts]
    pieces: list[dict[str, list]] = [{name: [None] * len(cs) for name in lay.other}
                                     for lay, cs in zip(layouts, counts)]
    preallocated = sum(lay.preallocated for lay in layouts)
    state = {"other": 0}
    lock = threading.Lock()
    stop = threading.Event()

    def put(t: int, i: int, table: pa.Table) -> int:
        got, kept = _put(layouts[t], schemas[t], table, int(offsets[t][i]))
        for name, chunks in kept.items():
            pieces[t][name][i] = chunks
        return got

    def fill(k: int) -> int:
        if stop.is_set():
            return 0
        tables = read(k)
        got = done = 0
        for t, i, table in tables:
            got += put(t, i, table)
            done += counts[t][i]
        del tables
        if got:
            with lock:
                state["other"] += got
                over = preallocated + state["other"] > memory_budget
            if over:
                stop.set()
                raise _OverBudget
        return done

    workers = max(1, min(items, threads or usable_cores()))
    desc = "building the random-access table" + ("s" if len(schemas) > 1 else "")
    try:
        if workers == 1:
            for _ in _progress.track((fill(k) for k in range(items)), sum(rows), desc, "rows", size=int):
                pass
        else:
            with ThreadPoolExecutor(workers, thread_name_prefix="arrowload-table") as pool:
                try:
                    for _ in _progress.track(pool.map(fill, range(items)), sum(rows), desc, "rows", size=int):
                        pass
                except BaseException:
                    stop.set()
                    pool.shutdown(wait=True, cancel_futures=True)
                    raise
    except _OverBudget:
        return None
    finally:
        # the units' memory, freed by threads that are gone, back to the system: the
        # allocator would keep it (tens of MiB) beside the table for the whole epoch
        pa.default_memory_pool().release_unused()
    return [_assemble(lay, p) for lay, p in zip(layouts, pieces)]


class Picked:
    """Rows ``rows`` (positions, in order) of ``table``: a member's share of a stream batch
    (``build_stream_many``), written by ``_put`` straight from the batch with no filtered
    copy in between."""

    __slots__ = ("table", "rows")

    def __init__(self, table: pa.Table, rows: np.ndarray) -> None:
        self.table = table
        self.rows = rows

    @property
    def num_rows(self) -> int:
        return len(self.rows)


def _put_picked(layout: Layout, schema: pa.Schema, picked: Picked, at: int) -> tuple[int, dict[str, list]]:
    """``_put`` of a :class:`Picked`: a fixed-width column of one chunk, of the type the
    table holds, taken by position straight into its buffer (``_Fixed.put`` with rows);
    every other column (stacked, variable-width, to cast) through ``_put`` of its rows
    taken with Arrow."""
    rest = []
    for name, column in zip(picked.table.schema.names, picked.table.columns):
        target = layout.fixed.get(name)
        if target is None or column.num_chunks != 1 or column.type != schema.field(name).type:
            rest.append(name)
        else:
            target.put(column.chunk(0), at, picked.rows)
    if not rest:
        return 0, {}
    return _put(layout, schema, take_rows(picked.table.select(rest), picked.rows), at)


def _put(layout: Layout, schema: pa.Schema, table: pa.Table, at: int) -> tuple[int, dict[str, list]]:
    """``table``'s rows written at row ``at`` of ``layout``'s buffers; its variable-width
    columns' chunks (name -> chunks, for the caller to keep in row order) and their bytes
    (counted against the budget as they come). A :class:`Picked` is written by position."""
    if isinstance(table, Picked):
        return _put_picked(layout, schema, table, at)
    got = 0
    kept: dict[str, list] = {}
    whole: dict[int, tuple] = {}  # group -> its members' single-chunk columns, written together
    for name, column in zip(table.schema.names, table.columns):
        typ = schema.field(name).type
        if column.type != typ:
            column = column.cast(typ)
        if name in layout.other:
            kept[name] = column.chunks
            got += column.nbytes
            continue
        target = layout.fixed.get(name)
        if target is None and column.num_chunks == 1:
            g, j = layout.member[name]
            whole.setdefault(id(g), (g, []))[1].append((j, column.chunk(0)))
            continue
        pos = at
        for chunk in column.chunks:
            if target is not None:
                target.put(chunk, pos)
            else:
                g, j = layout.member[name]
                g.put(j, chunk, pos)
            pos += len(chunk)
    for g, columns in whole.values():
        g.put_many(columns, at)
    return got, kept


class StreamMismatch(Exception):
    """A stream gave other rows than the counts said (``build_stream``; internal: the caller
    builds from the units instead)."""


#: ``try_stream``'s answer where the stream failed: build from the units instead.
UNITS = object()


def try_stream(build):
    """``build()`` (a ``build_stream*`` over a polars query) once polars is imported (waiting
    for its import), or ``UNITS`` where the query raised (a polars error, or a panic) or gave
    other rows than counted."""
    polars_ready(wait=True)
    try:
        return build()
    except BaseException as exc:  # noqa: BLE001 - polars panics are BaseExceptions
        if not recoverable(exc):
            raise
        return UNITS


def build_stream(batches, rows: int, schema: pa.Schema, *, stack: Mapping[str, Any] | None,
                 memory_budget: int) -> pa.Table | None:
    """The table ``build`` makes, from ``batches``: record batches of ``schema`` holding the
    ``rows`` rows of the units in order (one polars streaming query's, ``scan/stream.py``,
    decoding on polars' own threads), each written at its running row offset on this
    thread. ``None`` when it does not fit ``memory_budget``; :class:`StreamMismatch` when
    the batches hold other than ``rows`` rows (a file changed: the caller reads again)."""
    got = build_stream_many(([(0, pa.Table.from_batches([b]))] for b in batches), [(0, 0, rows)], [schema],
                            stack=stack, memory_budget=memory_budget)
    return None if got is None else got[0]


def build_stream_many(parts, members: Sequence[tuple[int, int, int]], schemas: Sequence[pa.Schema], *,
                      stack: Mapping[str, Any] | None, memory_budget: int) -> list[pa.Table] | None:
    """Several tables from one stream, as ``build_many`` makes them from reads: member ``m``
    (``members[m] = (t, first, rows)``) fills rows ``first .. first + rows`` of target
    ``t``; each item of ``parts`` (a stream batch, split) is a list of ``(m, table)`` pairs,
    each member's rows in order, written at the member's running offset on this thread.
    ``None`` over ``memory_budget``; :class:`StreamMismatch` where a member gets other than
    its ``rows`` rows."""
    rows = [0] * len(schemas)
    for t, first, n in members:
        rows[t] = max(rows[t], first + n)
    if sum(fixed_bytes(s, r) for s, r in zip(schemas, rows)) > memory_budget:
        return None
    layouts = [make_layout(s, r, stack) for s, r in zip(schemas, rows)]
    # each member's variable-width chunks in arrival order, joined in member order at the end
    pieces: list[dict[str, list]] = [{name: [] for name in layouts[t].other} for t, _, _ in members]
    at = [first for _, first, _ in members]
    preallocated = sum(lay.preallocated for lay in layouts)
    other = 0
    try:
        total = sum(n for _, _, n in members)
        track = _progress.track(parts, total, "building the random-access table", "rows",
                                size=lambda split: sum(table.num_rows for _, table in split))
        for split in track:
            for m, table in split:
                t, first, n = members[m]
                if at[m] + table.num_rows > first + n:
                    raise StreamMismatch(f"the stream gave member {m} more than the {n} rows counted")
                got, kept = _put(layouts[t], schemas[t], table, at[m])
                for name, chunks in kept.items():
                    pieces[m][name].append(chunks)
                other += got
                at[m] += table.num_rows
            if preallocated + other > memory_budget:
                return None
        for m, (t, first, n) in enumerate(members):
            if at[m] != first + n:
                raise StreamMismatch(f"the stream gave member {m} {at[m] - first} rows, {n} counted")
    finally:
        pa.default_memory_pool().release_unused()
    joined = [{name: [] for name in lay.other} for lay in layouts]
    for (t, _, _), mine in sorted(zip(members, pieces), key=lambda pair: pair[0][:2]):  # row order
        for name, chunks in mine.items():
            joined[t][name].extend(chunks)
    return [_assemble(lay, p) for lay, p in zip(layouts, joined)]


def _assemble(layout: Layout, pieces: dict[str, list]) -> pa.Table:
    schema = layout.schema
    fields, arrays = [], []
    done: set[int] = set()
    for f in schema:
        name = f.name
        if name in layout.member:
            g, _ = layout.member[name]
            if id(g) in done:
                continue
            done.add(id(g))
            for gf, arr in g.arrays(schema):
                fields.append(gf)
                arrays.append(arr)
        elif name in layout.fixed:
            fields.append(f)
            arrays.append(layout.fixed.pop(name).array())
        else:
            parts, pieces[name] = [c for unit in pieces[name] for c in unit], None
            arrays.append(pa.concat_arrays(parts) if parts else pa.array([], f.type))
            fields.append(f)
            del parts
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields, metadata=schema.metadata))
