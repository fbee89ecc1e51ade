"""Hive partition folders (``key=value/``) become typed columns."""

from __future__ import annotations

import datetime as dt
import re
import urllib.parse
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import InvalidArgumentError, SchemaMismatchError

NULL_VALUE = "__HIVE_DEFAULT_PARTITION__"
# DuckDB's hive typing: each folder value is the first of DATE, TIMESTAMP, BIGINT its text
# casts to (DuckDB's own casts: "2024-1-1", "epoch", "0x1F", " 1"), else VARCHAR; a key
# whose values do not all agree is VARCHAR. A BIGINT written with a plus sign or leading
# zeros ("+7", "007": a zip code) stays VARCHAR. The text is typed as it stands in the path
# ("%31" is VARCHAR "1"); "NULL" (any case) is typed as a missing value.
_CANDIDATES = (("DATE", pa.date32()), ("TIMESTAMP", pa.timestamp("us")), ("BIGINT", pa.int64()))
# DuckDB types a folder's BIGINT by a strict cast: digits (decimal, 0x hex, 0b binary) with
# an optional minus, no fraction, exponent or "_"
_BIGINT = re.compile(r"^\s*(-\d+|0|[1-9]\d*|-?0[xX][0-9a-fA-F]+|-?0[bB][01]+)\s*$")
# and a DATE by a strict one: no time of day
_TIME = re.compile(r"[T ]\d|:")


def hive_base(base: str) -> str:
    """``base`` above the ``key=value`` folders it ends in: where a lake's partition folders
    start when the dataset names one partition's folder or files (``lake/n=1/``,
    ``lake/n=1/d=x/f.parquet``). Its partition columns are then the same as the whole
    lake's, as DuckDB gives them, whichever part of it the paths name."""
    parts = base.rstrip("/").split("/")
    while len(parts) > 1 and "=" in parts[-1] and not parts[-1].startswith("="):
        parts.pop()
    return "/".join(parts) if base.rstrip("/") else base


def parse_partition(base: str, path: str) -> list[tuple[str, str | None]]:
    """``key=value`` folders between ``base`` and the file, outermost first; values as
    they stand in the path (still URL-encoded), the default partition None."""
    rel = path[len(base):].lstrip("/") if path.startswith(base) else path
    out = []
    for part in rel.split("/")[:-1]:
        if "=" in part:
            key, value = part.split("=", 1)
            out.append((urllib.parse.unquote(key), None if value == NULL_VALUE else value))
    return out


# the words DuckDB casts to a DATE / TIMESTAMP without a digit
_SPECIAL = {"epoch", "infinity", "-infinity", "inf", "-inf"}
_PLAIN_INT = re.compile(r"^-?\d+$")
_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def _plain(v: str) -> tuple[str, object] | None:
    """The kind and value DuckDB gives the folder text ``v`` where Python can tell alone
    (decimal integers, ISO dates, text without a digit: nearly every lake), else None (a
    DuckDB connection costs about 0.4 s on first use)."""
    if _PLAIN_INT.match(v):
        n = int(v)
        ok = _BIGINT.match(v) is not None and -(1 << 63) <= n < (1 << 63)
        return ("BIGINT", n) if ok else ("VARCHAR", None)
    if _ISO_DATE.match(v):
        try:
            return "DATE", dt.date.fromisoformat(v)
        except ValueError:
            return "VARCHAR", None  # "2024-02-30": no DATE, TIMESTAMP or BIGINT either
    if not any(c.isdigit() for c in v) and v.strip().lower() not in _SPECIAL:
        return "VARCHAR", None
    return None


def _duckdb_kinds(present: Sequence[str]) -> dict[str, tuple[str, object]]:
    """DuckDB's kind and value for each folder text (its TRY_CAST to DATE, TIMESTAMP and
    BIGINT, made strict as its hive typing is)."""
    import duckdb
    casts: dict[str, list] = {}
    with duckdb.connect() as con:
        texts = pa.table({"v": pa.array(present, pa.string())})  # noqa: F841 - DuckDB finds it by name
        for sql, _ in _CANDIDATES:
            column = con.sql(f"SELECT TRY_CAST(v AS {sql}) AS c FROM texts").to_arrow_table().column("c")
            try:
                casts[sql] = column.to_pylist()
            except (OverflowError, ValueError):  # "infinity" as a DATE: no Python date holds it
                casts[sql] = [None] * len(present)
    out = {}
    for i, v in enumerate(present):
        kind = next((sql for sql, _ in _CANDIDATES if casts[sql][i] is not None and
                     (sql != "BIGINT" or _BIGINT.match(v)) and (sql != "DATE" or not _TIME.search(v.strip()))),
                    "VARCHAR")
        out[v] = (kind, casts[kind][i] if kind != "VARCHAR" else None)
    return out


def _typed(raw: Sequence[str | None], given: pa.DataType | None) -> tuple[pa.DataType, list]:
    """One key's type (``given``, or DuckDB's hive typing of its folder values) and its
    values as that type."""
    present = sorted({v for v in raw if v is not None and v.upper() != "NULL"})
    if given is None:
        known = {v: _plain(v) for v in present}
        if any(k is None for k in known.values()):
            known = _duckdb_kinds(present)
        kinds = {kind for kind, _ in known.values()}
        kind = kinds.pop() if len(kinds) == 1 else "VARCHAR"
        if kind != "VARCHAR":  # "NULL" (any case) is a missing value here
            return dict(_CANDIDATES)[kind], [None if v is None or v not in known else known[v][1] for v in raw]
        given = pa.string()
    if pa.types.is_string(given) or pa.types.is_large_string(given):
        return given, [None if v is None else urllib.parse.unquote(v) for v in raw]
    values = pa.array([None if v is None else urllib.parse.unquote(v) for v in raw], pa.string())
    return given, values.cast(given).to_pylist()


def discover_partitions(base: str, paths: Sequence[str],
                        types: pa.Schema | None = None) -> tuple[pa.Schema, list[dict]]:
    """Partition schema (types inferred like DuckDB: integers -> int64, ISO dates -> date32,
    else string; or given by ``types``) and each file's values.

    Every file must carry the same keys (in any order, as DuckDB allows; the columns come
    in the first file's order), else the lake is ambiguous.
    """
    parsed = [parse_partition(base, p) for p in paths]
    keys = [k for k, _ in parsed[0]] if parsed else []
    unknown = [n for n in (types.names if types is not None else ()) if n not in keys]
    if unknown and paths:
        raise InvalidArgumentError(
            f"partitioning= names {', '.join(map(repr, unknown))}, which no hive folder of the files has "
            f"(their keys: {keys or 'none'}, e.g. {paths[0]!r}); name the keys of the `key=value/` folders",
            "partitioning")
    if not any(parsed):
        return pa.schema([]), [{} for _ in paths]
    for path, parts in zip(paths, parsed):
        got = [k for k, _ in parts]
        if got != keys and (sorted(got) != sorted(keys) or len(set(got)) != len(got)):
            raise SchemaMismatchError(
                f"hive partition folders differ: {paths[0]!r} has keys {keys} but {path!r} has "
                f"{got}; point arrowload at one partitioned table or pass partitioning=False")
    by_key = [dict(parts) for parts in parsed]
    fields, columns = [], []
    for key in keys:
        given = types.field(key).type if types is not None and key in types.names else None
        typ, values = _typed([found[key] for found in by_key], given)
        fields.append(pa.field(key, typ))
        columns.append(values)
    schema = pa.schema(fields)
    values = [{k: columns[j][i] for j, k in enumerate(keys)} for i in range(len(parsed))]
    return schema, values


def partition_expression(schema: pa.Schema, values: dict) -> pc.Expression | None:
    """The guarantee a file's folders give: ``key = value`` for each key (or ``key IS NULL``)."""
    expr = None
    for f in schema:
        v = values.get(f.name)
        term = pc.field(f.name).is_null() if v is None else pc.field(f.name) == pa.scalar(v, f.type)
        expr = term if expr is None else expr & term
    return expr
