"""Planned batch memory: stacking into pooled buffers, and the lifetime rule that a
batch the user can still see is never overwritten."""

from __future__ import annotations

import gc

import numpy as np
import pyarrow as pa
import pytest

import arrowload as al
from arrowload.pipeline.collate import BufferPool, resolve_stack


@pytest.fixture(scope="module")
def table():
    rng = np.random.default_rng(0)
    cols = {f"f{i}": pa.array(rng.standard_normal(10_000, dtype=np.float32)) for i in range(12)}
    cols["label"] = pa.array(rng.integers(0, 2, 10_000, dtype=np.int8))
    cols["id"] = pa.array(np.arange(10_000, dtype=np.int64))
    return pa.table(cols)


def to_np(x) -> np.ndarray:
    """A host copy of a numpy / torch / jax array."""
    return x.numpy().copy() if hasattr(x, "data_ptr") else np.array(x)


def expected_x(table, names):
    return np.stack([table.column(n).to_numpy() for n in names], axis=1)


FEATS = [f"f{i}" for i in range(12)]


@pytest.mark.parametrize("output", ["numpy", "torch", "jax", "arrow"])
def test_stacked_values_dtype_and_shape(table, tmp_path, output):
    ds = al.dataset(table)
    loader = ds.loader(1000, stack={"x": "f*"}, output=output, cache_dir=str(tmp_path))
    xs, ids = [], []
    for b in loader:
        if output == "arrow":
            x = b.column("x")
            assert x.type == pa.list_(pa.float32(), 12)
            xs.append(x.flatten().to_numpy().reshape(-1, 12).copy())
            ids.append(b.column("id").to_numpy().copy())
            assert b.schema.names == ["x", "label", "id"]
            continue
        x = b["x"]
        assert tuple(x.shape) == (1000, 12)
        assert str(x.dtype).endswith("float32")
        assert list(b) == ["x", "label", "id"]  # stacked columns replaced, in place of the first
        xs.append(to_np(x))
        ids.append(to_np(b["id"]))
    ids = np.concatenate(ids)
    np.testing.assert_array_equal(ids, np.arange(10_000))
    np.testing.assert_array_equal(np.concatenate(xs), expected_x(table, FEATS))


def test_glob_orders_naturally_and_lists_keep_order(table):
    spec = resolve_stack({"x": "f*"}, table.schema)
    assert spec.groups[0][1] == tuple(FEATS)  # f2 before f10
    spec = resolve_stack({"x": ["f3", "f1"], "y": ["label"]}, table.schema)
    assert spec.groups == (("x", ("f3", "f1")), ("y", ("label",)))


def test_stack_errors_name_the_column(table):
    with pytest.raises(al.ColumnNotFoundError, match="nope"):
        resolve_stack({"x": ["f0", "nope"]}, table.schema)
    with pytest.raises(al.ColumnNotFoundError, match="g\\*"):
        resolve_stack({"x": "g*"}, table.schema)
    t = table.append_column("s", pa.array(["a"] * table.num_rows))
    with pytest.raises(al.ArrowloadError, match="'s'"):
        resolve_stack({"x": ["f0", "s"]}, t.schema)
    with pytest.raises(ValueError, match="twice"):
        resolve_stack({"x": ["f0"], "y": ["f0"]}, table.schema)


def test_held_batches_are_never_overwritten(table, tmp_path):
    """Keep every batch (and views of them): all must still hold their own rows at the end."""
    loader = al.dataset(table).loader(512, stack={"x": FEATS}, cache_dir=str(tmp_path), prefetch=1)
    held = [b["x"][:, :] for b in loader]  # views, the strictest case: they refer to the buffer's owner
    np.testing.assert_array_equal(np.concatenate(held), expected_x(table, FEATS))


def test_buffers_are_reused_once_released(table, tmp_path):
    loader = al.dataset(table).loader(512, stack={"x": FEATS}, cache_dir=str(tmp_path))
    total = 0
    for b in loader:
        total += b["x"].shape[0]
        del b
    assert total == 10_000
    assert loader._pool.reused > 0
    assert loader._pool.allocated < 20  # 20 batches: most came from the pool


def test_pool_respects_views_and_tensors():
    import torch
    pool = BufferPool(capacity=2)
    a = pool.take((8, 4), np.float32)
    view = a[2:5]
    del a
    gc.collect()
    b = pool.take((8, 4), np.float32)
    assert not np.shares_memory(b, view)  # the view still sees the first buffer
    t = torch.from_dlpack(b[:8])
    del b
    c = pool.take((8, 4), np.float32)
    assert not np.shares_memory(c, view) and c.ctypes.data != t.data_ptr()
    del view, c
    d = pool.take((8, 4), np.float32)
    assert d.ctypes.data != t.data_ptr()  # the tensor keeps its buffer
    del t, d
    e = pool.take((8, 4), np.float32)
    assert pool.reused >= 2 and e.shape == (8, 4)
