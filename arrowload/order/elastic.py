"""Elastic layout: which epoch positions each rank reads, across changes of world size.

An epoch's order (:class:`~arrowload.order.sequence.EpochOrder`) is a sequence of ``N``
positions. A run at one world size is a **segment**: its ``W`` ranks each read an equal,
contiguous share (a *lane*) of the positions still **free** -- the positions no earlier
segment of the epoch consumed, taken in increasing position order as one virtual sequence
of ``M`` rows -- and every rank reads its lane in order, in lockstep with the others:

- ``per = M // W``; lane ``r`` is virtual rows ``[r*per, r*per + L)``, where ``L = per``,
  or with ``drop_last`` ``per`` rounded down to a multiple of ``batch_size``. The
  remainder (``M - W*per < W`` rows) and the ``drop_last`` tails are read by no rank of
  that segment.
- a segment that ended after each rank yielded ``c`` rows (``0 <= c <= L``, a multiple of
  the batch size or ``L``) consumed virtual rows ``[r*per, r*per + c)`` of every lane ``r``;
  the free positions of the next segment are what is left, the remainder and the tails
  included.

A fresh epoch is one segment over all ``N`` positions: lane ``r`` is
``rank_range(N, r, W)``, trimmed for ``drop_last`` -- the layout loaders always had. A
resume at the same world size continues the same lanes (exactly the uninterrupted
batches); a resume at another world size closes the segment and lays the free positions
out for the new one. So, whatever the world sizes ``W -> W' -> W'' ...``: every position
of the epoch is read at most once, a position no rank read is free for the next segment,
each rank of a segment reads the same number of rows, and the only positions an epoch
leaves out are those the last segment leaves out (fewer than its world size, plus with
``drop_last`` fewer than ``batch_size`` per rank). All of it is integer arithmetic over
the segments' ``(world_size, position)``: every rank computes the same lanes alone.

A lane is a few position ranges (at most one per lane of the segment before, plus
one): contiguous runs of the epoch order, so a resumed block shuffle reads whole windows
but at the ends of those runs, as a fresh rank does at the ends of its share.

>>> free = free_ranges(10, [Segment(4, 1)], batch_size=1, drop_last=False)
>>> free   # 4 lanes of 2 rows, 1 row each consumed; positions 8, 9 were the remainder
((1, 2), (3, 4), (5, 6), (7, 10))
>>> lane(free, rank=0, world_size=3, batch_size=1, drop_last=False)
((1, 2), (3, 4))
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

Ranges = tuple[tuple[int, int], ...]
#: the largest world size a segment may have (a bound on the arithmetic of a damaged state)
MAX_WORLD = 1 << 20


@dataclass(frozen=True)
class Segment:
    """Part of an epoch run at one world size: each of ``world_size`` ranks yielded
    ``position`` rows of its lane."""

    world_size: int
    position: int


def _rows(ranges: Ranges) -> int:
    return sum(b - a for a, b in ranges)


def lane_rows(free: int, world_size: int, batch_size: int, drop_last: bool) -> int:
    """Rows of each rank's lane in a segment over ``free`` rows."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    per = free // world_size
    return per // batch_size * batch_size if drop_last else per


def _starts(ranges: Ranges) -> list[int]:
    """Virtual row where each range starts."""
    out, seen = [], 0
    for a, b in ranges:
        out.append(seen)
        seen += b - a
    return out


def _take(ranges: Ranges, starts: list[int], lo: int, hi: int) -> list[tuple[int, int]]:
    out = []
    i = max(0, bisect.bisect_right(starts, lo) - 1)
    while i < len(ranges) and starts[i] < hi:
        a, b = ranges[i]
        s, e = max(lo, starts[i]), min(hi, starts[i] + b - a)
        if s < e:
            out.append((a + s - starts[i], a + e - starts[i]))
        i += 1
    return out


def take(ranges: Ranges, lo: int, hi: int) -> Ranges:
    """Rows ``[lo, hi)`` of the virtual sequence ``ranges`` (concatenated in order), as ranges."""
    return tuple(_take(ranges, _starts(ranges), lo, hi))


def lane(free: Ranges, rank: int, world_size: int, batch_size: int, drop_last: bool) -> Ranges:
    """The positions rank ``rank`` of ``world_size`` reads in a segment over ``free``, in order."""
    if not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    per = _rows(free) // world_size
    return take(free, rank * per, rank * per + lane_rows(_rows(free), world_size, batch_size, drop_last))


def _subtract(ranges: Ranges, cut: Sequence[tuple[int, int]]) -> Ranges:
    """``ranges`` without the positions in ``cut`` (both sorted and disjoint; each piece of
    ``cut`` inside one range)."""
    out = []
    cut = sorted(cut)
    i = 0
    for a, b in ranges:
        pos = a
        while i < len(cut) and cut[i][0] < b:
            s, e = cut[i]
            if s > pos:
                out.append((pos, s))
            pos = max(pos, e)
            i += 1
        if pos < b:
            out.append((pos, b))
    return tuple(out)


def check_segment(free: Ranges, segment: Segment, batch_size: int, drop_last: bool) -> int:
    """The lane rows of ``segment`` over ``free``; ``ValueError`` saying why where its
    position cannot be one its ranks reached together."""
    if not 1 <= segment.world_size <= MAX_WORLD:
        raise ValueError(f"world_size {segment.world_size} is not a world size (1..{MAX_WORLD})")
    rows = lane_rows(_rows(free), segment.world_size, batch_size, drop_last)
    if not 0 <= segment.position <= rows:
        raise ValueError(f"position {segment.position} is outside the lanes of world_size "
                         f"{segment.world_size} (each rank has rows 0..{rows})")
    if segment.position % batch_size and segment.position != rows:
        raise ValueError(f"position {segment.position} is not on a batch boundary (a multiple of "
                         f"batch_size {batch_size}, or {rows} at the end of the lanes)")
    return rows


def free_ranges(total: int, segments: Sequence[Segment], batch_size: int, drop_last: bool) -> Ranges:
    """The positions of an epoch of ``total`` rows that ``segments`` (in order) left unread,
    sorted. ``ValueError`` where a segment is impossible (``check_segment``)."""
    free: Ranges = ((0, total),) if total else ()
    for seg in segments:
        check_segment(free, seg, batch_size, drop_last)
        if seg.position == 0:
            continue
        per = _rows(free) // seg.world_size
        starts = _starts(free)
        used = [piece for r in range(seg.world_size)
                for piece in _take(free, starts, r * per, r * per + seg.position)]
        free = _subtract(free, used)
    return free


def resume_ranges(total: int, segments: Sequence[Segment], world_size: int, rank: int, position: int,
                  batch_size: int, drop_last: bool) -> Ranges:
    """What rank ``rank`` of ``world_size`` still reads: its lane of the segment after
    ``segments``, from ``position`` rows in."""
    free = free_ranges(total, segments, batch_size, drop_last)
    mine = lane(free, rank, world_size, batch_size, drop_last)
    return take(mine, position, _rows(mine))


def relayout(segments: Sequence[Segment], current: Segment, world_size: int) -> tuple[tuple[Segment, ...], int]:
    """The segments and position a loader of ``world_size`` resumes at from a state whose
    current segment is ``current``: the same lanes at the same world size; else
    ``current`` closed (where it consumed anything) and a new segment from its start."""
    if current.world_size == world_size:
        return tuple(segments), current.position
    closed = tuple(segments) + ((current,) if current.position else ())
    return closed, 0


__all__ = ["Ranges", "Segment", "check_segment", "free_ranges", "lane", "lane_rows", "relayout",
           "resume_ranges", "take"]
