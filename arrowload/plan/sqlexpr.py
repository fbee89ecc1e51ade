"""Compile SQL expressions (parsed by sqlglot, DuckDB dialect, or for a simple filter by
``simplesql`` into a tree of the same shape) into ``pyarrow.compute`` expressions, with
SQL's typing rules.

Only trees that ``pushable.equivalent`` proves to mean the same in pyarrow as in DuckDB
are compiled here (scan pushdown and pruning); DuckDB evaluates every other expression
itself (``duckeval``), so the typing below needs to be right only for that grammar.

Typing follows DuckDB, the engine the tests compare with: a literal takes the type of
the column it meets (``price >= 0.05`` on a DECIMAL(10,2) column compares decimals;
``f32 = 0.1`` compares float32; ``day = '2024-01-01'`` compares dates), ``/`` is true
division, ``%`` truncates toward zero, integer arithmetic raises on overflow, and
``CAST(float AS INT)`` rounds half away from zero. Type names follow DuckDB too:
``INT8`` is BIGINT; a one-byte integer is ``TINYINT``.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pat

from ..errors import ColumnNotFoundError, ExpressionError
from . import pushable, simplesql
from .arrowtypes import type_of
from .simplesql import isa
from .syntax import check_complete, syntax_error, token_error

DIALECT = "duckdb"
_NO = object()


def parse(text: str, what: str = "expression"):
    """Parse one SQL expression; syntax errors become ExpressionError with line/column and
    a message in SQL terms (see :mod:`arrowload.plan.syntax`).

    A simple filter (:mod:`arrowload.plan.simplesql`'s grammar) is parsed without sqlglot,
    into a simple tree of sqlglot's shape. Text in the small grammar that sqlglot's default
    dialect reads exactly as its DuckDB dialect does (:func:`parse_light`) is parsed without
    loading the DuckDB dialect; the rest, and every error, with the DuckDB dialect."""
    if not isinstance(text, str) or not text.strip():
        raise ExpressionError(f"empty {what}: pass SQL text such as \"x > 0 AND y = 'a'\"")
    _refuse_leading_point_38(text, what)
    simple = simplesql.parse(text)
    if simple is not None:
        return simple
    import sqlglot
    from sqlglot import exp
    tree = parse_light(text)
    if tree is not None:
        check_complete(tree, text, what)
        return tree
    try:
        tree = sqlglot.parse_one(text, read=DIALECT, into=exp.Condition)
    except sqlglot.errors.ParseError as e:
        raise syntax_error(e.errors[0] if e.errors else {}, text, what) from None
    except sqlglot.errors.TokenError:
        raise token_error(text, what, *_unterminated_at(text)) from None
    check_complete(tree, text, what)
    return tree


# a string, a quoted name, or a number of exactly 38 digits after a leading point
_POINT_38 = re.compile(r"""'(?:[^']|'')*'|"(?:[^"]|"")*"|(?<![\w.])(\.\d{38})(?![\w.])""")


def _refuse_leading_point_38(text: str, what: str) -> None:
    """DuckDB types ``.ddd`` with 38 digits DECIMAL(38, 38) and ``0.ddd`` (39 digits) DOUBLE,
    but both parsers store ``.ddd`` as ``0.ddd``: the SQL regenerated for DuckDB, and the
    check of what may be pushed, would read a DOUBLE where the text meant a DECIMAL."""
    for m in _POINT_38.finditer(text):
        if m.group(1):
            raise ExpressionError(
                f"the number {m.group(1)} in {what} {text!r} is a DECIMAL(38,38) in DuckDB, which "
                f"arrowload cannot keep apart from 0{m.group(1)} (a DOUBLE); write 0{m.group(1)} for "
                f"a DOUBLE or CAST('0{m.group(1)}' AS DECIMAL(38,38)) for the decimal")


# Tokens sqlglot's default dialect reads as its DuckDB dialect does, into the same trees
# (tests/test_lazy_imports.py checks both parsers on generated expressions): plain and
# quoted names, numbers, strings, comparisons, arithmetic, AND / OR / NOT, IN, IS, NULL,
# TRUE / FALSE, BETWEEN, LIKE / ILIKE, parentheses and commas. No function call, cast,
# typed literal (DATE '...'), ``::``, ``||``, ``^``, ``//``, ``**``, ``$`` or ``E'...'``.
_LIGHT_TOKENS = frozenset({
    "VAR", "IDENTIFIER", "NUMBER", "STRING", "EQ", "NEQ", "LT", "LTE", "GT", "GTE", "L_PAREN",
    "R_PAREN", "COMMA", "PLUS", "DASH", "STAR", "SLASH", "MOD", "AND", "OR", "NOT", "IN", "IS",
    "NULL", "TRUE", "FALSE", "BETWEEN", "LIKE", "ILIKE",
})
# Words the DuckDB tokenizer reads as keywords where the default one reads names (sqlglot
# 30; the test compares this with both tokenizers' keyword tables).
DUCKDB_WORDS = frozenset({
    "ATTACH", "BINARY", "BITSTRING", "BPCHAR", "CHAR", "CONNECT", "DATETIME", "DETACH", "DISCONNECT",
    "FORCE", "INSTALL", "INT8", "LOGICAL", "MACRO", "ONLY", "PIVOT_WIDER", "POSITIONAL", "RESET", "ROW",
    "SIGNED", "SUMMARIZE", "TIMESTAMP", "TIMESTAMP_MS", "TIMESTAMP_NS", "TIMESTAMP_S", "TIMESTAMP_US",
    "UBIGINT", "UINTEGER", "USMALLINT", "UTINYINT", "VARCHAR",
})
_OPERANDS = frozenset({"VAR", "IDENTIFIER", "NUMBER", "STRING", "NULL", "TRUE", "FALSE", "R_PAREN"})
_OPERAND_STARTS = _OPERANDS - {"R_PAREN"} | {"L_PAREN"}
_COMPARISONS = frozenset({"EQ", "NEQ", "LT", "LTE", "GT", "GTE"})
_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def parse_light(text: str):
    """``text`` parsed by sqlglot's default dialect when every token is in the grammar both
    dialects read alike (``_LIGHT_TOKENS``; plain names that are no DuckDB keyword; no
    operand right after another, as in a call or an alias): the DuckDB dialect's own tree,
    without importing it. None for anything else, or text the default dialect cannot parse."""
    import sqlglot
    from sqlglot import exp
    from sqlglot.dialects.dialect import Dialect
    dialect = Dialect.get_or_raise(None)
    try:
        tokens = dialect.tokenize(text)
    except sqlglot.errors.TokenError:
        return None
    previous = None
    # per parenthesis depth: [a comparison since the last AND / OR, a BETWEEN awaiting its AND]
    depth = [[False, False]]
    for token in tokens:
        kind = token.token_type.name
        if kind not in _LIGHT_TOKENS:
            return None
        if kind == "VAR" and (not _PLAIN_NAME.match(token.text) or token.text.upper() in DUCKDB_WORDS):
            return None
        if previous in _OPERANDS and kind in _OPERAND_STARTS:
            return None  # a call f(x), an alias, E'x', 1_000, 'a' 'b': the dialects differ there
        level = depth[-1]
        if kind in _COMPARISONS:
            level[0] = True
        elif kind == "IS" and level[0]:
            return None  # ``a = b IS NULL``: the dialects group it differently
        elif kind == "BETWEEN":
            level[1] = True
        elif kind == "AND" and level[1]:
            level[1] = False
        elif kind in ("AND", "OR", "COMMA"):
            level[0] = False
        elif kind == "L_PAREN":
            depth.append([False, False])
        elif kind == "R_PAREN" and len(depth) > 1:
            depth.pop()
        previous = kind
    try:
        trees = dialect.parser().parse_into(exp.Condition, tokens, text)
    except sqlglot.errors.ParseError:
        return None
    return trees[0] if len(trees) == 1 else None


def _unterminated_at(text: str) -> tuple[int, int]:
    """1-based line / column of the quote or comment left open in ``text`` (sqlglot's
    tokenizer error carries no position); the end of the text when none is found."""
    i, closers = 0, {"'": "'", '"': '"', "/*": "*/"}
    while i < len(text):
        opener = "/*" if text.startswith("/*", i) else text[i] if text[i] in "'\"" else None
        if opener is None:
            i += 1
            continue
        end = text.find(closers[opener], i + len(opener))
        if end < 0:
            break
        i = end + len(closers[opener])
    before = text[:min(i, len(text))]
    return before.count("\n") + 1, len(before) - (before.rfind("\n") + 1) + 1


def resolve_column(name: str, schema: pa.Schema, quoted: bool = False) -> str:
    """Exact match first, then the one column whose name matches case-insensitively, quoted
    or not: DuckDB's identifiers ("Label" reads a column label)."""
    if name in schema.names:
        return name
    matches = [n for n in schema.names if n.lower() == name.lower()]
    if len(matches) == 1:
        return matches[0]
    hint = (f"double quotes name a column in SQL; for the string write '{name}'" if quoted else "")
    raise ColumnNotFoundError(name, schema.names, hint=hint)


# ---------------------------------------------------------------------------
# SQL type names -> Arrow types

_SIMPLE_TYPES = {
    "BOOLEAN": pa.bool_(), "TINYINT": pa.int8(), "SMALLINT": pa.int16(), "INT": pa.int32(),
    "BIGINT": pa.int64(), "UTINYINT": pa.uint8(), "USMALLINT": pa.uint16(),
    "UINT": pa.uint32(), "UBIGINT": pa.uint64(), "FLOAT": pa.float32(),
    "DOUBLE": pa.float64(), "VARCHAR": pa.string(), "TEXT": pa.string(),
    "CHAR": pa.string(), "NVARCHAR": pa.string(), "DATE": pa.date32(),
    "TIMESTAMP": pa.timestamp("us"), "DATETIME": pa.timestamp("us"),
    "TIMESTAMPNTZ": pa.timestamp("us"), "TIMESTAMPTZ": pa.timestamp("us", tz="UTC"),
    "TIMESTAMP_S": pa.timestamp("s"), "TIMESTAMP_MS": pa.timestamp("ms"),
    "TIMESTAMP_NS": pa.timestamp("ns"), "VARBINARY": pa.binary(), "BINARY": pa.binary(),
    "BLOB": pa.binary(), "TIME": pa.time64("us"),
}  # sqlglot DataType.Type member names -> Arrow types


def arrow_type(dtype) -> pa.DataType:
    """The Arrow type of a DataType node (a sqlglot or a simple tree)."""
    t = simplesql.type_name(dtype)
    if t in _SIMPLE_TYPES:
        return _SIMPLE_TYPES[t]
    if t in ("DECIMAL", "BIGDECIMAL"):
        params = [int(p.this.this) for p in dtype.expressions if isa(p, "DataTypeParam")]
        precision, scale = (params + [18, 3][len(params):])[:2] if params else (18, 3)
        return pa.decimal128(precision, scale)
    raise ExpressionError(f"unsupported SQL type {dtype.sql(DIALECT)} in CAST")


# ---------------------------------------------------------------------------
# typed values during compilation

@dataclass(frozen=True)
class Typed:
    """A compiled operand: an Arrow expression with its type, or a not-yet-typed literal."""

    expr: pc.Expression | None
    type: pa.DataType | None
    value: Any = _NO  # python value for literals

    @property
    def is_literal(self) -> bool:
        return self.value is not _NO


def _lit(value: Any, typ: pa.DataType | None = None) -> Typed:
    return Typed(None, typ, value)


def _decimal_type_of(value: Decimal) -> pa.DataType:
    sign, digits, exponent = value.as_tuple()
    scale = max(-exponent, 0)
    precision = max(len(digits), scale + 1)
    return pa.decimal128(min(precision, 38), min(scale, 38))


def _fits(value: int, typ: pa.DataType) -> bool:
    try:
        pa.scalar(value, typ)
        return True
    except (pa.ArrowInvalid, OverflowError):
        return False


def _default_scalar(t: Typed) -> pa.Scalar:
    v = t.value
    if t.type is not None:
        return pa.scalar(v, t.type)
    if v is None:
        return pa.scalar(None, pa.null())
    if isinstance(v, bool):
        return pa.scalar(v, pa.bool_())
    if isinstance(v, int):
        return pa.scalar(v, pa.int64()) if _fits(v, pa.int64()) else pa.scalar(Decimal(v), pa.decimal128(38, 0))
    if isinstance(v, Decimal):
        return pa.scalar(v, _decimal_type_of(v))
    if isinstance(v, float):
        return pa.scalar(v, pa.float64())
    return pa.scalar(v)


def _literal_as(t: Typed, target: pa.DataType) -> pa.Scalar:
    """Give a literal the type of the operand it meets, the way DuckDB does."""
    v = t.value
    if v is None:
        return pa.scalar(None, target)
    if t.type is not None and (t.type.equals(target) or not isinstance(v, str)):
        if pat.is_timestamp(target) and isinstance(v, dt.date) and not isinstance(v, dt.datetime):
            v = dt.datetime(v.year, v.month, v.day)
            return pa.scalar(v, target)
        if pat.is_date(target) and isinstance(v, dt.datetime):
            return pa.scalar(v, t.type)  # compare as timestamp; caller widens the column
        return pa.scalar(v, t.type)
    try:
        if pat.is_decimal(target) and isinstance(v, (int, Decimal, float)) and not isinstance(v, bool):
            d = Decimal(str(v))
            lit = _decimal_type_of(d)
            scale = max(target.scale, lit.scale)
            integral = max(target.precision - target.scale, lit.precision - lit.scale)
            return pa.scalar(d, pa.decimal128(min(integral + scale, 38), scale))
        if pat.is_floating(target) and isinstance(v, (int, Decimal, float)) and not isinstance(v, bool):
            return pa.scalar(float(v), target)
        if pat.is_integer(target) and isinstance(v, int) and not isinstance(v, bool):
            return pa.scalar(v, target) if _fits(v, target) else _default_scalar(t)
        if pat.is_integer(target) and isinstance(v, (Decimal, float)):
            return _default_scalar(t)
        if isinstance(v, str) and (pat.is_date(target) or pat.is_timestamp(target) or pat.is_time(target)):
            return pa.scalar(v).cast(target)
        if isinstance(v, str) and (pat.is_string(target) or pat.is_large_string(target)):
            return pa.scalar(v, target)
        if isinstance(v, str) and pat.is_dictionary(target):
            return pa.scalar(v, target.value_type)
        if isinstance(v, str) and (pat.is_integer(target) or pat.is_floating(target)):
            return pa.scalar(v).cast(target)
        if isinstance(v, str) and pat.is_boolean(target):
            return pa.scalar(v.strip().lower() in ("true", "t", "1", "yes", "y"), target)
    except (pa.ArrowInvalid, InvalidOperation, ValueError) as e:
        raise ExpressionError(f"cannot use literal {v!r} as {target}: {e}") from None
    return _default_scalar(t)


def _as_expr(t: Typed, target: pa.DataType | None = None) -> pc.Expression:
    if not t.is_literal:
        return t.expr
    return pc.scalar(_literal_as(t, target) if target is not None else _default_scalar(t))


def _in_set(xe: pc.Expression, values: pa.Array, has_null: bool) -> pc.Expression:
    """``xe IN values`` with SQL's nulls: NULL where ``xe`` is NULL (it matters under NOT),
    and where nothing matched but the list holds a NULL (``has_null``)."""
    e = pc.is_in(xe, value_set=values)
    e = pc.or_kleene(e, pc.and_kleene(pc.is_null(xe), pc.scalar(pa.scalar(None, pa.bool_()))))
    if has_null:
        e = pc.or_kleene(e, pc.scalar(pa.scalar(None, pa.bool_())))
    return e


def _to_float(e: pc.Expression, src: pa.DataType | None, target: pa.DataType) -> pc.Expression:
    """``e`` (of type ``src``) as the float type ``target``, the way DuckDB converts.

    A DECIMAL becomes its unscaled integer divided by ``10**scale`` in ``target``, which is
    correctly rounded; Arrow's own decimal cast is not (``80.82`` -> ``80.82000000000001``).
    Integers round to the nearest float instead of failing when above 2**53 (2**24).
    """
    if src is not None and pat.is_decimal(src) and src.precision <= 18:
        scale = pc.scalar(pa.scalar(10 ** src.scale, pa.decimal128(src.scale + 1, 0)))
        unscaled = pc.multiply(e, scale).cast(pa.int64())
        return pc.divide(unscaled.cast(target, safe=False),
                         pc.scalar(pa.scalar(float(10 ** src.scale), target)))
    return e.cast(target, safe=False)


def _widen_for_int_literal(lit: Typed, other: Typed, e_other: pc.Expression) -> pc.Expression:
    """In arithmetic, an integer literal too wide for the integer column it meets makes the
    result INTEGER (BIGINT if it needs that), as in DuckDB: ``tinyint_col * 1000`` is INTEGER.
    Arrow would narrow the literal and compute in SMALLINT, overflowing early."""
    if not (lit.is_literal and isinstance(lit.value, int) and not isinstance(lit.value, bool)) \
            or other.is_literal or other.type is None or not pat.is_integer(other.type) \
            or _fits(lit.value, other.type):
        return e_other
    wide = pa.int32() if _fits(lit.value, pa.int32()) else pa.int64()
    return e_other.cast(wide) if wide.bit_width > other.type.bit_width else e_other


def _unify(a: Typed, b: Typed) -> tuple[pc.Expression, pc.Expression]:
    """Both operands as Arrow expressions, coerced to a common type by SQL rules."""
    if a.is_literal and not b.is_literal:
        ea, eb = _as_expr(a, b.type), b.expr
        ta, tb = _literal_as(a, b.type).type if a.value is not None else b.type, b.type
    elif b.is_literal and not a.is_literal:
        ea, eb = a.expr, _as_expr(b, a.type)
        ta, tb = a.type, _literal_as(b, a.type).type if b.value is not None else a.type
    else:
        ea, eb, ta, tb = _as_expr(a), _as_expr(b), a.type, b.type
        if a.is_literal:
            ta = _default_scalar(a).type
        if b.is_literal:
            tb = _default_scalar(b).type
    if ta is not None and tb is not None:
        if pat.is_date(ta) and pat.is_timestamp(tb):
            ea = ea.cast(tb)
        elif pat.is_timestamp(ta) and pat.is_date(tb):
            eb = eb.cast(ta)
        elif pat.is_decimal(ta) and pat.is_floating(tb):  # DuckDB: DECIMAL op FLOAT is FLOAT
            ea = _to_float(ea, ta, tb)
        elif pat.is_floating(ta) and pat.is_decimal(tb):
            eb = _to_float(eb, tb, ta)
    return ea, eb


_type_of = type_of  # the output type of a pyarrow expression over a schema


# node class names (sqlglot's, matched in the MRO: ``simplesql.isa``) -> pyarrow compute
_COMPARE = {"EQ": pc.equal, "NEQ": pc.not_equal, "GT": pc.greater,
            "GTE": pc.greater_equal, "LT": pc.less, "LTE": pc.less_equal}
_ARITH = {"Add": "add_checked", "Sub": "subtract_checked", "Mul": "multiply_checked"}
_UNARY_FUNCS = {"Abs": "abs_checked", "Lower": "utf8_lower", "Upper": "utf8_upper",
                "Length": "utf8_length", "Floor": "floor", "Ceil": "ceil",
                "Sqrt": "sqrt_checked", "Ln": "ln_checked", "Exp": "exp"}
# DuckDB orders NaN above every number: the side whose NaN keeps the row
_NAN_SIDE = {"GT": "a", "GTE": "a", "LT": "b", "LTE": "b"}


class Compiler:
    """Compile one syntax tree (sqlglot's or a simple one: ``simplesql``) against a schema.
    Stateless apart from the schema. Nodes are told apart by class name, so a simple
    tree compiles without importing sqlglot."""

    def __init__(self, schema: pa.Schema, text: str | None = "", root=None) -> None:
        self.schema = schema
        self._text = text
        self._root = root

    @property
    def text(self) -> str:
        """The expression's text for messages (generated from the tree only when needed)."""
        if self._text is None:
            self._text = self._root.sql(DIALECT) if self._root is not None else ""
        return self._text

    def compile(self, node) -> pc.Expression:
        t = self.visit(node)
        return _as_expr(t)

    def predicate(self, node) -> pc.Expression:
        t = self.visit(node)
        typ = t.type if not t.is_literal else _default_scalar(t).type
        if typ is not None and not (pat.is_boolean(typ) or pat.is_null(typ)):
            raise ExpressionError(f"filter {self.text or node.sql(DIALECT)!r} is of type {typ}, "
                                  "not boolean; write a comparison such as x > 0")
        return _as_expr(t)

    # -- dispatch ---------------------------------------------------------
    def visit(self, node) -> Typed:
        method = getattr(self, "visit_" + type(node).__name__, None)
        if method is None:
            for cls, fn in _COMPARE.items():
                if isa(node, cls):
                    return self._compare(node, fn)
            for cls, fname in _ARITH.items():
                if isa(node, cls):
                    return self._arith(node, fname)
            for cls, fname in _UNARY_FUNCS.items():
                if isa(node, cls):
                    arg = self.visit(node.this)
                    e = pc.Expression._call(fname, [_as_expr(arg)])
                    return Typed(e, self._typ(e))
            raise ExpressionError(
                f"unsupported SQL construct {type(node).__name__} ({node.sql(DIALECT)!r}) in "
                f"{self.text!r}; supported: comparisons, AND/OR/NOT, IN, BETWEEN, LIKE, IS NULL, "
                "arithmetic, CAST, CASE, COALESCE and simple functions")
        return method(node)

    def _typ(self, e: pc.Expression) -> pa.DataType:
        return _type_of(e, self.schema)

    def visit_Paren(self, node):
        return self.visit(node.this)

    def visit_Column(self, node):
        ident = node.this
        quoted = bool(getattr(ident, "quoted", False))
        name = resolve_column(node.name, self.schema, quoted)
        return Typed(pc.field(name), self.schema.field(name).type)

    def visit_Literal(self, node):
        if node.is_string:
            return _lit(node.this)
        text = node.this
        try:
            if any(c in text for c in "eE"):
                return _lit(float(text))
            if "." in text:
                return _lit(Decimal(text))
            return _lit(int(text))
        except (ValueError, InvalidOperation):
            raise ExpressionError(f"bad number {text!r} in {self.text!r}") from None

    def visit_Null(self, node):
        return _lit(None)

    def visit_Boolean(self, node):
        return _lit(bool(node.this), pa.bool_())

    def visit_Neg(self, node):
        inner = self.visit(node.this)
        if inner.is_literal and inner.value is not None:
            value = inner.value
            # Decimal's unary minus rounds to the context's 28 digits: a DECIMAL(38, 18)
            # literal lost its last digits and compared unequal
            return Typed(None, inner.type, value.copy_negate() if isinstance(value, Decimal) else -value)
        e = pc.negate_checked(_as_expr(inner))
        return Typed(e, inner.type)

    def visit_Cast(self, node):
        target = arrow_type(node.to)
        inner = self.visit(node.this)
        if inner.is_literal:
            if inner.value is None:
                return _lit(None, target)
            try:
                scalar = _default_scalar(inner) if not isinstance(inner.value, str) else pa.scalar(inner.value)
                if pat.is_integer(target) and (pat.is_floating(scalar.type) or pat.is_decimal(scalar.type)):
                    scalar = pc.round(scalar, round_mode="half_towards_infinity")
                return _lit(scalar.cast(target).as_py(), target)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                raise ExpressionError(f"cannot CAST {inner.value!r} AS {target}: {e}") from None
        src = inner.type
        e = inner.expr
        if pat.is_integer(target) and (pat.is_floating(src) or pat.is_decimal(src)):
            e = pc.round(e, round_mode="half_towards_infinity")
        if pat.is_floating(target) and pat.is_decimal(src):
            return Typed(_to_float(e, src, target), target)
        return Typed(e.cast(target), target)

    def visit_TryCast(self, node):
        raise ExpressionError(f"TRY_CAST is not supported in filter() / select() ({self.text!r}): Arrow "
                              "has no cast that turns failures into NULL. Use CAST on clean data, or "
                              "al.sql(), which runs TRY_CAST in DuckDB")

    def _compare(self, node, fn):
        a, b = self.visit(node.this), self.visit(node.expression)
        ea, eb = _unify(a, b)
        out = fn(ea, eb)
        # DuckDB orders NaN above every number: ``f > 5`` / ``5 < f`` keep NaN rows
        greater = next((v for k, v in _NAN_SIDE.items() if isa(node, k)), None)
        side = a if greater == "a" else b if greater == "b" else None
        if side is not None and not side.is_literal and side.type is not None and pat.is_floating(side.type):
            out = pc.or_kleene(out, pc.is_nan(side.expr))
        return Typed(out, pa.bool_())

    def _arith(self, node, fname):
        a, b = self.visit(node.this), self.visit(node.expression)
        a, b = self._arith_literals(a, b)
        ea, eb = _unify(a, b)
        ea, eb = _widen_for_int_literal(b, a, ea), _widen_for_int_literal(a, b, eb)
        e = pc.Expression._call(fname, [ea, eb])
        return Typed(e, self._typ(e))

    @staticmethod
    def _arith_literals(a: Typed, b: Typed) -> tuple[Typed, Typed]:
        """In arithmetic, an integer literal meeting a decimal column becomes DECIMAL(n,0)
        (Arrow would otherwise need precision 19 for int64)."""
        def fix(lit: Typed, other: Typed) -> Typed:
            if lit.is_literal and isinstance(lit.value, int) and not isinstance(lit.value, bool) \
                    and other.type is not None and pat.is_decimal(other.type):
                d = Decimal(lit.value)
                return _lit(d, _decimal_type_of(d))
            return lit
        return fix(a, b), fix(b, a)

    def visit_Div(self, node):
        a, b = self.visit(node.this), self.visit(node.expression)
        ea, eb = _as_expr(a), _as_expr(b)
        ta = a.type if not a.is_literal else _default_scalar(a).type
        tb = b.type if not b.is_literal else _default_scalar(b).type
        # DuckDB: FLOAT unless a DOUBLE is involved or neither side is a float (then DOUBLE)
        floats = [t for t in (ta, tb) if t is not None and pat.is_floating(t)]
        out = pa.float32() if floats and all(pat.is_float32(t) for t in floats) else pa.float64()
        e = pc.divide(_to_float(ea, ta, out), _to_float(eb, tb, out))
        return Typed(e, out)

    def visit_IntDiv(self, node):
        a, b = self.visit(node.this), self.visit(node.expression)
        ea, eb = _unify(a, b)
        e = pc.divide_checked(ea, eb)
        typ = self._typ(e)
        if pat.is_floating(typ):
            e = pc.floor(e)
        return Typed(e, typ)

    def visit_Mod(self, node):
        a, b = self.visit(node.this), self.visit(node.expression)
        a, b = self._arith_literals(a, b)
        ea, eb = _unify(a, b)
        # SQL's % truncates toward zero (the result takes the dividend's sign), as Arrow's
        # "remainder" does; exact for floats too (C fmod), unlike floored modulo + fix-up.
        e = pc.Expression._call("remainder", [ea, eb])
        return Typed(e, self._typ(e))

    def visit_And(self, node):
        return Typed(pc.and_kleene(self._bool(node.this), self._bool(node.expression)), pa.bool_())

    def visit_Or(self, node):
        return Typed(pc.or_kleene(self._bool(node.this), self._bool(node.expression)), pa.bool_())

    def visit_Not(self, node):
        return Typed(pc.invert(self._bool(node.this)), pa.bool_())

    def _bool(self, node) -> pc.Expression:
        t = self.visit(node)
        if t.is_literal:
            return pc.scalar(pa.scalar(t.value, pa.bool_()) if t.value is not None else pa.scalar(None, pa.bool_()))
        if not (pat.is_boolean(t.type) or pat.is_null(t.type)):
            raise ExpressionError(f"{node.sql(DIALECT)!r} is {t.type}, not boolean, in {self.text!r}")
        return t.expr

    def visit_Is(self, node):
        target = node.expression
        inner = self.visit(node.this)
        if isa(target, "Null"):
            return Typed(pc.is_null(_as_expr(inner)), pa.bool_())
        if isa(target, "Boolean"):
            e = pc.coalesce(pc.equal(_as_expr(inner), pc.scalar(bool(target.this))), pc.scalar(False))
            return Typed(e, pa.bool_())
        raise ExpressionError(f"unsupported IS {target.sql(DIALECT)} in {self.text!r}")

    def visit_Between(self, node):
        x = self.visit(node.this)
        lo, hi = self.visit(node.args["low"]), self.visit(node.args["high"])
        a1, b1 = _unify(x, lo)
        a2, b2 = _unify(x, hi)
        return Typed(pc.and_kleene(pc.greater_equal(a1, b1), pc.less_equal(a2, b2)), pa.bool_())

    def visit_In(self, node):
        x = self.visit(node.this)
        if node.args.get("query") is not None or node.args.get("unnest") is not None:
            raise ExpressionError(f"IN (subquery) is not supported in a filter: {self.text!r}; "
                                  "use al.sql() for subqueries")
        floating = x.type is not None and pat.is_floating(x.type)
        if floating and not x.is_literal and pushable.float_group_fits(node.expressions, x.type):
            # each literal is exactly the value DuckDB compares with, in the column's type:
            # one value set, with -0.0 beside 0.0 (pyarrow's is_in hashes them apart, SQL's
            # = finds them equal)
            values = [pushable.float_value(n, x.type) for n in node.expressions]
            values += [-v for v in values if v == 0]
            return Typed(_in_set(x.expr, pa.array(values, x.type), has_null=False), pa.bool_())
        items = [self.visit(e) for e in node.expressions]
        simple = not (x.is_literal or any(not i.is_literal for i in items) or floating)
        if simple:
            target = x.type.value_type if pat.is_dictionary(x.type) else x.type
            scalars = [_literal_as(i, target) for i in items if i.value is not None]
            # literals typed apart (TIMESTAMP '...' beside a string a timestamp[ns] column
            # reads in ns): one value set would hold them in the first one's type, losing the
            # others' precision; each compared on its own, as DuckDB does
            simple = len({str(v.type) for v in scalars}) <= 1
        if not simple:
            # general case: ORs of =, SQL semantics for free; a balanced tree, never a chain
            # as deep as the list is long
            terms = [pc.equal(*_unify(x, i)) for i in items]
            while len(terms) > 1:
                terms = [pc.or_kleene(a, b) for a, b in zip(terms[::2], terms[1::2])] + terms[len(terms) & ~1:]
            return Typed(terms[0] if terms else pc.scalar(False), pa.bool_())
        values = pa.array(scalars, type=scalars[0].type) if scalars else pa.array([], type=target)
        xe = x.expr
        if pat.is_date(target) and pat.is_timestamp(values.type):
            xe = xe.cast(values.type)
        return Typed(_in_set(xe, values, has_null=any(i.value is None for i in items)), pa.bool_())

    def _like(self, node, ignore_case: bool):
        x = self.visit(node.this)
        pattern = self.visit(node.expression)
        if not pattern.is_literal or not isinstance(pattern.value, str):
            raise ExpressionError(f"LIKE needs a string literal pattern in {self.text!r}")
        escape = node.args.get("escape")
        if escape is not None:
            raise ExpressionError(f"LIKE ... ESCAPE is not supported in {self.text!r}")
        e = pc.match_like(_as_expr(x), pattern=pattern.value, ignore_case=ignore_case)
        if node.args.get("negate"):  # sqlglot parses NOT LIKE / NOT ILIKE as Like(negate=True)
            e = pc.invert(e)
        return Typed(e, pa.bool_())

    def visit_Like(self, node):
        return self._like(node, False)

    def visit_ILike(self, node):
        return self._like(node, True)

    def visit_Escape(self, node):
        raise ExpressionError(f"LIKE ... ESCAPE is not supported in {self.text!r}")

    def visit_Coalesce(self, node):
        args = [self.visit(node.this)] + [self.visit(e) for e in node.expressions]
        typed = next((a.type for a in args if not a.is_literal), None)
        exprs = [_as_expr(a, typed) for a in args]
        e = pc.coalesce(*exprs)
        return Typed(e, self._typ(e))

    def visit_Round(self, node):
        x = self.visit(node.this)
        nd = node.args.get("decimals")
        digits = int(self.visit(nd).value) if nd is not None else 0
        e = pc.round(_as_expr(x), ndigits=digits, round_mode="half_towards_infinity")
        return Typed(e, self._typ(e))

    def visit_Case(self, node):
        subject = node.this
        conds, values = [], []
        for ifnode in node.args.get("ifs", []):
            if subject is None:
                cond = ifnode.this
            else:
                from sqlglot import exp  # CASE: a sqlglot tree (no simple tree has one)
                cond = exp.EQ(this=subject.copy(), expression=ifnode.this)
            conds.append(self._bool(cond))
            values.append(self.visit(ifnode.args["true"]))
        default = node.args.get("default")
        values.append(self.visit(default) if default is not None else _lit(None))
        typed = next((v.type for v in values if not v.is_literal), None)
        if typed is None:
            typed = next((_default_scalar(v).type for v in values if v.value is not None), pa.null())
        arrays = [_as_expr(v, typed) for v in values]
        struct = pc.make_struct(*conds, field_names=[str(i) for i in range(len(conds))])
        e = pc.case_when(struct, *arrays)
        return Typed(e, self._typ(e))


def compile_expression(tree, schema: pa.Schema, text: str | None = "") -> pc.Expression:
    """``tree`` as a pyarrow expression; ``text`` (None: generated from ``tree`` if an error
    needs it) names it in errors."""
    return Compiler(schema, text, tree).compile(tree)


def compile_predicate(tree, schema: pa.Schema, text: str | None = "") -> pc.Expression:
    return Compiler(schema, text, tree).predicate(tree)
