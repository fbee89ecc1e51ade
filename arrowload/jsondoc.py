"""The small JSON documents arrowload keeps beside data (selection indexes, random-access
cache manifests, remembered decoder choices): written atomically, their headers checked
one way. Each document's own fields are checked by its reader."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

from .errors import CorruptFileError, UnsupportedError


def check_header(doc: Any, where: str, fmt: str, version: int, fields: tuple[str, ...], redo: str) -> None:
    """``doc`` is a JSON object of format ``fmt``, version ``version``, with exactly the
    fields ``format``, ``version`` and ``fields``: ``UnsupportedError`` for another version,
    ``CorruptFileError`` naming the file for anything else. ``redo`` says what happens
    instead of trusting it ("the cache is rebuilt")."""
    if not isinstance(doc, dict):
        raise CorruptFileError(f"{where}: a {fmt} document is a JSON object, got {type(doc).__name__}", where)
    if doc.get("format") != fmt:
        raise CorruptFileError(f"{where}: format is {doc.get('format')!r}, not {fmt!r}", where)
    if type(doc.get("version")) is not int or doc["version"] != version:
        raise UnsupportedError(f"{where}: {fmt} version {doc.get('version')!r} is not supported (this "
                               f"arrowload reads version {version}); {redo}")
    known = ("format", "version") + fields
    extra = sorted(str(k) for k in doc if k not in known)
    missing = [k for k in fields if k not in doc]
    if extra or missing:
        what = "; ".join(filter(None, [f"unknown field(s) {', '.join(extra)}" if extra else "",
                                       f"missing field(s) {', '.join(missing)}" if missing else ""]))
        raise CorruptFileError(f"{where}: {what} (a {fmt} v{version} document has "
                               f"{', '.join(known)}); {redo}", where)


def write_atomic(path: str, obj: dict) -> None:
    """Write ``obj`` as JSON to ``path`` through a temporary file renamed over it: a reader
    never sees half a document; the temporary file is removed if writing fails."""
    write_bytes_atomic(path, json.dumps(obj).encode("utf-8"), suffix=".json")


def write_bytes_atomic(path: str, data: bytes, *, suffix: str = ".part") -> None:
    """Write ``data`` to ``path`` (a local file; its folder made if missing) through a
    temporary file in the same folder renamed over it, removed if writing fails."""
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
