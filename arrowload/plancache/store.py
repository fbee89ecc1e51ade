"""Where plan cache entries live: a root folder on local disk or object storage, and the
few operations the cache needs there, each with the strongest guarantee the store offers.

- Local disk (``os``): a document appears whole and only if absent by writing it to a
  temporary file and hard-linking it to its name (``link`` fails with ``EEXIST`` when the
  name exists: create-if-absent, atomic on local filesystems and on NFS); where hard links
  are not supported, ``O_CREAT | O_EXCL`` (create-if-absent, content written just after).
- Object storage (fsspec, resolved as ``al.dataset`` resolves URIs): one PUT is atomic;
  create-if-absent is a conditional PUT (``If-None-Match: *``, fsspec's ``mode="create"``),
  which S3 (and moto's server) honour; a delete or overwrite of a lock is conditional on the
  ETag it was seen with (``If-Match``) on S3. A store whose filesystem offers neither
  falls back to check-then-put (``exclusive == "weak"``): two writers may then both run the
  plan, and each writes its own attempt folder, so readers still see one whole entry.
"""

from __future__ import annotations

import functools
import os
import tempfile
import time
import uuid
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs

from ..errors import ArrowloadError, PathNotFoundError
from ..jsondoc import write_bytes_atomic
from ..options import default_cache_dir
from ..source.filesystem import (FileEntry, canonical_local_path, file_entry, filesystem_for, protocol_of,
                                 storage_error)


def _typed(method):
    """A store operation whose refusals by the object store are arrowload's errors: missing
    or rejected credentials and denied access (``StorageAccessError``), an unreachable
    endpoint (``StorageEndpointError``), and, for a write, a bucket that does not exist
    (``PathNotFoundError``); as ``al.dataset`` raises them for the same store."""
    writes = method.__name__ in ("create", "replace", "open_output")

    @functools.wraps(method)
    def typed(self, path, *args, **kwargs):
        try:
            return method(self, path, *args, **kwargs)
        except ArrowloadError:
            raise
        except FileNotFoundError as exc:
            if not writes or self.fs is None:
                raise
            raise PathNotFoundError(f"cannot write the cache entry {self.url(path)!r}: {exc}. Create the "
                                    "bucket (or folder) first, or point cache() at one that exists",
                                    self.url(path)) from exc
        except Exception as exc:
            error = storage_error(exc, self.url(path), local=self.is_local)
            if error is None:
                raise
            raise error from exc
    return typed


@dataclass(frozen=True)
class Stat:
    """What a store says of one object: its modification time (seconds since the epoch)
    and a tag that changes whenever it is rewritten (for conditional deletes)."""

    mtime: float
    tag: str


class Store:
    """A cache root: ``uri`` a local folder or an object-store URI (``s3://bucket/prefix``),
    None for the user cache dir (``$ARROWLOAD_CACHE_DIR``, else ``$XDG_CACHE_HOME/arrowload``,
    else ``~/.cache/arrowload``). Paths handed to the methods are store paths (``join``)."""

    def __init__(self, uri: str | os.PathLike | None = None, storage_options: dict | None = None) -> None:
        text = os.fspath(uri) if uri is not None else default_cache_dir()
        proto = protocol_of(text)
        self.protocol = proto if proto not in (None, "file", "local") else None
        if self.protocol is None:
            local = text[len("file://"):] if proto == "file" else text
            self.fs = None
            self.pafs: pafs.FileSystem = pafs.LocalFileSystem()
            self.root = canonical_local_path(local)
            if storage_options:
                filesystem_for(text, storage_options)  # raises the usual error: local path with options
        else:
            self.pafs, root = filesystem_for(text, storage_options)
            self.fs = self.pafs.handler.fs  # the fsspec filesystem under pyarrow's wrapper
            self.root = root.rstrip("/")
        self.storage_options = storage_options
        self.exclusive = "strong"

    # -- names -------------------------------------------------------------------------
    @property
    def is_local(self) -> bool:
        return self.fs is None or self.protocol == "memory"

    def join(self, *parts: str) -> str:
        if self.fs is None:
            return os.path.join(self.root, *parts)
        return "/".join([self.root, *parts])

    def url(self, path: str) -> str:
        """``path`` as the user would write it (a local path, or ``s3://bucket/key``)."""
        return path if self.fs is None else f"{self.protocol}://{path}"

    # -- reading -----------------------------------------------------------------------
    @_typed
    def read(self, path: str) -> bytes | None:
        """The object's bytes, None when it does not exist."""
        try:
            if self.fs is None:
                with open(path, "rb") as f:
                    return f.read()
            self.fs.invalidate_cache(path)
            return self.fs.cat_file(path)
        except FileNotFoundError:
            return None

    @_typed
    def stat(self, path: str) -> Stat | None:
        try:
            if self.fs is None:
                st = os.stat(path)
                return Stat(st.st_mtime, f"{st.st_ino}:{st.st_mtime_ns}:{st.st_size}")
            self.fs.invalidate_cache(path)
            info = self.fs.info(path)
        except FileNotFoundError:
            return None
        if info.get("type") == "directory":
            return None
        modified = info.get("LastModified") or info.get("mtime") or info.get("updated") or info.get("created")
        if hasattr(modified, "timestamp"):
            mtime = modified.timestamp()
        else:
            try:
                mtime = float(modified)
            except (TypeError, ValueError):
                mtime = time.time()
        tag = info.get("ETag") or info.get("generation") or f"{mtime}:{info.get('size')}"
        return Stat(mtime, str(tag))

    @_typed
    def children(self, path: str) -> list[str]:
        """Names directly under folder ``path`` (files and folders); [] when it is absent."""
        try:
            if self.fs is None:
                return sorted(os.listdir(path))
            self.fs.invalidate_cache(path)
            return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(path, detail=False))
        except (FileNotFoundError, NotADirectoryError):
            return []

    @_typed
    def size_of_tree(self, path: str) -> int:
        if self.fs is None:
            return sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(path) for n in names)
        try:
            return int(self.fs.du(path, total=True))
        except FileNotFoundError:
            return 0

    def file_entries(self, paths: list[str]) -> list[FileEntry]:
        """The files as a FileSource lists them (size, modification time, identity)."""
        infos = self.pafs.get_file_info(paths)
        missing = [i.path for i in infos if i.type != pafs.FileType.File]
        if missing:
            raise FileNotFoundError(missing[0])
        return [file_entry(i, self.pafs) for i in infos]

    # -- writing -----------------------------------------------------------------------
    @_typed
    def create(self, path: str, data: bytes) -> bool:
        """Write ``path`` only if it does not exist; True when this call created it. The
        object is whole when it appears (except on the ``O_EXCL`` fallback, see above)."""
        if self.fs is None:
            return _create_local(path, data)
        try:
            self.fs.pipe_file(path, data, mode="create")
            return True
        except FileExistsError:
            return False
        except (TypeError, NotImplementedError, ValueError):
            # a filesystem without create-if-absent: check, then put (weak; see the module doc)
            self.exclusive = "weak"
            self.fs.invalidate_cache(path)
            if self.fs.exists(path):
                return False
            self.fs.pipe_file(path, data)
            return True

    @_typed
    def replace(self, path: str, data: bytes, if_tag: str | None = None) -> bool:
        """Overwrite ``path``; with ``if_tag``, only while it is still the version seen with
        that tag (S3 ``If-Match``; locally, by comparing just before). False when it was not."""
        if self.fs is None:
            if if_tag is not None:
                now = self.stat(path)
                if now is None or now.tag != if_tag:
                    return False
            _write_local(path, data)
            return True
        if if_tag is not None and hasattr(self.fs, "call_s3"):
            bucket, key, _ = self.fs.split_path(path)
            try:
                self.fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data, IfMatch=if_tag)
            except (OSError, FileNotFoundError):
                return False
            finally:
                self.fs.invalidate_cache(path)
            return True
        self.fs.pipe_file(path, data)
        return True

    @_typed
    def delete(self, path: str, if_tag: str | None = None) -> bool:
        """Remove ``path``; with ``if_tag`` only while it is still the version seen with that
        tag (S3 ``If-Match``; locally, it is moved aside first and put back if it changed)."""
        if self.fs is None:
            if if_tag is None:
                try:
                    os.unlink(path)
                    return True
                except FileNotFoundError:
                    return False
            folder, name = os.path.split(path)
            aside = os.path.join(folder, f".{name}.{uuid.uuid4().hex[:8]}.removing")
            try:
                os.rename(path, aside)  # atomic: only one remover gets this version
            except FileNotFoundError:
                return False
            st = os.stat(aside)
            if f"{st.st_ino}:{st.st_mtime_ns}:{st.st_size}" != if_tag:
                try:  # another version than the one judged: put it back (unless replaced again)
                    os.link(aside, path)
                except OSError:
                    pass
                os.unlink(aside)
                return False
            os.unlink(aside)
            return True
        try:
            if if_tag is not None and hasattr(self.fs, "call_s3"):
                bucket, key, _ = self.fs.split_path(path)
                self.fs.call_s3("delete_object", Bucket=bucket, Key=key, IfMatch=if_tag)
            else:
                self.fs.rm_file(path)
            return True
        except (FileNotFoundError, OSError):
            return False
        finally:
            self.fs.invalidate_cache(path)

    @_typed
    def remove_tree(self, path: str) -> None:
        if self.fs is None:
            import shutil
            shutil.rmtree(path, ignore_errors=True)
            return
        try:
            self.fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass
        self.fs.invalidate_cache(path)

    @_typed
    def open_output(self, path: str) -> Any:
        """A pyarrow output stream writing ``path`` (its folder is made)."""
        if self.fs is None:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        return self.pafs.open_output_stream(path)

    @_typed
    def make_folder(self, path: str) -> None:
        if self.fs is None:
            os.makedirs(path, exist_ok=True)


def _create_local(path: str, data: bytes) -> bool:
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        except OSError:  # no hard links here: O_CREAT | O_EXCL
            try:
                out = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(out, "wb") as f:
                f.write(data)
            return True
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def _write_local(path: str, data: bytes) -> None:
    write_bytes_atomic(path, data)
