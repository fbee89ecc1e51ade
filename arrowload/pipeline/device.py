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

Whole reads on the device (one device): where a read converted whole into host arrays (a
``HostChunk``: a row group, a slice of an in-memory table, a gathered run of shuffled rows),
the reader thread that made it copies all of it to the device at once (:meth:`chunk`):
one copy per column per read, not per batch, and batches are then views of the device
tensors (a batch straddling two reads is concatenated on the device). Arrays already in
page-locked memory go to the device directly, with no host copy; others go through pinned
staging, one host copy per read. With ``ARROWLOAD_PIN_TABLES=1`` the buffers of an
in-memory Arrow table read unshuffled are page-locked in place once per loader
(:class:`HostPins`, ``cudaHostRegister``), so its reads need no host copy at all (opt-in;
see ``pin_tables_setting``). A ``stack=`` group whose columns share one type reaches the
stage as its columns (``chunks.StackParts``) and is stacked on the device: page-locked
columns copied as they are, others staged each into a row of one ``[k, rows]`` buffer
(sequential copies) and transposed there; not by a strided host copy. A whole read's
tensors are made usable on the device's default stream once (:meth:`_home`), so a
training loop there gets their batches with no stream call per batch (each such call
releases and retakes the GIL, which the reader threads contend for). On an H200
host, batch 4096 over a 2M-row in-memory table (``benchmarks/RESULTS.md``): one host copy a
batch bounds the stage at about 7-9 GB/s; whole reads staged gave 3.3 GB/s against 2.4
staged per batch; a page-locked table copied a read at a time reached 37 GB/s in a probe,
the bare pinned copy's rate. Reads that do not convert whole (strings, lists padded per
batch, a ``transform=``) and several devices keep the per-batch staging above.

jax (``output="jax"`` with ``device=`` or ``sharding=``): ``jax.device_put`` is
asynchronous; the producer thread issues it as soon as a batch is collated, so the
batches waiting in the prefetch queue are already on (or on their way to) the devices.
A ``jax.sharding.Sharding`` places a global batch across local devices.

Nothing here runs unless a CUDA device / jax placement is asked for: ``device=None`` or
``"cpu"`` never touches ``torch.cuda``.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import os
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import DeviceUnavailableError, InvalidArgumentError
from ..options import usable_cores
from .chunks import ColumnRows, HostChunk, StackParts, check_widths, goes_whole
from .collate import _bucket

#: A batch whose host arrays hold at least this many bytes is staged on a staging thread.
THREAD_BYTES = 4 << 20

#: Pinned staging kept for reuse by default, in bytes (the loader passes its ``prefetch``
#: budget, at least 64 MiB).
POOL_BYTES = 256 << 20


def default_copy_threads() -> int:
    """Staging threads by default: 1, or 2 where the process may run on 8 cores or more."""
    return 2 if usable_cores() >= 8 else 1


_BUSY = object()  # a staging slot handed out whose copy is not recorded yet


#: Whether a one-device stage copies whole reads (``chunk``); off, every batch is staged
#: on its own (``copy`` / ``to_device``).
WHOLE_READS = True

class DeviceChunk(ColumnRows):
    """The rows of one read on the device: tensors (first axis rows) in output order, and
    the event after which they are filled. ``slice`` gives views, as ``HostChunk``'s does
    (not a ``HostChunk``: checks for host arrays do not take it)."""

    __slots__ = ("event",)

    def __init__(self, columns: dict, num_rows: int, row_bytes: float, event: Any) -> None:
        super().__init__(columns, num_rows, row_bytes)
        self.event = event

    def _with(self, columns: dict, num_rows: int) -> "DeviceChunk":
        return DeviceChunk(columns, num_rows, self.row_bytes, self.event)


@dataclass
class DeviceBatch:
    """Tensors being copied to the device(s), with the event that marks the copy done."""

    parts: list[dict]          # one dict per device
    events: list[Any]
    stage: "TorchDeviceStage"
    homed: bool = False        # cut from a device chunk: ready on the home stream already


class TorchDeviceStage:
    """Pinned staging + asynchronous host-to-device copies on a dedicated stream."""

    def __init__(self, devices: list[Any], pool_capacity: int | None = None, pool_bytes: int | None = None,
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
        # "cuda" (no index) is the current device now, named by its index: every stream and
        # device lookup of torch then takes its short path, not a search for the current device
        # (about 40 us a call, a few calls a batch, measured on an H100 host)
        self.devices = [d if d.index is not None else torch.device("cuda", torch.cuda.current_device())
                        for d in self.devices]
        self.streams = [torch.cuda.Stream(device=d) for d in self.devices]
        #: where training steps run unless the user sets a stream: the device's default
        #: stream. A whole read's tensors are made usable there once per read (``_home``),
        #: so its batches need no stream calls there (each releases and retakes the GIL,
        #: contended by the reader threads)
        self.homes = [torch.cuda.default_stream(d) for d in self.devices]
        self._lock = threading.Lock()
        self._pinned: dict[tuple, list[list]] = {}  # key -> [[tensor, event | None], ...]
        self.copy_threads = default_copy_threads() if copy_threads is None else copy_threads
        # every staging thread may hold one batch's slots while earlier copies still run
        self.capacity = pool_capacity or 2 * self.copy_threads + 4
        #: the most pinned staging bytes kept for reuse (reads vary in size: many keys)
        self.pool_bytes = POOL_BYTES if pool_bytes is None else pool_bytes
        self.pinned_bytes = 0
        self._executor: ThreadPoolExecutor | None = None
        #: whole reads go to the device (one device only; see the module docstring)
        self.chunks = WHOLE_READS and len(self.devices) == 1
        # (event, host arrays) of whole-read copies that may still be reading those arrays:
        # they stay referenced (a pooled buffer is not reused) until the event completes
        self._inflight: deque = deque()
        self.reads = 0          # whole reads copied to the device
        self.direct_bytes = 0   # copied to the device straight from page-locked host memory
        self.staged_bytes = 0   # copied through pinned staging (one host copy)
        self._pins: weakref.finalize | None = None  # unlocks the table this stage page-locked

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
            slot = [tensor, _BUSY, tensor.numpy()]  # the pinned tensor, its copy's event, its array
            nbytes = slot[2].nbytes
            # kept for reuse within ``capacity`` a key and ``pool_bytes`` in all; past that a
            # slot serves once (torch's pinned allocator, which recorded the copy's event on
            # it, reuses its memory only after the copy)
            if len(slots) < self.capacity and self.pinned_bytes + nbytes <= self.pool_bytes:
                slots.append(slot)
                self.pinned_bytes += nbytes
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
        """Stop the staging threads (batches not staged yet are dropped) and unlock the
        pages of a table locked by :meth:`pin`. A later ``to_device`` starts them again."""
        with self._lock:
            executor, self._executor = self._executor, None
            pins, self._pins = self._pins, None
            self._inflight.clear()
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
        if pins is not None:
            pins()

    # -- whole reads ------------------------------------------------------------------
    def pin(self, table) -> None:
        """Page-lock ``table``'s buffers in place (once; undone by :meth:`close` or when the
        stage is collected), so its reads go to the device with no host copy. Skipped for a
        table over ``PIN_SHARE`` of the machine's memory, and range by range where the driver
        refuses (memory mapped read-only, ...): those reads are staged."""
        if self._pins is not None or not self.chunks:
            return
        spans = table_spans(table)
        total = sum(hi - lo for lo, hi in spans)
        limit = PIN_SHARE * (os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
        held = HOST_PINS.pin(spans, cuda_register(self.torch)) if 0 < total <= limit else []
        with self._lock:
            if self._pins is None:
                # the table stays referenced until its pages are unlocked, and the copy
                # streams too: no copy may still read the pages when they are
                self._pins = weakref.finalize(self, _unpin, held, table, list(self.streams))
                return
        HOST_PINS.unpin(held)  # pinned by another thread meanwhile

    def place(self, items: list) -> list:
        """On a reader thread: each host chunk of a read whose arrays are all numeric starts
        its copy to the device (:class:`DeviceChunk`); other items are returned as they are."""
        if not self.chunks:
            return items
        return [self.chunk(it) if _whole(it) else it for it in items]

    def chunk(self, host) -> DeviceChunk:
        """Copy a host chunk's arrays to the device, on the copy stream: arrays in page-locked
        memory directly, others through pinned staging."""
        torch = self.torch
        dev, stream = self.devices[0], self.streams[0]
        self._collect()
        used, columns, direct, staged = [], {}, 0, 0
        with self._copying(dev, stream, used):
            for name, value in host.columns.items():
                if isinstance(value, StackParts):
                    columns[name], page_locked = self._stack(value, dev, used)
                    if page_locked:
                        direct += value.nbytes
                    else:
                        staged += value.nbytes
                    continue
                arr = value.view(np.int64) if value.dtype.kind in "mM" else value
                src = torch.from_dlpack(arr)
                if src.is_pinned():
                    direct += arr.nbytes
                else:
                    view = self._staged(arr.nbytes, arr.dtype, arr.shape, used)
                    np.copyto(view, arr)
                    src = torch.from_numpy(view)
                    staged += arr.nbytes
                columns[name] = src.to(dev, non_blocking=True)
            event = self._recorded(stream, used)
        self._home(columns, event)
        with self._lock:
            if direct:
                self._inflight.append((event, host))
            self.reads += 1
            self.direct_bytes += direct
            self.staged_bytes += staged
        return DeviceChunk(columns, host.num_rows, host.row_bytes, event)

    def _staged(self, nbytes: int, dtype: np.dtype, shape: tuple, used: list) -> np.ndarray:
        """A pinned staging array of ``shape`` and ``dtype`` for a whole read, its slot added
        to ``used``: buffers keyed by size, rounded up (reads vary in rows), viewed as asked."""
        slot = self._staging((_bucket(max(1, nbytes)),), np.uint8)
        used.append(slot)
        return slot[2][:nbytes].view(dtype).reshape(shape)

    def _stack(self, group: StackParts, dev, used: list) -> tuple[Any, bool]:
        """A ``stack=`` group's ``[rows, k]`` tensor made on the device from its columns, on
        the current (copy) stream, and whether they went there with no host copy (all
        page-locked); else each is staged into a row of one ``[k, rows]`` pinned buffer
        (sequential copies, not a strided host stack) and transposed on the device."""
        torch = self.torch
        srcs = [torch.from_dlpack(m) for m in group.members]
        if all(src.is_pinned() for src in srcs):
            return torch.stack([src.to(dev, non_blocking=True) for src in srcs], dim=1), True
        n, k = group.shape
        rows = self._staged(group.nbytes, group.dtype, (k, n), used)
        for j, member in enumerate(group.members):
            np.copyto(rows[j], member)
        return torch.from_numpy(rows).to(dev, non_blocking=True).t().contiguous(), False

    def _home(self, columns: dict, event) -> None:
        """Make a device chunk's tensors (made on the copy stream) usable on the home stream,
        once for all its batches: the home stream waits for their copy, and their memory is
        not reused until the home stream's work queued when they are freed is done. The
        wait is queued when the read is copied, ahead of its batches: default-stream work
        queued after it (steps on earlier batches too) starts once that copy is done, which
        prefetch keeps ahead of the step."""
        home = self.homes[0]
        home.wait_event(event)
        for tensor in columns.values():
            tensor.record_stream(home)

    def _collect(self) -> None:
        """Drop the host arrays of whole-read copies that have finished, oldest first."""
        with self._lock:
            while self._inflight and self._inflight[0][0].query():
                self._inflight.popleft()

    def combine(self, parts: Sequence, host: Callable[[Sequence], Any]):
        """One batch of consecutive parts (see ``stages.Stages.combine``): device chunks are
        joined on the device (views where there is one part); parts still on the host are
        combined by ``host`` (the chunk converter's, which raises a batch's conversion
        error) and copied to the device first when they sit beside device chunks."""
        if not any(isinstance(p, DeviceChunk) for p in parts):
            return host(parts)
        if len(parts) == 1:
            return parts[0]
        parts = [p if isinstance(p, DeviceChunk) else host([p]) for p in parts]
        if not all(isinstance(p, DeviceChunk) or _whole(p) for p in parts):  # never seen: one schema
            return host([_to_host(p) for p in parts])
        parts = [p if isinstance(p, DeviceChunk) else self.chunk(p) for p in parts]
        torch = self.torch
        dev, stream = self.devices[0], self.streams[0]
        for name in parts[0].columns:  # lists of other widths in each read: the host path's error
            check_widths(name, [p.columns[name] for p in parts])
        with self._copying(dev, stream, []):
            for p in parts:  # chunks copied on another thread: ordered by their events
                stream.wait_event(p.event)
            columns = {name: torch.cat([p.columns[name] for p in parts]) for name in parts[0].columns}
            event = self._recorded(stream, [])
        self._home(columns, event)
        n = sum(p.num_rows for p in parts)
        return DeviceChunk(columns, n, sum(p.nbytes for p in parts) / max(1, n), event)

    def describe(self) -> str:
        """How batches reach the device(s), in words (``Loader.explain()``)."""
        devices = ", ".join(str(d) for d in self.devices)
        if not self.chunks:
            return f"{devices}: each batch staged through pinned memory on a copy stream per device"
        pin = "on" if pin_tables_setting() else "off, ARROWLOAD_PIN_TABLES=1 turns it on"
        return (f"{devices}: numeric reads copied whole through pinned memory on a copy stream, batches "
                f"cut on the device; an in-memory table read unshuffled page-locked in place: {pin}")

    def counts(self) -> dict[str, int]:
        """Running counts of whole reads: ``reads``, ``direct_bytes``, ``staged_bytes``."""
        with self._lock:
            return {"reads": self.reads, "direct_bytes": self.direct_bytes, "staged_bytes": self.staged_bytes}

    def batch(self, chunk: DeviceChunk) -> DeviceBatch:
        """A device chunk cut to one batch, as ``ready`` takes it."""
        return DeviceBatch([dict(chunk.columns)], [chunk.event], self, homed=True)

    def copy(self, host: dict) -> DeviceBatch:
        """Copy ``host`` into pinned staging and start its copies to the device(s), on the
        calling thread. Thread-safe: each column of each batch has its own staging buffer
        until its copy's event completes."""
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
            with self._copying(dev, stream, used):
                for name, arr in arrays.items():
                    slot = self._staging(arr.shape, arr.dtype)
                    used.append(slot)
                    np.copyto(slot[2], arr)  # the one host copy, into pinned memory
                    out[name] = slot[0].to(dev, non_blocking=True)
                event = self._recorded(stream, used)
            parts.append(out)
            events.append(event)
        return DeviceBatch(parts, events, self)

    @contextlib.contextmanager
    def _copying(self, dev, stream, used: list):
        """The body queues work on ``stream``, made this thread's current one for ``dev``
        meanwhile (what ``torch.cuda.stream(stream)`` does, without its lookups of the
        current device); current streams are per thread, so the consumer's is untouched.
        If the body fails, the staging slots in ``used`` are freed once the stream is done."""
        torch = self.torch
        previous = torch.cuda.current_stream(dev)
        torch.cuda.set_stream(stream)
        try:
            yield
        except BaseException:
            self._free_after(stream, used)
            raise
        finally:
            torch.cuda.set_stream(previous)

    def _recorded(self, stream, used: list):
        """An event recorded on ``stream`` after the work queued so far; the staging slots in
        ``used`` are reusable once it completes."""
        event = self.torch.cuda.Event()
        event.record(stream)
        for slot in used:
            slot[1] = event
        return event

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
        for dev, home, part, event in zip(self.devices, self.homes, batch.parts, batch.events):
            current = torch.cuda.current_stream(dev)
            if batch.homed and current == home:
                continue  # made usable there when its read was copied (``_home``)
            current.wait_event(event)
            for value in part.values():
                if isinstance(value, torch.Tensor):
                    value.record_stream(current)
        return batch.parts[0] if len(batch.parts) == 1 else batch.parts


def _to_host(part):
    """A device chunk's rows back on the host (a synchronous copy), as a ``HostChunk``."""
    if not isinstance(part, DeviceChunk):
        return part
    part.event.synchronize()
    return HostChunk({k: v.cpu().numpy() for k, v in part.columns.items()}, part.num_rows, part.row_bytes)


def _whole(item) -> bool:
    """A host chunk whose every column is a numeric host array (a read that goes to the
    device whole); Arrow batches and chunks holding Python lists do not."""
    return isinstance(item, HostChunk) and bool(item.columns) and goes_whole(item.columns)


# -- page-locking host memory in place -----------------------------------------------------

#: The largest share of the machine's memory one stage page-locks in place.
PIN_SHARE = 0.25


def pin_tables_setting() -> bool:
    """``$ARROWLOAD_PIN_TABLES=1``: page-lock an in-memory table read unshuffled to a CUDA
    device in place (:meth:`TorchDeviceStage.pin`). Its batches equal the CPU loader's on
    an H200 (``tests/test_device.py``, 2026-11-29). Off by default: it locks the user's
    memory (0.2 s for a 660 MB table, each loader), and it gained little there (4.7
    against 3.9 GB/s, ``benchmarks/bench_gpu.py``), the path being bound by Python work
    per read and per batch, not by the host copy."""
    return os.environ.get("ARROWLOAD_PIN_TABLES", "").strip() == "1"


def table_spans(table) -> list[tuple[int, int]]:
    """The page-aligned address ranges holding ``table``'s buffers, merged, in order."""
    page = os.sysconf("SC_PAGE_SIZE")
    spans = []

    def add(arr) -> None:
        for buf in arr.buffers():
            if buf is not None and buf.size and buf.is_cpu:
                spans.append((buf.address // page * page, -(-(buf.address + buf.size) // page) * page))

    for column in table.columns:
        for chunk in column.chunks:
            add(chunk)  # buffers() lists a nested array's children's buffers too
    spans.sort()
    merged: list[list[int]] = []
    for lo, hi in spans:
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return [(lo, hi) for lo, hi in merged]


def cuda_register(torch) -> tuple[Callable[[int, int], bool], Callable[[int], None]]:
    """(register(address, size) -> done, unregister(address)) through the CUDA runtime."""
    cudart = torch.cuda.cudart()

    def register(lo: int, size: int) -> bool:
        if int(cudart.cudaHostRegister(lo, size, 0)) == 0:
            return True
        # the runtime keeps the error as its last one; the next kernel launch torch checks
        # would raise it there: consume it now, on a launch of our own
        try:
            torch.zeros(1, device="cuda").add_(1)
        except Exception:  # noqa: BLE001 - the refused registration's error, consumed
            pass
        return False

    def unregister(lo: int) -> None:
        cudart.cudaHostUnregister(lo)

    return register, unregister


class HostPins:
    """Page-locked address ranges of this process, counted: a range is registered once with
    the driver (which refuses to register overlapping memory twice) and unregistered when
    its last holder lets go. ``pin`` registers only the parts of the ranges asked for that
    no earlier holder covers, and returns what the caller now holds, for ``unpin``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._starts: list[int] = []                  # sorted starts of registered ranges
        self._ranges: dict[int, list] = {}            # start -> [end, holders, unregister]

    def pin(self, spans: Sequence[tuple[int, int]],
            calls: tuple[Callable[[int, int], bool], Callable[[int], None]]) -> list[int]:
        register, unregister = calls
        held: list[int] = []
        starts, ranges = self._starts, self._ranges
        with self._lock:
            for lo, hi in spans:
                cursor = lo
                i = bisect.bisect_right(starts, lo) - 1
                if i < 0 or ranges[starts[i]][0] <= lo:  # no registered range holds ``lo``
                    i += 1
                while cursor < hi:
                    start = starts[i] if i < len(starts) and starts[i] < hi else None
                    gap_end = hi if start is None else start
                    if cursor < gap_end and register(cursor, gap_end - cursor):
                        ranges[cursor] = [gap_end, 1, unregister]
                        bisect.insort(starts, cursor)
                        held.append(cursor)
                        i += 1  # the new range now sits at i, the next registered one after it
                    if start is None:
                        break
                    entry = ranges[start]
                    entry[1] += 1
                    held.append(start)
                    cursor = max(cursor, entry[0])
                    i += 1
        return held

    def unpin(self, held: Sequence[int]) -> None:
        with self._lock:
            for start in held:
                entry = self._ranges[start]
                entry[1] -= 1
                if entry[1] == 0:
                    del self._ranges[start]
                    self._starts.remove(start)
                    entry[2](start)

    def ranges(self) -> list[tuple[int, int, int]]:
        """(start, end, holders) of every registered range, in address order."""
        with self._lock:
            return [(s, self._ranges[s][0], self._ranges[s][1]) for s in self._starts]


#: The process's page-locked ranges.
HOST_PINS = HostPins()


def _unpin(held: Sequence[int], table: Any, streams: list) -> None:
    """Unlock ``held`` once ``streams`` have finished every copy (closed or collected, a
    stage's copies may still read the pages); ``table``, whose buffers they hold, was kept
    alive until now."""
    for stream in streams:
        stream.synchronize()
    HOST_PINS.unpin(held)
    del table


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


def check_sharding(placement: Any, sizes: Iterable[int]) -> None:
    """Refuse a jax ``Sharding`` that cannot lay out a batch of each of ``sizes`` rows along
    its first axis (the batch size, and an epoch's short last batch): jax would raise at
    that batch, the last one only after an epoch of training. A device places anything."""
    shard_shape = getattr(placement, "shard_shape", None)
    if shard_shape is None:
        return
    from ..convert.jax_out import import_jax
    jax = import_jax()
    processes = 1 if getattr(placement, "is_fully_addressable", True) else jax.process_count()
    # the other axes as wide as the devices: any mesh axis divides them
    rest = (len(placement.device_set),) * (len(getattr(placement, "spec", ())) - 1)
    for rows in sorted(set(sizes)):
        try:
            shard_shape((rows * processes, *rest))
        except ValueError as exc:
            last = "" if rows == max(sizes) else (
                " (the epoch's last batch: pass drop_last=True, or a batch_size that divides this rank's rows)")
            raise InvalidArgumentError(f"sharding= cannot split a batch of {rows} rows{last}: {exc}", "sharding") \
                from None


def _device_put(jax, placement: Any, value: Any) -> Any:
    return jax.device_put(value, placement)
