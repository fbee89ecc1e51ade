"""What every source offers the planner: a schema, readable units with footer facts,
and a pyarrow dataset over any subset of those units."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import pyarrow as pa
import pyarrow.dataset as ds

from .schema import widen


@dataclass(frozen=True)
class Unit:
    """The smallest piece a scan can read on its own.

    A Parquet row group, a whole Arrow IPC / CSV / JSON file, or a slice of an in-memory
    table. ``num_rows`` is exact where the format's metadata says it (Parquet, IPC,
    memory) and None otherwise; ``column_bytes`` holds compressed bytes per top-level
    column from the footer (None where the format has no such metadata).

    ``deleted``: rows of the unit a table's deletion vector removes (Delta Lake). They are
    not in ``num_rows``, which counts the rows a read returns; the unit's physical rows
    (what its footer says, what a decoder slices by) are ``num_rows + deleted``.
    """

    index: int
    file: int
    path: str
    row_group: int | None
    num_rows: int | None
    column_bytes: Mapping[str, int] | None = None
    partition: Mapping[str, object] = field(default_factory=dict)
    deleted: int = 0

    def bytes_for(self, columns: Sequence[str] | None) -> int | None:
        if self.column_bytes is None or not getattr(self.column_bytes, "known", True):
            return None  # no sizes in the format, or a footer whose column metadata is unreadable
        if "*" in self.column_bytes:  # a format read whole, whatever the projection
            return self.column_bytes["*"]
        if columns is None:
            return sum(self.column_bytes.values())
        get = self.column_bytes.get
        return sum(get(c, 0) for c in columns)


class Source:
    """Base of the sources a Scan reads. Subclasses are immutable once discovered;
    footer facts are fetched lazily, once, and cached (thread-safe)."""

    kind: str = ""
    # a lake table's identity ({"format", "uri", "version"}), None for plain files
    table: Mapping[str, object] | None = None
    # logical column -> its name in the files, where they differ (Delta column mapping);
    # per file: ``file_columns(file)``
    column_renames: Mapping[str, str] = MappingProxyType({})
    # True when reads rename columns or drop deleted rows: ``dataset()`` then reads the
    # units it is given into memory, and streaming scans go unit by unit
    rewrites_rows: bool = False
    has_deletions: bool = False

    @property
    def display(self) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def schema(self) -> pa.Schema:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def partition_schema(self) -> pa.Schema:
        return pa.schema([])

    def units(self) -> tuple[Unit, ...]:  # pragma: no cover - abstract
        raise NotImplementedError

    def dataset(self, units: Sequence[int] | None, *, statistics: bool = True,
                columns: Sequence[str] | None = None) -> ds.Dataset:  # pragma: no cover
        """A pyarrow dataset reading exactly ``units`` (all when None), in order.
        ``statistics=False``: the caller neither filters nor prunes with it (a plain read).
        ``columns``: the only columns the caller reads (a hint; None: any)."""
        raise NotImplementedError

    def dataset_reads_as(self, scan) -> bool:
        """Whether ``dataset()`` reads as a scan with the options ``scan`` (an
        ``al.ScanOptions``) would: a source whose datasets were built under other settings
        (page checksums) must be read through arrowload's scan instead."""
        return True

    def statistics_dataset(self, units: Sequence[int] | None, *, statistics: bool = True) -> ds.Dataset:
        """A dataset whose fragments carry the units' footers and partition guarantees, for
        pruning and statistics-decided counts; reading it need not give the rows (a source
        that renames columns or deletes rows reads them through ``dataset()``)."""
        return self.dataset(units, statistics=statistics)

    @property
    def has_statistics(self) -> bool:
        return False

    def file_columns(self, file: int) -> Mapping[str, str | None]:
        """How file ``file`` stores the source's columns, where not under their own name:
        logical column -> its name in that file, or None where the file does not hold the
        column although it may have a column of that name (an Iceberg column dropped and
        added again: the file's column is the old one) or the column's value is a
        partition value (``Unit.partition``). Columns not in the map are stored under
        their own name, or missing (nulls). Default: ``column_renames``, the same for
        every file (Delta column mapping); Iceberg maps each file by field id."""
        return self.column_renames

    def conform_column(self, file: int, name: str, column, type: pa.DataType):
        """File ``file``'s column for source column ``name`` (an Array or ChunkedArray, as
        read, under its name in the file) as ``type``, the source's: ``widen``. Iceberg
        also maps the fields inside a nested column by field id."""
        return widen(column, type)

    def prefetch_checks(self, files) -> None:
        """Read ahead, side by side, what checking ``files``' footers will read one by one
        (an object store's Parquet footers: ``FileSource``); nothing for other sources."""

    def check_read(self, files) -> None:
        """After rows of ``files`` were read: raise ``SnapshotChangedError`` where one was
        rewritten since it was listed (``FileSource`` on local disk); nothing elsewhere."""

    @property
    def num_files(self) -> int:
        return len({u.file for u in self.units()})

    @property
    def is_local(self) -> bool:
        """True when reads are local (memory, local disk): global shuffle is cheap there."""
        return True

    def fingerprint(self) -> str:  # pragma: no cover - abstract
        """A digest of the data snapshot: changes when any file is added, removed, resized
        or rewritten (file sources: paths, sizes, modification times)."""
        raise NotImplementedError

    # -- snapshots (formats/snapshot_manifest, formats/loader_state/v3) ------------------
    # A table source (a Delta or Iceberg table at a version) overrides these: its id names
    # the table version ("delta:<uri>@v<N>"), its state form records what reopens that
    # version, and at_snapshot() opens it.

    @property
    def snapshot_id(self) -> str:
        """The data snapshot this source reads, as a short string: ``<kind>:`` and a digest
        of the data's identity (in-memory data: :meth:`fingerprint`)."""
        return f"{self.kind}:{self.fingerprint()}"

    def snapshot(self) -> dict:
        """What the snapshot is, as plain JSON data (file sources: the files with sizes,
        modification times, identities and the rows known so far)."""
        return {"snapshot_id": self.snapshot_id, "kind": self.kind}

    def state_snapshot(self) -> dict:
        """The snapshot as a loader state carries it: at least ``{"snapshot": id}``, plus
        what :meth:`at_snapshot` needs to read that snapshot again."""
        return {"snapshot": self.snapshot_id}

    def reads_as(self, doc: Mapping) -> bool:
        """Whether this source reads the snapshot ``doc`` (a :meth:`state_snapshot`) as it
        was read then: :meth:`at_snapshot` gives itself."""
        return doc.get("snapshot") == self.snapshot_id

    def at_snapshot(self, doc: Mapping) -> "Source":
        """This source as it was at the snapshot ``doc`` (a :meth:`state_snapshot` of the
        same data, possibly older): itself when it is that snapshot, else a source bound to
        it. Raises ``LookupError`` with the reason when this source cannot go back to it
        (the loader reports it as a state mismatch), ``SnapshotChangedError`` naming the
        file when the snapshot's data is no longer there."""
        if self.reads_as(doc):
            return self
        raise LookupError(f"{self.display} holds other data than the state's snapshot "
                          f"{doc.get('snapshot')!r} and cannot reopen it (in-memory data is not kept)")

    def pin(self) -> "Source":
        """This source bound to its current snapshot (file sources: exactly the files listed,
        checked when read). In-memory data is its own snapshot: itself."""
        return self

    def verify(self) -> None:
        """Raise ``SnapshotChangedError`` naming the file when a pinned source's data changed
        (a stat per file); nothing for unpinned sources."""

    def manifest(self) -> dict:
        """The ``formats/snapshot_manifest/v1`` document of this source's snapshot."""
        from ..errors import UnsupportedError
        raise UnsupportedError(f"{self.display} is not a set of files, so it has no snapshot manifest "
                               "(a manifest names files); write the data to Parquet and open that folder, "
                               "or keep the dataset object")

def file_to_source_names(columns: Mapping[str, str | None]) -> dict[str, str]:
    """The inverse of a ``file_columns`` map: a file's column name -> the source column it
    holds, where they differ. A column of the file named like a source column that it
    does not hold (the source column is renamed away or not in the file) maps to ``""``,
    no source column, so that its footer facts are never taken for that column's."""
    out = {p: c for c, p in columns.items() if p is not None}
    for c, p in columns.items():
        if p != c:
            out.setdefault(c, "")
    return out
