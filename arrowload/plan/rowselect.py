"""Keep some rows of a batch or table, for every column type arrowload reads.

pyarrow (26) has no ``filter`` / ``take`` kernel for ``string_view`` / ``binary_view``
columns (nor for lists, maps or structs of them) or run-end encoded ones, so a filter on
any other column of a file holding one would fail, and so would every shuffle. View
columns go through their large (offset) equivalent and back, run-end encoded ones through
their decoded values and back, which keeps the values and the type the user sees (a
run-end encoded column inside a struct or list is refused, naming it). Data taken from
many times (a shuffle's random-access table) is cast once: ``without_views``.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pat

from ..errors import UnsupportedError


def map_leaf_types(t: pa.DataType, leaf) -> pa.DataType | None:
    """``t`` with each leaf type (inside lists, fixed-size lists, maps and structs) replaced by
    ``leaf(type)`` where that is not None; None when no leaf is replaced."""
    if pat.is_list(t) or pat.is_large_list(t) or pat.is_fixed_size_list(t):
        inner = map_leaf_types(t.value_type, leaf)
        if inner is None:
            return None
        f = t.value_field.with_type(inner)
        if pat.is_fixed_size_list(t):
            return pa.list_(f, t.list_size)
        return pa.large_list(f) if pat.is_large_list(t) else pa.list_(f)
    if pat.is_map(t):
        key, item = map_leaf_types(t.key_type, leaf), map_leaf_types(t.item_type, leaf)
        if key is None and item is None:
            return None
        return pa.map_(t.key_field.with_type(key or t.key_type), t.item_field.with_type(item or t.item_type),
                       t.keys_sorted)
    if pat.is_struct(t):
        fields = [t.field(i) for i in range(t.num_fields)]
        inner = [map_leaf_types(f.type, leaf) for f in fields]
        if all(i is None for i in inner):
            return None
        return pa.struct([f.with_type(i) if i is not None else f for f, i in zip(fields, inner)])
    return leaf(t)


def _plain_leaf(t: pa.DataType) -> pa.DataType | None:
    if pat.is_string_view(t):
        return pa.large_string()
    if pat.is_binary_view(t):
        return pa.large_binary()
    return None


def _plain(t: pa.DataType) -> pa.DataType | None:
    """The type to filter ``t`` as; None when pyarrow filters ``t`` itself."""
    return map_leaf_types(t, _plain_leaf)


def _select(data, how):
    try:
        return _select_plain(data, how)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError) as e:
        for f in data.schema:  # name the column pyarrow cannot select rows of
            try:
                how(type(data).from_arrays([data.column(f.name)], names=[f.name]))
            except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError):
                raise UnsupportedError(
                    f"cannot keep the rows a filter or a shuffle selects of column {f.name!r} of type "
                    f"{f.type}: pyarrow has no kernel to select rows of this type ({e}); leave the "
                    "column out (select() the others) or convert it in a map() first") from None
        raise


def _select_plain(data, how):
    plain, views = without_views(data)
    return with_views(how(plain), views)


def filter_rows(data, mask):
    """``data.filter(mask)`` (null drops the row) for any column types."""
    return _select(data, lambda d: d.filter(mask))


def take_rows(data, indices):
    """``data.take(indices)`` (a table or batch) for any column types."""
    return _select(data, lambda d: d.take(indices))


def without_views(data):
    """``data`` (a table or batch) with its view-typed columns cast to their large
    equivalents and its run-end encoded columns decoded (one copy of those columns), and
    the schema to give rows kept from it back (None: no such column, ``data`` itself)."""
    schema = data.schema
    plain = [_plain(f.type) for f in schema]
    ree = [pat.is_run_end_encoded(f.type) for f in schema]
    if all(p is None for p in plain) and not any(ree):
        return data, None
    cols = [pc.run_end_decode(c) if r else c.cast(p) if p is not None else c
            for c, p, r in zip(data.columns, plain, ree)]
    return type(data).from_arrays(cols, names=schema.names), schema


def with_views(data, schema: pa.Schema | None):
    """Rows kept from a ``without_views`` table or batch, in the original ``schema``'s types."""
    if schema is None:
        return data
    cols = [c if c.type == f.type else
            pc.run_end_encode(c, run_end_type=f.type.run_end_type) if pat.is_run_end_encoded(f.type) else
            c.cast(f.type) for c, f in zip(data.columns, schema)]
    return type(data).from_arrays(cols, schema=schema)


def empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    """A batch of no rows of ``schema``, for every column type (``from_pylist([])`` and
    ``Schema.empty_table()`` have no converter for run-end encoded columns inside structs
    or dictionaries of string views)."""
    return pa.RecordBatch.from_arrays([_empty_array(f.type) for f in schema], schema=schema)


def _empty_array(t: pa.DataType) -> pa.Array:
    try:
        return pa.array([], t)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError):
        pass
    if pat.is_run_end_encoded(t):
        return pa.RunEndEncodedArray.from_arrays(pa.array([], t.run_end_type), _empty_array(t.value_type), t)
    if pat.is_struct(t):
        fields = [t.field(i) for i in range(t.num_fields)]
        return pa.StructArray.from_arrays([_empty_array(f.type) for f in fields], fields=fields)
    if pat.is_dictionary(t):
        return pa.DictionaryArray.from_arrays(pa.array([], t.index_type), _empty_array(t.value_type))
    return pa.nulls(0, t)


def empty_table(schema: pa.Schema) -> pa.Table:
    """A table of no rows of ``schema``, for every column type (``empty_batch``)."""
    return pa.Table.from_batches([empty_batch(schema)], schema=schema)
