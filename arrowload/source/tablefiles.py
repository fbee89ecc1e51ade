"""The live Parquet files of one lake table snapshot (Delta Lake version, Iceberg snapshot).

A table library says which files a snapshot holds, how big they are, their partition
values and the rows deletes remove from them; arrowload reads the files itself, with its
own pruning, decoders and loader. :class:`TableFileSource` is what both table formats
share: a Parquet :class:`~arrowload.source.files.FileSource` over exactly those files (no
listing) whose

- ``schema`` is the table's logical schema at that snapshot;
- ``file_columns(file)`` says where a file stores a logical column under another name,
  or does not hold it (see :meth:`Source.file_columns`): one map for the whole table
  (Delta column mapping, ``column_renames``) or one per file (Iceberg field ids,
  ``_column_map``);
- units count live rows: ``Unit.num_rows`` leaves out the rows deletes remove
  (``Unit.deleted``), so ``len()``, sharding, resume and ``count()`` are exact, and every
  read drops those rows (``keep_mask(unit, n)``) right after decoding.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from ..errors import CorruptFileError
from ..options import ScanOptions
from .base import file_to_source_names
from .filesystem import FileEntry
from .files import INT96_UNIT, FileSource, _ColumnSizes


class TableFile(NamedTuple):
    """One live file of a snapshot: its path (on the source's filesystem), size in bytes,
    partition values (logical column -> value) and the sorted positions of its deleted
    rows (None: none)."""

    path: str
    size: int | None
    partition: Mapping[str, object]
    deleted: np.ndarray | None = None


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


class TableFileSource(FileSource):
    """The live Parquet files of one table snapshot (see the module doc).

    Subclasses set ``table`` (the identity: ``{"format", "uri", ...}``) and say how the
    snapshot is named (``snapshot_label``); ``partition_columns`` are the columns whose
    values come from the table's metadata for every file (Delta); a file's other
    partition values (Iceberg identity partitions) are read only where the file lacks
    the column (``file_columns`` maps it to None).
    """

    decoders_conform = True  # the fast decoders apply file_columns and keep_mask

    def __init__(self, filesystem: pafs.FileSystem, root: str, files: Sequence[TableFile], *,
                 schema: pa.Schema, partition_columns: Sequence[str], table: dict, display: str,
                 renames: Mapping[str, str] | None = None,
                 scan_options: ScanOptions | None = None) -> None:
        entries = [FileEntry(f.path, f.size, None, None) for f in files]
        super().__init__(filesystem, entries, "parquet", root, display, partitioning=False,
                         scan_options=scan_options)
        by_path = {f.path: f for f in files}
        self.table = dict(table)
        self.root = root
        self.column_renames = dict(renames or {})
        self._logical = schema
        self._partition_schema = pa.schema([schema.field(c) for c in partition_columns])
        self._partition_values = [dict(by_path[e.path].partition) for e in self.entries]
        self._file_deleted = [by_path[e.path].deleted for e in self.entries]
        self.deleted_total = sum(len(d) for d in self._file_deleted if d is not None)
        self.has_deletions = self.deleted_total > 0
        self._unit_deleted: dict[int, np.ndarray] = {}
        self._maps: dict[int, dict[str, str | None]] = {}

    # -- identity of the snapshot, for display ------------------------------------
    def snapshot_label(self) -> str:  # pragma: no cover - abstract
        """``"version 3"`` / ``"snapshot 1234"``."""
        raise NotImplementedError

    def table_line(self, units) -> str:
        """``<format> <uri> <snapshot>: F of T files, D of Dt deleted rows`` for the units kept."""
        files = {u.file for u in units}
        kept = sum(u.deleted for u in units)
        return (f"{self.table['format']} {self.table['uri']} {self.snapshot_label()}: {len(files)} of "
                f"{self.num_files} files, {kept} of {self.deleted_total} deleted rows in them left out")

    # -- columns per file ----------------------------------------------------------
    def _column_map(self, i: int, meta) -> dict[str, str | None]:
        """File ``i``'s column map from its footer; default: the table-wide renames."""
        return dict(self.column_renames)

    def file_columns(self, file: int) -> Mapping[str, str | None]:
        self._ensure()
        return self._maps.get(file, self.column_renames)

    def _rounding(self) -> frozenset[int]:
        return frozenset()  # the table's schema types the columns: read_unit casts them

    @property
    def rewrites_rows(self) -> bool:
        if self.has_deletions or self.column_renames:
            return True
        self._ensure()
        return any(self._maps.values())

    # -- schema and units ------------------------------------------------------
    @property
    def schema(self) -> pa.Schema:
        return self._logical

    def _schema_of(self, file_schemas) -> pa.Schema:
        return self._logical

    def _units_of(self, i: int, meta, start: int) -> list:
        cmap = self._maps[i] = self._column_map(i, meta)
        units = super()._units_of(i, meta, start)
        names = file_to_source_names(cmap)
        if names:  # footer sizes under the source's column names
            sizes = _ColumnSizes(meta, functools.partial(self.footer_check, i), names)
            units = [dataclasses.replace(u, column_bytes=sizes.of(u.row_group)) for u in units]
        dels = self._file_deleted[i]
        if dels is None or not len(dels):
            return units
        out, at = [], 0
        for u in units:
            n = u.num_rows
            lo, hi = np.searchsorted(dels, [at, at + n])
            if hi > lo:
                self._unit_deleted[u.index] = dels[lo:hi] - at
            out.append(dataclasses.replace(u, num_rows=n - int(hi - lo), deleted=int(hi - lo)))
            at += n
        tail = dels[np.searchsorted(dels, at):]
        if len(tail):
            raise CorruptFileError(f"the deletes of {self.table['format']} table {self.table['uri']!r} remove row "
                                   f"{int(tail[0])} of {self.entries[i].path!r}, but the file holds {at} rows; "
                                   "the table is damaged: repair it with the engine that wrote it",
                                   self.entries[i].path)
        return out

    def deleted_rows(self, unit) -> np.ndarray | None:
        """Positions within ``unit``'s row group that the table's deletes remove."""
        if not unit.deleted:
            return None
        self.units()
        return self._unit_deleted.get(unit.index)

    def keep_mask(self, unit, n: int) -> pa.Array | None:
        dels = self.deleted_rows(unit)
        if dels is None:
            return None
        keep = np.ones(n, dtype=bool)
        keep[dels] = False
        return pa.array(keep)

    def head_source(self, rows: int):
        return None  # the table's own schema and units; head() reads through the scan

    # -- reads -------------------------------------------------------------------
    def statistics_dataset(self, units, *, statistics: bool = True) -> ds.Dataset:
        return FileSource.dataset(self, units, statistics=statistics)

    def dataset(self, units, *, statistics: bool = True, columns=None) -> ds.Dataset:
        """Files read as pyarrow fragments where they need nothing more; where columns are
        renamed or missing by id, or rows deleted, the units read now (``columns`` of
        them, nulls for the others) into an in-memory dataset of the logical schema."""
        all_units = self.units()
        chosen = range(len(all_units)) if units is None else units
        if not any(all_units[u].deleted or self.file_columns(all_units[u].file) for u in chosen):
            return FileSource.dataset(self, units, statistics=statistics)
        wanted = None if columns is None else set(columns)
        tables = [self.read_unit(all_units[u], wanted) for u in chosen]
        return ds.InMemoryDataset(tables or [self._logical.empty_table()], schema=self._logical)

    def read_unit(self, unit, wanted: set | None = None) -> pa.Table:
        """One unit's live rows in the logical schema (``wanted`` columns read, nulls for
        the others)."""
        import pyarrow.parquet as pq
        self.refuse_unreadable([unit.file])
        part = set(self._partition_schema.names)
        cmap = self.file_columns(unit.file)
        file_names = set(self._file_facts(unit.file)[1].names)
        read = []
        for f in self._logical:
            p = cmap.get(f.name, f.name)
            if (wanted is None or f.name in wanted) and f.name not in part and p in file_names:
                read.append(p)
        n = unit.num_rows + unit.deleted
        with self.filesystem.open_input_file(unit.path) as handle:
            pf = pq.ParquetFile(handle, metadata=self.file_metadata(unit.file),
                                page_checksum_verification=self._scan.page_checksums,
                                coerce_int96_timestamp_unit=INT96_UNIT)
            got = pf.read_row_group(unit.row_group, columns=read, use_threads=False) if read else None
        arrays = []
        for f in self._logical:
            p = cmap.get(f.name, f.name)
            if f.name in part or (p is None and f.name in unit.partition):
                v = unit.partition.get(f.name)
                arrays.append(pa.nulls(n, f.type) if v is None else pa.repeat(pa.scalar(v, f.type), n))
            elif got is not None and p in read:
                arrays.append(self.conform_column(unit.file, f.name, got.column(p), f.type))
            else:
                arrays.append(pa.nulls(n, f.type))
        table = pa.Table.from_arrays(arrays, schema=self._logical)
        mask = self.keep_mask(unit, n)
        return table if mask is None else table.filter(mask)

    # -- identity ------------------------------------------------------------------
    def fingerprint(self) -> str:
        """Changes with the table's snapshot (one that only deletes rows keeps the same
        files), the files, the rows deleted from them and how columns map to them."""
        h = hashlib.sha256(self._fingerprint_head().encode())
        h.update(super().fingerprint().encode())
        for d in self._file_deleted:
            h.update(b"-" if d is None else hashlib.sha256(np.ascontiguousarray(d, np.int64).tobytes()).digest())
        h.update(repr(sorted(self.column_renames.items())).encode())
        return h.hexdigest()[:32]

    def _fingerprint_head(self) -> str:  # pragma: no cover - abstract
        """What names the table and its snapshot, first in the fingerprint."""
        raise NotImplementedError

    # -- snapshots (source/base.py; formats/loader_state/v3 ``sources``) ----------------
    # A table snapshot is immutable and named by the table and its version / snapshot id;
    # it is opened again through the table's log / metadata (deletes and column maps with
    # it), never as a plain list of its Parquet files.
    #: the ``table`` field that names the snapshot (Delta: ``version``, Iceberg: ``snapshot_id``)
    snapshot_field = ""

    @property
    def snapshot_id(self) -> str:
        """``<format>:<table uri>@<version key>`` (``delta:s3://b/t@v12``, ``iceberg:/t@s1234``)."""
        return f"{self.table['format']}:{self.table['uri']}@{self._version_key(self.table.get(self.snapshot_field))}"

    @staticmethod
    def _version_key(value) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def snapshot(self) -> dict:
        return {"snapshot_id": self.snapshot_id, "table": dict(self.table),
                "files": self.num_files, "deleted_rows": self.deleted_total}

    def state_snapshot(self) -> dict:
        return {"snapshot": self.snapshot_id, "table": dict(self.table)}

    def reads_as(self, doc) -> bool:
        """The snapshot ``doc`` read the same way: an Iceberg schema change makes no snapshot,
        so the current table may read the state's snapshot with another schema
        (``table["schema_id"]``)."""
        return doc.get("snapshot") == self.snapshot_id and doc.get("table", self.table) == self.table

    def at_snapshot(self, doc) -> "TableFileSource":
        """The same table at the state's snapshot (``doc["table"]``), opened through the
        table's log / metadata with this source's storage options: ``LookupError`` for another
        table, ``SnapshotChangedError`` naming the table when that snapshot is gone."""
        from ..errors import ArrowloadError, SnapshotChangedError
        if self.reads_as(doc):
            return self
        fmt, uri = self.table["format"], self.table["uri"]
        t = doc.get("table")
        if not isinstance(t, dict) or t.get("format") != fmt:
            raise LookupError(f"the state was taken on {doc.get('snapshot')!r}, not on a snapshot of "
                              f"{fmt} table {uri}")
        if t.get("uri") != uri:
            raise LookupError(f"the state was taken on {fmt} table {t.get('uri')!r}; this dataset reads "
                              f"{fmt} table {uri!r}")
        value = t.get(self.snapshot_field)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise LookupError(f"the state's {fmt} {self.snapshot_field} is {value!r}, not one")
        try:
            return self._open_at(value, t)
        except ArrowloadError as exc:  # the snapshot is gone (log / metadata cleaned up, expired)
            raise SnapshotChangedError(f"{fmt} table {uri} no longer has {self.snapshot_field} {value}, which the "
                                       f"loader state was taken on ({exc}); resume from a newer state, or start "
                                       "the epoch again", uri) from exc

    def _gone(self, path: str, exc: BaseException) -> Exception:
        """A data file of this snapshot no longer there: the snapshot's files were cleaned
        up (a Delta ``vacuum``, Iceberg's snapshot expiry) while its log / metadata stayed."""
        from ..errors import SnapshotChangedError
        return SnapshotChangedError(f"{self._at()} lists {path!r}, which is gone ({exc}): "
                                    f"{self._changed_advice()}", path)

    def _changed_advice(self) -> str:
        """What to do about this snapshot's data files changed or removed (``_gone``, and
        ``FileSource._verify_listed`` finding them changed since the snapshot was opened)."""
        return (f"the data files of {self._at()} were cleaned up or rewritten (vacuum, snapshot expiry); "
                "read a newer snapshot, or resume from a newer state")

    def _at(self) -> str:
        return f"{self.table['format']} table {self.table['uri']} at {self.snapshot_field} " \
               f"{self.table.get(self.snapshot_field)}"

    def __getstate__(self):
        state = super().__getstate__()
        # how to reopen the table (a pyiceberg Table, storage options with credentials) stays
        # in this process: a copy elsewhere (a DataLoader worker) reads its snapshot only
        state.pop("_reopen", None)
        return state

    def _open_at(self, value: int, doc: dict | None = None) -> "TableFileSource":  # pragma: no cover - abstract
        """This table at another version / snapshot (``doc``: the state's ``table``, which
        may say more of how it was read)."""
        raise NotImplementedError

    def pin(self) -> "TableFileSource":
        """A table snapshot is pinned by being one: itself."""
        return self

    def manifest(self) -> dict:
        from ..errors import UnsupportedError
        raise UnsupportedError(f"{self.display} is a table snapshot, which pins itself: reopen it with "
                               f"{self.reopen_hint()} (a file manifest would lose its deletes and column maps)")

    def reopen_hint(self) -> str:  # pragma: no cover - abstract
        raise NotImplementedError
