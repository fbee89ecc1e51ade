"""Resolve user sources (paths, URIs, globs, filesystem objects) to a pyarrow filesystem
and a sorted list of files.

fsspec filesystems are wrapped with ``pyarrow.fs.PyFileSystem(FSSpecHandler(fs))`` so the
scan always speaks pyarrow; pyarrow's own filesystems are used as they are. Local paths use
pyarrow's native local filesystem (fast, releases the GIL).
"""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs

from ..errors import ArrowloadError, PathNotFoundError
from .identity import identity_of
from .retry import retry

_URI = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
_GLOB_CHARS = set("*?[")


@dataclass(frozen=True)
class FileEntry:
    """One file of a source: its path on the filesystem, size and change markers.

    ``mtime_ns`` is the modification time where the filesystem reports one;
    ``identity`` what else names this version of the file (S3 ETag / VersionId, GCS
    generation, local inode: see identity.py), None where the filesystem has nothing.
    Together with the size they identify the file's version (the snapshot key later
    stages cache on).
    """

    path: str
    size: int | None
    mtime_ns: int | None
    identity: str | None = None


def protocol_of(path: str) -> str | None:
    m = _URI.match(path)
    return m.group(1).lower() if m else None


def to_pyarrow_fs(filesystem: Any) -> pafs.FileSystem:
    """Accept a pyarrow FileSystem or any fsspec AbstractFileSystem."""
    if isinstance(filesystem, pafs.FileSystem):
        return filesystem
    try:
        import fsspec
    except ImportError as exc:  # pragma: no cover - fsspec is a core dependency
        raise ArrowloadError("fsspec is required for fsspec filesystems: pip install fsspec") from exc
    if isinstance(filesystem, fsspec.AbstractFileSystem):
        return pafs.PyFileSystem(pafs.FSSpecHandler(filesystem))
    raise TypeError(f"filesystem must be a pyarrow.fs.FileSystem or an fsspec filesystem, "
                    f"got {type(filesystem).__name__}")


def filesystem_for(path: str, storage_options: dict | None) -> tuple[pafs.FileSystem, str]:
    """Pick a filesystem for a path / URI and return it with the path stripped of its scheme."""
    proto = protocol_of(path)
    if proto in (None, "file", "local"):
        if storage_options:
            raise ValueError("storage_options apply to remote URIs only; got them with local path "
                             f"{path!r}")
        local = path[len("file://"):] if proto == "file" else path
        return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(local))
    try:
        import fsspec
    except ImportError as exc:  # pragma: no cover
        raise ArrowloadError("fsspec is required for URIs: pip install fsspec") from exc
    try:
        fs = fsspec.filesystem(proto, **(storage_options or {}))
    except (ImportError, ValueError) as exc:
        extra = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs",
                 "abfs": "adlfs", "abfss": "adlfs"}.get(proto)
        hint = f"; install it with: pip install 'arrowload[cloud]' (or {extra})" if extra else ""
        raise ArrowloadError(f"no filesystem available for {proto}:// ({exc}){hint}") from exc
    return to_pyarrow_fs(fs), fs._strip_protocol(path)


def _info(fs: pafs.FileSystem, path: str, retries: int, backoff: float) -> pafs.FileInfo:
    return retry(lambda: fs.get_file_info(path), retries=retries, backoff_s=backoff)


def _is_hidden(rel: str) -> bool:
    return any(part.startswith((".", "_")) and "=" not in part for part in rel.split("/"))


def list_files(fs: pafs.FileSystem, path: str, *, retries: int = 4,
               backoff: float = 0.05) -> tuple[str, list[FileEntry]]:
    """Expand one path (file, directory, or glob) into files, sorted by path.

    Returns ``(base_dir, entries)``: ``base_dir`` is where hive partition folders start.
    Hidden files and folders (``.x``, ``_x`` such as ``_SUCCESS``) inside a directory are skipped.
    """
    path = path.rstrip("/") if len(path) > 1 else path
    if _GLOB_CHARS & set(path):
        parts = path.split("/")
        first = next(i for i, p in enumerate(parts) if _GLOB_CHARS & set(p))
        base = "/".join(parts[:first]) or "/"
        infos = _list_dir(fs, base, retries, backoff, original=path)
        matched = [i for i in infos if fnmatch.fnmatchcase(i.path, path)]
        if not matched:
            raise PathNotFoundError(f"no files match the glob {path!r}", path)
        return base, sorted((_entry(i, fs) for i in matched), key=lambda e: e.path)
    info = _info(fs, path, retries, backoff)
    if info.type == pafs.FileType.NotFound:
        raise PathNotFoundError(f"no such file or directory: {path!r}; check the path "
                                "(and storage_options / filesystem for remote URIs)", path)
    if info.type == pafs.FileType.File:
        return os.path.dirname(path), [_entry(info, fs)]
    infos = _list_dir(fs, path, retries, backoff, original=path)
    entries = sorted((_entry(i, fs) for i in infos if not _is_hidden(i.path[len(path):].lstrip("/"))),
                     key=lambda e: e.path)
    if not entries:
        raise PathNotFoundError(f"directory {path!r} holds no data files", path)
    return path, entries


def _list_dir(fs: pafs.FileSystem, base: str, retries: int, backoff: float,
              original: str) -> list[pafs.FileInfo]:
    selector = pafs.FileSelector(base, recursive=True, allow_not_found=True)
    infos = retry(lambda: fs.get_file_info(selector), retries=retries, backoff_s=backoff)
    return [i for i in infos if i.type == pafs.FileType.File]


def _entry(info: pafs.FileInfo, fs: pafs.FileSystem | None = None) -> FileEntry:
    mtime = info.mtime_ns if info.mtime is not None else None
    return FileEntry(info.path, info.size, mtime, identity_of(fs, info.path) if fs is not None else None)
