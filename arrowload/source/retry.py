"""Retry transient object-store errors with exponential backoff and jitter."""

from __future__ import annotations

import errno
import random
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

_PERMANENT_ERRNOS = {errno.ENOENT, errno.EACCES, errno.EISDIR, errno.ENOTDIR, errno.EPERM}
_TRANSIENT_WORDS = ("timeout", "timed out", "connection", "throttl", "slow down", "slowdown",
                    "503", "500 ", "internal error", "service unavailable", "reset by peer",
                    "temporarily", "try again", "broken pipe")


def is_transient(exc: BaseException) -> bool:
    """True for errors worth retrying: network trouble, throttling, 5xx; never a missing
    or forbidden path, and never a decode error (a corrupt file stays corrupt)."""
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    if isinstance(exc, OSError):
        if exc.errno in _PERMANENT_ERRNOS:
            return False
        text = str(exc).lower()
        return any(word in text for word in _TRANSIENT_WORDS)
    return False


def retry(fn: Callable[[], T], *, retries: int, backoff_s: float,
          sleep: Callable[[float], None] = time.sleep) -> T:
    """Call ``fn``; on a transient error retry up to ``retries`` times, backing off
    ``backoff_s * 2**attempt`` (with jitter). The last error propagates unchanged."""
    attempt = 0
    while True:
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - filtered by is_transient
            if attempt >= retries or not is_transient(exc):
                raise
            sleep(backoff_s * (2 ** attempt) * (0.5 + random.random()))
            attempt += 1
