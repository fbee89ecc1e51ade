"""Read the units of one scan through a plan compiled once.

``UnitReader(plan, options)`` takes a plan over one scan (the scan's projection, pushed
predicate and kept units; filters, computed columns and maps above it) and works out once
what every unit read needs: the columns to decode and in which order, the predicate and
computed columns as pyarrow expressions, the part of the predicate polars can prefilter,
the nodes above the scan, the decoders that may read each file. ``read(i)`` then returns
the rows of unit ``i`` (a position in ``scan.selected_units()``) exactly as
``execute.to_table`` returns them for the plan restricted to that unit: the same rows,
order, schema and errors. ``count(i)`` is its number of rows, reading only what a count
needs (footers where checked statistics decide, else the predicate's columns).

Late materialization: with a pushed predicate on local files the predicate's columns are
decoded first, and the others only for units where some row survives; polars, where it
reads the unit, evaluates the translatable part of the predicate inside its Parquet
decoder (``plan/polars_filter.py``) and decodes the other columns only where rows survive.

Which decoder reads a unit is chosen by measurement (``choose.py``); they return identical
tables. A fast decoder that fails hands the unit to pyarrow's dataset scanner, whose rows
or error (translated by ``execute.scan_error``) are the answer. Thread-safe: a loader's
reader threads share one reader.

>>> import arrowload as al, pyarrow as pa, pyarrow.parquet as pq, tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "t.parquet")
>>> pq.write_table(pa.table({"x": list(range(10))}), path, row_group_size=4)
>>> reader = UnitReader(al.dataset(path).filter("x % 2 = 0").optimized_plan(), al.Options())
>>> [reader.read(i).column("x").to_pylist() for i in range(reader.num_units)]
[[0, 2], [4, 6], [8]]
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence

import pyarrow as pa
import pyarrow.acero as ac
import pyarrow.compute as pc

from ..errors import AmbiguousColumnError, InternalError, InvalidArgumentError
from ..options import Options
from ..plan.expr import SqlExpr
from ..plan.nodes import Filter, Map, Plan, Project, Scan, scans
from ..plan.rowselect import empty_table, filter_rows
from ..source import FileSource
from ..source.retry import retry
from . import execute, memory
from .choose import MEASURE_METHOD, Chooser, Gate, Measure, pool_cpu_readable
from .decoders import DatasetDecoder, ParquetDecoder, PolarsDecoder, empty_columns, recoverable
from .stream import STREAM_DECODER, env_decoders, polars_ready

ORDER = ("pyarrow", "polars", "dataset")  # the order candidates are first tried in
# polars costs an import (about 0.2 CPU seconds, once per process); on the 4M-row benchmark
# lake it decoded 16% cheaper than before this reader on plain reads and 35% on the filter
# it prefilters. It joins the candidates at once where its import is paid already or the
# reader's units hold POLARS_BYTES, else once the reader has read POLARS_BYTES. Without a
# filter polars prefilters, POLARS_PLAIN_BYTES: there its reads cost about what pyarrow's
# do (1.3e-9 CPU s per byte each, measured alone, 2026-11-27), so the import pays only on
# long runs -- as for the stream (pipeline/loader.py STREAM_IMPORT_BYTES). A 4M-row W1 epoch
# (341 MiB) pinned to polars took 0.77 CPU s, import included, against 0.62 with pyarrow.
POLARS_BYTES = 256 << 20
POLARS_PLAIN_BYTES = 1 << 30
# Where this situation's remembered measurements chose another decoder, polars (not imported
# yet) is measured again only once the reader has read this much in the process: its import
# (0.2 CPU s, ~50 MiB resident) is paid to catch a drifted choice on long runs only, not on
# every short epoch (a 4M-row block epoch held 302 MiB over its start for 282 allowed).
REMEASURE_IMPORT_BYTES = 1 << 30


def _evaluate(table: pa.Table, exprs: Sequence[pc.Expression], names: Sequence[str]) -> list[pa.ChunkedArray]:
    """pyarrow expressions over ``table``, as the scanner computes them (Acero, one thread)."""
    if table.num_columns == 0:  # Acero needs a column to carry the row count
        table = pa.table({"_": pa.nulls(table.num_rows)})
    decl = ac.Declaration.from_sequence([
        ac.Declaration("table_source", ac.TableSourceNodeOptions(table)),
        ac.Declaration("project", ac.ProjectNodeOptions(list(exprs), list(names)))])
    return decl.to_table(use_threads=False).columns


def _keep(table: pa.Table, mask: pa.ChunkedArray | None) -> pa.Table:
    """``execute.keep_rows``: the rows where ``mask`` is true (null drops the row)."""
    if mask is None or (mask.null_count == 0 and pc.all(mask).as_py() is not False):
        return table
    return filter_rows(table, mask)


def _trues(mask: pa.ChunkedArray) -> int:
    return int(pc.sum(mask).as_py() or 0)


class _Stage:
    """One node above the scan, compiled: how it turns the unit's batches into its own."""

    def __init__(self, node: Plan) -> None:
        self.node = node
        child_schema = node.children[0].schema
        if isinstance(node, Filter):
            pred = node.predicate
            self.kind = "duck-filter" if isinstance(pred, SqlExpr) and pred.runs_in(child_schema) == "duckdb" \
                else "filter"
        elif isinstance(node, Project):
            self.schema = node.schema
            self.duck = execute._duck_items(node, child_schema)
            self.kind = "project"
        elif isinstance(node, Map):
            self.kind = "map"
        else:  # pragma: no cover - ScanRowSource takes no other node
            raise InternalError(f"a unit reader cannot run {type(node).__name__} nodes (a bug: please report it)")
        self.child_schema = child_schema

    def __call__(self, batches: list[pa.RecordBatch]) -> list[pa.RecordBatch]:
        node = self.node
        if self.kind == "filter":
            return [o for b in batches if (o := node.predicate.filter_batch(b)).num_rows]
        if self.kind == "duck-filter":
            return [o for g in execute._runs(iter(batches))
                    for o in execute._filter_group(node.predicate, g, self.child_schema)]
        if self.kind == "project":
            if not self.duck:
                return [execute._project(node, b, self.schema, {}) for b in batches]
            return [o for g in execute._runs(iter(batches))
                    for o in execute._project_group(node, g, self.schema, self.duck)]
        return [execute.apply_map(node, b) for b in batches]


class UnitReader:
    """Units of one scan read through ``plan``, compiled once (see the module doc).

    ``decoders``: the names that may read (default: every eligible one, or the names in
    ``$ARROWLOAD_DECODER``, comma-separated, to pin one for a benchmark; ``polars-stream``
    there is the loader's, ``scan/stream.py``, and ignored here). ``decoder``: the
    name chosen so far (None while the candidates are being measured). ``cache_dir``: where
    the measurements are remembered across processes (``memory.py``; None: measured afresh).
    """

    def __init__(self, plan: Plan, options: Options, *, decoders: Sequence[str] | None = None,
                 cache_dir: str | None = None) -> None:
        found = scans(plan)
        if len(found) != 1:
            raise InternalError(f"a unit reader needs a plan over one scan, got {len(found)} (a bug: please report it)")
        self.plan = plan
        self.options = options
        self.scan = scan = found[0]
        self.units = scan.selected_units()
        self.num_units = len(self.units)
        self.reads = 0
        self.decoded_by: dict[str, int] = {}  # units read (or counted) by each decoder, all epochs
        self._lock = threading.Lock()
        try:
            execute._refuse_ambiguous(scan)
            self._refused = False
        except AmbiguousColumnError:  # raised by every read, as the scanner did
            self._refused = True
        self._compile_stages(plan, scan)
        self._compile_scan(scan)
        self._bad: set[tuple[str, int]] = set()  # (decoder, file) that failed where dataset read
        self._decided: frozenset[int] | None = None
        self._whole: frozenset[int] | None = None  # _kept_whole, once found
        self._decide_lock = threading.Lock()
        self._sizes: tuple[int, ...] | None = None
        self._cache_dir = cache_dir
        self._compile_decoders(decoders)

    # -- compile ---------------------------------------------------------------
    def _compile_stages(self, plan: Plan, scan: Scan) -> None:
        path, node = [], plan
        while node is not scan:
            path.append(node)
            node = node.children[0]
        self._stages = [_Stage(n) for n in reversed(path)]
        # counting needs the scan alone where only projections sit above it (as count_rows)
        self._scan_counts = all(isinstance(n, Project) for n in path)
        rows = [u.num_rows for u in self.units if u.num_rows]
        self._batch_rows = self.options.scan.batch_rows or min(max(rows, default=131_072), execute._MAX_BATCH_ROWS)

    def _compile_scan(self, scan: Scan) -> None:
        schema = scan.source.schema
        names = schema.names
        pred = scan.predicate
        self._pred = pred.to_arrow(schema, predicate=True) if pred is not None else None
        self._mask_key = None  # mask_key, worked out on first use
        pred_cols = pred.columns if pred is not None else frozenset()
        if scan.projection is not None:
            self._refs = [e.column_name() for _, e in scan.projection]
            computed = [(n, e) for n, e in scan.projection if e.column_name() is None]
            self._computed = ([e.to_arrow(schema) for _, e in computed], [n for n, _ in computed])
            # expressions that might raise (a user's pyarrow expression) see every row, as in
            # the scanner; the SQL grammar pushed into scans never raises, so it sees survivors
            self._project_first = any(not isinstance(e, SqlExpr) for _, e in computed)
            wanted = frozenset().union(*(e.columns for _, e in scan.projection)) if scan.projection else frozenset()
            self._out = None
        else:
            self._refs = self._computed = None
            self._project_first = False
            self._out = list(scan.columns if scan.columns is not None else names)
            wanted = frozenset(self._out)
        self._names = [n for n, _ in scan.projection] if scan.projection is not None else self._out
        self._need = tuple(n for n in dict.fromkeys(names) if n in wanted)
        self._pred_cols = tuple(n for n in dict.fromkeys(names) if n in pred_cols)
        self._all = tuple(n for n in dict.fromkeys(names) if n in wanted or n in pred_cols)
        self._rest = tuple(n for n in self._need if n not in pred_cols)
        self._scan_schema = scan.schema
        # predicate columns first, the others only where rows survive: on local files (on
        # object storage one request for all columns costs less than two round trips)
        self._late = pred is not None and bool(self._rest) and scan.source.is_local
        self._polars = None

    def _compile_decoders(self, decoders: Sequence[str] | None) -> None:
        scan, options = self.scan, self.options
        src = scan.source
        # the fast decoders read Parquet files as they are: only where the source's own
        # datasets do too, or where the decoders apply its renames and deletions (_conform)
        parquet = isinstance(src, FileSource) and (type(src).dataset is FileSource.dataset or
                                                   getattr(src, "decoders_conform", False)) \
            and src.kind == "parquet" and not src.in_memory_reads
        pinned = decoders if decoders is not None else \
            [d for d in env_decoders() if d != STREAM_DECODER] or None
        polars = parquet and PolarsDecoder.eligible(scan, options) and (pinned is not None or pool_cpu_readable())
        eligible = {"dataset": True, "pyarrow": parquet, "polars": polars}
        if pinned is not None:
            unknown = [d for d in pinned if d not in eligible]
            if unknown:
                raise InvalidArgumentError(f"unknown decoder {unknown[0]!r}; use one of {', '.join(ORDER)}",
                                           "decoders")
        names = [n for n in ORDER if eligible[n] and (pinned is None or n in pinned)] or ["dataset"]
        if pinned is None and "pyarrow" in names:
            # the dataset scanner decodes on pyarrow's own threads, which a reading thread's
            # CPU clock cannot see: where ParquetFile reads, it is the fallback, not a candidate
            names.remove("dataset")
        self._dataset = DatasetDecoder(scan, options, use_threads=options.scan.use_threads)
        self._decoders = {"dataset": self._dataset}
        if "pyarrow" in names:
            self._decoders["pyarrow"] = ParquetDecoder(scan, options)
        if "polars" in names:
            self._decoders["polars"] = PolarsDecoder(scan, options)
            # a computed column that may raise must see every row: no prefilter then
            if self._pred is not None and not self._project_first:
                from ..plan.polars_filter import split_for_polars
                part = src.partition_schema.names
                physical = pa.schema([f for f in src.schema if f.name not in part])
                split = split_for_polars(scan.predicate, physical)
                if split is not None and not (split.polars_columns & set(part)):
                    self._polars = split
                    self._polars_rest = split.rest.to_arrow(src.schema, predicate=True) \
                        if split.rest is not None else None
                    keep = set(self._need) | split.rest_columns
                    self._polars_cols = tuple(n for n in dict.fromkeys(src.schema.names) if n in keep)
                    self._polars_count_cols = tuple(n for n in dict.fromkeys(src.schema.names)
                                                    if n in split.rest_columns)
        self._read_bytes = 0
        self._memory_key = None
        self._remember_lock = threading.Lock()
        self._started_remembered = False
        got = None
        if self._cache_dir and pinned is None and len(names) > 1:
            self._situation = self._situation_of(eligible)
            self._memory_key = memory.situation_key(self._situation)
            got = memory.load(self._cache_dir, self._memory_key)
        self._remembered_costs = dict(got.costs) if got is not None else {}
        # bytes this reader reads before polars joins the candidates (0: it is one, or never
        # will be); see POLARS_BYTES, POLARS_PLAIN_BYTES and REMEASURE_IMPORT_BYTES
        self._polars_after = 0
        if "polars" in names and pinned is None and "polars" not in sys.modules:
            if got is not None and got.chosen != "polars":
                self._polars_after = REMEASURE_IMPORT_BYTES
            else:
                need = POLARS_BYTES if self._polars is not None else POLARS_PLAIN_BYTES
                if sum(self._unit_bytes()) < need:
                    self._polars_after = need
            if self._polars_after:
                names.remove("polars")
        self._chooser = Chooser(names, exclusive=("polars",))
        self._gate = Gate()
        if got is not None:
            self._chooser.remember(got.costs, got.measured)
            self._started_remembered = True

    def _situation_of(self, eligible: dict[str, bool]) -> dict:
        """What the decoders' measured costs depend on (``memory.py``): the machine, the
        decoder set, the columns read and the filter's shape -- never its literals."""
        schema = self.scan.source.schema
        typed = {f.name: str(f.type) for f in schema}
        return {"machine": memory.machine(), "method": MEASURE_METHOD,
                "decoders": [n for n in ORDER if eligible[n]],
                "columns": [[n, typed.get(n, "?")] for n in self._all],
                "filter": None if self._pred is None else {
                    "columns": [[n, typed.get(n, "?")] for n in self._pred_cols],
                    "late": self._late,
                    "polars_prefilter": sorted(self._polars.polars_columns) if self._polars is not None else None,
                    "polars_rest": self._polars is not None and self._polars_rest is not None}}

    def _remember(self) -> None:
        """Write the measured costs back (after a measurement, with a choice standing). One
        write at a time, each taking the costs when it starts: a write that took them before
        another thread's measurement landed cannot land after that thread's write."""
        c = self._chooser
        with self._remember_lock:
            chosen = c.chosen
            costs = {**self._remembered_costs, **c.costs()}  # a candidate not measured here keeps its cost
            if chosen is not None and chosen in costs:
                memory.save(self._cache_dir, self._memory_key, self._situation, chosen, costs, c.measured)

    def _unit_bytes(self) -> tuple[int, ...]:
        """Compressed bytes of the columns read, per unit (rows where footers do not say)."""
        if self._sizes is None:
            self._sizes = tuple(u.bytes_for(self._all) or u.num_rows or 1 for u in self.units)
        return self._sizes

    # -- what the reader chose ---------------------------------------------------
    @property
    def decoder(self) -> str | None:
        """The decoder reading units now (None while the candidates are being measured)."""
        return self._chooser.chosen

    @property
    def candidates(self) -> tuple[str, ...]:
        return self._chooser.names

    def decoded_counts(self) -> dict[str, int]:
        """Units each decoder read (or counted), over every epoch so far."""
        with self._lock:
            return dict(self.decoded_by)

    def count_decoded(self, name: str, units: int = 1) -> None:
        """Count ``units`` read by ``name`` elsewhere (an epoch's polars stream)."""
        with self._lock:
            self.decoded_by[name] = self.decoded_by.get(name, 0) + units

    def describe(self) -> dict:
        """What was compiled and chosen, for ``explain()`` / ``stats()``."""
        return {"decoder": self.decoder, "candidates": list(self.candidates),
                "cpu_per_byte": self._chooser.costs(), "late_materialization": self._late,
                "polars_prefilter": str(self._polars) if self._polars is not None and "polars" in self.candidates
                else None,
                "units_read": self.reads,
                # where the measurements were remembered across processes (None: not kept)
                "remembered": memory.path_for(self._cache_dir, self._memory_key)
                if self._memory_key is not None else None,
                "started_from_remembered": self._started_remembered,
                # measurements each candidate got in this process (a remembered start: one each
                # early, then one every RECHECK-th read)
                "measured_in_process": self._chooser.fresh()}

    def close(self) -> None:
        """Close the files the fast decoders hold open (a later read opens them again)."""
        for d in self._decoders.values():
            if hasattr(d, "close"):
                d.close()

    # -- reading -----------------------------------------------------------------
    def read(self, i: int) -> pa.Table:
        """Rows of unit ``i`` after the whole plan, in order (``plan.schema``)."""
        return self._finish(self._run(i, self._scan_unit))

    def _finish(self, table: pa.Table) -> pa.Table:
        """A unit's scanned rows through the plan's stages above the scan (counted read)."""
        with self._lock:
            self.reads += 1
        if not self._stages:
            return table
        batches = [b for b in table.to_batches(max_chunksize=self._batch_rows) if b.num_rows]
        for stage in self._stages:
            if not batches:
                break
            batches = stage(batches)
        return pa.Table.from_batches(batches, schema=self.plan.schema)

    @property
    def sees_every_row(self) -> bool:
        """Whether its computed columns must see every row of a unit, the predicate's
        rejects included (a user's pyarrow expression may raise on them)."""
        return self._project_first

    @property
    def decoded_columns(self) -> tuple[str, ...] | None:
        """Source columns ``read_decoded`` needs (its output's inputs and the predicate's);
        None where it cannot take decoded columns (a scan every read refuses)."""
        return None if self._refused else self._all

    @property
    def picks(self) -> tuple[tuple[str, str], ...] | None:
        """``(output name, decoded column)`` of each output column, where a unit's rows
        after the plan are the decoded rows its predicate keeps, these columns as decoded
        (no computed column, no stage above the scan): a shared decode may then hand out
        row positions (``keep_mask``) instead of filtered copies. None otherwise."""
        if self._stages:
            return None
        if self._refs is None:
            return tuple((n, n) for n in self._out)
        if any(r is None for r in self._refs):
            return None
        return tuple(zip(self._names, self._refs))

    @property
    def mask_key(self) -> tuple | None:
        """What ``keep_mask`` asks ``masks`` for: the same for readers whose predicates
        compute the same (``fingerprint.expr_key`` of the scan's predicate, not its pyarrow
        text, which elides long value lists) and read the same columns; None: it keeps
        every row."""
        if self._pred is None:
            return None
        if self._mask_key is None:
            from ..plan.fingerprint import expr_key
            self._mask_key = (expr_key(self.scan.predicate), self._pred_cols)
        return self._mask_key

    def keep_mask(self, table: pa.Table, masks: Callable | None = None) -> pa.ChunkedArray | None:
        """The rows of decoded ``table`` its predicate keeps (null: not kept), as
        ``read_decoded`` filters them; None: every row."""
        if self._pred is None:
            return None
        return masks(self.mask_key, self._pred, self._pred_cols) if masks is not None else \
            _evaluate(table.select(list(self._pred_cols)), [self._pred], ["_"])[0]

    def read_decoded(self, i: int, table: pa.Table, masks: Callable | None = None) -> pa.Table:
        """Rows of unit ``i`` after the whole plan, as ``read(i)`` gives them, from ``table``:
        the unit's rows decoded, in order, with at least ``decoded_columns`` (by name; others
        are ignored) -- every row, or (where ``sees_every_row`` is false) any subset holding
        every row the scan's predicate keeps. Several plans over one lake share one decode of a unit
        this way (``mixture.shared``). ``masks(key, expr, columns)`` (optional) gives the
        predicate's mask over ``table``'s ``columns`` (shared by readers whose predicates
        repeat)."""
        if self._pred is None:
            out = self._output(table, None)
        else:
            mask = self.keep_mask(table, masks)
            if not self._project_first and _trues(mask) == 0:
                out = empty_table(self._scan_schema)
            else:
                out = self._output(table, mask)
        return self._finish(out)

    def count(self, i: int) -> int:
        """Rows unit ``i`` gives after the whole plan (maps keep one row per row)."""
        if not self._scan_counts:
            return self.read(i).num_rows
        unit = self.units[i]
        if self._pred is None and unit.num_rows is not None:
            return unit.num_rows
        if self._pred is not None and i in self._statistics_decided():
            return unit.num_rows
        return self._run(i, self._count_unit)

    def _statistics_decided(self) -> frozenset[int]:
        """Positions of the units every row of which the (checked) statistics prove kept,
        counted from footers as ``execute.count_rows`` does; found once (counting threads
        wait for the first to find them)."""
        if self._decided is not None:
            return self._decided
        with self._decide_lock:
            return self._find_decided()

    def _find_decided(self) -> frozenset[int]:
        if self._decided is None:
            decided: frozenset[int] = frozenset()
            scan = self.scan
            if self.options.optimizer.metadata_count and scan.source.kind == "parquet" and not self._refused:
                try:
                    got = execute._decided_by_statistics(scan, scan.source.statistics_dataset(scan.units),
                                                         self._pred)
                except Exception:  # noqa: BLE001 - each unit's own read raises what is wrong
                    got = None
                if got is not None:
                    rest = set(got[1])
                    decided = frozenset(i for i, u in enumerate(self.units) if u.index not in rest)
            self._decided = decided
        return self._decided

    def _usable(self, name: str, unit, columns: frozenset[str]) -> bool:
        return (name, unit.file) not in self._bad and self._decoders[name].usable(unit, columns)

    def _columns_for(self, name: str, counting: bool) -> frozenset[str]:
        if name == "polars" and self._polars is not None:
            cols = self._polars_count_cols if counting else self._polars_cols
            return frozenset(cols) | self._polars.polars_columns
        return frozenset(self._pred_cols if counting else self._all)

    def _run(self, i: int, fn: Callable) -> object:
        """``fn(decoder, unit, measure)`` with the decoder chosen for unit ``i``; a fast
        decoder's failure hands the unit to the dataset scanner, whose answer stands."""
        if self._refused:
            execute._refuse_ambiguous(self.scan)
        counting = fn == self._count_unit
        name, measure = self._chooser.pick()
        return self._read_with(name, measure, i, fn, counting)

    def _count_read(self, size: int) -> None:
        with self._lock:
            self._read_bytes += size
            if not self._polars_after or self._read_bytes < self._polars_after:
                return
            self._polars_after = 0
        self._chooser.add("polars")

    def _read_with(self, name: str, measure: bool, i: int, fn: Callable, counting: bool):
        unit = self.units[i]
        picked, asked, cpu = name, measure, None
        try:
            if not self._usable(name, unit, self._columns_for(name, counting)):
                name, measure = next((n for n in self.candidates if n != picked and
                                      self._usable(n, unit, self._columns_for(n, counting))), "dataset"), False
            elif name == "polars" and not polars_ready():
                # polars' import (about 0.15-0.2 s, holding the GIL) runs on a thread of its own:
                # read with another fast decoder meanwhile, so no unit (the first batch's
                # included) waits for it -- the rows are the same whichever decoder reads
                # (none: wait for the import, as a decoder pinned alone does)
                other = next((n for n in self.candidates if n not in (picked, "dataset") and
                              self._usable(n, unit, self._columns_for(n, counting))), None)
                if other is not None:
                    name, measure = other, False
                else:
                    polars_ready(wait=True)
            with self._gate.enter(alone=measure):
                m = Measure() if measure else None
                if name == "dataset":
                    out = self._on_dataset(unit, fn)
                else:
                    try:
                        out = fn(self._decoders[name], unit, m)
                    except BaseException as exc:  # noqa: BLE001 - polars panics are BaseExceptions
                        if not recoverable(exc):
                            raise
                        return self._on_dataset(unit, fn, failed=name)
                if m is not None and name == picked:
                    cpu = m.done()
            with self._lock:
                self.decoded_by[name] = self.decoded_by.get(name, 0) + 1
            return out
        finally:
            size = self._unit_bytes()[i]
            if self._chooser.done(picked, cpu, size, ran=name == picked, measured=asked) and \
                    self._memory_key is not None:
                self._remember()
            if self._polars_after:
                self._count_read(size)

    def _on_dataset(self, unit, fn: Callable, failed: str | None = None):
        opts = self.options.scan
        try:
            out = retry(lambda: fn(self._dataset, unit, None), retries=opts.retries, backoff_s=opts.retry_backoff_s)
        except Exception as exc:  # noqa: BLE001 - translated, or re-raised as it is
            typed = execute.scan_error(self.scan.replace(units=(unit.index,)), exc)
            if typed is None:
                raise
            raise typed from exc
        if failed is not None:  # the file reads, only not with that decoder
            with self._lock:
                self._bad.add((failed, unit.file))
        return out

    def _kept_whole(self) -> frozenset:
        """Source unit indices whose every row the checked statistics prove the predicate
        keeps (``_statistics_decided``, as counts use them): read without it."""
        got = self._whole
        if got is None:
            decided = self._statistics_decided()
            got = self._whole = frozenset(self.units[i].index for i in decided)
        return got

    def _scan_unit(self, dec, unit, m) -> pa.Table:
        """The scan's rows of ``unit`` (its output schema). A unit whose rows the checked
        statistics all keep (``id < 400000`` over row groups of ids below it) is read
        without the predicate: its columns are neither read nor evaluated, and its rows not
        copied by a filter that keeps them all -- as DuckDB skips a filter its zone maps
        prove always true. Measured reads take the usual path (their cost per byte is
        compared between decoders)."""
        if self._pred is None or (m is None and unit.index in self._kept_whole()):
            return self._output(dec.read(unit, self._need, m), None)
        if self._polars is not None and dec.name == "polars":
            table = dec.read(unit, self._polars_cols, m, polars_filter=self._polars.polars)
            mask = _evaluate(table, [self._polars_rest], ["_"])[0] if self._polars_rest is not None else None
            return self._output(table, mask)
        if self._late and dec.name != "dataset":
            first = dec.read(unit, self._pred_cols, m)
            mask = _evaluate(first, [self._pred], ["_"])[0]
            if not self._project_first and _trues(mask) == 0:
                return empty_table(self._scan_schema)
            rest = dec.read(unit, self._rest, m)
            pick = {c: first.column(c) for c in self._pred_cols}
            table = pa.Table.from_arrays([pick[c] if c in pick else rest.column(c) for c in self._need],
                                         names=list(self._need)) if self._need else empty_columns(first.num_rows)
            return self._output(table, mask)
        table = dec.read(unit, self._all, m)
        return self._output(table, _evaluate(table, [self._pred], ["_"])[0])

    def _count_unit(self, dec, unit, m) -> int:
        if self._polars is not None and dec.name == "polars":
            table = dec.read(unit, self._polars_count_cols, m, polars_filter=self._polars.polars)
            if self._polars_rest is None:
                return table.num_rows
            return _trues(_evaluate(table, [self._polars_rest], ["_"])[0])
        if self._pred is None:
            return dec.read(unit, (), m).num_rows
        return _trues(_evaluate(dec.read(unit, self._pred_cols, m), [self._pred], ["_"])[0])

    def _output(self, table: pa.Table, mask: pa.ChunkedArray | None) -> pa.Table:
        """The scan's output columns of ``table`` (whose rows ``mask`` keeps)."""
        if self._refs is None:
            arrays = _keep(table.select(self._out), mask).columns
        elif self._project_first:
            arrays = self._project(table)
            n = table.num_rows
            arrays = _keep(pa.Table.from_arrays(arrays, names=self._names) if arrays else empty_columns(n),
                           mask).columns
        else:
            arrays = self._project(_keep(table.select(list(self._need)) if self._need
                                         else empty_columns(table.num_rows), mask))
        if not arrays:
            n = table.num_rows if mask is None else _trues(mask)
            return empty_columns(n)
        schema = self._scan_schema
        if all(a.type.equals(f.type) for a, f in zip(arrays, schema)):
            return pa.Table.from_arrays(arrays, schema=schema)
        return pa.Table.from_arrays(arrays, names=self._names)

    def _project(self, table: pa.Table) -> list[pa.ChunkedArray]:
        exprs, names = self._computed
        values = iter(_evaluate(table, exprs, names)) if exprs else iter(())
        return [table.column(ref) if ref is not None else next(values) for ref in self._refs]
