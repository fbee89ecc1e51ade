"""Order is arithmetic: shuffle, shard and resume as pure functions over integers."""

from .permutation import derive_key, permute
from .sequence import KINDS, SHUFFLE_CHOICES, EpochOrder, ShuffleKind, num_batches, rank_range
from .tasks import SourceShape, Task, TaskKind, plan_tasks

__all__ = ["KINDS", "SHUFFLE_CHOICES", "EpochOrder", "ShuffleKind", "SourceShape", "Task", "TaskKind", "derive_key",
           "num_batches", "permute", "plan_tasks", "rank_range"]
