"""Arrow IPC *stream* files (what Hugging Face ``datasets`` writes as ``.arrow``) beside
IPC *files* (Feather v2).

pyarrow's dataset layer reads only the IPC file format (it needs the footer's record
batch index). A stream has no footer: its batches follow one another. So a source whose
``.arrow`` files include streams reads the chosen files whole into an in-memory dataset:
local files through a memory map (zero-copy, the batches view the mapped file, as
``datasets`` itself does), remote ones in one read each. Which format a file has is
known from its first bytes (``ARROW1`` opens an IPC file); pyarrow tells it apart for
us when its file reader refuses the file.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.fs as pafs

from .schema import widen


def not_an_ipc_file(exc: BaseException) -> bool:
    """Whether pyarrow's IPC *file* reader refused the file for lacking the file magic."""
    return isinstance(exc, pa.ArrowInvalid) and "Not an Arrow file" in str(exc)


def _open(fs: pafs.FileSystem, path: str, local: bool):
    if local and isinstance(fs, pafs.LocalFileSystem):
        return pa.memory_map(path, "r")
    return fs.open_input_file(path)


def stream_facts(fs: pafs.FileSystem, path: str, local: bool) -> tuple[pa.Schema, int | None]:
    """The schema of an IPC stream file and, on local disk, its exact row count (the
    batches' headers, read through a memory map: no data is copied). Elsewhere the row
    count is unknown until the file is read (None)."""
    with _open(fs, path, local) as f:
        reader = pa.ipc.open_stream(f)
        if not local:
            return reader.schema, None
        rows = 0
        for batch in reader:
            rows += batch.num_rows
        return reader.schema, rows


def read_ipc(fs: pafs.FileSystem, path: str, stream: bool, local: bool) -> pa.Table:
    """A whole IPC stream or file as a Table (zero-copy over a memory map locally)."""
    source = _open(fs, path, local)
    try:
        reader = pa.ipc.open_stream(source) if stream else pa.ipc.open_file(source)
        return reader.read_all()
    finally:
        if not local:  # locally the table's buffers are views of the memory map: it stays open
            source.close()


def conform(table: pa.Table, schema: pa.Schema, partition: dict) -> pa.Table:
    """``table`` with exactly ``schema``'s columns: cast where the unified type is wider,
    nulls for a column the file lacks, the hive partition value for partition columns."""
    arrays = []
    n = table.num_rows
    for f in schema:
        if f.name in partition:
            arrays.append(pa.array([partition[f.name]] * n, f.type))
        elif f.name in table.schema.names:
            arrays.append(widen(table.column(f.name), f.type))
        else:
            arrays.append(pa.nulls(n, f.type))
    return pa.Table.from_arrays(arrays, schema=schema)
