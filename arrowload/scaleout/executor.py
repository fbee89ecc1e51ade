"""The loader's ``executor="ray"``: the CPU-heavy work of an epoch as Ray tasks.

What moves to Ray, and what stays:

- **unit reads**: reading unit ``i`` of a scan through the whole plan (decode, filters,
  computed columns, ``Dataset.map``) is one Ray task (:class:`UnitReads`), called where the
  threaded loader calls ``UnitReader.read(i)``: by the loader's reader threads (streaming
  scans, block shuffle) or by the build of the random-access table (global shuffle). Each
  reader thread waits on one task, so the loader's byte budget (``prefetch``) bounds the
  reads in flight exactly as it bounds reads on threads, and the producer takes results in
  task order;
- **``transform=``**: each batch's transform is one Ray task (:class:`BatchTransforms`),
  submitted as the batch is cut, at most ``window`` of them in flight (their input bytes
  counted in the budget), results taken in batch order (``stages.Pipeline``);
- the order, the tasks, batching, conversion and the resume state stay in this process,
  unchanged: batches, ``state_dict()`` and resume are those of ``executor="thread"``.

Maps and transforms must be pure functions of their batch: arrowload gives them no random
state of their own, and Ray may run a task again after a worker is lost. An exception
raised inside a task is re-raised here as itself (``runtime.get``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from . import runtime, tasks

#: Transforms in flight per Ray CPU (more keep a worker busy while its result travels back).
TRANSFORMS_PER_CPU = 2


class RayExecutor:
    """Ray tasks for one loader: built when the loader is (starting Ray where no session
    exists), sized from the cluster's CPUs."""

    def __init__(self) -> None:
        ray = runtime.started()
        self.cpus = runtime.cluster_cpus()
        self._read = ray.remote(num_cpus=1)(tasks.read_unit)
        self._transform = ray.remote(num_cpus=1)(tasks.transform_batch)

    @property
    def parallelism(self) -> int:
        """Unit reads worth running side by side: one per Ray CPU."""
        return self.cpus

    def unit_reads(self, plan, options) -> UnitReads:
        return UnitReads(self._read, plan, options)

    def transforms(self, fn: Callable) -> BatchTransforms:
        return BatchTransforms(self._transform, fn, TRANSFORMS_PER_CPU * self.cpus)

    def __repr__(self) -> str:
        return f"RayExecutor(cpus={self.cpus})"


class UnitReads:
    """``read(i)``: unit ``i``'s rows after ``plan``, read by a Ray task (blocking the
    calling thread, not a CPU). The plan is put in the object store once."""

    def __init__(self, remote, plan, options) -> None:
        ray = runtime.import_ray()
        self._remote = remote
        self._token = uuid.uuid4().hex
        self._ref = [ray.put((plan, options))]

    def __call__(self, i: int) -> pa.Table:
        return runtime.get(self._remote.remote(self._token, self._ref, int(i)))


class BatchTransforms:
    """``transform=`` as Ray tasks: ``submit(batch) -> handle``, ``result(handle) -> batch``
    (re-raising the transform's own exception); at most ``window`` in flight."""

    def __init__(self, remote, fn: Callable, window: int) -> None:
        ray = runtime.import_ray()
        self._remote = remote
        self._token = uuid.uuid4().hex
        self._ref = [ray.put(fn)]
        self.window = max(1, int(window))

    def submit(self, batch: Any):
        return self._remote.remote(self._token, self._ref, batch)

    def result(self, handle) -> pa.RecordBatch:
        return runtime.get(handle)
