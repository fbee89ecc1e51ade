"""What the loader can know when it is built, it checks then: ``stack=`` names, ragged
list columns, nulls (exactly on the random-access table of a global shuffle; from
Parquet footers where every row of the kept row groups is selected). And a plain
``list<float>`` embedding column -- what pandas and pyarrow write -- is a ``[batch, k]``
array, so the README's loader example works as written on such a lake.

Truths: pyarrow's own read of the files (values per ``id``), DuckDB for the filter.
"""

from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import arrowload as al

K = 16


def _frame(rng, n: int, start: int, k: int = K) -> pd.DataFrame:
    return pd.DataFrame({
        "id": np.arange(start, start + n, dtype=np.int64),
        "f0": rng.random(n, dtype=np.float32),
        "f1": rng.random(n, dtype=np.float32),
        "emb": [rng.random(k, dtype=np.float32) for _ in range(n)],
        "label": rng.integers(0, 2, n).astype(np.int8),
        "country": rng.choice(["US", "DE", "FR", "JP"], n),
    })


@pytest.fixture(scope="module")
def pandas_lake(tmp_path_factory) -> str:
    """Three shards written by pandas: ``emb`` is a plain ``list<float>``."""
    path = tmp_path_factory.mktemp("pandas_lake")
    rng = np.random.default_rng(0)
    for i in range(3):
        _frame(rng, 1_300, i * 1_300).to_parquet(path / f"part-{i}.parquet", row_group_size=400)
    assert pa.types.is_list(pq.read_schema(path / "part-0.parquet").field("emb").type)
    return str(path)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("build_checks_cache"))


def _truth(lake: str, where: str) -> dict[int, np.ndarray]:
    ids = duckdb.sql(f"SELECT id FROM read_parquet('{lake}/*.parquet') WHERE {where}").fetchnumpy()["id"]
    table = pq.read_table(lake)
    keep = set(ids.tolist())
    embs = table.column("emb").to_pylist()
    return {i: np.asarray(e, np.float32) for i, e in zip(table.column("id").to_pylist(), embs) if i in keep}


@pytest.mark.parametrize("output", ["numpy", "torch", "jax"])
@pytest.mark.parametrize("shuffle", [True, "block", False])
def test_readme_loader_example_on_a_plain_list_embedding(pandas_lake, cache, output, shuffle):
    ds = al.dataset(pandas_lake)
    # the README's example, as written (plus id, to check values)
    train = ds.filter("country IN ('US', 'DE')").select("id", "f0", "f1", "emb", "label")
    loader = train.loader(batch_size=256, shuffle=shuffle, seed=0, drop_last=True, output=output,
                          stack={"x": ["f0", "f1"]}, cache_dir=cache)
    truth = _truth(pandas_lake, "country IN ('US', 'DE')")
    seen = 0
    for batch in loader:
        assert tuple(batch["x"].shape) == (256, 2) and tuple(batch["emb"].shape) == (256, K)
        assert tuple(batch["label"].shape) == (256,)
        ids = np.asarray(batch["id"])
        emb = np.asarray(batch["emb"])
        assert emb.dtype == np.float32
        for i, row in zip(ids.tolist(), emb):
            assert np.array_equal(row, truth[i])
        seen += len(ids)
    assert seen == len(truth) // 256 * 256 and seen > 0


def test_readme_loader_example_exactly(pandas_lake, cache):
    ds = al.dataset(pandas_lake)
    train = ds.filter("country IN ('US', 'DE')").select("f0", "f1", "emb", "label")
    loader = train.loader(batch_size=1024, shuffle=True, seed=0, drop_last=True, output="torch",
                          stack={"x": ["f0", "f1"]}, cache_dir=cache)
    batch = next(iter(loader))
    assert {k: tuple(v.shape) for k, v in batch.items()} == {"x": (1024, 2), "emb": (1024, K), "label": (1024,)}


@pytest.fixture(scope="module")
def ragged_lake(tmp_path_factory) -> str:
    """``tok``: lists of 1..5 values; ``emb``: lists of K values."""
    path = tmp_path_factory.mktemp("ragged_lake")
    rng = np.random.default_rng(1)
    for i in range(2):
        frame = _frame(rng, 500, i * 500)
        frame["tok"] = [np.arange(rng.integers(1, 6), dtype=np.int32) for _ in range(500)]
        frame.to_parquet(path / f"part-{i}.parquet", row_group_size=250)
    return str(path)


def test_a_ragged_list_without_pad_lists_fails_at_build_for_a_global_shuffle(ragged_lake, cache):
    ds = al.dataset(ragged_lake).filter("label = 1").select("id", "tok")
    with pytest.raises(al.ArrowloadError) as info:
        ds.loader(64, shuffle="global", cache_dir=cache)  # built, never iterated
    message = str(info.value)
    assert isinstance(info.value, ValueError) and info.value.column == "tok"
    assert "'tok'" in message and "lengths 1 to 5" in message and "pad_lists=True, pad_to=5" in message
    padded = ds.loader(64, shuffle="global", pad_lists=True, pad_to=5, cache_dir=cache)
    batch = next(iter(padded))
    assert batch["tok"].shape == (64, 5) and batch["tok_lengths"].max() <= 5


def test_a_ragged_list_fails_at_build_from_parquet_footers(ragged_lake, cache):
    ds = al.dataset(ragged_lake).select("id", "tok")
    with pytest.raises(al.ArrowloadError, match="'tok'.*Parquet footer") as info:
        ds.loader(64, shuffle="block", cache_dir=cache)
    assert "pad_lists=True" in str(info.value)
    # the uniform column of the same files is fine
    assert next(iter(al.dataset(ragged_lake).select("emb").loader(64, cache_dir=cache)))["emb"].shape == (64, K)


def test_a_ragged_list_behind_a_filter_fails_at_its_first_batch_naming_lengths(ragged_lake, cache):
    ds = al.dataset(ragged_lake).filter("label = 1").select("id", "tok")
    loader = ds.loader(64, shuffle="none", cache_dir=cache)  # footers do not describe filtered rows
    with pytest.raises(al.ArrowloadError, match=r"'tok'.*lengths \d to \d"):
        list(loader)


@pytest.fixture(scope="module")
def two_widths_lake(tmp_path_factory) -> str:
    """Uniform lists in each file, of width 3 in one and 5 in the other."""
    path = tmp_path_factory.mktemp("two_widths")
    rng = np.random.default_rng(2)
    _frame(rng, 300, 0, k=3).to_parquet(path / "a.parquet", row_group_size=100)
    _frame(rng, 300, 300, k=5).to_parquet(path / "b.parquet", row_group_size=100)
    return str(path)


def test_lists_of_two_widths_never_give_batches_of_two_shapes(two_widths_lake, cache):
    with pytest.raises(al.ArrowloadError, match="'emb'.*3 values.*5"):
        al.dataset(two_widths_lake).select("id", "emb").loader(50, cache_dir=cache)  # footers
    with pytest.raises(al.ArrowloadError, match="'emb'.*lengths 3 to 5"):
        al.dataset(two_widths_lake).filter("id >= 0").loader(50, shuffle="global", cache_dir=cache)
    loader = al.dataset(two_widths_lake).filter("id >= 0").select("id", "emb").loader(50, cache_dir=cache)
    shapes = []
    with pytest.raises(al.ArrowloadError, match="'emb'.*5 values in this batch and 3 in earlier ones"):
        for batch in loader:
            shapes.append(batch["emb"].shape)
    assert shapes == [(50, 3)] * 6  # every batch before the error had the first width


@pytest.fixture(scope="module")
def null_lake(tmp_path_factory) -> str:
    """``f0`` has nulls in one row group of one file (statistics record them)."""
    path = tmp_path_factory.mktemp("null_lake")
    rng = np.random.default_rng(3)
    for i in range(2):
        frame = _frame(rng, 400, i * 400)
        table = pa.Table.from_pandas(frame, preserve_index=False)
        if i == 1:
            f0 = table.column("f0").to_numpy().astype(object)
            f0[[350, 360]] = None
            table = table.set_column(table.schema.get_field_index("f0"), "f0", pa.array(f0, pa.float32()))
        pq.write_table(table, path / f"part-{i}.parquet", row_group_size=100)
    assert pq.ParquetFile(path / "part-1.parquet").metadata.row_group(3).column(1).statistics.null_count == 2
    return str(path)


@pytest.mark.parametrize("shuffle", ["none", "block"])
def test_nulls_known_from_footer_statistics_fail_at_build(null_lake, cache, shuffle):
    ds = al.dataset(null_lake).select("id", "f0", "f1")
    with pytest.raises(al.ArrowloadError) as info:
        ds.loader(64, shuffle=shuffle, cache_dir=cache)
    message = str(info.value)
    assert isinstance(info.value, ValueError) and info.value.column == "f0"
    assert "part-1.parquet, row group 3" in message and "fill_null" in message
    filled = ds.loader(64, shuffle=shuffle, fill_null={"f0": -1.0}, cache_dir=cache)
    values = np.concatenate([b["f0"] for b in filled])
    assert (values == -1.0).sum() == 2


@pytest.mark.parametrize("pick", [lambda d: d.select("id", "f0", "f1", "label").select("id", "f0"),
                                  lambda d: d.select("id", "f0", "f1").select(a="f0", b="id")])
def test_nulls_from_footers_fail_at_build_after_selects_of_selects(null_lake, cache, pick):
    """Columns picked from a selection kept a projection above the scan, and the footer
    check (which reads a bare scan) was skipped: the nulls failed at the first batch."""
    with pytest.raises(al.ArrowloadError, match="part-1.parquet, row group 3"):
        pick(al.dataset(null_lake)).loader(64, cache_dir=cache)
    plan = pick(al.dataset(null_lake)).optimized_plan()
    assert type(plan).__name__ == "Scan"


def test_nulls_fail_at_build_before_a_global_shuffle_iterates(null_lake, cache):
    ds = al.dataset(null_lake).filter("label >= 0").select("id", "f0", "f1")
    with pytest.raises(al.ArrowloadError, match="'f0'.* 2 null"):
        ds.loader(64, shuffle="global", cache_dir=cache)
    stacked = al.dataset(null_lake).filter("label >= 0").select("id", "f0", "f1")
    with pytest.raises(al.ArrowloadError, match="'f0'"):
        stacked.loader(64, shuffle="global", stack={"x": ["f0", "f1"]}, cache_dir=cache)


def test_no_false_alarm_where_a_filter_removes_the_nulls(null_lake, cache):
    ds = al.dataset(null_lake).filter("f0 IS NOT NULL").select("id", "f0")
    for shuffle in ("none", "block", "global"):
        got = np.concatenate([b["id"] for b in ds.loader(64, shuffle=shuffle, cache_dir=cache)])
        truth = duckdb.sql(f"SELECT id FROM read_parquet('{null_lake}/*.parquet') WHERE f0 IS NOT NULL"
                           ).fetchnumpy()["id"]
        assert sorted(got.tolist()) == sorted(truth.tolist())


def test_option_names_are_checked_at_build(pandas_lake, cache):
    ds = al.dataset(pandas_lake).select("id", "f0", "f1", "emb")
    with pytest.raises(al.ColumnNotFoundError, match="'f2'.*did you mean") as info:
        ds.loader(64, shuffle="global", stack={"x": ["f0", "f2"]}, cache_dir=cache)
    assert isinstance(info.value, KeyError)
    with pytest.raises(al.ColumnNotFoundError, match="'embb'"):
        ds.loader(64, pad_lists=("embb",), cache_dir=cache)
    with pytest.raises(al.ColumnNotFoundError, match="'F0'"):
        ds.loader(64, fill_null={"F0": 0.0}, cache_dir=cache)


def test_footer_facts_fail_before_a_global_shuffle_reads_the_selection(null_lake, tmp_path):
    ds = al.dataset(null_lake).select("id", "f0")
    with pytest.raises(al.ArrowloadError, match="'f0'.*Parquet footer"):
        ds.loader(64, shuffle="global", memory_budget=1, cache_dir=str(tmp_path))
    assert not list(tmp_path.glob("ra-*")) and not list(tmp_path.glob(".tmp-ra-*"))  # nothing was gathered


@pytest.mark.parametrize("shuffle", [False, "global"])
@pytest.mark.parametrize("fill,match", [({"f0": "a"}, "does not fit its type float"),
                                        ({"label": 300}, "does not fit its type int8"),
                                        ({"*": "zero"}, "does not fit"),
                                        ({"f0": None}, "is None")])
def test_fill_null_values_are_checked_against_their_columns_at_build(pandas_lake, cache, shuffle, fill, match):
    """A value that cannot fill its column failed only at the first batch holding a null
    (on a global shuffle after the whole table was built), as a ConversionError."""
    with pytest.raises(al.InvalidArgumentError, match=match) as got:
        al.dataset(pandas_lake).select("id", "f0", "label").loader(16, shuffle=shuffle, fill_null=fill,
                                                                   cache_dir=cache)
    assert got.value.argument == "fill_null"


def test_a_device_that_is_not_one_is_an_invalid_argument(pandas_lake, cache):
    pytest.importorskip("torch")
    with pytest.raises(al.InvalidArgumentError, match="not a torch device") as got:
        al.dataset(pandas_lake).select("id").loader(16, output="torch", device="nope", cache_dir=cache)
    assert got.value.argument == "device"


def test_a_mixture_component_without_rows_is_named_by_explain_and_len(pandas_lake, cache):
    """``explain()`` and ``len()`` raised a bare ValueError naming the component by index."""
    ds = al.dataset(pandas_lake)
    m = al.mix({"us": ds.filter("country = 'US'"), "none": ds.filter("country = 'XX'")},
               weights={"us": 0.5, "none": 0.5}, cache_dir=cache)
    for ask in (m.explain, lambda: len(m), lambda: m.loader(8)):
        with pytest.raises(al.InvalidArgumentError, match="component 'none' selects no rows"):
            ask()
