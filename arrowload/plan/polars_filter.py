"""Which pushed predicates polars evaluates exactly as DuckDB does, translated to polars.

A scan's pushed predicate has DuckDB's meaning (``pushable`` proves pyarrow computes the
same). Where polars can compute that same meaning too, the unit reader hands it to
polars' Parquet decoder (``parallel="prefiltered"``): the predicate's columns are decoded
first and the others only where rows survive. Only this whitelist is translated, by node
type AND operand types, each shape checked against DuckDB by a differential test
(``tests/test_polars_filter.py``):

* ``col <op> literal`` / ``literal <op> col`` for ``= <> < <= > >=``, ``col <op> col`` of
  the very same type, ``col [NOT] IN (literals)``, ``col BETWEEN literal AND literal``,
  ``col IS [NOT] NULL``, a boolean column, ``TRUE`` / ``FALSE``, combined with AND / OR /
  NOT (polars' ``&`` / ``|`` / ``~`` are three-valued like SQL's, and a null keeps no row);
* ``col [NOT] LIKE 'pattern'`` on a string column, where the pattern is plain characters
  around one run of ``%`` or between two (``'ab%'``, ``'%ab'``, ``'a%b'``, ``'%ab%'``,
  ``'ab'``): ``starts_with`` / ``ends_with`` / a length check / ``contains`` / equality,
  byte for byte as DuckDB;
* columns that are integers (signed or unsigned), ``string`` / ``large_string``, ``bool``,
  ``date32``, ``decimal128`` and time-zone-naive ``timestamp`` in ``ms`` / ``us`` / ``ns``,
  with literals ``pushable.literal_fits`` accepts for that column type, typed as the column
  (as DuckDB and ``sqlexpr`` type them: a decimal literal the column's type holds exactly,
  a timestamp literal a count of the column's unit, a date one its midnight);
* ``float32`` / ``float64`` columns, also against each other and in ``IN`` lists: DuckDB and
  polars both order floats totally (NaN equal to NaN and above every number, ``-0.0``
  equal to ``0.0``), and polars is told to read no statistics (writers leave NaN out of
  min / max). A literal is the value DuckDB compares with (``pushable.float_value``): one
  the column's type holds exactly, or a plain decimal DuckDB casts to the column's type
  with one rounding (``0.9`` against a ``float32`` column is ``float32(0.9)``). DuckDB
  compares a ``float32`` column with a literal in exponent form (a DOUBLE) in double
  precision, and with it every literal of its ``IN`` list or ``BETWEEN``: such a group
  translates only where every literal is exact in ``float32``.

Zoned or second-unit timestamps, other LIKE patterns and everything else stay with
arrowload's evaluator. A predicate is split at its top-level ANDs: the translated
conjuncts prefilter in polars, the others (if any) are evaluated after, over the rows
polars kept.
"""

from __future__ import annotations

import datetime as dt
from functools import cached_property
from typing import Any

import pyarrow as pa
import pyarrow.types as pat

from . import pushable
from .expr import Expr, SqlExpr, conjoin, conjuncts
from .simplesql import isa

# node class names (sqlglot's trees and simple ones alike: ``simplesql.isa``)
_FLIP = {"EQ": "EQ", "NEQ": "NEQ", "LT": "GT", "GT": "LT", "LTE": "GTE", "GTE": "LTE"}
_KINDS = ("int", "float", "str", "bool", "date", "ts", "dec")
#: digits after the second of a timestamp unit polars has (no seconds unit)
_UNIT_DIGITS = {"ms": 3, "us": 6, "ns": 9}


class _No(Exception):
    """Not in the whitelist."""


def polars_kind(t: pa.DataType) -> str | None:
    """The whitelist's kind of a column type, or None when polars does not filter it here."""
    kind = pushable._kind(t)
    if kind == "ts" and t.unit not in _UNIT_DIGITS:
        return None
    return kind if kind in _KINDS else None


def _polars_type(t: pa.DataType, pl):
    if pat.is_floating(t):
        return pl.Float32 if pat.is_float32(t) else pl.Float64
    if pat.is_integer(t):
        return {"int8": pl.Int8, "int16": pl.Int16, "int32": pl.Int32, "int64": pl.Int64,
                "uint8": pl.UInt8, "uint16": pl.UInt16, "uint32": pl.UInt32, "uint64": pl.UInt64}[str(t)]
    if pat.is_string(t) or pat.is_large_string(t):
        return pl.String
    if pat.is_boolean(t):
        return pl.Boolean
    if pat.is_timestamp(t):
        return pl.Datetime(t.unit)
    if pat.is_decimal(t):
        return pl.Decimal(t.precision, t.scale)
    return pl.Date


def _column(node, schema: pa.Schema) -> tuple[str, pa.DataType] | None:
    while isa(node, "Paren"):
        node = node.this
    if isa(node, "Column") and node.name in schema.names and schema.names.count(node.name) == 1:
        t = schema.field(node.name).type
        if polars_kind(t) is not None:
            return node.name, t
        raise _No(f"column {node.name} of type {t}")
    return None


def _values(nodes, t: pa.DataType) -> list:
    """The values of literals ``nodes`` compared with a column of type ``t`` together (an
    ``IN`` list, ``BETWEEN``'s bounds; ``pushable.float_group_fits``)."""
    if polars_kind(t) == "float" and not pushable.float_group_fits(nodes, t):
        raise _No("a float literal group DuckDB compares in double precision")
    return [_value(n, t) for n in nodes]


def _value(node, t: pa.DataType) -> Any:
    """The Python value of literal ``node`` compared with a column of type ``t``."""
    if not pushable.literal_fits(node, t):
        raise _No("literal")
    kind = polars_kind(t)
    if kind == "float":
        return pushable.float_value(node, t)
    if kind == "dec":  # a plain decimal the column's type holds exactly (literal_fits)
        return pushable._number(node)
    if kind == "int":
        return int(pushable._number(node))
    if kind == "bool":
        while isa(node, "Paren"):
            node = node.this
        return bool(node.this)
    typed = pushable._typed_string(node)
    if typed is None:  # pragma: no cover - literal_fits accepted it
        raise _No("literal")
    if kind == "ts":
        return _epoch(typed[1], t.unit)
    return typed[1] if kind == "str" else dt.date.fromisoformat(typed[1])


def _epoch(text: str, unit: str) -> int:
    """Timestamp literal ``text`` (``YYYY-MM-DD[ HH:MM:SS[.f]]``, which ``literal_fits``
    checked: no more fractional digits than ``unit`` keeps) as an integer count of ``unit``
    since the epoch, as the column holds it; ``_No`` beyond its int64 range."""
    m = pushable._TIMESTAMP.match(text)
    if m is None:  # pragma: no cover - literal_fits accepted it
        raise _No("literal")
    day, hh, mm, ss, frac = m.groups()
    seconds = (dt.date.fromisoformat(day) - dt.date(1970, 1, 1)).days * 86_400
    if hh is not None:
        seconds += int(hh) * 3_600 + int(mm) * 60 + int(ss)
    digits = _UNIT_DIGITS[unit]
    value = seconds * 10 ** digits + (int((frac or "").ljust(digits, "0")) if frac else 0)
    if not -(2 ** 63) <= value < 2 ** 63:
        raise _No("a timestamp beyond the column's range")
    return value


_OPS = {"EQ": "==", "NEQ": "!=", "LT": "<", "LTE": "<=", "GT": ">", "GTE": ">="}


def _compare(cls, a, b, schema: pa.Schema) -> tuple:
    ca, cb = _column(a, schema), _column(b, schema)
    if ca is not None and cb is not None:
        if not ca[1].equals(cb[1]):
            raise _No("columns of different types")
        return ("cmp", _OPS[cls], ca[0], ("col", cb[0]))
    if ca is not None:
        return ("cmp", _OPS[cls], ca[0], ("val", _value(b, ca[1]), ca[1]))
    if cb is not None:
        return ("cmp", _OPS[_FLIP[cls]], cb[0], ("val", _value(a, cb[1]), cb[1]))
    raise _No("no column")


def _shape(node, schema: pa.Schema) -> tuple:
    """The predicate as a small tree of whitelisted shapes (polars not needed yet):
    ``("and"|"or", a, b)``, ``("not", a)``, ``("true"|"false",)``, ``("col", name)``,
    ``("cmp", op, name, ("col", name) | ("val", value, type))``, ``("null", name)``,
    ``("in", name, values, type)``; raises ``_No`` outside the whitelist."""
    if isa(node, "Paren"):
        return _shape(node.this, schema)
    if isa(node, "And", "Or"):
        return ("and" if isa(node, "And") else "or",
                _shape(node.this, schema), _shape(node.expression, schema))
    if isa(node, "Not"):
        return ("not", _shape(node.this, schema))
    if isa(node, "Boolean"):
        return ("true",) if node.this else ("false",)
    if isa(node, "Column"):
        c = _column(node, schema)
        if c is None or not pat.is_boolean(c[1]):
            raise _No("a non-boolean column as a predicate")
        return ("col", c[0])
    if type(node).__name__ in _OPS:
        return _compare(type(node).__name__, node.this, node.expression, schema)
    if isa(node, "Is"):
        c = _column(node.this, schema)
        if c is None or not isa(node.expression, "Null"):
            raise _No("IS")
        return ("null", c[0])
    if isa(node, "In"):
        c = _column(node.this, schema)
        if c is None or node.args.get("query") is not None or node.args.get("unnest") is not None \
                or not node.expressions:
            raise _No("IN")
        return ("in", c[0], _values(node.expressions, c[1]), c[1])
    if isa(node, "Like"):
        shape = _like(node, schema)
        return ("not", shape) if node.args.get("negate") else shape
    if isa(node, "Between"):
        c = _column(node.this, schema)
        if c is None or node.args.get("symmetric"):
            raise _No("BETWEEN")
        low, high = (("val", v, c[1]) for v in _values([node.args["low"], node.args["high"]], c[1]))
        return ("and", ("cmp", ">=", c[0], low), ("cmp", "<=", c[0], high))
    raise _No(type(node).__name__)


def _like(node, schema: pa.Schema) -> tuple:
    """``col LIKE 'pattern'`` (plain characters and ``%``, no escape, as ``pushable`` takes
    it) where the pattern is a prefix and / or a suffix around one run of ``%``, or
    characters between two: ``("like", name, prefix, suffix, middle)`` (``suffix`` None: no
    ``%``, the string itself)."""
    c = _column(node.this, schema)
    pattern = pushable._string(node.expression)
    if c is None or polars_kind(c[1]) != "str" or pattern is None or node.args.get("escape") is not None \
            or "\\" in pattern or "_" in pattern:
        raise _No("LIKE")
    if "%" not in pattern:
        return ("like", c[0], pattern, None, "")
    prefix, suffix = pattern[:pattern.index("%")], pattern[pattern.rindex("%") + 1:]
    middle = pattern[len(prefix):len(pattern) - len(suffix)].strip("%")
    if middle and (prefix or suffix or "%" in middle):
        raise _No("LIKE with characters between two % beside others")
    return ("like", c[0], prefix, suffix, middle)


def _build(shape: tuple, pl):
    kind = shape[0]
    if kind in ("and", "or"):
        a, b = _build(shape[1], pl), _build(shape[2], pl)
        return a & b if kind == "and" else a | b
    if kind == "not":
        return ~_build(shape[1], pl)
    if kind in ("true", "false"):
        return pl.lit(kind == "true", dtype=pl.Boolean)
    if kind == "col":
        return pl.col(shape[1])
    if kind == "null":
        return pl.col(shape[1]).is_null()
    if kind == "like":
        _, name, prefix, suffix, middle = shape
        col = pl.col(name)
        if suffix is None:
            return col == pl.lit(prefix, dtype=pl.String)
        if middle:
            return col.str.contains(middle, literal=True)
        parts = [col.str.starts_with(pl.lit(prefix, dtype=pl.String)),  # '' too: null stays null
                 col.str.ends_with(pl.lit(suffix, dtype=pl.String)) if suffix else None,
                 # 'ab%ba' needs both apart: 'aba' starts with 'ab' and ends with 'ba'
                 col.str.len_bytes() >= len(prefix.encode()) + len(suffix.encode()) if prefix and suffix else None]
        expr = parts[0]
        for p in parts[1:]:
            if p is not None:
                expr = expr & p
        return expr
    if kind == "in":
        _, name, values, t = shape
        if pat.is_timestamp(t):  # integers in the column's unit
            return pl.col(name).is_in(pl.Series(values, dtype=pl.Int64).cast(_polars_type(t, pl)).implode())
        return pl.col(name).is_in(pl.Series(values, dtype=_polars_type(t, pl)).implode())
    _, op, name, right = shape
    left = pl.col(name)
    if right[0] == "col":
        right = pl.col(right[1])
    elif pat.is_timestamp(right[2]):
        right = pl.lit(right[1], dtype=pl.Int64).cast(_polars_type(right[2], pl))
    else:
        right = pl.lit(right[1], dtype=_polars_type(right[2], pl))
    return {"==": left.__eq__, "!=": left.__ne__, "<": left.__lt__, "<=": left.__le__,
            ">": left.__gt__, ">=": left.__ge__}[op](right)


def translatable(tree, schema: pa.Schema) -> bool:
    """Whether predicate ``tree`` is in the whitelist (polars is not imported)."""
    try:
        _shape(tree, schema)
    except _No:
        return False
    return True


def to_polars(tree, schema: pa.Schema):
    """Predicate ``tree`` (bound, DuckDB dialect) as a polars expression keeping the same
    rows, or None when it is not in the whitelist."""
    if not translatable(tree, schema):
        return None
    import polars as pl
    return _build(_shape(tree, schema), pl)


class PolarsSplit:
    """A predicate split for a polars prefilter: ``polars`` (built on first use, which
    imports polars) keeps a superset of the rows, the conjuncts it translates; ``rest``
    (None when everything translated) is the predicate still to apply to what polars kept.
    ``polars_columns`` / ``rest_columns``: the columns each reads."""

    def __init__(self, parts: list[SqlExpr], rest: Expr | None, schema: pa.Schema) -> None:
        self._parts = parts
        self._schema = schema
        self.polars_columns = frozenset().union(*(p.columns for p in parts))
        self.rest = rest
        self.rest_columns = rest.columns if rest is not None else frozenset()

    @cached_property
    def polars(self):
        expr = None
        for part in self._parts:
            e = to_polars(part.node, self._schema)
            expr = e if expr is None else expr & e
        return expr

    def __str__(self) -> str:
        return " AND ".join(str(p) for p in self._parts)


def split_for_polars(predicate: Expr, schema: pa.Schema) -> PolarsSplit | None:
    """Split ``predicate`` at its top-level ANDs into the part polars evaluates with the
    same meaning and the rest; None when no conjunct translates. Polars is not imported."""
    done, rest = [], []
    for part in conjuncts(predicate):
        if isinstance(part, SqlExpr) and translatable(part.node, schema):
            done.append(part)
        else:
            rest.append(part)
    if not done:
        return None
    return PolarsSplit(done, conjoin(rest), schema)
