"""``loader.profile()``: shares that add up, a verdict on constructed bottlenecks, a plot
whose axes say what they show, and an untouched loader.

No timing is asserted: only relations every run satisfies (one thread cannot be busy
longer than the wall time, N reader threads not longer than N times it, each thread
group's shares add up to 100%) and counts against the loader's own contract. The verdict
tests build bottlenecks far beyond any timer noise (a transform or step sleeping 10-20 ms
per batch against reads of microseconds; a filesystem that sleeps on every read; a step
spinning on the CPU beside a thread that keeps a core busy).
"""

from __future__ import annotations

import io
import json
import time

import numpy as np
import pytest

import arrowload as al
from _support import CountingFile, CountingLocalFileSystem
from arrowload.pipeline.layout import of_batch
from arrowload.pipeline.profile import STAGES, Profile, Verdict

EPS = 1e-6


def _loader(lake, tmp_path, **kw):
    sel = al.dataset(lake, filesystem=kw.pop("filesystem", None)).filter("label = 1").select("id", "f0", "f1")
    kw.setdefault("cache_dir", str(tmp_path))
    return sel.loader(kw.pop("batch_size", 100), **kw)


def _check_bounded(p: Profile) -> None:
    st = p.stages()
    assert tuple(st) == STAGES and all(v >= 0 for v in st.values())
    producer = st["collate"] + st["transform"] + st["convert"]
    assert producer <= p.wall_s + EPS                                   # one producer thread
    assert abs(producer + st["producer idle"] - p.wall_s) <= EPS
    consumer = st["start-up"] + st["consumer wait"] + st["consumer step"] + st["consumer other"]
    assert abs(consumer - p.wall_s) <= EPS                               # one consumer thread
    assert st["read"] + st["reader convert"] <= p.readers_max * p.wall_s + EPS
    assert 0 <= p.readers_busy <= p.readers_max
    for group, parts in p.shares().items():
        assert all(0.0 <= v <= 1.0 for v in parts.values()), (group, parts)
        assert abs(sum(parts.values()) - 1.0) <= 1e-9, (group, parts)
    text = str(p)
    for pct in (int(w.rstrip("%")) for w in text.split() if w.endswith("%") and w[:-1].isdigit()):
        assert 0 <= pct <= 100, text                                    # no "176% of wall"


@pytest.mark.parametrize("shuffle", [False, "block", "global"])
def test_shares_are_bounded_and_add_up(parquet_lake, tmp_path, shuffle):
    with _loader(parquet_lake, tmp_path, shuffle=shuffle, io_threads=3) as loader:
        prof = loader.profile(7)
        full = loader.profile()
        n_rows, n_batches = loader.num_rows, len(loader)
    assert isinstance(prof, Profile)
    assert prof.batches == 7 and prof.rows == 700 == int(prof.batch_rows.sum())
    assert len(prof.arrivals) == len(prof.waits) == 7 and np.all(np.diff(prof.arrivals) >= 0)
    assert 0 < prof.first_batch_s == prof.arrivals[0] <= prof.wall_s
    assert full.batches == n_batches and full.rows == n_rows
    assert full.rows_per_rank == n_rows and full.batches_per_rank == n_batches
    for p in (prof, full):
        _check_bounded(p)
        assert p.rows_per_s > 0 and isinstance(p.verdict(), Verdict) and p.bottleneck()
        assert p.stats.rows >= p.rows and not p.step_timed
        json.dumps(p.as_dict())                                # plain data
    assert any("short run" in w for w in prof.warnings()) and prof.verdict().tentative


def test_gathers_on_the_readers_are_not_producer_time(parquet_lake, tmp_path):
    """Global shuffle gathers into host buffers on the reader threads: counted there
    (``reader_convert_s``), so the producer thread is never "busy" more than the wall."""
    with _loader(parquet_lake, tmp_path, shuffle="global", io_threads=2) as loader:
        prof = loader.profile()
    assert prof.stats.reader_convert_s > 0
    assert prof.stats.collate_s + prof.stats.transform_s + prof.stats.convert_s <= prof.wall_s + EPS
    _check_bounded(prof)


def test_profile_leaves_the_loader_where_it_was(parquet_lake, tmp_path):
    with _loader(parquet_lake, tmp_path, shuffle="block", seed=5) as loader, \
            _loader(parquet_lake, tmp_path, shuffle="block", seed=5) as twin:
        everything = [b["id"].tolist() for b in twin]
        state0, stats0 = loader.state_dict(), loader.stats()
        loader.profile(4)
        loader.profile(3, step_fn=lambda b: None)
        assert loader.state_dict() == state0 and loader.stats() == stats0
        assert [b["id"].tolist() for b in loader] == everything

        it = iter(twin)
        first = [next(it)["id"].tolist() for _ in range(3)]
        state = twin.state_dict()
        loader.load_state_dict(state)
        loader.profile()                        # a pending resume survives profiling
        assert loader.state_dict() == state
        assert first + [b["id"].tolist() for b in loader] == everything


def test_step_fn_sees_every_batch_and_profiling_records_the_real_loop(parquet_lake, tmp_path):
    with _loader(parquet_lake, tmp_path, shuffle="block", seed=1) as loader, \
            _loader(parquet_lake, tmp_path, shuffle="block", seed=1) as twin:
        truth = [b["id"].tolist() for b in twin]
        seen = []
        prof = loader.profile(step_fn=lambda b: seen.append(b["id"].tolist()))
        assert seen == truth and prof.step_timed and len(prof.steps) == prof.batches == len(truth)
        got = []
        with loader.profiling() as run:
            for batch in loader:
                got.append(batch["id"].tolist())
            for _ in loader:                    # a second iteration in the block runs plain
                pass
        assert got == truth
        p = run.profile
        assert p.step_timed and p.batches == len(truth) and p.rows == loader.num_rows
        _check_bounded(p)
        assert [k.text() for k in p.layout] == [k.text() for k in of_batch(twin_first(twin))]
        assert iter(loader).__class__.__name__ == "EpochIterator"   # outside the block: plain


def twin_first(loader):
    it = iter(loader)
    try:
        return next(it)
    finally:
        it.close()


# -- verdicts on constructed bottlenecks ---------------------------------------------------


def test_verdict_slow_transform(parquet_lake, tmp_path):
    def slow(batch):
        time.sleep(0.015)
        return batch

    with _loader(parquet_lake, tmp_path, transform=slow) as loader:
        prof = loader.profile(30)
    _check_bounded(prof)
    v = prof.verdict()
    assert v.kind == "transform", str(prof)
    assert "transform=" in v.advice and "Dataset.map" in v.advice
    assert prof.shares()["producer"]["transform"] >= 0.5


def test_verdict_slow_consumer(parquet_lake, tmp_path):
    with _loader(parquet_lake, tmp_path) as loader:
        prof = loader.profile(40, step_fn=lambda batch: time.sleep(0.015))
    _check_bounded(prof)
    v = prof.verdict()
    assert v.kind == "consumer", str(prof)
    assert "not the bottleneck" in v.advice
    assert prof.shares()["consumer"]["step"] >= 0.5
    assert prof.step_cpu_s < 0.5 * prof.step_s          # a sleeping step is not a CPU-bound one


class _SlowFile(CountingFile):
    def read(self, size=-1):
        time.sleep(0.02)
        return super().read(size)

    def readinto(self, buf):
        time.sleep(0.02)
        return super().readinto(buf)


class ThrottledFileSystem(CountingLocalFileSystem):
    """The local filesystem, sleeping 20 ms in every read call (a slow object store)."""

    def _open(self, path, mode="rb", *args, **kwargs):
        f = super()._open(path, mode, *args, **kwargs)
        if isinstance(f, CountingFile):
            f.__class__ = _SlowFile
        return f


def test_verdict_slow_reader(parquet_lake, tmp_path):
    fs = ThrottledFileSystem()
    with _loader(parquet_lake, tmp_path, filesystem=fs, io_threads=2, batch_size=50) as loader:
        fs.reset()
        prof = loader.profile()
    assert len(fs.stats.reads) > 0
    _check_bounded(prof)
    v = prof.verdict()
    assert v.kind == "reading-io", str(prof)
    assert "io_threads=4" in v.advice and "of 2 readers busy" in v.finding


_CONTENDED = r"""
import hashlib, json, os, sys, threading, time
if hasattr(os, "sched_setaffinity"):  # one core for every thread of this process, polars' pools included
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
import arrowload as al
lake, cache = sys.argv[1:3]
stop = threading.Event()

def busy():
    data = b"x" * (32 << 20)
    while not stop.is_set():
        hashlib.sha256(data).digest()

def step(batch):
    t0 = time.thread_time()
    while time.thread_time() - t0 < 0.004:
        pass

thread = threading.Thread(target=busy, daemon=True)
thread.start()
try:
    with al.dataset(lake).loader(1000, io_threads=2, cache_dir=cache) as loader:
        prof = loader.profile(step_fn=step)
finally:
    stop.set()
    thread.join()
out = prof.as_dict()
out["text"] = str(prof)
out["cores"] = prof.stats.cores
print(json.dumps(out, default=str))
"""


def test_verdict_cpu_contention(tmp_path):
    """A thread of the consumer keeps a core busy (hashing 32 MiB at a time releases the
    GIL) while the step spins on the CPU, and the loader decodes every column of a lake of
    100,000 rows beside them. The contended run is a process of its own, held to one core
    (``sched_setaffinity`` before any thread starts), so the contention is certain on any
    machine rather than only on one of few, idle cores: the verdict is contention, with
    numbers. The control, in this process on every core: the same step beside a loader of
    one column and no busy thread is the consumer."""
    import subprocess
    import sys

    from arrowload.datagen import write_lake
    lake = tmp_path / "lake"
    write_lake(lake, rows=100_000, shards=2, row_group_size=10_000, nulls=False)

    def step(batch):
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.004:
            pass

    with al.dataset(str(lake)).select("label").loader(1000, io_threads=2, cache_dir=str(tmp_path)) as loader:
        light = loader.profile(step_fn=step)
    assert light.verdict().kind == "consumer", str(light)

    run = subprocess.run([sys.executable, "-c", _CONTENDED, str(lake), str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    prof = json.loads(run.stdout.strip().splitlines()[-1])
    text, v = prof["text"], prof["verdict"]
    assert prof["batches"] == 100 and prof["rows"] == 100_000, text
    assert v["kind"] == "contention", text
    assert "io_threads=1" in v["advice"] and "cores" in v["finding"] and "loader threads" in v["finding"]
    assert prof["step_cpu_s"] >= 0.004 * prof["batches"] * 0.9, text  # the step computed (its own clock)
    assert "of a core" in text
    st = prof["stages"]
    assert all(x >= 0 for x in st.values()) and prof["step_s"] <= prof["wall_s"] + EPS, text


# -- the plot ------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [3, None])
def test_plot_axes_title_and_bins(parquet_lake, tmp_path, n):
    pytest.importorskip("matplotlib")
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.patches import StepPatch

    with _loader(parquet_lake, tmp_path, batch_size=20) as loader:
        prof = loader.profile(n)
    fig = prof.plot()
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    assert fig._suptitle.get_text().replace("\n", " ") == str(prof.verdict())
    shares_ax, rate_ax = fig.axes
    assert {t.get_text() for t in shares_ax.get_yticklabels()} == {"consumer", "producer",
                                                                   f"{prof.readers_max} readers"}
    fig.canvas.draw()
    ticks = [t.get_text() for t in rate_ax.get_yticklabels() if t.get_text()]
    assert ticks and not any("e" in t for t in ticks)                  # no "1e7"
    assert any(t.endswith(("k", "M")) for t in ticks) and rate_ax.get_ylabel() == "rows/s"
    assert rate_ax.yaxis.get_offset_text().get_text() == ""
    steps = [p for p in rate_ax.patches if isinstance(p, StepPatch)]
    assert steps
    values, edges, _ = steps[0].get_data()
    assert edges[0] == 0 and np.isclose(edges[-1], prof.wall_s)         # from 0 to the end
    assert np.allclose(np.diff(edges), edges[1] - edges[0])             # equal widths, the last too
    assert len(values) == len(edges) - 1
    assert np.isclose(np.sum(values * np.diff(edges)), prof.rows)        # every row, the last bin's too
    lo, hi = rate_ax.get_xlim()
    assert lo == 0 and prof.wall_s <= hi <= 1.05 * prof.wall_s
    first = [ln for ln in rate_ax.get_lines() if "first batch" in ln.get_label()]
    assert first and np.allclose(first[0].get_xdata(), prof.first_batch_s)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    assert buf.getvalue()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_arguments(parquet_lake, tmp_path):
    with _loader(parquet_lake, tmp_path) as loader:
        with pytest.raises(ValueError):
            loader.profile(0)
        with pytest.raises(TypeError):
            loader.profile(2, step_fn=3)
        text = str(loader.profile(2))
    for word in ("bottleneck", "readers", "producer", "consumer", "layout", "epoch"):
        assert word in text
