"""What any layer may ask of polars without importing it: whether this process has it
imported, whether it was forked from one that had (polars' thread pool does not survive
a fork, and a query there could wait forever for it), and polars' sort where it is usable.

Kept apart from ``scan/stream.py`` so that the pure ``order`` package can use the sort
without depending on the scan.
"""

from __future__ import annotations

import functools
import os
import re
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
_OFFSET = re.compile(r"([+-]?)(\d{2}):?(\d{2})")


def polars_zone(tz: str | None) -> bool:
    """Whether polars parses the time zone ``tz`` of an Arrow timestamp. polars panics on a
    zone it cannot parse whenever a file's schema holds one, even in a column a query does
    not read (a fixed offset such as ``'+05:30'``, which Arrow, Parquet and DuckDB accept).
    Where polars is imported it is asked (its own zone database decides); before, a close
    guess (``_zone_guess``): a wrong yes costs a stream that ends early and is read per
    unit instead, a wrong no a slower decoder."""
    if tz is None or tz == "UTC":
        return True
    if "polars" in sys.modules:
        return _polars_parses(tz)
    return _zone_guess(tz)


@functools.lru_cache(maxsize=256)
def _polars_parses(tz: str) -> bool:
    import polars as pl
    import pyarrow as pa
    try:
        pl.from_arrow(pa.array([], pa.timestamp("us", tz)))
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # noqa: BLE001 - its ComputeError, or a panic
        return False
    return True


@functools.lru_cache(maxsize=256)
def _zone_guess(tz: str) -> bool:
    """polars 2.1's rules, as measured: offsets of whole hours (``'-03:00'``, ``'+0500'``,
    ``'00:00'``: as ``Etc/GMT`` zones, -12 to +14 hours), ``utc``, and the IANA names of
    the system's zone database but ``localtime`` and ``Factory`` (all of its 599 names on
    this machine otherwise; without a database, any name)."""
    m = _OFFSET.fullmatch(tz)
    if m:
        sign, hours, minutes = m.group(1) or "+", int(m.group(2)), int(m.group(3))
        return minutes == 0 and hours <= (14 if sign == "+" else 12)
    if tz == "utc":
        return True
    if tz in _NOT_IANA or tz.startswith(("posix/", "right/")) or not re.fullmatch(r"[A-Za-z][\w+\-/]*", tz):
        return False
    import zoneinfo
    try:
        zoneinfo.ZoneInfo(tz)
    except (ValueError, OSError, LookupError):  # ZoneInfoNotFoundError is a KeyError
        return not zoneinfo.available_timezones()  # no database here: polars has its own
    return True
