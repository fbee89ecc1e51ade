"""One polars streaming query over a run of a scan's units, in source order.

An unshuffled epoch reads its positions in source order, a contiguous range per rank (an
elastic resume: a few). Where polars can read the scan exactly as the unit decoders do
(:meth:`StreamQuery.compile` says where), one ``collect_batches`` query per range reads
it: the files from the range's first unit's to its last unit's, the predicate evaluated
inside polars' Parquet decoder, the rows before the range's start skipped with a slice
(pushed into the scan without a filter; with one, the filtered rows before the start are
decoded and dropped), its rows handed over as Arrow record batches (``to_arrow``, zero
copy). Polars decodes on its own thread pool; the loader's reader threads only take the
rows in order (``pipeline/streamreads.py``).

Eligible: local Parquet that polars reads (``PolarsDecoder.eligible``: no page checksums,
no deletions or renamed columns), a plan that is the scan alone (no maps, residual filters
or computed columns above or in it), output columns that are plain file columns polars
reads with the unified types in every file, no partition columns, a predicate polars
translates whole (``plan/polars_filter.py``), and without a predicate every row group of
every file read (so a file's rows are its units' rows).

Memory: a query holds what polars decodes ahead of the reader (its pipeline's morsels in
flight and the morsels queued for ``collect_batches``; a few per polars thread: see
``held_bytes``) plus the rest of the batch being taken.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence

import pyarrow as pa

from ..options import Options, usable_cores
from ..plan.nodes import Plan, Scan
from ..source import FileSource
from .decoders import PolarsDecoder

#: The name a stream's reads go by in ``LoaderStats.decoders`` and ``profile()``.
STREAM_DECODER = "polars-stream"
#: the environment variable pinning decoders (tests, benchmarks)
DECODER_ENV = "ARROWLOAD_DECODER"
#: Morsels polars decodes ahead of the reader, per polars thread, and on top (measured on
#: polars 2.1: paused after its first batch, a query over 65,536-row row groups held about
#: seven row groups' worth on a 2-thread pool).
AHEAD_PER_THREAD = 2
AHEAD_EXTRA = 4


def env_decoders() -> list[str]:
    """The decoder names ``$ARROWLOAD_DECODER`` pins (comma-separated; ``polars-stream`` among
    them is the loader's, the others the unit reader's: ``scan/units.py``)."""
    return [d.strip() for d in os.environ.get(DECODER_ENV, "").split(",") if d.strip()]


def stream_setting() -> bool | None:
    """What the environment says of the stream: ``$ARROWLOAD_STREAM`` ``1`` / ``0`` forces it
    on (wherever eligible) / off; else ``$ARROWLOAD_DECODER`` (comma-separated decoder names,
    ``scan/units.py``) naming ``polars-stream`` forces it on, naming only others forces it off
    (the per-unit path with those decoders); None where neither is set (the default)."""
    forced = os.environ.get("ARROWLOAD_STREAM", "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    pinned = env_decoders()
    if not pinned:
        return None
    return STREAM_DECODER in pinned


class StreamQuery:
    """How to read a scan's units as one polars query per range (see the module doc).

    Built by :meth:`compile` (None where the scan is not eligible). ``batches(first, last,
    skip, n)``: record batches of ``n`` rows of units ``first..last`` (positions in
    ``scan.selected_units()``), after skipping ``skip`` rows of the first unit's file
    (after the filter), in the plan's schema."""

    def __init__(self, scan: Scan, schema: pa.Schema, columns: Sequence[tuple[str, str]], predicate) -> None:
        self.scan = scan
        self.schema = schema
        self.columns = tuple(columns)  # (output name, file column)
        self.predicate = predicate  # a polars_filter.PolarsSplit translating it whole, or None
        self.units = scan.selected_units()
        self._pl = None

    @classmethod
    def compile(cls, plan: Plan, options: Options) -> StreamQuery | None:
        if not isinstance(plan, Scan):
            return None  # maps, residual filters, SQL projections above the scan
        scan = plan
        src = scan.source
        if not PolarsDecoder.eligible(scan, options) or type(src).dataset is not FileSource.dataset:
            return None
        names = src.schema.names
        if len(set(names)) != len(names):
            return None
        if scan.projection is not None:
            columns = [(n, e.column_name()) for n, e in scan.projection]
            if any(c is None for _, c in columns):
                return None  # a computed column
        else:
            columns = [(n, n) for n in (scan.columns if scan.columns is not None else names)]
        parts = set(src.partition_schema.names)
        physical = pa.schema([f for f in src.schema if f.name not in parts])
        needed = {c for _, c in columns}
        predicate = None
        if scan.predicate is not None:
            from ..plan.polars_filter import split_for_polars
            split = split_for_polars(scan.predicate, physical)
            if split is None or split.rest is not None or split.polars_columns & parts:
                return None
            predicate = split  # its polars expression is built by the first query (importing polars)
            needed |= set(split.polars_columns)
        if needed & parts or not columns:
            return None
        units = scan.selected_units()
        if not units or any(u.row_group is None or u.num_rows is None or u.deleted for u in units):
            return None
        decoder = PolarsDecoder(scan, options)
        files = sorted({u.file for u in units})
        for f in files:
            if src.file_columns(f) or not needed <= decoder.readable_columns(f):
                return None
        if predicate is None:
            # without a filter a file's rows are all its row groups': every one must be read
            per_file: dict[int, int] = {}
            for u in src.units():
                per_file[u.file] = per_file.get(u.file, 0) + 1
            chosen: dict[int, int] = {}
            for u in units:
                chosen[u.file] = chosen.get(u.file, 0) + 1
            if any(chosen[f] != per_file.get(f) for f in files):
                return None
        return cls(scan, plan.schema, columns, predicate)

    def held_bytes(self, unit_bytes: int) -> int:
        """What one query holds decoded ahead of its reader, for units of ``unit_bytes``
        (the largest unit's decoded bytes): a few morsels per polars thread, plus the batch
        being taken."""
        pl = sys.modules.get("polars")
        threads = pl.thread_pool_size() if pl is not None and hasattr(pl, "thread_pool_size") else usable_cores()
        return (AHEAD_PER_THREAD * threads + AHEAD_EXTRA + 1) * max(1, unit_bytes)

    def skip_before(self, first: int, counts: Sequence[int]) -> int:
        """Rows of unit ``first``'s file before it, after the filter (units of the file not
        selected hold none: the statistics proved the predicate keeps none of their rows)."""
        f = self.units[first].file
        return sum(int(counts[i]) for i in range(first) if self.units[i].file == f)

    def batches(self, first: int, last: int, skip: int, n: int) -> Iterator[pa.RecordBatch]:
        """The query's record batches (see the class doc). Lazy: nothing runs until the
        first ``next``; dropping the iterator stops the query."""
        if self._pl is None:
            import polars as pl
            self._pl = pl
        pl = self._pl
        paths = []
        for u in self.units[first:last + 1]:
            if not paths or paths[-1] != u.path:
                paths.append(u.path)
        # use_statistics=False: polars would trust footer statistics arrowload found implausible
        # (min > max, NaN) and skip row groups that hold rows; the scan already kept only the
        # row groups whose checked statistics allow a match
        lf = pl.scan_parquet(paths, glob=False, hive_partitioning=False, cache=False, use_statistics=False,
                             extra_columns="ignore")
        if self.predicate is not None:
            lf = lf.filter(self.predicate.polars)
        lf = lf.slice(skip, n).select([pl.col(c).alias(name) for name, c in self.columns])
        return self._arrow(lf.collect_batches(engine="streaming"))

    def _arrow(self, frames) -> Iterator[pa.RecordBatch]:
        pl = self._pl
        schema = self.schema
        for df in frames:
            table = df.to_arrow(compat_level=pl.CompatLevel.oldest())
            del df
            if not table.schema.equals(schema):
                table = pa.Table.from_arrays([c if c.type.equals(f.type, check_metadata=True) else c.cast(f.type)
                                              for c, f in zip(table.columns, schema)], schema=schema)
            for b in table.to_batches():
                if b.num_rows:
                    yield b


__all__ = ["DECODER_ENV", "STREAM_DECODER", "StreamQuery", "env_decoders", "stream_setting"]
