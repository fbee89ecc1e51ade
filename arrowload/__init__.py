"""arrowload: train models straight off a columnar data lake.

>>> import arrowload as al
>>> ds = al.dataset("lake/events/")                       # doctest: +SKIP
>>> ds.filter("country = 'US'").select("f0", "label").head(5)  # doctest: +SKIP
"""

from . import sql as _sql_package  # noqa: F401 - load before `sql` below shadows the name
from .api import Dataset, dataset, sql
from .errors import (
    AmbiguousColumnError,
    ArrowloadError,
    ColumnNotFoundError,
    CorruptFileError,
    ExpressionError,
    LakeTableError,
    PathNotFoundError,
    SchemaMismatchError,
    StateMismatchError,
    TableNotFoundError,
    UnsupportedError,
)
from .options import OptimizerOptions, Options, ScanOptions
from .progress import progress_enabled, set_progress
from .scan.splits import Split

__version__ = "0.1.0.dev0"

__all__ = sorted([
    "AmbiguousColumnError",
    "ArrowloadError",
    "ColumnNotFoundError",
    "CorruptFileError",
    "Dataset",
    "ExpressionError",
    "LakeTableError",
    "OptimizerOptions",
    "Options",
    "PathNotFoundError",
    "ScanOptions",
    "SchemaMismatchError",
    "StateMismatchError",
    "TableNotFoundError",
    "Split",
    "UnsupportedError",
    "dataset",
    "progress_enabled",
    "set_progress",
    "sql",
])
