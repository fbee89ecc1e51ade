"""The batch layout: each output key of a loader's batches with its dtype, shape and device
(``x float32 [1024, 16] cpu``, ``label int8 [1024] cpu``).

Two sources, one shape of answer (:class:`KeyLayout`):

- :func:`of_batch` reads a real batch (numpy / torch / jax dict, Python lists, or a
  ``pyarrow.RecordBatch``);
- :func:`predicted` converts an *empty* batch of the plan's schema with the loader's own
  conversion (``stack=``, padding, output type: the code every batch goes through) and puts
  the batch size in front. No data is read and no device is touched: the device is the
  one the options name (CUDA copies are not run for an empty batch). Where the shape
  cannot be known before data arrives (an unpadded variable-length list whose width no
  footer gave, the output of ``transform=``), the dimension shows as ``?``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa


@dataclass(frozen=True)
class KeyLayout:
    """One output key: ``dtype`` as its library names it (without ``torch.``), ``shape``
    with ``"?"`` for a dimension not known yet, ``device`` (``cpu``, ``cuda:0``, ...)."""

    key: str
    dtype: str
    shape: tuple
    device: str

    def text(self) -> str:
        return f"{self.key} {self.dtype} [{', '.join(str(d) for d in self.shape)}] {self.device}"


def _one(key: str, value: Any) -> KeyLayout:
    mod = type(value).__module__.split(".")[0]
    if mod == "torch":
        return KeyLayout(key, str(value.dtype).removeprefix("torch."), tuple(value.shape), str(value.device))
    if mod in ("jax", "jaxlib"):
        try:
            devs = sorted(str(d) for d in value.devices())
            device = devs[0] if len(devs) == 1 else f"{len(devs)} devices"
        except Exception:  # noqa: BLE001 - a display never raises
            device = "?"
        return KeyLayout(key, str(value.dtype), tuple(value.shape), device)
    if hasattr(value, "dtype") and hasattr(value, "shape"):  # numpy
        return KeyLayout(key, str(value.dtype), tuple(value.shape), "cpu")
    if isinstance(value, (pa.Array, pa.ChunkedArray)):
        return KeyLayout(key, str(value.type), (len(value),), "cpu")
    if isinstance(value, list):  # strings, binaries: Python objects
        kinds = sorted({type(v).__name__ for v in value[:64] if v is not None})
        return KeyLayout(key, f"list[{'|'.join(kinds) or 'object'}]", (len(value),), "cpu")
    return KeyLayout(key, type(value).__name__, (), "?")


def of_batch(batch: Any) -> list[KeyLayout]:
    """The layout of one real batch, key by key in its order."""
    if isinstance(batch, pa.RecordBatch):
        return [_one(n, batch.column(i)) for i, n in enumerate(batch.schema.names)]
    if isinstance(batch, Mapping):
        return [_one(str(k), v) for k, v in batch.items()]
    return [_one("batch", batch)]


def predicted(loader) -> list[KeyLayout]:
    """The layout of ``loader``'s batches before any is read (see the module docstring).
    Raises what the conversion of an empty batch raises; callers that display catch it."""
    from ..convert.batches import BatchOutput
    from .collate import BufferPool
    from .preflight import unpadded_lists
    from ..plan.rowselect import empty_batch

    o = loader.options
    schema = loader._plan.schema
    empty = empty_batch(schema)
    unknown: set[str] = set()
    if o.transform is not None:
        try:
            empty = loader._transform_stage()(empty)
        except Exception:  # noqa: BLE001 - a transform may refuse an empty batch
            return [KeyLayout("(transform=)", "known at the first batch", ("?",), _device(loader, None))]
        unknown = set(empty.schema.names)
    widths = getattr(loader._widths, "widths", {}) if loader._widths is not None else {}
    lists = set(unpadded_lists(empty.schema, loader._convert)) if o.output != "arrow" else set()
    out = BatchOutput(loader._convert, o.stack, BufferPool(max_bytes=1 << 20))(empty)
    found = []
    for k in of_batch(out):
        shape = list(k.shape)
        if shape:
            shape[0] = o.batch_size
        if len(shape) > 1 and k.key in lists:
            shape[1] = widths.get(k.key, "?")
        if k.key in unknown and len(shape) > 1:
            shape[1:] = ["?"] * (len(shape) - 1)
        dtype = k.dtype
        if dtype == "list[object]" and k.key in empty.schema.names:  # no value to look at
            dtype = _python_kind(empty.schema.field(k.key).type)
        found.append(KeyLayout(k.key, dtype, tuple(shape), _device(loader, k.device)))
    return found


def _python_kind(t: pa.DataType) -> str:
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "list[str]"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "list[bytes]"
    return "list[object]"


def _device(loader, converted: str | None) -> str:
    o = loader.options
    if o.output in ("numpy", "arrow"):
        return "cpu"
    if o.devices:
        return ", ".join(str(d) for d in o.devices)
    if o.sharding is not None:
        return "sharded"
    if o.device is not None:
        return str(o.device)
    return converted or "cpu"


__all__ = ["KeyLayout", "of_batch", "predicted"]
