"""Apache Iceberg tables read at a pinned snapshot (``al.iceberg`` / ``al.dataset`` of a table folder).

Truths from outside arrowload: ``pyiceberg``'s own read (``table.scan(snapshot_id=...).to_arrow()``)
of every snapshot, DuckDB for filters over that truth. Tables are written by pyiceberg
(``SqlCatalog`` on sqlite in a temporary folder, offline): appends, a copy-on-write delete,
an overwrite with a filter, a partitioned table (identity on a string and on an int;
pyiceberg writes bucket / truncate / time transforms only with the ``pyiceberg-core``
package, which is not a dependency here), schema evolution (add, rename, drop and add again). pyiceberg writes only
copy-on-write deletes, so a merge-on-read snapshot (a Parquet position delete file) and an
equality delete file are committed here with pyiceberg's own manifest writer and snapshot
producer; pyiceberg's own read honours the position deletes (the truth) and refuses the
equality deletes.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections import Counter

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import arrowload as al
from _support import moto_s3_server, state_after
from _support import flat_ids, sorted_rows

ROW_GROUP_ROWS = "64"  # small row groups, so that deletes and pruning cross row groups


def _catalog(root, **properties):
    from pyiceberg.catalog.sql import SqlCatalog
    catalog = SqlCatalog("test", uri=f"sqlite:///{root}/catalog.db", warehouse=f"file://{root}", **properties)
    catalog.create_namespace("ns")
    return catalog


def _rows(start: int, n: int, **extra) -> pa.Table:
    ids = list(range(start, start + n))
    cols = {"id": pa.array(ids, pa.int64()),
            "part": [("a", "b", "c d")[i % 3] for i in ids],
            "n": pa.array([i % 2 for i in ids], pa.int32()),
            "x": pa.array([float(i) / 4 for i in ids], pa.float64())}
    for name, fn in extra.items():
        cols[name] = fn(ids)
    return pa.table(cols)


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """One partitioned table (identity on ``part`` and on ``n``) through its
    snapshots: two appends, a copy-on-write delete, a column added (and appended to), a
    column renamed (and appended to), a column dropped and added again with another type
    (and appended to), an overwrite of one partition. Returns (table, [snapshot ids])."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import IdentityTransform
    from pyiceberg.types import DoubleType, IntegerType, LongType, NestedField, StringType

    catalog = _catalog(tmp_path_factory.mktemp("iceberg"))
    schema = Schema(NestedField(1, "id", LongType()), NestedField(2, "part", StringType()),
                    NestedField(3, "n", IntegerType()), NestedField(4, "x", DoubleType()))
    spec = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "part"),
                         PartitionField(3, 1001, IdentityTransform(), "n"))
    table = catalog.create_table("ns.events", schema=schema, partition_spec=spec,
                                 properties={"write.parquet.row-group-limit": ROW_GROUP_ROWS})
    snaps = []

    def commit(fn):
        fn()
        snaps.append(table.current_snapshot().snapshot_id)

    arrow = table.schema().as_arrow()
    commit(lambda: table.append(_rows(0, 300).cast(arrow)))
    commit(lambda: table.append(_rows(300, 300).cast(arrow)))
    commit(lambda: table.delete("id >= 100 and id < 160"))                 # copy-on-write
    with table.update_schema() as u:
        u.add_column("extra", StringType())
    commit(lambda: table.append(_rows(600, 150, extra=lambda ids: [f"e{i}" for i in ids])
                                .cast(table.schema().as_arrow())))
    with table.update_schema() as u:
        u.rename_column("x", "y")
    commit(lambda: table.append(_rows(750, 50, extra=lambda ids: [f"e{i}" for i in ids])
                                .rename_columns({"x": "y"}).cast(table.schema().as_arrow())))
    with table.update_schema() as u:
        u.delete_column("extra")
    with table.update_schema() as u:
        u.add_column("extra", LongType())
    commit(lambda: table.append(_rows(800, 50, extra=lambda ids: [i * 10 for i in ids])
                                .rename_columns({"x": "y"}).cast(table.schema().as_arrow())))
    commit(lambda: table.overwrite(_rows(2000, 40, extra=lambda ids: [-i for i in ids])
                                   .filter(pc.equal(pc.field("part"), "a"))
                                   .rename_columns({"x": "y"}).cast(table.schema().as_arrow()),
                                   overwrite_filter="part = 'a'"))
    return table, snaps


def _truth(table, snapshot_id=None) -> pa.Table:
    return table.scan(snapshot_id=snapshot_id).to_arrow()


# -- merge-on-read deletes, committed with pyiceberg's own writers ------------------------

def _delete_manifest_writer():
    from pyiceberg.manifest import ManifestContent, ManifestWriterV2

    class DeleteManifestWriter(ManifestWriterV2):
        """pyiceberg's v2 manifest writer for a manifest of delete files (its own writes
        only data manifests)."""

        def content(self):
            return ManifestContent.DELETES

        @property
        def _meta(self):
            return {**super()._meta, "content": "deletes"}

    return DeleteManifestWriter


def commit_deletes(table, *, positions: dict[str, list[int]] | None = None,
                   equality_ids: list[int] | None = None) -> str:
    """Commit a snapshot that adds one delete file: position deletes ``{data file URI:
    [row positions]}`` (the spec's ``file_path`` / ``pos`` schema, field ids 2147483546 /
    2147483545), or equality deletes on ``id``. The delete manifest goes into a snapshot
    made by pyiceberg's own fast-append producer. Returns the delete file's URI."""
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat, ManifestEntry, ManifestEntryStatus
    from pyiceberg.typedef import Record

    location = table.location()
    uri = f"{location}/data/deletes-{uuid.uuid4()}.parquet"
    local = uri.removeprefix("file://")
    if positions is not None:
        paths, pos = [], []
        for f, ps in sorted(positions.items()):
            paths += [f] * len(ps)
            pos += sorted(ps)
        schema = pa.schema([pa.field("file_path", pa.string(), False, {b"PARQUET:field_id": b"2147483546"}),
                            pa.field("pos", pa.int64(), False, {b"PARQUET:field_id": b"2147483545"})])
        pq.write_table(pa.table({"file_path": paths, "pos": pos}, schema=schema), local)
        content, n, eq = DataFileContent.POSITION_DELETES, len(pos), None
    else:
        schema = pa.schema([pa.field("id", pa.int64(), True, {b"PARQUET:field_id": b"1"})])
        pq.write_table(pa.table({"id": equality_ids}, schema=schema), local)
        content, n, eq = DataFileContent.EQUALITY_DELETES, len(equality_ids), [1]
    data_file = DataFile.from_args(content=content, file_path=uri, file_format=FileFormat.PARQUET,
                                   partition=Record(), record_count=n,
                                   file_size_in_bytes=os.path.getsize(local), equality_ids=eq)
    data_file.spec_id = table.spec().spec_id
    writer = _delete_manifest_writer()
    with table.transaction() as tx:
        with tx.update_snapshot().fast_append() as append:
            out = table.io.new_output(f"{location}/metadata/{uuid.uuid4()}-deletes-m0.avro")
            with writer(spec=table.spec(), schema=table.schema(), output_file=out,
                        snapshot_id=append._snapshot_id, avro_compression="deflate") as w:
                w.add_entry(ManifestEntry.from_args(status=ManifestEntryStatus.ADDED,
                                                   snapshot_id=append._snapshot_id, sequence_number=None,
                                                   file_sequence_number=None, data_file=data_file))
            manifest = w.to_manifest_file()
            produced = append._process_manifests
            append._process_manifests = lambda manifests: produced(manifests) + [manifest]
    return uri


POS_DELETED = {0: [0, 5, 63, 64, 65, 130, 199], 1: [3, 4, 150]}  # per data file: ids 0.., ids 1000..


@pytest.fixture(scope="module")
def mor(tmp_path_factory):
    """An unpartitioned table of two data files of 200 rows (row groups of 64), then a
    snapshot adding a position delete file that removes rows of both (across row-group
    boundaries), then an append. Returns (table, [snapshot ids], the two data file URIs)."""
    catalog = _catalog(tmp_path_factory.mktemp("mor"))
    schema = pa.schema([("id", pa.int64()), ("s", pa.string()), ("x", pa.float64())])
    table = catalog.create_table("ns.mor", schema=schema,
                                 properties={"write.parquet.row-group-limit": ROW_GROUP_ROWS})
    for start in (0, 1000):
        ids = list(range(start, start + 200))
        table.append(pa.table({"id": ids, "s": [f"v{i}" for i in ids], "x": [i / 2 for i in ids]}, schema=schema))
    snaps = [table.current_snapshot().snapshot_id]
    # by their first id: the file of ids 0.. first
    files = [t.file.file_path for t in sorted(table.scan().plan_files(), key=lambda t: t.file.lower_bounds[1])]
    commit_deletes(table, positions={files[f]: p for f, p in POS_DELETED.items()})
    snaps.append(table.current_snapshot().snapshot_id)
    table.append(pa.table({"id": [5000, 5001], "s": ["w", "z"], "x": [0.5, 1.5]}, schema=schema))
    snaps.append(table.current_snapshot().snapshot_id)
    return table, snaps, files


# -- every snapshot reads as pyiceberg does ------------------------------------------------

@pytest.mark.parametrize("k", range(7))
def test_every_snapshot_reads_as_pyiceberg_does(history, k):
    table, snaps = history
    truth = _truth(table, snaps[k])
    ds = al.iceberg(table, snapshot_id=snaps[k])
    got = ds.to_arrow()
    assert got.schema.names == truth.schema.names
    assert sorted_rows(got) == sorted_rows(truth)
    assert ds.count() == truth.num_rows
    assert len(ds.loader(32)) == -(-truth.num_rows // 32)
    assert ds.plan.source.table == {"format": "iceberg", "uri": table.location().removeprefix("file://"),
                                    "snapshot_id": snaps[k]}


def test_fixture_covers_what_it_claims(history):
    """The folder holds dead rows; the table is partitioned; the snapshots differ."""
    table, snaps = history
    assert len(set(snaps)) == 7 and [f.name for f in table.spec().fields] == ["part", "n"]
    counts = [_truth(table, s).num_rows for s in snaps]
    assert counts[2] == counts[1] - 60 and counts[-1] < counts[-2]
    folder_rows = sum(pq.read_metadata(os.path.join(d, f)).num_rows
                      for d, _, fs in os.walk(table.location().removeprefix("file://")) for f in fs
                      if f.endswith(".parquet"))
    assert folder_rows > counts[-1]


def test_added_column_reads_as_nulls_in_older_files(history):
    table, snaps = history
    got = al.iceberg(table, snapshot_id=snaps[3]).select("id", "extra").to_arrow()
    old = got.filter(pc.less(got["id"], 600))
    new = got.filter(pc.greater_equal(got["id"], 600))
    assert old.num_rows > 0 and old["extra"].null_count == old.num_rows
    assert new.num_rows == 150 and new["extra"].to_pylist() == [f"e{i}" for i in new["id"].to_pylist()]


def test_renamed_column_reads_from_older_files_by_field_id(history):
    table, snaps = history
    ds = al.iceberg(table, snapshot_id=snaps[4])
    assert "y" in ds.schema.names and "x" not in ds.schema.names
    got = ds.select("id", "y").to_arrow()
    assert got["y"].null_count == 0  # files written before the rename hold the column as "x"
    assert got["y"].to_pylist() == [i / 4 for i in got["id"].to_pylist()]
    src = ds.plan.source
    renamed = [i for i in range(src.num_files) if src.file_columns(i).get("y") == "x"]
    assert 0 < len(renamed) < src.num_files
    # filters and statistics on the renamed column see the old files' values
    expected = sum(1 for i in got["id"].to_pylist() if i / 4 < 30)
    assert ds.filter("y < 30").count() == expected
    assert sorted(ds.filter("y < 30").select("id").to_arrow()["id"].to_pylist()) == \
        sorted(i for i in got["id"].to_pylist() if i / 4 < 30)


def test_dropped_and_added_again_column_never_reads_the_old_data(history):
    table, snaps = history
    ds = al.iceberg(table, snapshot_id=snaps[5])
    assert ds.schema.field("extra").type == pa.int64()
    got = ds.select("id", "extra").to_arrow()
    old = got.filter(pc.less(got["id"], 800))
    assert old.num_rows > 0 and old["extra"].null_count == old.num_rows  # not "e600"...
    new = got.filter(pc.greater_equal(got["id"], 800))
    assert new["extra"].to_pylist() == [i * 10 for i in new["id"].to_pylist()]
    # statistics of the old "extra" (strings) are never used for the new one
    assert ds.filter("extra IS NULL").count() == old.num_rows
    assert ds.filter("extra IS NOT NULL").count() == 50
    assert sorted(flat_ids(ds.filter("extra IS NULL").select("id").loader(64))) == sorted(old["id"].to_pylist())
    desc = ds.describe()  # footer statistics, mapped per file
    extra = desc.filter(desc["column"] == "extra")
    assert extra["null_count"].item() == old.num_rows and extra["min"].item() == "8000"
    assert float(desc.filter(desc["column"] == "y")["min"].item()) == 0.0  # "x" in the oldest files


def test_identity_partition_column_missing_from_a_file_reads_as_its_value(tmp_path):
    """A data file without its identity partition column (a migrated file, committed with
    pyiceberg's own fast append): the column reads as the file's partition value, as
    pyiceberg's own read does."""
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import IdentityTransform
    from pyiceberg.typedef import Record
    from pyiceberg.types import LongType, NestedField, StringType

    catalog = _catalog(tmp_path)
    schema = Schema(NestedField(1, "id", LongType()), NestedField(2, "region", StringType()))
    table = catalog.create_table("ns.migrated", schema=schema,
                                 partition_spec=PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "region")))
    table.append(pa.table({"id": [1, 2], "region": ["eu", "us"]}, schema=schema.as_arrow()))
    path = os.path.join(table.location().removeprefix("file://"), "data", "region=apac", "migrated.parquet")
    os.makedirs(os.path.dirname(path))
    pq.write_table(pa.table({"id": pa.array([10, 11, 12], pa.int64())}, schema=pa.schema(
        [pa.field("id", pa.int64(), metadata={b"PARQUET:field_id": b"1"})])), path)
    data_file = DataFile.from_args(content=DataFileContent.DATA, file_path="file://" + path,
                                   file_format=FileFormat.PARQUET, partition=Record("apac"), record_count=3,
                                   file_size_in_bytes=os.path.getsize(path))
    data_file.spec_id = 0
    with table.transaction() as tx:
        with tx.update_snapshot().fast_append() as append:
            append.append_data_file(data_file)
    truth = _truth(table)
    assert sorted(truth.filter(pc.equal(truth["region"], "apac"))["id"].to_pylist()) == [10, 11, 12]
    ds = al.iceberg(table)
    assert sorted_rows(ds.to_arrow()) == sorted_rows(truth)
    assert ds.filter("region = 'apac'").count() == 3
    assert sorted(flat_ids(ds.filter("region <> 'eu'").loader(2))) == [2, 10, 11, 12]
    got = pa.Table.from_batches(list(ds.loader(5, output="arrow")))
    assert sorted_rows(got) == sorted_rows(truth)


@pytest.mark.parametrize("decoder", ["pyarrow", "dataset"])
def test_field_id_mapping_in_either_decoder(history, decoder, monkeypatch):
    table, snaps = history
    monkeypatch.setenv("ARROWLOAD_DECODER", decoder)
    truth = _truth(table, snaps[6])
    batches = list(al.iceberg(table, snapshot_id=snaps[6]).loader(50, output="arrow"))
    assert sorted_rows(pa.Table.from_batches(batches)) == sorted_rows(truth)


@pytest.mark.parametrize("predicate", [
    "part = 'c d' AND id > 100",
    "part = 'a' OR y < 20",
    "n = 1 AND y > 100",
    "extra IS NULL",
    "id BETWEEN 150 AND 900 AND part <> 'a'",
    "extra > 8100",
])
def test_filters_match_duckdb_over_the_truth(history, predicate):
    table, snaps = history
    truth = _truth(table, snaps[6])  # noqa: F841 - DuckDB reads it by name
    expected = duckdb.sql(f"SELECT * FROM truth WHERE {predicate}").arrow()
    expected = expected.read_all() if hasattr(expected, "read_all") else expected
    ds = al.iceberg(table, snapshot_id=snaps[6]).filter(predicate)
    assert sorted_rows(ds.to_arrow()) == sorted_rows(expected)
    assert ds.count() == expected.num_rows


def test_statistics_pruning_keeps_fewer_row_groups(history):
    table, snaps = history
    ds = al.iceberg(table, snapshot_id=snaps[1])
    total = len(ds.plan.source.units())
    kept = ds.filter("part = 'b' AND id < 50").optimized_plan()
    assert 0 < len(kept.units) < total
    assert sorted(ds.filter("part = 'b' AND id < 50").to_arrow()["id"].to_pylist()) == \
        [i for i in range(50) if i % 3 == 1]


# -- the loader: exact once per epoch, resume, shuffles ------------------------------------

@pytest.fixture(params=["history", "mor"])
def latest(request, history, mor):
    """The latest snapshot of each table, without the column that has nulls: (dataset, truth)."""
    table = history[0] if request.param == "history" else mor[0]
    columns = ["id", "part", "n", "y"] if request.param == "history" else ["id", "s", "x"]
    return al.iceberg(table).select(*columns), _truth(table)


@pytest.mark.parametrize("shuffle", [False, "global", "block"])
def test_loader_is_exact_once_per_epoch_across_ranks(latest, shuffle):
    ds, truth = latest
    n = truth.num_rows
    per_rank = []
    for rank in (0, 1):
        loader = ds.loader(16, shuffle=shuffle, seed=7, world_size=2, rank=rank)
        loader.set_epoch(1)
        ids = flat_ids(loader)
        assert len(ids) == n // 2 and len(loader) == -(-(n // 2) // 16)
        per_rank.append(ids)
    both = per_rank[0] + per_rank[1]
    assert len(set(both)) == len(both) == n - n % 2
    assert set(both) <= set(truth["id"].to_pylist())


@pytest.mark.parametrize("shuffle", ["global", "block"])
def test_resume_is_exact(latest, shuffle):
    ds, _ = latest
    ds = ds.filter("id <> 204")
    full = [list(b["id"]) for b in ds.loader(24, shuffle=shuffle, seed=2)]
    for k in (1, 5, 11):
        state = state_after(ds.loader(24, shuffle=shuffle, seed=2), k)
        fresh = ds.loader(24, shuffle=shuffle, seed=2)
        fresh.load_state_dict(state)
        assert [list(b["id"]) for b in fresh] == full[k:]


def test_snapshots_are_snapshot_ids_and_a_state_resumes_on_its_own_snapshot(history):
    table, snaps = history
    a, b = al.iceberg(table, snapshot_id=snaps[4]), al.iceberg(table, snapshot_id=snaps[5])
    assert a.plan.source.fingerprint() != b.plan.source.fingerprint()
    assert a.plan.source.fingerprint() == al.iceberg(table, snapshot_id=snaps[4]).plan.source.fingerprint()
    assert a.snapshot_id == f"iceberg:{a.plan.source.table['uri']}@s{snaps[4]}" != b.snapshot_id
    assert a.pin().snapshot_id == a.snapshot_id
    for shuffle in (False, "block", "global"):
        whole = flat_ids(a.select("id").loader(16, shuffle=shuffle, seed=1))
        state = state_after(a.select("id").loader(16, shuffle=shuffle, seed=1), 2)
        assert state["sources"] == [{"snapshot": a.snapshot_id, "table": a.plan.source.table}]
        # a loader built on the newer snapshot (the table moved on) resumes snapshot 4's epoch
        later = b.select("id").loader(16, shuffle=shuffle, seed=1)
        later.load_state_dict(state)
        assert later.snapshot_id == a.snapshot_id
        assert flat_ids(later) == whole[2 * 16:]
    other = state_after(al.dataset(pa.table({"id": list(range(100))})).loader(16, seed=1), 1)
    with pytest.raises(al.StateMismatchError):
        b.select("id").loader(16, seed=1).load_state_dict(other)


# -- position deletes (merge-on-read) --------------------------------------------------------

def test_position_delete_fixture_is_honoured_by_pyiceberg(mor):
    table, snaps, files = mor
    tasks = list(table.scan(snapshot_id=snaps[1]).plan_files())
    assert all(len(t.delete_files) == 1 for t in tasks)
    assert _truth(table, snaps[0]).num_rows == 400
    assert _truth(table, snaps[1]).num_rows == 400 - 10
    gone = set(range(200)) | set(range(1000, 1200))
    gone -= set(_truth(table, snaps[1])["id"].to_pylist())
    assert gone == {p for p in POS_DELETED[0]} | {1000 + p for p in POS_DELETED[1]}


@pytest.mark.parametrize("k", range(3))
def test_position_deleted_rows_never_appear(mor, k):
    table, snaps, _ = mor
    truth = _truth(table, snaps[k])
    ds = al.iceberg(table, snapshot_id=snaps[k])
    assert sorted_rows(ds.to_arrow()) == sorted_rows(truth)
    assert ds.count() == truth.num_rows
    src = ds.plan.source
    assert sum(u.num_rows for u in src.units()) == truth.num_rows
    assert sum(u.deleted for u in src.units()) == (0 if k == 0 else 10)
    live = truth["id"].to_pylist()
    big = sorted(r["id"] for r in truth.to_pylist() if r["x"] >= 50)
    assert ds.filter("x >= 50").count() == len(big)
    assert sorted(ds.filter("x >= 50").select("id").to_arrow()["id"].to_pylist()) == big
    assert sorted(flat_ids(ds.to_batches())) == sorted(live)


def test_sql_aggregates_over_position_deletes_match_duckdb(mor):
    """al.sql's DuckDB path (an aggregate) streams the live rows only."""
    table, snaps, _ = mor
    truth = _truth(table, snaps[2])  # noqa: F841 - DuckDB reads it by name
    query = "SELECT id // 100 AS k, count(*) AS c, sum(x) AS sx FROM {} GROUP BY 1 ORDER BY 1"
    expected = duckdb.sql(query.format("truth")).arrow()
    expected = expected.read_all() if hasattr(expected, "read_all") else expected
    got = al.sql(query.format("t"), t=al.iceberg(table, snapshot_id=snaps[2])).to_arrow()
    assert got.to_pylist() == expected.to_pylist()


@pytest.mark.parametrize("decoder", ["pyarrow", "dataset"])
def test_position_deletes_in_either_decoder(mor, decoder, monkeypatch):
    table, snaps, _ = mor
    monkeypatch.setenv("ARROWLOAD_DECODER", decoder)
    live = _truth(table, snaps[1])["id"].to_pylist()
    ds = al.iceberg(table, snapshot_id=snaps[1])
    assert sorted(flat_ids(ds.loader(7))) == sorted(live)
    assert sorted(flat_ids(ds.filter("s <> 'v3'").loader(9))) == sorted(i for i in live if i != 3)


def test_explain_repr_and_describe_name_the_table_snapshot_and_deleted_rows(mor):
    table, snaps, _ = mor
    root = table.location().removeprefix("file://")
    ds = al.iceberg(table, snapshot_id=snaps[1])
    text = ds.explain()
    assert f"iceberg table {root} snapshot {snaps[1]} (2 files, 10 deleted rows)" in text
    assert "2 of 2 files, 10 of 10 deleted rows" in text
    assert f"snapshot {snaps[1]}" in repr(ds) and "10 deleted rows" in repr(ds)
    assert "1 of 2 files, 3 of 10 deleted rows" in ds.filter("id >= 1000").explain()
    desc = ds.describe()
    assert all("iceberg" in s and f"snapshot {snaps[1]}" in s for s in desc["source"])
    assert desc.filter(desc["column"] == "id")["rows"].item() == 390


def test_equality_deletes_are_refused_naming_the_file(tmp_path):
    catalog = _catalog(tmp_path)
    schema = pa.schema([("id", pa.int64()), ("s", pa.string())])
    table = catalog.create_table("ns.eq", schema=schema)
    table.append(pa.table({"id": [1, 2, 3], "s": ["a", "b", "c"]}, schema=schema))
    before = table.current_snapshot().snapshot_id
    uri = commit_deletes(table, equality_ids=[2])
    with pytest.raises(ValueError, match="equality deletes"):
        table.scan().to_arrow()  # pyiceberg cannot read it either
    for open_ in (lambda: al.iceberg(table), lambda: al.dataset(table.location().removeprefix("file://"))):
        with pytest.raises(al.UnsupportedTableFeatureError) as info:
            open_()
        assert info.value.feature == "equality deletes" and uri in str(info.value)
        assert isinstance(info.value, NotImplementedError) and isinstance(info.value, al.ArrowloadError)
    assert al.iceberg(table, snapshot_id=before).count() == 3  # before the deletes: readable


def test_missing_position_delete_file_is_a_typed_error_naming_it(tmp_path):
    catalog = _catalog(tmp_path)
    schema = pa.schema([("id", pa.int64())])
    table = catalog.create_table("ns.gone", schema=schema)
    table.append(pa.table({"id": [1, 2, 3]}, schema=schema))
    data = next(iter(table.scan().plan_files())).file.file_path
    uri = commit_deletes(table, positions={data: [1]})
    assert al.iceberg(table).to_arrow()["id"].to_pylist() == [1, 3]
    os.remove(uri.removeprefix("file://"))
    with pytest.raises(al.PathNotFoundError) as info:
        al.iceberg(table)
    assert uri in str(info.value) and "delete file" in str(info.value)


# -- how a table is named ---------------------------------------------------------------------

def test_metadata_json_path_and_table_folder(history, tmp_path):
    table, snaps = history
    root = table.location().removeprefix("file://")
    truth = _truth(table)
    by_path = al.iceberg(table.metadata_location.removeprefix("file://"), snapshot_id=snaps[3])
    assert sorted_rows(by_path.to_arrow()) == sorted_rows(_truth(table, snaps[3]))
    assert by_path.plan.source.fingerprint() == al.iceberg(table, snapshot_id=snaps[3]).plan.source.fingerprint()
    assert sorted_rows(al.iceberg(table.metadata_location).to_arrow()) == sorted_rows(truth)  # a file:// URI
    for ds in (al.dataset(root), al.iceberg(root)):  # the folder: its newest metadata file
        assert ds.plan.source.table["snapshot_id"] == snaps[-1]
        assert sorted_rows(ds.to_arrow()) == sorted_rows(truth)
    with pytest.raises(al.InvalidArgumentError, match="no snapshot 12345"):
        al.iceberg(table, snapshot_id=12345)
    with pytest.raises(al.ArgumentTypeError):
        al.iceberg(42)
    with pytest.raises(al.PathNotFoundError):
        al.iceberg(str(tmp_path / "nothing.metadata.json"))


def test_newest_metadata_by_version_hint_and_number(history, tmp_path):
    """A copy of the table folder (paths inside still point at the original files): the
    version-hint.text file decides where present, else the highest version number."""
    table, snaps = history
    root = str(tmp_path / "t")
    shutil.copytree(table.location().removeprefix("file://"), root)
    meta = os.path.join(root, "metadata")
    names = sorted(n for n in os.listdir(meta) if n.endswith(".metadata.json"))
    assert al.dataset(root).plan.source.table["snapshot_id"] == snaps[-1]
    older = names[3]
    os.rename(os.path.join(meta, older), os.path.join(meta, "v99.metadata.json"))
    got = al.dataset(root).plan.source.table["snapshot_id"]
    from pyiceberg.table import StaticTable
    assert got == StaticTable.from_metadata(os.path.join(meta, "v99.metadata.json")).current_snapshot().snapshot_id
    with open(os.path.join(meta, "version-hint.text"), "w") as f:
        f.write(str(int(names[-1].split("-")[0])))
    assert al.dataset(root).plan.source.table["snapshot_id"] == snaps[-1]


def test_folder_inside_a_table_is_refused_naming_the_root(history):
    table, _ = history
    root = table.location().removeprefix("file://")
    for inner in (os.path.join(root, "data"), os.path.join(root, "data", "part=a")):
        if not os.path.isdir(inner):
            continue
        with pytest.raises(al.LakeTableError) as info:
            al.dataset(inner)
        assert os.path.samefile(info.value.table_root, root)
        assert f"al.iceberg({info.value.table_root!r})" in str(info.value)
    with pytest.raises(al.LakeTableError, match="al.iceberg"):
        al.dataset(root, format="csv")


def test_current_table_reads_with_the_schema_changed_since_its_last_snapshot(tmp_path):
    """A column renamed, one added and one widened after the last append (no snapshot
    since): the current table reads as pyiceberg reads it, with the current schema; the
    snapshot by id reads with its own (time travel); a state taken on the current table
    resumes on it after the table moved on."""
    from pyiceberg.types import LongType
    catalog = _catalog(tmp_path)
    table = catalog.create_table("ns.evolved", schema=pa.schema([("id", pa.int64()), ("x", pa.int32())]))
    table.append(pa.table({"id": pa.array(range(100), pa.int64()), "x": pa.array(range(0, 1000, 10), pa.int32())}))
    first = table.current_snapshot().snapshot_id
    with table.update_schema() as update:
        update.rename_column("x", "y")
        update.add_column("z", LongType())
    with table.update_schema() as update:
        update.update_column("y", LongType())
    table = catalog.load_table("ns.evolved")
    ds = al.iceberg(table)
    truth = table.scan().to_arrow()
    assert ds.schema == truth.schema and ds.schema.names == ["id", "y", "z"]
    assert ds.to_arrow().sort_by("id").equals(truth.sort_by("id"))
    assert ds.filter("y > 500").count() == 49 and ds.filter("z IS NULL").count() == 100
    old = al.iceberg(table, snapshot_id=first)
    assert old.schema.names == ["id", "x"] and old.to_arrow().sort_by("id").equals(
        table.scan(snapshot_id=first).to_arrow().sort_by("id"))
    assert ds.snapshot_id == old.snapshot_id and ds.plan.source.fingerprint() != old.plan.source.fingerprint()
    whole = flat_ids(ds.select("id", "y").loader(16, shuffle="global", seed=1))
    state = state_after(ds.select("id", "y").loader(16, shuffle="global", seed=1), 2)
    from test_formats import validator
    validator("loader_state", 4).validate(state)
    assert state["sources"][0]["table"]["schema_id"] == table.metadata.current_schema_id
    table.append(pa.table({"id": pa.array(range(100, 110), pa.int64()), "y": pa.array([1] * 10, pa.int64()),
                           "z": pa.array([2] * 10, pa.int64())}))
    later = al.iceberg(catalog.load_table("ns.evolved")).select("id", "y").loader(16, shuffle="global", seed=1)
    later.load_state_dict(state)
    assert flat_ids(later) == whole[2 * 16:]



@pytest.mark.parametrize("change", ["add", "rename"])
def test_a_state_resumes_after_a_schema_change_that_made_no_snapshot(tmp_path, change):
    """A state taken on the current snapshot, then a column added (or an unselected one
    renamed): the table's snapshot stays, its current schema moves on. The same selection
    resumes the state's snapshot as it was read, to exactly the rest of the epoch; it was
    refused as "not the selection the state was taken with"."""
    from pyiceberg.types import LongType
    catalog = _catalog(tmp_path)
    table = catalog.create_table("ns.t", schema=pa.schema([("id", pa.int64()), ("x", pa.int64())]))
    table.append(pa.table({"id": pa.array(range(100), pa.int64()), "x": pa.array(range(100), pa.int64())}))

    def loader():
        return al.iceberg(catalog.load_table("ns.t")).select("id").loader(10, shuffle="global", seed=3)

    whole = flat_ids(loader())
    state = state_after(loader(), 3)
    with catalog.load_table("ns.t").update_schema() as update:
        if change == "add":
            update.add_column("z", LongType())
        else:
            update.rename_column("x", "y")
    moved = catalog.load_table("ns.t")
    assert moved.current_snapshot().snapshot_id == table.current_snapshot().snapshot_id
    assert moved.metadata.current_schema_id != table.metadata.current_schema_id
    resumed = loader()
    resumed.load_state_dict(state)
    assert flat_ids(resumed) == whole[30:] and sorted(whole) == list(range(100))


_EVOLVE = st.lists(st.sampled_from(["append", "rename", "add", "widen", "drop"]), min_size=1, max_size=6)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_EVOLVE)
def test_generated_schema_evolution_reads_as_pyiceberg_does(tmp_path_factory, ops):
    """Appends and schema changes in any order, the last ones possibly after the last
    append: the current table as pyiceberg's scan reads it (columns, types, rows), and
    every snapshot as pyiceberg reads that snapshot."""
    from pyiceberg.types import LongType, StringType
    catalog = _catalog(tmp_path_factory.mktemp("evolve"))
    table = catalog.create_table("ns.t", schema=pa.schema([("id", pa.int64()), ("c0", pa.int32())]))
    next_id, added = 0, 1
    for op in ops:
        cols = [f.name for f in table.schema().fields]
        if op == "append":
            arrow = table.schema().as_arrow()
            data = {f.name: pa.array([None] * 5, f.type) for f in arrow}
            data["id"] = pa.array(range(next_id, next_id + 5), pa.int64())
            for f in arrow:
                if f.name != "id" and (pa.types.is_integer(f.type)):
                    data[f.name] = pa.array([i * 3 for i in range(next_id, next_id + 5)], f.type)
            table.append(pa.table(data, schema=arrow))
            next_id += 5
        elif op == "rename" and len(cols) > 1:
            with table.update_schema() as u:
                u.rename_column(cols[-1], f"r{added}")
            added += 1
        elif op == "add":
            with table.update_schema() as u:
                u.add_column(f"a{added}", StringType() if added % 2 else LongType())
            added += 1
        elif op == "widen":
            ints = [f.name for f in table.schema().fields if str(f.field_type) == "int"]
            if ints:
                with table.update_schema() as u:
                    u.update_column(ints[0], LongType())
        elif op == "drop" and len(cols) > 2:
            with table.update_schema() as u:
                u.delete_column(cols[-1])
        table = catalog.load_table("ns.t")
    truth = table.scan().to_arrow()
    ds = al.iceberg(table)
    assert ds.schema.names == truth.schema.names
    assert sorted_rows(ds.to_arrow()) == sorted_rows(truth.cast(ds.schema))
    for snap in table.snapshots():
        old = table.scan(snapshot_id=snap.snapshot_id).to_arrow()
        got = al.iceberg(table, snapshot_id=snap.snapshot_id)
        assert got.schema.names == old.schema.names
        assert sorted_rows(got.to_arrow()) == sorted_rows(old.cast(got.schema))


def test_empty_table_has_no_rows(tmp_path):
    catalog = _catalog(tmp_path)
    table = catalog.create_table("ns.empty", schema=pa.schema([("id", pa.int64()), ("s", pa.string())]))
    ds = al.iceberg(table)
    assert ds.schema.names == ["id", "s"] and ds.count() == 0 and ds.to_arrow().num_rows == 0
    assert ds.plan.source.table["snapshot_id"] is None


# -- S3 ------------------------------------------------------------------------------------------

def test_iceberg_table_on_s3(tmp_path):
    """Through a real S3 API (moto on loopback): pyiceberg writes the table (its fsspec
    FileIO with ``s3.endpoint``: pyarrow's S3 multipart uploads fail against moto), with a
    copy-on-write delete; arrowload opens it from the Table
    (the FileIO's properties give the endpoint and keys) and from its metadata URI."""
    import s3fs
    with moto_s3_server() as url:
        s3 = s3fs.S3FileSystem(endpoint_url=url, key="testing", secret="testing", skip_instance_cache=True)
        s3.mkdir("lake")
        from pyiceberg.catalog.sql import SqlCatalog
        catalog = SqlCatalog("s3test", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse="s3://lake/wh",
                             **{"py-io-impl": "pyiceberg.io.fsspec.FsspecFileIO", "s3.endpoint": url,
                                "s3.access-key-id": "testing", "s3.secret-access-key": "testing",
                                "s3.region": "us-east-1"})
        catalog.create_namespace("ns")
        schema = pa.schema([("id", pa.int64()), ("s", pa.string())])
        table = catalog.create_table("ns.t", schema=schema)
        table.append(pa.table({"id": list(range(100)), "s": [f"v{i}" for i in range(100)]}, schema=schema))
        table.append(pa.table({"id": list(range(100, 150)), "s": ["w"] * 50}, schema=schema))
        table.delete("id < 10")
        truth = _truth(table)
        ds = al.iceberg(table)
        assert ds.plan.source.table["uri"].startswith("s3://lake/wh")
        assert sorted_rows(ds.to_arrow()) == sorted_rows(truth)
        assert Counter(flat_ids(ds.loader(16, shuffle="block", seed=1))) == Counter(truth["id"].to_pylist())
        options = {"endpoint_url": url, "key": "testing", "secret": "testing"}
        by_uri = al.iceberg(table.metadata_location, storage_options=options)
        assert by_uri.filter("s = 'w'").count() == 50
        folder = al.dataset(table.location(), storage_options=options)
        assert folder.count() == truth.num_rows
        with pytest.raises(al.LakeTableError, match="Iceberg"):
            al.dataset(table.location() + "/data/", storage_options=options)


def test_transform_partitions_read_as_pyiceberg_does(tmp_path):
    """Bucket, day and truncate partitions (written by pyiceberg with pyiceberg-core): the
    source columns are in the data files, the partition values only in the manifests; rows,
    counts, filters (DuckDB) and a sharded loader match pyiceberg's own read."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import BucketTransform, DayTransform, TruncateTransform
    from pyiceberg.types import LongType, NestedField, StringType, TimestampType

    catalog = _catalog(tmp_path)
    schema = Schema(NestedField(1, "id", LongType()), NestedField(2, "ts", TimestampType()),
                    NestedField(3, "name", StringType()))
    spec = PartitionSpec(PartitionField(1, 1000, BucketTransform(4), "id_bucket"),
                         PartitionField(2, 1001, DayTransform(), "ts_day"),
                         PartitionField(3, 1002, TruncateTransform(2), "name_trunc"))
    table = catalog.create_table("ns.transformed", schema=schema, partition_spec=spec)
    n = 400
    rows = pa.table({"id": pa.array(range(n), pa.int64()),
                     "ts": pa.array([1_700_000_000_000_000 + i * 3_600_000_000 for i in range(n)],
                                    pa.timestamp("us")),
                     "name": [f"{'abcdef'[i % 6]}{'xyz'[i % 3]}-{i}" for i in range(n)]})
    table.append(rows.cast(schema.as_arrow()))
    table.append(rows.slice(0, 50).set_column(0, "id", pa.array(range(n, n + 50), pa.int64()))
                 .cast(schema.as_arrow()))
    truth = _truth(table)
    assert truth.num_rows == n + 50
    files = {t.file.file_path for t in table.scan().plan_files()}
    assert len(files) > 8  # one file per (bucket, day, prefix): really partitioned
    ds = al.iceberg(table)
    assert sorted_rows(ds.to_arrow()) == sorted_rows(truth)
    assert ds.count() == truth.num_rows
    for predicate in ("id < 100", "name LIKE 'a%'", "ts >= TIMESTAMP '2023-11-16 00:00:00'"):
        expected = duckdb.sql(f"SELECT * FROM truth WHERE {predicate}").arrow()
        expected = expected.read_all() if hasattr(expected, "read_all") else expected
        got = ds.filter(predicate)
        assert sorted_rows(got.to_arrow()) == sorted_rows(expected), predicate
        assert got.count() == expected.num_rows
    ids = [flat_ids(ds.select("id").loader(32, shuffle="block", seed=3, rank=r, world_size=2)) for r in range(2)]
    assert not set(ids[0]) & set(ids[1]) and len(ids[0]) == len(ids[1]) == truth.num_rows // 2


# -- files without field ids: the table's name mapping -------------------------------------

@pytest.fixture(scope="module")
def migrated(tmp_path_factory):
    """A table migrated from plain Parquet: two files written without field ids (several
    row groups each) registered with pyiceberg's ``add_files`` (the table keeps the name
    mapping pyiceberg wrote); then a column renamed, a column added, and rows appended
    with field ids. Returns (table, [snapshot ids])."""
    from pyiceberg.types import LongType

    root = tmp_path_factory.mktemp("migrated")
    catalog = _catalog(root)
    plain = []
    for k in range(2):
        ids = list(range(k * 200, (k + 1) * 200))
        path = str(root / f"plain-{k}.parquet")
        pq.write_table(pa.table({"id": pa.array(ids, pa.int64()), "name": [f"n{i}" for i in ids],
                                 "x": pa.array([i / 4 for i in ids], pa.float64())}),
                       path, row_group_size=64)
        plain.append(path)
    schema = pq.read_schema(plain[0])
    assert all(not f.metadata for f in schema)  # no field ids, as a plain writer leaves them
    table = catalog.create_table("ns.migrated", schema=schema)
    table.add_files(plain)
    snaps = [table.current_snapshot().snapshot_id]
    with table.update_schema() as u:
        u.rename_column("name", "label")
        u.add_column("extra", LongType())
    ids = list(range(400, 450))
    table.append(pa.table({"id": pa.array(ids, pa.int64()), "label": [f"n{i}" for i in ids],
                           "x": pa.array([i / 4 for i in ids], pa.float64()),
                           "extra": pa.array([i * 10 for i in ids], pa.int64())}).cast(table.schema().as_arrow()))
    snaps.append(table.current_snapshot().snapshot_id)
    return table, snaps


@pytest.mark.parametrize("k", [0, 1])
def test_files_without_field_ids_read_by_the_name_mapping(migrated, k):
    """Columns of files written without field ids are found through the table's name
    mapping (before: every column of such a file read as nulls), renamed ones too."""
    table, snaps = migrated
    truth = _truth(table, snaps[k])
    assert truth["id"].null_count == 0 and truth.num_rows == (400 if k == 0 else 450)
    ds = al.iceberg(table, snapshot_id=snaps[k])
    got = ds.to_arrow()
    assert got.schema.names == truth.schema.names
    assert sorted_rows(got) == sorted_rows(truth)
    assert ds.count() == truth.num_rows
    assert sorted(flat_ids(ds.select("id").loader(64, shuffle=True, seed=1))) == sorted(truth["id"].to_pylist())


@pytest.mark.parametrize("decoder", ["pyarrow", "dataset", "polars"])
@pytest.mark.parametrize("predicate", ["label = 'n7' OR label > 'n43'", "x < 20 AND id >= 10", "extra IS NULL",
                                       "extra > 4200"])
def test_name_mapped_files_filter_as_duckdb_in_every_decoder(migrated, decoder, predicate, monkeypatch):
    table, snaps = migrated
    monkeypatch.setenv("ARROWLOAD_DECODER", decoder)
    truth = _truth(table, snaps[1])  # noqa: F841 - DuckDB reads it by name
    expected = duckdb.sql(f"SELECT * FROM truth WHERE {predicate}").arrow()
    expected = expected.read_all() if hasattr(expected, "read_all") else expected
    ds = al.iceberg(table, snapshot_id=snaps[1]).filter(predicate)
    assert expected.num_rows > 0
    assert sorted_rows(pa.Table.from_batches(list(ds.loader(50, output="arrow")))) == sorted_rows(expected)
    assert ds.count() == expected.num_rows


def test_files_without_field_ids_and_no_name_mapping_are_refused(migrated, tmp_path):
    """Without a name mapping a file without field ids cannot be read by the spec (pyiceberg
    refuses it too): a typed error naming the file and the property, never nulls."""
    table, snaps = migrated
    meta = table.metadata_location.removeprefix("file://")
    doc = json.loads(open(meta).read())
    del doc["properties"]["schema.name-mapping.default"]
    bare = tmp_path / "v99.metadata.json"
    bare.write_text(json.dumps(doc))
    from pyiceberg.table import StaticTable
    static = StaticTable.from_metadata(str(bare))
    with pytest.raises(Exception):
        static.scan(snapshot_id=snaps[0]).to_arrow()
    with pytest.raises(al.UnsupportedTableFeatureError, match="name mapping") as err:
        al.iceberg(str(bare), snapshot_id=snaps[0]).to_arrow()
    assert err.value.feature == "data files without field ids" and "plain-" in str(err.value)


def test_statistics_prune_renamed_columns_under_the_files_names(history, migrated):
    """A column renamed after a file was written prunes that file's row groups on its
    statistics under the old name (before: never pruned); a column the file lacks never
    prunes it. Rows as pyiceberg reads them, DuckDB over them."""
    table, snaps = history
    ds = al.iceberg(table, snapshot_id=snaps[4])
    total = len(ds.plan.source.units())
    assert len(ds.filter("y < 10").optimized_plan().units) <= total // 4  # before: every older file kept
    got = sorted(ds.filter("y < 10").select("id").to_arrow()["id"].to_pylist())
    assert got == sorted(i for i in _truth(table, snaps[4])["id"].to_pylist() if i / 4 < 10)
    # "extra" (dropped and added again) is absent from the older files: they are kept
    ds6 = al.iceberg(table, snapshot_id=snaps[6])
    truth = _truth(table, snaps[6])  # noqa: F841 - DuckDB reads it by name
    for predicate in ("extra IS NULL AND y < 30", "extra > 8100", "y >= 200 AND extra IS NULL"):
        expected = duckdb.sql(f"SELECT * FROM truth WHERE {predicate}").arrow()
        expected = expected.read_all() if hasattr(expected, "read_all") else expected
        assert sorted_rows(ds6.filter(predicate).to_arrow()) == sorted_rows(expected), predicate
    mtable, msnaps = migrated  # files without field ids: "label" is "name" there (name mapping)
    m = al.iceberg(mtable, snapshot_id=msnaps[1])
    kept = m.filter("label < 'n11'").optimized_plan().units
    assert len(kept) < len(m.plan.source.units())
    expected = [i for i in _truth(mtable, msnaps[1]).to_pydict()["label"] if i < "n11"]
    assert sorted(m.filter("label < 'n11'").to_arrow()["label"].to_pylist()) == sorted(expected)


# -- nested schema evolution: the fields inside a struct / list / map, by field id ---------------

def _nested_batch(table, start: int, n: int, evolved: int) -> pa.Table:
    """Rows ``start..start+n`` in ``table``'s current schema (``evolved``: how many of the
    schema changes below it has seen), with nulls at every level: a null struct, list,
    map (pyiceberg writes those two as empty), element, map value and field."""
    arrow = table.schema().as_arrow()
    a = "a2" if evolved >= 1 else "a"
    rows = []
    for i in range(start, start + n):
        s = None if i % 7 == 3 else {a: (None if i % 5 == 0 else i * 3), "b": f"b{i}"}
        element = {"x": i % 11}
        if evolved >= 1:
            s = None if s is None else {**{k: v for k, v in s.items() if k != "b"}, "c": i / 8}
            element["y"] = None if i % 4 == 0 else f"y{i}"
        l = None if i % 9 == 4 else [element, None] if i % 2 else [element]
        value = {"p": float(i % 13)} if evolved < 1 else {"p": float(i % 13), "q": i}
        m = None if i % 10 == 6 else [(f"k{i % 3}", None if i % 6 == 1 else value)]
        rows.append({"id": i, "s": s, "l": l, "m": m})
    got = pa.Table.from_pylist(rows, schema=pa.schema([f.remove_metadata() for f in arrow]))
    return got


@pytest.fixture(scope="module")
def nested(tmp_path_factory):
    """A table whose nested columns evolve: ``s`` struct<a int, b string>, ``l``
    list<struct<x int>>, ``m`` map<string, struct<p float>>; rows appended; then a field
    renamed (``s.a`` -> ``a2``) and widened (int -> long), one dropped (``s.b``), fields
    added (``s.c``, ``l.element.y``, ``m.value.q``), one widened inside a map (``p``
    float -> double); rows appended; then ``s.c`` moved first; rows appended. Returns
    (table, [snapshot ids])."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import (DoubleType, FloatType, IntegerType, ListType, LongType, MapType, NestedField,
                                 StringType, StructType)

    catalog = _catalog(tmp_path_factory.mktemp("nested"))
    schema = Schema(
        NestedField(1, "id", LongType(), required=False),
        NestedField(2, "s", StructType(NestedField(3, "a", IntegerType(), required=False),
                                       NestedField(4, "b", StringType(), required=False)), required=False),
        NestedField(5, "l", ListType(6, StructType(NestedField(7, "x", IntegerType(), required=False)),
                                     element_required=False), required=False),
        NestedField(8, "m", MapType(9, StringType(), 10, StructType(NestedField(11, "p", FloatType(),
                                                                                 required=False)),
                                    value_required=False), required=False))
    table = catalog.create_table("ns.nested", schema=schema,
                                 properties={"write.parquet.row-group-limit": ROW_GROUP_ROWS})
    table.append(_nested_batch(table, 0, 150, 0))
    snaps = [table.current_snapshot().snapshot_id]
    with table.update_schema() as u:
        u.rename_column("s.a", "a2")
        u.update_column("s.a", LongType())
        u.delete_column("s.b")
        u.add_column(("s", "c"), DoubleType())
        u.add_column(("l", "element", "y"), StringType())
        u.add_column(("m", "value", "q"), LongType())
        u.update_column("m.value.p", DoubleType())
    table.append(_nested_batch(table, 150, 100, 1))
    snaps.append(table.current_snapshot().snapshot_id)
    with table.update_schema() as u:
        u.move_first("s.c")
    table.append(_nested_batch(table, 250, 80, 2))
    snaps.append(table.current_snapshot().snapshot_id)
    return table, snaps


def test_nested_fixture_covers_what_it_claims(nested):
    table, snaps = nested
    files = [t.file.file_path.removeprefix("file://") for t in table.scan().plan_files()]
    layouts = {str(pq.read_schema(f).field("s").type) for f in files}
    assert len(files) == 3 and len(layouts) == 3  # three layouts of s, one per file
    assert any(pq.ParquetFile(f).num_row_groups > 1 for f in files)
    s = table.schema().as_arrow().field("s").type
    assert [s.field(i).name for i in range(s.num_fields)] == ["c", "a2"]
    truth = _truth(table)
    assert truth.num_rows == 330 and truth["s"].null_count > 0
    # nulls inside: a list element, a map value (pyiceberg's writer stores a null list or
    # map as an empty one, so those levels hold no nulls in the files)
    assert any(None in r for r in truth["l"].to_pylist()) and \
        any(v is None for r in truth["m"].to_pylist() for _, v in r)


@pytest.mark.parametrize("k", [0, 1, 2])
@pytest.mark.parametrize("decoder", ["pyarrow", "dataset"])
def test_nested_fields_read_by_field_id_as_pyiceberg_reads_them(nested, k, decoder, monkeypatch):
    """Fields renamed, dropped, added, widened and moved inside a struct, a list's element
    and a map's value since a file was written read as pyiceberg reads them (before: the
    whole table was refused with UnsupportedTableFeatureError, even for other columns)."""
    table, snaps = nested
    monkeypatch.setenv("ARROWLOAD_DECODER", decoder)
    truth = _truth(table, snaps[k])
    ds = al.iceberg(table, snapshot_id=snaps[k])
    got = ds.to_arrow()
    assert got.schema.equals(ds.schema) and sorted_rows(got) == sorted_rows(truth)
    batches = list(ds.loader(32, output="arrow", shuffle="global", seed=1))
    assert sorted_rows(pa.Table.from_batches(batches)) == sorted_rows(truth)
    assert sorted_rows(ds.select("id", "m").to_arrow()) == sorted_rows(truth.select(["id", "m"]))


@pytest.mark.parametrize("predicate", ["id > 140 AND id < 260", "s IS NULL OR id % 4 = 1", "l IS NOT NULL"])
def test_nested_evolution_filters_match_duckdb_over_the_truth(nested, predicate):
    table, _ = nested
    truth = _truth(table)  # noqa: F841 - DuckDB reads it by name
    expected = duckdb.sql(f"SELECT id FROM truth WHERE {predicate}").arrow()
    expected = expected.read_all() if hasattr(expected, "read_all") else expected
    ds = al.iceberg(table).filter(predicate)
    assert sorted(ds.select("id").to_arrow()["id"].to_pylist()) == sorted(expected["id"].to_pylist())
    assert sorted_rows(ds.to_arrow()) == sorted_rows(_truth(table).filter(pc.is_in(
        _truth(table)["id"], expected["id"])))


def test_nested_evolution_keeps_nulls_at_every_level_as_the_files_hold_them(nested):
    """Each row's nested value against the file it was written to, read with plain pyarrow
    and moved into the current schema by hand: nulls of the struct, an element, a map
    value and a field stay where they were; added fields are null."""
    table, _ = nested
    got = {r["id"]: r for r in al.iceberg(table).to_arrow().to_pylist()}
    raw = {}
    for t in table.scan().plan_files():
        for r in pq.read_table(t.file.file_path.removeprefix("file://")).to_pylist():
            raw[r["id"]] = r
    assert set(got) == set(raw)
    for i, r in raw.items():
        s = r["s"]
        want_s = None if s is None else {"c": s.get("c"), "a2": s.get("a2", s.get("a"))}
        want_l = None if r["l"] is None else [None if e is None else {"x": e["x"], "y": e.get("y")}
                                              for e in r["l"]]
        want_m = None if r["m"] is None else [(k, None if v is None else {"p": v["p"], "q": v.get("q")})
                                              for k, v in r["m"]]
        assert (got[i]["s"], got[i]["l"], got[i]["m"]) == (want_s, want_l, want_m), i


def test_nested_fields_whose_names_were_swapped_read_and_filter_by_id(tmp_path):
    """Two struct fields that swapped names since a file was written: the file's ``s.a`` is
    the table's ``s.b`` (a read or a filter by name would take the other field's values,
    or its statistics). Rows and counts as DuckDB over pyiceberg's read."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StructType

    catalog = _catalog(tmp_path)
    schema = Schema(NestedField(1, "id", LongType(), required=False),
                    NestedField(2, "s", StructType(NestedField(3, "a", LongType(), required=False),
                                                   NestedField(4, "b", LongType(), required=False)),
                                required=False))
    table = catalog.create_table("ns.swapped", schema=schema,
                                 properties={"write.parquet.row-group-limit": ROW_GROUP_ROWS})

    def plain():
        return pa.schema([f.remove_metadata() for f in table.schema().as_arrow()])
    table.append(pa.Table.from_pylist([{"id": i, "s": {"a": i, "b": 1000 + i}} for i in range(200)],
                                      schema=plain()))
    with table.update_schema() as u:
        u.rename_column("s.a", "tmp")
    with table.update_schema() as u:
        u.rename_column("s.b", "a")
        u.rename_column("s.tmp", "b")
    table.append(pa.Table.from_pylist([{"id": i, "s": {"a": 5000 + i, "b": i}} for i in range(200, 260)],
                                      schema=plain()))
    truth = _truth(table)
    ds = al.iceberg(table)
    assert sorted_rows(ds.to_arrow()) == sorted_rows(truth)
    for predicate in ("s.a > 1100", "s.a < 100", "s.b < 50", "s.a = 1005"):
        want = duckdb.sql(f"SELECT id FROM truth WHERE {predicate}").fetchall()
        got = ds.filter(predicate)
        assert sorted(got.to_arrow()["id"].to_pylist()) == sorted(r[0] for r in want), predicate
        assert got.count() == len(want), predicate


def test_columns_added_with_a_default_read_it_from_older_files(tmp_path):
    """A column (or a field inside a struct) added with a default value (``initial-default``)
    reads that value from files written before it, as the spec's column projection and
    pyiceberg read it -- after an identity partition value, before null (before: null).
    Every kind of value; filters and counts over it as DuckDB over pyiceberg's read."""
    import datetime
    import decimal

    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import IdentityTransform
    from pyiceberg.types import (BooleanType, DateType, DecimalType, FloatType, IntegerType, LongType, NestedField,
                                 StringType, StructType, TimestampType)

    catalog = _catalog(tmp_path)
    schema = Schema(NestedField(1, "id", LongType(), required=False),
                    NestedField(2, "p", StringType(), required=False),
                    NestedField(3, "s", StructType(NestedField(4, "a", LongType(), required=False)), required=False))
    spec = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="p"))
    table = catalog.create_table("ns.defaults", schema=schema, partition_spec=spec,
                                 properties={"write.parquet.row-group-limit": ROW_GROUP_ROWS})

    def plain():
        return pa.schema([f.remove_metadata() for f in table.schema().as_arrow()])
    table.append(pa.Table.from_pylist([{"id": i, "p": "ab"[i % 2], "s": None if i % 9 == 0 else {"a": i}}
                                       for i in range(200)], schema=plain()))
    with table.update_schema() as u:
        u.add_column("n", IntegerType(), default_value=7)
        u.add_column("k", StringType(), default_value="x")
        u.add_column("dt", DateType(), default_value=datetime.date(2024, 1, 2))
        u.add_column("ts", TimestampType(), default_value=datetime.datetime(2024, 1, 2, 3, 4, 5))
        u.add_column("dec", DecimalType(9, 2), default_value=decimal.Decimal("1.25"))
        u.add_column("b", BooleanType(), default_value=True)
        u.add_column("f", FloatType(), default_value=1.5)
        u.add_column(("s", "c"), IntegerType(), default_value=5)
    rows = [{"id": i, "p": "ab"[i % 2], "s": {"a": i, "c": i % 3}, "n": i % 4, "k": None, "dt": None,
             "ts": datetime.datetime(2025, 1, 1), "dec": decimal.Decimal("2.50"), "b": False, "f": None}
            for i in range(200, 260)]
    table.append(pa.Table.from_pylist(rows, schema=plain()))
    truth = _truth(table)
    assert truth.filter(pc.less(truth["id"], 200))["n"].to_pylist() == [7] * 200  # the truth holds defaults
    for decoder in ("pyarrow", "dataset"):
        os.environ["ARROWLOAD_DECODER"] = decoder
        try:
            ds = al.iceberg(table)
            assert sorted_rows(ds.to_arrow()) == sorted_rows(truth), decoder
            assert sorted_rows(pa.Table.from_batches(list(ds.loader(64, output="arrow", shuffle="block")))) == \
                sorted_rows(truth), decoder
        finally:
            del os.environ["ARROWLOAD_DECODER"]
    for predicate in ("n = 7", "k = 'x' AND id % 2 = 0", "dt = DATE '2024-01-02'", "s.c = 5", "b AND f > 1",
                      "dec < 2"):
        want = sorted(r[0] for r in duckdb.sql(f"SELECT id FROM truth WHERE {predicate}").fetchall())
        got = al.iceberg(table).filter(predicate)
        assert sorted(got.select("id").to_arrow()["id"].to_pylist()) == want, predicate
        assert got.count() == len(want), predicate
