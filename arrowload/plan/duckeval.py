"""Evaluate SQL filters and computed columns with DuckDB over an Arrow batch.

Whatever part of an expression is not proven to mean the same in pyarrow compute (see
``pushable``) runs here, so its answer is DuckDB's by construction: DuckDB scans the
pyarrow batch in place (no copy), evaluates the expression and hands back Arrow.

Threading: DuckDB connections are not thread-safe, so each thread gets its own
connection (``threading.local``), closed when the thread ends (or by ``close_thread``);
DuckDB releases the GIL while it runs. Sandbox: every connection is opened with
``enable_external_access`` off and extension auto-loading off, then its configuration is
locked, so an expression cannot read files, URLs or the environment even if it got past
``sandbox.check_expression``.
"""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pyarrow.types as pat

from ..errors import ExpressionError, UnsupportedError
from .ducktypes import duck_type
from .rowselect import empty_table, filter_rows
from .sandbox import DUCKDB_SANDBOX

_ROW = "__arrowload_row"


class _Connection:
    """One sandboxed DuckDB connection, closed when its owner (a thread) lets it go."""

    def __init__(self) -> None:
        import duckdb
        # parallelism comes from arrowload's own threads
        self.con = duckdb.connect(config={**DUCKDB_SANDBOX, "threads": 1})

    def close(self) -> None:
        con, self.con = self.con, None
        if con is not None:
            con.close()

    def __del__(self) -> None:  # the thread ended: its thread-local slot is released
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


_local = threading.local()


def connection():
    """This thread's sandboxed DuckDB connection (opened on first use)."""
    c = getattr(_local, "conn", None)
    if c is None or c.con is None:
        c = _local.conn = _Connection()
    return c.con


def close_thread() -> None:
    """Close this thread's connection now (it is reopened if needed later)."""
    c = getattr(_local, "conn", None)
    if c is not None:
        c.close()
        _local.conn = None


def _input(data, columns) -> pa.Table:
    """The ``columns`` of ``data`` (a RecordBatch or Table) as a Table DuckDB can scan."""
    arrays, fields = [], []
    for n in [n for n in data.schema.names if n in columns]:
        arr = data.column(n)
        f = data.schema.field(n)
        target = duck_type(f.type)
        if target is not None:
            arr = arr.cast(target)
            f = f.with_type(target)
        arrays.append(arr)
        fields.append(f)
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def _with_row_index(data, columns) -> pa.Table:
    table = _input(data, columns)
    index = pa.array(np.arange(data.num_rows, dtype=np.int64))
    if table.num_columns == 0:
        return pa.table({_ROW: index})
    return table.append_column(_ROW, index)


def _relation(batch: pa.RecordBatch, text: str, what: str, columns):
    import duckdb
    data = _input(batch, columns)
    try:
        return connection().from_arrow(data)
    except duckdb.Error as e:
        bad = [f"{f.name!r} ({f.type})" for f in data.schema]
        raise UnsupportedError(
            f"{what} {text!r}: DuckDB cannot read the column types {', '.join(bad)} ({e}); "
            "cast the column in a map() first, or filter on other columns") from None


def _fetch(build, text: str, what: str) -> pa.Table:
    import duckdb
    try:
        return build().to_arrow_table()
    except duckdb.Error as e:
        msg = str(e).split("\n\nLINE", 1)[0].strip()
        raise ExpressionError(f"{what} {text!r} failed in DuckDB: {msg}; fix the expression (e.g. "
                              "TRY_CAST, or filter out the values it cannot handle)") from None


def filter_mask_indices(batch: pa.RecordBatch, sql: str, text: str, columns) -> np.ndarray:
    """Positions of the rows of ``batch`` where the WHERE clause ``sql`` holds (DuckDB's
    WHERE semantics: NULL and false drop the row), in source order."""
    data = _with_row_index(batch, columns)
    rel = _relation(data, text, "filter", set(columns) | {_ROW})
    out = _fetch(lambda: rel.filter(sql).project(f'"{_ROW}"'), text, "filter")
    idx = out.column(0).to_numpy()
    if idx.size > 1 and np.any(idx[1:] < idx[:-1]):
        idx = np.sort(idx)
    return idx


def filter_batch(batch, sql: str, text: str, columns):
    """The rows of ``batch`` (a RecordBatch or a Table: one DuckDB call either way) where
    the WHERE clause ``sql`` holds, in order."""
    idx = filter_mask_indices(batch, sql, text, columns)
    if idx.size == batch.num_rows:
        return batch
    mask = np.zeros(batch.num_rows, dtype=bool)
    mask[idx] = True
    return filter_rows(batch, pa.array(mask))


def evaluate_many(batch: pa.RecordBatch, items: list[tuple[str, str, str]], columns) -> list[pa.Array]:
    """Values of several expressions (``(name, sql, text)``) over ``batch``, one per row,
    in one DuckDB query."""
    if not items:
        return []
    select = ", ".join(f'({sql}) AS "{i}"' for i, (_, sql, _) in enumerate(items))
    texts = "; ".join(t for _, _, t in items)
    # a scan of zero columns would yield no rows: a row index keeps the row count
    data = _with_row_index(batch, columns)
    rel = _relation(data, texts, "expression", set(columns) | {_ROW})
    out = _fetch(lambda: rel.project(select), texts, "expression")
    if out.num_rows != batch.num_rows:  # pragma: no cover - an aggregate would be refused earlier
        raise ExpressionError(f"expression {texts!r} does not give one value per row; use al.sql() "
                              "for aggregates")
    return [canonical(_one_array(out.column(i))) for i in range(len(items))]


def _one_array(column: pa.ChunkedArray) -> pa.Array:
    """A column's chunks as one array. Unions cannot be concatenated by Arrow (26): one
    chunk is taken as it is, more are refused in arrowload's words."""
    if column.num_chunks == 1:
        return column.chunk(0)
    t = column.type
    if column.num_chunks == 0 and pat.is_union(t) and t.mode == "sparse":  # no rows: typed all the same
        return pa.UnionArray.from_sparse(pa.array([], pa.int8()), [pa.array([], f.type) for f in t],
                                         field_names=[f.name for f in t], type_codes=list(t.type_codes))
    try:
        return column.combine_chunks()
    except pa.ArrowNotImplementedError as e:
        raise UnsupportedError(f"an expression of type {column.type} over several record batches is "
                               f"not supported ({e}); cast it to another type (e.g. VARCHAR)") from None


def canonical_type(t: pa.DataType) -> pa.DataType:
    """DuckDB's Arrow output with pyarrow's usual field names (``item`` for list values)."""
    if pat.is_fixed_size_list(t):
        return pa.list_(pa.field("item", canonical_type(t.value_type)), t.list_size)
    if pat.is_large_list(t):
        return pa.large_list(pa.field("item", canonical_type(t.value_type)))
    if pat.is_list(t):
        return pa.list_(pa.field("item", canonical_type(t.value_type)))
    return t


def canonical(arr: pa.Array) -> pa.Array:
    t = canonical_type(arr.type)
    return arr if str(t) == str(arr.type) else arr.cast(t)


def _empty(schema: pa.Schema, columns) -> pa.RecordBatch:
    """No rows of the ``columns`` of ``schema`` (any type, unions included)."""
    sub = pa.schema([f for f in schema if f.name in columns])
    try:
        table = empty_table(sub)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError) as e:
        bad = ", ".join(f"{f.name!r} ({f.type})" for f in sub)
        raise UnsupportedError(f"expressions over the column types {bad} are not supported ({e}); "
                               "convert the column in a map() first") from None
    return pa.RecordBatch.from_arrays([c.combine_chunks() for c in table.columns], schema=sub)


def output_types(schema: pa.Schema, items: list[tuple[str, str, str]], columns) -> list[pa.DataType]:
    """The Arrow types DuckDB gives the expressions over ``schema`` (evaluated on no rows)."""
    return [a.type for a in evaluate_many(_empty(schema, columns), items, columns)]


def check_predicate(schema: pa.Schema, sql: str, text: str, columns) -> None:
    """Bind the WHERE clause over ``schema`` now, so a type error or an unknown function
    fails at the call that wrote it, not at the first batch. A filter must be a boolean
    (or NULL): DuckDB would read ``WHERE id + 1`` as ``id + 1 <> 0``, almost always a typo."""
    empty = _empty(schema, columns)
    typ = evaluate_many(empty, [("_", sql, text)], columns)[0].type
    if not (pat.is_boolean(typ) or pat.is_null(typ)):
        raise ExpressionError(f"filter {text!r} is of type {typ}, not boolean; write a comparison "
                              "such as x > 0")
    filter_mask_indices(empty, sql, text, columns)
