"""Planned batch memory: stacking into pooled buffers, and the lifetime rule that a
batch the user can still see is never overwritten."""

from __future__ import annotations

import gc

import numpy as np
import pyarrow as pa
import pytest

import arrowload as al
from arrowload.errors import ConversionError
from arrowload.convert.options import ConvertOptions
from arrowload.pipeline import collate
from arrowload.pipeline.collate import BufferPool, resolve_stack, stack_batch


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


@pytest.mark.parametrize("rows", [1, 1023, 8192, 8193, 70_001])
def test_stacking_by_row_blocks_equals_numpys_stack(rows):
    """Columns are written into the stacked buffer block by block (``STACK_BLOCK_BYTES``):
    every row, at any length around the block, equals ``np.stack`` of the columns -- with
    a column of nulls filled and a bit-packed boolean among them (written apart)."""
    rng = np.random.default_rng(rows)
    cols = {f"f{i}": pa.array(rng.standard_normal(rows).astype(np.float32)) for i in range(16)}
    holes = rng.standard_normal(rows).astype(np.float32)
    mask = rng.random(rows) < 0.3
    cols["holes"] = pa.array(holes, mask=mask)
    cols["flag"] = pa.array(rng.random(rows) < 0.5)
    batch = pa.RecordBatch.from_pydict(cols)
    names = [f"f{i}" for i in range(8)] + ["holes", "flag"] + [f"f{i}" for i in range(8, 16)]
    spec = resolve_stack({"x": names}, batch.schema)
    got = stack_batch(batch, spec, BufferPool(), ConvertOptions(fill_null={"holes": -1.0}))["x"]
    want = np.stack([np.where(mask, np.float32(-1), holes) if n == "holes" else
                     batch.column(n).to_numpy(zero_copy_only=False).astype(np.float32) for n in names], axis=1)
    assert got.shape == (rows, len(names)) and got.dtype == np.float32
    assert np.array_equal(got, want)
    assert collate.STACK_BLOCK_BYTES // (len(names) * 4) < 70_001  # the largest case spans blocks


def test_stack_with_a_boolean_and_a_filled_column_that_has_no_nulls_in_a_read(tmp_path):
    """A stacked group holding a bit-packed boolean (converted apart) and a ``fill_null``
    column whose nulls lie in one row group only: reads whose filled column has no nulls
    raised ColumnNotFoundError (the boolean's conversion saw ``fill_null`` name a column
    it was not given)."""
    import pyarrow.parquet as pq
    n = 4000
    holes = np.arange(n, dtype=np.float32)
    mask = np.zeros(n, dtype=bool)
    mask[[3500, 3999]] = True
    t = pa.table({"f0": np.arange(n, dtype=np.float32) * 2, "holes": pa.array(holes, mask=mask),
                  "flag": pa.array(np.arange(n) % 3 == 0), "label": np.arange(n) % 5})
    pq.write_table(t, tmp_path / "a.parquet", row_group_size=1000)
    got = list(al.dataset(str(tmp_path / "a.parquet")).loader(
        700, stack={"x": ["f0", "holes", "flag"]}, fill_null={"holes": -1.0}, cache_dir=str(tmp_path)))
    x = np.concatenate([to_np(b["x"]) for b in got])
    want = np.stack([np.arange(n, dtype=np.float32) * 2, np.where(mask, np.float32(-1), holes),
                     (np.arange(n) % 3 == 0).astype(np.float32)], axis=1)
    assert np.array_equal(x, want)
    assert np.array_equal(np.concatenate([to_np(b["label"]) for b in got]), np.arange(n) % 5)


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
    """The stacked buffer of a read is one pooled [rows, 12] array; once the batches cut
    from it are gone, the next epoch writes into the same buffer."""
    loader = al.dataset(table).loader(512, stack={"x": FEATS}, cache_dir=str(tmp_path))
    total = 0
    for epoch in range(4):
        loader.set_epoch(epoch)
        for b in loader:
            total += b["x"].shape[0]
            del b
    assert total == 40_000
    assert loader._pool.reused >= 3
    assert loader._pool.allocated <= 1  # 80 batches, one buffer


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


# ---------------------------------------------------------------------------
# reads converted whole, gathers into pooled buffers


@pytest.fixture(scope="module")
def mixed():
    """Every array-valued kind the fast paths handle: numbers, bool, date32, fixed-size list."""
    rng = np.random.default_rng(1)
    n = 20_011
    return pa.table({
        "id": pa.array(np.arange(n, dtype=np.int64)),
        "f0": pa.array(rng.standard_normal(n, dtype=np.float32)),
        "f1": pa.array(rng.standard_normal(n).astype(np.float32)),
        "small": pa.array(rng.integers(-100, 100, n, dtype=np.int8)),
        "flag": pa.array(rng.integers(0, 2, n).astype(bool)),
        "day": pa.array(rng.integers(0, 20_000, n).astype(np.int32), pa.int32()).cast(pa.date32()),
        "emb": pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(n * 3, dtype=np.float32)), 3),
    })


def rows_of(table: pa.Table, name: str) -> np.ndarray:
    col = table.column(name).combine_chunks()
    if pa.types.is_fixed_size_list(col.type):
        return col.flatten().to_numpy().reshape(len(col), -1)
    if pa.types.is_date32(col.type):
        return col.to_numpy(zero_copy_only=False).astype("datetime64[D]")
    return col.to_numpy(zero_copy_only=False)


@pytest.mark.parametrize("where", ["memory", "disk"])
@pytest.mark.parametrize("stack", [None, {"x": ["f0", "f1", "small"]}])
def test_shuffled_batches_keep_rows_whole_and_are_never_overwritten(mixed, tmp_path, where, stack):
    """Global shuffle gathers every column straight into pooled buffers (from the in-memory
    table, or chunk by chunk from the memory-mapped cache). Each row of every batch must be
    one row of the table across all columns, and batches held over two epochs must keep
    their values while later batches are gathered."""
    budget = 1 if where == "disk" else None
    loader = al.dataset(mixed).loader(1000, shuffle="global", seed=3, stack=stack, memory_budget=budget,
                                      cache_dir=str(tmp_path))
    assert loader.source_kind.startswith("table (memory" if where == "memory" else "table (/")
    held = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        seen = []
        for b in loader:
            held.append(b)
            seen.append(b["id"])
        assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(mixed.num_rows))
    for b in held:
        ids = b["id"]
        assert not b["id"].flags.writeable
        for name in ("emb", "flag", "day"):
            np.testing.assert_array_equal(b[name], rows_of(mixed, name)[ids])
        if stack:
            assert list(b) == ["id", "x", "flag", "day", "emb"]
            expect = np.stack([rows_of(mixed, c)[ids].astype(np.float32) for c in stack["x"]], axis=1)
            np.testing.assert_array_equal(b["x"], expect)
        else:
            assert list(b) == mixed.schema.names
            for name in ("f0", "f1", "small"):
                np.testing.assert_array_equal(b[name], rows_of(mixed, name)[ids])
                assert b[name].dtype == rows_of(mixed, name).dtype


def test_gathers_reuse_pooled_buffers(mixed, tmp_path):
    loader = al.dataset(mixed).select("id", "f0").loader(1000, shuffle="global", cache_dir=str(tmp_path))
    for epoch in range(3):
        loader.set_epoch(epoch)
        for b in loader:
            del b
    assert loader._pool.reused >= 2 * 2  # two columns, reused in epochs 2 and 3
    assert loader._pool.allocated <= 2 * 2  # two columns, at most one spare each


@pytest.mark.parametrize("bs", [999, 4096])
def test_batches_straddling_reads_are_concatenated_once_and_kept(mixed, tmp_path, bs):
    """Units of 1,000 rows (a memory table's slices) and batches that cross them: the rows
    of two reads are concatenated into a pooled buffer; held batches keep their rows."""
    ds = al.dataset(pa.Table.from_batches(mixed.to_batches(max_chunksize=1000)))
    loader = ds.loader(bs, stack={"x": ["f0", "f1"]}, cache_dir=str(tmp_path))
    held = [b for epoch in range(2) for b in (loader.set_epoch(epoch), list(loader))[1]]
    got = np.concatenate([b["id"] for b in held])
    assert np.array_equal(got, np.tile(np.arange(mixed.num_rows), 2))
    x = np.concatenate([b["x"] for b in held])
    expect = np.stack([rows_of(mixed, "f0"), rows_of(mixed, "f1")], axis=1)
    np.testing.assert_array_equal(x, np.concatenate([expect, expect]))


def test_padded_lists_go_into_pooled_buffers(tmp_path):
    lists = [[float(j) for j in range(i % 7)] for i in range(5000)]
    table = pa.table({"id": np.arange(5000), "tok": pa.array(lists, pa.list_(pa.float32()))})
    loader = al.dataset(table).loader(500, pad_lists=True, pad_value=-1, cache_dir=str(tmp_path))
    held = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        for i, b in enumerate(loader):
            if epoch == 0 and i < 3:
                held.append(b)  # kept: never overwritten by the later batches
            del b
    for b in held:
        for row, i in enumerate(b["id"]):
            n = int(i) % 7
            assert b["tok_lengths"][row] == n
            np.testing.assert_array_equal(b["tok"][row, :n], np.arange(n, dtype=np.float32))
            assert (b["tok"][row, n:] == -1).all()
    assert loader._pool.reused >= 10  # 30 batches: most reuse a released buffer
    assert loader._pool.pooled_bytes <= loader._pool.max_bytes


def test_a_bad_value_fails_the_batch_that_holds_it(tmp_path):
    """A chunk that cannot convert whole is converted batch by batch: the batches before
    the null arrive, then the error names its column."""
    vals = np.arange(10_000, dtype=np.float64)
    f = pa.array(vals, mask=np.arange(10_000) == 7_777)
    loader = al.dataset(pa.table({"id": np.arange(10_000), "f": f})).loader(1000, cache_dir=str(tmp_path))
    got = []
    with pytest.raises(ConversionError, match="'f'"):
        for b in loader:
            got.append(b["id"])
    assert len(got) == 7  # rows 0..6999; the batch of row 7,777 fails


def test_fixed_width_padding_converts_per_read_and_fails_the_right_batch(tmp_path):
    """With pad_to the padded shape no longer depends on the batch: reads are padded whole.
    The values match per-batch padding; a list longer than pad_to fails its own batch."""
    lists = [[float(i)] * (i % 5) for i in range(3000)]
    table = pa.table({"id": np.arange(3000), "tok": pa.array(lists, pa.list_(pa.float32()))})
    got = list(al.dataset(table).loader(256, pad_lists=True, pad_to=6, cache_dir=str(tmp_path)))
    tok = np.concatenate([b["tok"] for b in got])
    assert all(b["tok"].shape[1:] == (6,) for b in got)
    lengths = np.concatenate([b["tok_lengths"] for b in got])
    np.testing.assert_array_equal(lengths, np.arange(3000) % 5)
    expect = np.zeros((3000, 6), np.float32)
    for i in range(3000):
        expect[i, :i % 5] = i
    np.testing.assert_array_equal(tok, expect)

    lists[2000] = [1.0] * 7
    table = pa.table({"id": np.arange(3000), "tok": pa.array(lists, pa.list_(pa.float32()))})
    seen = []
    with pytest.raises(ConversionError, match="pad_to=6"):
        for b in al.dataset(table).loader(256, pad_lists=True, pad_to=6, cache_dir=str(tmp_path)):
            seen.append(b)
    assert len(seen) == 2000 // 256  # the batches before the one holding row 2000


@pytest.mark.parametrize("take", [300, 15_000, 20_011])
@pytest.mark.parametrize("chunks", [1, 7])
def test_gather_from_chunks_dense_and_sparse_is_pyarrows_take(mixed, take, chunks):
    """``ChunkConverter.gather`` straight from a table of several chunks (a block window read
    unit by unit, the memory-mapped cache) and from one: a small gather takes from each
    chunk, a large one (half the table or more) lays the stack group out row-major first.
    Truth: pyarrow's ``take`` of the same rows, stacked with numpy."""
    from arrowload.convert.options import ConvertOptions
    from arrowload.pipeline.chunks import ChunkConverter

    table = pa.Table.from_batches(mixed.to_batches(max_chunksize=-(-mixed.num_rows // chunks)))
    assert table.column("id").num_chunks == chunks
    conv = ChunkConverter(ConvertOptions(), {"x": ["f0", "small", "f1"]}, BufferPool())
    rows = np.random.default_rng(take).permutation(mixed.num_rows)[:take]
    got = conv.gather(table, rows, keep=False)
    truth = mixed.take(pa.array(rows))
    assert list(got.columns) == ["id", "x", "flag", "day", "emb"]
    expect = np.stack([rows_of(truth, c).astype(np.float32) for c in ("f0", "small", "f1")], axis=1)
    np.testing.assert_array_equal(got.columns["x"], expect)
    for name in ("id", "flag", "day", "emb"):
        np.testing.assert_array_equal(got.columns[name], rows_of(truth, name))
        assert got.columns[name].dtype == rows_of(truth, name).dtype
    with pytest.raises(IndexError):
        conv.gather(table, np.array([0, mixed.num_rows]), keep=False)
