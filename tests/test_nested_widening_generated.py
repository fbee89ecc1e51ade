"""Generated lakes whose files disagree on a column's NESTED type, read as one: arrowload
against DuckDB's ``read_parquet(..., union_by_name=true)`` over the same files.

Each example draws a lake-wide skeleton for a column ``n`` -- a list, a map or a struct
whose children are scalars or one more level of list / map / struct (list<struct>,
struct<list>, map<string, struct>, list<map>, ...) -- and writes 1-4 Parquet files, each
with its own concrete type of that skeleton:

* lists as ``list`` / ``large_list`` / ``fixed_size_list`` (size 1-3, sometimes another
  size in another file), their element field sometimes non-nullable;
* maps with string or integer keys (their widths per file), items of any family, the item
  field sometimes non-nullable;
* structs with their fields in another order or another (non-empty) subset per file,
  fields sometimes non-nullable;
* leaves of the scalar families of ``test_widening_generated``: integers of any width and
  signedness, integers and floats, string / large_string (string_view now and then),
  decimals of several precisions and scales, timestamps of any unit, naive or zoned;
  rarely a leaf of another family or the null type (refusals, on purpose).

Values: nulls at every level a field allows, empty lists and maps, extreme integers, NaN,
dates outside the nanosecond range. Files are written by pyarrow (sometimes
``store_schema=False``, sometimes small row groups), polars or DuckDB (where they take the
table; else pyarrow).

Where DuckDB reads the lake, arrowload must give its values (``to_arrow``, a loader epoch
with ``output="arrow"``, a filter on ``id``, and the ``count()`` of a filter on a nested
element) under the drawn decoder -- or refuse with ``SchemaMismatchError`` on every read
path; the refusals are counted (``event``) and, with ``$NESTED_REFUSALS`` set to a path,
logged as JSON lines. Integers beside float32 (no float64) are read by DuckDB as FLOAT and
by arrowload as double: at such leaves both sides are compared rounded to float32. Struct
fields must come in DuckDB's order (first seen) at every depth.

A refusal is accepted where ``_documented_refusal`` names a documented reason (types of
different families, a signed integer beside uint64, naive beside zoned timestamps, decimals
no decimal128 holds); any other fails the test. ``$NESTED_UNEXPLAINED_LOG_ONLY`` and
``$NESTED_ORDER_LOG_ONLY`` turn those two checks into events (to survey a run);
``$NESTED_WIDENING_EXAMPLES`` sets the number of examples (default 100).
"""

from __future__ import annotations

import json
import math
import os
import struct
import tempfile
from decimal import Decimal

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pyarrow.types as pat
from hypothesis import HealthCheck, Phase, assume, event, given, settings
from hypothesis import strategies as st

import arrowload as al
from _support import PER_SECOND, int_range, pinned_decoder, timestamp_ticks

INTS = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()]
TEXTS = [pa.string(), pa.large_string(), pa.string(), pa.large_string(), pa.string_view()]
ZONES = ["UTC", "America/New_York", "Asia/Tokyo"]
UNITS = ["s", "ms", "us", "ns"]
FAMILIES = ["int", "float", "text", "dec", "ts"]


# ---------------------------------------------------------------------------
# drawing the skeleton (lake-wide) and each file's type of it

def _leaf():
    return st.tuples(st.just("leaf"), st.sampled_from(FAMILIES))


def _container(child):
    names = st.lists(st.sampled_from("abc"), min_size=1, max_size=3, unique=True)
    return st.one_of(
        st.tuples(st.just("list"), child, st.integers(1, 3)),
        st.tuples(st.just("map"), st.sampled_from(["text", "int"]), child),
        names.flatmap(lambda ns: st.tuples(st.just("struct"),
                                           st.tuples(*[st.tuples(st.just(n), child) for n in ns]))),
    )


def skeletons():
    """A list, map or struct of scalars, or of one more level of them."""
    return _container(st.one_of(_leaf(), _leaf(), _container(_leaf())))


@st.composite
def _file_type(draw, node, lake: dict) -> pa.DataType:
    """One file's concrete type of the skeleton ``node``."""
    kind = node[0]
    if kind == "leaf":
        family = node[1]
        if draw(st.integers(0, 30)) == 0:
            return pa.null()
        if draw(st.integers(0, lake["clash"])) == 0:  # a leaf of another family, rarely
            family = draw(st.sampled_from([f for f in FAMILIES if f != family]))
        ints = st.sampled_from(INTS + [pa.int64(), pa.uint64()])
        if family == "int":
            return draw(ints)
        if family == "float":
            return draw(st.one_of(ints, st.sampled_from([pa.float32(), pa.float64()])))
        if family == "text":
            return draw(st.sampled_from(TEXTS))
        if family == "dec":
            p = draw(st.sampled_from([1, 4, 9, 10, 18, 19, 28, 38]))
            return pa.decimal128(p, draw(st.integers(0, min(p, 6))))
        zoned = lake["zoned"] if lake["zoned"] is not None else draw(st.booleans())
        return pa.timestamp(draw(st.sampled_from(UNITS)), draw(st.sampled_from(ZONES)) if zoned else None)
    if kind == "list":
        value = _field("element", draw(_file_type(node[1], lake)), draw(_nullable()))
        shape = draw(st.sampled_from(["list", "large", "fixed", "fixed", "fixed-other"]))
        if shape == "list":
            return pa.list_(value)
        if shape == "large":
            return pa.large_list(value)
        return pa.list_(value, node[2] if shape == "fixed" else draw(st.integers(1, 3)))
    if kind == "map":
        key = (draw(st.sampled_from([pa.string(), pa.large_string()])) if node[1] == "text"
               else draw(st.sampled_from([pa.int8(), pa.int32(), pa.int64(), pa.uint16()])))
        return pa.map_(pa.field("key", key, False), _field("value", draw(_file_type(node[2], lake)),
                                                           draw(_nullable())))
    fields = list(node[1])
    keep = draw(st.lists(st.sampled_from(range(len(fields))), min_size=1, max_size=len(fields), unique=True))
    return pa.struct([_field(fields[k][0], draw(_file_type(fields[k][1], lake)), draw(_nullable()))
                      for k in keep])


def _nullable():
    return st.sampled_from([True, True, True, True, False])


def _field(name: str, t: pa.DataType, nullable: bool) -> pa.Field:
    return pa.field(name, t, nullable or pat.is_null(t))  # a null-typed field is nullable


# ---------------------------------------------------------------------------
# drawing values

def _values(t: pa.DataType, wide_dates: bool, nullable: bool = True) -> st.SearchStrategy:
    """Python values of type ``t`` (nulls among them where ``nullable``)."""
    if pat.is_null(t):
        return st.none()
    if pat.is_integer(t):
        lo, hi = int_range(t)
        inner = st.one_of(st.integers(lo, hi), st.sampled_from([lo, hi]))
    elif pat.is_floating(t):
        inner = st.floats(width=t.bit_width)
    elif pat.is_string(t) or pat.is_large_string(t) or str(t) == "string_view":
        inner = st.text(st.characters(codec="utf-8"), max_size=4)
    elif pat.is_decimal(t):
        top = 10 ** t.precision - 1
        inner = st.builds(lambda n: Decimal(f"{n}e-{t.scale}"),  # exact: no context rounding
                          st.one_of(st.integers(-top, top), st.sampled_from([-top, top])))
    elif pat.is_fixed_size_list(t):
        inner = st.lists(_values(t.value_type, wide_dates, t.value_field.nullable),
                         min_size=t.list_size, max_size=t.list_size)
    elif pat.is_list(t) or pat.is_large_list(t):
        inner = st.lists(_values(t.value_type, wide_dates, t.value_field.nullable), max_size=3)
    elif pat.is_map(t):
        keys = (st.text(st.sampled_from("kxyz"), min_size=1, max_size=2) if pat.is_string(t.key_type)
                or pat.is_large_string(t.key_type) else st.integers(*int_range(t.key_type)).map(lambda k: k % 5))
        inner = st.lists(st.tuples(keys, _values(t.item_type, wide_dates, t.item_field.nullable)),
                         max_size=3, unique_by=lambda kv: kv[0])
    elif pat.is_struct(t):
        inner = st.fixed_dictionaries({f.name: _values(f.type, wide_dates, f.nullable) for f in t})
    else:
        assert pat.is_timestamp(t), t
        inner = timestamp_ticks(t.unit, wide_dates)
    return st.one_of(st.none(), inner) if nullable else inner


@st.composite
def lakes(draw):
    """(skeleton, [(writer, row_group_size, pyarrow.Table)])."""
    skeleton = draw(skeletons())
    lake = {"clash": draw(st.sampled_from([12, 40, 40, 1000])),
            "zoned": draw(st.sampled_from([True, False, True, False, None]))}
    wide_dates = draw(st.booleans())
    files, next_id = [], 0
    for _ in range(draw(st.integers(1, 4))):
        t = draw(_file_type(skeleton, lake))
        rows = draw(st.sampled_from([0, 1, 2, 3, 5]))
        columns = {"id": pa.array(range(next_id, next_id + rows), pa.int64()),
                   "n": pa.array(draw(st.lists(_values(t, wide_dates), min_size=rows, max_size=rows)), t)}
        next_id += rows + 100
        writer = draw(st.sampled_from(["pyarrow", "pyarrow", "pyarrow-bare", "polars", "duckdb"]))
        files.append((writer, draw(st.sampled_from([None, 2])), pa.table(columns)))
    return skeleton, files


def _no_view(t: pa.DataType) -> pa.DataType:
    """``t`` with string_view as string, at any depth."""
    if str(t) == "string_view":
        return pa.string()
    if pat.is_struct(t):
        return pa.struct([f.with_type(_no_view(f.type)) for f in t])
    if pat.is_fixed_size_list(t):
        return pa.list_(t.value_field.with_type(_no_view(t.value_type)), t.list_size)
    if pat.is_list(t):
        return pa.list_(t.value_field.with_type(_no_view(t.value_type)))
    if pat.is_large_list(t):
        return pa.large_list(t.value_field.with_type(_no_view(t.value_type)))
    if pat.is_map(t):
        return pa.map_(t.key_field.with_type(_no_view(t.key_type)), t.item_field.with_type(_no_view(t.item_type)))
    return t


def _write(folder: str, files) -> list[tuple[str, str]]:
    """Paths and the writer that wrote each (a writer that refuses the table: pyarrow)."""
    out = []
    for k, (writer, row_group_size, table) in enumerate(files):
        path = os.path.join(folder, f"part-{k}.parquet")
        if writer == "polars":
            import polars as pl
            try:
                pl.from_arrow(table).write_parquet(path)
                out.append((path, writer))
                continue
            except Exception:  # noqa: BLE001 - a type polars does not take (maps, timestamp[s], ...)
                pass
        if writer == "duckdb":
            try:
                with duckdb.connect() as con:
                    con.execute("SET TimeZone = 'UTC'")
                    con.register("t", table)
                    con.execute(f"COPY (SELECT * FROM t) TO '{path}' (FORMAT parquet)")
                pq.read_table(path)  # (a list of null arrays DuckDB writes, pyarrow cannot read)
                out.append((path, writer))
                continue
            except Exception:  # noqa: BLE001 - a type DuckDB does not take
                if os.path.exists(path):
                    os.remove(path)
        try:
            pq.write_table(table, path, row_group_size=row_group_size, store_schema=writer != "pyarrow-bare")
        except pa.ArrowNotImplementedError:  # pyarrow cannot slice a string_view inside a struct
            try:
                pq.write_table(table, path, store_schema=writer != "pyarrow-bare")
            except pa.ArrowNotImplementedError:  # nor a list of them: as strings
                n = table.column("n")
                table = table.set_column(1, "n", pa.array(n.to_pylist(), _no_view(n.type)))
                pq.write_table(table, path, store_schema=writer != "pyarrow-bare")
        out.append((path, "pyarrow" if writer in ("polars", "duckdb") else writer))
    return out


# ---------------------------------------------------------------------------
# comparing values

def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def _float32_paths(t: pa.DataType, path=()) -> set:
    """Leaf paths where ``t`` (DuckDB's type) holds float32."""
    if pat.is_float32(t):
        return {path}
    if pat.is_struct(t):
        return set().union(*[_float32_paths(f.type, path + (f.name,)) for f in t])
    if pat.is_list(t) or pat.is_large_list(t) or pat.is_fixed_size_list(t):
        return _float32_paths(t.value_type, path + ("[]",))
    if pat.is_map(t):
        return _float32_paths(t.key_type, path + ("key",)) | _float32_paths(t.item_type, path + ("value",))
    return set()


def _py(arr: pa.Array, f32: set, path=()) -> list:
    """Values, not types: timestamps as integer nanoseconds since the epoch (UTC), NaN as a
    marker, floats at ``f32`` paths rounded to float32, maps as lists of (key, item)."""
    t = arr.type
    if pat.is_dictionary(t):
        arr, t = arr.dictionary_decode(), t.value_type
    valid = arr.is_valid().to_pylist()
    if pat.is_timestamp(t):
        scale = 1_000_000_000 // PER_SECOND[t.unit]
        return [None if v is None else v * scale for v in arr.cast(pa.int64()).to_pylist()]
    if pat.is_floating(t) or (pat.is_integer(t) and path in f32):
        out = []
        for v in arr.to_pylist():
            if v is not None and path in f32:
                v = _f32(float(v))
            out.append("NaN" if isinstance(v, float) and math.isnan(v) else v)
        return out
    if pat.is_struct(t):
        cols = {f.name: _py(arr.field(k), f32, path + (f.name,)) for k, f in enumerate(t)}
        return [{n: c[i] for n, c in cols.items()} if valid[i] else None for i in range(len(arr))]
    if pat.is_fixed_size_list(t):
        k = t.list_size
        values = _py(arr.values, f32, path + ("[]",))
        return [values[(arr.offset + i) * k:(arr.offset + i + 1) * k] if valid[i] else None
                for i in range(len(arr))]
    if pat.is_map(t):
        entries = arr.values  # the whole child, offsets index into it
        keys = _py(entries.field(0), f32, path + ("key",))
        items = _py(entries.field(1), f32, path + ("value",))
        offs = arr.offsets.to_pylist()
        return [list(zip(keys[offs[i]:offs[i + 1]], items[offs[i]:offs[i + 1]], strict=True)) if valid[i] else None
                for i in range(len(arr))]
    if pat.is_list(t) or pat.is_large_list(t):
        values = _py(arr.values, f32, path + ("[]",))
        offs = arr.offsets.to_pylist()
        return [values[offs[i]:offs[i + 1]] if valid[i] else None for i in range(len(arr))]
    return arr.to_pylist()


def _names(t: pa.DataType):
    """The struct field names at every depth, in order (types left out)."""
    if pat.is_struct(t):
        return [(f.name, _names(f.type)) for f in t]
    if pat.is_list(t) or pat.is_large_list(t) or pat.is_fixed_size_list(t):
        return ["[]", _names(t.value_type)]
    if pat.is_map(t):
        return ["map", _names(t.key_type), _names(t.item_type)]
    return None


def _rows(table: pa.Table, f32: set) -> dict[int, object]:
    table = table.combine_chunks()
    ids = table.column("id").to_pylist()
    col = table.column("n")
    vals = _py(col.chunk(0) if col.num_chunks else pa.array([], col.type), f32)
    rows = dict(zip(ids, vals, strict=True))
    assert len(rows) == table.num_rows, "an id read twice"
    return rows


# ---------------------------------------------------------------------------
# why arrowload may refuse what DuckDB reads (merge_types: only safe widenings)

def _leaves(t: pa.DataType, path=(), out=None) -> dict:
    """Leaf types by path (struct fields by name, a list's or map's children by role)."""
    out = {} if out is None else out
    if pat.is_struct(t):
        for f in t:
            _leaves(f.type, path + (f.name,), out)
    elif pat.is_list(t) or pat.is_large_list(t) or pat.is_fixed_size_list(t):
        _leaves(t.value_type, path + ("[]",), out)
    elif pat.is_map(t):
        _leaves(t.key_type, path + ("key",), out)
        _leaves(t.item_type, path + ("value",), out)
    else:
        out.setdefault(path, []).append(t)
    return out


def _family(t: pa.DataType) -> str:
    if pat.is_integer(t) or pat.is_floating(t):
        return "number"
    if str(t) in {"string", "large_string", "string_view"}:
        return "text"
    if pat.is_timestamp(t):
        return "timestamp"
    if pat.is_decimal(t):
        return "decimal"
    return str(t)


def _documented_refusal(types: list[pa.DataType]) -> str:
    """The documented reason arrowload refuses these files' types, or UNEXPLAINED."""
    paths = {}
    for t in types:
        for path, ts in _leaves(t).items():
            paths.setdefault(path, []).extend(ts)
    shapes = {}
    for t in types:  # a leaf in one file, nested in another
        for path in _leaves(t):
            shapes.setdefault(path[:1], set()).add(len(path))
    for ts in paths.values():
        ts = [t for t in ts if not pat.is_null(t)]
        if len({_family(t) for t in ts}) > 1:
            return "types of different families"
        if pa.uint64() in ts and any(pat.is_signed_integer(t) for t in ts) and not any(pat.is_floating(t) for t in ts):
            return "a signed integer beside uint64 (DuckDB: HUGEINT)"
        if len({t.tz is None for t in ts if pat.is_timestamp(t)}) > 1:
            return "tz-naive beside tz-aware timestamps"
        decs = [t for t in ts if pat.is_decimal(t)]
        if decs and max(t.precision - t.scale for t in decs) + max(t.scale for t in decs) > 38:
            return "decimals no decimal128 holds"
    return "UNEXPLAINED"


# ---------------------------------------------------------------------------
# a filter on a nested element, in the dialect both sides read

def _element(t: pa.DataType, draw) -> tuple[str, pa.DataType] | None:
    """A path from ``n`` to a leaf of DuckDB's type ``t`` (``.field``, ``[1]``, ``['key']``)."""
    expr = "n"
    for _ in range(3):
        if pat.is_struct(t):
            f = t.field(draw(st.integers(0, t.num_fields - 1)))
            expr, t = f'{expr}."{f.name}"', f.type
        elif pat.is_list(t) or pat.is_large_list(t) or pat.is_fixed_size_list(t):
            expr, t = f"{expr}[{draw(st.integers(1, 2))}]", t.value_type
        elif pat.is_map(t):
            key = draw(st.sampled_from(["'k'", "'x'", "'kx'"] if pat.is_string(t.key_type) or
                                       pat.is_large_string(t.key_type) else ["0", "1", "3"]))
            expr, t = f"{expr}[{key}]", t.item_type
        else:
            return expr, t
    return (expr, t) if not pat.is_nested(t) else None


# ---------------------------------------------------------------------------
# the test

def _log(kind: str, **what) -> None:
    path = os.environ.get("NESTED_REFUSALS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"kind": kind, **what}, default=str) + "\n")


@settings(max_examples=int(os.environ.get("NESTED_WIDENING_EXAMPLES", "100")), deadline=None,
          phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(lake=lakes(), decoder=st.sampled_from([None, "pyarrow", "polars", "dataset"]),
       batch=st.integers(1, 9), data=st.data())
def test_generated_nested_lakes_read_as_duckdb_union_by_name_reads_them(lake, decoder, batch, data):
    skeleton, files = lake
    with tempfile.TemporaryDirectory(prefix="nwiden-") as folder, duckdb.connect() as con, pinned_decoder(decoder):
        con.execute("SET TimeZone = 'UTC'")
        root = os.path.join(folder, "lake")
        os.mkdir(root)
        written = _write(root, files)
        for p, _ in written:  # pyarrow cannot read back some files of nulls in fixed-size lists: not ours
            try:
                pq.read_table(p)
            except pa.ArrowInvalid:
                event("pyarrow cannot read back a file it wrote")
                assume(False)
        arrow_types = [pq.read_schema(p).field("n").type for p, _ in written]  # as written (polars, DuckDB pick theirs)
        types = [str(t) for t in arrow_types]
        scan = f"read_parquet('{root}/*.parquet', union_by_name=true)"
        try:
            got_duck = con.sql(f"SELECT * FROM {scan}").to_arrow_table()
        except duckdb.Error as exc:
            got_duck = exc
        ds = al.dataset(root)
        cache = os.path.join(folder, "cache")
        reads = {
            "to_arrow": lambda: ds.to_arrow(),
            "loader": lambda: pa.Table.from_batches(list(ds.loader(
                batch, shuffle=False, output="arrow", drop_last=False, cache_dir=cache)), schema=ds.schema),
            "filter id": lambda: ds.filter("id % 3 <> 1").to_arrow(),
        }
        got, refused = {}, {}
        for what, read in reads.items():
            try:
                got[what] = read()
            except al.SchemaMismatchError as exc:
                refused[what] = str(exc) + (f" [caused by {type(exc.__cause__).__name__}: {exc.__cause__}]"
                                            if exc.__cause__ is not None else "")
        assert not (got and refused), ("some read paths refuse, others read", refused, list(got), types)
        if isinstance(got_duck, Exception):
            event("DuckDB refuses" + (", arrowload too" if refused else ", arrowload reads"))
            if not refused:
                _log("duckdb-refuses-arrowload-reads", types=types, duckdb=str(got_duck)[:300],
                     schema=str(ds.schema.field("n").type))
            return
        duck_type = got_duck.schema.field("n").type
        if refused:
            why = _documented_refusal(arrow_types)
            event("arrowload refuses what DuckDB reads: " + why)
            _log("arrowload-refuses", why=why, types=types, duckdb_type=str(duck_type),
                 message=next(iter(refused.values()))[:400])
            assert why != "UNEXPLAINED" or os.environ.get("NESTED_UNEXPLAINED_LOG_ONLY"), (
                "arrowload refuses, for no documented reason, a lake DuckDB reads", types, str(duck_type), refused)
            return
        event("compared" + (" (types differ)" if len(set(types)) > 1 else ""))
        f32 = _float32_paths(duck_type)
        want = _rows(got_duck, f32)
        for what, table in got.items():
            assert table.column_names == ["id", "n"], (what, table.column_names)
            rows = _rows(table, f32)
            expect = want if what != "filter id" else {i: r for i, r in want.items() if i % 3 != 1}
            assert rows.keys() == expect.keys(), (what, sorted(rows), sorted(expect), types)
            for i, r in rows.items():
                assert r == expect[i], (what, i, r, expect[i], types, str(duck_type), str(ds.schema.field("n").type))
        # struct fields in DuckDB's order (first seen), at every depth
        if os.environ.get("NESTED_ORDER_LOG_ONLY") and _names(ds.schema.field("n").type) != _names(duck_type):
            event("struct fields in another order than DuckDB's")
            _log("order", types=types, duckdb_type=str(duck_type), schema=str(ds.schema.field("n").type))
        else:
            assert _names(ds.schema.field("n").type) == _names(duck_type), (
                str(ds.schema.field("n").type), str(duck_type), types)
        picked = _element(duck_type, data.draw)
        if picked is None:
            return
        expr, leaf = picked
        predicates = [f"{expr} IS NOT NULL", f"{expr} IS NULL"]
        if pat.is_integer(leaf) or pat.is_decimal(leaf):
            predicates.append(f"{expr} > 0")
        elif pat.is_string(leaf) or pat.is_large_string(leaf) or str(leaf) == "string_view":
            predicates.append(f"{expr} >= 'k'")
        for predicate in predicates:
            count = con.sql(f"SELECT count(*) FROM {scan} WHERE {predicate}").fetchall()[0][0]
            event("filter on a nested element")
            assert ds.filter(predicate).count() == count, (predicate, types)
