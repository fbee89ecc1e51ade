"""Reading the loader's cache documents (``formats/selection_index/v1``,
``formats/ra_cache/v1``) field by field.

Each reader takes the parsed JSON and where it came from, and returns a frozen value or
raises a typed error naming the file and the field: :class:`~arrowload.errors.UnsupportedError`
for another format version, :class:`~arrowload.errors.CorruptFileError` for anything else
out of the spec. The loader treats either as "rebuild the cache": a damaged or foreign
cache is never trusted, and never fatal. Whether a valid document *matches* the loader
(same snapshot, plan, units) is the caller's question.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..errors import CorruptFileError
from ..jsondoc import check_header

SELECTION_FORMAT = "arrowload.selection_index"
RA_FORMAT = "arrowload.ra_cache"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class SelectionIndex:
    """Exact row counts per unit after a filter, on one snapshot."""

    snapshot: str
    plan: str
    units: tuple[int, ...]
    counts: tuple[int, ...]


@dataclass(frozen=True)
class RaManifest:
    """The manifest of a random-access Arrow IPC cache."""

    snapshot: str
    plan: str
    num_rows: int
    chunk_rows: int
    schema: str
    reusable: bool


def load_json(path: str) -> Any:
    """A JSON document from ``path``; ``CorruptFileError`` when it does not parse."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # (nested past the parser's depth)
        raise CorruptFileError(f"{path}: not a JSON document ({type(exc).__name__}: {exc}); delete it "
                               "and it is rebuilt", path) from exc


def read_selection_index(doc: Any, where: str) -> SelectionIndex:
    _header(doc, where, SELECTION_FORMAT, ("snapshot", "plan", "units", "counts"))
    units = _int_list(doc, "units", where)
    counts = _int_list(doc, "counts", where)
    if len(units) != len(counts):
        raise CorruptFileError(f"{where}: counts has {len(counts)} entries for {len(units)} units; "
                               "delete the file and it is rebuilt", where)
    return SelectionIndex(_string(doc, "snapshot", where, nonempty=True), _string(doc, "plan", where),
                          units, counts)


def read_ra_manifest(doc: Any, where: str) -> RaManifest:
    _header(doc, where, RA_FORMAT, ("snapshot", "plan", "num_rows", "chunk_rows", "schema", "reusable"))
    num_rows = _int(doc, "num_rows", where, low=0)
    chunk_rows = _int(doc, "chunk_rows", where, low=1)
    if type(doc["reusable"]) is not bool:
        raise CorruptFileError(f"{where}: reusable is {doc['reusable']!r}, not true or false", where)
    return RaManifest(_string(doc, "snapshot", where, nonempty=True), _string(doc, "plan", where),
                      num_rows, chunk_rows, _string(doc, "schema", where), doc["reusable"])


def _header(doc: Any, where: str, fmt: str, fields: tuple[str, ...]) -> None:
    check_header(doc, where, fmt, FORMAT_VERSION, fields, "the cache is rebuilt")


def _string(doc: dict, key: str, where: str, nonempty: bool = False) -> str:
    value = doc[key]
    if type(value) is not str or (nonempty and not value):
        raise CorruptFileError(f"{where}: {key} is {value!r}, not a{' non-empty' if nonempty else ''} "
                               "string", where)
    return value


def _int(doc: dict, key: str, where: str, low: int) -> int:
    value = doc[key]
    if type(value) is not int or value < low:
        raise CorruptFileError(f"{where}: {key} is {value!r}, not an integer >= {low}", where)
    return value


def _int_list(doc: dict, key: str, where: str) -> tuple[int, ...]:
    value = doc[key]
    if not isinstance(value, list) or not all(type(v) is int and v >= 0 for v in value):
        bad = value if not isinstance(value, list) else \
            next(v for v in value if type(v) is not int or v < 0)
        raise CorruptFileError(f"{where}: {key} must be a list of integers >= 0 (found {bad!r})", where)
    return tuple(value)
