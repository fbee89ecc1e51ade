"""Write a plan's output, in its order, as a few files of bounded size.

Rows are gathered into groups of ``ROW_GROUP_ROWS`` (the loader's unit of work: 65,536
rows) or ``ROW_GROUP_BYTES`` of Arrow data, whichever comes first; each group is one
Parquet row group (or one record batch of an Arrow IPC file), and a new file starts once a
file holds ``FILE_BYTES`` of Arrow data. Only one group is held in memory at a time.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import contextmanager

import pyarrow as pa

from ..errors import SchemaMismatchError
from .documents import CachedFile
from .store import Store

ROW_GROUP_ROWS = 65_536
ROW_GROUP_BYTES = 64 << 20
FILE_BYTES = 512 << 20
EXTENSIONS = {"parquet": "parquet", "ipc": "arrow"}


class _FileWriter:
    def __init__(self, store: Store, path: str, name: str, schema: pa.Schema, fmt: str) -> None:
        self.name = name
        self.sink = store.open_output(path)
        if fmt == "parquet":
            import pyarrow.parquet as pq
            with _parquet_types(schema):
                self.writer = pq.ParquetWriter(self.sink, schema, store_schema=True)
        else:
            self.writer = pa.ipc.new_file(self.sink, schema)
        self.fmt = fmt
        self.rows = 0
        self.arrow_bytes = 0

    def write(self, table: pa.Table) -> None:
        if self.fmt == "parquet":
            with _parquet_types(table.schema):
                self.writer.write_table(table, row_group_size=max(1, table.num_rows))
        else:
            for batch in table.combine_chunks().to_batches(max_chunksize=max(1, table.num_rows)):
                self.writer.write_batch(batch)
        self.rows += table.num_rows
        self.arrow_bytes += table.nbytes

    def close(self) -> int:
        """Finish the file; its size in bytes."""
        self.writer.close()
        size = self.sink.tell()
        self.sink.close()
        return int(size)


@contextmanager
def _parquet_types(schema: pa.Schema):
    """pyarrow refusing to write a column type to Parquet (intervals, run-end encoded,
    dictionaries of string views) as the error that says to cache as IPC."""
    try:
        yield
    except pa.ArrowNotImplementedError as exc:
        raise SchemaMismatchError(
            f"Parquet cannot store some column types of the plan ({exc}; columns: "
            f"{', '.join(f'{f.name} ({f.type})' for f in schema)}); use cache(format='ipc'), which "
            "stores every Arrow type") from None


def write_files(batches: Iterable[pa.RecordBatch], schema: pa.Schema, store: Store, folder: str,
                prefix: str, fmt: str) -> list[CachedFile]:
    """Write ``batches`` (of ``schema``) under ``folder`` as ``part-00000.<ext>`` ...; the
    files, named ``prefix/part-...`` (relative to the entry), with their rows and bytes.
    At least one file is written (an empty result is a file with the schema and no rows)."""
    ext = EXTENSIONS[fmt]
    done: list[CachedFile] = []
    current: _FileWriter | None = None
    held: list[pa.RecordBatch] = []
    held_rows = held_bytes = 0

    def open_next() -> _FileWriter:
        name = f"part-{len(done):05d}.{ext}"
        return _FileWriter(store, store.join(folder, name) if store.fs is None else f"{folder}/{name}",
                           name, schema, fmt)

    def finish(w: _FileWriter) -> None:
        size = w.close()
        done.append(CachedFile(f"{prefix}/{w.name}", w.rows, size))

    def flush() -> None:
        nonlocal current, held, held_rows, held_bytes
        if not held_rows:
            return
        table = pa.Table.from_batches(held, schema=schema)
        held, held_rows, held_bytes = [], 0, 0
        if current is None:
            current = open_next()
        current.write(table)
        if current.arrow_bytes >= FILE_BYTES:
            finish(current)
            current = None

    try:
        for batch in batches:
            if batch.schema != schema:
                batch = pa.RecordBatch.from_arrays(batch.columns, schema=schema)
            while batch.num_rows:
                take = min(batch.num_rows, ROW_GROUP_ROWS - held_rows)
                part = batch.slice(0, take) if take < batch.num_rows else batch
                batch = batch.slice(take) if take < batch.num_rows else batch.slice(0, 0)
                held.append(part)
                held_rows += part.num_rows
                held_bytes += part.nbytes
                if held_rows >= ROW_GROUP_ROWS or held_bytes >= ROW_GROUP_BYTES:
                    flush()
        flush()
        if current is None and not done:
            current = open_next()  # no rows: one file holding the schema
        if current is not None:
            finish(current)
            current = None
    finally:
        if current is not None:
            try:
                current.close()
            except Exception:  # noqa: BLE001 - already failing; the attempt folder is removed
                pass
    return done
