"""``Dataset.describe()``: per-column statistics, from Parquet footers unless asked to scan.

Footers (the default) cost nothing beyond what ``ds.schema`` already read: min, max and
null count come from the row-group statistics the writer stored, sizes from the column
chunk metadata. ``exact=True`` runs one DuckDB scan over the selection instead (only the
described columns are read) for exact rows, nulls, min and max and a HyperLogLog
distinct estimate.

>>> import pyarrow as pa, arrowload as al
>>> al.dataset(pa.table({"x": [3, 1, None]})).describe(exact=True)["min", "max", "null_count"].row(0)
('1', '3', 1)
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import pyarrow as pa

from .errors import ColumnNotFoundError
from .plan.nodes import Filter, Limit, Map, Plan, Project, Scan
from .source.base import file_to_source_names

#: The columns of the table ``describe()`` returns, in order.
RESULT_COLUMNS = ("column", "type", "rows", "null_count", "min", "max", "approx_distinct",
                  "compressed_bytes", "uncompressed_bytes", "source")

SOURCE_FOOTER = "footer"
SOURCE_FOOTER_BOUNDS = "footer, before filter"
SOURCE_PARTITION = "partition folders"
SOURCE_SCAN = "scan"
SOURCE_NONE = "no statistics"
SOURCE_UNREADABLE = "footer unreadable"


def format_value(value: Any, type_: pa.DataType | None = None) -> str | None:
    """A statistic as text, the same way whether it came from a footer or a scan:
    float32 values with float32 precision, timestamps and dates in ISO format."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if type_ is not None and pa.types.is_float32(type_):
            import numpy as np
            return str(np.float32(value))
        return repr(value)
    if type(value).__name__ == "datetime64":  # past Python's datetime range
        return str(value).replace("T", " ")
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, (dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        return value.hex() if len(value) <= 32 else value[:32].hex() + "..."
    return str(value)


def _nested(type_: pa.DataType) -> bool:
    return pa.types.is_nested(type_) or pa.types.is_dictionary(type_) and pa.types.is_nested(type_.value_type)


# ---------------------------------------------------------------------------
# which scan columns the output columns are


def lineage(plan: Plan) -> tuple[Scan | None, dict[str, str | None], bool]:
    """Follow the output columns of ``plan`` down to one scan.

    Returns ``(scan, {output column: source column or None}, filtered)``: the scan (None
    when the columns do not come from a single scan, e.g. a DuckDB query), each output
    column's source column (None when computed), and whether rows are filtered or
    limited on the way (footer statistics then describe the rows *before* that)."""
    names = list(plan.schema.names)
    current: dict[str, str | None] = {n: n for n in names}
    filtered = False
    node = plan
    while True:
        if isinstance(node, Project):
            items = node.mapping
            current = {o: (items[c].column_name() if c is not None and c in items else None)
                       for o, c in current.items()}
            node = node.child
        elif isinstance(node, (Filter, Limit)):
            filtered = True
            node = node.child
        elif isinstance(node, Map):
            current = {o: None for o in current}
            node = node.child
        elif isinstance(node, Scan):
            if node.projection is not None:
                proj = dict(node.projection)
                current = {o: (proj[c].column_name() if c is not None and c in proj else None)
                           for o, c in current.items()}
            if node.predicate is not None or node.limit is not None:
                filtered = True
            return node, current, filtered
        else:
            return None, {o: None for o in current}, True


# ---------------------------------------------------------------------------
# footers


@dataclass
class _Acc:
    """Statistics of one source column, folded over row groups; None = unknown."""

    nulls: int | None = 0
    lo: Any = None
    hi: Any = None
    minmax_known: bool = True
    distinct: list = field(default_factory=list)
    compressed: int | None = 0
    uncompressed: int | None = 0
    unreadable: str | None = None  # why some footer metadata of the column could not be read

    def no_minmax(self) -> None:
        self.minmax_known = False

    def add_minmax(self, lo: Any, hi: Any) -> None:
        try:
            self.lo = lo if self.lo is None or lo < self.lo else self.lo
            self.hi = hi if self.hi is None or hi > self.hi else self.hi
        except TypeError:  # values of types Python cannot order against each other
            self.minmax_known = False

    def add_nulls(self, n: int | None) -> None:
        self.nulls = None if n is None or self.nulls is None else self.nulls + n

    def add_bytes(self, compressed: int | None, uncompressed: int | None) -> None:
        self.compressed = None if compressed is None or self.compressed is None else self.compressed + compressed
        self.uncompressed = None if uncompressed is None or self.uncompressed is None \
            else self.uncompressed + uncompressed


def _leaf_index(meta, names=None) -> dict[str, list[int]]:
    """Leaf column indices per top-level column, by the source's names (``names``: a
    file's column name -> the source's, where they differ: Delta column mapping)."""
    from .source.footer import leaf_columns
    out: dict[str, list[int]] = {}
    for c, name in enumerate(leaf_columns(meta)):
        out.setdefault(names.get(name, name) if names else name, []).append(c)
    return out


def _stat_value(stats, which: str, type_: pa.DataType | None = None) -> Any:
    """A min / max statistic as a Python value: float16 (stored as two bytes) as a float,
    a timestamp past Python's ``datetime`` range as numpy ``datetime64``."""
    try:
        value = getattr(stats, which)
    except (OverflowError, ValueError):
        if type_ is None or not (pa.types.is_timestamp(type_) or pa.types.is_date(type_)):
            raise
        value = _datetime64(getattr(stats, which + "_raw"), type_)
    if type_ is not None and pa.types.is_float16(type_) and isinstance(value, bytes) and len(value) == 2:
        import numpy as np
        value = float(np.frombuffer(value, dtype="<f2")[0])
    if isinstance(value, float) and math.isnan(value):
        raise ValueError("NaN statistic")
    if type_ is not None and pa.types.is_duration(type_):
        value = _as_column_type(value, type_)  # Parquet stores a duration as its int64 count
    if type_ is not None and pa.types.is_floating(type_) and isinstance(value, (int, float)) \
            and not isinstance(value, bool):
        # a file's integers under a unified float column bound it as floats; a zero bound
        # is +0.0 whatever its sign (writers store -0.0 as a min wherever a zero is)
        value = float(value) + 0.0
    return value


def footer_stats(scan: Scan, source_columns: Sequence[str]) -> tuple[int | None, dict[str, _Acc]]:
    """Rows and per-column statistics of ``scan``'s kept units from footer metadata
    already fetched (no I/O). Columns without statistics get unknown (None) fields."""
    src = scan.source
    units = scan.selected_units()
    rows = sum(u.num_rows for u in units) if all(u.num_rows is not None for u in units) else None
    accs = {c: _Acc() for c in source_columns}
    part_names = set(src.partition_schema.names)
    file_meta = getattr(src, "file_metadata", None)
    parquet = src.kind == "parquet" and file_meta is not None
    indexes: dict[int, dict[str, list[int]]] = {}
    types = {f.name: f.type for f in src.schema}
    footer_check = getattr(src, "footer_check", None)
    file_columns = getattr(src, "file_columns", lambda file: {})
    if parquet:
        src.prefetch_checks(sorted({u.file for u in units}))  # (an object store's, side by side)
    for u in units:
        if u.num_rows == 0:
            continue  # an empty row group (pyarrow writes one for a 0-row file) holds nothing to describe
        meta = file_meta(u.file) if parquet else None
        check = footer_check(u.file) if meta is not None and footer_check is not None else None
        mapped = file_columns(u.file)
        if meta is not None and u.file not in indexes:
            indexes[u.file] = _leaf_index(meta, file_to_source_names(mapped))
        rg = meta.row_group(u.row_group) if meta is not None and u.row_group is not None else None
        for c, acc in accs.items():
            if c in part_names or (c in mapped and mapped[c] is None and c in u.partition):
                value = u.partition.get(c)
                acc.add_bytes(0, 0)
                if value is None:
                    acc.add_nulls(u.num_rows)
                else:
                    acc.add_nulls(0)
                    acc.add_minmax(value, value)
                continue
            if rg is None:
                acc.nulls = None
                acc.no_minmax()
                acc.add_bytes(None, None)
                continue
            leaves = indexes[u.file].get(c, [])
            bad = [check.bad_chunks[(u.row_group, i)] for i in leaves
                   if check is not None and (u.row_group, i) in check.bad_chunks]
            if bad or (check is not None and check.problem is not None):
                # pyarrow would abort on this chunk's metadata: nothing of it is read
                acc.unreadable = acc.unreadable or (bad[0] if bad else check.problem)
                acc.nulls = None
                acc.no_minmax()
                acc.add_bytes(None, None)
                continue
            chunks = [rg.column(i) for i in leaves]
            acc.add_bytes(sum(ch.total_compressed_size for ch in chunks),
                          sum(ch.total_uncompressed_size for ch in chunks))
            if not chunks:  # the column is missing from this file: it reads as nulls
                acc.add_nulls(rg.num_rows)
                continue
            if len(chunks) != 1 or (c in types and pa.types.is_nested(types[c])):
                acc.nulls = None  # nested: leaf statistics do not describe rows
                acc.no_minmax()
                continue
            stats = chunks[0].statistics
            if stats is None:
                acc.nulls = None
                acc.no_minmax()
                continue
            # a deletion vector's rows are in the footer's counts: min / max still bound the
            # live rows, the null count does not count them
            acc.add_nulls(stats.null_count if stats.has_null_count and not u.deleted else None)
            acc.distinct.append(stats.distinct_count if getattr(stats, "has_distinct_count", False) else None)
            if stats.has_min_max:
                try:
                    acc.add_minmax(_stat_value(stats, "min", types.get(c)), _stat_value(stats, "max", types.get(c)))
                except Exception:  # noqa: BLE001 - a statistic pyarrow cannot convert is unknown
                    acc.no_minmax()
            elif not (stats.has_null_count and stats.null_count == rg.num_rows):
                acc.no_minmax()  # values but no min/max: unknown; all nulls: nothing to add
    return rows, accs


# ---------------------------------------------------------------------------
# the public entry point


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _types_of(schema: pa.Schema) -> dict[str, pa.DataType]:
    """Column name -> its type (the first one, where a file repeats a name): built once, as
    ``schema.names`` builds a list of every name on each call (16,000 columns described
    one by one took 27 s)."""
    out: dict[str, pa.DataType] = {}
    for f in schema:
        out.setdefault(f.name, f.type)
    return out


def _first_row(table: pa.Table) -> dict[str, Any]:
    """The first row as Python values; timestamps and dates past Python's ``datetime``
    range (year 9999) as numpy ``datetime64`` instead of an OverflowError."""
    out = {}
    for name, col in zip(table.column_names, table.columns):
        value = col[0]
        try:
            out[name] = value.as_py()
        except (OverflowError, ValueError):
            t = col.type
            if not (pa.types.is_timestamp(t) or pa.types.is_date(t)):
                raise
            out[name] = _datetime64(value.cast(pa.int64() if not pa.types.is_date32(t) else pa.int32()).as_py(), t)
    return out


def _datetime64(count: int, type_: pa.DataType):
    import numpy as np
    unit = "D" if pa.types.is_date32(type_) else "ms" if pa.types.is_date64(type_) else type_.unit
    return np.datetime64(int(count), unit)


def _exact_view(dataset, names: Sequence[str], schema: pa.Schema):
    """What DuckDB scans for ``exact=True``: the described columns, float16 widened to
    float32 (DuckDB has no half-float type; the values are the same) and durations as their
    int64 counts (DuckDB reads a duration as an INTERVAL of microseconds: a ``duration[ns]``
    lost its nanoseconds; ``_as_column_type`` gives the counts back as durations)."""
    types = _types_of(schema)
    halves = [n for n in names if pa.types.is_float16(types[n])]
    spans = [n for n in names if pa.types.is_duration(types[n])]
    if spans:
        dataset = dataset.map(_durations_as_counts, name="arrowload.describe.durations-as-int64")
    if not halves:
        return dataset.select(*names) if list(names) != list(schema.names) or spans else dataset
    return dataset.select(**{n: f"CAST({_quote(n)} AS FLOAT)" if n in halves else _quote(n) for n in names})


def _durations_as_counts(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with its duration columns as their int64 counts (same unit)."""
    return pa.RecordBatch.from_arrays(
        [c.cast(pa.int64()) if pa.types.is_duration(c.type) else c for c in batch.columns], names=batch.schema.names)


def _exact(dataset, names: Sequence[str], schema: pa.Schema) -> tuple[int, dict[str, tuple]]:
    """One DuckDB scan: rows, and per column (non-null count, min, max, distinct estimate)."""
    parts = ["count(*) AS __rows"]
    types = _types_of(schema)
    for i, n in enumerate(names):
        q = _quote(n)
        parts.append(f"count({q}) AS __n{i}")
        if not _nested(types[n]):
            parts.append(f"min({q}) AS __lo{i}, max({q}) AS __hi{i}")
        parts.append(f"approx_count_distinct({q}) AS __d{i}")
    row = _first_row(dataset.sql("SELECT " + ", ".join(parts) + " FROM self").to_arrow())
    out = {}
    for i, n in enumerate(names):
        lo, hi = (_as_column_type(row.get(f"__{k}{i}"), types[n]) for k in ("lo", "hi"))
        out[n] = (row[f"__n{i}"], lo, hi, row[f"__d{i}"])
    return row["__rows"], out



def _as_column_type(value: Any, type_: pa.DataType) -> Any:
    """A min / max as the column's own Python value: a duration's int64 count (the exact
    scan reads durations as counts, see ``_exact_view``; Parquet footers store them so) as
    the duration it is, as ``to_pylist`` gives it (a ``timedelta``; for nanoseconds,
    pandas' ``Timedelta`` where pandas is installed)."""
    if value is None or not pa.types.is_duration(type_) or isinstance(value, bool) or not isinstance(value, int):
        return value
    return pa.scalar(value, type_).as_py()


def describe(dataset, columns: Sequence[str] | str | None = None, *, exact: bool = False):
    """Per-column statistics of ``dataset``'s output as a ``polars.DataFrame``, one row
    per column: ``column, type, rows, null_count, min, max, approx_distinct,
    compressed_bytes, uncompressed_bytes, source``. min / max are text (one column
    holds every type), rendered the same way from footers and from scans; the typed
    values are in the result's ``bounds`` (``{column: (min, max)}``). The frame is a
    :class:`arrowload.description.Description`: its displays (notebook and ``repr``)
    show every column with counts, byte units and the share of bytes read.

    ``exact=False`` (default): from Parquet footers only, no data page is read. ``source``
    says ``"footer"`` when the statistics describe exactly the selected rows,
    ``"footer, before filter"`` when the selection filters or limits rows (the values
    then bound the selection: the kept row groups before the filter),
    ``"partition folders"`` for hive partition columns (values from the folder names),
    ``"no statistics"`` where the format or a computed column has none. min / max
    leave NaN out (as Parquet writers do); ``approx_distinct`` is known from footers
    only where the writer stored a distinct count and a single row group holds the column.
    ``exact=True``: one scan (DuckDB) over the described columns of the selection; rows,
    nulls, min and max are exact, ``approx_distinct`` is a HyperLogLog estimate.
    Byte sizes always come from footers (the bytes the column takes on disk).
    """
    import polars as pl

    schema = dataset.schema
    if isinstance(columns, str):
        columns = [columns]
    if columns is not None and (not isinstance(columns, (list, tuple)) or
                                not all(isinstance(c, str) for c in columns)):
        from .errors import ArgumentTypeError
        raise ArgumentTypeError(f"describe(columns=...) takes a column name or a list of names, got "
                                f"{columns!r}; e.g. describe(['a', 'b'])", "columns")
    names = list(schema.names) if columns is None else list(columns)
    types = _types_of(schema)
    for n in names:
        if n not in types:
            raise ColumnNotFoundError(n, schema.names, "describe()")
    plan = dataset.optimized_plan()
    scan, mapping, filtered = lineage(plan)
    src_cols = sorted({mapping[n] for n in names if mapping.get(n) is not None})
    rows: int | None = None
    accs: dict[str, _Acc] = {}
    has_stats = False
    if scan is not None:
        rows, accs = footer_stats(scan, src_cols)
        has_stats = scan.source.has_statistics
    scanned: dict[str, tuple] = {}
    if exact:
        sub = _exact_view(dataset, names, schema)
        rows, scanned = _exact(sub, names, schema)
    records = []
    bounds: dict[str, tuple[Any, Any]] = {}
    for n in names:
        type_ = types[n]
        acc = accs.get(mapping.get(n)) if mapping.get(n) is not None else None
        rec: dict[str, Any] = {"column": n, "type": str(type_), "rows": rows, "null_count": None,
                               "min": None, "max": None, "approx_distinct": None,
                               "compressed_bytes": acc.compressed if acc else None,
                               "uncompressed_bytes": acc.uncompressed if acc else None,
                               "source": SOURCE_NONE}
        if exact:
            count, lo, hi, distinct = scanned[n]
            bounds[n] = (lo, hi)
            rec.update(null_count=rows - count, min=format_value(lo, type_), max=format_value(hi, type_),
                       approx_distinct=min(distinct, count) if distinct is not None else None,
                       source=SOURCE_SCAN)
        elif acc is not None and (has_stats or mapping[n] in scan.source.partition_schema.names):
            partition = mapping[n] in scan.source.partition_schema.names
            rec["null_count"] = acc.nulls
            if acc.minmax_known:
                bounds[n] = (acc.lo, acc.hi)
                rec["min"], rec["max"] = format_value(acc.lo, type_), format_value(acc.hi, type_)
            if len(acc.distinct) == 1 and acc.distinct[0] is not None:
                rec["approx_distinct"] = acc.distinct[0]
            rec["source"] = SOURCE_PARTITION if partition else SOURCE_FOOTER
            if filtered:
                rec["source"] += ", before filter"
            if acc.unreadable:
                rec["source"] = f"{SOURCE_UNREADABLE}: {acc.unreadable}"
        table_line = getattr(scan.source, "table_line", None) if scan is not None else None
        if table_line is not None:  # a lake table: which version, files and deleted rows
            rec["source"] += f" ({table_line(scan.selected_units())})"
        records.append(rec)
        bounds.setdefault(n, (None, None))
    from .description import Description
    frame = pl.DataFrame(records, schema={
        "column": pl.String, "type": pl.String, "rows": pl.Int64, "null_count": pl.Int64,
        "min": pl.String, "max": pl.String, "approx_distinct": pl.Int64,
        "compressed_bytes": pl.Int64, "uncompressed_bytes": pl.Int64, "source": pl.String,
    })
    how = "from one scan" if exact else "from footers"
    return Description.of(frame, bounds, how)
