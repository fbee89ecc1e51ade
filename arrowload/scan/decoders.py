"""Ways to decode the columns of one unit, each returning the same table.

A decoder's ``read(unit, columns)`` returns the unit's rows of ``columns`` (source column
names, in that order) with the source's unified types: a column the file lacks reads as
nulls, a hive partition column as its value. Three decoders:

- ``dataset``: pyarrow's dataset scanner over the one unit (what every read used before;
  any source: Parquet, IPC, CSV, JSON, memory).
- ``pyarrow``: ``ParquetFile`` readers kept open per file (a small pool, so that each is
  used by one thread at a time), reading the row group's column chunks by leaf index on
  the calling thread, with the scan options' pre-buffering and page checksums.
- ``polars``: ``pl.scan_parquet`` sliced to the row group's rows, for local files whose
  columns polars reads with exactly these values; it can take a predicate
  (``polars_filter``) and decode the other columns only where rows survive.

The fast decoders serve a file only where its footer passed arrowload's check (pyarrow
would abort on damaged column metadata) and its columns need nothing the dataset scanner
alone does; a file they do not serve is read by ``dataset``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from contextlib import contextmanager

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.types as pat

from .._polars import forked_with_polars, polars_zone, refuse_after_fork
from ..options import Options
from ..plan.nodes import Scan
from ..source import FileSource
from ..source.base import Unit
from ..source.files import INT96_UNIT
from ..source.footer import per_schema
from ..source.schema import timestamp_zones
from .choose import PolarsCall

_MAX_BATCH_ROWS = 1 << 20
OPEN_FILES = 64  # ParquetFile readers kept open per reader (all files together)


def empty_columns(n: int) -> pa.Table:
    """A table of ``n`` rows and no columns."""
    return pa.table({"_": pa.nulls(n)}).drop_columns(["_"])


def _constant(value, n: int, t: pa.DataType) -> pa.Array:
    if value is None:
        return pa.nulls(n, t)
    return pa.repeat(pa.scalar(value, t), n)


def _leaves(t: pa.DataType) -> int:
    """Parquet leaf columns of a column of Arrow type ``t``."""
    if isinstance(t, pa.BaseExtensionType):
        t = t.storage_type
    if t.num_fields == 0:  # not nested (a dictionary neither)
        return 1
    if pat.is_list(t) or pat.is_large_list(t) or pat.is_fixed_size_list(t) or \
            pat.is_list_view(t) or pat.is_large_list_view(t):
        return _leaves(t.value_type)
    if pat.is_map(t):
        return _leaves(t.key_type) + _leaves(t.item_type)
    if pat.is_struct(t):
        return sum(_leaves(t.field(i).type) for i in range(t.num_fields))
    return 1


class _FileFacts:
    """What the fast decoders need of one Parquet file, found once: each top-level
    column's leaf indices and Arrow type as pyarrow reads the file."""

    def __init__(self, meta) -> None:
        schema = meta.schema.to_arrow_schema()
        self.names = schema.names
        self.types: dict[str, pa.DataType] = {}
        self.leaves: dict[str, list[int]] = {}
        self.int96: set[str] = set()  # columns with legacy INT96 timestamps: polars reads them in ns
        at = 0
        for f in schema:
            k = _leaves(f.type)
            self.leaves[f.name] = list(range(at, at + k))
            t = f.type
            if at + k <= meta.num_columns and any(meta.schema.column(i).physical_type == "INT96"
                                                  for i in range(at, at + k)):
                self.int96.add(f.name)
                if pat.is_timestamp(t):  # read in INT96_UNIT (source/files.py), as pyarrow's readers are told
                    t = pa.timestamp(INT96_UNIT, t.tz)
            self.types[f.name] = t
            at += k
        self.consistent = at == meta.num_columns and len(set(self.names)) == len(self.names)
        # polars parses the whole schema of a file it reads: a time zone it does not know,
        # in any column, makes it panic (PolarsDecoder reads no column of such a file)
        self.zones = frozenset().union(*(timestamp_zones(f.type) for f in schema))


class _Base:
    """What the decoders share: the source, its unified schema, partition values, and the
    per-file facts (``facts(file)``: None where a fast decoder must not read the file)."""

    name = ""

    def __init__(self, scan: Scan, options: Options) -> None:
        self.scan = scan
        self.source = scan.source
        self.options = options
        self.schema = self.source.schema
        self._types = {f.name: f.type for f in reversed(list(self.schema))}  # a repeated name: its first
        self.partitions = frozenset(self.source.partition_schema.names)
        # where a file stores a column under another name, or not at all (Source.file_columns)
        self._columns_of = getattr(self.source, "file_columns", lambda file: {})
        self._lock = threading.Lock()
        self._facts: dict[int, _FileFacts | None] = {}
        self._plans: dict[tuple[int, tuple[str, ...]], tuple | None] = {}

    def facts(self, file: int) -> _FileFacts | None:
        if file in self._facts:
            return self._facts[file]
        src = self.source
        facts = None
        if src.footer_check(file).ok:
            meta = src.file_metadata(file)
            f = per_schema("file_facts", meta, lambda: _FileFacts(meta))  # shared: read only
            # a partition key that is also a column of the file: the scanner decides
            if f.consistent and not (self.partitions & set(f.names)):
                facts = f
        with self._lock:
            self._facts[file] = facts
        return facts

    def _conform(self, table: pa.Table | None, n: int, unit: Unit, columns: Sequence[str],
                 facts: _FileFacts) -> pa.Table:
        """``columns`` of ``table`` (the file's columns read, by their names in the file)
        cast to the unified types, partition values and nulls for the others; ``n`` rows,
        all the unit's physical rows: the rows a table's deletes remove are dropped here,
        the one place every fast decoder's read passes."""
        if not columns:
            return empty_columns(n - unit.deleted)
        arrays = []
        mapped = self._columns_of(unit.file)
        for c in columns:
            t = self._types[c]
            p = mapped.get(c, c)
            if c in self.partitions or (p is None and c in unit.partition):
                arrays.append(_constant(unit.partition.get(c), n, t))
            elif p is not None and p in facts.types:
                col = table.column(p)
                # check_metadata: also the names of nested fields (a list's child is "element"
                # read by pyarrow, "item" by polars): every decoder's table is the same one
                arrays.append(self.source.conform_column(unit.file, c, col, t))
            else:
                arrays.append(pa.nulls(n, t))
        out = pa.Table.from_arrays(arrays, names=list(columns))
        if unit.deleted:
            out = out.filter(self.source.keep_mask(unit, n))
        return out


class DatasetDecoder(_Base):
    """pyarrow's dataset scanner over one unit (any source kind)."""

    name = "dataset"

    def __init__(self, scan: Scan, options: Options, *, use_threads: bool = True) -> None:
        super().__init__(scan, options)
        src = self.source
        self._statistics = scan.predicate is not None  # as the scan path: footers checked first
        rows = [u.num_rows for u in scan.selected_units() if u.num_rows]
        self._kwargs = dict(
            batch_size=options.scan.batch_rows or min(max(rows, default=131_072), _MAX_BATCH_ROWS),
            use_threads=use_threads, batch_readahead=options.scan.batch_readahead,
            fragment_readahead=options.scan.fragment_readahead)
        if src.kind == "parquet":
            self._kwargs["fragment_scan_options"] = ds.ParquetFragmentScanOptions(
                pre_buffer=options.scan.pre_buffer, page_checksum_verification=options.scan.page_checksums)

    def usable(self, unit: Unit, columns: frozenset[str]) -> bool:
        return True

    def read(self, unit: Unit, columns: Sequence[str], measure=None) -> pa.Table:
        dataset = self.source.dataset((unit.index,), statistics=self._statistics, columns=columns)
        return ds.Scanner.from_dataset(dataset, columns=list(columns), **self._kwargs).to_table()


class _OpenFiles:
    """ParquetFile readers of one source, each used by one thread at a time: a reader is
    taken from its file's free list (or opened, with the footer already read) and put
    back after the read; at most ``cap`` are kept open, the least recently used closed."""

    def __init__(self, source: FileSource, options: Options, cap: int = OPEN_FILES) -> None:
        self.source = source
        self.options = options
        self.cap = cap
        self.local = source.is_local
        self._lock = threading.Lock()
        self._free: dict[int, list] = {}
        self._order: list[tuple[int, object]] = []  # (file, reader) free, oldest first

    def _open(self, file: int):
        import pyarrow.parquet as pq
        src, scan = self.source, self.options.scan
        handle = src.filesystem.open_input_file(src.entries[file].path)
        # local files: each column chunk read on the calling thread (its CPU clock then sees
        # the reading too, as polars' does); object storage: pre-buffered, one request per range
        try:
            return pq.ParquetFile(handle, metadata=src.file_metadata(file),
                                  pre_buffer=scan.pre_buffer and not self.local,
                                  page_checksum_verification=scan.page_checksums,
                                  coerce_int96_timestamp_unit=INT96_UNIT)
        except BaseException:
            handle.close()
            raise

    @contextmanager
    def use(self, file: int):
        with self._lock:
            free = self._free.get(file)
            pf = free.pop() if free else None
            if pf is not None:
                self._order.remove((file, pf))
        if pf is None:
            pf = self._open(file)
        try:
            yield pf
        except BaseException:
            pf.close(force=True)  # a failed reader is not reused
            raise
        closing = []
        with self._lock:
            self._free.setdefault(file, []).append(pf)
            self._order.append((file, pf))
            while len(self._order) > self.cap:
                f, old = self._order.pop(0)
                self._free[f].remove(old)
                closing.append(old)
        for old in closing:
            old.close(force=True)

    def close(self) -> None:
        with self._lock:
            readers, self._order, self._free = [r for _, r in self._order], [], {}
        for r in readers:
            r.close(force=True)


class ParquetDecoder(_Base):
    """Row groups read with ``ParquetFile`` on the calling thread (no thread pool)."""

    name = "pyarrow"

    def __init__(self, scan: Scan, options: Options) -> None:
        super().__init__(scan, options)
        self._files = _OpenFiles(self.source, options)

    def usable(self, unit: Unit, columns: frozenset[str]) -> bool:
        return unit.row_group is not None and self.facts(unit.file) is not None

    def _indices(self, file: int, facts: _FileFacts, columns: tuple[str, ...]) -> list[int]:
        key = (file, columns)
        got = self._plans.get(key)
        if got is None:
            mapped = self._columns_of(file)
            names = [mapped.get(c, c) for c in columns]
            got = [i for c in names if c is not None and c in facts.leaves for i in facts.leaves[c]]
            self._plans[key] = got
        return got

    def read(self, unit: Unit, columns: Sequence[str], measure=None) -> pa.Table:
        columns = tuple(columns)
        facts = self.facts(unit.file)
        indices = self._indices(unit.file, facts, columns)
        table = None
        if indices:
            with self._files.use(unit.file) as pf:
                table = pf.reader.read_row_groups([unit.row_group], column_indices=indices, use_threads=False)
        n = unit.num_rows + unit.deleted if table is None else table.num_rows
        return self._conform(table, n, unit, columns, facts)

    def close(self) -> None:
        self._files.close()


def recoverable(exc: BaseException) -> bool:
    """Whether a fallback may answer a read that raised ``exc``: any ``Exception``, and
    polars' panics (``PanicException`` derives from ``BaseException``); never an interrupt
    or an exit."""
    return isinstance(exc, Exception) or type(exc).__name__ == "PanicException"


def polars_reads(t: pa.DataType) -> bool:
    """Types polars reads from Parquet and hands back with the same values (cast back to
    ``t``): numbers but float16, booleans, strings, binaries, dates, naive or UTC
    timestamps of ms / us / ns, decimal128, and lists of those."""
    if pat.is_integer(t) or pat.is_float32(t) or pat.is_float64(t) or pat.is_boolean(t) or pat.is_date32(t):
        return True
    if pat.is_string(t) or pat.is_large_string(t) or pat.is_binary(t) or pat.is_large_binary(t):
        return True
    if pat.is_timestamp(t):
        return t.unit in ("ms", "us", "ns") and t.tz in (None, "UTC")
    if pat.is_decimal128(t):
        return True
    if pat.is_list(t) or pat.is_large_list(t) or pat.is_fixed_size_list(t):
        return polars_reads(t.value_type)
    return False


class PolarsDecoder(_Base):
    """Row groups read by polars (local files), optionally prefiltered by a polars
    predicate inside its Parquet decoder."""

    name = "polars"

    def __init__(self, scan: Scan, options: Options) -> None:
        super().__init__(scan, options)
        starts, at, last = {}, 0, None
        for u in self.source.units():  # each row group's first row in its file
            if u.file != last:
                at, last = 0, u.file
            starts[u.index] = at
            at += (u.num_rows or 0) + u.deleted
        self._starts = starts
        self._readable: dict[int, frozenset[str]] = {}
        self._readable_facts: dict[int, tuple] = {}  # id(facts) -> (facts, readable columns)
        self._pl = None

    @staticmethod
    def eligible(scan: Scan, options: Options) -> bool:
        """Whether polars may read this scan at all: local Parquet files, no page checksums
        asked (polars does not verify them), threads allowed (polars decodes on its pool),
        no renamed columns or deleted rows (its prefilter would drop rows before the
        deletion mask could apply), not in a process forked with polars imported (a
        DataLoader worker: polars' pool did not survive the fork)."""
        src = scan.source
        return (not forked_with_polars() and isinstance(src, FileSource) and src.kind == "parquet"
                and not src.in_memory_reads and not src.rewrites_rows
                and isinstance(src.filesystem, pafs.LocalFileSystem) and not options.scan.page_checksums
                and options.scan.use_threads)

    def _columns_ok(self, file: int) -> frozenset[str]:
        got = self._readable.get(file)
        if got is None:
            facts = self.facts(file)
            shared = self._readable_facts.get(id(facts))  # files sharing their schema's facts
            if shared is not None and shared[0] is facts:
                got = shared[1]
            else:
                parses = facts is not None and all(polars_zone(z) for z in facts.zones)
                got = frozenset() if not parses else frozenset(
                    c for c, t in facts.types.items()
                    if c in self._types and t.equals(self._types[c]) and polars_reads(t)
                    and c not in facts.int96) | self.partitions
                self._readable_facts[id(facts)] = (facts, got)
            self._readable[file] = got
        return got

    def readable_columns(self, file: int) -> frozenset[str]:
        """Columns of ``file`` polars reads with the unified types (and the partition keys)."""
        return self._columns_ok(file)

    def usable(self, unit: Unit, columns: frozenset[str]) -> bool:
        # not in a process forked with polars imported (a DataLoader worker): its pool is gone
        return unit.row_group is not None and unit.num_rows is not None and not forked_with_polars() \
            and columns <= self._columns_ok(unit.file)

    def read(self, unit: Unit, columns: Sequence[str], measure=None, polars_filter=None) -> pa.Table:
        refuse_after_fork()
        if self._pl is None:
            import polars as pl
            self._pl = pl
        pl = self._pl
        facts = self.facts(unit.file)
        physical = [c for c in columns if c not in self.partitions]
        lf = pl.scan_parquet(unit.path, parallel="prefiltered" if polars_filter is not None else "none",
                             use_statistics=False, glob=False, hive_partitioning=False, cache=False)
        lf = lf.slice(self._starts[unit.index], unit.num_rows)
        if polars_filter is not None:
            lf = lf.filter(polars_filter)
        lf = lf.select(physical) if physical else lf.select(pl.len())
        with PolarsCall(measure is not None) as call:
            frame = lf.collect()
        if measure is not None:
            measure.add_pool(call.cpu_s)
        if not physical:
            return self._conform(None, int(frame.item()), unit, columns, facts)
        table = frame.to_arrow(compat_level=pl.CompatLevel.oldest())
        return self._conform(table, table.num_rows, unit, columns, facts)
