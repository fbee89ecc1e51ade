"""A mixture's components read one lake once: each unit decoded once for all of them.

Components that are plans over one scan of the **same source** (``al.mix({"web":
ds.filter("src = 'web'"), "code": ds.filter("src = 'code'")})``) would each decode every
unit (row group) of the lake with its own predicate: a mixture of three components decoded
the lake three times. Here they form a group (:class:`Group`): a unit is decoded once, with
the union of the columns its members need, keeping the rows any member may keep (the OR of
their SQL predicates; every row where one has none) -- one ``UnitReader`` over a scan of
those columns: the same decoders (polars prefilters inside its decoder), measurements and
fallbacks as any read. Each
member's predicate is evaluated on the predicate's columns only (a predicate several members
share is evaluated once) and each member takes its rows with its own plan
(``UnitReader.read_decoded``): the same rows, order and errors as its own read.

- Global shuffle: the members' random-access tables are built in **one pass** over the lake
  (``rabuild.build_many``): each unit decoded once and copied into every member's table.
  Where the union can stream and the loader's rule for a streamed build allows it
  (``pipeline.loader._stream_allowed``), that pass is one polars streaming query over the
  union (``Group.union_stream``): its batches are split among the members on a few threads,
  in order, and written at each member's running offset (``rabuild.build_stream_many``).
- None (no shuffle), where the union streams and the loader's rule allows it: one polars
  query over the union for the whole epoch, its batches split among the members and
  queued per member (``mixture.stream``); members that keep the union's columns unchanged
  take positions in each batch (``Group.pick_rows``) instead of filtered copies.
- Block / none otherwise: the members' scans read their units through a :class:`UnitCache`: the
  first member to need a unit decodes it for all; the others' rows wait in the cache
  (capped in bytes, counted in the loader's byte budget) until they are read. Members that
  keep the union's columns unchanged get their rows as positions in the decoded unit
  (``rabuild.Picked``), which a block window writes by position; the others a filtered
  table. The mixture
  visits units in one order for every component (``order.mixture.units_key``), so the
  members need a unit at nearly the same time and the cache hits. Block shuffle, where
  polars decodes the union's units (``decode_many``): once a component's window is
  placed, the units of its next window are decoded on a thread of their own
  (``UnitCache.warm_ahead``, a few at once), while the readers take rows from this one.

A unit that left the cache before every member read it is decoded again: never a wrong
row, only a slower read. Components over other sources, over several scans (SQL joins,
limits) or read by Ray are bound as any loader binds its dataset.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict, deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa

from ..convert.host import true_positions
from ..order import ShuffleKind
from ..plan.nodes import Map, Scan, has_map, scans, walk
from ..scan.units import UnitReader, _evaluate
from ..source.snapshot import miscount_error

#: share of the prefetch budget the decoded-unit cache of block / none shuffles may hold
CACHE_SHARE = 4


class Group:
    """Members (component index -> its ``UnitReader``) over one source: decodes a unit
    once and splits it into every member's rows."""

    def __init__(self, source: Any, options: Any, cache_dir: str | None) -> None:
        self.source = source
        self.options = options
        self.cache_dir = cache_dir
        self.members: dict[int, UnitReader] = {}
        self._local: dict[int, dict[int, int]] = {}  # member -> unit index -> its position
        self._reader: UnitReader | None = None
        self._position: dict[int, int] = {}
        self._query: Any = False  # the union's polars query (union_stream), once compiled
        #: mask key -> the union query's boolean column holding it (``_marked``)
        self._marks: dict[tuple, str] = {}
        #: units may be decoded a few at once by polars (``decode_many``): set per iteration
        #: by the mixture's loader, by the loader's rule for polars reads
        self.polars_decodes = False
        self._lock = threading.Lock()

    def add(self, c: int, reader: UnitReader) -> None:
        with self._lock:
            self.members[c] = reader
            self._local[c] = {u.index: i for i, u in enumerate(reader.units)}
            self._reader = None  # the union of columns changed
            self._query = False
            self._marks = {}

    def units_of(self, c: int) -> tuple[int, ...]:
        """The source's unit indices member ``c`` reads, in its order."""
        return tuple(u.index for u in self.members[c].units)

    def _union_reader(self) -> UnitReader:
        with self._lock:
            if self._reader is None:
                wanted: set[str] = set()
                for r in self.members.values():
                    wanted |= set(r.decoded_columns or ())
                names = tuple(n for n in dict.fromkeys(self.source.schema.names) if n in wanted)
                scan = Scan(self.source, columns=names, predicate=_any_of(list(self.members.values())))
                self._reader = UnitReader(scan, self.options, cache_dir=self.cache_dir)
                self._position = {u.index: j for j, u in enumerate(scan.selected_units())}
            return self._reader

    def split(self, unit: int, raw: pa.Table | None = None) -> dict[int, Any]:
        """Unit ``unit`` (a source unit index) decoded once (or ``raw``: its rows as the
        union reads them, ``decode_many``): each member's rows of it, for the members that
        read it -- a table, or for the members ``picks()`` allows, their rows as positions
        in the decoded unit (``rabuild.Picked``: no filtered copy; whoever writes them takes
        them by position, ``ScanRowSource.read_unit`` otherwise)."""
        from ..pipeline.rabuild import Picked
        if raw is None:
            raw = self._union_reader().read(self._position[unit])
        view, positions, out = self.divide(raw, [c for c in self.members if unit in self._local[c]], self.picks())
        out.update((c, view if rows is None else Picked(view, rows)) for c, rows in positions.items())
        return out

    def split_rows(self, raw: pa.Table, members, masks=None) -> dict[int, pa.Table]:
        """Rows the union read decoded (a unit's, or a stream batch's: ``union_stream``):
        each of ``members``' rows of them, after its whole plan; a predicate several
        members share is evaluated once (``masks``: as ``pick_rows``)."""
        masks = masks or _shared_masks(raw, self._marks)
        return {c: self.members[c].read_decoded(0, raw, masks) for c in members}

    def picks(self) -> tuple[tuple[tuple[str, str], ...], list[int]] | None:
        """``(picks, members)``: the members whose rows are the union's rows their
        predicate keeps with the same columns unchanged (``UnitReader.picks``: ``(output
        name, decoded column)`` each), the first such member's kind; ``pick_rows`` serves
        them as positions, the others take ``split_rows``. None where no member is one."""
        first = next((c for c in self.members if self.members[c].picks), None)
        if first is None:
            return None
        picks, schema = self.members[first].picks, self.members[first].plan.schema
        chosen = [c for c in self.members
                  if self.members[c].picks == picks and self.members[c].plan.schema.equals(schema)]
        return picks, chosen

    def pick_rows(self, raw: pa.Table, members, masks=None) -> dict[int, np.ndarray | None]:
        """Each of ``members``' rows of ``raw`` as positions (None: every row), for members
        ``picks`` allows; a predicate several members share is evaluated once (``masks``:
        a ``_shared_masks`` of ``raw`` to share with other calls)."""
        masks = masks or _shared_masks(raw, self._marks)
        out: dict[int, np.ndarray | None] = {}
        for c in members:
            mask = self.members[c].keep_mask(raw, masks)
            if mask is None:
                out[c] = None
            else:
                out[c] = true_positions(mask)  # bits unpacked: 3x cheaper than Arrow's to_numpy
        return out

    def divide(self, raw: pa.Table, members, found) -> tuple[pa.Table | None, dict, dict]:
        """Rows the union decoded (a unit's, a stream batch's) among ``members``: ``(view,
        positions, tables)``. Members ``found`` (``picks()``'s answer) allows take their rows
        as positions (``positions[c]``, None: every row) in ``view``, the decoded columns
        they keep under their output names; the others their rows after their plans
        (``tables[c]``). Each predicate is evaluated once for all of them."""
        masks = _shared_masks(raw, self._marks)
        plain = [c for c in members if found is not None and c in found[1]]
        view, positions = None, {}
        if plain:
            view = pa.Table.from_arrays([raw.column(col) for _, col in found[0]],
                                        names=[name for name, _ in found[0]])
            positions = self.pick_rows(raw, plain, masks)
        rest = [c for c in members if c not in positions]
        return view, positions, self.split_rows(raw, rest, masks) if rest else {}

    def union_stream(self):
        """The polars query that reads the union's units (``scan/stream.py``: in source
        order, or a few at once, ``decode_many``), or None where it cannot; compiled once
        for the members it has. Where every member takes its rows as positions
        (``picks``), it gives the members' output columns and, instead of the columns their
        predicates read, each predicate's mask as a boolean column polars evaluates
        (``_marked``)."""
        reader = self._union_reader()
        with self._lock:
            if self._query is False:
                from ..scan.stream import StreamQuery
                query = StreamQuery.compile(reader.scan, self.options)
                self._query = self._marked(query) if query is not None else None
            return self._query

    def _marked(self, query):
        """``query`` giving the members' masks (``StreamQuery.marked``) where every member
        is served by positions (``picks``) and polars translates each predicate whole: the
        predicates' columns are neither decoded to Arrow nor evaluated again per batch
        (``_shared_masks`` takes the mask columns). ``query`` itself otherwise. Lock held."""
        found = self.picks()
        if found is None or len(found[1]) != len(self.members):
            return query
        keys: dict[tuple, str] = {}
        marks = []
        for r in self.members.values():
            key = r.mask_key
            if key is not None and key not in keys:
                keys[key] = name = f"__arrowload_mask_{len(marks)}"
                marks.append((name, r.scan.predicate))
        got = query.marked(list(dict.fromkeys(col for _, col in found[0])), marks)
        if got is None:
            return query
        self._marks = keys
        return got

    def decode_many(self, units: list[int]) -> list[pa.Table] | None:
        """``units`` (source unit indices) as the union reads them, decoded by polars at once
        (``StreamQuery.unit_tables``: side by side on its pool), where the mixture's loader
        allows it (``polars_decodes``), the union's polars query reads them as the union
        reader does and polars is imported (else its import starts in the background);
        None otherwise, or where the query fails."""
        from ..scan.decoders import recoverable
        from ..scan.stream import forked_with_polars, polars_ready
        if not self.polars_decodes or len(units) < 2 or forked_with_polars() or not polars_ready():
            return None
        query = self.union_stream()
        if query is None:
            return None
        try:
            return query.unit_tables([self._position[u] for u in units])
        except BaseException as exc:  # noqa: BLE001 - polars panics are BaseExceptions
            if not recoverable(exc):
                raise
            return None

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()


def _held_bytes(parts: list) -> int:
    """Bytes ``parts`` (tables, ``rabuild.Picked``) hold: a table several picks share, once."""
    seen: set[int] = set()
    total = 0
    for part in parts:
        table = getattr(part, "table", part)
        if id(table) not in seen:
            seen.add(id(table))
            total += table.nbytes
    return total


def _shared_masks(raw: pa.Table, marks: dict[tuple, str] | None = None):
    """``masks(key, expr, columns)`` over ``raw``: each predicate (``UnitReader.mask_key``)
    evaluated once, or read from ``raw``'s column ``marks[key]`` where it has one (the union
    query's masks, evaluated by polars: ``Group._marked``)."""
    found: dict[Any, pa.ChunkedArray] = {}
    named = set(raw.column_names) if marks else ()

    def masks(key, expr, columns) -> pa.ChunkedArray:
        got = found.get(key)
        if got is None:
            mark = marks.get(key) if marks else None
            got = found[key] = raw.column(mark) if mark in named else \
                _evaluate(raw.select(list(columns)), [expr], ["_"])[0]
        return got
    return masks


def _any_of(readers: list[UnitReader]):
    """The OR of the readers' pushed predicates (SQL), which the shared decode may filter
    by: a row no member keeps is dropped there (polars prefilters it inside its decoder);
    None (decode every row) where a member keeps every row, has a computed column that
    must see every row (``UnitReader.sees_every_row``) or a predicate that is not SQL."""
    from ..plan.expr import SqlExpr, disjoin
    from ..plan.fingerprint import sql_tree
    preds, seen = [], []
    for r in readers:
        pred = r.scan.predicate
        if pred is None or r.sees_every_row or not isinstance(pred, SqlExpr):
            return None
        shape = sql_tree(pred.node, resolved=True)  # the same predicate once (simple or sqlglot tree)
        if shape not in seen:
            seen.append(shape)
            preds.append(pred)
    return disjoin(preds)


def _ordered_map(fn, items, workers: int):
    """``fn`` of each item on ``workers`` threads, results in the items' order; at most
    twice ``workers`` items in flight (a stream's batches are taken as results are)."""
    with ThreadPoolExecutor(workers, thread_name_prefix="arrowload-table") as pool:
        pending: deque = deque()
        try:
            for item in items:
                pending.append(pool.submit(fn, item))
                if len(pending) > 2 * workers:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for f in pending:
                f.cancel()


class UnitCache:
    """Members' rows of the units a :class:`Group` decoded, until each member read them.

    ``get(c, unit)``: member ``c``'s rows of ``unit``; the first member to ask decodes the
    unit for all (the others wait for that decode, not decode it again). An entry leaves
    when every member that reads the unit took its rows, or, oldest first, when the rows
    held pass ``capacity`` bytes; a member asking for a unit no longer held decodes it
    again. ``peak``: the most bytes held at once."""

    def __init__(self, group: Group, capacity: int) -> None:
        self.group = group
        self.capacity = capacity
        self._lock = threading.Lock()
        self._entries: OrderedDict[int, tuple[Future, set]] = OrderedDict()
        self._sizes: dict[int, int] = {}
        #: units every member took in this iteration: a warm-up does not decode them again (the
        #: members hold their rows while they read them; a member asking again decodes anew)
        self._done: set[int] = set()
        self.held = 0
        self.peak = 0
        #: how a reader waits for a unit another thread decodes (``Readers.wait``: helping)
        self.wait: Any = None
        self._ahead: ThreadPoolExecutor | None = None  # warm_ahead's thread, made on first use
        self._ahead_job: Future | None = None
        self._ahead_pid = os.getpid()  # the process whose thread runs it (not a forked child)
        self._largest = 0  # the most bytes one decoded unit held: what a look-ahead may add
        self._closed = False
        self._halt = False  # the running look-ahead stops at its next group (clear, close)

    def warm(self, unit: int) -> None:
        """Decode ``unit`` for the members now (their ``get`` takes the rows later), unless it
        is held, being decoded or already taken by every member in this iteration."""
        with self._lock:
            if unit in self._entries or unit in self._done:
                return
        self._fetch(None, unit)

    def warm_many(self, units: list[int]) -> None:
        """Decode ``units`` for the members now, together (``Group.decode_many``: polars side
        by side), those not held, being decoded or taken by every member already; where they
        cannot be decoded together, each is decoded when a member asks for it."""
        with self._lock:
            mine = [u for u in dict.fromkeys(units) if u not in self._entries and u not in self._done]
            entries = {u: (Future(), set()) for u in mine}
            self._entries.update(entries)
        if not mine:
            return
        raws, k = None, 0
        try:
            raws = self.group.decode_many(mine)
            if raws is not None:
                for k, (u, raw) in enumerate(zip(mine, raws)):
                    self._settle(u, entries[u][0], None, lambda u=u, raw=raw: self.group.split(u, raw))
                k = len(mine)
        finally:
            left = mine[k:]
            if left:  # not decoded here: the members' gets decode them one by one
                with self._lock:
                    for u in left:
                        if self._entries.get(u) is entries[u]:
                            self._drop(u)
                for u in left:
                    if not entries[u][0].done():
                        entries[u][0].set_result(None)

    def warm_ahead(self, units: list[int]) -> None:
        """``warm_many(units)`` on a thread of its own, now, while the readers go on (the
        next block window's units: polars decodes them while the readers place and gather
        the current one). Only where polars decodes the group's units together
        (``Group.polars_decodes``) and no earlier look-ahead still runs; a few units at a
        time, each group only while it fits the cache's capacity beside what it holds
        (else it would push out units members still need, decoded again)."""
        with self._lock:
            self._forget_if_forked()
            if self._closed or not self.group.polars_decodes or (
                    self._ahead_job is not None and not self._ahead_job.done()):
                return
            if self._ahead is None:
                self._ahead = ThreadPoolExecutor(1, thread_name_prefix="arrowload-ahead")
            self._ahead_job = self._ahead.submit(self._warm_quietly, list(units))

    def _warm_quietly(self, units: list[int]) -> None:
        from ..pipeline.rowsource import window_step
        step = window_step()  # a few at once, as a window's own reads: peak memory stays down
        try:
            for k in range(0, len(units), step):
                group = units[k:k + step]
                with self._lock:
                    fits = 0 < self._largest and self.held + self._largest * len(group) <= self.capacity
                if self._closed or self._halt or not fits:
                    return
                self.warm_many(group)
        except Exception:  # noqa: BLE001 - a failed decode is the member's to raise, on its own read
            pass

    def _forget_if_forked(self) -> bool:
        """In a process forked from the one that started the look-ahead: forget its thread
        and job (neither is in this process; waiting on the job would wait forever)."""
        if self._ahead_pid == os.getpid():
            return False
        self._ahead, self._ahead_job, self._ahead_pid = None, None, os.getpid()
        return True

    def _settle_ahead(self) -> None:
        """Wait for the look-ahead decode running, if any (a new iteration or the close)."""
        if self._forget_if_forked():
            return
        job = self._ahead_job
        if job is not None:
            self._halt = True
            job.cancel()
            try:
                job.result()
            except BaseException:  # noqa: BLE001 - cancelled, or failed quietly
                pass
            self._halt = False

    def close(self) -> None:
        """Stop looking ahead; returns once the running look-ahead decode ended (no polars
        read outlives the loader)."""
        with self._lock:
            self._closed = True
        self._settle_ahead()
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.shutdown(wait=True)

    def get(self, c: int, unit: int) -> pa.Table:
        return self._fetch(c, unit)

    def _fetch(self, c: int | None, unit: int) -> pa.Table | None:
        while True:
            with self._lock:
                entry = self._entries.get(unit)
                owner = entry is None
                if owner:
                    entry = (Future(), set())
                    self._entries[unit] = entry
            fut, taken = entry
            if owner:
                self._settle(unit, fut, c, lambda: self.group.split(unit))
            if c is None:
                return None
            wait = self.wait
            tables = wait(fut) if wait is not None and not owner else fut.result()
            if tables is None:
                continue  # a batch decode gave up on it (warm_many): decoded by whoever asks first
            break
        with self._lock:
            taken.add(c)
            if self._entries.get(unit) is entry and taken >= set(tables):
                self._drop(unit)
                self._done.add(unit)
        return tables[c]

    def _settle(self, unit: int, fut: Future, c: int | None, split) -> None:
        """Decode and split ``unit`` (``split()``) into its entry's future, counting what it
        holds (all but member ``c``'s rows, which ``c`` takes at once)."""
        try:
            tables = split()
        except BaseException as exc:  # noqa: BLE001 - re-raised by each waiting member
            with self._lock:
                self._drop(unit)
            fut.set_exception(exc)
            raise
        size = _held_bytes([t for k, t in tables.items() if k != c])
        fut.set_result(tables)
        with self._lock:
            self._largest = max(self._largest, size)
            if unit in self._entries:
                self._sizes[unit] = size
                self.held += size
                self.peak = max(self.peak, self.held)
                while self.held > self.capacity and len(self._entries) > 1:
                    self._drop(next(iter(self._entries)))

    def clear(self) -> None:
        """Forget every held unit and the peak (a new iteration starts: the previous one's
        look-ahead ended first)."""
        self._settle_ahead()
        with self._lock:
            self._entries.clear()
            self._sizes.clear()
            self._done.clear()
            self.held = self.peak = 0

    def _drop(self, unit: int) -> None:
        self._entries.pop(unit, None)
        self.held -= self._sizes.pop(unit, 0)


def shareable(plan, options) -> Any | None:
    """The source a component's plan can share decodes of (a plan over one scan, read here,
    not by Ray), else None."""
    from ..pipeline.rowsource import _one_scan
    if options.executor != "thread" or not _one_scan(plan):
        return None
    scan = scans(plan)[0]
    return scan.source


class SharedSources:
    """The random-access layers of a mixture's components, bound once for the groups
    sharing a source: ``source(c, dataset, plan, kind)`` is the hook each component's
    ``Loader`` binds through (None: it binds on its own)."""

    def __init__(self, datasets, options, cache_dir: str, max_readers: int) -> None:
        self.options = options
        self.cache_dir = cache_dir
        self.max_readers = max_readers
        self.datasets = list(datasets)
        self.plans = [ds.optimized_plan() for ds in self.datasets]
        by_source: dict[int, list[int]] = {}
        for c, plan in enumerate(self.plans):
            src = shareable(plan, options)
            if src is not None:
                by_source.setdefault(id(src), []).append(c)
        self.group_of: dict[int, int] = {}
        self.members: list[list[int]] = []
        for cs in by_source.values():
            if len(cs) > 1:
                for c in cs:
                    self.group_of[c] = len(self.members)
                self.members.append(cs)
        self.groups: list[Group | None] = [None] * len(self.members)
        self.caches: list[UnitCache | None] = [None] * len(self.members)
        self._tables: dict[int, Any] = {}
        #: component -> (the table its rows are a slice of, its first row there, its source)
        self.joint: dict[int, tuple[Any, int, Any]] = {}
        self._built: set[int] = set()
        self._lock = threading.Lock()

    @property
    def cache_bytes(self) -> int:
        """What the decoded-unit caches may hold at once (taken out of the prefetch budget)."""
        return self.options.prefetch // CACHE_SHARE if any(self.caches) else 0

    def peak(self) -> int:
        """The most bytes the decoded-unit caches held in the current (or last) iteration."""
        return sum(c.peak for c in self.caches if c is not None)

    def restart(self) -> None:
        """A new iteration: the caches start empty (rows of an iteration that ended before
        every member took them are not kept)."""
        for c in self.caches:
            if c is not None:
                c.clear()

    def _group(self, g: int, dataset) -> Group:
        if self.groups[g] is None:
            src = scans(self.plans[self.members[g][0]])[0].source
            self.groups[g] = Group(src, dataset.options, self.cache_dir)
        return self.groups[g]

    def source(self, c: int, dataset, plan, kind: ShuffleKind):
        """Component ``c``'s row source when it shares decodes, else None."""
        from ..pipeline.rowsource import ScanRowSource
        g = self.group_of.get(c)
        if g is None or dataset is not self.datasets[c]:
            return None  # not shared, or rebound to a loaded state's snapshot
        with self._lock:
            if kind is ShuffleKind.GLOBAL:
                if g not in self._built:
                    self._built.add(g)
                    self._build_tables(g, dataset)
                return self._tables.pop(c, None)
            group = self._group(g, dataset)
            src = ScanRowSource(plan, dataset.options, self.cache_dir, self.max_readers)
            if src.reader.decoded_columns is None:
                return src
            group.add(c, src.reader)
            if self.caches[g] is None:
                self.caches[g] = UnitCache(group, self.options.prefetch // CACHE_SHARE)
            cache, units = self.caches[g], src.units
            src._read = lambda i: cache.get(c, units[i])
            src._warm = lambda positions: cache.warm_many([units[i] for i in positions])
            src._warm_ahead = lambda positions: cache.warm_ahead([units[i] for i in positions])
            return src

    def _build_tables(self, g: int, dataset) -> None:
        """Every member's random-access table in one pass over the lake (members that have
        a reusable disk cache open it; members the build cannot hold bind on their own)."""
        from ..pipeline import rabuild
        from ..pipeline.rowsource import ScanRowSource, TableRowSource, _digest, _surely_spills, cached_table
        o = self.options
        budget = o.memory_budget if o.memory_budget is not None else _total_memory() // 4
        stack = o.stack if o.output != "arrow" and o.transform is None else None
        todo, sources = [], []
        for c in self.members[g]:
            plan = self.plans[c]
            reuse = all(not isinstance(n, Map) or bool(n.name) for n in walk(plan))
            found = cached_table(plan, self.cache_dir, reuse)
            if found is not None:
                self._tables[c] = found
            elif not _surely_spills(scans(plan), budget):
                todo.append(c)
        if len(todo) < 2:
            return
        group = self._group(g, dataset)
        try:
            for c in todo:
                src = ScanRowSource(self.plans[c], self.datasets[c].options, self.cache_dir, self.max_readers)
                sources.append(src)
                group.add(c, src.reader)
            units = sorted({u for c in todo for u in group.units_of(c)})
            places = [{u: i for i, u in enumerate(group.units_of(c))} for c in todo]
            # members with one schema share one table, one after the other (target, its
            # first unit there, its first row there)
            schemas: list[pa.Schema] = []
            at: list[tuple[int, int, int]] = []
            counts: list[list[int]] = []
            for c, src in zip(todo, sources):
                schema = self.plans[c].schema
                t = next((j for j, s in enumerate(schemas) if s.equals(schema, check_metadata=True)), None)
                if t is None:
                    t = len(schemas)
                    schemas.append(schema)
                    counts.append([])
                at.append((t, len(counts[t]), sum(counts[t])))
                counts[t].extend(int(n) for n in src.counts)

            def read(k: int) -> list:
                got = group.split(units[k])
                out = []
                for c, src, where, (t, first, _) in zip(todo, sources, places, at):
                    i = where.get(units[k])
                    if i is None:
                        continue
                    table = got[c]
                    if table.num_rows != src.counts[i]:
                        raise miscount_error(f"unit {i} of component {c}", table.num_rows, src.counts[i],
                                             src.source, has_map(src.plan),
                                             "the mixture loader")
                    out.append((t, first + i, table))
                return out

            tables = self._streamed(group, todo, sources, at, schemas, stack, budget)
            if tables is rabuild.UNITS:
                from ..options import usable_cores
                tables = rabuild.build_many(read, len(units), counts, schemas, stack=stack, memory_budget=budget,
                                            threads=usable_cores())
        finally:
            for src in sources:
                src.close()
            group.close()
        if tables is None:
            return  # over the budget: each binds on its own (and spills to its disk cache)
        snapshot = _digest(group.source.fingerprint())
        for c, src, (t, _, row) in zip(todo, sources, at):
            n = int(sum(src.counts))
            found = TableRowSource(tables[t].slice(row, n), where="memory", snapshot=snapshot,
                                   schema=self.plans[c].schema)
            self._tables[c] = found
            self.joint[c] = (tables[t], row, found)

    def _streamed(self, group: Group, todo: list[int], sources: list, at: list, schemas: list, stack,
                  budget: int):
        """The members' tables filled from one polars streaming query over the union of
        their reads (``rabuild.build_stream_many``; each batch split among the members as a
        shared unit is), where the union can stream and the loader's rule for a streamed
        table build allows it (``pipeline.loader._stream_allowed``); else, or where the query
        fails or gives a member other rows than counted, ``rabuild.UNITS`` (read per unit)."""
        from ..pipeline import rabuild
        from ..pipeline.loader import _stream_allowed
        from ..scan.stream import forked_with_polars
        query = group.union_stream()
        if query is None or not query.units or forked_with_polars():
            return rabuild.UNITS
        unit = max(max((src.est_bytes(i) for i in range(len(src.counts))), default=0) for src in sources)

        def read() -> int:  # the largest member's read (the union reads at least that)
            return max(sum(src.read_bytes(i) for i in range(len(src.counts))) for src in sources)

        if not _stream_allowed(query, unit, read, prefetch=self.options.prefetch):
            return rabuild.UNITS
        members = [(t, row, int(sum(src.counts))) for src, (t, _, row) in zip(sources, at)]
        index = {c: m for m, c in enumerate(todo)}
        found = group.picks()

        def split(batch):
            view, positions, tables = group.divide(pa.Table.from_batches([batch]), todo, found)
            # rows as positions in the batch, written from it: no filtered copy
            out = [(index[c], view if rows is None else rabuild.Picked(view, rows)) for c, rows in positions.items()]
            return out + [(index[c], table) for c, table in tables.items()]

        from ..options import usable_cores
        parts = _ordered_map(split, query.batches(0, len(query.units) - 1, 0, None), usable_cores())
        return rabuild.try_stream(lambda: rabuild.build_stream_many(parts, members, schemas, stack=stack,
                                                                    memory_budget=budget))

    def joint_table(self, sources: list) -> tuple[Any, list[int]] | None:
        """``(table, first rows)`` where every component's row source is its slice of one
        shared table (global shuffle over one lake, one schema): a batch is then one gather
        from that table. None otherwise."""
        found = [self.joint.get(c) for c in range(len(sources))]
        if not found or any(f is None or f[2] is not s for f, s in zip(found, sources)):
            return None
        table = found[0][0]
        if any(f[0] is not table for f in found):
            return None
        return table, [f[1] for f in found]

    def close(self) -> None:
        for c in self.caches:
            if c is not None:
                c.close()
        for g in self.groups:
            if g is not None:
                g.close()


def _total_memory() -> int:
    from ..pipeline.loader import _total_memory as total
    return total()


__all__ = ["CACHE_SHARE", "Group", "SharedSources", "UnitCache", "shareable"]
