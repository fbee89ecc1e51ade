"""The optimizer: an ordered tuple of rules, each a pure function ``Plan -> Plan``.

Each rule returns its input unchanged when it does not apply; each can be switched off
by the ``OptimizerOptions`` flag named beside it. That flag is the rule's name wherever a
person reads it: ``explain()``'s "applied" and "switched off" lines and its per-scan notes
(``row_group_pruning   row groups 8 -> 2``), the docs; the function names are internal. Results never depend on which rules
ran, only the cost does (tested rule by rule).
"""

from __future__ import annotations

from collections.abc import Callable

from ..options import OptimizerOptions
from ..plan.nodes import Plan
from .prune_limit import prune_limit
from .prune_partitions import prune_partitions
from .prune_row_groups import prune_row_groups
from .pushdown_limit import pushdown_limit
from .pushdown_predicates import pushdown_predicates
from .pushdown_projection import pushdown_projection

Rule = Callable[[Plan], Plan]

# (flag in OptimizerOptions, rule), in the order they run.
RULES: tuple[tuple[str, Rule], ...] = (
    ("predicate_pushdown", pushdown_predicates),
    ("limit_pushdown", pushdown_limit),
    ("projection_pushdown", pushdown_projection),
    ("partition_pruning", prune_partitions),
    ("row_group_pruning", prune_row_groups),
    ("limit_pushdown", prune_limit),
)


def optimize_steps(plan: Plan, options: OptimizerOptions) -> list[tuple[str, Plan]]:
    """Each enabled rule's flag (its name in ``explain()``, in ``OptimizerOptions`` and in
    the docs: one name per idea) with the plan after it ran."""
    steps = []
    for flag, rule in RULES:
        if getattr(options, flag):
            plan = rule(plan)
            steps.append((flag, plan))
    return steps


def optimize(plan: Plan, options: OptimizerOptions) -> Plan:
    for flag, rule in RULES:
        if getattr(options, flag):
            plan = rule(plan)
    return plan


__all__ = ["RULES", "optimize", "optimize_steps"] + [rule.__name__ for _, rule in RULES]
