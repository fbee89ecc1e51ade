"""Delta Lake tables read at a pinned version, through arrowload's own Parquet path.

``open_delta(uri, version=, timestamp=)`` asks ``deltalake`` (imported here, lazily) for
what the version holds: the live files with their sizes and partition values
(``get_add_actions(flatten=True)``), the table's schema, its protocol, and the rows each
file's deletion vector removes (``deletion_vectors()``). Nothing else of deltalake is
used: the rows are read by arrowload's scans (pruning, fast decoders, loader), never by
``to_pyarrow_dataset()``, which returns every value null on a column-mapped table and
refuses tables with deletion vectors.

The result is a :class:`DeltaSource`: a :class:`~arrowload.source.tablefiles.TableFileSource`
over exactly the live files (no listing: sizes come from the log) whose

- ``schema`` is the table's logical schema at that version (a column added later reads
  as nulls in older files; partition columns typed from the table schema);
- ``column_renames`` maps a logical column to its physical name in the files (column
  mapping, ``name`` and ``id`` modes: ``delta.columnMapping.physicalName``); inside a
  nested column a struct's fields are found by physical name too, at every level
  (``conform_column``: a field renamed since a file was written keeps its physical name,
  one added later reads as nulls);
- units count live rows: ``Unit.num_rows`` leaves out the rows a deletion vector removes
  (``Unit.deleted``), so ``len()``, sharding, resume and ``count()`` are exact, and every
  read drops those rows (``deleted_rows(unit)``) right after decoding.

Reader features other than those handled here raise
:class:`~arrowload.errors.UnsupportedTableFeatureError` naming the feature.
"""

from __future__ import annotations

import datetime as dt
import json
import posixpath
import urllib.parse
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from ..errors import (ArrowloadError, CorruptFileError, InvalidArgumentError, MissingDependencyError, PathNotFoundError,
                      UnsupportedTableFeatureError)
from ..options import ScanOptions
from .filesystem import filesystem_for, protocol_of, storage_error
from .tablefiles import TableFile, TableFileSource, plural
from .schema import children, remap_nested

# reader features arrowload reads correctly (PROTOCOL.md, "Valid Feature Names")
SUPPORTED_READER_FEATURES = frozenset({
    "columnMapping",        # physical -> logical names (column_renames)
    "deletionVectors",      # rows removed per file (Unit.deleted, deleted_rows)
    "timestampNtz",         # timestamps without time zone: pyarrow reads them as such
    "v2Checkpoint",         # how the log is stored: deltalake lists the files
    "vacuumProtocolCheck",  # a rule for vacuum, nothing for readers
    "typeWidening",         # older files in narrower types: cast to the table's on read
})
#: reader features that only matter where the schema holds their type: a table without
#: such a column reads as any other (deltalake 1.6 names ``variantType`` in every table it
#: writes with deletion vectors)
TYPE_READER_FEATURES = {"variantType": "variant"}
MAX_READER_VERSION = 3
_PHYSICAL = "delta.columnMapping.physicalName"
_MODE = "delta.columnMapping.mode"

# fsspec (s3fs) storage_options -> delta-rs object_store options
_S3_KEYS = {"key": "AWS_ACCESS_KEY_ID", "secret": "AWS_SECRET_ACCESS_KEY", "token": "AWS_SESSION_TOKEN",
            "endpoint_url": "AWS_ENDPOINT_URL"}


def _deltalake():
    try:
        import deltalake
    except ImportError as exc:  # pragma: no cover - a dev / lake extra dependency
        raise MissingDependencyError("al.delta() needs the deltalake package: pip install deltalake") from exc
    return deltalake


def delta_storage_options(uri: str, storage_options: dict | None) -> tuple[dict | None, dict | None]:
    """``(fsspec options, deltalake options)`` from the user's ``storage_options``: s3fs
    style keys (``key``, ``secret``, ``token``, ``endpoint_url``, ``client_kwargs.region_name``)
    serve both, translated for delta-rs; upper-case ``AWS_*`` / ``AZURE_*`` / ``GOOGLE_*``
    keys are delta-rs options only."""
    if not storage_options:
        return None, None
    fs_opts, delta_opts = {}, {}
    for k, v in storage_options.items():
        if k.isupper():
            delta_opts[k] = str(v)
            continue
        fs_opts[k] = v
        if protocol_of(uri) in ("s3", "s3a") and k in _S3_KEYS and v is not None:
            delta_opts[_S3_KEYS[k]] = str(v)
            if k == "endpoint_url" and str(v).startswith("http://"):
                delta_opts["AWS_ALLOW_HTTP"] = "true"
        if k == "client_kwargs" and isinstance(v, dict) and v.get("region_name"):
            delta_opts["AWS_REGION"] = str(v["region_name"])
    if "AWS_ENDPOINT_URL" in delta_opts:
        delta_opts.setdefault("AWS_REGION", "us-east-1")
    return fs_opts or None, delta_opts or None


def _check_protocol(table, uri: str) -> None:
    proto = table.protocol()
    if proto.min_reader_version > MAX_READER_VERSION:
        raise UnsupportedTableFeatureError(
            f"delta table {uri!r} needs reader version {proto.min_reader_version}; arrowload reads "
            f"versions up to {MAX_READER_VERSION}: read it with an engine that supports it, or "
            "downgrade the table's protocol", feature=f"minReaderVersion {proto.min_reader_version}")
    types = None
    for feature in proto.reader_features or ():
        if feature in TYPE_READER_FEATURES:
            types = _schema_types(table) if types is None else types
            if TYPE_READER_FEATURES[feature] not in types:
                continue
        if feature not in SUPPORTED_READER_FEATURES:
            raise UnsupportedTableFeatureError(
                f"delta table {uri!r} uses the reader feature {feature!r}, which arrowload cannot "
                f"honour (it reads {', '.join(sorted(SUPPORTED_READER_FEATURES))}); reading its files "
                "without it could return wrong rows: read the table with an engine that supports "
                f"{feature!r}, or rewrite it without the feature", feature=feature)


def _schema_types(table) -> set[str]:
    """Every type name in the table's schema (``"long"``, ``"variant"``, ...), nested ones
    included; ``{"variant"}`` where the schema cannot be walked (read as holding one)."""
    found: set[str] = set()

    def walk(t) -> None:
        if isinstance(t, str):
            found.add(t)
        elif isinstance(t, dict):
            found.add(str(t.get("type")))
            for f in t.get("fields") or ():
                walk(f.get("type") if isinstance(f, dict) else None)
            for key in ("elementType", "keyType", "valueType"):
                if key in t:
                    walk(t[key])

    try:
        walk(json.loads(table.schema().to_json()))
    except (ValueError, TypeError, AttributeError):
        return {"variant"}
    return found


def _logical_schema(table) -> tuple[pa.Schema, dict[str, str], dict[str, pa.DataType]]:
    """The table schema (no field metadata), ``{logical: physical}`` where they differ, and
    the nested columns whose fields inside are column-mapped as their types with the log's
    field metadata (``delta.columnMapping.physicalName``): their fields are found in the
    files by physical name (``DeltaSource.conform_column``)."""
    schema = pa.schema(table.schema().to_arrow())
    mode = _mapping_mode(table)
    renames: dict[str, str] = {}
    nested: dict[str, pa.DataType] = {}
    fields = []
    for f in schema:
        meta = {k.decode(): v.decode() for k, v in (f.metadata or {}).items()}
        physical = meta.get(_PHYSICAL)
        if mode != "none" and physical and physical != f.name:
            renames[f.name] = physical
        if mode != "none" and _nested_renames(f.type):
            nested[f.name] = f.type
        fields.append(pa.field(f.name, _bare(f.type), f.nullable))
    return pa.schema(fields), renames, nested


def _bare(t: pa.DataType) -> pa.DataType:
    """``t`` without the field metadata inside it."""
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _bare(f.type), f.nullable) for f in children(t)])
    if pa.types.is_map(t):
        return pa.map_(pa.field(t.key_field.name, _bare(t.key_type), t.key_field.nullable),
                       pa.field(t.item_field.name, _bare(t.item_type), t.item_field.nullable),
                       t.keys_sorted)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        value = pa.field(t.value_field.name, _bare(t.value_type), t.value_field.nullable)
        if pa.types.is_fixed_size_list(t):
            return pa.list_(value, t.list_size)
        return pa.large_list(value) if pa.types.is_large_list(t) else pa.list_(value)
    return t


def _physical_name(field: pa.Field) -> str:
    """A table field's name in the files: its ``delta.columnMapping.physicalName``."""
    raw = (field.metadata or {}).get(_PHYSICAL.encode())
    return field.name if raw is None else raw.decode()


def _mapping_mode(table) -> str:
    """The column mapping mode in force: the table's ``delta.columnMapping.mode`` where its
    protocol enables the feature (reader version 2, or 3 naming ``columnMapping``), else
    ``"none"``: the files then hold the logical names whatever the configuration says (as
    deltalake writes a table asking for name mapping beside a ``timestampNtz`` column)."""
    mode = (table.metadata().configuration or {}).get(_MODE, "none")
    proto = table.protocol()
    if proto.min_reader_version < 2 or (proto.min_reader_version >= 3 and
                                        "columnMapping" not in (proto.reader_features or ())):
        return "none"
    return mode


def _nested_renames(t: pa.DataType) -> bool:
    if pa.types.is_struct(t):
        for i in range(t.num_fields):
            f = t.field(i)
            phys = (f.metadata or {}).get(_PHYSICAL.encode())
            if (phys is not None and phys.decode() != f.name) or _nested_renames(f.type):
                return True
        return False
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _nested_renames(t.value_type)
    if pa.types.is_map(t):
        return _nested_renames(t.key_type) or _nested_renames(t.item_type)
    return False


def _deleted_by_path(table, root_uri: str) -> dict[str, np.ndarray]:
    """``{path relative to the table: sorted deleted row positions}`` for every live file
    with a deletion vector (deltalake decodes them)."""
    get = getattr(table, "deletion_vectors", None)
    if get is None:  # pragma: no cover - deltalake before 1.x
        raise UnsupportedTableFeatureError(
            "this deltalake version cannot decode deletion vectors; pip install -U deltalake",
            feature="deletionVectors")
    root = urllib.parse.unquote(root_uri.rstrip("/"))
    out: dict[str, np.ndarray] = {}
    for batch in get():
        rb = pa.record_batch(batch)
        paths = rb.column("filepath").to_pylist()
        vectors = rb.column("selection_vector")
        for i, path in enumerate(paths):
            keep = vectors[i].values.to_numpy(zero_copy_only=False)
            rel = urllib.parse.unquote(path)
            rel = rel[len(root):].lstrip("/") if rel.startswith(root) else rel
            out[rel] = np.flatnonzero(~keep.astype(bool)).astype(np.int64)
    return out


def _partition_value(value: Any, t: pa.DataType) -> Any:
    if value is None:
        return None
    try:
        return pa.scalar(value).cast(t).as_py()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return pa.scalar(str(value)).cast(t).as_py()


def _logged(fs, root: str, version: int) -> bool:
    """Whether the table's log holds an entry or a checkpoint of ``version`` (it exists,
    whatever made it fail to open)."""
    log = f"{root.rstrip('/')}/_delta_log/{version:020d}"
    try:
        infos = fs.get_file_info([f"{log}.json", f"{log}.checkpoint.parquet"])
    except Exception:  # noqa: BLE001 - the store cannot say: not known to exist
        return False
    return any(i.type != pafs.FileType.NotFound for i in infos)


def _opens(deltalake, table_uri: str, delta_opts) -> bool:
    """Whether the table's latest version opens (a version not found is then gone from
    its log, not a table missing)."""
    try:
        deltalake.DeltaTable(table_uri, storage_options=delta_opts)
    except Exception:  # noqa: BLE001 - any failure: say what the first error said
        return False
    return True


def open_delta(uri: str, *, version: int | None = None, timestamp: Any = None,
               storage_options: dict | None = None, scan_options: ScanOptions | None = None) -> "DeltaSource":
    """The Delta table at ``uri`` at ``version`` / ``timestamp`` (latest when both are None)
    as a :class:`DeltaSource` (reads the log now, footers on first need)."""
    if version is not None and timestamp is not None:
        raise InvalidArgumentError("al.delta() takes version= or timestamp=, not both")
    if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 0):
        raise InvalidArgumentError(f"al.delta(version=...) takes a table version (an int >= 0), got {version!r}")
    deltalake = _deltalake()
    fs_opts, delta_opts = delta_storage_options(uri, storage_options)
    fs, root = filesystem_for(uri, fs_opts)
    table_uri = root if isinstance(fs, pafs.LocalFileSystem) else uri.rstrip("/")
    try:
        table = deltalake.DeltaTable(table_uri, version=version, storage_options=delta_opts)
        if timestamp is not None:
            _load_at(table, timestamp, uri)
    except ArrowloadError:  # ours (_load_at's, a feature refused): as it is
        raise
    except Exception as exc:  # noqa: BLE001 - deltalake's errors are not OSErrors
        name = type(exc).__name__
        if name == "TableNotFoundError" and version is not None and _opens(deltalake, table_uri, delta_opts):
            raise InvalidArgumentError(f"delta table {uri!r} has no version {version} any more: its log entries "
                                       f"were cleaned up ({exc}); see deltalake.DeltaTable(uri).history() for "
                                       "the versions kept") from exc
        if name == "TableNotFoundError":
            raise PathNotFoundError(f"no delta table at {uri!r} ({exc}); check the path, or pass "
                                    "storage_options for a remote store", uri) from exc
        typed = storage_error(exc, uri, local=isinstance(fs, pafs.LocalFileSystem))
        if typed is not None:  # credentials, access, endpoint: as al.dataset says them
            raise typed from exc
        if version is not None and not _logged(fs, root, version):
            raise InvalidArgumentError(f"delta table {uri!r} has no version {version} ({exc}); see "
                                       "deltalake.DeltaTable(uri).history() for its versions") from exc
        at = f" at version {version}" if version is not None else ""
        raise CorruptFileError(f"cannot open the delta table {uri!r}{at}: deltalake {deltalake.__version__} "
                               f"refuses its log ({name}: {exc}); the log is damaged, or written by a writer "
                               "this deltalake does not read: check it with deltalake.DeltaTable(uri), or "
                               "upgrade deltalake", f"{uri.rstrip('/')}/_delta_log") from exc
    _check_protocol(table, uri)
    schema, renames, nested = _logical_schema(table)
    partition_cols = list(table.metadata().partition_columns or [])
    actions = pa.table(table.get_add_actions(flatten=True))
    deleted = _deleted_by_path(table, str(table.table_uri)) if "deletionVectors" in \
        (table.protocol().reader_features or ()) else {}
    rels = [urllib.parse.unquote(p) for p in actions.column("path").to_pylist()]
    sizes = actions.column("size_bytes").to_pylist()
    files = []
    for i, rel in enumerate(rels):
        if protocol_of(rel) is not None:  # an absolute URI (shallow clones)
            path = filesystem_for(rel, fs_opts)[1]
        else:
            path = posixpath.join(root.rstrip("/"), rel)
        values = {}
        for c in partition_cols:
            col = f"partition.{c}"
            raw = actions.column(col)[i].as_py() if col in actions.column_names else None
            values[c] = _partition_value(raw, schema.field(c).type)
        files.append(TableFile(path, sizes[i], values, deleted.get(rel)))
    src = DeltaSource(fs, root, files, schema=schema, partition_columns=partition_cols, renames=renames,
                      nested=nested,
                      table={"format": "delta", "uri": root if isinstance(fs, pafs.LocalFileSystem) else
                             uri.rstrip("/"), "version": int(table.version())},  # one spelling per table
                      scan_options=scan_options)
    # how to open another version of the same table (at_snapshot); never saved in a state
    src._reopen = (uri, storage_options, scan_options)
    return src


def _load_at(table, timestamp: Any, uri: str) -> None:
    if isinstance(timestamp, dt.datetime) and timestamp.tzinfo is None:
        timestamp = timestamp.replace(tzinfo=dt.timezone.utc)
    if not isinstance(timestamp, (dt.datetime, str)):
        raise InvalidArgumentError(f"al.delta(timestamp=...) takes a datetime or an ISO 8601 string, "
                                   f"got {type(timestamp).__name__}")
    when = timestamp if isinstance(timestamp, dt.datetime) else \
        dt.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    history = table.history()
    first = min((h["timestamp"] for h in history if "timestamp" in h), default=None)
    if first is not None and when.timestamp() * 1000 < first and min(h["version"] for h in history) == 0:
        raise InvalidArgumentError(f"delta table {uri!r} did not exist at {when.isoformat()} (its first "
                                   f"commit is at {dt.datetime.fromtimestamp(first / 1000, dt.timezone.utc).isoformat()}); "
                                   "pass a later timestamp")
    table.load_as_version(timestamp)


class DeltaSource(TableFileSource):
    """The live Parquet files of one Delta table version (see the module doc).

    ``table``: ``{"format": "delta", "uri", "version"}``; ``column_renames``: logical ->
    physical column names; ``deleted_rows(unit)``: the positions (within its row group) a
    deletion vector removes, or None.
    """

    def __init__(self, filesystem: pafs.FileSystem, root: str, files: Sequence[TableFile], *, schema: pa.Schema,
                 partition_columns: Sequence[str], renames: dict[str, str], table: dict,
                 scan_options: ScanOptions | None = None, nested: dict[str, pa.DataType] | None = None) -> None:
        deleted = sum(len(f.deleted) for f in files if f.deleted is not None)
        display = (f"delta table {table['uri']} version {table['version']} ({plural(len(files), 'file')}, "
                   f"{plural(deleted, 'deleted row')})")
        nested = dict(nested or {})
        # a nested column whose own physical name is its name (a table given column mapping
        # after it had data) maps to itself: every read of it then passes conform_column,
        # as every read of a renamed column does, never a decoder reading fields by name
        renames = {**{c: c for c in nested}, **renames}
        super().__init__(filesystem, root, files, schema=schema, partition_columns=partition_columns,
                         table=table, display=display, renames=renames, scan_options=scan_options)
        self._nested = nested  # nested column -> its type with physical names inside

    def conform_column(self, file: int, name: str, column, type: pa.DataType):
        keyed = self._nested.get(name)
        if keyed is None:
            return super().conform_column(file, name, column, type)
        # column mapping inside a nested column: a struct's fields by physical name
        return remap_nested(column, column.type, keyed, type, lambda f: f.name, _physical_name)

    def snapshot_label(self) -> str:
        return f"version {self.table['version']}"

    def _fingerprint_head(self) -> str:
        return f"delta\n{self.table['uri']}\n{self.table['version']}\n"

    snapshot_field = "version"

    @staticmethod
    def _version_key(value) -> str:
        return f"v{value}"

    def _open_at(self, value: int, doc: dict | None = None) -> "DeltaSource":
        uri, storage_options, scan_options = getattr(self, "_reopen", (self.table["uri"], None, None))
        return open_delta(uri, version=value, storage_options=storage_options, scan_options=scan_options)

    def reopen_hint(self) -> str:
        return f"al.delta({self.table['uri']!r}, version={self.table['version']})"
