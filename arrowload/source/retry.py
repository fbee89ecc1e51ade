"""Retry transient object-store errors with exponential backoff and jitter.

Errors fall into three kinds (:func:`classify`):

- ``"transient"``: timeouts, throttling, 5xx, connection resets: retried with backoff;
- ``"endpoint"``: the endpoint cannot be reached at all (connection refused, unknown
  host): a configuration error, not retried here (the filesystem's own transport may
  have tried once more: arrowload's s3fs allows botocore one quick retry);
- ``"permanent"``: everything else (missing or forbidden paths, missing or rejected
  credentials, corrupt files): never retried.
"""

from __future__ import annotations

import errno
import random
import re
import socket
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

TRANSIENT, ENDPOINT, PERMANENT = "transient", "endpoint", "permanent"

_PERMANENT_ERRNOS = {errno.ENOENT, errno.EACCES, errno.EISDIR, errno.ENOTDIR, errno.EPERM}
_TRANSIENT_WORDS = ("timeout", "timed out", "connection", "throttl", "slow down", "slowdown",
                    "slow_down", "reduce your request rate", "503", "500 ", "internal error",
                    "internal_failure", "internalerror", "service unavailable", "service_unavailable",
                    "reset by peer", "temporarily", "try again", "broken pipe", "request_timeout")
# Credentials missing or rejected, or access denied: the same request fails the same way.
DENIED = re.compile(
    r"access.?denied|accessdenied|forbidden|\b403\b|invalidaccesskeyid|signaturedoesnotmatch|"
    r"expiredtoken|invalidtoken|unable to locate credentials|no credentials|"
    r"partial credentials|credentials? (?:were|was) not found|unrecognizedclient|"
    r"invalid_access_key_id|signature_does_not_match|unauthorized|authorizationpermissionmismatch|"
    r"authenticationfailed|authorizationfailure|failed to authenticate|\b401\b|"
    r"lacked the necessary privileges", re.IGNORECASE)  # (the last: Rust object_store's, deltalake's)
# The endpoint itself cannot be reached (AWS SDK curl codes 6 / 7: unknown host / refused).
_UNREACHABLE = re.compile(
    r"could not connect to the endpoint|curlcode: (?:6|7)\b|could not resolve host|"
    r"connection refused|name or service not known|nodename nor servname|"
    r"temporary failure in name resolution|failed to connect to|cannot connect to host|"
    r"connect call failed", re.IGNORECASE)
# Clients whose errors are not OSErrors: their words say what happened (gcsfs speaks
# aiohttp; adlfs azure.core, whose ServiceRequestError is "cannot connect to host")
_CLIENTS = ("aiohttp", "urllib3", "requests", "azure.core")


def _botocore_kind(exc: BaseException) -> str | None:
    mod = type(exc).__module__ or ""
    if not mod.startswith(("botocore", "aiobotocore")):
        return None
    names = {c.__name__ for c in type(exc).__mro__}
    if names & {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError",
                "NoAuthTokenError", "UnauthorizedSSOTokenError", "TokenRetrievalError"}:
        return PERMANENT
    if "ConnectTimeoutError" in names or "ReadTimeoutError" in names:
        return TRANSIENT
    if "EndpointConnectionError" in names:
        return ENDPOINT
    if names & {"HTTPClientError", "ConnectionError", "ConnectionClosedError", "ReadTimeoutError",
                "ResponseStreamingError", "IncompleteReadError"}:
        return TRANSIENT  # resets, closed connections, truncated responses
    if "ClientError" in names:
        response = getattr(exc, "response", None) or {}
        status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        if status in (401, 403) or DENIED.search(str(exc)):
            return PERMANENT
        if status == 404:
            return PERMANENT
        if status is not None and (status >= 500 or status == 429):
            return TRANSIENT
        return TRANSIENT if any(w in str(exc).lower() for w in _TRANSIENT_WORDS) else PERMANENT
    if "NoRegionError" in names or "ParamValidationError" in names:
        return PERMANENT
    return None


def classify(exc: BaseException) -> str:
    """``"transient"``, ``"endpoint"`` or ``"permanent"`` (see the module docstring)."""
    from ..errors import ArrowloadError
    if isinstance(exc, ArrowloadError):
        return PERMANENT  # already diagnosed
    kind = _botocore_kind(exc)
    if kind is not None:
        return kind
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return PERMANENT
    if isinstance(exc, (ConnectionRefusedError, socket.gaierror)):
        return ENDPOINT
    text = str(exc)
    if isinstance(exc, (ConnectionError, TimeoutError, OSError)) or type(exc).__module__.startswith(_CLIENTS):
        if _UNREACHABLE.search(text):
            return ENDPOINT
        if DENIED.search(text):
            return PERMANENT
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return TRANSIENT
    if isinstance(exc, OSError):
        if exc.errno in _PERMANENT_ERRNOS:
            return PERMANENT
        lowered = text.lower()
        return TRANSIENT if any(word in lowered for word in _TRANSIENT_WORDS) else PERMANENT
    return PERMANENT


def is_transient(exc: BaseException) -> bool:
    """True for errors worth retrying with backoff: network trouble, throttling, 5xx; never
    a missing or forbidden path, missing credentials, an unreachable endpoint, or a decode
    error (a corrupt file stays corrupt)."""
    return classify(exc) == TRANSIENT


def retry(fn: Callable[[], T], *, retries: int, backoff_s: float,
          sleep: Callable[[float], None] = time.sleep) -> T:
    """Call ``fn``; on a transient error retry up to ``retries`` times, backing off
    ``backoff_s * 2**attempt`` (with jitter); other errors (an unreachable endpoint
    included) are not retried. The last error propagates unchanged."""
    attempt = 0
    while True:
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - filtered by classify
            kind = classify(exc)
            if attempt >= retries or kind != TRANSIENT:
                raise
            sleep(backoff_s * (2 ** attempt) * (0.5 + random.random()))
            attempt += 1
