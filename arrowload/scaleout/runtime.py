"""``ray``, imported on first use, and the error translation every Ray call here shares."""

from __future__ import annotations

from typing import Any

from ..errors import MissingDependencyError

_ray: Any = None


def import_ray():
    """``ray``, imported on first use, or an error saying how to install it."""
    global _ray
    if _ray is None:
        try:
            import ray
            import ray.data  # noqa: F401 - to_ray() and the executor's checks need Ray Data
        except ImportError as exc:
            raise MissingDependencyError("Ray is needed for to_ray() and executor='ray': "
                                         "pip install 'arrowload[ray]' (ray[data] >= 2.9)") from exc
        _ray = ray
    return _ray


def started():
    """``ray``, with a Ray session in this process: the one already started
    (``ray.init(...)`` by the caller, or Ray Train's worker), else ``ray.init()`` -- a local
    Ray, or the cluster ``RAY_ADDRESS`` names, as Ray's own first remote call would."""
    ray = import_ray()
    if not ray.is_initialized():
        ray.init()
    return ray


def get(refs):
    """``ray.get(refs)``, an exception raised inside a task re-raised as itself (its type
    and message, the Ray error with the remote traceback as its cause), so a failure on a
    Ray worker reads exactly as the same failure on a thread."""
    ray = import_ray()
    try:
        return ray.get(refs)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, BaseException) and not isinstance(cause, ray.exceptions.RayError):
            raise cause.with_traceback(None) from exc
        raise


def cluster_cpus() -> int:
    """CPUs of the Ray cluster (at least 1)."""
    ray = started()
    return max(1, int(ray.cluster_resources().get("CPU", 1)))
