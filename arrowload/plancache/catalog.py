"""What a cache root holds, and clearing it: ``al.cache_entries`` / ``al.clear_cache`` and
``arrowload cache ls | clear``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from ..errors import ArgumentTypeError, ArrowloadError, InvalidArgumentError
from .documents import decode, read_commit
from .entry import COMMIT_NAME, LOCK_NAME
from .lock import looks_live
from .store import Store

_KEY = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True)
class CacheEntry:
    """One entry of a plan cache.

    ``state``: ``"committed"`` (readers use it), ``"writing"`` (no commit yet, its writer
    looks alive), ``"incomplete"`` (no commit and no live writer: a writer crashed; the next
    use rewrites it) or ``"damaged"`` (a commit document that does not read; rewritten on
    next use). ``bytes`` counts everything stored in the entry's folder; ``rows``,
    ``written_at``, ``snapshot``, ``summary`` and ``data_format`` come from the commit."""

    key: str
    uri: str
    state: str
    bytes: int
    rows: int | None = None
    written_at: datetime | None = None
    snapshot: str | None = None
    summary: str | None = None
    data_format: str | None = None
    name: str | None = None


def cache_entries(uri: str | None = None, *, storage_options: dict | None = None) -> list[CacheEntry]:
    """The entries under a cache root (``uri``: a folder or object-store URI; default the
    user cache dir), newest first, entries without a commit last. Reads each entry's commit
    document and lists its folder; reads no data.

    >>> import arrowload as al
    >>> [e.key[:12] for e in al.cache_entries("/nonexistent/cache")]
    []
    """
    store = Store(uri, storage_options)
    return _entries(store)


def _entries(store: Store) -> list[CacheEntry]:
    plans = store.join("plans")
    out = []
    for key in store.children(plans):
        if not _KEY.fullmatch(key):
            continue
        folder = store.join("plans", key)
        size = store.size_of_tree(folder)
        commit_path = store.join("plans", key, COMMIT_NAME)
        data = store.read(commit_path)
        if data is not None:
            try:
                c = read_commit(decode(data, commit_path), store.url(commit_path))
            except ArrowloadError:
                out.append(CacheEntry(key, store.url(folder), "damaged", size))
                continue
            out.append(CacheEntry(key, store.url(folder), "committed", size, c.num_rows, c.written_at,
                                  c.snapshot, c.summary, c.data_format, c.name))
            continue
        live = looks_live(store, store.join("plans", key, LOCK_NAME))
        out.append(CacheEntry(key, store.url(folder), "writing" if live else "incomplete", size))
    epoch = datetime.min.replace(tzinfo=timezone.utc)
    out.sort(key=lambda e: (e.written_at is None, -(e.written_at or epoch).timestamp() if e.written_at else 0,
                            e.key))
    return out


def clear_cache(uri: str | None = None, *, keys: list[str] | tuple[str, ...] | None = None,
                older_than: float | timedelta | None = None,
                storage_options: dict | None = None) -> list[CacheEntry]:
    """Remove entries of a cache root; the entries removed.

    ``keys``: entries to remove, by key or a unique prefix of one (at least 6 hex digits;
    ``cache ls`` shows 12); default all. ``older_than``: only committed entries written more
    than this long ago (days, or a ``timedelta``); entries without a commit and without a
    live writer (a crashed writer's files) are removed by any clear. An entry whose writer
    is at work is left alone. A removed entry's commit goes first, so no reader trusts
    files that are being removed."""
    if older_than is not None:
        if isinstance(older_than, bool) or not isinstance(older_than, (int, float, timedelta)):
            raise ArgumentTypeError(f"older_than takes days (a number) or a datetime.timedelta, got "
                                    f"{type(older_than).__name__}", "older_than")
        age = older_than if isinstance(older_than, timedelta) else timedelta(days=float(older_than))
        if age < timedelta(0):
            raise InvalidArgumentError(f"older_than must be >= 0, got {older_than!r}", "older_than")
    if isinstance(keys, str):
        raise ArgumentTypeError(f"keys takes a list of keys, got the string {keys!r}; write keys=[{keys!r}]",
                                "keys")
    store = Store(uri, storage_options)
    entries = _entries(store)
    chosen = entries if keys is None else _by_prefix(entries, list(keys), store)
    removed = []
    cutoff = datetime.now(timezone.utc) - age if older_than is not None else None
    for e in chosen:
        if e.state == "writing":
            continue
        if cutoff is not None and e.state == "committed" and e.written_at is not None and e.written_at > cutoff:
            continue
        if e.state != "committed" and looks_live(store, store.join("plans", e.key, LOCK_NAME)):
            continue  # a writer took the crashed writer's entry over since it was listed
        store.delete(store.join("plans", e.key, COMMIT_NAME))
        store.remove_tree(store.join("plans", e.key))
        removed.append(e)
    return removed


def _by_prefix(entries: list[CacheEntry], keys: list[str], store: Store) -> list[CacheEntry]:
    out = []
    for k in keys:
        if not isinstance(k, str) or not re.fullmatch(r"[0-9a-f]{6,32}", k):
            raise InvalidArgumentError(f"cache key {k!r} is not 6 to 32 lower-case hex digits (a key or "
                                       "the start of one, as `arrowload cache ls` shows them)", "keys")
        found = [e for e in entries if e.key.startswith(k)]
        if not found:
            raise InvalidArgumentError(f"no plan cache entry {k!r} under {store.url(store.join('plans'))}; "
                                       "`arrowload cache ls` lists them", "keys")
        if len(found) > 1:
            raise InvalidArgumentError(f"cache key {k!r} starts {len(found)} entries "
                                       f"({', '.join(e.key[:12] for e in found)}); give more digits", "keys")
        if found[0] not in out:
            out.append(found[0])
    return out
