"""Frozen option objects: one place to switch optimizations off and tune the scan."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

from .errors import ArgumentTypeError, InvalidArgumentError


def default_cache_dir() -> str:
    """``$ARROWLOAD_CACHE_DIR``, else ``$XDG_CACHE_HOME/arrowload``, else ``~/.cache/arrowload``:
    where the loader's caches and ``Dataset.cache()``'s entries go when no place is given."""
    env = os.environ.get("ARROWLOAD_CACHE_DIR")
    if env:
        return env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "arrowload")


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity), at least 1."""
    import os
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _check_fields(obj, lowest: dict[str, int | float] = {}) -> None:  # noqa: B006 - read only
    """Each field of an options object has its annotated type (``bool``, ``int`` not a
    bool, ``float`` or an int, optionally None) and is at least ``lowest[name]``."""
    cls = type(obj).__name__
    for f in dataclasses.fields(obj):
        value, kind = getattr(obj, f.name), str(f.type)
        if value is None and "None" in kind:
            continue
        if kind.startswith("bool"):
            ok = isinstance(value, bool)
        elif kind.startswith("int"):
            ok = hasattr(value, "__index__") and not isinstance(value, (bool, float))
            if ok and not isinstance(value, int):  # a numpy integer
                value = value.__index__()
                object.__setattr__(obj, f.name, value)
        elif kind.startswith("float"):
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        else:
            continue
        if not ok:
            raise ArgumentTypeError(f"{cls}({f.name}={value!r}): {f.name} must be {kind}, got "
                                    f"{type(value).__name__}; the default is {f.default!r}", f.name)
        if f.name in lowest and value < lowest[f.name]:
            raise InvalidArgumentError(f"{cls}({f.name}={value!r}): {f.name} must be >= {lowest[f.name]}; "
                                       f"the default is {f.default!r}", f.name)


@dataclass(frozen=True)
class OptimizerOptions:
    """Which optimizer rules run. Every rule can be switched off; results never change, only cost.

    >>> OptimizerOptions.none().predicate_pushdown
    False
    """

    predicate_pushdown: bool = True
    projection_pushdown: bool = True
    limit_pushdown: bool = True
    partition_pruning: bool = True
    row_group_pruning: bool = True
    metadata_count: bool = True

    def __post_init__(self) -> None:
        _check_fields(self)

    @classmethod
    def none(cls) -> "OptimizerOptions":
        """Every optimization off: the plan runs exactly as written (full scans, then filter)."""
        return cls(**{f.name: False for f in dataclasses.fields(cls)})


@dataclass(frozen=True)
class ScanOptions:
    """How files are read.

    ``io_threads`` bounds concurrent footer fetches (object stores profit from many);
    ``retries`` / ``retry_backoff_s`` apply to transient I/O errors (connection resets,
    timeouts, throttling) on listing, footers and opening files; a missing file or a
    corrupt one is never retried. ``batch_rows`` caps rows per batch when streaming;
    ``None`` means row-group sized batches (the fast path: slicing later is free).
    ``page_checksums``: verify the CRC of every Parquet page that carries one (files
    written with ``write_page_checksum=True``); a mismatch raises ``CorruptFileError``
    instead of returning wrong values. Pages without a checksum are read as they are. Off
    by default: it costs 5-14% more CPU on a full scan (``benchmarks/bench_scan.py
    --checksums``), above the 3% a default may cost. ``check_footers``: decode each
    Parquet footer's column metadata in Python before pyarrow uses it (one more read of
    each footer when a source is planned): pyarrow aborts the whole process on encrypted
    or damaged column metadata, and with the check such files raise ``CorruptFileError``
    instead. Turn it off only for files you trust, to save that read per file.
    """

    use_threads: bool = True
    pre_buffer: bool = True
    io_threads: int = 16
    retries: int = 4
    retry_backoff_s: float = 0.05
    batch_rows: int | None = None
    batch_readahead: int = 4
    fragment_readahead: int = 2
    page_checksums: bool = False
    check_footers: bool = True

    def __post_init__(self) -> None:
        _check_fields(self, {"io_threads": 1, "retries": 0, "retry_backoff_s": 0, "batch_rows": 1,
                             "batch_readahead": 0, "fragment_readahead": 0})


@dataclass(frozen=True)
class Options:
    """All of arrowload's knobs in one immutable value; see ``Dataset.with_options``."""

    optimizer: OptimizerOptions = field(default_factory=OptimizerOptions)
    scan: ScanOptions = field(default_factory=ScanOptions)

    def __post_init__(self) -> None:
        for name, cls in (("optimizer", OptimizerOptions), ("scan", ScanOptions)):
            if not isinstance(getattr(self, name), cls):
                raise ArgumentTypeError(f"Options({name}=...) takes an al.{cls.__name__}, got "
                                        f"{type(getattr(self, name)).__name__}: Options({name}=al.{cls.__name__}(...))",
                                        name)

    def replace(self, **changes) -> "Options":
        return dataclasses.replace(self, **changes)
