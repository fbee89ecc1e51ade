"""Which SQL expressions pyarrow compute evaluates exactly as DuckDB does.

Filters follow DuckDB's semantics. pyarrow compute differs from DuckDB in many small
ways (NaN ordering and equality, ``-0.0`` in ``IN`` lists, ``LIKE`` escapes and ``_`` on
multi-byte characters, literal typing, overflow, casts to text ...), so only a small
grammar whose meaning is the same in both is compiled to pyarrow, where it runs inside the
scan and drives partition and row-group pruning. Everything else is evaluated by DuckDB
itself (``duckeval``). The grammar is a whitelist by node type AND operand types:

* ``col <op> literal`` / ``literal <op> col`` for ``= <> < <= > >=``, ``col [NOT] IN
  (literals)``, ``col BETWEEN literal AND literal``, ``col IS [NOT] NULL``, and
  ``col <op> col`` of the very same type, combined with AND / OR / NOT and parentheses;
* columns that are integers (signed or unsigned), ``string`` / ``large_string``,
  ``bool``, ``date32``, time-zone-naive timestamps and ``decimal128`` (against plain
  decimal literals the column's type holds exactly); ``float32`` / ``float64`` against
  the literals whose value DuckDB rounds to the column's type once (``float_value``: those
  it holds exactly, and plain decimals such as ``0.9``; never column against column; ``IN``
  as one value set holding ``-0.0`` beside ``0.0``), with ``>`` / ``>=`` keeping NaN rows
  (DuckDB: NaN is greater than every number);
* integer literals that fit the column's type; string literals against strings, strict
  ISO dates / timestamps (no more fractional digits than the column keeps) against dates
  and timestamps; ``LIKE`` with a pattern of plain characters and ``%`` only.

No NULL literal, arithmetic, function, CAST of a column, float16, decimal256, dictionary
or string_view column is in the grammar: DuckDB evaluates those.
"""

from __future__ import annotations

import datetime as dt
import re
from decimal import Decimal, InvalidOperation

import numpy as np
import pyarrow as pa
import pyarrow.types as pat

from .simplesql import isa, type_name

# Nodes are told apart by class name (``simplesql.isa``): these functions read sqlglot's
# trees and simple ones (``simplesql``) alike, without importing sqlglot.
_COMPARISONS = ("EQ", "NEQ", "GT", "GTE", "LT", "LTE")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_TIMESTAMP = re.compile(r"^(\d{4}-\d{2}-\d{2})(?:[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?)?$")
_UNIT_DIGITS = {"s": 0, "ms": 3, "us": 6, "ns": 9}


def _kind(t: pa.DataType) -> str | None:
    if pat.is_integer(t):
        return "int"
    if pat.is_float32(t) or pat.is_float64(t):
        return "float"
    if pat.is_string(t) or pat.is_large_string(t):
        return "str"
    if pat.is_boolean(t):
        return "bool"
    if pat.is_date32(t):
        return "date"
    if pat.is_timestamp(t) and t.tz is None:
        return "ts"
    if pat.is_decimal128(t):
        return "dec"
    return None


def _column_type(node, schema: pa.Schema) -> pa.DataType | None:
    while isa(node, "Paren"):
        node = node.this
    if isa(node, "Column") and node.name in schema.names:
        return schema.field(node.name).type
    return None


def _number(node) -> Decimal | None:
    """The value of a numeric literal (``-`` allowed), else None."""
    while isa(node, "Paren"):
        node = node.this
    neg = False
    while isa(node, "Neg"):
        neg, node = not neg, node.this
        while isa(node, "Paren"):
            node = node.this
    if not (isa(node, "Literal") and not node.is_string):
        return None
    try:
        v = Decimal(node.this)
    except InvalidOperation:
        return None
    if not v.is_finite():
        return None
    return v.copy_negate() if neg else v  # (unary minus rounds to 28 digits)


def _string(node) -> str | None:
    while isa(node, "Paren"):
        node = node.this
    if isa(node, "Literal") and node.is_string:
        return node.this
    return None


def _typed_string(node) -> tuple[str, str] | None:
    """``DATE '...'`` / ``TIMESTAMP '...'`` / a plain string literal: (kind, text)."""
    while isa(node, "Paren"):
        node = node.this
    s = _string(node)
    if s is not None:
        return "str", s
    if isa(node, "Cast") and _string(node.this) is not None:
        t = type_name(node.args["to"])
        if t == "DATE":
            return "date", _string(node.this)
        if t in ("TIMESTAMP", "TIMESTAMPNTZ", "DATETIME"):  # both parsers spell TIMESTAMP '...' TIMESTAMPNTZ
            return "ts", _string(node.this)
    return None


def _exact_float(v: Decimal, t: pa.DataType) -> bool:
    f = float(v)
    if not np.isfinite(f):
        return False
    if pat.is_float32(t):
        with np.errstate(over="ignore"):  # beyond float32: inf, not exact
            f32 = np.float32(f)
        return bool(np.isfinite(f32)) and Decimal(float(f32)) == v
    return Decimal(f) == v


#: a float type's significand bits and the largest power of ten it holds exactly (5**k < 2**bits)
_FLOAT_EXACT = {"float": (24, 10), "double": (53, 22)}


def float_value(node, t: pa.DataType) -> float | None:
    """The value DuckDB compares a ``float32`` / ``float64`` column (type ``t``) with, for
    numeric literal ``node``, where it is the literal correctly rounded to ``t`` (the value
    ``sqlexpr`` gives it); else None.

    - A literal ``t`` holds exactly: itself (in ``t`` or in double precision, alike).
    - A plain decimal (``0.9``, ``-2.5``, ``3``): DuckDB types it DECIMAL (INTEGER) and
      casts it to ``t`` as its unscaled integer divided by its power of ten. Where both are
      exact in ``t``, that is one rounding: the correctly rounded value. (Python rounds to
      double first, then to float32: one rounding too, since 53 >= 2 * 24 + 2.)
    - Exponent form (``1e-1``) is a DOUBLE in DuckDB: against ``float64``, correctly
      rounded by both parsers; against ``float32`` DuckDB compares in double precision,
      so only an exact one qualifies.
    """
    v = _number(node)
    if v is None or _kind(t) != "float":  # float16: no rounding rule here
        return None
    if _exact_float(v, t):
        return float(v)
    f32 = pat.is_float32(t)
    if f32 and _double_literal(node):
        return None
    _, digits, exponent = v.as_tuple()
    bits, pow10 = _FLOAT_EXACT[str(t)]
    if exponent > 0 or -exponent > pow10 or int("".join(map(str, digits)) or "0") >= 2 ** bits:
        return None
    value = float(v)
    if f32:
        value = float(np.float32(value))
        if not np.isfinite(value):  # pragma: no cover - below 2**24 at most 10 places: finite
            return None
    return value


#: the most digits DuckDB's DECIMAL holds; a literal with a point and more digits (leading
#: and trailing zeros counted: ``1.000...0``) is a DOUBLE
_DECIMAL_DIGITS = 38


def _double_literal(node) -> bool:
    """Whether DuckDB types numeric literal ``node`` DOUBLE: exponent form, or a point and
    more digits than a DECIMAL holds."""
    text = _text(node).lower()
    return "e" in text or ("." in text and sum(c.isdigit() for c in text) > _DECIMAL_DIGITS)


def float_group_fits(nodes, t: pa.DataType) -> bool:
    """Whether literals ``nodes``, compared with a float column of type ``t`` together (an
    ``IN`` list, ``BETWEEN``'s bounds), each mean ``float_value``: against ``float32``,
    DuckDB compares the whole group in double precision where one of them is a DOUBLE, so
    then every one must be exact in ``float32``."""
    if pat.is_float32(t) and any(_double_literal(n) for n in nodes):
        return all((v := _number(n)) is not None and _exact_float(v, t) for n in nodes)
    return all(float_value(n, t) is not None for n in nodes)


def _valid_date(text: str) -> bool:
    if not _DATE.match(text):
        return False
    try:
        dt.date.fromisoformat(text)
        return True
    except ValueError:
        return False


def literal_fits(node, t: pa.DataType) -> bool:
    """True when literal ``node`` compared with a column of type ``t`` means the same in
    pyarrow (after ``sqlexpr``'s literal typing) as in DuckDB."""
    kind = _kind(t)
    if kind == "int":
        v = _number(node)
        if v is None or v != v.to_integral_value() or "." in _text(node) or "e" in _text(node).lower():
            return False
        try:
            pa.scalar(int(v), t)
            return True
        except (pa.ArrowInvalid, OverflowError):
            return False
    if kind == "float":
        return float_value(node, t) is not None
    if kind == "dec":  # a plain decimal literal the column's type holds exactly
        v = _number(node)
        if v is None or _double_literal(node):
            return False
        return v.as_tuple().exponent >= -t.scale and abs(v) < Decimal(10) ** (t.precision - t.scale)
    if kind == "bool":
        while isa(node, "Paren"):
            node = node.this
        return isa(node, "Boolean")
    typed = _typed_string(node)
    if typed is None:
        return False
    lit_kind, text = typed
    if kind == "str":
        return lit_kind == "str"
    if kind == "date":
        return lit_kind in ("str", "date") and _valid_date(text)
    if kind == "ts":
        m = _TIMESTAMP.match(text)
        if lit_kind not in ("str", "ts", "date") or m is None or not _valid_date(m.group(1)):
            return False
        if lit_kind == "date" and m.group(2) is not None:
            return False
        if m.group(2) is not None and not (int(m.group(2)) < 24 and int(m.group(3)) < 60 and int(m.group(4)) < 60):
            return False
        frac = m.group(5) or ""
        if lit_kind == "ts" and len(frac) > _UNIT_DIGITS["us"]:  # a TIMESTAMP literal holds microseconds
            return False
        return len(frac) <= _UNIT_DIGITS.get(t.unit, -1)
    return False


def _text(node) -> str:
    while isa(node, "Paren", "Neg"):
        node = node.this
    return node.this if isa(node, "Literal") else ""


def _compare_ok(a, b, schema: pa.Schema) -> bool:
    ta, tb = _column_type(a, schema), _column_type(b, schema)
    if ta is not None and tb is not None:  # column against column: same type, no NaN
        return ta.equals(tb) and _kind(ta) in ("int", "str", "bool", "date", "ts", "dec")
    if ta is not None:
        return _kind(ta) is not None and literal_fits(b, ta)
    if tb is not None:
        return _kind(tb) is not None and literal_fits(a, tb)
    return False


def equivalent(node, schema: pa.Schema) -> bool:
    """True when predicate ``node`` compiles to pyarrow with exactly DuckDB's answer."""
    if isa(node, "Paren"):
        return equivalent(node.this, schema)
    if isa(node, "And", "Or"):
        return equivalent(node.this, schema) and equivalent(node.expression, schema)
    if isa(node, "Not"):
        return equivalent(node.this, schema)
    if isa(node, "Boolean"):
        return True
    if isa(node, "Column"):
        t = _column_type(node, schema)
        return t is not None and pat.is_boolean(t)
    if isa(node, *_COMPARISONS):
        return _compare_ok(node.this, node.expression, schema)
    if isa(node, "Is"):
        t = _column_type(node.this, schema)
        return isa(node.expression, "Null") and t is not None and _kind(t) is not None
    if isa(node, "In"):
        t = _column_type(node.this, schema)
        if t is None or _kind(t) is None or node.args.get("query") is not None \
                or node.args.get("unnest") is not None or not node.expressions:
            return False
        if _kind(t) == "float":  # one value set with -0.0 beside 0.0 (sqlexpr.visit_In)
            return float_group_fits(node.expressions, t)
        return all(literal_fits(e, t) for e in node.expressions)
    if isa(node, "Between"):
        t = _column_type(node.this, schema)
        if t is None or _kind(t) is None or node.args.get("symmetric"):
            return False
        if _kind(t) == "float":
            return float_group_fits([node.args["low"], node.args["high"]], t)
        return literal_fits(node.args["low"], t) and literal_fits(node.args["high"], t)
    if isa(node, "Like"):
        t = _column_type(node.this, schema)
        pattern = _string(node.expression)
        return (t is not None and _kind(t) == "str" and pattern is not None
                and node.args.get("escape") is None and "\\" not in pattern and "_" not in pattern)
    return False


def projection_equivalent(node, schema: pa.Schema) -> bool:
    """True when computed column ``node`` is the same in pyarrow: a bare column reference,
    or a boolean predicate of the grammar above."""
    while isa(node, "Paren"):
        node = node.this
    if isa(node, "Column"):
        return node.name in schema.names
    return equivalent(node, schema) and not isa(node, "Boolean")
