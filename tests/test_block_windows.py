"""Block-shuffle windows read from a scan: every way a window reaches the batches gives
the order layer's rows exactly.

A task over a whole window scatters each unit to its places as it is read; part of a
window (a rank's ends, a resume) is laid out and gathered; columns without host arrays
(strings) or ``output="arrow"`` take with Arrow. Truth: ``EpochOrder.rows`` over
pyarrow's own read of the same files, in source order (files by path, row groups, rows).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import arrowload as al
from arrowload.order import EpochOrder

FILES, PER_FILE, ROW_GROUP = 3, 700, 128
FLOATS = [f"f{i}" for i in range(4)]


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("block_lake")
    rng = np.random.default_rng(1)
    for i in range(FILES):
        n = PER_FILE
        ids = np.arange(i * n, (i + 1) * n, dtype=np.int64)
        cols = {"id": ids}
        for f in FLOATS:
            cols[f] = rng.standard_normal(n).astype(np.float32)
        cols["flag"] = ids % 3 == 0
        cols["small"] = (ids % 100).astype(np.int8)
        cols["emb"] = pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(3 * n).astype(np.float32)), 3)
        cols["score"] = pa.array([None if k % 7 == 0 else float(k) for k in ids.tolist()], pa.float64())
        cols["name"] = pa.array([f"n{k}" for k in ids.tolist()])
        pq.write_table(pa.table(cols), path / f"part-{i}.parquet", row_group_size=ROW_GROUP)
    return str(path)


def truth(lake: str) -> pa.Table:
    return pa.concat_tables(pq.read_table(f"{lake}/part-{i}.parquet") for i in range(FILES))


def expected_rows(loader, epoch: int, window: int, seed: int, start: int, stop: int) -> np.ndarray:
    counts = tuple(loader._source.counts)
    return EpochOrder(counts, "block", seed=seed, epoch=epoch, window=window).rows(start, stop)


def check_batches(batches: list[dict], table: pa.Table, rows: np.ndarray, stacked: bool) -> None:
    got_ids = np.concatenate([np.asarray(b["id"]) for b in batches])
    want = table.take(pa.array(rows))
    np.testing.assert_array_equal(got_ids, want.column("id").to_numpy())
    if stacked:
        x = np.concatenate([np.asarray(b["x"]) for b in batches])
        assert x.shape == (len(rows), len(FLOATS))
        for j, f in enumerate(FLOATS):
            np.testing.assert_array_equal(x[:, j], want.column(f).to_numpy())
    else:
        for f in FLOATS:
            np.testing.assert_array_equal(np.concatenate([np.asarray(b[f]) for b in batches]),
                                          want.column(f).to_numpy())
    np.testing.assert_array_equal(np.concatenate([np.asarray(b["flag"]) for b in batches]),
                                  want.column("flag").to_numpy(zero_copy_only=False))
    np.testing.assert_array_equal(np.concatenate([np.asarray(b["small"]) for b in batches]),
                                  want.column("small").to_numpy())
    emb = np.concatenate([np.asarray(b["emb"]) for b in batches])
    np.testing.assert_array_equal(emb, np.stack(want.column("emb").to_numpy(zero_copy_only=False)))


@pytest.mark.parametrize("stack", [True, False])
@pytest.mark.parametrize("window", [1, 3, 40])
def test_whole_windows_scatter_to_the_order(lake, tmp_path, stack, window):
    """One rank, whole windows (a window of 40 row groups holds the whole lake)."""
    cols = ["id", *FLOATS, "flag", "small", "emb"]
    kw = {"stack": {"x": FLOATS}} if stack else {}
    loader = al.dataset(lake).select(*cols).loader(50, shuffle="block", shuffle_window=window, seed=3,
                                                    cache_dir=str(tmp_path), io_threads=2, **kw)
    loader.set_epoch(1)
    batches = list(loader)
    n = FILES * PER_FILE
    check_batches(batches, truth(lake), expected_rows(loader, 1, window, 3, 0, n), stack)
    assert loader.stats().bytes_read > 0


@pytest.mark.parametrize("rank", [0, 1, 2, 3])
def test_a_rank_reads_parts_of_windows_at_its_ends(lake, tmp_path, rank):
    """Four ranks cut windows (525 rows each; windows end at 316, 700, 1084, ...): a rank's
    first and last windows are partly its own."""
    cols = ["id", *FLOATS, "flag", "small", "emb"]
    loader = al.dataset(lake).select(*cols).loader(64, shuffle="block", shuffle_window=3, seed=9, rank=rank,
                                                    world_size=4, stack={"x": FLOATS}, cache_dir=str(tmp_path))
    start, stop = loader._rank_rows()
    offsets = loader._order(0).window_offsets
    assert start not in offsets or stop not in offsets  # at least one end inside a window
    check_batches(list(loader), truth(lake), expected_rows(loader, 0, 3, 9, start, stop), True)


def test_resume_mid_window(lake, tmp_path):
    """A state taken mid-window resumes with that window's remaining positions (part of it)."""
    cols = ["id", *FLOATS, "flag", "small", "emb"]

    def build():
        return al.dataset(lake).select(*cols).loader(70, shuffle="block", shuffle_window=4, seed=2,
                                                      stack={"x": FLOATS}, cache_dir=str(tmp_path))

    first = build()
    it = iter(first)
    for _ in range(5):
        next(it)
    state = first.state_dict()
    it.close()
    second = build()
    second.load_state_dict(state)
    rest = list(second)
    n = FILES * PER_FILE
    check_batches(rest, truth(lake), expected_rows(second, 0, 4, 2, 5 * 70, n), True)


def test_filled_nulls_and_strings_follow_the_order(lake, tmp_path):
    """A column with nulls filled (placed through host arrays) and a string column (no host
    arrays: Arrow's take) give the same rows as the order."""
    loader = al.dataset(lake).select("id", "score", "name").loader(
        100, shuffle="block", shuffle_window=2, seed=5, fill_null={"score": -1.0}, cache_dir=str(tmp_path))
    batches = list(loader)
    rows = expected_rows(loader, 0, 2, 5, 0, FILES * PER_FILE)
    want = truth(lake).take(pa.array(rows))
    np.testing.assert_array_equal(np.concatenate([b["id"] for b in batches]), want.column("id").to_numpy())
    np.testing.assert_array_equal(np.concatenate([b["score"] for b in batches]),
                                  want.column("score").fill_null(-1.0).to_numpy())
    assert [s for b in batches for s in b["name"]] == want.column("name").to_pylist()

    filled = al.dataset(lake).select("id", "score").loader(
        100, shuffle="block", shuffle_window=2, seed=5, fill_null={"score": -1.0}, cache_dir=str(tmp_path))
    got = [b["score"] for b in filled]
    np.testing.assert_array_equal(np.concatenate(got), want.column("score").fill_null(-1.0).to_numpy())


def test_arrow_output_takes_with_arrow(lake, tmp_path):
    loader = al.dataset(lake).select("id", "f0").loader(90, shuffle="block", shuffle_window=3, seed=1,
                                                        output="arrow", cache_dir=str(tmp_path))
    got = pa.Table.from_batches(list(loader))
    rows = expected_rows(loader, 0, 3, 1, 0, FILES * PER_FILE)
    assert got.equals(truth(lake).select(["id", "f0"]).take(pa.array(rows)))
