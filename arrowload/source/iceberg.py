"""Apache Iceberg tables read at a pinned snapshot, through arrowload's own Parquet path.

``open_iceberg(table, snapshot_id=)`` asks ``pyiceberg`` (imported here, lazily) for what
the snapshot holds: ``table.scan(snapshot_id=...).plan_files()`` gives the live data
files with their sizes, partitions and the delete files that apply to each, and
``scan.projection()`` the snapshot's schema (the current table reads with the table's
current schema, as pyiceberg does). The rows are read by arrowload's scans
(pruning on footers, fast decoders, loader), never by pyiceberg's ``to_arrow()``.

The result is an :class:`IcebergSource`, a
:class:`~arrowload.source.tablefiles.TableFileSource` whose

- ``schema`` is the table's current schema for the current snapshot (a column renamed or
  added since the last snapshot is there, as pyiceberg and Spark read it), else the
  snapshot's own (time travel); ``table["schema_id"]`` names the schema where it is not
  the snapshot's, so a loader state reopens its snapshot as it was read;
- columns are found in each file by **field id** (``PARQUET:field_id`` in the file's
  schema), as the Iceberg spec says: a column renamed after a file was written reads
  from that file under its old name; a column the file lacks (added later, or dropped
  and added again with a new id while the file holds the old one) reads as the file's
  identity partition value, else as its ``initial-default`` (read as a constant, as a
  partition value is), else as nulls; ``file_columns(file)`` holds each file's map;
- a file written without field ids (one a migration registered with ``add_files``, or
  written by another engine) has its columns given ids by the table's **name mapping**
  (the ``schema.name-mapping.default`` property: each field id with the names a file may
  hold it under), as the spec says; such a file in a table without a name mapping is
  refused (``UnsupportedTableFeatureError``), never read as nulls;
- position deletes (Parquet delete files of ``file_path`` / ``pos``) remove rows per
  file (``Unit.deleted``), so ``count()``, ``len(loader)``, sharding and resume are exact.

Inside a nested column the same holds at every level: a struct's fields, a list's
element and a map's key and value are found by field id (``schema.remap_nested``), so fields
renamed, moved, widened or added since a file was written read as pyiceberg reads them.
Such a file reads through ``conform_column`` (its ``file_columns`` entry names the
column, so the decoders that read files as they are pass it by).

Equality deletes, deletion vectors (format v3, Puffin files) and a nested column whose
fields changed in a file whose nested fields have no field ids raise
:class:`~arrowload.errors.UnsupportedTableFeatureError` naming the feature and the file:
reading without them would return deleted or wrong rows.
"""

from __future__ import annotations

import json
import os
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.types as pat

from ..errors import (ArgumentTypeError, CorruptFileError, InvalidArgumentError, MissingDependencyError,
                      PathNotFoundError, UnsupportedTableFeatureError)
from ..options import ScanOptions
from .filesystem import canonical_local_path, filesystem_for, protocol_of
from .schema import children, remap_nested
from .tablefiles import TableFile, TableFileSource, plural

FIELD_ID = b"PARQUET:field_id"

# fsspec (s3fs) storage_options <-> pyiceberg FileIO properties
_S3_KEYS = {"key": "s3.access-key-id", "secret": "s3.secret-access-key", "token": "s3.session-token",
            "endpoint_url": "s3.endpoint"}


def _pyiceberg():
    try:
        import pyiceberg.table
    except ImportError as exc:  # pragma: no cover - a dev / lake extra dependency
        raise MissingDependencyError("al.iceberg() needs the pyiceberg package: pip install pyiceberg") from exc
    return pyiceberg.table


def iceberg_properties(storage_options: Mapping | None) -> dict[str, str]:
    """pyiceberg FileIO properties from s3fs-style ``storage_options`` (``key``,
    ``secret``, ``token``, ``endpoint_url``, ``client_kwargs.region_name``); keys with a
    dot (``s3.endpoint``) pass as they are."""
    out: dict[str, str] = {}
    for k, v in (storage_options or {}).items():
        if k in _S3_KEYS and v is not None:
            out[_S3_KEYS[k]] = str(v)
        elif k == "client_kwargs" and isinstance(v, dict) and v.get("region_name"):
            out["s3.region"] = str(v["region_name"])
        elif "." in k:
            out[k] = str(v)
    if "s3.endpoint" in out:
        out.setdefault("s3.region", "us-east-1")
    return out


def fsspec_options(properties: Mapping[str, str], uri: str) -> dict | None:
    """s3fs ``storage_options`` from a pyiceberg table's FileIO properties (so that a
    catalog's credentials and endpoint serve arrowload's reads too)."""
    if protocol_of(uri) not in ("s3", "s3a"):
        return None
    back = {v: k for k, v in _S3_KEYS.items()}
    out: dict[str, Any] = {back[k]: v for k, v in properties.items() if k in back}
    if properties.get("s3.region"):
        out["client_kwargs"] = {"region_name": properties["s3.region"]}
    return out or None


def _plain(t: pa.DataType) -> pa.DataType:
    """``t`` with large strings / binaries / lists as their 32-bit offset kinds (what
    pyarrow reads from Parquet; pyiceberg's schemas use the large ones)."""
    if pat.is_large_string(t):
        return pa.string()
    if pat.is_large_binary(t):
        return pa.binary()
    if pat.is_large_list(t) or pat.is_list(t):
        return pa.list_(t.value_field.with_type(_plain(t.value_type)).remove_metadata())
    if pat.is_fixed_size_list(t):
        return pa.list_(t.value_field.with_type(_plain(t.value_type)).remove_metadata(), t.list_size)
    if pat.is_map(t):
        return pa.map_(t.key_field.with_type(_plain(t.key_type)).remove_metadata(),
                       t.item_field.with_type(_plain(t.item_type)).remove_metadata())
    if pat.is_struct(t):
        return pa.struct([t.field(i).with_type(_plain(t.field(i).type)).remove_metadata()
                          for i in range(t.num_fields)])
    return t


def _logical_schema(schema) -> tuple[pa.Schema, list[tuple[str, int]]]:
    """The snapshot schema as Arrow (every column nullable, no field ids) and its
    top-level ``(name, field id)`` pairs."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow
    arrow = schema_to_pyarrow(schema, include_field_ids=False)
    fields = [pa.field(f.name, _plain(f.type)) for f in arrow]
    return pa.schema(fields), [(f.name, f.field_id) for f in schema.fields]


def _nested_ids(schema) -> dict[str, pa.DataType]:
    """The snapshot schema's nested top-level columns as Arrow types whose fields carry
    their Iceberg field ids (``PARQUET:field_id``): what a file's nested fields are found
    by (``schema.remap_nested``)."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow
    arrow = schema_to_pyarrow(schema, include_field_ids=True)
    return {f.name: f.type for f in arrow if pat.is_nested(f.type)}


def _initial_defaults(schema) -> dict[int, Any]:
    """``{field id: value}`` of the schema's fields (nested ones included) that have an
    ``initial-default``: the value a data file written before the field was added holds
    for it (the spec's column projection: after an identity partition value, before null)."""
    from pyiceberg.types import ListType, MapType, StructType
    out: dict[int, Any] = {}

    def walk(fields) -> None:
        for f in fields:
            if getattr(f, "initial_default", None) is not None:
                out[f.field_id] = f.initial_default
            t = f.field_type
            if isinstance(t, StructType):
                walk(t.fields)
            elif isinstance(t, ListType):
                walk([t.element_field])
            elif isinstance(t, MapType):
                walk([t.key_field, t.value_field])
    walk(schema.fields)
    return out


def _field_id(field: pa.Field) -> int | None:
    raw = (field.metadata or {}).get(FIELD_ID)
    try:
        return None if raw is None else int(raw)
    except ValueError:
        return None


def _kind(t: pa.DataType) -> str:
    if pat.is_struct(t):
        return "struct"
    if pat.is_map(t):
        return "map"
    if pat.is_list(t) or pat.is_large_list(t) or pat.is_fixed_size_list(t):
        return "list"
    return "leaf"


def _same_fields(have: pa.DataType, want: pa.DataType) -> bool:
    """Whether a file's nested type ``have`` holds the same fields, by name and (where the
    file has them) field id, at every level, as the snapshot's ``want`` (with ids): then a
    cast reads it (``widen``); otherwise its fields are found by id (``remap_nested``)."""
    if _kind(have) != _kind(want):
        return False
    ours, theirs = children(have), children(want)
    if len(ours) != len(theirs):
        return False
    for a, b in zip(ours, theirs):
        if pat.is_struct(have) and a.name != b.name:
            return False
        fid = _field_id(a)
        if fid is not None and fid != _field_id(b):
            return False
        if not _same_fields(a.type, b.type):
            return False
    return True


def _ids_inside(t: pa.DataType) -> bool:
    """Whether every field inside a nested type carries a field id."""
    return all(_field_id(f) is not None and _ids_inside(f.type) for f in children(t))


NAME_MAPPING = "schema.name-mapping.default"


def _name_mapping(properties: Mapping[str, str] | None, where: str) -> dict[str, int] | None:
    """The table's name mapping (``schema.name-mapping.default``: a JSON list of
    ``{"field-id": id, "names": [...], "fields": [...]}``) as top-level name -> field id,
    or None where the table has none."""
    raw = (properties or {}).get(NAME_MAPPING)
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
        out: dict[str, int] = {}
        for entry in doc:
            fid = entry.get("field-id")
            if fid is None:  # a name the mapping leaves unmapped: never read by name
                continue
            for name in entry.get("names") or ():
                out[str(name)] = int(fid)
        return out
    except (ValueError, TypeError, AttributeError) as exc:
        raise CorruptFileError(f"iceberg table {where!r}: its {NAME_MAPPING} property is not a valid "
                               f"name mapping ({exc}); fix the property", where) from None


def _partition_value(value: Any, t: pa.DataType) -> Any:
    """An identity partition value (as pyiceberg decodes it from the manifest) in type ``t``."""
    if value is None:
        return None
    try:
        if isinstance(value, int) and not isinstance(value, bool) and (pat.is_temporal(t)):
            base = pa.int32() if pat.is_date32(t) or pat.is_time32(t) else pa.int64()
            return pa.scalar(value, base).cast(t).as_py()
        return pa.scalar(value).cast(t).as_py()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return pa.scalar(str(value)).cast(t).as_py()


def _load_table(table: Any, storage_options: dict | None):
    """A pyiceberg ``Table`` from what the user passed: a Table, or the path / URI of a
    ``*.metadata.json`` (or of a table folder: its newest metadata file)."""
    ptable = _pyiceberg()
    if isinstance(table, ptable.Table):
        return table
    if not isinstance(table, (str, os.PathLike)):
        raise ArgumentTypeError(f"al.iceberg() takes a pyiceberg Table or the path / URI of a table's "
                                f"*.metadata.json, got {type(table).__name__}", "table")
    uri = os.fspath(table)
    if not uri.endswith(".metadata.json"):
        from .lake import newest_iceberg_metadata
        fs, path = filesystem_for(uri, storage_options, listing=True)
        found = newest_iceberg_metadata(fs, path)
        if found is None:
            raise PathNotFoundError(f"{uri!r} is neither an Iceberg *.metadata.json file nor a table folder "
                                    "with metadata/*.metadata.json; pass the metadata file's path, or the "
                                    "table loaded by its catalog (catalog.load_table(...))", uri)
        uri = _rejoin(uri, path, found)
    elif protocol_of(uri) is None:
        uri = canonical_local_path(uri)
    try:
        return ptable.StaticTable.from_metadata(uri, properties=iceberg_properties(storage_options))
    except FileNotFoundError as exc:
        raise PathNotFoundError(f"no Iceberg metadata file at {uri!r} ({exc}); check the path, or pass "
                                "storage_options for a remote store", uri) from exc


def _rejoin(uri: str, stripped: str, found: str) -> str:
    """``found`` (a path on the filesystem ``uri`` was stripped to ``stripped`` for) as a
    URI of the same scheme."""
    proto = protocol_of(uri)
    if proto in (None, "file", "local"):
        return found
    return f"{proto}://{found}"


def _snapshot(table, snapshot_id: int | None, where: str):
    if snapshot_id is None:
        return table.current_snapshot()
    if isinstance(snapshot_id, bool) or not isinstance(snapshot_id, int):
        raise InvalidArgumentError(f"al.iceberg(snapshot_id=...) takes a snapshot id (an int), got "
                                   f"{snapshot_id!r}", "snapshot_id")
    snap = table.snapshot_by_id(snapshot_id)
    if snap is None:
        known = [s.snapshot_id for s in table.snapshots()]
        raise InvalidArgumentError(f"iceberg table {where!r} has no snapshot {snapshot_id}; its snapshots are "
                                   f"{known[-8:]}{' (last 8)' if len(known) > 8 else ''}: see "
                                   "table.snapshots() or table.history()", "snapshot_id")
    return snap


def _plan(scan, table, where: str):
    """``scan.plan_files()``, with equality deletes refused naming the file."""
    try:
        return list(scan.plan_files())
    except ValueError as exc:
        if "equality delete" not in str(exc).lower():
            raise
        path = _equality_delete_file(scan, table)
        raise UnsupportedTableFeatureError(
            f"iceberg table {where!r} at snapshot {scan.snapshot_id} has equality deletes "
            f"({path or 'a delete file'}); arrowload applies position deletes only, and reading the data "
            "files without the equality deletes would return deleted rows: compact the table (rewrite "
            "its data files, e.g. Spark's rewrite_data_files) or read it with an engine that applies "
            "equality deletes", feature="equality deletes") from exc


def _equality_delete_file(scan, table) -> str | None:
    from pyiceberg.manifest import DataFileContent, ManifestContent
    snap = table.snapshot_by_id(scan.snapshot_id) if scan.snapshot_id is not None else table.current_snapshot()
    for manifest in snap.manifests(table.io):
        if manifest.content != ManifestContent.DELETES:
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if entry.data_file.content == DataFileContent.EQUALITY_DELETES:
                return entry.data_file.file_path
    return None


class _Paths:
    """URIs as pyiceberg writes them -> paths on the source's filesystem."""

    def __init__(self, root_uri: str, fs_opts: dict | None) -> None:
        self.fs, self.root = filesystem_for(root_uri, fs_opts)
        self.local = isinstance(self.fs, pafs.LocalFileSystem)

    def __call__(self, uri: str) -> str:
        proto = protocol_of(uri)
        if self.local:
            if proto not in (None, "file", "local"):
                raise InvalidArgumentError(f"iceberg data file {uri!r} is not on the table's local filesystem "
                                           f"({self.root!r}); arrowload reads a table from one filesystem")
            # not unquoted: pyiceberg's FileIO reads the URI's path as it is written
            return canonical_local_path(urllib.parse.urlparse(uri).path if proto == "file" else uri)
        return uri.split("://", 1)[1] if proto is not None else uri


def _position_deletes(fs: pafs.FileSystem, paths: _Paths, delete_file, where: str) -> dict[str, np.ndarray]:
    """``{data file URI: positions}`` of one position delete file (Parquet)."""
    import pyarrow.parquet as pq
    from pyiceberg.manifest import DataFileContent, FileFormat
    if delete_file.content == DataFileContent.EQUALITY_DELETES:
        raise UnsupportedTableFeatureError(
            f"iceberg table {where!r} has equality deletes ({delete_file.file_path}); arrowload applies "
            "position deletes only: compact the table or read it with an engine that applies them",
            feature="equality deletes")
    if delete_file.file_format != FileFormat.PARQUET:
        kind = "deletion vectors" if delete_file.file_format == FileFormat.PUFFIN else \
            f"{delete_file.file_format.name} delete files"
        raise UnsupportedTableFeatureError(
            f"iceberg table {where!r} deletes rows with {kind} ({delete_file.file_path}); arrowload reads "
            "Parquet position delete files only: compact the table, or read it with pyiceberg",
            feature=kind)
    path = paths(delete_file.file_path)
    try:
        with fs.open_input_file(path) as handle:
            got = pq.read_table(handle, columns=["file_path", "pos"])
    except FileNotFoundError as exc:
        raise PathNotFoundError(f"the position delete file {delete_file.file_path!r} of iceberg table "
                                f"{where!r} is missing ({exc}); the table is damaged (a file removed "
                                "outside Iceberg): restore it, or read an older snapshot", path) from exc
    except (pa.ArrowInvalid, KeyError) as exc:
        raise CorruptFileError(f"cannot read the position delete file {delete_file.file_path!r} of iceberg "
                               f"table {where!r} ({exc}); it should be Parquet with columns file_path and "
                               "pos: restore it, or read an older snapshot", path) from exc
    out: dict[str, np.ndarray] = {}
    files = got.column("file_path").to_numpy(zero_copy_only=False)
    pos = got.column("pos").to_numpy(zero_copy_only=False).astype(np.int64)
    for name in np.unique(files):
        out[str(name)] = pos[files == name]
    return out


def open_iceberg(table: Any, *, snapshot_id: int | None = None, storage_options: dict | None = None,
                 scan_options: ScanOptions | None = None, schema_id: int | None = None) -> "IcebergSource":
    """The Iceberg ``table`` (a pyiceberg Table, or a metadata JSON path / URI) at
    ``snapshot_id`` (the current snapshot when None) as an :class:`IcebergSource` (plans
    the snapshot's files and reads its delete files now, footers on first need).

    The current table reads with the table's current schema, as pyiceberg and Spark read
    it (a column renamed or added since the last snapshot is there); an older snapshot
    with its own schema (time travel); ``schema_id``: with that schema (a loader state's
    snapshot reopened as it was read)."""
    table = _load_table(table, storage_options)
    location = table.location()
    fs_opts = storage_options if storage_options is not None else \
        fsspec_options(getattr(table.io, "properties", {}) or {}, location)
    paths = _Paths(location, fs_opts)
    where = paths.root if paths.local else location.rstrip("/")
    snap = _snapshot(table, snapshot_id, where)
    files: list[TableFile] = []
    record_counts: dict[str, int] = {}
    read_with = None
    if snap is None:  # a table without snapshots: no rows, its current schema
        schema = table.schema()
        sid = None
    else:
        sid = snap.snapshot_id
        scan = table.scan(snapshot_id=sid)
        schema = scan.projection()
        want = table.metadata.current_schema_id if snapshot_id is None else schema_id
        if want is not None and want != schema.schema_id:
            schema = table.schemas()[want]
            read_with = want  # a schema other than the snapshot's: part of what names the read
        tasks = _plan(scan, table, where)
        specs = table.metadata.specs()
        arrow = _logical_schema(schema)[0]
        deletes: dict[str, dict[str, np.ndarray]] = {}
        for task in tasks:
            df = task.file
            positions = []
            for d in sorted(task.delete_files, key=lambda d: d.file_path):
                if d.file_path not in deletes:
                    deletes[d.file_path] = _position_deletes(paths.fs, paths, d, where)
                got = deletes[d.file_path].get(df.file_path)
                if got is not None:
                    positions.append(got)
            dels = np.unique(np.concatenate(positions)) if positions else None
            ident = _identity_values(specs.get(df.spec_id), schema, arrow, df.partition)
            path = paths(df.file_path)
            if dels is not None and not len(dels):
                dels = None
            files.append(TableFile(path, df.file_size_in_bytes, ident, dels))
            record_counts[path] = df.record_count
    arrow, ids = _logical_schema(schema)
    table_id = {"format": "iceberg", "uri": where, "snapshot_id": sid}
    if read_with is not None:
        table_id["schema_id"] = read_with
    mapping = _name_mapping(getattr(table.metadata, "properties", None), where)
    src = IcebergSource(paths.fs, paths.root, files, schema=arrow, field_ids=ids, table=table_id,
                        record_counts=record_counts, scan_options=scan_options, name_mapping=mapping,
                        nested_ids=_nested_ids(schema), defaults=_initial_defaults(schema))
    # how to open another snapshot of the same table (at_snapshot); never saved in a state
    src._reopen = (table, storage_options, scan_options)
    return src


def _identity_values(spec, schema, arrow: pa.Schema, partition) -> dict[str, Any]:
    """``{column: value}`` of a data file's identity partition fields (columns of the
    snapshot schema only)."""
    if spec is None or partition is None:
        return {}
    from pyiceberg.transforms import IdentityTransform
    out = {}
    for pos, field in enumerate(spec.fields):
        if not isinstance(field.transform, IdentityTransform):
            continue
        try:
            col = schema.find_field(field.source_id)
        except ValueError:
            continue  # the source column is not in this snapshot's schema
        out[col.name] = _partition_value(partition[pos], arrow.field(col.name).type)
    return out


class IcebergSource(TableFileSource):
    """The live Parquet data files of one Iceberg snapshot (see the module doc).

    ``table``: ``{"format": "iceberg", "uri": <table location>, "snapshot_id"}``;
    ``file_columns(file)``: the file's columns mapped by field id; ``deleted_rows(unit)``:
    the positions (within its row group) position deletes remove, or None.
    """

    def __init__(self, filesystem: pafs.FileSystem, root: str, files: Sequence[TableFile], *,
                 schema: pa.Schema, field_ids: Sequence[tuple[str, int]], table: dict,
                 record_counts: Mapping[str, int], scan_options: ScanOptions | None = None,
                 name_mapping: Mapping[str, int] | None = None,
                 nested_ids: Mapping[str, pa.DataType] | None = None,
                 defaults: Mapping[int, Any] | None = None) -> None:
        deleted = sum(len(f.deleted) for f in files if f.deleted is not None)
        display = (f"iceberg table {table['uri']} snapshot {table['snapshot_id']} ({plural(len(files), 'file')}, "
                   f"{plural(deleted, 'deleted row')})")
        super().__init__(filesystem, root, files, schema=schema, partition_columns=(), table=table,
                         display=display, scan_options=scan_options)
        self._field_ids = tuple(field_ids)
        self._record_counts = dict(record_counts)
        self._name_mapping = None if name_mapping is None else dict(name_mapping)
        self._nested_ids = dict(nested_ids or {})  # nested column -> its type with field ids
        self._defaults = dict(defaults or {})  # field id -> its initial default
        self._nested_maps: dict[int, dict[str, pa.DataType]] = {}  # file -> column -> its footer type

    def snapshot_label(self) -> str:
        return f"snapshot {self.table['snapshot_id']}"

    def _fingerprint_head(self) -> str:
        head = f"iceberg\n{self.table['uri']}\n{self.table['snapshot_id']}\n{self._logical.to_string()}\n"
        if self._name_mapping is not None:  # a table property: it may change without a snapshot
            head += f"name-mapping {sorted(self._name_mapping.items())}\n"
        return head

    snapshot_field = "snapshot_id"

    @staticmethod
    def _version_key(value) -> str:
        return "empty" if value is None else f"s{value}"

    def _open_at(self, value: int, doc: dict | None = None) -> "IcebergSource":
        reopen = getattr(self, "_reopen", None)
        if reopen is None:  # a copy unpickled elsewhere: the metadata file of the table's location
            raise LookupError(f"{self.display} cannot reopen another snapshot in this process; open the "
                              "table here with al.iceberg(table) and load the state into that loader")
        table, storage_options, scan_options = reopen
        return open_iceberg(table, snapshot_id=value, storage_options=storage_options, scan_options=scan_options,
                            schema_id=(doc or {}).get("schema_id"))

    def reopen_hint(self) -> str:
        return f"al.iceberg(<table>, snapshot_id={self.table['snapshot_id']})"

    def _column_map(self, i: int, meta) -> dict[str, str | None]:
        """Logical column -> the file's column of the same field id where its name differs;
        None where the file lacks the field id but has a column of the name (an older
        column, or one written without field ids) or the file's identity partition value
        stands in for it."""
        path = self.entries[i].path
        expected = self._record_counts.get(path)
        if expected is not None and meta.num_rows != expected:
            raise CorruptFileError(f"iceberg data file {path!r} holds {meta.num_rows} rows, but the table's "
                                   f"manifest says {expected}; the file was replaced or damaged: restore it "
                                   "or repair the table", path)
        file_schema = meta.schema.to_arrow_schema()
        by_id: dict[int, pa.Field] = {}
        for f in file_schema:
            raw = (f.metadata or {}).get(FIELD_ID)
            if raw is not None:
                try:
                    by_id[int(raw)] = f
                except ValueError:
                    pass
        if not by_id and len(file_schema):  # written without field ids: the name mapping gives them
            if self._name_mapping is None:
                raise UnsupportedTableFeatureError(
                    f"iceberg table {self.table['uri']!r}: data file {path!r} has no field ids and the table "
                    f"has no name mapping ({NAME_MAPPING}) to find its columns by; set one (pyiceberg: "
                    "table.transaction().set_properties(...)) or rewrite the file with field ids",
                    feature="data files without field ids")
            for f in file_schema:
                fid = self._name_mapping.get(f.name)
                if fid is not None and fid not in by_id:
                    by_id[fid] = f
        names = set(file_schema.names)
        partition = self._partition_values[i]
        out: dict[str, str | None] = {}
        for name, fid in self._field_ids:
            f = by_id.get(fid)
            if f is None:
                if name not in partition and fid in self._defaults:  # added with a default
                    partition[name] = self._defaults[fid]  # read as a constant, as a partition value is
                if name in names or name in partition:
                    out[name] = None
                continue
            if f.name != name:
                out[name] = f.name
            ids = self._nested_ids.get(name)
            if ids is not None and not _same_fields(f.type, ids):
                if not _ids_inside(f.type):
                    raise UnsupportedTableFeatureError(
                        f"iceberg table {self.table['uri']!r}: column {name!r} is nested and its fields in "
                        f"{path!r} ({f.type}) differ from the snapshot schema's "
                        f"({self._logical.field(name).type}), and the file's nested fields carry no field "
                        "ids to map them by: read the table with pyiceberg, or rewrite that file",
                        feature="nested schema evolution")
                # fields inside were renamed, added, dropped or reordered since the file was
                # written: the file reads through conform_column, its fields found by id (remap_nested)
                self._nested_maps.setdefault(i, {})[name] = f.type
                out[name] = f.name
        return out

    def conform_column(self, file: int, name: str, column, type: pa.DataType):
        have = self._nested_maps.get(file, {}).get(name)
        if have is None:
            return super().conform_column(file, name, column, type)
        # a field found by id, as the Iceberg spec reads them: renamed since the file was
        # written, it reads under its new name; added since, as nulls; dropped, left out
        return remap_nested(column, have, self._nested_ids[name], type, _field_id, _field_id, self._default_values)

    def _default_values(self, field: pa.Field, n: int) -> pa.Array | None:
        """A nested field's initial default for ``n`` rows (None: it has none)."""
        value = self._defaults.get(_field_id(field))
        if value is None:
            return None
        return pa.repeat(pa.scalar(value, _plain(field.type)), n)
