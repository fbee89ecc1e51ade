"""The loader as stages: the pipeline wired from plain callables, reader threads sized to
the machine and bounded, ``LoaderOptions`` as a public value, and the CPU figures.

Truths stand outside the code under test: threads counted by name in
``threading.enumerate()`` while batches flow (in a ``transform=`` on the producer thread,
and between batches on the consumer's), rows against plain pyarrow reads of the same
files, the CPU a consumer burns measured on its own thread with ``time.thread_time``. No
timing is asserted.
"""

from __future__ import annotations

import dataclasses
import os
import random
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import arrowload as al
from arrowload.order import Task, TaskKind
from arrowload.pipeline.loader import STREAM_READERS
from arrowload.pipeline.stages import EpochIterator, Readers, Settings, Stages
from arrowload.scan.stream import STREAM_DECODER

from conftest import ROWS

KINDS = ("none", "block", "global")
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def reader_threads() -> int:
    return sum(t.name.startswith("arrowload-read") for t in threading.enumerate())


def loader_thread_names() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("arrowload")}


# ---------------------------------------------------------------------------
# the reader pool


class _Concurrency:
    """Counts tasks running at once, and the reader threads alive while they run."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0
        self.most_alive = 0

    def task(self, value, pause: float = 0.002):
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
            self.most_alive = max(self.most_alive, reader_threads())
        time.sleep(pause)
        with self.lock:
            self.now -= 1
        return value * 2


def test_readers_run_at_most_target_tasks_on_at_most_bound_threads():
    before = reader_threads()
    readers = Readers(bound=3, target=2)
    c = _Concurrency()
    try:
        futures = [readers.submit(c.task, i) for i in range(24)]
        assert [f.result() for f in futures] == [2 * i for i in range(24)]
        assert c.most <= 2 and readers.peak <= 2 and c.most_alive - before <= 2
        readers.set_target(10)  # clamped to the bound
        assert readers.target == 3
        futures = [readers.submit(c.task, i) for i in range(24)]
        assert [f.result() for f in futures] == [2 * i for i in range(24)]
        assert c.most <= 3 and readers.peak <= 3 and c.most_alive - before <= 3
        readers.set_target(1)  # surplus threads end once idle
        futures = [readers.submit(c.task, i) for i in range(6)]
        assert [f.result() for f in futures] == [2 * i for i in range(6)]
        assert readers.cpu_s >= 0.0
    finally:
        readers.close()
    assert reader_threads() == before  # close() ends every thread


@pytest.mark.parametrize("target", [1, 2, 4])
def test_readers_map_runs_each_item_once_in_order(target):
    """Sub-reads of a running task go to free slots or run inline: every item exactly once,
    results in item order, never more tasks at once than the target."""
    readers = Readers(bound=4, target=target)
    calls: list[int] = []
    lock = threading.Lock()
    c = _Concurrency()

    def sub(x):
        with lock:
            calls.append(x)
        return c.task(x, pause=random.random() * 0.002)

    try:
        futures = [readers.submit(lambda k=k: readers.map(sub, range(k * 10, k * 10 + 7))) for k in range(5)]
        for k, f in enumerate(futures):
            assert f.result() == [2 * x for x in range(k * 10, k * 10 + 7)]
        assert sorted(calls) == sorted(x for k in range(5) for x in range(k * 10, k * 10 + 7))
        assert c.most <= target  # inline items run on their task's own slot
    finally:
        readers.close()


def test_readers_map_helps_the_older_task_first():
    """A thread whose own task is further on runs the older task's queued sub-reads before
    its own (a block-shuffle window is read by every reader): every sub-read of the first
    task starts before any of the second's, whichever thread runs it."""
    readers = Readers(bound=2, target=2)
    started: list[str] = []
    lock = threading.Lock()
    first_running = threading.Event()
    second_running = threading.Event()

    def sub(name):
        with lock:
            started.append(name)
        if name == "a0":
            first_running.set()
            time.sleep(0.02)  # a0 holds its thread while the other queues its own sub-reads
        return name

    def first():  # both tasks run before either maps
        second_running.wait(5)
        return readers.map(sub, [f"a{i}" for i in range(4)])

    def second():
        second_running.set()
        first_running.wait(5)
        return readers.map(sub, [f"b{i}" for i in range(4)])

    try:
        fa = readers.submit(first)
        fb = readers.submit(second)
        assert fa.result() == [f"a{i}" for i in range(4)] and fb.result() == [f"b{i}" for i in range(4)]
        assert sorted(started) == sorted([f"a{i}" for i in range(4)] + [f"b{i}" for i in range(4)])
        assert [n[0] for n in started] == ["a"] * 4 + ["b"] * 4, started
    finally:
        readers.close()


def test_readers_hand_errors_to_the_waiter_and_cancel_on_close():
    readers = Readers(bound=2, target=1)
    gate = threading.Event()

    def boom():
        raise KeyError("no such unit")

    fut = readers.submit(boom)
    with pytest.raises(KeyError, match="no such unit"):
        fut.result()
    blocker = readers.submit(gate.wait, 5)
    queued = readers.submit(lambda: "never")
    time.sleep(0.01)
    closer = threading.Thread(target=readers.close)
    closer.start()
    time.sleep(0.01)
    gate.set()
    closer.join()
    assert blocker.result() is True and queued.cancelled()
    assert readers.submit(lambda: 1).cancelled()  # a closed pool runs nothing


# ---------------------------------------------------------------------------
# the pipeline from plain callables (no Loader, no row source)


def test_pipeline_from_callables_keeps_task_order_whatever_the_read_timing():
    """Reads finish in random order on several threads; batches come out cut exactly in
    task order, with the last one short."""
    rows = [np.arange(s, s + n) for s, n in zip(range(0, 1000, 37), [37] * 27)]
    tasks = [Task(TaskKind.UNIT, len(r), 8 * len(r), unit=i, lo=0, hi=len(r)) for i, r in enumerate(rows)]

    def read(task, cache=None, map_units=None):
        time.sleep(random.random() * 0.003)
        return [pa.record_batch({"x": rows[task.unit]})], 0.0

    stages = Stages(tasks=tasks, read=read,
                    combine=lambda parts: parts[0] if len(parts) == 1 else pa.concat_batches(parts),
                    finish=lambda b: b.column("x").to_numpy(), deliver=lambda x: x.tolist())
    seen = []
    it = EpochIterator(stages, Settings(batch_size=50, prefetch=1 << 20, max_readers=3),
                       on_batch=seen.append)
    got = list(it)
    assert [len(b) for b in got] == [50] * 19 + [49]
    assert [x for b in got for x in b] == list(range(999))
    assert seen == [len(b) for b in got]
    s = it.stats
    assert s.rows == 999 and s.batches == 20 and s.units_read == 27
    assert s.readers_max == 3 and 1 <= s.readers <= 3 and s.readers_peak <= 3


def test_pipeline_reraises_a_read_error_where_the_consumer_iterates():
    def read(task, cache=None, map_units=None):
        if task.unit == 3:
            raise al.CorruptFileError("unit 3 is damaged", "x.parquet")
        return [pa.record_batch({"x": np.arange(10)})], 0.0

    tasks = [Task(TaskKind.UNIT, 10, 80, unit=i, lo=0, hi=10) for i in range(6)]
    before = reader_threads()
    it = EpochIterator(Stages(tasks, read, lambda p: pa.concat_batches(p), lambda b: b),
                       Settings(batch_size=10, prefetch=1 << 20, max_readers=2))
    got = 0
    with pytest.raises(al.CorruptFileError, match="unit 3"):
        for _ in it:
            got += 1
    assert got == 3
    assert reader_threads() == before  # the failure closed the pipeline: its readers ended


def test_pipeline_a_delivery_error_ends_the_epoch():
    """``deliver`` fails on the consumer's thread (the device stage's copy of a batch did):
    the error reaches the consumer and the pipeline's threads end with it, as for a read."""
    def deliver(b):
        if b.column("x")[0].as_py() == 30:
            raise RuntimeError("the copy of batch 3 failed")
        return b

    tasks = [Task(TaskKind.UNIT, 10, 80, unit=i, lo=0, hi=10) for i in range(40)]
    read = lambda task, cache=None, map_units=None: ([pa.record_batch({"x": np.arange(10) + 10 * task.unit})], 0.0)  # noqa: E731
    before = loader_thread_names()
    it = EpochIterator(Stages(tasks, read, lambda p: pa.concat_batches(p), lambda b: b, deliver=deliver),
                       Settings(batch_size=10, prefetch=1 << 20, max_readers=2))
    got = 0
    with pytest.raises(RuntimeError, match="batch 3"):
        for _ in it:
            got += 1
    assert got == 3
    assert loader_thread_names() <= before  # the producer and the readers ended
    assert list(it) == []  # and the epoch is over


# ---------------------------------------------------------------------------
# reader threads of a loader: sized to the machine, bounded, invisible in the batches


@pytest.mark.parametrize("io_threads", [None, 1, 3])
@pytest.mark.parametrize("kind", KINDS)
def test_reader_threads_never_exceed_the_bound(parquet_lake, tmp_path, kind, io_threads):
    """Counted while batches are made (a transform, on the producer thread) and between
    batches (on the consumer's): never more ``arrowload-read`` threads than ``io_threads``,
    or than the cores this process may run on by default (a streamed epoch: one); no other
    kind of loader thread (block windows read on the same readers). Rows exact against pyarrow."""
    bound = io_threads or CORES
    before = reader_threads()
    truth = np.sort(pq.read_table(parquet_lake, columns=["id"]).column("id").to_numpy())
    seen: list[int] = []
    names: set[str] = set()

    def count(batch):
        seen.append(reader_threads() - before)
        names.update(loader_thread_names())
        return batch

    ds = al.dataset(parquet_lake).select("id", "f0")
    for transform in (count, None):
        loader = ds.loader(500, shuffle=kind, seed=2, shuffle_window=3, io_threads=io_threads,
                           transform=transform, cache_dir=str(tmp_path))
        ids = []
        for b in loader:
            seen.append(reader_threads() - before)
            names.update(loader_thread_names())
            ids.append(np.asarray(b["id"]).copy())
        np.testing.assert_array_equal(np.sort(np.concatenate(ids)), truth)
        s = loader.stats()
        if io_threads is None and STREAM_DECODER in s.decoders:
            bound = STREAM_READERS  # the stream's tasks take their rows one at a time
        assert s.readers_max == bound and 1 <= s.readers <= bound and 1 <= s.readers_peak <= bound
        loader.close()
    assert 0 < max(seen) <= bound, seen
    assert all(n == "arrowload-loader" or n.startswith("arrowload-read-") for n in names), names
    assert reader_threads() == before  # every reader stopped with its loader


@pytest.mark.parametrize("kind", [False, "block", "global"])
def test_the_exit_hook_stops_iterations_left_open(parquet_lake, tmp_path, kind):
    """An iteration left open when the interpreter exits (a DataLoader worker told to stop
    mid-epoch) is stopped by the hook arrowload registers with atexit: its producer and
    reader threads joined before native thread pools are torn down (a spawned worker once
    ended with std::terminate, SIGABRT, in the suite). Here the hook is called directly;
    a fresh interpreter that exits mid-epoch must end with status 0."""
    import subprocess
    import sys

    from arrowload.pipeline import stages
    before = {t for t in threading.enumerate() if t.name.startswith("arrowload")}
    ds = al.dataset(parquet_lake).select("id", "f0")
    loader = ds.loader(64, shuffle=kind, seed=0, prefetch=1 << 20, cache_dir=str(tmp_path))
    it = iter(loader)
    next(it)
    mine = {t for t in threading.enumerate() if t.name.startswith("arrowload")} - before
    assert mine
    stages._close_at_exit()
    assert not [t.name for t in mine if t.is_alive()]
    code = (f"import arrowload as al\nit = iter(al.dataset({parquet_lake!r}).select('id', 'f0')"
            f".loader(64, shuffle={kind!r}, seed=0, cache_dir={str(tmp_path)!r}))\nnext(it)\n"
            "import sys\nsys.exit(0)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-500:]


def test_autotuning_never_changes_a_batch(parquet_lake, tmp_path):
    """A consumer that stalls now and then (the tuner drops readers) and then races (it adds
    them back) gets exactly the batches of one fixed reader."""
    ds = al.dataset(parquet_lake).filter("label = 1").select("id", "f0")
    for kind in KINDS:
        fixed = [b["id"].copy() for b in ds.loader(300, shuffle=kind, seed=9, shuffle_window=2, io_threads=1,
                                                    cache_dir=str(tmp_path))]
        tuned = []
        for i, b in enumerate(ds.loader(300, shuffle=kind, seed=9, shuffle_window=2, io_threads=4, prefetch=1 << 18,
                                        cache_dir=str(tmp_path))):
            if i % 7 < 3:
                time.sleep(0.003)
            tuned.append(b["id"].copy())
        assert len(tuned) == len(fixed) and all(np.array_equal(a, b) for a, b in zip(tuned, fixed)), kind


def test_io_threads_none_is_the_default_and_the_bound_is_the_cores(parquet_lake, tmp_path):
    ds = al.dataset(parquet_lake).select("id", "f0")
    loader = ds.loader(1000, cache_dir=str(tmp_path))
    assert loader.options.io_threads is None and loader.max_readers == CORES
    assert f"at most {CORES}" in loader.explain()
    assert ds.loader(1000, io_threads=7, cache_dir=str(tmp_path)).max_readers == 7


# ---------------------------------------------------------------------------
# LoaderOptions


def test_loader_options_is_public_and_accepted_by_loader(parquet_lake, tmp_path):
    assert "LoaderOptions" in al.__all__
    ds = al.dataset(parquet_lake).select("id")
    base = al.LoaderOptions(batch_size=700, shuffle="block", seed=3, cache_dir=str(tmp_path))
    a = ds.loader(options=base)
    b = ds.loader(700, shuffle="block", seed=3, cache_dir=str(tmp_path))
    assert a.options == b.options and a.options is base
    assert [x["id"].tolist() for x in a] == [x["id"].tolist() for x in b]


def test_loader_keywords_replace_options_fields(parquet_lake, tmp_path):
    ds = al.dataset(parquet_lake).select("id")
    base = al.LoaderOptions(batch_size=64, shuffle="global", seed=3, drop_last=True, cache_dir=str(tmp_path))
    ld = ds.loader(options=base, seed=4)
    assert ld.options == dataclasses.replace(base, seed=4)
    assert ds.loader(128, options=base).options.batch_size == 128  # positional batch_size too
    # a keyword given with its default value still replaces the field (it was given)
    plain = ds.loader(options=base, shuffle=False, drop_last=False)
    assert plain.shuffle_kind == "none" and not plain.options.drop_last
    assert plain.options.seed == 3  # fields not given are kept


def test_loader_options_errors(parquet_lake):
    ds = al.dataset(parquet_lake)
    with pytest.raises(al.ArgumentTypeError, match="batch_size") as err:
        ds.loader()
    assert isinstance(err.value, TypeError) and err.value.argument == "batch_size"
    with pytest.raises(al.ArgumentTypeError, match="al.LoaderOptions") as err:
        ds.loader(options={"batch_size": 8})
    assert err.value.argument == "options"
    with pytest.raises(al.InvalidArgumentError, match="io_threads"):
        al.LoaderOptions(batch_size=8, io_threads=0)
    with pytest.raises(al.InvalidArgumentError, match="shuffle"):
        ds.loader(options=al.LoaderOptions(batch_size=8), shuffle="sideways")


def test_loader_options_are_frozen_and_normalized_stably():
    opts = al.LoaderOptions(batch_size=np.int64(8), shuffle=True)
    assert type(opts.batch_size) is int and opts.shuffle == "auto"
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.seed = 1  # type: ignore[misc]
    again = dataclasses.replace(opts, seed=1)  # checked again: "auto" stays "auto"
    assert again.shuffle == "auto" and again.seed == 1
    assert dataclasses.replace(al.LoaderOptions(8, shuffle="block"), seed=2).shuffle == "block"


def test_auto_shuffle_from_options_picks_the_kind(parquet_lake, tmp_path):
    ld = al.dataset(parquet_lake).select("id").loader(options=al.LoaderOptions(100, shuffle=True,
                                                                               cache_dir=str(tmp_path)))
    assert ld.shuffle_kind == "global"  # local files allow random access


# ---------------------------------------------------------------------------
# what the loader costs in CPU, and the settings it chose


def test_stats_show_settings_and_cpu(parquet_lake, tmp_path):
    """A consumer that burns CPU on its own thread (measured there, the truth) is seen as the
    consumer's CPU; the loader's own threads' CPU is part of the process's."""
    loader = al.dataset(parquet_lake).select("id", "f0", "f1").loader(1000, io_threads=2, prefetch=1 << 22,
                                                                       cache_dir=str(tmp_path))
    burned = 0.0
    for _ in loader:
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.004:
            pass
        burned += time.thread_time() - t0
    s = loader.stats()
    assert s.batches == ROWS // 1000 and burned >= 0.004 * s.batches
    assert s.consumer_cpu_s >= 0.9 * burned  # the consumer's own work, seen as such
    assert 0 < s.loader_cpu_s <= s.cpu_s + 0.01
    assert s.consumer_cpu_s <= s.cpu_s + 0.01 and s.native_cpu_s >= 0.0
    assert s.readers_max == 2 and s.prefetch == 1 << 22 and s.cores == CORES
    assert 0.0 <= s.loader_share <= 1.0
    text = str(s)
    assert "reader thread" in text and "at most 2" in text and "CPU" in text and "consumer" in text
    assert set(s.as_dict()) >= {"readers", "readers_peak", "readers_max", "prefetch", "cpu_s", "loader_cpu_s",
                                "native_cpu_s", "consumer_cpu_s", "wait_s", "read_s"}
    explained = loader.explain()
    assert "reader threads autotuned, at most io_threads=2" in explained
    assert "last run" in explained and "CPU" in explained
    assert "reader thread" in repr(loader)
    prof = loader.profile(5)
    assert "settings" in str(prof) and "cpu" in str(prof) and prof.io_threads == 2
