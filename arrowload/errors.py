"""One root for every error arrowload raises.

Each exception also subclasses the builtin a caller would naturally catch
(``FileNotFoundError``, ``KeyError``, ``ValueError`` ...), and its message names
the file, column or position at fault and what would fix it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ArrowloadError(Exception):
    """Root of every exception raised by arrowload."""


class _PathMessage:
    """For errors that name a path: ``path`` is kept, and ``str()`` is the message as
    written (``OSError`` and its kin would format a single argument their own way)."""

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path

    def __str__(self) -> str:
        return str(self.args[0])


class PathNotFoundError(_PathMessage, ArrowloadError, FileNotFoundError):
    """A path, URI or glob given as a source matched nothing."""


class ColumnNotFoundError(ArrowloadError, KeyError):
    """A column named by the user does not exist; the message lists the closest names."""

    def __init__(self, column: str, available: Iterable[str], where: str = "", hint: str = "") -> None:
        self.column = column
        self.available = tuple(available)
        close = difflib.get_close_matches(column, self.available, n=3, cutoff=0.5)
        if not close:  # case-insensitive: LABL suggests label
            lowered = {name.lower(): name for name in self.available}
            close = [lowered[c] for c in difflib.get_close_matches(column.lower(), list(lowered), n=3, cutoff=0.5)]
        if not close:
            lowered = {name.lower(): name for name in self.available}
            close = [lowered[column.lower()]] if column.lower() in lowered else []
        suggest = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        listing = ", ".join(self.available[:20]) + (" ..." if len(self.available) > 20 else "")
        place = f" in {where}" if where else ""
        extra = f" ({hint})" if hint else ""
        super().__init__(f"column {column!r} not found{place}{suggest}{extra} (columns: {listing})")

    def __str__(self) -> str:  # KeyError's str() would repr() the message
        return str(self.args[0])


class TableNotFoundError(ArrowloadError, KeyError):
    """A SQL query names a table that was not bound; the message lists the bound names."""

    def __init__(self, table: str, bound) -> None:
        self.table = table
        self.bound = tuple(bound)
        names = ", ".join(self.bound) or "none"
        if table.isidentifier():
            fix = f"Bind it by keyword: al.sql(query, {table}=al.dataset(...))"
        else:  # a path written in FROM
            fix = (f"Bind the file as a table and name it in FROM: al.sql(\"... FROM t\", "
                   f"t=al.dataset({table!r}))")
        super().__init__(f"table {table!r} is not bound; bound tables: {names}. {fix}")

    def __str__(self) -> str:
        return str(self.args[0])


class ExpressionError(ArrowloadError, ValueError):
    """A filter, projection or SQL text that cannot be parsed or typed.

    ``line`` and ``column`` (1-based) point at the offending token when known.
    """

    def __init__(self, message: str, *, text: str | None = None,
                 line: int | None = None, column: int | None = None) -> None:
        self.text, self.line, self.col = text, line, column
        if text is not None and line is not None and column is not None:
            src = text.splitlines()[line - 1] if text.splitlines() else text
            message = f"{message}, at line {line}, column {column}:\n  {src}\n  {' ' * max(column - 1, 0)}^"
        super().__init__(message)


class SchemaMismatchError(ArrowloadError, TypeError):
    """Shards disagree on a column's type in a way that cannot be unified safely."""


class CorruptFileError(_PathMessage, ArrowloadError, OSError):
    """A shard is truncated or not a valid file of its format."""


class UnsupportedError(ArrowloadError, NotImplementedError):
    """The request is valid but this combination is not supported (yet); the message says what is."""


class ConversionError(ArrowloadError, ValueError):
    """A batch cannot be handed to numpy / torch / jax as asked (a null, a ragged list, a bad option).

    ``column`` names the column at fault when there is one; the message says what would fix it.
    """

    def __init__(self, message: str, column: str | None = None) -> None:
        super().__init__(message)
        self.column = column


class MissingDependencyError(ArrowloadError, ImportError):
    """An optional dependency (torch, jax, ...) is needed for the request; the message says what to install."""


class DeviceUnavailableError(ArrowloadError, RuntimeError):
    """The requested device (e.g. ``"cuda"``) is not available in this process."""


class SnapshotChangedError(_PathMessage, ArrowloadError, RuntimeError):
    """The data changed under a snapshot the loader, a pinned dataset or a cache was built
    on. ``path`` names the (first) file that changed or vanished, where one is known."""


class StateMismatchError(ArrowloadError, ValueError):
    """A loader state was taken on a different dataset, plan or loader configuration."""


class StorageAccessError(_PathMessage, ArrowloadError, PermissionError):
    """An object store refused the request: no credentials found, credentials it rejects,
    or access denied by a policy. Never retried; the message names the URL and what to set."""


class StorageEndpointError(_PathMessage, ArrowloadError, ConnectionError):
    """An object store's endpoint cannot be reached at all (connection refused, unknown host):
    a configuration error, not retried by arrowload (an s3fs built from ``storage_options``
    lets botocore try once more, quickly). The message names the endpoint and how to set it
    (``storage_options={"endpoint_url": ...}``, ``AWS_ENDPOINT_URL``)."""


class PathEncodingError(_PathMessage, ArrowloadError, UnicodeError):
    """A path or file name is not valid UTF-8 (pyarrow reads UTF-8 paths only); rename the file."""


class ExternalAccessError(ArrowloadError, PermissionError):
    """SQL run with ``external_access=False`` tried to reach outside the bound tables (a file,
    the network, an extension, a setting or the environment); DuckDB's sandbox refused it."""

    def __str__(self) -> str:
        return str(self.args[0])


class InvalidArgumentError(ArrowloadError, ValueError):
    """An argument has the right type but a value outside what is accepted (``batch_size=0``,
    ``rank=2`` with ``world_size=2``, an unknown ``shuffle`` kind). ``argument`` names it; the
    message says which values are accepted."""

    def __init__(self, message: str, argument: str | None = None) -> None:
        super().__init__(message)
        self.argument = argument


class ArgumentTypeError(ArrowloadError, TypeError):
    """An argument has a type that is not accepted (``batch_size=2.5``, ``batch_size=True``).
    ``argument`` names it; the message says which types are accepted."""

    def __init__(self, message: str, argument: str | None = None) -> None:
        super().__init__(message)
        self.argument = argument


class LakeTableError(ArrowloadError, ValueError):
    """A Delta Lake or Iceberg table folder was given where plain files are read.

    ``path`` is what was given, ``table_format`` ``"delta"`` or ``"iceberg"``,
    ``table_root`` the table's folder (``path`` or one of its ancestors).
    """

    def __init__(self, message: str, *, path: str | None = None, table_format: str | None = None,
                 table_root: str | None = None) -> None:
        super().__init__(message)
        self.path, self.table_format, self.table_root = path, table_format, table_root


class UnsupportedTableFeatureError(ArrowloadError, NotImplementedError):
    """A lake table uses a reader feature arrowload cannot honour (reading its files
    without it would return wrong rows). ``feature`` names it (a Delta protocol feature
    name such as ``"variantType"``, or ``"minReaderVersion 4"``; for Iceberg
    ``"equality deletes"``, ``"deletion vectors"``, ``"nested schema evolution"``)."""

    def __init__(self, message: str, *, feature: str | None = None) -> None:
        super().__init__(message)
        self.feature = feature


class AmbiguousColumnError(ArrowloadError, KeyError):
    """A column name that several columns of a file share was selected, filtered or read.

    ``column`` is the name; the message names the source and what would fix it.
    """

    def __init__(self, message: str, column: str | None = None) -> None:
        super().__init__(message)
        self.column = column

    def __str__(self) -> str:  # KeyError's str() would repr() the message
        return str(self.args[0])


class LoaderClosedError(ArrowloadError, ValueError):
    """A loader was used after ``close()`` (or after its ``with`` block); build a new one
    with ``Dataset.loader()``. A ``ValueError``, as for I/O on a closed Python file."""


class MemoryBudgetError(ArrowloadError, MemoryError):
    """The selection does not fit the ``memory_budget`` given and nothing may spill to disk;
    the message names the budget and how to let it spill (``cache_dir=``) or raise it."""


class StorageRetryError(_PathMessage, ArrowloadError, ConnectionError):
    """Reading a file kept failing with transient storage errors (timeouts, throttling, 5xx,
    dropped connections) after the configured retries; the message names the file, the last
    error and how to retry more (``al.ScanOptions(retries=..., retry_backoff_s=...)``)."""


class ScanError(ArrowloadError, OSError):
    """Reading a source failed, but reading each of its files again on its own did not fail:
    no file can be blamed (an intermittent storage or reader failure). Retrying may succeed."""

    def __str__(self) -> str:
        return str(self.args[0])


class QueryError(ArrowloadError, RuntimeError):
    """DuckDB failed running a SQL query for a reason other than the query's text or the
    bound tables' files (out of memory, an interrupt, an I/O error of DuckDB's own)."""


class InternalError(ArrowloadError, RuntimeError):
    """An invariant arrowload relies on did not hold: a bug in arrowload, not in the
    caller's data or arguments. Please report it with the traceback."""


class UncacheablePlanError(ArrowloadError, ValueError):
    """``Dataset.cache()`` was asked to cache a plan whose identity arrowload cannot compute
    (a ``map()`` without a ``name``: a function's code cannot be fingerprinted); the message
    says how to name it (``map(fn, name="fn-v1")`` or ``cache(key="v1")``)."""


class CacheWriteError(_PathMessage, ArrowloadError, OSError):
    """Writing a plan cache entry failed because the storage cannot take it (a full disk,
    a quota, a file size limit); the partial entry is removed, and the message names the
    folder, the storage's error and where else to write (``cache(uri=...)``)."""


class CacheLockTimeoutError(_PathMessage, ArrowloadError, TimeoutError):
    """Waiting for another writer of a plan cache entry took longer than allowed; the
    message names the lock, its holder and how to go on (wait longer, or remove the lock
    of a writer that is gone)."""
