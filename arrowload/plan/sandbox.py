"""Filters and projections are expressions over one row: no queries, no outside world.

A SQL filter or computed column may be evaluated by DuckDB (see ``duckeval``). DuckDB
can do far more than compute a value from a row: subqueries, table functions that read
files or URLs, functions that read the environment or the engine's settings. None of
that belongs in ``filter()`` / ``select()``: it would let whoever writes a filter read
files on the machine running the loader. This module refuses such expressions when they
are built, with an error pointing at ``al.sql`` for real queries. The connection that
evaluates them is sandboxed as well (``enable_external_access`` off, configuration
locked), so a construct missed here still cannot reach a file, a URL or a setting.
"""

from __future__ import annotations

from sqlglot import exp

from ..errors import ExpressionError, ExternalAccessError

# DuckDB settings of a sandboxed connection: no files, URLs, extensions, Python variables
# found by name, and no way to change that from SQL. Used for evaluating filters and
# computed columns (``duckeval``) and for ``al.sql(..., external_access=False)``.
DUCKDB_SANDBOX = {
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "python_enable_replacements": False,
    "lock_configuration": True,
}

# Query-shaped nodes: anything that reads a relation rather than the current row.
_QUERY_NODES = (exp.Query, exp.Subquery, exp.Exists, exp.Table, exp.From, exp.Join,
                exp.Lateral, exp.Unnest, exp.Values, exp.Command, exp.Pragma, exp.Set)

# Functions (lower-case names) that read files, URLs, the environment, the catalog or the
# engine's settings, or that are volatile (a row count taken once must hold when read).
_REFUSED_FUNCTIONS = frozenset({
    "getenv", "current_setting", "read_text", "read_blob", "read_csv", "read_csv_auto",
    "read_json", "read_json_auto", "read_json_objects", "read_ndjson", "read_ndjson_auto",
    "read_parquet", "parquet_scan", "parquet_metadata", "parquet_schema", "parquet_file_metadata",
    "parquet_kv_metadata", "sniff_csv", "glob", "query", "query_table", "iceberg_scan",
    "delta_scan", "read_xlsx", "st_read", "sqlite_scan", "postgres_scan", "mysql_scan",
    "current_database", "current_schema", "current_schemas", "current_catalog", "current_user",
    "session_user", "user", "version", "pragma_version", "which_secret", "duckdb_secrets",
    "random", "rand", "uuid", "gen_random_uuid", "uuidv4", "uuidv7", "setseed", "nextval",
    "currval", "now", "current_timestamp", "current_date", "current_time", "get_current_time",
    "get_current_timestamp", "transaction_timestamp", "today", "localtimestamp", "localtime",
})
# unnest() and friends in a select list: rows (or a struct's fields) of their own
_SET_RETURNING = (exp.Explode, exp.ExplodeOuter, exp.Posexplode, exp.PosexplodeOuter, exp.Unnest)
_SET_RETURNING_NAMES = frozenset({"unnest", "generate_subscripts"})
_REFUSED_PREFIXES = ("read_", "duckdb_", "pragma_", "pg_", "sqlite_", "postgres_", "mysql_", "http")


def gives_rows_or_columns(node: exp.Expression) -> bool:
    """``unnest()`` / ``generate_subscripts()`` (rows of their own, or a struct's fields as
    columns) and ``COLUMNS(...)`` (several columns): no value of one row, in a filter or a
    computed column; ``al.sql`` leaves a query holding one to DuckDB."""
    return isinstance(node, (*_SET_RETURNING, exp.Columns)) or _function_name(node) in _SET_RETURNING_NAMES


# What DuckDB's sandbox (enable_external_access off) still lets a query read: the engine's
# settings (paths of its temp and home directories ...) and its variables.
_SETTINGS_FUNCTIONS = frozenset({"current_setting", "duckdb_settings", "getvariable", "duckdb_variables"})


def refuse_settings(tree: exp.Expression) -> None:
    """Raise ``ExternalAccessError`` where an ``al.sql`` query run with
    ``external_access=False`` reads DuckDB's settings or variables."""
    for node in tree.walk():
        name = _function_name(node)
        if name in _SETTINGS_FUNCTIONS:
            raise ExternalAccessError(
                f"the query calls {name}(), which reads DuckDB's settings: refused under "
                "external_access=False, where a query may read only the bound tables")


def _function_name(node: exp.Expression) -> str | None:
    if isinstance(node, exp.Anonymous):
        return str(node.name).lower()
    if isinstance(node, exp.Func):
        return node.sql_name().lower()
    return None


def _why_refused(node: exp.Expression) -> str | None:
    if isinstance(node, _QUERY_NODES):
        return f"a subquery or table reference ({node.sql('duckdb')[:60]!r})"
    if isinstance(node, exp.In) and (node.args.get("query") is not None or node.args.get("unnest") is not None):
        return "IN (subquery)"
    if isinstance(node, exp.Placeholder) or isinstance(node, exp.Parameter):
        return "a query parameter"
    if isinstance(node, (exp.AggFunc, exp.Window)):
        return f"an aggregate or window function ({node.sql('duckdb')[:60]!r}), which is not a value of one row"
    if gives_rows_or_columns(node):
        return (f"{node.sql('duckdb')[:60]!r}, which gives rows or columns of its own rather than one "
                "value of the row")
    if isinstance(node, exp.Star) and not isinstance(node.parent, exp.Count):
        return f"a star expression ({node.sql('duckdb')[:60]!r}), which is several columns, not one value"
    if isinstance(node, (exp.CurrentTimestamp, exp.CurrentDate, exp.CurrentTime, exp.Rand)):
        return f"the volatile function {node.sql('duckdb')!r}"
    name = _function_name(node)
    if name is not None and (name in _REFUSED_FUNCTIONS or name.startswith(_REFUSED_PREFIXES)):
        return f"the function {name}() (it reads files, the environment or settings, or is volatile)"
    return None


def check_expression(tree: exp.Expression, text: str | None, what: str = "expression") -> None:
    """Raise ``ExpressionError`` when ``tree`` is more than an expression over the row."""
    for node in tree.walk():
        why = _why_refused(node)
        if why is not None:
            shown = text if text is not None else tree.sql("duckdb")
            raise ExpressionError(
                f"{what} {shown!r} uses {why}: filters and computed columns are expressions over "
                "the row's own columns, without subqueries, table functions, file, network or "
                "environment access. Run queries with al.sql('SELECT ... FROM t WHERE ...', t=ds)")
