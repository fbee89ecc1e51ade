"""Data mixtures: ``al.mix({name: dataset, ...}, weights=...)``.

Components are Datasets (filters, ``al.sql`` select-project-filter queries over one lake or
several; any plan the loader reads) with the same output schema. A mixture is lazy: it
reads nothing until sizes, ``explain()`` or a loader are asked for.

Rows matching several components are **counted in each**: a component is its own
selection, read in its own order, and a row two components select can be drawn once per
pass of each (use disjoint filters where a row must be drawn at most once).

See :mod:`arrowload.order.mixture` for the arithmetic (apportionment per batch, stopping,
ranks) and :mod:`arrowload.mixture.loader` for the loader and its state
(``formats/mixture_state/v1``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import ArgumentTypeError, InvalidArgumentError, SchemaMismatchError
from ..options import default_cache_dir
from ..order.mixture import STOPPING, Phase, Schedule
from ..pipeline.options import DEFAULT, LoaderOptions, resolve_options
from . import weights as _weights


def component_size(ds, cache_dir: str | None) -> int:
    """Exact rows of a component: per unit counts through the selection index (cached by
    snapshot in ``cache_dir``, reading only the filter's columns) where the plan is over one
    scan, else ``count()``."""
    from ..pipeline.options import reader_bound
    from ..pipeline.rowsource import ScanRowSource, _one_scan
    plan = ds.optimized_plan()
    if _one_scan(plan):
        src = ScanRowSource(plan, ds.options, cache_dir, reader_bound(None))
        try:
            return int(sum(src.counts))
        finally:
            src.close()
    return int(ds.count())


class Mixture:
    """Components drawn at set proportions. Built by :func:`mix`; lazy and immutable.

    ``len(m)`` is the rows of one epoch drawn a row at a time (a loader's epoch is the
    whole batches of it: see ``Mixture.loader``); ``"cycle"`` mixtures have none
    (``UnsupportedError``). ``sizes()`` are the components' exact rows; ``weights`` the
    normalized weights; ``explain()`` says per component its rows, bytes, files, weight and
    passes per epoch."""

    def __init__(self, components: Mapping[str, Any], weights: Any = None, temperature: Any = None,
                 seed: int = 0, stopping: str = "first_exhausted", cache_dir: str | None = None) -> None:
        from ..api import Dataset
        if not isinstance(components, Mapping) or not components:
            raise ArgumentTypeError("al.mix() takes a non-empty dict {name: Dataset}, e.g. al.mix({'web': "
                                    "ds.filter(\"src = 'web'\"), 'code': ds.filter(\"src = 'code'\")})",
                                    "components")
        for name, ds in components.items():
            if not isinstance(name, str) or not name:
                raise ArgumentTypeError(f"component names must be non-empty strings, got {name!r}", "components")
            if not isinstance(ds, Dataset):
                raise ArgumentTypeError(f"component {name!r} must be an arrowload Dataset (al.dataset(...)."
                                        f"filter(...) or al.sql(...)), got {type(ds).__name__}", "components")
        if stopping not in STOPPING:
            raise InvalidArgumentError(f"stopping must be one of {', '.join(map(repr, STOPPING))}, got "
                                       f"{stopping!r}", "stopping")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ArgumentTypeError(f"seed must be an integer >= 0, got {seed!r}", "seed")
        self.names = tuple(components)
        self.datasets = tuple(components.values())
        first = self.datasets[0].schema
        for name, ds in zip(self.names[1:], self.datasets[1:]):
            if not ds.schema.equals(first):
                raise SchemaMismatchError(
                    f"mixture components must have the same columns and types: {self.names[0]!r} has "
                    f"{first.to_string(show_schema_metadata=False)!s:.200} but {name!r} has "
                    f"{ds.schema.to_string(show_schema_metadata=False)!s:.200}; select / cast the same columns "
                    "in each component")
        self.seed = seed
        self.stopping = stopping
        self._cache_dir = cache_dir
        self._sizes: tuple[int, ...] | None = None
        self.weights = _weights.normalized(_weights.resolve(self.names, weights, temperature, self.sizes))

    @property
    def schema(self):
        return self.datasets[0].schema

    def sizes(self) -> tuple[int, ...]:
        """Exact rows of each component (reading only the filters' columns, cached by snapshot)."""
        if self._sizes is None:
            cache = self._cache_dir or default_cache_dir()
            self._sizes = tuple(component_size(ds, cache) for ds in self.datasets)
        return self._sizes

    def _schedule(self, batch_size: int = 1) -> Schedule:
        _weights.refuse_empty(self.names, self.sizes(), self.weights)
        return Schedule(self.sizes(), (Phase(0, self.weights, (0,) * len(self.names)),), batch_size,
                        self.seed, 0, self.stopping)

    def __len__(self) -> int:
        if self.stopping == "cycle":
            from ..errors import UnsupportedError
            raise UnsupportedError("a stopping='cycle' mixture never ends: it has no length. Iterate its "
                                   "loader with steps=N batches per epoch")
        return int(self._schedule().num_blocks)

    def passes(self) -> tuple[float, ...]:
        """Passes over each component in one epoch (drawn a row at a time)."""
        if self.stopping == "cycle":
            return tuple(float("inf") if w > 0 else 0.0 for w in self.weights)
        s = self._schedule()
        drawn = s.stream_index(s.num_blocks)
        return tuple(d / n if n else 0.0 for d, n in zip(drawn, self.sizes()))

    def with_weights(self, weights: Any = None, *, temperature: Any = None) -> "Mixture":
        """The same components with other weights."""
        m = Mixture(dict(zip(self.names, self.datasets)), weights, temperature, self.seed, self.stopping,
                    self._cache_dir)
        m._sizes = self._sizes
        return m

    def loader(self, batch_size: int | None = None, *, options: LoaderOptions | None = None,
               steps: int | None = None, **kwargs: Any):
        """A :class:`~arrowload.mixture.loader.MixtureLoader`: batches of ``batch_size`` rows,
        each holding the floor or the ceiling of ``weight x batch_size`` rows of every
        component, interleaved (shuffled) within the batch. Takes ``Dataset.loader``'s
        arguments (``shuffle``: each component in its own order, global or block as its
        source allows; ``seed``: default the mixture's) and ``steps``: batches per rank per
        epoch, for ``stopping="cycle"`` (without it a cycle epoch never ends). Every batch
        is whole: ``drop_last`` changes nothing."""
        from .loader import MixtureLoader
        unknown = [k for k in kwargs if k not in LoaderOptions.__dataclass_fields__]
        if unknown:
            raise ArgumentTypeError(f"Mixture.loader() got unknown arguments {unknown}; it takes "
                                    "Dataset.loader()'s arguments and steps=", unknown[0])
        seed_given = "seed" in kwargs or (options is not None and options.seed != 0)
        opts = resolve_options(batch_size, options, {k: kwargs.get(k, DEFAULT)
                                                     for k in LoaderOptions.__dataclass_fields__
                                                     if k != "batch_size"})
        if not seed_given:
            import dataclasses
            opts = dataclasses.replace(opts, seed=self.seed)
        return MixtureLoader(self, opts, steps)

    # -- description ---------------------------------------------------------
    def component_rows(self) -> list[dict]:
        """Per component: name, rows, weight, passes per epoch, files and bytes kept (footers)."""
        from ..plan.explain import scan_stats
        from ..plan.nodes import scans
        out = []
        sizes = self.sizes()
        passes = self.passes()
        for name, ds, n, w, p in zip(self.names, self.datasets, sizes, self.weights, passes):
            files = nbytes = 0
            known = True
            for s in scans(ds.optimized_plan()):
                try:
                    st = scan_stats(s)
                except Exception:  # noqa: BLE001 - a description never raises
                    known = False
                    continue
                files += st["files"][0]
                if st["bytes"][0] is None:
                    known = False
                else:
                    nbytes += st["bytes"][0]
            out.append({"name": name, "rows": n, "weight": w, "passes": p, "files": files,
                        "bytes": nbytes if known else None})
        return out

    def explain(self) -> str:
        from ..display import fmt_bytes, fmt_int
        lines = ["== mixture ==",
                 f"  stopping     {self.stopping} (seed {self.seed})",
                 "  epoch        " + ("endless (cycle): loader(steps=N) sets batches per epoch"
                                      if self.stopping == "cycle" else f"{fmt_int(len(self))} rows drawn"),
                 "  overlap      a row several components select is drawn in each (its own pass of each)",
                 "",
                 f"  {'component':<16} {'rows':>12} {'weight':>8} {'passes':>8} {'files':>6} {'bytes read':>11}"]
        for r in self.component_rows():
            lines.append(f"  {r['name']:<16} {fmt_int(r['rows']):>12} {r['weight']:>8.4f} "
                         f"{r['passes']:>8.3f} {r['files']:>6} {fmt_bytes(r['bytes']) if r['bytes'] is not None else '?':>11}")
        for name, ds in zip(self.names, self.datasets):
            lines += ["", f"== component {name!r} =="] + ["  " + t for t in ds.explain().splitlines()]
        return "\n".join(lines)

    def __repr__(self) -> str:
        try:
            w = ", ".join(f"{n}={x:.3g}" for n, x in zip(self.names, self.weights))
            return f"arrowload.Mixture({len(self.names)} components: {w}; stopping={self.stopping!r}, seed={self.seed})"
        except Exception:  # noqa: BLE001 - a display never raises
            return "arrowload.Mixture(<unavailable>)"

    def _repr_html_(self) -> str:
        from ..display import esc, fmt_bytes, fmt_int, html_box, html_table
        try:
            rows = [(r["name"], fmt_int(r["rows"]), f"{r['weight']:.4f}", f"{r['passes']:.3f}", r["files"],
                     fmt_bytes(r["bytes"]) if r["bytes"] is not None else "?") for r in self.component_rows()]
            body = html_table(("component", "rows", "weight", "passes / epoch", "files", "bytes read"), rows)
        except Exception as exc:  # noqa: BLE001 - a display never raises
            body = f"<p>unavailable: {esc(exc)}</p>"
        return html_box("arrowload.Mixture", esc(f"stopping={self.stopping}, seed={self.seed}"), body)


def mix(components: Mapping[str, Any], weights: Any = None, temperature: float | None = None, seed: int = 0,
        stopping: str = "first_exhausted", *, cache_dir: str | None = None) -> Mixture:
    """Mix Datasets at set proportions.

    ``components``: ``{name: Dataset}`` with the same output schema (filters or ``al.sql``
    queries over one lake or several). ``weights``: a dict ``{name: weight}``, a list in
    component order, or a Dataset of ``(component, weight)`` rows (``al.sql("SELECT src AS
    component, count(*) AS weight FROM t GROUP BY src", t=ds)``); normalized. Default: equal.
    ``temperature=T``: weights proportional to ``size ** (1 / T)`` (exact sizes, cached,
    reading only the filters' columns). ``stopping``: ``"first_exhausted"`` (the epoch ends
    when a component's pass would run out), ``"all_exhausted"`` (components that run out
    start a new pass, counted, until every component finished one), ``"cycle"`` (never
    ends; ``loader(steps=N)``). Rows several components select are drawn in each.

    >>> import pyarrow as pa, arrowload as al
    >>> ds = al.dataset(pa.table({"src": ["a"] * 60 + ["b"] * 40, "x": list(range(100))}))
    >>> m = al.mix({"a": ds.filter("src = 'a'"), "b": ds.filter("src = 'b'")}, weights={"a": 3, "b": 1})
    >>> batch = next(iter(m.loader(8, shuffle=True)))
    >>> sorted(batch["src"])
    ['a', 'a', 'a', 'a', 'a', 'a', 'b', 'b']
    """
    return Mixture(components, weights, temperature, seed, stopping, cache_dir)


__all__ = ["Mixture", "component_size", "mix"]
