"""Progress bars for long operations: counting a selection, building the random-access
table, materializing a selection, loader epochs.

In a terminal a bar is ``tqdm``'s text on stderr. In a notebook kernel it is one display
output (an HTML ``<progress>`` with tqdm's text beside it, and that text as the plain
version) that is updated in place at most twice a second and once more, finished, when
the work ends: the same with or without ipywidgets, live in Jupyter / VS Code and in an
exported or ``nbclient``-executed notebook, whose stored output is the single final line
(tqdm's text fallback would store a line per refresh). Work without a known total gets no
bar (a count of "1.00rows" says nothing). Whether bars show is decided once per bar:

- ``ARROWLOAD_PROGRESS=0`` (or ``false`` / ``off`` / ``no``) in the environment switches
  them off, ``=1`` on; it wins over everything else;
- otherwise ``al.set_progress(False | True | "auto")`` (process-wide; ``with
  al.progress_enabled(False): ...`` for a block);
- ``"auto"`` (the default) shows bars in a notebook kernel or when stderr is a
  terminal, and never elsewhere (so pipes, CI logs and test runs stay quiet).

Bars also wait ``delay`` seconds (default 0.5) before drawing, so fast operations never
flash one. Without tqdm installed nothing is drawn.

>>> import arrowload as al
>>> al.set_progress(False)   # no bars anywhere in this process
>>> al.set_progress("auto")  # back to the default
"""

from __future__ import annotations

import contextlib
import html
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

_OFF = {"0", "false", "off", "no", "never"}
_ON = {"1", "true", "on", "yes", "always"}
_lock = threading.Lock()
_setting: bool | str = "auto"


def set_progress(enabled: bool | str = "auto") -> None:
    """Show progress bars always (True), never (False) or where someone can see them
    ("auto": a notebook or a terminal). ``ARROWLOAD_PROGRESS`` in the environment
    overrides this."""
    global _setting
    if enabled not in (True, False, "auto"):
        from .errors import InvalidArgumentError
        raise InvalidArgumentError(f"set_progress() takes True, False or 'auto'; got {enabled!r}")
    with _lock:
        _setting = enabled


def get_progress() -> bool | str:
    """The process-wide setting given to :func:`set_progress` (not the environment)."""
    return _setting


@contextlib.contextmanager
def progress_enabled(enabled: bool | str = True) -> Iterator[None]:
    """Within the block, progress bars follow ``enabled`` (then the previous setting)."""
    before = _setting
    set_progress(enabled)
    try:
        yield
    finally:
        set_progress(before)


def ipython_shell():
    """The running IPython shell where the program imported IPython, else None (never
    imports it)."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return None
    try:
        return ipython.get_ipython()
    except Exception:  # noqa: BLE001 - a broken IPython is no notebook
        return None


def _in_notebook() -> bool:
    shell = ipython_shell()
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def active() -> bool:
    """Would a bar be drawn now? (environment, then :func:`set_progress`, then "auto")."""
    env = os.environ.get("ARROWLOAD_PROGRESS", "").strip().lower()
    if env in _OFF:
        return False
    setting = True if env in _ON else _setting
    if setting is False:
        return False
    if setting == "auto" and not (_in_notebook() or _stderr_is_terminal()):
        return False
    return _tqdm_class() is not None


_TQDM: Any = None


def _tqdm_class():
    global _TQDM
    if _TQDM is None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                from tqdm import tqdm  # text; a notebook draws a NotebookBar instead
        except ImportError:
            _TQDM = False
        else:
            _TQDM = tqdm
    return _TQDM or None


class _NoBar:
    """What :func:`bar` returns when bars are off: accepts every call, draws nothing."""

    n = 0
    total = None

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix_str(self, *args, **kwargs) -> None:
        pass

    def set_description(self, *args, **kwargs) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class NotebookBar:
    """A bar in a notebook kernel: one display output (``display_id``), drawn once
    ``delay`` seconds have passed, updated in place at most every ``every`` seconds and
    once more when closed (the stored output of an executed notebook is that last state).
    Needs IPython only; ipywidgets plays no part."""

    def __init__(self, total: float, desc: str = "", unit: str = "it", *, delay: float = 0.5,
                 every: float = 0.5, unit_scale: bool = False, **ignored: Any) -> None:
        self.total, self.desc, self.unit, self.n = total, desc, unit, 0
        self.delay, self.every, self.unit_scale = delay, every, unit_scale
        self.postfix = ""
        self._start = self._last = time.monotonic()
        self._handle = None
        self._lock = threading.Lock()
        self.closed = False

    def text(self, elapsed: float | None = None) -> str:
        elapsed = time.monotonic() - self._start if elapsed is None else elapsed
        try:
            from tqdm import tqdm
        except ImportError:  # pragma: no cover - tqdm is a dependency
            done = f"{self.n:,}/{self.total:,} {self.unit}"
            return f"{self.desc}: {done} [{elapsed:.1f}s]" + (f", {self.postfix}" if self.postfix else "")
        return tqdm.format_meter(self.n, self.total, elapsed, ncols=100, prefix=self.desc, unit=self.unit,
                                 unit_scale=self.unit_scale, postfix=self.postfix or None)

    def _bundle(self) -> dict[str, str]:
        text = self.text()
        value = min(self.n, self.total) if self.total else 0
        return {"text/plain": text,
                "text/html": f'<div class="arrowload-progress" style="font-family:monospace,monospace;'
                             f'font-size:12px"><progress value="{value}" max="{self.total or 1}" '
                             f'style="width:16em;vertical-align:middle"></progress> '
                             f"{html.escape(text)}</div>"}

    def _draw(self) -> None:
        from IPython.display import display
        bundle = self._bundle()
        if self._handle is None:
            self._handle = display(bundle, raw=True, display_id=True)
        else:
            self._handle.update(bundle, raw=True)

    def update(self, n: float = 1) -> None:
        with self._lock:
            self.n += n
            now = time.monotonic()
            if now - self._start >= self.delay and (self._handle is None or now - self._last >= self.every):
                self._last = now
                self._draw()

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = s

    def set_description(self, desc: str = "", refresh: bool = True) -> None:
        self.desc = desc

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            if self._handle is not None:  # never drawn: the work took less than `delay`
                self._draw()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def bar(total: int | float | None = None, desc: str = "", unit: str = "it", *,
        enabled: bool | None = None, delay: float = 0.5, **kwargs: Any):
    """A progress bar or, when bars are off or ``total`` is unknown (None), a silent
    stand-in with the same ``update`` / ``close`` / context-manager interface. In a
    notebook kernel the bar is a :class:`NotebookBar`; elsewhere ``tqdm``. ``enabled``
    overrides the global decision for this bar (None: decide by :func:`active`). Extra
    keywords go to tqdm (``unit_scale=True``, ``leave=False`` ...)."""
    show = active() if enabled is None else (enabled and _tqdm_class() is not None)
    if not show or total is None:
        return _NoBar()
    if _in_notebook():
        return NotebookBar(total, desc, unit, delay=delay, **kwargs)
    kwargs.setdefault("dynamic_ncols", True)
    return _tqdm_class()(total=total, desc=desc, unit=unit, delay=delay, **kwargs)


def track(iterable: Iterable, total: int | None = None, desc: str = "", unit: str = "it", *,
          size: Callable[[Any], int] | None = None, enabled: bool | None = None,
          delay: float = 0.5, **kwargs: Any) -> Iterator:
    """Iterate ``iterable`` under a bar. Each item advances it by one, or by ``size(item)``
    (e.g. ``size=len`` counts the rows of record batches). ``total`` defaults to
    ``len(iterable)`` when counting items. Yields the same items; the bar closes when
    iteration ends or stops early."""
    if total is None and size is None:
        try:
            total = len(iterable)  # type: ignore[arg-type]
        except TypeError:
            total = None
    if size is not None:
        kwargs.setdefault("unit_scale", True)
    with bar(total, desc, unit, enabled=enabled, delay=delay, **kwargs) as b:
        for item in iterable:
            yield item
            b.update(1 if size is None else size(item))


def track_loader(loader, desc: str | None = None, *, enabled: bool | None = None,
                 delay: float = 0.5) -> Iterator:
    """One epoch of ``loader`` under a bar counting batches (total ``len(loader)``, less
    the batches a resumed state already delivered), with rows/s as a postfix.
    ``enabled=None`` follows the global setting; a bar never changes the batches."""
    desc = f"epoch {loader.epoch}" if desc is None else desc
    it = iter(loader)
    done = getattr(loader, "_batches_done", 0)
    total = max(0, len(loader) - done)
    try:
        with bar(total, desc, "batch", enabled=enabled, delay=delay) as b:
            for item in it:
                yield item
                b.update(1)
                stats = loader.stats()
                if stats.wall_s > 0:
                    b.set_postfix_str(f"{stats.rows / stats.wall_s:,.0f} rows/s", refresh=False)
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()


def expected_rows(plan) -> int | None:
    """Rows a plan will return when footers say so exactly (a scan without filter or
    limit, under projections and maps); None otherwise."""
    from .plan.nodes import Map, Project, Scan
    node = plan
    while isinstance(node, (Project, Map)):
        node = node.child
    if not isinstance(node, Scan) or node.predicate is not None or node.limit is not None:
        return None
    units = node.selected_units()
    if any(u.num_rows is None for u in units):
        return None
    return sum(u.num_rows for u in units)


def collect(batches: Iterable, schema, *, total: int | None = None, desc: str = "",
            enabled: bool | None = None):
    """Gather record batches into a ``pyarrow.Table`` under a bar counting rows."""
    import pyarrow as pa
    held = []
    with bar(total, desc, "rows", enabled=enabled, unit_scale=True) as b:
        for batch in batches:
            held.append(batch)
            b.update(batch.num_rows)
    return pa.Table.from_batches(held, schema=schema)
