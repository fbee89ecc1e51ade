"""The sequential layer of one epoch: reader threads run tasks ahead, one producer thread
cuts their rows into batches in task order and converts them, the consumer takes them;
everything held in flight is bounded in bytes.

Wired from plain callables (:class:`Stages`: the task sequence, ``read(task)``,
``combine(parts)``, ``transform(batch)``, ``finish(batch)``, ``deliver(out)``); nothing
here knows the Loader, a row source or an output type.

Reader threads are sized to the machine and tuned while the epoch runs (:class:`Readers`):
at most ``Settings.max_readers`` threads exist (``io_threads``, or the cores this process
may run on), of which ``target`` may be busy. The producer starts ``target`` from the
bytes of the first task and the prefetch budget, adds a reader while the consumer waits
on a read that is not done and the budget has room for another task, and drops one when
the readers sat idle for more than one reader's time since the last look. Results are
taken in task order whatever the thread timing, so the batches never depend on it.

Threads: ``arrowload-loader`` (the producer) and ``arrowload-read-<n>`` (readers); all stop
on ``close()`` (the iterator's finalizer calls it); an exception raised on any of them is
re-raised where the consumer iterates.
"""

from __future__ import annotations

import atexit
import gc
import itertools
import os
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import CancelledError, Future, wait
from dataclasses import dataclass
from typing import Any

from ..errors import InternalError, LoaderClosedError
from ..order.tasks import Task, TaskKind
from .budget import ByteBudget
from .options import usable_cores
from .stats import LoaderStats

#: Thread names: ``arrowload-read-<n>`` for readers, ``arrowload-loader`` for the producer.
READER_PREFIX = "arrowload-read"
PRODUCER_NAME = "arrowload-loader"
#: Readers are re-tuned at most this often (seconds): idle time is judged over such spans.
TUNE_SPAN_S = 0.05
#: Batches ready for a consumer that never waited since the last look: the readers run
#: ahead of it (one fewer keeps up).
AHEAD_BATCHES = 4
#: The CPU time of native threads is re-read at most this often while an epoch runs.
NATIVE_CPU_EVERY_S = 0.5


@dataclass(frozen=True)
class Stages:
    """What one epoch runs, as plain callables.

    - ``tasks``: the reads, in epoch order (``order.tasks.plan_tasks``);
    - ``read(task, cache=..., map_units=...) -> (parts, convert_seconds)``: one task's rows,
      on a reader thread; ``cache(key, load)`` shares a read between tasks,
      ``map_units(fn, items)`` runs a task's sub-reads on free reader slots;
    - ``place(items) -> items`` (optional) on the reader thread after each read: the CUDA
      stage starts copying whole reads to the device there (``device.TorchDeviceStage.place``);
    - ``combine(parts) -> batch``: consecutive parts (``.num_rows``, ``.nbytes``, ``.slice``)
      of exactly one batch as one batch;
    - ``transform(batch) -> batch`` (optional) and ``finish(batch) -> out`` on the producer
      thread, in order; or ``transform`` asynchronous (it has ``submit(batch) -> handle``,
      ``result(handle) -> batch`` and ``window``: Ray tasks, ``scaleout.executor``): up to
      ``window`` batches in flight, their bytes in the budget, finished in batch order;
    - ``deliver(out) -> out`` (optional) on the consumer's thread as each batch is taken;
    - ``device() -> {counter: n}`` (optional): the CUDA stage's running counts of whole reads
      (``reads``, ``direct_bytes``, ``staged_bytes``), for ``LoaderStats.device`` (this
      iteration's share);
    - ``decoded() -> {decoder: units}`` (optional): the reader's running count of units each
      decoder read, for ``LoaderStats.decoders`` (this iteration's share);
    - ``held``: bytes the reads hold outside their tasks for the whole iteration (a polars
      stream's read-ahead, ``streamreads.py``), counted in the budget from the start;
    - ``close()`` (optional): stops what ``read`` runs outside the tasks (the stream's
      query), called first when the iteration ends or is closed;
    - ``readers`` (optional): the most reader threads these reads can use, below
      ``Settings.max_readers`` (a polars stream's tasks take their rows one at a time).
    """

    tasks: Iterable[Task]
    read: Callable[..., tuple[list, float]]
    combine: Callable[[list], Any]
    finish: Callable[[Any], Any]
    transform: Callable[[Any], Any] | None = None
    deliver: Callable[[Any], Any] | None = None
    place: Callable[[list], list] | None = None
    decoded: Callable[[], dict] | None = None
    device: Callable[[], dict] | None = None
    held: int = 0
    close: Callable[[], None] | None = None
    readers: int | None = None


@dataclass(frozen=True)
class Settings:
    """``batch_size`` rows per batch (the last may be short); ``prefetch`` bytes read and not
    yet consumed; ``max_readers`` reader threads at most; ``share_units``: tasks over one
    unit share its read (ranges cut per batch, as for DataLoader workers)."""

    batch_size: int
    prefetch: int
    max_readers: int
    share_units: bool = False


def thread_cpu() -> dict[int, float]:
    """CPU seconds of each thread of this process, by native id (Linux ``/proc``; empty
    where it is not available). Resolution: the kernel's clock tick (10 ms)."""
    out: dict[int, float] = {}
    try:
        tids = os.listdir("/proc/self/task")
        tick = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                text = f.read()
        except OSError:
            continue  # the thread ended meanwhile
        fields = text[text.rindex(b")") + 2:].split()
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def start_readers(first: Task, prefetch: int, bound: int) -> int:
    """Readers to start with: as many reads of the first task's size as the budget holds,
    between 1 and ``bound``."""
    return max(1, min(bound, prefetch // max(1, first.est_bytes)))


class Readers:
    """At most ``bound`` reader threads, of which at most ``target`` run a task at once.

    Threads start on demand and end when they find themselves beyond ``target`` with
    nothing to do, so the threads alive never exceed ``bound`` and the busy ones never
    exceed ``target``. ``submit`` queues a task (FIFO); ``map`` runs sub-reads of a running
    task on free slots, or inline on the calling thread, so a task never waits for a slot.
    Counts: ``peak`` (most busy at once), ``cpu_s`` (the tasks' thread CPU time), idle time
    of the threads waiting for work (``take_idle``)."""

    def __init__(self, bound: int, target: int = 1, name: str = READER_PREFIX) -> None:
        self.bound = max(1, int(bound))
        self.target = max(1, min(self.bound, int(target)))
        self.busy = 0
        self.peak = 0
        self.most_alive = 0  # the most threads alive at once
        self.cpu_s = 0.0
        self._name = name
        self._numbers = itertools.count()
        self._cond = threading.Condition()
        self._queue: deque = deque()
        self._subs = 0  # sub-reads (``map``) at the front of the queue, by their task's number
        self._seq = itertools.count()  # tasks numbered as submitted: older first among sub-reads
        self._local = threading.local()  # the number of the task a reader thread runs
        self._threads: set[threading.Thread] = set()
        self._waiting: dict[threading.Thread, float] = {}
        self._idle_acc = 0.0
        self._idle_from = time.perf_counter()
        self._closed = False

    @property
    def alive(self) -> int:
        return len(self._threads)

    @property
    def queued(self) -> int:
        """Tasks and sub-reads waiting for a free slot."""
        return len(self._queue)

    def set_target(self, n: int) -> None:
        with self._cond:
            self.target = max(1, min(self.bound, int(n)))
            self._spawn()
            self._cond.notify_all()

    def submit(self, fn: Callable, *args: Any) -> Future:
        fut: Future = Future()
        with self._cond:
            if self._closed:
                fut.cancel()
                fut.set_running_or_notify_cancel()
                return fut
            self._queue.append((fut, fn, args, next(self._seq)))
            self._spawn()
            self._cond.notify()
        return fut

    def map(self, fn: Callable, items: Sequence) -> list:
        """``[fn(x) for x in items]``, side by side on free reader slots; called from a
        running task. Sub-reads queue ahead of whole tasks but behind the sub-reads queued
        before them (older tasks' first), and the calling thread runs queued sub-reads in
        that order until all of its own have started, then waits for them: threads whose
        own task is further on help finish the older one first (a block-shuffle window's
        units are read by every reader, so its batches come sooner). Sub-reads never wait
        on anything, so no thread waits on one that is not running."""
        items = list(items)
        if len(items) <= 1 or self.bound <= 1:
            out = []
            for x in items:
                self._check_open()
                out.append(fn(x))
            return out
        futures = [Future() for _ in items]
        with self._cond:
            if self._closed:
                for fut in futures:
                    fut.cancel()
            else:
                seq = getattr(self._local, "seq", -1)
                at = self._subs  # behind the sub-reads of older (or the same) tasks
                while at and self._queue[at - 1][3] > seq:
                    at -= 1
                for fut, x in zip(futures, items):
                    self._queue.insert(at, (fut, fn, (x,), seq))
                    self._subs += 1
                    at += 1
                self._spawn()
                self._cond.notify_all()
        while not all(f.done() or f.running() for f in futures):
            with self._cond:
                if not self._subs:
                    break
                fut, f, args, _ = self._queue.popleft()
                self._subs -= 1
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(f(*args))
                except BaseException as exc:  # noqa: BLE001 - re-raised by whoever waits on it
                    fut.set_exception(exc)
            del fut, f, args
        # every one was taken by a thread (it runs to the end) or cancelled by close(), which
        # ends the read: nobody waits for it, and running them here would hold close() up
        # for every sub-read left (a window's units, a mixture's reads ahead)
        if any(fut.cancelled() for fut in futures):
            self._check_open()
        return [fut.result() for fut in futures]

    def _check_open(self) -> None:
        """Raise ``CancelledError`` once ``close()`` was called: the read in progress ends."""
        if self._closed:
            raise CancelledError("the loader's readers were closed while this read ran")

    def wait(self, fut: Future) -> Any:
        """``fut``'s result, running queued sub-reads (``map``) on this thread meanwhile: a
        reader waiting for a read another task started (a unit or window shared through a
        cache) helps finish it instead of sitting idle. Sub-reads never wait on this thread."""
        while not fut.done():
            with self._cond:
                item = None
                if self._subs and not self._closed:
                    item = self._queue.popleft()
                    self._subs -= 1
            if item is None:
                wait((fut,), timeout=0.002)
                continue
            sub, f, args, _ = item
            if sub.set_running_or_notify_cancel():
                try:
                    sub.set_result(f(*args))
                except BaseException as exc:  # noqa: BLE001 - re-raised by whoever waits on it
                    sub.set_exception(exc)
            del item, sub, f, args
        return fut.result()

    def take_idle(self, now: float | None = None) -> float:
        """Seconds the threads spent waiting for work since the last call."""
        now = time.perf_counter() if now is None else now
        with self._cond:
            since = self._idle_from
            idle = self._idle_acc + sum(now - max(t, since) for t in self._waiting.values())
            self._idle_acc = 0.0
            self._idle_from = now
        return idle

    def close(self, join: bool = True) -> None:
        """Cancel the work queued and take none after it (a read running in a sub-read's
        ``map`` ends); with ``join``, wait for the threads to finish what they run."""
        with self._cond:
            self._closed = True
            self._subs = 0
            while self._queue:
                fut = self._queue.popleft()[0]
                fut.cancel()
                fut.set_running_or_notify_cancel()
            self._cond.notify_all()
            threads = list(self._threads)
        if not join:
            return
        me = threading.current_thread()
        for t in threads:
            if t is not me:
                t.join()

    # -- threads -------------------------------------------------------------------------
    def _spawn(self) -> None:
        """Start threads for queued work no waiting thread will take (lock held)."""
        while len(self._queue) > len(self._waiting) and len(self._threads) < self.target:
            t = threading.Thread(target=self._work, name=f"{self._name}-{next(self._numbers)}", daemon=True)
            self._threads.add(t)
            self.most_alive = max(self.most_alive, len(self._threads))
            self._waiting[t] = time.perf_counter()  # counted as waiting until it takes work
            t.start()

    def _work(self) -> None:
        me = threading.current_thread()
        cond = self._cond
        while True:
            with cond:
                while True:
                    if self._closed or (len(self._threads) > self.target and not
                                        (self._queue and self.busy < self.target)):
                        self._end_wait(me)
                        self._threads.discard(me)
                        cond.notify_all()
                        return
                    if self._queue and self.busy < self.target:
                        break
                    self._waiting.setdefault(me, time.perf_counter())
                    cond.wait()
                self._end_wait(me)
                fut, fn, args, seq = self._queue.popleft()
                if self._subs:
                    self._subs -= 1
                self._local.seq = seq
                self.busy += 1
                self.peak = max(self.peak, self.busy)
            cpu = 0.0
            if fut.set_running_or_notify_cancel():
                c0 = time.thread_time()
                try:
                    fut.set_result(fn(*args))
                except BaseException as exc:  # noqa: BLE001 - re-raised by whoever waits on it
                    fut.set_exception(exc)
                cpu = time.thread_time() - c0
            del fut, fn, args
            with cond:
                self.busy -= 1
                self.cpu_s += cpu
                cond.notify_all()

    def _end_wait(self, me: threading.Thread) -> None:
        start = self._waiting.pop(me, None)
        if start is not None:
            self._idle_acc += max(0.0, time.perf_counter() - max(start, self._idle_from))


class SharedCache:
    """The last few units / windows read, shared by the reader threads, so consecutive
    tasks over one unit (a unit split between batches of DataLoader workers) read it once.
    A key being read by one thread is waited for, not read twice. ``capacity=0``: no
    sharing, every ``get`` loads."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._items: dict = {}

    def get(self, key, load: Callable[[], Any], wait: Callable[[Future], Any] | None = None):
        """``load()``'s result for ``key``, loaded once while kept; ``wait(future)`` waits for
        a load another thread runs (default: block; ``Readers.wait`` helps it along)."""
        if self.capacity == 0:
            return load()
        with self._lock:
            fut = self._items.get(key)
            owner = fut is None
            if owner:
                fut = Future()
                self._items[key] = fut
                while len(self._items) > self.capacity:
                    self._items.pop(next(iter(self._items)))
        if owner:
            try:
                fut.set_result(load())
            except BaseException as exc:  # noqa: BLE001 - waiters re-raise it
                fut.set_exception(exc)
                with self._lock:
                    self._items.pop(key, None)
        return wait(fut) if wait is not None and not owner else fut.result()


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


_DONE = object()


#: the iterations whose threads may still run (``_close_at_exit``)
_LIVE: "weakref.WeakSet[Pipeline]" = weakref.WeakSet()


def _close_at_exit() -> None:
    """At interpreter exit, after the iterators' own finalizers (which close theirs): stop
    any iteration still running, then collect the reference cycles its reads left, so that
    the DuckDB objects in them go while the interpreter is whole. A process leaving a
    filtered epoch (a DuckDB filter) in the middle -- a DataLoader worker told to stop --
    aborted in native teardown ("terminate called ..." / "FATAL: exception not rethrown",
    SIGABRT) in 13 of 16 runs of a probe; with this, 1 of 16 (not all: see the README's
    known limits). Iterations a finalizer already closed (or is closing) are left as they are: a
    second join would block again where the first was interrupted."""
    for pipeline in list(_LIVE):
        if pipeline.stop.is_set():
            continue
        try:
            pipeline.close()
        except Exception:  # noqa: BLE001 - exiting: nothing to report it to
            pass
    gc.collect()


atexit.register(_close_at_exit)


class Pipeline:
    """The threads of one epoch iteration. Owned by an :class:`EpochIterator`; never
    references it."""

    def __init__(self, stages: Stages, settings: Settings) -> None:
        _LIVE.add(self)
        self.stages = stages
        self.settings = settings
        self.stop = threading.Event()
        self.budget = ByteBudget(settings.prefetch, self.stop)
        self._held = self.budget.charge(max(0, int(stages.held)))  # never released: the reads hold it
        self.out: queue.Queue = queue.Queue()
        bound = max(1, min(settings.max_readers, stages.readers or settings.max_readers))
        self.stats = LoaderStats(readers_max=bound, prefetch=settings.prefetch, cores=usable_cores())
        self.readers = Readers(bound)
        self.cache = SharedCache(bound + 1 if settings.share_units else 0)
        self.consumer_waiting = False
        self._producer_cpu = 0.0
        self._tuned_at = 0.0
        self._consumer_waits = 0
        self._consumer_cpu = 0.0
        self._consumer_mark: float | None = None
        self._native_at = 0.0
        # an asynchronous transform's batches in flight, in order: (handle, bytes counted)
        self._transforming: deque = deque()
        self._transform_bytes = 0
        self.thread = threading.Thread(target=self._run, name=PRODUCER_NAME, daemon=True)
        self.started = time.perf_counter()
        self._cpu0 = time.process_time()
        self._decoded = stages.decoded
        self._decoded0 = stages.decoded() if stages.decoded is not None else {}
        self._device0 = stages.device() if stages.device is not None else {}
        self._threads0 = thread_cpu()
        self.thread.start()

    # producer ------------------------------------------------------------------
    def _read(self, task: Task) -> tuple[list, float, float]:
        t0 = time.perf_counter()
        items, convert_s = self.stages.read(task, cache=self.cache.get, map_units=self.readers.map)
        if self.stages.place is not None:
            t1 = time.perf_counter()
            items = self.stages.place(items)
            convert_s += time.perf_counter() - t1
        return items, time.perf_counter() - t0, convert_s

    def _run(self) -> None:
        cpu0 = time.thread_time()
        try:
            self._produce(cpu0)
            while self._transforming and not self.stop.is_set():
                self._emit_transformed()
            self.out.put(_DONE)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, re-raised there
            self.out.put(_Failure(exc))
        finally:
            self._producer_cpu = time.thread_time() - cpu0

    def _add_reader(self, waiting_on: Task) -> None:
        """The producer waits for a read: one reader more if the consumer waits too, every
        reader is busy, and there is work for another one -- reads already admitted waiting
        for a slot (sub-reads of a window), or room in the budget for another read of this
        size."""
        r = self.readers
        if not self.consumer_waiting or r.target >= r.bound or r.busy < r.target:
            return
        if r.queued or self.budget.fits(waiting_on.est_bytes):
            r.set_target(r.target + 1)
            r.take_idle()
            self._tuned_at = time.perf_counter()

    def _drop_reader(self) -> None:
        """One reader fewer when, since the last look, the readers were not needed: they sat
        idle for longer than one reader's whole time (the budget was full, or nothing was
        left to read), or they ran ahead -- the consumer never waited for a batch and
        batches are queued for it. Fewer readers
        then take the same rows at the same pace with less CPU contention."""
        r = self.readers
        now = time.perf_counter()
        span = now - self._tuned_at
        if span < TUNE_SPAN_S:
            return
        idle = r.take_idle(now)
        waited, self._consumer_waits = self._consumer_waits, 0
        self._tuned_at = now
        if r.target <= 1 or self.consumer_waiting:
            return
        ahead = not waited and self.out.qsize() >= AHEAD_BATCHES
        if idle >= span or ahead:
            r.set_target(r.target - 1)

    def _produce(self, cpu0: float) -> None:
        st = self.stages
        bsize = self.settings.batch_size
        readers = self.readers
        tasks = iter(st.tasks)
        inflight: deque[tuple[Future, Task]] = deque()
        pending: deque = deque()  # HostChunks / Arrow batches, in order
        pending_rows = 0
        carried = 0  # bytes of read rows still in `pending`, counted in the budget (see below)
        next_task: Task | None = next(tasks, None)
        if next_task is not None:
            readers.set_target(start_readers(next_task, self.settings.prefetch, readers.bound))
            readers.take_idle()
            self._tuned_at = time.perf_counter()
        while True:
            while len(inflight) < 2 * readers.target:
                if next_task is None:
                    next_task = next(tasks, None)
                    if next_task is None:
                        break
                if not self.budget.acquire(next_task.est_bytes, block=not inflight, own=carried + self._held):
                    if self.stop.is_set():
                        return
                    break  # over budget: let in-flight work drain first
                inflight.append((readers.submit(self._read, next_task), next_task))
                next_task = None
            if not inflight or self.stop.is_set():
                break
            fut, task = inflight.popleft()
            while not wait((fut,), timeout=TUNE_SPAN_S).done:
                if self.stop.is_set():  # closed: never wait out a read in flight
                    return
                self._add_reader(task)
            items, secs, convert_s = fut.result()
            del fut
            self._drop_reader()
            self.stats.read_s += secs - convert_s
            self.stats.reader_convert_s += convert_s  # on the reader thread, not this one
            self.stats.units_read += task.last - task.unit + 1 if task.kind == TaskKind.RUN else 1
            self.stats.bytes_read += task.read_bytes
            t0 = time.perf_counter()
            added = 0
            for b in items:
                pending.append(b)
                pending_rows += b.num_rows
                added += b.nbytes
            self.stats.bytes_decoded += added
            del items
            # The task's rows now wait in ``pending`` until cut into batches: its estimate
            # is replaced by the bytes it actually holds ("carried"), which pass to each
            # batch as it is emitted; the budget counts every byte read and not yet
            # consumed. Waits are only on the consumer, never on bytes this thread holds
            # itself (``own``), so a read larger than the whole budget still flows.
            self.budget.release(task.est_bytes)
            carried += self.budget.charge(added)
            reserved = sum(t.est_bytes for _, t in inflight)
            while pending_rows >= bsize:
                batch = st.combine(take_rows(pending, bsize))
                pending_rows -= bsize
                self.stats.collate_s += time.perf_counter() - t0
                give = min(carried, batch.nbytes)
                self.budget.release(give)
                carried -= give
                if not self._emit(batch, reserved + carried):
                    return
                t0 = time.perf_counter()
            held = sum(b.nbytes for b in pending)
            if carried > held:  # estimates of slices drift: never carry more than is held
                self.budget.release(carried - held)
                carried = held
            self.stats.collate_s += time.perf_counter() - t0
            self._producer_cpu = time.thread_time() - cpu0
        if pending_rows and not self.stop.is_set():
            batch = st.combine(take_rows(pending, pending_rows))
            self.budget.release(carried)
            self._emit(batch)

    def _emit(self, batch: Any, reserved: int = 0) -> bool:
        st = self.stages
        if hasattr(st.transform, "submit"):
            return self._submit(batch, reserved)
        if st.transform is not None:
            t0 = time.perf_counter()
            batch = st.transform(batch)
            self.stats.transform_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        out = st.finish(batch)
        self.stats.convert_s += time.perf_counter() - t0
        nbytes = batch.nbytes
        # Wait only while the consumer holds batches (it will release them), never on the
        # reads this thread has in flight.
        if not self.budget.acquire(nbytes, own=reserved + self._held):
            return False
        self.out.put((out, batch.num_rows, nbytes))
        return True

    def _submit(self, batch: Any, reserved: int) -> bool:
        """Hand ``batch`` to the asynchronous transform, its bytes counted in the budget until
        the consumer takes its result; then finish the oldest while more than ``window`` are
        in flight. The batches in flight are this thread's own: they never make it wait."""
        nbytes = batch.nbytes
        if not self.budget.acquire(nbytes, own=reserved + self._transform_bytes + self._held):
            return False
        t0 = time.perf_counter()
        self._transforming.append((self.stages.transform.submit(batch), nbytes))
        self._transform_bytes += nbytes
        self.stats.transform_s += time.perf_counter() - t0
        while len(self._transforming) > self.stages.transform.window:
            if self.stop.is_set():
                return False
            self._emit_transformed()
        return True

    def _emit_transformed(self) -> None:
        """The oldest transform in flight: its result finished and queued for the consumer."""
        handle, nbytes = self._transforming.popleft()
        t0 = time.perf_counter()
        batch = self.stages.transform.result(handle)
        del handle
        self._transform_bytes -= nbytes
        self.stats.transform_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        out = self.stages.finish(batch)
        self.stats.convert_s += time.perf_counter() - t0
        self.out.put((out, batch.num_rows, nbytes))  # the consumer releases what _submit acquired

    # consumer ------------------------------------------------------------------
    def next(self):
        if self.stop.is_set():  # ended, failed or closed: exhausted, as a generator is
            raise StopIteration
        t0 = time.perf_counter()
        mark = time.thread_time()
        if self._consumer_mark is not None:  # the consumer's own work since the last batch
            self._consumer_cpu += mark - self._consumer_mark
        try:
            item = self.out.get_nowait()  # a batch ready: no wait, no timed wait's bookkeeping
        except queue.Empty:
            self.consumer_waiting = True
            self._consumer_waits += 1
            while True:
                try:
                    item = self.out.get(timeout=0.1)
                    break
                except queue.Empty:
                    if not self.thread.is_alive() and self.out.empty():
                        raise InternalError("the loader's producer thread died without a result (a bug: "
                                            "please report it with the traceback)") from None
            self.consumer_waiting = False
        self.stats.wait_s += time.perf_counter() - t0
        if item is _DONE:
            self.close()
            self._account(final=True)
            raise StopIteration
        if isinstance(item, _Failure):
            self.close()
            raise item.exc
        out, rows, nbytes = item
        self.budget.release(nbytes)
        self.stats.rows += rows
        self.stats.batches += 1
        self.stats.peak_prefetch_bytes = self.budget.peak
        self._account()
        self._consumer_mark = time.thread_time()
        return out, rows

    def _account(self, final: bool = False) -> None:
        s, r = self.stats, self.readers
        now = time.perf_counter()
        s.wall_s = now - self.started
        s.cpu_s = time.process_time() - self._cpu0
        s.loader_cpu_s = r.cpu_s + self._producer_cpu
        s.consumer_cpu_s = self._consumer_cpu
        s.readers = min(r.target, r.most_alive)  # (a target above the threads the work needed is no thread)
        s.readers_peak = r.peak
        if final or now - self._native_at >= NATIVE_CPU_EVERY_S:
            self._native_at = now
            s.native_cpu_s = self._native_cpu()
            self._count_decoders()

    def _count_decoders(self) -> None:
        """This iteration's units per decoder (read with the native CPU, not per batch; and
        when the iteration ends or is closed)."""
        if self._decoded is not None:
            self.stats.decoders = {k: n for k, n in _since(self._decoded(), self._decoded0).items() if n > 0}
        if self.stages.device is not None:
            self.stats.device = _since(self.stages.device(), self._device0)

    def _native_cpu(self) -> float:
        """CPU time since the start of threads Python does not know (pyarrow's decode and
        I/O pools; BLAS / OpenMP pools of the training step, where it has them)."""
        known = {t.native_id for t in threading.enumerate()}
        before = self._threads0
        return sum(max(0.0, cpu - before.get(tid, 0.0)) for tid, cpu in thread_cpu().items()
                   if tid not in known)

    def delivered_all(self) -> bool:
        """Whether every batch was taken: the producer ended and left only its end marker.
        With nothing queued the producer may be putting that marker now: given a moment."""
        with self.out.mutex:
            queued = len(self.out.queue)
        if queued > 1:
            return False
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join(DONE_WAIT_S)
        if self.thread.is_alive():
            return False
        with self.out.mutex:
            return len(self.out.queue) == 1 and self.out.queue[0] is _DONE

    def close(self) -> None:
        self.stop.set()
        if self.stages.close is not None:  # wakes reads waiting on it, stops its query
            self.stages.close()
        self.readers.close(join=False)  # no queued read starts while the producer stops
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join()
        self.readers.close()
        self._count_decoders()
        while not self.out.empty():
            try:
                self.out.get_nowait()
            except queue.Empty:
                break


def _since(counts: dict, base: dict) -> dict:
    """Running ``counts`` less what they were at ``base`` (this iteration's share)."""
    return {k: v - base.get(k, 0) for k, v in counts.items()}


def take_rows(pending: deque, n: int) -> list:
    """Pop the first ``n`` rows of ``pending`` (HostChunks or Arrow batches): the parts of one
    batch, zero-copy slices; a combine step makes them one (a copy only when there are several)."""
    parts, got = [], 0
    while got < n:
        b = pending.popleft()
        take = min(b.num_rows, n - got)
        parts.append(b.slice(0, take) if take < b.num_rows else b)
        got += take
        if take < b.num_rows:
            pending.appendleft(b.slice(take))
    return parts


#: how long an iteration being ended waits for a producer that may be finishing the epoch
#: (``Pipeline.delivered_all``): only when the consumer took every batch queued
DONE_WAIT_S = 0.05


class EpochIterator:
    """What ``iter(loader)`` returns: batches of one epoch's :class:`Pipeline`. Dropping it
    (or ``close()``) stops its threads. ``on_batch(rows)`` is called as each batch is
    taken (the loader's position); ``stats`` fills while it runs."""

    def __init__(self, stages: Stages, settings: Settings,
                 on_batch: Callable[[int], None] | None = None) -> None:
        self._pipeline = Pipeline(stages, settings)
        self._finalizer = weakref.finalize(self, self._pipeline.close)
        self._deliver = stages.deliver
        self._on_batch = on_batch
        self.stats = self._pipeline.stats
        self._ended: str | None = None  # why the loader ended this iteration before its end
        # ``end`` from another thread and a batch being taken: a batch counts (``on_batch``)
        # only where the iteration was not ended before, never after the loader moved on
        self._ending = threading.Lock()

    def __iter__(self):
        return self

    def __next__(self):
        if self._ended is not None:
            raise LoaderClosedError(self._ended)
        try:
            out, rows = self._pipeline.next()
        except Exception:
            # ended by another thread while this one waited: the queue was emptied under it
            # (no end marker, or the marker of a producer stopped early), never a short epoch
            if self._ended is not None:
                raise LoaderClosedError(self._ended) from None
            raise
        if self._deliver is not None:  # may wait for the batch's staging (pipeline/device.py)
            t0 = time.perf_counter()
            try:
                out = self._deliver(out)
            except BaseException:
                self.close()  # a batch that failed to arrive ends the epoch, as a failed read does
                raise
            finally:
                self.stats.wait_s += time.perf_counter() - t0
        with self._ending:
            if self._ended is not None:
                raise LoaderClosedError(self._ended)
            if self._on_batch is not None:
                self._on_batch(rows)
        return out

    def close(self) -> None:
        self._finalizer()

    @property
    def running(self) -> bool:
        """Whether batches may still come: not at its end, failed or closed."""
        return not self._pipeline.stop.is_set()

    def end(self, why: str) -> None:
        """Stop an iteration the loader takes away from its consumer (a new ``iter()``,
        ``load_state_dict``, ``set_epoch``, ``close``): where it was still running, its next
        ``next()`` raises ``LoaderClosedError(why)`` instead of ending as though the epoch
        were over; one that has handed out every batch (only its end is left) ends as usual."""
        with self._ending:
            if self.running and not self._pipeline.delivered_all():
                self._ended = why
        self.close()


def end_iterations(active, why: str) -> None:
    """``EpochIterator.end(why)`` for each of a loader's ``active`` iterators."""
    for it in list(active):
        it.end(why)


#: why a loader ended an iteration in progress, as its consumer is told at its next batch
ENDED_BY_ITER = ("this iteration was ended by a new iter() of its loader, which runs one iteration "
                 "at a time (zip(loader, loader) or two threads over one loader would each lose "
                 "rows): use one iterator, or one loader per consumer")
ENDED_BY_LOAD = ("this iteration was ended by load_state_dict(): iterate the loader again to go on "
                 "from the loaded position")
ENDED_BY_CLOSE = "the loader was closed (close()) while this iteration ran; build a new loader"
ENDED_BY_EPOCH = ("this iteration was ended by set_epoch() to another epoch: its batches would count in "
                  "that epoch's position; iterate the loader again for the new epoch, or call set_epoch "
                  "between epochs")


__all__ = ["ENDED_BY_CLOSE", "ENDED_BY_EPOCH", "ENDED_BY_ITER", "ENDED_BY_LOAD", "EpochIterator", "Pipeline", "Readers",
           "Settings", "SharedCache", "Stages", "end_iterations", "start_readers", "take_rows"]
