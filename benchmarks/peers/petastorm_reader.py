#!/usr/bin/env python
"""Petastorm: ``make_batch_reader("file://" + lake, schema_fields=[...])`` (one batch per
row group), re-cut to B rows, stacked to x[B, 16].

Petastorm is not in the ``bench`` extra: 0.13.1 (the latest) pins ``setuptools<70``
(it would downgrade the environment's setuptools) and pulls pyspark, and it does not
import with pyarrow >= 16 (``petastorm.utils`` imports ``pyarrow.filesystem``, removed
from pyarrow). Install it by hand to try; this peer reports the import error as the
reason it is unusable.
"""

from __future__ import annotations

import sys

from benchlib import WORKLOADS, Unusable, main


def setup(spec, info):
    try:
        import petastorm  # noqa: F401
        from petastorm import make_batch_reader  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure makes it unusable
        raise Unusable(f"import failed: {type(exc).__name__}: {exc}") from None


def batches(spec, info):
    import numpy as np
    import torch
    from petastorm import make_batch_reader
    w = WORKLOADS[spec["workload"]]
    pend_x, pend_y = [], []
    with make_batch_reader("file://" + spec["lake"], schema_fields=list(w.columns),
                           num_epochs=1, shuffle_row_groups=False) as reader:
        for rb in reader:
            x = np.stack([getattr(rb, c) for c in w.x], axis=1).astype(np.float32, copy=False)
            pend_x.append(x)
            pend_y.append(np.asarray(rb.label))
            xs, ys = np.concatenate(pend_x), np.concatenate(pend_y)
            k = len(ys) // w.batch * w.batch
            for i in range(0, k, w.batch):
                yield torch.from_numpy(xs[i:i + w.batch]), torch.from_numpy(ys[i:i + w.batch])
            pend_x, pend_y = [xs[k:]], [ys[k:]]
    if pend_y and len(pend_y[0]):
        yield torch.from_numpy(pend_x[0]), torch.from_numpy(pend_y[0])


if __name__ == "__main__":
    sys.exit(main())
