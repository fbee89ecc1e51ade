"""An unshuffled epoch's unit tasks served from one polars streaming query per range.

:class:`StreamReads` has the interface of a row source's ``read`` (``read(task, cache=,
map_units=) -> (parts, convert_seconds)``) for the tasks ``order.tasks.plan_tasks`` makes
of an unshuffled epoch over a :class:`~arrowload.pipeline.rowsource.ScanRowSource` whose
scan polars can stream (``scan/stream.py``). The tasks are the same unit pieces as on the
per-unit path, so batches, order and resume are the same; only where their rows come from
differs: each range of positions is one query, and each task takes the next rows of it.

Reader threads run tasks side by side, in order of submission (FIFO); a task waits for
the one before it to have taken its rows (the older one is always running or done, so
no thread waits on one that is not), takes its own, then converts them outside the lock.
Polars decodes on its own pool meanwhile.

Polars not imported yet (a fresh process): the first task starts its import on a thread of
its own (``stream.polars_ready``) and the tasks read on the per-unit path
until it has ended (where the stream is forced on, they wait for it); the query then opens
at the next task's start (it slices off the rows
of the file before that unit before filtering: their row groups are not read). The first
batch so waits for a unit's read, not for the import (0.15-0.2 s).

Failure: where a query fails (a polars error, fewer rows than counted), that task and
every later one are read on the per-unit path (``source.read``), whose rows or error
(``SnapshotChangedError``, a decoder's typed error) are the answer, as without the stream.
``close()`` drops the query (polars stops it) and wakes every waiting task.
"""

from __future__ import annotations

import threading
import time
from collections import deque

import pyarrow as pa

from ..errors import SnapshotChangedError
from ..order.tasks import TaskKind
from ..scan.decoders import recoverable
from ..scan.stream import STREAM_DECODER, StreamQuery, polars_ready
from .stages import take_rows


def _changed(what: str) -> SnapshotChangedError:
    return SnapshotChangedError(f"the data changed under the loader: the files' rows no longer match the "
                                f"counts taken when it was built ({what}); build a new loader")


class _Short(Exception):
    """A query ended before the rows counted (polars failed without raising: it panicked
    on a worker thread, as on a time zone it cannot parse in a file's schema). Not taken
    for a change of the data: the per-unit path reads the task and says (its reads check
    the files)."""


def merge_ranges(ranges) -> list[tuple[int, int]]:
    """Non-empty ``ranges`` in their order, consecutive ones that touch joined."""
    out: list[tuple[int, int]] = []
    for a, b in ranges:
        if a >= b:
            continue
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


#: Rows per batch of a task's query under which its batches are joined before conversion
SMALL_PART_ROWS = 4096


class StreamReads:
    """Tasks of the positions ``ranges`` of ``order`` (unshuffled) read from ``query``
    (see the module doc). ``source``: the scan row source (counts; its per-unit ``read``
    for fallback); ``conv``: the chunk converter (or None: Arrow batches); ``count(name)``:
    called once per task read, with the decoder's name."""

    def __init__(self, query: StreamQuery, source, order, ranges, conv=None, count=None, *,
                 wait_import: bool = False) -> None:
        self.query = query
        self.source = source
        self.order = order
        self.conv = conv
        self._count = count
        self._ranges = merge_ranges(ranges)
        self._k = 0  # the range being read
        self._pos = self._ranges[0][0] if self._ranges else 0  # the next task's first position
        self._it = None  # the query reading the rest of range ``_k`` from ``_pos``, once open
        self._left: deque[pa.RecordBatch] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self.failed: BaseException | None = None
        self.queries = 0
        self._wait_import = wait_import  # the stream forced on: every task waits for polars

    # -- the reads ---------------------------------------------------------------------
    def read(self, task, *, cache=None, map_units=None) -> tuple[list, float]:
        """Task ``task``'s rows, taken from the range's query in position order (the first
        task of a range opens it, once polars is imported: see the module doc), or from the
        per-unit path while polars imports or once a query failed."""
        if task.kind not in (TaskKind.UNIT, TaskKind.RUN) or not task.rows:
            return self._fallback(task, cache, map_units)
        start, stop = task.positions(self.order)
        with self._cond:
            while self._closed or not self._turn(start):
                if self._closed:
                    return [], 0.0  # the iteration ended: nobody takes this result
                self._cond.wait(0.05)
            batches = None
            try:
                if self.failed is None and (self._it is not None or polars_ready(wait=self._wait_import)):
                    try:
                        if self._it is None:
                            self._open(start)
                        batches = self._take(stop - start)
                    except SnapshotChangedError as exc:
                        self.failed = exc
                        self._drop()
                        raise
                    except BaseException as exc:  # noqa: BLE001 - polars panics are BaseExceptions
                        if not recoverable(exc):
                            raise
                        self.failed = exc  # the per-unit path gives the answer
                        self._drop()
                        batches = None
                self._pos = stop
                if stop == self._ranges[self._k][1]:
                    self._finish_range()
            finally:
                self._cond.notify_all()
        if batches is None:
            return self._fallback(task, cache, map_units)
        self.source.check_read([u for u, _, _ in task.pieces()])  # (a local file rewritten meanwhile)
        if self._count is not None:
            self._count(STREAM_DECODER, 1 if task.kind == TaskKind.UNIT else task.last - task.unit + 1)
        if self.conv is None:
            return batches, 0.0
        t0 = time.perf_counter()
        if len(batches) > 1 and task.rows < SMALL_PART_ROWS * len(batches):
            # polars hands a morsel per row group: tiny row groups (a file of 100-row groups)
            # make thousands of parts, each converted on its own (about 60 us each); one
            # copy into one part is cheaper
            batches = [pa.concat_batches(batches)]
        items = [self.conv.chunk(b) for b in batches]
        return items, time.perf_counter() - t0

    def _fallback(self, task, cache, map_units):
        return self.source.read(task, self.order, self.conv, cache=cache, map_units=map_units)

    def _turn(self, start: int) -> bool:
        """Whether the task at ``start`` is next: the tasks before it took their turns
        (lock held). Past a range's end the next task starts the next range."""
        if self._pos == start:
            return True
        k = self._k + 1
        if k < len(self._ranges) and self._ranges[k][0] == start and self._pos == self._ranges[self._k][1]:
            self._k, self._pos = k, start
            return True
        return False

    def _open(self, start: int) -> None:
        """Start the query of the rest of the current range, from ``start`` (lock held)."""
        b = self._ranges[self._k][1]
        pieces = self.order.unit_pieces(start, b)
        first, lo, _ = pieces[0]
        last = pieces[-1][0]
        self._it = self.query.batches(first, last, lo, b - start)
        self.queries += 1

    def _take(self, n: int) -> list[pa.RecordBatch]:
        """The next ``n`` rows of the query, as zero-copy slices of its batches (lock held)."""
        left = self._left
        have = sum(b.num_rows for b in left)
        while have < n:
            b = next(self._it, None)
            if b is None:  # the per-unit path answers: the rows, or the change its checks find
                raise _Short(f"the query ended {n - have} rows fewer than counted")
            left.append(b)
            have += b.num_rows
        return take_rows(left, n)

    def _finish_range(self) -> None:
        """The range's rows are all taken: its query must be exhausted (lock held)."""
        if self._it is not None and (self._left or next(self._it, None) is not None):
            self._drop()
            self.failed = _changed("more rows than counted")
            raise self.failed
        self._drop()

    def _drop(self) -> None:
        it, self._it = self._it, None
        self._left.clear()
        if it is not None and hasattr(it, "close"):
            it.close()  # a generator: its frame (and polars' iterator) released now

    def close(self) -> None:
        """Stop the query and wake every task waiting for its turn. Idempotent."""
        with self._cond:
            self._closed = True
            self._drop()
            self._cond.notify_all()


__all__ = ["StreamReads", "merge_ranges"]
