"""Run a (usually optimized) plan: stream record batches, build tables, count rows.

Scans go through pyarrow's dataset scanner over exactly the units the plan kept, with
the pushed predicate and projection, ``pre_buffer`` (coalesced reads) and row-group
sized batches; the GIL is released while it decodes. Nodes left above the scan (a
polars filter, a map, an unpushed projection) run per batch in arrow compute.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.dataset as ds

from ..errors import AmbiguousColumnError, ArrowloadError, CorruptFileError, ExpressionError
from ..options import Options, ScanOptions
from ..plan.nodes import Filter, Limit, Map, Plan, Project, Scan, SqlQuery
from ..source import FileSource
from ..source.filesystem import storage_error
from ..source.retry import retry

_MAX_BATCH_ROWS = 1 << 20


def _batch_rows(scan: Scan, options: Options) -> int:
    if options.scan.batch_rows:
        return options.scan.batch_rows
    rows = [u.num_rows for u in scan.selected_units() if u.num_rows]
    return min(max(rows, default=131_072), _MAX_BATCH_ROWS)


def scanner(scan: Scan, options: Options, units=None, *, streaming: bool = False) -> ds.Scanner:
    """A pyarrow Scanner for ``scan`` (or a subset of its ``units``)."""
    src = scan.source
    _refuse_ambiguous(scan)
    # a filter makes pyarrow read column chunk statistics: the source checks footers first
    dataset = src.dataset(scan.units if units is None else units, statistics=scan.predicate is not None)
    schema = src.schema
    columns: list[str] | dict | None
    if scan.projection is not None:
        columns = {name: e.to_arrow(schema) for name, e in scan.projection}
    else:
        columns = list(scan.columns) if scan.columns is not None else None
    kwargs = dict(
        columns=columns,
        filter=scan.predicate.to_arrow(schema, predicate=True) if scan.predicate is not None else None,
        batch_size=_batch_rows(scan, options),
        use_threads=options.scan.use_threads,
        batch_readahead=1 if streaming else options.scan.batch_readahead,
        fragment_readahead=1 if streaming else options.scan.fragment_readahead,
    )
    kwargs.update(_fragment_options(src, options))
    return ds.Scanner.from_dataset(dataset, **kwargs)


def _refuse_ambiguous(scan: Scan) -> None:
    """Files may hold several columns of one name (pyarrow reads them, its datasets cannot
    tell them apart): reading such a name is an error, the other columns read fine."""
    names = scan.source.schema.names
    if len(set(names)) == len(names):
        return
    dups = sorted({n for n in names if names.count(n) > 1})
    read = scan.read_columns
    hit = [n for n in dups if n in read]
    if hit:
        others = [n for n in dict.fromkeys(names) if n not in dups]
        hint = f".select({', '.join(repr(n) for n in others[:5])})" if others else "a rewrite"
        raise AmbiguousColumnError(
            f"column {hit[0]!r} is ambiguous: {scan.source.display} has {names.count(hit[0])} columns "
            f"named {hit[0]!r}, and reading it (or every column) cannot tell them apart; select the "
            f"other columns by name ({hint}), or rewrite the file with unique column names", hit[0])


def _fragment_options(src, options: Options) -> dict:
    """Parquet fragment scan options of every read: pre-buffering and page checksums."""
    if src.kind != "parquet":
        return {}
    return {"fragment_scan_options": ds.ParquetFragmentScanOptions(
        pre_buffer=options.scan.pre_buffer, page_checksum_verification=options.scan.page_checksums)}


_STRICT = Options(scan=ScanOptions(page_checksums=True))


def _read_error(scan: Scan, exc: BaseException) -> ArrowloadError:
    """Name the shard that failed: re-read the kept files one by one to find it."""
    src = scan.source
    if isinstance(src, FileSource):
        for f in sorted({u.file for u in scan.selected_units()}):
            path = src.entries[f].path
            units = [u.index for u in scan.selected_units() if u.file == f]
            try:
                # checksums verified here whatever the default: a bad page is the file's fault
                for _ in scanner(scan, _STRICT, units, streaming=True).to_batches():
                    pass
            except Exception as inner:  # noqa: BLE001
                typed = storage_error(inner, path, local=src.is_local)  # credentials, denied, endpoint
                if typed is not None:
                    return typed
                if _decodes_plainly(scan, units):
                    return ExpressionError(f"evaluating the selection on {path!r} failed: {inner}; the "
                                           "file itself reads fine: fix the filter / expression (e.g. "
                                           "filter out the values a CAST cannot convert)")
                check = src.footer_check(f) if src.kind == "parquet" else None
                if check is not None and not check.ok:  # say which column, and why
                    return CorruptFileError(f"cannot read {path!r}: {check.reason()}; {check.fix()}", path)
                return CorruptFileError(f"cannot read {path!r}: {inner}; the file is truncated or "
                                        "corrupt; remove or rewrite it", path)
    return ArrowloadError(f"scanning {src.display} failed: {exc}")


def _decodes_plainly(scan: Scan, units: list[int]) -> bool:
    """True when the units' columns decode without the plan's filter and expressions: a
    failure was then the expression's (a CAST that cannot convert ...), not the file's."""
    if scan.projection is None and scan.predicate is None:
        return False
    try:
        extra = {"fragment_scan_options": ds.ParquetFragmentScanOptions(page_checksum_verification=True)} \
            if scan.source.kind == "parquet" else {}
        for _ in ds.Scanner.from_dataset(scan.source.dataset(units, statistics=False),
                                         columns=list(scan.read_columns),
                                         batch_readahead=1, fragment_readahead=1, **extra).to_batches():
            pass
    except Exception:  # noqa: BLE001
        return False
    return True


_READ_ERRORS = (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, OSError)


def scan_batches(scan: Scan, options: Options, *, under_limit: bool = False) -> Iterator[pa.RecordBatch]:
    """Batches of ``scan`` in source order; with a limit, stop reading once it is met.
    ``under_limit``: a Limit above (past a residual filter or a map) may stop consuming
    early, so read unit by unit rather than let the scanner read ahead."""
    remaining = scan.limit
    if remaining == 0:
        return
    try:
        if (remaining is not None and scan.predicate is not None) or under_limit:
            # Selective filter under a limit: read unit by unit and stop early.
            batches = (b for u in (scan.units if scan.units is not None else range(len(scan.source.units())))
                       for b in scanner(scan, options, (u,), streaming=True).to_batches())
        else:
            batches = scanner(scan, options, streaming=remaining is not None).to_batches()
        for b in batches:
            if b.num_rows == 0:
                continue
            if remaining is not None:
                if b.num_rows >= remaining:
                    yield b.slice(0, remaining)
                    return
                remaining -= b.num_rows
            yield b
    except _READ_ERRORS as exc:
        if isinstance(exc, (FileNotFoundError, ArrowloadError)):  # already says which file
            raise
        raise _read_error(scan, exc) from exc
    except Exception as exc:  # botocore's errors are not OSErrors
        typed = storage_error(exc, scan.source.display, local=getattr(scan.source, 'is_local', False))
        if typed is None:
            raise
        raise typed from exc


def as_record_batch(out, what: str) -> pa.RecordBatch:
    """What a user function returned (a RecordBatch, Table or polars DataFrame) as one
    RecordBatch; a Table of several chunks is concatenated (one copy)."""
    if type(out).__module__.split(".")[0] == "polars":
        out = out.to_arrow()
    if isinstance(out, pa.Table):
        return out.combine_chunks().to_batches()[0] if out.num_rows else \
            pa.RecordBatch.from_pylist([], schema=out.schema)
    if not isinstance(out, pa.RecordBatch):
        raise TypeError(f"{what} must return a pyarrow RecordBatch (or Table / polars DataFrame), "
                        f"got {type(out).__name__}")
    return out


def apply_map(node: Map, batch: pa.RecordBatch) -> pa.RecordBatch:
    if node.columns is not None:
        batch = batch.select(list(node.columns))
    return as_record_batch(node.fn(batch), f"map function {node.name or node.fn!r}")


def _project(node: Project, batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    arrays = []
    for (name, e), f in zip(node.items, schema):
        ref = e.column_name()
        arr = batch.column(ref) if ref is not None else e.evaluate(batch)
        arrays.append(arr if arr.type.equals(f.type) else arr.cast(f.type))
    if not arrays:
        return batch.select([])
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def iter_batches(plan: Plan, options: Options, *, _under_limit: bool = False) -> Iterator[pa.RecordBatch]:
    """Stream the plan's output batches, in order."""
    if isinstance(plan, Scan):
        yield from scan_batches(plan, options, under_limit=_under_limit)
    elif isinstance(plan, Filter):
        for b in iter_batches(plan.child, options, _under_limit=_under_limit):
            out = plan.predicate.filter_batch(b)
            if out.num_rows:
                yield out
    elif isinstance(plan, Project):
        schema = plan.schema
        for b in iter_batches(plan.child, options, _under_limit=_under_limit):
            yield _project(plan, b, schema)
    elif isinstance(plan, Map):
        for b in iter_batches(plan.child, options, _under_limit=_under_limit):
            yield apply_map(plan, b)
    elif isinstance(plan, SqlQuery):
        from ..sql.duck import stream
        yield from stream(plan, options)
    elif isinstance(plan, Limit):
        remaining = plan.n
        if remaining == 0:
            return
        for b in iter_batches(plan.child, options, _under_limit=True):
            if b.num_rows >= remaining:
                yield b.slice(0, remaining)
                return
            remaining -= b.num_rows
            yield b
    else:  # pragma: no cover - every node type is handled above
        raise TypeError(f"cannot execute {type(plan).__name__}")


def to_table(plan: Plan, options: Options) -> pa.Table:
    """The whole result. A bare scan runs as one multi-threaded pyarrow scan."""
    if isinstance(plan, Scan) and plan.limit is None:
        try:
            # a whole scan is idempotent: transient object-store errors are retried with backoff
            return retry(lambda: scanner(plan, options).to_table(), retries=options.scan.retries,
                         backoff_s=options.scan.retry_backoff_s)
        except _READ_ERRORS as exc:
            if isinstance(exc, (FileNotFoundError, ArrowloadError)):  # already says which file
                raise
            raise _read_error(plan, exc) from exc
        except Exception as exc:  # botocore's errors are not OSErrors
            typed = storage_error(exc, plan.source.display, local=getattr(plan.source, 'is_local', False))
            if typed is None:
                raise
            raise typed from exc
    return pa.Table.from_batches(list(iter_batches(plan, options)), schema=plan.schema)


def _count_row_group_subsets(dataset: ds.FileSystemDataset, expr, **scan_kwargs) -> int:
    """``count_rows`` of Parquet fragments that may hold a subset of their file's row groups.

    pyarrow (26) counts such a fragment as its whole file when the filter is decided true
    by the partition values alone (``country = 'DE'`` on ``country=DE/``): its fast path
    returns the file's row count. A fragment never holds more rows than its row groups,
    and in that case holds exactly them, so the count is capped there.
    """
    total = 0
    for frag in dataset.get_fragments():
        one = ds.FileSystemDataset([frag], dataset.schema, dataset.format, dataset.filesystem)
        n = one.count_rows(filter=expr, **scan_kwargs)
        groups = frag.row_groups
        if groups is not None:
            n = min(n, sum(g.num_rows for g in groups))
        total += n
    return total


def count_rows(plan: Plan, options: Options) -> int:
    """Rows the plan returns, reading as little as the plan allows.

    Projections keep counts; a scan without predicate counts from footers (Parquet,
    IPC, memory); a pushed predicate lets pyarrow answer from statistics where they
    decide it and otherwise read only the predicate's columns.
    """
    node = plan
    while isinstance(node, Project):
        node = node.child
    if isinstance(node, Limit):
        return min(node.n, count_rows(node.child, options))
    if isinstance(node, SqlQuery):
        from ..sql.duck import count
        return count(node, options)
    if isinstance(node, Scan) and options.optimizer.metadata_count:
        units = node.selected_units()
        if node.predicate is None and all(u.num_rows is not None for u in units):
            total = sum(u.num_rows for u in units)
        else:
            src = node.source
            expr = node.predicate.to_arrow(src.schema, predicate=True) if node.predicate else None
            try:
                frag_opts = _fragment_options(src, options)
                if expr is not None and node.units is not None and src.kind == "parquet":
                    total = _count_row_group_subsets(src.dataset(node.units), expr, **frag_opts)
                else:
                    total = src.dataset(node.units).count_rows(filter=expr, **frag_opts) if expr is not None \
                        else src.dataset(node.units, statistics=False).count_rows(**frag_opts)
            except _READ_ERRORS as exc:
                if isinstance(exc, (FileNotFoundError, ArrowloadError)):  # already says which file
                    raise
                raise _read_error(node, exc) from exc
        return total if node.limit is None else min(total, node.limit)
    return sum(b.num_rows for b in iter_batches(node, options))
