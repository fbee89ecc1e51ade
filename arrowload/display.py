"""How Datasets, Loaders and profiles show themselves: text for ``repr()`` and terminals,
HTML for notebooks (``_repr_html_``).

Everything shown comes from footers and the plan (no data page is read to display a
Dataset); every piece of text that reaches HTML goes through ``html.escape``. A display
never raises: a part that cannot be computed shows why instead.
"""

from __future__ import annotations

import html
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .plan.explain import _fmt_bytes, render_tree, scan_stats, unreadable_footers
from .plan.nodes import Plan, Scan, SqlQuery, scans, walk
from .progress import ipython_shell

MAX_SCHEMA_ROWS = 64

_STYLE_TABLE = "border-collapse:collapse;font-size:12px;margin:2px 0"
_STYLE_CELL = "text-align:left;padding:1px 10px 1px 0;vertical-align:top"
_STYLE_HEAD = _STYLE_CELL + ";font-weight:600;border-bottom:1px solid #ccc"


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def fmt_bytes(n: int | float | None) -> str:
    return _fmt_bytes(None if n is None else int(n))


def fmt_int(n: int | None) -> str:
    return "?" if n is None else f"{n:,}"


def unit_name(kind: str) -> str:
    return {"parquet": "row groups", "memory": "slices"}.get(kind, "files")


# ---------------------------------------------------------------------------
# HTML building blocks


def html_table(header: Sequence[str] | None, rows: Iterable[Sequence[Any]], *,
               raw_columns: Sequence[int] = ()) -> str:
    """A small HTML table; every cell is escaped except columns in ``raw_columns``
    (which the caller has built from escaped parts)."""
    out = [f'<table style="{_STYLE_TABLE}">']
    if header:
        out.append("<thead><tr>" + "".join(f'<th style="{_STYLE_HEAD}">{esc(h)}</th>' for h in header)
                   + "</tr></thead>")
    out.append("<tbody>")
    for row in rows:
        cells = []
        for i, v in enumerate(row):
            text = v if i in raw_columns else esc(v)
            cells.append(f'<td style="{_STYLE_CELL}">{text}</td>')
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def html_details(summary: str, body_html: str, *, open_: bool = False) -> str:
    attr = " open" if open_ else ""
    return f"<details{attr}><summary>{esc(summary)}</summary>{body_html}</details>"


def html_pre(text: str) -> str:
    return f'<pre style="font-size:12px;margin:2px 0">{esc(text)}</pre>'


def html_box(title: str, subtitle: str, body: str) -> str:
    return ('<div class="arrowload-repr" style="font-family:monospace,monospace;font-size:12px">'
            f"<div><strong>{esc(title)}</strong> <span>{esc(subtitle)}</span></div>{body}</div>")


# ---------------------------------------------------------------------------
# Datasets


@dataclass
class ScanSummary:
    kind: str
    display: str
    files: tuple[int, int] | None = None
    units: tuple[int, int] | None = None
    columns: tuple[int, int] | None = None
    read_columns: tuple[str, ...] = ()
    bytes: tuple[int | None, int | None] | None = None
    rows_total: int | None = None
    rows_kept: int | None = None
    pushed: list[str] = field(default_factory=list)
    notes: list[tuple[str, str]] = field(default_factory=list)
    under_sql: bool = False
    error: str | None = None
    unreadable: list[str] = field(default_factory=list)

    def source_line(self) -> str:
        if self.error:
            return f"<unavailable: {self.error}>"
        parts = []
        if self.files and self.kind != "memory":
            parts.append(plural(self.files[1], "file"))
        if self.units and self.kind in ("parquet", "memory"):  # other formats: a unit is a file
            parts.append(plural(self.units[1], unit_name(self.kind)[:-1]))
        if self.rows_total is not None:
            parts.append(f"{fmt_int(self.rows_total)} rows")
        if self.bytes and self.bytes[1] is not None:
            parts.append(f"{fmt_bytes(self.bytes[1])}" + (" compressed" if self.kind == "parquet" else ""))
        return ", ".join(parts)

    def reads_line(self) -> str:
        if self.error or not self.units:
            return ""
        parts = [] if self.kind == "memory" else [f"{self.files[0]:,} of {self.files[1]:,} files"]
        if self.kind in ("parquet", "memory"):
            parts.append(f"{self.units[0]:,} of {self.units[1]:,} {unit_name(self.kind)}")
        parts.append(f"{self.columns[0]:,} of {self.columns[1]:,} columns")
        kb, tb = self.bytes or (None, None)
        if kb is not None and tb is not None:
            pct = f" ({100.0 * kb / tb:.1f}%)" if tb else ""
            parts.append(f"~{fmt_bytes(kb)} of {fmt_bytes(tb)}{pct}")
        return ("at most " if self.under_sql else "") + ", ".join(parts)

    def pushed_line(self) -> str:
        items = list(self.pushed) + [what for _, what in self.notes]
        if self.under_sql:
            items.append("DuckDB pushes its own projection and filters into this scan when the "
                         "query runs (see explain())")
        return "; ".join(items) if items else "nothing (the scan reads every row of the kept columns)"


def plural(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def summarize_scan(scan: Scan, under_sql: bool = False) -> ScanSummary:
    src = scan.source
    s = ScanSummary(kind=src.kind, display=src.display, under_sql=under_sql)
    try:
        st = scan_stats(scan)
        s.files, s.units, s.columns, s.bytes = st["files"], st["units"], st["columns"], st["bytes"]
        s.read_columns = tuple(scan.read_columns)
        all_units = src.units()
        if all(u.num_rows is not None for u in all_units):
            s.rows_total = sum(u.num_rows for u in all_units)
        s.rows_kept = st["rows"]
        if scan.predicate is not None:
            s.pushed.append(f"filter {scan.predicate}")
        if scan.projection is not None or scan.columns is not None:
            s.pushed.append(f"projection ({s.columns[0]} of {s.columns[1]} columns read)")
        if scan.limit is not None:
            s.pushed.append(f"limit {scan.limit:,}")
        s.notes = list(scan.notes)
        s.unreadable = unreadable_footers(src)
    except Exception as exc:  # noqa: BLE001 - a display never raises
        s.error = f"{type(exc).__name__}: {exc}"
    return s


@dataclass
class DatasetSummary:
    where: str
    schema: list[tuple[str, str, bool]] | None
    schema_error: str | None
    scans: list[ScanSummary]
    logical: list[str]
    optimized: list[str] | None
    sql: str | None
    error: str | None = None


def summarize_dataset(ds) -> DatasetSummary:
    plan: Plan = ds.plan
    logical_scans = scans(plan)
    where = ", ".join(f"{s.source.kind}: {s.source.display}" for s in logical_scans)
    schema, schema_error = None, None
    try:
        schema = [(f.name, str(f.type), f.nullable) for f in ds.schema]
    except Exception as exc:  # noqa: BLE001
        schema_error = f"{type(exc).__name__}: {exc}"
    optimized, found, error = None, [], None
    try:
        opt = ds.optimized_plan()
        optimized = render_tree(opt)
        in_sql = any(isinstance(n, SqlQuery) for n in walk(opt))
        found = [summarize_scan(s, in_sql) for s in scans(opt)]
    except Exception as exc:  # noqa: BLE001
        error = f"{type(exc).__name__}: {exc}"
    sql = plan.query if isinstance(plan, SqlQuery) else None
    return DatasetSummary(where, schema, schema_error, found, render_tree(plan), optimized, sql, error)


def _schema_text(summary: DatasetSummary) -> str:
    if summary.schema is None:
        return f"<schema unavailable: {summary.schema_error}>"
    return ", ".join(f"{n}: {t}" for n, t, _ in summary.schema)


def dataset_text(ds) -> str:
    """The text ``repr()`` of a Dataset (footers and plan only; nothing is scanned)."""
    s = summarize_dataset(ds)
    lines = [f"arrowload.Dataset({s.where})", f"  columns: {_schema_text(s)}"]
    many = len(s.scans) > 1
    for i, sc in enumerate(s.scans):
        tag = f" [{i}]" if many else ""
        lines.append(f"  source{tag}:  {sc.kind}: {sc.display}: {sc.source_line()}" if many
                     else f"  source:  {sc.source_line()}")
        if sc.reads_line():
            lines.append(f"  reads{tag}:   {sc.reads_line()}")
        if not sc.error:
            lines.append(f"  pushed{tag}:  {sc.pushed_line()}")
        for what in sc.unreadable:
            lines.append(f"  unreadable{tag}: {what}")
    if s.error:
        lines.append(f"  <plan unavailable: {s.error}>")
    lines.append("  plan: " + "\n        ".join(s.logical))
    return "\n".join(lines)


def dataset_html(ds) -> str:
    """The notebook display of a Dataset: schema, sources, what the plan pushes down."""
    s = summarize_dataset(ds)
    parts = []
    rows: list[tuple[str, str]] = []
    for i, sc in enumerate(s.scans):
        tag = f" [{i}]" if len(s.scans) > 1 else ""
        rows.append((f"source{tag}", f"{sc.kind}: {sc.display}"))
        if sc.source_line():
            rows.append(("", sc.source_line()))
        if sc.reads_line():
            rows.append((f"reads{tag}", sc.reads_line()))
        if not sc.error:
            rows.append((f"pushed down{tag}", sc.pushed_line()))
        for what in sc.unreadable:
            rows.append((f"unreadable{tag}", what))
    if s.sql:
        rows.append(("runs in DuckDB", s.sql))
    if s.error:
        rows.append(("plan", f"unavailable: {s.error}"))
    parts.append(html_table(None, rows))
    if s.schema is None:
        parts.append(f"<div>schema unavailable: {esc(s.schema_error)}</div>")
    else:
        shown = s.schema[:MAX_SCHEMA_ROWS]
        body = html_table(("#", "column", "type", "nullable"),
                          [(i, n, t, "yes" if nl else "no") for i, (n, t, nl) in enumerate(shown)])
        if len(s.schema) > len(shown):
            body += f"<div>... and {len(s.schema) - len(shown)} more columns</div>"
        parts.append(html_details(f"schema ({len(s.schema)} columns)", body, open_=len(s.schema) <= 32))
    plan_text = "\n".join(s.logical)
    if s.optimized is not None:
        plan_text += "\n\noptimized:\n" + "\n".join(s.optimized)
    parts.append(html_details("plan", html_pre(plan_text)))
    ncols = f"{len(s.schema)} columns" if s.schema is not None else ""
    return html_box("arrowload.Dataset", ncols, "".join(parts))


# ---------------------------------------------------------------------------
# Loaders


def loader_layout(loader) -> list:
    """The loader's batch layout (``pipeline.layout.KeyLayout`` per output key), predicted
    from the plan's schema and the loader's own conversion of an empty batch; ``[]`` where it
    cannot be computed (a display never raises)."""
    from .pipeline.layout import predicted
    try:
        return predicted(loader)
    except Exception:  # noqa: BLE001 - a display never raises
        return []


def loader_rate(loader) -> tuple[float, str] | None:
    """(rows/s, where it comes from) of the loader's last run or last profile, or None."""
    stats = loader.stats()
    if stats.batches and stats.wall_s > 0:
        return stats.rows / stats.wall_s, "the last run's"
    prof = getattr(loader, "_last_profile", None)
    if prof is not None and prof.rows_per_s > 0:
        return prof.rows_per_s, "the last profile's"
    return None


def loader_epoch_text(loader) -> str:
    """``196 batches, 200,000 rows per rank; epoch ~0.16 s at the last run's 1.25M rows/s``."""
    from .order import rank_range
    from .pipeline.stats import fmt_rate, fmt_seconds
    o = loader.options
    start, stop = rank_range(loader.num_rows, loader.rank, loader.world_size)
    rows = stop - start
    if o.drop_last:
        rows = rows // o.batch_size * o.batch_size
    text = f"{fmt_int(len(loader))} batches, {fmt_int(rows)} rows per rank"
    rate = loader_rate(loader)
    if rate is not None:
        text += f"; epoch ~{fmt_seconds(rows / rate[0])} at {rate[1]} {fmt_rate(rate[0])}"
    return text


def loader_lines(loader) -> list[tuple[str, str]]:
    """(label, value) pairs describing a Loader's setup, batch layout and position."""
    o = loader.options
    rows: list[tuple[str, str]] = []
    try:
        from .tables import fmt_count
        window = f", window of {fmt_count(o.shuffle_window, 'unit')}" if loader.shuffle_kind == "block" else ""
        rows.append(("shuffle", f"{loader.shuffle_kind}{window} (seed {o.seed})"))
        rows.append(("rows", f"{fmt_int(loader.num_rows)} selected; rank {loader.rank} of {loader.world_size}"))
        rows.append(("batches", f"{fmt_int(len(loader))} per epoch of {o.batch_size:,} rows "
                                f"(drop_last={o.drop_last})"))
        for i, k in enumerate(loader_layout(loader)):
            rows.append(("layout" if i == 0 else "", k.text()))
        rows.append(("epoch", loader_epoch_text(loader)))
        done = getattr(loader, "_batches_done", 0)
        rows.append(("position", f"epoch {loader.epoch}, {done:,} of {len(loader):,} batches delivered"))
        rows.append(("source", f"{loader.source_kind}, {plural(len(loader._source.counts), 'unit')}"))
        rows.append(("output", f"{o.output}" + (f" on {o.device}" if o.device is not None else "")))
        rows.append(("prefetch", f"{fmt_bytes(o.prefetch)} budget, {loader.readers_text()}"))
        stats = loader.stats()
        if stats.batches:
            rows.append(("last run", str(stats)))
    except Exception as exc:  # noqa: BLE001 - a display never raises
        rows.append(("error", f"{type(exc).__name__}: {exc}"))
    return rows


def loader_text(loader, first_line: str) -> str:
    lines = [first_line]
    pairs = loader_lines(loader)
    width = max(len(k) for k, _ in pairs)
    for k, v in pairs:
        lines.append(f"  {k:<{width}}  {v}")
    ds_lines = dataset_text(loader._dataset).splitlines()
    lines.append("  dataset: " + ds_lines[0])
    lines.extend("  " + ln for ln in ds_lines[1:])
    return "\n".join(lines)


def loader_html(loader) -> str:
    pairs = loader_lines(loader)
    layout = loader_layout(loader)
    body = html_table(None, [(k, v) for k, v in pairs if k not in ("layout", "")])
    if layout:
        body += html_details(f"batch layout ({plural(len(layout), 'key')})",
                             html_table(("key", "dtype", "shape", "device"),
                                        [(k.key, k.dtype, "[" + ", ".join(str(d) for d in k.shape) + "]",
                                          k.device) for k in layout]),
                             open_=len(layout) <= 32)
    body += html_details("dataset", dataset_html(loader._dataset))
    sub = f"batch_size={loader.options.batch_size}, shuffle={loader.shuffle_kind}, output={loader.options.output}"
    return html_box("arrowload.Loader", sub, body)


# ---------------------------------------------------------------------------
# rows in a notebook: ``Dataset.head()``

_HEADS: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_PREVIOUS: dict[int, Any] = {}  # id(shell) -> the HTML formatter of pyarrow.Table we wrap (or None)


def _ipython_shell():
    shell = ipython_shell()
    return shell if shell is not None and hasattr(shell, "display_formatter") else None


def _table_html(table) -> str | None:
    if _HEADS.get(id(table)) is table:
        return rows_html(table)
    previous = _PREVIOUS.get(id(_ipython_shell()))
    return previous(table) if previous is not None else None


def rows_html(table) -> str:
    """The notebook display of rows ``Dataset.head()`` returned (``tables.html_rows``)."""
    from .tables import html_rows
    try:
        return html_rows(table, title="arrowload head()")
    except Exception as exc:  # noqa: BLE001 - a display never raises
        return f"<pre>{esc(f'{type(exc).__name__}: {exc}')}</pre>"


def show_as_rows(table) -> None:
    """In an IPython shell, make ``table`` (a ``pyarrow.Table`` from ``head()``) display as
    an HTML table of rows. The result stays the very ``pyarrow.Table`` (the contract);
    only IPython's HTML formatter learns to draw tables ``head()`` returned (weakly held:
    other tables display as before, through any formatter registered earlier)."""
    shell = _ipython_shell()
    if shell is None:
        return
    _HEADS[id(table)] = table
    if id(shell) not in _PREVIOUS:
        import pyarrow as pa
        formatter = shell.display_formatter.formatters["text/html"]
        _PREVIOUS[id(shell)] = formatter.for_type(pa.Table, _table_html)
