"""Objects that hold a lock still pickle (DataLoader workers started with spawn or
forkserver receive a copy of the loader): the lock is left out and made anew."""

from __future__ import annotations

import threading


class PicklableLock:
    """Mixin for classes whose ``_lock`` attribute is a ``threading.Lock``."""

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("_lock", None)
        return state

    def __setstate__(self, state) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
