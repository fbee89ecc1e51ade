"""Parquet footers checked before pyarrow touches their column chunks.

pyarrow (26) aborts the process, with an uncaught C++ exception, when a column chunk's
metadata is encrypted (a plaintext-footer file read without keys) or inconsistent (a
physical type that disagrees with the schema, an unknown codec, byte-array sizes on a
non-byte-array column): ``RowGroupMetaData.column(i)`` and the statistics used by
row-group pruning throw from C++ code that Python cannot catch. So the footer's Thrift
bytes are decoded here, in Python, and every column chunk is checked first; a file with
an unreadable chunk is never handed to those accessors: ``explain()``, ``describe()`` and
``repr()`` say what could not be read, and reading it raises ``CorruptFileError`` naming
the file and the column.

The decoder walks the Thrift compact protocol and keeps only the fields the checks need
(statistics, histograms and the schema are skipped unbuilt).
"""

from __future__ import annotations

import struct
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field

import pyarrow.fs as pafs

MAGIC = b"PAR1"
TAIL_READ = 64 << 10

# parquet.thrift enums
_PHYSICAL = ("BOOLEAN", "INT32", "INT64", "INT96", "FLOAT", "DOUBLE", "BYTE_ARRAY", "FIXED_LEN_BYTE_ARRAY")
_CODECS = range(0, 8)            # UNCOMPRESSED .. LZ4_RAW
_ENCODINGS = {0, 2, 3, 4, 5, 6, 7, 8, 9}
_BYTE_ARRAY = 6


class FooterDecodeError(ValueError):
    """The footer bytes are not valid Thrift compact protocol."""


# ---------------------------------------------------------------------------
# leaf columns


def _leaf_count(t) -> int:
    import pyarrow as pa
    if pa.types.is_struct(t):
        return sum(_leaf_count(t.field(i).type) for i in range(t.num_fields)) or 1
    if pa.types.is_map(t):
        return _leaf_count(t.key_type) + _leaf_count(t.item_type)
    if isinstance(t, pa.BaseExtensionType):
        return _leaf_count(t.storage_type)
    if hasattr(t, "value_type") and not pa.types.is_dictionary(t):  # list types
        return _leaf_count(t.value_type)
    return 1


# ---------------------------------------------------------------------------
# facts of a file's schema, shared by the files that have the same one

#: ``(what, schema_key)`` -> what was derived from that schema alone (the lake of thousands
#: of small files a streaming writer leaves has one schema: each file paid 60-80 us of
#: Python for the same answers), least recently used first
_PER_SCHEMA: OrderedDict = OrderedDict()
#: the leaf columns of the schemas ``_PER_SCHEMA`` holds facts of, at most, counted once per
#: fact (about 900 bytes of Python objects a leaf column and fact: some 18 MiB; a schema of
#: more columns keeps its newest fact)
_PER_SCHEMA_LEAVES = 20_000
_per_schema_leaves = 0
_PER_SCHEMA_LOCK = threading.RLock()  # (a computation may ask for another fact)

#: id(footer metadata) -> (a weak reference to it, its schema_key): one key per file
_KEYS: dict[int, tuple] = {}
#: the schemas keys were made for, by their text: text -> [(ParquetSchema, key)]. Two
#: schemas may print alike (names are not quoted: a column named ``x (String)`` beside a
#: string column ``x``); the schemas' own comparison tells them apart. Each holds its
#: file's footer: at most ``_SEEN_BYTES`` of footers (as serialized) in all, then
#: forgotten (new keys are made then, never an old key for another schema: ``_serial``)
_SEEN: dict[tuple, list] = {}
_SEEN_BYTES = 8 << 20
_seen_bytes = 0
_serial = 0


def schema_key(meta) -> tuple | None:
    """What a Parquet footer says of its columns, as a key: files with equal keys have the
    same schema tree (every name, physical and logical type, repetition and field id: the
    schemas compare equal) and the same stored Arrow schema (``ARROW:schema``: large or
    dictionary types, time zones), so the same leaf columns and Arrow types. None where the
    tree cannot be rendered. Worked out once per metadata object."""
    global _seen_bytes, _serial
    got = _KEYS.get(id(meta))
    if got is not None and got[0]() is meta:
        return got[1]
    try:
        schema = meta.schema
        text = str(schema)
        kv = meta.metadata
        base = (text[text.find("\n") + 1:], meta.num_columns, kv.get(b"ARROW:schema") if kv else None)
        with _PER_SCHEMA_LOCK:
            seen = _SEEN.setdefault(base, [])
            key = next((k for other, k in seen if other.equals(schema)), None)
            if key is None:
                if _seen_bytes > _SEEN_BYTES:
                    _SEEN.clear()
                    _seen_bytes = 0
                    seen = _SEEN.setdefault(base, [])
                _serial += 1
                key = (*base, _serial)
                seen.append((schema, key))
                _seen_bytes += meta.serialized_size
    except Exception:  # noqa: BLE001 - no key: nothing shared
        return None
    try:
        ref = weakref.ref(meta, lambda _, i=id(meta): _KEYS.pop(i, None))
    except TypeError:  # (not weakly referable: worked out at each call)
        return key
    _KEYS[id(meta)] = (ref, key)
    return key


def forget_schema_facts() -> None:
    """Forget the facts shared between files of one schema (they are worked out again)."""
    global _per_schema_leaves
    with _PER_SCHEMA_LOCK:
        _PER_SCHEMA.clear()
        _per_schema_leaves = 0


def per_schema(what: str, meta, compute):
    """``compute()``, once per distinct schema (``schema_key``) for each ``what``; the
    answer is shared between files, so it must not be changed by its users."""
    global _per_schema_leaves
    key = schema_key(meta)
    if key is None:
        return compute()
    k = (what, key)
    got = _PER_SCHEMA.get(k)
    if got is None:
        with _PER_SCHEMA_LOCK:  # once: two reader threads on files of one schema wait for one answer
            got = _PER_SCHEMA.get(k)
            if got is None:
                got = _PER_SCHEMA[k] = compute()
                _per_schema_leaves += key[1]
                while _per_schema_leaves > _PER_SCHEMA_LEAVES and len(_PER_SCHEMA) > 1:
                    (_, old), _ = _PER_SCHEMA.popitem(last=False)
                    _per_schema_leaves -= old[1]
    else:
        try:
            _PER_SCHEMA.move_to_end(k)
        except KeyError:  # (evicted meanwhile by another thread)
            pass
    return got


def leaf_columns(meta) -> tuple[str, ...]:
    """The top-level column each leaf column chunk of a Parquet file belongs to (found once
    per schema, ``per_schema``).

    The names come from the Parquet schema; where one is not valid UTF-8 (pyarrow's
    ``ColumnSchema.path`` raises UnicodeDecodeError), from the Arrow schema pyarrow reads
    (its stored ``ARROW:schema`` or its own decoding), matched to the leaves in order."""
    return per_schema("leaf_columns", meta, lambda: tuple(_leaf_columns(meta)))


def leaf_facts(meta) -> tuple[tuple[str, str | None, str], ...]:
    """``(top-level column, leaf path, physical type)`` of each leaf column of a Parquet
    file, in order (found once per schema; the path None where it is not UTF-8)."""
    def compute():
        schema = meta.schema
        out = []
        for c, head in enumerate(leaf_columns(meta)):
            col = schema.column(c)
            try:
                path = col.path
            except UnicodeDecodeError:  # a name that is not UTF-8: no path
                path = None
            out.append((head, path, col.physical_type))
        return tuple(out)
    return per_schema("leaf_facts", meta, compute)


def _leaf_columns(meta) -> list[str]:
    schema = meta.schema
    try:
        paths = [schema.column(c).path for c in range(meta.num_columns)]
    except UnicodeDecodeError:
        paths = None
    if paths is not None and not any("." in p for p in paths):
        return paths  # flat, no dotted names: each leaf is its own column
    # a path joins names with dots, so "a.b" is column "a.b" or field b of struct a: the
    # top-level fields and their leaf counts decide (each path then starts with its name)
    out: list[str] = []
    try:
        for f in schema.to_arrow_schema():
            out.extend([f.name] * _leaf_count(f.type))
    except Exception:  # noqa: BLE001 - names unknown: the paths or positions will do
        out = []
    if len(out) == meta.num_columns and (paths is None or all(
            p == n or p.startswith(n + ".") for p, n in zip(paths, out))):
        return out
    if paths is not None:
        return [p.split(".", 1)[0] for p in paths]
    return [f"<column {c}>" for c in range(meta.num_columns)]


# ---------------------------------------------------------------------------
# the checks


@dataclass(frozen=True)
class FooterCheck:
    """What could not be read in one Parquet file's footer.

    ``bad_chunks`` maps ``(row group, leaf column index)`` to a reason; ``columns`` are
    the affected top-level column names; ``encrypted`` is True when the file (or a column
    of it) is encrypted.
    """

    path: str
    bad_chunks: dict[tuple[int, int], str] = field(default_factory=dict)
    columns: tuple[str, ...] = ()
    encrypted: bool = False
    problem: str | None = None  # the footer as a whole could not be decoded

    @property
    def ok(self) -> bool:
        return not self.bad_chunks and self.problem is None

    def reason(self) -> str:
        if self.problem is not None:
            return self.problem
        (rg, _), why = next(iter(sorted(self.bad_chunks.items())))
        cols = ", ".join(repr(c) for c in self.columns)
        what = f"column {cols}" if len(self.columns) == 1 else f"columns {cols}"
        return f"{what}: {why} (first in row group {rg})"

    def fix(self) -> str:
        if self.encrypted:
            return ("arrowload cannot decrypt Parquet modular encryption; decrypt the file with "
                    "pyarrow.parquet.encryption and its keys, or select other files")
        return "the footer is damaged; rewrite the file from its source, or remove it"


def read_footer_bytes(fs: pafs.FileSystem, path: str, size: int | None,
                      expected: int | None = None) -> bytes | None:
    """The Thrift bytes of a plaintext Parquet footer (None for an encrypted footer, which
    pyarrow refuses with a Python exception of its own). ``expected``: the footer's length
    as pyarrow parsed it (``FileMetaData.serialized_size``), so that one read of exactly
    the footer and its 8-byte tail suffices (a signed plaintext footer is longer: then a
    second read)."""
    with fs.open_input_file(path) as f:
        if size is None:
            size = f.size()
        if size < 12:
            return None
        take = min(size, expected + 8 if expected else TAIL_READ)
        tail = f.read_at(take, size - take)
        if tail[-4:] != MAGIC:
            return None
        (length,) = struct.unpack("<i", tail[-8:-4])
        if length <= 0 or length + 8 > size:
            return None
        if length + 8 > take:
            tail = f.read_at(length + 8, size - length - 8)
        return bytes(tail[-8 - length:-8])


def check_footer(path: str, footer: bytes | None, leaves: list[tuple[str, str]]) -> FooterCheck:
    """Check every column chunk of a footer against the schema's leaves (``[(top-level
    name, physical type)]`` from pyarrow's parsed schema, which is safe to read)."""
    if footer is None:
        return FooterCheck(path)
    try:
        encrypted, row_groups = _decode_file(footer)
    except FooterDecodeError as exc:
        return FooterCheck(path, problem=f"the footer cannot be decoded ({exc})")
    except IndexError:  # a read past the last byte
        return FooterCheck(path, problem="the footer cannot be decoded (footer ends inside a value)")
    bad: dict[tuple[int, int], str] = {}
    for r, chunks in enumerate(row_groups):
        if len(chunks) != len(leaves):
            bad[(r, 0)] = f"row group {r} has {len(chunks)} column chunks for {len(leaves)} columns"
            continue
        for c, chunk in enumerate(chunks):
            why = _check_chunk(chunk, leaves[c][1])
            if why is not None:
                encrypted = encrypted or why.startswith("encrypted")
                bad[(r, c)] = why
    names = tuple(dict.fromkeys(leaves[c][0] if c < len(leaves) else "?" for _, c in sorted(bad)))
    return FooterCheck(path, bad, names, encrypted)


# The Thrift compact protocol, walked over ``(buf, pos)`` with the position returned by
# every step (no reader object, no per-byte method call: a footer of a few hundred KiB is
# walked in milliseconds). Reading past the end raises IndexError, which ``check_footer``
# reports as a footer that ends inside a value. Only the fields checked are kept
# (FileMetaData -> RowGroup -> ColumnChunk -> ColumnMetaData); everything else (schema,
# statistics, histograms ...) is skipped without building it.


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    b = buf[pos]
    pos += 1
    if b < 0x80:
        return b, pos
    result, shift = b & 0x7F, 7
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 70:
            raise FooterDecodeError("varint too long")


_STOP = -1


def _field(buf: bytes, pos: int, last: int) -> tuple[int, int, int]:
    """``(field id, compact type, pos)`` of the next field header; the type is ``_STOP``
    at the end of the struct."""
    head = buf[pos]
    pos += 1
    if head == 0:
        return 0, _STOP, pos
    delta = head >> 4
    if delta:
        return last + delta, head & 0x0F, pos
    n, pos = _varint(buf, pos)
    return (n >> 1) ^ -(n & 1), head & 0x0F, pos


def _list_header(buf: bytes, pos: int) -> tuple[int, int, int]:
    head = buf[pos]
    pos += 1
    size, etype = head >> 4, head & 0x0F
    if size == 15:
        size, pos = _varint(buf, pos)
    if size > len(buf):
        raise FooterDecodeError("list longer than the footer")
    return size, etype, pos


def _skip(buf: bytes, pos: int, ctype: int, depth: int = 0) -> int:
    """The position after a value of compact type ``ctype`` at ``pos``."""
    if depth > 64:
        raise FooterDecodeError("footer nests too deeply")
    if ctype == 12:
        return _skip_struct(buf, pos, depth)
    if ctype in (4, 5, 6):  # varints: up to the first byte without the high bit
        while buf[pos] & 0x80:
            pos += 1
        pos += 1
    elif ctype == 8:  # binary
        n, pos = _varint(buf, pos)
        pos += n
    elif ctype in (1, 2):  # booleans live in the field header
        return pos
    elif ctype == 3:
        pos += 1
    elif ctype == 7:
        pos += 8
    elif ctype in (9, 10):  # list, set
        size, etype, pos = _list_header(buf, pos)
        if etype in (1, 2):
            pos += size
        elif etype in (4, 5, 6):
            for _ in range(size):
                while buf[pos] & 0x80:
                    pos += 1
                pos += 1
        elif etype == 8 and depth < 64:  # binaries (a column's path)
            end = len(buf)
            for _ in range(size):
                n, pos = _varint(buf, pos)
                pos += n
                if pos > end:
                    raise FooterDecodeError("a value runs past the footer")
        elif etype == 12 and depth < 64:  # structs (encoding stats)
            for _ in range(size):
                pos = _skip_struct(buf, pos, depth + 1)
        else:
            for _ in range(size):
                pos = _skip(buf, pos, etype, depth + 1)
    elif ctype == 11:  # map
        size, pos = _varint(buf, pos)
        if size:
            types = buf[pos]
            pos += 1
            for _ in range(size):
                pos = _skip(buf, pos, types >> 4, depth + 1)
                pos = _skip(buf, pos, types & 0x0F, depth + 1)
    else:
        raise FooterDecodeError(f"unknown Thrift type {ctype}")
    if pos > len(buf):
        raise FooterDecodeError("a value runs past the footer")
    return pos


def _skip_struct(buf: bytes, pos: int, depth: int) -> int:
    """The position after the struct at ``pos`` (``depth``: its nesting, for ``_skip``).
    Varints and binaries, most of a footer, are skipped here without a call each."""
    end = len(buf)
    while True:
        head = buf[pos]
        pos += 1
        if head == 0:
            return pos
        if depth >= 64:
            raise FooterDecodeError("footer nests too deeply")
        if not head & 0xF0:  # a field id of its own (zigzag varint) follows
            _, pos = _varint(buf, pos)
        ctype = head & 0x0F
        if ctype in (5, 6, 4):
            while buf[pos] & 0x80:
                pos += 1
            pos += 1
        elif ctype == 8:
            n = buf[pos]
            if n < 0x80:
                pos += 1
            else:
                n, pos = _varint(buf, pos)
            pos += n
            if pos > end:
                raise FooterDecodeError("a value runs past the footer")
        elif ctype not in (1, 2):
            pos = _skip(buf, pos, ctype, depth + 1)


def _expect(ctype: int, want: int) -> None:
    if ctype != want:
        raise FooterDecodeError(f"a field has Thrift type {ctype}, expected {want}")


def _decode_file(buf: bytes) -> tuple[bool, list[list[dict]]]:
    encrypted, row_groups, pos, fid = False, None, 0, 0
    while True:
        fid, ctype, pos = _field(buf, pos, fid)
        if ctype == _STOP:
            break
        if fid == 4:
            _expect(ctype, 9)
            size, etype, pos = _list_header(buf, pos)
            _expect(etype, 12)
            row_groups = []
            for _ in range(size):
                chunks, pos = _decode_row_group(buf, pos)
                row_groups.append(chunks)
        else:
            encrypted = encrypted or fid == 8  # encryption_algorithm: a plaintext-footer encrypted file
            pos = _skip(buf, pos, ctype)
    if row_groups is None:
        raise FooterDecodeError("the footer has no row groups field")
    return encrypted, row_groups


def _decode_row_group(buf: bytes, pos: int) -> tuple[list[dict], int]:
    chunks: list[dict] = []
    fid = 0
    while True:
        fid, ctype, pos = _field(buf, pos, fid)
        if ctype == _STOP:
            return chunks, pos
        if fid == 1:
            _expect(ctype, 9)
            size, etype, pos = _list_header(buf, pos)
            _expect(etype, 12)
            chunks = []
            for _ in range(size):
                chunk, pos = _decode_chunk(buf, pos)
                chunks.append(chunk)
        else:
            pos = _skip(buf, pos, ctype)


def _decode_chunk(buf: bytes, pos: int) -> tuple[dict, int]:
    out: dict = {}
    fid = 0
    while True:
        head = buf[pos]
        pos += 1
        if head == 0:
            return out, pos
        if head >> 4:
            fid += head >> 4
        else:
            n, pos = _varint(buf, pos)
            fid = (n >> 1) ^ -(n & 1)
        ctype = head & 0x0F
        if fid == 3 and ctype == 12:
            out[3], pos = _decode_column_meta(buf, pos)
            continue
        if fid in (8, 9):
            out[fid] = True
        if ctype == 5 or ctype == 6:  # offsets and lengths of the page indexes
            while buf[pos] & 0x80:
                pos += 1
            pos += 1
        else:
            pos = _skip(buf, pos, ctype)


def _decode_column_meta(buf: bytes, pos: int) -> tuple[dict, int]:
    out: dict = {}
    fid = 0
    while True:  # the field headers inline: the hottest loop of a footer
        head = buf[pos]
        pos += 1
        if head == 0:
            return out, pos
        if head >> 4:
            fid += head >> 4
        else:
            n, pos = _varint(buf, pos)
            fid = (n >> 1) ^ -(n & 1)
        ctype = head & 0x0F
        if ctype == 5 or ctype == 6:
            if fid in (1, 4, 5, 6, 7, 9):
                n, pos = _varint(buf, pos)
                out[fid] = (n >> 1) ^ -(n & 1)
            else:
                while buf[pos] & 0x80:
                    pos += 1
                pos += 1
        elif fid == 2 and ctype == 9:
            size, etype, pos = _list_header(buf, pos)
            _expect(etype, 5)
            values = []
            for _ in range(size):
                n, pos = _varint(buf, pos)
                values.append((n >> 1) ^ -(n & 1))
            out[2] = values
        elif fid == 16 and ctype == 12:
            present = {}
            sid = 0
            while True:
                sid, stype, pos = _field(buf, pos, sid)
                if stype == _STOP:
                    break
                present[sid] = True
                pos = _skip(buf, pos, stype)
            out[16] = present
        else:
            pos = _skip(buf, pos, ctype)


def _check_chunk(chunk, physical: str) -> str | None:
    if not isinstance(chunk, dict):
        return "a column chunk is not a struct"
    if 8 in chunk or 9 in chunk:
        return "encrypted column metadata (no decryption keys)"
    cmd = chunk.get(3)
    if not isinstance(cmd, dict):
        return "the column chunk has no column metadata"
    ptype = cmd.get(1)
    if not isinstance(ptype, int) or not 0 <= ptype < len(_PHYSICAL):
        return f"unknown physical type {ptype!r} in the column metadata"
    if _PHYSICAL[ptype] != physical:
        return f"column metadata says {_PHYSICAL[ptype]} but the schema says {physical}"
    codec = cmd.get(4)
    if codec not in _CODECS:
        return f"unknown compression codec {codec!r}"
    encodings = cmd.get(2)
    if not isinstance(encodings, list) or any(e not in _ENCODINGS for e in encodings):
        return f"unknown encodings {encodings!r}"
    for fid in (5, 6, 7, 9):  # num_values, sizes, data page offset
        if not isinstance(cmd.get(fid), int) or cmd[fid] < 0:
            return "negative or missing sizes / offsets in the column metadata"
    sizes = cmd.get(16)  # SizeStatistics
    if isinstance(sizes, dict) and 1 in sizes and ptype != _BYTE_ARRAY:
        return f"byte-array size statistics on a {physical} column"
    return None


# Checks of file versions already decoded in this process, keyed by (filesystem type, path,
# size, mtime_ns, identity): a version's footer never changes, so a new dataset over the
# same files neither reads nor decodes their footers' bytes again. Bounded (LRU).
_KNOWN: "OrderedDict[tuple, FooterCheck]" = OrderedDict()
_KNOWN_MAX = 16_384
_KNOWN_LOCK = threading.Lock()


# Checks remembered across processes (``formats/footer_checks/v1``): the file versions whose
# footers passed, kept in the loader's cache dir, so a new process over unchanged files
# neither reads nor decodes their footers' bytes in Python again (8 files of 8 row groups and
# 26 columns: 0.06 s of a 0.09 s loader build). Only passing checks are kept; a file that
# failed is checked anew (and fails again), never trusted from disk. One document per folder
# of files (``footer-checks/<key>.json``), read when a file of that folder is first looked
# up: a process pays for the folders it opens, never for every lake the cache dir has seen
# (one document for all of them grew to 15,000 entries and 0.13 s per loader build).
CHECKS_FORMAT = "arrowload.footer_checks"
CHECKS_VERSION = 1
#: What passes the check (``_check_chunk`` and the decoder): bumped when that changes, so
#: that files passed under other rules are checked again.
CHECK_RULES = 1
_CHECKS_DIR = "footer-checks"
_LEGACY_FILE = "footer-checks.json"  # one document for every folder, before; removed when writing
_SOURCES: list[str] = []  # the cache dirs consulted, in the order first named
_ON_DISK: dict[tuple[str, str], list] = {}  # (cache dir, folder key) -> keys read or last written, in order


def _folder_key(key: tuple) -> str:
    """The name of the document holding file version ``key``: its filesystem and folder."""
    where = (key[0], key[1].rpartition("/")[0])
    found = _FOLDER_KEYS.get(where)
    if found is None:
        import hashlib
        found = hashlib.sha256(f"{where[0]}\0{where[1]}".encode()).hexdigest()[:32]
        if len(_FOLDER_KEYS) >= _KNOWN_MAX:
            _FOLDER_KEYS.clear()
        _FOLDER_KEYS[where] = found
    return found


_FOLDER_KEYS: dict[tuple[str, str], str] = {}
#: files of a folder's document besides those the writing loader reads (most recent kept):
#: other datasets over the folder, without keeping every file the folder ever held
_OTHERS_KEPT = 1024


def _checks_path(cache_dir: str, folder_key: str) -> str:
    import os
    return os.path.join(cache_dir, _CHECKS_DIR, folder_key + ".json")


def read_footer_checks(doc, where: str) -> list[tuple]:
    """The file versions a ``footer_checks`` document lists (each ``(filesystem, path,
    size, mtime_ns, identity)``); ``CorruptFileError`` / ``UnsupportedError`` naming
    ``where`` for anything out of the spec."""
    from ..errors import CorruptFileError
    from ..jsondoc import check_header
    check_header(doc, where, CHECKS_FORMAT, CHECKS_VERSION, ("rules", "passed"),
                 "the footers are checked again")
    if type(doc["rules"]) is not int or doc["rules"] < 1:
        raise CorruptFileError(f"{where}: rules must be a positive integer, got {doc['rules']!r}", where)
    passed = doc["passed"]
    if not isinstance(passed, list):
        raise CorruptFileError(f"{where}: passed must be a list", where)
    keys = []
    for k in passed:
        if not (isinstance(k, list) and len(k) == 5 and isinstance(k[0], str) and isinstance(k[1], str)
                and type(k[2]) is int and k[2] >= 0 and (k[4] is None or isinstance(k[4], str))
                and (type(k[3]) is int or (k[3] is None and k[4] is not None))):
            raise CorruptFileError(f"{where}: each passed entry is [filesystem, path, size, mtime_ns or null, "
                                   f"identity or null] (not both null), got {k!r}", where)
        keys.append(tuple(k))
    return keys


def recall_checks(cache_dir: str | None) -> None:
    """Consult ``cache_dir`` for the passing checks of earlier processes from now on. Nothing
    is read here: a folder's document is read (once per process) when one of its files is
    first looked up (``known_check``)."""
    if cache_dir:
        with _KNOWN_LOCK:
            if cache_dir not in _SOURCES:
                _SOURCES.append(cache_dir)


def _read_folder(cache_dir: str, folder_key: str) -> list:
    """The keys ``cache_dir`` remembers for one folder, made known to this process; held
    under ``_KNOWN_LOCK``. A missing, damaged, foreign or other-version document, or one
    written under other check rules, is ignored (and rewritten by ``keep_checks``)."""
    import json
    keys: list[tuple] = []
    path = _checks_path(cache_dir, folder_key)
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        keys = read_footer_checks(doc, path) if doc.get("rules") == CHECK_RULES else []
    except Exception:  # noqa: BLE001 - nothing remembered is never fatal: checked anew
        keys = []
    for key in keys:
        if key not in _KNOWN:
            _KNOWN[key] = FooterCheck(key[1])
            _KNOWN.move_to_end(key, last=False)  # recalled, not used: the first to go
    _ON_DISK[(cache_dir, folder_key)] = keys
    return keys


def keep_checks(cache_dir: str | None, versions) -> None:
    """Write the passing checks of the file versions ``versions`` (a loader's files) to
    ``cache_dir``, in the documents of their folders that lack some: each document keeps
    those and, most recent first, up to ``_OTHERS_KEPT`` files besides (one version a file;
    a file deleted from the folder ages out). Failures to write are ignored (a cache). Costs
    what the loader's own files cost, never what the process or the cache dir saw before."""
    import os

    from ..jsondoc import write_atomic
    if not cache_dir:
        return
    writes = []
    with _KNOWN_LOCK:
        by_folder: dict[str, list] = {}
        for k in versions:
            check = _KNOWN.get(k)
            if check is not None and check.ok and len(k) == 5:
                by_folder.setdefault(_folder_key(k), []).append(k)
        for folder_key, keys in by_folder.items():
            on_disk = _ON_DISK.get((cache_dir, folder_key))
            if on_disk is None:
                on_disk = _read_folder(cache_dir, folder_key)
            if set(on_disk).issuperset(keys):
                continue
            mine = {k[1] for k in keys}
            others = [k for k in on_disk if k[1] not in mine]  # oldest first
            newest = {k[1]: k for k in others}  # one version a file, the latest written
            kept = list(newest.values())[-_OTHERS_KEPT:] + keys
            _ON_DISK[(cache_dir, folder_key)] = kept
            writes.append((_checks_path(cache_dir, folder_key), kept))
    for path, kept in writes:
        doc = {"format": CHECKS_FORMAT, "version": CHECKS_VERSION, "rules": CHECK_RULES,
               "passed": [list(k) for k in kept]}
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            write_atomic(path, doc)
        except OSError:
            pass
    if writes:
        try:
            os.remove(os.path.join(cache_dir, _LEGACY_FILE))
        except OSError:
            pass


def known_check(key: tuple | None) -> FooterCheck | None:
    """The check of the file version ``key`` if this process made it already, or an earlier
    one remembered it in a consulted cache dir (``recall_checks``)."""
    if key is None:
        return None
    with _KNOWN_LOCK:
        check = _KNOWN.get(key)
        if check is None and len(key) == 5 and _SOURCES:
            folder_key = _folder_key(key)
            for cache_dir in _SOURCES:
                if (cache_dir, folder_key) not in _ON_DISK:
                    _read_folder(cache_dir, folder_key)
            check = _KNOWN.get(key)
        if check is not None:
            _KNOWN.move_to_end(key)
        return check


def forget_checks() -> None:
    """Forget every remembered check (the next dataset reads and decodes footers anew)."""
    with _KNOWN_LOCK:
        _KNOWN.clear()
        _ON_DISK.clear()
        _SOURCES.clear()


def remember_check(key: tuple | None, check: FooterCheck) -> None:
    if key is None:
        return
    with _KNOWN_LOCK:
        _KNOWN[key] = check
        _KNOWN.move_to_end(key)
        while len(_KNOWN) > _KNOWN_MAX:
            _KNOWN.popitem(last=False)
