"""A cache of plan output: ``Dataset.cache()`` writes what an expensive plan computes once
(Parquet or Arrow IPC, local disk or object storage), keyed by the plan's fingerprint and
the snapshot of its sources; later runs and every rank read it. See ``entry.py`` for the
write-once protocol and ``formats/plan_cache/v1`` for the commit document."""

from __future__ import annotations

from .catalog import CacheEntry, cache_entries, clear_cache
from .entry import CacheMissError, Entry, check_cacheable
from .source import CachedSource, peeking
from .store import Store

__all__ = ["CacheEntry", "CacheMissError", "CachedSource", "Entry", "Store", "cache_entries", "check_cacheable",
           "clear_cache", "peeking"]
