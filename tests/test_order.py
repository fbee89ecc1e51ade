"""Order is arithmetic: the shuffle, shard and resume functions of ``arrowload.order``.

Properties are checked with hypothesis against plain Python / numpy truths (a sorted
list is ``range(n)``, a window's rows are the rows of its units), and golden vectors pin
the exact outputs so the order of an epoch never changes by accident: a change to any
literal below changes every shuffled epoch every user has ever trained on, and must be a
deliberate, announced decision (update the literals in the same commit).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections import Counter
from math import factorial

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arrowload import _polars
from arrowload.order import (KINDS, ORDER_SINCE, ORDER_VERSION, EpochOrder, derive_key, num_batches, permute,
                             rank_range, shuffled_range)
from arrowload.order.permutation import _splitmix64, shuffled_ranges

keys = st.integers(min_value=0, max_value=2**64 - 1)
sizes = st.integers(min_value=1, max_value=3000)
counts_st = st.lists(st.integers(min_value=0, max_value=40), min_size=0, max_size=14).map(tuple)
kinds = st.sampled_from(KINDS)


# ---------------------------------------------------------------------------
# golden vectors (generated once from the implementation, then frozen)

GOLDEN_PERMUTE = {  # order version 3: a small domain is a hash sort (SMALL_DOMAIN)
    0: [6, 4, 5, 9, 8, 1, 3, 0, 7, 2],
    12345: [0, 1, 7, 9, 8, 3, 4, 2, 5, 6],
}
# order version 3: larger domains whose bit count is odd run a network of unequal halves
GOLDEN_PERMUTE_ODD = {  # (n, first, stop, key): permute(range(first, stop), n, key)[-10:]
    (6, 0, 6, 0): [4, 5, 1, 3, 0, 2],
    (6, 0, 6, 12345): [0, 1, 3, 4, 2, 5],
    (5000, 0, 10, 12345): [1590, 2837, 2967, 2667, 4197, 789, 2554, 2671, 2511, 2197],
    # 2,048 positions: the round functions read from tables
    (5000, 0, 2048, 12345): [821, 3505, 1828, 3290, 1929, 3678, 1854, 4638, 1672, 4682],
}
GOLDEN_COUNTS = (3, 0, 5, 2, 4)  # 14 rows in 5 units, one of them empty
GOLDEN_ROWS = {  # EpochOrder(GOLDEN_COUNTS, kind, seed=7, epoch=1, window=2).rows(0, 14)
    "none": list(range(14)),
    # order version 3 (14 rows and 5 units: small domains, a hash sort); version 2 gave
    # global [13, 11, 12, 9, 7, 4, 5, 0, 1, 6, 3, 8, 10, 2] and block
    # [8, 7, 3, 9, 4, 5, 6, 13, 10, 12, 11, 0, 2, 1] over windows [[3, 2], [1, 4], [0]]
    # (version 1 other rows inside the windows too)
    "global": [0, 4, 9, 2, 6, 5, 8, 10, 12, 3, 11, 7, 13, 1],
    "block": [0, 13, 2, 1, 10, 11, 12, 7, 6, 9, 8, 3, 5, 4],
}
GOLDEN_SHUFFLED = {  # shuffled_range(10, key)
    0: [6, 9, 4, 8, 2, 3, 0, 7, 1, 5],
    12345: [2, 8, 6, 9, 1, 4, 0, 3, 5, 7],
}
GOLDEN_BLOCK_WINDOWS = [[0, 4], [2, 3], [1]]
GOLDEN_KEYS = {(0,): 1927618558350093866, (1, 2): 7450458766295249246}


@pytest.mark.parametrize("key", sorted(GOLDEN_PERMUTE))
def test_permute_golden(key):
    assert permute(np.arange(10), 10, key).tolist() == GOLDEN_PERMUTE[key]


@pytest.mark.parametrize("key", sorted(GOLDEN_SHUFFLED))
def test_shuffled_range_golden(key):
    assert shuffled_range(10, key).tolist() == GOLDEN_SHUFFLED[key]


@pytest.mark.parametrize("case", sorted(GOLDEN_PERMUTE_ODD))
def test_permute_golden_odd_bit_domains(case):
    n, first, stop, key = case
    assert permute(np.arange(first, stop), n, key)[-10:].tolist() == GOLDEN_PERMUTE_ODD[case]


def test_order_version_names_the_changes():
    """The order arithmetic's version: a state records it, and a kind's order loads only from
    states taken since it last changed (block rows in version 2; global rows and block units
    in version 3, ``permute`` over odd bit counts)."""
    assert ORDER_VERSION == 3
    assert ORDER_SINCE == {"none": 1, "global": 3, "block": 3}
    assert set(ORDER_SINCE) == set(KINDS) and max(ORDER_SINCE.values()) <= ORDER_VERSION


@pytest.mark.parametrize("kind", KINDS)
def test_epoch_order_golden(kind):
    order = EpochOrder(GOLDEN_COUNTS, kind, seed=7, epoch=1, window=2)
    assert order.rows(0, 14).tolist() == GOLDEN_ROWS[kind]


def test_block_windows_golden():
    order = EpochOrder(GOLDEN_COUNTS, "block", seed=7, epoch=1, window=2)
    assert [w.tolist() for w in order.windows] == GOLDEN_BLOCK_WINDOWS


def test_derive_key_golden():
    for parts, value in GOLDEN_KEYS.items():
        assert derive_key(*parts) == value
    assert derive_key(1, 2) != derive_key(2, 1)  # order-sensitive


# ---------------------------------------------------------------------------
# permute


@settings(max_examples=150, deadline=None)
@given(n=sizes, key=keys)
def test_permute_is_a_bijection(n, key):
    out = permute(np.arange(n), n, key)
    assert out.dtype == np.int64
    assert sorted(out.tolist()) == list(range(n))


@settings(max_examples=100, deadline=None)
@given(n=sizes, key=keys, data=st.data())
def test_permute_slices_agree_with_the_whole(n, key, data):
    whole = permute(np.arange(n), n, key)
    a = data.draw(st.integers(0, n))
    b = data.draw(st.integers(a, n))
    assert permute(np.arange(a, b), n, key).tolist() == whole[a:b].tolist()
    picks = data.draw(st.lists(st.integers(0, n - 1), max_size=30))
    assert permute(np.array(picks, dtype=np.int64), n, key).tolist() == whole[picks].tolist()


@settings(max_examples=60, deadline=None)
@given(n=st.integers(20, 3000), key=keys)
def test_permute_depends_on_key_and_moves_rows(n, key):
    p = permute(np.arange(n), n, key)
    q = permute(np.arange(n), n, (key + 1) % 2**64)
    assert p.tolist() != q.tolist()
    assert p.tolist() != list(range(n))


def test_permute_edges():
    assert permute(np.arange(1), 1, 5).tolist() == [0]
    assert permute(np.zeros(0, dtype=np.int64), 0, 5).tolist() == []
    with pytest.raises(IndexError):
        permute([3], 3, 0)
    with pytest.raises(IndexError):
        permute([-1], 3, 0)
    with pytest.raises(ValueError):
        permute([0], 0, 0)


def _z(chi2: float, dof: int) -> float:
    return (chi2 - dof) / np.sqrt(2 * dof)


@pytest.mark.parametrize("n", [5, 10])
def test_permute_positions_are_uniform_over_keys(n):
    """Each row lands on each position about equally often over many keys (chi-square,
    deterministic keys, so this cannot flake). Small domains matter: a block shuffle
    permutes a handful of row groups with the same function."""
    keys_ = 1500
    cnt = np.zeros((n, n))
    for k in range(keys_):
        cnt[np.arange(n), permute(np.arange(n), n, k)] += 1
    expected = keys_ / n
    chi2 = float(((cnt - expected) ** 2 / expected).sum())
    assert _z(chi2, (n - 1) ** 2) < 5, cnt


@pytest.mark.parametrize("n", [5, 6])
def test_permute_whole_orders_of_a_few_items_are_uniform(n):
    """Every order of ``n`` items about equally likely over keys (chi-square over all n!
    orders, deterministic keys). A Feistel network of halves one or two bits wide failed
    this badly (n = 5: chi-square 45 times its degrees of freedom) while its positions
    looked uniform; small domains are a hash sort now."""
    trials = 300 * factorial(n) if n == 5 else 50 * factorial(n)
    seen = Counter(tuple(permute(np.arange(n), n, k).tolist()) for k in range(trials))
    assert len(seen) == factorial(n)
    expected = trials / factorial(n)
    chi2 = sum((v - expected) ** 2 / expected for v in seen.values())
    assert _z(chi2, factorial(n) - 1) < 5, max(seen.values()) / expected


def test_permute_keeps_the_shape_of_its_positions():
    for n in (10, 10_000):
        flat = permute(np.arange(8), n, 1)
        assert permute(np.arange(8).reshape(2, 4), n, 1).tolist() == flat.reshape(2, 4).tolist()
        assert int(permute(np.int64(3), n, 1)) == int(flat[3])


def test_permute_all_orders_of_four_equally_likely():
    trials = 2400
    seen = Counter(tuple(permute(np.arange(4), 4, k).tolist()) for k in range(trials))
    assert len(seen) == factorial(4)
    expected = trials / factorial(4)
    chi2 = sum((v - expected) ** 2 / expected for v in seen.values())
    assert _z(chi2, factorial(4) - 1) < 5, seen


# ---------------------------------------------------------------------------
# shuffled_range (rows inside a block-shuffle window)

_U32 = 2**32 - 1


def _fmix32(h: int) -> int:
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _U32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _U32
    return h ^ (h >> 16)


def _shuffled_truth(n: int, key: int) -> list[int]:
    """The spec in plain Python integers: positions sorted by their hash."""
    k = _splitmix64(key)
    h = [_fmix32(_fmix32((i * 0x9E3779B9 + (k & _U32)) & _U32) ^ (k >> 32)) for i in range(n)]
    assert len(set(h)) == n  # a bijection of uint32: no ties
    return sorted(range(n), key=h.__getitem__)


@settings(max_examples=100, deadline=None)
@given(n=st.integers(0, 2000), key=keys)
def test_shuffled_range_is_the_hash_order(n, key):
    out = shuffled_range(n, key)
    assert out.dtype == np.int64
    assert out.tolist() == _shuffled_truth(n, key)
    assert sorted(out.tolist()) == list(range(n))  # a bijection


@pytest.mark.parametrize("n", [(1 << 18) + 3, 600_001])
def test_shuffled_range_is_the_hash_order_on_long_ranges(n):
    """A window-sized range (one packed sort of hashes and positions): the spec's order."""
    assert shuffled_range(n, 77).tolist() == _shuffled_truth(n, 77)


@pytest.mark.parametrize("n", [_polars.SORT_MIN - 1, _polars.SORT_MIN, 100_003])
def test_sort_distinct_by_polars_equals_numpys_sort(n):
    """Where polars is imported, distinct uint64 keys are sorted by polars
    (``_polars.sort_distinct``): the same array as numpy's sort, keys past 2**63 included
    (an unsigned order, not a signed one)."""
    pytest.importorskip("polars")
    rng = np.random.default_rng(n)
    values = np.unique(rng.integers(0, 2**64 - 1, n + 64, dtype=np.uint64, endpoint=True))[:n]
    values = values[rng.permutation(values.size)]
    assert (values >= np.uint64(1 << 63)).any() and (values < np.uint64(1 << 63)).any()
    want = np.sort(values)
    got = _polars.sort_distinct(values.copy())
    assert got.dtype == np.uint64 and got.tolist() == want.tolist()


def test_shuffled_range_is_the_same_without_polars():
    """A window's permutation sorted by polars (imported here) and by numpy (a process that
    never imports polars) is one order."""
    pytest.importorskip("polars")
    n, key = 300_007, 12345
    code = ("import sys, numpy as np; from arrowload.order.permutation import shuffled_range; "
            f"np.save(sys.argv[1], shuffled_range({n}, {key})); assert 'polars' not in sys.modules")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "perm.npy")
        subprocess.run([sys.executable, "-c", code, out], check=True)
        assert np.load(out).tolist() == shuffled_range(n, key).tolist()


@pytest.mark.parametrize("m, n", [(4, 1024), (3, 1500), (1, 5000)])
def test_sorted_hashes_inverted_give_the_hash_order(monkeypatch, m, n):
    """Ranges long enough for the hashes to be sorted alone (numpy; polars set aside) and
    inverted back to their positions (``permutation._positions``): the spec's order, one
    range or several at once, keys past 2**63 included."""
    from arrowload.order import permutation
    monkeypatch.setattr(permutation, "polars_sorts", lambda size: False)
    ks = [3 * k + 1 for k in range(m - 1)] + [2**64 - 5]
    assert [row.tolist() for row in shuffled_ranges(n, ks)] == [_shuffled_truth(n, k) for k in ks]
    assert shuffled_range(n, ks[-1]).tolist() == _shuffled_truth(n, ks[-1])


@settings(max_examples=30, deadline=None)
@given(n=st.integers(0, 1500), ks=st.lists(keys, max_size=5))
def test_shuffled_ranges_are_each_keys_hash_order(n, ks):
    out = shuffled_ranges(n, ks)
    assert out.dtype == np.int64 and out.shape == (len(ks), n)
    assert [row.tolist() for row in out] == [_shuffled_truth(n, k) for k in ks]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(20, 3000), key=keys)
def test_shuffled_range_depends_on_key_and_moves_rows(n, key):
    p = shuffled_range(n, key)
    assert p.tolist() != shuffled_range(n, (key + 1) % 2**64).tolist()
    assert p.tolist() != list(range(n))


def test_shuffled_range_edges():
    assert shuffled_range(0, 3).tolist() == [] and shuffled_range(1, 3).tolist() == [0]
    with pytest.raises(ValueError):
        shuffled_range(-1, 0)
    with pytest.raises(ValueError):
        shuffled_range(2**32 + 1, 0)


@pytest.mark.parametrize("n", [2, 5, 10])
def test_shuffled_range_positions_are_uniform_over_keys(n):
    """As for ``permute``: small windows (a few rows left in a window) must be uniform too.
    Keys as the order layer makes them (``derive_key``) and raw consecutive keys."""
    keys_ = 1500
    for make in (lambda k: derive_key(3, k), lambda k: k):
        cnt = np.zeros((n, n))
        for k in range(keys_):
            cnt[np.arange(n), shuffled_range(n, make(k))] += 1
        expected = keys_ / n
        chi2 = float(((cnt - expected) ** 2 / expected).sum())
        assert _z(chi2, (n - 1) ** 2) < 5, cnt


def test_shuffled_range_all_orders_of_four_equally_likely():
    trials = 2400
    seen = Counter(tuple(shuffled_range(4, derive_key(9, k)).tolist()) for k in range(trials))
    assert len(seen) == factorial(4)
    expected = trials / factorial(4)
    chi2 = sum((v - expected) ** 2 / expected for v in seen.values())
    assert _z(chi2, factorial(4) - 1) < 5, seen


def test_shuffled_range_pairs_are_unordered_on_a_large_window():
    """No position structure survives: over a 65,536-row window, a row's new place is
    uncorrelated with its old one and neighbours land far apart."""
    n = 1 << 16
    p = shuffled_range(n, derive_key(1, 2, 3))
    assert abs(np.corrcoef(np.arange(n), p)[0, 1]) < 0.02
    assert np.median(np.abs(np.diff(p))) > n / 5


# ---------------------------------------------------------------------------
# EpochOrder


def _window_row_sets(order: EpochOrder) -> list[set[int]]:
    offs = order.offsets
    return [set(r for u in units for r in range(offs[u], offs[u + 1])) for units in order.windows]


@settings(max_examples=150, deadline=None)
@given(counts=counts_st, kind=kinds, seed=st.integers(0, 2**32), epoch=st.integers(0, 1000),
       window=st.integers(1, 6))
def test_epoch_rows_are_a_permutation_and_deterministic(counts, kind, seed, epoch, window):
    order = EpochOrder(counts, kind, seed, epoch, window)
    n = sum(counts)
    assert order.total == n
    rows = order.rows(0, n)
    assert sorted(rows.tolist()) == list(range(n))
    again = EpochOrder(counts, kind, seed, epoch, window).rows(0, n)
    assert rows.tolist() == again.tolist()
    if kind == "none":
        assert rows.tolist() == list(range(n))


@settings(max_examples=150, deadline=None)
@given(counts=counts_st, kind=kinds, seed=st.integers(0, 2**32), epoch=st.integers(0, 50),
       window=st.integers(1, 6), data=st.data())
def test_epoch_slices_agree_with_the_whole(counts, kind, seed, epoch, window, data):
    """Resume and sharding read positions [a, b) directly: they must equal the slice."""
    order = EpochOrder(counts, kind, seed, epoch, window)
    n = order.total
    whole = order.rows(0, n).tolist()
    cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=5)))
    bounds = [0, *cuts, n]
    pieces = [order.rows(a, b).tolist() for a, b in zip(bounds, bounds[1:])]
    assert [r for p in pieces for r in p] == whole
    fresh = EpochOrder(counts, kind, seed, epoch, window)  # no cached state from `whole`
    a = data.draw(st.integers(0, n))
    b = data.draw(st.integers(a, n))
    assert fresh.rows(a, b).tolist() == whole[a:b]


@settings(max_examples=150, deadline=None)
@given(counts=counts_st, seed=st.integers(0, 2**32), epoch=st.integers(0, 50),
       window=st.integers(1, 6))
def test_block_windows_keep_rows_in_their_units(counts, seed, epoch, window):
    order = EpochOrder(counts, "block", seed, epoch, window)
    units = [u for w in order.windows for u in w.tolist()]
    assert sorted(units) == list(range(len(counts)))  # every unit in exactly one window
    assert all(len(w) <= window for w in order.windows)
    rows = order.rows(0, order.total).tolist()
    offs = order.window_offsets
    for w, allowed in enumerate(_window_row_sets(order)):
        segment = rows[offs[w]:offs[w + 1]]
        assert set(segment) == allowed and len(segment) == len(allowed)


@settings(max_examples=100, deadline=None)
@given(counts=counts_st.filter(lambda c: sum(c) >= 20), kind=st.sampled_from(["global", "block"]),
       seed=st.integers(0, 2**32), epoch=st.integers(0, 1000), window=st.integers(1, 6))
def test_epochs_and_seeds_differ(counts, kind, seed, epoch, window):
    n = sum(counts)
    base = EpochOrder(counts, kind, seed, epoch, window).rows(0, n).tolist()
    assert EpochOrder(counts, kind, seed, epoch + 1, window).rows(0, n).tolist() != base
    assert EpochOrder(counts, kind, seed + 1, epoch, window).rows(0, n).tolist() != base


@settings(max_examples=60, deadline=None)
@given(counts=counts_st, seed=st.integers(0, 2**32), epoch=st.integers(0, 50), window=st.integers(1, 6),
       data=st.data())
def test_block_window_local_is_a_slice_of_the_window_permutation(counts, seed, epoch, window, data):
    """Resume inside a window = recompute that window's permutation and slice it: the same
    rows from a fresh order (nothing kept) as from one that computed every window."""
    order = EpochOrder(counts, "block", seed, epoch, window)
    for w in range(len(order.windows)):
        size = int(order.window_offsets[w + 1] - order.window_offsets[w])
        whole = order.window_permutation(w)
        assert sorted(whole.tolist()) == list(range(size))
        assert whole.tolist() == shuffled_range(size, derive_key(seed, epoch, 0x63, w)).tolist()
        lo = data.draw(st.integers(0, size))
        hi = data.draw(st.integers(lo, size))
        fresh = EpochOrder(counts, "block", seed, epoch, window)
        assert fresh.window_local(w, lo, hi).tolist() == whole[lo:hi].tolist()


def test_global_shuffle_mixes_units():
    """Global is not a block shuffle in disguise: the first rows come from many units."""
    counts = (100,) * 50
    rows = EpochOrder(counts, "global", 0, 0).rows(0, 200)
    assert len(set((rows // 100).tolist())) > 40


def test_epoch_order_rejects_bad_arguments():
    with pytest.raises(ValueError):
        EpochOrder((1, 2), "random")
    with pytest.raises(ValueError):
        EpochOrder((1, 2), "block", window=0)
    with pytest.raises(IndexError):
        EpochOrder((1, 2), "none").rows(0, 4)
    with pytest.raises(IndexError):
        EpochOrder((1, 2), "global").rows(2, 1)


@settings(max_examples=100, deadline=None)
@given(counts=counts_st, data=st.data())
def test_unit_pieces_and_locate(counts, data):
    order = EpochOrder(counts, "none")
    n = order.total
    a = data.draw(st.integers(0, n))
    b = data.draw(st.integers(a, n))
    offs = order.offsets
    rows = [offs[u] + i for u, lo, hi in order.unit_pieces(a, b) for i in range(lo, hi)]
    assert rows == list(range(a, b))
    units, within = order.locate(np.arange(n))
    assert (offs[units] + within).tolist() == list(range(n))
    assert all(0 <= w < counts[u] for u, w in zip(units.tolist(), within.tolist()))


# ---------------------------------------------------------------------------
# sharding and batch counts


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 10_000), world=st.integers(1, 9))
def test_rank_ranges_are_disjoint_equal_and_leave_less_than_world(n, world):
    ranges = [rank_range(n, r, world) for r in range(world)]
    sizes_ = {b - a for a, b in ranges}
    assert len(sizes_) == 1  # equal shares
    covered = [p for a, b in ranges for p in range(a, b)]
    assert len(covered) == len(set(covered))  # disjoint
    assert all(0 <= p < n for p in covered)
    assert 0 <= n - len(covered) < world  # the remainder left out is smaller than world
    assert covered == list(range(len(covered)))  # contiguous from the start


@pytest.mark.parametrize("rank,world", [(-1, 2), (2, 2), (0, 0)])
def test_rank_range_rejects_bad_ranks(rank, world):
    with pytest.raises(ValueError):
        rank_range(10, rank, world)


@settings(max_examples=200, deadline=None)
@given(rows=st.integers(0, 10_000), bs=st.integers(1, 600), drop_last=st.booleans())
def test_num_batches_matches_slicing(rows, bs, drop_last):
    batches = [min(bs, rows - s) for s in range(0, rows, bs)]
    if drop_last:
        batches = [b for b in batches if b == bs]
    assert num_batches(rows, bs, drop_last) == len(batches)


def test_num_batches_rejects_zero():
    with pytest.raises(ValueError):
        num_batches(10, 0, False)


@settings(max_examples=60, deadline=None)
@given(st.integers(4097, 1 << 20), st.integers(0, 2**64 - 1), st.data())  # (past SMALL_DOMAIN: the network)
def test_permute_tables_equal_the_arithmetic(n, key, data):
    """Large calls read the Feistel rounds from tables (``_round_tables``); the output is the
    arithmetic network's, position for position."""
    from arrowload.order import permutation as P
    a = data.draw(st.integers(0, n - 1))
    b = min(n, a + data.draw(st.integers(P._TABLE_MIN, 4 * P._TABLE_MIN)))
    idx = np.arange(a, b, dtype=np.int64)
    lb, rb = P._halves(n)
    keys = [np.uint64(P.derive_key(key, r)) for r in range(P._ROUNDS)]
    with np.errstate(over="ignore"):
        y = P._feistel(idx.astype(np.uint64), lb, rb, keys)
        while (bad := y >= np.uint64(n)).any():
            y[bad] = P._feistel(y[bad], lb, rb, keys)
    assert permute(idx, n, key).tolist() == y.astype(np.int64).tolist()


def test_permute_tables_at_the_largest_tabulated_domain():
    """n near 2**32: 16-bit halves, the largest the tables serve."""
    from arrowload.order import permutation as P
    n, key = 2**32 - 5, 12345
    idx = np.arange(n - 2048, n, dtype=np.int64)
    keys = [np.uint64(P.derive_key(key, r)) for r in range(P._ROUNDS)]
    with np.errstate(over="ignore"):
        y = P._feistel(idx.astype(np.uint64), 16, 16, keys)
        while (bad := y >= np.uint64(n)).any():
            y[bad] = P._feistel(y[bad], 16, 16, keys)
    assert permute(idx, n, key).tolist() == y.astype(np.int64).tolist()
