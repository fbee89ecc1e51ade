"""Order is arithmetic: shuffle, shard and resume as pure functions over integers."""

from .permutation import derive_key, permute
from .sequence import KINDS, SHUFFLE_CHOICES, EpochOrder, ShuffleKind, num_batches, rank_range

__all__ = ["KINDS", "SHUFFLE_CHOICES", "EpochOrder", "ShuffleKind", "derive_key", "num_batches", "permute",
           "rank_range"]
