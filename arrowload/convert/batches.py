"""One batch's last step: what the pipeline cut -> what the user gets.

Two paths, side by side, one object (:class:`BatchOutput`), called on the one thread that
emits batches, in order:

- **host chunks** (the usual path): a read was converted whole on its reader thread into
  host arrays (``pipeline.chunks``); a batch is views of them (or one pooled copy where it
  straddles two reads), and :meth:`BatchOutput.host` hands them on: the width check of
  unpadded lists, then numpy / torch / jax (``convert_host``), or the CUDA staging copies,
  or jax placement.
- **Arrow batches** (per batch: a ``transform=``, ``output="arrow"``, lists padded to the
  batch's longest, a read that did not convert whole): :meth:`BatchOutput.arrow` converts
  one ``pyarrow.RecordBatch`` -- ``stack=`` columns written once into pooled buffers,
  other columns as host arrays -- then the same :meth:`host` step; ``output="arrow"`` with
  ``stack=`` comes back as Arrow, the groups as fixed-size lists (``_arrow_stacked``).

Where a batch's memory comes from and how long it lives: see ``pipeline.collate``
(``BufferPool``) and ``pipeline.chunks``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from ..pipeline.collate import BufferPool, resolve_stack, stack_batch, stacked_arrays
from . import convert_batch, convert_host
from .host import restricted, to_host
from .options import ConvertOptions


class BatchOutput:
    """Converts the batches of one loader (see the module docstring).

    ``widths``: an object whose ``check(host)`` refuses a batch of unpadded lists whose
    width differs from earlier batches' (``preflight.ListWidths``), or None.
    ``to_device(host) -> out``: replaces the conversion of host arrays (the pinned CUDA
    stage: it converts and starts the copies); ``place(out) -> out``: applied after it
    (jax placement with ``sharding=``); ``on_device(chunk) -> out``: a batch cut from reads
    already copied to the device whole (``pipeline.device.DeviceChunk``: it has ``event``)."""

    def __init__(self, convert: ConvertOptions, stack: Mapping[str, Any] | None, pool: BufferPool, *,
                 widths: Any = None, to_device: Callable[[dict], Any] | None = None,
                 place: Callable[[dict], Any] | None = None,
                 on_device: Callable[[Any], Any] | None = None) -> None:
        self.convert = convert
        self.stack = stack
        self.pool = pool
        self.widths = widths
        self.to_device = to_device
        self.place = place
        self.on_device = on_device
        self._stack_spec = None

    def __call__(self, batch: Any) -> Any:
        """A batch the pipeline cut: an Arrow batch, or a host chunk (``.columns``)."""
        if isinstance(batch, pa.RecordBatch):
            return self.arrow(batch)
        if self.on_device is not None and hasattr(batch, "event"):
            if self.widths is not None:
                self.widths.check(batch.columns)
            return self.on_device(batch)
        return self.host(batch.columns)

    def arrow(self, batch: pa.RecordBatch) -> Any:
        """Convert one Arrow batch (the per-batch path: ``transform=``, ``output="arrow"``,
        padded lists, a read that did not convert whole); with ``stack=``, the stacked
        columns are written once into pooled buffers (see ``collate``), padded lists too."""
        output = self.convert.output
        if output == "arrow" and not self.stack:
            return convert_batch(batch, self.convert)
        if self.stack:
            spec = self._stack_spec
            if spec is None or not spec.stacked <= set(batch.schema.names):
                spec = self._stack_spec = resolve_stack(self.stack, batch.schema)
            if output == "arrow":
                return self._arrow_stacked(batch, spec)
            host = stack_batch(batch, spec, self.pool, self.convert)
        else:
            host = to_host(batch, self.convert, self.pool.take)
        return self.host(host)

    def _arrow_stacked(self, batch: pa.RecordBatch, spec) -> pa.RecordBatch:
        """``output="arrow"`` with ``stack=``: each group a fixed-size list column in the
        place of its first column; the other columns as Arrow has them (their types kept,
        ``fill_null`` applied as without ``stack=``)."""
        names = batch.schema.names
        rest = [n for n in names if n not in spec.stacked]
        plain = convert_batch(batch.select(rest), restricted(self.convert, rest)) if rest else None
        stacked = stacked_arrays(batch, spec, self.pool, self.convert)
        arrays, out_names = [], []
        for name in names:
            g = spec.first.get(name)
            if g is not None:
                out, view = stacked[g]
                arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(view.reshape(-1)), view.shape[1]))
                out_names.append(out)
            elif name not in spec.stacked:
                arrays.append(plain.column(name))
                out_names.append(name)
        return pa.RecordBatch.from_arrays(arrays, names=out_names)

    def host(self, host: dict) -> Any:
        """Host arrays of one batch -> what the user gets; with a CUDA device the copies start
        here (``to_device``), with ``sharding=`` the jax placement (``place``)."""
        if self.widths is not None:
            self.widths.check(host)
        if self.to_device is not None:
            return self.to_device(host)
        out = convert_host(host, self.convert)
        if self.place is not None:
            out = self.place(out)
        return out


def concat_arrow(parts: Sequence[pa.RecordBatch]) -> pa.RecordBatch:
    """Consecutive Arrow parts of one batch as one batch (a copy only when there are several)."""
    return parts[0] if len(parts) == 1 else pa.concat_batches(list(parts))


__all__ = ["BatchOutput", "concat_arrow"]
