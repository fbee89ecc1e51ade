"""What runs inside a Ray worker: unit reads through a plan and batch transforms.

The driver puts the plan (or the transform) in Ray's object store once per loader and
sends each task a token and the reference; a worker process unpickles and compiles it on
its first task (a :class:`~arrowload.scan.units.UnitReader`) and keeps it for the next
tasks of the same token. Nothing here imports ray: the functions are plain and are made
remote by :mod:`.executor`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import pyarrow as pa

#: Compiled plans / transforms a worker process keeps (the most recent tokens).
KEEP = 8
_lock = threading.Lock()
_kept: OrderedDict = OrderedDict()


def _compiled(token: str, ref: list, build):
    """The object compiled from ``ref[0]`` (an ObjectRef, fetched on a miss) for ``token``."""
    with _lock:
        got = _kept.get(token)
        if got is not None:
            _kept.move_to_end(token)
            return got
    import ray
    got = build(ray.get(ref[0]))
    with _lock:
        _kept[token] = got
        while len(_kept) > KEEP:
            _kept.popitem(last=False)
    return got


def _unit_reader(payload):
    from ..scan.units import UnitReader
    plan, options = payload
    return UnitReader(plan, options)


def read_unit(token: str, ref: list, i: int) -> pa.Table:
    """Rows of unit ``i`` after the whole plan (``UnitReader.read``), on a Ray worker."""
    return _compiled(token, ref, _unit_reader).read(i)


def transform_batch(token: str, ref: list, batch: Any) -> pa.RecordBatch:
    """``transform(batch)`` as the threaded loader runs it, on a Ray worker."""
    from ..scan.execute import as_record_batch
    fn = _compiled(token, ref, lambda f: f)
    return as_record_batch(fn(batch), "transform")
