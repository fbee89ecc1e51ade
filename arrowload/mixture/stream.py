"""An unshuffled mixture over one lake read through one polars streaming query.

The components of a mixture over one lake (a :class:`~arrowload.mixture.shared.Group`) read
without shuffle take their rows in source order: block ``b`` holds rows ``[s_c(b), s_c(b) +
n_c(b))`` of each component's rows in lake order (``order.mixture.Schedule``). One streaming
query over the union of their reads (``Group.union_stream``: the OR of their predicates,
the union of their columns) yields every row any of them keeps, in lake order; each of its
batches is split among the members on a few threads, in order, and queued per member:
members that keep the union's columns unchanged (``Group.picks``) as positions in the batch,
converted to host arrays once (``Group.pick_rows``), the others as their rows after their
whole plan (``Group.split_rows``), each converted (:class:`Rows`). A task (a few consecutive blocks of this rank)
takes, per component, the rows its blocks hold from the head of that component's queue,
after dropping the rows before them (other ranks' blocks). The rows, order and batches are
those of the per-unit path (``MixtureLoader._component_rows``); only where they come from
differs.

Bounded: a component's rows may arrive far ahead of their turn (a lake sorted by the
component's column: the stream must pass all of one component to reach the next). Before
the epoch, :func:`stream_span` works out from the components' exact per-unit counts and the
schedule's arithmetic how many bytes the queues would hold at most; over a quarter of
``prefetch`` (``QUEUE_SHARE``, the share the decoded-unit cache of ``mixture.shared`` has
otherwise) the epoch reads per unit. While it runs, queues over that bound plus a task's
rows (a task fills each component in turn) and a unit (a polars batch may span units)
end the stream too.

Polars not imported yet: the first tasks read per unit while it imports on a thread of its
own, and the query opens at the first task after (forced on, ``ARROWLOAD_STREAM=1``, every
task waits for it).

Tasks run on the reader threads in submission order (FIFO): a task waits for the one before
it to have taken its rows, as ``pipeline.streamreads.StreamReads`` does. Failure (a polars
error, fewer rows than counted, the queues over their bound): this task and every later
one read on the per-unit path, whose rows or error are the answer.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import CancelledError

import numpy as np
import pyarrow as pa

from ..plan.rowselect import take_rows
from ..pipeline.chunks import HostChunk, _row_items, _scatter_rows, _take_rows
from ..pipeline.streamreads import merge_ranges
from ..scan.decoders import recoverable
from ..scan.stream import forked_with_polars, polars_ready

#: what the queues may hold, as a share of the prefetch budget (the decoded-unit cache's)
QUEUE_SHARE = 4


def stream_span(union_units: tuple[int, ...], members: list[tuple[tuple[int, ...], tuple[int, ...]]],
                row_bytes: list[float], phase_start: int, offsets: tuple[int, ...], q: tuple[int, ...],
                batch_size: int, first_block: int, stop_block: int, drawn_first: tuple[int, ...],
                drawn_stop: tuple[int, ...]) -> tuple[np.ndarray, int, float] | None:
    """What the stream over ``union_units`` (source unit indices, in order) holds queued
    while it serves the blocks ``[first_block, stop_block)``, read unit by unit.

    ``members[c] = (units, counts)``: component ``c``'s units (source indices) and its rows
    in each; ``row_bytes[c]`` its decoded bytes per row; ``drawn_first`` / ``drawn_stop``
    each component's stream index at the first block and past the last. From
    ``phase_start`` on, component ``c`` draws ``offsets[c] + cumulative_c(b - phase_start)``
    rows by block ``b``, within a few rows of ``B q_c / Q`` per block (``order.mixture``):
    the queues are taken on that line (a few rows either way, against units of rows).
    Unit ``j`` is read when the first block the units before it cannot serve comes; the
    queues then hold its rows and those the blocks served so far left.

    The answer: ``(rows, first unit, peak bytes)``: ``rows[j, c]``, component ``c``'s rows
    in union units before position ``j`` (``[J + 1, m]``), the union position the stream
    starts at, and the most bytes queued; None where a component's unit is outside the
    union or a component is drawn past its pass (the stream reads one pass)."""
    from ..order.mixture import Q
    m = len(members)
    pos = {u: j for j, u in enumerate(union_units)}
    per = np.zeros((len(union_units), m), dtype=np.int64)
    for c, (units, counts) in enumerate(members):
        for u, n in zip(units, counts):
            j = pos.get(u)
            if j is None:
                if n:
                    return None
                continue
            per[j, c] = n
    rows = np.zeros((len(union_units) + 1, m), dtype=np.int64)
    np.cumsum(per, axis=0, out=rows[1:])
    total = rows[-1]
    first = np.asarray(drawn_first, dtype=np.int64)
    stop = np.asarray(drawn_stop, dtype=np.int64)
    if np.any(stop > total):
        return None  # a second pass (or a count the stream cannot hold): per unit
    live = stop > first
    if not live.any():
        return None
    # the union position holding each live component's first row of the span
    starts = [int(np.searchsorted(rows[1:, c], first[c], side="right")) for c in range(m) if live[c]]
    j0 = min(starts)
    avail = np.minimum(rows[j0 + 1:], stop[None, :]).astype(np.float64)  # after reading each unit
    rate = np.asarray(q, dtype=np.float64) * batch_size / Q  # rows per block
    off = np.asarray(offsets, dtype=np.float64)
    # the blocks the rows read so far serve: the least, over the components drawing, of
    # the blocks their rows cover
    drawing = rate > 0
    if not drawing.any():
        return None
    k = np.min(np.where(drawing[None, :], (avail - off[None, :]) / np.where(drawing, rate, 1.0)[None, :],
                        np.inf), axis=1) + phase_start
    k = np.clip(k, first_block, stop_block)
    # unit j is read when a block the units before it cannot serve comes: the queues then
    # hold its rows and those the blocks served so far left
    before = np.concatenate([[float(first_block)], k[:-1]])
    consumed = np.maximum(off[None, :] + rate[None, :] * (before - phase_start)[:, None], first[None, :])
    held = np.maximum(0.0, avail - consumed) @ np.asarray(row_bytes, dtype=np.float64)
    return rows, j0, float(held.max()) if held.size else 0.0


class MixStream:
    """Component rows of an unshuffled mixture over one lake from one polars query (see the
    module doc). ``query``: the union's ``StreamQuery``; ``group``: the members' ``Group``;
    ``rows``: ``stream_span``'s per-unit cumulative counts (union positions); ``stop``:
    each component's stream index past the epoch's last block; ``cap``: the queues' bound in
    bytes; ``workers``: threads splitting batches."""

    def __init__(self, query, group, rows: np.ndarray, stop: tuple[int, ...], cap: int, workers: int,
                 last_unit: int, conv=None, wait_import: bool = False) -> None:
        self.query = query
        self.wait_import = wait_import  # the stream forced on: every task waits for polars' import
        self.conv = conv
        self.group = group
        self.rows = rows
        self.stop = tuple(int(x) for x in stop)
        self.cap = cap
        self.workers = workers
        self.last_unit = last_unit
        m = len(self.stop)
        self._queues: list[deque] = [deque() for _ in range(m)]
        self._head = [0] * m  # each queue's first row: its component stream index
        self._from = [0] * m  # each component's next row when the query opened: rows before it are not queued
        self._count = [0] * m
        self._bytes = [0] * m
        self._it = None
        self._source = None
        self._next = 0  # the next task's first block (index into this rank's blocks)
        self._cond = threading.Condition()
        self._closed = False
        self.failed: BaseException | str | None = None
        self.queries = 0
        self.picked = 0  # stream batches served as positions (Group.pick_rows), not filtered copies
        self.peak = 0

    def take(self, first: int, stop: int, pieces: list[list[tuple[int, int]]],
             nexts: tuple[int, ...]) -> list[list[Rows]] | None:
        """The rows of the task of blocks ``[first, stop)``: per component the parts
        (:class:`Rows`) of its stream ranges ``pieces[c]`` in order; None: read it per unit
        (see the module doc). ``nexts``: each component's stream index at the task's first
        block (its next row, whether or not it draws in this task). Waits for the tasks
        before it."""
        with self._cond:
            while not self._closed and self._next < first:
                self._cond.wait(0.05)
            if self._closed or self._next > first:
                return None  # closed, or this task's turn is past (it is read again): per unit
            try:
                if self.failed is not None:
                    return None
                if self._it is None:
                    if forked_with_polars():
                        return None  # polars' pool did not survive this process's fork: per unit
                    if not polars_ready(wait=self.wait_import):
                        return None  # its import runs on a thread of its own: per unit meanwhile
                    self._open(nexts)
                try:
                    return [self._take(c, ranges) for c, ranges in enumerate(pieces)]
                except BaseException as exc:  # noqa: BLE001 - polars panics are BaseExceptions
                    if self._closed or not recoverable(exc):
                        raise  # closed: the read ends here, not per unit
                    self._fail(exc)
                    return None
            finally:
                self._next = stop
                self._cond.notify_all()

    def _open(self, nexts: tuple[int, ...]) -> None:
        """Start the query at the union unit holding the first row any component takes
        from here on (lock held): the queues' heads are the components' rows before that
        unit. Every component that draws again counts, not only those drawing in the first
        task: a later draw cannot go back before the unit the query starts at."""
        rows = self.rows
        firsts = [int(np.searchsorted(rows[1:, c], nexts[c], side="right"))
                  for c in range(len(self.stop)) if nexts[c] < self.stop[c]]
        j0 = min(firsts) if firsts else 0
        self._head = [int(x) for x in rows[j0]]
        self._from = [int(x) for x in nexts]
        from .shared import _ordered_map
        members = list(self.group.members)

        conv = self.conv
        found = self.group.picks() if conv is not None else None

        def split(batch: pa.RecordBatch) -> dict[int, list[Rows]]:
            # on the splitting threads. Members that keep their rows unchanged: the batch
            # converted to host arrays once, each member's rows as positions in it; the
            # others: their rows after their plans, each converted
            raw = pa.Table.from_batches([batch])
            view, positions, tables = self.group.divide(raw, members, found)
            out: dict[int, list[Rows]] = {}
            if view is not None:  # one chunk per column: the batch's own arrays
                picked = pa.RecordBatch.from_arrays([c.chunk(0) for c in view.columns], names=view.column_names)
                host = conv.chunk(picked)
                if isinstance(host, HostChunk):
                    self.picked += 1
                    out = {c: [Rows(picked, host, idx)] if idx is None or len(idx) else []
                           for c, idx in positions.items()}
                else:  # does not convert whole: these members' rows after their plans too
                    tables.update(self.group.split_rows(raw, list(positions)))
            for c, table in tables.items():
                out[c] = [Rows.of(b, conv) for b in table.to_batches() if b.num_rows]
            return out

        self._source = self.query.batches(j0, self.last_unit, 0, None)
        self._it = _ordered_map(split, self._source, self.workers)
        self.queries += 1

    def _take(self, c: int, ranges: list[tuple[int, int]]) -> list:
        out: list = []
        for lo, hi in merge_ranges(ranges):  # a block's rows follow the block before it's
            if lo < self._head[c]:  # before the query's start (a bug): per unit, whose rows are right
                raise _Short(f"component {c}'s row {lo} comes before the stream's head {self._head[c]}")
            self._fill(c, hi)
            self._drop(c, lo)
            queue, got = self._queues[c], 0
            while got < hi - lo:
                b = queue.popleft()
                n = min(b.num_rows, hi - lo - got)
                if n < b.num_rows:
                    queue.appendleft(b.slice(n))
                    b = b.slice(0, n)
                out.append(b)
                got += n
            self._head[c] = hi
            self._count[c] -= got
        self._bytes[c] = sum(p.nbytes for p in self._queues[c])
        return out

    def _drop(self, c: int, lo: int) -> None:
        """Drop component ``c``'s queued rows before stream index ``lo``."""
        queue = self._queues[c]
        while self._head[c] < lo:
            b = queue.popleft()
            n = min(b.num_rows, lo - self._head[c])
            if n < b.num_rows:
                queue.appendleft(b.slice(n))
            self._head[c] += n
            self._count[c] -= n

    def _fill(self, c: int, hi: int) -> None:
        """Pull batches until component ``c`` holds its rows up to ``hi`` (lock held)."""
        while self._head[c] + self._count[c] < hi:
            if self._closed:  # set by close() without the lock this read holds
                raise CancelledError("the loader was closed while its mixture stream was read")
            got = next(self._it, None)
            if got is None:
                raise _Short(f"the stream ended {hi - self._head[c] - self._count[c]} rows short of component {c}")
            for m, parts in got.items():
                for part in parts:
                    self._put(m, part)
            held = sum(self._bytes)
            self.peak = max(self.peak, held)
            if held > self.cap:
                raise _Short(f"the queues passed their bound ({held} bytes > {self.cap})")

    def _put(self, m: int, part: Rows) -> None:
        """Queue component ``m``'s rows of a batch, keeping none past its last drawn row."""
        end = self._head[m] + self._count[m]
        if not self._count[m] and end < self._from[m]:  # rows before its next one: dropped here, not held
            skip = min(part.num_rows, self._from[m] - end)
            self._head[m] += skip
            end += skip
            if skip == part.num_rows:
                return
            part = part.slice(skip)
        keep = min(part.num_rows, max(0, self.stop[m] - end))
        if not keep:
            return
        if keep < part.num_rows:
            part = part.slice(0, keep)
        self._queues[m].append(part)
        self._count[m] += keep
        self._bytes[m] += part.nbytes

    def _fail(self, exc: BaseException | str) -> None:
        self.failed = exc
        self._release()

    def _release(self) -> None:
        it, self._it = self._it, None
        for q in self._queues:
            q.clear()
        self._count = [0] * len(self._count)
        self._bytes = [0] * len(self._bytes)
        if it is not None:
            it.close()  # the split threads end
            source, self._source = self._source, None
            if hasattr(source, "close"):
                source.close()  # polars' query is dropped

    def close(self) -> None:
        """Stop the query and wake every task waiting for its turn. Idempotent. A task
        filling the queues holds the lock: it sees the flag between stream batches."""
        self._closed = True
        with self._cond:
            self._release()
            self._cond.notify_all()


class Rows:
    """A component's rows of one stream batch: ``batch`` (the rows, or with ``idx`` the
    batch they are picked from) and, where the loader converts reads to host arrays and
    this one converts whole, its host chunk ``host``; ``idx``: the positions of the rows in
    both (None: all). Sliced together, no copy."""

    __slots__ = ("batch", "host", "idx", "num_rows")

    def __init__(self, batch: pa.RecordBatch, host, idx: np.ndarray | None = None) -> None:
        self.batch = batch
        self.host = host
        self.idx = idx
        self.num_rows = batch.num_rows if idx is None else len(idx)

    @classmethod
    def of(cls, batch: pa.RecordBatch, conv) -> "Rows":
        host = conv.chunk(batch) if conv is not None else None
        return cls(batch, host if isinstance(host, HostChunk) else None)

    @property
    def nbytes(self) -> int:
        if self.idx is None:
            return self.host.nbytes if self.host is not None else self.batch.nbytes
        per = self.host.row_bytes if self.host is not None else self.batch.nbytes / max(1, self.batch.num_rows)
        return int(per * self.num_rows)

    def slice(self, offset: int, length: int | None = None) -> "Rows":
        n = self.num_rows - offset if length is None else length
        if self.idx is not None:
            return Rows(self.batch, self.host, self.idx[offset:offset + n])
        return Rows(self.batch.slice(offset, n), self.host.slice(offset, n) if self.host is not None else None)

    def arrow(self) -> pa.RecordBatch:
        return self.batch if self.idx is None else take_rows(self.batch, pa.array(self.idx, pa.int64()))


def gather(found: list[list], base: np.ndarray, idx: np.ndarray, pool) -> HostChunk | None:
    """A task's rows as one host chunk: position ``p`` holds row ``idx[p]`` of the
    components' rows concatenated (component ``c``'s parts ``found[c]`` from ``base[c]``:
    :class:`Rows` or host chunks), each row copied once from its host arrays to its place;
    None where a part has no host chunk (an Arrow batch) or a column is not an array (the
    Arrow path then).

    Parts that pick rows by position from one host chunk (the members of one stream batch,
    whatever their component) are moved together: one take and one scatter per chunk and
    column, not one per part (a 2.4M-row epoch of three components made 5,151 calls of each).
    Where picked rows are most of the task and the chunks hold few rows besides, the chunks
    are laid end to end and each column taken once, every output row by one index
    (:func:`_one_take`): a sequential copy and one random read a row, where a take and a
    scatter made two random accesses."""
    hosts = [[(p, None) if isinstance(p, HostChunk) else (getattr(p, "host", None), getattr(p, "idx", None))
              for p in parts] for parts in found]
    if any(h is None for parts in hosts for h, _ in parts):
        return None
    first = next((h for parts in hosts for h, _ in parts), None)
    if first is None:
        return None
    n = len(idx)
    where = np.empty(n, dtype=np.int64)
    where[idx] = np.arange(n, dtype=np.int64)
    whole: list = []  # (host, output positions): every row of the host, in order
    picked: dict[int, list] = {}  # id(host) -> [host, positions..., rows...]: rows by position
    for c, parts in enumerate(hosts):
        at = int(base[c])
        for host, rows in parts:
            k = host.num_rows if rows is None else len(rows)
            if rows is None:
                whole.append((host, where[at:at + k]))
            else:
                g = picked.setdefault(id(host), [host, [], []])
                g[1].append(where[at:at + k])
                g[2].append(rows)
            at += k
    moves = whole + [(h, np.concatenate(pos) if len(pos) > 1 else pos[0],
                      np.concatenate(rows) if len(rows) > 1 else rows[0]) for h, pos, rows in picked.values()]
    fused = _one_take(moves, n)
    columns = {}
    for name, sample in first.columns.items():
        if not isinstance(sample, np.ndarray):
            return None
        out = pool.take((n, *sample.shape[1:]), sample.dtype)
        if fused is not None and _take_once(fused, name, out, pool):
            columns[name] = out
            continue
        for move in moves:
            src, pos = move[0].columns[name], move[1]
            rows = move[2] if len(move) > 2 else None
            if src.dtype == out.dtype and src.shape[1:] == out.shape[1:]:  # rows as opaque items
                _scatter_rows(out, pos, src if rows is None else _take_rows(src, rows))
            else:
                out[pos] = src if rows is None else src[rows]
        columns[name] = out
    return HostChunk(columns, n, sum(p.nbytes for parts in found for p in parts) / max(1, n))


#: Rows of the chunks laid end to end per picked row, at most, for :func:`_one_take` (a
#: sequential copy of a row costs about a tenth of a random access to it; measured on one
#: task of 64,600 rows, 17 float32 columns, from three stream batches: 1.4 against 2.2 ms)
ONE_TAKE_SPAN = 4


def _one_take(moves: list, n: int) -> tuple[list, int, np.ndarray] | None:
    """The task's rows as one index into its host chunks laid end to end: ``(chunks, their
    rows, index)`` (output position ``p`` holds row ``index[p]``), where picked rows (a take
    and a scatter each) are worth it (:data:`ONE_TAKE_SPAN`); else None."""
    picked = sum(len(m[1]) for m in moves if len(m) > 2)
    hosts: dict[int, tuple] = {}
    span = 0
    for m in moves:
        if id(m[0]) not in hosts:
            hosts[id(m[0])] = (m[0], span)
            span += m[0].num_rows
    if not picked or span > ONE_TAKE_SPAN * picked:
        return None
    index = np.empty(n, dtype=np.int64)
    for m in moves:
        at = hosts[id(m[0])][1]
        index[m[1]] = m[2] + at if len(m) > 2 else np.arange(at, at + m[0].num_rows, dtype=np.int64)
    return [h for h, _ in hosts.values()], span, index


def _take_once(fused: tuple[list, int, np.ndarray], name: str, out: np.ndarray, pool) -> bool:
    """Column ``name`` of the task into ``out`` by :func:`_one_take`'s index: the chunks'
    arrays laid end to end (a pooled temporary; none for one chunk), then one take along
    rows. False (nothing written) where an array's dtype or row shape differs from ``out``'s
    or it is not C-contiguous (the per-move path then)."""
    hosts, span, index = fused
    arrays = [h.columns[name] for h in hosts]
    if any(not isinstance(a, np.ndarray) or a.dtype != out.dtype or a.shape[1:] != out.shape[1:]
           or not a.flags.c_contiguous for a in arrays):
        return False
    if len(arrays) == 1:
        src = arrays[0]
    else:
        src = np.concatenate(arrays, out=pool.take((span, *out.shape[1:]), out.dtype))
    items, into = (src, out) if out.ndim == 1 else (_row_items(src), _row_items(out))
    if items is None or into is None:
        return False
    np.take(items, index, out=into, mode="clip")  # the index is in range by construction
    return True


class _Short(Exception):
    """The stream cannot serve a task (fewer rows than counted, queues over their bound):
    it and every later task read per unit."""


def queue_cap(prefetch: int) -> int:
    return max(1, prefetch // QUEUE_SHARE)


__all__ = ["MixStream", "QUEUE_SHARE", "Rows", "gather", "queue_cap", "stream_span"]

