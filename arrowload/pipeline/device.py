"""The Load stage: batches arrive on the accelerator before the training step asks.

torch (``output="torch", device="cuda[:i]"``): each host array is copied once into a
pinned (page-locked) staging buffer taken from a small pool, then copied to the device
with ``non_blocking=True`` on a dedicated CUDA stream, and an event is recorded. The
consumer's current stream waits on that event and each tensor is ``record_stream``-ed on
it, so the tensors are safe to use there while the copy of the next batch overlaps the
step on this one. A staging buffer is reused only after its copy's event completed
(never by another column of the same batch, nor by another thread, while its copy may
still be running).

Where a batch's arrays are large (``THREAD_BYTES``, 4 MiB, or more) the host copy into
pinned memory runs on staging threads of the stage's own (``arrowload-h2d_<n>``,
``copy_threads``: 1, or 2 with 8 cores or more), one batch each: the producer collates
the next batch while earlier ones are staged, and the consumer takes them in order.
Smaller batches are staged on the producer thread: there the hand-off to another thread
and back (GIL hand-offs, a future) buys nothing measurable and costs CPU. On an H100 host
(``benchmarks/RESULTS.md``), in-memory table to the GPU, same run: 65,536-row batches
(21 MB) went from 2.99 to 4.07 GB/s on two staging threads (CPU 338 -> 403 ms an epoch);
4,096-row batches (1.3 MB) from 1.99 to 2.15 GB/s, within the run's noise, for 20% more
CPU (468 -> 563 ms).
With ``devices=[...]`` each batch is split into contiguous row slices (views, no host
copy), one per device.

jax (``output="jax"`` with ``device=`` or ``sharding=``): ``jax.device_put`` is
asynchronous; the producer thread issues it as soon as a batch is collated, so the
batches waiting in the prefetch queue are already on (or on their way to) the devices.
A ``jax.sharding.Sharding`` places a global batch across local devices.

Nothing here runs unless a CUDA device / jax placement is asked for: ``device=None`` or
``"cpu"`` never touches ``torch.cuda``.
"""

from __future__ import annotations

import functools
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import DeviceUnavailableError
from ..options import usable_cores

#: A batch whose host arrays hold at least this many bytes is staged on a staging thread.
THREAD_BYTES = 4 << 20


def default_copy_threads() -> int:
    """Staging threads by default: 1, or 2 where the process may run on 8 cores or more."""
    return 2 if usable_cores() >= 8 else 1


_BUSY = object()  # a staging slot handed out whose copy is not recorded yet


@dataclass
class DeviceBatch:
    """Tensors being copied to the device(s), with the event that marks the copy done."""

    parts: list[dict]          # one dict per device
    events: list[Any]
    stage: "TorchDeviceStage"


class TorchDeviceStage:
    """Pinned staging + asynchronous host-to-device copies on a dedicated stream."""

    def __init__(self, devices: list[Any], pool_capacity: int | None = None,
                 copy_threads: int | None = None) -> None:
        from ..convert.torch_out import import_torch, target_device
        torch = self.torch = import_torch()
        self.devices = [target_device(d) for d in devices]  # raises clearly without CUDA
        if any(d is None or d.type != "cuda" for d in self.devices):
            raise ValueError("TorchDeviceStage is for CUDA devices")
        count = torch.cuda.device_count()
        for asked, d in zip(devices, self.devices):
            if d.index is not None and d.index >= count:
                raise DeviceUnavailableError(
                    f"device {asked!r}: this process sees {count} CUDA device(s) (cuda:0 .. "
                    f"cuda:{count - 1}); pass one of those, or check CUDA_VISIBLE_DEVICES")
        self.streams = [torch.cuda.Stream(device=d) for d in self.devices]
        self._lock = threading.Lock()
        self._pinned: dict[tuple, list[list]] = {}  # key -> [[tensor, event | None], ...]
        self.copy_threads = default_copy_threads() if copy_threads is None else copy_threads
        # every staging thread may hold one batch's slots while earlier copies still run
        self.capacity = pool_capacity or 2 * self.copy_threads + 4
        self._executor: ThreadPoolExecutor | None = None

    def _staging(self, shape: tuple[int, ...], dtype: np.dtype):
        torch = self.torch
        key = (shape, np.dtype(dtype).str)
        with self._lock:
            slots = self._pinned.setdefault(key, [])
            for slot in slots:
                # a slot is free once its copy finished; one handed out (to this batch's other
                # columns of the same shape, or to another producer thread) is not
                event = slot[1]
                if event is None or (event is not _BUSY and event.query()):
                    slot[1] = _BUSY
                    return slot
            tensor = torch.from_numpy(np.empty(shape, dtype=dtype)).pin_memory()
            slot = [tensor, _BUSY]
            if len(slots) < self.capacity:
                slots.append(slot)
            return slot

    def to_device(self, host: dict) -> Future | DeviceBatch:
        """Start copying ``host`` (numpy arrays / lists) to the device(s). A batch of
        ``THREAD_BYTES`` or more goes to a staging thread and this returns at once with the
        future of its :class:`DeviceBatch` (``ready`` takes either); a smaller one, or any
        with ``copy_threads=0``, is staged here. The host arrays stay referenced, so a
        pooled collation buffer is not reused, until they are staged."""
        if self.copy_threads == 0 or sum(v.nbytes for v in host.values()
                                         if isinstance(v, np.ndarray)) < THREAD_BYTES:
            return self.copy(host)
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.copy_threads, thread_name_prefix="arrowload-h2d")
            return self._executor.submit(self.copy, host)

    def close(self) -> None:
        """Stop the staging threads (batches not staged yet are dropped). A later
        ``to_device`` starts them again."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)

    def copy(self, host: dict) -> DeviceBatch:
        """Copy ``host`` into pinned staging and start its copies to the device(s), on the
        calling thread. Thread-safe: each column of each batch has its own staging buffer
        until its copy's event completes."""
        torch = self.torch
        n = next((len(v) for v in host.values()), 0)
        k = len(self.devices)
        bounds = [(i * n) // k for i in range(k + 1)]
        parts, events = [], []
        for i, (dev, stream) in enumerate(zip(self.devices, self.streams)):
            lo, hi = bounds[i], bounds[i + 1]
            used = []
            out = {}
            arrays = {}
            for name, value in host.items():
                out[name] = value[lo:hi]  # arrays are replaced by their tensors below
                if isinstance(value, np.ndarray):
                    arr = out[name]
                    arrays[name] = arr.view(np.int64) if arr.dtype.kind in "mM" else arr
            try:
                with torch.cuda.stream(stream):
                    for name, arr in arrays.items():
                        slot = self._staging(arr.shape, arr.dtype)
                        used.append(slot)
                        np.copyto(slot[0].numpy(), arr)  # the one host copy, into pinned memory
                        out[name] = slot[0].to(dev, non_blocking=True)
                    event = torch.cuda.Event()
                    event.record(stream)
            except BaseException:
                self._free_after(stream, used)
                raise
            for slot in used:
                slot[1] = event  # reusable once this copy has finished
            parts.append(out)
            events.append(event)
        return DeviceBatch(parts, events, self)

    @staticmethod
    def _free_after(stream, slots: list) -> None:
        """A batch failed: free its staging slots once ``stream`` has finished with them
        (left busy, never reused, if even that fails)."""
        try:
            stream.synchronize()
        except Exception:  # noqa: BLE001 - the error that failed the batch is the one raised
            return
        for slot in slots:
            slot[1] = None

    def ready(self, batch: DeviceBatch | Future):
        """On the consumer's thread: make its current stream wait for the copies and mark
        the tensors as used there. One dict, or a list of dicts with several devices. A
        batch still being staged is waited for (its staging error is raised here)."""
        torch = self.torch
        if isinstance(batch, Future):
            batch = batch.result()
        for dev, part, event in zip(self.devices, batch.parts, batch.events):
            current = torch.cuda.current_stream(dev)
            current.wait_event(event)
            for value in part.values():
                if isinstance(value, torch.Tensor):
                    value.record_stream(current)
        return batch.parts[0] if len(batch.parts) == 1 else batch.parts


def wants_cuda(output: str, device: Any, devices: Any) -> bool:
    """True only when the user asked for CUDA; never imports torch otherwise."""
    if output != "torch":
        return False
    targets = list(devices) if devices else ([device] if device is not None else [])
    for d in targets:
        text = str(d)
        if text.startswith("cuda") or getattr(d, "type", None) == "cuda":
            return True
    return False


def jax_place(host_converted: dict, placement: Any) -> dict:
    """``jax.device_put`` every array (async); placement is a device or a Sharding. A
    Sharding over devices of several processes (a global mesh of a ``jax.distributed``
    job) makes one global array per column from every process's batch
    (``jax.make_array_from_process_local_data``): this process's rows are its slice along
    the sharded axis, where the sharding lays out its devices (rank order for a mesh of
    ``jax.devices()``). Every rank yields the same number of batches of the same sizes,
    so the processes build each global array together."""
    from ..convert.jax_out import import_jax
    jax = import_jax()
    if not getattr(placement, "is_fully_addressable", True):
        put = functools.partial(jax.make_array_from_process_local_data, placement)
    else:
        put = functools.partial(_device_put, jax, placement)
    return {k: (put(v) if hasattr(v, "shape") and not isinstance(v, list) else v)
            for k, v in host_converted.items()}


def _device_put(jax, placement: Any, value: Any) -> Any:
    return jax.device_put(value, placement)
