"""What the loader checks when it is built, before the first batch (and before a global
shuffle has read anything more than it must): the output's shape is known then.

- ``stack=`` names (a typo is a ``ColumnNotFoundError`` with a suggestion), ``pad_lists`` /
  ``fill_null`` names;
- variable-length list columns that are not padded must hold lists of one length ``k``
  (they become ``[batch, k]`` arrays): checked exactly on the random-access table (global
  shuffle), and from Parquet footers where the scan keeps every row of its row groups (a
  row group whose value count is not a multiple of its row count, or two row groups of
  different widths, cannot be rectangular);
- nulls in array-valued columns without ``fill_null``: exactly on the random-access table,
  and from Parquet footer statistics (``null_count > 0`` in a kept row group) where the
  scan keeps every row of its row groups.

Where nothing can be known at build time (a filter keeps some rows of a row group, no
statistics, a ``transform=`` that reshapes batches), the checks made per read remain the
backstop: :class:`ListWidths` keeps the width of each unpadded list column the same from
batch to batch, and conversion refuses nulls and ragged lists per batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..convert.host import _check_names, _fill_for, array_valued, arrow_scalar, host_scalar, leaf_type, null_fix
from ..convert.options import ConvertOptions
from ..errors import ConversionError, InvalidArgumentError
from ..plan.nodes import Plan, Scan
from ..source.footer import leaf_facts
from .chunks import _varlist, pad_fix as _fix
from .collate import resolve_stack


def unpadded_lists(schema: pa.Schema, opts: ConvertOptions) -> tuple[str, ...]:
    """Variable-length list columns that convert as ``[batch, k]`` (not padded)."""
    return tuple(f.name for f in schema if _varlist(f.type) and array_valued(f.type) and not opts.pads(f.name))


def check_plan(schema: pa.Schema, plan: Plan, opts: ConvertOptions, stack: Mapping[str, Any] | None) -> None:
    """Before any data is read (before a global shuffle builds its random-access table):
    option names against the output schema, and Parquet footer facts where the scan keeps
    every row of its row groups."""
    if stack:
        resolve_stack(stack, schema)
    if opts.output == "arrow":
        return
    _check_names(opts, schema.names)
    _check_fills(schema, opts)
    if isinstance(plan, Scan) and plan.predicate is None and plan.limit is None:
        _check_footers(plan, schema, opts)


def _check_fills(schema: pa.Schema, opts: ConvertOptions) -> None:
    """Each ``fill_null`` value against the (leaf) type of each column it fills: a value
    that does not fit (``'a'`` for a double, ``9`` for a bool) is refused now, not at the
    first batch with nulls."""
    for field in schema:
        fill = _fill_for(field.name, field.type, opts)
        if fill is None:
            continue
        leaf = leaf_type(field.type)
        try:
            if array_valued(leaf):
                host_scalar(field.name, fill, leaf, "fill_null")
            else:  # strings, decimals, structs: filled as Python objects (``host._objects``)
                arrow_scalar(field.name, fill, leaf, "fill_null")
        except ConversionError as exc:
            raise InvalidArgumentError(str(exc), "fill_null") from None


def check_source(source: Any, opts: ConvertOptions) -> dict[str, int]:
    """After the random-access table is built (global shuffle, SQL results): its nulls and
    list lengths, exactly. Returns the widths of unpadded list columns (name -> k)."""
    table = getattr(source, "table", None)
    if opts.output == "arrow" or not isinstance(table, pa.Table):
        return {}
    return _check_table(table, opts)


def _check_table(table: pa.Table, opts: ConvertOptions) -> dict[str, int]:
    widths = {}
    lists = set(unpadded_lists(table.schema, opts))
    for field, column in zip(table.schema, table.columns):
        if isinstance(field.type, pa.ExtensionType):  # (Hugging Face's Array2D): its storage's checks
            column = pa.chunked_array([c.storage for c in column.chunks], type=field.type.storage_type)
            field = field.with_type(field.type.storage_type)
        name = field.name
        if not array_valued(field.type):
            continue
        fill = _fill_for(name, field.type, opts)
        if name in lists:
            if column.null_count:
                raise ConversionError(f"column {name!r} ({field.type}) has {column.null_count} null list(s) in "
                                      f"the selection, which have no rectangular array form; filter them out "
                                      f"(.filter(\"{name} IS NOT NULL\")) or {_fix(name)}", column=name)
            lengths = pc.list_value_length(column)
            bounds = pc.min_max(lengths)
            lo, hi = bounds["min"].as_py(), bounds["max"].as_py()
            if lo is not None and lo != hi:
                raise ConversionError(f"column {name!r} is a variable-length list ({field.type}) with lengths "
                                      f"{lo} to {hi} in the selection, which have no rectangular array form; "
                                      f"{_fix(name, hi)}", column=name)
            widths[name] = lo or 0
        if fill is None:
            nulls = column.null_count
            if pa.types.is_list(field.type) or pa.types.is_large_list(field.type) or \
                    pa.types.is_fixed_size_list(field.type):
                nulls += pc.list_flatten(column).null_count if len(column) else 0
            if nulls:
                raise ConversionError(f"column {name!r} ({field.type}) has {nulls} null(s) in the selection; "
                                      f"{null_fix(name, field.type)}", column=name)
    return widths


def _check_footers(scan: Scan, schema: pa.Schema, opts: ConvertOptions) -> None:
    """Every row of each kept row group reaches the loader: footer facts are facts about it."""
    source = scan.source
    if not getattr(source, "has_statistics", False) or not hasattr(source, "file_metadata"):
        return
    lists = set(unpadded_lists(schema, opts))
    # output column -> the source column it passes through unchanged (computed ones are left
    # to the per-read checks)
    if scan.projection is None:
        through = {n: n for n in schema.names}
    else:
        through = {n: e.column_name() for n, e in scan.projection if e.column_name() is not None}
    wanted = {through[f.name]: f for f in schema if f.name in through and array_valued(f.type)
              and (f.name in lists or _fill_for(f.name, f.type, opts) is None)}
    if not wanted:
        return
    widths: dict[str, tuple[int, str]] = {}
    columns: dict[int, list[tuple[int, str, pa.Field]]] = {}  # per file: (index, path, output field)
    source.prefetch_checks(sorted({u.file for u in scan.selected_units()}))  # (an object store's, side by side)
    for unit in scan.selected_units():
        if unit.row_group is None or unit.deleted or source.file_columns(unit.file):
            # (deletes remove rows the footer still counts; a file whose columns are renamed
            # or stand for other columns: its footer names the file's columns, not the source's)
            continue
        if unit.file not in columns and hasattr(source, "refuse_unreadable"):
            # encrypted / damaged column metadata aborts pyarrow's accessors: a typed error now
            source.refuse_unreadable([unit.file])
        try:
            meta = source.file_metadata(unit.file)
            rg = meta.row_group(unit.row_group)
            if unit.file not in columns:  # the leaf columns to look at, found once per file
                found = []
                for j, (head, leaf, _) in enumerate(leaf_facts(meta)):  # (a dotted name is one column's)
                    if leaf is None:
                        return  # a name that is not UTF-8: the per-read checks decide
                    rest = leaf[len(head) + 1:] if leaf.startswith(head + ".") else ""
                    if head in wanted:
                        found.append((j, wanted[head].name + ("." + rest if rest else ""), wanted[head]))
                columns[unit.file] = found
        except Exception:  # noqa: BLE001 - footers that cannot be read: the per-read checks decide
            return
        rows = rg.num_rows
        where = f"{unit.path}, row group {unit.row_group}"
        for j, path, field in columns[unit.file]:
            try:
                chunk = rg.column(j)
                stats = chunk.statistics if chunk.is_stats_set else None
                nulls = stats.null_count if stats is not None and stats.has_null_count else None
                values = chunk.num_values
            except Exception:  # noqa: BLE001 - damaged column metadata: left to the read
                continue
            top = field.name
            if path == top and nulls and _fill_for(top, field.type, opts) is None:
                raise ConversionError(f"column {top!r} ({field.type}) has {nulls} null(s) in {where} (Parquet "
                                      f"footer statistics), which the loader reads; {null_fix(top, field.type)}",
                                      column=top)
            if top in lists and path != top and rows:
                if values % rows:
                    raise ConversionError(
                        f"column {top!r} is a variable-length list ({field.type}) whose lists differ in "
                        f"length (Parquet footer: {values} values for {rows} rows in {where}), which has no "
                        f"rectangular array form; {_fix(top)}", column=top)
                k = values // rows
                seen = widths.setdefault(top, (k, where))
                if seen[0] != k:
                    raise ConversionError(
                        f"column {top!r} is a variable-length list ({field.type}) with lists of {seen[0]} "
                        f"values in {seen[1]} and of {k} in {where} (Parquet footers), which have no "
                        f"rectangular array form; {_fix(top, max(k, seen[0]))}", column=top)


class ListWidths:
    """The width of each unpadded list column, fixed by the first batch (or by the build's
    check): a later batch of another width is an error, never a batch of another shape.
    Called on the one thread that emits batches, in order."""

    def __init__(self, names: tuple[str, ...], known: Mapping[str, int]) -> None:
        self.names = names
        self.widths = dict(known)

    def check(self, host: Mapping[str, Any]) -> None:
        for name in self.names:
            value = host.get(name)
            shape = getattr(value, "shape", None)
            if shape is None or len(shape) < 2 or shape[0] == 0:
                continue
            k = self.widths.setdefault(name, shape[1])
            if k != shape[1]:
                raise ConversionError(f"column {name!r} is a variable-length list whose lists have {shape[1]} "
                                      f"values in this batch and {k} in earlier ones, which gives batches of "
                                      f"different shapes; {_fix(name, max(k, shape[1]))}", column=name)
