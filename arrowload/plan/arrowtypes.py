"""The output type of a ``pyarrow.compute`` expression over a schema."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from ..errors import ExpressionError
from .rowselect import empty_table


def type_of(expr: pc.Expression, schema: pa.Schema) -> pa.DataType:
    """The output type of ``expr`` over ``schema`` (evaluated on zero rows)."""
    empty = empty_table(schema)
    try:
        return ds.dataset(empty).to_table(columns={"_": expr}).schema.field("_").type
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        raise ExpressionError(f"cannot evaluate {expr}: {e}") from None
