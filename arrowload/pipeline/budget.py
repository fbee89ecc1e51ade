"""A byte budget: the loader's memory bound, in bytes rather than in batches."""

from __future__ import annotations

import threading


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

    def acquire(self, n: int, block: bool = True, own: int = 0) -> bool:
        """``own``: bytes the caller itself holds and cannot release while it waits; they
        never make it wait (only others' bytes do), so the caller cannot deadlock itself."""
        with self._cond:
            while self.used > own and self.used + n > self.limit:
                if not block or self._stop.is_set():
                    return False
                self._cond.wait(0.05)
            if self._stop.is_set():
                return False
            self.used += n
            self.peak = max(self.peak, self.used)
            return True

    def release(self, n: int) -> None:
        with self._cond:
            self.used = max(0, self.used - n)
            self._cond.notify_all()
