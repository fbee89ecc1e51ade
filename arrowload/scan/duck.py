"""Run SQL in DuckDB over arrowload scans: the ``SqlQuery`` nodes of a plan.

DuckDB reads each bound table through arrowload (its plan's batches, or the pyarrow
dataset of a plain scan), so running a query runs plans: the executor's functions come in
as a :class:`PlanReader` (``scan.execute.PLAN_READER``) rather than by importing the
executor, which imports this module to run ``SqlQuery`` nodes.

Every run opens its own in-memory DuckDB connection and closes it when the result is
exhausted, when the consumer stops early, or on error: no connection or DuckDB thread
outlives the query. DuckDB errors are translated into arrowload errors (never leaked raw).

A query built with ``external_access=False`` runs on a sandboxed connection
(``plan.sandbox.DUCKDB_SANDBOX``): DuckDB's ``enable_external_access`` off (no file or
network access, no extension install or load, no ``getenv``), no extension autoloading,
no lookup of Python variables by name, and the configuration locked so the query cannot ``SET`` any of it back. The bound tables
are registered by arrowload before the lock and stay readable.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import NamedTuple

import pyarrow as pa

from ..errors import (ArrowloadError, ColumnNotFoundError, ExpressionError, ExternalAccessError, PathNotFoundError,
                      QueryError, ScanError, TableNotFoundError, UnsupportedError)
from ..options import Options
from ..plan.ducktypes import duck_schema
from ..plan.nodes import Plan, Scan, SqlQuery, scans
from ..plan.rowselect import empty_table

_BATCH_ROWS = 65_536


class PlanReader(NamedTuple):
    """How a query reads its bound tables: ``batches(plan, options)`` streams a plan's
    record batches, ``read_error(scan, exc)`` names the file at fault when a read of
    ``scan`` failed (``scan.execute.iter_batches`` / ``read_error``)."""

    batches: Callable[[Plan, Options], Iterator[pa.RecordBatch]]
    read_error: Callable[[Scan, BaseException], Exception]


class Query(NamedTuple):
    """A query with its bound tables, before it is a ``SqlQuery`` node (its result schema
    is what binding it finds out)."""

    query: str
    names: tuple[str, ...]
    tables: tuple[Plan, ...]
    external_access: bool = True



def _duckdb():
    import duckdb
    return duckdb


def arrow_source(plan: Plan, options: Options, reader: PlanReader):
    """What DuckDB scans for a bound table: the pyarrow dataset of the kept units (with the
    pushed predicate, restricted to the plan's columns) when the plan is a plain scan —
    DuckDB then pushes its own projection and filters into it — else a stream of the
    plan's batches."""
    # a pushed predicate streams: as a pyarrow dataset filter it would prune row groups by
    # statistics unsound for it (NaN left out of min/max, corrupt footers); so do columns
    # DuckDB is given cast (float16) or whose filters pyarrow cannot run (extension types:
    # DuckDB pushes its own filters into a dataset as pyarrow expressions)
    if isinstance(plan, Scan) and plan.projection is None and plan.limit is None and plan.predicate is None \
            and not plan.source.rewrites_rows and duck_schema(plan.schema) is None \
            and not any(isinstance(f.type, pa.BaseExtensionType) for f in plan.schema) \
            and plan.source.dataset_reads_as(options.scan):  # (else: streamed, as the options say)
        src = plan.source
        dataset = src.dataset(plan.units)
        if plan.columns is not None:
            dataset = dataset.replace_schema(plan.schema)
        return dataset
    return _PlanStream(plan, options, reader)


class _PlanStream:
    """The plan's batches as an Arrow C stream, opened afresh each time DuckDB scans it
    (a query may scan a bound table twice: self-joins, subqueries); a RecordBatchReader
    could be read only once."""

    def __init__(self, plan: Plan, options: Options, reader: PlanReader) -> None:
        self.plan, self.options, self.reader = plan, options, reader
        self.cast = duck_schema(plan.schema)  # what DuckDB is given, where a column is cast
        self.schema = self.cast or plan.schema

    def __arrow_c_schema__(self):
        return self.schema.__arrow_c_schema__()

    def __arrow_c_stream__(self, requested_schema=None):
        batches = self.reader.batches(self.plan, self.options)
        if self.cast is not None:
            batches = (b.cast(self.cast) for b in batches)
        return pa.RecordBatchReader.from_batches(self.schema, batches).__arrow_c_stream__(requested_schema)


def _bound_empty(schema: pa.Schema) -> pa.Table:
    """An empty table of ``schema`` as DuckDB is given it (binding needs types only)."""
    return empty_table(duck_schema(schema) or schema)


def connect(external_access: bool = True):
    """A fresh in-memory DuckDB connection; sandboxed unless ``external_access`` (DuckDB's
    settings of ``plan.sandbox.DUCKDB_SANDBOX``, the same as for filters)."""
    if external_access:
        return _duckdb().connect(":memory:", config={})
    from ..plan.sandbox import DUCKDB_SANDBOX
    return _duckdb().connect(":memory:", config=dict(DUCKDB_SANDBOX))


def _connect(node: SqlQuery | Query, options: Options, reader: PlanReader):
    return _registered(node, reader, lambda child: arrow_source(child, options, reader))


def _registered(node: SqlQuery | Query, reader: PlanReader, table: Callable[[Plan], object]):
    """A connection of ``node``'s access with each bound table registered as ``table(plan)``;
    closed again, the error translated, when one cannot be."""
    con = connect(node.external_access)
    try:
        for name, child in zip(node.names, node.tables):
            con.register(name, table(child))
    except _errors() as exc:
        con.close()
        raise translate(exc, node, reader) from None
    except BaseException:
        con.close()
        raise
    return con


_SANDBOX_REFUSALS = re.compile(
    r"disabled by configuration|configuration has been locked|external access|"
    r"Function with name (?:getenv|read_\w+|glob|sniff_csv|parquet_\w+|delta_scan|iceberg_\w+)\b",
    re.IGNORECASE)


# DuckDB's words when scanning a registered Arrow dataset or stream failed
_TABLE_READ = re.compile(r"reading the stream registered as '([^']+)' failed", re.IGNORECASE)


def _table_read_error(msg: str, node: SqlQuery | Query, reader: PlanReader) -> Exception | None:
    """A failure while DuckDB read a bound table is the table's, not the query's: re-read
    the table's scans to name the file at fault and why (a corrupt page, a checksum that
    does not match, storage refusing access) with the error the same read outside SQL
    raises; where the re-read finds nothing wrong with the files (a transient storage
    error), a ``ScanError`` saying so. None when the failure was not a table's read (a
    value DuckDB could not compute: the caller's)."""
    m = _TABLE_READ.search(msg)
    if m is None or m.group(1) not in node.names:
        return None
    unfound = None
    for scan in scans(node.tables[node.names.index(m.group(1))]):
        typed = reader.read_error(scan, RuntimeError(msg))
        if not isinstance(typed, ScanError):  # the re-read named the file and the cause
            return typed
        unfound = unfound or typed
    if unfound is None or not _READ_FAILURE.search(msg):
        return None  # the stream failed evaluating the table's own filters or expressions
    return ScanError(f"reading the bound table {m.group(1)!r} failed: {msg.strip()}; reading its files again "
                     "did not fail, so no file is at fault (a transient storage error): run the query again")


# the read failures (not a value's) a bound table's stream passes on: I/O, storage, Arrow's IO errors
_READ_FAILURE = re.compile(r"failed: (?:IOError|OSError|ConnectionError|TimeoutError|\[Errno)", re.IGNORECASE)

# DuckDB's error kinds a failing value raises (a cast, an overflow ...), as its messages open
_RUNTIME_FAILURES = re.compile(r"(Conversion|Invalid Input|Out of Range|Type Mismatch|Not implemented) Error:",
                               re.IGNORECASE)


def translate(exc: Exception, node: SqlQuery | Query, reader: PlanReader) -> Exception:
    """A DuckDB exception as the arrowload error a user can act on."""
    duckdb = _duckdb()
    msg = str(exc)
    table_error = _table_read_error(msg, node, reader)
    if table_error is not None:
        return table_error
    if not node.external_access and (isinstance(exc, duckdb.PermissionException)
                                     or _SANDBOX_REFUSALS.search(msg)):
        said = " ".join(msg.split())
        return ExternalAccessError(
            f"the query was refused by the sandbox of external_access=False ({said}): it may read "
            f"only the bound tables ({', '.join(node.names)}), not files, the network, extensions, "
            "settings or the environment. Bind the data as a table (al.sql(query, name=...)); "
            "external_access=True allows the rest, for SQL you trust")
    unreadable = _UNREADABLE.search(msg) and _unreadable_columns(node)
    if unreadable:
        return UnsupportedError(
            f"DuckDB cannot read the column(s) {', '.join(unreadable)} of the bound table(s) ({msg.strip()}); "
            "select the other columns before binding the table, or cast the column in a map() first")
    if isinstance(exc, duckdb.BinderException):
        m = re.search(r'column "?([^"\s]+)"? not found', msg, re.IGNORECASE) or \
            re.search(r'Referenced column "([^"]+)"', msg) or \
            re.search(r'does not have a column named "([^"]+)"', msg)
        if m:
            available = sorted({n for t in node.tables for n in t.schema.names})
            err = ColumnNotFoundError(m.group(1), available, "SQL query")
            err.__cause__ = None
            return err
        return ExpressionError(f"cannot bind SQL query: {msg}")
    if isinstance(exc, duckdb.CatalogException):
        m = re.search(r'Table with name (\S+) does not exist', msg)
        if m:
            return TableNotFoundError(m.group(1), node.names)
        return ExpressionError(f"SQL catalog error: {msg}")
    if isinstance(exc, (duckdb.ParserException, duckdb.SyntaxException)):
        return ExpressionError(f"cannot parse SQL query: {msg}")
    if isinstance(exc, (duckdb.ConversionException, duckdb.InvalidInputException,
                        duckdb.OutOfRangeException, duckdb.TypeMismatchException,
                        duckdb.NotImplementedException)):
        return ExpressionError(f"SQL query failed: {msg}")
    if not isinstance(exc, duckdb.Error):  # raised while the result streamed: its kind is in its text
        if _RUNTIME_FAILURES.match(msg):
            return ExpressionError(f"SQL query failed: {msg}")
        return QueryError(f"DuckDB failed running the query: {msg}")
    if isinstance(exc, duckdb.IOException):
        m = re.search(r'No files found that match the pattern "([^"]*)"', msg)
        if m:
            return PathNotFoundError(
                f"the query reads {m.group(1)!r}, which matches no file; fix the path, or bind the "
                f"data as a table: al.sql('SELECT ... FROM t', t=al.dataset(PATH))", m.group(1))
    return QueryError(f"DuckDB failed running the query: {msg}")


_UNREADABLE = re.compile(r"Unsupported (?:Internal )?Arrow Type", re.IGNORECASE)


def _unreadable_columns(node: SqlQuery | Query) -> list[str]:
    """``table.column (type)`` for each column of the bound tables DuckDB cannot be given."""
    found = []
    con = connect(external_access=False)
    try:
        for name, child in zip(node.names, node.tables):
            for f in child.schema:
                try:
                    con.register("_probe", _bound_empty(pa.schema([f])))
                    con.unregister("_probe")
                except _errors():
                    found.append(f"{name}.{f.name} ({f.type})")
    finally:
        con.close()
    return found


def _errors():
    return _duckdb().Error


def ordered(node: SqlQuery) -> str:
    """``node``'s query with one order of its rows, whatever DuckDB's threads do: its own
    ``ORDER BY`` keys, then every output column by position. DuckDB returns aggregates,
    joins, DISTINCT and set operations in an order that changes from run to run (and keeps
    an arbitrary subset under a ``LIMIT`` without ``ORDER BY``); a loader's positions, the
    ranks' shards and a resume in another process need the same rows in the same places.
    Rows equal in every column are interchangeable. (``al.sql`` took the query as one
    sqlglot ``Query``.)"""
    from sqlglot import exp, parse_one

    from ..plan.sqlexpr import DIALECT
    tree = parse_one(node.query, read=DIALECT)
    order = tree.args.get("order")
    if order is not None and any(isinstance(o.this, exp.Var) and o.this.name.upper() == "ALL"
                                 for o in order.expressions):
        return node.query  # ORDER BY ALL: every column already, left to right
    keys = [exp.Literal.number(i) for i in range(1, len(node.result_schema) + 1)]
    return tree.order_by(*keys, append=True, copy=False).sql(DIALECT)


def stream(node: SqlQuery, options: Options, reader: PlanReader,
           query: str | None = None) -> Iterator[pa.RecordBatch]:
    """Stream the query's result (``query``: the node's, rewritten, with the same output
    columns); the connection closes when the generator finishes or is closed early."""
    con = _connect(node, options, reader)
    try:
        try:
            result = con.sql(query or node.query).to_arrow_reader(_BATCH_ROWS)
        except _errors() as exc:
            raise translate(exc, node, reader) from None
        while True:
            try:
                batch = result.read_next_batch()
            except StopIteration:
                return
            except (_errors(), pa.ArrowException, OSError) as exc:  # (mid-stream, DuckDB's come as Arrow's)
                if isinstance(exc, ArrowloadError):
                    raise
                raise translate(exc, node, reader) from None
            if batch.num_rows:
                yield batch
    finally:
        con.close()


def _scalar_query(node: SqlQuery, query: str, options: Options, reader: PlanReader):
    con = _connect(node, options, reader)
    try:
        return con.sql(query).fetchall()
    except _errors() as exc:
        raise translate(exc, node, reader) from None
    finally:
        con.close()


def result_schema(node: Query, reader: PlanReader) -> pa.Schema:
    """The schema of ``node``'s result, as DuckDB binds it (no row is read); binding
    errors (unknown columns, types) raise here, at the call that wrote the query. Each
    table is bound as an empty table of its schema: binding needs types only, so no source
    is opened (no footer fetched, no cached dataset written) before the query runs."""
    con = _registered(node, reader, lambda child: _bound_empty(child.schema))
    try:
        schema = con.sql(f"SELECT * FROM ({node.query}) AS q LIMIT 0").to_arrow_table().schema
        # the subquery renamed repeated names (``user_id_1``); the stream keeps DuckDB's own
        names = con.sql(node.query).columns
        if len(names) == len(schema):
            schema = pa.schema([f.with_name(n) for f, n in zip(schema, names)], schema.metadata)
        return schema
    except _errors() as exc:
        raise translate(exc, node, reader) from None
    finally:
        con.close()


def reads_outside(node: SqlQuery) -> bool:
    """Whether ``node``'s query reads more than its bound tables: files through
    ``read_parquet(...)`` or a quoted path, the environment, the network -- what DuckDB's
    sandbox refuses where the query is bound without external access (over empty tables:
    nothing is read). No source arrowload knows keys such a query's answer."""
    if not node.external_access:
        return False
    con = connect(False)
    try:
        for name, child in zip(node.names, node.tables):
            con.register(name, _bound_empty(child.schema))
        con.sql(f"SELECT * FROM ({node.query}) AS q LIMIT 0").columns
        return False
    except _errors() as exc:
        return isinstance(exc, _duckdb().PermissionException) or bool(_SANDBOX_REFUSALS.search(str(exc)))
    finally:
        con.close()


def output_names(tree, schema: pa.Schema, query: str | None = None) -> list[str] | None:
    """The names DuckDB gives the select list of a one-table ``tree`` over ``schema``
    (``(price * 2)``, ``CAST("label" AS DOUBLE)`` ...), found by binding it over an empty
    table: ``query`` as written where given (DuckDB names an expression by its own spelling
    of what was written: ``len(s)``, not sqlglot's ``length(s)``), else the tree's SQL; None
    where DuckDB cannot bind it."""
    from sqlglot import exp

    from ..plan.sqlexpr import DIALECT
    table = tree.find(exp.Table)
    con = connect(external_access=False)  # binding needs nothing outside the empty table
    try:
        con.register(table.name, _bound_empty(schema))
        return list(con.sql(query if query is not None else tree.sql(DIALECT)).columns)
    except _errors():
        return None
    finally:
        con.close()


def count(node: SqlQuery, options: Options, reader: PlanReader) -> int:
    return int(_scalar_query(node, f"SELECT count(*) FROM ({node.query}) AS q", options, reader)[0][0])


def explain(node: SqlQuery, options: Options, reader: PlanReader) -> str:
    """DuckDB's physical plan: it shows the projections and filters pushed into each scan."""
    rows = _scalar_query(node, f"EXPLAIN {node.query}", options, reader)
    return "\n".join(r[1] for r in rows)
