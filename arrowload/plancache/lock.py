"""One writer per cache entry: a lock document created only if absent (see ``store.py``
for what each store guarantees), kept alive by a heartbeat, taken over when stale.

The holder rewrites the lock every ``HEARTBEAT_S`` seconds (its ``beat`` grows, so its
version changes). A waiter judges a lock stale when

- its holder ran on this host and its process is gone (at once), or
- the waiter has watched it for ``stale_after`` seconds of its own clock without a new
  version (no clock of another machine is trusted), or
- the store's modification time is older than ``stale_after`` plus ``CLOCK_SKEW_S`` by the
  waiter's wall clock (a lock left long ago need not be watched for a whole period).

A stale lock is removed only while it is still the version judged (a conditional delete:
S3 ``If-Match``; locally it is moved aside atomically and put back if it changed), and the
waiter then competes for a fresh lock like any other.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from datetime import datetime, timezone

from ..errors import ArrowloadError
from .documents import LockDoc, decode, encode, read_lock
from .store import Stat, Store

HEARTBEAT_S = 10.0
STALE_AFTER_S = 60.0
CLOCK_SKEW_S = 300.0
HOST = socket.gethostname()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


class HeldLock:
    """A lock this process holds, with its heartbeat thread; ``release()`` ends both."""

    def __init__(self, store: Store, path: str, doc: LockDoc, tag: str | None) -> None:
        self.store, self.path, self.doc, self.tag = store, path, doc, tag
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="arrowload-cache-heartbeat", daemon=True)
        self._thread.start()

    @property
    def token(self) -> str:
        return self.doc.token

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            doc = LockDoc(self.doc.key, self.doc.token, self.doc.host, self.doc.pid, self.doc.started_at,
                          self.doc.beat + 1)
            try:
                ok = self.store.replace(self.path, encode(doc.to_doc()), if_tag=self.tag)
                st = self.store.stat(self.path) if ok else None
            except Exception:  # noqa: BLE001 - a missed beat is retried; waiters allow several
                continue
            if not ok or st is None:
                self.lost = True  # taken over: the commit (create-if-absent) still decides
                return
            self.doc, self.tag = doc, st.tag

    def release(self) -> None:
        self._stop.set()
        self._thread.join()
        if not self.lost:
            try:
                self.store.delete(self.path, if_tag=self.tag)
            except Exception:  # noqa: BLE001 - a lock left behind goes stale and is taken over
                pass


def try_acquire(store: Store, path: str, key: str) -> HeldLock | None:
    """The lock, if this call created it; None while another writer holds it."""
    doc = LockDoc(key, uuid.uuid4().hex[:16], HOST, os.getpid(), datetime.now(timezone.utc), 0)
    if not store.create(path, encode(doc.to_doc())):
        return None
    st = store.stat(path)
    return HeldLock(store, path, doc, st.tag if st is not None else None)


class Watcher:
    """A waiter's view of another writer's lock over time."""

    def __init__(self, store: Store, path: str, stale_after: float) -> None:
        self.store, self.path, self.stale_after = store, path, stale_after
        self._tag: str | None = None
        self._since = time.monotonic()
        self.stat: Stat | None = None
        self.doc: LockDoc | None = None

    def check(self) -> str:
        """``"absent"``, ``"live"`` or ``"stale"``."""
        st = self.stat = self.store.stat(self.path)
        if st is None:
            return "absent"
        if st.tag != self._tag:
            self._tag, self._since = st.tag, time.monotonic()
            data = self.store.read(self.path)
            try:
                self.doc = read_lock(decode(data, self.path), self.path) if data is not None else None
            except ArrowloadError:
                self.doc = None  # unreadable: judged by its age alone
        doc = self.doc
        if doc is not None and doc.host == HOST and not pid_alive(doc.pid):
            return "stale"
        if time.monotonic() - self._since >= self.stale_after:
            return "stale"
        if time.time() - st.mtime > self.stale_after + CLOCK_SKEW_S:
            return "stale"
        return "live"

    def break_stale(self) -> bool:
        """Remove the lock judged stale, only if it is still that version."""
        return self._tag is not None and self.store.delete(self.path, if_tag=self._tag)

    def describe(self) -> str:
        doc = self.doc
        who = f"writer {doc.host}:{doc.pid} since {doc.started_at:%Y-%m-%d %H:%M:%S} UTC" if doc else \
            "an unknown writer"
        age = f", last heartbeat {time.time() - self.stat.mtime:.0f}s ago" if self.stat else ""
        return who + age


def looks_live(store: Store, path: str, stale_after: float = STALE_AFTER_S) -> bool:
    """One look at a lock (for listings and clearing, which do not wait): held by a live
    writer unless absent, its process on this host is gone, or it is older than
    ``stale_after`` (plus ``CLOCK_SKEW_S`` on object storage, whose clock is not ours)."""
    st = store.stat(path)
    if st is None:
        return False
    data = store.read(path)
    try:
        doc = read_lock(decode(data, path), path) if data is not None else None
    except ArrowloadError:
        doc = None
    if doc is not None and doc.host == HOST and not pid_alive(doc.pid):
        return False
    allowance = stale_after + (0.0 if store.fs is None else CLOCK_SKEW_S)
    return time.time() - st.mtime <= allowance
