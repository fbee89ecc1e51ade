"""arrowload: train models straight off a columnar data lake.

>>> import arrowload as al
>>> ds = al.dataset("lake/events/")                       # doctest: +SKIP
>>> ds.filter("country = 'US'").select("f0", "label").head(5)  # doctest: +SKIP
"""

from . import sql as _sql_package  # noqa: F401 - load before `sql` below shadows the name
from .api import Dataset, dataset, delta, iceberg, sql
from .errors import (
    AmbiguousColumnError,
    ArgumentTypeError,
    CacheLockTimeoutError,
    CacheWriteError,
    ArrowloadError,
    ColumnNotFoundError,
    ConversionError,
    CorruptFileError,
    DeviceUnavailableError,
    ExpressionError,
    ExternalAccessError,
    InternalError,
    InvalidArgumentError,
    LakeTableError,
    LoaderClosedError,
    MemoryBudgetError,
    MissingDependencyError,
    PathEncodingError,
    PathNotFoundError,
    QueryError,
    ScanError,
    SchemaMismatchError,
    SnapshotChangedError,
    StateMismatchError,
    StorageAccessError,
    StorageEndpointError,
    StorageRetryError,
    TableNotFoundError,
    UncacheablePlanError,
    UnsupportedError,
    UnsupportedTableFeatureError,
)
from .mixture import Mixture, mix
from .options import OptimizerOptions, Options, ScanOptions
from .pipeline.options import LoaderOptions
from .plancache import CacheEntry, cache_entries, clear_cache
from .progress import progress_enabled, set_progress
from .scan.splits import Split

# The loader's modules (the library's main path) load with the package, as polars' or torch's
# do: a first `loader()` would otherwise import them (about 12 ms) inside the epoch it starts.
# Third-party heavyweights (polars, sqlglot's dialect, torch, jax) stay lazy.
from .pipeline import loader as _loader  # noqa: E402,F401
from .pipeline import streamreads as _streamreads  # noqa: E402,F401

__version__ = "0.1.0.dev0"

__all__ = sorted([
    "AmbiguousColumnError",
    "ArgumentTypeError",
    "ArrowloadError",
    "CacheEntry",
    "CacheLockTimeoutError",
    "CacheWriteError",
    "ColumnNotFoundError",
    "ConversionError",
    "CorruptFileError",
    "Dataset",
    "DeviceUnavailableError",
    "ExpressionError",
    "ExternalAccessError",
    "InternalError",
    "InvalidArgumentError",
    "LakeTableError",
    "LoaderClosedError",
    "LoaderOptions",
    "Mixture",
    "MemoryBudgetError",
    "MissingDependencyError",
    "OptimizerOptions",
    "Options",
    "PathEncodingError",
    "PathNotFoundError",
    "QueryError",
    "ScanError",
    "ScanOptions",
    "SchemaMismatchError",
    "SnapshotChangedError",
    "Split",
    "StateMismatchError",
    "StorageAccessError",
    "StorageEndpointError",
    "StorageRetryError",
    "TableNotFoundError",
    "UncacheablePlanError",
    "UnsupportedError",
    "UnsupportedTableFeatureError",
    "cache_entries",
    "clear_cache",
    "dataset",
    "delta",
    "iceberg",
    "mix",
    "progress_enabled",
    "set_progress",
    "sql",
])
