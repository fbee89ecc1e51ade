"""One polars streaming query over a run of a scan's units, in source order.

An unshuffled epoch reads its positions in source order, a contiguous range per rank (an
elastic resume: a few). Where polars can read the scan exactly as the unit decoders do
(:meth:`StreamQuery.compile` says where), one ``collect_batches`` query per range reads
it: the files from the range's first unit's to its last unit's, the predicate evaluated
inside polars' Parquet decoder, the rows of the first unit's file before it and of the
last unit's file after it sliced off ahead of the filter (pushed into the scan: their row
groups are not read), the rows of the first unit before the range's start skipped after
it, its rows handed over as Arrow record batches (``to_arrow``, zero copy). Polars decodes
on its own thread pool; the loader's reader threads only take the rows in order
(``pipeline/streamreads.py``).

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
import threading
from collections.abc import Iterator, Sequence

import pyarrow as pa

from .._polars import forked_with_polars, polars_imported, refuse_after_fork
from ..options import Options, usable_cores
from ..plan.expr import Expr
from ..plan.nodes import Plan, Scan
from ..source import FileSource
from ..source.schema import widen
from .decoders import PolarsDecoder

#: The name a stream's reads go by in ``LoaderStats.decoders`` and ``profile()``.
STREAM_DECODER = "polars-stream"
#: ... and a block-shuffle window's units read at once (``StreamQuery.unit_tables``)
WINDOW_DECODER = "polars-window"
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


_importer: threading.Thread | None = None
_importer_lock = threading.Lock()


def polars_threads() -> int:
    """Threads of polars' pool (the usable cores where polars is not imported yet)."""
    pl = sys.modules.get("polars")
    return pl.thread_pool_size() if pl is not None and hasattr(pl, "thread_pool_size") else usable_cores()


def _import_polars() -> None:
    """Import polars off the reading threads; a broken polars install only leaves it out
    (its decoder then fails and the dataset scanner reads; a stream falls back per unit)."""
    try:
        import polars  # noqa: F401
    except Exception:  # noqa: BLE001 - see above
        pass


def import_polars_in_background() -> threading.Thread | None:
    """Start polars' import (about 0.15-0.2 s, holding the GIL) on a thread of its own,
    once per process, so that no read waits for it: the unit reader's polars reads and a
    stream's query wait for it to end, reading otherwise meanwhile. The thread (to join),
    or None where polars is imported already."""
    global _importer
    if polars_imported():
        return None
    with _importer_lock:
        if _importer is None:
            _importer = threading.Thread(target=_import_polars, daemon=True, name="arrowload-import-polars")
            _importer.start()
        return _importer


def polars_ready(wait: bool = False) -> bool:
    """Whether polars may be used now: it is imported. The first time it is not, its import
    starts on a thread of its own (``import_polars_in_background``) and the caller reads
    otherwise meanwhile -- or, with ``wait``, waits for that import (then True: a broken
    install fails the polars read, whose fallback answers)."""
    importer = import_polars_in_background()
    if importer is not None and wait:
        importer.join()
        return True
    return importer is None


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
    ``scan.selected_units()``), after skipping ``skip`` rows of the first unit (after the
    filter), in the plan's schema."""

    def __init__(self, scan: Scan, schema: pa.Schema, columns: Sequence[tuple[str, str]], predicate,
                 marks: Sequence[tuple[str, object]] = ()) -> None:
        self.scan = scan
        self.schema = schema
        self.columns = tuple(columns)  # (output name, file column)
        self.predicate = predicate  # a polars_filter.PolarsSplit translating it whole, or None
        self.marks = tuple(marks)  # (output name, PolarsSplit): boolean columns (``marked``)
        self.units = scan.selected_units()
        self._pl = None
        self._starts: dict[int, int] | None = None  # unit index -> its first row in its file
        self._c_stream: bool | None = None  # _table: frames through the C stream interface
        self._totals: dict[int, int] = {}  # file -> its rows

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
        needed = {c for _, c in columns}
        predicate = None
        if scan.predicate is not None:
            predicate = _whole_split(scan.predicate, src)
            if predicate is None:
                return None
            needed |= set(predicate.polars_columns)  # its polars expression is built by the first query
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

    def marked(self, columns: Sequence[str], marks: Sequence[tuple[str, Expr]]) -> StreamQuery | None:
        """This query giving file ``columns`` (of its own) and, per ``(name, predicate)`` of
        ``marks``, a non-null boolean column ``name``: whether the predicate keeps the row
        (null: not kept, as a filter), evaluated inside polars; None where polars does not
        translate a predicate whole (or a name is taken). A mixture's union reads its
        members' masks this way instead of the columns their predicates read
        (``mixture.shared.Group.union_stream``)."""
        src = self.scan.source
        own = {c for _, c in self.columns}
        names = [n for n, _ in marks]
        if not set(columns) <= own or len(set(names)) != len(names) or set(names) & set(src.schema.names):
            return None
        splits = []
        for name, pred in marks:
            split = _whole_split(pred, src)
            if split is None:
                return None
            splits.append((name, split))
        fields = [self.schema.field(next(n for n, c in self.columns if c == col)).with_name(col) for col in columns]
        schema = pa.schema(fields + [pa.field(n, pa.bool_(), nullable=False) for n in names])
        return StreamQuery(self.scan, schema, [(c, c) for c in columns], self.predicate, splits)

    def _select(self) -> list:
        """The query's output columns as polars expressions (its marks last)."""
        pl = self._polars()
        return [pl.col(c).alias(name) for name, c in self.columns] + \
            [split.polars.fill_null(False).alias(name) for name, split in self.marks]

    def held_bytes(self, unit_bytes: int) -> int:
        """What one query holds decoded ahead of its reader, for units of ``unit_bytes``
        (the largest unit's decoded bytes): a few morsels per polars thread, plus the batch
        being taken."""
        return (AHEAD_PER_THREAD * polars_threads() + AHEAD_EXTRA + 1) * max(1, unit_bytes)

    def _file_rows(self) -> tuple[dict[int, int], dict[int, int]]:
        """Each unit's first row in its file and each file's rows, every row group counted
        (those the scan does not select too)."""
        if self._starts is None:
            starts, totals, at, last = {}, {}, 0, None
            for u in self.scan.source.units():
                if u.file != last:
                    at, last = 0, u.file
                starts[u.index] = at
                at += (u.num_rows or 0) + u.deleted
                totals[u.file] = at
            self._totals = totals
            self._starts = starts  # last: another thread that sees it sees the totals too
        return self._starts, self._totals

    def _file_offset(self, first: int) -> int:
        """Rows of unit ``first``'s file before its row group: where the query slices before
        filtering."""
        return self._file_rows()[0][self.units[first].index]

    def _span(self, first: int, last: int, files: Sequence[int]) -> int | None:
        """Rows from unit ``first``'s start to unit ``last``'s end over ``files`` (the range's
        files, in order), where rows of the last file follow unit ``last`` (else None: the
        query reads to the end of its files anyway)."""
        starts, totals = self._file_rows()
        a, b = self.units[first], self.units[last]
        end = starts[b.index] + (b.num_rows or 0) + b.deleted
        if end >= totals[b.file]:
            return None
        return sum(totals[f] for f in files[:-1]) - starts[a.index] + end

    def batches(self, first: int, last: int, skip: int, n: int | None) -> Iterator[pa.RecordBatch]:
        """The query's record batches (see the class doc). The query starts here: polars
        decodes ahead on its own threads (``held_bytes``) before the first ``next``;
        dropping the iterator stops it. The rows before unit ``first`` in its file and
        after unit ``last`` in its file are sliced off before the filter (polars skips their
        row groups unread), the ``skip`` rows of unit ``first`` after it; ``n=None``: every
        row to the end of unit ``last``."""
        refuse_after_fork()  # the callers read per unit instead
        paths, files = [], []
        for u in self.units[first:last + 1]:
            if not paths or paths[-1] != u.path:
                paths.append(u.path)
                files.append(u.file)
        lf = self._scan(paths)
        offset, span = self._file_offset(first), self._span(first, last, files)
        if offset or span is not None:  # polars reads no row group outside the slice
            lf = lf.slice(offset, span)
        if self.predicate is not None:
            lf = lf.filter(self.predicate.polars)
        if skip or n is not None:
            lf = lf.slice(skip, n)
        lf = lf.select(self._select())
        return self._arrow(lf.collect_batches(engine="streaming"))

    def unit_tables(self, indices: Sequence[int]) -> list[pa.Table]:
        """The rows of units ``indices`` (positions in ``scan.selected_units()``), a table
        each, as the unit decoders give them: one polars query per unit, all run at once
        (``collect_all``: polars decodes them side by side on its pool). A block-shuffle
        window's read."""
        refuse_after_fork()
        pl = self._polars()
        starts = self._file_rows()[0]
        select = self._select()
        queries = []
        for i in indices:
            u = self.units[i]
            lf = self._scan(u.path).slice(starts[u.index], u.num_rows)
            if self.predicate is not None:
                lf = lf.filter(self.predicate.polars)
            queries.append(lf.select(select))
        return [self._table(df) for df in pl.collect_all(queries)]

    def _polars(self):
        """The polars module (imported on first use)."""
        if self._pl is None:
            import polars as pl
            self._pl = pl
        return self._pl

    def _scan(self, paths):
        """The Parquet files ``paths`` as polars scans them for the unit decoders' rows.
        ``use_statistics=False``: polars would trust footer statistics arrowload found
        implausible (min > max, NaN) and skip row groups that hold rows; the scan already
        kept only the row groups whose checked statistics allow a match."""
        return self._polars().scan_parquet(paths, glob=False, hive_partitioning=False, cache=False,
                                           use_statistics=False, extra_columns="ignore")

    def _table(self, df) -> pa.Table:
        """A polars frame of the query as an Arrow table in the plan's schema: through the
        Arrow C stream interface where every column is fixed-width (the types polars exports
        there are the plan's; 18 against 42 us of CPU for a W2 frame of 17 columns, as
        ``to_arrow`` converts column by column), else ``to_arrow`` at the oldest compat
        level (plain strings and lists, not views)."""
        if self._c_stream is None:
            self._c_stream = all(_fixed_width(f.type) for f in self.schema)
        if self._c_stream:
            table = pa.RecordBatchReader.from_stream(df).read_all()
        else:
            table = df.to_arrow(compat_level=self._pl.CompatLevel.oldest())
        schema = self.schema
        if not table.schema.equals(schema):
            table = pa.Table.from_arrays([widen(c, f.type) for c, f in zip(table.columns, schema)], schema=schema)
        return table

    def _arrow(self, frames) -> Iterator[pa.RecordBatch]:
        for df in frames:
            table = self._table(df)
            del df
            for b in table.to_batches():
                if b.num_rows:
                    yield b


def _fixed_width(t: pa.DataType) -> bool:
    """A plain fixed-width Arrow type (numbers, booleans, dates, times, timestamps,
    durations), exported by polars' C stream as itself."""
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or \
        pa.types.is_date(t) or pa.types.is_timestamp(t) or pa.types.is_time(t) or pa.types.is_duration(t)


def _whole_split(predicate: Expr, src):
    """``predicate`` as polars evaluates it over ``src``'s files, where polars translates it
    whole and it reads no partition column (``plan/polars_filter.py``); else None."""
    from ..plan.polars_filter import split_for_polars
    parts = set(src.partition_schema.names)
    split = split_for_polars(predicate, pa.schema([f for f in src.schema if f.name not in parts]))
    if split is None or split.rest is not None or split.polars_columns & parts:
        return None
    return split


__all__ = ["DECODER_ENV", "STREAM_DECODER", "StreamQuery", "WINDOW_DECODER", "env_decoders", "forked_with_polars",
           "import_polars_in_background", "polars_threads",
           "polars_imported", "polars_ready", "stream_setting"]
