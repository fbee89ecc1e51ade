"""The Load stage on a machine without CUDA: the CUDA path is never entered, asking for it
is a clear error, and jax placement works on the CPU device."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

import arrowload as al


@pytest.fixture()
def ds():
    return al.dataset(pa.table({"f0": np.arange(1000, dtype=np.float32),
                                "f1": np.arange(1000, dtype=np.float32) * 2,
                                "label": np.arange(1000, dtype=np.int64) % 2}))


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


@pytest.mark.parametrize("kwargs", [{"device": "cuda"}, {"device": "cuda:1"}, {"devices": ["cuda:0", "cuda:1"]}])
def test_cuda_without_cuda_is_a_clear_error(ds, tmp_path, kwargs):
    assert not torch.cuda.is_available()
    with pytest.raises(al.ArrowloadError, match="CUDA"):
        ds.loader(256, output="torch", cache_dir=str(tmp_path), **kwargs)


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
