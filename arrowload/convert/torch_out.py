"""Host arrays -> torch tensors, through DLPack; torch is imported only here, on first use.

``torch.from_dlpack`` of a numpy array shares its memory, read-only arrays included
(numpy exports a versioned DLPack capsule that torch accepts), without the
"non-writable array" warning that ``torch.from_numpy`` gives. With ``device=None`` or
``"cpu"`` no ``torch.cuda`` function is called.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ConversionError, DeviceUnavailableError, MissingDependencyError

_torch = None


def import_torch():
    """``torch``, imported on first use, or an error saying how to install it."""
    global _torch
    if _torch is None:
        try:
            import torch
        except ImportError as exc:
            raise MissingDependencyError("output='torch' needs PyTorch: pip install 'arrowload[torch]' "
                                         "(or install torch for your platform from pytorch.org)") from exc
        _torch = torch
    return _torch


def target_device(device: Any):
    """The ``torch.device`` to move tensors to, or ``None`` to leave them where they are (host memory)."""
    if device is None:
        return None
    torch = import_torch()
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise ConversionError(f"device={device!r} is not a torch device ('cpu', 'cuda', 'cuda:1', ...): "
                              f"{exc}") from exc
    if dev.type == "cpu":
        return None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DeviceUnavailableError(
            f"device={device!r} asks for CUDA, but torch.cuda.is_available() is False in this process "
            f"(torch {torch.__version__}); install a CUDA build of torch, check CUDA_VISIBLE_DEVICES, "
            "or pass device=None to keep batches in host memory")
    if dev.type == "cuda":
        return dev
    if dev.type == "meta":
        raise ConversionError(f"device={device!r}: meta tensors hold no data; pass a device that does "
                              "('cpu', 'cuda', ...) or device=None")
    for where, backend in ((f"torch.backends.{dev.type}", getattr(torch.backends, dev.type, None)),
                           (f"torch.{dev.type}", getattr(torch, dev.type, None))):
        available = getattr(backend, "is_available", None)
        if callable(available) and not available():
            raise DeviceUnavailableError(f"device={device!r} is not available in this process "
                                         f"({where}.is_available() is False)")
    try:  # a backend this torch build lacks answers only when used (xpu: an AssertionError)
        torch.empty(1, device=dev)
    except (AssertionError, RuntimeError, NotImplementedError) as exc:
        raise DeviceUnavailableError(f"device={device!r} is not usable in this process (torch "
                                     f"{torch.__version__}: {exc})") from exc
    return dev


#: whether this numpy gives, and this torch takes, a versioned DLPack capsule (None: not asked yet)
_CAPSULES: list = [None]


def _versioned(torch) -> bool:
    if _CAPSULES[0] is None:
        try:
            torch.from_dlpack(np.zeros(1, np.float32).__dlpack__(max_version=(1, 0)))
            _CAPSULES[0] = True
        except Exception:  # noqa: BLE001 - numpy < 2.1 (no max_version), or a torch without them
            _CAPSULES[0] = False
    return _CAPSULES[0]


def _from_numpy(torch, value: np.ndarray):
    """A tensor sharing ``value``'s memory. From numpy's DLPack capsule, asked of numpy
    directly where numpy (2.1+) and torch take a versioned one: ``torch.from_dlpack`` given
    the array asks for it through a Python wrapper that checks the device and builds keyword
    arguments, 1.1 against 0.6 us a column a batch (35 ms an epoch of 4M rows, 17 unstacked
    columns, batch 1024). Else (an older numpy or torch) from the array itself."""
    if _versioned(torch):
        return torch.from_dlpack(value.__dlpack__(max_version=(1, 0)))
    return torch.from_dlpack(value)


def convert(host: dict[str, np.ndarray | list], dev: Any) -> dict[str, Any]:
    """Each numpy array as a tensor sharing its memory, moved to ``dev`` (``target_device``'s answer) if not
    ``None``; lists unchanged."""
    torch = import_torch()
    out: dict[str, Any] = {}
    for name, value in host.items():
        if not isinstance(value, np.ndarray):
            out[name] = value
            continue
        if value.dtype.kind in "mM":  # datetime64 / timedelta64: int64 counts in the same unit
            value = value.view(np.int64)
        try:
            tensor = _from_numpy(torch, value)
        except (BufferError, RuntimeError, TypeError) as exc:
            raise ConversionError(f"column {name!r}: torch {torch.__version__} has no tensor for numpy dtype "
                                  f"{value.dtype} ({exc}); cast the column in the plan (e.g. to int64)",
                                  column=name) from exc
        if dev is not None:
            try:
                tensor = tensor.to(dev)
            except RuntimeError as exc:
                raise DeviceUnavailableError(f"cannot move column {name!r} to {dev}: {exc}") from exc
        out[name] = tensor
    return out
