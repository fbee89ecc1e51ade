"""The order of one epoch, as integer arithmetic.

Rows are numbered ``0..N-1`` in source order (files sorted by path, then row groups,
then rows; after filtering), grouped into units (row groups / files / chunks) of known
``counts``. An epoch is a sequence of those rows, a pure function of
``(counts, kind, seed, epoch, window)``; rank ``r`` of ``w`` takes positions
``[r*per, (r+1)*per)`` with ``per = N // w`` (the remainder, fewer than ``w`` rows, is
left out of that epoch). Resuming at position ``k`` is ``row_at(start + k ...)``: no
reading or discarding of the rows before it.

Kinds:

- ``"none"``: source order.
- ``"global"``: a uniform pseudorandom permutation of all N rows (``permutation.permute``).
- ``"block"``: units in a random order (``permute``), cut into windows of ``window``
  consecutive units; rows are shuffled within each window by ``shuffled_range`` (one
  permutation array per window, computed when the window is first read and sliced; a
  resume recomputes it, O(window)). A rank's positions cover whole windows except at its
  two ends. Quality knob: ``window`` (more units mixed = closer to global, more memory).

The arithmetic is versioned (``ORDER_VERSION``): a loader state records the version it was
taken under, and loads only where its kind's order is still the same
(``ORDER_SINCE[kind] <= version``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .permutation import derive_key, permute, shuffled_range


class ShuffleKind(str, enum.Enum):
    """The kinds of epoch order, spelled once: the loader's ``shuffle=`` argument, the CLI's
    ``--shuffle``, :class:`EpochOrder` and the loader state all use these values."""

    NONE = "none"
    GLOBAL = "global"
    BLOCK = "block"

    def __str__(self) -> str:
        return self.value


KINDS = tuple(k.value for k in ShuffleKind)
#: what ``shuffle=`` accepts as text: a kind, or ``"auto"`` (the same as ``True``: the best
#: kind the source allows)
SHUFFLE_CHOICES = KINDS + ("auto",)
_SALT_GLOBAL = 0x61
_SALT_UNITS = 0x62
_SALT_WINDOW = 0x63

#: the version of the order arithmetic: bumped whenever any kind's order changes
#: 2: "block" shuffles rows inside a window by ``shuffled_range`` (was ``permute``)
#: 3: ``permute`` hash-sorts domains of at most ``SMALL_DOMAIN`` positions and runs its
#: network over ``bit_length(n - 1)`` bits for larger ones, halves of unequal widths where
#: that is odd (was a network over an even number of bits): "global" rows and "block" units
ORDER_VERSION = 3
#: the version in which each kind's order last changed: a state taken under an earlier
#: version would resume into another order
ORDER_SINCE = {"none": 1, "global": 3, "block": 3}
#: windows whose permutation an EpochOrder keeps (reader threads work on a few at once)
_KEPT_WINDOWS = 2


def rank_range(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """This rank's positions: equal shares, the remainder left out."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    per = n // world_size
    return rank * per, (rank + 1) * per


def num_batches(rows: int, batch_size: int, drop_last: bool) -> int:
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return rows // batch_size if drop_last else -(-rows // batch_size)


@dataclass(frozen=True)
class EpochOrder:
    """The row order of one epoch over units with ``counts`` rows each."""

    counts: tuple[int, ...]
    kind: str = "none"
    seed: int = 0
    epoch: int = 0
    window: int = 8

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown shuffle kind {self.kind!r}; one of {KINDS}")
        if self.window < 1:
            raise ValueError("window must be >= 1")

    @cached_property
    def offsets(self) -> np.ndarray:
        """Start of each unit in source-order row numbers (length units + 1)."""
        return np.concatenate([[0], np.cumsum(np.asarray(self.counts, dtype=np.int64))]).astype(np.int64)

    @property
    def total(self) -> int:
        return int(self.offsets[-1])

    # -- block shuffle structure ---------------------------------------------
    @cached_property
    def unit_order(self) -> np.ndarray:
        """Units in the order the epoch visits them (a permutation for "block")."""
        n = len(self.counts)
        if self.kind != "block" or n == 0:
            return np.arange(n, dtype=np.int64)
        return permute(np.arange(n), n, derive_key(self.seed, self.epoch, _SALT_UNITS))

    @cached_property
    def windows(self) -> list[np.ndarray]:
        """Units of each window, in visiting order ("block"; one unit per window otherwise)."""
        order = self.unit_order
        w = self.window if self.kind == "block" else 1
        return [order[i:i + w] for i in range(0, len(order), w)]

    @cached_property
    def window_offsets(self) -> np.ndarray:
        counts = np.asarray(self.counts, dtype=np.int64)
        sizes = [int(counts[u].sum()) for u in self.windows]
        return np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)

    def window_rows(self, w: int) -> np.ndarray:
        """Source-order row numbers of window ``w``, units concatenated in visiting order."""
        offs = self.offsets
        parts = [np.arange(offs[u], offs[u + 1], dtype=np.int64) for u in self.windows[w]]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def window_permutation(self, w: int) -> np.ndarray:
        """Local indices (into ``window_rows(w)``) of all of window ``w``'s positions, in
        order: ``shuffled_range(size, key(seed, epoch, w))``. The last few are kept (read-only
        arrays shared by the threads that slice them)."""
        kept = self._window_cache
        found = kept.get(w)
        if found is None:
            size = int(self.window_offsets[w + 1] - self.window_offsets[w])
            found = shuffled_range(size, derive_key(self.seed, self.epoch, _SALT_WINDOW, w))
            found.flags.writeable = False
            kept[w] = found  # a race computes it twice, never differently
            while len(kept) > _KEPT_WINDOWS:
                try:
                    kept.pop(next(iter(kept)))
                except (KeyError, RuntimeError, StopIteration):  # another thread trimmed it
                    break
        return found

    @cached_property
    def _window_cache(self) -> dict:
        return {}

    def window_local(self, w: int, lo: int, hi: int) -> np.ndarray:
        """Local indices (into ``window_rows(w)``) of window positions ``[lo, hi)``: a slice
        of ``window_permutation(w)``."""
        return self.window_permutation(w)[lo:hi]

    # -- the sequence -----------------------------------------------------------
    def rows(self, start: int, stop: int) -> np.ndarray:
        """Source-order row numbers at epoch positions ``[start, stop)``."""
        if not 0 <= start <= stop <= self.total:
            raise IndexError(f"positions [{start}, {stop}) outside [0, {self.total})")
        if self.kind == "none":
            return np.arange(start, stop, dtype=np.int64)
        if self.kind == "global":
            return permute(np.arange(start, stop, dtype=np.int64), self.total,
                           derive_key(self.seed, self.epoch, _SALT_GLOBAL))
        parts = []
        for w, lo, hi in self.window_pieces(start, stop):
            parts.append(self.window_rows(w)[self.window_local(w, lo, hi)])
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def window_pieces(self, start: int, stop: int) -> list[tuple[int, int, int]]:
        """``(window, lo, hi)``: the windows positions ``[start, stop)`` fall in, with the
        local position range inside each."""
        offs = self.window_offsets
        out = []
        w = int(np.searchsorted(offs, start, side="right")) - 1
        pos = start
        while pos < stop:
            w_end = int(offs[w + 1])
            hi = min(stop, w_end)
            if hi > pos:
                out.append((w, pos - int(offs[w]), hi - int(offs[w])))
            pos = hi
            w += 1
        return out

    def unit_pieces(self, start: int, stop: int) -> list[tuple[int, int, int]]:
        """For source order: ``(unit, lo, hi)`` row ranges inside units covering
        positions ``[start, stop)``."""
        if self.kind != "none":
            raise ValueError("unit_pieces() is for unshuffled order")
        offs = self.offsets
        out = []
        u = int(np.searchsorted(offs, start, side="right")) - 1
        pos = start
        while pos < stop:
            while offs[u + 1] <= pos:
                u += 1
            hi = min(stop, int(offs[u + 1]))
            out.append((u, pos - int(offs[u]), hi - int(offs[u])))
            pos = hi
        return out

    def locate(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(unit, row within unit)`` for source-order row numbers."""
        units = np.searchsorted(self.offsets, rows, side="right") - 1
        return units, rows - self.offsets[units]
