"""Arrow column -> host numpy array (or Python list): the layout work every output shares.

Zero-copy views are made with ``np.frombuffer`` over the Arrow data buffer at the
array's own offset, so they work for any slice and keep the buffer alive. Every copy
arrowload has to make (bit-unpacked booleans, widened date32 / time32, decoded
dictionaries, filled nulls, padded lists) is written once, into a fresh 64-byte aligned
Arrow allocation: jax on CPU takes such buffers through DLPack without copying again.

Nothing here knows about torch or jax; ``torch_out`` / ``jax_out`` take these arrays over.
"""

from __future__ import annotations

import dataclasses
import math

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import ColumnNotFoundError, ConversionError, UnsupportedError
from .options import ALL_NUMERIC, ConvertOptions

_ARROW_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError,
                 OverflowError)


@dataclass
class Host:
    """One converted array-valued column, before nulls are filled (or refused)."""

    data: np.ndarray
    owned: bool                       # True: arrowload allocated it (a copy); False: views the batch
    nulls: np.ndarray | None = None   # bool, data's shape: where data is null and not yet filled
    lengths: np.ndarray | None = None  # int64 [batch]: list lengths of a padded column


# ---------------------------------------------------------------------------
# the batch


def to_host(batch: pa.RecordBatch | pa.Table, opts: ConvertOptions,
            alloc: Callable[[tuple, np.dtype], np.ndarray] = None) -> dict[str, np.ndarray | list]:
    """Every column of ``batch`` as a numpy array (array-valued types) or a Python list (the rest).

    A padded list column ``x`` adds ``x_lengths`` right after ``x``. ``alloc(shape, dtype)``
    gives the buffer a padded list is written into (the loader passes its buffer pool's
    ``take``); by default a fresh aligned allocation.
    """
    names = batch.schema.names
    _check_names(opts, names)
    out: dict[str, np.ndarray | list] = {}
    for name, column in zip(names, batch.columns):
        arr = _one_chunk(column)
        fill = _fill_for(name, arr.type, opts)
        if not array_valued(arr.type):
            out[name] = _objects(name, arr, fill)
            continue
        host = _host(name, arr, opts, fill, nested=False, alloc=alloc)
        out[name] = _fill(name, arr.type, host, fill, opts)
        if host.lengths is not None:
            key = f"{name}_lengths"
            if key in names:
                raise ConversionError(f"padding column {name!r} adds {key!r}, but the batch already has a "
                                      f"column of that name; rename one of them in the plan", column=name)
            out[key] = host.lengths
    return out


def restricted(opts: ConvertOptions, names) -> ConvertOptions:
    """``opts`` for a batch of only ``names`` among the loader's columns (``stack_batch``
    converts a batch's stacked columns and its others apart): ``fill_null`` and named
    ``pad_lists`` keep the entries naming those columns (the loader checked the names)."""
    keep = set(names)
    changes: dict = {}
    fill = opts.fill_null
    if fill and any(k != ALL_NUMERIC and k not in keep for k in fill):
        changes["fill_null"] = {k: v for k, v in fill.items() if k == ALL_NUMERIC or k in keep} or None
    pad = opts.pad_lists
    if isinstance(pad, tuple) and any(k not in keep for k in pad):
        changes["pad_lists"] = tuple(k for k in pad if k in keep) or False
    return dataclasses.replace(opts, **changes) if changes else opts


def _check_names(opts: ConvertOptions, names: list[str]) -> None:
    for key in opts.fill_null or ():
        if key != ALL_NUMERIC and key not in names:
            raise ColumnNotFoundError(key, names, where="ConvertOptions.fill_null")
    if isinstance(opts.pad_lists, tuple):
        for key in opts.pad_lists:
            if key not in names:
                raise ColumnNotFoundError(key, names, where="ConvertOptions.pad_lists")


def _one_chunk(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    if not isinstance(column, pa.ChunkedArray):
        return column
    if column.num_chunks == 1:
        return column.chunk(0)
    if column.num_chunks == 0:
        return pa.array([], type=column.type)
    return pa.concat_arrays(column.chunks)  # a Table with several chunks: one copy, documented


# ---------------------------------------------------------------------------
# types


@lru_cache(maxsize=1024)  # types are hashable; the loader sees a few per run
def array_valued(t: pa.DataType) -> bool:
    """Whether a column of type ``t`` becomes an array (else a Python list of objects)."""
    if pa.types.is_dictionary(t):
        return array_valued(t.value_type)
    if isinstance(t, pa.BaseExtensionType):
        return array_valued(t.storage_type)
    if _primitive_dtype(t) is not None or pa.types.is_boolean(t):
        return True
    if _is_list(t):
        return array_valued(t.value_type)
    return False


@lru_cache(maxsize=1024)  # types are hashable; the loader sees a few per run
def leaf_type(t: pa.DataType) -> pa.DataType:
    """The element type under any lists, dictionaries and extension wrappers."""
    while True:
        if pa.types.is_dictionary(t):
            t = t.value_type
        elif isinstance(t, pa.BaseExtensionType):
            t = t.storage_type
        elif _is_list(t):
            t = t.value_type
        else:
            return t


def _is_list(t: pa.DataType) -> bool:
    return (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
            or pa.types.is_list_view(t) or pa.types.is_large_list_view(t))


@lru_cache(maxsize=1024)  # types are hashable; the loader sees a few per run
def _primitive_dtype(t: pa.DataType) -> tuple[np.dtype, bool] | None:
    """(numpy dtype, needs widening from 32 bits) for fixed-width numbers and temporals, else None."""
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return np.dtype(t.to_pandas_dtype()), False
    if pa.types.is_timestamp(t):
        return np.dtype(f"datetime64[{t.unit}]"), False
    if pa.types.is_date64(t):
        return np.dtype("datetime64[ms]"), False
    if pa.types.is_date32(t):
        return np.dtype("datetime64[D]"), True
    if pa.types.is_duration(t) or pa.types.is_time64(t):
        return np.dtype(f"timedelta64[{t.unit}]"), False
    if pa.types.is_time32(t):
        return np.dtype(f"timedelta64[{t.unit}]"), True
    return None


def _fill_for(name: str, t: pa.DataType, opts: ConvertOptions) -> Any:
    fills = opts.fill_null
    if not fills:
        return None
    if name in fills:
        return fills[name]
    leaf = leaf_type(t)
    if ALL_NUMERIC in fills and (pa.types.is_integer(leaf) or pa.types.is_floating(leaf)):
        value = fills[ALL_NUMERIC]
        if pa.types.is_integer(leaf) and isinstance(value, (float, np.floating)) and not float(value).is_integer():
            return None  # '*': 0.5 fills the float columns; an integer column's nulls stay refused
        return value
    return None


# ---------------------------------------------------------------------------
# buffers


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A writable array in a fresh 64-byte aligned Arrow allocation."""
    dtype = np.dtype(dtype)
    count = int(math.prod(shape))
    buf = pa.allocate_buffer(count * dtype.itemsize)
    return np.frombuffer(buf, dtype=dtype, count=count).reshape(shape)


def _aligned_copy(data: np.ndarray) -> np.ndarray:
    out = aligned_empty(data.shape, data.dtype)
    np.copyto(out, data)
    return out


def _view(arr: pa.Array, dtype: np.dtype) -> np.ndarray:
    """The data buffer of a fixed-width array as numpy, at the array's offset: no copy."""
    buf = arr.buffers()[1]
    if len(arr) == 0 or buf is None:
        return np.empty(0, dtype=dtype)
    return np.frombuffer(buf, dtype=dtype, count=len(arr), offset=arr.offset * dtype.itemsize)


def _null_mask(arr: pa.Array) -> np.ndarray | None:
    if not arr.null_count:
        return None
    return ~valid_bits(arr)


def unpack_bits(buf: pa.Buffer | None, offset: int, n: int, missing: bool) -> np.ndarray:
    """Bits ``offset .. offset + n`` of an Arrow bitmap (least significant bit first) as
    numpy bools, a byte each; ``missing`` everywhere where there is no buffer (a validity
    bitmap left out: no nulls). ``np.unpackbits`` over the bytes that hold them: 6 us for
    65,536 bits, against 64 us for Arrow's ``to_numpy`` of a boolean array and 39 us for
    its cast to uint8 (this machine)."""
    if buf is None or n == 0:
        return np.full(n, missing, dtype=np.bool_)
    first = offset >> 3
    data = np.frombuffer(buf, dtype=np.uint8, count=((offset + n + 7) >> 3) - first, offset=first)
    skip = offset & 7
    return np.unpackbits(data, bitorder="little")[skip:skip + n].view(np.bool_)


def bool_values(arr: pa.Array) -> np.ndarray:
    """A boolean array's values as numpy bools (a null's slot as stored: see ``valid_bits``)."""
    return unpack_bits(arr.buffers()[1], arr.offset, len(arr), False)


def valid_bits(arr: pa.Array) -> np.ndarray:
    """Where ``arr`` is not null, as numpy bools."""
    if arr.null_count == len(arr) and len(arr):
        return np.zeros(len(arr), dtype=np.bool_)  # a null-typed array has no buffers at all
    return unpack_bits(arr.buffers()[0], arr.offset, len(arr), True)


def true_positions(mask: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The positions where a boolean ``mask`` is true (a null: not true), as int64."""
    chunks = mask.chunks if isinstance(mask, pa.ChunkedArray) else [mask]
    parts, at = [], 0
    for a in chunks:
        keep = bool_values(a)
        if a.null_count:
            keep = keep & valid_bits(a)
        found = np.flatnonzero(keep)
        if at:
            found += at
        parts.append(found)
        at += len(a)
    if len(parts) == 1:
        return parts[0].astype(np.int64, copy=False)
    return np.concatenate(parts).astype(np.int64, copy=False) if parts else np.zeros(0, dtype=np.int64)


# ---------------------------------------------------------------------------
# columns


def _host(name: str, arr: pa.Array, opts: ConvertOptions, fill: Any, nested: bool, alloc=None) -> Host:
    t = arr.type
    decoded = False
    if pa.types.is_dictionary(t):
        arr, decoded = arr.dictionary_decode(), True  # a gather: the one copy
        t = arr.type
    if isinstance(t, pa.BaseExtensionType):
        return _extension(name, arr, opts, fill, nested, alloc)
    if pa.types.is_boolean(t):
        # Arrow packs booleans into bits; numpy / torch / jax want a byte each: one copy
        # (unpacked, then written into an aligned allocation: 9 against 39 us for 65,536
        # values by Arrow's cast to uint8)
        out = aligned_empty((len(arr),), np.dtype(np.bool_))
        out[...] = bool_values(arr)
        return Host(out, owned=True, nulls=_null_mask(arr))
    prim = _primitive_dtype(t)
    if prim is not None:
        dtype, widen = prim
        if widen:  # date32 / time32: 32-bit counts, numpy's datetime64 / timedelta64 are 64-bit
            wide = pc.cast(arr.view(pa.int32()), pa.int64())
            return Host(_view(wide, dtype), owned=True, nulls=_null_mask(arr))
        return Host(_view(arr, dtype), owned=decoded, nulls=_null_mask(arr))
    if pa.types.is_fixed_size_list(t):
        return _fixed_size_list(name, arr, opts, fill)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        if nested:
            raise UnsupportedError(f"column {name!r} nests a variable-length list ({arr.type}) inside "
                                   "another list; only the outermost list can be padded. Flatten or "
                                   "select the inner values in the plan")
        return _padded_list(name, arr, opts, fill, alloc)
    if pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        raise UnsupportedError(f"column {name!r} is a {t}; list views are not converted yet. "
                               "Cast it to a list type in the plan")
    raise UnsupportedError(f"column {name!r} has type {t}, which has no array form")  # pragma: no cover


def _extension(name: str, arr: pa.Array, opts: ConvertOptions, fill: Any, nested: bool, alloc=None) -> Host:
    t = arr.type
    host = _host(name, arr.storage, opts, fill, nested, alloc)
    if isinstance(t, pa.FixedShapeTensorType):
        perm = t.permutation
        if perm is not None and list(perm) != sorted(perm):
            raise UnsupportedError(f"column {name!r} is a fixed_shape_tensor with permutation {perm}; "
                                   "only row-major tensors are converted")
        shape = (len(arr), *t.shape)
        host.data = host.data.reshape(shape)
        if host.nulls is not None:
            host.nulls = host.nulls.reshape(shape)
    return host


def _fixed_size_list(name: str, arr: pa.Array, opts: ConvertOptions, fill: Any) -> Host:
    n, k = len(arr), arr.type.list_size
    # ``values`` ignores the slice offset (``flatten`` honours it but drops null lists): slice it.
    child = _host(name, arr.values.slice(arr.offset * k, n * k), opts, fill, nested=True)
    shape = (n, k, *child.data.shape[1:])
    data = child.data.reshape(shape)
    nulls = child.nulls.reshape(shape) if child.nulls is not None else None
    if arr.null_count:
        rows = ~valid_bits(arr)
        nulls = np.zeros(shape, dtype=bool) if nulls is None else nulls.copy()
        nulls[rows] = True  # a null list is k nulls: filled with the fill value, or an error
    return Host(data, owned=child.owned, nulls=nulls)


def _uniform_list(name: str, arr: pa.Array, opts: ConvertOptions, fill: Any) -> Host:
    """A variable-length list column that is not padded: when every list has the same
    length ``k`` (what pyarrow and pandas write for embeddings), ``[batch, k]`` like a
    fixed-size list, a view of the values buffer (equal lengths make the offsets regular);
    otherwise an error naming the column and the lengths seen."""
    t = arr.type
    n = len(arr)
    offsets = _view(arr.offsets, np.dtype(np.int64 if pa.types.is_large_list(t) else np.int32))
    extents = np.diff(offsets) if n else np.zeros(0, dtype=np.int64)
    fix = (f"pass pad_lists=True, pad_to=N (or pad_lists=({name!r},)) to pad it with pad_value and get "
           f"'{name}_lengths', or make it a fixed-size list in the plan")
    if arr.null_count:
        raise ConversionError(f"column {name!r} ({t}) has {arr.null_count} null list(s) in this batch, which "
                              f"have no rectangular array form; filter them out (.filter(\"{name} IS NOT "
                              f"NULL\")) or {fix}", column=name)
    lo = int(extents.min()) if n else 0
    hi = int(extents.max()) if n else 0
    if lo != hi:
        raise ConversionError(f"column {name!r} is a variable-length list ({t}) with lengths {lo} to {hi} in "
                              f"this batch, which have no rectangular array form; {fix.replace('N', str(hi), 1)}",
                              column=name)
    start = int(offsets[0]) if n else 0
    child = _host(name, arr.values.slice(start, n * hi), opts, fill, nested=True)
    shape = (n, hi, *child.data.shape[1:])
    nulls = child.nulls.reshape(shape) if child.nulls is not None else None
    return Host(child.data.reshape(shape), owned=child.owned, nulls=nulls)


def _padded_list(name: str, arr: pa.Array, opts: ConvertOptions, fill: Any, alloc=None) -> Host:
    t = arr.type
    if not opts.pads(name):
        return _uniform_list(name, arr, opts, fill)
    n = len(arr)
    offsets = _view(arr.offsets, np.dtype(np.int64 if pa.types.is_large_list(t) else np.int32))
    extents = np.diff(offsets).astype(np.int64) if n else np.zeros(0, dtype=np.int64)
    lengths = extents.copy()
    row_nulls = _null_mask(arr)
    if row_nulls is not None:
        if fill is None:
            raise ConversionError(
                f"column {name!r} has {int(row_nulls.sum())} null list(s) in this batch; pass "
                f"fill_null={{{name!r}: <value>}} (a null list then has length 0, all padding) or filter "
                f"them out: .filter(\"{name} IS NOT NULL\")", column=name)
        lengths[row_nulls] = 0
    start = int(offsets[0]) if n else 0
    stop = int(offsets[-1]) if n else 0
    child = _host(name, arr.values.slice(start, stop - start), opts, fill, nested=True)
    values, value_nulls = child.data, child.nulls
    if row_nulls is not None and extents[row_nulls].any():
        keep = np.repeat(~row_nulls, extents)  # null lists backed by values (rare): leave those out
        values = values[keep]
        value_nulls = value_nulls[keep] if value_nulls is not None else None
    longest = int(lengths.max()) if n else 0
    width = longest if opts.pad_to is None else opts.pad_to
    if longest > width:
        raise ConversionError(f"column {name!r} has a list of length {longest} in this batch, longer than "
                              f"pad_to={opts.pad_to}; raise pad_to or truncate the lists in the plan",
                              column=name)
    pad = host_scalar(name, opts.pad_value, leaf_type(arr.type), "pad_value")
    out = (alloc or aligned_empty)((n, width, *values.shape[1:]), values.dtype)
    out[...] = pad
    inside = np.arange(width) < lengths[:, None]
    out[inside] = values  # row-major order of ``inside`` is the order of the flattened values: one copy
    nulls = None
    if value_nulls is not None and value_nulls.any():
        nulls = np.zeros(out.shape, dtype=bool)
        nulls[inside] = value_nulls
    return Host(out, owned=True, nulls=nulls, lengths=lengths)


def _objects(name: str, arr: pa.Array, fill: Any) -> list:
    """Strings, binaries, decimals, structs ... stay Python objects; a null is ``None`` unless filled."""
    if fill is not None and arr.null_count:
        try:
            arr = pc.fill_null(arr, arrow_scalar(name, fill, arr.type, "fill_null"))
        except _ARROW_ERRORS as exc:
            raise ConversionError(f"fill_null[{name!r}] cannot fill column {name!r} of type {arr.type}: {exc}",
                                  column=name) from exc
    if _has_datetime_leaf(arr.type):
        return _py_values(arr)
    return arr.to_pylist()


@lru_cache(maxsize=1024)  # types are hashable; the loader sees a few per run
def _has_datetime_leaf(t: pa.DataType) -> bool:
    """Whether a nested type holds timestamps or dates somewhere below (a struct of
    timestamps, a list of dates ...)."""
    if pa.types.is_timestamp(t) or pa.types.is_date(t):
        return True
    if isinstance(t, pa.BaseExtensionType):
        return False  # extension values convert through their own class
    if pa.types.is_struct(t):
        return any(_has_datetime_leaf(t.field(i).type) for i in range(t.num_fields))
    if _is_list(t) and not (pa.types.is_list_view(t) or pa.types.is_large_list_view(t)):
        return _has_datetime_leaf(t.value_type)
    return False


def _py_values(arr: pa.Array) -> list:
    """``arr.to_pylist()``, except that timestamps and dates inside structs and lists become
    numpy ``datetime64`` scalars (as top-level ones become ``datetime64`` arrays): Python's
    ``datetime`` stops at year 9999 and Arrow's timestamps do not (``to_pylist`` raises
    OverflowError there)."""
    t = arr.type
    valid = None if not arr.null_count else (~pc.is_null(arr).to_numpy(zero_copy_only=False)).tolist()
    if pa.types.is_timestamp(t) or pa.types.is_date(t):
        unit = "D" if pa.types.is_date32(t) else "ms" if pa.types.is_date64(t) else t.unit
        counts = arr.view(pa.int32() if pa.types.is_date32(t) else pa.int64())
        counts = pc.fill_null(counts, 0) if arr.null_count else counts  # exact ints, nulls masked below
        out = list(counts.to_numpy(zero_copy_only=False).astype(np.int64).astype(f"datetime64[{unit}]"))
    elif pa.types.is_struct(t):
        names = [t.field(i).name for i in range(t.num_fields)]
        children = [_py_values(arr.field(i)) for i in range(t.num_fields)]
        out = [dict(zip(names, row)) for row in zip(*children)] if children else [{} for _ in range(len(arr))]
    elif pa.types.is_fixed_size_list(t):
        k = t.list_size
        child = _py_values(arr.values.slice(arr.offset * k, len(arr) * k))
        out = [child[i * k:(i + 1) * k] for i in range(len(arr))]
    elif _is_list(t):
        offsets = arr.offsets.to_numpy(zero_copy_only=False)
        start = int(offsets[0]) if len(offsets) else 0
        child = _py_values(arr.values.slice(start, int(offsets[-1]) - start if len(offsets) else 0))
        out = [child[int(offsets[i]) - start:int(offsets[i + 1]) - start] for i in range(len(arr))]
    else:
        return arr.to_pylist()
    if valid is not None:
        out = [v if ok else None for v, ok in zip(out, valid)]
    return out


# ---------------------------------------------------------------------------
# nulls and scalars


def null_fix(name: str, t: pa.DataType) -> str:
    """What fixes nulls in column ``name`` on the way to arrays (the CLI rewrites it in flags)."""
    leaf = leaf_type(t)
    star = (" (or {'*': <value>} for every numeric column)"
            if pa.types.is_integer(leaf) or pa.types.is_floating(leaf) else "")
    return (f"pass fill_null={{{name!r}: <value>}}{star}, or filter the rows out: "
            f".filter(\"{name} IS NOT NULL\")")


def _fill(name: str, t: pa.DataType, host: Host, fill: Any, opts: ConvertOptions) -> np.ndarray:
    nulls = host.nulls
    if nulls is None or not nulls.any():
        return host.data
    if fill is None:
        count = int(nulls.sum())
        raise ConversionError(
            f"column {name!r} ({t}) has {count} null value(s) in this batch, and {opts.output} arrays cannot "
            f"hold a null; {null_fix(name, t)}", column=name)
    value = host_scalar(name, fill, leaf_type(t), "fill_null")
    data = host.data
    if not (host.owned and data.flags.writeable):
        data = _aligned_copy(data)  # the one copy: never write into the batch's own buffers
    data[nulls] = value
    return data


def arrow_scalar(name: str, value: Any, t: pa.DataType, what: str) -> pa.Scalar:
    """``value`` as an Arrow scalar of type ``t``, refusing lossy casts (1.5 -> int, 300 -> int8,
    9 -> bool)."""
    if pa.types.is_boolean(t) and not isinstance(value, (bool, np.bool_)) and value not in (0, 1):
        raise ConversionError(f"{what} value {value!r} for column {name!r} does not fit its type bool: give "
                              "True / False (or 1 / 0)", column=name)
    textual = pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)
    binary = pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t) \
        or pa.types.is_fixed_size_binary(t)
    if (textual and not isinstance(value, str)) or (binary and not isinstance(value, (bytes, bytearray))):
        raise ConversionError(f"{what} value {value!r} for column {name!r} does not fit its type {t}: give "
                              f"a {'str' if textual else 'bytes'} value", column=name)
    try:
        if pa.types.is_decimal(t) and isinstance(value, int) and not isinstance(value, bool):
            return pa.scalar(value, type=t)  # checked: 10**9 does not fit decimal(10, 2)
        scalar = pa.scalar(value)
        if scalar.type != t:
            try:
                scalar = scalar.cast(t)  # safe cast: truncation and overflow raise
            except pa.ArrowNotImplementedError:
                scalar = pa.scalar(value, type=t)
        return scalar
    except _ARROW_ERRORS as exc:
        raise ConversionError(f"{what} value {value!r} for column {name!r} does not fit its type {t}: {exc}",
                              column=name) from exc


def host_scalar(name: str, value: Any, t: pa.DataType, what: str) -> Any:
    """``value`` as the numpy scalar that a column of leaf type ``t`` holds."""
    scalar = arrow_scalar(name, value, t, what)
    try:
        one = pa.array([scalar.as_py()], type=t)
    except _ARROW_ERRORS as exc:
        raise ConversionError(f"{what} value {value!r} for column {name!r} does not fit its type {t}: {exc}",
                              column=name) from exc
    return _host(name, one, ConvertOptions(), None, nested=True).data[0]
