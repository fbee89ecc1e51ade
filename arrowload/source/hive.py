"""Hive partition folders (``key=value/``) become typed columns."""

from __future__ import annotations

import datetime as dt
import re
import urllib.parse
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import SchemaMismatchError

NULL_VALUE = "__HIVE_DEFAULT_PARTITION__"
# DuckDB's hive typing: "-7" is BIGINT, but "+7" and "007" (a zip code) stay VARCHAR.
_INT = re.compile(r"^(-?[1-9]\d{0,17}|-?0|-\d{1,18})$")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def parse_partition(base: str, path: str) -> list[tuple[str, str | None]]:
    """``key=value`` folders between ``base`` and the file, outermost first."""
    rel = path[len(base):].lstrip("/") if path.startswith(base) else path
    out = []
    for part in rel.split("/")[:-1]:
        if "=" in part:
            key, value = part.split("=", 1)
            value = urllib.parse.unquote(value)
            out.append((urllib.parse.unquote(key), None if value in (NULL_VALUE, "") else value))
    return out


def _infer(values: Sequence[str]) -> pa.DataType:
    if values and all(_INT.match(v) for v in values):
        return pa.int64()
    if values and all(_DATE.match(v) for v in values):
        try:
            for v in values:
                dt.date.fromisoformat(v)
            return pa.date32()
        except ValueError:
            pass
    return pa.string()  # DuckDB keeps "1.5" VARCHAR too


def _convert(value: str | None, typ: pa.DataType):
    if value is None:
        return None
    if pa.types.is_integer(typ):
        return int(value)
    if pa.types.is_floating(typ):
        return float(value)
    if pa.types.is_date(typ):
        return dt.date.fromisoformat(value)
    return pa.scalar(value).cast(typ).as_py()


def discover_partitions(base: str, paths: Sequence[str],
                        types: pa.Schema | None = None) -> tuple[pa.Schema, list[dict]]:
    """Partition schema (types inferred like DuckDB: integers -> int64, ISO dates -> date32,
    else string; or given by ``types``) and each file's values.

    Every file must carry the same keys in the same order, else the lake is ambiguous.
    """
    parsed = [parse_partition(base, p) for p in paths]
    if not any(parsed):
        return pa.schema([]), [{} for _ in paths]
    keys = [k for k, _ in parsed[0]]
    for path, parts in zip(paths, parsed):
        if [k for k, _ in parts] != keys:
            raise SchemaMismatchError(
                f"hive partition folders differ: {paths[0]!r} has keys {keys} but {path!r} has "
                f"{[k for k, _ in parts]}; point arrowload at one partitioned table or pass "
                "partitioning=False")
    fields = []
    for i, key in enumerate(keys):
        if types is not None and key in types.names:
            typ = types.field(key).type
        else:
            typ = _infer([parts[i][1] for parts in parsed if parts[i][1] is not None])
        fields.append(pa.field(key, typ))
    schema = pa.schema(fields)
    values = [{k: _convert(v, schema.field(k).type) for k, v in parts} for parts in parsed]
    return schema, values


def partition_expression(schema: pa.Schema, values: dict) -> pc.Expression | None:
    """The guarantee a file's folders give: ``key = value`` for each key (or ``key IS NULL``)."""
    expr = None
    for f in schema:
        v = values.get(f.name)
        term = pc.field(f.name).is_null() if v is None else pc.field(f.name) == pa.scalar(v, f.type)
        expr = term if expr is None else expr & term
    return expr
