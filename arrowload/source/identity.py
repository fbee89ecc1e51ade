"""A file's version beyond its size and modification time, from what the filesystem offers.

Size and mtime miss a rewrite of a same-size file within the mtime's granularity (or one
whose mtime was set back). Object stores name each version of an object: S3's ETag (and
VersionId), GCS's generation, Azure's etag; local disks have the inode (a rewrite through
a temporary file and a rename, as most writers do, gives a new one). S3's VersionId is
not used: a listing does not report it, so listing and a later check would disagree.
``identity_of``
returns that marker as a short string, None where the filesystem has none (pyarrow's
own S3 / GCS filesystems do not expose it: reach them through s3fs / gcsfs for it).
"""

from __future__ import annotations

import os

import pyarrow.fs as pafs

# fsspec info keys that name an object's version, by backend (s3fs, adlfs, gcsfs, local); only
# keys that a listing and a single-object request both report (S3 lists no VersionId)
_VERSION_KEYS = ("ETag", "etag", "generation", "ino")


def _fsspec_of(fs: pafs.FileSystem):
    handler = getattr(fs, "handler", None)
    return getattr(handler, "fs", None)


def identity_of(fs: pafs.FileSystem, path: str, *, fresh: bool = False) -> str | None:
    """The version marker of ``path`` (see the module docstring). ``fresh``: ask the store
    now rather than reuse a listing cached by the fsspec filesystem."""
    if isinstance(fs, pafs.LocalFileSystem):
        try:
            st = os.stat(path)
        except OSError:
            return None
        # the inode alone: a device number can change across reboots and container restarts
        # (overlay, NFS), which would refuse every saved state and rebuild every cache
        return f"ino={st.st_ino}"
    inner = _fsspec_of(fs)
    if inner is None:
        return None
    listed = getattr(getattr(fs, "handler", None), "identities", None)
    if not fresh and listed and path in listed:  # as the listing that found the file said
        return listed[path]
    try:
        if fresh:
            inner.invalidate_cache(path)
        info = inner.info(path)
    except (OSError, ValueError):
        return None
    return identity_from_info(info)


def identity_from_info(info: dict) -> str | None:
    """The version marker in an fsspec ``info`` dict (None: it holds none)."""
    parts = [f"{k}={info[k]}" for k in _VERSION_KEYS if info.get(k) not in (None, "")]
    return ";".join(parts) or None
