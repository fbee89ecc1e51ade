"""Tables for people: text that fits a terminal, HTML for a notebook, the same cells in both.

- :func:`fit_frame` renders a frame as a box table no wider than the terminal: long cells
  are cut (with "…"), and when the columns still do not fit, the middle ones are hidden
  behind one "…" column, as DuckDB and polars do, never squeezed into slivers.
- :func:`html_rows` is the notebook display of a few rows (``Dataset.head()`` in Jupyter).
- :func:`terminal_width`, :func:`wrap` and :func:`shown_path` are the small habits every
  command shares: ``COLUMNS`` wins, lines break at word boundaries, paths are shown
  relative to the working directory where they lie under it.

Only polars (imported where a table is drawn) and pyarrow are used; nothing here reads data.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import textwrap
from typing import Any

ELLIPSIS = "…"


def terminal_width() -> int:
    """Columns of the terminal (``COLUMNS`` wins, as in every shell tool); 120 when output
    goes to a pipe or file; never under 40."""
    return max(40, shutil.get_terminal_size((120, 24)).columns)


def cut(text: str | None, n: int, *, left: bool = False) -> str | None:
    """``text`` in at most ``n`` characters, the cut marked with an ellipsis (at the start
    with ``left``: the end of a path is the part that tells files apart)."""
    if text is None or len(text) <= n:
        return text
    return ELLIPSIS + text[len(text) - n + 1:] if left else text[: n - 1] + ELLIPSIS


_UNIT = re.compile(r"(\d) (B|KiB|MiB|GiB|TiB|of \d)\b")
_KEEP = "\x00"  # stands for a space that must not break while wrapping


def wrap(text: str, width: int, indent: str = "  ", hanging: str = "  ") -> str:
    """``text`` broken at word boundaries into lines of at most ``width`` characters; a
    number stays with its unit (``9.2 MiB``); a single word longer than a line (a long
    path) is the only thing ever cut."""
    kept = _UNIT.sub(lambda m: m.group(1) + _KEEP + m.group(2), text.replace(_KEEP, " "))
    lines = textwrap.wrap(kept, width, initial_indent=indent, subsequent_indent=indent + hanging,
                          break_long_words=True, break_on_hyphens=False)
    return "\n".join(lines).replace(_KEEP, " ") or indent.rstrip()


def wrap_lines(text: str, width: int) -> str:
    """Each line of ``text`` that is longer than ``width`` wrapped at word boundaries, its
    continuation indented under its first word (plan trees and ``key  value`` lines keep
    their shape)."""
    out = []
    for line in text.splitlines():
        if len(line) <= width:
            out.append(line)
            continue
        lead = line[: len(line) - len(line.lstrip())]
        body = line.lstrip()
        # a "label   value" line continues under its value
        head, sep, rest = body.partition("  ")
        hang = " " * (len(head) + len(sep) + len(rest) - len(rest.lstrip())) if sep and len(head) < 20 else "  "
        if len(lead) + len(hang) > width // 2:
            hang = "  "
        out.append(wrap(body, width, indent=lead, hanging=hang))
    return "\n".join(out)


def shown_path(path: str) -> str:
    """``path`` relative to the working directory where it lies under it (as the user
    would type it); URIs and paths elsewhere as they are."""
    if "://" in path or not os.path.isabs(path):
        return path
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        return path
    if rel.startswith(".."):
        return path
    return rel + ("/" if path.endswith("/") and not rel.endswith("/") else "")


def fmt_count(n: int | None, word: str | None = None) -> str:
    """``16,793`` / ``1 unit`` / ``2 units``; ``?`` when unknown."""
    if n is None:
        return "?" if word is None else f"? {word}s"
    if word is None:
        return f"{n:,}"
    return f"{n:,} {word}" + ("" if n == 1 else "es" if word.endswith(("s", "ch", "sh", "x")) else "s")


# ---------------------------------------------------------------------------
# text


def _render(frame, *, cols: int, dtypes: bool, str_len: int, list_len: int) -> str:
    import polars as pl
    with pl.Config(fmt_str_lengths=str_len, tbl_width_chars=30_000, fmt_table_cell_list_len=list_len,
                   tbl_rows=max(frame.height, 1), tbl_cols=cols, tbl_hide_dataframe_shape=True,
                   tbl_hide_column_data_types=not dtypes):
        return str(frame)


def _short_names(frame, n: int):
    """Column names cut to ``n`` characters (kept distinct)."""
    names, seen = [], set()
    for name in frame.columns:
        short = cut(name, n)
        k = 1
        while short in seen:
            k += 1
            short = cut(name, n - len(str(k)) - 1) + f"~{k}"
        seen.add(short)
        names.append(short)
    return frame.rename(dict(zip(frame.columns, names)))


def fit_frame(frame, width: int, *, dtypes: bool = True, str_len: int = 32,
              list_len: int = 4) -> tuple[str, int]:
    """``frame`` (a polars DataFrame, or a pyarrow Table) as a box table whose lines are at
    most ``width`` characters. Cells longer than ``str_len`` are cut; then, while the table
    is too wide, the middle columns give way to one "…" column (first and last columns
    stay, as in DuckDB and polars); a lone column still too wide has its cells cut further.
    Returns ``(text, columns shown)``; every row of ``frame`` is shown."""
    import polars as pl
    if not isinstance(frame, pl.DataFrame):
        from .convert.polars_frame import displayable
        frame = pl.from_arrow(displayable(frame))
    frame = _visible(frame)
    total = frame.width
    if total == 0:
        return _render(frame, cols=-1, dtypes=dtypes, str_len=str_len, list_len=list_len), 0
    frame = _short_names(frame, max(str_len, 12))
    text = ""
    for length in sorted({str_len, 20, 12, 8}, reverse=True):
        if length > str_len:
            continue
        frame = _short_names(frame, max(length, 8))
        lo, hi = 1, total  # the most columns that fit: widths grow with the columns shown
        best = None
        while lo <= hi:
            mid = (lo + hi) // 2
            text = _render(frame, cols=mid if mid < total else -1, dtypes=dtypes, str_len=length,
                           list_len=list_len)
            if max(map(len, text.splitlines()), default=0) <= width:
                best, lo = (text, mid), mid + 1
            else:
                hi = mid - 1
        if best is not None:
            return best
    return text, 1  # pragma: no cover - one column of 8 characters fits 40 columns


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _escaped(text: str | None) -> str | None:
    """``text`` with control characters as escapes (``\\n``, ``\\x1b``): printed raw, a newline
    split a row in two and an ANSI escape recoloured the terminal."""
    if text is None or not _CONTROL.search(text):
        return text
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def _visible(frame):
    """``frame`` with control characters in its names and top-level string cells escaped."""
    import polars as pl
    strings = [c for c, t in frame.schema.items() if t == pl.String]
    if strings:
        frame = frame.with_columns(pl.col(c).map_elements(_escaped, return_dtype=pl.String, skip_nulls=True)
                                   for c in strings)
    names = {c: _escaped(c) for c in frame.columns if _CONTROL.search(c)}
    return frame.rename(names) if names else frame


def fit_table(frame, width: int, *, drop: tuple[str, ...] = (), drop_late: tuple[str, ...] = (),
              left: tuple[str, ...] = (), wide: tuple[str, ...] = ()):
    """Render ``frame`` as a box table no wider than ``width``. In order, until it fits:
    cells are cut (with "…") down to 20 characters, the columns in ``drop`` are left out,
    cells outside the ``wide`` columns are cut down to 10, the columns in ``drop_late`` are
    left out, and every cell is cut further. Returns ``(text, names left out)``."""
    import polars as pl
    frame = frame.with_columns(pl.col(c).cast(pl.String) for c in frame.columns)
    dropped: list[str] = []
    early = [c for c in drop if c in frame.columns]
    late = [c for c in drop_late if c in frame.columns]
    cap = narrow = 48
    while True:
        limit = {c: cap if c in wide else min(cap, narrow) for c in frame.columns}
        short = frame.select(
            pl.col(c).map_elements(lambda v, c=c, limit=limit: cut(v, limit[c], left=c in left), return_dtype=pl.String)
            for c in frame.columns)
        short = short.rename({c: cut(c, max(limit[c], 5)) for c in short.columns})
        text = _render(short, cols=-1, dtypes=False, str_len=10_000, list_len=4)
        if max(map(len, text.splitlines()), default=0) <= width:
            return text, dropped
        if cap > 20:
            cap = narrow = cap - 4
        elif early:
            name = early.pop(0)
            frame = frame.drop(name)
            dropped.append(name)
        elif narrow > 10:
            narrow -= 2
        elif late:
            name = late.pop(0)
            frame = frame.drop(name)
            dropped.append(name)
        elif cap > 5:
            cap = narrow = cap - 1
        else:  # pragma: no cover - a few columns of 5 characters fit 40
            return text, dropped


def hidden_note(shown: int, total: int, width: int, hint: str = "--columns A,B picks them") -> str:
    """The line under a table whose middle columns are hidden."""
    return wrap(f"{shown} of {total} columns shown; {hint}, a wider terminal shows more", width, indent="")


# ---------------------------------------------------------------------------
# HTML

_TABLE = "border-collapse:collapse;font-size:12px;margin:2px 0"
_CELL = "padding:1px 8px;border-bottom:1px solid #eee;white-space:nowrap;max-width:24em;" \
        "overflow:hidden;text-overflow:ellipsis"
_HEAD = "padding:1px 8px;border-bottom:1px solid #999;text-align:left;white-space:nowrap"
MAX_HTML_COLUMNS = 40
MAX_HTML_ROWS = 50


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _numeric(t) -> bool:
    import pyarrow as pa
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)


def cell_text(value: Any, limit: int = 64) -> str:
    """A value as a table cell shows it: ``null``, lists cut after 4 items, text cut."""
    if value is None:
        return "null"
    if isinstance(value, float):
        return repr(value)
    if type(value).__name__ == "float32":
        return str(value)
    if isinstance(value, (list, tuple)):
        items = [cell_text(v, 16) for v in value[:4]]
        return "[" + ", ".join(items) + (", …" if len(value) > 4 else "") + "]"
    if isinstance(value, bytes):
        return "b'" + value[:16].hex() + ("…" if len(value) > 16 else "") + "'"
    return cut(str(value), limit) or ""


def html_rows(table, *, title: str = "") -> str:
    """The first rows of a ``pyarrow.Table`` as an HTML table (names, types, values;
    numbers right-aligned, every cell escaped, long cells cut with the full value as a
    tooltip). More than 40 columns: the middle ones give way to a "…" column."""
    names = table.column_names
    picked = list(range(len(names)))
    if len(picked) > MAX_HTML_COLUMNS:
        half = MAX_HTML_COLUMNS // 2
        picked = picked[:half] + [-1] + picked[-half:]
    rows = min(table.num_rows, MAX_HTML_ROWS)
    data = {i: table.column(i).slice(0, rows).to_pylist() for i in picked if i >= 0}
    import pyarrow as pa
    single = {i: pa.types.is_float32(table.schema.field(i).type) or pa.types.is_float16(table.schema.field(i).type)
              for i in data}
    head, types = [], []
    for i in picked:
        if i < 0:
            head.append(f'<th style="{_HEAD}">{ELLIPSIS}</th>')
            types.append(f'<td style="{_CELL};color:#888"></td>')
            continue
        head.append(f'<th style="{_HEAD}">{esc(names[i])}</th>')
        types.append(f'<td style="{_CELL};color:#888">{esc(table.schema.field(i).type)}</td>')
    body = []
    for r in range(rows):
        cells = []
        for i in picked:
            if i < 0:
                cells.append(f'<td style="{_CELL}">{ELLIPSIS}</td>')
                continue
            v = data[i][r]
            if isinstance(v, float) and single[i]:
                import numpy as np
                v = np.float32(v)  # shown with float32's precision, as polars and the CLI do
            text = cell_text(v)
            full = cell_text(v, 1000)
            align = ";text-align:right" if _numeric(table.schema.field(i).type) else ""
            tip = f' title="{esc(full)}"' if full != text else ""
            color = ";color:#888" if v is None else ""
            cells.append(f'<td style="{_CELL}{align}{color}"{tip}>{esc(text)}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    shape = f"{fmt_count(table.num_rows, 'row')}, {fmt_count(len(names), 'column')}"
    if rows < table.num_rows:
        shape += f" (first {rows:,} shown)"
    if len(picked) < len(names):
        shape += f" ({MAX_HTML_COLUMNS} of {len(names)} columns shown)"
    caption = f"<strong>{esc(title)}</strong> " if title else ""
    return ('<div class="arrowload-rows" style="font-family:monospace,monospace;font-size:12px;overflow-x:auto">'
            f"<div>{caption}<span>{esc(shape)}</span></div>"
            f'<table style="{_TABLE}"><thead><tr>{"".join(head)}</tr><tr>{"".join(types)}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


__all__ = ["ELLIPSIS", "cell_text", "cut", "esc", "fit_frame", "fit_table", "fmt_count", "hidden_note", "html_rows",
           "shown_path", "terminal_width", "wrap", "wrap_lines"]
