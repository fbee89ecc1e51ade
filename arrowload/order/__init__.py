"""Order is arithmetic: shuffle, shard and resume as pure functions over integers."""

from .permutation import derive_key, permute, shuffled_range
from .sequence import (KINDS, ORDER_SINCE, ORDER_VERSION, SHUFFLE_CHOICES, EpochOrder, ShuffleKind,
                       num_batches, rank_range)

__all__ = ["KINDS", "ORDER_SINCE", "ORDER_VERSION", "SHUFFLE_CHOICES", "EpochOrder", "ShuffleKind",
           "derive_key", "num_batches", "permute", "rank_range", "shuffled_range"]
