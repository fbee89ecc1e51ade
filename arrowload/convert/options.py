"""``ConvertOptions``: how a batch is handed to numpy, torch, jax or kept as Arrow.

Validated once, when built, so converting a batch does no option checking.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConversionError

OUTPUTS = ("numpy", "torch", "jax", "arrow")

#: ``fill_null`` key that applies to every integer / floating-point column
#: (and to lists of them) not named explicitly.
ALL_NUMERIC = "*"


@dataclass(frozen=True)
class ConvertOptions:
    """How ``convert_batch`` turns an Arrow batch into arrays.

    ``output``     ``"numpy"`` | ``"torch"`` | ``"jax"`` (a dict column -> array) or ``"arrow"``
                   (the batch itself).
    ``pad_lists``  ``True`` pads every variable-length list column, a tuple of names pads
                   those; a padded column ``x`` gives ``x`` ``[batch, max_len, ...]`` plus
                   ``x_lengths`` (int64). Not padded, a list column whose lists all have one
                   length ``k`` is ``[batch, k]`` (a view of its values); lists of different
                   lengths (or null lists) are an error naming the column and the lengths.
    ``pad_value``  what fills the padding (checked against the column's type).
    ``pad_to``     pad to this fixed length instead of the batch's longest list (fixed shapes
                   spare jax recompilation); a longer list is an error.
    ``fill_null``  column -> value put where the column is null; key ``"*"`` covers every
                   integer / floating-point column (and lists of them) not named; a value
                   with a fraction (0.5) fills the floating-point ones only. Without
                   it a null in an array-valued column is an error.
    ``device``     ``None`` keeps arrays in host memory. torch: a device string
                   (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...) or ``torch.device``; jax: a
                   platform string (``"cpu"``, ``"gpu"``, ``"cuda:0"``, ``"tpu:1"``) or a
                   ``jax.Device``. numpy and arrow output live in host memory: only
                   ``None`` / ``"cpu"``.

    >>> ConvertOptions(output="torch", pad_lists=("tokens",), fill_null={"*": 0}).pad_lists
    ('tokens',)
    """

    output: str = "numpy"
    pad_lists: bool | tuple[str, ...] = False
    pad_value: Any = 0
    fill_null: Mapping[str, Any] | None = None
    device: Any = None
    pad_to: int | None = None

    def __post_init__(self) -> None:
        if self.output not in OUTPUTS:
            raise ConversionError(f"output={self.output!r} is not one of {', '.join(map(repr, OUTPUTS))}")
        pad = self.pad_lists
        if isinstance(pad, str):
            pad = (pad,)
        elif not isinstance(pad, bool):
            try:
                pad = tuple(pad)
            except TypeError:
                pad = None
            if pad is None or not all(isinstance(n, str) for n in pad):
                raise ConversionError(f"pad_lists={self.pad_lists!r} must be True, False or a tuple of "
                                      "column names")
        object.__setattr__(self, "pad_lists", pad)
        if not _is_scalar(self.pad_value):
            raise ConversionError(f"pad_value={self.pad_value!r} must be a scalar (a number or a bool)")
        if self.pad_to is not None and (isinstance(self.pad_to, bool) or not isinstance(self.pad_to, int)
                                        or self.pad_to < 0):
            raise ConversionError(f"pad_to={self.pad_to!r} must be None or a non-negative int")
        if self.fill_null is not None:
            if not isinstance(self.fill_null, Mapping):
                raise ConversionError(f"fill_null={self.fill_null!r} must be a mapping column -> value, "
                                      "e.g. {'score': 0.0} or {'*': 0}")
            for key, value in self.fill_null.items():
                if not isinstance(key, str):
                    raise ConversionError(f"fill_null key {key!r} must be a column name (str) or '*'")
                if value is None:
                    raise ConversionError(f"fill_null[{key!r}] is None; give the value nulls become")
            object.__setattr__(self, "fill_null", _FrozenMap(self.fill_null))
        if self.output in ("numpy", "arrow") and self.device not in (None, "cpu"):
            raise ConversionError(f"output={self.output!r} lives in host memory, so device must be None "
                                  f"or 'cpu' (got {self.device!r}); use output='torch' or 'jax' to place "
                                  "batches on an accelerator")

    def pads(self, name: str) -> bool:
        """Whether the variable-length list column ``name`` is padded."""
        return self.pad_lists is True or (isinstance(self.pad_lists, tuple) and name in self.pad_lists)


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (numbers.Number, bool)) or hasattr(value, "dtype") and getattr(value, "ndim", 1) == 0


class _FrozenMap(Mapping):
    """A read-only, hashable copy of ``fill_null`` (so the options stay a value)."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, Any]) -> None:
        self._items = dict(items)

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self):
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(tuple(sorted((k, repr(v)) for k, v in self._items.items())))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self.items()) == dict(other.items())

    def __repr__(self) -> str:
        return repr(self._items)
