"""Run a (usually optimized) plan: stream record batches, build tables, count rows.

Scans go through pyarrow's dataset scanner over exactly the units the plan kept, with
the pushed projection, ``pre_buffer`` (coalesced reads) and row-group sized batches; the
GIL is released while it decodes. The pushed predicate is computed by the scanner as one
more column and applied to each batch (``keep_rows``), never handed to pyarrow as a scan
filter: pyarrow would skip row groups by statistics without asking whether they are
sound (the optimizer's ``prune_row_groups`` does that). Nodes left above the scan run per
batch: a residual SQL filter or computed column in DuckDB (one call per run of batches,
``duckeval``), a polars filter in polars, a map in the user's function.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.types as pat

from ..errors import (AmbiguousColumnError, ArrowloadError, CorruptFileError, ExpressionError, ScanError,
                      SchemaMismatchError, StorageRetryError)
from ..optimize.prune_row_groups import matching_row_groups, sound_columns
from ..options import Options, ScanOptions
from ..plan.expr import SqlExpr
from ..plan.rowselect import filter_rows
from ..plan.mapfn import apply_map, as_record_batch  # noqa: F401 - as_record_batch: the loader's
from ..plan.nodes import Filter, Limit, Map, Plan, Project, Scan, SqlQuery, walk
from ..source import FileSource
from ..source.filesystem import storage_error
from ..source.retry import is_transient, retry
from ..source.schema import widen
from ..source.snapshot import changed_paths, files_changed_error
from .duck import PlanReader
from .duck import count as sql_count
from .duck import ordered as ordered_query
from .duck import stream as sql_stream

_MAX_BATCH_ROWS = 1 << 20
KEEP = "__arrowload_keep"


def keep_rows(data):
    """A scanner's batch (or table) with the pushed predicate applied: rows where the
    ``KEEP`` column is true (null and false drop the row, as in SQL), without that column."""
    names = data.schema.names
    if not names or names[-1] != KEEP:
        return data
    mask = data.column(len(names) - 1)
    data = data.drop_columns([KEEP]) if isinstance(data, pa.Table) else data.select(names[:-1])
    if mask.null_count == 0 and pc.all(mask).as_py() is not False:
        return data
    return filter_rows(data, mask)


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
    dataset = src.dataset(scan.units if units is None else units, statistics=scan.predicate is not None,
                          columns=scan.read_columns)
    schema = src.schema
    columns: list[str] | dict | None
    if scan.projection is not None:
        columns = {name: e.to_arrow(schema) for name, e in scan.projection}
    else:
        columns = list(scan.columns) if scan.columns is not None else None
    if scan.predicate is not None:
        # The predicate is computed as a column and applied by ``keep_rows``, never given to
        # pyarrow as a scan filter: pyarrow would skip row groups by their statistics, which
        # is unsound where statistics are missing NaN, corrupt or implausible. Pruning is the
        # optimizer's job (prune_row_groups), which checks the statistics first.
        if not isinstance(columns, dict):
            columns = {n: pc.field(n) for n in (columns if columns is not None else schema.names)}
        columns[KEEP] = scan.predicate.to_arrow(schema, predicate=True)
    kwargs = dict(
        columns=columns,
        filter=None,
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


def read_error(scan: Scan, exc: BaseException) -> ArrowloadError:
    """Name the shard that failed: re-read the kept files one by one to find it. Files
    changed since they were listed come first: their footers, read then, no longer
    describe them (a rewritten file is not a corrupt one)."""
    src = scan.source
    if isinstance(src, FileSource):
        changed = _changed_since_opened(src)
        if changed is not None:
            return changed
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
                if is_transient(inner):  # the storage, not the file: retrying may succeed
                    return StorageRetryError(
                        f"reading {path!r} kept failing with transient storage errors: {inner}. The "
                        "file is not at fault; try again later, or retry longer with "
                        "al.Options(scan=al.ScanOptions(retries=..., retry_backoff_s=...))", path)
                if _decodes_plainly(scan, units):
                    return ExpressionError(f"evaluating the selection on {path!r} failed: {inner}; the "
                                           "file itself reads fine: fix the filter / expression (e.g. "
                                           "filter out the values a CAST cannot convert)")
                unfit = _unfit_widening(src, f, scan.read_columns)
                if unfit is not None:
                    return unfit
                check = src.footer_check(f) if src.kind == "parquet" else None
                if check is not None and not check.ok:  # say which column, and why
                    return CorruptFileError(f"cannot read {path!r}: {check.reason()}; {check.fix()}", path)
                return CorruptFileError(f"cannot read {path!r}: {inner}; pyarrow cannot decode it: the file "
                                        "is truncated or corrupt, or laid out in a way pyarrow does not read "
                                        "(another reader, e.g. DuckDB, may); rewrite it", path)
    if is_transient(exc):
        return StorageRetryError(f"scanning {src.display} failed with a transient storage error: {exc} "
                                 "(reading each file again did not fail). Try again later, or "
                                 "retry longer with al.ScanOptions(retries=..., retry_backoff_s=...)")
    return ScanError(f"scanning {src.display} failed: {exc}; reading each file again on its own did not "
                     "fail, so no file is at fault: retry the read")


def _unfit_widening(src: FileSource, f: int, columns) -> SchemaMismatchError | None:
    """The error of file ``f`` whose column reads in its own type but whose values do not fit
    the type the source widened it to for other files (``schema.merge_types``: ``timestamp[ms]``
    next to ``timestamp[ns]`` is ``timestamp[ns]``, which holds no date past 2262): the
    files disagree, neither is corrupt. None where every column fits (or reads nowhere)."""
    path = src.entries[f].path
    unified = src.schema
    names = [n for n in (columns if columns is not None else unified.names) if n in unified.names]
    try:
        own = src.own_columns(f, names)
    except Exception:  # noqa: BLE001 - the file's own failure: not a widening
        return None
    for name in own.column_names:
        have, want = own.schema.field(name).type, unified.field(name).type
        if have.equals(want):
            continue
        try:
            widen(own.column(name), want)
        except pa.ArrowInvalid as exc:  # a value out of the widened type's range
            return SchemaMismatchError(
                f"column {name!r} is {have} in {path!r} and {want} in the source (widened for its other "
                f"files), and its values there do not fit {want}: {exc}. Neither file is corrupt: rewrite "
                "one shard with the other's type, or select a subset of files")
    return None


def _decodes_plainly(scan: Scan, units: list[int]) -> bool:
    """True when the units' columns decode without the plan's filter and expressions: a
    failure was then the expression's (a CAST that cannot convert ...), not the file's."""
    if scan.projection is None and scan.predicate is None:
        return False
    try:
        extra = {"fragment_scan_options": ds.ParquetFragmentScanOptions(page_checksum_verification=True)} \
            if scan.source.kind == "parquet" else {}
        for _ in ds.Scanner.from_dataset(scan.source.dataset(units, statistics=False, columns=scan.read_columns),
                                         columns=list(scan.read_columns),
                                         batch_readahead=1, fragment_readahead=1, **extra).to_batches():
            pass
    except Exception:  # noqa: BLE001
        return False
    return True


_READ_ERRORS = (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, OSError)


def _changed_since_opened(source) -> ArrowloadError | None:
    """``SnapshotChangedError`` naming the files of ``source`` gone or rewritten since the
    dataset listed them; None where none are (or asking fails)."""
    changed = changed_paths(source)
    if not changed:
        return None
    return files_changed_error(changed, "the dataset", "it was opened",
                               "open the dataset again (al.dataset(...)) to read the files as they are now")


def scan_error(scan: Scan, exc: BaseException) -> ArrowloadError | None:
    """The arrowload error for a failed read of ``scan``: a read error names the file at
    fault (``read_error``), an object-store refusal says what to set (``storage_error``;
    botocore's errors are not OSErrors). None where ``exc`` is to be re-raised as it is
    (it already names its file, or is not a read failure)."""
    if isinstance(exc, ArrowloadError):
        return None
    if isinstance(exc, FileNotFoundError):  # it names its file; one listed and gone since is a change
        return _changed_since_opened(scan.source)
    if isinstance(exc, _READ_ERRORS):
        return read_error(scan, exc)
    return storage_error(exc, scan.source.display, local=getattr(scan.source, "is_local", False))


def scan_batches(scan: Scan, options: Options, *, under_limit: bool = False) -> Iterator[pa.RecordBatch]:
    """Batches of ``scan`` in source order; with a limit, stop reading once it is met.
    ``under_limit``: a Limit above (past a residual filter or a map) may stop consuming
    early, so read unit by unit rather than let the scanner read ahead."""
    remaining = scan.limit
    if remaining == 0:
        return
    try:
        if (remaining is not None and scan.predicate is not None) or under_limit or scan.source.rewrites_rows:
            # (a source that renames or deletes rows reads each unit into memory: one at a time)
            # Selective filter under a limit: read unit by unit and stop early.
            batches = (b for u in (scan.units if scan.units is not None else range(len(scan.source.units())))
                       for b in scanner(scan, options, (u,), streaming=True).to_batches())
        else:
            batches = scanner(scan, options, streaming=remaining is not None).to_batches()
        for b in batches:
            b = keep_rows(b)
            if b.num_rows == 0:
                continue
            if remaining is not None:
                if b.num_rows >= remaining:
                    yield b.slice(0, remaining)
                    return
                remaining -= b.num_rows
            yield b
    except Exception as exc:  # noqa: BLE001 - translated, or re-raised as it is
        typed = scan_error(scan, exc)
        if typed is None:
            raise
        raise typed from exc


def _duck_items(node: Project, schema: pa.Schema) -> list[int]:
    """Positions of the projection's items DuckDB computes."""
    return [i for i, (_, e) in enumerate(node.items)
            if isinstance(e, SqlExpr) and e.column_name() is None and not e.projectable_on(schema)]


def _duck_values(node: Project, data, duck: list[int]) -> dict[int, pa.Array]:
    """The DuckDB items over ``data`` (a batch or a table), in one query."""
    if not duck:
        return {}
    from ..plan import duckeval  # DuckDB loads with the first expression it evaluates
    items = [(str(i), node.items[i][1].duck_sql, node.items[i][1].text) for i in duck]
    columns = frozenset().union(*(node.items[i][1].columns for i in duck))
    return dict(zip(duck, duckeval.evaluate_many(data, items, columns)))


def _project(node: Project, batch: pa.RecordBatch, schema: pa.Schema,
             computed: dict[int, pa.Array] | None = None) -> pa.RecordBatch:
    if computed is None:
        computed = _duck_values(node, batch, _duck_items(node, batch.schema))
    arrays = []
    for i, ((name, e), f) in enumerate(zip(node.items, schema)):
        ref = e.column_name()
        arr = batch.column(ref) if ref is not None else computed[i] if i in computed else e.evaluate(batch)
        arrays.append(arr if arr.type.equals(f.type) else arr.cast(f.type))
    if not arrays:
        return batch.select([])
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _project_group(node: Project, group: list[pa.RecordBatch], schema: pa.Schema,
                   duck: list[int]) -> Iterator[pa.RecordBatch]:
    """Project a run of batches, the DuckDB items in one call over all of them."""
    if not group:
        return
    values = _duck_values(node, pa.Table.from_batches(group, schema=group[0].schema), duck)
    offset = 0
    for b in group:
        yield _project(node, b, schema, {i: v.slice(offset, b.num_rows) for i, v in values.items()})
        offset += b.num_rows


# a run of batches evaluated in one DuckDB call holds at most this many rows / bytes
_DUCK_GROUP_ROWS = 1 << 20
_DUCK_GROUP_BYTES = 64 << 20


def _runs(batches: Iterator[pa.RecordBatch]) -> Iterator[list[pa.RecordBatch]]:
    """Consecutive batches grouped into runs of at most ``_DUCK_GROUP_ROWS`` rows /
    ``_DUCK_GROUP_BYTES`` bytes (a single larger batch is a run alone): DuckDB costs about a
    millisecond per call whatever the size, so a run is evaluated in one call."""
    group: list[pa.RecordBatch] = []
    rows = size = 0
    for b in batches:
        group.append(b)
        rows, size = rows + b.num_rows, size + b.nbytes
        if rows >= _DUCK_GROUP_ROWS or size >= _DUCK_GROUP_BYTES:
            yield group
            group, rows, size = [], 0, 0
    if group:
        yield group


def _filter_group(pred: SqlExpr, group: list[pa.RecordBatch], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    if not group:
        return
    table = pred.filter_batch(pa.Table.from_batches(group, schema=schema)) if len(group) > 1 \
        else pred.filter_batch(group[0])
    for b in (table.to_batches() if isinstance(table, pa.Table) else [table]):
        if b.num_rows:
            yield b


def iter_batches(plan: Plan, options: Options, *, ordered: bool = False,
                 _under_limit: bool = False) -> Iterator[pa.RecordBatch]:
    """Stream the plan's output batches, in order. ``ordered``: the same rows in the same
    order in every run and process, where a SQL query's result has no order of its own
    (``duck.ordered``): what a loader's table and a written cache need; without it a query
    streams in DuckDB's order, as DuckDB gives it."""
    if isinstance(plan, Scan):
        yield from scan_batches(plan, options, under_limit=_under_limit)
    elif isinstance(plan, Filter):
        pred = plan.predicate
        if _under_limit or not (isinstance(pred, SqlExpr) and pred.runs_in(plan.child.schema) == "duckdb"):
            for b in iter_batches(plan.child, options, _under_limit=_under_limit, ordered=ordered):
                out = pred.filter_batch(b)
                if out.num_rows:
                    yield out
            return
        for group in _runs(iter_batches(plan.child, options, ordered=ordered)):
            yield from _filter_group(pred, group, plan.child.schema)
    elif isinstance(plan, Project):
        schema = plan.schema
        duck = _duck_items(plan, plan.child.schema)
        if _under_limit or not duck:
            for b in iter_batches(plan.child, options, _under_limit=_under_limit, ordered=ordered):
                yield _project(plan, b, schema)
            return
        for group in _runs(iter_batches(plan.child, options, ordered=ordered)):
            yield from _project_group(plan, group, schema, duck)
    elif isinstance(plan, Map):
        for b in iter_batches(plan.child, options, _under_limit=_under_limit, ordered=ordered):
            yield apply_map(plan, b)
    elif isinstance(plan, SqlQuery):
        yield from sql_stream(plan, options, PLAN_READER, ordered_query(plan) if ordered else None)
    elif isinstance(plan, Limit):
        remaining = plan.n
        if remaining == 0:
            return
        for b in iter_batches(plan.child, options, _under_limit=True, ordered=ordered):
            if b.num_rows >= remaining:
                yield b.slice(0, remaining)
                return
            remaining -= b.num_rows
            yield b
    else:  # pragma: no cover - every node type is handled above
        raise TypeError(f"cannot execute {type(plan).__name__}")


# How DuckDB reads the tables a SqlQuery binds (duck.py runs those nodes and, through
# this, the plans under them).
PLAN_READER = PlanReader(iter_batches, read_error)


def to_table(plan: Plan, options: Options) -> pa.Table:
    """The whole result. A bare scan runs as one multi-threaded pyarrow scan."""
    if isinstance(plan, Scan) and plan.limit is None:
        try:
            # a whole scan is idempotent: transient object-store errors are retried with backoff
            return retry(lambda: keep_rows(scanner(plan, options).to_table()), retries=options.scan.retries,
                         backoff_s=options.scan.retry_backoff_s)
        except Exception as exc:  # noqa: BLE001 - translated, or re-raised as it is
            typed = scan_error(plan, exc)
            if typed is None:
                raise
            raise typed from exc
    # a transient storage error the stream could not retry in place (it reads ahead and
    # yields as it goes): the whole read, deterministic, again; never a DuckDB query, which
    # can hang scanning a Python filesystem's dataset again after a failed scan
    again = 0 if any(isinstance(n, SqlQuery) for n in walk(plan)) else options.scan.retries
    while True:
        try:
            return pa.Table.from_batches(list(iter_batches(plan, options)), schema=plan.schema)
        except StorageRetryError:
            if again <= 0:
                raise
            again -= 1


def _renamed(src, file_of: dict, fragment) -> Collection[str]:
    """Source columns that ``fragment``'s file does not store under their own name (its
    statistics under that name, if any, are another column's)."""
    i = file_of.get(fragment.path)
    return src.column_renames if i is None else src.file_columns(i)


def _decided_by_statistics(scan: Scan, dataset: ds.FileSystemDataset, expr) -> tuple[int, list[int]] | None:
    """``(rows, units)``: the rows of row groups whose statistics prove ``expr`` true for
    every row (counted from the footer, no data read), and the units left to count by
    reading. Only where that is sound: every predicate column has checked statistics in
    every file (``prune_row_groups.sound_columns``: decodable, min <= max, an order pyarrow
    shares with DuckDB) and none is a float (writers leave NaN out of min / max, so "every
    value <= 10" could count NaN rows that DuckDB's order rejects). None where not sound."""
    src = scan.source
    schema = src.schema
    columns = scan.predicate.columns
    if src.kind != "parquet" or any(pat.is_floating(schema.field(c).type) for c in columns):
        return None
    fragments = list(dataset.get_fragments())
    file_of = {e.path: i for i, e in enumerate(src.entries)} if hasattr(src, "entries") else {}
    if not all(columns <= sound_columns(frag, schema, columns, renamed=_renamed(src, file_of, frag))
               for frag in fragments):
        return None
    # a row group no row of which can make the predicate false or null is all-true
    maybe_not = pc.invert(expr) | expr.is_null()
    all_true: set[tuple[str, int]] = set()
    for frag in fragments:
        ids = [g.id for g in frag.row_groups]
        open_ids = matching_row_groups(frag, maybe_not, schema)
        if open_ids is None:
            return None  # statistics pyarrow cannot compare: the rows are counted by reading
        all_true.update((frag.path, i) for i in ids if i not in open_ids)
    rows, rest = 0, []
    for u in scan.selected_units():
        if (u.path, u.row_group) in all_true:
            rows += u.num_rows
        else:
            rest.append(u.index)
    return rows, rest


def _count_scan(scan: Scan, options: Options) -> int:
    """Rows of ``scan`` (before its limit) after its predicate: row groups that checked
    statistics decide are counted from footers (``_decided_by_statistics``), the rest by
    reading only the predicate's columns. Unchecked statistics never decide a count:
    pyarrow's ``count_rows(filter=)`` counts whole row groups its statistics call all-true,
    which is wrong where those statistics leave out NaN or are corrupt."""
    src = scan.source
    frag_opts = _fragment_options(src, options)
    retrying = dict(retries=options.scan.retries, backoff_s=options.scan.retry_backoff_s)  # reads are idempotent
    if scan.predicate is None:
        return retry(lambda: src.dataset(scan.units, columns=()).count_rows(**frag_opts), **retrying)
    expr = scan.predicate.to_arrow(src.schema, predicate=True)
    decided = _decided_by_statistics(scan, src.statistics_dataset(scan.units), expr)
    counted = 0
    units = scan.units
    if decided is not None:
        counted, units = decided
        if not units:
            return counted
    dataset = src.dataset(units, columns=tuple(scan.predicate.columns))
    kwargs = dict(columns={KEEP: expr}, use_threads=options.scan.use_threads,
                  batch_size=_batch_rows(scan, options), **frag_opts)
    # one bool column: small even whole; to_table decodes on pyarrow's threads without
    # handing each batch to Python in order
    keep = retry(lambda: ds.Scanner.from_dataset(dataset, **kwargs).to_table(), **retrying).column(0)
    return counted + int(pc.sum(keep).as_py() or 0)


def count_rows(plan: Plan, options: Options) -> int:
    """Rows the plan returns, reading as little as the plan allows.

    Projections keep counts; a scan without predicate counts from footers (Parquet,
    IPC, memory); with a pushed predicate only the predicate's columns of the units
    left after (sound) pruning are read.
    """
    node = plan
    while isinstance(node, Project):
        node = node.child
    if isinstance(node, Limit):
        return min(node.n, count_rows(node.child, options))
    if isinstance(node, SqlQuery):
        return sql_count(node, options, PLAN_READER)
    if isinstance(node, Scan) and options.optimizer.metadata_count:
        units = node.selected_units()
        if node.predicate is None and all(u.num_rows is not None for u in units):
            total = sum(u.num_rows for u in units)
        else:
            try:
                total = _count_scan(node, options)
            except Exception as exc:  # noqa: BLE001 - translated, or re-raised as it is
                typed = scan_error(node, exc)
                if typed is None:
                    raise
                raise typed from exc
        return total if node.limit is None else min(total, node.limit)
    return sum(b.num_rows for b in iter_batches(node, options))

