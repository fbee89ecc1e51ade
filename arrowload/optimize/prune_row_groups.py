"""Row-group pruning: skip Parquet row groups whose min/max/null-count statistics prove
the scan's predicate false for every row (footers only; no data page is read).

Statistics are evidence only where they are sound. Per file, a column's statistics are
used only when its type has an order pyarrow's pruning shares with DuckDB (integers,
float32 / float64, strings, booleans, dates, timestamps) and every row group's
statistics for it decode and are plausible: min <= max and neither is NaN. A column
failing that (a writer that put NaN into the statistics, a corrupt or hand-edited
footer, an unsupported type such as float16, decimals, intervals) is not used to prune
in that file; the conjuncts of the predicate that read it are left out of the pruning
expression there. Missing statistics simply prune nothing (pyarrow cannot prove a row
group false without them). NaN rows a writer left out of min/max (pyarrow does) are safe:
the pushed comparisons that DuckDB answers true for NaN (``f > 5``) carry an explicit
``is_nan`` term that statistics cannot refute.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections import OrderedDict

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pat

from ..plan.expr import SqlExpr, conjuncts
from ..plan.nodes import Plan, Scan, transform_up
from ..plan.simplesql import isa


def _orderable(t: pa.DataType) -> bool:
    return (pat.is_integer(t) or pat.is_float32(t) or pat.is_float64(t) or pat.is_string(t)
            or pat.is_large_string(t) or pat.is_boolean(t) or pat.is_date32(t) or pat.is_timestamp(t))


def _plausible(stats) -> bool:
    if stats is None:
        return True  # nothing to prune with; pyarrow keeps the row group
    try:
        if not stats.has_min_max:
            return True
        lo, hi = stats.min, stats.max
        if isinstance(lo, float) and (math.isnan(lo) or math.isnan(hi)):
            return False
        return not (lo > hi)
    except Exception:  # noqa: BLE001 - undecodable statistics are not evidence
        return False


def matching_row_groups(frag, expr, schema: pa.Schema) -> set[int] | None:
    """Ids of ``frag``'s row groups whose statistics allow ``expr`` (``frag.subset``, the
    file read as ``schema``); None where pyarrow cannot compare them with its literals:
    statistics of another type than the column's, as in a file whose embedded Arrow schema
    says string_view (deltalake's rewrites) where the source has string."""
    try:
        return {rg.id for rg in frag.subset(filter=expr, schema=schema).row_groups}
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError, pa.ArrowInvalid):
        return None


def sound_columns(fragment, schema: pa.Schema, columns, implausible: set[str] | None = None, *,
                  renamed=()) -> set[str]:
    """The columns among ``columns`` whose statistics in ``fragment`` (a Parquet file or a
    subset of its row groups) may be used to prune. Partition columns are always sound
    (their values come from folder names, not statistics). Columns left out because their
    statistics are implausible are added to ``implausible``. ``renamed`` columns (stored
    under another name in the file, or not held by a column of their name: Delta column
    mapping, Iceberg field ids; ``Source.file_columns``) are never sound here: pyarrow
    would take them for missing columns, all null, or read another column's statistics."""
    out = set()
    try:
        md = fragment.metadata
        leaves = {md.schema.column(i).path: i for i in range(md.num_columns)}
        groups = [g.id for g in fragment.row_groups] if fragment.row_groups is not None \
            else range(md.num_row_groups)
        file_names = set(fragment.physical_schema.names)
    except Exception:  # noqa: BLE001 - a damaged footer: prune nothing in this file
        return out
    for name in columns:
        if name in renamed:
            continue
        if name not in file_names:
            out.add(name)  # a partition column (or missing: pyarrow fills nulls, no stats used)
            continue
        i = leaves.get(name)
        if i is None or name not in schema.names or not _orderable(schema.field(name).type):
            continue
        try:
            if all(_plausible(md.row_group(g).column(i).statistics) for g in groups):
                out.add(name)
                continue
        except Exception:  # noqa: BLE001
            pass
        if implausible is not None:
            implausible.add(name)
    return out


def _nan_false(part, schema: pa.Schema) -> bool:
    """True when a NaN in any float column the conjunct reads makes that atom false: then
    pruning on the float's statistics is sound although writers leave NaN out of min/max
    (pyarrow's pruning assumes every value lies in [min, max]; it even replaces a column by
    its value when min == max). Only SQL conjuncts without NOT / ``<>`` whose float
    comparisons all point "less than" qualify; ``f > 5`` keeps NaN under DuckDB's order."""
    floats = {n for n in part.columns if n in schema.names and pat.is_floating(schema.field(n).type)}
    if not floats:
        return True
    if not isinstance(part, SqlExpr):
        return False

    def is_float(node) -> bool:
        while isa(node, "Paren"):
            node = node.this
        return isa(node, "Column") and node.name in floats

    def columns(node):
        return (n for n in node.walk() if isa(n, "Column"))

    for node in part.node.walk():  # the planner's tree: simple or sqlglot's (simplesql.isa)
        if isa(node, "Not", "NEQ") and any(is_float(c) for c in columns(node)):
            return False
        if isa(node, "GT", "GTE") and is_float(node.this):
            return False
        if isa(node, "LT", "LTE") and is_float(node.expression):
            return False
        if isa(node, "Like") and node.args.get("negate"):
            return False
    return True


#: per source (weakly), what pruning found for recent (predicate, units): ``_remembered``
_MEMO: "weakref.WeakKeyDictionary[object, OrderedDict]" = weakref.WeakKeyDictionary()
_MEMO_LOCK = threading.Lock()
_MEMO_SIZE = 8


def _prune(scan: Scan) -> Scan:
    src = scan.source
    if scan.predicate is None or not src.has_statistics:
        return scan
    units = scan.selected_units()
    if not units:
        return scan
    found = _remembered(src, (scan.predicate, scan.units))
    if found is None:
        kept, distrusted = _kept(scan, units)
        found = (kept, _distrust_note(distrusted))
        # the kept units pruned again by the same predicate keep them all (a count plan
        # re-optimizes the loader's optimized plan): remembered too
        _remember(src, (scan.predicate, scan.units), found)
        _remember(src, (scan.predicate, kept), found)
    kept, note = found
    out = scan.keep_units(kept, "row_group_pruning", f"row groups {len(units)} -> {len(kept)}")
    if note is not None:  # say why a file was not pruned on a column (explain shows the notes)
        out = out.replace(notes=out.notes + (("row_group_pruning", note),))
    return out


def _remembered(src, key):
    """What pruning found for ``key`` over ``src``, where it was found before (footers are
    immutable for a source: the answer stays right), else None."""
    with _MEMO_LOCK:
        memo = _MEMO.get(src)
        return None if memo is None else memo.get(key)


def _remember(src, key, found) -> None:
    with _MEMO_LOCK:
        memo = _MEMO.get(src)
        if memo is None:
            memo = _MEMO[src] = OrderedDict()
        memo[key] = found
        while len(memo) > _MEMO_SIZE:
            memo.popitem(last=False)


def _distrust_note(distrusted: dict[str, int]) -> str | None:
    if not distrusted:
        return None
    what = ", ".join(f"{n!r} in {k} file{'s' if k > 1 else ''}" for n, k in sorted(distrusted.items()))
    return f"statistics not used (NaN, implausible or unreadable): {what}"


def _kept(scan: Scan, units) -> tuple[tuple[int, ...], dict[str, int]]:
    """The units of ``scan`` whose statistics do not prove its predicate false, and per
    column the files whose statistics for it were not trusted."""
    src = scan.source
    schema = src.schema
    parts = [(c, c.to_arrow(schema, predicate=True)) for c in conjuncts(scan.predicate)]
    # files whose column metadata cannot be read (encrypted, damaged: source/footer.py)
    # are kept whole, unpruned: explain() still works, and reading them raises
    check = getattr(src, "footer_check", None)
    files = {u.file for u in units}
    src.prefetch_checks(sorted(files))  # (an object store's footers, side by side)
    unreadable = {f for f in files if check is not None and not check(f).ok}
    keep: set[tuple[str, int]] = {(u.path, u.row_group) for u in units if u.file in unreadable}
    prunable = tuple(u.index for u in units if u.file not in unreadable)
    dataset = src.statistics_dataset(scan.units if not unreadable else prunable)
    file_of = {u.path: u.file for u in units}
    distrusted: dict[str, int] = {}
    physical: dict = {}  # a file's column map -> its conjuncts and schema in the file's names
    for frag in (dataset.get_fragments() if prunable else ()):
        bad: set[str] = set()
        renamed = src.file_columns(file_of[frag.path]) if frag.path in file_of else src.column_renames
        fparts, fschema, back = parts, schema, {}
        if renamed:
            key = tuple(sorted(renamed.items(), key=lambda kv: (kv[0], kv[1] or "")))
            if key not in physical:
                physical[key] = _in_file_names(parts, schema, renamed)
            fparts, fschema, back = physical[key]
        sound = sound_columns(frag, fschema, {back.get(n, n) for n in scan.predicate.columns if
                                              renamed.get(n, n) is not None}, bad)
        for name in bad:
            name = next((k for k, v in back.items() if v == name), name)
            distrusted[name] = distrusted.get(name, 0) + 1
        usable = [e for c, e in fparts if c.columns <= sound and _nan_false(c, fschema)]
        if not usable:
            keep.update((frag.path, rg.id) for rg in frag.row_groups)
            continue
        expr = usable[0]
        for e in usable[1:]:
            expr = pc.and_kleene(expr, e)
        ids = matching_row_groups(frag, expr, fschema)
        if ids is None:  # statistics pyarrow cannot compare: every row group kept (the read
            ids = {rg.id for rg in frag.row_groups}  # casts the file's columns, and filters them)
        keep.update((frag.path, i) for i in ids)
    return tuple(u.index for u in units if (u.path, u.row_group) in keep), distrusted


def _in_file_names(parts, schema: pa.Schema, renamed) -> tuple[list, pa.Schema, dict[str, str]]:
    """The conjuncts and the schema in a file's own column names (``renamed``: logical ->
    the file's name, or None where the file lacks the column): a renamed column (Delta
    column mapping, an Iceberg column renamed after the file was written) prunes on its
    statistics under the file's name. Conjuncts reading a column the file lacks, or that
    cannot be rewritten, are left out; so is every conjunct where names would collide.
    Also returns logical -> file name for the renamed columns."""
    back = {n: v for n, v in renamed.items() if v is not None and v != n}
    names = [back.get(f.name, f.name) for f in schema if renamed.get(f.name, f.name) is not None]
    if len(set(names)) != len(names):
        return [], schema, back
    fschema = pa.schema([f.with_name(back.get(f.name, f.name)) for f in schema
                         if renamed.get(f.name, f.name) is not None])
    out = []
    for c, e in parts:
        if any(renamed.get(n, n) is None for n in c.columns):
            continue
        if not any(n in back for n in c.columns):
            out.append((c, e))
            continue
        moved = c.substitute({n: SqlExpr.column(back.get(n, n)) for n in c.columns})
        if moved is None:  # a pyarrow / polars expression: not rewritten
            continue
        try:
            out.append((moved, moved.to_arrow(fschema, predicate=True)))
        except Exception:  # noqa: BLE001 - not compilable in the file's names: not used to prune
            continue
    return out, fschema, back


def prune_row_groups(plan: Plan) -> Plan:
    return transform_up(plan, lambda n: _prune(n) if isinstance(n, Scan) else n)
