"""What any layer may ask of polars without importing it: whether this process has it
imported, whether it was forked from one that had (polars' thread pool does not survive
a fork, and a query there could wait forever for it), and polars' sort where it is usable.

Kept apart from ``scan/stream.py`` so that the pure ``order`` package can use the sort
without depending on the scan.
"""

from __future__ import annotations

import functools
import os
import sys

import numpy as np

#: this process is a fork of one that had imported polars (a DataLoader worker forked from
#: a process that read with polars)
_forked_with_polars = False


def _after_fork_in_child() -> None:
    global _forked_with_polars
    if "polars" in sys.modules:
        _forked_with_polars = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def forked_with_polars() -> bool:
    """Whether this process was forked from one that had imported polars (see above)."""
    return _forked_with_polars


class PolarsAfterFork(RuntimeError):
    """polars was asked to run in a process forked from one that had imported it: its
    thread pool did not survive the fork, so a query would wait forever. Raised before
    any query starts; every caller's fallback (another decoder) answers instead."""


def refuse_after_fork() -> None:
    """Raise :class:`PolarsAfterFork` in a process forked with polars imported."""
    if _forked_with_polars:
        raise PolarsAfterFork("polars' thread pool did not survive this process's fork (a DataLoader "
                              "worker?): reading with another decoder")


def polars_imported() -> bool:
    """Whether polars is imported (and not still being imported by another thread)."""
    mod = sys.modules.get("polars")
    return mod is not None and not getattr(getattr(mod, "__spec__", None), "_initializing", False)


#: fewer values: numpy's sort costs about what handing them to polars does
SORT_MIN = 1 << 14


def polars_sorts(size: int) -> bool:
    """Whether :func:`sort_distinct` sorts ``size`` values by polars (else numpy)."""
    return size >= SORT_MIN and polars_imported() and not forked_with_polars()


def sort_distinct(values: np.ndarray) -> np.ndarray:
    """``np.sort(values)`` of a 1-D uint64 array of distinct values, where it is cheaper: by
    polars (one thread, the GIL released) where polars is imported and usable here, else
    numpy. Distinct values have one sorted order, so both give the same array. Measured on
    the 2-core benchmark machine (numpy 2.4, polars 2.1; thread CPU ms, medians of 9):
    65,536 values 2.3 by numpy against 0.8 by polars, 524,288 24.8 against 7.4, 4,194,304
    249 against 67. The result may be ``values`` sorted in place."""
    if polars_sorts(values.size):
        pl = sys.modules["polars"]
        try:
            out = pl.Series(values, dtype=pl.UInt64).sort(multithreaded=False).to_numpy()
        except Exception:  # noqa: BLE001 - numpy's sort answers the same
            out = None
        if out is not None and out.shape == values.shape and out.dtype == np.uint64:
            return out
    values.sort()
    return values


#: names zoneinfo finds in the system's database that are not IANA zone names polars knows
_NOT_IANA = frozenset({"localtime", "Factory", "posixrules"})


@functools.lru_cache(maxsize=256)
def polars_zone(tz: str | None) -> bool:
    """Whether polars parses the time zone ``tz`` of an Arrow timestamp: none, or a name of
    the IANA database (Python's ``zoneinfo`` knows it; each of its 599 names on this
    machine but ``localtime`` and ``Factory`` polars 2.1 parses too). A fixed offset (``'+05:30'``), which
    Arrow, Parquet and DuckDB accept, makes polars panic whenever a file's schema holds it,
    even in a column the query does not read."""
    if tz is None or tz == "UTC":
        return True
    if tz[:1] in "+-" or not tz.strip() or tz in _NOT_IANA or tz.startswith(("posix/", "right/")):
        return False
    try:
        import zoneinfo
        zoneinfo.ZoneInfo(tz)
    except (ValueError, OSError, LookupError):  # ZoneInfoNotFoundError is a KeyError
        return False
    return True


def polars_zones_ok(t) -> bool:
    """Whether every timestamp in Arrow type ``t`` (nested ones too) has a zone polars
    parses (``polars_zone``)."""
    import pyarrow as pa
    if pa.types.is_timestamp(t):
        return polars_zone(t.tz)
    if isinstance(t, pa.ExtensionType):
        return polars_zones_ok(t.storage_type)
    if pa.types.is_dictionary(t):
        return polars_zones_ok(t.value_type)
    if pa.types.is_map(t):
        return polars_zones_ok(t.key_type) and polars_zones_ok(t.item_type)
    if pa.types.is_struct(t):
        return all(polars_zones_ok(t.field(i).type) for i in range(t.num_fields))
    if hasattr(t, "value_type"):  # lists of every kind
        return polars_zones_ok(t.value_type)
    return True
