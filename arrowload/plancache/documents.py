"""The plan cache's two small documents, field by field (``formats/plan_cache/v1``,
``formats/plan_cache_lock/v1``): the commit document, written last (its presence is the
commit), and the writer's lock. Readers raise ``UnsupportedError`` for another version and
``CorruptFileError`` naming the document and the field for anything else out of the spec;
the cache then rewrites the entry (a damaged commit is never trusted)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from ..errors import CorruptFileError
from ..jsondoc import check_header

COMMIT_FORMAT = "arrowload.plan_cache"
LOCK_FORMAT = "arrowload.plan_cache_lock"
VERSION = 1
DATA_FORMATS = ("parquet", "ipc")
_HEX32 = re.compile(r"[0-9a-f]{32}")
_COMMIT_FIELDS = ("key", "plan", "snapshot", "name", "summary", "data_format", "schema", "num_rows",
                  "num_bytes", "files", "written_at", "writer")
_LOCK_FIELDS = ("key", "token", "host", "pid", "started_at", "beat")


@dataclass(frozen=True)
class CachedFile:
    path: str  # relative to the entry's folder, "/"-separated
    rows: int
    bytes: int


@dataclass(frozen=True)
class Commit:
    """A committed entry: what it holds and where its files are."""

    key: str
    plan: str
    snapshot: str
    name: str | None
    summary: str
    data_format: str
    schema: str
    num_rows: int
    num_bytes: int
    files: tuple[CachedFile, ...]
    written_at: datetime
    writer: dict

    def to_doc(self) -> dict:
        return {"format": COMMIT_FORMAT, "version": VERSION, "key": self.key, "plan": self.plan,
                "snapshot": self.snapshot, "name": self.name, "summary": self.summary,
                "data_format": self.data_format, "schema": self.schema, "num_rows": self.num_rows,
                "num_bytes": self.num_bytes,
                "files": [{"path": f.path, "rows": f.rows, "bytes": f.bytes} for f in self.files],
                "written_at": format_time(self.written_at), "writer": dict(self.writer)}


@dataclass(frozen=True)
class LockDoc:
    """Who writes an entry now. ``beat`` grows with every heartbeat (the lock's version
    changes, so a stale lock is told from a live one by watching it)."""

    key: str
    token: str
    host: str
    pid: int
    started_at: datetime
    beat: int

    def to_doc(self) -> dict:
        return {"format": LOCK_FORMAT, "version": VERSION, "key": self.key, "token": self.token,
                "host": self.host, "pid": self.pid, "started_at": format_time(self.started_at),
                "beat": self.beat}


def format_time(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def encode(doc: dict) -> bytes:
    return json.dumps(doc, sort_keys=True, indent=1).encode()


def decode(data: bytes, where: str) -> Any:
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # (nested past the parser's depth)
        raise CorruptFileError(f"{where}: not a JSON document ({exc}); the entry is rewritten", where) from exc


def read_commit(doc: Any, where: str) -> Commit:
    check_header(doc, where, COMMIT_FORMAT, VERSION, _COMMIT_FIELDS, "the entry is rewritten")
    for name in ("key", "plan"):
        _hex(doc, name, where)
    snapshot = _string(doc, "snapshot", where)
    if not snapshot:
        raise CorruptFileError(f"{where}: snapshot is empty; the entry is rewritten", where)
    name = doc["name"]
    if name is not None and (not isinstance(name, str) or not name):
        raise CorruptFileError(f"{where}: name is {name!r}, not null or a non-empty string", where)
    if doc["data_format"] not in DATA_FORMATS:
        raise CorruptFileError(f"{where}: data_format is {doc['data_format']!r}, not one of "
                               f"{', '.join(DATA_FORMATS)}", where)
    files = doc["files"]
    if not isinstance(files, list) or not files:
        raise CorruptFileError(f"{where}: files is not a non-empty list", where)
    out = []
    for i, f in enumerate(files):
        if not isinstance(f, dict) or set(f) != {"path", "rows", "bytes"}:
            raise CorruptFileError(f"{where}: files[{i}] is not an object of path, rows and bytes", where)
        path = f["path"]
        if not isinstance(path, str) or not path or path.startswith("/") or ".." in path.split("/"):
            raise CorruptFileError(f"{where}: files[{i}].path {path!r} is not a relative path inside "
                                   "the entry", where)
        out.append(CachedFile(path, _int(f, "rows", where), _int(f, "bytes", where)))
    num_rows = _int(doc, "num_rows", where)
    if num_rows != sum(f.rows for f in out):
        raise CorruptFileError(f"{where}: num_rows {num_rows} is not the sum of the files' rows "
                               f"({sum(f.rows for f in out)})", where)
    writer = doc["writer"]
    if not isinstance(writer, dict) or not isinstance(writer.get("host"), str) or \
            type(writer.get("pid")) is not int:
        raise CorruptFileError(f"{where}: writer is not an object with host and pid", where)
    return Commit(doc["key"], doc["plan"], snapshot, name, _string(doc, "summary", where), doc["data_format"],
                  _string(doc, "schema", where), num_rows, _int(doc, "num_bytes", where), tuple(out),
                  _time(doc, "written_at", where), {"host": writer["host"], "pid": writer["pid"]})


def read_lock(doc: Any, where: str) -> LockDoc:
    check_header(doc, where, LOCK_FORMAT, VERSION, _LOCK_FIELDS, "the lock is treated as held by an unknown writer")
    _hex(doc, "key", where)
    token = _string(doc, "token", where)
    if not token:
        raise CorruptFileError(f"{where}: token is empty", where)
    return LockDoc(doc["key"], token, _string(doc, "host", where), _int(doc, "pid", where),
                   _time(doc, "started_at", where), _int(doc, "beat", where))


def _hex(doc: dict, name: str, where: str) -> str:
    value = doc[name]
    if not isinstance(value, str) or not _HEX32.fullmatch(value):
        raise CorruptFileError(f"{where}: {name} is {value!r}, not 32 lower-case hex digits", where)
    return value


def _string(doc: dict, name: str, where: str) -> str:
    value = doc[name]
    if not isinstance(value, str):
        raise CorruptFileError(f"{where}: {name} is {value!r}, not a string", where)
    return value


def _int(doc: dict, name: str, where: str) -> int:
    value = doc[name]
    if type(value) is not int or value < 0:
        raise CorruptFileError(f"{where}: {name} is {value!r}, not an integer >= 0", where)
    return value


def _time(doc: dict, name: str, where: str) -> datetime:
    value = doc[name]
    try:
        if not isinstance(value, str) or not value.endswith("Z"):
            raise ValueError("not a UTC time ending in Z")
        return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
    except ValueError:
        raise CorruptFileError(f"{where}: {name} is {value!r}, not a UTC time like "
                               "2025-01-31T12:00:00.000000Z", where) from None
