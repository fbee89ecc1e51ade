"""Host arrays -> jax arrays, through DLPack; jax is imported only here, on first use.

What jax (0.10, CPU backend) does with a DLPack buffer, measured in tests/test_convert.py:

* it shares the memory when the data address is 64-byte aligned and copies it once
  (inside XLA) when it is not. Arrow allocates 64-byte aligned buffers, so a batch that
  starts at row ``r`` is shared when ``r * itemsize`` is a multiple of 64; every buffer
  arrowload allocates itself (booleans, padding, fills, widening) is aligned.
* it asks for a legacy (unversioned) capsule, which numpy refuses to export for
  read-only arrays and pyarrow exports with a DeprecationWarning. So a read-only view
  is handed over through a writable alias of the same memory (jax arrays are immutable;
  nothing writes through it).
* with ``jax_enable_x64`` off (jax's default) jax has no 64-bit types and would silently
  turn int64 into int32 and float64 into float32. arrowload instead narrows 64-bit
  integers (and int64 date / time counts) only when every value fits, in one copy, and
  refuses float64 with a message naming the fixes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ConversionError, DeviceUnavailableError, MissingDependencyError
from .host import aligned_empty

_jax = None


def import_jax():
    """``jax`` (with ``jax.dlpack``), imported on first use, or an error saying how to install it."""
    global _jax
    if _jax is None:
        try:
            import jax
            import jax.dlpack  # noqa: F401
        except ImportError as exc:
            raise MissingDependencyError("output='jax' needs jax: pip install 'arrowload[jax]' "
                                         "(or jax[cuda12] for GPUs)") from exc
        _jax = jax
    return _jax


def target_device(device: Any):
    """The ``jax.Device`` to put arrays on, or ``None`` to leave them where DLPack put them (host)."""
    if device is None:
        return None
    jax = import_jax()
    if not isinstance(device, str):
        return device  # a jax.Device (or a Sharding): jax.device_put checks it
    platform, _, index = device.partition(":")
    try:
        devices = jax.devices(platform)
    except RuntimeError as exc:
        raise DeviceUnavailableError(f"device={device!r}: jax has no {platform!r} backend in this process "
                                     f"({exc}); install the matching jax build or pass device=None") from exc
    try:
        return devices[int(index or 0)]
    except (ValueError, IndexError) as exc:
        raise DeviceUnavailableError(f"device={device!r}: jax sees {len(devices)} {platform} device(s)") from exc


class _WritableAlias:
    """Presents a read-only array's memory as writable, only so jax's DLPack import accepts it.

    It holds the array (and through it the Arrow buffer), so the memory lives as long as
    the jax array that imports it.
    """

    def __init__(self, array: np.ndarray) -> None:
        self._array = array
        interface = dict(array.__array_interface__)
        interface["data"] = (interface["data"][0], False)
        self.__array_interface__ = interface


def _narrow(name: str, value: np.ndarray) -> np.ndarray:
    """A 64-bit array as jax-without-x64 can hold it, exactly, or an error."""
    if value.dtype.kind == "f":
        raise ConversionError(
            f"column {name!r} is float64, and jax_enable_x64 is off, so jax would round it to float32 "
            "silently; cast it to float32 in the plan, or enable 64-bit jax first: "
            "jax.config.update('jax_enable_x64', True)", column=name)
    small = np.dtype(np.int32 if value.dtype.kind == "i" else np.uint32)
    info = np.iinfo(small)
    if value.size and (value.min() < info.min or value.max() > info.max):
        raise ConversionError(
            f"column {name!r} is {value.dtype} with values outside {small} in this batch, and "
            "jax_enable_x64 is off (jax would truncate them); enable 64-bit jax: "
            "jax.config.update('jax_enable_x64', True)", column=name)
    out = aligned_empty(value.shape, small)
    np.copyto(out, value, casting="unsafe")  # checked above: exact
    return out


def convert(host: dict[str, np.ndarray | list], dev: Any) -> dict[str, Any]:
    """Each numpy array as a jax array (shared where jax allows, see above), put on ``dev``
    (``target_device``'s answer) if not ``None``; lists unchanged."""
    jax = import_jax()
    x64 = bool(jax.config.read("jax_enable_x64"))
    out: dict[str, Any] = {}
    for name, value in host.items():
        if not isinstance(value, np.ndarray):
            out[name] = value
            continue
        if value.dtype.kind in "mM":  # datetime64 / timedelta64: int64 counts in the same unit
            value = value.view(np.int64)
        if not x64 and value.dtype.itemsize == 8:
            value = _narrow(name, value)
        source = value if value.flags.writeable else np.asarray(_WritableAlias(value))
        try:
            array = jax.dlpack.from_dlpack(source)
        except (BufferError, RuntimeError, TypeError) as exc:
            raise ConversionError(f"column {name!r}: jax {jax.__version__} cannot import numpy dtype "
                                  f"{value.dtype} ({exc}); cast the column in the plan", column=name) from exc
        if dev is not None:
            array = jax.device_put(array, dev)
        out[name] = array
    return out
