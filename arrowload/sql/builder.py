"""``al.sql``: SQL over bound tables, as a plan.

A select-project-filter query (``SELECT cols/exprs FROM t WHERE ... LIMIT n``, with
aliases, ``*`` and ``* EXCLUDE (...)``) becomes the same lazy plan as
``.filter().select().limit()``: same pushdown, same splits, so loaders can shuffle,
shard and resume over it. Everything else (joins, aggregates, GROUP BY, windows,
subqueries, UNION, ORDER BY, DISTINCT, CTEs) runs in DuckDB over arrowload's scans of
the bound tables, with DuckDB's projections and filters pushed into those scans, and
streams back as Arrow record batches.
"""

from __future__ import annotations

from collections.abc import Collection

import sqlglot
from sqlglot import exp

from ..errors import ArgumentTypeError, ExpressionError, TableNotFoundError
from ..plan.expr import SqlExpr
from ..plan import sandbox
from ..plan.nodes import Filter, Limit, Plan, Project, SqlQuery
from ..plan.sqlexpr import DIALECT, _unterminated_at, resolve_column
from ..plan.syntax import check_complete, syntax_error, token_error
from ..scan import duck
from ..scan.execute import PLAN_READER

# Clauses that make a query more than select-project-filter.
_COMPLEX_ARGS = ("joins", "group", "having", "order", "distinct", "windows", "qualify",
                 "offset", "laterals", "pivots", "with", "with_", "for_", "sample", "prewhere", "connect",
                 "match", "cluster", "distribute", "sort", "settings", "format", "into",
                 "locks", "kind", "operation_modifiers")


def parse_query(query: str) -> exp.Expression:
    """The one SELECT statement of ``query`` (DuckDB dialect); a syntax error is an
    ExpressionError with the line and column."""
    if not isinstance(query, str):
        raise ArgumentTypeError(f"al.sql() takes the query as SQL text, got {type(query).__name__}: "
                                "al.sql('SELECT ... FROM t', t=al.dataset(...))", "query")
    if not query.strip():
        raise ExpressionError("empty SQL query")
    try:
        trees = sqlglot.parse(query, read=DIALECT)
    except sqlglot.errors.ParseError as e:
        raise syntax_error(e.errors[0] if e.errors else {}, query, "SQL") from None
    except sqlglot.errors.TokenError:
        raise token_error(query, "SQL", *_unterminated_at(query)) from None
    trees = [t for t in trees if t is not None]
    if len(trees) != 1:
        raise ExpressionError(f"al.sql() runs one statement; got {len(trees)}")
    tree = trees[0]
    check_complete(tree, query, "SQL")
    if not isinstance(tree, exp.Query):
        raise ExpressionError(f"al.sql() runs queries (SELECT ...); got {type(tree).__name__.upper()}")
    return tree


def _table_names(tree: exp.Expression, bound: Collection[str] = ()) -> list[str]:
    """Tables the query reads, minus its own CTE names and the quoted file paths it reads
    by itself (``FROM 'data/x.parquet'``: DuckDB's replacement scan, as ``read_parquet``)
    -- a quoted name that is a ``bound`` table's (``**{"v1.2": ds}``) stays a table."""
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    tables = {n.lower() for n in bound}
    out = []
    for t in tree.find_all(exp.Table):
        if isinstance(t.this, exp.Identifier) and t.name.lower() not in ctes and not t.args.get("db") \
                and (t.name.lower() in tables or not _file_path(t.this)):
            out.append(t.name)
    return out


def _file_path(name: exp.Identifier) -> bool:
    """A quoted name that spells a file or glob (a ``/``, a ``.``, a ``*``), which DuckDB
    reads as a file where no table has it."""
    return bool(name.args.get("quoted")) and any(ch in name.name for ch in "/\\.*")


def _is_simple(tree: exp.Expression) -> bool:
    if not isinstance(tree, exp.Select):
        return False
    if any(tree.args.get(a) for a in _COMPLEX_ARGS):
        return False
    from_ = tree.args.get("from") or tree.args.get("from_")
    if from_ is None or not isinstance(from_.this, exp.Table) or not isinstance(from_.this.this, exp.Identifier):
        return False
    table = from_.this
    if any(v for k, v in table.args.items() if k not in ("this", "alias")) or \
            (isinstance(table.args.get("alias"), exp.TableAlias) and table.args["alias"].columns):
        return False  # TABLESAMPLE, PIVOT, column aliases ...: DuckDB runs it
    for node in tree.walk():
        if node is tree:
            continue
        if isinstance(node, (exp.AggFunc, exp.Window, exp.Subquery, exp.Select, exp.Union, exp.Unnest,
                             exp.Lateral, exp.TryCast)) or sandbox.gives_rows_or_columns(node):
            return False
    limit = tree.args.get("limit")
    if limit is not None and not (isinstance(limit.expression, exp.Literal) and limit.expression.is_int):
        return False
    if limit is not None and any(limit.args.get("limit_options") and limit.args["limit_options"].args.get(k)
                                 for k in ("percent", "with_ties")):
        return False  # LIMIT 10 PERCENT, WITH TIES
    return True


def _output_name(e: exp.Expression) -> str:
    if isinstance(e, exp.Alias):
        return e.alias
    if isinstance(e, exp.Column):
        return e.name
    return e.sql(DIALECT)


def _written(query: str | None, tree: exp.Select) -> tuple[list[str | None], str | None]:
    """Each select item's text as written in ``query`` (its alias left out) and the WHERE
    condition's, found by the query's tokens; None for any not found. DuckDB evaluates an
    expression as written: sqlglot's regenerated SQL can mean something else to it."""
    from sqlglot.dialects.dialect import Dialect
    from sqlglot.tokens import TokenType as T
    none = [None] * len(tree.expressions)
    if query is None:
        return none, None
    try:
        tokens = Dialect.get_or_raise(DIALECT).tokenize(query)
    except Exception:  # noqa: BLE001 - then the SQL is regenerated, as before
        return none, None
    clauses = {T.SELECT, T.FROM, T.WHERE, T.LIMIT}
    depth, clause, items, where = 0, None, [[]], []
    for tok in tokens:
        if depth == 0 and tok.token_type in clauses:
            clause = tok.token_type
            continue
        if depth == 0 and clause == T.SELECT and tok.token_type == T.COMMA:
            items.append([])
            continue
        if tok.token_type in (T.L_PAREN, T.L_BRACKET, T.L_BRACE):
            depth += 1
        elif tok.token_type in (T.R_PAREN, T.R_BRACKET, T.R_BRACE):
            depth -= 1
        if clause == T.SELECT:
            items[-1].append(tok)
        elif clause == T.WHERE:
            where.append(tok)
    if len(items) == len(tree.expressions) + 1 and not items[-1]:
        items.pop()  # a trailing comma (``SELECT a, b, FROM t``), as DuckDB allows
    if len(items) != len(tree.expressions):
        return none, None
    texts: list[str | None] = []
    for e, toks in zip(tree.expressions, items):
        if isinstance(e, exp.Alias) and toks:
            toks = toks[:-1]  # the alias, and its AS
            if toks and toks[-1].token_type == T.ALIAS:
                toks = toks[:-1]
        texts.append(query[toks[0].start:toks[-1].end + 1] if toks else None)
    return texts, (query[where[0].start:where[-1].end + 1] if where else None)


def _bind_written(inner: exp.Expression, text: str | None, schema, names: frozenset[str]) -> SqlExpr:
    """``inner`` bound, with DuckDB evaluating ``text`` (its text in the query) where that
    parses to the same tree; else the SQL regenerated from the tree. ``names``: the table's
    name and alias (lower-case), which qualify its columns."""
    from ..plan.sqlexpr import parse
    if text is not None:
        try:
            again = parse(text)
        except ValueError:
            again = None
        if isinstance(again, exp.Expression) and again.sql(DIALECT) == inner.sql(DIALECT):
            return SqlExpr.bind(again, schema, text, names)
    return SqlExpr.bind(inner, schema, inner.sql(DIALECT), names)


def _lower_simple(tree: exp.Select, child: Plan, query: str | None = None) -> Plan:
    """SELECT-project-filter-limit as Filter / Project / Limit nodes over ``child``
    (``query``: the text ``tree`` was parsed from)."""
    schema = child.schema
    plan: Plan = child
    item_texts, where_text = _written(query, tree)
    table = (tree.args.get("from") or tree.args.get("from_")).this
    # DuckDB: an alias hides the table's name (under ``FROM t AS u``, ``t.a`` is a struct
    # column ``t``'s field, or an error)
    qualifiers = frozenset([(table.alias or table.name).lower()])
    where = tree.args.get("where")
    if where is not None:
        plan = Filter(plan, _bind_written(where.this, where_text, schema, qualifiers))
        plan.predicate.check(schema, predicate=True)  # types now: an error -> DuckDB runs the query
    unnamed = []
    items: list[tuple[str, SqlExpr]] = []
    star_only = True
    stars = 0
    for e, written in zip(tree.expressions, item_texts):
        if isinstance(e, exp.Star) or (isinstance(e, exp.Column) and isinstance(e.this, exp.Star)):
            if isinstance(e, exp.Column) and e.table and e.table.lower() not in qualifiers:
                raise ValueError("st.*: a struct's fields")  # DuckDB runs it
            star = e if isinstance(e, exp.Star) else e.this
            excluded = star.args.get("except_") or star.args.get("except") or star.args.get("exclude") or []
            if any(isinstance(x, exp.Column) and x.table and x.table.lower() not in qualifiers for x in excluded):
                raise ValueError("EXCLUDE of another table's column")  # DuckDB runs it (and says so)
            drop = {_resolve(x.name, schema) for x in excluded}
            if star.args.get("replace") or star.args.get("rename") or star.args.get("ilike"):
                raise ExpressionError("SELECT * REPLACE / RENAME / ILIKE is not supported; use aliases")
            items.extend((n, SqlExpr.column(n)) for n in schema.names if n not in drop)
            stars += 1
            star_only = star_only and not drop and stars == 1  # (``*, *``: every column twice)
            continue
        star_only = False
        inner = e.this if isinstance(e, exp.Alias) else e
        bound_e = _bind_written(inner, written, schema, qualifiers)
        if not isinstance(e, (exp.Alias, exp.Column)):
            unnamed.append(len(items))
        # a column keeps its name as stored (``SELECT ID`` outputs ``id``, as in DuckDB)
        # (a struct's field ``st.b`` is named ``b``)
        items.append(((bound_e.column_name() or e.name) if isinstance(e, exp.Column) else _output_name(e), bound_e))
    if unnamed:  # unaliased expressions are named as DuckDB names them
        names = duck.output_names(tree, schema, query)
        if names is not None and len(names) == len(items):
            items = [(names[i], e) if i in unnamed else (n, e) for i, (n, e) in enumerate(items)]
    if not star_only:
        plan = Project(plan, tuple(items))
        _ = plan.schema  # types every expression now: one arrowload cannot compute -> DuckDB
    limit = tree.args.get("limit")
    if limit is not None:
        plan = Limit(plan, int(limit.expression.this))
    return plan


def _resolve(name: str, schema) -> str:
    return resolve_column(name, schema)


def build(tree: exp.Expression, tables: dict[str, Plan], *,
          external_access: bool = True, query: str | None = None) -> tuple[Plan, str]:
    """The plan of the parsed query ``tree`` (``parse_query``) over ``tables`` (bound name
    -> plan), and the name of the first table it reads (whose options run it).

    A select-project-filter query over one table becomes Filter / Project / Limit nodes
    over that table's plan; anything else a ``SqlQuery`` node, bound now (its result
    schema from DuckDB: unknown columns and bad types fail here). ``external_access=False``:
    what DuckDB runs is sandboxed (see :mod:`arrowload.scan.duck`); a lowered query reads
    only its bound table."""
    if not isinstance(external_access, bool):
        raise ArgumentTypeError(f"external_access must be True or False, got {external_access!r}")
    if not external_access:
        sandbox.refuse_settings(tree)
    lookup = {n.lower(): n for n in tables}
    used: list[str] = []
    for t in _table_names(tree, tables):
        real = lookup.get(t.lower())
        if real is None:
            raise TableNotFoundError(t, list(tables))
        if real not in used:
            used.append(real)
    if not used:
        raise ExpressionError("the query reads no bound table; bind one by keyword: al.sql('SELECT ... FROM t', "
                              "t=al.dataset(PATH)) (a query needs at least one bound table; bind the files it "
                              "would read by itself, read_parquet('...') or a quoted path, so)")
    if _is_simple(tree) and len(used) == 1:
        try:
            return _lower_simple(tree, tables[used[0]], query), used[0]
        except (ValueError, KeyError):
            pass  # an expression (or repeated name) the lazy plan cannot express: DuckDB runs it
    # DuckDB runs it; bound names are registered as they are written in the query.
    written = {}
    for t in _table_names(tree, tables):
        written.setdefault(lookup[t.lower()], t)
    names = tuple(written[n] for n in used)
    query = duck.Query(tree.sql(DIALECT), names, tuple(tables[n] for n in used), external_access)
    schema = duck.result_schema(query, PLAN_READER)
    return SqlQuery(query.query, query.names, query.tables, schema, external_access), used[0]


__all__ = ["build", "parse_query"]
