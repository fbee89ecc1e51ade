"""Simple filters parsed without sqlglot: the small grammar most filters are written in.

``ds.filter("id < 400000")`` used to import sqlglot (0.1-0.2 s, mostly its parser and
dialects) to read five tokens. :func:`parse` reads the grammar below with a regular
expression tokenizer and a recursive-descent parser into a tree whose nodes have
sqlglot's exact shape: the same class names as ``sqlglot.exp`` (``Column``,
``Identifier``, ``Literal``, ``EQ`` ...), the same ``args`` (keys and values), ``this`` /
``expression`` / ``expressions`` / ``name``, exactly the tree sqlglot's DuckDB dialect
parses the same text into (``tests/test_simplesql.py`` checks that on generated text).
The planner reads either tree through :func:`isa` (class names in the MRO), so pushdown,
pruning, compilation to pyarrow and fingerprints never need sqlglot for a simple filter.
:meth:`Expression.to_sqlglot` builds the real tree (and imports sqlglot) only where one
is needed: SQL text for DuckDB, ``explain()``, rewriting through a computed column.

The grammar: comparisons (``= == != <> < <= > >=``) of operands, ``AND`` / ``OR`` /
``NOT``, parentheses, ``[NOT] IN (operands)``, ``[NOT] BETWEEN a AND b``, ``IS [NOT]
NULL``, ``[NOT] LIKE operand`` (no ``ESCAPE``); operands are numbers, strings, ``TRUE`` /
``FALSE`` / ``NULL``, plain names (no SQL keyword) and double-quoted names, ``-operand``,
``DATE '...'`` / ``TIMESTAMP '...'`` and a parenthesized expression. One operator per
comparison (``a = b = c``, ``a LIKE 'x' = TRUE`` are not in it). Anything else --
functions, arithmetic, ILIKE, CASE, ``::``, comments, keywords it does not know -- gives
None, and the caller parses the text with sqlglot as before.
"""

from __future__ import annotations

import re
from typing import Any, Iterator

# ---------------------------------------------------------------------------
# nodes: sqlglot's class names and args


class Expression:
    """A node of a simple filter. Immutable once parsed (rewrites build new nodes)."""

    __slots__ = ("args",)
    key = "expression"

    def __init__(self, **args: Any) -> None:
        self.args = args

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        cls.key = cls.__name__.lower()

    @property
    def this(self) -> Any:
        return self.args.get("this")

    @property
    def expression(self) -> Any:
        return self.args.get("expression")

    @property
    def expressions(self) -> list:
        return self.args.get("expressions") or []

    @property
    def name(self) -> str:
        this = self.args.get("this")
        return this if isinstance(this, str) else ""

    def iter_children(self) -> Iterator["Expression"]:
        for value in self.args.values():
            if isinstance(value, Expression):
                yield value
            elif isinstance(value, list):
                yield from (v for v in value if isinstance(v, Expression))

    def walk(self) -> Iterator["Expression"]:
        """This node and every node below it (depth first)."""
        stack = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(list(node.iter_children())))

    def find_all(self, *names: str) -> Iterator["Expression"]:
        return (n for n in self.walk() if isa(n, *names))

    def unnest(self) -> "Expression":
        node = self
        while type(node) is Paren:
            node = node.this
        return node

    def copy(self) -> "Expression":
        return self  # immutable

    def to_sqlglot(self):
        """The same tree built of sqlglot's classes (imports sqlglot)."""
        from sqlglot import exp
        args = {k: _to_sqlglot(v) for k, v in self.args.items()}
        return getattr(exp, type(self).__name__)(**args)

    def sql(self, dialect: str | None = None, **opts: Any) -> str:
        """SQL text, as sqlglot generates it (imports sqlglot)."""
        return self.to_sqlglot().sql(dialect=dialect, **opts)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.args.items())
        return f"{type(self).__name__}({inner})"


def _to_sqlglot(value: Any) -> Any:
    if isinstance(value, Expression):
        return value.to_sqlglot()
    if isinstance(value, list):
        return [_to_sqlglot(v) for v in value]
    return value


class Identifier(Expression):
    __slots__ = ()


class Column(Expression):
    __slots__ = ()

    @property
    def name(self) -> str:
        return self.this.this


class Literal(Expression):
    __slots__ = ()

    @property
    def is_string(self) -> bool:
        return bool(self.args.get("is_string"))


class Null(Expression):
    __slots__ = ()


class Boolean(Expression):
    __slots__ = ()


class Paren(Expression):
    __slots__ = ()


class Neg(Expression):
    __slots__ = ()


class Not(Expression):
    __slots__ = ()


class Binary(Expression):
    __slots__ = ()


class Connector(Binary):
    __slots__ = ()


class And(Connector):
    __slots__ = ()


class Or(Connector):
    __slots__ = ()


class EQ(Binary):
    __slots__ = ()


class NEQ(Binary):
    __slots__ = ()


class LT(Binary):
    __slots__ = ()


class LTE(Binary):
    __slots__ = ()


class GT(Binary):
    __slots__ = ()


class GTE(Binary):
    __slots__ = ()


class Is(Binary):
    __slots__ = ()


class In(Expression):
    __slots__ = ()


class Between(Expression):
    __slots__ = ()


class Like(Expression):
    __slots__ = ()


class TypeName:
    """A SQL type's name where sqlglot has its ``DataType.Type`` enum member: ``.name`` and
    ``.value`` as the member's, ``str()`` as the member's (fingerprints print it)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    @property
    def value(self) -> str:
        return self.name

    def __eq__(self, other: object) -> bool:
        return getattr(other, "name", None) == self.name and getattr(other, "value", None) == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    def __str__(self) -> str:
        return f"DType.{self.name}"

    def __repr__(self) -> str:
        return f"<DType.{self.name}>"


class DataType(Expression):
    __slots__ = ()

    def to_sqlglot(self):
        from sqlglot import exp
        return exp.DataType(this=exp.DataType.Type[self.this.name], nested=False)


class Cast(Expression):
    __slots__ = ()

    @property
    def to(self) -> DataType:
        return self.args["to"]


_MRO_NAMES: dict[type, frozenset[str]] = {}


def isa(node: Any, *names: str) -> bool:
    """True when a class named one of ``names`` is in ``node``'s MRO: ``isinstance`` by
    class name, for this module's trees and sqlglot's alike (``isa(n, "EQ", "NEQ")``)."""
    t = type(node)
    mro = _MRO_NAMES.get(t)
    if mro is None:
        mro = _MRO_NAMES[t] = frozenset(c.__name__ for c in t.__mro__)
    return any(n in mro for n in names)


def is_simple(node: Any) -> bool:
    """True for a tree of this module (False for a sqlglot tree)."""
    return isinstance(node, Expression)


def type_name(datatype: Any) -> str:
    """``DATE`` / ``TIMESTAMPNTZ`` ...: the name of a DataType node's type (either tree)."""
    return datatype.this.name


def column(name: str, quoted: bool = True) -> Column:
    """``exp.column(name, quoted=quoted)``'s tree."""
    return Column(this=Identifier(this=name, quoted=quoted))


def paren(node: Expression) -> Paren:
    return Paren(this=node)


def and_(*parts: Expression) -> Expression:
    """``exp.and_(*parts)``'s tree: a left-deep chain, connectors among the parts wrapped
    in parentheses (as sqlglot wraps them)."""
    return _chain(And, parts)


def or_(*parts: Expression) -> Expression:
    """``exp.or_(*parts)``'s tree (as ``and_``)."""
    return _chain(Or, parts)


def _chain(connector: type, parts) -> Expression:
    wrapped = [Paren(this=p) if isinstance(p, Connector) else p for p in parts]
    out = wrapped[0]
    for p in wrapped[1:]:
        out = connector(this=out, expression=p)
    return out


def flatten_and(node: Expression) -> list[Expression]:
    """``node.flatten()`` of an And: the operands of the chain of ANDs, unnested."""
    if type(node) is And:
        return flatten_and(node.this) + flatten_and(node.expression)
    return [node.unnest()]


def map_columns(node: Expression, fn) -> Expression:
    """A copy of ``node`` with every Column ``c`` replaced by ``fn(c)``."""
    if type(node) is Column:
        return fn(node)
    args = {}
    for k, v in node.args.items():
        if isinstance(v, Expression):
            v = map_columns(v, fn)
        elif isinstance(v, list):
            v = [map_columns(x, fn) if isinstance(x, Expression) else x for x in v]
        args[k] = v
    return type(node)(**args)


# ---------------------------------------------------------------------------
# tokenizer and parser

# Words sqlglot's DuckDB dialect reads as keywords (its tokenizer's single-word KEYWORDS)
# or as functions without parentheses (its parser's NO_PAREN_FUNCTION_PARSERS): never a
# plain column name here (tests/test_simplesql.py checks the list against sqlglot).
SQL_WORDS = frozenset({
    "ALL", "ALTER", "ANALYZE", "AND", "ANTI", "ANY", "APPLY", "ARRAY", "AS", "ASC", "ASOF",
    "ATTACH", "AUTOINCREMENT", "AUTO_INCREMENT", "BEGIN", "BETWEEN", "BIGDECIMAL", "BIGINT",
    "BIGNUM", "BIGNUMERIC", "BINARY", "BIT", "BITSTRING", "BLOB", "BOOL", "BOOLEAN", "BPCHAR",
    "BYTE", "BYTEA", "CACHE", "CALL", "CASE", "CHAR", "CHARACTER", "CLOB", "COLLATE", "COLUMN",
    "COMMENT", "COMMIT", "CONNECT", "CONNECT_BY_ROOT", "CONSTRAINT", "COPY", "CREATE", "CROSS",
    "CUBE", "CURRENT_CATALOG", "CURRENT_DATE", "CURRENT_SCHEMA", "CURRENT_TIME",
    "CURRENT_TIMESTAMP", "CURRENT_USER", "DATABASE", "DATE", "DATEMULTIRANGE", "DATERANGE",
    "DATETIME", "DEC", "DECFLOAT", "DECIMAL", "DECIMAL128", "DECIMAL256", "DECIMAL32",
    "DECIMAL64", "DEFAULT", "DELETE", "DESC", "DESCRIBE", "DETACH", "DISCONNECT", "DISTINCT",
    "DIV", "DOUBLE", "DROP", "ELSE", "END", "ENUM", "ESCAPE", "EXCEPT", "EXECUTE", "EXISTS",
    "EXPLAIN", "FALSE", "FETCH", "FILE", "FILTER", "FIRST", "FIXED", "FLOAT", "FLOAT4",
    "FLOAT8", "FOR", "FORCE", "FORMAT", "FROM", "FULL", "FUNCTION", "GEOGRAPHY", "GEOMETRY",
    "GLOB", "GRANT", "HAVING", "HUGEINT", "IF", "ILIKE", "IN", "INDEX", "INET", "INNER",
    "INSERT", "INSTALL", "INT", "INT1", "INT128", "INT16", "INT2", "INT256", "INT32", "INT4",
    "INT4MULTIRANGE", "INT4RANGE", "INT64", "INT8", "INT8MULTIRANGE", "INT8RANGE", "INTEGER",
    "INTERSECT", "INTERVAL", "INTO", "IS", "ISNULL", "JOIN", "JSON", "JSONB", "KEEP", "KILL",
    "LATERAL", "LEFT", "LIKE", "LIMIT", "LIST", "LOAD", "LOCALTIME", "LOCALTIMESTAMP", "LOCK",
    "LOGICAL", "LONG", "LONGBLOB", "LONGTEXT", "LONGVARCHAR", "MACRO", "MAP", "MEDIUMBLOB",
    "MEDIUMINT", "MEDIUMTEXT", "MERGE", "NAMESPACE", "NATURAL", "NCHAR", "NEXT", "NOT",
    "NOTNULL", "NULL", "NULLABLE", "NUMBER", "NUMERIC", "NUMMULTIRANGE", "NUMRANGE", "NVARCHAR",
    "NVARCHAR2", "OBJECT", "OFFSET", "ON", "ONLY", "OPERATOR", "OPTIMIZE", "OR", "ORDINALITY",
    "OUT", "OUTER", "OVER", "OVERLAPS", "OVERWRITE", "PARTITION", "PARTITIONED_BY", "PERCENT",
    "PIVOT", "PIVOT_WIDER", "POSITIONAL", "PRAGMA", "PREPARE", "PROCEDURE", "QUALIFY", "RANGE",
    "REAL", "RECURSIVE", "REF", "REFERENCES", "REGEXP", "RENAME", "REPLACE", "RESET",
    "RETURNING", "REVOKE", "RIGHT", "RLIKE", "ROLLBACK", "ROLLUP", "ROW", "ROWS", "SCHEMA",
    "SELECT", "SEMI", "SEQUENCE", "SESSION", "SESSION_USER", "SET", "SETTINGS", "SHORT", "SHOW",
    "SIGNED", "SMALLINT", "SOME", "STR", "STRAIGHT_JOIN", "STRING", "STRUCT", "SUMMARIZE",
    "TABLE", "TABLESAMPLE", "TEMP", "TEMPORARY", "TEXT", "THEN", "TIME", "TIMESTAMP",
    "TIMESTAMPLTZ", "TIMESTAMPNTZ", "TIMESTAMPTZ", "TIMESTAMP_LTZ", "TIMESTAMP_MS",
    "TIMESTAMP_NS", "TIMESTAMP_NTZ", "TIMESTAMP_S", "TIMESTAMP_US", "TIMETZ", "TIME_NS",
    "TINYBLOB", "TINYINT", "TINYTEXT", "TRIGGER", "TRUE", "TRUNCATE", "TSMULTIRANGE", "TSRANGE",
    "TSTZMULTIRANGE", "TSTZRANGE", "UBIGINT", "UHUGEINT", "UINT", "UINT128", "UINT256",
    "UINTEGER", "UNCACHE", "UNION", "UNIQUE", "UNKNOWN", "UNNEST", "UNPIVOT", "UPDATE", "USE",
    "USING", "USMALLINT", "UTINYINT", "UUID", "VACUUM", "VALUES", "VARBINARY", "VARCHAR",
    "VARCHAR2", "VARIANT", "VECTOR", "VIEW", "VOLATILE", "WHEN", "WHERE", "WINDOW", "WITH",
    "XOR",
})
# the keywords of the grammar (the DuckDB tokenizer reads TIMESTAMP as TIMESTAMPNTZ)
_KEYWORDS = {"AND", "OR", "NOT", "IN", "IS", "NULL", "TRUE", "FALSE", "BETWEEN", "LIKE", "DATE", "TIMESTAMP"}
_TYPED_LITERALS = {"DATE": "DATE", "TIMESTAMP": "TIMESTAMPNTZ"}

_TOKEN = re.compile(r"""
    (?P<ws>[ \t\r\n]+)
  | (?P<bad>--|/\*)
  | (?P<num>(?:[0-9]+(?:\.[0-9]+)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)
  | (?P<str>'(?:[^']|'')*')
  | (?P<qid>"(?:[^"]|"")+")
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op><>|!=|==|<=|>=|[=<>(),-])
""", re.VERBOSE)
_COMPARISONS = {"=": EQ, "==": EQ, "!=": NEQ, "<>": NEQ, "<": LT, "<=": LTE, ">": GT, ">=": GTE}
_FOLLOW = {"AND", "OR", ")", None}  # what may come after a predicate


class _No(Exception):
    """Not in the grammar."""


def _tokens(text: str) -> list[tuple[str, str]] | None:
    out = []
    pos, end = 0, len(text)
    while pos < end:
        m = _TOKEN.match(text, pos)
        if m is None:
            return None
        kind, value = m.lastgroup, m.group()
        pos = m.end()
        if kind == "ws":
            continue
        if kind == "bad":
            return None
        if kind == "name":
            upper = value.upper()
            if upper in _KEYWORDS:
                kind, value = upper, upper
            elif upper in SQL_WORDS:
                return None
        elif kind == "op":
            kind = value
        out.append((kind, value))
    return out


class _Parser:
    def __init__(self, tokens: list[tuple[str, str]]) -> None:
        self.tokens = tokens
        self.i = 0

    def peek(self, ahead: int = 0) -> str | None:
        j = self.i + ahead
        return self.tokens[j][0] if j < len(self.tokens) else None

    def take(self, kind: str | None = None) -> str:
        if self.i >= len(self.tokens) or (kind is not None and self.tokens[self.i][0] != kind):
            raise _No()
        value = self.tokens[self.i][1]
        self.i += 1
        return value

    def disjunction(self) -> Expression:
        return self._chain("OR", Or, self.conjunction)

    def conjunction(self) -> Expression:
        return self._chain("AND", And, self.negation)

    def _chain(self, word: str, node_type, operand) -> Expression:
        """``operand (word operand)*``, folded to the left as sqlglot folds it."""
        node = operand()
        while self.peek() == word:
            self.i += 1
            node = node_type(this=node, expression=operand())
        return node

    def negation(self) -> Expression:
        if self.peek() == "NOT":
            self.i += 1
            return Not(this=self.negation())
        return self.predicate()

    def predicate(self) -> Expression:
        left = self.operand()
        kind = self.peek()
        if kind in _COMPARISONS:
            self.i += 1
            node = _COMPARISONS[kind](this=left, expression=self.operand())
        elif kind == "IS":
            self.i += 1
            negate = self.peek() == "NOT"
            if negate:
                self.i += 1
            self.take("NULL")
            node = Is(this=left, expression=Null())
            node = Not(this=node) if negate else node
        elif kind in ("IN", "BETWEEN") or (kind == "NOT" and self.peek(1) in ("IN", "BETWEEN")):
            negate = kind == "NOT"
            if negate:
                self.i += 1
            node = self.in_list(left) if self.take() == "IN" else self.between(left)
            node = Not(this=node) if negate else node
        elif kind == "LIKE" or (kind == "NOT" and self.peek(1) == "LIKE"):
            negate = kind == "NOT"  # sqlglot: Like(..., negate=True), not Not(Like(...))
            self.i += 2 if negate else 1
            node = Like(this=left, expression=self.operand(), **({"negate": True} if negate else {}))
        else:
            node = left
        if self.peek() not in _FOLLOW:
            raise _No()
        return node

    def in_list(self, left: Expression) -> In:
        self.take("(")
        items = [self.operand()]
        while self.peek() == ",":
            self.i += 1
            items.append(self.operand())
        self.take(")")
        return In(this=left, expressions=items)

    def between(self, left: Expression) -> Between:
        low = self.operand()
        self.take("AND")
        return Between(this=left, low=low, high=self.operand(), symmetric=None)

    def operand(self) -> Expression:
        kind = self.peek()
        if kind is None:
            raise _No()
        value = self.take()
        if kind == "-":
            return Neg(this=self.operand())
        if kind == "num":
            return Literal(this="0" + value if value.startswith(".") else value, is_string=False)
        if kind == "str":
            return Literal(this=value[1:-1].replace("''", "'"), is_string=True)
        if kind == "name":
            return Column(this=Identifier(this=value, quoted=False))
        if kind == "qid":
            return Column(this=Identifier(this=value[1:-1].replace('""', '"'), quoted=True))
        if kind in ("TRUE", "FALSE"):
            return Boolean(this=kind == "TRUE")
        if kind == "NULL":
            return Null()
        if kind in _TYPED_LITERALS and self.peek() == "str":
            text = self.take()[1:-1].replace("''", "'")
            return Cast(this=Literal(this=text, is_string=True),
                        to=DataType(this=TypeName(_TYPED_LITERALS[kind]), nested=False))
        if kind == "(":
            inner = self.disjunction()
            self.take(")")
            return Paren(this=inner)
        raise _No()


def parse(text: str) -> Expression | None:
    """``text`` as a simple tree (sqlglot's DuckDB parse of it, in this module's classes),
    or None when it is outside the grammar (the caller then parses it with sqlglot)."""
    tokens = _tokens(text)
    if not tokens:
        return None
    parser = _Parser(tokens)
    try:
        node = parser.disjunction()
    except _No:
        return None
    return node if parser.i == len(tokens) else None
