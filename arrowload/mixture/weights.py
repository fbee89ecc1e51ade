"""A mixture's weights: a dict, equal, a temperature over component sizes, or a SQL query."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ArgumentTypeError, InvalidArgumentError


def _number(name: str, value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        raise ArgumentTypeError(f"{what}: the weight of {name!r} must be a number >= 0, got "
                                f"{type(value).__name__} {value!r}", "weights")
    x = float(value)
    if not math.isfinite(x) or x < 0:
        raise InvalidArgumentError(f"{what}: the weight of {name!r} must be a finite number >= 0, got {value!r}",
                                   "weights")
    return x


def _from_mapping(names: Sequence[str], given: Mapping, what: str) -> tuple[float, ...]:
    missing = [n for n in names if n not in given]
    extra = [str(k) for k in given if k not in names]
    if missing or extra:
        raise InvalidArgumentError(
            f"{what} must give one weight per component: "
            + (f"missing {missing}" if missing else "") + ("; " if missing and extra else "")
            + (f"no component named {extra}" if extra else "")
            + f" (components: {list(names)})", "weights")
    out = tuple(_number(n, given[n], what) for n in names)
    if sum(out) <= 0:
        raise InvalidArgumentError(f"{what}: at least one weight must be > 0, got {dict(zip(names, out))}",
                                   "weights")
    return out


def _from_query(names: Sequence[str], table) -> tuple[float, ...]:
    """Rows ``(component, weight)``: columns named so, else the first two."""
    cols = table.column_names
    if len(cols) < 2:
        raise InvalidArgumentError(f"a weights query must return (component, weight) rows, got the columns "
                                   f"{cols}: e.g. SELECT src AS component, count(*) AS weight FROM t GROUP BY src",
                                   "weights")
    key = "component" if "component" in cols else cols[0]
    val = "weight" if "weight" in cols else cols[1]
    given: dict = {}
    for k, v in zip(table.column(key).to_pylist(), table.column(val).to_pylist()):
        k = str(k)
        if k in given:
            raise InvalidArgumentError(f"the weights query returned component {k!r} twice; group by it", "weights")
        if v is None:
            raise InvalidArgumentError(f"the weights query returned a null weight for {k!r}", "weights")
        given[k] = v
    return _from_mapping(names, given, "the weights query's rows")


def resolve(names: Sequence[str], weights: Any, temperature: Any, sizes) -> tuple[float, ...]:
    """Weights in component order (not normalized). ``sizes()`` gives the exact component
    sizes (only called for ``temperature``)."""
    from ..api import Dataset
    if weights is not None and temperature is not None:
        raise InvalidArgumentError("give weights= or temperature=, not both: temperature=T weighs each "
                                   "component by its size ** (1 / T)", "temperature")
    if temperature is not None:
        t = _number("temperature", temperature, "temperature=")
        if t <= 0:
            raise InvalidArgumentError(f"temperature must be > 0, got {temperature!r} (1: proportional to "
                                       "size; larger: flatter)", "temperature")
        n = sizes()
        if not any(n):
            raise InvalidArgumentError("temperature=: every component selects no rows", "temperature")
        # size ** (1 / T), scaled by the largest's (in logs: a small T overflows a float)
        top = max(math.log(s) for s in n if s) / t
        return tuple(math.exp(math.log(s) / t - top) if s else 0.0 for s in n)
    if weights is None:
        return tuple(1.0 for _ in names)
    if isinstance(weights, Dataset):
        return _from_query(names, weights.to_arrow())
    if isinstance(weights, Mapping):
        return _from_mapping(names, weights, "weights=")
    if isinstance(weights, (list, tuple)):
        if len(weights) != len(names):
            raise InvalidArgumentError(f"weights= as a sequence needs one weight per component ({len(names)}: "
                                       f"{list(names)}), got {len(weights)}", "weights")
        return _from_mapping(names, dict(zip(names, weights)), "weights=")
    raise ArgumentTypeError(f"weights= takes a dict {{component: weight}}, a list in component order or a "
                            f"Dataset of (component, weight) rows (al.sql(...)), got {type(weights).__name__}",
                            "weights")


def normalized(weights: Sequence[float]) -> tuple[float, ...]:
    total = sum(weights)
    return tuple(w / total for w in weights)


def refuse_empty(names: Sequence[str], sizes: Sequence[int], weights: Sequence[float]) -> None:
    """A component that selects no rows cannot be drawn from: refused where its weight is
    not 0 (``InvalidArgumentError`` naming it)."""
    for name, n, w in zip(names, sizes, weights):
        if n == 0 and w > 0:
            raise InvalidArgumentError(f"component {name!r} selects no rows but has weight {w:.3g}: give it "
                                       "weight 0 or leave it out", "weights")
