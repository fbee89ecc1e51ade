"""Lake table folders (Delta Lake, Iceberg) are never read as plain Parquet: a table's
root folder is read through its log / metadata (``al.delta``, tests/test_delta.py;
``al.iceberg``, tests/test_iceberg.py), a folder inside one is refused.

The tables are written by the real libraries (``deltalake``; ``pyiceberg`` with a
``SqlCatalog`` on sqlite in a temporary folder), with overwrites and deletes, so the
folder holds many more rows than the table: the libraries' own reads are the truth that
reading the folder would be wrong.
"""

from __future__ import annotations

import glob
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import arrowload as al
from _support import moto_s3_server


@pytest.fixture(scope="module")
def delta_table(tmp_path_factory) -> str:
    from deltalake import DeltaTable, write_deltalake

    path = str(tmp_path_factory.mktemp("delta") / "events")
    for i in range(3):
        write_deltalake(path, pa.table({"id": list(range(i * 10, i * 10 + 10)),
                                        "part": ["a"] * 5 + ["b"] * 5}),
                        mode="append", partition_by=["part"])
    write_deltalake(path, pa.table({"id": list(range(8)), "part": ["a"] * 4 + ["b"] * 4}),
                    mode="overwrite", partition_by=["part"])
    DeltaTable(path).delete("id >= 5")
    return path


@pytest.fixture(scope="module")
def iceberg_table(tmp_path_factory) -> str:
    from pyiceberg.catalog.sql import SqlCatalog

    warehouse = tmp_path_factory.mktemp("iceberg")
    catalog = SqlCatalog("test", uri=f"sqlite:///{warehouse}/catalog.db",
                         warehouse=f"file://{warehouse}")
    catalog.create_namespace("ns")
    schema = pa.schema([("id", pa.int64()), ("s", pa.string())])
    table = catalog.create_table("ns.events", schema=schema)
    table.append(pa.table({"id": [1, 2, 3], "s": ["a", "b", "c"]}, schema=schema))
    table.append(pa.table({"id": [4, 5, 6], "s": ["d", "e", "f"]}, schema=schema))
    table.overwrite(pa.table({"id": [7, 8, 9], "s": ["g", "h", "i"]}, schema=schema))
    table.delete("id >= 9")
    return table.location().removeprefix("file://")


def _folder_rows(folder: str) -> int:
    return sum(pq.read_metadata(p).num_rows
               for p in glob.glob(os.path.join(folder, "**", "*.parquet"), recursive=True))


def test_delta_fixture_has_dead_rows(delta_table):
    from deltalake import DeltaTable
    assert DeltaTable(delta_table).to_pyarrow_table().num_rows == 5
    assert _folder_rows(delta_table) > 5  # what reading the folder as Parquet would return


def test_delta_table_folder_reads_its_live_rows(delta_table):
    from deltalake import DeltaTable
    got = al.dataset(delta_table).to_arrow()
    assert sorted(got.column("id").to_pylist()) == \
        sorted(DeltaTable(delta_table).to_pyarrow_table().column("id").to_pylist())


@pytest.mark.parametrize("where", ["partition", "glob"])
def test_delta_folder_is_refused(delta_table, where):
    path = {"partition": os.path.join(delta_table, "part=a"),
            "glob": os.path.join(delta_table, "*", "*.parquet")}[where]
    with pytest.raises(al.LakeTableError) as info:
        al.dataset(path)
    err = info.value
    assert isinstance(err, al.ArrowloadError) and isinstance(err, ValueError)
    assert err.table_format == "delta"
    assert os.path.samefile(err.table_root, delta_table)
    msg = str(err)
    assert "Delta Lake" in msg and "_delta_log" in msg and "deleted and overwritten rows" in msg
    assert "al.delta(" in msg and path in msg


def test_delta_live_files_listed_explicitly_still_read(delta_table):
    """A list of files (what ``DeltaTable.file_uris()`` gives) is the caller's choice: read."""
    from deltalake import DeltaTable
    dt = DeltaTable(delta_table)
    files = [u.removeprefix("file://") for u in dt.file_uris()]
    got = al.dataset(files).select("id").to_arrow()
    assert sorted(got.column("id").to_pylist()) == sorted(dt.to_pyarrow_table().column("id").to_pylist())


def test_iceberg_fixture_has_dead_rows(iceberg_table):
    assert _folder_rows(iceberg_table) > 2  # the live table: ids 7 and 8


def test_iceberg_table_folder_reads_its_live_rows(iceberg_table):
    """The root folder opens its newest metadata file (al.iceberg, tests/test_iceberg.py)."""
    got = al.dataset(iceberg_table).to_arrow()
    assert sorted(got.column("id").to_pylist()) == [7, 8]  # pyiceberg's own read of it


@pytest.mark.parametrize("where", ["data", "glob"])
def test_iceberg_folder_is_refused(iceberg_table, where):
    path = {"data": os.path.join(iceberg_table, "data"),
            "glob": os.path.join(iceberg_table, "data", "*.parquet")}[where]
    with pytest.raises(al.LakeTableError) as info:
        al.dataset(path)
    err = info.value
    assert err.table_format == "iceberg"
    assert os.path.samefile(err.table_root, iceberg_table)
    msg = str(err)
    assert "Iceberg" in msg and "metadata.json" in msg and f"al.iceberg({err.table_root!r})" in msg and path in msg


def test_plain_parquet_folder_with_metadata_json_is_not_a_table(tmp_path, assert_tables_equal):
    """No false positive: a ``metadata.json`` side file and a ``metadata`` data folder."""
    t = pa.table({"id": list(range(10)), "x": [float(i) for i in range(10)]})
    (tmp_path / "metadata").mkdir()
    pq.write_table(t.slice(0, 5), tmp_path / "a.parquet")
    pq.write_table(t.slice(5), tmp_path / "metadata" / "b.parquet")
    (tmp_path / "metadata.json").write_text('{"description": "not a table"}')
    assert_tables_equal(al.dataset(str(tmp_path)).to_arrow(), t)


def test_delta_table_on_s3_is_refused(delta_table):
    """Through a real S3 API (moto on loopback): a partition and a glob inside the table."""
    import s3fs
    with moto_s3_server() as url:
        s3 = s3fs.S3FileSystem(endpoint_url=url, key="testing", secret="testing",
                               skip_instance_cache=True)
        s3.mkdir("lakes")
        for folder, _, names in os.walk(delta_table):
            for name in names:
                rel = os.path.relpath(os.path.join(folder, name), delta_table).replace(os.sep, "/")
                s3.put_file(os.path.join(folder, name), f"lakes/events/{rel}")
        options = {"endpoint_url": url, "key": "testing", "secret": "testing"}
        for uri in ("s3://lakes/events/part=b/", "s3://lakes/events/*/*.parquet"):
            with pytest.raises(al.LakeTableError, match="Delta Lake"):
                al.dataset(uri, storage_options=options)
