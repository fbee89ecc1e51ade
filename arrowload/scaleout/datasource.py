"""``Dataset.to_ray()``: a ``ray.data.Dataset`` read through arrowload's plan.

:class:`ArrowloadDatasource` is a ``ray.data.Datasource`` whose read tasks are arrowload's
units (Parquet row groups, files, slices of a table) as the optimized plan keeps them --
partitions and row groups pruned, projection and filter pushed into the scan -- in source
order, grouped into at most ``parallelism`` contiguous runs. Each task's ``BlockMetadata``
holds its exact row count after the filter (the loader's selection index: only the
filter's columns are read, once per snapshot, cached on disk) and its decoded size, so
Ray's ``count()`` is answered from metadata without reading a row. Units the filter
leaves empty get no task. A task reads its units with arrowload's own
:class:`~arrowload.scan.units.UnitReader` (decoders, late materialization, filters,
computed columns and ``map()`` inside the read), on a Ray worker.

Ray's pushdown hooks map onto the plan: ``rd.select_columns([...])`` becomes
``Dataset.select(...)`` and ``rd.filter(expr=col("x") > 1)`` (an expression Ray can turn
into a ``pyarrow.compute.Expression``) becomes ``Dataset.filter(...)``, so arrowload prunes
and pushes them like its own (a UDF predicate stays a Ray filter above the read).

A plan that is not a scan unit by unit (SQL over DuckDB, a ``limit``) is one read task over
the whole plan, its row count unknown to Ray until read.

This module subclasses Ray's ``Datasource`` and so imports ray: it is imported only by
``Dataset.to_ray()`` (and by Ray workers unpickling a read task).
"""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from ray.data import Datasource, ReadTask
from ray.data.block import BlockMetadata

from ..errors import ArrowloadError
from ..options import default_cache_dir, usable_cores
from ..pipeline.rowsource import ScanRowSource, _one_scan
from ..plan.nodes import has_map
from ..scan.units import UnitReader
from ..source.snapshot import miscount_error
from . import runtime


class _Layout:
    """The read tasks' plan, computed once per datasource: the kept units (positions in the
    plan's ``selected_units``) with their exact counts, decoded sizes and files."""

    def __init__(self, dataset) -> None:
        dataset._verify()
        self.plan = plan = dataset.optimized_plan()
        self.options = dataset.options
        self.schema = plan.schema
        self.scan = _one_scan(plan)
        if not self.scan:
            self.positions: tuple[int, ...] = ()
            self.counts: tuple[int, ...] = ()
            self.sizes: tuple[int, ...] = ()
            self.files: tuple[str, ...] = ()
            return
        src = ScanRowSource(plan, dataset.options, default_cache_dir(), usable_cores())
        try:
            meta = src.scan.selected_units()
            kept = [i for i, c in enumerate(src.counts) if c > 0]
            self.positions = tuple(kept)
            self.counts = tuple(int(src.counts[i]) for i in kept)
            # est_bytes: what the unit decodes to; the filter keeps counts / rows of it
            self.sizes = tuple(max(1, src.est_bytes(i) * src.counts[i] // max(1, meta[i].num_rows or src.counts[i]))
                               for i in kept)
            self.files = tuple(meta[i].path for i in kept)
        finally:
            src.close()

    def groups(self, parallelism: int) -> list[list[int]]:
        """Indices into ``positions``, cut into at most ``parallelism`` contiguous runs of
        about equal rows (source order kept within and across runs)."""
        n = len(self.positions)
        if n == 0:
            return []
        if parallelism is None or parallelism <= 0 or parallelism >= n:
            return [[j] for j in range(n)]
        # unit j goes to run floor(k * (rows before its middle) / total): contiguous, about
        # total / k rows each (a run may be empty and is dropped)
        total = max(1, sum(self.counts))
        out: dict[int, list[int]] = {}
        before = 0
        for j, c in enumerate(self.counts):
            out.setdefault(min(parallelism - 1, parallelism * (2 * before + c) // (2 * total)), []).append(j)
            before += c
        return [out[g] for g in sorted(out)]


def _metadata(num_rows: int | None, size_bytes: int | None, files: Sequence[str], schema: pa.Schema) -> BlockMetadata:
    """``BlockMetadata`` across Ray versions (the schema moved to ``ReadTask`` in 2.4x)."""
    params = inspect.signature(BlockMetadata).parameters
    kw: dict[str, Any] = dict(num_rows=num_rows, size_bytes=size_bytes, input_files=list(files), exec_stats=None)
    if "schema" in params:
        kw["schema"] = schema
    return BlockMetadata(**kw)


def _read_task(read_fn, meta: BlockMetadata, schema: pa.Schema, per_task_row_limit: int | None) -> ReadTask:
    params = inspect.signature(ReadTask.__init__).parameters
    kw: dict[str, Any] = {}
    if "schema" in params:
        kw["schema"] = schema
    if per_task_row_limit is not None and "per_task_row_limit" in params:
        kw["per_task_row_limit"] = per_task_row_limit
    return ReadTask(read_fn, meta, **kw)


def read_units(plan, options, positions: Sequence[int], counts: Sequence[int]) -> Iterator[pa.Table]:
    """The rows of units ``positions`` of ``plan``'s scan, in order, each checked against the
    count the task's metadata promised (a changed file would break Ray's ``count()``)."""
    reader = UnitReader(plan, options)
    try:
        for i, expected in zip(positions, counts):
            table = reader.read(i)
            if table.num_rows != expected:
                unit = reader.units[i]
                raise miscount_error(f"unit {i} ({unit.path}, row group {unit.row_group})", table.num_rows, expected,
                                     reader.scan.source, has_map(plan),
                                     "the Ray dataset (to_ray())")
            yield table
    finally:
        reader.close()


def _read_whole(dataset) -> Iterator[pa.Table]:
    yield dataset.to_arrow()


class ArrowloadDatasource(Datasource):
    """A ``ray.data.Datasource`` over an arrowload Dataset (see the module doc). Pickles
    with its dataset (maps with cloudpickle, as Ray pickles functions)."""

    def __init__(self, dataset) -> None:
        super().__init__()
        self._dataset = dataset
        self._projection_map = None
        self._layout: _Layout | None = None

    @property
    def dataset(self):
        """The arrowload Dataset read, Ray's pushed projection and filters included."""
        return self._dataset

    def get_name(self) -> str:
        return "Arrowload"

    def _planned(self) -> _Layout:
        if self._layout is None:
            self._layout = _Layout(self._dataset)
        return self._layout

    def estimate_inmemory_data_size(self) -> int | None:
        layout = self._planned()
        return sum(layout.sizes) if layout.scan else None

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                       data_context: Any = None) -> list[ReadTask]:
        layout = self._planned()
        schema = layout.schema
        if not layout.scan:
            meta = _metadata(None, None, (), schema)
            return [_read_task(functools.partial(_read_whole, self._dataset), meta, schema, per_task_row_limit)]
        tasks = []
        for group in layout.groups(parallelism):
            positions = [layout.positions[j] for j in group]
            counts = [layout.counts[j] for j in group]
            files = list(dict.fromkeys(layout.files[j] for j in group if layout.files[j]))
            meta = _metadata(sum(counts), sum(layout.sizes[j] for j in group), files, schema)
            fn = functools.partial(read_units, layout.plan, layout.options, positions, counts)
            tasks.append(_read_task(fn, meta, schema, per_task_row_limit))
        return tasks

    # -- Ray's pushdown hooks, onto arrowload's plan ---------------------------------
    def supports_projection_pushdown(self) -> bool:
        return True

    def supports_predicate_pushdown(self) -> bool:
        return True

    def apply_projection(self, projection_map):
        """Ray's column selection as ``Dataset.select(*names)`` (pruned in the scan)."""
        if projection_map is None:
            return self
        names = list(projection_map)
        if not names or names == self._dataset.columns:
            return self  # nothing to prune (no columns at all: Ray counts from metadata)
        try:
            selected = self._dataset.select(*names)
        except ArrowloadError:
            return self  # a name arrowload does not know: Ray keeps its own projection
        return self._clone(selected, {n: n for n in names})

    def apply_predicate(self, predicate_expr):
        """Ray's filter as ``Dataset.filter(pyarrow expression)`` (pushed, pruned); an
        expression without a pyarrow form stays Ray's (``self`` returned: no pushdown)."""
        try:
            expr = predicate_expr.to_pyarrow()
            filtered = self._dataset.filter(expr)
        except Exception:  # noqa: BLE001 - not pushable: Ray filters above the read
            return self
        clone = self._clone(filtered, self._projection_map)
        previous = self.get_current_predicate()
        clone._predicate_expr = predicate_expr if previous is None else previous & predicate_expr
        return clone

    def _clone(self, dataset, projection_map) -> ArrowloadDatasource:
        clone = copy.copy(self)
        clone._dataset = dataset
        clone._projection_map = projection_map
        clone._layout = None
        return clone

    def __repr__(self) -> str:
        return f"ArrowloadDatasource({len(self._dataset.columns)} columns)"


def to_ray(dataset, parallelism: int | None = None):
    """``ray.data.read_datasource(ArrowloadDatasource(dataset))``; ``parallelism``: the most
    read tasks (default: Ray's choice)."""
    ray = runtime.import_ray()
    params = inspect.signature(ray.data.read_datasource).parameters
    kw: dict[str, Any] = {}
    if parallelism is not None:
        kw["override_num_blocks" if "override_num_blocks" in params else "parallelism"] = parallelism
    return ray.data.read_datasource(ArrowloadDatasource(dataset), **kw)
