#!/usr/bin/env python
"""Lance, over a copy of the lake converted once (``lance.write_dataset`` of the whole
table, every column; prepared by the harness, its time reported with the data):
``dataset.scanner(columns=..., filter="<the SQL filter>", batch_size=B,
scan_in_order=True).to_batches()``, re-cut to exact B-row batches, stacked to x[B, 16]
(``np.stack``).

- W3: global shuffle by random access: ``take`` of a permutation slice per batch.
- W5: ``scanner(offset=n)``.
"""

from __future__ import annotations

import sys

import lance
import numpy as np
import pyarrow.dataset as pads

from benchlib import WORKLOADS, arrow_xy, filter_sql, main, rebatch


def prepare(lake: str, uri: str) -> None:
    """Convert the Parquet lake at ``lake`` into a Lance dataset at ``uri``."""
    d = pads.dataset(lake, format="parquet")
    lance.write_dataset(d.scanner(batch_size=65_536).to_reader(), uri, mode="overwrite")


def batches(spec, info):
    w = WORKLOADS[spec["workload"]]
    ds = lance.dataset(spec["lance"])
    info["resume"] = "scanner(offset=n)"
    if w.shuffle:
        info["shuffle"] = "global (take of a permutation slice per batch)"
        n = ds.count_rows()
        perm = np.random.default_rng(spec["seed"]).permutation(n)
        for i in range(0, n, w.batch):
            yield arrow_xy(ds.take(perm[i:i + w.batch].tolist(), columns=w.columns), w.x)
        return
    kw = dict(columns=w.columns, batch_size=w.batch, scan_in_order=True)
    if w.filter:
        kw["filter"] = filter_sql(spec)
    if w.mode == "resume":
        kw["offset"] = int(spec["resume_row"])
    for b in rebatch(ds.scanner(**kw).to_batches(), w.batch):
        yield arrow_xy(b, w.x)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--prepare"]:
        prepare(sys.argv[2], sys.argv[3])
        sys.exit(0)
    sys.exit(main())
