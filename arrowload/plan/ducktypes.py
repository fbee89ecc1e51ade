"""Arrow types DuckDB reads: what arrowload casts (losslessly) before handing data over.

Used by the filters and computed columns DuckDB evaluates (``plan.duckeval``) and by the
tables ``al.sql`` binds (``scan.duck``), so both give DuckDB the same types.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.types as pat

from .rowselect import map_leaf_types


def _duck_leaf(t: pa.DataType) -> pa.DataType | None:
    # exact: every half float is a float; DuckDB reads Parquet FLOAT16 as FLOAT
    return pa.float32() if pat.is_float16(t) else None


def duck_type(t: pa.DataType) -> pa.DataType | None:
    """The type to cast ``t`` to before DuckDB scans it; None when it needs nothing."""
    return map_leaf_types(t, _duck_leaf)


def duck_schema(schema: pa.Schema) -> pa.Schema | None:
    """``schema`` with each column as DuckDB is given it (``duck_type``); None when no
    column needs a cast."""
    types = [duck_type(f.type) for f in schema]
    if all(t is None for t in types):
        return None
    return pa.schema([f.with_type(t) if t is not None else f for f, t in zip(schema, types)], schema.metadata)
