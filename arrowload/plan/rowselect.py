"""Keep some rows of a batch or table, for every column type arrowload reads.

pyarrow (26) has no ``filter`` / ``take`` kernel for ``string_view`` / ``binary_view``
columns (nor for lists of them), so a filter on any other column of a file holding one
would fail, and so would every shuffle. Such columns go through their large (offset)
equivalent and back, which keeps the values and the type the user sees. Data taken from
many times (a shuffle's random-access table) is cast once: ``without_views``.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.types as pat

from ..errors import UnsupportedError


def map_leaf_types(t: pa.DataType, leaf) -> pa.DataType | None:
    """``t`` with each leaf type (inside lists, fixed-size lists and structs) replaced by
    ``leaf(type)`` where that is not None; None when no leaf is replaced."""
    if pat.is_list(t) or pat.is_large_list(t) or pat.is_fixed_size_list(t):
        inner = map_leaf_types(t.value_type, leaf)
        if inner is None:
            return None
        f = t.value_field.with_type(inner)
        if pat.is_fixed_size_list(t):
            return pa.list_(f, t.list_size)
        return pa.large_list(f) if pat.is_large_list(t) else pa.list_(f)
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
                    f"cannot keep the filtered rows of column {f.name!r} of type {f.type}: pyarrow "
                    f"has no kernel to select rows of this type ({e}); leave the column out "
                    "(select() the others) or convert it in a map() before filtering") from None
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
    equivalents (one copy of those columns), and the schema to cast rows kept from it back
    to (None: no view columns, ``data`` itself)."""
    schema = data.schema
    plain = [_plain(f.type) for f in schema]
    if all(p is None for p in plain):
        return data, None
    cols = [c.cast(p) if p is not None else c for c, p in zip(data.columns, plain)]
    return type(data).from_arrays(cols, names=schema.names), schema


def with_views(data, schema: pa.Schema | None):
    """Rows kept from a ``without_views`` table or batch, in the original ``schema``'s types."""
    if schema is None:
        return data
    cols = [c.cast(f.type) if c.type != f.type else c for c, f in zip(data.columns, schema)]
    return type(data).from_arrays(cols, schema=schema)
