#!/usr/bin/env python
"""The tuned pyarrow scan turned into training batches: the reference of the
"x tuned pyarrow" column.

The Scanner of bare_decode (row-group batches, ``pre_buffer``, readahead; filter and
projection pushed down), re-cut into exact batches of B rows (zero-copy slices, one
concatenation where a batch straddles two row groups), each stacked into x[B, 16]
(``np.stack``) or viewed as x[B, 64] (emb), label zero-copy, to torch.

- W3: global shuffle the simple way: ``to_table()`` then ``take`` of a permutation slice
  per batch.
- W5: resumes by seeking: row-group row counts from the footers say which row groups
  hold rows >= the resume row; only those are scanned.
"""

from __future__ import annotations

import sys

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads

from benchlib import TUNED, WORKLOADS, arrow_xy, main, pa_filter, rebatch


def _scanner(d, w, spec):
    return d.scanner(columns=w.columns, filter=pa_filter(spec), batch_size=TUNED["batch_size"],
                     batch_readahead=TUNED["batch_readahead"],
                     fragment_readahead=TUNED["fragment_readahead"],
                     fragment_scan_options=pads.ParquetFragmentScanOptions(pre_buffer=True))


def batches(spec, info):
    w = WORKLOADS[spec["workload"]]
    src = spec["hive"] if w.hive else spec["lake"]
    d = pads.dataset(src, format="parquet", partitioning="hive" if w.hive else None)
    info["resume"] = "seek: skips whole row groups by footer row counts"
    if w.shuffle:
        info["shuffle"] = "global (to_table + take per batch)"
        table = _scanner(d, w, spec).to_table().combine_chunks()
        perm = np.random.default_rng(spec["seed"]).permutation(table.num_rows)
        for i in range(0, table.num_rows, w.batch):
            yield arrow_xy(table.take(pa.array(perm[i:i + w.batch])), w.x)
        return
    if w.mode == "resume":
        d, skip = _seek(d, spec["resume_row"])
        stream = _scanner(d, w, spec).to_batches()
        stream = _drop(stream, skip)
    else:
        stream = _scanner(d, w, spec).to_batches()
    for b in rebatch(stream, w.batch):
        yield arrow_xy(b, w.x)


def _seek(d, row: int):
    """A dataset of the row groups from the one holding ``row`` on (files in path order),
    and how many rows of its first row group to drop."""
    frags = sorted(d.get_fragments(), key=lambda f: f.path)
    kept = []
    skip = row
    for f in frags:
        groups = f.row_groups
        ids = []
        for rg in groups:
            if skip >= rg.num_rows and not kept and not ids:
                skip -= rg.num_rows
                continue
            ids.append(rg.id)
        if ids:
            kept.append(f.subset(row_group_ids=ids))
    return pads.FileSystemDataset(kept, d.schema, d.format, d.filesystem), skip


def _drop(stream, n: int):
    for b in stream:
        if n >= b.num_rows:
            n -= b.num_rows
            continue
        if n:
            b = b.slice(n)
            n = 0
        yield b


if __name__ == "__main__":
    sys.exit(main())
