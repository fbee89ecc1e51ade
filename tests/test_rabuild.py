"""The random-access table built at decode speed (``pipeline/rabuild``) and the global
shuffle gathering from it.

Truths are outside arrowload: pyarrow's own read of the same Parquet files (or the pyarrow
table the units are sliced from), in the order ``EpochOrder`` computes, stacked with
``numpy.stack``. Every column kind is covered (fixed widths with and without nulls,
fixed-size lists with null lists and null values, strings, decimals, booleans, temporals,
variable-length lists, structs), as are ``stack=`` groups held row-major, groups that
cannot be (nulls, mixed dtypes), the disk cache when the table does not fit, and errors
raised on the building threads.
"""

from __future__ import annotations

import datetime as dt
import glob
import os
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import arrowload as al
from arrowload.order import EpochOrder
from arrowload.pipeline import rabuild
from arrowload.pipeline.rowsource import TableRowSource

FEATS = [f"f{i}" for i in range(16)]


def _mixed_table(n: int, seed: int = 0) -> pa.Table:
    """Every kind of column, nulls in some units only (the first rows are null-free)."""
    rng = np.random.default_rng(seed)
    nulls = rng.random(n) < 0.1
    nulls[:300] = False
    k = 3
    child_nulls = rng.random(n * k) < 0.05
    child_nulls[: 300 * k] = False
    return pa.table({
        "i8": pa.array(rng.integers(-100, 100, n, dtype=np.int8)),
        "u16": pa.array(rng.integers(0, 60000, n, dtype=np.uint16)),
        "i32n": pa.array(rng.integers(-9, 9, n, dtype=np.int32), mask=nulls),
        "i64": pa.array(np.arange(n, dtype=np.int64)),
        "f16": pa.array(rng.standard_normal(n).astype(np.float16)),
        "f32": pa.array(rng.standard_normal(n).astype(np.float32)),
        "f64n": pa.array(rng.standard_normal(n), mask=nulls),
        "b": pa.array(rng.random(n) < 0.5, mask=nulls),
        "d32": pa.array(np.arange(n, dtype=np.int32), pa.date32()),
        "ts": pa.array(np.arange(n, dtype=np.int64) * 1000, pa.timestamp("us", tz="UTC")),
        "dur": pa.array(np.arange(n, dtype=np.int64), pa.duration("ms")),
        "t32": pa.array(np.arange(n, dtype=np.int32) % 86_400, pa.time32("s")),
        "fsl": pa.FixedSizeListArray.from_arrays(
            pa.array(rng.standard_normal(n * k).astype(np.float32), mask=child_nulls), k,
            mask=pa.array(nulls)),
        "s": pa.array([None if m else f"row {i}" for i, m in enumerate(nulls)]),
        "dec": pa.array([None if m else Decimal(i).scaleb(-2) for i, m in enumerate(nulls)], pa.decimal128(12, 2)),
        "lst": pa.array([[i] * (i % 4) for i in range(n)], pa.list_(pa.int32())),
        "st": pa.array([{"a": i, "b": str(i)} for i in range(n)]),
    })


def _units(table: pa.Table, sizes: list[int]):
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    return lambda i: table.slice(int(offsets[i]), sizes[i]), sizes


@pytest.mark.parametrize("threads", [1, 3])
def test_build_equals_the_units_concatenated(threads):
    table = _mixed_table(5_000)
    sizes = [700, 0, 1_300, 999, 1, 2_000]
    read, counts = _units(table, sizes)
    built = rabuild.build(read, counts, table.schema, stack=None, memory_budget=1 << 40, threads=threads)
    assert built.schema == table.schema
    assert built.equals(table)
    for name in ("i64", "f32", "fsl", "ts"):  # fixed widths: one buffer each, built in place
        assert built.column(name).num_chunks == 1
    assert built.column("i32n").null_count == table.column("i32n").null_count > 0
    assert built.column("fsl").null_count == table.column("fsl").null_count > 0
    flat = pc.list_flatten(built.column("fsl"))
    assert flat.null_count == pc.list_flatten(table.column("fsl")).null_count


def test_build_of_units_made_of_several_chunks():
    table = _mixed_table(2_000)

    def read(i):
        part = table.slice(i * 1_000, 1_000)
        return pa.concat_tables([part.slice(0, 333), part.slice(333, 1), part.slice(334)])

    built = rabuild.build(read, [1_000, 1_000], table.schema, stack=None, memory_budget=1 << 40, threads=2)
    assert built.equals(table)


@pytest.mark.parametrize("sizes", [[1_000, 1_500, 500], [1_000, 20_000, 9_001]])
def test_stacked_group_is_held_row_major_once(sizes):
    # units past collate.STACK_BLOCK_BYTES (8,192 rows of 16 float32) are written by row blocks
    n = sum(sizes)
    rng = np.random.default_rng(1)
    feats = {c: rng.standard_normal(n).astype(np.float32) for c in FEATS}
    table = pa.table({"id": np.arange(n), **feats, "label": pa.array(rng.integers(0, 2, n, dtype=np.int8))})
    read, counts = _units(table, sizes)
    built = rabuild.build(read, counts, table.schema, stack={"x": "f*"}, memory_budget=1 << 40, threads=2)
    assert built.schema.names == ["id", "x", "label"]
    field = built.schema.field("x")
    assert field.type == pa.list_(pa.float32(), 16) and rabuild.stacked_members(field) == tuple(FEATS)
    x = built.column("x").chunk(0).values.to_numpy().reshape(n, 16)
    np.testing.assert_array_equal(x, np.stack([feats[c] for c in FEATS], axis=1))
    assert built.nbytes == table.nbytes  # the member columns are not kept twice
    src = TableRowSource(built, unit_rows=1_024, schema=table.schema)
    assert src.read_unit(1).equals(table.slice(1_024, 1_024))
    rows = np.array([n - 1, 0, 17, 1_500, 17, n // 2])
    assert src.gather(rows).equals(table.take(rows))


@pytest.mark.parametrize("n", [2_000, 40_000])
def test_groups_with_nulls_or_mixed_dtypes_keep_their_columns(n):
    rng = np.random.default_rng(2)
    mask = np.zeros(n, dtype=bool)
    mask[n * 3 // 4] = True  # one null, in the last unit
    table = pa.table({
        "a": pa.array(rng.standard_normal(n).astype(np.float32)),
        "b": pa.array(rng.standard_normal(n).astype(np.float32), mask=mask),
        "c": pa.array(rng.integers(0, 9, n, dtype=np.int32)),
        "d": pa.array(rng.standard_normal(n).astype(np.float32)),
    })
    read, counts = _units(table, [n // 2, n - n // 2])
    built = rabuild.build(read, counts, table.schema, stack={"ab": ["a", "b"], "cd": ["c", "d"]},
                          memory_budget=1 << 40, threads=2)
    assert built.equals(table)  # ab had a null: split back; cd mixes int32 and float32
    assert all(rabuild.stacked_members(f) is None for f in built.schema)


def test_over_budget_is_none_before_reading_or_as_soon_as_it_crosses():
    table = _mixed_table(4_000)
    reads = []

    def read(i):
        reads.append(i)
        return table.slice(i * 1_000, 1_000)

    assert rabuild.build(read, [1_000] * 4, table.schema, stack=None, memory_budget=1_000, threads=1) is None
    assert reads == []  # the fixed-width columns alone do not fit: nothing read
    fixed = rabuild.fixed_bytes(table.schema, 4_000)
    assert rabuild.build(read, [1_000] * 4, table.schema, stack=None, memory_budget=fixed + 10, threads=1) is None
    assert reads == [0]  # the strings of the first unit cross it


@pytest.mark.parametrize("size", [5 * 4096 + 17, 3 * 4096, 10 * 4096 + 4095, 4096 * 7 + 1])
@pytest.mark.parametrize("cores", [1, 2, 3])
def test_the_first_touch_writes_one_byte_a_page_on_every_thread_count(monkeypatch, size, cores):
    """``rabuild._touch`` (a table's memory touched before any row is written): a zero at
    every ``_TOUCH``-th byte from the first, nothing else written, whether one thread or
    several (slices of whole pages) touch it."""
    monkeypatch.setattr(rabuild, "_TOUCH_PARALLEL", 4096)
    monkeypatch.setattr(rabuild, "usable_cores", lambda: cores)
    raw = np.full(size, 7, dtype=np.uint8)
    rabuild._touch(raw)
    want = np.full(size, 7, dtype=np.uint8)
    want[::rabuild._TOUCH] = 0
    np.testing.assert_array_equal(raw, want)


def test_an_error_on_a_building_thread_is_raised_to_the_caller():
    table = _mixed_table(3_000)

    def read(i):
        if i == 2:
            raise ValueError("unit 2 is damaged")
        return table.slice(i * 1_000, 1_000)

    with pytest.raises(ValueError, match="unit 2 is damaged"):
        rabuild.build(read, [1_000] * 3, table.schema, stack=None, memory_budget=1 << 40, threads=2)


# ---------------------------------------------------------------------------
# through the loader, against pyarrow's read of the files


def _truth(lake: str, columns: list[str]) -> pa.Table:
    return pq.read_table(sorted(glob.glob(os.path.join(lake, "*.parquet"))), columns=columns)


def test_the_table_of_a_global_shuffle_is_pyarrows_read(parquet_lake, tmp_path):
    """Every column of the events lake (nulls, strings, decimals, lists, temporals)."""
    loader = al.dataset(parquet_lake).loader(100, shuffle="global", output="arrow", cache_dir=str(tmp_path))
    assert loader.source_kind == "table (memory)"
    truth = _truth(parquet_lake, None)
    assert loader._source.table.equals(truth)
    assert loader._source.table.column("emb").num_chunks == 1


@pytest.mark.parametrize("output", ["numpy", "torch"])
def test_stacked_global_batches_are_the_order_layers_rows(parquet_lake, tmp_path, output):
    """Batches, order and dtypes exactly as pyarrow's rows in EpochOrder's permutation,
    stacked with numpy; the table holds the group once, row-major."""
    if output == "torch":
        pytest.importorskip("torch")
    sel = al.dataset(parquet_lake).filter("label = 1").select(*FEATS, "label", "id")
    loader = sel.loader(256, shuffle="global", seed=11, output=output, stack={"x": FEATS},
                        cache_dir=str(tmp_path))
    loader.set_epoch(3)
    assert rabuild.stacked_members(loader._source.table.schema.field("x")) == tuple(FEATS)
    truth = _truth(parquet_lake, [*FEATS, "label", "id"]).filter(pc.equal(pc.field("label"), 1))
    order = EpochOrder(tuple(loader._source.counts), "global", 11, 3).rows(0, truth.num_rows)
    x = np.stack([truth.column(c).to_numpy() for c in FEATS], axis=1)[order]
    ids = truth.column("id").to_numpy()[order]
    got = list(loader)
    assert [list(b) for b in got[:1]] == [["x", "label", "id"]]
    as_np = (lambda t: t) if output == "numpy" else (lambda t: t.numpy())
    np.testing.assert_array_equal(np.concatenate([as_np(b["x"]) for b in got]), x)
    np.testing.assert_array_equal(np.concatenate([as_np(b["id"]) for b in got]), ids)
    assert as_np(got[0]["x"]).dtype == np.float32 and as_np(got[0]["label"]).dtype == np.int8


def test_stack_with_fill_null_and_a_null_member(parquet_lake, tmp_path):
    """score has nulls: its group is not held stacked, and fill_null fills it as before;
    a null-free member named in fill_null stacks and needs no fill."""
    sel = al.dataset(parquet_lake).select("id", "f0", "score", "f1")
    loader = sel.loader(500, shuffle="global", seed=2, stack={"x": ["f0", "score"], "y": ["f1"]},
                        fill_null={"score": -1.0, "f1": 0.0}, cache_dir=str(tmp_path))
    schema = loader._source.table.schema
    assert rabuild.stacked_members(schema.field("y")) == ("f1",) and "x" not in schema.names
    truth = _truth(parquet_lake, ["id", "f0", "score", "f1"])
    order = EpochOrder(tuple(loader._source.counts), "global", 2, 0).rows(0, truth.num_rows)
    score = truth.column("score").fill_null(-1.0).to_numpy()
    expect = np.stack([truth.column("f0").to_numpy().astype(np.float64), score], axis=1)[order]
    got = list(loader)
    np.testing.assert_array_equal(np.concatenate([b["x"] for b in got]), expect)
    np.testing.assert_array_equal(np.concatenate([b["y"] for b in got])[:, 0],
                                  truth.column("f1").to_numpy()[order])
    with pytest.raises(al.ArrowloadError, match="score"):  # without the fill: refused at build, as before
        sel.loader(500, shuffle="global", stack={"x": ["f0", "score"]}, cache_dir=str(tmp_path))


def test_transform_and_arrow_output_see_the_plans_columns(parquet_lake, tmp_path):
    sel = al.dataset(parquet_lake).select("id", "f0", "f1")
    seen = []

    def spy(batch):
        seen.append(batch.schema.names)
        return batch

    loader = sel.loader(4_000, shuffle="global", stack={"x": ["f0", "f1"]}, transform=spy,
                        cache_dir=str(tmp_path))
    batch = next(iter(loader))
    assert seen[0] == ["id", "f0", "f1"] and batch["x"].shape == (4_000, 2)
    arrow = sel.loader(4_000, shuffle="global", output="arrow", cache_dir=str(tmp_path))
    assert next(iter(arrow)).schema.names == ["id", "f0", "f1"]


def test_spill_to_the_disk_cache_gives_the_same_batches(parquet_lake, tmp_path):
    sel = al.dataset(parquet_lake).select("id", *FEATS[:4])
    kw = {"shuffle": "global", "seed": 5, "stack": {"x": FEATS[:4]}, "cache_dir": str(tmp_path)}
    memory = sel.loader(1_000, **kw)
    disk = sel.loader(1_000, memory_budget=1 << 16, **kw)
    assert memory.source_kind == "table (memory)" and disk.source_kind.endswith(".arrow)")
    # the cache file holds the plan's columns (formats/ra_cache unchanged)
    assert disk._source.table.schema.names == ["id", *FEATS[:4]]
    for a, b in zip(memory, disk, strict=True):
        np.testing.assert_array_equal(a["id"], b["id"])
        np.testing.assert_array_equal(a["x"], b["x"])


def test_strings_past_the_budget_spill(tmp_path):
    """The fixed-width part fits, the strings do not: the build stops and the selection
    goes to the disk cache, whole and in order."""
    n = 20_000
    table = pa.table({"id": np.arange(n), "s": [f"{i:08d}" * 40 for i in range(n)]})
    lake = tmp_path / "lake"
    lake.mkdir()
    pq.write_table(table, lake / "a.parquet", row_group_size=2_000)
    budget = n * 8 + 1_000_000  # ids fit, 6.4 MB of strings do not
    loader = al.dataset(str(lake)).loader(1_000, shuffle="global", memory_budget=budget,
                                          cache_dir=str(tmp_path / "cache"))
    assert loader.source_kind.endswith(".arrow)")
    assert loader._source.table.equals(table)
    ids = np.concatenate([b["id"] for b in loader])
    np.testing.assert_array_equal(np.sort(ids), np.arange(n))
    with pytest.raises(al.MemoryBudgetError):
        from arrowload.pipeline.rowsource import materialize
        ds = al.dataset(str(lake))
        materialize(ds.optimized_plan(), ds.options, memory_budget=budget, cache_dir=None, reuse=False)


def test_temporal_and_boolean_columns_through_a_global_shuffle(tmp_path):
    n = 5_000
    table = pa.table({
        "id": np.arange(n),
        "day": pa.array([dt.date(2024, 1, 1) + dt.timedelta(days=i % 400) for i in range(n)]),
        "ts": pa.array(np.arange(n, dtype=np.int64) * 10**6, pa.timestamp("us")),
        "flag": pa.array(np.arange(n) % 3 == 0),
    })
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=700)
    loader = al.dataset(str(tmp_path / "t.parquet")).loader(999, shuffle="global", seed=1,
                                                             cache_dir=str(tmp_path / "c"))
    order = EpochOrder(tuple(loader._source.counts), "global", 1, 0).rows(0, n)
    got = list(loader)
    for name in ("day", "ts", "flag"):
        expect = table.column(name).to_numpy()[order]
        np.testing.assert_array_equal(np.concatenate([b[name] for b in got]), expect)
    assert got[0]["day"].dtype == np.dtype("datetime64[D]")


def test_groups_are_not_stacked_beside_columns_gathered_with_arrow():
    """A string column sends every gather through Arrow: the group stays as its columns."""
    n = 1_000
    table = pa.table({"s": [str(i) for i in range(n)], "a": np.arange(n, dtype=np.float64),
                      "b": np.arange(n, dtype=np.float64)})
    read, counts = _units(table, [600, 400])
    built = rabuild.build(read, counts, table.schema, stack={"x": ["a", "b"]}, memory_budget=1 << 40)
    assert built.schema == table.schema and built.equals(table)


@pytest.mark.parametrize("case", ["floats with nulls", "ints", "list with nulls inside and out", "a slice",
                                  "timestamps"])
def test_fixed_put_by_position_equals_put_of_the_taken_rows(case):
    """``_Fixed.put(arr, at, rows)`` (a mixture's rows written from a stream batch by
    position) leaves the buffer and its masks as ``put`` of ``arr.take(rows)`` does."""
    rng = np.random.default_rng(5)
    n = 1000
    if case == "floats with nulls":
        arr = pa.array(np.where(rng.random(n) < 0.2, None, rng.standard_normal(n)).tolist(), pa.float32())
    elif case == "ints":
        arr = pa.array(rng.integers(-9, 9, n), pa.int16())
    elif case == "list with nulls inside and out":
        leaf = pa.array(np.where(rng.random(4 * n) < 0.1, None, rng.standard_normal(4 * n)).tolist(), pa.float64())
        arr = pa.FixedSizeListArray.from_arrays(leaf, 4, mask=pa.array(rng.random(n) < 0.1))
    elif case == "a slice":
        arr = pa.array(rng.standard_normal(n + 37), pa.float64()).slice(37)
    else:
        arr = pa.array(rng.integers(0, 10**12, n), pa.timestamp("us"))
    rows = np.sort(rng.choice(n, 300, replace=False))
    by_position, taken = rabuild._Fixed("c", arr.type, 400), rabuild._Fixed("c", arr.type, 400)
    by_position.put(arr, 50, rows)
    taken.put(arr.take(pa.array(rows)), 50)
    want = taken.array().slice(50, 300)
    got = by_position.array().slice(50, 300)
    assert got.equals(want) and got.equals(arr.take(pa.array(rows)))
