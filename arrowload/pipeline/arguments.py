"""Checking the loader's arguments when the loader is built, one rule per argument.

Every check raises :class:`~arrowload.errors.ArgumentTypeError` (a ``TypeError``) for a
value of the wrong type and :class:`~arrowload.errors.InvalidArgumentError` (a
``ValueError``) for a value out of range; both name the argument and say what is accepted.
Integers are Python ints or numpy integers (``np.int64(256)`` is fine), never bools
(``batch_size=True`` is refused, not read as 1). The checked value comes back normalized
(a Python ``int``, a :class:`~arrowload.order.ShuffleKind` or ``None`` for "auto").

>>> positive_int("batch_size", 256)
256
>>> shuffle_kind(True) is None, shuffle_kind("block")
(True, <ShuffleKind.BLOCK: 'block'>)
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import ArgumentTypeError, InvalidArgumentError
from ..order import SHUFFLE_CHOICES, ShuffleKind

#: the largest seed: seeds are mixed as unsigned 64-bit integers
MAX_SEED = (1 << 64) - 1


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def integer(name: str, value: Any, *, low: int | None = None, high: int | None = None,
            what: str = "an integer", example: str = "") -> int:
    """``value`` as a Python int, checked against ``[low, high]``."""
    hint = f", e.g. {name}={example}" if example else ""
    if not _is_int(value):
        raise ArgumentTypeError(f"{name}={value!r} ({type(value).__name__}): {name} must be {what} "
                                f"(a Python int or a numpy integer, not a bool or float){hint}", name)
    v = int(value)
    if (low is not None and v < low) or (high is not None and v > high):
        raise InvalidArgumentError(f"{name}={v}: {name} must be {what}{hint}", name)
    return v


def positive_int(name: str, value: Any, example: str = "") -> int:
    return integer(name, value, low=1, what="a positive integer (>= 1)", example=example)


def optional_int(name: str, value: Any, *, low: int, high: int | None = None, what: str,
                 example: str = "") -> int | None:
    return None if value is None else integer(name, value, low=low, high=high, what=what, example=example)


def boolean(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentTypeError(f"{name}={value!r} ({type(value).__name__}): {name} must be True or False",
                                name)
    return bool(value)


def shuffle_kind(value: Any) -> ShuffleKind | None:
    """``shuffle=``: False / "none", "global", "block", or True / "auto" (returned as None:
    the loader picks the best kind its source allows)."""
    accepted = f"True, False or one of {', '.join(map(repr, SHUFFLE_CHOICES))}"
    if isinstance(value, (bool, np.bool_)):
        return None if value else ShuffleKind.NONE
    if value is None:
        return ShuffleKind.NONE
    if isinstance(value, ShuffleKind):
        return value
    if not isinstance(value, str):
        raise ArgumentTypeError(f"shuffle={value!r} ({type(value).__name__}): shuffle must be {accepted}",
                                "shuffle")
    if value == "auto":
        return None
    try:
        return ShuffleKind(value)
    except ValueError:
        raise InvalidArgumentError(f"shuffle={value!r} is not a shuffle kind; shuffle must be {accepted}",
                                   "shuffle") from None


def rank_and_world(rank: Any, world_size: Any, where: str = "") -> tuple[int, int]:
    """Both checked: ``world_size >= 1`` and ``0 <= rank < world_size``."""
    src = f" (from {where})" if where else ""
    world = integer("world_size", world_size, low=1, what="a positive integer (the number of ranks)")
    r = integer("rank", rank, low=0, what="an integer >= 0 (this process's rank)")
    if r >= world:
        raise InvalidArgumentError(f"rank={r} with world_size={world}{src}: rank must be in "
                                   f"0..{world - 1} (0 <= rank < world_size)", "rank")
    return r, world


def env_int(name: str, text: str) -> int:
    """An integer from the environment variable ``name`` (RANK / WORLD_SIZE)."""
    try:
        return int(text)
    except ValueError:
        raise InvalidArgumentError(f"environment variable {name}={text!r} is not an integer; set it to "
                                   f"an integer or pass {name.lower()}= to the loader", name.lower()) from None


def optional_callable(name: str, value: Any) -> Any:
    if value is not None and not callable(value):
        raise ArgumentTypeError(f"{name}={value!r} ({type(value).__name__}): {name} must be None or a "
                                "function of a pyarrow.RecordBatch", name)
    return value


def optional_path(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise ArgumentTypeError(f"{name}={value!r} ({type(value).__name__}): {name} must be None or a "
                                "directory path (str or os.PathLike)", name)
    return os.fspath(value)


#: Where the loader's transforms run: ``"thread"`` (this process's threads) or ``"ray"``.
EXECUTORS = ("thread", "ray")


def executor(value: Any) -> str:
    """``executor=``: ``"thread"`` or ``"ray"``."""
    accepted = ", ".join(map(repr, EXECUTORS))
    if not isinstance(value, str):
        raise ArgumentTypeError(f"executor={value!r} ({type(value).__name__}): executor must be one of "
                                f"{accepted}", "executor")
    if value not in EXECUTORS:
        raise InvalidArgumentError(f"executor={value!r} is not an executor; executor must be one of {accepted} "
                                   "(\"ray\" runs the plan's maps and transform= as Ray tasks)", "executor")
    return value


def output(value: Any, outputs: tuple[str, ...]) -> str:
    accepted = ", ".join(map(repr, outputs))
    if not isinstance(value, str):
        raise ArgumentTypeError(f"output={value!r} ({type(value).__name__}): output must be one of {accepted}",
                                "output")
    if value not in outputs:
        raise InvalidArgumentError(f"output={value!r} is not an output; output must be one of {accepted}",
                                   "output")
    return value


def stack_spec(value: Any) -> Mapping[str, Any] | None:
    """``stack=``: a mapping output name -> list of column names or one glob (``"f*"``)."""
    if value is None:
        return None
    example = "stack={'x': ['f0', 'f1']} or stack={'x': 'f*'}"
    if not isinstance(value, Mapping):
        raise ArgumentTypeError(f"stack={value!r} ({type(value).__name__}): stack must be a mapping "
                                f"output name -> column names, e.g. {example}", "stack")
    for key, cols in value.items():
        if not isinstance(key, str):
            raise ArgumentTypeError(f"stack key {key!r} must be an output column name (str), e.g. {example}",
                                    "stack")
        if isinstance(cols, str):
            continue
        if not isinstance(cols, (list, tuple)) or not all(isinstance(c, str) for c in cols):
            raise ArgumentTypeError(f"stack[{key!r}]={cols!r}: must be a list of column names or one glob "
                                    f"(str), e.g. {example}", "stack")
        if not cols:
            raise InvalidArgumentError(f"stack[{key!r}] is empty; name the columns to stack, e.g. {example}",
                                       "stack")
    return value


def device_list(value: Any) -> tuple | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ArgumentTypeError(f"devices={value!r}: devices must be a list of devices, e.g. "
                                "devices=['cuda:0', 'cuda:1']", "devices")
    devices = tuple(value)
    return devices or None


def pad_lists(value: Any) -> Any:
    if isinstance(value, (bool, np.bool_, str)) or value is None:
        return value
    if isinstance(value, (list, tuple, set, frozenset)) and all(isinstance(n, str) for n in value):
        return value
    raise ArgumentTypeError(f"pad_lists={value!r} ({type(value).__name__}): pad_lists must be True, False or "
                            "column names, e.g. pad_lists=('tokens',)", "pad_lists")


def scalar(name: str, value: Any) -> Any:
    if isinstance(value, (numbers.Number, np.generic)) and getattr(value, "ndim", 0) == 0:
        return value
    raise ArgumentTypeError(f"{name}={value!r} ({type(value).__name__}): {name} must be a number or a bool, "
                            f"e.g. {name}=0", name)


def fill_null(value: Any) -> Mapping[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ArgumentTypeError(f"fill_null={value!r} ({type(value).__name__}): fill_null must be a mapping "
                                "column -> value, e.g. fill_null={'score': 0.0} or {'*': 0}", "fill_null")
    for key, v in value.items():
        if not isinstance(key, str):
            raise ArgumentTypeError(f"fill_null key {key!r} ({type(key).__name__}) must be a column name or '*'",
                                    "fill_null")
        if v is None:
            raise InvalidArgumentError(f"fill_null[{key!r}] is None: give the value its nulls become", "fill_null")
    return value
