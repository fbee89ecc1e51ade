"""What a ``Dataset.map`` function (or a loader ``transform``) returns, as one
``pyarrow.RecordBatch`` checked against what it declared.

Plan-level: ``Map`` nodes type themselves with it (the function over an empty batch),
and the scan runs it per batch."""

from __future__ import annotations

import pyarrow as pa

from ..errors import ArgumentTypeError, SchemaMismatchError
from .rowselect import empty_batch


def as_record_batch(out, what: str) -> pa.RecordBatch:
    """What a user function returned (a RecordBatch, Table or polars DataFrame) as one
    RecordBatch; a Table of several chunks is concatenated (one copy)."""
    if type(out).__module__.split(".")[0] == "polars":
        out = out.to_arrow()
    if isinstance(out, pa.Table):
        return out.combine_chunks().to_batches()[0] if out.num_rows else \
            empty_batch(out.schema)
    if not isinstance(out, pa.RecordBatch):
        raise ArgumentTypeError(f"{what} must return a pyarrow RecordBatch (or Table / polars DataFrame), "
                                f"got {type(out).__name__}; return e.g. batch.append_column(...) or "
                                "pa.RecordBatch.from_pydict({...})", "fn")
    return out


def apply_map(node, batch: pa.RecordBatch, inferring: bool = False) -> pa.RecordBatch:
    """``node.fn`` (of a ``Map`` node) over ``batch``, checked against its ``output_schema``,
    or without one against what it returned on an empty batch (the plan's schema; found
    here with ``inferring``)."""
    if node.columns is not None:
        batch = batch.select(list(node.columns))
    what = f"map function {node.name or node.fn!r}"
    out = as_record_batch(node.fn(batch), what)
    declared = node.output_schema
    if declared is None and not inferring:
        inferred = node.schema
        if not out.schema.equals(inferred):
            if [(f.name, f.type) for f in out.schema] == [(f.name, f.type) for f in inferred]:
                return pa.RecordBatch.from_arrays(out.columns, schema=inferred)
            raise SchemaMismatchError(
                f"{what} returned columns ({_fields(out.schema)}) that differ from what it returns on an "
                f"empty batch ({_fields(inferred)}), which is the plan's schema without output_schema "
                "(a column built from Python lists is null-typed when empty); pass "
                "map(..., output_schema=pa.schema([...])) or build typed columns (pa.array(v, type=...))")
        return out
    if declared is not None and not out.schema.equals(declared):
        if [(f.name, f.type) for f in out.schema] == [(f.name, f.type) for f in declared]:
            return pa.RecordBatch.from_arrays(out.columns, schema=declared)  # nullability, metadata
        raise SchemaMismatchError(
            f"{what} returned columns ({_fields(out.schema)}) that differ from its "
            f"output_schema ({_fields(node.output_schema)}); return what output_schema says, or fix "
            "output_schema (or leave it out: the function's output on an empty batch is then used)")
    return out


def _fields(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name}: {f.type}" for f in schema)
