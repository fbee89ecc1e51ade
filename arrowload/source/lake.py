"""Recognise lake table folders (Delta Lake, Apache Iceberg) before they are read as files.

A table folder holds every file any version of the table ever wrote: overwritten and
deleted rows stay on disk until a vacuum, and only the table's log / metadata says which
files are live. Reading the folder's Parquet files directly returns those dead rows, so
``al.dataset()`` opens a Delta table's root folder through its log (``al.delta()``,
source/delta.py) and refuses a folder inside one (a partition), and Iceberg folders
(also their ``data/`` folder) until ``al.iceberg()`` reads them, with
:class:`~arrowload.errors.LakeTableError`.

Detection is a listing check, no table library is imported: a ``_delta_log/`` folder
(Delta), or a ``metadata/`` folder holding ``*.metadata.json`` files (Iceberg), in the
folder given or in one of its ancestors. Explicit file paths are not checked: a list of
files is what a table library's ``file_uris()`` hands over, and the caller chose them.
"""

from __future__ import annotations

import posixpath

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
        fix = ("Table support comes with al.iceberg() (not available yet); until then read the "
               "table with its own library (pyiceberg) and pass the result, or the list of its "
               "live files, to al.dataset()")
    raise LakeTableError(
        f"{shown!r} {where} {name} table folder (it has {marker}); reading its files directly "
        f"would return deleted and overwritten rows as if they were live. {fix}",
        path=path, table_format=kind, table_root=root)
