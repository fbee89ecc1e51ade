"""Order is arithmetic: shuffle, shard and resume as pure functions over integers."""

from .elastic import Segment, free_ranges, lane, lane_rows, relayout, resume_ranges, take
from .permutation import derive_key, permute, shuffled_range
from .sequence import (KINDS, ORDER_SINCE, ORDER_VERSION, SHUFFLE_CHOICES, EpochOrder, ShuffleKind,
                       num_batches, rank_range)
from .tasks import SourceShape, Task, TaskKind, plan_tasks

__all__ = ["KINDS", "ORDER_SINCE", "ORDER_VERSION", "SHUFFLE_CHOICES", "EpochOrder", "ShuffleKind",
           "Segment", "SourceShape", "Task", "TaskKind", "derive_key", "free_ranges", "lane", "lane_rows",
           "num_batches", "permute", "plan_tasks", "rank_range", "relayout", "resume_ranges", "shuffled_range",
           "take"]
