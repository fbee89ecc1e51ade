"""The logical plan: a small tree of immutable nodes that check themselves when built.

Rewrites (the optimizer) build new nodes; nothing here is ever mutated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import pyarrow as pa

from ..errors import AmbiguousColumnError, ArgumentTypeError, ColumnNotFoundError, InvalidArgumentError
from ..source import Source
from .expr import Expr
from .mapfn import apply_map
from .rowselect import empty_batch


@dataclass(frozen=True, eq=False)
class Plan:
    """Base node. ``children`` is a tuple; ``schema`` is the output schema."""

    @property
    def children(self) -> tuple["Plan", ...]:
        return ()

    def with_children(self, *children: "Plan") -> "Plan":
        return self

    @property
    def schema(self) -> pa.Schema:  # pragma: no cover - abstract
        raise NotImplementedError

    def replace(self, **changes) -> "Plan":
        return dataclasses.replace(self, **changes)


def _check_columns(names, schema: pa.Schema, where: str) -> None:
    for n in names:
        if n not in schema.names:
            raise ColumnNotFoundError(n, schema.names, where)


def _check_unambiguous(names, child: "Plan", where: str) -> None:
    """A name that several input columns share cannot be read (files may repeat a name;
    pyarrow reads them, its datasets cannot tell them apart): refuse it when the node is
    built, naming the source; the other columns stay usable."""
    all_names = child.schema.names
    if len(set(all_names)) == len(all_names):
        return
    for n in names:
        if all_names.count(n) > 1:
            found = scans(child)
            origin = found[0].source.display if len(found) == 1 else "the input"
            others = [c for c in dict.fromkeys(all_names) if all_names.count(c) == 1]
            hint = f"select the other columns by name (.select({', '.join(map(repr, others[:5]))})) or " \
                if others else ""
            raise AmbiguousColumnError(
                f"column {n!r} in {where} is ambiguous: {origin} has {all_names.count(n)} columns named "
                f"{n!r}, which cannot be told apart; {hint}rewrite the file with unique column names", n)


@dataclass(frozen=True, eq=False)
class Scan(Plan):
    """Read a source. The optimizer pushes work into it:

    ``columns``: source columns it outputs (or, with ``projection``, the ones the
    projection reads); None = all. ``predicate``: rows kept (compiled into the pyarrow
    scan). ``projection``: computed output columns. ``limit``: at most this many rows
    (after the predicate). ``units``: indices of the source units kept by pruning (None =
    all). ``notes``: what each pruning rule removed, for ``explain()``.
    """

    source: Source
    columns: tuple[str, ...] | None = None
    predicate: Expr | None = None
    projection: tuple[tuple[str, Expr], ...] | None = None
    limit: int | None = None
    units: tuple[int, ...] | None = None
    notes: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.columns is not None:
            _check_columns(self.columns, self.source.schema, self.source.display)
        if self.limit is not None and self.limit < 0:
            raise ValueError(f"limit must be >= 0, got {self.limit}")
        if self.predicate is not None and not self.predicate.pushable_on(self.source.schema):
            raise ValueError("a Scan predicate must compile to pyarrow")

    @cached_property
    def schema(self) -> pa.Schema:
        src = self.source.schema
        if self.projection is not None:
            return pa.schema([_item_field(n, e, src) for n, e in self.projection])
        if self.columns is not None:
            return pa.schema([src.field(c) for c in self.columns])
        return src

    @property
    def read_columns(self) -> tuple[str, ...]:
        """Source columns the scan decodes: its output inputs plus the predicate's."""
        names = self.source.schema.names
        wanted = set(self.columns if self.columns is not None else names)
        if self.predicate is not None:
            wanted |= self.predicate.columns
        return tuple(n for n in names if n in wanted)

    def selected_units(self):
        units = self.source.units()
        return units if self.units is None else tuple(units[i] for i in self.units)

    def keep_units(self, kept: tuple[int, ...], rule: str, what: str) -> "Scan":
        """This scan reading only ``kept`` of its units, with a note for ``explain()``;
        itself when nothing was pruned (rules return their input unchanged)."""
        if len(kept) == len(self.selected_units()):
            return self
        return self.replace(units=kept, notes=self.notes + ((rule, what),))


def _item_field(name: str, e: Expr, src: pa.Schema) -> pa.Field:
    """The field of projection item ``name = e`` over ``src``: a column passed through
    keeps its field (NOT NULL included, as its batches carry it), a computed one its type."""
    ref = e.column_name()
    return src.field(ref).with_name(name) if ref is not None else pa.field(name, e.output_type(src))


@dataclass(frozen=True, eq=False)
class Filter(Plan):
    """Keep the rows where ``predicate`` is true (SQL semantics: NULL drops the row)."""

    child: Plan
    predicate: Expr

    def __post_init__(self) -> None:
        _check_columns(sorted(self.predicate.columns), self.child.schema, "filter")
        _check_unambiguous(sorted(self.predicate.columns), self.child, "filter")

    @property
    def children(self):
        return (self.child,)

    def with_children(self, child):
        return Filter(child, self.predicate)

    @property
    def schema(self):
        return self.child.schema


@dataclass(frozen=True, eq=False)
class Project(Plan):
    """Output exactly ``items``: (name, expression) pairs, in order."""

    child: Plan
    items: tuple[tuple[str, Expr], ...]

    def __post_init__(self) -> None:
        names = [n for n, _ in self.items]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise InvalidArgumentError(f"select() names each output column once; repeated: "
                                       f"{', '.join(map(repr, dupes))}; give the computed one another "
                                       "name (select('a', a2='a + 1'))", "select")
        for _, e in self.items:
            _check_columns(sorted(e.columns), self.child.schema, "select")
            _check_unambiguous(sorted(e.columns), self.child, "select")

    @property
    def children(self):
        return (self.child,)

    def with_children(self, child):
        return Project(child, self.items)

    @cached_property
    def schema(self):
        src = self.child.schema
        return pa.schema([_item_field(name, e, src) for name, e in self.items])

    @property
    def mapping(self) -> dict[str, Expr]:
        return dict(self.items)


@dataclass(frozen=True, eq=False)
class Map(Plan):
    """A vectorized function of a ``pyarrow.RecordBatch`` returning a RecordBatch.

    ``columns``: the input columns ``fn`` reads (the batch it gets holds only those);
    None = all. ``output_schema``: what it returns, if known; otherwise found by calling
    ``fn`` on an empty batch. The optimizer never moves filters or limits across a Map.
    """

    child: Plan
    fn: Callable[[pa.RecordBatch], Any]
    columns: tuple[str, ...] | None = None
    output_schema: pa.Schema | None = None
    name: str = field(default="")

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise ArgumentTypeError(f"map() takes a function of a pyarrow RecordBatch, got "
                                    f"{type(self.fn).__name__}: map(lambda batch: ...)", "fn")
        if self.output_schema is not None and not isinstance(self.output_schema, pa.Schema):
            raise ArgumentTypeError(f"map(output_schema=...) takes a pyarrow.Schema, got "
                                    f"{type(self.output_schema).__name__}; e.g. pa.schema([('x', pa.int64())])",
                                    "output_schema")
        if self.columns is not None and not all(isinstance(c, str) for c in self.columns):
            raise ArgumentTypeError(f"map(columns=...) takes a list of column names, got {list(self.columns)!r}",
                                    "columns")
        if self.columns is not None:
            _check_columns(self.columns, self.child.schema, "map(columns=...)")
            _check_unambiguous(self.columns, self.child, "map(columns=...)")

    @property
    def children(self):
        return (self.child,)

    def with_children(self, child):
        return dataclasses.replace(self, child=child)

    @property
    def input_schema(self) -> pa.Schema:
        src = self.child.schema
        return src if self.columns is None else pa.schema([src.field(c) for c in self.columns])

    @cached_property
    def schema(self):
        if self.output_schema is not None:
            return self.output_schema
        return apply_map(self, empty_batch(self.input_schema), inferring=True).schema


@dataclass(frozen=True, eq=False)
class Limit(Plan):
    """The first ``n`` rows, in source order."""

    child: Plan
    n: int

    def __post_init__(self) -> None:
        if not isinstance(self.n, bool) and hasattr(self.n, "__index__"):  # numpy integers too
            object.__setattr__(self, "n", self.n.__index__())
        if isinstance(self.n, bool) or not isinstance(self.n, int):
            raise ArgumentTypeError(f"limit(n) / head(n) needs an integer n >= 0, got {self.n!r} "
                                    f"({type(self.n).__name__}); pass int(n)", "n")
        if self.n < 0:
            raise InvalidArgumentError(f"limit(n) / head(n) needs an integer n >= 0, got {self.n}; "
                                       "use 0 for no rows", "n")

    @property
    def children(self):
        return (self.child,)

    def with_children(self, child):
        return Limit(child, self.n)

    @property
    def schema(self):
        return self.child.schema


def transform_up(plan: Plan, fn: Callable[[Plan], Plan]) -> Plan:
    """Rebuild the tree bottom-up, applying ``fn`` to each node after its children."""
    kids = tuple(transform_up(c, fn) for c in plan.children)
    if any(k is not c for k, c in zip(kids, plan.children)):
        plan = plan.with_children(*kids)
    return fn(plan)


def walk(plan: Plan):
    """Every node of the tree, parents before children."""
    yield plan
    for c in plan.children:
        yield from walk(c)


def has_map(plan: Plan) -> bool:
    """Whether a ``map()`` is in the plan (loaders count rows before maps)."""
    return any(isinstance(n, Map) for n in walk(plan))


def scans(plan: Plan) -> list[Scan]:
    if isinstance(plan, Scan):
        return [plan]
    return [s for c in plan.children for s in scans(c)]


def with_sources(plan: Plan, new: Callable[[int, Source], Source]) -> Plan:
    """``plan`` with the source of its ``i``-th scan (in ``scans`` order) replaced by
    ``new(i, source)``; nodes are rebuilt (and check themselves) above a changed scan. A
    source read by several scans is replaced once, by the same new source."""
    done: dict[int, Source] = {}
    count = [0]

    def rebuild(node: Plan) -> Plan:
        if isinstance(node, Scan):
            i = count[0]
            count[0] += 1
            if id(node.source) not in done:
                done[id(node.source)] = new(i, node.source)
            src = done[id(node.source)]
            return node if src is node.source else node.replace(source=src)
        children = [rebuild(c) for c in node.children]
        if all(a is b for a, b in zip(children, node.children)):
            return node
        return node.with_children(*children)

    return rebuild(plan)


@dataclass(frozen=True, eq=False)
class SqlQuery(Plan):
    """A query DuckDB runs over the bound child plans (joins, aggregates, windows ...).

    Each child is registered with DuckDB under its name as a pyarrow dataset (or a
    stream), so DuckDB pushes its own projections and filters into arrowload's scans;
    the result streams back as Arrow record batches. ``result_schema`` is what DuckDB
    said the query returns when it was bound (``al.sql`` binds it when building the node:
    a plan never asks DuckDB later).
    """

    query: str
    names: tuple[str, ...]
    tables: tuple[Plan, ...]
    result_schema: pa.Schema
    # False: DuckDB runs sandboxed (no file, network, extension, setting or environment access)
    external_access: bool = True

    def __post_init__(self) -> None:
        if len(self.names) != len(self.tables):
            raise ValueError("SqlQuery needs one name per bound table")
        if not isinstance(self.result_schema, pa.Schema):
            raise ValueError("SqlQuery needs the result's pyarrow.Schema (bind the query first)")

    @property
    def children(self):
        return self.tables

    def with_children(self, *children):
        # rewrites below keep each table's rows and columns: the result is the same
        return SqlQuery(self.query, self.names, tuple(children), self.result_schema, self.external_access)

    @property
    def schema(self):
        return self.result_schema
