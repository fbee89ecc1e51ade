"""What ``Dataset.describe()`` returns: the statistics frame, shown for people.

:class:`Description` *is* the ``polars.DataFrame`` ``describe()`` always returned (same
columns, same values: every polars method works and returns a plain frame), with
displays that answer at a glance:

- every column of the dataset is a row, whatever polars' row limit (``pl.Config``) says;
- counts with thousands separators, byte sizes with units (``54.5 MiB``), min / max
  shown as values (not quoted text), in the notebook (``_repr_html_``) and the terminal
  (``repr``), with the same cells as ``arrowload inspect``;
- in the notebook, a bar per column: its share of the bytes a scan of the described
  columns reads (compressed sizes from the footers).

``bounds`` holds min / max as typed Python values (int, float, ``datetime`` ...), where
the frame holds their text (one column holds every type).

>>> import pyarrow as pa, arrowload as al
>>> d = al.dataset(pa.table({"x": [3, 1, None]})).describe(exact=True)
>>> d.bounds["x"]
(1, 3)
"""

from __future__ import annotations

from typing import Any

import polars as pl

from .plan.explain import _fmt_bytes
from .tables import cut, esc, fmt_count

#: The short headers of the displays (the frame keeps its long column names).
SHORT_HEADERS = {"null_count": "nulls", "approx_distinct": "distinct", "compressed_bytes": "compressed",
                 "uncompressed_bytes": "uncompressed"}
_COUNTS = ("rows", "null_count", "approx_distinct")
_BYTES = ("compressed_bytes", "uncompressed_bytes")
_RIGHT = {"rows", "nulls", "distinct", "compressed", "uncompressed", "share"}


def display_rows(frame: pl.DataFrame, *, keep_empty: bool = False) -> list[dict[str, str]]:
    """Each row of a ``describe()`` frame as the displays show it: counts as ``16,793``,
    bytes as ``54.5 MiB``, unknowns empty; headers shortened (``nulls``, ``distinct``,
    ``compressed`` ...). Columns unknown for every row are left out unless ``keep_empty``."""
    names = [c for c in frame.columns
             if keep_empty or c in ("column", "type") or frame[c].null_count() < frame.height]
    out = []
    for rec in frame.select(names).iter_rows(named=True):
        row = {}
        for name, value in rec.items():
            if value is None:
                text = ""
            elif name in _COUNTS:
                text = fmt_count(value)
            elif name in _BYTES:
                text = _fmt_bytes(value)
            else:
                text = str(value)
            row[SHORT_HEADERS.get(name, name)] = text
        out.append(row)
    return out


def text_table(frame: pl.DataFrame, width: int) -> tuple[str, list[str]]:
    """The statistics as a box table at most ``width`` characters wide (``repr()`` and
    ``arrowload inspect``): cells cut first, then the least telling columns left out
    (sizes, distinct, rows, then min / max). Returns ``(text, headers left out)``."""
    from .tables import fit_table
    return fit_table(pl.DataFrame(display_rows(frame)), width,
                     drop=("rows", "uncompressed", "distinct", "compressed"), drop_late=("max", "min"),
                     wide=("column", "type"))


def _shares(frame: pl.DataFrame) -> list[float | None]:
    """Each column's share of the compressed bytes of all described columns."""
    if "compressed_bytes" not in frame.columns:
        return [None] * frame.height
    sizes = frame["compressed_bytes"].to_list()
    total = sum(s for s in sizes if s is not None)
    return [None if s is None or not total else s / total for s in sizes]


class Description(pl.DataFrame):
    """The frame ``describe()`` returns, with displays that show every column (see module)."""

    bounds: dict[str, tuple[Any, Any]]
    how: str

    @classmethod
    def of(cls, frame: pl.DataFrame, bounds: dict[str, tuple[Any, Any]], how: str) -> Description:
        out = cls._from_pydf(frame._df)
        out.bounds, out.how = bounds, how
        return out

    def _summary(self) -> str:
        rows = self["rows"].drop_nulls() if "rows" in self.columns and self.height else None
        n = f"{fmt_count(int(rows[0]), 'row')}, " if rows is not None and len(rows) else ""
        return f"{n}{fmt_count(self.height, 'column')} described {getattr(self, 'how', '')}".rstrip()

    def __str__(self) -> str:
        if not {"column", "type"} <= set(self.columns):
            return pl.DataFrame.__str__(self)
        from .tables import terminal_width, wrap
        width = terminal_width()
        text, dropped = text_table(self, width)
        out = f"{wrap(self._summary(), width, indent='')}\n{text}"
        if dropped:
            out += "\n" + wrap(f"({', '.join(dropped)} left out to fit {width} columns)", width, indent="")
        return out

    def __repr__(self) -> str:
        return self.__str__()

    def _repr_html_(self, **kwargs: Any) -> str:
        if not {"column", "type"} <= set(self.columns):
            return pl.DataFrame._repr_html_(self, **kwargs)
        return description_html(self, self._summary(), getattr(self, "bounds", {}))


def _is_number(value: Any) -> bool:
    from decimal import Decimal
    return isinstance(value, (int, float, Decimal)) and not isinstance(value, bool)


def description_html(frame: pl.DataFrame, summary: str, bounds: dict[str, tuple[Any, Any]] | None = None) -> str:
    """The notebook display: one row per column, numbers right-aligned, the share of bytes
    read as a bar; long cells cut with the full text as a tooltip; everything escaped."""
    rows = display_rows(frame)
    shares = _shares(frame)
    header = list(rows[0]) if rows else ["column", "type"]
    with_bar = any(s is not None for s in shares)
    cell = "padding:1px 8px;border-bottom:1px solid #eee;white-space:nowrap"
    head = "".join(f'<th style="{cell};text-align:{"right" if h in _RIGHT else "left"}">{esc(h)}</th>'
                   for h in header)
    if with_bar:
        head += f'<th style="{cell};text-align:left">share of bytes read</th>'
    body = []
    for row, share in zip(rows, shares):
        cells = []
        numeric = any(_is_number(v) for v in (bounds or {}).get(row.get("column"), ()))
        for h in header:
            text = row[h]
            short = cut(text, 28 if h not in ("source", "column", "type") else 40) or ""
            tip = f' title="{esc(text)}"' if short != text else ""
            align = "right" if h in _RIGHT or (numeric and h in ("min", "max")) else "left"
            cells.append(f'<td style="{cell};text-align:{align}"{tip}>{esc(short)}</td>')
        if with_bar:
            if share is None:
                cells.append(f'<td style="{cell}"></td>')
            else:
                px = max(1, round(120 * share)) if share > 0 else 0
                cells.append(f'<td style="{cell}"><span style="display:inline-block;width:{px}px;height:9px;'
                             f'background:#4c78a8;margin-right:6px"></span>{100 * share:.1f}%</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    return ('<div class="arrowload-describe" style="font-family:monospace,monospace;font-size:12px;'
            'overflow-x:auto">'
            f"<div><strong>arrowload describe()</strong> <span>{esc(summary)}</span></div>"
            '<table style="border-collapse:collapse;font-size:12px;margin:2px 0">'
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>")


__all__ = ["SHORT_HEADERS", "Description", "description_html", "display_rows", "text_table"]
