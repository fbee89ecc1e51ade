"""The Load stage (``pipeline/device.py``).

Everywhere: the CUDA path is never entered for ``device=None`` / ``"cpu"``, asking for an
unavailable CUDA device is a clear ``DeviceUnavailableError``, and jax placement works on
the CPU device. Where CUDA is present (skipped without it, the one permitted skip): batches
land on the device with the CPU loader's exact dtypes, shapes and values, pinned staging
buffers are reused, held batches are never overwritten, ``devices=[...]`` splits rows, and
jax ``sharding=`` places them on GPUs.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import arrowload as al

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
no_cuda_here = pytest.mark.skipif(CUDA, reason="asserts what happens without CUDA")


@pytest.fixture()
def ds():
    return al.dataset(pa.table({"f0": np.arange(1000, dtype=np.float32),
                                "f1": np.arange(1000, dtype=np.float32) * 2,
                                "label": np.arange(1000, dtype=np.int64) % 2}))


def typed_dataset(n: int = 2000):
    """Every dtype the device stage stages: two float32 columns of one shape (they must not
    share a staging buffer), float64, int32, uint8, bool, int64, a timestamp (int64 counts
    in torch), a fixed-size list (2-D) and strings (stay Python lists)."""
    rng = np.random.default_rng(7)
    emb = rng.standard_normal((n, 8), dtype=np.float32)
    return al.dataset(pa.table({
        "id": np.arange(n, dtype=np.int64),
        "f32": rng.standard_normal(n, dtype=np.float32),
        "f32b": rng.standard_normal(n, dtype=np.float32),
        "f64": rng.standard_normal(n),
        "i32": rng.integers(-1000, 1000, n, dtype=np.int32),
        "u8": rng.integers(0, 255, n, dtype=np.uint8),
        "flag": rng.random(n) < 0.5,
        "ts": pa.array(np.arange(n, dtype=np.int64) * 1_000_003, pa.timestamp("us")),
        "emb": pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), 8),
        "name": [f"row{i}" for i in range(n)],
    }))


def assert_same_batch(gpu: dict, cpu: dict, device_type: str = "cuda") -> None:
    assert list(gpu) == list(cpu)
    for name, want in cpu.items():
        got = gpu[name]
        if isinstance(want, torch.Tensor):
            assert got.device.type == device_type, name
            assert got.dtype == want.dtype and got.shape == want.shape, name
            assert torch.equal(got.cpu(), want), name
        else:
            assert got == want, name


# ---------------------------------------------------------------------------
# without CUDA (and anywhere: the CPU path)


@pytest.fixture()
def no_cuda(monkeypatch):
    """Make every torch.cuda entry point explode: the loader must not call them."""
    def boom(*a, **k):
        raise AssertionError("torch.cuda was touched")
    for name in ("is_available", "current_device", "current_stream", "Stream", "Event",
                 "synchronize", "device_count", "stream"):
        monkeypatch.setattr(torch.cuda, name, boom)


@pytest.mark.parametrize("device", [None, "cpu"])
def test_cpu_paths_never_touch_cuda(ds, tmp_path, no_cuda, device):
    loader = ds.loader(256, output="torch", device=device, stack={"x": ["f0", "f1"]}, cache_dir=str(tmp_path))
    xs = [b["x"] for b in loader]
    assert all(x.device.type == "cpu" for x in xs)
    got = torch.cat(xs).numpy()
    np.testing.assert_array_equal(got, np.stack([np.arange(1000), np.arange(1000) * 2], 1))


@pytest.mark.parametrize("output", ["numpy", "arrow", "jax"])
def test_other_outputs_never_touch_cuda(ds, tmp_path, no_cuda, output):
    """``device="cuda"`` means the torch device stage only with ``output="torch"``."""
    loader = ds.loader(500, output=output, cache_dir=str(tmp_path))
    assert loader._device_stage is None
    assert sum(len(b["label"]) if output != "arrow" else b.num_rows for b in loader) == 1000


@no_cuda_here
@pytest.mark.parametrize("kwargs", [{"device": "cuda"}, {"device": "cuda:1"}, {"devices": ["cuda:0", "cuda:1"]}])
def test_cuda_without_cuda_is_a_clear_error(ds, tmp_path, kwargs):
    with pytest.raises(al.DeviceUnavailableError, match="CUDA") as info:
        ds.loader(256, output="torch", cache_dir=str(tmp_path), **kwargs)
    assert isinstance(info.value, RuntimeError)
    assert "device=None" in str(info.value)  # says what to do


@pytest.mark.parametrize("kwargs", [{"device": "cuda"}, {"devices": ["cuda:0", "cuda:0"]}])
def test_cuda_reported_unavailable_is_a_clear_error(ds, tmp_path, monkeypatch, kwargs):
    """The same on any machine: a process where torch reports no CUDA (CUDA_VISIBLE_DEVICES
    empty, a driver missing) never creates streams and says what to do."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "Stream", lambda *a, **k: pytest.fail("a stream was created"))
    with pytest.raises(al.DeviceUnavailableError, match="torch.cuda.is_available"):
        ds.loader(256, output="torch", cache_dir=str(tmp_path), **kwargs)


def test_cuda_index_past_the_visible_devices_is_a_clear_error(ds, tmp_path, monkeypatch):
    """Asking for cuda:3 where the process sees one device: DeviceUnavailableError naming the
    device and the visible range, before any stream is made (before: torch's own error)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "Stream", lambda *a, **k: pytest.fail("a stream was created"))
    with pytest.raises(al.DeviceUnavailableError, match=r"'cuda:3'.*1 CUDA device.*cuda:0 \.\. cuda:0"):
        ds.loader(256, output="torch", devices=["cuda:0", "cuda:3"], cache_dir=str(tmp_path))


def test_devices_and_sharding_need_their_outputs(ds, tmp_path):
    with pytest.raises(ValueError, match="devices="):
        ds.loader(256, output="numpy", devices=["cpu"], cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match="sharding="):
        ds.loader(256, output="torch", sharding=object(), cache_dir=str(tmp_path))


def test_jax_sharding_places_batches(ds, tmp_path):
    import jax
    from jax.sharding import SingleDeviceSharding
    sharding = SingleDeviceSharding(jax.devices("cpu")[0])
    loader = ds.loader(250, output="jax", sharding=sharding, stack={"x": ["f0", "f1"]}, cache_dir=str(tmp_path))
    batches = list(loader)
    assert len(batches) == 4
    for b in batches:
        assert b["x"].sharding == sharding and b["x"].shape == (250, 2)
    np.testing.assert_array_equal(np.concatenate([np.asarray(b["label"]) for b in batches]),
                                  np.arange(1000) % 2)


def test_jax_sharding_that_cannot_split_an_elastic_resumes_last_batch_is_refused_at_load(tmp_path):
    """A 2-rank loader of batch 50 over 2,300 rows splits every batch on 2 devices; a state
    taken at 3 ranks after one batch lays the rest out anew, with a last batch of 25 rows:
    jax raised its IndivisibleError there, mid-epoch. The load is refused
    (InvalidArgumentError naming sharding=), and the loader goes on as it was."""
    import subprocess
    import sys
    import textwrap
    script = textwrap.dedent(f"""
        import os
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
        os.environ["JAX_PLATFORMS"] = "cpu"
        import jax, numpy as np, pyarrow as pa, pyarrow.parquet as pq
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        import arrowload as al
        pq.write_table(pa.table({{"id": np.arange(2300)}}), {str(tmp_path / "a.parquet")!r}, row_group_size=97)
        ds = al.dataset({str(tmp_path / "a.parquet")!r})
        cache = {str(tmp_path / "c")!r}
        sh = NamedSharding(Mesh(np.array(jax.devices()), ("batch",)), P("batch"))
        old = ds.loader(50, rank=0, world_size=3, cache_dir=cache)
        it = iter(old); next(it); state = old.state_dict(); old.close()
        loader = ds.loader(50, rank=0, world_size=2, output="jax", sharding=sh, cache_dir=cache)
        try:
            loader.load_state_dict(state)
        except al.InvalidArgumentError as exc:
            print("refused", "sharding" in str(exc))
        print(sum(len(b["id"]) for b in loader))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["refused", "True", "1150"], out.stdout


def test_jax_sharding_that_cannot_split_a_batch_is_refused_when_built(tmp_path):
    """A mesh of 2 devices and a batch of 255 rows, or 2,999 rows whose last batch has 183:
    jax raised its own IndivisibleError at that batch, the last one after an epoch of
    training. The loader now refuses them when built (InvalidArgumentError naming
    sharding=), and a batch size that divides, with drop_last for the short batch, runs."""
    import subprocess
    import sys
    import textwrap
    script = textwrap.dedent(f"""
        import os
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
        os.environ["JAX_PLATFORMS"] = "cpu"
        import jax, numpy as np, pyarrow as pa, pyarrow.parquet as pq
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        import arrowload as al
        pq.write_table(pa.table({{"id": np.arange(2999, dtype=np.int32), "e": pa.array([[1.0, 2.0]] * 2999,
                       pa.list_(pa.float32(), 2))}}), {str(tmp_path / "a.parquet")!r})
        ds = al.dataset({str(tmp_path / "a.parquet")!r})
        sh = NamedSharding(Mesh(np.array(jax.devices()), ("batch",)), P("batch"))
        for kw in (dict(batch_size=255), dict(batch_size=256), dict(batch_size=256, drop_last=True)):
            try:
                loader = ds.loader(output="jax", sharding=sh, cache_dir={str(tmp_path / "c")!r}, **kw)
            except al.InvalidArgumentError as exc:
                print("refused", kw["batch_size"], "last batch" in str(exc))
                continue
            ids = np.concatenate([np.asarray(b["id"]) for b in loader])
            print("ran", len(ids), len(set(ids.tolist())), loader.options.drop_last)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:3] == ["refused 255 False", "refused 256 True", "ran 2816 2816 True"], out.stdout


# ---------------------------------------------------------------------------
# with CUDA


@needs_cuda
@pytest.mark.parametrize("shuffle", [False, "global"])
@pytest.mark.parametrize("stack", [None, {"x": ["f32", "f32b", "f64"]}])
def test_cuda_batches_equal_the_cpu_loader(tmp_path, shuffle, stack):
    """Every batch, held until the end of the epoch (so a reused buffer would show), equals
    the CPU loader's batch exactly: device, dtype, shape and values."""
    ds = typed_dataset()
    kw = dict(shuffle=shuffle, seed=4, stack=stack, cache_dir=str(tmp_path))
    cpu = list(ds.loader(96, output="torch", **kw))
    gpu = list(ds.loader(96, output="torch", device="cuda", **kw))
    assert len(gpu) == len(cpu) == -(-2000 // 96)
    for g, c in zip(gpu, cpu):
        assert_same_batch(g, c)
        assert all(t.device == torch.device("cuda", torch.cuda.current_device())
                   for t in g.values() if isinstance(t, torch.Tensor))


@needs_cuda
def test_cuda_held_batch_is_not_overwritten_by_later_ones(tmp_path):
    """A batch the consumer keeps stays intact while later batches reuse the staging buffers
    and the device allocator, with work queued on the consumer's stream in between."""
    ds = typed_dataset()
    cpu = list(ds.loader(64, output="torch", shuffle="global", seed=1, cache_dir=str(tmp_path)))
    it = iter(ds.loader(64, output="torch", device="cuda", shuffle="global", seed=1, cache_dir=str(tmp_path)))
    first = next(it)
    kept = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in first.items()}
    for i, b in enumerate(it, start=1):
        assert_same_batch(b, cpu[i])
        _ = (b["f32"] * 2 + b["f64"]).sum()  # the consumer's own work on its stream
        del b
    assert_same_batch(first, cpu[0])
    for k, v in kept.items():
        assert torch.equal(first[k], v) if isinstance(v, torch.Tensor) else first[k] == v


@needs_cuda
@pytest.mark.parametrize(("threads", "where"), [(0, "all"), (1, "all"), (3, "all"), (2, "full"), (2, "none")])
def test_cuda_staging_keeps_the_order(tmp_path, monkeypatch, threads, where):
    """Batches staged on the producer thread, on one staging thread, on several at once, or
    the full ones on threads and the short last one inline, arrive in order, each equal to
    the CPU loader's, all held to the end; ``close()`` stops the staging threads."""
    import arrowload.pipeline.device as device
    ds = typed_dataset(20_000)
    kw = dict(shuffle="global", seed=8, stack={"x": ["f32", "f32b", "f64"]}, cache_dir=str(tmp_path))
    cpu = list(ds.loader(64, output="torch", **kw))
    full = sum(t.numel() * t.element_size() for t in cpu[0].values() if isinstance(t, torch.Tensor))
    assert cpu[-1]["id"].numel() < 64  # a short last batch: fewer bytes than ``full``
    monkeypatch.setattr(device, "default_copy_threads", lambda: threads)
    monkeypatch.setattr(device, "THREAD_BYTES", {"all": 0, "full": full, "none": full + 1}[where])
    with ds.loader(64, output="torch", device="cuda", **kw) as loader:
        assert loader._device_stage.copy_threads == threads
        gpu = list(loader)
        staging = [t for t in threading.enumerate() if t.name.startswith("arrowload-h2d")]
        assert len(staging) <= threads and (len(staging) > 0) == (threads > 0 and where != "none")
    assert len(gpu) == len(cpu) == -(-20_000 // 64)
    for g, c in zip(gpu, cpu):
        assert_same_batch(g, c)
    assert not any(t.is_alive() for t in staging)


@needs_cuda
def test_cuda_pinned_staging_is_reused(tmp_path, monkeypatch):
    """Host arrays go through page-locked staging buffers taken from a pool: far fewer
    pinned allocations than arrays copied, every pooled buffer pinned."""
    calls = []
    original = torch.Tensor.pin_memory

    def counting(self, *a, **k):
        calls.append(tuple(self.shape))
        return original(self, *a, **k)

    monkeypatch.setattr(torch.Tensor, "pin_memory", counting)
    ds = typed_dataset()
    loader = ds.loader(32, output="torch", device="cuda", drop_last=True, prefetch=1, cache_dir=str(tmp_path))
    n = 0
    for b in loader:
        n += 1
        assert b["id"].device.type == "cuda"
    stage = loader._device_stage
    arrays_copied = n * 9  # nine numeric columns per batch
    assert n == 62
    assert 0 < len(calls) <= len(stage._pinned) * stage.capacity
    assert len(calls) < arrays_copied // 4, (len(calls), arrays_copied)
    for slots in stage._pinned.values():
        assert all(slot[0].is_pinned() for slot in slots)


@needs_cuda
def test_cuda_devices_split_rows(tmp_path):
    """``devices=[...]``: each batch is split into contiguous row ranges, one per device, in
    order; together they are the CPU batch. One GPU: the same device twice still splits."""
    count = torch.cuda.device_count()
    devices = [f"cuda:{i}" for i in range(count)] if count > 1 else ["cuda:0", "cuda:0"]
    ds = typed_dataset()
    kw = dict(shuffle="global", seed=2, cache_dir=str(tmp_path))
    cpu = list(ds.loader(100, output="torch", **kw))
    gpu = list(ds.loader(100, output="torch", devices=devices, **kw))
    assert len(gpu) == len(cpu) == 20
    k = len(devices)
    for parts, want in zip(gpu, cpu):
        assert isinstance(parts, list) and len(parts) == k
        bounds = [(i * 100) // k for i in range(k + 1)]
        for i, (part, dev) in enumerate(zip(parts, devices)):
            sliced = {n: v[bounds[i]:bounds[i + 1]] for n, v in want.items()}
            assert_same_batch(part, sliced)
            assert all(t.device == torch.device(dev) for t in part.values() if isinstance(t, torch.Tensor))


def _jax_gpus() -> list:
    try:
        import jax
        return list(jax.devices("gpu"))
    except Exception:  # noqa: BLE001 - no GPU backend in this jax
        return []


# jax without jax_enable_x64 (its default) refuses float64: its tests leave f64 out
JAX_COLUMNS = ["id", "f32", "f32b", "i32", "u8", "flag", "ts", "emb"]


@needs_cuda
def test_jax_sharding_places_batches_on_gpus(tmp_path):
    gpus = _jax_gpus()
    if not gpus:
        pytest.skip("jax has no GPU backend in this environment")
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
    sharding = NamedSharding(Mesh(np.array(gpus), ("batch",)), PartitionSpec("batch"))
    size = 40 * len(gpus)
    ds = typed_dataset().select(*JAX_COLUMNS)
    kw = dict(shuffle="global", seed=3, drop_last=True, stack={"x": ["f32", "f32b"]}, cache_dir=str(tmp_path))
    cpu = list(ds.loader(size, output="numpy", **kw))
    out = list(ds.loader(size, output="jax", sharding=sharding, **kw))
    assert len(out) == len(cpu) > 0
    for got, want in zip(out, cpu):
        for name in ("x", "id", "emb"):
            assert got[name].sharding == sharding
            assert {d.platform for d in got[name].devices()} == {gpus[0].platform}
            np.testing.assert_array_equal(np.asarray(jax.device_get(got[name])), want[name])


@needs_cuda
@pytest.mark.parametrize("shuffle", [False, "global"])
def test_jax_device_cuda_puts_every_array_on_the_gpu(tmp_path, shuffle):
    """``output="jax", device="cuda"``, the same spelling as torch's: every array of every
    batch lives on the first GPU and equals the numpy loader's batch."""
    gpus = _jax_gpus()
    if not gpus:
        pytest.skip("jax has no GPU backend in this environment")
    import jax
    ds = typed_dataset().select(*JAX_COLUMNS)
    kw = dict(shuffle=shuffle, seed=5, stack={"x": ["f32", "f32b"]}, cache_dir=str(tmp_path))
    cpu = list(ds.loader(96, output="numpy", **kw))
    out = list(ds.loader(96, output="jax", device="cuda", **kw))
    assert len(out) == len(cpu) == -(-2000 // 96)
    for got, want in zip(out, cpu):
        assert list(got) == list(want)
        for name, value in want.items():
            assert got[name].devices() == {gpus[0]}, name
            np.testing.assert_array_equal(np.asarray(jax.device_get(got[name])), value.astype(got[name].dtype))


# ---------------------------------------------------------------------------
# whole reads on the device, and page-locking a table in place


def test_table_spans_cover_every_buffer():
    """Every buffer of a table of several chunks (nested lists and strings too) lies inside
    one of its spans; the spans are page-aligned, sorted and disjoint."""
    from arrowload.pipeline.device import table_spans
    import os
    page = os.sysconf("SC_PAGE_SIZE")
    parts = [pa.table({"x": np.arange(i, i + 5000, dtype=np.float32),
                       "s": [f"r{j}" for j in range(5000)],
                       "l": pa.array([[j, j + 1] for j in range(5000)], pa.list_(pa.int64()))})
             for i in range(3)]
    table = pa.concat_tables(parts)
    spans = table_spans(table)
    assert spans and all(lo % page == 0 and hi % page == 0 and lo < hi for lo, hi in spans)
    assert all(a[1] < b[0] for a, b in zip(spans, spans[1:]))
    buffers = [b for col in table.columns for c in col.chunks for b in c.buffers() if b is not None and b.size]
    assert len(buffers) == 3 * 5  # per chunk: x data; s offsets, data; l offsets, child data
    for b in buffers:
        assert any(lo <= b.address and b.address + b.size <= hi for lo, hi in spans), b


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 40), st.integers(1, 8)), max_size=4), min_size=1, max_size=5),
       st.sets(st.integers(0, 48)), st.randoms(use_true_random=False))
def test_host_pins_register_each_page_once(holders, refused, rnd):
    """``HostPins`` against a fake driver that, like CUDA's, refuses to register memory twice:
    however holders' ranges overlap, every page asked for is registered exactly once while
    held (except ranges the driver refuses, which stay unregistered), and unpinning the
    holders in any order unregisters every range exactly once, when its last holder goes."""
    from arrowload.pipeline.device import HostPins
    live: dict[int, int] = {}  # start -> end, as the fake driver holds them
    unregistered: list[int] = []

    def register(lo, size):
        assert not any(lo < e and s < lo + size for s, e in live.items()), "registered twice"
        if lo in refused:
            return False
        live[lo] = lo + size
        return True

    def unregister(lo):
        assert lo in live
        unregistered.append(lo)
        del live[lo]

    pins = HostPins()
    held = []
    for spans in holders:
        merged = []
        for lo, n in sorted(spans):  # a holder's own spans are merged (table_spans)
            if merged and lo <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], lo + n)
            else:
                merged.append([lo, lo + n])
        held.append(pins.pin([tuple(m) for m in merged], (register, unregister)))
        for lo, hi in merged:  # every page asked for is registered, unless refused
            for page in range(lo, hi):
                inside = [s for s, e in live.items() if s <= page < e]
                assert len(inside) <= 1
        assert sorted(live.items()) == [(s, e) for s, e, _ in pins.ranges()]
    assert set(live) == {s for h in held for s in h}
    order = list(range(len(held)))
    rnd.shuffle(order)
    for k in order:
        pins.unpin(held[k])
    assert not live and not pins.ranges()
    assert len(unregistered) == len(set(unregistered))


def _numeric_table(n: int, chunk: int) -> pa.Table:
    """The typed dataset's numeric columns in chunks of ``chunk`` rows (so batches straddle
    reads)."""
    table = typed_dataset(n).select("id", "f32", "f32b", "f64", "i32", "u8", "flag", "ts", "emb").to_arrow()
    return pa.Table.from_batches(table.to_batches(max_chunksize=chunk))


def _whole_read_dataset(tmp_path, where: str):
    """``(dataset, table)``: 5,000 rows of numeric columns, an in-memory table in chunks of
    700 rows, or one Parquet file of it in row groups of 900 (batches of 96 straddle reads)."""
    table = _numeric_table(5000, 700)
    if where == "memory":
        return al.dataset(table), table
    import pyarrow.parquet as pq
    (tmp_path / "lake").mkdir()
    pq.write_table(table, tmp_path / "lake" / "part-0.parquet", row_group_size=900)
    return al.dataset(str(tmp_path / "lake")), table


#: what the stand-in's streams and driver did, in order (``("sync", stream)``,
#: ``("unregister", address)``)
_LOG: list = []


#: the stand-in's streams that waited on an event, in order
_WAITS: list = []


class _FakeStream:
    def __init__(self, device=None, default=False):
        self.device = device
        self.default = default  # the device's default stream (the consumer's unless set)

    def __eq__(self, other):
        return isinstance(other, _FakeStream) and self.default and other.default

    __hash__ = object.__hash__

    def wait_event(self, event):
        assert isinstance(event, _FakeEvent) and event.recorded
        _WAITS.append(self)

    def synchronize(self):
        _LOG.append(("sync", self))


class _FakeEvent:
    def __init__(self):
        self.recorded = False

    def record(self, stream=None):
        self.recorded = True

    def query(self):
        return self.recorded

    def synchronize(self):
        pass


@pytest.fixture()
def cuda_stand_in(monkeypatch):
    """``torch.cuda`` played by the CPU, for the stage's logic where CI has no GPU: streams
    and events that only check they are used in order, pinning that pins nothing, and every
    non-blocking copy to the stage's device (the CPU, set by ``_stand_in_stage``) a real
    copy, so a staging buffer reused too early would show in the batches."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "Stream", _FakeStream)
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _FakeStream(device, default=True))
    monkeypatch.setattr(torch.cuda, "default_stream", lambda device=None: _FakeStream(device, default=True))
    monkeypatch.setattr(torch.cuda, "set_stream", lambda stream: None)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a, **k: self)
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: None)
    original = torch.Tensor.to

    def to(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        return out.clone() if kwargs.get("non_blocking") and out.data_ptr() == self.data_ptr() else out

    monkeypatch.setattr(torch.Tensor, "to", to)


def _stand_in_stage(loader):
    """The loader's device stage moved to the CPU (``cuda_stand_in``), counting its whole reads."""
    loader._device_stage.devices = [torch.device("cpu")]
    return _counted_stage(loader)


def _counted_stage(loader):
    """``(stage, rows of each whole read copied so far)`` of the loader's device stage."""
    stage = loader._device_stage
    calls = []
    chunk = stage.chunk

    def counted(host):
        calls.append(host.num_rows)
        return chunk(host)

    stage.chunk = counted
    return stage, calls


def test_pinned_staging_kept_is_bounded_in_bytes_against_a_cuda_stand_in(cuda_stand_in):
    """Whole reads of many sizes (many staging keys): the pinned staging kept for reuse
    never exceeds ``pool_bytes``, and every read arrives intact."""
    from arrowload.pipeline.chunks import HostChunk
    from arrowload.pipeline.device import TorchDeviceStage
    stage = TorchDeviceStage(["cuda"], pool_bytes=1 << 20)
    stage.devices = [torch.device("cpu")]
    rng = np.random.default_rng(3)
    for rows in rng.integers(1, 40_000, 60):
        x = rng.standard_normal((int(rows), 4)).astype(np.float32)
        y = np.arange(rows, dtype=np.int64)
        chunk = stage.chunk(HostChunk({"x": x, "y": y}, int(rows), 24.0))
        assert torch.equal(chunk.columns["x"], torch.from_numpy(x))
        assert torch.equal(chunk.columns["y"], torch.from_numpy(y))
        assert stage.pinned_bytes <= 1 << 20
    kept = sum(slot[2].nbytes for slots in stage._pinned.values() for slot in slots)
    assert 0 < kept == stage.pinned_bytes <= 1 << 20


class _FakeDriver:
    """``torch.cuda.cudart()``'s registrations, as the driver keeps them: overlapping memory
    is refused (the error code 712, ``cudaErrorHostMemoryAlreadyRegistered``)."""

    def __init__(self):
        self.live: dict[int, int] = {}  # start -> end

    def cudaHostRegister(self, lo, size, flags):
        if any(lo < e and s < lo + size for s, e in self.live.items()):
            return 712
        self.live[lo] = lo + size
        return 0

    def cudaHostUnregister(self, lo):
        assert lo in self.live, "unregistering memory never registered"
        del self.live[lo]
        _LOG.append(("unregister", lo))
        return 0

    def holds(self, address: int) -> bool:
        return any(s <= address < e for s, e in self.live.items())


def test_whole_reads_stats_and_profile_against_a_cuda_stand_in(tmp_path, cuda_stand_in):
    """``stats()`` and ``profile()`` of a loader whose reads go to the device whole count
    its rows, batches and bytes as the host loader's do."""
    ds = al.dataset(_numeric_table(5000, 700))
    host = ds.loader(96, output="torch")
    list(host)
    with ds.loader(96, output="torch", device="cuda") as loader:
        _stand_in_stage(loader)
        list(loader)
        got, want = loader.stats(), host.stats()
        assert (got.rows, got.batches, got.bytes_decoded) == (want.rows, want.batches, want.bytes_decoded)
        assert got.device["reads"] > 0 and got.device["staged_bytes"] > 0 and not want.device
        assert "to the device whole" in str(got) and "to the device" not in str(want)
        list(loader)  # a second epoch counts its own reads only
        assert loader.stats().device == got.device
        assert "numeric reads copied whole" in loader.explain() and "to device" not in host.explain()
        prof = loader.profile(10)
        assert prof is not None and "batches" in repr(prof).lower()


@pytest.mark.parametrize("consumer", ["default", "own"])
def test_batches_of_whole_reads_need_no_stream_calls_on_the_default_stream(tmp_path, cuda_stand_in, monkeypatch,
                                                                            consumer):
    """A whole read is made usable on the device's default stream once (the stream waits on
    its copy), so a consumer there makes no stream call per batch; a consumer on a stream
    of its own waits on each batch's copy. Either way the batches equal the CPU loader's."""
    ds = al.dataset(_numeric_table(5000, 700))
    cpu = list(ds.loader(96, output="torch", cache_dir=str(tmp_path)))
    if consumer == "own":
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _FakeStream(device))
    with ds.loader(96, output="torch", device="cuda", cache_dir=str(tmp_path)) as loader:
        _, calls = _stand_in_stage(loader)
        _WAITS.clear()
        got = list(loader)
    straddled = sum(1 for i in range(len(got)) if (96 * i) // 700 != min(96 * i + 95, 4999) // 700)
    on_default = sum(1 for w in _WAITS if w.default)
    assert len(calls) == 8 and straddled == 7
    assert on_default == len(calls) + straddled  # once per read, and per batch joined on the device
    per_batch = len(_WAITS) - on_default - 2 * straddled  # the copy stream waits on both parts joined
    assert per_batch == (len(got) if consumer == "own" else 0)
    for g, c in zip(got, cpu):
        assert_same_batch(g, c, device_type="cpu")


def test_reads_with_strings_stay_per_batch_against_a_cuda_stand_in(tmp_path, cuda_stand_in):
    """A read holding strings (Python lists) is not copied whole: its batches are staged
    one by one, and equal the CPU loader's."""
    ds = typed_dataset()
    cpu = list(ds.loader(96, output="torch", cache_dir=str(tmp_path)))
    with ds.loader(96, output="torch", device="cuda", cache_dir=str(tmp_path)) as loader:
        stage, calls = _stand_in_stage(loader)
        got = list(loader)
    assert calls == [] and stage.staged_bytes == 0
    for g, c in zip(got, cpu):
        assert_same_batch(g, c, device_type="cpu")


@dataclasses.dataclass
class _CudaEnv:
    prepare: Any          # loader -> (stage, rows of each whole read copied so far)
    device_type: str      # where the batches' tensors are
    driver: Any           # the stand-in's _FakeDriver, None on CUDA


@pytest.fixture(params=["stand-in", "cuda"])
def cuda_env(request, monkeypatch):
    """Where the whole-read tests run: ``"stand-in"`` everywhere (``cuda_stand_in``, a
    ``_FakeDriver`` for page-locking, a tensor pinned where the driver holds its memory;
    batches stay on the CPU), ``"cuda"`` on a CUDA device (skipped without one)."""
    if request.param == "cuda":
        if not CUDA:
            pytest.skip("needs a CUDA device")
        return _CudaEnv(_counted_stage, "cuda", None)
    request.getfixturevalue("cuda_stand_in")
    driver = _FakeDriver()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: driver)
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self, *a: self.numel() > 0 and driver.holds(self.data_ptr()))
    return _CudaEnv(_stand_in_stage, "cpu", driver)


@pytest.mark.parametrize("where", ["memory", "lake"])
@pytest.mark.parametrize("shuffle", [False, "global", "block"])
@pytest.mark.parametrize("stack", [None, {"x": ["f32", "f32b", "f64"]}, {"x": ["f32", "f32b"]}])
@pytest.mark.parametrize("pin", [False, True])
def test_whole_reads_equal_the_cpu_loader(cuda_env, tmp_path, monkeypatch, where, shuffle, stack, pin):
    """Reads of numeric columns go to the device whole (fewer copies than batches) and
    batches are cut there (a batch straddling two reads joined on the device): every batch,
    all held to the end, equals the CPU loader's. With ``ARROWLOAD_PIN_TABLES=1`` an
    in-memory table read unshuffled is page-locked in place (every buffer inside a range
    the driver holds) and its numeric columns copied with no host copy (``direct_bytes``;
    the bool column, bit-packed in Arrow, and a stack group of mixed types, stacked on the
    host, are staged; a group of one type is stacked on the device from its page-locked
    columns) until the loader closes."""
    from arrowload.pipeline import device
    monkeypatch.setenv("ARROWLOAD_PIN_TABLES", "1" if pin else "0")
    driver = cuda_env.driver
    ds, table = _whole_read_dataset(tmp_path, where)
    kw = dict(shuffle=shuffle, seed=6, stack=stack, cache_dir=str(tmp_path / "cache"))
    cpu = list(ds.loader(96, output="torch", **kw))
    before = device.HOST_PINS.ranges()
    with ds.loader(96, output="torch", device="cuda", **kw) as loader:
        stage, calls = cuda_env.prepare(loader)
        assert stage.chunks
        got = list(loader)
        pinned = pin and where == "memory" and not shuffle
        assert (len(device.HOST_PINS.ranges()) > len(before)) == pinned
        if pinned:
            assert stage.direct_bytes > 0
            mixed = stack is not None and "f64" in stack["x"]
            assert stage.staged_bytes == 5000 + (5000 * 3 * 8 if mixed else 0)
            if driver is not None:
                assert len(device.HOST_PINS.ranges()) - len(before) == len(driver.live)
                for col in table.columns:
                    for c in col.chunks:
                        assert all(driver.holds(b.address) for b in c.buffers() if b is not None and b.size)
        else:
            assert stage.direct_bytes == 0 and stage.staged_bytes > 0
        _ = sum(float(b["id"].sum()) for b in got)  # the consumer's own work meanwhile
    assert device.HOST_PINS.ranges() == before  # unlocked at close
    assert driver is None or not driver.live
    assert 0 < len(calls) < len(got) and sum(calls) >= 5000
    assert len(got) == len(cpu) == -(-5000 // 96)
    for g, c in zip(got, cpu):
        assert_same_batch(g, c, device_type=cuda_env.device_type)


def test_whole_reads_two_loaders_share_pins_and_resume(cuda_env, monkeypatch):
    """Two loaders over one in-memory table lock its pages once between them (the driver
    refuses a second registration) and let go of them when the last closes, or is collected
    unclosed (once its copies are done); a loader resumed from a state mid-epoch gives the
    rest of the uninterrupted epoch's batches."""
    import gc
    from arrowload.pipeline import device
    monkeypatch.setenv("ARROWLOAD_PIN_TABLES", "1")
    driver = cuda_env.driver
    ds = al.dataset(_numeric_table(3000, 512))
    base = device.HOST_PINS.ranges()
    old = {s for s, _, _ in base}

    def holders() -> set:
        return {h for s, _, h in device.HOST_PINS.ranges() if s not in old}

    a = ds.loader(100, output="torch", device="cuda")
    b = ds.loader(100, output="torch", device="cuda")
    cuda_env.prepare(a), cuda_env.prepare(b)
    whole = [x["id"].cpu().clone() for x in a]
    it = iter(b)
    for _ in range(7):
        next(it)
    state = b.state_dict()
    assert holders() == {2}
    assert driver is None or len(driver.live) == len(device.HOST_PINS.ranges()) - len(base)
    a.close()
    assert holders() == {1} and (driver is None or driver.live)
    it.close()
    stream = b._device_stage.streams[0]
    mark = len(_LOG)
    del b, it
    gc.collect()  # never closed: collected, it lets go of the pages too, once its copies are done
    assert device.HOST_PINS.ranges() == base
    if driver is not None:
        assert not driver.live
        after = _LOG[mark:]
        assert after[0] == ("sync", stream) and all(kind == "unregister" for kind, _ in after[1:])
    c = ds.loader(100, output="torch", device="cuda")
    cuda_env.prepare(c)
    c.load_state_dict(state)
    rest = [x["id"].cpu() for x in c]
    c.close()
    assert device.HOST_PINS.ranges() == base and (driver is None or not driver.live)
    assert len(rest) == len(whole) - 7
    for got, want in zip(rest, whole[7:]):
        assert torch.equal(got, want)


def test_device_reads_convert_a_read_with_strings_once_as_the_host_path_does(monkeypatch):
    """A read the CUDA stage will not take whole (a string column) converts once, to the
    chunk the host path makes (its stack group stacked on the host), not once for the device
    and again for the host; the wrapper copies without recursing through ``__getattr__``."""
    import copy

    from arrowload.convert.options import ConvertOptions
    from arrowload.pipeline import collate
    from arrowload.pipeline.chunks import ChunkConverter, DeviceReads, HostChunk
    n = 5000
    rng = np.random.default_rng(0)
    batch = pa.record_batch({"f0": rng.standard_normal(n).astype(np.float32),
                             "name": [f"row{i}" for i in range(n)],
                             "f1": rng.standard_normal(n).astype(np.float32)})
    conv = ChunkConverter(ConvertOptions(output="torch"), {"x": ["f0", "f1"]}, collate.BufferPool())
    want = conv.chunk(batch)
    calls = []
    to_host = collate.to_host
    monkeypatch.setattr(collate, "to_host", lambda b, *a, **k: calls.append(b.schema.names) or to_host(b, *a, **k))
    reads = DeviceReads(conv)
    got = reads.chunk(batch)
    assert calls == [["name"]]
    assert isinstance(got, HostChunk) and list(got.columns) == list(want.columns) == ["x", "name"]
    assert got.row_bytes == want.row_bytes
    np.testing.assert_array_equal(got.columns["x"], want.columns["x"])
    assert got.columns["name"] == want.columns["name"]
    assert copy.copy(reads).conv is conv


def test_a_batch_joining_reads_of_other_list_widths_on_the_device_is_a_conversion_error(cuda_stand_in):
    """An unpadded list column whose lists have one length in one read and another in the
    next: a batch spanning both is the ``ConversionError`` the CPU loader raises (naming the
    column and ``pad_lists``), not torch's ``RuntimeError`` from joining them on the device."""
    table = pa.Table.from_batches([
        pa.record_batch({"id": pa.array([0, 1], pa.int64()), "vl": pa.array([[1], [2]], pa.list_(pa.int32()))}),
        pa.record_batch({"id": pa.array([2, 3], pa.int64()), "vl": pa.array([[], []], pa.list_(pa.int32()))}),
    ])
    ds = al.dataset(table)
    with pytest.raises(al.ConversionError, match="'vl'.*pad_lists") as cpu:
        list(ds.loader(3, output="torch"))
    with ds.loader(3, output="torch", device="cuda") as loader:
        _, calls = _stand_in_stage(loader)
        with pytest.raises(al.ConversionError, match="'vl'.*pad_lists") as gpu:
            list(loader)
    assert calls == [2, 2] and str(gpu.value) == str(cpu.value)
