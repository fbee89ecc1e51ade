"""One cache entry: the key of a plan over a snapshot, and the write-once protocol.

An entry is the folder ``<root>/plans/<key>/``:

- ``<attempt>/part-00000.parquet`` ...: the plan's output, written by one writer into a
  folder of its own (the lock's token), so a writer that was taken over for being stale
  can never mix its files with another's;
- ``commit.json`` (``formats/plan_cache/v1``): written last, create-if-absent; its
  presence is the commit, and it lists the files (with rows and bytes) readers use;
- ``writer.lock`` (``formats/plan_cache_lock/v1``): present while someone writes.

``Entry.ensure()`` returns the committed entry, writing it first if needed: readers only
trust a commit whose files are all there with their sizes; everyone else waits for the
writer (bounded by ``wait_timeout``), takes over a stale lock, or writes when the lock is
free. A damaged commit (unreadable, missing files) is removed under the lock and rewritten.
"""

from __future__ import annotations

import errno
import hashlib
import os
import time
from datetime import datetime, timezone

import pyarrow as pa

from ..errors import ArrowloadError, CacheLockTimeoutError, UncacheablePlanError
from ..options import Options
from ..optimize import optimize
from ..plan.explain import describe_node
from ..plan.fingerprint import plan_fingerprint
from ..plan.nodes import Map, Plan, scans, walk
from ..scan import execute
from ..source import MemorySource
from ..source.filesystem import FileEntry
from .documents import Commit, decode, encode, read_commit
from .lock import HOST, STALE_AFTER_S, HeldLock, Watcher, try_acquire
from .store import Store
from .writer import write_files

KEY_FORMAT = "arrowload.plan_cache/v1"
COMMIT_NAME = "commit.json"
LOCK_NAME = "writer.lock"


def check_cacheable(plan: Plan, key: str | None) -> None:
    """A plan whose identity arrowload cannot compute cannot be cached without ``key``: a
    ``map()`` without a ``name`` is fingerprinted by its function's ``module.qualname``
    only (``plan/fingerprint.py``), which stays the same when its code changes."""
    if key is not None:
        return
    from ..plan.nodes import SqlQuery
    from ..scan.duck import reads_outside
    outside = [n for n in walk(plan) if isinstance(n, SqlQuery) and reads_outside(n)]
    if outside:
        raise UncacheablePlanError(
            "cannot cache this plan: its SQL reads data by itself (read_parquet(...), a quoted file path, "
            "the environment ...) beside its bound tables, and a cache keyed on the bound tables would "
            "serve stale rows when that data changes. Bind the data as a table (al.sql(query, name="
            "al.dataset(...))), or pass the version of the whole plan: .cache(key='v1')")
    unnamed = [n for n in walk(plan) if isinstance(n, Map) and not n.name]
    if unnamed:
        fn = unnamed[0].fn
        what = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"
        raise UncacheablePlanError(
            f"cannot cache this plan: its map({what}) has no name, and arrowload cannot fingerprint a "
            "function's code (its name stays the same when the code changes, so a cache keyed on it "
            "would serve stale rows). Name the version of the function: ds.map(fn, name='fn-v1') "
            "(change the name when the code changes), or pass the version of the whole plan: "
            "ds.cache(key='v1')")


def _snapshot_key(plan: Plan) -> str:
    """The snapshot of every source under ``plan``, as one digest.

    Each source's ``snapshot_id`` (files: a digest of paths, sizes, modification times and
    identities; a Delta table: its URI and version), a full digest of in-memory data (its
    snapshot id samples only the first and last slices: too weak for a cache that outlives
    the process), and the key of a cached dataset (no need to write it to know what it
    holds)."""
    h = hashlib.sha256(b"snapshot\n")
    for s in scans(plan):
        src = s.source
        entry = getattr(src, "entry", None)  # a cached dataset (plancache/source.py)
        if isinstance(entry, Entry):
            part = "cache:" + entry.key
        elif isinstance(src, MemorySource):
            part = "memory:" + _memory_digest(src)
        else:
            part = "source:" + src.snapshot_id
            files = getattr(src, "files_id", None)
            if files is not None and files != src.snapshot_id:
                # a lake table's id is its URI and version: a table deleted and written again
                # starts at version 0 once more, with other files
                part += "\n" + files
        h.update(part.encode() + b"\n")
    return h.hexdigest()[:32]



def _memory_digest(src: MemorySource) -> str:
    h = hashlib.sha256(src.schema.to_string().encode())
    for batch in src.dataset(None).to_batches():
        for col in batch.columns:
            _digest_array(h, col)
    return h.hexdigest()[:32]


def _digest_array(h, arr: pa.Array) -> None:
    """``arr``'s buffers (its children's included) and its dictionaries' into ``h``: an
    array's ``buffers()`` holds a dictionary's indices, not its values (two tables of the
    same indices over other dictionaries read each other's cache)."""
    h.update(f"{arr.offset}:{len(arr)}".encode())
    for buf in arr.buffers():
        h.update(b"-" if buf is None else memoryview(buf))
    for dictionary in _dictionaries(arr):
        h.update(b"dictionary")
        _digest_array(h, dictionary)


def _dictionaries(arr: pa.Array):
    t = arr.type
    if pa.types.is_dictionary(t):
        yield arr.dictionary
    elif isinstance(t, pa.BaseExtensionType):
        yield from _dictionaries(arr.storage)
    elif pa.types.is_struct(t):
        for k in range(t.num_fields):
            yield from _dictionaries(arr.field(k))
    elif hasattr(arr, "values") and hasattr(t, "value_type"):  # lists, maps
        yield from _dictionaries(arr.values)


def summarize(plan: Plan, width: int = 240) -> str:
    """The plan on one line: its nodes, outermost first."""
    text = " <- ".join(describe_node(n) for n in walk(plan))
    return text if len(text) <= width else text[: width - 1] + "…"


class Entry:
    """The cache entry of ``plan`` in ``store``; nothing is read or written until asked."""

    def __init__(self, plan: Plan, options: Options, store: Store, data_format: str, name: str | None,
                 wait_timeout: float, stale_after: float = STALE_AFTER_S) -> None:
        check_cacheable(plan, name)
        self.plan, self.options, self.store = plan, options, store
        self.data_format, self.name = data_format, name
        self.wait_timeout, self.stale_after = wait_timeout, stale_after
        self.plan_key = plan_fingerprint(plan, data=False)
        self.snapshot = _snapshot_key(plan)
        doc = f"{KEY_FORMAT}\nplan={self.plan_key}\nsnapshot={self.snapshot}\nformat={data_format}\n" \
              f"name={name if name is not None else ''}"
        self.key = hashlib.sha256(doc.encode()).hexdigest()[:32]
        self.folder = store.join("plans", self.key)
        self.commit_path = store.join("plans", self.key, COMMIT_NAME)
        self.lock_path = store.join("plans", self.key, LOCK_NAME)
        self.schema = plan.schema
        self.summary = summarize(plan)

    @property
    def url(self) -> str:
        return self.store.url(self.folder)

    # -- reading -----------------------------------------------------------------------
    def committed(self) -> Commit | None:
        """The commit, if one exists and reads as valid (files are not checked): a peek."""
        try:
            return self._read_commit()
        except ArrowloadError:
            return None

    def _read_commit(self) -> Commit | None:
        data = self.store.read(self.commit_path)
        if data is None:
            return None
        commit = read_commit(decode(data, self.commit_path), self.store.url(self.commit_path))
        if commit.key != self.key or commit.data_format != self.data_format:
            from ..errors import CorruptFileError
            raise CorruptFileError(f"{self.store.url(self.commit_path)}: commit of key {commit.key} "
                                   f"({commit.data_format}) in the folder of {self.key} "
                                   f"({self.data_format}); the entry is rewritten", self.commit_path)
        return commit

    def _files(self, commit: Commit) -> list[FileEntry] | None:
        """The committed files as a source lists them; None if any is missing or resized."""
        paths = [self.store.join(self.folder, *f.path.split("/")) if self.store.fs is None
                 else f"{self.folder}/{f.path}" for f in commit.files]
        try:
            entries = self.store.file_entries(paths)
        except (FileNotFoundError, OSError):
            return None
        if any(e.size != f.bytes for e, f in zip(entries, commit.files)):
            return None
        return entries

    def _usable(self) -> tuple[Commit, list[FileEntry]] | None | str:
        """A verified commit with its files; None without one; ``"damaged"`` for a commit
        that cannot be trusted (unreadable, another key, files missing or resized)."""
        try:
            commit = self._read_commit()
        except ArrowloadError:
            return "damaged"
        if commit is None:
            return None
        files = self._files(commit)
        return (commit, files) if files is not None else "damaged"

    # -- the protocol ------------------------------------------------------------------
    def ensure(self) -> tuple[Commit, list[FileEntry]]:
        """The committed entry and its files, writing it first when no one has: see the
        module docstring. Raises ``CacheLockTimeoutError`` when another writer holds the
        lock for longer than ``wait_timeout`` seconds."""
        deadline = time.monotonic() + self.wait_timeout
        watcher = Watcher(self.store, self.lock_path, self.stale_after)
        pause = 0.02
        while True:
            found = self._usable()
            if isinstance(found, tuple):
                return found
            try:
                lock = try_acquire(self.store, self.lock_path, self.key)
            except OSError as exc:  # its lock document is the entry's first write
                if _storage_full(exc):
                    raise self._full(exc) from exc
                raise
            if lock is not None:
                try:
                    return self._write_locked(lock)
                finally:
                    lock.release()
            state = watcher.check()
            if state == "stale":
                watcher.break_stale()
                continue
            if state == "live" and time.monotonic() > deadline:
                raise CacheLockTimeoutError(
                    f"waited {self.wait_timeout:g}s for the plan cache entry {self.url} while "
                    f"{watcher.describe()} holds its lock {self.store.url(self.lock_path)}; wait "
                    "longer (cache(wait_timeout=...)), or, if that writer is gone, remove the lock "
                    f"(it is also taken over once its heartbeat is {self.stale_after:g}s old)",
                    self.store.url(self.lock_path))
            time.sleep(pause)
            pause = min(1.0, pause * 1.5)

    def _full(self, exc: OSError):
        """The error for a write of this entry the storage cannot take (no space, a quota, a
        file size limit): ``CacheWriteError`` naming the entry."""
        from ..errors import CacheWriteError
        return CacheWriteError(f"writing the plan cache entry {self.url} failed: the storage cannot take it "
                               f"({exc}); the partial entry is removed. Free space there, or cache to another "
                               "place (cache(uri=...), $ARROWLOAD_CACHE_DIR)", self.url)

    def _write_locked(self, lock: HeldLock) -> tuple[Commit, list[FileEntry]]:
        found = self._usable()  # committed by another writer between our look and our lock
        if isinstance(found, tuple):
            return found
        if found == "damaged":
            self.store.delete(self.commit_path)
        attempt = lock.token
        attempt_folder = self.store.join(self.folder, attempt) if self.store.fs is None \
            else f"{self.folder}/{attempt}"
        batches = _Reads(iter(()))
        try:
            self.store.make_folder(attempt_folder)
            batches = _Reads(execute.iter_batches(optimize(self.plan, self.options.optimizer), self.options,
                                                  ordered=True))
            files = write_files(batches, self.schema, self.store, attempt_folder, attempt, self.data_format)
            commit = Commit(self.key, self.plan_key, self.snapshot, self.name, self.summary, self.data_format,
                            self.schema.to_string(), sum(f.rows for f in files), sum(f.bytes for f in files),
                            tuple(files), datetime.now(timezone.utc), {"host": HOST, "pid": os.getpid()})
            won = self.store.create(self.commit_path, encode(commit.to_doc()))
        except BaseException as exc:
            self.store.remove_tree(attempt_folder)
            if batches.failed is None and _storage_full(exc):  # the cache's own writes, not the plan's reads
                raise self._full(exc) from exc
            raise
        if not won:  # a writer taken over as stale finished after all: its commit stands
            self.store.remove_tree(attempt_folder)
            found = self._usable()
            if isinstance(found, tuple):
                return found
            raise CacheLockTimeoutError(f"{self.url}: another writer committed an entry that cannot be "
                                        "read back; clear it (arrowload cache clear "
                                        f"{self.key[:12]}) and run again", self.commit_path)
        for child in self.store.children(self.folder):  # attempts of writers that died
            if child not in (attempt, COMMIT_NAME, LOCK_NAME) and not child.startswith("."):
                self.store.remove_tree(self.store.join(self.folder, child) if self.store.fs is None
                                       else f"{self.folder}/{child}")
        files_found = self._files(commit)
        if files_found is None:
            from ..errors import InternalError
            raise InternalError(f"{self.url}: the files just written are not all there (a bug, or "
                                "someone removed them meanwhile)")
        return commit, files_found


#: errnos of storage that cannot take a write: full, over a quota, past a file size limit
_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def _storage_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it was raised from) is the storage refusing a write for
    room: its errno, never its text (a source's path or a message may say "quota")."""
    for _ in range(8):  # (a chain of causes, never a long one)
        if exc is None:
            return False
        if isinstance(exc, OSError) and exc.errno in _FULL:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class _Reads:
    """The plan's batches, remembering an error of theirs (a source's, a ``map()``'s): that
    one is never the cache's storage being full, whatever it says."""

    def __init__(self, batches) -> None:
        self._it = iter(batches)
        self.failed: BaseException | None = None

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self._it)
        except StopIteration:
            raise
        except BaseException as exc:
            self.failed = exc
            raise


class CacheMissError(ArrowloadError, LookupError):
    """Raised only while peeking (``explain()``, ``repr``): the entry is not written yet,
    and peeking never writes. Never reaches the user from a method that reads data."""
