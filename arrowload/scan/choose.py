"""The cheapest decoder of a reader, chosen by measurement.

Each eligible decoder reads a few units (after one warm-up read each, which pays for
imports and opened files); its cost is CPU seconds per byte of the unit (compressed bytes
of the columns read, from the footer, else rows: the same measure whatever the decoder).
The cheapest median wins, except that the first candidate (the default: pyarrow's
``ParquetFile``, no import and no second thread pool) is left only for one cheaper by
more than ``MARGIN``: closer costs are within the spread between runs, and a choice that
flips between processes makes their timings differ for nothing. Every ``recheck``-th unit after that is read and measured by
each candidate in turn, so a choice that stops being cheapest is undone.
Which decoder reads a unit never changes its rows (the decoders return identical tables),
only the CPU they cost.

Measurements remembered from earlier processes (``memory.py``, ``Chooser.remember``) replace
a candidate's trials: the cheapest remembered one reads at once. They are checked early in
every process all the same: each live candidate with a remembered cost gets its warm-up (for
the chosen one, its first read) and one measured read within the first few reads (about
``2 x`` candidates picks; a void measurement is tried again, up to ``CHECKS`` times), and the
choice is made again after each. Without that, a wrong memory (one taken in a noisy moment)
was permanent for any lake of fewer than about ``2 x RECHECK`` units per process: the
periodic re-measurement reached the other candidate only as its unmeasured warm-up. After
the check, every ``recheck``-th read measures as before (never a candidate's first read in
the process, which pays its imports and opened files).

How remembered and fresh costs combine: the remembered cost is one sample, the oldest of
the candidate's ``KEEP``, and the median of the samples decides -- except that against one
fresh sample it gives way (a median of two is their mean, which would move a wrong memory
only halfway per process, and an absurd one never). So one fresh measurement per process
replaces the remembered cost, and the document written back holds it (``memory.py``); with
two or more fresh ones the remembered cost votes in the median until ``KEEP`` fresh ones
push it out.

CPU is the reading thread's own (``time.thread_time``) plus, for polars, the CPU its
thread pool spent meanwhile (Linux: ``/proc/self/task/*/schedstat``); a polars measurement
that overlapped another polars call of the process is discarded. Where the pool's time
cannot be read, polars is not measured and so not chosen. A measured read runs alone among
its reader's reads (``Gate``): decoders that share the cores with other reads cost more
than alone (polars' pool threads spin while they wait), and unevenly so.

pyarrow's dataset scanner is not a candidate where ``ParquetFile`` reads: it decodes on
pyarrow's own threads, which no reading thread's clock sees.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Sequence
from contextlib import contextmanager

WARMUP = 1   # unmeasured reads per candidate (imports, files opened)
TRIALS = 3   # measured reads per candidate before the first choice
RECHECK = 32  # after the choice, every RECHECK-th read measures another candidate
KEEP = 4     # measurements kept per candidate (the median decides)
CHECKS = 3   # measured reads tried per remembered candidate early in a process (voids retried)
#: How much cheaper per byte than the first candidate another must be to be chosen. On the
#: benchmark lake pyarrow's and polars' medians differ by 5-10% unfiltered and swapped places
#: between processes (block-shuffle epochs 0.62 s or 0.87 s by which one won).
MARGIN = 0.10

_POOL_PREFIXES = ("polars", "async-executor", "tokio-rt-worker")
#: How a read's CPU is measured (part of a remembered measurement's situation, so that
#: measurements taken another way are not trusted). 3: the reading thread plus polars' pool.
#: (2 also counted pyarrow's native I/O threads: it made polars the choice for unfiltered reads
#: on the 4M-row lake, where a whole epoch then took 0.65-0.98 s against 0.44 s with pyarrow.)
MEASURE_METHOD = 3


class Chooser:
    """Which candidate reads the next unit, and whether to measure it. Thread-safe.

    Every ``pick()`` is followed by one ``done(name, cpu_s, size, ran=..., measured=...)``
    when the read ends (``cpu_s`` None when it was not measured, or the measurement is void;
    ``ran`` False where another decoder read the unit instead; ``measured`` the pick's
    ``measure``). ``exclusive``
    candidates (polars: one thread pool for the whole process) are measured only while no
    other read of theirs is in flight; meanwhile the other candidates read.

    >>> c = Chooser(["a", "b"], warmup=0, trials=1)
    >>> name, measure = c.pick(); c.done(name, 2.0, 1)
    False
    >>> name, measure = c.pick(); c.done(name, 1.0, 1)
    True
    >>> c.pick()[0], c.chosen
    ('b', 'b')
    """

    def __init__(self, names: Sequence[str], *, warmup: int = WARMUP, trials: int = TRIALS,
                 recheck: int = RECHECK, exclusive: Sequence[str] = ()) -> None:
        if not names:
            raise ValueError("a chooser needs at least one candidate")
        self.names = tuple(names)
        self._warmup, self._trials, self._recheck = warmup, trials, recheck
        self._exclusive = frozenset(exclusive)
        self._lock = threading.Lock()
        self._started = {n: 0 for n in self.names}   # reads handed out (warm-up included)
        self._measured = 0                           # measurements recorded (remembered ones too)
        self._remembered: dict[str, float] = {}      # costs from earlier processes (remember())
        self._busy = {n: 0 for n in self.names}      # reads in flight
        self._ran = {n: 0 for n in self.names}       # reads it did itself in this process
        self._fresh = {n: 0 for n in self.names}     # measurements taken in this process
        self._seeded: set[str] = set()               # oldest kept sample is a remembered cost
        self._owed: dict[str, int] = {}              # remembered, not yet measured here: tries left
        self._checking: set[str] = set()             # owed ones with a measured read in flight
        self._costs: dict[str, list[float]] = {n: [] for n in self.names}
        self._failed: set[str] = set()
        self._picks = 0
        self._next_other = 0
        self.chosen: str | None = self.names[0] if len(self.names) == 1 else None

    def pick(self) -> tuple[str, bool]:
        """``(candidate, measure)`` for the next read."""
        with self._lock:
            name, measure = self._pick()
            self._busy[name] += 1
            return name, measure

    def _live(self) -> list[str]:
        return [n for n in self.names if n not in self._failed] or [self.names[-1]]

    def _free(self, n: str) -> bool:
        return n not in self._exclusive or self._busy[n] == 0

    def _pick(self) -> tuple[str, bool]:
        live = self._live()
        if len(live) == 1:
            return live[0], False
        if self.chosen is None:
            # each candidate in turn until every one has its warm-up and its trials
            # (a void measurement is tried again, up to 3x the trials)
            short = [n for n in live if self._short(n)]
            if short:
                ready = [n for n in short if self._free(n)]
                if not ready:  # an exclusive candidate is being measured: read with another
                    others = [n for n in live if n not in self._exclusive]
                    return (others or live)[0], False
                n = min(ready, key=lambda k: self._started[k])
                self._started[n] += 1
                return n, self._started[n] > self._warmup
            self._decide(live)
        if self._owed:
            check = self._check(live)
            if check is not None:
                return check
        self._picks += 1
        if self._recheck and self._picks % self._recheck == 0:
            n = live[self._next_other % len(live)]  # each candidate in turn, the chosen too
            self._next_other += 1
            # a candidate's first reads in this process pay its imports and opened files:
            # measured only once warm (a remembered candidate skipped its warm-up)
            return n, self._free(n) and self._ran[n] >= self._warmup
        return self.chosen, False

    def _check(self, live: list[str]) -> tuple[str, bool] | None:
        """The early check of remembered costs (module doc): a measured read for an owed
        candidate that is warm (has read ``warmup`` units here), else a warm-up read for
        one that is not (the chosen one warms up on its own reads); None: the usual pick.
        The measured read needs no ``_free``: it runs alone among its reader's reads
        (``Gate``), and an overlapping polars call of another reader voids it."""
        owed = [n for n in live if self._owed.get(n, 0) > 0 and n not in self._checking]
        for n in owed:
            if self._ran[n] >= self._warmup:
                self._owed[n] -= 1
                self._checking.add(n)
                return n, True
        for n in owed:
            if n != self.chosen and self._busy[n] == 0:
                return n, False
        return None

    def _decide(self, live: list[str]) -> str:
        measured = [n for n in live if self._costs[n]]
        if not measured:  # nothing could be measured: the first candidate
            self.chosen = live[0]
        else:
            cost = {n: self._cost(n) for n in measured}
            best = min(measured, key=lambda n: (cost[n], live.index(n)))
            first = live[0]
            if best != first and first in cost and cost[best] > (1 - MARGIN) * cost[first]:
                best = first
            self.chosen = best
        return self.chosen

    def _cost(self, n: str) -> float:
        """The median of ``n``'s samples; of a remembered one and one fresh, the fresh one."""
        costs = self._costs[n]
        if len(costs) == 2 and n in self._seeded:
            return costs[1]
        return statistics.median(costs)

    def done(self, name: str, cpu_s: float | None, size: int, *, ran: bool = True,
             measured: bool = False) -> bool:
        """A read picked for ``name`` ended (``ran``: by ``name`` itself, not another decoder;
        ``measured``: it was picked to be measured); measured, it cost ``cpu_s`` for ``size``
        bytes (or rows). True when this measurement counted and a choice stands (worth
        remembering)."""
        with self._lock:
            self._busy[name] -= 1
            if ran:
                self._ran[name] += 1
            if measured:
                self._checking.discard(name)
            if cpu_s is None or size <= 0:
                if measured and self._owed.get(name) == 0:
                    del self._owed[name]  # its tries are spent: checked no more in this process
                return False
            costs = self._costs[name]
            costs.append(cpu_s / size)
            if len(costs) > KEEP:
                self._seeded.discard(name)  # the remembered sample is pushed out
            del costs[:-KEEP]
            self._measured += 1
            self._fresh[name] += 1
            self._owed.pop(name, None)
            live = self._live()
            if self.chosen is not None or not any(self._short(n) for n in live):
                self._decide(live)
            return self.chosen is not None

    def _short(self, n: str) -> bool:
        return self._started[n] < self._warmup + self._trials or \
            (len(self._costs[n]) < self._trials and self._started[n] < self._warmup + 3 * self._trials)

    def remember(self, costs: dict[str, float], measured: int = 1) -> None:
        """Start from measurements remembered from earlier processes (``memory.py``): a
        candidate with one needs no trials; the cheapest is chosen once every live
        candidate has one; each is then checked early (a warm-up and one measured read,
        see the module doc), and the periodic re-measurement goes on from there."""
        with self._lock:
            for n, c in costs.items():
                if n in self._costs and not self._costs[n] and c >= 0:
                    self._seed(n, float(c))
            self._remembered.update(costs)
            self._measured = max(self._measured, measured)
            live = self._live()
            if len(live) > 1 and not any(self._short(n) for n in live):
                self._decide(live)

    def _seed(self, n: str, cost: float) -> None:
        self._costs[n].append(cost)
        self._seeded.add(n)
        self._owed[n] = CHECKS
        self._started[n] = max(self._started[n], self._warmup + 3 * self._trials)

    def fresh(self) -> dict[str, int]:
        """Measurements of each candidate taken in this process (remembered ones not counted)."""
        with self._lock:
            return dict(self._fresh)

    @property
    def measured(self) -> int:
        """Measurements behind the costs (remembered ones included)."""
        return self._measured

    def add(self, name: str) -> None:
        """A new candidate, measured (the others keep their measurements) before the
        choice is made again."""
        with self._lock:
            if name in self.names:
                return
            self.names += (name,)
            self._started[name] = self._busy[name] = 0
            self._costs[name] = []
            self._ran[name] = self._fresh[name] = 0
            remembered = self._remembered.get(name)
            if remembered is not None:  # measured in an earlier process: no trials, a check
                self._seed(name, float(remembered))
            self.chosen = None
            live = self._live()
            if not any(self._short(n) for n in live):
                self._decide(live)

    def fail(self, name: str) -> None:
        """``name`` failed where another decoder read the unit: never pick it again."""
        with self._lock:
            self._failed.add(name)
            if self.chosen == name:
                self._decide(self._live())

    def costs(self) -> dict[str, float]:
        """Measured CPU seconds per byte of each candidate measured so far (``_cost``)."""
        with self._lock:
            return {n: self._cost(n) for n, c in self._costs.items() if c}


class Gate:
    """Lets a measured read run alone among its reader's reads: it waits for the reads in
    flight to end and holds new ones back while it runs (a few reads per epoch), so that
    what it costs is not what sharing the cores with the other reads costs."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active = 0
        self._waiting = 0
        self._alone = False

    @contextmanager
    def enter(self, alone: bool):
        with self._cond:
            if alone:
                self._waiting += 1
                while self._active or self._alone:
                    self._cond.wait()
                self._waiting -= 1
                self._alone = True
            else:
                while self._alone or self._waiting:
                    self._cond.wait()
                self._active += 1
        try:
            yield
        finally:
            with self._cond:
                if alone:
                    self._alone = False
                else:
                    self._active -= 1
                self._cond.notify_all()


# ---------------------------------------------------------------------------
# CPU time of polars' thread pool

_TASKS = "/proc/self/task"
_pool_tids: dict[str, bool] = {}
_pool_lock = threading.Lock()
_inflight = 0
_generation = 0


def pool_cpu_readable() -> bool:
    """True where the CPU time of other threads of the process can be read (Linux)."""
    try:
        tid = os.listdir(_TASKS)[0]
        with open(f"{_TASKS}/{tid}/schedstat") as f:
            int(f.read().split()[0])
        return True
    except (OSError, ValueError, IndexError):
        return False


def _pool_cpu_ns() -> int:
    total = 0
    for tid in os.listdir(_TASKS):
        mine = _pool_tids.get(tid)
        try:
            if mine is None:
                with open(f"{_TASKS}/{tid}/comm") as f:
                    mine = f.read().startswith(_POOL_PREFIXES)
                _pool_tids[tid] = mine
            if mine:
                with open(f"{_TASKS}/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
        except (OSError, ValueError):
            continue  # the thread ended meanwhile
    return total


class PolarsCall:
    """Brackets one polars call: counts the calls in flight in the process (so that a
    measurement can tell it overlapped another) and, when ``measure``, the CPU polars'
    pool spent during the call (``cpu_s``; None when it overlapped another call)."""

    def __init__(self, measure: bool) -> None:
        self.measure = measure
        self.cpu_s: float | None = None

    def __enter__(self) -> "PolarsCall":
        global _inflight, _generation
        with _pool_lock:
            _inflight += 1
            _generation += 1
            self._gen, self._alone = _generation, _inflight == 1
        if self.measure:
            self._pool = _pool_cpu_ns()
        return self

    def __exit__(self, *exc) -> None:
        global _inflight
        if self.measure:
            pool = _pool_cpu_ns() - self._pool
        with _pool_lock:
            _inflight -= 1
            alone = self._alone and _generation == self._gen
        if self.measure and alone and exc[0] is None:
            self.cpu_s = pool / 1e9


class Measure:
    """CPU of one read: the reading thread's, plus what helper pools report (``add_pool``;
    None marks the measurement as spoiled)."""

    def __init__(self) -> None:
        self._thread = time.thread_time()
        self._pool = 0.0
        self._spoiled = False

    def add_pool(self, cpu_s: float | None) -> None:
        if cpu_s is None:
            self._spoiled = True
        else:
            self._pool += cpu_s

    def done(self) -> float | None:
        """CPU seconds of the read, or None where it cannot be known."""
        return None if self._spoiled else time.thread_time() - self._thread + self._pool
