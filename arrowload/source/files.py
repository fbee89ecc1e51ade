"""File sources: Parquet, Arrow IPC / Feather, CSV and JSON lines on any filesystem."""

from __future__ import annotations

import copy
import functools
import hashlib
import os
import re
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from .._pickle import PicklableLock
from ..errors import CorruptFileError, InvalidArgumentError, StorageRetryError
from ..options import ScanOptions, default_cache_dir
from .base import Source, Unit
from .filesystem import FileEntry, bind_listing, storage_error
from .footer import (FooterCheck, check_footer, known_check, leaf_columns, leaf_facts, per_schema,
                     read_footer_bytes, recall_checks, remember_check)
from .hive import discover_partitions, hive_base, partition_expression
from .identity import identity_of
from .ipc import conform, not_an_ipc_file, read_ipc, stream_facts
from .retry import is_transient, retry
from .schema import children, rounds, unify_schemas
from .snapshot import (MANIFEST_FORMAT, MANIFEST_VERSION, PinnedFile, absolute, changed_error, compact,
                       differs, files_changed_error, files_of_compact, json_value, partitioning_doc, relative,
                       schema_digest, snapshot_id)

FORMAT_ALIASES = {
    "parquet": "parquet", "pq": "parquet",
    "ipc": "ipc", "arrow": "ipc", "feather": "ipc",
    "csv": "csv",
    "json": "json", "jsonl": "json", "ndjson": "json",
}
_EXTENSIONS = {
    ".parquet": "parquet", ".parq": "parquet", ".pq": "parquet",
    ".arrow": "ipc", ".arrows": "ipc", ".feather": "ipc", ".ipc": "ipc",
    ".csv": "csv", ".json": "json", ".jsonl": "json", ".ndjson": "json",
}
_COMPRESSION = (".gz", ".bz2", ".zst", ".lz4")
#: a read meeting a transient fault is tried again where it failed up to this many times
#: (at most ``ScanOptions.retries``) before the reader's retry of the whole unit or file
_READ_RETRIES = 2


def format_of_path(path: str) -> str | None:
    name = path.lower()
    for comp in _COMPRESSION:
        if name.endswith(comp):
            name = name[: -len(comp)]
    return _EXTENSIONS.get(os.path.splitext(name)[1])


def normalize_format(fmt: str) -> str:
    try:
        return FORMAT_ALIASES[fmt.lower()]
    except KeyError:
        raise InvalidArgumentError(f"unknown format {fmt!r}; use one of parquet, ipc (arrow/feather), "
                                   "csv, json") from None


def infer_format(entries: Sequence[FileEntry]) -> tuple[str, list[FileEntry]]:
    """The one format of a set of files, from their extensions.

    Files with no recognised extension are ignored when the others agree (``README``, a
    ``.crc`` file), and so are ``.json`` files beside Parquet or Arrow files: they are side
    files (Hugging Face's ``dataset_info.json`` / ``state.json``, a ``metadata.json``), not
    JSON-lines data (``.jsonl`` / ``.ndjson`` always count). Two recognised data formats in
    one source are an error.
    """
    by_format: dict[str, list[FileEntry]] = {}
    for e in entries:
        fmt = format_of_path(e.path)
        if fmt is not None:
            by_format.setdefault(fmt, []).append(e)
    if "json" in by_format and ("parquet" in by_format or "ipc" in by_format) and \
            all(_is_side_json(e.path) for e in by_format["json"]):
        del by_format["json"]
    if len(by_format) == 1:
        (fmt, kept), = by_format.items()
        return fmt, kept
    if not by_format:
        sample = entries[0].path if entries else "?"
        raise InvalidArgumentError(f"cannot infer the format of {sample!r} from its extension; "
                                   "pass format='parquet' | 'ipc' | 'csv' | 'json'")
    listing = ", ".join(f"{k} ({v[0].path!r}...)" for k, v in by_format.items())
    raise InvalidArgumentError(f"files of several formats in one source: {listing}; pass format= "
                               "or point at one kind of file")


def _is_side_json(path: str) -> bool:
    return path.lower().endswith(".json")


#: the unit Parquet's legacy INT96 timestamps are read in: microseconds, as DuckDB and Spark
#: read them. pyarrow's default, nanoseconds, wraps the dates Spark and Hive write as
#: sentinels (9999-12-31 read as 1816-03-30, 0001-01-01 as 1754-08-30) without a word
INT96_UNIT = "us"


def _printable(exc: BaseException, limit: int = 400) -> str:
    """A reader's message about a file, shown: its control bytes (a binary file read as CSV
    quotes them) as ``?`` and at most ``limit`` characters."""
    text = re.sub(r"[\x00-\x08\x0b-\x1f\x7f]", "?", str(exc))
    return text if len(text) <= limit else text[:limit] + "..."


def _file_format(fmt: str, scan: ScanOptions | None = None) -> ds.FileFormat:
    if fmt == "parquet":
        # the default for every scan of this source's datasets (DuckDB's too); arrowload's
        # own scanner passes the same setting with its other fragment options
        verify = scan.page_checksums if scan is not None else ScanOptions().page_checksums
        return ds.ParquetFileFormat(read_options=ds.ParquetReadOptions(coerce_int96_timestamp_unit=INT96_UNIT),
                                    default_fragment_scan_options=ds.ParquetFragmentScanOptions(
                                        page_checksum_verification=verify))
    if fmt == "ipc":
        return ds.IpcFileFormat()
    if fmt == "csv":
        # An empty field is NULL, in a string column too, as DuckDB reads it (and as
        # pyarrow.csv.write_csv writes a null); pyarrow's default would read "" there. Only
        # the empty field: pyarrow's default null markers ("NA", "N/A", "null", "nan", ...)
        # are text (Namibia's "NA") and numbers ("nan" a NaN), as in DuckDB.
        import pyarrow.csv as pacsv
        return ds.CsvFileFormat(convert_options=pacsv.ConvertOptions(strings_can_be_null=True, null_values=[""]))
    if fmt == "json":
        return ds.JsonFileFormat()
    raise AssertionError(fmt)


class _ColumnSizes(PicklableLock):
    """Compressed bytes per top-level column and row group of one Parquet file, read from
    its footer on first use (only ``explain()``, splits and the loader's budget need them).
    ``check()`` says whether the footer's column chunks are safe to read (see footer.py):
    where they are not, sizes are unknown."""

    def __init__(self, meta, check, names: Mapping[str, str] | None = None) -> None:
        self._meta = meta
        self._check = check
        self._names = names  # a column's name in the file -> its name in the source
        self._lock = threading.Lock()
        self._table: list[dict[str, int]] | None = None
        self._known: bool | None = None

    @property
    def known(self) -> bool:
        if self._known is None:
            self._known = self._check().ok
        return self._known

    def table(self) -> list[dict[str, int]]:
        if self._table is None:
            with self._lock:
                if self._table is None:
                    meta = self._meta
                    names = leaf_columns(meta)
                    if self._names:
                        names = [self._names.get(n, n) for n in names]
                    rows = []
                    for rg in range(meta.num_row_groups):
                        sizes: dict[str, int] = {}
                        if self.known:
                            rgm = meta.row_group(rg)
                            for c, key in enumerate(names):
                                sizes[key] = sizes.get(key, 0) + rgm.column(c).total_compressed_size
                        rows.append(sizes)
                    self._table = rows
        return self._table

    def of(self, rg: int) -> "_LazySizes":
        return _LazySizes(self, rg)


class _LazySizes(Mapping):
    """One row group's column sizes, computed with the whole file's on first access;
    ``known`` is False where the footer's column metadata cannot be read."""

    __slots__ = ("_sizes", "_rg", "_row")

    def __init__(self, sizes: _ColumnSizes, rg: int) -> None:
        self._sizes, self._rg, self._row = sizes, rg, None

    @property
    def known(self) -> bool:
        return self._sizes.known

    def _d(self) -> dict[str, int]:
        row = self._row
        if row is None:
            row = self._row = self._sizes.table()[self._rg]
        return row

    def __getitem__(self, key):
        return self._d()[key]

    def __iter__(self):
        return iter(self._d())

    def __len__(self) -> int:
        return len(self._d())

    def __contains__(self, key) -> bool:
        return key in self._d()

    def get(self, key, default=None):
        return self._d().get(key, default)


#: Parquet logical types pyarrow's own readers give as canonical extension types (DuckDB
#: writes them without a stored Arrow schema; the dataset API gives their storage types)
_LOGICAL_EXTENSIONS = {"UUID": (pa.binary(16), pa.uuid), "JSON": (pa.string(), lambda: pa.json_(pa.string()))}


def logical_extensions(schema: pa.Schema, meta) -> pa.Schema:
    """``schema`` (a Parquet fragment's physical schema) with each top-level column whose
    Parquet logical type is UUID or JSON as ``pq.read_table`` types it (``arrow.uuid``,
    ``arrow.json``), where it came through as the plain storage type: a UUID read as 16
    raw bytes casts to text as bytes, not as DuckDB's and pyarrow's UUID text."""
    found = per_schema("logical_extensions", meta, lambda: _logical_kinds(meta))
    if not found:
        return schema
    fields = []
    for f in schema:
        kind = found.get(f.name)
        if kind is not None and f.type == _LOGICAL_EXTENSIONS[kind][0]:
            f = f.with_type(_LOGICAL_EXTENSIONS[kind][1]())
        fields.append(f)
    return pa.schema(fields, schema.metadata)


def _utf8_names(schema: pa.Schema) -> bool:
    """Whether every field name of ``schema`` (nested ones too) decodes as UTF-8 (pyarrow
    raises UnicodeDecodeError on first use of one that does not)."""
    def names(fields) -> None:
        for f in fields:
            _ = f.name
            names(children(f.type))
    try:
        names(schema)
    except UnicodeDecodeError:
        return False
    return True


def _logical_kinds(meta) -> dict[str, str]:
    """Top-level columns of a Parquet file whose logical type is UUID or JSON: name -> kind
    (none where a name is not UTF-8)."""
    found = {}
    try:
        for c in range(meta.num_columns):
            col = meta.schema.column(c)
            name = col.path
            kind = str(getattr(col.logical_type, "type", ""))
            if "." not in name and kind in _LOGICAL_EXTENSIONS:
                found[name] = kind
    except (UnicodeDecodeError, ValueError):
        return {}
    return found


def _encrypted(path: str, exc: BaseException) -> CorruptFileError | None:
    """The error for a Parquet file whose footer is encrypted (pyarrow says so), else None."""
    if "encrypt" not in str(exc).lower():
        return None
    return CorruptFileError(f"cannot read {path!r}: its footer is encrypted (Parquet modular encryption) "
                            "and arrowload cannot decrypt it; decrypt the file with "
                            f"pyarrow.parquet.encryption and its keys, or select other files ({exc})", path)


class FileSource(PicklableLock, Source):
    """Files of one format on one filesystem, sorted by path, with hive partitions.

    Listing happens at construction (a missing path fails fast); footers are fetched on
    first need (one after the other on local disk, ``ScanOptions.io_threads`` at a time
    on object stores), with retries, and cached per file.
    """

    def __init__(self, filesystem: pafs.FileSystem, entries: Sequence[FileEntry], fmt: str,
                 base: str, display: str, partitioning=None,
                 scan_options: ScanOptions | None = None, *, root: str | None = None) -> None:
        self.entries = tuple(sorted(entries, key=lambda e: e.path))
        scan = scan_options or ScanOptions()
        self.filesystem = bind_listing(filesystem, self.entries, min(scan.retries, _READ_RETRIES),
                                       scan.retry_backoff_s)
        #: where hive folders start, as the filesystem spells it; snapshots name files relative to it
        self.base = base
        #: ``base`` as a URI (``s3://bucket/lake``; a local path as it is): a manifest's ``root``
        self.root = root if root is not None else base
        self._partitioning = partitioning
        #: the files of the snapshot this source is pinned to (None: not pinned), by index
        self._pinned: tuple[PinnedFile, ...] | None = None
        self._schema_digest: str | None = None  # a manifest's, checked once footers are read
        self._snapshot_id: str | None = None
        self.kind = fmt
        self.format = _file_format(fmt, scan_options)
        if fmt == "json":
            # pyarrow's JSON dataset reader (26) can deadlock when files of several blocks
            # are read concurrently and no CPU thread is spare; one block per file avoids it
            # (and the schema is inferred from the whole file, not from its first MiB).
            import pyarrow.json as pajson
            biggest = max((e.size or 0 for e in self.entries), default=0)
            self.format = ds.JsonFileFormat(read_options=pajson.ReadOptions(
                block_size=min(max(biggest + 1, 1 << 20), (1 << 31) - 1)))
        self._display = display
        self._scan = scan_options or ScanOptions()
        self._lock = threading.Lock()
        self._facts: tuple | None = None
        self._checks: dict[int, FooterCheck] = {}
        self._footers: dict[int, bytes | None] = {}
        self._fetched: dict[int, tuple] = {}  # file -> (fragment, schema, footer facts)
        self._streams: set[int] = set()  # IPC stream files (read whole, see ipc.py)
        self._rounding_of: tuple | None = None  # (the facts it was found for, _rounding())
        self._leaf_names: dict[str, str] | None = None  # a file column's name -> the source's
        paths = [e.path for e in self.entries]
        if partitioning is False:
            self._partition_schema, self._partition_values = pa.schema([]), [{} for _ in paths]
        else:
            types = partitioning if isinstance(partitioning, pa.Schema) else None
            self._partition_schema, self._partition_values = discover_partitions(hive_base(base), paths, types)

    # -- facts from footers -------------------------------------------------
    @property
    def display(self) -> str:
        return self._display

    @property
    def partition_schema(self) -> pa.Schema:
        return self._partition_schema

    @property
    def has_statistics(self) -> bool:
        return self.kind == "parquet"

    def _fragment(self, i: int) -> ds.FileFragment:
        kwargs = {}
        guarantee = partition_expression(self._partition_schema, self._partition_values[i])  # hive folders
        if guarantee is not None:
            kwargs["partition_expression"] = guarantee
        return self.format.make_fragment(self.entries[i].path, self.filesystem, **kwargs)

    def _fetch(self, i: int):
        path = self.entries[i].path
        frag = self._fragment(i)

        def load():
            if self.kind == "parquet":
                frag.ensure_complete_metadata()
                # the footer's bytes too (one read of the tail, like pyarrow's own): decoded
                # and checked on first use of column chunk metadata (footer.py), so later
                # calls (a display, a filtered query) read no more footers
                meta = frag.metadata
                # on local disk with pyarrow's read (the page cache holds it); on an object
                # store when first checked (``prefetch_checks``): a file pruning skips costs
                # one request pair, not two
                if self._scan.check_footers and self.is_local and known_check(self._version(i)) is None:
                    self._footers[i] = read_footer_bytes(self.filesystem, path, self.entries[i].size,
                                                         meta.serialized_size)
                return logical_extensions(frag.physical_schema, meta), meta
            if self.kind == "ipc":
                try:
                    return frag.physical_schema, frag.count_rows()
                except pa.ArrowInvalid as exc:
                    if not not_an_ipc_file(exc):
                        raise
                    # an IPC stream (Hugging Face datasets' .arrow files), not an IPC file
                    schema, rows = stream_facts(self.filesystem, path, self.is_local)
                    self._streams.add(i)
                    return schema, rows
            return frag.physical_schema, None

        schema, meta = self._read_typed(path, load)
        if not per_schema("utf8_names", meta, lambda: _utf8_names(schema)) if self.kind == "parquet" \
                else not _utf8_names(schema):
            raise CorruptFileError(f"cannot read {path!r}: a column name in it is not valid UTF-8 (Parquet and "
                                   "Arrow store names as UTF-8); rewrite the file with UTF-8 names, or select "
                                   "the other files", path)
        return frag, schema, meta

    def _read_typed(self, path: str, load):
        """``load()`` (a read of ``path``'s footer or header) with the scan's retries, its
        failures as arrowload's typed errors (vanished: ``SnapshotChangedError``; damaged:
        ``CorruptFileError``; the store's: ``storage_error``'s, ``StorageRetryError``)."""
        try:
            return retry(load, retries=self._scan.retries, backoff_s=self._scan.retry_backoff_s)
        except FileNotFoundError as exc:
            raise self._gone(path, exc) from exc
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise _encrypted(path, exc) or CorruptFileError(
                f"cannot read the {self.kind} footer/header of {path!r}: {_printable(exc)}. The file is "
                f"truncated, corrupt or not {self.kind}; remove or rewrite it", path) from exc
        except OSError as exc:
            typed = storage_error(exc, path, local=self.is_local)  # credentials, denied, endpoint
            if typed is not None:
                raise typed from exc
            if is_transient(exc):
                raise StorageRetryError(
                    f"reading {path!r} kept failing after {self._scan.retries} retries: {exc}. The "
                    "storage is failing transiently (timeouts, throttling, dropped connections); try "
                    "again later, or retry longer with al.Options(scan=al.ScanOptions(retries=..., "
                    "retry_backoff_s=...))", path) from exc
            raise _encrypted(path, exc) or CorruptFileError(f"cannot read {path!r}: {exc}", path) from exc
        except Exception as exc:  # botocore's errors are not OSErrors
            typed = storage_error(exc, path, local=self.is_local)
            if typed is None:
                raise
            raise typed from exc

    def _file_facts(self, i: int) -> tuple:
        """``(fragment, physical schema, footer facts)`` of file ``i``, fetched once (a
        race between two threads fetches it twice, to the same result)."""
        got = self._fetched.get(i)
        if got is None:
            got = self._fetched[i] = self._fetch(i)
        return got

    def _footer_workers(self, n: int) -> int:
        """Threads fetching ``n`` footers: one on local disk (a footer is a read of a few
        KiB from the page cache; a thread pool costs more CPU than it saves, and the
        threads would take cores from decoding), ``io_threads`` on object stores, where
        many requests in flight hide their latency."""
        if self.is_local:
            return 1
        return max(1, min(n, self._scan.io_threads))

    def _per_file(self, fn, files: list[int]) -> None:
        """``fn(file)`` for each of ``files``, on ``_footer_workers`` threads."""
        workers = self._footer_workers(len(files))
        if workers == 1:
            for f in files:
                fn(f)
            return
        with ThreadPoolExecutor(workers, thread_name_prefix="arrowload-footer") as pool:
            list(pool.map(fn, files))

    def _ensure(self) -> tuple:
        if self._facts is not None:
            return self._facts
        with self._lock:
            if self._facts is not None:
                return self._facts
            n = len(self.entries)
            missing = [i for i in range(n) if i not in self._fetched]
            if self.kind == "parquet" and self._scan.check_footers and missing:
                recall_checks(default_cache_dir())  # passed in earlier processes: not read again
            self._per_file(self._file_facts, missing)
            fetched = [self._fetched[i] for i in range(n)]
            file_schemas = [(self.entries[i].path, s) for i, (_, s, _) in enumerate(fetched)]
            schema = self._schema_of(file_schemas)
            units = []
            for i, (frag, _, meta) in enumerate(fetched):
                units.extend(self._units_of(i, meta, len(units)))
            if self._pinned is not None:
                self._check_footers_pinned(schema)
            self._facts = (tuple(f for f, _, _ in fetched), schema, tuple(units))
            return self._facts

    def _schema_of(self, file_schemas: list[tuple[str, pa.Schema]]) -> pa.Schema:
        """The source's schema from its files' (unified) and its partition columns."""
        schema = unify_schemas(file_schemas)
        for f in self._partition_schema:
            if f.name not in schema.names:
                schema = schema.append(f)
        return schema

    def head_source(self, rows: int) -> "FileSource | None":
        """The first files, in path order, whose footers say they hold at least ``rows``
        rows, as a source of their own (same filesystem, format, partition columns and
        options); footers are read one by one in file order and no further than needed.
        None where the format's footers hold no row count (CSV, JSON) or ``rows`` needs
        every file. The answer does not depend on what was read before (footers already
        known are reused): ``head(n)`` has the same columns whether or not ``schema`` was
        asked first."""
        if self.kind not in ("parquet", "ipc"):
            return None
        covered, k = 0, 0
        while k < len(self.entries) and (covered < rows or k == 0):
            _, _, meta = self._file_facts(k)
            covered += meta.num_rows if self.kind == "parquet" else meta
            k += 1
        if k == len(self.entries):
            return None
        return self._prefix(k)

    def _prefix(self, k: int) -> "FileSource":
        """This source restricted to its first ``k`` files, sharing what is known of them."""
        sub = copy.copy(self)  # PicklableLock: a fresh lock
        sub.entries = self.entries[:k]
        sub._partition_values = self._partition_values[:k]
        sub._facts = None
        sub._checks = {}
        sub._fetched = {i: f for i, f in self._fetched.items() if i < k}
        sub._footers = self._footers  # shared: whichever checks a file first takes its bytes
        sub._streams = self._streams
        sub._pinned = self._pinned[:k] if self._pinned is not None else None
        sub._snapshot_id = None
        return sub

    def _units_of(self, i: int, meta, start: int) -> list[Unit]:
        path, part = self.entries[i].path, self._partition_values[i]
        if self.kind == "parquet":
            sizes = _ColumnSizes(meta, functools.partial(self.footer_check, i), self._leaf_names)
            return [Unit(start + rg, i, path, rg, meta.row_group(rg).num_rows, sizes.of(rg), part)
                    for rg in range(meta.num_row_groups)]
        size = self.entries[i].size
        rows = meta if self.kind == "ipc" else None
        return [Unit(start, i, path, None, rows, {"*": size} if size is not None else None, part)]

    @property
    def schema(self) -> pa.Schema:
        return self._ensure()[1]

    def units(self) -> tuple[Unit, ...]:
        return self._ensure()[2]

    @property
    def num_files(self) -> int:
        return len(self.entries)

    def changed_files(self, identity: bool = True) -> list[str]:
        """Files that are gone or differ from when they were listed: in size, modification
        time (to the nanosecond, as the same filesystem reports it), or identity (S3 ETag /
        VersionId, GCS generation, local inode; see identity.py), asked afresh
        (``identity=False``: not asked, one batched stat in all)."""
        infos = self.filesystem.get_file_info([e.path for e in self.entries])
        out = []
        for e, info in zip(self.entries, infos):
            mtime = info.mtime_ns if info.mtime is not None else None
            if info.type != pafs.FileType.File or info.size != e.size or \
                    (mtime is not None and e.mtime_ns is not None and mtime != e.mtime_ns):
                out.append(e.path)
            elif identity and e.identity is not None and \
                    identity_of(self.filesystem, e.path, fresh=True) != e.identity:
                out.append(e.path)
        return out

    def footer_check(self, i: int) -> FooterCheck:
        """Whether file ``i``'s column chunk metadata can be read safely (Parquet only):
        decoded from the footer's bytes on first use, in Python, and cached. pyarrow
        aborts the process on encrypted or inconsistent column metadata; nothing hands
        such a chunk to it (see footer.py)."""
        check = self._checks.get(i)
        if check is not None:
            return check
        meta = self.file_metadata(i)
        version = self._version(i)
        check = known_check(version)
        if check is None:
            leaves = [(head, physical) for head, _, physical in leaf_facts(meta)]
            with self._lock:
                footer = self._footers.pop(i, None)
            path = self.entries[i].path
            if footer is None and self._scan.check_footers:
                # an object store's (read when first checked; prefetch_checks reads many side
                # by side), or known when listed and forgotten since (the process-wide cache
                # is bounded): read the bytes now rather than check nothing. Outside the
                # lock: two threads checking one file both read it, to the same answer
                footer = self._footer_now(i, meta)
            check = check_footer(path, footer, leaves)
            if footer is not None:
                remember_check(version, check)
        with self._lock:
            return self._checks.setdefault(i, check)

    def _version(self, i: int) -> tuple | None:
        """What names this version of file ``i``: its size with its modification time and,
        where the store has one, its version marker (an fsspec listing of S3 gives no
        modification time, its ETag names the version); None where the filesystem reports
        neither: then nothing is reused across datasets."""
        e = self.entries[i]
        if e.size is None or (e.mtime_ns is None and e.identity is None):
            return None
        return (type(self.filesystem).__name__, e.path, e.size, e.mtime_ns, e.identity)

    def footer_versions(self) -> list[tuple]:
        """The versions of this source's Parquet files, as footer checks name them
        (``footer.keep_checks`` writes theirs)."""
        if self.kind != "parquet":
            return []
        return [v for v in map(self._version, range(len(self.entries))) if v is not None]

    def _footer_now(self, i: int, meta) -> bytes:
        """File ``i``'s footer bytes read after the dataset was planned: the footer pyarrow
        parsed then (``meta``), or the file changed since (``SnapshotChangedError``). A
        check of another object's bytes would pass pyarrow's old metadata, whose damaged
        column chunks abort the process, or call a healthy rewritten file corrupt. The read
        ends where the listed size did, so a file grown or shrunk since has no footer there
        (or none that long)."""
        path = self.entries[i].path
        try:
            footer = self._read_typed(path, lambda: read_footer_bytes(
                self.filesystem, path, self.entries[i].size, meta.serialized_size))
        except CorruptFileError as exc:  # its tail read when planned: not there now
            raise self._changed(path, f"its footer no longer reads: {exc}") from exc
        if footer is None or len(footer) < meta.serialized_size:
            raise self._changed(path, "its footer is not the one read then")
        return footer

    def prefetch_checks(self, files) -> None:
        """Read the footer bytes of ``files`` not checked yet, side by side (``io_threads``
        on an object store), before each is checked one by one (``footer_check``): planning
        reads them on local disk only, and a serial read per file would pay each request's
        latency in turn."""
        if self.kind != "parquet" or not self._scan.check_footers or self.is_local:
            return
        meta = self._ensure()[0]
        todo = [f for f in dict.fromkeys(files) if f not in self._checks and f not in self._footers
                and known_check(self._version(f)) is None]
        if len(todo) < 2:
            return

        def fetch(f: int) -> None:
            try:
                self._footers[f] = self._footer_now(f, meta[f].metadata)
            except Exception:  # noqa: BLE001 - footer_check reads it again and says what failed
                pass
        self._per_file(fetch, todo)

    def refuse_unreadable(self, files) -> None:
        if self.kind != "parquet":
            return
        files = list(files)
        self.prefetch_checks(files)
        for f in files:
            check = self.footer_check(f)
            if not check.ok:
                raise CorruptFileError(f"cannot read {check.path!r}: {check.reason()}; {check.fix()}",
                                       check.path)

    def file_metadata(self, i: int):
        """The Parquet ``FileMetaData`` of file ``i`` (statistics per row group and column
        chunk), from the footer already fetched: no I/O. None for other formats."""
        if self.kind != "parquet":
            return None
        self._ensure()
        return self._fetched[i][2]  # the object planning read (one per file: footer.schema_key)

    def dataset(self, units: Sequence[int] | None, *, statistics: bool = True,
                columns: Sequence[str] | None = None) -> ds.FileSystemDataset:
        """A dataset over ``units``. ``statistics=True`` (default): the caller may filter or
        prune with it, which makes pyarrow read column chunk metadata, so every file's
        footer is checked first (one read of its tail, once) and an unreadable one raises
        CorruptFileError. ``statistics=False``: a plain read of the columns, where pyarrow
        raises a Python error of its own on such a file."""
        fragments, schema, all_units = self._ensure()
        if self._streams:
            files = list(range(len(fragments))) if units is None else \
                list(dict.fromkeys(all_units[u].file for u in units))
            return self._read_whole(files, schema)
        if self._rounding():
            return self._read_rounded(range(len(all_units)) if units is None else units, columns)
        return self._file_dataset(units, statistics=statistics)

    def dataset_reads_as(self, scan: ScanOptions) -> bool:
        # the fragments verify page checksums as the options this source was opened with say
        return self.kind != "parquet" or scan.page_checksums == self._scan.page_checksums

    def statistics_dataset(self, units: Sequence[int] | None, *, statistics: bool = True) -> ds.Dataset:
        if self._rounding():  # the fragments carry the footers; dataset() reads the rows
            return self._file_dataset(units, statistics=statistics)
        return self.dataset(units, statistics=statistics)

    def _file_dataset(self, units: Sequence[int] | None, *, statistics: bool) -> ds.FileSystemDataset:
        """The files' fragments (row groups subset to ``units``): what ``dataset`` reads
        unless it reads the units here."""
        fragments, schema, all_units = self._ensure()
        if units is None:
            chosen = list(fragments)
            if statistics:
                self.refuse_unreadable(range(len(fragments)))
        else:
            chosen = []
            groups: dict[int, list[int]] = {}
            order: list[int] = []
            for u in units:
                unit = all_units[u]
                if unit.file not in groups:
                    groups[unit.file] = []
                    order.append(unit.file)
                if unit.row_group is not None:
                    groups[unit.file].append(unit.row_group)
            if statistics:
                self.refuse_unreadable(order)
            for f in order:
                frag = fragments[f]
                rgs = groups[f]
                if self.kind == "parquet" and len(rgs) != len(frag.row_groups):
                    frag = frag.subset(row_group_ids=rgs)
                chosen.append(frag)
        return ds.FileSystemDataset(chosen, schema, self.format, self.filesystem)

    def _rounding(self) -> frozenset[int]:
        """Files holding an integer column this source reads as a float (one unified with
        a float column of another file; or integers inside a list or struct so unified).
        DuckDB rounds such integers to the nearest
        double; pyarrow's dataset scan refuses any past 2**53, and polars reads each file
        as it is. Their units are read and cast here (``dataset``; ``schema.widen``)."""
        facts = self._ensure()
        found = self._rounding_of
        if found is None or found[0] is not facts:
            schema = facts[1]
            seen = Counter(schema.names)
            types = {f.name: f.type for f in schema if seen[f.name] == 1}  # (a duplicated name: no unifying)
            by_schema: dict[pa.Schema, bool] = {}  # (a lake of many files has few schemas)

            def rounding(file_schema: pa.Schema) -> bool:
                got = by_schema.get(file_schema)
                if got is None:
                    got = by_schema[file_schema] = any(f.name in types and rounds(f.type, types[f.name])
                                                       for f in file_schema)
                return got
            found = self._rounding_of = (facts, frozenset(
                i for i in range(len(facts[0])) if rounding(self._fetched[i][1])))
        return found[1]

    @property
    def rewrites_rows(self) -> bool:
        """Units are read and cast here, one at a time, never by a pyarrow dataset scan of
        the files or by polars: where a file's integers are read as floats (``_rounding``)."""
        return bool(self._rounding())

    def _read_rounded(self, units: Sequence[int], columns: Sequence[str] | None) -> ds.InMemoryDataset:
        """``units`` read (``columns`` of them, nulls for the others) and cast to the
        unified schema, integers rounded into floats (``schema.widen``), as a dataset."""
        fragments, schema, all_units = self._ensure()
        wanted = None if columns is None else set(columns)
        tables = []
        for u in units:
            unit = all_units[u]
            frag = fragments[unit.file]
            if unit.row_group is not None:
                frag = frag.subset(row_group_ids=[unit.row_group])
            names = [f.name for f in frag.physical_schema
                     if (wanted is None or f.name in wanted) and f.name not in unit.partition]
            try:
                read = frag.to_table(schema=frag.physical_schema, columns=names)
            except FileNotFoundError as exc:
                raise self._gone(unit.path, exc) from exc
            tables.append(conform(read, schema, self._partition_values[unit.file]))
        return ds.InMemoryDataset(tables or [schema.empty_table()], schema=schema)

    @property
    def in_memory_reads(self) -> bool:
        """True when ``dataset()`` reads the chosen files whole into memory (IPC streams):
        its fragments are then in-memory ones, with no path or partition expression (hive
        partition values are columns of the data, and filters on them apply as on any)."""
        self._ensure()
        return bool(self._streams)

    def own_columns(self, f: int, names: Sequence[str]) -> pa.Table:
        """Columns ``names`` of file ``f`` in the file's own types (not the unified ones),
        those it has: what a read error is checked against (``execute._unfit_widening``)."""
        path = self.entries[f].path
        self._ensure()
        if f in self._streams:
            table = read_ipc(self.filesystem, path, True, self.is_local)
            return table.select([n for n in names if n in table.column_names])
        frag = self.format.make_fragment(path, self.filesystem)
        own = frag.physical_schema
        return frag.to_table(columns=[n for n in names if n in own.names], schema=own)

    def _read_whole(self, files: Sequence[int], schema: pa.Schema) -> ds.InMemoryDataset:
        """IPC streams (and IPC files beside them) read whole, in order, as an in-memory
        dataset of the unified schema (a unit is a whole file for IPC)."""
        batches = []
        for f in files:
            path = self.entries[f].path
            try:
                table = retry(lambda: read_ipc(self.filesystem, path, f in self._streams, self.is_local),
                              retries=self._scan.retries, backoff_s=self._scan.retry_backoff_s)
            except FileNotFoundError as exc:
                raise self._gone(path, exc) from exc
            except (pa.ArrowInvalid, OSError) as exc:
                raise CorruptFileError(f"cannot read the Arrow IPC {'stream' if f in self._streams else 'file'} "
                                       f"{path!r}: {exc}; the file is truncated or corrupt; remove or "
                                       "rewrite it", path) from exc
            batches.extend(conform(table, schema, self._partition_values[f]).to_batches())
        return ds.InMemoryDataset(batches, schema=schema)

    @property
    def is_local(self) -> bool:
        fs = self.filesystem
        if isinstance(fs, pafs.LocalFileSystem):
            return True
        handler = getattr(fs, "handler", None)
        inner = getattr(handler, "fs", None)
        protocol = getattr(inner, "protocol", None)
        protocols = protocol if isinstance(protocol, (tuple, list)) else (protocol,)
        return any(p in ("file", "local", "memory") for p in protocols)

    def fingerprint(self) -> str:
        h = hashlib.sha256(f"{self.kind}\n".encode())
        for e in self.entries:
            # milliseconds: fsspec reports float seconds, pyarrow nanoseconds, for the same file
            mtime_ms = e.mtime_ns // 1_000_000 if e.mtime_ns is not None else None
            identity = f"\t{e.identity}" if e.identity is not None else ""
            h.update(f"{e.path}\t{e.size}\t{mtime_ms}{identity}\n".encode())
        h.update(self._partition_schema.to_string().encode())
        return h.hexdigest()[:32]

    # -- snapshots (snapshot.py; formats/snapshot_manifest/v1, formats/loader_state/v3) -------
    @property
    def pinned(self) -> bool:
        """True when this source is bound to a snapshot (``pin()``, a manifest, a loader
        state): its files are checked against it when read."""
        return self._pinned is not None

    def _rows(self, i: int) -> int | None:
        """File ``i``'s row count where a footer already said it (or the snapshot recorded it)."""
        got = self._fetched.get(i)
        if got is not None and self.kind in ("parquet", "ipc") and got[2] is not None:
            return int(got[2].num_rows if self.kind == "parquet" else got[2])
        return self._pinned[i].rows if self._pinned is not None else None

    def _files(self) -> list[PinnedFile]:
        return [PinnedFile(relative(self.base, e.path), e.size, e.mtime_ns, e.identity, self._rows(i))
                for i, e in enumerate(self.entries)]

    @property
    def snapshot_id(self) -> str:
        """``files:`` and a digest of the files (paths relative to the root, sizes,
        modification times, identities); see snapshot.py. No I/O."""
        if self._snapshot_id is None:
            self._snapshot_id = self.files_id
        return self._snapshot_id

    @property
    def files_id(self) -> str:
        """The digest of this source's files (``snapshot_id`` of plain files; a lake table's
        snapshot id names its version instead). No I/O."""
        return snapshot_id(self.kind, self._files())

    def snapshot(self) -> dict:
        """The files of this snapshot as plain data (rows where footers were read)."""
        return {"snapshot_id": self.snapshot_id, "root": self.root, "file_format": self.kind,
                "partitioning": partitioning_doc(self._partitioning, self._partition_schema),
                "files": [{"path": f.path, "size": f.size, "mtime_ns": f.mtime_ns, "identity": f.identity,
                           "rows": f.rows, "partition": {k: json_value(v) for k, v in part.items()}}
                          for f, part in zip(self._files(), self._partition_values)]}

    def manifest(self) -> dict:
        """The ``formats/snapshot_manifest/v1`` document (reads every footer first: row
        counts and the schema digest)."""
        schema = self.schema
        doc = self.snapshot()
        rows = [f["rows"] for f in doc["files"]]
        return {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, **doc,
                "schema_digest": schema_digest(schema),
                "num_rows": None if any(r is None for r in rows) else sum(rows)}

    def state_snapshot(self) -> dict:
        """The compact file list a loader state carries (rows where footers were read)."""
        return compact(self.snapshot_id, self.root, self.kind, self._files())

    def _subset(self, keep: Sequence[int], files: Sequence[PinnedFile]) -> "FileSource":
        """This source over files ``keep`` (indices into ``entries``, in order), pinned to
        ``files``; footers already fetched are shared where the hive columns come out the same."""
        keep = list(keep)
        where = {old: new for new, old in enumerate(keep)}
        sub = copy.copy(self)  # PicklableLock: a fresh lock
        sub.entries = tuple(self.entries[i] for i in keep)
        paths = [e.path for e in sub.entries]
        if self._partitioning is False:
            sub._partition_values = [{} for _ in paths]
        else:
            types = self._partitioning if isinstance(self._partitioning, pa.Schema) else None
            sub._partition_schema, sub._partition_values = discover_partitions(hive_base(self.base), paths, types)
        same = sub._partition_schema.equals(self._partition_schema)
        sub._facts = None
        sub._checks = {}
        sub._fetched = {where[i]: f for i, f in self._fetched.items() if i in where} if same else {}
        sub._footers = {where[i]: b for i, b in self._footers.items() if i in where} if same else {}
        sub._streams = {where[i] for i in self._streams if i in where} if same else set()
        sub._pinned = tuple(files)
        sub._snapshot_id = None
        if not self.pinned:
            sub._display = f"{self._display} (pinned: {len(keep)} files)"
        return sub

    def pin(self) -> "FileSource":
        """This source bound to exactly the files it listed (no I/O here): reads check them
        (``verify``) and refuse a file that changed or vanished since."""
        if self.pinned:
            return self
        return self._subset(range(len(self.entries)), self._files())

    def at_snapshot(self, doc) -> "FileSource":
        """The files of the loader-state snapshot ``doc`` under this source's root, checked
        against this source's listing (size, modification time, identity): a file of the
        snapshot that is gone or differs raises ``SnapshotChangedError`` naming it. Files
        listed now but not in the snapshot (appended since) are left out."""
        if self.reads_as(doc):
            return self
        if "files" not in doc:
            raise LookupError(f"the state's snapshot {doc.get('snapshot')!r} is not a file list, and "
                              f"{self.display} holds other files")
        if doc.get("file_format") != self.kind or doc.get("root") != self.root:
            raise LookupError(f"the state was taken on {doc.get('file_format')} files under "
                              f"{doc.get('root')!r}; this dataset reads {self.kind} files under {self.root!r}")
        try:
            files = files_of_compact(doc, "sources")
        except ValueError as exc:
            raise LookupError(f"the state's file list is damaged ({exc})") from exc
        index = {e.path: i for i, e in enumerate(self.entries)}
        keep, changes = [], []
        for f in files:
            i = index.get(absolute(self.base, f.path))
            what = differs(f, self.entries[i] if i is not None else None)
            if what is not None:
                changes.append((absolute(self.base, f.path), what))
            keep.append(i)
        if changes:
            raise changed_error(changes, "A loader state resumes on the files it was taken on; restore "
                                "them, or start the epoch afresh without the state (a new loader reads "
                                "the data as it is now)")
        if keep != sorted(keep):
            raise LookupError("the state's file list is not in path order; the state was edited")
        sub = self._subset(keep, files)
        if sub.snapshot_id != doc["snapshot"]:
            raise LookupError(f"the state's file list does not give its snapshot id {doc['snapshot']!r}; "
                              "the state was damaged or edited")
        return sub

    def verify(self) -> None:
        """For a pinned source: every pinned file is still there and the same (one stat
        per file, identities asked afresh), else ``SnapshotChangedError`` naming it. An
        unpinned local source: ``_verify_listed``."""
        if self._pinned is None:
            self._verify_listed()
            return
        inner = getattr(getattr(self.filesystem, "handler", None), "fs", None)
        if inner is not None and hasattr(inner, "invalidate_cache"):
            inner.invalidate_cache()
        from .filesystem import file_entry
        try:
            infos = self.filesystem.get_file_info([e.path for e in self.entries])
        except OSError as exc:
            typed = storage_error(exc, self.root, local=self.is_local)
            raise (typed or exc) from exc
        changes = []
        for e, info, f in zip(self.entries, infos, self._pinned):
            now = file_entry(info, self.filesystem) if info.type == pafs.FileType.File else None
            what = differs(f, now)
            if what is not None:
                changes.append((e.path, what))
        if changes:
            raise changed_error(changes, self._fix())

    def _changed(self, path: str, why: str) -> Exception:
        """The error for a listed file found changed after planning (``why``)."""
        return files_changed_error([path], "the dataset", f"it was planned ({why})", self._changed_advice())

    def _gone(self, path: str, exc: BaseException) -> Exception:
        """The error for a listed file no longer there: the data changed under the dataset,
        as for a file rewritten (``SnapshotChangedError``; a table source says which
        snapshot)."""
        return files_changed_error([path], "the dataset", f"it was listed ({exc})", self._changed_advice())

    def _verify_listed(self) -> None:
        """An unpinned local source: its files still the ones listed, in size and
        modification time (one batched stat, about 1 us a file), else
        ``SnapshotChangedError`` naming them. Its footers, read once, would otherwise be
        taken for a rewritten file's: their statistics prune rows the file now holds (a
        rewrite with the same layout read wrong rows without a word), their offsets fail
        the read. Remote files are not stat-ed here (a request each): through fsspec each is
        checked as a read opens it (``filesystem.bind_listing``), and ``pin()`` checks them all."""
        if not self.is_local or not self.entries:
            return
        try:
            changed = self.changed_files(identity=False)
        except OSError:
            return  # the read's own error says more
        if changed:
            raise files_changed_error(changed, "the dataset", "it was opened", self._changed_advice())

    def check_read(self, files) -> None:
        """Local files whose rows were just read: still the versions listed (a stat each,
        about 2 us), else ``SnapshotChangedError``. A loader's epoch reads its files one
        after another, long after the check its iteration started with (``verify``): a file
        rewritten in place meanwhile would hand its new rows out as the snapshot's. Checked
        after the read, so rows read from a file that changed before or while they were read
        never pass; remote files are checked as each read opens them (``bind_listing``)."""
        if not self.is_local or not files:
            return
        entries = [self.entries[i] for i in files]
        # the filesystem's own stat, as the listing's (pyarrow rounds a modification time
        # through a double: os.stat's nanoseconds differ from the listed ones)
        for e, info in zip(entries, self.filesystem.get_file_info([e.path for e in entries])):
            if info.type != pafs.FileType.File:
                raise self._gone(e.path, FileNotFoundError(e.path))
            # size exact, modification time to the millisecond, as a pinned snapshot is checked
            # (a manifest's files copied elsewhere keep their times to that precision)
            what = differs(e, FileEntry(e.path, info.size, info.mtime_ns if info.mtime is not None else None, None))
            if what is not None:
                raise self._changed(e.path, what)

    def _changed_advice(self) -> str:
        """What to do about files changed under an unpinned dataset."""
        return (f"open the dataset again (al.dataset({self.root!r})) to read the files as they are now; "
                "Dataset.pin() keeps a dataset on the files as they were")

    def _fix(self) -> str:
        return ("This dataset is pinned to the files as they were (Dataset.pin(), a manifest or a loader "
                "state); restore those files, or open the data as it is now with "
                f"al.dataset({self.root!r}) (a new snapshot)")

    def _check_footers_pinned(self, schema: pa.Schema) -> None:
        """Footers against the pinned snapshot: row counts and, from a manifest, the schema."""
        changes = []
        for i, f in enumerate(self._pinned):
            rows = self._fetched.get(i)
            if f.rows is None or rows is None or self.kind not in ("parquet", "ipc"):
                continue
            now = int(rows[2].num_rows if self.kind == "parquet" else rows[2])
            if now != f.rows:
                changes.append((self.entries[i].path, f"holds {now} rows, the snapshot recorded {f.rows}"))
        if changes:
            raise changed_error(changes, self._fix())
        if self._schema_digest is not None and schema_digest(schema) != self._schema_digest:
            raise changed_error([(self.entries[0].path, "and the others give another schema than the "
                                  "manifest recorded")], self._fix())
