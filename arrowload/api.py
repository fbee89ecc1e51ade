"""The lazy Dataset facade: filter / select / map / limit build a plan; nothing is read
until a result is asked for (``count``, ``head``, ``to_arrow`` ...)."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from . import progress as _progress
from .errors import ArgumentTypeError, ColumnNotFoundError, InvalidArgumentError
from .options import OptimizerOptions, Options, ScanOptions
from .optimize import optimize, optimize_steps
from .pipeline.options import DEFAULT, LoaderOptions, resolve_options
from .plan import explain as _explain
from .plan.expr import SqlExpr, make_expr
from .plan.nodes import Filter, Limit, Map, Plan, Project, Scan, SqlQuery, scans, walk, with_sources
from .scan import execute
from .scan.splits import Split, plan_splits
from .source import open_source


class Dataset:
    """A lazy, immutable selection over a data lake (or an in-memory table).

    Every method that shapes the selection returns a new Dataset and reads nothing.
    Results are computed from the optimized plan: filters, projections and limits are
    pushed into the scan; partitions and row groups that cannot match are skipped.
    A Dataset is safe to share between threads.

    >>> import pyarrow as pa, arrowload as al
    >>> ds = al.dataset(pa.table({"x": [1, 2, 3], "y": ["a", "b", "c"]}))
    >>> ds.filter("x >= 2").select("y").to_arrow().column("y").to_pylist()
    ['b', 'c']
    """

    def __init__(self, plan: Plan, options: Options | None = None) -> None:
        if options is not None and not isinstance(options, Options):
            raise ArgumentTypeError(f"options= takes an al.Options, got {type(options).__name__}: "
                                    "al.Options(scan=al.ScanOptions(...), optimizer=al.OptimizerOptions(...))",
                                    "options")
        self._plan = plan
        self._options = options or Options()

    # -- building ---------------------------------------------------------
    @property
    def plan(self) -> Plan:
        """The logical plan as written (before optimization)."""
        return self._plan

    @property
    def options(self) -> Options:
        return self._options

    def _with(self, plan: Plan) -> "Dataset":
        return type(self)(plan, self._options)

    def with_options(self, options: Options | None = None, *, optimizer: OptimizerOptions | None = None,
                     scan: ScanOptions | None = None) -> "Dataset":
        """The same selection with other options, e.g. every optimization off:
        ``ds.with_options(optimizer=al.OptimizerOptions.none())``."""
        for given, cls in ((options, Options), (optimizer, OptimizerOptions), (scan, ScanOptions)):
            if given is not None and not isinstance(given, cls):
                raise ArgumentTypeError(f"with_options() takes an al.{cls.__name__} there, got "
                                        f"{type(given).__name__}: e.g. ds.with_options(scan=al.ScanOptions("
                                        "page_checksums=True))", cls.__name__)
        opts = options or self._options
        if optimizer is not None:
            opts = dataclasses.replace(opts, optimizer=optimizer)
        if scan is not None:
            opts = dataclasses.replace(opts, scan=scan)
        return type(self)(self._plan, opts)

    @property
    def schema(self) -> pa.Schema:
        """Output schema (reads footers of a file source on first use, no data)."""
        return self._plan.schema

    @property
    def columns(self) -> list[str]:
        return self.schema.names

    def filter(self, predicate: Any) -> "Dataset":
        """Keep rows where ``predicate`` holds: SQL text (DuckDB dialect, e.g.
        ``"country IN ('US','DE') AND ts >= DATE '2024-01-01'"``), a
        ``pyarrow.compute.Expression`` or a polars expression. Lazy."""
        expr = make_expr(predicate, self.schema, "filter")
        node = Filter(self._plan, expr)  # checks the columns it names (missing, ambiguous)
        expr.check(self.schema, predicate=True)  # type-check now: a bad filter fails here
        return self._with(node)

    def select(self, *names: str, **exprs: Any) -> "Dataset":
        """Output these columns, in this order: names as they are, keywords as computed
        columns from SQL text (``label="CAST(label AS TINYINT)"``), pyarrow or polars
        expressions. Lazy."""
        schema = self.schema
        items = []
        for n in names:
            if not isinstance(n, str):
                raise ArgumentTypeError(f"select() takes column names positionally, got "
                                        f"{type(n).__name__}; pass expressions as keywords: "
                                        "select(x='a + b')")
            if n not in schema.names:
                raise ColumnNotFoundError(n, schema.names, "select")
            items.append((n, SqlExpr.column(n)))
        for name, value in exprs.items():
            items.append((name, make_expr(value, schema, f"select({name}=...)")))
        if not items:
            raise InvalidArgumentError("select() needs at least one column: select('a', 'b') or "
                                       "select(x='a + b')")
        return self._with(Project(self._plan, tuple(items)))

    def map(self, fn: Callable[[pa.RecordBatch], Any], *, columns: list[str] | None = None,
            output_schema: pa.Schema | None = None, name: str = "") -> "Dataset":
        """Apply a vectorized function to each ``pyarrow.RecordBatch`` (it may return a
        RecordBatch, Table or polars DataFrame). ``columns`` declares the inputs it reads so
        the scan decodes only those. Lazy; filters and limits are not moved across it. A
        loader (and ``to_ray``) counts rows before maps: there a map must keep one row per
        input row (``cache()`` a map that drops or adds rows first)."""
        if isinstance(columns, str):
            raise ArgumentTypeError(f"map(columns=...) takes a list of column names, got the string "
                                    f"{columns!r}; write columns=[{columns!r}]", "columns")
        return self._with(Map(self._plan, fn, tuple(columns) if columns is not None else None,
                              output_schema, name))

    def limit(self, n: int) -> "Dataset":
        """At most the first ``n`` rows in source order. Lazy."""
        return self._with(Limit(self._plan, n))

    def sql(self, query: str, *, external_access: bool = True, **tables: Any) -> "Dataset":
        """Run SQL over this dataset, bound as ``self`` (plus any ``tables``):
        ``ds.sql("SELECT country, avg(f0) FROM self GROUP BY country")``. Lazy.
        ``external_access``: as in :func:`sql`."""
        return sql(query, external_access=external_access, self=self, **tables)

    def cache(self, uri: str | None = None, *, format: str = "parquet", key: str | None = None,
              storage_options: dict | None = None, wait_timeout: float = 3600.0) -> "Dataset":
        """This selection's output, written once and read back from then on: a Dataset whose
        source is the cached files. Lazy: the entry is written (or found) the first time
        rows, a count or a loader are asked for, never by ``cache()``, ``schema`` or
        ``explain()`` (which says "cache hit" or "cache miss").

        Entries are keyed by the plan's fingerprint (``formats/plan_fingerprint/v1``) and the
        snapshot of every source under it: a changed source (a file added, rewritten) gives
        another key, a miss, and a new entry; the old one stays until cleared
        (``al.clear_cache`` / ``arrowload cache clear``). A ``map()`` needs a ``name`` (its
        version: arrowload cannot fingerprint code), or pass ``key`` to name the version of
        the whole plan; otherwise ``UncacheablePlanError``.

        ``uri``: a local folder or an object-store URI (``s3://bucket/prefix``, resolved as
        ``al.dataset`` resolves URIs, with ``storage_options``); default the user cache dir
        (``$ARROWLOAD_CACHE_DIR``, else ``$XDG_CACHE_HOME/arrowload``, else
        ``~/.cache/arrowload``). Entries go under ``<uri>/plans/<key>/``. ``format``:
        ``"parquet"`` or ``"ipc"`` (Arrow IPC files: every Arrow type, memory-mappable).

        One writer per entry, on every rank and process: the first to take the entry's lock
        runs the plan and commits; the others wait (at most ``wait_timeout`` seconds, then
        ``CacheLockTimeoutError`` naming the lock) and read what it wrote. A writer that
        died is detected (its process gone, or its heartbeat older than a minute) and its
        lock taken over; files without a commit are never read.

        >>> import pyarrow as pa, arrowload as al, tempfile
        >>> ds = al.dataset(pa.table({"x": [1, 2, 3]}))
        >>> cached = ds.map(lambda b: b, name="identity-v1").cache(tempfile.mkdtemp())
        >>> cached.to_arrow().column("x").to_pylist()
        [1, 2, 3]
        """
        from .plancache import CachedSource, Entry, Store
        if format not in ("parquet", "ipc"):
            raise InvalidArgumentError(f"cache(format=...) takes 'parquet' or 'ipc', got {format!r}", "format")
        if key is not None and (not isinstance(key, str) or not key):
            raise ArgumentTypeError(f"cache(key=...) takes a non-empty string naming the version of the "
                                    f"plan (e.g. key='tokenize-v2'), got {key!r}", "key")
        if isinstance(wait_timeout, bool) or not isinstance(wait_timeout, (int, float)) or wait_timeout < 0:
            raise InvalidArgumentError(f"cache(wait_timeout=...) takes seconds >= 0, got {wait_timeout!r}",
                                       "wait_timeout")
        if uri is not None and not isinstance(uri, (str, os.PathLike)):
            raise ArgumentTypeError(f"cache(uri=...) takes a folder or URI, got {type(uri).__name__}", "uri")
        entry = Entry(self._plan, self._options, Store(uri, storage_options), format, key, float(wait_timeout))
        return self._with(Scan(CachedSource(entry)))

    def loader(self, batch_size: int | None = None, *, options: LoaderOptions | None = None,
               shuffle: bool | str = DEFAULT, seed: int = DEFAULT,
               drop_last: bool = DEFAULT, rank: int | None = DEFAULT, world_size: int | None = DEFAULT,
               output: str = DEFAULT, device: Any = DEFAULT, prefetch: int = DEFAULT,
               io_threads: int | None = DEFAULT, shuffle_window: int = DEFAULT,
               transform: Callable[[pa.RecordBatch], Any] | None = DEFAULT,
               pad_lists: bool | tuple[str, ...] = DEFAULT, pad_value: Any = DEFAULT,
               pad_to: int | None = DEFAULT,
               fill_null: dict | None = DEFAULT, cache_dir: str | None = DEFAULT,
               memory_budget: int | None = DEFAULT, stack: dict | None = DEFAULT,
               devices: list | None = DEFAULT, sharding: Any = DEFAULT, executor: str = DEFAULT):
        """Batches of exactly ``batch_size`` rows for training, as a :class:`Loader`.

        ``options``: an ``al.LoaderOptions`` holding any of the arguments below; a keyword
        given here replaces that field (``ds.loader(options=base, rank=r)``) and
        ``batch_size`` may come from either (one must give it). A keyword not given keeps
        the field of ``options``, else ``LoaderOptions``'s default: ``shuffle=False,
        seed=0, drop_last=False, rank=None, world_size=None, output="numpy", device=None,
        prefetch=256 << 20, io_threads=None, shuffle_window=8, transform=None,
        pad_lists=False, pad_value=0, pad_to=None, fill_null=None, cache_dir=None,
        memory_budget=None, stack=None, devices=None, sharding=None, executor="thread"``.

        ``shuffle``: False (source order), ``"global"`` (a uniform pseudorandom permutation of
        all selected rows; needs random access, so Parquet selections are gathered from
        memory when they fit ``memory_budget`` bytes, else from a memory-mapped Arrow IPC
        cache under ``cache_dir``), ``"block"`` (row groups in random order, rows shuffled
        within windows of ``shuffle_window`` row groups; streams, for object storage) or
        True / ``"auto"`` (global where the source is local or in memory, block otherwise).
        ``rank`` / ``world_size`` default to torch.distributed, then jax (process index /
        count, once ``jax.distributed`` is initialized), then RANK / WORLD_SIZE, then 0 / 1;
        every rank gets the same number of rows. ``state_dict()`` is the same on every rank
        and resumes at any world size (elastic). ``output``: "numpy", "torch", "jax"
        or "arrow". ``prefetch`` bounds the bytes read and not yet consumed (a batch larger
        than it is read alone); reads of the random-access table are sized from it, in
        whole batches. ``io_threads``: the most reader threads running ahead (default None:
        the cores this process may run on); how many run is tuned while the epoch runs (one
        more while the consumer waits on reads and the budget allows, one fewer when readers
        idle), never changing a batch. ``transform(batch) -> batch`` runs on every batch, in order.
        ``pad_lists`` pads variable-length list columns to the batch's longest list (or to
        ``pad_to``) with ``pad_value`` and adds ``<name>_lengths``; ``fill_null`` fills nulls
        per column (``"*"``: every numeric one); ``stack={"x": ["f0", "f1"]}`` (or a glob,
        ``"f*"``) gives one ``[batch, k]`` array. Stacked, padded and shuffled batches are
        written into pooled buffers, reused only once nothing refers to them. ``device`` /
        ``devices`` (torch: pinned staging, copies on a CUDA stream) and ``sharding`` (jax)
        place batches on accelerators.
        ``executor="ray"`` runs the CPU-heavy work of the loader as Ray tasks (``ray.init()``
        first, or a running Ray cluster): each read of a unit, with the plan's filters and
        ``map()`` s, and each ``transform=`` call; in flight at most ``prefetch`` bytes, results
        taken in task order, so the batches, ``state_dict()`` and resume are exactly those of
        ``executor="thread"`` (the default). Maps and transforms must be pure functions of
        their batch (no randomness of their own: Ray may run a task again).
        A variable-length list column that is not padded (a ``list<float>`` embedding as
        pandas and pyarrow write it) gives ``[batch, k]`` when its lists share one length
        ``k`` (a view of its values); lists of different lengths are an error naming the
        column and the lengths seen.
        Building the loader counts the selected rows exactly (reading only the filter's
        columns, cached on disk by snapshot) and, for global shuffle, builds the
        random-access table. Every argument is checked first (``ArgumentTypeError``, a
        ``TypeError``, for a wrong type; ``InvalidArgumentError``, a ``ValueError``, for a
        value out of range; both name the argument and the accepted values; numpy integers
        are integers, bools are not), then what the first batches would refuse: ``stack`` /
        ``pad_lists`` / ``fill_null`` names, ragged or null lists, nulls without
        ``fill_null`` (from Parquet footers where every row of the kept row groups is
        selected, exactly on the random-access table).
        """
        from .pipeline.loader import Loader
        opts = resolve_options(batch_size, options, dict(
            shuffle=shuffle, seed=seed, drop_last=drop_last, rank=rank, world_size=world_size, output=output,
            device=device, prefetch=prefetch, io_threads=io_threads, shuffle_window=shuffle_window,
            transform=transform, pad_lists=pad_lists, pad_value=pad_value, pad_to=pad_to, fill_null=fill_null,
            cache_dir=cache_dir, memory_budget=memory_budget, stack=stack, devices=devices, sharding=sharding,
            executor=executor))
        return Loader(self, opts)

    # -- snapshots --------------------------------------------------------
    @property
    def snapshot_id(self) -> str:
        """The data snapshot this dataset reads, as a short string (no I/O): for files
        ``files:`` and a digest of the file list (paths relative to the root, sizes,
        modification times, identities such as S3 ETags or local inodes), so it changes when
        a file is added, removed or rewritten and not between ``al.dataset`` calls on the
        same files; for in-memory data ``memory:`` and a digest of the data; several
        sources (SQL over several datasets) are joined with ``+``.

        >>> import pyarrow as pa, arrowload as al
        >>> al.dataset(pa.table({"x": [1]})).snapshot_id.startswith("memory:")
        True
        """
        return "+".join(s.source.snapshot_id for s in scans(self._plan)) or "none"

    def pin(self) -> "Dataset":
        """This selection bound to its current snapshot: exactly the files listed when the
        dataset was opened, whatever is appended later. No I/O here; every read of the pinned
        dataset (``count``, ``head``, ``to_arrow``, ``to_batches``, ``loader`` ...) first
        checks each file (one stat) and raises ``SnapshotChangedError`` naming a file that
        changed or vanished. ``pinned.save_manifest(path)`` writes the file list, which
        ``al.dataset(path)`` reopens. In-memory data is already its own snapshot."""
        return self._with(with_sources(self._plan, lambda i, src: src.pin()))

    def save_manifest(self, path: str | os.PathLike, *, storage_options: dict | None = None) -> str:
        """Write the snapshot manifest (``formats/snapshot_manifest/v1``) of this dataset's
        files to ``path``, whole or not at all, and return its ``snapshot_id``. ``path`` is a
        local file (written to a temporary file renamed over it) or a URI (``s3://``,
        ``gs://``, ``az://`` ...: one upload, which object stores make visible whole);
        ``storage_options`` as for ``al.dataset`` -- by default a URI on the dataset's own
        store is written with the dataset's credentials.
        The manifest names the files (root URI; per file its path relative to the root,
        size, modification time, ETag / generation / inode where known, rows from its
        footer, partition values), the format and a schema digest; it reads every footer.
        ``al.dataset(path)`` reopens exactly those files (pinned: checked when read), from
        any process. The manifest holds the data, not the selection: filters, columns and
        maps of this dataset are not saved. A dataset over several sources or in-memory data
        has no manifest (``UnsupportedError``)."""
        import json

        from .jsondoc import write_atomic
        from .source.filesystem import protocol_of, write_object
        found = list({id(s.source): s.source for s in scans(self._plan)}.values())
        if len(found) != 1:
            from .errors import UnsupportedError
            raise UnsupportedError(f"a snapshot manifest names the files of one source; this dataset reads "
                                   f"{len(found)} sources: save a manifest per dataset")
        doc = found[0].manifest()
        path = os.fspath(path)
        if protocol_of(path) in (None, "file", "local"):
            if storage_options:
                raise InvalidArgumentError(f"storage_options apply to URIs only; got them with the local path "
                                           f"{path!r}", "storage_options")
            write_atomic(path[len("file://"):] if path.startswith("file://") else path, doc)
        else:
            write_object(path, json.dumps(doc).encode("utf-8"), storage_options, found[0])
        return doc["snapshot_id"]

    def _verify(self) -> None:
        """Pinned sources check their files (a stat each) before a read."""
        for s in scans(self._plan):
            s.source.verify()

    # -- planning ---------------------------------------------------------
    def optimized_plan(self) -> Plan:
        return optimize(self._plan, self._options.optimizer)

    def splits(self) -> list[Split]:
        """The scan tasks the optimized plan reads: one per kept row group (Parquet) or file."""
        return plan_splits(self.optimized_plan())

    def explain(self) -> str:
        """The plan before and after optimization, which rules changed it, and per scan the
        files / row groups / columns / bytes kept vs total (from footers; no data is read).
        A cached selection (``cache()``) says whether its entry exists ("cache hit: <uri>,
        N rows, written <time>" / "cache miss: will write <uri>"); explaining never writes."""
        from .plancache import CacheMissError, CachedSource, peeking
        lines = ["== logical plan =="] + _explain.render_tree(self._plan)
        for s in scans(self._plan):
            if isinstance(s.source, CachedSource):
                lines += ["", f"== plan cache {s.source.entry.key[:12]} ==", "  " + s.source.status(),
                          "  cached plan:"] + ["    " + t for t in _explain.render_tree(s.source.entry.plan)]
        with peeking():
            try:
                return "\n".join(lines + self._explain_optimized())
            except CacheMissError:
                return "\n".join(lines + ["", "== optimized plan ==",
                                          "  (planned over the cached files once they are written)"])

    def _explain_optimized(self) -> list[str]:
        steps = optimize_steps(self._plan, self._options.optimizer)
        final = steps[-1][1] if steps else self._plan
        lines = ["", "== optimized plan =="] + _explain.render_tree(final)
        changed = []
        prev = self._plan
        for name, after in steps:
            if (_explain.render_tree(after) != _explain.render_tree(prev) or
                    [s.notes for s in scans(after)] != [s.notes for s in scans(prev)]) and name not in changed:
                changed.append(name)
            prev = after
        off = [f.name for f in dataclasses.fields(self._options.optimizer)
               if not getattr(self._options.optimizer, f.name)]
        lines += ["", "== rules (al.OptimizerOptions flags) ==", "  applied: " + (", ".join(changed) or "none")]
        if off:
            lines.append("  switched off: " + ", ".join(off))
        under_duckdb = {id(s) for node in walk(final) if isinstance(node, SqlQuery) for s in scans(node)}
        for i, s in enumerate(scans(final)):
            lines += ["", f"== scan {i} ({s.source.kind}: {s.source.display}) =="]
            lines += _explain.render_scan_stats(s)
            if id(s) in under_duckdb and s.projection is None and s.predicate is None:
                lines.append("  (what the plan keeps; DuckDB pushes the query's own filters and columns into "
                             "this scan as it runs, pruning files and row groups: see its plan below)")
        for node in walk(final):
            if isinstance(node, SqlQuery):
                from .scan.duck import explain as duck_explain
                lines += ["", "== duckdb physical plan (filters / projections pushed into each scan) =="]
                lines.append(duck_explain(node, self._options, execute.PLAN_READER))
        return lines

    # -- results ----------------------------------------------------------
    def count(self) -> int:
        """Number of rows: from footers when the plan allows (no filter, or a filter
        decided by statistics), else reading only the filter's columns."""
        self._verify()
        plan = Project(self._plan, ())
        return execute.count_rows(optimize(plan, self._options.optimizer), self._options)

    def head(self, n: int = 5) -> pa.Table:
        """The first ``n`` rows, reading as little as possible (one row group for a plain
        selection).

        Of a plain Parquet / Arrow IPC folder (``al.dataset(path).head(n)``) footers are read
        in file order and no further than the file that completes ``n`` rows: the result has
        the columns and types of the files read, as pyarrow's and polars' scans take them
        from the first file (``schema`` unifies every file; they agree wherever the shards
        do), whether or not other footers were read before.

        The result is a ``pyarrow.Table``; in a notebook it displays as an HTML table of
        its rows (names, types, values), as ``arrowload head`` prints them."""
        limit = Limit(self._plan, n)  # checks n
        self._verify()
        plan = self._plan
        bare = isinstance(plan, Scan) and plan.columns is None and plan.predicate is None and \
            plan.projection is None and plan.limit is None and plan.units is None
        if bare and self._options.optimizer.limit_pushdown:
            first = getattr(plan.source, "head_source", None)
            sub = first(limit.n) if first is not None else None
            if sub is not None:
                limit = Limit(Scan(sub), limit.n)
        table = execute.to_table(optimize(limit, self._options.optimizer), self._options)
        if "IPython" in sys.modules:
            from .display import show_as_rows
            show_as_rows(table)
        return table

    def to_arrow(self) -> pa.Table:
        """The whole selection as a ``pyarrow.Table`` (multi-threaded scan; with a progress
        bar where ``al.set_progress`` allows one)."""
        self._verify()
        plan = self.optimized_plan()
        if _progress.active():
            return _progress.collect(execute.iter_batches(plan, self._options), plan.schema,
                                     total=_progress.expected_rows(plan), desc="to_arrow")
        return execute.to_table(plan, self._options)

    def to_batches(self) -> Iterator[pa.RecordBatch]:
        """Stream the selection as ``pyarrow.RecordBatch`` es, in source order; memory stays
        bounded by the scanner's readahead."""
        self._verify()
        return execute.iter_batches(self.optimized_plan(), self._options)

    def to_polars(self):
        """The whole selection as a ``polars.DataFrame``. A column of a type polars cannot
        import (intervals, unions, 256-bit decimals ...) raises ``UnsupportedError`` before
        anything is read."""
        from .convert.polars_frame import check_polars_schema, to_polars
        found = scans(self._plan)
        origin = found[0].source.display if len(found) == 1 else "the selection"
        check_polars_schema(self.schema, origin)
        return to_polars(self.to_arrow(), origin)

    def to_ray(self, *, parallelism: int | None = None):
        """The selection as a ``ray.data.Dataset`` (the ``ray`` extra), read by Ray tasks
        through this plan: one read task per run of arrowload's kept units (row groups,
        files) in source order, at most ``parallelism`` of them (default: Ray's choice), each
        with its exact row count after the filter and its size in Ray's block metadata
        (``count()`` reads no rows). Ray's ``select_columns`` and expression ``filter`` on the
        result are pushed into this plan (``Dataset.select`` / ``Dataset.filter``). Lazy in
        Ray's way: planning the read counts the selected rows (only the filter's columns,
        cached by snapshot). Ray Data keeps block order only with
        ``DataContext.get_current().execution_options.preserve_order = True``.

        >>> rd = al.dataset("s3://bucket/events/").filter("label = 1").to_ray()  # doctest: +SKIP
        >>> rd.count(), rd.take(1)                                               # doctest: +SKIP
        """
        if parallelism is not None:
            from .pipeline import arguments
            parallelism = arguments.integer("parallelism", parallelism, low=1,
                                            what="None or a positive integer (the most read tasks)", example="8")
        from .scaleout import runtime
        runtime.import_ray()  # a missing Ray says how to install it
        from .scaleout.datasource import to_ray
        return to_ray(self, parallelism)

    def to_pandas(self):
        """The selection as a pandas DataFrame (pyarrow's ``to_pandas``; string / binary
        view columns, and lists of them, as their large equivalents, which pyarrow converts
        inside lists too)."""
        from .plan.rowselect import without_views
        return without_views(self.to_arrow())[0].to_pandas()

    def describe(self, columns: list[str] | str | None = None, *, exact: bool = False):
        """Per-column statistics as a ``polars.DataFrame`` (one row per column: type, rows,
        null_count, min, max, approx_distinct, compressed / uncompressed bytes, source).
        From Parquet footers by default (no data page is read; the ``source`` column says
        when values bound a filtered selection); ``exact=True`` scans the selection once.
        See :func:`arrowload.describe.describe`."""
        from .describe import describe
        return describe(self, columns, exact=exact)

    def __repr__(self) -> str:
        """Schema, sources (files / row groups / rows / bytes), what the plan pushes into
        the scan, and the plan; from footers only, never raises."""
        from .display import dataset_text
        from .plancache import peeking
        with peeking():  # a display never writes a cache entry
            return dataset_text(self)

    def _repr_html_(self) -> str:
        from .display import dataset_html
        from .plancache import peeking
        with peeking():
            return dataset_html(self)


def sql(query: str, *, external_access: bool = True, **tables: Any) -> Dataset:
    """A lazy Dataset defined by SQL (DuckDB dialect) over tables bound by keyword
    (arrowload Datasets, paths / URIs, pyarrow tables, polars or pandas frames); the
    query reads at least one of them (one that reads none is an ExpressionError).

    ``SELECT cols FROM t WHERE ... LIMIT n`` becomes the same plan as
    ``t.filter(...).select(...).limit(n)``; joins, aggregates, windows, ORDER BY and the
    rest run in DuckDB over arrowload's scans, with projections and filters pushed into
    them, and stream back as Arrow.

    ``external_access=True`` (the default) gives the query DuckDB's full reach, as when
    you run DuckDB yourself: table functions such as ``read_csv('...')`` / ``read_text``
    read any file this process can, and extensions may load. Services that pass
    someone else's SQL through must pass ``external_access=False``: DuckDB then runs with
    ``enable_external_access`` off and its configuration locked, so the query sees only
    the bound tables (no file, network, extension install / load, settings or environment
    access; a refusal is an :class:`~arrowload.errors.ExternalAccessError`).

    >>> import pyarrow as pa, arrowload as al
    >>> t = pa.table({"k": ["a", "b", "a"], "v": [1, 2, 3]})
    >>> al.sql("SELECT k, max(v) AS m FROM t GROUP BY k ORDER BY k", t=t).to_arrow().to_pylist()
    [{'k': 'a', 'm': 3}, {'k': 'b', 'm': 2}]
    """
    from .sql.builder import build, parse_query
    if not isinstance(external_access, bool):
        raise ArgumentTypeError(f"external_access must be True or False, got {external_access!r}")
    tree = parse_query(query)
    bound = {name: value if isinstance(value, Dataset) else dataset(value) for name, value in tables.items()}
    plan, first = build(tree, {name: d.plan for name, d in bound.items()}, external_access=external_access,
                        query=query)
    return Dataset(plan, bound[first].options)


def dataset(source: Any, *, format: str | None = None, partitioning: Any = None,
            filesystem: Any = None, storage_options: dict | None = None,
            options: Options | None = None) -> Dataset:
    """Open a lazy Dataset.

    ``source``: a path, URI (``file://``, ``s3://``, ``gs://``, ``az://``, ``memory://``
    ...), directory, glob or a list of them; or a pyarrow Table / RecordBatchReader /
    Dataset, a polars or pandas DataFrame. ``format`` (parquet, ipc / arrow / feather,
    csv, json) is inferred from extensions. Hive folders (``key=value/``) become typed
    columns; ``partitioning=False`` turns that off, a ``pyarrow.Schema`` fixes their types.
    ``filesystem``: any fsspec or pyarrow filesystem; ``storage_options``: fsspec options
    for a URI's filesystem. Files are listed now (a missing path fails here); footers are
    read on first need.
    """
    if options is not None and not isinstance(options, Options):
        raise ArgumentTypeError(f"al.dataset(options=...) takes an al.Options, got {type(options).__name__}: "
                                "al.Options(scan=al.ScanOptions(...))", "options")
    options = options or Options()
    src = open_source(source, format=format, partitioning=partitioning, filesystem=filesystem,
                      storage_options=storage_options, scan_options=options.scan)
    return Dataset(Scan(src), options)


def delta(uri: str | Any, *, version: int | None = None, timestamp: Any = None,
          storage_options: dict | None = None, options: Options | None = None) -> Dataset:
    """Open a Delta Lake table at a pinned version as a lazy Dataset.

    ``uri``: the table's root folder (local path or ``s3://`` / ``gs://`` / ``az://`` URI).
    ``version``: a table version (int); ``timestamp``: a ``datetime`` (naive = UTC) or ISO
    8601 string, the latest version committed at or before it; neither: the latest
    version. ``storage_options``: as for :func:`dataset` (s3fs-style ``key`` / ``secret``
    / ``endpoint_url`` serve the log reader too; upper-case ``AWS_*`` keys go to
    ``deltalake`` only).

    The version's log (read now, by ``deltalake``) says which files are live, their
    partition values and the rows deletion vectors remove; arrowload reads those files
    itself, with the same pruning, counts and loader as any Parquet source: deleted rows
    never appear (``count()``, ``len(loader)`` exact), column-mapped tables read by their
    logical names, a column added later reads as nulls in older files. A reader feature
    arrowload cannot honour raises :class:`~arrowload.errors.UnsupportedTableFeatureError`.
    ``explain()`` and ``repr()`` name the table and its version. ``al.dataset(uri)`` on a
    Delta table's folder is ``al.delta(uri)``.

    >>> t = al.delta("s3://bucket/events", version=12)     # doctest: +SKIP
    >>> t.filter("day >= DATE '2024-01-01'").loader(1024, shuffle=True)  # doctest: +SKIP
    """
    if options is not None and not isinstance(options, Options):
        raise ArgumentTypeError(f"al.delta(options=...) takes an al.Options, got {type(options).__name__}",
                                "options")
    if not isinstance(uri, (str, os.PathLike)):
        raise ArgumentTypeError(f"al.delta() takes the table's path or URI, got {type(uri).__name__}", "uri")
    from .source.delta import open_delta
    from .source.filesystem import check_path
    options = options or Options()
    src = open_delta(check_path(os.fspath(uri)), version=version, timestamp=timestamp,
                     storage_options=storage_options, scan_options=options.scan)
    return Dataset(Scan(src), options)


def iceberg(table: Any, *, snapshot_id: int | None = None, storage_options: dict | None = None,
            options: Options | None = None) -> Dataset:
    """Open an Apache Iceberg table at a pinned snapshot as a lazy Dataset.

    ``table``: a ``pyiceberg`` Table (``catalog.load_table("ns.events")``), or the path /
    URI of one of its ``*.metadata.json`` files, or of its folder (its newest metadata
    file). ``snapshot_id``: a snapshot of the table (``table.snapshots()``); None: the
    current one. ``storage_options``: as for :func:`dataset` (s3fs-style ``key`` /
    ``secret`` / ``endpoint_url``; they open the metadata too); a Table's own FileIO
    properties (``s3.endpoint``, ``s3.access-key-id``, ...) serve when none are given.

    The snapshot's plan (read now, by ``pyiceberg``: ``scan(snapshot_id=...).plan_files()``)
    says which data files are live and which position delete files apply to them;
    arrowload reads those files itself, with the same pruning, counts and loader as any
    Parquet source. Columns are found in each file by field id (a renamed column reads
    from older files under its new name; a column dropped and added again never reads the
    old data; a column added later reads as nulls in older files); rows position deletes
    remove never appear (``count()``, ``len(loader)`` exact). Equality deletes raise
    :class:`~arrowload.errors.UnsupportedTableFeatureError`. ``explain()`` and ``repr()``
    name the table and its snapshot. ``al.dataset(folder)`` on an Iceberg table's folder
    is ``al.iceberg(folder)``.

    >>> t = al.iceberg(catalog.load_table("ns.events"), snapshot_id=42)   # doctest: +SKIP
    >>> t.filter("day >= DATE '2024-01-01'").loader(1024, shuffle=True)   # doctest: +SKIP
    """
    if options is not None and not isinstance(options, Options):
        raise ArgumentTypeError(f"al.iceberg(options=...) takes an al.Options, got {type(options).__name__}",
                                "options")
    from .source.iceberg import open_iceberg
    options = options or Options()
    if isinstance(table, (str, os.PathLike)):
        from .source.filesystem import check_path
        table = check_path(os.fspath(table))
    src = open_iceberg(table, snapshot_id=snapshot_id, storage_options=storage_options,
                       scan_options=options.scan)
    return Dataset(Scan(src), options)
