"""Pseudorandom permutations of ``[0, n)``, as pure functions of ``(n, key)``.

``permute(i, n, key)`` maps any positions on their own (random access, no array):

A Feistel network over the bits covering ``n`` (``b = bit_length(n - 1)``), with cycle
walking to stay inside ``[0, n)``. Its halves are ``b // 2`` (left, high) and ``b - b // 2``
bits: for an odd ``b`` they swap widths each round (an alternating unbalanced network; 8
rounds bring them back). The domain ``2**b`` is under ``2n``, so a position walks about
``2**b / n`` passes (order version 2 rounded ``b`` up to an even number: a domain up to
``4n``, twice the walking). It is a bijection for any key, costs O(1) memory whatever ``n``
is, and maps any slice of positions independently — which is what makes resuming and
sharding a shuffled epoch free (no permutation array to rebuild or to skip through).
Domains of at most ``SMALL_DOMAIN`` positions (a block shuffle's row groups, small tables)
are permuted as ``shuffled_range`` orders them instead: a network of halves a few bits
wide is far from uniform there (chi-square over every order of 5 items, 60,000 keys:
45 times its degrees of freedom, one order twice as likely as it should be; order version
2's even bit counts 5.6 times), the hash sort 1.4. Pure integer arithmetic on numpy;
the output for given inputs never changes (golden vectors in the tests pin it).

``shuffled_range(n, key)`` is the whole permutation as an array, about 8x cheaper than
``permute`` over all of ``[0, n)``: where the whole domain is held anyway (the rows of a
block-shuffle window), computing it once and slicing it is the cheaper way to the same
guarantees (a bijection, a pure function of its inputs, resumable at any position by
recomputing it).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from .._polars import polars_sorts, sort_distinct

# 8 rounds: with 4, the permutation is measurably non-uniform on small domains (a few
# units in a block shuffle), e.g. some orders of 4 items twice as likely as others.
_ROUNDS = 8
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + _GOLDEN) & _MASK64
    z = x
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def derive_key(*parts: int) -> int:
    """Mix integers (seed, epoch, salt ...) into one 64-bit key, order-sensitively."""
    k = 0x6A09E667F3BCC908
    for p in parts:
        k = _splitmix64(k ^ (int(p) & _MASK64))
    return k


def _mix(x: np.ndarray, key: np.uint64) -> np.ndarray:
    z = x ^ key
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def _feistel(x: np.ndarray, lb: int, rb: int, keys: list[np.uint64]) -> np.ndarray:
    """The network over ``lb + rb`` bits (left ``lb``, right ``rb``); uint64 in and out.
    Each round is ``(L, R) -> (R, L ^ F(R))``, the new halves ``rb`` and ``lb`` bits wide."""
    left, right = x >> np.uint64(rb), x & np.uint64((1 << rb) - 1)
    for k in keys:
        left, right = right, left ^ (_mix(right, k) & np.uint64((1 << lb) - 1))
        lb, rb = rb, lb
    return (left << np.uint64(rb)) | right


def _halves(n: int) -> tuple[int, int]:
    """The widths of the network's left and right halves for the domain ``[0, n)``."""
    bits = max(2, int(n - 1).bit_length())  # (13 and more where permute runs it)
    return bits // 2, bits - bits // 2


def permute(index, n: int, key: int) -> np.ndarray:
    """Image of ``index`` (array-like of ints in ``[0, n)``) under the permutation of
    ``[0, n)`` chosen by ``key``. Vectorized; returns int64."""
    given = np.asarray(index, dtype=np.int64)
    idx = given.reshape(-1)  # (any shape: walked as one row, given back in its shape)
    if n <= 0:
        if idx.size:
            raise ValueError("permute() of an empty domain")
        return given
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise IndexError(f"positions must lie in [0, {n})")
    if n <= SMALL_DOMAIN:
        return _small(n, int(key) & _MASK64)[given]
    return _network(idx, n, key).reshape(given.shape)


#: domains up to this many positions are permuted by a hash sort, held whole (32 KiB)
SMALL_DOMAIN = 4096
_SALT_SMALL = 0x5A


@lru_cache(maxsize=64)
def _small(n: int, key: int) -> np.ndarray:
    """The whole permutation of a small domain (``shuffled_range``'s order)."""
    out = shuffled_range(n, derive_key(key, _SALT_SMALL))
    out.flags.writeable = False
    return out


def _network(idx: np.ndarray, n: int, key) -> np.ndarray:
    """The Feistel network's images of the 1-d positions ``idx`` of ``[0, n)``."""
    lb, rb = _halves(n)
    if rb <= _TABLE_HALF and idx.size >= _TABLE_MIN:
        # the same network, each round's function read from a table (see _round_tables)
        tables = _round_tables(int(key) & _MASK64, lb, rb)
        y = _feistel_tables(idx, lb, rb, tables)
        _walk(y, n, lambda v: _feistel_tables(v, lb, rb, tables))
        return y
    keys = [np.uint64(derive_key(key, r)) for r in range(_ROUNDS)]
    with np.errstate(over="ignore"):
        y = _feistel(idx.astype(np.uint64), lb, rb, keys)
        _walk(y, np.uint64(n), lambda v: _feistel(v, lb, rb, keys))
    return y.astype(np.int64)


def _walk(y: np.ndarray, n, step) -> None:
    """Cycle walking, in place: each value of ``y`` at or past ``n`` is sent through the
    network again (``step``) until it lands in ``[0, n)``. Only the values still out of range
    are tested and stepped each round: the domain is up to 2n, where a
    value takes up to ~30 rounds to land, and testing the whole array every round made a
    65,536-position slice of a 1.2M-row component cost 4x its first pass."""
    pending = np.flatnonzero(y >= n)
    while pending.size:
        moved = step(y[pending])
        y[pending] = moved
        pending = pending[moved >= n]


# A round's function depends on the right half only (at most 16 bits for domains up to
# 2**32): it is tabulated once per key (2**width uint16 entries per round), and a round is a
# lookup and an xor -- the same output as the arithmetic, 2.4x cheaper over 4M positions
# (0.074 s against 0.179 s of CPU, in 65,536-position slices: a global epoch's gathers).
_TABLE_HALF = 16
_TABLE_MIN = 1024  # fewer positions: the arithmetic costs less than building the tables


@lru_cache(maxsize=8)
def _round_tables(key: int, lb: int, rb: int) -> tuple[np.ndarray, ...]:
    """``_mix(r, round key) & mask`` for every right half ``r``, one table per round (the
    right half is ``rb`` bits wide in even rounds, ``lb`` in odd ones, the mask the other)."""
    tables = []
    with np.errstate(over="ignore"):
        for r in range(_ROUNDS):
            width, out = (rb, lb) if r % 2 == 0 else (lb, rb)
            domain = np.arange(1 << width, dtype=np.uint64)
            t = (_mix(domain, np.uint64(derive_key(key, r))) & np.uint64((1 << out) - 1)).astype(np.uint16)
            t.flags.writeable = False
            tables.append(t)
    return tuple(tables)


def _feistel_tables(x: np.ndarray, lb: int, rb: int, tables: tuple[np.ndarray, ...]) -> np.ndarray:
    """``_feistel`` with the round functions read from ``tables``; int64 in and out."""
    left = (x >> rb).astype(np.uint16)
    right = (x & ((1 << rb) - 1)).astype(np.uint16)
    for t in tables:
        left ^= t.take(right)
        left, right = right, left
    return (left.astype(np.int64) << rb) | right


_C1 = np.uint32(0x85EBCA6B)
_C2 = np.uint32(0xC2B2AE35)
_GOLDEN32 = np.uint32(0x9E3779B9)


def _fmix32(h: np.ndarray) -> np.ndarray:
    """murmur3's 32-bit finalizer, in place: a bijection of uint32."""
    h ^= h >> np.uint32(16)
    h *= _C1
    h ^= h >> np.uint32(13)
    h *= _C2
    h ^= h >> np.uint32(16)
    return h


_M32 = 1 << 32
#: see ``_sorted_by_hash``: shorter rows of positions are sorted packed with their hashes
_HASH_SORT_MIN = 1024
_C1_INV = np.uint32(pow(int(_C1), -1, _M32))
_C2_INV = np.uint32(pow(int(_C2), -1, _M32))
_GOLDEN32_INV = np.uint32(pow(int(_GOLDEN32), -1, _M32))


def _unfmix32(h: np.ndarray) -> np.ndarray:
    """The inverse of :func:`_fmix32`, in place (``x ^= x >> 13`` undone by ``x ^= x >> 13
    ^ x >> 26``; each multiplier by its inverse mod 2**32)."""
    h ^= h >> np.uint32(16)
    h *= _C2_INV
    h ^= (h >> np.uint32(13)) ^ (h >> np.uint32(26))
    h *= _C1_INV
    h ^= h >> np.uint32(16)
    return h


def _positions(h: np.ndarray, lo, hi) -> np.ndarray:
    """The positions ``i`` whose hashes (``shuffled_range``'s ``h``) are ``h``, in its order,
    as int64 (``h`` is overwritten): ``h`` inverted step by step."""
    with np.errstate(over="ignore"):
        _unfmix32(h)
        h ^= hi
        _unfmix32(h)
        h -= lo
        h *= _GOLDEN32_INV
    return h.astype(np.int64)


def shuffled_range(n: int, key: int) -> np.ndarray:
    """``[0, n)`` in a pseudorandom order chosen by ``key``, as one int64 array.

    Positions sorted by ``h(i) = f(f(i * 0x9E3779B9 + lo) ^ hi)`` (uint32 arithmetic),
    ``f`` murmur3's 32-bit finalizer, ``(lo, hi)`` the low and high halves of
    ``splitmix64(key)``. ``h`` is a bijection of uint32, so no two positions tie and the
    order is exactly "sorted by h" whatever the sort (``_sorted_by_hash``: one sort of
    the hashes with the positions packed beneath). ``n`` at most 2**32."""
    if not 0 <= n <= 1 << 32:
        raise ValueError(f"shuffled_range() needs 0 <= n <= 2**32, got {n}")
    if n <= 1:
        return np.arange(n, dtype=np.int64)
    k = _splitmix64(int(key) & _MASK64)
    return _sorted_by_hash(n, np.uint32(k & 0xFFFFFFFF), np.uint32(k >> 32))


def shuffled_ranges(n: int, keys) -> np.ndarray:
    """``[shuffled_range(n, k) for k in keys]`` as one ``[len(keys), n]`` int64 array,
    computed for all keys at once (the same hashes and sort, row by row)."""
    if not 0 <= n <= 1 << 32:
        raise ValueError(f"shuffled_ranges() needs 0 <= n <= 2**32, got {n}")
    keys = [int(k) & _MASK64 for k in keys]
    m = len(keys)
    if n <= 1 or m == 0:
        return np.broadcast_to(np.arange(n, dtype=np.int64), (m, n)).copy()
    mixed = [_splitmix64(k) for k in keys]
    lo = np.array([k & 0xFFFFFFFF for k in mixed], dtype=np.uint32)[:, None]
    hi = np.array([k >> 32 for k in mixed], dtype=np.uint32)[:, None]
    return _sorted_by_hash(n, lo, hi).astype(np.int64, copy=False)


def _sorted_by_hash(n: int, lo, hi) -> np.ndarray:
    """``[0, n)`` sorted by ``h(i)`` (see ``shuffled_range``) for the key halves ``lo`` /
    ``hi``: uint32 scalars (one order) or ``[m, 1]`` columns (``m`` orders, one per row).

    ``h`` is a bijection: no ties, so any sort gives the one order. Each position is packed
    under its hash (``h << 32 | i``, uint64) and the packed keys sorted directly; the low
    halves are then the order. Measured against ``argsort(h)`` (numpy 2.4, x86-64 with
    AVX-512, medians of 7 calls in one process): 6.5 against 11.3 ms at
    524,288 positions (a block shuffle's window of 8 row groups), 0.82 against 1.18 ms at
    65,536 (against two stable 16-bit radix sorts, the way below 2**18 until then), 14.6
    against 25.6 ms for 2,400 rows of 1,024 (a mixture epoch's interleaves). One order's
    keys are sorted by polars where it is imported (``_polars.sort_distinct``): on the
    2-core benchmark machine numpy's sort of 524,288 keys took 24.8 ms, polars' 7.4.

    Where numpy sorts, it sorts the hashes alone (uint32, about twice as fast as the packed
    uint64 keys: 0.33 against 0.78 ms for 63 rows of 1,024 on that machine) and inverts
    ``h`` on the sorted hashes to get the positions back (``_positions``): 63 interleaves
    1.41 -> 0.95 ms, 2,400 69-70 -> 50-51 ms, 524,288 positions 33 -> 22 ms. Its dozen
    array operations cost more than they save on short ranges: rows under
    ``_HASH_SORT_MIN`` positions or under four times that in all keep the packed sort
    (1-D: 1,024 positions 52 against 63 us, 4,096 163 against 133 us)."""
    with np.errstate(over="ignore"):
        h = np.arange(n, dtype=np.uint32)
        h *= _GOLDEN32
        h = h + lo
        _fmix32(h)
        h ^= hi
        _fmix32(h)
    if n >= _HASH_SORT_MIN and h.size >= 4 * _HASH_SORT_MIN and (h.ndim > 1 or not polars_sorts(n)):
        h.sort(axis=-1)  # distinct: the hash order
        return _positions(h, lo, hi)
    packed = h.astype(np.uint64)
    del h  # at most 16 bytes a position held at once (the packed keys, then the result)
    packed <<= np.uint64(32)
    packed |= np.arange(n, dtype=np.uint64)
    if packed.ndim == 1:
        packed = sort_distinct(packed)  # the keys are distinct: polars' sort where it is faster
    else:
        packed.sort(axis=-1)
    low = packed.view(np.uint32)[..., 0::2] if np.little_endian else packed.view(np.uint32)[..., 1::2]
    return low.astype(np.int64)
