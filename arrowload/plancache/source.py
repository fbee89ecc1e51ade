"""The source of a cached Dataset: the committed entry's files, opened on first use.

``CachedSource`` is a ``FileSource`` (so every reader, decoder, pruning rule and loader
path treats the cache as the Parquet / Arrow IPC files it is) whose files are only known
once the entry is committed. Until then it answers what the plan alone knows (schema,
format, where it will be) and writes (or waits for) the entry the first time anything
needs the files: units, a scan, a count, a loader, the snapshot fingerprint.

``peeking()`` marks code that must never write (``explain()``, ``repr``): there a missing
entry raises ``CacheMissError`` instead of being written; a committed one is opened.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from datetime import datetime

import pyarrow as pa

from ..errors import SchemaMismatchError
from ..plan.nodes import scans
from ..source.files import FileSource
from .documents import Commit
from .entry import CacheMissError, Entry

_PEEK: contextvars.ContextVar[bool] = contextvars.ContextVar("arrowload_plancache_peek", default=False)
_OWN = frozenset({"entry", "_open_lock", "_opened", "kind", "_commit"})


@contextlib.contextmanager
def peeking():
    """Within the block, a cached source whose entry is not committed raises
    ``CacheMissError`` rather than writing it."""
    token = _PEEK.set(True)
    try:
        yield
    finally:
        _PEEK.reset(token)


class CachedSource(FileSource):
    """The files of a plan cache entry (see the module docstring). Thread-safe: the first
    user writes or waits, the others wait for it."""

    def __init__(self, entry: Entry) -> None:  # FileSource.__init__ runs when opened
        self.entry = entry
        self.kind = entry.data_format
        self._open_lock = threading.Lock()
        self._opened = False
        self._commit: Commit | None = None

    def __getattr__(self, name: str):
        # only attributes FileSource sets when it is built get here: open, then look again
        if name.startswith("__") or name in _OWN:
            raise AttributeError(name)
        self.open()
        return object.__getattribute__(self, name)

    def __getstate__(self):
        self.open()  # a copy sent elsewhere (a DataLoader worker) reads the committed files
        state = super().__getstate__()
        state.pop("_open_lock", None)
        return state

    def __setstate__(self, state) -> None:
        super().__setstate__(state)
        self._open_lock = threading.Lock()

    # -- opening -------------------------------------------------------------------------
    def open(self) -> Commit:
        """Write (or wait for) the entry if needed and open its files; the commit."""
        if self._opened:
            return self._commit
        with self._open_lock:
            if self._opened:
                return self._commit
            if _PEEK.get() and self.entry.committed() is None:
                raise CacheMissError(f"plan cache miss: {self.entry.url} is written on first use "
                                     "(count, to_arrow, to_batches, loader ...)")
            # the data the entry is keyed by is still there, as the plan's own reads check it:
            # a hit must not answer for files changed under the dataset (SnapshotChangedError)
            for scan in scans(self.entry.plan):
                verify = getattr(scan.source, "verify", None)
                if verify is not None:
                    verify()
            commit, files = self.entry.ensure()
            FileSource.__init__(self, self.entry.store.pafs, files, self.entry.data_format, self.entry.folder,
                                self._label(), partitioning=False, scan_options=self.entry.options.scan)
            written = FileSource.schema.fget(self)
            if not written.equals(self.entry.schema, check_metadata=False):
                raise SchemaMismatchError(
                    f"the plan cache entry {self.entry.url} holds columns of other types than the plan "
                    f"({written} vs {self.entry.schema}): {self.entry.data_format} cannot store some of "
                    "them as they are; use cache(format='ipc'), which stores every Arrow type")
            self._commit = commit
            self._opened = True
            return commit

    def verify(self) -> None:
        """Before every read (``Dataset._verify``), not only the first: the data the entry is
        keyed by is still there, as the plan's own reads check it (a cached dataset kept
        answering from the old rows after its source's files were rewritten, where the
        dataset itself raises ``SnapshotChangedError``); then the entry's own files."""
        for scan in scans(self.entry.plan):
            verify = getattr(scan.source, "verify", None)
            if verify is not None:
                verify()
        if self._opened:
            FileSource.verify(self)

    def _label(self) -> str:
        return f"plan cache {self.entry.key[:12]} ({self.entry.url})"

    @property
    def opened(self) -> bool:
        return self._opened

    def status(self) -> str:
        """One line for ``explain()``: a hit with its rows and time, or a miss (no write)."""
        commit = self._commit or self.entry.committed()
        if commit is None:
            return f"cache miss: will write {self.entry.url} ({self.entry.data_format}) on first use"
        written = commit.written_at.astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
        return f"cache hit: {self.entry.url}, {commit.num_rows:,} rows, written {written}"

    @property
    def written_at(self) -> datetime | None:
        commit = self._commit or self.entry.committed()
        return commit.written_at if commit is not None else None

    # -- what is known before the files are -------------------------------------------------
    @property
    def display(self) -> str:
        return self._label()

    @property
    def schema(self) -> pa.Schema:
        return self.entry.schema

    @property
    def partition_schema(self) -> pa.Schema:
        return pa.schema([])

    @property
    def is_local(self) -> bool:
        return self.entry.store.is_local
