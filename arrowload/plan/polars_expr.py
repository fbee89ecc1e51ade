"""Translate simple polars predicates into SQL trees, so they push into the scan.

Only shapes whose meaning is the same in polars and in SQL are translated: column-to-
literal and column-to-column comparisons, AND / OR / NOT, IS [NOT] NULL and
``is_between`` (closed both ends), with integer, float, string, boolean and date
literals. Anything else (arithmetic, whose overflow and ``%`` rules differ; ``is_in``;
string functions ...) returns None and the expression runs in polars after the scan.
The input is polars' own JSON serialization of the expression; an unknown layout (a
future polars) also returns None, never a wrong translation.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from sqlglot import exp

_COMPARE = {"Eq": exp.EQ, "NotEq": exp.NEQ, "Lt": exp.LT, "LtEq": exp.LTE,
            "Gt": exp.GT, "GtEq": exp.GTE}
_EPOCH = dt.date(1970, 1, 1)


class _Unsupported(Exception):
    pass


def _literal(node: dict) -> exp.Expression:
    if "Dyn" in node:
        (kind, value), = node["Dyn"].items()
        if kind == "Int" and isinstance(value, int):
            return exp.Literal.number(value)
        if kind == "Float" and isinstance(value, (int, float)):
            return exp.Literal.number(repr(float(value)))
        raise _Unsupported(kind)
    if "Scalar" in node:
        (kind, value), = node["Scalar"].items()
        if kind == "String" and isinstance(value, str):
            return exp.Literal.string(value)
        if kind == "Boolean" and isinstance(value, bool):
            return exp.Boolean(this=value)
        if kind == "Date" and isinstance(value, int):
            return exp.cast(exp.Literal.string((_EPOCH + dt.timedelta(days=value)).isoformat()), "DATE")
        raise _Unsupported(kind)
    raise _Unsupported("literal")


def _operand(node: Any) -> exp.Expression:
    if isinstance(node, dict) and "Column" in node and isinstance(node["Column"], str):
        return exp.column(node["Column"], quoted=True)
    if isinstance(node, dict) and "Literal" in node:
        return _literal(node["Literal"])
    raise _Unsupported("operand")


def _predicate(node: Any) -> exp.Expression:
    if not isinstance(node, dict) or len(node) != 1:
        raise _Unsupported("shape")
    (kind, body), = node.items()
    if kind == "BinaryExpr":
        op = body.get("op")
        if op in ("And", "LogicalAnd"):
            return exp.and_(exp.paren(_predicate(body["left"])), exp.paren(_predicate(body["right"])))
        if op in ("Or", "LogicalOr"):
            return exp.or_(exp.paren(_predicate(body["left"])), exp.paren(_predicate(body["right"])))
        if op in _COMPARE:
            left, right = _operand(body["left"]), _operand(body["right"])
            if isinstance(left, exp.Literal) and isinstance(right, exp.Literal):
                raise _Unsupported("literal comparison")
            return _COMPARE[op](this=left, expression=right)
        raise _Unsupported(op)
    if kind == "Function":
        fn, args = body.get("function"), body.get("input", [])
        if fn == {"Boolean": "Not"} and len(args) == 1:
            return exp.Not(this=exp.paren(_predicate(args[0])))
        if fn == {"Boolean": "IsNull"} and len(args) == 1:
            return exp.Is(this=_operand(args[0]), expression=exp.Null())
        if fn == {"Boolean": "IsNotNull"} and len(args) == 1:
            return exp.Not(this=exp.Is(this=_operand(args[0]), expression=exp.Null()))
        if fn == {"Boolean": {"IsBetween": {"closed": "Both"}}} and len(args) == 3:
            return exp.Between(this=_operand(args[0]), low=_operand(args[1]), high=_operand(args[2]))
        raise _Unsupported("function")
    raise _Unsupported(kind)


def polars_to_sql(expr: Any) -> exp.Expression | None:
    """The SQL tree equivalent to polars predicate ``expr``, or None if not translatable."""
    try:
        doc = json.loads(expr.meta.serialize(format="json"))
        return _predicate(doc)
    except (_Unsupported, ValueError, TypeError, KeyError, AttributeError, Exception):  # noqa: BLE001
        return None
