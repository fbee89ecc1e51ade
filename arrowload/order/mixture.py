"""The order of a data mixture, as integer arithmetic.

A mixture draws rows from ``m`` components (each a selection with ``sizes[c]`` rows, read in
its own epoch order, one pass after another) into one stream of **blocks** of ``B`` rows
(``B`` = the batch size). Block ``b`` holds ``n_c(b)`` rows of component ``c``: the next
``n_c(b)`` of that component's stream. Everything below is a pure function of integers;
no draw is ever replayed.

Apportionment (:class:`Apportion`): the weights, normalized, are held as integers ``q_c``
summing to ``Q = 2**32`` (largest remainder; ``quantize``). Each block gives component
``c`` its base ``floor(B q_c / Q)`` rows plus ``e_c(b)`` in ``{0, 1}``: the ``R`` extra
rows of a block (``R = B - sum of the bases``) go to the components whose arcs of the circle
``[0, R)`` -- consecutive, of lengths ``f_c = frac(B q_c / Q)`` -- hold the points
``u_b + j`` (``j = 0..R-1``), with ``u_b = frac(theta + b * phi)``, ``phi`` the golden
ratio's ``F(38) / F(40)`` and ``theta`` seeded. So in **every block each component gets the
floor or the ceiling of ``weight x B``** (within +-1 of it), the block's counts sum to
``B``, and the extras rotate in a low-discrepancy order: after ``k`` blocks a component's
rows stay within ``2 + log2(k + 1) / 4`` rows of ``weight x B x k`` (the arc discrepancy
of the rotation, growing like ``log k``; tested, and at most 3.6 rows measured over 50,000
blocks of up to 8 components). The cumulative count after ``k`` blocks is a closed form (``floor_sum``):
``O(m log Q)`` integer operations, wherever ``k`` is.

Phases: a mixture may be re-weighted where a state is loaded. A :class:`Phase` starts at a
block with its weights and each component's stream index there; the stream index of
component ``c`` at block ``b`` of a phase is ``offset_c + cumulative_c(b - start)``.

Stopping (:func:`epoch_blocks`): ``"first_exhausted"`` ends the epoch at the last block
after which no component of weight > 0 has run past the end of its current pass;
``"all_exhausted"`` at the first block after which every component of weight > 0 finished
its first pass of the epoch (the others restart new passes meanwhile, counted);
``"cycle"`` never ends (``None``).

Ranks: blocks are dealt round-robin (:func:`rank_blocks`): from the epoch's ``position``
(blocks every rank has consumed together), rank ``r`` of ``W`` takes blocks
``position + r, position + r + W, ...``; each rank the same number, the last fewer than
``W`` blocks left out. A global step is ``W`` consecutive blocks, so the world size can
change at any step (elastic resume) with every block read at most once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from .permutation import derive_key, permute, shuffled_range, shuffled_ranges
from .sequence import EpochOrder

#: weights are held as integers summing to this
Q = 1 << 32
_F40 = 102_334_155
_F38 = 39_088_169
#: the common denominator of the arcs and the rotation
DENOM = Q * _F40
_STEP = Q * _F38
STOPPING = ("first_exhausted", "all_exhausted", "cycle")
_SALT_THETA = 0x71
_SALT_INTERLEAVE = 0x72
_SALT_COMPONENT = 0x73
_SALT_UNITS = 0x74

#: the version of a mixture's order arithmetic (the mixture state's ``order`` field); bumped
#: whenever any component kind's order changes. 3: a block shuffle visits units in one order
#: for every component (``units_key``; was each component's own), so a unit decoded for one
#: component serves the others (``mixture.shared``). 4: ``permute``'s network over the bits
#: covering its domain (``ORDER_VERSION`` 3): "global" rows and "block" units
MIXTURE_ORDER_VERSION = 4
#: the version in which each kind's order in a mixture last changed: a state of an earlier
#: version loads where every component's kind is unchanged since
MIXTURE_ORDER_SINCE = {"none": 1, "global": 4, "block": 4}


def floor_sum(n: int, m: int, a: int, b: int) -> int:
    """``sum(floor((a*i + b) / m) for i in range(n))`` in ``O(log m)`` (Euclid-like);
    ``n >= 0``, ``m >= 1``, ``a, b >= 0``."""
    ans = 0
    while True:
        if a >= m:
            ans += n * (n - 1) // 2 * (a // m)
            a %= m
        if b >= m:
            ans += n * (b // m)
            b %= m
        y = a * n + b
        if y < m:
            return ans
        n, b = divmod(y, m)
        m, a = a, m


def quantize(weights: Sequence[float]) -> tuple[int, ...]:
    """Weights (>= 0, not all 0) as integers summing to ``Q``, by largest remainder (ties to
    the first component)."""
    w = [float(x) for x in weights]
    if not w or any(not np.isfinite(x) or x < 0 for x in w) or sum(w) <= 0:
        raise ValueError(f"weights must be finite, >= 0 and not all 0, got {list(weights)}")
    total = sum(w)
    exact = [x / total * Q for x in w]
    q = [int(x) for x in exact]
    rest = Q - sum(q)
    for i in sorted(range(len(w)), key=lambda i: (-(exact[i] - q[i]), i))[:rest]:
        q[i] += 1
    return tuple(q)


@dataclass(frozen=True)
class Apportion:
    """Rows of each component in each block of ``batch_size`` rows, for weights ``q``
    (``quantize``) and a seeded offset ``theta`` in ``[0, DENOM)``."""

    q: tuple[int, ...]
    batch_size: int
    theta: int

    def __post_init__(self) -> None:
        if sum(self.q) != Q or any(x < 0 for x in self.q):
            raise ValueError("q must be integers >= 0 summing to Q (see quantize)")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")

    @cached_property
    def base(self) -> tuple[int, ...]:
        return tuple(self.batch_size * x // Q for x in self.q)

    @cached_property
    def arcs(self) -> tuple[int, ...]:
        """Arc boundaries ``s_0 = 0 <= s_1 <= ... <= s_m = R * DENOM``."""
        out = [0]
        for x in self.q:
            out.append(out[-1] + (self.batch_size * x % Q) * _F40)
        return tuple(out)

    @property
    def extras(self) -> int:
        return self.batch_size - sum(self.base)

    def counts(self, b: int) -> tuple[int, ...]:
        """Rows of each component in block ``b`` (they sum to ``batch_size``)."""
        u = (self.theta + b * _STEP) % DENOM
        s = self.arcs
        return tuple(base + (s[c + 1] + u) // DENOM - (s[c] + u) // DENOM for c, base in enumerate(self.base))

    def cumulative(self, k: int) -> tuple[int, ...]:
        """Rows of each component in blocks ``0..k-1``: a closed form, ``O(m log Q)``."""
        if k <= 0:
            return (0,) * len(self.q)
        fs = [floor_sum(k, DENOM, _STEP, s + self.theta) for s in self.arcs]
        return tuple(base * k + fs[c + 1] - fs[c] for c, base in enumerate(self.base))

    def blocks(self, first: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """``(starts, counts)``: arrays ``[stop - first, m]`` of each block's cumulative rows
        before it and its rows, for blocks ``first..stop-1`` (one closed form, then steps)."""
        n, m = stop - first, len(self.q)
        counts = np.empty((max(0, n), m), dtype=np.int64)
        u = (self.theta + first * _STEP) % DENOM
        s, base = self.arcs, self.base
        for i in range(n):
            for c in range(m):
                counts[i, c] = base[c] + (s[c + 1] + u) // DENOM - (s[c] + u) // DENOM
            u = (u + _STEP) % DENOM
        starts = np.zeros_like(counts)
        if n:
            starts[0] = self.cumulative(first)
            if n > 1:
                starts[1:] = np.cumsum(counts[:-1], axis=0) + starts[0]
        return starts, counts


@dataclass(frozen=True)
class Phase:
    """From block ``start`` on, ``weights`` apply; ``offsets`` are each component's stream
    index (rows drawn in this epoch, all passes) at ``start``."""

    start: int
    weights: tuple[float, ...]
    offsets: tuple[int, ...]


@dataclass(frozen=True)
class Schedule:
    """The block stream of one epoch of a mixture: component ``sizes``, ``phases`` (the first
    starts at block 0 with offsets 0), ``batch_size``, the mixture's ``seed``, the
    ``epoch`` and ``stopping``."""

    sizes: tuple[int, ...]
    phases: tuple[Phase, ...]
    batch_size: int
    seed: int
    epoch: int
    stopping: str = "first_exhausted"
    apportions: tuple = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.stopping not in STOPPING:
            raise ValueError(f"stopping must be one of {STOPPING}, got {self.stopping!r}")
        if not self.phases or self.phases[0].start != 0:
            raise ValueError("the first phase starts at block 0")
        for p in self.phases:
            if len(p.weights) != len(self.sizes) or len(p.offsets) != len(self.sizes):
                raise ValueError("a phase needs one weight and one offset per component")
        for a, b in zip(self.phases, self.phases[1:]):
            if b.start < a.start:
                raise ValueError("phases must start in increasing block order")
        for c, n in enumerate(self.sizes):
            if n == 0 and any(p.weights[c] > 0 for p in self.phases):
                raise ValueError(f"component {c} has no rows and weight > 0")
        object.__setattr__(self, "apportions", tuple(
            Apportion(quantize(p.weights), self.batch_size,
                      derive_key(self.seed, self.epoch, _SALT_THETA, i) % DENOM)
            for i, p in enumerate(self.phases)))

    def phase_index(self, b: int) -> int:
        i = 0
        while i + 1 < len(self.phases) and self.phases[i + 1].start <= b:
            i += 1
        return i

    def stream_index(self, b: int) -> tuple[int, ...]:
        """Each component's stream index at the start of block ``b``."""
        i = self.phase_index(b)
        p = self.phases[i]
        cum = self.apportions[i].cumulative(b - p.start)
        return tuple(o + x for o, x in zip(p.offsets, cum))

    def blocks(self, first: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """``(starts, counts)`` ``[stop - first, m]``: each block's stream index and rows per
        component, for blocks ``first..stop-1``."""
        parts_s, parts_c = [], []
        b = first
        while b < stop:
            i = self.phase_index(b)
            end = self.phases[i + 1].start if i + 1 < len(self.phases) else stop
            end = min(end, stop)
            s, c = self.apportions[i].blocks(b - self.phases[i].start, end - self.phases[i].start)
            parts_s.append(s + np.asarray(self.phases[i].offsets, dtype=np.int64))
            parts_c.append(c)
            b = end
        m = len(self.sizes)
        if not parts_s:
            return np.zeros((0, m), np.int64), np.zeros((0, m), np.int64)
        return np.concatenate(parts_s), np.concatenate(parts_c)

    @cached_property
    def num_blocks(self) -> int | None:
        """Blocks in this epoch (``None``: ``"cycle"``, endless)."""
        return epoch_blocks(self)

    def passes(self, b: int) -> tuple[int, ...]:
        """Passes each component started in blocks ``0..b-1`` (0: none of its rows drawn)."""
        idx = self.stream_index(b)
        return tuple(-(-i // n) if n else 0 for i, n in zip(idx, self.sizes))

    def interleave(self, b: int) -> np.ndarray:
        """Slot of each position of block ``b``: slots ``0..n_0-1`` are component 0's rows,
        then component 1's, ... (a seeded permutation of ``[0, batch_size)``)."""
        return shuffled_range(self.batch_size, derive_key(self.seed, self.epoch, _SALT_INTERLEAVE, b))

    def interleaves(self, blocks) -> np.ndarray:
        """``[interleave(b) for b in blocks]`` as one ``[len(blocks), batch_size]`` array."""
        return shuffled_ranges(self.batch_size, [derive_key(self.seed, self.epoch, _SALT_INTERLEAVE, int(b))
                                                 for b in blocks])


def epoch_blocks(s: Schedule) -> int | None:
    """Blocks in the epoch of ``s`` (see the module's doc), decided by its last phase."""
    if s.stopping == "cycle":
        return None
    p, ap = s.phases[-1], s.apportions[-1]
    live = [c for c in range(len(s.sizes)) if p.weights[c] > 0 and ap.q[c] > 0]
    if s.stopping == "first_exhausted":
        limits = {}
        for c in live:  # the end of each component's current pass (one just completed: no more)
            n, o = s.sizes[c], p.offsets[c]
            limits[c] = o if (o and o % n == 0) else (o // n + 1) * n

        def ok(k: int) -> bool:  # a component at its limit may go on drawing nothing
            cum = ap.cumulative(k)
            return all(p.offsets[c] + cum[c] <= limits[c] for c in live)
        if not live:
            return p.start
        hi = 1 + max((limits[c] - p.offsets[c]) * Q // (s.batch_size * ap.q[c]) for c in live)
        while ok(hi):  # the cumulative counts may lag their targets by a few rows
            hi *= 2
        lo = 0  # ok(lo) holds and ok(hi) does not: the largest k with ok(k) lies in [lo, hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if ok(mid):
                lo = mid
            else:
                hi = mid
        return p.start + lo
    # all_exhausted
    todo = [c for c in live if p.offsets[c] < s.sizes[c]]
    if not todo:
        return p.start

    def done(k: int) -> bool:
        cum = ap.cumulative(k)
        return all(p.offsets[c] + cum[c] >= s.sizes[c] for c in todo)
    hi = max((s.sizes[c] - p.offsets[c]) * Q // (s.batch_size * ap.q[c]) + 2 for c in todo)
    while not done(hi):
        hi *= 2
    lo = 0
    while lo < hi:
        mid = (lo + hi) // 2
        if done(mid):
            hi = mid
        else:
            lo = mid + 1
    return p.start + lo


def rank_blocks(position: int, num_blocks: int | None, world_size: int, rank: int) -> range:
    """Blocks rank ``rank`` of ``world_size`` reads from ``position`` (blocks consumed by
    every rank together) to the end of an epoch of ``num_blocks`` (None: endless)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    if num_blocks is None:
        return range(position + rank, 1 << 62, world_size)
    steps = max(0, num_blocks - position) // world_size
    return range(position + rank, position + steps * world_size, world_size)


def units_key(seed: int, epoch: int, p: int) -> int:
    """The seed of the units' visiting order of pass ``p`` of ``epoch`` (block shuffle), the
    same for every component of the mixture."""
    return derive_key(seed, epoch, _SALT_UNITS, p)


@dataclass(frozen=True)
class ComponentOrder(EpochOrder):
    """A component's epoch order in a mixture: :class:`~arrowload.order.EpochOrder`, except
    that a block shuffle visits the units in a mixture-wide order. ``units``: each unit's
    number in its source (a lake's row groups: ``Unit.index``; ``()``: ``0, 1, ...``) among
    ``space`` (the source's units); ``units_key``: :func:`units_key`. Unit ``u`` comes
    before ``v`` where ``permute(units[u], space, units_key)`` is smaller: components over
    one lake visit its row groups in one order (their windows too, where they read the same
    row groups), whatever rows each keeps. Rows inside a window are shuffled as
    ``EpochOrder`` does, with the component's own seed."""

    units: tuple[int, ...] = ()
    space: int = 0
    units_key: int = 0

    @cached_property
    def unit_order(self) -> np.ndarray:
        n = len(self.counts)
        if self.kind != "block" or n == 0:
            return np.arange(n, dtype=np.int64)
        ids = np.asarray(self.units, dtype=np.int64) if self.units else np.arange(n, dtype=np.int64)
        space = max(self.space, int(ids.max()) + 1)
        return np.argsort(permute(ids, space, self.units_key), kind="stable").astype(np.int64)


def component_key(seed: int, name: str) -> int:
    """The seed of a component's own orders, from the mixture's seed and its name."""
    import hashlib
    digest = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")
    return derive_key(seed, _SALT_COMPONENT, digest)


__all__ = ["DENOM", "MIXTURE_ORDER_SINCE", "MIXTURE_ORDER_VERSION", "Q", "STOPPING", "Apportion",
           "ComponentOrder", "Phase", "Schedule", "component_key", "epoch_blocks", "floor_sum", "quantize",
           "rank_blocks", "units_key"]
