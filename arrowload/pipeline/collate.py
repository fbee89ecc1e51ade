"""Planned batch memory: stacking columns into one ``[batch, k]`` array, written once
into a buffer from a small reusable pool instead of a fresh allocation per batch.

``stack={"x": ["f0", "f1", ...]}`` (or a glob, ``{"x": "f*"}``) gives one array ``x`` of
shape ``[batch, k]`` in place of those columns, placed where the first of them was.
Each value is copied exactly once, from the Arrow column into the pooled buffer.

Lifetime rule: a pooled buffer is reused only when nothing outside the pool refers to
it any more -- no numpy view, torch tensor or jax array the user still holds (they all
keep a reference to the buffer). A batch handed to the user is therefore never
overwritten while the user can still see it; a user who keeps every batch simply makes
the pool allocate new buffers (it never grows beyond ``capacity`` pooled ones).
"""

from __future__ import annotations

import fnmatch
import math
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa

from .._pickle import PicklableLock
from ..convert.host import aligned_empty, restricted, to_host
from ..convert.options import ConvertOptions
from ..errors import ColumnNotFoundError, ConversionError, InvalidArgumentError


@dataclass(frozen=True)
class StackSpec:
    """Resolved stacking: output name -> the input columns, in order, and the dtype of
    each stacked array (numpy's promotion of its columns' types)."""

    groups: tuple[tuple[str, tuple[str, ...]], ...]
    dtypes: tuple[np.dtype, ...] = ()

    @cached_property
    def stacked(self) -> frozenset[str]:
        return frozenset(c for _, cols in self.groups for c in cols)

    @cached_property
    def first(self) -> dict[str, int]:
        """Index of the group each group's first column opens."""
        return {cols[0]: i for i, (_, cols) in enumerate(self.groups)}


def resolve_stack(stack: Mapping[str, str | Sequence[str]] | None, schema: pa.Schema) -> StackSpec | None:
    """Check ``stack`` against the loader's output schema: names exist (globs match), the
    columns are numeric or boolean scalars, no column is used twice."""
    if not stack:
        return None
    groups, used = [], {}
    for out, spec in stack.items():
        patterns = [spec] if isinstance(spec, str) else list(spec)
        cols: list[str] = []
        for pat in patterns:
            if any(ch in pat for ch in "*?["):
                matched = [n for n in schema.names if fnmatch.fnmatchcase(n, pat)]
                if not matched:
                    raise ColumnNotFoundError(pat, schema.names, f"stack[{out!r}]")
                cols.extend(m for m in _natural(matched) if m not in cols)
            else:
                if pat not in schema.names:
                    raise ColumnNotFoundError(pat, schema.names, f"stack[{out!r}]")
                cols.append(pat)
        for c in cols:
            t = schema.field(c).type
            if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)):
                raise ConversionError(f"stack[{out!r}]: column {c!r} is {t}; only numeric and boolean "
                                      "columns stack into one array", column=c)
            if c in used:
                raise InvalidArgumentError(f"stack: column {c!r} is stacked twice (into {used[c]!r} and "
                                           f"{out!r}); name each column in one stack group", "stack")
            used[c] = out
        if out in schema.names and out not in cols:
            raise InvalidArgumentError(f"stack output {out!r} would shadow the column of the same name; "
                                       f"name the output otherwise (e.g. {out + '_stacked'!r})", "stack")
        groups.append((out, tuple(cols)))
    dtypes = tuple(np.result_type(*[schema.field(c).type.to_pandas_dtype() for c in cols])
                   for _, cols in groups)
    return StackSpec(tuple(groups), dtypes)


def _natural(names: list[str]) -> list[str]:
    """f2 before f10: the order people mean by "f*"."""
    import re
    return sorted(names, key=lambda n: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", n)])


class BufferPool(PicklableLock):
    """Reusable host buffers for collation. Thread-safe.

    ``take(shape, dtype)`` hands out a C-contiguous view of a flat, 64-byte aligned buffer
    whose size is ``shape``'s element count rounded up to one of eight steps per power of
    two (at most 12.5% slack). Buffers are keyed by (size, dtype), so batches whose shapes
    vary a little -- padded lists of different widths, a short last batch -- share them.

    A view of a buffer (``buf[:n]``, a torch tensor over it) refers to the array that owns
    the memory -- numpy collapses view chains to that owner -- so reuse is decided on the
    owner's reference count, measured against its count when only the pool held it.
    The pool keeps at most ``capacity`` buffers per key and ``max_bytes`` in all (the
    loader passes its prefetch budget: idle buffers never outweigh the batches in flight);
    past that, ``take`` allocates a buffer the pool forgets. ``allocated`` counts fresh
    buffers, ``reused`` the takes served from the pool.
    """

    def __init__(self, capacity: int = 64, max_bytes: int = 256 << 20) -> None:
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.pooled_bytes = 0
        self._lock = threading.Lock()
        self._slots: dict[tuple, list[_Slot]] = {}
        self._cursor: dict[tuple, int] = {}
        self.allocated = 0
        self.reused = 0

    def __getstate__(self):
        state = super().__getstate__()
        state["_slots"] = {}  # a copy starts empty: reference counts do not survive pickling
        state["_cursor"] = {}
        return state

    def take(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        count = int(math.prod(shape))
        size = _bucket(count)
        key = (size, dtype.str)
        with self._lock:  # the view is made under the lock: no other thread sees the slot idle
            slots = self._slots.setdefault(key, [])
            # buffers come back in about the order they were handed out: the search starts
            # after the last one reused (not at the first, which made every take check
            # every busy buffer before it: 20 checks a take in a block-shuffled mixture)
            n = len(slots)
            start = self._cursor.get(key, 0)
            for k in range(n):
                j = (start + k) % n
                slot = slots[j]
                if slot.idle():
                    self.reused += 1
                    self._cursor[key] = j + 1
                    return slot.buf[:count].reshape(shape)
            self.allocated += 1
            nbytes = size * dtype.itemsize
            if len(slots) >= self.capacity or self.pooled_bytes + nbytes > self.max_bytes:
                return aligned_empty((size,), dtype)[:count].reshape(shape)
            slot = _Slot(aligned_empty((size,), dtype))
            slots.append(slot)
            self.pooled_bytes += nbytes
            return slot.buf[:count].reshape(shape)


def _bucket(count: int) -> int:
    """``count`` rounded up to a multiple of 1/8 of the next power of two (>= 64)."""
    if count <= 64:
        return 64
    step = (1 << (count - 1).bit_length()) // 8
    return -(-count // step) * step


class _Slot:
    """A pooled buffer and the array owning its memory, with the owner's reference count
    when nothing outside the slot refers to it (measured once, at creation)."""

    __slots__ = ("buf", "owner", "baseline")

    def __init__(self, buf: np.ndarray) -> None:
        self.buf = buf
        self.owner = _owner(buf)
        self.baseline = 0
        self.baseline = sys.getrefcount(self.owner) if self.owner is not buf else 0
        del buf

    def idle(self) -> bool:
        if self.owner is self.buf:
            return sys.getrefcount(self.buf) <= 2  # the slot, the call's argument
        return sys.getrefcount(self.owner) <= self.baseline and sys.getrefcount(self.buf) <= 2


def _owner(arr: np.ndarray):
    while isinstance(arr.base, np.ndarray):
        arr = arr.base
    return arr


def member_view(col, dtype: np.dtype) -> np.ndarray | None:
    """A stack group member's values as a view of its Arrow buffer (no copy), or None where
    they must be converted: nulls (filled or refused), bit-packed booleans, a bool group."""
    if col.null_count == 0 and dtype != np.bool_ and col.type.id != _BOOL_ID:
        return col.to_numpy(zero_copy_only=True)
    return None


def stacked_arrays(batch: pa.RecordBatch, spec: StackSpec, pool: BufferPool,
                   opts: ConvertOptions) -> list[tuple[str, np.ndarray]]:
    """``(output name, [rows, k] array)`` of each of ``spec``'s groups of ``batch``, written
    into pooled buffers (read-only for numpy output)."""
    n = batch.num_rows
    arrays = dict(zip(batch.schema.names, batch.columns))
    stacked = []
    for (out, cols), dtype in zip(spec.groups, spec.dtypes):
        buf = pool.take((n, len(cols)), dtype)
        slow, fast = [], []
        for j, c in enumerate(cols):
            view = member_view(arrays[c], dtype)
            if view is not None:
                fast.append((j, view))
            else:
                slow.append((j, c))
        write_by_row_blocks(buf, fast, n)
        if slow:  # nulls (filled or refused) and bit-packed booleans go through to_host
            names_slow = [c for _, c in slow]
            parts = to_host(batch.select(names_slow), restricted(opts, names_slow))
            for j, c in slow:
                buf[:, j] = parts[c]
        view = buf[:n]
        if opts.output == "numpy":
            view.flags.writeable = False
        stacked.append((out, view))
    return stacked


def stack_batch(batch: pa.RecordBatch, spec: StackSpec, pool: BufferPool,
                opts: ConvertOptions, stacked: list | None = None) -> dict:
    """Host arrays for ``batch`` with ``spec``'s columns stacked into pooled buffers (or
    ``stacked``, ``(output name, value)`` of each group, made by the caller); the other
    columns converted by ``to_host`` (zero-copy where possible)."""
    names = batch.schema.names  # looked up once: name lookups on a batch cost microseconds each
    stacked_names = spec.stacked
    rest_names = [name for name in names if name not in stacked_names]
    host_rest = to_host(batch.select(rest_names), restricted(opts, rest_names), pool.take) if rest_names else {}
    if stacked is None:
        stacked = stacked_arrays(batch, spec, pool, opts)
    # each stacked array takes the place of its first column
    result: dict = {}
    first = spec.first
    for name in names:
        g = first.get(name)
        if g is not None:
            out, view = stacked[g]
            result[out] = view
        elif name not in stacked_names:
            result[name] = host_rest[name]
            lengths = f"{name}_lengths"
            if lengths in host_rest:
                result[lengths] = host_rest[lengths]
    return result


_BOOL_ID = pa.bool_().id

#: rows of a stacked buffer written at a time: the columns are interleaved block by block so
#: that the block being written (~512 KiB) stays in cache across its columns. Writing each
#: column down the whole buffer (a 4 MiB unit of 16 float32 columns) took 0.72-0.73 ms per
#: 65,536 rows, by blocks of 8,192 rows 0.42-0.44 ms (numpy, this machine).
STACK_BLOCK_BYTES = 512 << 10


def write_by_row_blocks(buf: np.ndarray, columns: list, n: int) -> None:
    """``buf[:n, j] = values`` for each ``(j, values)`` of ``columns``, by row blocks."""
    if not columns:
        return
    step = max(1024, STACK_BLOCK_BYTES // max(1, buf.shape[1] * buf.itemsize))
    if n <= step:
        for j, values in columns:
            buf[:n, j] = values
        return
    for start in range(0, n, step):
        stop = min(n, start + step)
        rows = buf[start:stop]
        for j, values in columns:
            rows[:, j] = values[start:stop]
