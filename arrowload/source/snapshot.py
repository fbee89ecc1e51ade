"""Snapshots of file sources: the manifest document (``formats/snapshot_manifest/v1``), the
compact file list a loader state carries (``formats/loader_state/v3``), the snapshot id,
and the check of files against what a snapshot recorded.

A file snapshot is the list of files a source read: each file's path relative to the
source's root (where hive folders start), size, modification time (nanoseconds, as the
filesystem reports it) and identity (``identity.py``: S3 / Azure ETag, GCS generation,
local inode; None where the filesystem has none), plus the row count where a footer said
it. Its id, ``files:<32 hex digits>``, is a SHA-256 over the format and, per file, the
relative path, size, modification time in milliseconds (fsspec reports float seconds,
pyarrow nanoseconds, for the same file) and identity: it changes when a file is added,
removed, resized or rewritten, and not with how the root was spelled.

Pure functions over plain values; the FileSource (files.py) wires them.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ..errors import CorruptFileError, SnapshotChangedError, UnsupportedError
from .filesystem import FileEntry, files_changed_error  # noqa: F401 - the snapshot's error, said here

MANIFEST_FORMAT = "arrowload.snapshot_manifest"
MANIFEST_VERSION = 1
MANIFEST_FIELDS = ("snapshot_id", "root", "file_format", "partitioning", "schema_digest", "num_rows", "files")
_FILE_FIELDS = ("path", "size", "mtime_ns", "identity", "rows", "partition")
#: how a manifest is recognised when opened (by its header, whatever the file is called):
#: ``save_manifest`` writes ``format`` first; any key order is found in the first 64 KiB
_HEADER = re.compile(rb'"format"\s*:\s*"arrowload\.snapshot_manifest"')
PEEK_BYTES = 1 << 16


@dataclass(frozen=True)
class PinnedFile:
    """One file of a snapshot: ``path`` relative to the root; ``rows`` where known."""

    path: str
    size: int | None
    mtime_ns: int | None
    identity: str | None
    rows: int | None = None


def relative(base: str, path: str) -> str:
    """``path`` relative to the root ``base`` (both as the filesystem spells them)."""
    root = base.rstrip("/")
    if root and path.startswith(root + "/"):
        return path[len(root) + 1:]
    if not root and path.startswith("/"):
        return path[1:]
    return path


def absolute(base: str, rel: str) -> str:
    root = base.rstrip("/")
    return f"{root}/{rel}" if root or base.startswith("/") else rel


def snapshot_id(kind: str, files: Sequence[PinnedFile]) -> str:
    """``files:`` and 32 hex digits naming the file list (see the module docstring)."""
    rows = [[f.path, f.size, f.mtime_ns // 1_000_000 if f.mtime_ns is not None else None, f.identity]
            for f in files]
    text = json.dumps({"format": kind, "files": rows}, separators=(",", ":"), ensure_ascii=True)
    return "files:" + hashlib.sha256(f"{MANIFEST_FORMAT}\n{text}".encode()).hexdigest()[:32]


def schema_digest(schema: pa.Schema) -> str:
    """32 hex digits over the schema's field names, types and nullability (no metadata)."""
    fields = [[f.name, str(f.type), f.nullable] for f in schema]
    return hashlib.sha256(json.dumps(fields, separators=(",", ":")).encode()).hexdigest()[:32]


def json_value(value: Any) -> Any:
    """A partition value as JSON: numbers, strings, booleans and null as they are, the rest
    (dates) as their ISO / string form."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    iso = getattr(value, "isoformat", None)
    return iso() if iso is not None else str(value)


# -- the compact form a loader state carries ------------------------------------------

def compact(sid: str, root: str, kind: str, files: Sequence[PinnedFile]) -> dict:
    """The snapshot as a loader state carries it: one short row per file,
    ``[path, size, mtime_ns, identity, rows]``."""
    return {"snapshot": sid, "root": root, "file_format": kind,
            "files": [[f.path, f.size, f.mtime_ns, f.identity, f.rows] for f in files]}


def files_of_compact(doc: Mapping[str, Any], where: str) -> list[PinnedFile]:
    """The files of a compact snapshot (checked: a damaged one raises ``ValueError`` with
    ``where`` and the row at fault; the loader turns it into a StateMismatchError)."""
    rows = doc.get("files")
    if not isinstance(rows, list):
        raise ValueError(f"{where}.files is not a list")
    out = []
    for i, row in enumerate(rows):
        if not (isinstance(row, list) and len(row) == 5 and isinstance(row[0], str) and row[0] and
                all(v is None or (type(v) is int and v >= 0) for v in (row[1], row[2], row[4])) and
                (row[3] is None or isinstance(row[3], str))):
            raise ValueError(f"{where}.files[{i}] is not [path, size, mtime_ns, identity, rows]: {row!r:.120}")
        out.append(PinnedFile(row[0], row[1], row[2], row[3], row[4]))
    return out


# -- checking files against a snapshot ---------------------------------------------------

def differs(pinned: PinnedFile, now: FileEntry | None) -> str | None:
    """What differs between a pinned file and what the filesystem reports now, in words;
    None when it is the same file (size exact, modification time to the millisecond,
    identity exact where both are known)."""
    if now is None:
        return "is gone"
    if pinned.size is not None and now.size != pinned.size:
        return f"has {now.size} bytes, the snapshot recorded {pinned.size}"
    if pinned.mtime_ns is not None and now.mtime_ns is not None and \
            pinned.mtime_ns // 1_000_000 != now.mtime_ns // 1_000_000:
        return f"was modified (mtime_ns {now.mtime_ns}, the snapshot recorded {pinned.mtime_ns})"
    if pinned.identity is not None and now.identity is not None and pinned.identity != now.identity:
        return f"was rewritten ({now.identity}, the snapshot recorded {pinned.identity})"
    return None


def changed_paths(source: Any) -> list[str]:
    """``source.changed_files()`` (its listed files gone or rewritten since), or nothing
    where the source lists no files or asking fails too (the caller's own error is then
    the answer)."""
    if not hasattr(source, "changed_files"):
        return []
    try:
        return source.changed_files()
    except Exception:  # noqa: BLE001 - a storage failure: the caller names the file it can
        return []


def miscount_error(unit: str, got: int, counted: int, source: Any, has_map: bool, rebuild: str) -> Exception:
    """The error for a read of ``unit`` (words naming it) that gave ``got`` rows where the
    counts said ``counted``. Files that changed since: ``SnapshotChangedError`` (``rebuild``:
    what to build again). Else, where the plan has a ``map()`` (``has_map``):
    ``UnsupportedError``, the map changed the number of rows (counts skip maps: they are run
    per unit, so counting through them would read the lake twice)."""
    changed = changed_paths(source)
    if changed:
        return files_changed_error(changed, "the loader", "it was built", f"build {rebuild} again")
    if has_map:
        return UnsupportedError(
            f"{unit} gave {got} rows where {counted} were counted: a map() changed the number of rows. "
            "Loaders (and to_ray) count rows before maps and need maps that keep one row per input row: "
            "drop rows with .filter() before the map, or .cache() the mapped dataset first (its rows are "
            "then counted)")
    return SnapshotChangedError(f"{unit} gave {got} rows where {counted} were counted: the data changed "
                                f"under the loader; build {rebuild} again")


def changed_error(changes: Sequence[tuple[str, str]], fix: str) -> SnapshotChangedError:
    """The error naming the first changed files (``(path, what)`` pairs) and ``fix``."""
    shown = "; ".join(f"{p!r} {what}" for p, what in changes[:3])
    more = f" (and {len(changes) - 3} more)" if len(changes) > 3 else ""
    return SnapshotChangedError(f"the data changed under a pinned snapshot: {shown}{more}. {fix}",
                                changes[0][0])


# -- the manifest document ----------------------------------------------------------------

def looks_like_manifest(head: bytes) -> bool:
    """Whether the first bytes of a file are a snapshot manifest's header."""
    return _HEADER.search(head[:PEEK_BYTES]) is not None


def partitioning_doc(partitioning: Any, partition_schema: pa.Schema) -> list | None:
    """The manifest's ``partitioning``: null when hive partitioning was switched off, else
    the partition columns as ``[name, type]`` pairs (empty where there are none)."""
    if partitioning is False:
        return None
    return [[f.name, str(f.type)] for f in partition_schema]


def partitioning_arg(doc: list | None, where: str) -> Any:
    """``partitioning=`` reopening a manifest's files as they were opened."""
    if doc is None:
        return False
    if not doc:
        return None
    fields = []
    for name, typ in doc:
        try:
            fields.append(pa.field(name, pa.type_for_alias(typ)))
        except (ValueError, KeyError) as exc:
            raise UnsupportedError(f"{where}: partition column {name!r} has type {typ!r}, which this "
                                   "arrowload cannot name; reopen the root with al.dataset(root, "
                                   f"partitioning=...) ({exc})") from exc
    return pa.schema(fields)


def read_manifest(doc: Any, where: str) -> dict:
    """Check a manifest document (header, fields, each file); the document, or
    ``UnsupportedError`` for another version / ``CorruptFileError`` naming ``where``."""
    from ..jsondoc import check_header
    check_header(doc, where, MANIFEST_FORMAT, MANIFEST_VERSION, MANIFEST_FIELDS,
                 "write it again with Dataset.save_manifest() of this arrowload")

    def bad(what: str) -> CorruptFileError:
        return CorruptFileError(f"{where}: {what}; the manifest was damaged or edited: write it again "
                                "with Dataset.save_manifest()", where)

    for key in ("snapshot_id", "root", "file_format", "schema_digest"):
        if not isinstance(doc[key], str) or not doc[key]:
            raise bad(f"{key} is not a non-empty string")
    if doc["num_rows"] is not None and (type(doc["num_rows"]) is not int or doc["num_rows"] < 0):
        raise bad("num_rows is not an integer >= 0 or null")
    part = doc["partitioning"]
    if part is not None and not (isinstance(part, list) and all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in part)):
        raise bad("partitioning is neither null nor a list of [name, type] pairs")
    files = doc["files"]
    if not isinstance(files, list) or not files:
        raise bad("files is not a non-empty list")
    for i, f in enumerate(files):
        if not isinstance(f, dict) or sorted(f) != sorted(_FILE_FIELDS):
            raise bad(f"files[{i}] does not have exactly the fields {', '.join(_FILE_FIELDS)}")
        if not isinstance(f["path"], str) or not f["path"] or f["path"].startswith("/"):
            raise bad(f"files[{i}].path is not a path relative to the root")
        for key in ("size", "mtime_ns", "rows"):
            if f[key] is not None and (type(f[key]) is not int or f[key] < 0):
                raise bad(f"files[{i}].{key} is not an integer >= 0 or null")
        if f["identity"] is not None and not isinstance(f["identity"], str):
            raise bad(f"files[{i}].identity is not a string or null")
        if not isinstance(f["partition"], dict):
            raise bad(f"files[{i}].partition is not an object")
    kinds = {"parquet", "ipc", "csv", "json"}
    if doc["file_format"] not in kinds:
        raise bad(f"file_format {doc['file_format']!r} is not one of {', '.join(sorted(kinds))}")
    pinned = manifest_files(doc)
    if snapshot_id(doc["file_format"], pinned) != doc["snapshot_id"]:
        raise bad("snapshot_id is not the digest of its files")
    return doc


def manifest_files(doc: Mapping[str, Any]) -> list[PinnedFile]:
    return [PinnedFile(f["path"], f["size"], f["mtime_ns"], f["identity"], f["rows"]) for f in doc["files"]]
