"""The loader over object storage: a real S3 API (moto's server on 127.0.0.1), read through
s3fs exactly as a user would (``storage_options``). Same coverage and resume guarantees as
on local disk; ``shuffle=True`` streams there, so it must pick (and say) ``"block"``.

The truth is DuckDB over a local copy of the very files uploaded.
"""

from __future__ import annotations

import glob
import json
import os
import re

import duckdb
import numpy as np
import pytest

import arrowload as al
from arrowload.datagen import write_lake

from _support import moto_s3_server

BUCKET = "arrowload-loader-test"  # moto keeps one backend per process: a bucket name of its own
PRED = "label = 0 OR f0 > 1.0"


@pytest.fixture(scope="module")
def s3_lake(tmp_path_factory):
    """(storage_options, s3 URI, local copy) of a small lake uploaded to moto."""
    import s3fs
    local = tmp_path_factory.mktemp("s3_lake_local")
    write_lake(local, rows=3_001, shards=3, row_group_size=250, features=2, emb_dim=4)
    with moto_s3_server() as url:
        options = {"endpoint_url": url, "key": "testing", "secret": "testing"}
        fs = s3fs.S3FileSystem(**options)
        fs.mkdir(BUCKET)
        for path in sorted(glob.glob(str(local / "*.parquet"))):
            fs.put(path, f"{BUCKET}/lake/{os.path.basename(path)}")
        yield options, f"s3://{BUCKET}/lake/", str(local)


def truth_ids(local: str) -> np.ndarray:
    pattern = os.path.join(local, "*.parquet").replace("'", "''")
    con = duckdb.connect()
    try:
        return con.sql(f"SELECT id FROM read_parquet('{pattern}', filename=true, file_row_number=true) "
                       f"WHERE {PRED} ORDER BY filename, file_row_number").fetchnumpy()["id"]
    finally:
        con.close()


def build(s3_lake, cache_dir, **kw):
    options, uri, _ = s3_lake
    ds = al.dataset(uri, storage_options=options).filter(PRED).select("id", "f0", "label")
    return ds.loader(64, cache_dir=str(cache_dir), **kw)


def collect(loader) -> list[np.ndarray]:
    return [np.asarray(b["id"]).copy() for b in loader]


def test_shuffle_true_streams_blocks_from_object_storage(s3_lake, tmp_path):
    loader = build(s3_lake, tmp_path, shuffle=True)
    assert loader.shuffle_kind == "block"
    assert "shuffle='block'" in repr(loader)
    assert re.search(r"shuffle\s+block", loader.explain())


@pytest.mark.parametrize("shuffle", [False, True])
def test_every_row_once_across_ranks_on_s3(s3_lake, tmp_path, shuffle):
    truth = truth_ids(s3_lake[2])
    n, world = len(truth), 2
    per = n // world
    seen = []
    for rank in range(world):
        loader = build(s3_lake, tmp_path, shuffle=shuffle, seed=4, rank=rank, world_size=world)
        batches = collect(loader)
        assert len(batches) == len(loader)
        assert all(len(b) == 64 for b in batches[:-1])
        ids = np.concatenate(batches)
        assert len(ids) == per
        if not shuffle:
            assert np.array_equal(ids, truth[rank * per:(rank + 1) * per])
        seen.append(ids)
    everything = np.concatenate(seen)
    assert len(np.unique(everything)) == len(everything) == n - n % world
    assert np.isin(everything, truth).all()
    if shuffle:
        assert not np.array_equal(np.sort(seen[0]), seen[0])


def test_resume_on_s3(s3_lake, tmp_path):
    full = collect(build(s3_lake, tmp_path, shuffle=True, seed=2, rank=1, world_size=2))
    n = len(full)
    for k in (0, n // 2, n):
        loader = build(s3_lake, tmp_path, shuffle=True, seed=2, rank=1, world_size=2)
        it = iter(loader)
        for _ in range(k):
            next(it)
        state = json.loads(json.dumps(loader.state_dict()))
        it.close()
        assert state["shuffle"] == "block"
        fresh = build(s3_lake, tmp_path, shuffle=True, seed=2, rank=1, world_size=2)
        fresh.load_state_dict(state)
        rest = collect(fresh)
        assert len(rest) == n - k
        assert all(np.array_equal(a, b) for a, b in zip(rest, full[k:]))
