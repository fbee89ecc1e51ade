"""``LoaderOptions``: everything that shapes a Loader, in one frozen, checked object.

``al.LoaderOptions`` is public: build it once, keep it beside a training config, and pass
it as ``Dataset.loader(options=...)``. Keyword arguments given to ``Dataset.loader``
next to ``options=`` replace those fields (``ds.loader(options=base, rank=r)``), so a
shared base is specialized per call; a keyword left out keeps the field of ``options``
(or, without ``options``, ``LoaderOptions``'s default). ``batch_size`` comes from the
positional argument or from ``options``; one of them must give it.

>>> import arrowload as al
>>> base = al.LoaderOptions(batch_size=1024, shuffle="block", seed=7)
>>> base.shuffle, base.io_threads
(<ShuffleKind.BLOCK: 'block'>, None)
>>> resolve_options(None, base, {"seed": 8}).seed
8
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ArgumentTypeError, InvalidArgumentError
from ..options import usable_cores
from . import arguments as _arguments


class _Default:
    """A ``Dataset.loader`` keyword not given: the field of ``options=``, else the default
    of :class:`LoaderOptions`."""

    _instance = None

    def __new__(cls) -> _Default:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "DEFAULT"

    def __reduce__(self):
        return (_Default, ())


DEFAULT: Any = _Default()


@dataclass(frozen=True)
class LoaderOptions:
    """Everything that shapes a Loader. See ``Dataset.loader`` for the meaning of each.

    Every field is checked (and integers normalized to ``int``) when the object is built,
    so a bad value fails here, never at the first batch. ``shuffle`` is normalized to a
    :class:`~arrowload.order.ShuffleKind`, or ``"auto"`` (``True``: the best kind the
    source allows). ``io_threads=None`` sizes the reader threads to the machine (never more
    busy readers than the cores this process may run on, autotuned under ``prefetch``); an
    integer is the most reader threads the loader may use."""

    batch_size: int
    shuffle: Any = False
    seed: int = 0
    drop_last: bool = False
    rank: int | None = None
    world_size: int | None = None
    output: str = "numpy"
    device: Any = None
    prefetch: int = 256 << 20
    io_threads: int | None = None
    shuffle_window: int = 8
    transform: Callable | None = None
    pad_lists: bool | tuple[str, ...] = False
    pad_value: Any = 0
    pad_to: int | None = None
    fill_null: Mapping[str, Any] | None = None
    cache_dir: str | None = None
    memory_budget: int | None = None
    stack: Mapping[str, Any] | None = None
    devices: tuple | None = None
    sharding: Any = None
    executor: str = "thread"

    def __post_init__(self) -> None:
        """Every argument checked (and integers normalized to ``int``) now, so a bad value
        fails at ``Dataset.loader(...)``, never at the first batch; see ``arguments``."""
        from ..convert.options import OUTPUTS
        a = _arguments
        put = object.__setattr__.__get__(self)  # frozen: normalize in place, once
        put("batch_size", a.positive_int("batch_size", self.batch_size, "1024"))
        kind = a.shuffle_kind(self.shuffle)
        put("shuffle", "auto" if kind is None else kind)  # stable: checking it again keeps it
        put("seed", a.integer("seed", self.seed, low=0, high=a.MAX_SEED,
                              what="an integer in 0 .. 2**64 - 1", example="0"))
        put("drop_last", a.boolean("drop_last", self.drop_last))
        if self.world_size is not None:
            put("world_size", a.integer("world_size", self.world_size, low=1,
                                        what="a positive integer (the number of ranks)"))
        if self.rank is not None:
            put("rank", a.integer("rank", self.rank, low=0, what="an integer >= 0 (this process's rank)"))
        if self.rank is not None and self.world_size is not None:
            a.rank_and_world(self.rank, self.world_size)
        put("output", a.output(self.output, OUTPUTS))
        put("prefetch", a.positive_int("prefetch", self.prefetch, "256 << 20 (bytes held in flight)"))
        put("io_threads", a.optional_int("io_threads", self.io_threads, low=1, high=1024,
                                         what="None (sized to the machine) or an integer in 1 .. 1024 "
                                              "(the most reader threads)", example="2"))
        put("shuffle_window", a.positive_int("shuffle_window", self.shuffle_window, "8 (row groups)"))
        a.optional_callable("transform", self.transform)
        put("pad_to", a.optional_int("pad_to", self.pad_to, low=0, what="None or an integer >= 0 "
                                     "(the padded length)", example="128"))
        put("cache_dir", a.optional_path("cache_dir", self.cache_dir))
        put("memory_budget", a.optional_int("memory_budget", self.memory_budget, low=0,
                                            what="None or an integer >= 0 (bytes)", example="8 << 30"))
        a.pad_lists(self.pad_lists)
        if self.output == "arrow" and (self.pad_lists or self.pad_to is not None):
            raise InvalidArgumentError(
                f"{'pad_lists' if self.pad_lists else 'pad_to'}= pads list columns into arrays (for the "
                "numpy, torch and jax outputs); output='arrow' hands out Arrow lists as they are, so it "
                "would be ignored: drop it, or choose another output",
                "pad_lists" if self.pad_lists else "pad_to")
        a.scalar("pad_value", self.pad_value)
        a.fill_null(self.fill_null)
        a.stack_spec(self.stack)
        put("devices", a.device_list(self.devices))
        put("executor", a.executor(self.executor))

    @property
    def auto_shuffle(self) -> bool:
        """``shuffle=True`` / ``"auto"``: the loader picks the kind its source allows."""
        return self.shuffle == "auto"


def reader_bound(io_threads: int | None) -> int:
    """The most reader threads: ``io_threads`` when given, else the usable cores."""
    return io_threads if io_threads is not None else usable_cores()


def resolve_options(batch_size: Any, options: Any, keywords: Mapping[str, Any]) -> LoaderOptions:
    """``Dataset.loader``'s arguments as one :class:`LoaderOptions`: ``options`` (or the
    defaults) with every keyword that was given (not ``DEFAULT``) replacing its field, and
    ``batch_size`` (when not None) replacing ``options.batch_size``."""
    given = {k: v for k, v in keywords.items() if v is not DEFAULT}
    if batch_size is not None:
        given["batch_size"] = batch_size
    if options is None:
        if "batch_size" not in given:
            raise ArgumentTypeError("loader() needs a batch_size: pass it first, e.g. ds.loader(1024), or in "
                                    "options=al.LoaderOptions(batch_size=1024)", "batch_size")
        return LoaderOptions(**given)
    if not isinstance(options, LoaderOptions):
        raise ArgumentTypeError(f"options={options!r} ({type(options).__name__}): options must be an "
                                "al.LoaderOptions, e.g. options=al.LoaderOptions(batch_size=1024, "
                                "shuffle=True)", "options")
    return dataclasses.replace(options, **given) if given else options


__all__ = ["DEFAULT", "LoaderOptions", "reader_bound", "resolve_options", "usable_cores"]
