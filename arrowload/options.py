"""Frozen option objects: one place to switch optimizations off and tune the scan."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


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


@dataclass(frozen=True)
class Options:
    """All of arrowload's knobs in one immutable value; see ``Dataset.with_options``."""

    optimizer: OptimizerOptions = field(default_factory=OptimizerOptions)
    scan: ScanOptions = field(default_factory=ScanOptions)

    def replace(self, **changes) -> "Options":
        return dataclasses.replace(self, **changes)
