"""An Arrow table as a ``polars.DataFrame``, refusing with a typed error what polars cannot import.

polars imports most Arrow types, but not intervals, unions, list views, run-end encoded
arrays, 256-bit decimals or timestamps in a time zone it cannot parse (a fixed offset); for some of them (nested inside a struct or list, or inside a
dictionary) it does not raise but panics. The schema is checked first, so no panic is
reached, and a column polars refuses is named with its type and what to do instead.

>>> import pyarrow as pa
>>> to_polars(pa.table({"x": [1, 2]}), "example").shape
(2, 1)
"""

from __future__ import annotations

import pyarrow as pa

from .._polars import polars_zone
from ..errors import UnsupportedError


def _unimportable(t: pa.DataType) -> bool:
    """True when polars cannot import type ``t`` (or a type nested in it)."""
    if (pa.types.is_interval(t) or pa.types.is_union(t) or pa.types.is_decimal256(t)
            or pa.types.is_list_view(t) or pa.types.is_large_list_view(t) or pa.types.is_run_end_encoded(t)):
        return True
    if pa.types.is_timestamp(t):
        return not polars_zone(t.tz)  # a fixed offset ('+05:30'): polars cannot parse it
    if isinstance(t, pa.ExtensionType):
        return _unimportable(t.storage_type)
    if pa.types.is_dictionary(t):
        return _unimportable(t.value_type)
    if pa.types.is_map(t):
        return _unimportable(t.key_type) or _unimportable(t.item_type)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _unimportable(t.value_type)
    if pa.types.is_struct(t):
        return any(_unimportable(t.field(i).type) for i in range(t.num_fields))
    return False


def check_polars_schema(schema: pa.Schema, origin: str) -> None:
    """Raise :class:`UnsupportedError` naming the first column of ``schema`` that polars
    cannot import, its type, and what to do instead."""
    bad = [f for f in schema if _unimportable(f.type)]
    if not bad:
        return
    f = bad[0]
    others = [n for n in schema.names if n not in {b.name for b in bad}]
    keep = f"select the other columns first (.select({', '.join(map(repr, others[:5]))})), " if others else ""
    also = f" (so are {', '.join(repr(b.name) for b in bad[1:])})" if len(bad) > 1 else ""
    raise UnsupportedError(
        f"column {f.name!r} of {origin} is {f.type}, a type polars cannot import{also}; "
        f"{keep}convert it in SQL (.select({f.name}=\"CAST({f.name} AS VARCHAR)\")), "
        "or read it with to_arrow() / to_pandas()")


def to_polars(table: pa.Table, origin: str):
    """``table`` as a ``polars.DataFrame`` (zero-copy where polars allows)."""
    import polars as pl
    check_polars_schema(table.schema, origin)
    return pl.from_arrow(table)


def displayable(table: pa.Table) -> pa.Table:
    """``table`` with each column polars cannot import replaced by its values as text
    (Python's ``str`` of each value, nulls kept), for showing a few rows; other columns as
    they are."""
    for i, f in enumerate(table.schema):
        if _unimportable(f.type):
            text = pa.array([None if v is None else str(v) for v in table.column(i).to_pylist()], pa.string())
            table = table.set_column(i, pa.field(f.name, pa.string()), text)
    return table
