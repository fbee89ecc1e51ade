"""User expressions (SQL text, ``pyarrow.compute.Expression``, polars) behind one interface.

The planner needs three things of an expression: which columns it reads, whether it
can run inside the pyarrow scan (and so prune partitions and row groups), and how to
rewrite it when a projection renames or computes the columns it reads.

sqlglot (the SQL parser) and DuckDB load on first use, not with this module: a plain
column (``select("f0", "f1")``) is a SqlExpr with no syntax tree until one is asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.types as pat

from ..errors import ArgumentTypeError, ColumnNotFoundError, ExpressionError
from . import pushable, simplesql, sqlexpr
from .arrowtypes import type_of
from .rowselect import empty_batch, empty_table, filter_rows


class Expr:
    """Base of SQL, Arrow and polars expressions. Immutable."""

    columns: frozenset[str]

    @property
    def pushable(self) -> bool:
        """True when the expression compiles to a pyarrow expression (scan pushdown)."""
        return True

    def pushable_on(self, schema: pa.Schema) -> bool:
        """True when, as a predicate over ``schema``, it runs inside the pyarrow scan."""
        return self.pushable

    def projectable_on(self, schema: pa.Schema) -> bool:
        """True when, as a computed column over ``schema``, pyarrow evaluates it in the scan."""
        return self.pushable

    def check(self, schema: pa.Schema, predicate: bool = False) -> None:
        """Type-check over ``schema`` now (a bad filter fails at the call that wrote it)."""
        if predicate:
            self.to_arrow(schema, predicate=True)
        else:
            self.output_type(schema)

    def runs_in(self, schema: pa.Schema, predicate: bool = True) -> str:
        """Which engine evaluates it (for ``explain()``)."""
        return "pyarrow"

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
        try:
            return filter_rows(batch, self.to_arrow(batch.schema, predicate=True))
        except _ARROW_ERRORS as e:
            raise ExpressionError(f"filter {self} failed: {e}; fix the expression, or write it "
                                  "as SQL text (DuckDB semantics)") from None

    def evaluate(self, batch: pa.RecordBatch) -> pa.Array:
        e = self.to_arrow(batch.schema)
        try:
            return ds.dataset(pa.Table.from_batches([batch])).to_table(columns={"_": e}).column("_").combine_chunks()
        except _ARROW_ERRORS as err:
            raise ExpressionError(f"expression {self} failed: {err}; fix the expression, or write it "
                                  "as SQL text (DuckDB semantics)") from None

    def output_type(self, schema: pa.Schema) -> pa.DataType:
        return type_of(self.to_arrow(schema), schema)


_ARROW_ERRORS = (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError)


DIALECT = "duckdb"  # the SQL dialect of filters and computed columns (as in sqlexpr)


def quote_column(name: str) -> str:
    """A column reference as DuckDB's SQL writes it: ``"name"``, inner quotes doubled."""
    return '"' + name.replace('"', '""') + '"'


class SqlExpr(Expr):
    """A SQL expression (DuckDB dialect) with DuckDB's semantics.

    The parts ``pushable.equivalent`` proves to mean the same in pyarrow compile to a
    pyarrow expression (scan pushdown, pruning); everything else is evaluated by DuckDB
    over the Arrow batch (``duckeval``). Subqueries, table functions and file, network or
    environment access are refused when it is built (``sandbox``).

    Two trees: ``node`` is the tree the planner reads (pushability, compilation, pruning,
    fingerprints): a simple tree (``simplesql``) for a simple filter, else sqlglot's; ``tree``
    is sqlglot's, built from the simple one on first use (SQL text for DuckDB, ``explain``).
    A simple filter and a bare column (:meth:`column`) never import sqlglot until then.
    """

    def __init__(self, tree, text: str | None = None, schema: pa.Schema | None = None) -> None:
        self._node = tree
        self._text = text  # None: SQL generated from the tree when first asked for
        self.schema = schema
        if simplesql.is_simple(tree):
            self._tree = None  # no sandbox check: the simple grammar reads the row only
        else:
            from . import sandbox
            self._tree = tree
            sandbox.check_expression(tree, text)
        if self._tree is None:
            self.columns = frozenset(c.name for c in tree.find_all("Column"))
        else:
            from sqlglot import exp
            self.columns = frozenset(c.name for c in tree.find_all(exp.Column))
        self._column = tree.name if simplesql.isa(tree, "Column") else None

    @classmethod
    def parse(cls, text: str, schema: pa.Schema, what: str = "expression") -> "SqlExpr":
        return cls.bind(sqlexpr.parse(text, what), schema, text)

    @classmethod
    def bind(cls, tree, schema: pa.Schema, text: str | None = None,
             table_names: frozenset[str] = frozenset()) -> "SqlExpr":
        """Resolve the tree's column names against ``schema`` now, so an unknown column
        fails at the call that named it (unquoted names match case-insensitively).
        ``table_names`` (lower-case): names of the table the row comes from (``al.sql``'s
        table and alias): ``t.a`` is its column ``a``, as in DuckDB, even where ``t`` is also
        a struct column."""
        if simplesql.is_simple(tree):
            def resolve(node):
                real = sqlexpr.resolve_column(node.name, schema, bool(node.this.args.get("quoted")))
                return simplesql.column(real)
            return cls(simplesql.map_columns(tree, resolve), text, schema)
        from sqlglot import exp

        from . import sandbox
        sandbox.check_expression(tree, text)
        tree = _comprehension_variables(tree)
        written = sum(1 for _ in tree.find_all(exp.Column))
        spans: list[tuple[int, int, Any]] = []  # each column's place in ``text``, and its bound tree

        def fix(node):
            if isinstance(node, exp.Column):
                named = node
                parts = node.parts
                if len(parts) >= 2 and parts[0].name.lower() in table_names:  # the table's own column
                    rest = [p.copy() for p in parts[1:]][::-1]
                    node = exp.Column(this=rest[0], **({"table": rest[1]} if len(rest) > 1 else {}),
                                      **({"db": rest[2]} if len(rest) > 2 else {}))
                new = _struct_path(node, schema)
                if new is None and table_names and len(node.parts) >= 2:
                    # (al.sql) a qualifier that is neither the table nor a struct: DuckDB decides
                    raise ValueError(f"{node.sql()}: no table or struct column of that name")
                if new is None:
                    quoted = bool(getattr(node.this, "quoted", False))
                    new = exp.column(sqlexpr.resolve_column(node.name, schema, quoted), quoted=True)
                span = _span(named, text)
                if span is not None:
                    spans.append((*span, new))  # (its SQL written when DuckDB needs it: duck_sql)
                return new
            return node
        out = cls(tree.transform(fix), text, schema)
        if text is not None and len(spans) == written and _disjoint(spans):
            out._spans = spans
            out.columns = out.columns | _vars_naming_columns(tree, schema)
        return out

    @classmethod
    def column(cls, name: str) -> "SqlExpr":
        """The column ``name`` as it is (a quoted identifier), built without parsing."""
        self = cls.__new__(cls)
        self._node = None
        self._tree = None
        self._column = name
        self._text = name
        self.schema = None
        self.columns = frozenset((name,))
        return self

    @property
    def text(self) -> str:
        """The SQL as the user wrote it (or as generated from the tree, DuckDB dialect)."""
        if self._text is None:
            self._text = str(self)
        return self._text

    @property
    def node(self):
        """The tree the planner reads: simple (``simplesql``) or sqlglot's."""
        if self._node is None:
            self._node = simplesql.column(self._column)
        return self._node

    @property
    def tree(self):
        """The sqlglot syntax tree (built from the simple one on first use: imports sqlglot)."""
        if self._tree is None:
            self._tree = self.node.to_sqlglot()
        return self._tree

    @property
    def tree_built(self) -> bool:
        """False while no sqlglot tree was built (a bare column, a simple filter)."""
        return self._tree is not None

    def _field(self, schema: pa.Schema) -> int:
        """Index of the bare column in ``schema`` (-1: not a bare column, missing or repeated)."""
        return -1 if self._column is None else schema.get_field_index(self._column)

    @property
    def pushable(self) -> bool:
        return self.schema is not None and self.pushable_on(self.schema)

    def _memo(self, what: str, schema: pa.Schema, work):
        """``work()``, once per expression, ``what`` and schema: the plan asks again in every
        optimizer pass and per batch, and a 10,000-value IN list takes 0.1 s to check."""
        memo = self.__dict__.setdefault("_memos", {})
        key = (what, schema)
        if key not in memo:
            memo[key] = work()
        return memo[key]

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("_memos", None)  # made again where it is unpickled
        return state

    def pushable_on(self, schema: pa.Schema) -> bool:
        i = self._field(schema)
        if i >= 0:  # a column as a predicate: booleans only
            return pat.is_boolean(schema.field(i).type)
        return self._memo("pushable", schema, lambda: pushable.equivalent(self.node, schema))

    def projectable_on(self, schema: pa.Schema) -> bool:
        if self._field(schema) >= 0:
            return True
        return self._memo("projectable", schema, lambda: pushable.projection_equivalent(self.node, schema))

    def runs_in(self, schema: pa.Schema, predicate: bool = True) -> str:
        ok = self.pushable_on(schema) if predicate else self.projectable_on(schema)
        return "pyarrow" if ok else "duckdb"

    #: where each column is written in the text, and its bound tree (``bind``): the text as
    #: written can then be given to DuckDB with its names spelled as bound; None: SQL
    #: regenerated from the tree
    _spans: list | None = None

    @cached_property
    def duck_sql(self) -> str:
        """The SQL text DuckDB evaluates: the user's own where it is known (sqlglot's
        regenerated SQL can mean something else to DuckDB: ``date_diff(month, ...)`` with a
        column ``month`` became the unit 'MONTH', ``log2(x)`` became ``LOG(2, x)``, some
        functions lost arguments), else regenerated from the bound tree."""
        if self._spans is not None and self._text is not None:
            return _rewritten(self._text, [(a, b, node.sql(DIALECT)) for a, b, node in self._spans])
        return str(self)

    def to_arrow(self, schema: pa.Schema, predicate: bool = False) -> pc.Expression:
        if not predicate and self._field(schema) >= 0:
            return pc.field(self._column)
        ok = self.pushable_on(schema) if predicate else self.projectable_on(schema)
        if not ok:
            raise ExpressionError(f"{self.text!r} is evaluated by DuckDB, not compiled to a pyarrow "
                                  "expression (its meaning in pyarrow compute would differ)")
        if predicate:
            return self._memo("predicate", schema, lambda: sqlexpr.compile_predicate(self.node, schema, self._text))
        return self._memo("expression", schema, lambda: sqlexpr.compile_expression(self.node, schema, self._text))

    def check(self, schema: pa.Schema, predicate: bool = False) -> None:
        if predicate and self.pushable_on(schema):
            self.to_arrow(schema, predicate=True)
        elif predicate:
            from . import duckeval
            duckeval.check_predicate(schema, self.duck_sql, self.text, self.columns)
        else:
            self.output_type(schema)

    def filter_batch(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        if self.pushable_on(batch.schema):
            return super().filter_batch(batch)
        from . import duckeval
        return duckeval.filter_batch(batch, self.duck_sql, self.text, self.columns)

    def evaluate(self, batch: pa.RecordBatch) -> pa.Array:
        if self.projectable_on(batch.schema):
            return super().evaluate(batch)
        from . import duckeval
        return duckeval.evaluate_many(batch, [("_", self.duck_sql, self.text)], self.columns)[0]

    def output_type(self, schema: pa.Schema) -> pa.DataType:
        i = self._field(schema)
        if i >= 0:
            return schema.field(i).type
        if self.projectable_on(schema):
            return super().output_type(schema)
        from . import duckeval
        return duckeval.output_types(schema, [("_", self.duck_sql, self.text)], self.columns)[0]

    def column_name(self) -> str | None:
        return self._column

    def substitute(self, mapping: Mapping[str, Expr]) -> Expr | None:
        if not all(isinstance(mapping.get(c), SqlExpr) for c in self.columns):
            return None
        if simplesql.is_simple(self.node) and all(simplesql.is_simple(mapping[c].node) for c in self.columns):
            def rename(node):  # the same rewrite as below, on the simple tree
                if node.name not in mapping:
                    return node
                e = mapping[node.name].node
                return e if simplesql.isa(e, "Column") else simplesql.paren(e)
            return SqlExpr(simplesql.map_columns(self.node, rename))
        from sqlglot import exp

        def fix(node):
            if isinstance(node, exp.Column) and node.name in mapping:
                return exp.paren(mapping[node.name].tree.copy(), copy=False) \
                    if not isinstance(mapping[node.name].tree, exp.Column) else mapping[node.name].tree.copy()
            return node
        tree = self.tree.copy().transform(fix)
        return SqlExpr(tree)

    def __str__(self) -> str:
        if self._tree is None and self._column is not None:  # a bare column: "name"
            return quote_column(self._column)
        return self.tree.sql(DIALECT)

    def __repr__(self) -> str:
        return f"SqlExpr({self})"


def _arrow_columns(expr: pc.Expression, schema: pa.Schema) -> frozenset[str]:
    """Columns a pyarrow expression reads, found by binding it against the schema with
    each column removed in turn (pyarrow exposes no field list). A name several columns
    share binds to its first: the plan node naming it then refuses it as ambiguous."""
    if len(set(schema.names)) != len(schema.names):
        firsts = {f.name: f for f in reversed(list(schema))}
        schema = pa.schema([firsts[n] for n in dict.fromkeys(schema.names)])

    def binds(s: pa.Schema) -> str | None:
        try:
            ds.dataset(empty_table(s)).scanner(columns={"_": expr})
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
        from ..convert.polars_frame import check_polars_schema
        used = pa.schema([f for f in schema if f.name in cols])
        check_polars_schema(used, f"the polars expression {expr}")  # refused now, not at the first batch
        return cls(expr, cols)

    @property
    def pushable(self) -> bool:
        return False

    def to_arrow(self, schema, predicate=False):
        raise ExpressionError("polars expressions do not compile to pyarrow")

    def check(self, schema: pa.Schema, predicate: bool = False) -> None:
        pass  # polars types it when it runs

    def runs_in(self, schema: pa.Schema, predicate: bool = True) -> str:
        return "polars"

    def substitute(self, mapping: Mapping[str, Expr]) -> Expr | None:
        if all(mapping.get(c) is not None and mapping[c].column_name() == c for c in self.columns):
            return self
        return None

    def _values(self, data) -> pa.Array:
        """The expression over ``data`` (a RecordBatch or Table): only the columns it reads
        go to polars, so the others are never converted (polars cannot import every Arrow
        type, and a round trip through it would change some)."""
        import polars as pl

        from ..convert.polars_frame import check_polars_schema
        used = [i for i, n in enumerate(data.schema.names) if n in self.columns]
        if used:
            inputs = data.select(used)
            check_polars_schema(inputs.schema, f"the polars expression {self}")
            frame = pl.from_arrow(inputs)
        else:  # a constant: one row per input row
            frame = pl.DataFrame({"__arrowload_row": pl.zeros(data.num_rows, eager=True)})
        try:
            out = frame.select(self.expr.alias("_")).to_series().to_arrow()
        except pl.exceptions.PolarsError as exc:
            raise ExpressionError(f"the polars expression {self} failed: {exc}; fix the expression "
                                  "(polars refuses it over these columns' types)") from None
        if isinstance(out, pa.ChunkedArray):
            out = out.combine_chunks()
        if len(out) == 1 and data.num_rows != 1:  # a scalar result broadcasts
            out = pa.repeat(out[0], data.num_rows) if data.num_rows else out.slice(0, 0)
        if len(out) != data.num_rows:
            raise ExpressionError(f"the polars expression {self} gives {len(out)} values for "
                                  f"{data.num_rows} rows; use an expression of one value per row")
        return out

    def filter_batch(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        from .rowselect import filter_rows
        mask = self._values(batch)
        if not pa.types.is_boolean(mask.type):
            raise ExpressionError(f"the polars filter {self} gives {mask.type}, not booleans; "
                                  "compare it to something (pl.col('x') > 1)")
        return filter_rows(batch, mask)

    def evaluate(self, batch: pa.RecordBatch) -> pa.Array:
        return self._values(batch)

    def output_type(self, schema: pa.Schema) -> pa.DataType:
        used = pa.schema([f for f in schema if f.name in self.columns])
        return self.evaluate(empty_batch(used)).type

    def __str__(self) -> str:
        return f"polars({self.expr})"


class AndExpr(Expr):
    """Conjunction of expressions of different kinds (e.g. SQL AND a polars filter)."""

    def __init__(self, parts: tuple[Expr, ...]) -> None:
        self.parts = parts
        self.columns = frozenset().union(*(p.columns for p in parts))

    @property
    def pushable(self) -> bool:
        return all(p.pushable for p in self.parts)

    def pushable_on(self, schema: pa.Schema) -> bool:
        return all(p.pushable_on(schema) for p in self.parts)

    def check(self, schema: pa.Schema, predicate: bool = False) -> None:
        for p in self.parts:
            p.check(schema, predicate=True)

    def runs_in(self, schema: pa.Schema, predicate: bool = True) -> str:
        return "+".join(sorted({p.runs_in(schema) for p in self.parts}))

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
    if isinstance(e, SqlExpr) and e.column_name() is None:
        node = e.node
        if simplesql.isa(node, "And", "Paren"):
            inner = node.unnest()
            if simplesql.isa(inner, "And"):
                parts = simplesql.flatten_and(inner) if simplesql.is_simple(inner) else list(inner.flatten())
                written = _written_parts(e, parts)
                if written is None and e._spans is not None:
                    return [e]  # its parts' text not found: kept whole, so DuckDB reads it as written
                return [c for p in (written or [SqlExpr(t, schema=e.schema) for t in parts]) for c in conjuncts(p)]
    return [e]


def _written_parts(e: "SqlExpr", parts: list) -> list["SqlExpr"] | None:
    """``e``'s conjuncts ``parts`` (subtrees of its tree), each with its text as written in
    ``e``'s and the places of its columns there, so that DuckDB evaluates each as written
    once the optimizer has split them (a part's regenerated SQL can mean something else:
    ``date_diff(month, ...)`` over a column ``month``); None where ``e`` has no written text
    or the parts are not found in it."""
    if e._spans is None or e._text is None:
        return None
    from sqlglot import exp
    text = e._text
    ranges = _and_operands(text)
    if ranges is None or len(ranges) != len(parts):
        return None
    extra = e.columns - frozenset(c.name for c in e.tree.find_all(exp.Column))  # (see _vars_naming_columns)
    out = []
    for (a, b), t in zip(ranges, parts):
        cols = list(t.find_all(exp.Column))
        mine = [(s - a, z - a, node) for s, z, node in e._spans if any(node is c for c in cols)]
        if len(mine) != len(cols) or any(s < 0 or z > b - a for s, z, _ in mine):
            return None
        part = SqlExpr(t, text[a:b], e.schema)
        part._spans = mine
        part.columns = part.columns | extra
        out.append(part)
    return out


def _and_operands(text: str) -> list[tuple[int, int]] | None:
    """The ``[start, stop)`` of each operand of the top-level ANDs of the SQL ``text``
    (enclosing parentheses unwrapped; ``BETWEEN .. AND`` and ``CASE .. END`` kept whole);
    None where it does not tokenize."""
    import sys

    from sqlglot.dialects.dialect import Dialect
    from sqlglot.tokens import TokenType as T
    # DuckDB's tokenizer where its dialect parsed the text; the default one where the text
    # was in the grammar both read alike (sqlexpr.parse_light), so as not to load it here
    dialect = DIALECT if "sqlglot.dialects.duckdb" in sys.modules else None
    try:
        tokens = Dialect.get_or_raise(dialect).tokenize(text)
    except Exception:  # noqa: BLE001 - then the parts are not found
        return None
    opens, closes = (T.L_PAREN, T.L_BRACKET, T.L_BRACE, T.CASE), (T.R_PAREN, T.R_BRACKET, T.R_BRACE, T.END)
    while len(tokens) >= 2 and tokens[0].token_type == T.L_PAREN and tokens[-1].token_type == T.R_PAREN:
        depth = 0
        for i, tok in enumerate(tokens):
            depth += tok.token_type in opens
            depth -= tok.token_type in closes
            if depth == 0:
                break
        if i != len(tokens) - 1:
            break  # "(a) AND (b)": the first parenthesis closes before the end
        tokens = tokens[1:-1]
    if not tokens:
        return None
    ranges, first, depth, between = [], 0, 0, False
    for i, tok in enumerate(tokens):
        kind = tok.token_type
        if kind in opens:
            depth += 1
        elif kind in closes:
            depth -= 1
        elif depth == 0 and kind == T.BETWEEN:
            between = True
        elif depth == 0 and kind == T.AND:
            if between:
                between = False
                continue
            if i == first:
                return None
            ranges.append((tokens[first].start, tokens[i - 1].end + 1))
            first = i + 1
    if first >= len(tokens):
        return None
    ranges.append((tokens[first].start, tokens[-1].end + 1))
    return ranges


def conjoin(parts: list[Expr]) -> Expr | None:
    """AND the parts together (SQL parts into one SQL tree), or None for no parts."""
    if not parts:
        return None
    sql = [p for p in parts if isinstance(p, SqlExpr)]
    rest = [p for p in parts if not isinstance(p, SqlExpr)]
    merged: list[Expr] = [_connect(sql, "and_")] if sql else []
    merged.extend(rest)
    return merged[0] if len(merged) == 1 else AndExpr(tuple(merged))


def disjoin(parts: list[SqlExpr]) -> SqlExpr:
    """OR SQL parts together into one SQL tree (as ``conjoin`` ANDs them)."""
    return _connect(parts, "or_")


def _connect(sql: list[SqlExpr], how: str) -> SqlExpr:
    """``sql`` joined by ``exp.and_`` / ``exp.or_`` (``how``), each part in parentheses: a
    simple tree where every part is one (no sqlglot), else sqlglot's."""
    if len(sql) == 1:
        return sql[0]
    if all(simplesql.is_simple(p.node) for p in sql):
        return SqlExpr(getattr(simplesql, how)(*[simplesql.paren(p.node) for p in sql]), schema=sql[0].schema)
    from sqlglot import exp
    return SqlExpr(getattr(exp, how)(*[exp.paren(p.tree.copy(), copy=False) for p in sql], copy=False),
                   schema=sql[0].schema)


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
    raise ArgumentTypeError(f"{what} must be SQL text, a pyarrow.compute.Expression or a polars "
                            f"expression, got {value!r} ({type(value).__name__}); e.g. \"x > 1\" "
                            "or pc.field('x') > 1", what)


def _span(node, text: str | None) -> tuple[int, int] | None:
    """Where the column ``node`` is written in ``text`` (``[start, stop)``), from its parts'
    positions; None where they are not known or the text there is not its name."""
    if text is None:
        return None
    parts = node.parts
    starts, stops = [], []
    for part in parts:
        meta = part.meta if hasattr(part, "meta") else {}
        start, end = meta.get("start"), meta.get("end")
        if start is None or end is None:
            return None
        written = text[start:end + 1]
        quoted = bool(part.args.get("quoted"))
        if (written[1:-1].replace('""', '"') if quoted else written) != part.name:
            return None
        starts.append(start)
        stops.append(end + 1)
    return min(starts), max(stops)


def _disjoint(spans: list[tuple]) -> bool:
    ordered = sorted(spans, key=lambda s: s[0])
    return all(a[1] <= b[0] for a, b in zip(ordered, ordered[1:]))


def _rewritten(text: str, spans: list[tuple[int, int, str]]) -> str:
    """``text`` with each (disjoint) span replaced, in parentheses on lines of their own (a
    ``--`` comment in the text ends with its line)."""
    out, at = [], 0
    for start, stop, sql in sorted(spans, key=lambda s: s[0]):
        out += [text[at:start], sql]
        at = stop
    out.append(text[at:])
    return "(\n" + "".join(out) + "\n)"


def _vars_naming_columns(tree, schema: pa.Schema) -> frozenset[str]:
    """Columns of ``schema`` that the tree holds as keywords (sqlglot reads ``month`` in
    ``date_diff(month, a, b)`` as a date part, DuckDB as the column ``month``): the batch
    DuckDB evaluates over must hold them."""
    from sqlglot import exp
    found = set()
    for var in tree.find_all(exp.Var):
        try:
            found.add(sqlexpr.resolve_column(var.name, schema, False))
        except (ColumnNotFoundError, KeyError, ValueError):
            pass
    return frozenset(found)


def _comprehension_variables(tree):
    """``tree`` with the variables of list comprehensions (``[x + 1 FOR x IN lst]``) as bare
    identifiers, as sqlglot leaves a lambda's (``x -> x + 1``): they are not columns."""
    from sqlglot import exp
    if not any(True for _ in tree.find_all(exp.Comprehension)):
        return tree
    tree = tree.copy()
    for comp in tree.find_all(exp.Comprehension):
        names = {a.name for a in (comp.args.get("expression"), comp.args.get("position")) if a is not None}
        for part in (comp.this, comp.args.get("condition")):
            if part is None:
                continue
            for col in list(part.find_all(exp.Column)):
                if not col.table and col.name in names:
                    col.replace(exp.Identifier(this=col.name, quoted=bool(getattr(col.this, "quoted", False))))
                elif col.parts[0].name in names:  # x.a: the variable's field, not a column a
                    col.replace(exp.Dot.build([exp.Identifier(this=p.name, quoted=bool(p.args.get("quoted")))
                                               for p in col.parts]))
    return tree


def _struct_path(node, schema: pa.Schema):
    """``st.a`` (``st.a.b`` ...) as DuckDB reads it where ``st`` is no table but a struct
    column of ``schema``: its field ``a`` (``st['a']``, field names matched as columns are);
    None where the first part names no struct column (a qualified column: ``t.x``)."""
    from sqlglot import exp
    parts = node.parts
    if len(parts) < 2:
        return None
    first = parts[0]
    try:
        real = sqlexpr.resolve_column(first.name, schema, bool(first.args.get("quoted")))
    except ColumnNotFoundError:
        return None
    t = schema.field(real).type
    out = exp.column(real, quoted=True)
    for part in parts[1:]:
        if not pa.types.is_struct(t):
            return None
        names = [t.field(i).name for i in range(t.num_fields)]
        try:
            got = sqlexpr.resolve_column(part.name, pa.schema([pa.field(n, pa.null()) for n in names]),
                                         bool(part.args.get("quoted")))
        except ColumnNotFoundError:
            path = ".".join(p.name for p in parts[:parts.index(part)])
            raise ColumnNotFoundError(f"{path}.{part.name}", [f"{path}.{n}" for n in names],
                                      hint=f"{path} is a struct; its fields are {', '.join(names)}") from None
        out = exp.Bracket(this=out, expressions=[exp.Literal.string(got)])
        t = t.field(names.index(got)).type
    return out
