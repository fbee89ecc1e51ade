"""Delta Lake tables read at a pinned version (``al.delta`` / ``al.dataset`` of a table folder).

Truths from outside arrowload: ``deltalake``'s own read (``DeltaTable(...).to_pyarrow_table()``)
where it is right (no column mapping, no deletion vectors), DuckDB for filters over that
truth, the rows written for a column-mapped table (deltalake reads every value of it as
null), and for deletion vectors a table written by hand to the Delta protocol, whose live
rows are known by construction and also cross-checked with ``deltalake``'s own decoding of
its vectors (``DeltaTable.deletion_vectors()``).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import struct
import time
import uuid
import zlib
from collections import Counter

import duckdb
import jsonschema
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import arrowload as al
from _support import CountingLocalFileSystem, moto_s3_server, state_after
from _support import flat_ids, sorted_rows


# -- fixtures -------------------------------------------------------------------------

def _rows(start: int, n: int, extra: bool = False) -> pa.Table:
    ids = list(range(start, start + n))
    cols = {"id": pa.array(ids, pa.int64()),
            "part": [("a", "b", "c d")[i % 3] for i in ids],
            "n": pa.array([i % 2 for i in ids], pa.int32()),
            "x": [float(i) / 4 for i in ids]}
    if extra:
        cols["extra"] = [f"e{i}" for i in ids]
    return pa.table(cols)


@pytest.fixture(scope="module")
def versions(tmp_path_factory) -> tuple[str, list[float]]:
    """A table partitioned by a string and an int column, through five versions:
    0 write, 1 append, 2 delete (delta-rs rewrites the files), 3 append with a new
    column (schema evolution), 4 overwrite of part of the rows then an append (5).
    Returns the path and each version's commit time (seconds)."""
    from deltalake import DeltaTable, write_deltalake
    path = str(tmp_path_factory.mktemp("delta") / "events")
    kw = dict(partition_by=["part", "n"])
    times = []
    write_deltalake(path, _rows(0, 300), **kw)
    times.append(time.time())
    time.sleep(0.02)
    write_deltalake(path, _rows(300, 300), mode="append", **kw)
    times.append(time.time())
    time.sleep(0.02)
    DeltaTable(path).delete("id % 7 = 0")
    times.append(time.time())
    time.sleep(0.02)
    write_deltalake(path, _rows(600, 150, extra=True), mode="append", schema_mode="merge", **kw)
    times.append(time.time())
    time.sleep(0.02)
    write_deltalake(path, _rows(1000, 90, extra=True), mode="overwrite", **kw)
    times.append(time.time())
    write_deltalake(path, _rows(2000, 60, extra=True), mode="append", **kw)
    times.append(time.time())
    return path, times


def _truth(path: str, version: int | None = None) -> pa.Table:
    from deltalake import DeltaTable
    return DeltaTable(path, version=version).to_pyarrow_table()


Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"


def _z85(data: bytes) -> str:
    out = []
    for i in range(0, len(data), 4):
        v = int.from_bytes(data[i:i + 4], "big")
        chars = []
        for _ in range(5):
            chars.append(Z85[v % 85])
            v //= 85
        out.append("".join(reversed(chars)))
    return "".join(out)


def _bitmap(rows) -> bytes:
    """Delta's serialized bitmap (PROTOCOL.md "Deletion Vector Format"): magic, then a
    portable 64-bit RoaringBitmap of one bucket, array containers."""
    containers: dict[int, list[int]] = {}
    for r in sorted(rows):
        containers.setdefault(r >> 16, []).append(r & 0xFFFF)
    body = struct.pack("<II", 12346, len(containers))
    for k, v in containers.items():
        body += struct.pack("<HH", k, len(v) - 1)
    offset = 8 + 8 * len(containers)
    for v in containers.values():
        body += struct.pack("<I", offset)
        offset += 2 * len(v)
    for v in containers.values():
        body += struct.pack(f"<{len(v)}H", *v)
    return struct.pack("<IQI", 1681511377, 1, 0) + body


DV_DELETED = {0: [1, 5, 9, 10], 1: [0, 4, 7, 8, 13], 2: []}  # per file, physical positions


@pytest.fixture(scope="module")
def dv_table(tmp_path_factory) -> tuple[str, pa.Table]:
    """Three Parquet files of 14 rows (row groups of 4), a log written by hand: file 0's
    deletion vector inline, file 1's in a deletion vector file (relative path with a
    random prefix), file 2 without one. Returns the path and the expected live rows."""
    root = str(tmp_path_factory.mktemp("dv") / "t")
    os.makedirs(f"{root}/_delta_log")
    os.makedirs(f"{root}/ab")
    schema = {"type": "struct", "fields": [
        {"name": "id", "type": "long", "nullable": True, "metadata": {}},
        {"name": "s", "type": "string", "nullable": True, "metadata": {}},
        {"name": "x", "type": "double", "nullable": True, "metadata": {}}]}
    adds, live = [], []
    for f in range(3):
        ids = list(range(f * 100, f * 100 + 14))
        t = pa.table({"id": pa.array(ids, pa.int64()), "s": [f"v{i}" for i in ids], "x": [i / 2 for i in ids]})
        name = f"part-{f}.parquet"
        pq.write_table(t, f"{root}/{name}", row_group_size=4)
        add = {"path": name, "partitionValues": {}, "size": os.path.getsize(f"{root}/{name}"),
               "modificationTime": 0, "dataChange": True, "stats": json.dumps({"numRecords": 14})}
        dels = DV_DELETED[f]
        data = _bitmap(dels)
        if f == 0:
            add["deletionVector"] = {"storageType": "i", "pathOrInlineDv": _z85(data + b"\0" * (-len(data) % 4)),
                                     "sizeInBytes": len(data), "cardinality": len(dels)}
        elif f == 1:
            u = uuid.uuid4()
            with open(f"{root}/ab/deletion_vector_{u}.bin", "wb") as out:
                out.write(b"\x01" + struct.pack(">I", len(data)) + data + struct.pack(">I", zlib.crc32(data)))
            add["deletionVector"] = {"storageType": "u", "pathOrInlineDv": "ab" + _z85(u.bytes), "offset": 1,
                                     "sizeInBytes": len(data), "cardinality": len(dels)}
        adds.append({"add": add})
        live.append(t.filter(pa.array([i not in dels for i in range(14)])))
    log = [{"protocol": {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["deletionVectors"],
                         "writerFeatures": ["deletionVectors"]}},
           {"metaData": {"id": str(uuid.uuid4()), "format": {"provider": "parquet", "options": {}},
                         "schemaString": json.dumps(schema), "partitionColumns": [],
                         "configuration": {"delta.enableDeletionVectors": "true"}, "createdTime": 0}}] + adds
    with open(f"{root}/_delta_log/00000000000000000000.json", "w") as out:
        out.write("\n".join(json.dumps(a) for a in log) + "\n")
    return root, pa.concat_tables(live)


@pytest.fixture(scope="module")
def mapped_table(tmp_path_factory) -> tuple[str, pa.Table]:
    """Column mapping (``name`` mode), written by delta-rs: physical names ``col-<uuid>``
    in the files; partitioned; two versions. Returns the path and the rows written."""
    from deltalake import write_deltalake
    path = str(tmp_path_factory.mktemp("cm") / "t")
    a = pa.table({"id": pa.array(range(50), pa.int64()), "part": ["p", "q"] * 25,
                  "x y": [i * 1.5 for i in range(50)]})
    b = pa.table({"id": pa.array(range(50, 80), pa.int64()), "part": ["q"] * 30, "x y": [None] * 30},
                 schema=a.schema)
    write_deltalake(path, a, partition_by=["part"], configuration={"delta.columnMapping.mode": "name"})
    write_deltalake(path, b, partition_by=["part"], mode="append")
    return path, pa.concat_tables([a, b])


# -- versions, appends, overwrite, delete, partitions, schema evolution ---------------------

@pytest.mark.parametrize("version", [0, 1, 2, 3, 4, 5])
def test_every_version_reads_as_deltalake_does(versions, version):
    path, _ = versions
    truth = _truth(path, version)
    ds = al.delta(path, version=version)
    got = ds.to_arrow()
    assert got.schema.names == truth.schema.names
    assert sorted_rows(got) == sorted_rows(truth)
    assert ds.count() == truth.num_rows
    assert ds.plan.source.table == {"format": "delta", "uri": path, "version": version}


def test_partition_columns_are_typed_from_the_table_schema(versions):
    path, _ = versions
    ds = al.delta(path, version=1)
    assert ds.schema.field("part").type == pa.string()
    assert ds.schema.field("n").type == pa.int32()  # not the int64 hive folders would infer
    assert ds.plan.source.partition_schema.names == ["part", "n"]


def test_column_added_later_reads_as_nulls_in_older_files(versions):
    path, _ = versions
    got = al.delta(path, version=3).select("id", "extra").to_arrow()
    old = got.filter(pa.compute.less(got["id"], 600))
    new = got.filter(pa.compute.greater_equal(got["id"], 600))
    assert old.num_rows > 0 and old["extra"].null_count == old.num_rows
    assert new["extra"].null_count == 0 and new.num_rows == 150


def test_timestamp_pins_the_version_committed_before_it(versions):
    path, times = versions
    for v in (1, 3):
        when = dt.datetime.fromtimestamp(times[v] + 0.005, dt.timezone.utc)
        ds = al.delta(path, timestamp=when)
        assert ds.plan.source.table["version"] == v
        assert sorted_rows(ds.to_arrow()) == sorted_rows(_truth(path, v))
    with pytest.raises(al.InvalidArgumentError, match="did not exist"):
        al.delta(path, timestamp=dt.datetime(2000, 1, 1))


def test_dataset_of_the_table_folder_is_the_latest_version(versions):
    path, _ = versions
    ds = al.dataset(path)
    assert ds.plan.source.table["version"] == 5
    assert sorted_rows(ds.to_arrow()) == sorted_rows(_truth(path))


@pytest.mark.parametrize("predicate", [
    "part = 'c d' AND id > 100",
    "n = 1 OR x < 20",
    "extra IS NULL",
    "id BETWEEN 150 AND 700 AND part <> 'a'",
])
def test_filters_match_duckdb_over_the_truth(versions, predicate):
    path, _ = versions
    truth = _truth(path, 3)  # noqa: F841 - DuckDB reads it by name
    expected = duckdb.sql(f"SELECT * FROM truth WHERE {predicate}").arrow()
    expected = expected.read_all() if hasattr(expected, "read_all") else expected
    ds = al.delta(path, version=3).filter(predicate)
    assert sorted_rows(ds.to_arrow()) == sorted_rows(expected)
    assert ds.count() == expected.num_rows


def test_versions_are_snapshots_and_a_state_resumes_on_its_own_version(versions):
    path, _ = versions
    a, b = al.delta(path, version=4), al.delta(path, version=5)
    assert a.plan.source.fingerprint() != b.plan.source.fingerprint()
    assert a.plan.source.fingerprint() == al.delta(path, version=4).plan.source.fingerprint()
    assert a.snapshot_id == f"delta:{a.plan.source.table['uri']}@v4" != b.snapshot_id
    assert al.dataset(path).snapshot_id == al.delta(path).snapshot_id  # the latest version
    for shuffle in (False, "block", "global"):
        whole = [b_["id"].tolist() for b_ in a.loader(16, shuffle=shuffle, seed=1)]
        state = state_after(a.loader(16, shuffle=shuffle, seed=1), 2)
        assert state["sources"] == [{"snapshot": a.snapshot_id, "table": a.plan.source.table}]
        with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "formats",
                               "loader_state", "v4", "schema.json")) as f:
            jsonschema.validate(state, json.load(f))
        # a loader built on the newer version (the table moved on) resumes version 4's epoch
        later = b.loader(16, shuffle=shuffle, seed=1)
        later.load_state_dict(state)
        assert later.snapshot_id == a.snapshot_id
        assert [b_["id"].tolist() for b_ in later] == whole[2:]
    # another table's state is refused, naming the table
    other = state_after(al.dataset(pa.table({"id": list(range(100))})).loader(16, seed=1), 1)
    with pytest.raises(al.StateMismatchError):
        b.loader(16, seed=1).load_state_dict(other)


def test_a_state_on_a_version_whose_log_is_gone_names_it(versions, tmp_path):
    path, _ = versions
    copy = str(tmp_path / "events")
    shutil.copytree(path, copy)
    state = state_after(al.delta(copy, version=1).loader(16, seed=1), 1)
    from deltalake import DeltaTable
    DeltaTable(copy).create_checkpoint()  # the latest version no longer needs the commits before it
    log = os.path.join(copy, "_delta_log")
    for name in os.listdir(log):  # the log of versions 0-1 cleaned up
        if name.startswith(("00000000000000000000.", "00000000000000000001.")):
            os.remove(os.path.join(log, name))
    latest = al.delta(copy)
    with pytest.raises((al.SnapshotChangedError, al.StateMismatchError), match="version 1"):
        latest.loader(16, seed=1).load_state_dict(state)


def test_a_delta_version_pins_itself_and_has_no_file_manifest(versions, tmp_path):
    path, _ = versions
    ds = al.delta(path, version=3)
    assert ds.pin().snapshot_id == ds.snapshot_id
    with pytest.raises(al.UnsupportedError, match="version=3"):
        ds.pin().save_manifest(str(tmp_path / "m.json"))


def test_partition_pruning_and_statistics_pruning_keep_fewer_units(versions):
    path, _ = versions
    ds = al.delta(path, version=3)
    text = ds.filter("part = 'a' AND n = 0").explain()
    assert "partition_pruning" in text
    total = len(ds.plan.source.units())
    kept = ds.filter("part = 'a' AND n = 0").optimized_plan()
    assert 0 < len(kept.units) < total


def test_statistics_pruning_reads_fewer_bytes(tmp_path):
    """Bytes pulled through a counting filesystem: a selective filter on a sorted column
    reads a fraction of what a full read does, with the same rows as deltalake."""
    from deltalake import write_deltalake
    from arrowload.source.filesystem import to_pyarrow_fs
    path = str(tmp_path / "t")
    t = pa.table({"id": pa.array(range(20_000), pa.int64()), "v": [float(i) for i in range(20_000)]})
    write_deltalake(path, t, writer_properties=None)
    import deltalake
    write_deltalake(path, t.slice(0, 0), mode="append")
    # files of several row groups, so that statistics prune inside a file
    write_deltalake(path, pa.table({"id": pa.array(range(20_000, 40_000), pa.int64()),
                                    "v": [float(i) for i in range(20_000, 40_000)]}), mode="append",
                    writer_properties=deltalake.WriterProperties(max_row_group_size=2_000))

    def measure(predicate):
        fs = CountingLocalFileSystem()
        ds = al.delta(path)
        ds.plan.source.filesystem = to_pyarrow_fs(fs)  # before any footer is read
        got = ds.filter(predicate).to_arrow()
        return got, fs.stats.bytes_read

    full, full_bytes = measure("id >= 0")
    few, few_bytes = measure("id BETWEEN 30000 AND 30100")
    assert full.num_rows == 40_000 and sorted(few["id"].to_pylist()) == list(range(30000, 30101))
    assert few_bytes < full_bytes / 3, (few_bytes, full_bytes)


# -- column mapping ------------------------------------------------------------------------

def test_column_mapped_table_reads_by_logical_names(mapped_table):
    path, written = mapped_table
    from deltalake import DeltaTable
    assert DeltaTable(path).to_pyarrow_table()["id"].null_count > 0  # why arrowload reads itself
    ds = al.delta(path)
    assert ds.plan.source.column_renames  # the files hold physical names
    assert ds.schema.names == ["id", "part", "x y"]
    assert sorted_rows(ds.to_arrow()) == sorted_rows(written)
    assert sorted_rows(al.delta(path, version=0).to_arrow()) == sorted_rows(written.slice(0, 50))
    got = ds.filter('"x y" > 30 AND part = \'p\'').select("id").to_arrow()
    assert sorted(got["id"].to_pylist()) == [i for i in range(50) if i * 1.5 > 30 and i % 2 == 0]
    assert ds.filter('"x y" IS NULL').count() == 30


def test_column_mapping_configured_but_not_in_the_protocol_reads_logical_names(tmp_path):
    """deltalake writes a table asked for name mapping beside a timestamp-without-zone
    column with reader version 3 and only ``timestampNtz`` among its reader features: the
    mapping is not in force and the files hold the logical names. Read through the
    configuration's mapping, every value was null and filters found nothing."""
    from deltalake import DeltaTable, QueryBuilder, write_deltalake
    path = str(tmp_path / "t")
    written = pa.table({"id": pa.array(range(40), pa.int64()),
                        "ts": pa.array([dt.datetime(2024, 1, 1 + i % 20) for i in range(40)], pa.timestamp("us"))})
    write_deltalake(path, written, configuration={"delta.columnMapping.mode": "name"})
    proto = DeltaTable(path).protocol()
    assert "columnMapping" not in (proto.reader_features or ()) and proto.min_reader_version == 3
    truth = pa.table(QueryBuilder().register("t", DeltaTable(path)).execute("SELECT * FROM t").read_all())
    ds = al.delta(path)
    assert not ds.plan.source.column_renames
    assert sorted_rows(ds.to_arrow()) == sorted_rows(truth) == sorted_rows(written)
    assert ds.filter("id >= 30").count() == 10
    assert ds.filter("ts > TIMESTAMP '2024-01-15'").count() == 10


@pytest.mark.parametrize("mode", ["none", "name", "id"])
@pytest.mark.parametrize("ts", [None, pa.timestamp("us"), pa.timestamp("us", "UTC")])
def test_column_mapping_modes_and_protocols_read_as_deltalake(tmp_path, mode, ts):
    """Each mapping mode beside each timestamp kind (which decides the protocol deltalake
    writes: a zone-less one brings reader version 3 and ``timestampNtz``), appended to
    twice: the rows deltalake's own query engine reads, and a filter's count over them."""
    from deltalake import DeltaTable, QueryBuilder, write_deltalake
    path = str(tmp_path / "t")

    def rows(start):
        cols = {"id": pa.array(range(start, start + 30), pa.int64()), "x y": [i * 0.5 for i in range(30)]}
        if ts is not None:
            cols["t"] = pa.array([dt.datetime(2024, 1, 1 + i % 20) for i in range(30)], ts)
        return pa.table(cols)
    config = {} if mode == "none" else {"delta.columnMapping.mode": mode}
    write_deltalake(path, rows(0), configuration=config)
    write_deltalake(path, rows(30), mode="append")
    truth = pa.table(QueryBuilder().register("t", DeltaTable(path)).execute("SELECT * FROM t").read_all())
    ds = al.delta(path)
    assert sorted_rows(ds.to_arrow()) == sorted_rows(truth)
    want = duckdb.sql('SELECT count(*) FROM truth WHERE id >= 45 AND "x y" < 10').fetchall()[0][0]
    assert ds.filter('id >= 45 AND "x y" < 10').count() == want


def test_column_mapped_table_through_the_loader(mapped_table):
    path, written = mapped_table
    ds = al.delta(path).select("id", "part")
    loader = ds.loader(7, shuffle="global", seed=3, world_size=2, rank=0)
    seen = []
    for rank in (0, 1):
        batches = list(ds.loader(7, shuffle="global", seed=3, world_size=2, rank=rank))
        seen += flat_ids(batches)
        assert all(len(b["id"]) == 7 for b in batches[:-1])
    assert len(loader) == -(-40 // 7)
    assert len(seen) == len(set(seen)) == 80
    xy = {r["id"]: r["x y"] for r in written.to_pylist()}
    rb = next(iter(al.delta(path).loader(80, output="arrow")))
    assert {r["id"]: r["x y"] for r in rb.to_pylist()} == xy


# -- deletion vectors --------------------------------------------------------------------

def test_deletion_vector_fixture_agrees_with_deltalake(dv_table):
    """deltalake decodes the hand-written vectors to the positions written."""
    from deltalake import DeltaTable
    path, _ = dv_table
    got = {}
    for batch in DeltaTable(path).deletion_vectors():
        rb = pa.record_batch(batch)
        for p, keep in zip(rb["filepath"].to_pylist(), rb["selection_vector"].to_pylist()):
            got[os.path.basename(p)] = [i for i, k in enumerate(keep) if not k]
    assert got == {f"part-{f}.parquet": d for f, d in DV_DELETED.items() if d}


def test_deleted_rows_never_appear(dv_table):
    path, live = dv_table
    ds = al.delta(path)
    assert sorted_rows(ds.to_arrow()) == sorted_rows(live)
    assert ds.count() == live.num_rows == 42 - 9
    assert sum(u.num_rows for u in ds.plan.source.units()) == live.num_rows
    assert sum(u.deleted for u in ds.plan.source.units()) == 9
    assert sorted(ds.filter("x >= 50").select("id").to_arrow()["id"].to_pylist()) == \
        sorted(i for i in live["id"].to_pylist() if i / 2 >= 50)
    assert ds.filter("x >= 50").count() == sum(1 for i in live["id"].to_pylist() if i / 2 >= 50)
    assert [r["id"] for r in ds.head(3).to_pylist()] == [0, 2, 3]
    assert sorted(flat_ids(ds.to_batches())) == sorted(live["id"].to_pylist())


@pytest.mark.parametrize("decoder", ["pyarrow", "dataset"])
def test_deleted_rows_never_appear_in_either_decoder(dv_table, decoder, monkeypatch):
    path, live = dv_table
    monkeypatch.setenv("ARROWLOAD_DECODER", decoder)
    ds = al.delta(path)
    got = flat_ids(ds.loader(5))
    assert sorted(got) == sorted(live["id"].to_pylist())
    got = flat_ids(ds.filter("s <> 'v3'").loader(4))
    assert sorted(got) == sorted(i for i in live["id"].to_pylist() if i != 3)


@pytest.mark.parametrize("shuffle", [False, "global", "block"])
def test_loader_is_exact_once_per_epoch_across_ranks(dv_table, shuffle):
    path, live = dv_table
    ds = al.delta(path)
    per_rank = []
    for rank in (0, 1):
        loader = ds.loader(4, shuffle=shuffle, seed=7, world_size=2, rank=rank)
        loader.set_epoch(1)
        ids = flat_ids(loader)
        assert len(ids) == 33 // 2 and len(loader) == -(-16 // 4)
        per_rank.append(ids)
    both = per_rank[0] + per_rank[1]
    assert len(set(both)) == len(both) == 32  # one row of 33 left out for equal ranks
    assert set(both) <= set(live["id"].to_pylist())


@pytest.mark.parametrize("shuffle", ["global", "block"])
def test_resume_is_exact(dv_table, shuffle):
    path, _ = dv_table
    ds = al.delta(path).filter("id <> 204")
    full = [list(b["id"]) for b in ds.loader(3, shuffle=shuffle, seed=2)]
    for k in (1, 4, 7):
        state = state_after(ds.loader(3, shuffle=shuffle, seed=2), k)
        fresh = al.delta(path).filter("id <> 204").loader(3, shuffle=shuffle, seed=2)
        fresh.load_state_dict(state)
        assert [list(b["id"]) for b in fresh] == full[k:]


def test_explain_and_repr_name_the_table_version_and_deleted_rows(dv_table):
    path, _ = dv_table
    ds = al.delta(path)
    text = ds.explain()
    assert f"delta table {path} version 0 (3 files, 9 deleted rows)" in text
    assert "3 of 3 files, 9 of 9 deleted rows" in text
    assert "version 0" in repr(ds) and "9 deleted rows" in repr(ds)
    desc = ds.describe()
    assert set(desc["source"].to_list()) and all("delta" in s and "version 0" in s for s in desc["source"])
    assert desc.filter(desc["column"] == "id")["rows"].item() == 33


# -- refusals, errors, S3 ---------------------------------------------------------------

def _protocol(root: str, features: list[str]) -> str:
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(f"{root}/_delta_log")
    pq.write_table(pa.table({"id": [1, 2]}), f"{root}/f.parquet")
    schema = {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]}
    log = [{"protocol": {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": features,
                         "writerFeatures": features}},
           {"metaData": {"id": str(uuid.uuid4()), "format": {"provider": "parquet", "options": {}},
                         "schemaString": json.dumps(schema), "partitionColumns": [], "configuration": {},
                         "createdTime": 0}},
           {"add": {"path": "f.parquet", "partitionValues": {}, "size": os.path.getsize(f"{root}/f.parquet"),
                    "modificationTime": 0, "dataChange": True, "stats": json.dumps({"numRecords": 2})}}]
    with open(f"{root}/_delta_log/00000000000000000000.json", "w") as out:
        out.write("\n".join(json.dumps(a) for a in log) + "\n")
    return root


def test_unsupported_reader_feature_is_a_typed_error_naming_it(tmp_path):
    from deltalake import DeltaTable
    root = _protocol(str(tmp_path / "t"), ["timestampNtz"])
    assert al.delta(root).to_arrow()["id"].to_pylist() == [1, 2]  # a feature it honours
    root = _protocol(str(tmp_path / "t"), ["variantShredding-preview"])
    DeltaTable(root)  # the log itself loads
    for open_ in (al.delta, al.dataset):
        with pytest.raises(al.UnsupportedTableFeatureError) as info:
            open_(root)
        assert info.value.feature == "variantShredding-preview" and "variantShredding-preview" in str(info.value)
        assert isinstance(info.value, NotImplementedError) and isinstance(info.value, al.ArrowloadError)


def test_a_type_feature_without_a_column_of_its_type_reads(tmp_path):
    """deltalake names ``variantType`` among the reader features of every table it writes
    with deletion vectors enabled: a table without a variant column reads as deltalake
    reads it (it was refused); one with a variant column is still refused."""
    from deltalake import DeltaTable, write_deltalake
    path = str(tmp_path / "dv")
    data = pa.table({"id": pa.array(range(10), pa.int64()), "s": pa.array([{"a": i} for i in range(10)])})
    write_deltalake(path, data, configuration={"delta.enableDeletionVectors": "true"})
    DeltaTable(path).delete("id < 3")
    table = DeltaTable(path)
    truth = pa.table(table.scan().read_all()).sort_by("id")
    assert al.delta(path).to_arrow().sort_by("id").equals(truth) and truth.num_rows == 7
    assert al.dataset(path).filter("id >= 5").count() == 5
    root = _protocol(str(tmp_path / "v"), ["variantType"])
    log = f"{root}/_delta_log/00000000000000000000.json"
    lines = [json.loads(x) for x in open(log)]
    fields = [{"name": "id", "type": "long", "nullable": True, "metadata": {}},
              {"name": "x", "type": {"type": "array", "elementType": "variant", "containsNull": True},
               "nullable": True, "metadata": {}}]
    lines[1]["metaData"]["schemaString"] = json.dumps({"type": "struct", "fields": fields})
    with open(log, "w") as out:
        out.write("\n".join(json.dumps(a) for a in lines) + "\n")
    with pytest.raises(al.UnsupportedTableFeatureError, match="variantType"):
        al.delta(root)


def test_missing_table_and_missing_version(versions, tmp_path):
    path, _ = versions
    with pytest.raises(al.InvalidArgumentError, match="no version 99"):
        al.delta(path, version=99)
    with pytest.raises(al.PathNotFoundError):
        al.delta(str(tmp_path / "nothing"))
    with pytest.raises(al.InvalidArgumentError):
        al.delta(path, version=1, timestamp=dt.datetime.now())


def test_a_version_whose_log_was_cleaned_up_is_named_not_the_table(tmp_path):
    """After ``cleanup_metadata`` an old version is gone from the log: that version is
    named, not "no delta table at" the table whose latest version opens."""
    from deltalake import DeltaTable, write_deltalake
    path = str(tmp_path / "t")
    for i in range(6):
        write_deltalake(path, pa.table({"id": [i]}), mode="append")
    DeltaTable(path).alter.set_table_properties({"delta.logRetentionDuration": "interval 0 seconds"})
    DeltaTable(path).create_checkpoint()
    DeltaTable(path).cleanup_metadata()
    with pytest.raises(al.InvalidArgumentError, match="no version 2 any more"):
        al.delta(path, version=2)
    assert al.delta(path).count() == 6


def test_a_damaged_log_is_a_corrupt_file_error_not_a_missing_version(tmp_path):
    """A log entry deltalake cannot read leaked deltalake's own DeltaError without a
    version, and with one was "has no version 1" although version 1 is in the log. Both are
    a CorruptFileError naming the log now; a version before the damage still opens (as in
    deltalake), and a version the log never had is still the missing version."""
    from deltalake import DeltaTable, write_deltalake
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"id": [0]}))
    write_deltalake(path, pa.table({"id": [1]}), mode="append")
    with open(os.path.join(path, "_delta_log", f"{1:020d}.json"), "w") as out:
        out.write("{not json\n")
    for kw in ({}, {"version": 1}):
        with pytest.raises(Exception) as truth:
            DeltaTable(path, **kw)
        assert not isinstance(truth.value, al.ArrowloadError)
        with pytest.raises(al.CorruptFileError, match="refuses its log") as info:
            al.delta(path, **kw)
        assert isinstance(info.value, OSError) and "_delta_log" in info.value.path, kw
    assert al.delta(path, version=0).to_arrow().column("id").to_pylist() == [0]
    with pytest.raises(al.InvalidArgumentError, match="no version 7"):
        al.delta(path, version=7)


def test_path_inside_a_table_is_refused_naming_the_root(versions):
    path, _ = versions
    inner = os.path.join(path, "part=a")
    with pytest.raises(al.LakeTableError) as info:
        al.dataset(inner)
    assert os.path.samefile(info.value.table_root, path)
    assert f"al.delta({path!r})" in str(info.value)


def test_delta_table_on_s3(versions, dv_table):
    """Through a real S3 API (moto on loopback): the log through deltalake, the files
    through arrowload, with deletion vectors; a partition folder is still refused."""
    import s3fs
    path, _ = versions
    dv_path, live = dv_table
    with moto_s3_server() as url:
        s3 = s3fs.S3FileSystem(endpoint_url=url, key="testing", secret="testing", skip_instance_cache=True)
        s3.mkdir("delta-lakes")
        for local, name in ((path, "events"), (dv_path, "dv")):
            for folder, _, names in os.walk(local):
                for n in names:
                    rel = os.path.relpath(os.path.join(folder, n), local).replace(os.sep, "/")
                    s3.put_file(os.path.join(folder, n), f"delta-lakes/{name}/{rel}")
        options = {"endpoint_url": url, "key": "testing", "secret": "testing"}
        ds = al.dataset("s3://delta-lakes/events", storage_options=options)
        assert sorted_rows(ds.to_arrow()) == sorted_rows(_truth(path))
        v2 = al.delta("s3://delta-lakes/events", version=2, storage_options=options)
        assert v2.count() == _truth(path, 2).num_rows
        dv = al.delta("s3://delta-lakes/dv", storage_options=options)
        assert sorted_rows(dv.to_arrow()) == sorted_rows(live)
        assert Counter(flat_ids(dv.loader(4, shuffle="block", seed=1))) == Counter(live["id"].to_pylist())
        with pytest.raises(al.LakeTableError, match="Delta Lake"):
            al.dataset("s3://delta-lakes/events/part=b/", storage_options=options)
        # credentials the store refuses: deltalake's own OSError ("lacked the necessary
        # privileges") was raised as it was; al.dataset says StorageAccessError
        import urllib.request

        def auth(count: bytes) -> None:  # moto's switch: process-wide, so always switched back
            urllib.request.urlopen(urllib.request.Request(url + "/moto-api/reset-auth", data=count, method="POST",
                                                          headers={"Content-Type": "text/plain"}), timeout=10).read()
        auth(b"0")
        try:
            wrong = {"endpoint_url": url, "key": "AKIANOBODY", "secret": "wrong"}
            with pytest.raises(al.StorageAccessError, match="delta-lakes/events"):
                al.delta("s3://delta-lakes/events", storage_options=wrong)
        finally:
            auth(b"inf")


def test_statistics_prune_column_mapped_columns_under_their_physical_names(tmp_path):
    """Column mapping stores every column as ``col-<uuid>``: a filter on the logical name
    prunes row groups on the physical column's statistics (before: never pruned), with the
    rows deltalake reads and fewer bytes (counting filesystem)."""
    import deltalake
    from deltalake import DeltaTable, write_deltalake
    from arrowload.source.filesystem import to_pyarrow_fs
    path = str(tmp_path / "t")
    t = pa.table({"id": pa.array(range(20_000), pa.int64()), "v w": [float(i) for i in range(20_000)],
                  "s": [f"s{i % 7}" for i in range(20_000)]})
    write_deltalake(path, t, configuration={"delta.columnMapping.mode": "name"},
                    writer_properties=deltalake.WriterProperties(max_row_group_size=2_000))
    truth = t  # noqa: F841 - DuckDB reads it by name (deltalake's own read of a mapped table: nulls)
    assert DeltaTable(path).version() == 0 and al.delta(path).plan.source.column_renames

    def measure(predicate):
        fs = CountingLocalFileSystem()
        ds = al.delta(path)
        ds.plan.source.filesystem = to_pyarrow_fs(fs)  # before any footer is read
        units = ds.filter(predicate).optimized_plan().units
        kept = len(ds.plan.source.units()) if units is None else len(units)
        got = ds.filter(predicate).to_arrow()
        return got, kept, fs.stats.bytes_read

    total = len(al.delta(path).plan.source.units())
    assert total == 10
    full, kept_all, full_bytes = measure("id >= 0")
    for predicate, groups in (('"v w" BETWEEN 4100.5 AND 5000', 1), ("id < 2500 AND s = 's3'", 2),
                              ('"v w" < 10.5 OR id = 19995', 2)):
        expected = duckdb.sql(f"SELECT * FROM truth WHERE {predicate}").arrow()
        expected = expected.read_all() if hasattr(expected, "read_all") else expected
        got, kept, nbytes = measure(predicate)
        assert sorted_rows(got) == sorted_rows(expected), predicate
        assert kept == groups and nbytes < full_bytes / 3, (predicate, kept, nbytes, full_bytes)
    assert kept_all == total


@pytest.mark.parametrize("partitioned", [False, True])
def test_filters_on_strings_after_deltalake_rewrote_files(tmp_path, partitioned):
    """deltalake's delete / update / merge write files whose embedded Arrow schema types
    strings string_view, so their row-group statistics are string_view where the table's
    column is string: pruning by them raised ArrowNotImplementedError ('equal' has no
    kernel for (string, string_view)) for every filter on a string column. Such files are
    now kept whole by the pruning (and by count's statistics), and read and filtered as
    any: rows, counts and loader epochs equal deltalake's own read, filtered by DuckDB."""
    from deltalake import DeltaTable, write_deltalake

    path = str(tmp_path / "t")
    n = 600
    data = pa.table({"id": pa.array(range(n), pa.int64()), "s": [["a", "b", "", "c", None][i % 5] for i in range(n)],
                     "p": [f"p{i % 3}" for i in range(n)]})
    write_deltalake(path, data, partition_by=["p"] if partitioned else None)
    table = DeltaTable(path)
    table.delete("id % 7 = 0")
    table.update(predicate="id % 11 = 0", updates={"s": "'z'"})
    files = [u.removeprefix("file://") for u in DeltaTable(path).file_uris()]
    assert any(pa.types.is_string_view(pq.read_schema(f).field("s").type) for f in files)  # the case at hand
    truth = DeltaTable(path).to_pyarrow_table()
    con = duckdb.connect()
    con.register("truth", truth)
    for where in ("s = 'a'", "s <> 'a'", "s IN ('b', 'z')", "s IS NULL", "s LIKE 'a%'", "s = 'a' AND p = 'p1'",
                  "p = 'p2' OR s = ''"):
        want = sorted(r[0] for r in con.sql(f"SELECT id FROM truth WHERE {where}").fetchall())
        sel = al.delta(path).filter(where).select("id")
        assert sorted(sel.to_arrow()["id"].to_pylist()) == want and want, where
        assert sel.count() == len(want), where
        for shuffle in (False, "block", "global"):
            got = sorted(i for b in sel.loader(64, shuffle=shuffle, seed=2, output="numpy") for i in b["id"].tolist())
            assert got == want, (where, shuffle)


def test_resuming_on_a_vacuumed_version_is_a_snapshot_change(tmp_path):
    """A loader state taken on version 0, the table then overwritten and vacuumed: version
    0's log is still there, so the table reopens at it, but its data files are gone. The
    README promises SnapshotChangedError for a snapshot cleaned up; it raised
    PathNotFoundError ("disappeared after listing") on the first read."""
    from deltalake import DeltaTable, write_deltalake

    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"id": pa.array(range(100), pa.int64())}))
    loader = al.delta(path).loader(10, shuffle=False, output="numpy")
    batches = iter(loader)
    for _ in range(2):
        next(batches)
    state = loader.state_dict()
    loader.close()
    write_deltalake(path, pa.table({"id": pa.array(range(100, 150), pa.int64())}), mode="overwrite")
    DeltaTable(path).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    resumed = al.delta(path).loader(10, shuffle=False, output="numpy")
    with pytest.raises(al.SnapshotChangedError) as got:
        resumed.load_state_dict(state)
        list(resumed)
    assert "version 0" in str(got.value) and got.value.path.endswith(".parquet")
    assert sorted(i for b in al.delta(path).loader(10, output="numpy") for i in b["id"].tolist()) == \
        list(range(100, 150))


def test_reading_a_vacuumed_version_is_a_snapshot_change(tmp_path):
    """The table's data files removed after it was opened (an old version whose files a
    vacuum removed, or the current version opened before an overwrite and a vacuum):
    every read says SnapshotChangedError naming the table and version, as deltalake's own
    read fails (FileNotFoundError). It raised TypeError: the table kept how to reopen
    itself in an attribute that hid the files' advice method."""
    from deltalake import DeltaTable, write_deltalake

    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"id": pa.array(range(10), pa.int64())}))
    write_deltalake(path, pa.table({"id": pa.array(range(10, 20), pa.int64())}), mode="overwrite")
    current = al.delta(path)
    DeltaTable(path).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    with pytest.raises(FileNotFoundError):
        DeltaTable(path, version=0).to_pyarrow_table()
    with pytest.raises(al.SnapshotChangedError, match="delta table .* at version 0") as got:
        al.delta(path, version=0).to_arrow()
    assert got.value.path.endswith(".parquet")
    assert current.count() == 10
    write_deltalake(path, pa.table({"id": pa.array(range(20, 25), pa.int64())}), mode="overwrite")
    DeltaTable(path).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    for read in (current.count, current.to_arrow, lambda: list(current.loader(4, output="numpy"))):
        with pytest.raises(al.SnapshotChangedError, match="cleaned up or rewritten"):
            read()
    assert sorted(al.delta(path).to_arrow()["id"].to_pylist()) == list(range(20, 25))


# -- column mapping inside nested columns ------------------------------------------------------------

def _nested_rows(start: int, n: int, a: str = "a", c: bool = False) -> pa.Table:
    """Rows with a struct ``s`` (fields ``a`` -- or its new name -- and ``b``, and ``c``
    where asked), a list of structs ``l`` and a map ``m``, nulls at every level."""
    fields = [pa.field(a, pa.int64()), pa.field("b", pa.string())] + ([pa.field("c", pa.float64())] if c else [])
    schema = pa.schema([("id", pa.int64()), ("s", pa.struct(fields)),
                        ("l", pa.list_(pa.struct([("x", pa.int64())]))), ("m", pa.map_(pa.string(), pa.int64()))])
    rows = []
    for i in range(start, start + n):
        s = None if i % 7 == 3 else {a: None if i % 5 == 0 else i, "b": f"b{i}", **({"c": i / 2} if c else {})}
        rows.append({"id": i, "s": s, "l": None if i % 9 == 4 else [{"x": i}, None] if i % 2 else [{"x": i}],
                     "m": None if i % 10 == 6 else [("k", None if i % 6 == 1 else i)]})
    return pa.Table.from_pylist(rows, schema=schema)


def _engine_truth(path: str) -> pa.Table:
    """deltalake's own query engine's read (``to_pyarrow_table`` reads a column-mapped
    table's values as nulls)."""
    from deltalake import DeltaTable, QueryBuilder
    return pa.table(QueryBuilder().register("t", DeltaTable(path)).execute("SELECT * FROM t").read_all())


@pytest.mark.parametrize("decoder", ["pyarrow", "dataset"])
def test_column_mapped_nested_columns_read_as_deltalake(tmp_path, decoder, monkeypatch):
    """A column-mapped table (delta-rs names every field inside a struct ``col-<uuid>`` in
    the files too) with a struct, a list of structs and a map reads as deltalake's engine
    reads it, through every path (before: refused whole with UnsupportedTableFeatureError,
    even for its other columns); filters on a field inside as DuckDB over that read."""
    import deltalake
    from deltalake import write_deltalake
    monkeypatch.setenv("ARROWLOAD_DECODER", decoder)
    path = str(tmp_path / "t")
    write_deltalake(path, _nested_rows(0, 300), configuration={"delta.columnMapping.mode": "name"},
                    writer_properties=deltalake.WriterProperties(max_row_group_size=64))
    write_deltalake(path, _nested_rows(300, 90), mode="append")
    inner = pq.read_schema(next(str(p) for p in (tmp_path / "t").rglob("*.parquet"))).field(
        al.delta(path).plan.source.column_renames["s"]).type
    assert all(inner.field(i).name.startswith("col-") for i in range(inner.num_fields))  # as claimed
    truth = _engine_truth(path)
    ds = al.delta(path)
    assert sorted_rows(ds.to_arrow()) == sorted_rows(truth)
    assert sorted_rows(pa.Table.from_batches(list(ds.loader(32, output="arrow", shuffle="block", seed=3)))) == \
        sorted_rows(truth)
    assert sorted_rows(ds.select("id", "m").to_arrow()) == sorted_rows(truth.select(["id", "m"]))
    for predicate in ("s.a > 250", "s IS NULL OR s.b = 'b17'", "l IS NULL AND id < 200"):
        want = sorted(r[0] for r in duckdb.sql(f"SELECT id FROM truth WHERE {predicate}").fetchall())
        assert sorted(ds.filter(predicate).select("id").to_arrow()["id"].to_pylist()) == want, predicate
        assert ds.filter(predicate).count() == len(want), predicate


def test_column_mapped_nested_field_renamed_and_added_in_the_log(tmp_path):
    """What Spark's ``ALTER TABLE ... RENAME COLUMN s.a TO a2`` and ``ADD COLUMN s.c``
    commit on a column-mapped table (delta-rs writes no such schema change): a metaData
    action whose struct field keeps its physical name under a new name, and a new field
    with a new physical name. Files written before read ``a2`` from their ``a`` and ``c``
    as nulls, as deltalake's engine reads them."""
    from deltalake import write_deltalake
    path = str(tmp_path / "t")
    write_deltalake(path, _nested_rows(0, 60), configuration={"delta.columnMapping.mode": "name"})
    log = os.path.join(path, "_delta_log")
    with open(os.path.join(log, "00000000000000000000.json")) as fh:
        meta = next(json.loads(line)["metaData"] for line in fh if '"metaData"' in line)
    schema = json.loads(meta["schemaString"])
    fields = next(f for f in schema["fields"] if f["name"] == "s")["type"]["fields"]
    assert fields[0]["name"] == "a"
    fields[0]["name"] = "a2"
    top = int(meta["configuration"]["delta.columnMapping.maxColumnId"]) + 1
    fields.append({"name": "c", "type": "double", "nullable": True,
                   "metadata": {"delta.columnMapping.id": top, "delta.columnMapping.physicalName": f"col-{uuid.uuid4()}"}})
    meta["schemaString"] = json.dumps(schema)
    meta["configuration"]["delta.columnMapping.maxColumnId"] = str(top)
    with open(os.path.join(log, "00000000000000000001.json"), "w") as fh:
        fh.write(json.dumps({"commitInfo": {"timestamp": 1_700_000_000_000, "operation": "ADD COLUMNS"}}) + "\n")
        fh.write(json.dumps({"metaData": meta}) + "\n")
    write_deltalake(path, _nested_rows(60, 30, a="a2", c=True), mode="append")
    truth = _engine_truth(path)
    got = al.delta(path).to_arrow()
    assert sorted_rows(got) == sorted_rows(truth)
    by_id = {r["id"]: r["s"] for r in got.to_pylist()}
    assert by_id[1] == {"a2": 1, "b": "b1", "c": None} and by_id[61] == {"a2": 61, "b": "b61", "c": 30.5}
    want = sorted(r[0] for r in duckdb.sql("SELECT id FROM truth WHERE s.a2 % 4 = 1 OR s.c > 40").fetchall())
    assert sorted(al.delta(path).filter("s.a2 % 4 = 1 OR s.c > 40").to_arrow()["id"].to_pylist()) == want


@pytest.mark.parametrize("decoder", ["pyarrow", "dataset"])
def test_nested_fields_of_a_table_given_column_mapping_later_read_by_physical_name(tmp_path, decoder, monkeypatch):
    """What Spark commits for ``SET TBLPROPERTIES ('delta.columnMapping.mode' = 'name')`` on
    a table with data (every field keeps its name as its physical name), then two struct
    fields swapping names and one added (physical name ``col-<uuid>``). No top-level column
    is renamed, yet every read of ``s`` must find its fields by physical name (before: read
    by name, the swapped fields read each other's values and the added one read nulls from
    the files holding it, in every path but the per-unit loader's)."""
    from deltalake import write_deltalake
    monkeypatch.setenv("ARROWLOAD_DECODER", decoder)
    path = str(tmp_path / "t")

    def rows(lo, hi, names=("x", "y"), c=False):
        fields = [(names[0], pa.int64()), (names[1], pa.int64())] + ([("c", pa.float64())] if c else [])
        schema = pa.schema([("id", pa.int64()), ("s", pa.struct(fields))])
        return pa.Table.from_pylist([{"id": i, "s": None if i % 11 == 3 else
                                      {names[0]: i, names[1]: 1000 + i, **({"c": i / 2} if c else {})}}
                                     for i in range(lo, hi)], schema=schema)
    write_deltalake(path, rows(0, 100))
    log = os.path.join(path, "_delta_log")
    with open(os.path.join(log, "00000000000000000000.json")) as fh:
        meta = next(json.loads(line)["metaData"] for line in fh if '"metaData"' in line)
    schema = json.loads(meta["schemaString"])
    ids = iter(range(1, 100))

    def tag(f):
        f["metadata"] = {"delta.columnMapping.id": next(ids), "delta.columnMapping.physicalName": f["name"]}
        for g in f["type"].get("fields", ()) if isinstance(f["type"], dict) else ():
            tag(g)
    for f in schema["fields"]:
        tag(f)
    inner = next(f for f in schema["fields"] if f["name"] == "s")["type"]["fields"]
    inner[0]["name"], inner[1]["name"] = "y", "x"  # swapped: the files' x is the table's y
    top = next(ids)
    inner.append({"name": "c", "type": "double", "nullable": True,
                  "metadata": {"delta.columnMapping.id": top, "delta.columnMapping.physicalName": f"col-{uuid.uuid4()}"}})
    meta["schemaString"] = json.dumps(schema)
    meta["configuration"] = {"delta.columnMapping.mode": "name", "delta.columnMapping.maxColumnId": str(top)}
    with open(os.path.join(log, "00000000000000000001.json"), "w") as fh:
        fh.write(json.dumps({"commitInfo": {"timestamp": 1_700_000_000_000, "operation": "RENAME COLUMN"}}) + "\n")
        fh.write(json.dumps({"protocol": {"minReaderVersion": 2, "minWriterVersion": 5}}) + "\n")
        fh.write(json.dumps({"metaData": meta}) + "\n")
    write_deltalake(path, rows(100, 160, names=("y", "x"), c=True), mode="append")
    truth = _engine_truth(path)
    ds = al.delta(path)
    assert not any(k != v for k, v in ds.plan.source.column_renames.items())  # no column renamed at the top
    assert sorted_rows(ds.to_arrow()) == sorted_rows(truth)
    assert sorted_rows(pa.Table.from_batches(list(ds.loader(16, output="arrow", shuffle="global")))) == \
        sorted_rows(truth)
    for predicate in ("s.x > 1050", "s.y < 10", "s.c > 60", "s IS NULL"):
        want = sorted(r[0] for r in duckdb.sql(f"SELECT id FROM truth WHERE {predicate}").fetchall())
        assert sorted(ds.filter(predicate).select("id").to_arrow()["id"].to_pylist()) == want, predicate
        assert ds.filter(predicate).count() == len(want), predicate
