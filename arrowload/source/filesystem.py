"""Resolve user sources (paths, URIs, globs, filesystem objects) to a pyarrow filesystem
and a sorted list of files.

fsspec filesystems are wrapped with ``pyarrow.fs.PyFileSystem(FSSpecHandler(fs))`` so the
scan always speaks pyarrow; pyarrow's own filesystems are used as they are. Local paths use
pyarrow's native local filesystem (fast, releases the GIL).
"""

from __future__ import annotations

import fnmatch
import inspect
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs

from ..errors import (ArgumentTypeError, InvalidArgumentError, MissingDependencyError,
                      PathEncodingError, PathNotFoundError, SnapshotChangedError, StorageAccessError,
                      StorageEndpointError)
from .retry import DENIED, ENDPOINT, PERMANENT, classify, retry
from .identity import identity_from_info, identity_of

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


class _Handler(pafs.FSSpecHandler):
    """pyarrow's handler for an fsspec filesystem, its files opened without fsspec's read
    cache (``cache_type``; None: the filesystem's own, which its user chose). pyarrow asks
    for exactly the ranges it needs (footers, the kept column chunks, coalesced by
    ``pre_buffer``); s3fs' default ``readahead`` cache fetched up to 50 MiB past each of
    them: a one-column query of one row group out of ten downloaded the whole 8.8 MB file,
    against 195 KB without it (moto's S3 server, bytes s3fs fetched)."""

    def __init__(self, fs, cache_type: str | None = "none",
                 listed: dict[str, tuple[int | None, str | None, int | None]] | None = None,
                 read_retries: int = 0, backoff_s: float = 0.0) -> None:
        super().__init__(fs)
        self.cache_type = cache_type
        #: transient faults in a read retried where they happen (``_RetryingFile``)
        self.read_retries, self.backoff_s = read_retries, backoff_s
        #: the version each listed file had when listed, by path: (size, identity, mtime_ns)
        self.listed = listed or {}
        #: identities (``identity.identity_from_info``) of the files this handler's listings
        #: found, by path: a listing reports them, so no request per file asks again
        self.identities: dict[str, str | None] = {}

    def bound(self, entries, read_retries: int = 0, backoff_s: float = 0.0) -> "_Handler":
        """This handler for one listing (``FileEntry`` s): opening a listed file checks that it
        is still the version listed (a fresh ``info``), as a cached footer describes only it;
        a read of one meeting a transient fault reopens it and reads again, up to
        ``read_retries`` times (see ``_RetryingFile``)."""
        return _Handler(self.fs, self.cache_type, {e.path: (e.size, e.identity, e.mtime_ns) for e in entries},
                        read_retries, backoff_s)

    def _open(self, path):
        from pyarrow import PythonFile
        listed = self.listed.get(path)
        if listed is not None and hasattr(self.fs, "invalidate_cache"):
            self.fs.invalidate_cache(path)  # the object as it is now, not as a listing cached it
        # (info, not isfile: isfile answers False for a refused credential or a dead endpoint,
        # which then looked like a missing file)
        info = self.fs.info(path)
        if info.get("type") not in (None, "file"):
            raise FileNotFoundError(path)
        if listed is not None:
            now = self._create_file_info(path, info)  # (its mtime as the listing converted it)
            _check_listed(path, listed, info, now.mtime_ns if now.mtime is not None else None)
        cache = {} if self.cache_type is None else {"cache_type": self.cache_type}
        size = {"size": info["size"]} if isinstance(info.get("size"), int) else {}
        # (the size known: no second request for it; a filesystem whose files take no size
        # or no cache_type is asked without them)

        def open_file():
            for kwargs in ({**cache, **size}, cache, {}):
                try:
                    f = self.fs.open(path, mode="rb", **kwargs)
                    break
                except TypeError:
                    if not kwargs:
                        raise
            if type(getattr(type(f), "details", None)) is property and getattr(f, "_details", 0) is None:
                try:  # what its first read would ask the store again (s3fs: one HEAD per open)
                    f.details = info
                except (AttributeError, KeyError, TypeError):
                    pass
            return f

        f = open_file()
        if listed is not None and self.read_retries:
            f = _RetryingFile(f, open_file, self.read_retries, self.backoff_s)
        return PythonFile(f, mode="r")

    def get_file_info_selector(self, selector):
        """pyarrow's ``FSSpecHandler.get_file_info_selector``, keeping each file's identity
        from the listing's details (``identities``)."""
        fs = self.fs
        if not fs.isdir(selector.base_dir):
            if fs.exists(selector.base_dir):
                raise NotADirectoryError(selector.base_dir)
            if selector.allow_not_found:
                return []
            raise FileNotFoundError(selector.base_dir)
        found = fs.find(selector.base_dir, maxdepth=None if selector.recursive else 1, withdirs=True,
                        detail=True)
        base = selector.base_dir.strip("/")
        infos = []
        for path, info in found.items():
            if path.strip("/") != base:  # (fsspec lists the base folder itself: pyarrow's GH-37555)
                infos.append(self._create_file_info(path, info))
                if info.get("type") == "file":
                    self.identities[path] = identity_from_info(info)
        return infos

    def open_input_file(self, path):
        return self._open(path)

    def open_input_stream(self, path):
        return self._open(path)


class _RetryingFile:
    """An fsspec file whose reads meeting a transient fault (``retry.classify``: a connection
    reset, a timeout, a 5xx) are tried again by ``retry.retry``, up to ``retries`` times with
    its backoff, on the file opened afresh at the same position. Other errors, and the last
    fault, propagate; everything else is the file's own (``close``, ``closed``: the one open
    now).

    Readers above retry whole units too; this retries the one range where it failed, and it
    is the only retry for what other libraries scan through arrowload's filesystem: DuckDB,
    given a pyarrow dataset by ``al.sql``, can hang after one failed read (README).
    """

    def __init__(self, f, reopen, retries: int, backoff_s: float) -> None:
        self._f, self._reopen, self._retries, self._backoff_s = f, reopen, retries, backoff_s

    def __getattr__(self, name):
        return getattr(self._f, name)

    def _again(self, call):
        pos = self._f.tell()
        tries = 0

        def attempt():
            nonlocal tries
            if tries:  # the file opened afresh where the failed read began
                try:
                    self._f.close()
                except Exception:  # noqa: BLE001 - a broken connection may not close cleanly
                    pass
                self._f = self._reopen()
                self._f.seek(pos)
            tries += 1
            return call(self._f)
        return retry(attempt, retries=self._retries, backoff_s=self._backoff_s)

    def read(self, size=-1):
        return self._again(lambda f: f.read(size))

    def readinto(self, buf):
        return self._again(lambda f: f.readinto(buf))


def _check_listed(path: str, listed: tuple[int | None, str | None, int | None], info: dict,
                  mtime_ns: int | None) -> None:
    """Raise SnapshotChangedError where ``info`` (the object now; ``mtime_ns`` its modification
    time) is not the version listed: another size, identity or modification time (a file
    rewritten in place keeps its size and, on a local disk, its inode)."""
    size, identity, listed_mtime = listed
    now_size, now_identity = info.get("size"), identity_from_info(info)
    if (size is not None and now_size is not None and now_size != size) or \
            (identity is not None and now_identity is not None and now_identity != identity) or \
            (listed_mtime is not None and mtime_ns is not None and listed_mtime != mtime_ns
             and not any(k in info for k in ("ETag", "etag", "generation"))):  # (a store's version
        # marker decides there: a listing and a HEAD may give its time in other precisions)
        raise files_changed_error([path], "the dataset", "it was listed",
                                  "open the dataset again (al.dataset(...)) to read the files as they "
                                  "are now, or pin() datasets whose files are rewritten in place")


def files_changed_error(changed: Sequence[str], under: str, since: str, fix: str) -> SnapshotChangedError:
    """The error for listed files (``changed``: their paths, as ``FileSource.changed_files``
    gives them) that changed under ``under`` (the loader, the dataset) after ``since``, and
    what to do (``fix``); it names the first."""
    return SnapshotChangedError(f"the data changed under {under}: {', '.join(changed[:3])} "
                                f"{'were' if len(changed) > 1 else 'was'} rewritten, added or removed "
                                f"after {since}; {fix}", changed[0])


def bind_listing(filesystem: pafs.FileSystem, entries, read_retries: int = 0,
                 backoff_s: float = 0.0) -> pafs.FileSystem:
    """``filesystem`` for reading the files ``entries`` listed: where it reaches an fsspec
    filesystem through arrowload's handler, a handler of its own that refuses a listed file
    rewritten since (its footer, read and cached then, would misread the new bytes), and
    retries a read that meets a transient fault (``read_retries``, ``_RetryingFile``)."""
    handler = getattr(filesystem, "handler", None)
    if isinstance(handler, _Handler):
        return pafs.PyFileSystem(handler.bound(entries, read_retries, backoff_s))
    return filesystem


def _chosen_cache(filesystem) -> bool:
    """Whether an fsspec filesystem's user chose its read cache: a ``default_cache_type``
    other than its class's default."""
    chosen = getattr(filesystem, "default_cache_type", None)
    if chosen is None:
        return False
    try:
        default = inspect.signature(type(filesystem).__init__).parameters["default_cache_type"].default
    except (KeyError, TypeError, ValueError):
        return False
    return chosen != default


def to_pyarrow_fs(filesystem: Any, *, keep_cache: bool | None = None) -> pafs.FileSystem:
    """Accept a pyarrow FileSystem or any fsspec AbstractFileSystem (its files read
    without fsspec's cache unless its user chose one, ``keep_cache``: see ``_Handler``)."""
    if isinstance(filesystem, pafs.FileSystem):
        return filesystem
    try:
        import fsspec
    except ImportError as exc:  # pragma: no cover - fsspec is a core dependency
        raise MissingDependencyError("fsspec is required for fsspec filesystems: "
                                     "pip install fsspec") from exc
    if isinstance(filesystem, fsspec.AbstractFileSystem):
        keep = _chosen_cache(filesystem) if keep_cache is None else keep_cache
        return pafs.PyFileSystem(_Handler(filesystem, None if keep else "none"))
    raise ArgumentTypeError(f"filesystem must be a pyarrow.fs.FileSystem or an fsspec filesystem, "
                            f"got {type(filesystem).__name__}; pass e.g. s3fs.S3FileSystem(...) or "
                            "pyarrow.fs.S3FileSystem(...), or leave it out and pass storage_options=")


# The package fsspec needs for each protocol: a missing one is a MissingDependencyError.
_PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs",
             "abfs": "adlfs", "abfss": "adlfs", "adl": "adlfs", "hf": "huggingface_hub",
             "http": "aiohttp", "https": "aiohttp", "sftp": "paramiko", "ssh": "paramiko"}
_CLOUD = {"s3fs", "gcsfs", "adlfs"}


def check_path(path: str) -> str:
    """``path`` as text pyarrow can use: bytes are decoded as the OS would (``os.fsdecode``);
    a name that is not valid UTF-8 (undecodable bytes, surrogate escapes) is a
    PathEncodingError, since pyarrow's filesystems take UTF-8 paths only."""
    if isinstance(path, (bytes, bytearray)):
        path = os.fsdecode(bytes(path))
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(path) if _surrogates_only(path) else path.encode("utf-8", "backslashreplace")
        raise PathEncodingError(f"path {shown!r} is not valid UTF-8; pyarrow (and so arrowload) reads "
                                "UTF-8 paths only: rename the file or folder (e.g. with convmv) and "
                                "pass the new name", path=path) from None
    return path


def _surrogates_only(text: str) -> bool:
    try:
        os.fsencode(text)
        return True
    except UnicodeError:
        return False


def canonical_local_path(path: str) -> str:
    """One spelling per local path: ``~`` expanded, absolute, normalized (``lake/``,
    ``/abs/lake``, ``/abs/lake/`` and ``/abs//lake/`` are all ``/abs/lake``), so what is keyed
    on paths (snapshots, loader states, caches) does not depend on how a path was written.
    Symbolic links are kept as written (a link is another name, not another spelling)."""
    p = os.path.abspath(os.path.expanduser(path))
    if p.startswith("//") and os.sep == "/":  # POSIX keeps a leading "//"; the kernel does not care
        p = "/" + p.lstrip("/")
    return p


def filesystem_for(path: str, storage_options: dict | None, *,
                   listing: bool = False) -> tuple[pafs.FileSystem, str]:
    """Pick a filesystem for a path / URI and return it with the path stripped of its scheme.

    ``listing=True``: the filesystem for the first calls (listing, lake-table probes), which
    fail fast on a wrong endpoint (see ``_default_options``); reads use the one built
    without it, which keeps the client's own retries of transient errors."""
    proto = protocol_of(path)
    if proto in (None, "file", "local"):
        if storage_options:
            raise InvalidArgumentError("storage_options apply to remote URIs only; got them with local "
                                       f"path {path!r}: drop storage_options, or use a URI "
                                       "(s3://bucket/path, gs://..., az://...)")
        local = path[len("file://"):] if proto == "file" else path
        return pafs.LocalFileSystem(), canonical_local_path(local)
    try:
        import fsspec
    except ImportError as exc:  # pragma: no cover
        raise MissingDependencyError("fsspec is required for URIs: pip install fsspec") from exc
    options = _default_options(proto, storage_options, listing)
    _refuse_missing_token_file(proto, path, options)
    try:
        fs = fsspec.filesystem(proto, **options)
    except ImportError as exc:
        package = _PACKAGES.get(proto)
        install = (f'pip install "arrowload[cloud]" (or pip install {package})' if package in _CLOUD
                   else f"pip install {package}" if package else "install the fsspec implementation for it")
        raise MissingDependencyError(f"reading {path!r} needs the {package or proto + '://'} package, "
                                     f"which is not installed: {install}") from exc
    except ValueError as exc:
        if "protocol" in str(exc).lower() and "known" in str(exc).lower():
            raise InvalidArgumentError(f"unknown URI scheme {proto}:// in {path!r}; use a local path "
                                       "or one of s3://, gs://, az://, file://, memory://, https:// "
                                       f"({exc})") from exc
        raise InvalidArgumentError(f"cannot set up the {proto}:// filesystem for {path!r} with "
                                   f"storage_options {sorted(options)}: {exc}") from exc
    except TypeError as exc:  # an option the filesystem does not take
        raise InvalidArgumentError(f"storage_options for {proto}:// are not accepted: {exc}; see the "
                                   f"options of {_type_name(proto)}") from exc
    return to_pyarrow_fs(fs, keep_cache="default_cache_type" in options), fs._strip_protocol(path)


def _refuse_missing_token_file(proto: str, path: str, options: dict) -> None:
    """gcsfs takes a ``token`` string that is no file for an OAuth access token and asks
    Google to check it: a mistyped credentials path became an HTTP or DNS error from the
    token endpoint. A token that names a JSON file which does not exist is refused here."""
    token = options.get("token")
    if proto in ("gs", "gcs") and isinstance(token, str) and token.lower().endswith(".json") \
            and not os.path.exists(os.path.expanduser(token)):
        raise StorageAccessError(f"storage_options={{'token': {token!r}}} for {path!r} names a credentials "
                                 f"file that does not exist; point it at a service-account JSON file, or set "
                                 f"{_HINTS['gs'].credentials}", path)


def _type_name(proto: str) -> str:
    package = _PACKAGES.get(proto)
    return f"{package}'s filesystem" if package else f"the {proto}:// filesystem"


def _default_options(proto: str, storage_options: dict | None, listing: bool = False) -> dict:
    """The user's storage_options, plus arrowload's defaults for filesystems it creates.

    Listing on s3fs: botocore retries once, quickly, unless ``config_kwargs={"retries": ...}``
    says otherwise. botocore cannot tell a refused connection (a wrong endpoint) from a blip
    and by default retries it for seconds; the listing is the first request, and arrowload
    retries what is transient there itself, so a wrong endpoint fails after one quick retry.
    Reads keep botocore's default retries: a 500 / 503 in the middle of a streaming scan is
    retried by the client, where arrowload could not restart the stream.
    """
    options = dict(storage_options or {})
    if listing and proto in ("s3", "s3a"):
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("retries", {"mode": "standard", "max_attempts": 1})
        options["config_kwargs"] = config
    return options


def _info(fs: pafs.FileSystem, path: str, retries: int, backoff: float, url: str) -> pafs.FileInfo:
    try:
        return retry(lambda: fs.get_file_info(path), retries=retries, backoff_s=backoff)
    except Exception as exc:  # noqa: BLE001 - translated where we can say more
        typed = storage_error(exc, url, local=isinstance(fs, pafs.LocalFileSystem))
        if typed is not None:
            raise typed from exc
        raise


def storage_error(exc: BaseException, url: str, path: str | None = None, *, local: bool = False):
    """The arrowload error for an object-store failure on ``url`` (a path or URI): missing or
    rejected credentials and denied access (StorageAccessError), an unreachable endpoint
    (StorageEndpointError), a name that is not UTF-8 (PathEncodingError); None for anything
    else (the caller handles it). ``local``: ``url`` is on the local disk, where a denial is
    about file permissions, not credentials."""
    from ..errors import ArrowloadError
    if isinstance(exc, ArrowloadError):
        return None
    path = path or url
    if isinstance(exc, TypeError) and "unexpected keyword argument" in str(exc) and not local:
        # an option the filesystem's client takes only at its first request (s3fs' session)
        proto = protocol_of(url)
        return InvalidArgumentError(f"storage_options for {url!r} are not accepted: {exc}; see the options "
                                    f"of {_type_name(proto) if proto else 'its filesystem'}", "storage_options")
    if isinstance(exc, UnicodeError):
        return PathEncodingError(f"a file name under {url!r} is not valid UTF-8 ({exc}); pyarrow (and "
                                 "so arrowload) reads UTF-8 names only: rename it (e.g. with convmv) "
                                 "or point at the other files", path)
    if local:
        if isinstance(exc, PermissionError):
            return StorageAccessError(f"permission denied reading {url!r} ({_detail(exc)}): make it "
                                      "readable (file permissions / ownership) or leave it out", path)
        return None
    kind = classify(exc)
    detail = _detail(exc)
    if kind == ENDPOINT:
        endpoint = _endpoint_of(detail)
        where = f"the endpoint {endpoint}" if endpoint else "the object store's endpoint"
        return StorageEndpointError(
            f"cannot reach {where} for {url!r}: the connection was refused or the host is unknown "
            f"({detail}). Check the endpoint: {_hints(url).endpoint} (for a filesystem you built: its "
            "endpoint, e.g. pyarrow S3FileSystem(endpoint_override=...))", path)
    if kind != PERMANENT:
        return None
    names = {c.__name__ for c in type(exc).__mro__}
    text = detail.lower()
    if names & {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"} or \
            "unable to locate credentials" in text or "no credentials" in text:
        return StorageAccessError(f"no credentials found for {url!r} ({detail}). Set them: "
                                  f"{_credentials_hint(url)}", path)
    if isinstance(exc, PermissionError) or "ClientError" in names or isinstance(exc, OSError) or \
            type(exc).__module__.startswith("azure.core"):
        if isinstance(exc, PermissionError) or DENIED.search(detail):
            return StorageAccessError(
                f"access denied to {url!r}: the object store rejected the credentials in use or "
                f"they lack permission ({detail}). Check {_credentials_hint(url, public=False)}, "
                f"and that they may list and read: {_hints(url).grants}", path)
    return None


@dataclass(frozen=True)
class _StoreHints:
    """What to tell the user of one object store: where its endpoint is set, the
    permissions a read needs, where credentials come from, how to read a public bucket."""

    endpoint: str
    grants: str
    credentials: str
    anon: str


_HINTS = {
    "gs": _StoreHints("storage_options={'endpoint_url': 'http://host:port'} or STORAGE_EMULATOR_HOST",
                      "storage.objects.list and storage.objects.get on the bucket",
                      "GOOGLE_APPLICATION_CREDENTIALS (a service-account file) or storage_options={'token': ...}",
                      "storage_options={'token': 'anon'}"),
    "az": _StoreHints("the account_name, or the BlobEndpoint of storage_options={'connection_string': ...} "
                      "(AZURE_STORAGE_CONNECTION_STRING)",
                      "the Storage Blob Data Reader role on the container, or a SAS token with read and list",
                      "AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY (or a SAS token), or "
                      "storage_options={'account_name': ..., 'account_key': ...}",
                      "storage_options={'anon': True}"),
    "s3": _StoreHints("storage_options={'endpoint_url': 'http://host:port'} or the AWS_ENDPOINT_URL environment "
                      "variable",
                      "the bucket policy grants s3:ListBucket and s3:GetObject",
                      "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or "
                      "storage_options={'key': ..., 'secret': ...}",
                      "storage_options={'anon': True}"),
}


def _hints(url: str) -> _StoreHints:
    """The hints for the store ``url`` is on (S3 where it cannot be told)."""
    proto = protocol_of(url) or ""
    return _HINTS["gs" if proto in ("gs", "gcs") else "az" if proto in ("az", "abfs", "abfss", "adl") else "s3"]


def _credentials_hint(url: str, public: bool = True) -> str:
    """Where credentials come from, for the store ``url`` is on."""
    hints = _hints(url)
    return f"{hints.credentials}; for a public bucket {hints.anon}" if public else hints.credentials


def _detail(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    cause = exc.__cause__ or exc.__context__
    if cause is not None and str(cause) and str(cause) not in text and len(text) < 40:
        text = f"{text}: {cause}"
    return " ".join(text.split())


_ENDPOINT_RE = re.compile(r'endpoint URL: "?(?P<url>[a-z][a-z0-9+.-]*://[^/"\s]+)|'
                          r"Failed to connect to (?P<host>[^\s;]+?)(?: port (?P<port>\d+))?(?:[\s;]|$)|"
                          r"Cannot connect to host (?P<aio>[^\s;]+)", re.IGNORECASE)


def _endpoint_of(text: str) -> str | None:
    """The endpoint a connection error names (botocore, pyarrow's curl, aiohttp), if any."""
    m = _ENDPOINT_RE.search(text)
    if not m:
        return None
    if m.group("host"):
        return m.group("host") + (f":{m.group('port')}" if m.group("port") else "")
    return m.group("url") or m.group("aio")


def _is_hidden(rel: str) -> bool:
    return any(part.startswith((".", "_")) and "=" not in part for part in rel.split("/"))


def _glob_matches(names: list[str], pattern: list[str]) -> bool:
    """Whether a path's components below the glob's base (``names``) match the glob's
    (``pattern``), as DuckDB's and Python's globs match: ``*``, ``?`` and ``[...]`` within
    one component (never across ``/``), ``**`` any number of folders. A hidden name (``.x``,
    ``_x``: ``_temporary``, ``_SUCCESS``) matches a wildcard only where the pattern's
    component starts with that character too, and never ``**``, as a folder's listing
    skips them."""
    if not pattern:
        return not names
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        if _glob_matches(names, rest):
            return True
        return bool(names) and not _is_hidden(names[0]) and _glob_matches(names[1:], pattern)
    if not names:
        return False
    name = names[0]
    if _GLOB_CHARS & set(head) and _is_hidden(name) and head[:1] != name[:1]:
        return False
    return fnmatch.fnmatchcase(name, head) and _glob_matches(names[1:], rest)


def list_files(fs: pafs.FileSystem, path: str, *, retries: int = 4,
               backoff: float = 0.05, url: str | None = None) -> tuple[str, list[FileEntry]]:
    """Expand one path (file, directory, or glob) into files, sorted by path.

    Returns ``(base_dir, entries)``: ``base_dir`` is where hive partition folders start.
    Hidden files and folders (``.x``, ``_x`` such as ``_SUCCESS``) inside a directory are skipped.
    ``url`` is the path as the user wrote it (``s3://...``), for error messages.
    """
    path = check_path(path)
    # "both/": the folder, where "both" is also a file (a URI's path lost its "/" in _strip_protocol)
    folder = len(path) > 1 and (path.endswith("/") or (url or "").endswith("/"))
    path = path.rstrip("/") if len(path) > 1 else path
    url = url or path
    inner = getattr(getattr(fs, "handler", None), "fs", None)
    if inner is not None and hasattr(inner, "invalidate_cache"):
        # fsspec filesystems are shared instances with listing caches: a new dataset lists
        # what is there now (sizes, mtimes and ETags of files rewritten since included)
        inner.invalidate_cache()
    if _GLOB_CHARS & set(path):
        parts = path.split("/")
        first = next(i for i, p in enumerate(parts) if _GLOB_CHARS & set(p))
        base = "/".join(parts[:first]) or "/"
        infos = _list_dir(fs, base, retries, backoff, original=url)
        pattern = parts[first:]
        matched = [i for i in infos if _glob_matches(i.path[len(base):].lstrip("/").split("/"), pattern)]
        if matched:
            return base, sorted((file_entry(i, fs) for i in matched), key=lambda e: e.path)
        # no match: a file or folder whose own name holds the wildcard ("q?dir/") is itself
        if _info(fs, path, retries, backoff, url).type == pafs.FileType.NotFound:
            raise PathNotFoundError(f"no files match the glob {url!r}; check the pattern", path)
    info = _info(fs, path, retries, backoff, url)
    if info.type == pafs.FileType.NotFound:
        raise PathNotFoundError(f"no such file or directory: {url!r}; check the path "
                                "(and storage_options / filesystem for remote URIs)", path)
    infos = (_list_dir(fs, path, retries, backoff, original=url) if info.type != pafs.FileType.File else
             _list_dir(fs, path + "/", retries, backoff, original=url) if folder else [])
    if info.type == pafs.FileType.File and not infos:
        return os.path.dirname(path), [file_entry(info, fs)]
    entries = sorted((file_entry(i, fs) for i in infos if not _is_hidden(i.path[len(path):].lstrip("/"))),
                     key=lambda e: e.path)
    if not entries:
        raise PathNotFoundError(f"directory {url!r} holds no data files", path)
    return path, entries


def _list_dir(fs: pafs.FileSystem, base: str, retries: int, backoff: float,
              original: str) -> list[pafs.FileInfo]:
    selector = pafs.FileSelector(base, recursive=True, allow_not_found=True)
    try:
        infos = retry(lambda: fs.get_file_info(selector), retries=retries, backoff_s=backoff)
        for i in infos:
            _ = i.path  # pyarrow decodes names here: a non-UTF-8 one fails now, not later
    except Exception as exc:  # noqa: BLE001 - translated where we can say more
        typed = storage_error(exc, original, local=isinstance(fs, pafs.LocalFileSystem))
        if isinstance(typed, PathEncodingError):
            typed = PathEncodingError(_undecodable_message(fs, base, original, exc), original)
        if typed is not None:
            raise typed from exc
        raise
    return [i for i in infos if i.type == pafs.FileType.File]


def file_entry(info: pafs.FileInfo, fs: pafs.FileSystem | None = None) -> FileEntry:
    mtime = info.mtime_ns if info.mtime is not None else None
    return FileEntry(info.path, info.size, mtime, identity_of(fs, info.path) if fs is not None else None)


def _undecodable_message(fs: pafs.FileSystem, base: str, original: str, exc: BaseException) -> str:
    """Name the files under ``base`` whose names are not UTF-8 (local folders only: a remote
    store's listing is already text)."""
    bad: list[bytes] = []
    if isinstance(fs, pafs.LocalFileSystem):
        for folder, dirs, names in os.walk(os.fsencode(base)):
            for name in dirs + names:
                try:
                    name.decode("utf-8")
                except UnicodeDecodeError:
                    bad.append(os.path.join(folder, name))
    shown = ", ".join(repr(b) for b in bad[:5]) + (" ..." if len(bad) > 5 else "")
    what = f"these names under {original!r} are not valid UTF-8: {shown}" if bad else \
        f"a file name under {original!r} is not valid UTF-8 ({exc})"
    return (f"{what}; pyarrow (and so arrowload) reads UTF-8 names only: rename them (e.g. with "
            "convmv) or point at the other files")


def write_object(uri: str, data: bytes, storage_options: dict | None, like: Any = None) -> None:
    """Write ``data`` to the object ``uri`` in one upload (object stores make an object
    visible whole or not at all). ``like``: a source whose files live on the same store
    (``root`` and ``filesystem``), whose filesystem -- credentials, endpoint -- is used
    where no ``storage_options`` are given."""
    proto = protocol_of(uri)
    root = getattr(like, "root", None)
    if storage_options is None and root is not None and protocol_of(str(root)) == proto:
        fs, stripped = like.filesystem, uri.split("://", 1)[1]
    else:
        fs, stripped = filesystem_for(uri, storage_options)
    try:
        with fs.open_output_stream(stripped) as f:
            f.write(data)
    except Exception as exc:  # noqa: BLE001 - translated where it is a storage failure
        typed = storage_error(exc, uri)
        if typed is None:
            raise
        raise typed from exc
