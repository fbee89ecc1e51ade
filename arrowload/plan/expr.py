"""User expressions (SQL text, ``pyarrow.compute.Expression``, polars) behind one interface.

The planner needs three things of an expression: which columns it reads, whether it
can run inside the pyarrow scan (and so prune partitions and row groups), and how to
rewrite it when a projection renames or computes the columns it reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from sqlglot import exp

from ..errors import ColumnNotFoundError, ExpressionError
from . import sqlexpr


class Expr:
    """Base of SQL, Arrow and polars expressions. Immutable."""

    columns: frozenset[str]

    @property
    def pushable(self) -> bool:
        """True when the expression compiles to a pyarrow expression (scan pushdown)."""
        return True

    def to_arrow(self, schema: pa.Schema, predicate: bool = False) -> pc.Expression:
        raise NotImplementedError

    def substitute(self, mapping: Mapping[str, "Expr"]) -> "Expr | None":
        """The same expression over the inputs of a projection whose outputs are ``mapping``;
        None when this kind of expression cannot be rewritten that way."""
        raise NotImplementedError

    def column_name(self) -> str | None:
        """The column's name when the expression is a bare column reference."""
        return None

    def filter_batch(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        return batch.filter(self.to_arrow(batch.schema, predicate=True))

    def evaluate(self, batch: pa.RecordBatch) -> pa.Array:
        e = self.to_arrow(batch.schema)
        return ds.dataset(pa.Table.from_batches([batch])).to_table(columns={"_": e}).column("_").combine_chunks()

    def output_type(self, schema: pa.Schema) -> pa.DataType:
        return sqlexpr._type_of(self.to_arrow(schema), schema)


class SqlExpr(Expr):
    """A SQL expression (DuckDB dialect), compiled to Arrow against the input schema."""

    def __init__(self, tree: exp.Expression, text: str | None = None) -> None:
        self.tree = tree
        self.text = text if text is not None else tree.sql(sqlexpr.DIALECT)
        self.columns = frozenset(c.name for c in tree.find_all(exp.Column))

    @classmethod
    def parse(cls, text: str, schema: pa.Schema, what: str = "expression") -> "SqlExpr":
        return cls.bind(sqlexpr.parse(text, what), schema, text)

    @classmethod
    def bind(cls, tree: exp.Expression, schema: pa.Schema, text: str | None = None) -> "SqlExpr":
        """Resolve the tree's column names against ``schema`` now, so an unknown column
        fails at the call that named it (unquoted names match case-insensitively)."""
        def fix(node):
            if isinstance(node, exp.Column):
                quoted = bool(getattr(node.this, "quoted", False))
                real = sqlexpr.resolve_column(node.name, schema, quoted)
                return exp.column(real, quoted=True)
            return node
        return cls(tree.transform(fix), text)

    @classmethod
    def column(cls, name: str) -> "SqlExpr":
        return cls(exp.column(name, quoted=True), name)

    def to_arrow(self, schema: pa.Schema, predicate: bool = False) -> pc.Expression:
        if predicate:
            return sqlexpr.compile_predicate(self.tree, schema, self.text)
        return sqlexpr.compile_expression(self.tree, schema, self.text)

    def column_name(self) -> str | None:
        return self.tree.name if isinstance(self.tree, exp.Column) else None

    def substitute(self, mapping: Mapping[str, Expr]) -> Expr | None:
        if not all(isinstance(mapping.get(c), SqlExpr) for c in self.columns):
            return None

        def fix(node):
            if isinstance(node, exp.Column) and node.name in mapping:
                return exp.paren(mapping[node.name].tree.copy(), copy=False) \
                    if not isinstance(mapping[node.name].tree, exp.Column) else mapping[node.name].tree.copy()
            return node
        tree = self.tree.copy().transform(fix)
        return SqlExpr(tree)

    def __str__(self) -> str:
        return self.tree.sql(sqlexpr.DIALECT)

    def __repr__(self) -> str:
        return f"SqlExpr({self})"


def _arrow_columns(expr: pc.Expression, schema: pa.Schema) -> frozenset[str]:
    """Columns a pyarrow expression reads, found by binding it against the schema with
    each column removed in turn (pyarrow exposes no field list)."""
    def binds(s: pa.Schema) -> str | None:
        try:
            ds.dataset(s.empty_table()).scanner(columns={"_": expr})
            return None
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
            return str(e)
    err = binds(schema)
    if err is not None:
        if "No match for FieldRef" in err:
            name = err.split("FieldRef.Name(", 1)[-1].split(")", 1)[0]
            raise ColumnNotFoundError(name, schema.names)
        raise ExpressionError(f"invalid expression {expr}: {err}")
    used = set()
    for i, name in enumerate(schema.names):
        if binds(schema.remove(i)) is not None:
            used.add(name)
    return frozenset(used)


class ArrowExpr(Expr):
    """A ``pyarrow.compute.Expression`` given by the user, used as it is."""

    def __init__(self, expr: pc.Expression, columns: frozenset[str]) -> None:
        self.expr = expr
        self.columns = columns

    @classmethod
    def of(cls, expr: pc.Expression, schema: pa.Schema) -> "ArrowExpr":
        return cls(expr, _arrow_columns(expr, schema))

    def to_arrow(self, schema: pa.Schema, predicate: bool = False) -> pc.Expression:
        return self.expr

    def substitute(self, mapping: Mapping[str, Expr]) -> Expr | None:
        # only renames that keep the name can pass: pyarrow expressions can't be rewritten
        if all(mapping.get(c) is not None and mapping[c].column_name() == c for c in self.columns):
            return self
        return None

    def __str__(self) -> str:
        return str(self.expr)


class PolarsExpr(Expr):
    """A polars expression. It runs in polars on each batch after the scan (the scan still
    reads only the columns it needs); it is not pushed into pyarrow."""

    def __init__(self, expr: Any, columns: frozenset[str]) -> None:
        self.expr = expr
        self.columns = columns

    @classmethod
    def of(cls, expr: Any, schema: pa.Schema) -> "PolarsExpr":
        cols = frozenset(expr.meta.root_names())
        for c in cols:
            if c not in schema.names:
                raise ColumnNotFoundError(c, schema.names)
        return cls(expr, cols)

    @property
    def pushable(self) -> bool:
        return False

    def to_arrow(self, schema, predicate=False):
        raise ExpressionError("polars expressions do not compile to pyarrow")

    def substitute(self, mapping: Mapping[str, Expr]) -> Expr | None:
        if all(mapping.get(c) is not None and mapping[c].column_name() == c for c in self.columns):
            return self
        return None

    def filter_batch(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        import polars as pl
        out = pl.from_arrow(batch).filter(self.expr).to_arrow()
        return _to_batch(out, batch.schema)

    def evaluate(self, batch: pa.RecordBatch) -> pa.Array:
        import polars as pl
        out = pl.from_arrow(batch).select(self.expr.alias("_")).to_arrow()
        return out.column("_").combine_chunks()

    def output_type(self, schema: pa.Schema) -> pa.DataType:
        return self.evaluate(pa.RecordBatch.from_pylist([], schema=schema)).type

    def __str__(self) -> str:
        return f"polars({self.expr})"


def _to_batch(table: pa.Table, schema: pa.Schema) -> pa.RecordBatch:
    from ..scan.execute import as_record_batch
    return as_record_batch(table.cast(schema) if not table.schema.equals(schema) else table, "polars")


class AndExpr(Expr):
    """Conjunction of expressions of different kinds (e.g. SQL AND a polars filter)."""

    def __init__(self, parts: tuple[Expr, ...]) -> None:
        self.parts = parts
        self.columns = frozenset().union(*(p.columns for p in parts))

    @property
    def pushable(self) -> bool:
        return all(p.pushable for p in self.parts)

    def to_arrow(self, schema, predicate=False):
        out = None
        for p in self.parts:
            e = p.to_arrow(schema, predicate=True)
            out = e if out is None else pc.and_kleene(out, e)
        return out

    def filter_batch(self, batch):
        for p in self.parts:
            batch = p.filter_batch(batch)
        return batch

    def substitute(self, mapping):
        parts = tuple(p.substitute(mapping) for p in self.parts)
        return None if any(p is None for p in parts) else AndExpr(parts)

    def __str__(self) -> str:
        return " AND ".join(f"({p})" for p in self.parts)


def conjuncts(e: Expr) -> list[Expr]:
    """Split a predicate at its top-level ANDs (so the pushable parts can go down alone)."""
    if isinstance(e, AndExpr):
        return [c for p in e.parts for c in conjuncts(p)]
    if isinstance(e, SqlExpr) and isinstance(e.tree, exp.And):
        return [SqlExpr(t) for t in e.tree.flatten()]
    return [e]


def conjoin(parts: list[Expr]) -> Expr | None:
    """AND the parts together (SQL parts into one SQL tree), or None for no parts."""
    if not parts:
        return None
    sql = [p for p in parts if isinstance(p, SqlExpr)]
    rest = [p for p in parts if not isinstance(p, SqlExpr)]
    merged: list[Expr] = []
    if sql:
        merged.append(sql[0] if len(sql) == 1 else
                      SqlExpr(exp.and_(*[exp.paren(p.tree.copy(), copy=False) for p in sql], copy=False)))
    merged.extend(rest)
    return merged[0] if len(merged) == 1 else AndExpr(tuple(merged))


def make_expr(value: Any, schema: pa.Schema, what: str = "expression") -> Expr:
    """Wrap what the user passed (SQL text, pyarrow Expression, polars Expr) as an Expr."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, str):
        return SqlExpr.parse(value, schema, what)
    if isinstance(value, pc.Expression):
        return ArrowExpr.of(value, schema)
    if type(value).__module__.split(".")[0] == "polars":
        if what == "filter":
            from .polars_expr import polars_to_sql
            tree = polars_to_sql(value)
            if tree is not None:  # same meaning in SQL: push it into the scan
                return SqlExpr.bind(tree, schema)
        return PolarsExpr.of(value, schema)
    raise TypeError(f"{what} must be SQL text, a pyarrow.compute.Expression or a polars "
                    f"expression, got {type(value).__name__}")
