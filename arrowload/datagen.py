"""Deterministic synthetic lakes for the demo, the tests and the benchmarks.

``write_lake("lake/events", rows=200_000, shards=8)`` writes zstd Parquet shards of an
"events" table whose ``id`` and ``ts`` increase with the row number (so range filters
on them are selective and row-group statistics can prune), with a skewed ``country``,
a binary ``label``, float32 features ``f0..f{k-1}``, a fixed-size-list embedding
``emb``, a decimal ``price``, a date ``day``, free ``text`` and some nulls.
"""

from __future__ import annotations

import datetime as dt
import os
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

COUNTRIES = ["US", "DE", "IN", "BR", "FR", "GB", "JP", "CA", "NG", "MX"]
_COUNTRY_P = np.array([0.35, 0.15, 0.12, 0.08, 0.07, 0.07, 0.06, 0.05, 0.03, 0.02])
START = dt.datetime(2024, 1, 1)


def events_table(rows: int, *, start_id: int = 0, seed: int = 0, features: int = 16,
                 emb_dim: int = 64, nulls: bool = True) -> pa.Table:
    """``rows`` events with ids ``start_id..start_id+rows-1``; same arguments, same table."""
    rng = np.random.default_rng([seed, start_id])
    ids = np.arange(start_id, start_id + rows, dtype=np.int64)
    ts = (np.datetime64(START, "us") + (ids * 37_000_000).astype("timedelta64[us]"))
    country = np.array(COUNTRIES, dtype=object)[rng.choice(len(COUNTRIES), rows, p=_COUNTRY_P)]
    label = (rng.random(rows) < 0.2).astype(np.int8)
    cols: dict[str, pa.Array] = {
        "id": pa.array(ids),
        "ts": pa.array(ts, pa.timestamp("us")),
        "day": pc.cast(pa.array(ts, pa.timestamp("us")), pa.date32()),
        "user_id": pa.array(rng.integers(0, max(rows // 10, 1), rows, dtype=np.int64)),
        "country": pa.array(country, pa.string()),
        "label": pa.array(label),
    }
    feats = rng.standard_normal((rows, features), dtype=np.float32)
    for i in range(features):
        cols[f"f{i}"] = pa.array(feats[:, i])
    if emb_dim:
        emb = rng.standard_normal(rows * emb_dim, dtype=np.float32)
        cols["emb"] = pa.FixedSizeListArray.from_arrays(pa.array(emb), emb_dim)
    cents = rng.integers(1, 10_000, rows)
    cols["price"] = pa.array([Decimal(int(c)).scaleb(-2) for c in cents], pa.decimal128(10, 2))
    words = np.array(["alpha", "beta", "gamma", "delta", "eps"], dtype=object)
    cols["text"] = pa.array([f"{a} {b}" for a, b in zip(words[rng.integers(0, 5, rows)],
                                                          words[rng.integers(0, 5, rows)])])
    if nulls and rows:
        mask = rng.random(rows) < 0.02
        cols["score"] = pa.array(np.where(mask, np.nan, rng.random(rows)), pa.float64(),
                                 mask=mask)
        cmask = rng.random(rows) < 0.01
        cols["country"] = pa.array(country, pa.string(), mask=cmask)
    return pa.table(cols)


def write_lake(path: str | os.PathLike, rows: int = 200_000, shards: int = 8, *,
               row_group_size: int = 16_384, partition_by: str | None = None,
               compression: str = "zstd", seed: int = 0, features: int = 16,
               emb_dim: int = 64, nulls: bool = True, filesystem=None) -> list[str]:
    """Write the events table as ``shards`` Parquet files under ``path``
    (``part-00000.parquet`` ...); with ``partition_by`` (e.g. ``"country"``), as hive
    folders ``country=US/part-00000.parquet``. Returns the written paths, sorted."""
    path = os.fspath(path)
    fs = filesystem
    if fs is None:
        os.makedirs(path, exist_ok=True)
    written = []
    per = -(-rows // shards) if shards else 0
    for s in range(shards):
        lo, hi = s * per, min(rows, (s + 1) * per)
        if lo >= hi:
            break
        table = events_table(hi - lo, start_id=lo, seed=seed, features=features,
                             emb_dim=emb_dim, nulls=nulls)
        groups = [(None, table)]
        if partition_by is not None:
            keys = pc.unique(table.column(partition_by)).to_pylist()
            groups = [(k, table.filter(pc.is_null(table.column(partition_by)) if k is None
                                       else pc.equal(table.column(partition_by), k))
                       .drop_columns([partition_by])) for k in sorted(keys, key=lambda v: (v is None, v))]
        for key, part in groups:
            folder = path if partition_by is None else \
                f"{path}/{partition_by}={'__HIVE_DEFAULT_PARTITION__' if key is None else key}"
            target = f"{folder}/part-{s:05d}.parquet"
            if fs is None:
                os.makedirs(folder, exist_ok=True)
                pq.write_table(part, target, row_group_size=row_group_size, compression=compression)
            else:
                with fs.open(target, "wb") as f:
                    pq.write_table(part, f, row_group_size=row_group_size, compression=compression)
            written.append(target)
    return sorted(written)
