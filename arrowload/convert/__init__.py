"""The convert stage: an Arrow batch -> a dict of numpy arrays, torch tensors or jax arrays.

>>> import pyarrow as pa
>>> from arrowload.convert import ConvertOptions, convert_batch
>>> batch = pa.record_batch({"x": pa.array([1.0, 2.0, 3.0], pa.float32()), "s": ["a", "b", "c"]})
>>> out = convert_batch(batch.slice(1), ConvertOptions(output="numpy"))
>>> out["x"], out["s"]
(array([2., 3.], dtype=float32), ['b', 'c'])

Eager, pure and thread-safe: the loader calls ``convert_batch`` on its threads, once per
batch. torch and jax are imported on first use, never by ``import arrowload``.

Contract per Arrow type (numpy / torch / jax; ``output="arrow"`` returns the batch itself):

=====================================  ==================================================  ===================
Arrow type                             result                                              copies
=====================================  ==================================================  ===================
int8..int64, uint8..uint64,            1-D array of the same dtype                         none (view)
float16/32/64
bool                                   1-D bool array                                      one (bits -> bytes)
timestamp[unit] (any tz), date64,      numpy ``datetime64[unit]`` / ``timedelta64[unit]``  none (view)
duration[unit], time64[unit]           (UTC values; time of day = time since midnight);
                                       torch / jax: int64 counts in that unit
date32, time32                         as above, widened from 32 to 64 bits                one
fixed_size_list<T>[k] (nested)         ``[batch, k]`` (``[batch, k, k2, ...]``)             as T (view for numbers)
fixed_shape_tensor<T>[shape]           ``[batch, *shape]`` (row-major only)                 as T
list<T>, large_list<T> with            ``[batch, max_len, ...]`` padded with ``pad_value``  one (padding)
``pad_lists`` covering it              plus ``<name>_lengths`` int64 ``[batch]``
list<T> not covered, every list of     ``[batch, k]`` (like a fixed-size list)             none (view)
one length k (what pandas writes)
list<T> not covered, lengths differ    error naming the column and the lengths seen:
or null lists                          pass ``pad_lists=True, pad_to=N`` / ``(name,)``
dictionary<T>                          decoded, then as T                                  one (the gather)
string, binary (all flavours),         Python list (``to_pylist``), null -> ``None``       objects
decimal, struct, map, null, ...
=====================================  ==================================================  ===================

* torch gets the same memory through ``torch.from_dlpack`` (no copy, no warning; the
  uint16/32/64 dtypes need torch >= 2.3, which has them with limited operator support;
  older torch raises an error naming the column). With ``device=None`` or ``"cpu"`` no
  ``torch.cuda`` function is called; ``device="cuda"`` without CUDA raises
  ``DeviceUnavailableError``; a device move is the one extra copy.
* jax on CPU shares the memory only when its address is 64-byte aligned, and copies it
  once otherwise; with ``jax_enable_x64`` off, 64-bit integers are narrowed (one copy)
  when their values fit and float64 is refused. See ``arrowload.convert.jax_out``.
* A null in an array-valued column raises ``ConversionError`` naming the column, unless
  ``fill_null`` covers it; filling is one copy. A null fixed-size list becomes ``k``
  fill values; a null variable-length list becomes length 0 (all padding).
* A ``pa.Table`` is accepted too: a column of one chunk converts like a batch's column,
  one of several chunks is concatenated first (one copy).

Lifetime: an array that views the batch holds a reference to the Arrow buffer, so the
memory stays valid after the batch is dropped. numpy arrays are returned read-only
(they may be views of Arrow memory, which is immutable by contract); call ``.copy()``
for a writable one. torch tensors that share memory have no read-only flag: do not
write into them in place (``tensor.clone()`` first), or you change the Arrow batch and
every other view of it. ``output="arrow"`` hands out Arrow lists as they are (a loader
refuses ``pad_lists`` / ``pad_to`` with it); it applies ``fill_null`` to non-nested columns
(nested ones raise ``UnsupportedError``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import ConversionError, UnsupportedError
from .host import arrow_scalar, leaf_type, to_host
from .options import ALL_NUMERIC, OUTPUTS, ConvertOptions

__all__ = ["ALL_NUMERIC", "OUTPUTS", "ConvertOptions", "convert_batch", "convert_host"]


def convert_batch(batch: pa.RecordBatch | pa.Table, options: ConvertOptions | None = None) -> Any:
    """Convert one batch as ``options`` say: a dict column -> array, or the Arrow batch itself.

    Raises ``ConversionError`` (a null without ``fill_null``, an unpadded variable-length
    list, a value that does not fit), ``ColumnNotFoundError`` (an option names a missing
    column), ``DeviceUnavailableError`` and ``MissingDependencyError``.
    """
    opts = options if options is not None else ConvertOptions()
    if opts.output == "arrow":
        return _arrow(batch, opts)
    if opts.output != "numpy":
        _backend(opts)  # first: a missing device fails before any work
    return convert_host(to_host(batch, opts), opts)


def _backend(opts: ConvertOptions):
    """The output's module and target device (imported and resolved once per pair: this
    runs for every batch)."""
    key = (opts.output, opts.device)
    try:
        return _BACKENDS[key]
    except (KeyError, TypeError):  # TypeError: a device object that does not hash
        pass
    if opts.output == "torch":
        from . import torch_out as backend
    else:
        from . import jax_out as backend
    found = backend, backend.target_device(opts.device)
    try:
        _BACKENDS[key] = found
    except TypeError:
        pass
    return found


#: ``_backend``'s answers by (output, device)
_BACKENDS: dict = {}


def convert_host(host: dict, opts: ConvertOptions) -> dict:
    """Finish host arrays (from ``to_host`` or a collation step) as ``opts.output`` asks:
    read-only numpy arrays, or torch / jax arrays sharing their memory."""
    if opts.output == "numpy":
        for value in host.values():
            # read first: a chunk's views inherit its arrays' flag, set once per read
            # (setting it costs 0.19 us even where it is off already; reading it 0.03)
            if isinstance(value, np.ndarray) and value.flags.writeable:
                value.flags.writeable = False
        return host
    backend, device = _backend(opts)
    return backend.convert(host, device)


def _arrow(batch: pa.RecordBatch | pa.Table, opts: ConvertOptions) -> pa.RecordBatch | pa.Table:
    if not opts.fill_null:
        return batch
    from .host import _check_names, _fill_for

    _check_names(opts, batch.schema.names)
    columns = list(batch.columns)
    changed = False
    for i, field in enumerate(batch.schema):
        fill = _fill_for(field.name, field.type, opts)
        if fill is None:
            continue
        if leaf_type(field.type) != field.type and not pa.types.is_dictionary(field.type):
            if field.name in opts.fill_null and _holds_nulls(columns[i]):
                raise UnsupportedError(f"fill_null[{field.name!r}]: output='arrow' does not fill nulls inside "
                                       f"the nested column {field.name!r} ({field.type}); Arrow holds them "
                                       "as they are. Use output='numpy' / 'torch' / 'jax', or fill in the plan")
            continue  # '*' leaves nested columns as Arrow has them
        col = columns[i]
        try:
            if pa.types.is_dictionary(field.type) and _dictionary_nulls(col):
                # a null among the dictionary's values (the indices are valid): filled there
                col = _fill_dictionaries(col, arrow_scalar(field.name, fill, field.type.value_type, "fill_null"))
            if col.null_count:
                col = pc.fill_null(col, arrow_scalar(field.name, fill, field.type, "fill_null"))
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            raise ConversionError(f"fill_null[{field.name!r}] cannot fill column {field.name!r} of type "
                                  f"{field.type}: {exc}", column=field.name) from exc
        if col is not columns[i]:
            columns[i] = col
            changed = True
    if not changed:
        return batch
    return type(batch).from_arrays(columns, schema=batch.schema)


def _chunks(col) -> list:
    return col.chunks if isinstance(col, pa.ChunkedArray) else [col]


def _fill_dictionaries(col, value: pa.Scalar):
    """``col`` (an array, or chunked: a table's) with the nulls among its dictionaries'
    values filled by ``value``, as it came."""
    def filled(c):
        return pa.DictionaryArray.from_arrays(c.indices, pc.fill_null(c.dictionary, value))
    if isinstance(col, pa.ChunkedArray):
        return pa.chunked_array([filled(c) for c in col.chunks], col.type)
    return filled(col)


def _dictionary_nulls(col) -> bool:
    return any(c.dictionary.null_count for c in _chunks(col))


def _holds_nulls(col) -> bool:
    """Whether a column holds a null anywhere: its rows, list values, struct fields, or a
    dictionary's values."""
    for c in _chunks(col):
        if c.null_count:
            return True
        t = c.type
        if isinstance(t, pa.BaseExtensionType):
            c, t = c.storage, t.storage_type
        if pa.types.is_dictionary(t):
            if c.dictionary.null_count:
                return True
        elif pa.types.is_struct(t):
            if any(_holds_nulls(f) for f in c.flatten()):
                return True
        elif hasattr(c, "flatten") and hasattr(t, "value_type"):
            if _holds_nulls(c.flatten()):
                return True
    return False
