"""Recognise lake table folders (Delta Lake, Apache Iceberg) before they are read as files.

A table folder holds every file any version of the table ever wrote: overwritten and
deleted rows stay on disk until a vacuum, and only the table's log / metadata says which
files are live. Reading the folder's Parquet files directly returns those dead rows, so
``al.dataset()`` opens a table's root folder through its log or metadata (a Delta table
with ``al.delta()``, source/delta.py; an Iceberg table with ``al.iceberg()`` of its newest
metadata file, source/iceberg.py) and refuses a folder inside one (a partition, an
Iceberg table's ``data/`` folder) with :class:`~arrowload.errors.LakeTableError`.

Detection is a listing check, no table library is imported: a ``_delta_log/`` folder
(Delta), or a ``metadata/`` folder holding ``*.metadata.json`` files (Iceberg), in the
folder given or in one of its ancestors. Explicit file paths are not checked: a list of
files is what a table library's ``file_uris()`` hands over, and the caller chose them.
"""

from __future__ import annotations

import posixpath
import re

import pyarrow.fs as pafs

from ..errors import LakeTableError
from .retry import retry

DELTA_LOG = "_delta_log"
ICEBERG_METADATA = "metadata"
_ICEBERG_SUFFIX = ".metadata.json"


def _ancestors(path: str) -> list[str]:
    """``path`` and its parent folders, innermost first, up to (not including) the
    filesystem root; on object stores the last one is the bucket."""
    out = []
    current = path.rstrip("/") or "/"
    while current not in ("", "/", "."):
        out.append(current)
        parent = posixpath.dirname(current)
        if parent == current:
            break
        current = parent
    return out


def detect_lake_table(fs: pafs.FileSystem, folder: str, *,
                      retries: int = 4, backoff: float = 0.05) -> tuple[str, str] | None:
    """``(kind, table_root)`` when ``folder`` is, or lies inside, a Delta / Iceberg table
    folder; None otherwise. ``kind`` is ``"delta"`` or ``"iceberg"``."""
    candidates = _ancestors(folder)
    probes = []
    for c in candidates:
        probes.append(f"{c}/{DELTA_LOG}")
        probes.append(f"{c}/{ICEBERG_METADATA}")
    try:
        infos = retry(lambda: fs.get_file_info(probes), retries=retries, backoff_s=backoff)
    except OSError:
        # a parent the caller may not list (credentials scoped to a prefix): probe one by one;
        # a folder that cannot be looked at is not known to be a table
        infos = [_probe(fs, p) for p in probes]
    for i, c in enumerate(candidates):
        delta, meta = infos[2 * i], infos[2 * i + 1]
        if delta.type == pafs.FileType.Directory:
            return "delta", c
        if meta.type == pafs.FileType.Directory and _has_iceberg_metadata(fs, meta.path, retries, backoff):
            return "iceberg", c
    return None


def _probe(fs: pafs.FileSystem, path: str) -> pafs.FileInfo:
    try:
        return fs.get_file_info(path)
    except OSError:
        return pafs.FileInfo(path, pafs.FileType.Unknown)


def _has_iceberg_metadata(fs: pafs.FileSystem, folder: str, retries: int, backoff: float) -> bool:
    selector = pafs.FileSelector(folder, recursive=False, allow_not_found=True)
    try:
        infos = retry(lambda: fs.get_file_info(selector), retries=retries, backoff_s=backoff)
    except OSError:
        return False
    return any(i.type == pafs.FileType.File and i.base_name.endswith(_ICEBERG_SUFFIX) for i in infos)


def refuse_lake_table(fs: pafs.FileSystem, path: str, shown: str, *,
                      retries: int = 4, backoff: float = 0.05) -> None:
    """Raise :class:`LakeTableError` when the folder ``path`` (shown to the user as
    ``shown``) is a lake table or inside one."""
    found = detect_lake_table(fs, path, retries=retries, backoff=backoff)
    if found is None:
        return
    kind, root = found
    name, marker = {
        "delta": ("a Delta Lake", f"{DELTA_LOG}/"),
        "iceberg": ("an Apache Iceberg", f"{ICEBERG_METADATA}/*{_ICEBERG_SUFFIX}"),
    }[kind]
    where = "is" if root.rstrip("/") == path.rstrip("/") else f"lies inside {root!r}, which is"
    if kind == "delta":
        fix = (f"open the table at its root with al.delta({root!r}) (or al.dataset() of the root), "
               "and filter on its partition columns to read part of it")
    else:
        fix = (f"open the table at its root with al.iceberg({root!r}) (or al.dataset() of the root, "
               "or al.iceberg(catalog.load_table(...))), and filter on its columns to read part of it")
    raise LakeTableError(
        f"{shown!r} {where} {name} table folder (it has {marker}); reading its files directly "
        f"would return deleted and overwritten rows as if they were live. {fix}",
        path=path, table_format=kind, table_root=root)


# catalog tables: 00003-<uuid>.metadata.json; Hadoop tables: v3.metadata.json
_VERSIONED = re.compile(r"^(?:v(\d+)|(\d+)-[^/]*)\.metadata\.json$")


def newest_iceberg_metadata(fs: pafs.FileSystem, root: str, *,
                            retries: int = 4, backoff: float = 0.05) -> str | None:
    """The path of the newest ``*.metadata.json`` of the Iceberg table at ``root``, None
    where ``root`` has none: the version ``metadata/version-hint.text`` names where that
    file exists, else the highest version number in the file names (``00012-<uuid>``,
    ``v12``), the latest modified among equals."""
    folder = f"{root.rstrip('/')}/{ICEBERG_METADATA}"
    selector = pafs.FileSelector(folder, recursive=False, allow_not_found=True)
    try:
        infos = retry(lambda: fs.get_file_info(selector), retries=retries, backoff_s=backoff)
    except OSError:
        return None
    files = {i.base_name: i for i in infos if i.type == pafs.FileType.File}
    hint = files.get("version-hint.text")
    if hint is not None:
        try:
            with fs.open_input_stream(hint.path) as f:
                text = f.read().decode().strip()
        except (OSError, UnicodeDecodeError):
            text = ""
        if text.isdigit():
            for name in (f"v{text}{_ICEBERG_SUFFIX}", ):
                if name in files:
                    return files[name].path
            for name, info in files.items():
                m = _VERSIONED.match(name)
                if m and int(m.group(1) or m.group(2)) == int(text):
                    return info.path
    best = None
    for name, info in files.items():
        m = _VERSIONED.match(name)
        if m is None:
            continue
        key = (int(m.group(1) or m.group(2)), info.mtime_ns or 0, name)
        if best is None or key > best[0]:
            best = (key, info.path)
    if best is None:
        newest = [i for n, i in files.items() if n.endswith(_ICEBERG_SUFFIX)]
        if not newest:
            return None
        return max(newest, key=lambda i: (i.mtime_ns or 0, i.base_name)).path
    return best[1]
