"""A byte budget: the loader's memory bound, in bytes rather than in batches."""

from __future__ import annotations

import threading

from ..order.tasks import MAX_READ_ROWS, READ_SHARE, read_rows  # noqa: F401 - read sizes live with the tasks


class ByteBudget:
    """Blocks ``acquire(n)`` while ``used + n > limit``; a lone request larger than the
    whole budget still passes when nothing else is held, so the pipeline always progresses.
    ``stop`` (an Event) aborts waits: acquire then returns False."""

    def __init__(self, limit: int, stop: threading.Event) -> None:
        self.limit = max(1, int(limit))
        self.used = 0
        self.peak = 0
        self._cond = threading.Condition()
        self._stop = stop
        self._waiting = 0  # threads in acquire's wait: release notifies only where there are some

    def acquire(self, n: int, block: bool = True, own: int = 0) -> bool:
        """``own``: bytes the caller itself holds and cannot release while it waits; they
        never make it wait (only others' bytes do), so the caller cannot deadlock itself."""
        with self._cond:
            while self.used > own and self.used + n > self.limit:
                if not block or self._stop.is_set():
                    return False
                self._waiting += 1
                try:
                    self._cond.wait(0.05)
                finally:
                    self._waiting -= 1
            if self._stop.is_set():
                return False
            self.used += n
            self.peak = max(self.peak, self.used)
            return True

    def charge(self, n: int) -> int:
        """Count ``n`` bytes that are already held (never waits); returns ``n``."""
        with self._cond:
            self.used += n
            self.peak = max(self.peak, self.used)
        return n

    def release(self, n: int) -> None:
        if n <= 0:
            return
        with self._cond:
            self.used = max(0, self.used - n)
            if self._waiting:
                self._cond.notify_all()

    def fits(self, n: int) -> bool:
        """Whether ``n`` more bytes fit under the limit now (never waits)."""
        with self._cond:
            return self.used + n <= self.limit


# -- read units sized in bytes ---------------------------------------------------------

#: Bytes per record batch of the random-access cache file: what its writer holds (plus
#: one incoming scan batch) while streaming the selection to disk. Between these bounds,
#: the memory budget / 4 (a budget of 1 byte still writes 1 MiB batches, not one row each).
CACHE_CHUNK_BYTES = (1 << 20, 16 << 20)


def cache_chunk_rows(memory_budget: int, row_bytes: float) -> int:
    """Rows per record batch of the random-access cache (see ``CACHE_CHUNK_BYTES``):
    at least one row, at most ``MAX_READ_ROWS``."""
    lo, hi = CACHE_CHUNK_BYTES
    target = min(hi, max(lo, int(memory_budget) // 4))
    return max(1, min(MAX_READ_ROWS, int(target // max(1.0, float(row_bytes)))))
