"""Sources: URI -> filesystem, discovery of files and partitions, footers, schema unification."""

from __future__ import annotations

import os
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds

import pyarrow.fs as pafs

from ..errors import ArgumentTypeError, ArrowloadError, CorruptFileError, InvalidArgumentError, LakeTableError
from ..options import ScanOptions
from .base import Source, Unit
from .files import FileSource, format_of_path, infer_format, normalize_format
from .filesystem import (_GLOB_CHARS, FileEntry, check_path, file_entry, filesystem_for,
                         list_files, protocol_of, to_pyarrow_fs)
from .lake import newest_iceberg_metadata, refuse_lake_table
from .memory import MemorySource
from . import snapshot

__all__ = ["FileSource", "MemorySource", "Source", "Unit", "open_source"]


def _memory_table(source: Any) -> tuple[Any, str] | None:
    """In-memory inputs as a pyarrow Table / RecordBatchReader, or None if not one."""
    if isinstance(source, pa.Table):
        return source, f"memory table ({source.num_rows} rows)"
    if isinstance(source, pa.RecordBatch):
        return pa.Table.from_batches([source]), f"memory batch ({source.num_rows} rows)"
    if isinstance(source, pa.RecordBatchReader):
        return source, "memory RecordBatchReader"
    mod = type(source).__module__.split(".")[0]
    if mod == "polars":
        import polars as pl
        if isinstance(source, pl.LazyFrame):
            source = source.collect()
        if isinstance(source, pl.DataFrame):
            return source.to_arrow(), f"polars DataFrame ({source.height} rows)"
    if mod == "pandas":
        import pandas as pd
        if isinstance(source, pd.DataFrame):
            table = pa.Table.from_pandas(source, preserve_index=False)
            return table.replace_schema_metadata(None), f"pandas DataFrame ({len(source)} rows)"
    return None


def open_source(source: Any, *, format: str | None = None, partitioning: Any = None,
                filesystem: Any = None, storage_options: dict | None = None,
                scan_options: ScanOptions | None = None) -> Source:
    """Resolve what the user passed to ``al.dataset`` into a Source (listing files now,
    reading footers later)."""
    scan_options = scan_options or ScanOptions()
    mem = _memory_table(source)
    if mem is not None:
        return MemorySource(*mem)
    if isinstance(source, ds.FileSystemDataset):
        files = list(source.files)
        fs = source.filesystem
        fmt = {"parquet": "parquet", "ipc": "ipc", "csv": "csv", "json": "json"}.get(
            source.format.default_extname, None) or format_of_path(files[0]) or "parquet"
        infos = fs.get_file_info(files)
        entries = [file_entry(i, fs) for i in infos]
        base = os.path.commonpath(files) if len(files) > 1 else os.path.dirname(files[0])
        return FileSource(fs, entries, fmt, base, f"pyarrow dataset ({len(files)} files)",
                          partitioning, scan_options)
    if isinstance(source, ds.Dataset):
        return MemorySource(source.to_table(), "pyarrow dataset (in memory)")
    paths = [source] if isinstance(source, (str, bytes, os.PathLike)) else _path_list(source)
    if not paths:
        raise InvalidArgumentError("al.dataset() needs at least one path; got an empty list")
    paths = [check_path(os.fspath(p)) for p in paths]
    if format is None and len(paths) == 1 and _may_be_manifest(paths[0]):
        doc = _manifest_at(paths[0], filesystem, storage_options)
        if doc is not None:
            return _open_manifest(doc, paths[0], filesystem, storage_options, scan_options)
    if filesystem is not None:
        pafs = list_fs = to_pyarrow_fs(filesystem)
        stripped = [_strip_for(filesystem, p) for p in paths]
    else:
        protocols = {protocol_of(p) or "file" for p in paths}
        if len(protocols) > 1:
            raise InvalidArgumentError(f"paths on several filesystems ({sorted(protocols)}); one "
                                       "dataset reads from one filesystem: open one dataset per "
                                       "filesystem")
        pafs, _ = filesystem_for(paths[0], storage_options)
        list_fs, _ = filesystem_for(paths[0], storage_options, listing=True)
        stripped = [filesystem_for(p, storage_options)[1] for p in paths]
    entries: dict[str, FileEntry] = {}
    bases = []
    for p, url in zip(stripped, paths):
        base, found = list_files(list_fs, p, retries=scan_options.retries,
                                 backoff=scan_options.retry_backoff_s, url=url)
        named = len(found) == 1 and found[0].path == p  # the file the caller named
        # a glob, unless nothing matched it and it named a folder itself (list_files)
        globbed = bool(_GLOB_CHARS & set(p)) and not named and base != (p.rstrip("/") or "/")
        if globbed or not named:
            kind = _lake_root(list_fs, base) if len(paths) == 1 and not globbed else None
            if kind is not None:
                # a table's own folder: read through its log / metadata, latest version
                name, opener = {"delta": ("a Delta Lake", "al.delta"),
                                "iceberg": ("an Apache Iceberg", "al.iceberg")}[kind]
                if filesystem is not None or format not in (None, "parquet") or partitioning is not None:
                    raise LakeTableError(
                        f"{url!r} is {name} table folder: open it with {opener}({url!r}, "
                        "storage_options=...) or al.dataset() without filesystem= / format= / "
                        "partitioning= (the table's log / metadata says where its files are and how "
                        "they are typed)", path=url, table_format=kind, table_root=base)
                if kind == "delta":
                    from .delta import open_delta
                    return open_delta(url, storage_options=storage_options, scan_options=scan_options)
                from .iceberg import open_iceberg
                return open_iceberg(url, storage_options=storage_options, scan_options=scan_options)
            # a folder or glob (not a file the caller named): refuse lake table folders
            refuse_lake_table(list_fs, base, url, retries=scan_options.retries,
                              backoff=scan_options.retry_backoff_s)
        bases.append(base)
        for e in found:
            entries.setdefault(e.path, e)
    all_entries = sorted(entries.values(), key=lambda e: e.path)
    if format is None:
        fmt, all_entries = infer_format(all_entries)
    else:
        fmt = normalize_format(format)
    if fmt in ("csv", "json") and len(all_entries) > 1:
        # a zero-byte text shard holds no rows (and no header to type): left out, as DuckDB
        # reads such a folder; pyarrow's dataset refused the whole folder
        all_entries = [e for e in all_entries if e.size != 0] or all_entries[:1]
    base = bases[0] if len(set(bases)) == 1 else os.path.commonpath(bases)
    display = paths[0] if len(paths) == 1 else f"{len(paths)} paths ({paths[0]}, ...)"
    return FileSource(pafs, all_entries, fmt, base, display, partitioning, scan_options,
                      root=_root_uri(filesystem, paths[0], base))


def _root_uri(filesystem: Any, first: str, base: str) -> str:
    """``base`` as a URI: with the scheme of the paths given (or of ``filesystem``); a
    local path as it is."""
    proto = protocol_of(first)
    if proto is None and filesystem is not None:
        named = getattr(filesystem, "protocol", None) or getattr(filesystem, "type_name", None)
        proto = named[0] if isinstance(named, (tuple, list)) else named
    if proto in (None, "file", "local"):
        return base
    return f"{proto}://{base.lstrip('/')}"


def _may_be_manifest(path: str) -> bool:
    """Whether ``path`` is worth a look for a manifest header: one file (no glob) named
    ``.json``, or with an extension no data format has (a folder has none, and is not
    opened for it)."""
    if _GLOB_CHARS & set(path) or path.endswith("/"):
        return False
    fmt = format_of_path(path)
    return fmt == "json" or (fmt is None and bool(os.path.splitext(path.rsplit("/", 1)[-1])[1]))


def _manifest_at(path: str, filesystem: Any, storage_options: dict | None) -> dict | None:
    """The snapshot manifest at ``path`` (recognised by its header, whatever its name),
    or None when the file is something else (JSON-lines data) or not there."""
    import json
    proto = protocol_of(path)
    try:
        if filesystem is not None:
            fs, stripped = to_pyarrow_fs(filesystem), _strip_for(filesystem, path)
        elif proto in (None, "file", "local"):
            fs, stripped = filesystem_for(path, None)
        else:
            fs, stripped = filesystem_for(path, storage_options)
        with fs.open_input_stream(stripped) as f:
            head = f.read(snapshot.PEEK_BYTES)
            if not snapshot.looks_like_manifest(head):
                return None
            text = head + f.read()
    except (OSError, ArrowloadError):
        return None  # not there, or not readable: the ordinary path says why
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise CorruptFileError(f"{path}: starts like an arrowload snapshot manifest but is not JSON ({exc}); "
                               "write it again with Dataset.save_manifest()", path) from exc
    return snapshot.read_manifest(doc, path)


def _open_manifest(doc: dict, where: str, filesystem: Any, storage_options: dict | None,
                   scan_options: ScanOptions) -> FileSource:
    """A FileSource pinned to the manifest ``doc``'s files, checked now (a stat per file)."""
    root = doc["root"]
    if filesystem is not None:
        fs, base = to_pyarrow_fs(filesystem), _strip_for(filesystem, root)
    else:
        fs, base = filesystem_for(root, storage_options)
    pinned = snapshot.manifest_files(doc)
    entries = [FileEntry(snapshot.absolute(base, f.path), f.size, f.mtime_ns, f.identity) for f in pinned]
    partitioning = snapshot.partitioning_arg(doc["partitioning"], where)
    src = FileSource(fs, entries, doc["file_format"], base, f"{where} (manifest of {root}, {len(entries)} files)",
                     partitioning, scan_options, root=root)
    src = src._subset(range(len(entries)), pinned)
    src._display = f"{where} (manifest of {root}, {len(entries)} files)"
    src._schema_digest = doc["schema_digest"]
    src.verify()
    return src


def _lake_root(fs, folder: str) -> str | None:
    """``"delta"`` / ``"iceberg"`` where the listed ``folder`` is a table's root (it holds
    ``_delta_log/``, or ``metadata/*.metadata.json``); None otherwise (a folder inside a
    table is refused by ``refuse_lake_table``)."""
    root = folder.rstrip("/")
    try:
        delta, meta = fs.get_file_info([f"{root}/_delta_log", f"{root}/metadata"])
    except OSError:
        return None
    if delta.type == pafs.FileType.Directory:
        return "delta"
    if meta.type == pafs.FileType.Directory and newest_iceberg_metadata(fs, root) is not None:
        return "iceberg"
    return None


def _path_list(source: Any) -> list:
    """A list of paths from an iterable; anything else is an ArgumentTypeError."""
    try:
        paths = list(source)
    except TypeError:
        raise ArgumentTypeError(f"al.dataset() takes a path, URI, list of paths, or an in-memory "
                                f"table / frame; got {type(source).__name__}") from None
    for p in paths:
        if not isinstance(p, (str, bytes, os.PathLike)):
            raise ArgumentTypeError(f"al.dataset() takes paths as str or os.PathLike; got "
                                    f"{type(p).__name__} ({p!r:.60})")
    return paths


def _strip_for(filesystem: Any, path: str) -> str:
    strip = getattr(filesystem, "_strip_protocol", None)
    if strip is not None:
        return strip(path)
    if protocol_of(path) is not None:
        return path.split("://", 1)[1]
    return path
