"""Order is arithmetic: shuffle, shard and resume as pure functions over integers."""

from .permutation import derive_key, permute
from .sequence import KINDS, EpochOrder, num_batches, rank_range

__all__ = ["KINDS", "EpochOrder", "derive_key", "num_batches", "permute", "rank_range"]
