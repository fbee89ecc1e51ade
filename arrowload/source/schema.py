"""Unify the schemas of shards: widen where it is safe, otherwise name both files and the column."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pat

from ..errors import SchemaMismatchError


def rounds(have: pa.DataType, unified: pa.DataType) -> bool:
    """Whether ``have`` (a file's type) reaches ``unified`` (``merge_types``) only by
    arrowload's own ``widen``, not a cast: integers read as float64, as DuckDB reads them,
    past 2**53 to the nearest double (at the top level or inside a list or struct: DuckDB
    rounds them there too), or a struct whose fields are not the unified one's in the same
    order (matched by name, the missing ones null)."""
    if pat.is_dictionary(have):
        have = have.value_type
    if pat.is_integer(have):
        return pat.is_floating(unified)
    if _is_list(have, sized=True) and _is_list(unified, sized=True):
        return rounds(have.value_type, unified.value_type)
    if pat.is_map(have) and pat.is_map(unified):
        return rounds(have.key_type, unified.key_type) or rounds(have.item_type, unified.item_type)
    if pat.is_struct(have) and pat.is_struct(unified):
        if have.names != unified.names:
            return True
        return any(rounds(a.type, b.type) for a, b in zip(have.fields, unified.fields))
    return False


def widen(col, unified: pa.DataType):
    """A file's column (an Array or ChunkedArray) as its source's unified type
    (``merge_types``): every widening exact -- a value the unified type cannot hold is an
    error (``pa.ArrowInvalid``) -- but integers into float64, which round as in DuckDB
    (pyarrow's checked cast refuses them past 2**53). Inside a list or struct only those
    integers round: the rest of the value is cast checked, child by child."""
    if col.type.equals(unified, check_metadata=True):
        return col
    if not rounds(col.type, unified):
        return col.cast(unified)
    if pat.is_integer(col.type) or (pat.is_dictionary(col.type) and pat.is_integer(col.type.value_type)):
        return col.cast(unified, safe=False)
    if isinstance(col, pa.ChunkedArray):
        return pa.chunked_array([_widen_nested(c, unified) for c in col.chunks], type=unified)
    return _widen_nested(col, unified)


def _widen_nested(arr: pa.Array, unified: pa.DataType) -> pa.Array:
    """``widen`` of one list or struct array holding a rounding integer: rebuilt from its
    children, each widened on its own (its nulls kept)."""
    if pat.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if pat.is_fixed_size_list(arr.type):
        if pat.is_fixed_size_list(unified):  # of one size: its values widened in place
            k = unified.list_size
            values = arr.values.slice(arr.offset * k, len(arr) * k)
            return pa.FixedSizeListArray.from_arrays(widen(values, unified.value_type), type=unified,
                                                     mask=_nulls(arr))
        # offsets first (exact), then as a list: fields inside nullable, as a null list's
        # slots may hold nulls a non-nullable field refuses in a cast
        arr = arr.cast(pa.list_(pa.field(arr.type.value_field.name, nullable_inside(arr.type.value_type))))
    if pat.is_struct(arr.type):  # fields by name: a field this file lacks is null
        at = {f.name: i for i, f in enumerate(arr.type)}
        fields = [widen(arr.field(at[f.name]), f.type) if f.name in at else pa.nulls(len(arr), f.type)
                  for f in unified]
        return pa.StructArray.from_arrays(fields, fields=list(unified), mask=_nulls(arr))
    inner = [f.type for f in children(unified)]  # a list's values; a map's keys, then items
    return _rebuilt(arr, unified, lambda values, position: widen(values, inner[position]))


def _nulls(arr: pa.Array) -> pa.Array | None:
    return arr.is_null() if arr.null_count else None


def _rebuilt(arr: pa.Array, unified: pa.DataType, values_as) -> pa.Array:
    """A list or map array as ``unified`` with its values (a map: keys, then items) as
    ``values_as(values, position)`` gives them, its nulls kept: the values this (possibly
    sliced) array spans, and offsets into them from 0 (``from_arrays`` refuses a mask
    beside sliced offsets)."""
    offsets = arr.offsets
    start, stop = offsets[0].as_py(), offsets[-1].as_py()
    offsets = pc.subtract(offsets.cast(pa.int64() if pat.is_large_list(unified) else pa.int32()), start)
    if pat.is_map(unified):
        keys = values_as(arr.keys.slice(start, stop - start), 0)
        items = values_as(arr.items.slice(start, stop - start), 1)
        return pa.MapArray.from_arrays(offsets, keys, items, type=unified, mask=_nulls(arr))
    values = values_as(arr.values.slice(start, stop - start), 0)
    kind = pa.LargeListArray if pat.is_large_list(unified) else pa.ListArray
    return kind.from_arrays(offsets, values, type=unified, mask=_nulls(arr))


def children(t: pa.DataType) -> list[pa.Field]:
    """The fields directly inside a nested type (a struct's, a list's element, a map's key
    and item), in order; none for a leaf."""
    if pat.is_struct(t):
        return [t.field(i) for i in range(t.num_fields)]
    if _is_list(t) or pat.is_fixed_size_list(t):
        return [t.value_field]
    if pat.is_map(t):
        return [t.key_field, t.item_field]
    return []


def remap_nested(col, have: pa.DataType, keyed: pa.DataType, unified: pa.DataType, file_key, table_key,
                 missing=None):
    """A file's nested column (an Array or ChunkedArray; ``have``: its type as the file's
    footer gives it, field metadata included) as the table's type ``unified`` (``keyed``:
    the same with the table's field metadata), a struct's fields found at every level by
    a key, not by name or position: the field of the file whose ``file_key(field)``
    equals a table field's ``table_key(field)`` (a lake table's field id or physical
    name). A table field no file field matches reads as nulls; a file field no table field
    matches is left out; leaves widen (``widen``); every level's nulls are kept.
    ``missing(field, n)``: the values of a table field (``keyed``'s) the file lacks, for
    ``n`` rows, or None for nulls (a lake table's default value)."""
    if isinstance(col, pa.ChunkedArray):
        return pa.chunked_array([remap_nested(c, have, keyed, unified, file_key, table_key, missing)
                                 for c in col.chunks], type=unified)
    if not pat.is_nested(unified):
        return widen(col, unified)
    if pat.is_dictionary(col.type):
        col = col.dictionary_decode()
    if pat.is_struct(unified):
        at = {file_key(f): k for k, f in enumerate(children(have))}
        out = []
        for want, key in zip(unified, children(keyed)):
            k = at.get(table_key(key))
            if k is not None:
                out.append(remap_nested(col.field(k), have.field(k).type, key.type, want.type, file_key,
                                        table_key, missing))
                continue
            got = None if missing is None else missing(key, len(col))
            out.append(pa.nulls(len(col), want.type) if got is None else got)
        return pa.StructArray.from_arrays(out, fields=list(unified), mask=_nulls(col))
    inner = children(unified)
    return _rebuilt(col, unified, lambda values, i: remap_nested(
        values, children(have)[i].type, children(keyed)[i].type, inner[i].type, file_key, table_key, missing))


_SIGNED = [pa.int8(), pa.int16(), pa.int32(), pa.int64()]
_UNSIGNED = [pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()]


def merge_types(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """The narrowest type both ``a`` and ``b`` convert to without loss, or None.

    Safe widenings: null -> anything; integers of the same signedness to the wider;
    unsigned into a wider signed type; float32 -> float64; integers beside floats ->
    float64 (DuckDB reads DOUBLE beside float64 but FLOAT beside float32 alone, losing
    integers past 2**24: arrowload keeps them); string / binary and their view types -> their
    large variants; dictionary-encoded values -> their value type; decimals to a precision
    that holds both; timestamps to the finer unit (a value past the finer unit's range
    is refused when read: ``SchemaMismatchError``), in UTC where both carry different time
    zones (both are instants); lists, large lists and fixed-size lists -> a large list
    where either is large, a fixed-size list where both are of one size, else a list, of
    their merged values (DuckDB reads ARRAY beside LIST as a LIST); maps of their merged
    keys and items (a value nullable where either file's is); structs field by field, by
    name (in first-seen order, a field one file lacks null there, as DuckDB's
    ``union_by_name`` merges them). These are the files polars writes (large strings and
    lists, also inside structs) next to pyarrow's and DuckDB's: DuckDB's ``union_by_name``
    reads them.
    """
    if a.equals(b):
        return a
    if pat.is_null(a):
        return b
    if pat.is_null(b):
        return a
    if pat.is_dictionary(a) or pat.is_dictionary(b):
        va = a.value_type if pat.is_dictionary(a) else a
        vb = b.value_type if pat.is_dictionary(b) else b
        return merge_types(va, vb)
    if pat.is_integer(a) and pat.is_integer(b):
        return _merge_ints(a, b)
    if pat.is_floating(a) and pat.is_floating(b):
        return a if a.bit_width >= b.bit_width else b
    if (pat.is_integer(a) and pat.is_floating(b)) or (pat.is_floating(a) and pat.is_integer(b)):
        return pa.float64()
    for family, large in _TEXT_FAMILIES:
        if {str(a), str(b)} <= family:
            return large
    if pat.is_decimal(a) and pat.is_decimal(b):
        scale = max(a.scale, b.scale)
        integral = max(a.precision - a.scale, b.precision - b.scale)
        if integral + scale <= 38:
            return pa.decimal128(integral + scale, scale)
        return None
    if pat.is_timestamp(a) and pat.is_timestamp(b) and (a.tz is None) == (b.tz is None):
        order = ["s", "ms", "us", "ns"]
        unit = a.unit if order.index(a.unit) >= order.index(b.unit) else b.unit
        return pa.timestamp(unit, a.tz if a.tz == b.tz else "UTC")
    if _is_list(a, sized=True) and _is_list(b, sized=True):
        inner = merge_types(a.value_type, b.value_type)
        if inner is None:
            return None
        if pat.is_fixed_size_list(a) and pat.is_fixed_size_list(b) and a.list_size == b.list_size:
            return pa.list_(inner, a.list_size)
        return pa.large_list(inner) if pat.is_large_list(a) or pat.is_large_list(b) else pa.list_(inner)
    if pat.is_map(a) and pat.is_map(b):  # keys and items each merged, as a list's values
        key, item = merge_types(a.key_type, b.key_type), merge_types(a.item_type, b.item_type)
        if key is None or item is None:
            return None
        return pa.map_(pa.field(a.key_field.name, key, False),
                       pa.field(a.item_field.name, item, a.item_field.nullable or b.item_field.nullable),
                       keys_sorted=a.keys_sorted and b.keys_sorted)
    if pat.is_struct(a) and pat.is_struct(b):
        if a.names == b.names:
            pairs = list(zip(a.fields, b.fields))
        elif len(set(a.names)) == len(a.names) and len(set(b.names)) == len(b.names):
            # fields by name, in first-seen order, as DuckDB's union_by_name merges them; a
            # field one side lacks is null there
            theirs = {f.name: f for f in b.fields}
            ours = set(a.names)
            pairs = [(f, theirs.get(f.name)) for f in a.fields] + [(None, f) for f in b.fields if f.name not in ours]
        else:
            return None  # a repeated field name: which one is which cannot be told
        fields = []
        for fa, fb in pairs:
            if fa is None or fb is None:
                f = fa or fb
                fields.append(pa.field(f.name, f.type, True))
                continue
            inner = merge_types(fa.type, fb.type)
            if inner is None:
                return None
            fields.append(pa.field(fa.name, inner, fa.nullable or fb.nullable))
        return pa.struct(fields)
    return None


#: text and bytes types that hold the same values, and the one each pair widens to
_TEXT_FAMILIES = (({"string", "large_string", "string_view"}, pa.large_string()),
                  ({"binary", "large_binary", "binary_view"}, pa.large_binary()))


def _is_list(t: pa.DataType, sized: bool = False) -> bool:
    """A list or large list (``sized``: or a fixed-size list)."""
    return pat.is_list(t) or pat.is_large_list(t) or (sized and pat.is_fixed_size_list(t))


def _merge_ints(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    sa, sb = pat.is_signed_integer(a), pat.is_signed_integer(b)
    if sa == sb:
        return a if a.bit_width >= b.bit_width else b
    signed, unsigned = (a, b) if sa else (b, a)
    width = max(signed.bit_width, unsigned.bit_width * 2)
    return {8: pa.int8(), 16: pa.int16(), 32: pa.int32(), 64: pa.int64()}.get(width)


def unify_schemas(schemas: Sequence[tuple[str, pa.Schema]]) -> pa.Schema:
    """Union by name of the shards' schemas, in first-seen column order.

    A column missing from some shards reads as nulls there. Types are merged with
    :func:`merge_types`; anything else raises :class:`SchemaMismatchError` naming the
    column and the two files that disagree.
    """
    if schemas and all(s.equals(schemas[0][1]) for _, s in schemas[1:]):
        return pa.schema([f.remove_metadata() for f in schemas[0][1]])  # the common case
    seen: dict[str, list[tuple[str, pa.Field]]] = {}  # column -> (file, its field there), first-seen order
    for path, schema in schemas:
        for f in schema:
            seen.setdefault(f.name, []).append((path, f))
    fields: dict[str, pa.Field] = {}
    for name, found in seen.items():
        # files holding floats first (a stable sort): integers no integer type holds together
        # (int8 beside uint64) widen to double where any file holds floats, whatever order
        # the files come in, as DuckDB reads them
        found = sorted(found, key=lambda pf: not _holds_float(pf[1].type))
        first, have = found[0]
        have = have.remove_metadata()
        todo, failed = found[1:], None
        while todo:
            # a file whose type does not merge yet is taken again once the others have
            # widened the column (int8 and uint64 in a struct field, a float file later):
            # the answer does not depend on the files' order
            left = []
            for path, f in todo:
                merged = merge_types(have.type, f.type)
                if merged is None:
                    left.append((path, f))
                    failed = failed or (have.type, path, f.type)
                    continue
                have = pa.field(name, merged, have.nullable or f.nullable)
            if len(left) == len(todo):
                own, (at, path, theirs) = found[0][1].type, failed
                before = f"{own} in {first!r}" if own == at else \
                    f"{at} in the other files ({own} in {first!r}, widened by others)"
                raise SchemaMismatchError(
                    f"column {name!r} is {before} but {theirs} in {path!r}, and the two cannot be "
                    "unified safely; rewrite one shard or select a subset of files")
            todo, failed = left, None
        if len(found) > 1:  # struct fields in the order the files show them, not the merge's
            have = have.with_type(_seen_order(have.type, [f.type for _, f in seen[name]]))
            if any(not f.type.equals(have.type) for _, f in found):
                # cast from some file: no field inside may refuse nulls (pyarrow's cast checks
                # the slots under a null parent too; DuckDB has no NOT NULL inside a column)
                have = have.with_type(nullable_inside(have.type))
        fields[name] = have
    _refuse_case_variants(fields, schemas)
    out = []
    for name, f in fields.items():
        missing = any(name not in s.names for _, s in schemas)
        out.append(f.with_nullable(True) if missing else f)
    return pa.schema(out)


def _seen_order(merged: pa.DataType, types: list[pa.DataType]) -> pa.DataType:
    """``merged`` with its struct fields (at any depth) in the order the files' ``types``,
    in file order, first show them (DuckDB's ``union_by_name`` order)."""
    types = [t.value_type if pat.is_dictionary(t) else t for t in types]
    if pat.is_struct(merged):
        structs = [t for t in types if pat.is_struct(t)]
        order = list(dict.fromkeys(n for t in structs for n in t.names))
        if sorted(order) != sorted(merged.names):
            return merged
        out = []
        for n in order:
            f = merged.field(n)
            out.append(f.with_type(_seen_order(f.type, [t.field(n).type for t in structs if n in t.names])))
        return pa.struct(out)
    if _is_list(merged, sized=True):
        inner = _seen_order(merged.value_type, [t.value_type for t in types if _is_list(t, sized=True)])
        return _list_like(merged, merged.value_field.with_type(inner))
    if pat.is_map(merged):
        maps = [t for t in types if pat.is_map(t)]
        inner = _seen_order(merged.item_type, [t.item_type for t in maps])
        if inner.equals(merged.item_type):
            return merged  # (as it is: its keys_sorted and entries' name kept)
        return pa.map_(merged.key_field, merged.item_field.with_type(inner), keys_sorted=merged.keys_sorted)
    return merged


def _list_like(t: pa.DataType, value: pa.Field) -> pa.DataType:
    """A list type of ``t``'s kind (list, large list, fixed-size list of its size) of ``value``."""
    if pat.is_fixed_size_list(t):
        return pa.list_(value, t.list_size)
    return pa.large_list(value) if pat.is_large_list(t) else pa.list_(value)


def nullable_inside(t: pa.DataType) -> pa.DataType:
    """``t`` with every field inside it nullable (a map's keys stay as they are: Arrow wants
    them non-null)."""
    if pat.is_struct(t):
        return pa.struct([pa.field(f.name, nullable_inside(f.type), True, f.metadata) for f in t])
    if pat.is_map(t):
        item = t.item_field
        if item.nullable and nullable_inside(item.type).equals(item.type):
            return t  # (as it is: its keys_sorted and entries' name kept)
        return pa.map_(t.key_field, pa.field(item.name, nullable_inside(item.type), True, item.metadata),
                       keys_sorted=t.keys_sorted)
    if _is_list(t, sized=True):
        value = t.value_field
        return _list_like(t, pa.field(value.name, nullable_inside(value.type), True, value.metadata))
    return t


def timestamp_zones(t: pa.DataType) -> set[str]:
    """The time zones of the timestamps in type ``t``, nested ones too."""
    if pat.is_timestamp(t):
        return {t.tz} if t.tz is not None else set()
    if pat.is_dictionary(t):
        return timestamp_zones(t.value_type)
    if isinstance(t, pa.BaseExtensionType):
        return timestamp_zones(t.storage_type)
    return set().union(*(timestamp_zones(f.type) for f in children(t)))


def _holds_float(t: pa.DataType) -> bool:
    """Whether a type is, or holds at any depth, a floating-point type."""
    if pat.is_floating(t):
        return True
    if pat.is_dictionary(t):
        return _holds_float(t.value_type)
    return any(_holds_float(f.type) for f in children(t))


def _refuse_case_variants(fields: dict, schemas: Sequence[tuple[str, pa.Schema]]) -> None:
    """Columns whose names differ only in case in different files (``Id`` here, ``id``
    there, never both in one file) would be two half-null columns, and an unquoted ``id``
    one of them; DuckDB's union by name reads them as one. Refused, naming both files."""
    by_lower: dict[str, list[str]] = {}
    for name in fields:
        by_lower.setdefault(name.lower(), []).append(name)
    for names in by_lower.values():
        if len(names) < 2:
            continue
        if any(sum(n in s.names for n in names) > 1 for _, s in schemas):
            continue  # one file holds both: two columns by the file's own word
        a, b = names[:2]
        path_a = next(p for p, s in schemas if a in s.names)
        path_b = next(p for p, s in schemas if b in s.names)
        raise SchemaMismatchError(
            f"column {a!r} in {path_a!r} and {b!r} in {path_b!r} differ only in case: arrowload would read "
            "them as two columns, each null in the other's files (DuckDB's union by name reads one); "
            "rename one of them in its files, or open the files apart")
