"""Snapshots: ``Dataset.snapshot_id``, ``pin()`` / ``save_manifest`` / ``al.dataset(manifest)``,
and loader states that resume on their own snapshot after files were appended.

The truth for "the rest of the epoch" is the uninterrupted run of a loader built on the
files as they were (compared by ids, batch by batch); the truth for what a snapshot holds
is pyarrow reading the original files itself. Appends are real files written beside the
others (one whose rows the filter keeps, one whose rows it drops); changes are real
rewrites and deletions. On S3, moto's server on loopback, through s3fs (ETags).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import arrowload as al
from arrowload.datagen import events_table, write_lake

from _support import moto_s3_server, per_rank_state

PRED = "label = 0"
KINDS = ["none", "block", "global"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("snapshot_lake")
    write_lake(path, rows=2_400, shards=3, row_group_size=200, features=2, emb_dim=4)
    return str(path)


@pytest.fixture()
def lake(pristine, tmp_path) -> str:
    """A copy of the lake this test may append to and rewrite."""
    path = str(tmp_path / "lake")
    shutil.copytree(pristine, path)
    return path


def _extra(kept: bool, start: int = 1_000_000) -> pa.Table:
    """Rows to append: all kept by PRED (label 0) or all dropped by it (label 1)."""
    table = events_table(300, start_id=start, features=2, emb_dim=4)
    return table.filter(pc.equal(table.column("label"), 0 if kept else 1))


def append(lake: str, name: str, kept: bool, start: int = 1_000_000) -> str:
    path = os.path.join(lake, name)
    pq.write_table(_extra(kept, start), path, row_group_size=100)
    return path


def selection(source, **kw) -> al.Dataset:
    return al.dataset(source, **kw).filter(PRED).select("id", "f0")


def ids(batches) -> list[np.ndarray]:
    return [np.asarray(b["id"]) for b in batches]


def same_batches(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def loader(source, kind: str, cache: str, **kw):
    return selection(source).loader(64, shuffle=kind, seed=5, cache_dir=cache, **kw)


# ---------------------------------------------------------------------------
# snapshot_id


def test_snapshot_id_is_stable_and_follows_the_files(lake):
    first = al.dataset(lake).snapshot_id
    assert first.startswith("files:") and len(first) == len("files:") + 32
    # the same files however the root is spelled, and whatever the selection
    assert al.dataset(lake + "/").snapshot_id == first
    assert al.dataset(lake.replace("/", "//")).snapshot_id == first
    assert selection(lake).snapshot_id == first
    assert al.dataset(os.path.join(lake, "*.parquet")).snapshot_id == first
    # appending a file changes it; removing it again gives the first id back
    extra = append(lake, "part-00009.parquet", kept=False)
    appended = al.dataset(lake).snapshot_id
    assert appended != first
    os.remove(extra)
    assert al.dataset(lake).snapshot_id == first
    # rewriting a file in place (same name, other rows) changes it
    name = os.path.join(lake, "part-00001.parquet")
    pq.write_table(pq.read_table(name).slice(0, 10), name)
    assert al.dataset(lake).snapshot_id not in (first, appended)
    # in-memory data: a digest of the data
    t = pa.table({"x": [1, 2, 3]})
    assert al.dataset(t).snapshot_id == al.dataset(t).snapshot_id
    assert al.dataset(t).snapshot_id.startswith("memory:")
    assert al.dataset(t).snapshot_id != al.dataset(pa.table({"x": [1, 2, 4]})).snapshot_id


def test_snapshot_id_follows_a_same_size_rewrite(lake):
    """A rewrite that keeps size and modification time (a byte flipped, mtime set back) is
    still another file: the local identity (inode, through the rename writers do) says so."""
    name = os.path.join(lake, "part-00000.parquet")
    before = al.dataset(lake).snapshot_id
    st_ = os.stat(name)
    data = bytearray(open(name, "rb").read())
    data[100] ^= 0xFF
    tmp = name + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.utime(tmp, ns=(st_.st_atime_ns, st_.st_mtime_ns))
    os.replace(tmp, name)
    assert os.stat(name).st_size == st_.st_size and os.stat(name).st_mtime_ns == st_.st_mtime_ns
    assert al.dataset(lake).snapshot_id != before


# ---------------------------------------------------------------------------
# resume across appends


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("kept", [True, False], ids=["appended-kept", "appended-filtered-out"])
def test_resume_after_append_yields_the_rest_of_the_uninterrupted_epoch(lake, tmp_path, kind, kept):
    cache = str(tmp_path / "cache")
    full = ids(loader(lake, kind, cache))
    original_ids = pds.dataset(lake).to_table(filter=pc.field("label") == 0, columns=["id"]).column("id")
    assert sorted(np.concatenate(full).tolist()) == sorted(original_ids.to_pylist())
    taken = loader(lake, kind, cache)
    it = iter(taken)
    for _ in range(5):
        next(it)
    it.close()
    state = json.loads(json.dumps(taken.state_dict()))
    assert state["version"] == 4 and state["snapshot"] == al.dataset(lake).snapshot_id
    append(lake, "part-00003.parquet", kept)
    append(lake, "a-first.parquet", kept, start=2_000_000)  # sorts before the others
    resumed = loader(lake, kind, cache)
    if kept:
        assert resumed.num_rows > taken.num_rows  # the new loader sees the appended rows ...
    assert resumed.snapshot_id != state["snapshot"]
    resumed.load_state_dict(state)  # ... until it loads the state: then it reads the state's files
    assert resumed.snapshot_id == state["snapshot"] and resumed.num_rows == taken.num_rows
    assert same_batches(ids(resumed), full[5:])
    old = loader(lake, kind, cache)  # the same state as version 3 wrote it (per rank) resumes as before
    old.load_state_dict(per_rank_state(state, 3, taken.rank))
    assert old.snapshot_id == state["snapshot"] and same_batches(ids(old), full[5:])
    # the rule: a loader stays on the snapshot it resumed, for the next epochs too
    assert "a loaded state's files" in resumed.explain()
    resumed.set_epoch(1)
    assert loader(lake, kind, cache).snapshot_id != state["snapshot"]  # a new loader reads the data as it is
    epoch1 = ids(resumed)
    assert sorted(np.concatenate(epoch1).tolist()) == sorted(original_ids.to_pylist())
    assert resumed.state_dict()["snapshot"] == state["snapshot"]


def test_resumed_next_epoch_equals_the_uninterrupted_next_epoch(lake, tmp_path):
    cache = str(tmp_path / "cache")
    reference = loader(lake, "global", cache)
    reference.set_epoch(1)
    epoch1 = ids(reference)
    taken = loader(lake, "global", cache)
    it = iter(taken)
    next(it)
    it.close()
    state = taken.state_dict()
    append(lake, "part-00003.parquet", kept=True)
    resumed = loader(lake, "global", cache)
    resumed.load_state_dict(state)
    list(resumed)
    resumed.set_epoch(1)
    assert same_batches(ids(resumed), epoch1)


def test_resume_across_append_at_another_rank_and_on_the_same_files(lake, tmp_path):
    """Each rank's state carries the whole file list; a state loads unchanged on the data
    it was taken on (no switch), and a loader already on the state's snapshot takes a
    state of the newer files back to them."""
    cache = str(tmp_path / "cache")
    full = [ids(loader(lake, "block", cache, rank=r, world_size=2, drop_last=True)) for r in range(2)]
    states = []
    for r in range(2):
        taken = loader(lake, "block", cache, rank=r, world_size=2, drop_last=True)
        it = iter(taken)
        for _ in range(2):
            next(it)
        it.close()
        states.append(taken.state_dict())
    same = loader(lake, "block", cache, rank=1, world_size=2, drop_last=True)
    same.load_state_dict(states[1])
    assert same_batches(ids(same), full[1][2:])
    append(lake, "part-00003.parquet", kept=True)
    newer = loader(lake, "block", cache, rank=0, world_size=2, drop_last=True)
    newer_state = newer.state_dict()  # at the start of the epoch
    newer_full = ids(newer)
    for r in range(2):
        resumed = loader(lake, "block", cache, rank=r, world_size=2, drop_last=True)
        resumed.load_state_dict(states[r])
        assert same_batches(ids(resumed), full[r][2:])
    back = loader(lake, "block", cache, rank=0, world_size=2, drop_last=True)
    back.load_state_dict(states[0])
    back.load_state_dict(newer_state)  # the loader's own dataset's snapshot again
    assert back.snapshot_id == newer_state["snapshot"] and same_batches(ids(back), newer_full)


@pytest.mark.parametrize("change", ["rewritten", "deleted", "touched"])
def test_a_changed_or_vanished_file_of_the_state_is_named(lake, tmp_path, change):
    cache = str(tmp_path / "cache")
    taken = loader(lake, "none", cache)
    it = iter(taken)
    next(it)
    it.close()
    state = taken.state_dict()
    victim = os.path.join(lake, "part-00001.parquet")
    append(lake, "part-00003.parquet", kept=True)
    if change == "deleted":
        os.remove(victim)
    elif change == "touched":  # the same bytes, another modification time
        st_ = os.stat(victim)
        os.utime(victim, ns=(st_.st_atime_ns, st_.st_mtime_ns + 5_000_000_000))
    else:
        pq.write_table(pq.read_table(victim).slice(0, 50), victim)
    resumed = loader(lake, "none", cache)
    with pytest.raises(al.SnapshotChangedError) as info:
        resumed.load_state_dict(state)
    assert isinstance(info.value, RuntimeError) and info.value.path == victim
    assert victim in str(info.value) and "without the state" in str(info.value)
    assert ("is gone" in str(info.value)) == (change == "deleted")
    assert ("was modified" in str(info.value)) == (change == "touched")
    assert resumed.snapshot_id != state["snapshot"]  # the loader is left as it was
    assert len(list(resumed)) == len(resumed)


def test_plan_and_setup_must_still_match_after_an_append(lake, tmp_path):
    cache = str(tmp_path / "cache")
    state = loader(lake, "global", cache).state_dict()
    append(lake, "part-00003.parquet", kept=True)
    other_filter = al.dataset(lake).filter("label = 1").select("id", "f0").loader(64, shuffle="global", seed=5,
                                                                                  cache_dir=cache)
    with pytest.raises(al.StateMismatchError, match=r"plan: the selection"):
        other_filter.load_state_dict(state)
    with pytest.raises(al.StateMismatchError, match=r"seed"):
        selection(lake).loader(64, shuffle="global", seed=6, cache_dir=cache).load_state_dict(state)
    # a loader over another folder holding the same file names cannot go back to the state's files
    other = str(tmp_path / "other")
    shutil.copytree(lake, other)
    with pytest.raises(al.StateMismatchError, match=r"^snapshot: .*under"):
        loader(other, "global", cache).load_state_dict(state)


def test_version_2_states_still_refuse_appended_data(lake, tmp_path):
    """A version 2 state names the data by fingerprints and has no file list: it loads on the
    same files, and is refused after an append, exactly as before."""
    cache = str(tmp_path / "cache")
    taken = loader(lake, "none", cache)
    it = iter(taken)
    next(it)
    it.close()
    v2 = per_rank_state(taken.state_dict(), 2, taken.rank)
    v2.update(snapshot=taken._source_snapshot())
    fresh = loader(lake, "none", cache)
    fresh.load_state_dict(v2)
    assert len(list(fresh)) == len(fresh) - 1
    append(lake, "part-00003.parquet", kept=False)
    with pytest.raises(al.StateMismatchError, match=r"snapshot: the data is not the data"):
        loader(lake, "none", cache).load_state_dict(v2)


def test_damaged_sources_are_refused(lake, tmp_path):
    cache = str(tmp_path / "cache")
    state = loader(lake, "none", cache).state_dict()
    fresh = loader(lake, "none", cache)
    other = dict(state, sources=[dict(state["sources"][0], snapshot="files:" + "0" * 32)])
    with pytest.raises(al.StateMismatchError, match=r"^sources: .*not the state's snapshot"):
        fresh.load_state_dict(other)
    bad_row = json.loads(json.dumps(state))
    bad_row["sources"][0]["files"][0] = bad_row["sources"][0]["files"][0][:4]
    with pytest.raises(al.StateMismatchError, match=r"^sources: sources\[0\]\.files\[0\]"):
        fresh.load_state_dict(bad_row)
    # a file list that does not give its id (an edited size), on appended data
    append(lake, "part-00003.parquet", kept=True)
    edited = json.loads(json.dumps(state))
    edited["sources"][0]["files"][0][2] += 10**9  # another mtime: the listing disagrees
    with pytest.raises(al.SnapshotChangedError, match="was modified"):
        loader(lake, "none", cache).load_state_dict(edited)


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("snapshot_small")
    write_lake(path, rows=600, shards=3, row_group_size=50, features=2, emb_dim=4)
    return str(path)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(KINDS), batch=st.integers(1, 90), seed=st.integers(0, 3),
       at=st.floats(0, 1), kept=st.booleans(), world=st.sampled_from([(0, 1), (1, 2), (2, 3)]))
def test_resume_anywhere_across_an_append_equals_the_uninterrupted_run(small, tmp_path_factory, kind, batch,
                                                                       seed, at, kept, world):
    cache = str(tmp_path_factory.mktemp("cache"))
    rank, size = world
    extra = os.path.join(small, "part-00001b.parquet")  # between the others in path order

    def build():
        return al.dataset(small).filter(PRED).select("id").loader(
            batch, shuffle=kind, seed=seed, shuffle_window=2, rank=rank, world_size=size, cache_dir=cache)

    full = ids(build())
    k = int(at * len(full))
    taken = build()
    it = iter(taken)
    for _ in range(k):
        next(it)
    it.close()
    state = json.loads(json.dumps(taken.state_dict()))
    try:
        pq.write_table(_extra(kept), extra, row_group_size=40)
        resumed = build()
        resumed.load_state_dict(state)
        assert same_batches(ids(resumed), full[k:])
    finally:
        os.remove(extra)


def test_state_size_grows_by_one_short_row_per_file(tmp_path):
    """The inline file list: one ``[path, size, mtime_ns, identity, rows]`` row per file
    (measured: 69 bytes a local file, 69,465 bytes for 1,000 files)."""
    t = pa.table({"id": pa.array(range(4), pa.int64())})
    for i in range(200):
        pq.write_table(t, str(tmp_path / f"part-{i:05d}.parquet"))
    state = al.dataset(str(tmp_path)).loader(8, cache_dir=str(tmp_path / ".cache")).state_dict()
    files = state["sources"][0]["files"]
    assert len(files) == 200 and files[0][0] == "part-00000.parquet" and files[0][4] == 4
    assert len(json.dumps(state)) < 200 * 90


# ---------------------------------------------------------------------------
# pin() and manifests


def test_pin_save_manifest_and_reopen_equal_the_original_rows(lake, tmp_path):
    original = pds.dataset(lake).to_table()
    pinned = al.dataset(lake).pin()
    assert pinned.snapshot_id == al.dataset(lake).snapshot_id
    manifest = str(tmp_path / "out" / "events.json")
    sid = pinned.save_manifest(manifest)
    assert sid == pinned.snapshot_id
    assert not [n for n in os.listdir(tmp_path / "out") if n != "events.json"]  # no temporary file left
    append(lake, "part-00003.parquet", kept=True)
    append(lake, "a-first.parquet", kept=False)
    for ds in (pinned, al.dataset(manifest)):
        got = ds.to_arrow()
        assert got.sort_by("id").equals(original.sort_by("id"))
        assert ds.count() == original.num_rows
        assert ds.snapshot_id == sid
        assert ds.filter(PRED).count() == original.filter(pc.field("label") == 0).num_rows
    assert al.dataset(lake).count() > original.num_rows  # the folder itself has grown
    # the manifest recognised by its header, whatever its name
    renamed = str(tmp_path / "events.manifest")
    shutil.copy(manifest, renamed)
    assert al.dataset(renamed).count() == original.num_rows
    # a fresh process reopens the same rows
    code = ("import sys, arrowload as al; d = al.dataset(sys.argv[1]); t = d.to_arrow(); "
            "print(d.snapshot_id, t.num_rows, sum(t.column('id').to_pylist()))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code, manifest], capture_output=True, text=True, check=True,
                         env=env, cwd=str(tmp_path)).stdout.split()
    assert out == [sid, str(original.num_rows), str(sum(original.column("id").to_pylist()))]


def test_loader_over_a_manifest_matches_the_loader_over_the_files(lake, tmp_path):
    cache = str(tmp_path / "cache")
    manifest = str(tmp_path / "m.json")
    al.dataset(lake).save_manifest(manifest)
    full = ids(loader(lake, "global", cache))
    append(lake, "part-00003.parquet", kept=True)
    over_manifest = loader(manifest, "global", cache)
    assert same_batches(ids(over_manifest), full)
    # and its state resumes on the manifest's dataset
    it = iter(over_manifest)
    for _ in range(3):
        next(it)
    it.close()
    again = loader(manifest, "global", cache)
    again.load_state_dict(over_manifest.state_dict())
    assert same_batches(ids(again), full[3:])


def test_hive_partitions_and_partitioning_off_survive_the_manifest(pristine, tmp_path):
    hive = str(tmp_path / "hive")
    write_lake(hive, rows=900, shards=2, row_group_size=100, features=1, emb_dim=2, partition_by="country")
    for part, name in ((None, "h.json"), (False, "off.json")):
        kw = {} if part is None else {"partitioning": part}
        ds = al.dataset(hive, **kw)
        ds.save_manifest(str(tmp_path / name))
        back = al.dataset(str(tmp_path / name))
        assert back.schema == ds.schema
        assert back.to_arrow().sort_by("id").equals(ds.to_arrow().sort_by("id"))
    doc = json.load(open(tmp_path / "h.json"))
    assert doc["partitioning"] == [["country", "string"]]
    assert {f["partition"]["country"] for f in doc["files"]} >= {"US", None}
    assert json.load(open(tmp_path / "off.json"))["partitioning"] is None


@pytest.mark.parametrize("change", ["rewritten", "deleted"])
def test_pinned_reads_name_a_changed_or_vanished_file(lake, tmp_path, change):
    pinned = al.dataset(lake).filter(PRED).pin()
    manifest = str(tmp_path / "m.json")
    pinned.save_manifest(manifest)
    victim = os.path.join(lake, "part-00002.parquet")
    if change == "deleted":
        os.remove(victim)
    else:
        pq.write_table(pq.read_table(victim).slice(0, 7), victim)
    for read in (pinned.to_arrow, pinned.count, lambda: pinned.head(3), lambda: pinned.loader(16),
                 lambda: list(pinned.to_batches()), lambda: al.dataset(manifest)):
        with pytest.raises(al.SnapshotChangedError) as info:
            read()
        assert info.value.path == victim and victim in str(info.value)
        assert "restore" in str(info.value) and "al.dataset(" in str(info.value)
    # the folder opened afresh reads what is there now
    assert al.dataset(lake).count() == pds.dataset(lake).count_rows()


def test_manifest_detection_leaves_json_lines_data_alone(tmp_path):
    path = str(tmp_path / "rows.json")
    with open(path, "w") as f:
        f.write('{"format": "not a manifest", "x": 1}\n{"format": "b", "x": 2}\n')
    assert al.dataset(path).to_arrow().column("x").to_pylist() == [1, 2]
    broken = str(tmp_path / "broken.json")
    with open(broken, "w") as f:
        f.write('{"format": "arrowload.snapshot_manifest", "version": 1, "files": [')
    with pytest.raises(al.CorruptFileError, match="broken.json"):
        al.dataset(broken)


def test_in_memory_data_pins_to_itself_and_has_no_manifest(tmp_path):
    ds = al.dataset(pa.table({"x": [1, 2]}))
    assert ds.pin().snapshot_id == ds.snapshot_id
    with pytest.raises(al.UnsupportedError, match="not a set of files"):
        ds.save_manifest(str(tmp_path / "m.json"))
    joined = al.sql("SELECT a.x FROM a JOIN b ON a.x = b.x", a=ds, b=al.dataset(pa.table({"x": [2]})))
    assert joined.snapshot_id.count("+") == 1
    with pytest.raises(al.UnsupportedError, match="2 sources"):
        joined.save_manifest(str(tmp_path / "m.json"))


# ---------------------------------------------------------------------------
# S3 (moto on loopback, s3fs: ETag identities)

BUCKET = "arrowload-snapshot-test"  # moto keeps one backend per process: a bucket of its own


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """(storage_options, s3fs filesystem, local copy of the uploaded lake)."""
    import s3fs
    local = tmp_path_factory.mktemp("s3_snapshot_local")
    write_lake(local, rows=1_800, shards=3, row_group_size=150, features=2, emb_dim=4)
    with moto_s3_server() as url:
        options = {"endpoint_url": url, "key": "testing", "secret": "testing"}
        fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
        fs.mkdir(BUCKET)
        yield options, fs, str(local)


def _upload(fs, local: str, prefix: str) -> str:
    for name in sorted(os.listdir(local)):
        fs.put(os.path.join(local, name), f"{BUCKET}/{prefix}/{name}")
    return f"s3://{BUCKET}/{prefix}"


def test_s3_resume_across_append_and_etag_identity(s3, tmp_path):
    options, fs, local = s3
    uri = _upload(fs, local, "resume")
    cache = str(tmp_path / "cache")

    def build():
        return selection(uri, storage_options=options).loader(64, shuffle="block", seed=2, cache_dir=cache)

    full = ids(build())
    truth = pds.dataset(local).to_table(filter=pc.field("label") == 0, columns=["id"]).column("id")
    assert sorted(np.concatenate(full).tolist()) == sorted(truth.to_pylist())
    taken = build()
    it = iter(taken)
    for _ in range(4):
        next(it)
    it.close()
    state = json.loads(json.dumps(taken.state_dict()))
    source = state["sources"][0]
    assert source["root"] == uri and all(row[3].startswith("ETag=") for row in source["files"])
    extra = str(tmp_path / "part-00003.parquet")
    pq.write_table(_extra(True), extra)
    fs.put(extra, f"{BUCKET}/resume/part-00003.parquet")
    resumed = build()
    assert resumed.num_rows > taken.num_rows
    resumed.load_state_dict(state)
    assert same_batches(ids(resumed), full[4:])
    # the same size, another content: a new ETag (and perhaps the same second) -> named
    victim = f"{BUCKET}/resume/part-00001.parquet"
    data = bytearray(fs.cat(victim))
    data[200] ^= 0xFF
    fs.pipe(victim, bytes(data))
    assert fs.size(victim) == len(data)
    with pytest.raises(al.SnapshotChangedError, match="part-00001.parquet") as info:
        build().load_state_dict(state)
    assert info.value.path == victim


def test_s3_manifest_reopens_the_pinned_objects(s3, tmp_path):
    options, fs, local = s3
    uri = _upload(fs, local, "manifest")
    manifest = str(tmp_path / "s3.json")
    sid = al.dataset(uri, storage_options=options).pin().save_manifest(manifest)
    doc = json.load(open(manifest))
    assert doc["root"] == uri and all(f["identity"].startswith("ETag=") for f in doc["files"])
    extra = str(tmp_path / "part-00009.parquet")
    pq.write_table(_extra(True), extra)
    fs.put(extra, f"{BUCKET}/manifest/part-00009.parquet")
    back = al.dataset(manifest, storage_options=options)
    assert back.snapshot_id == sid
    assert back.to_arrow().sort_by("id").equals(pds.dataset(local).to_table().sort_by("id"))
    fs.rm(f"{BUCKET}/manifest/part-00000.parquet")
    with pytest.raises(al.SnapshotChangedError, match="part-00000.parquet.*is gone"):
        back.count()


def test_s3_manifest_saved_to_the_store_itself(s3, tmp_path):
    """``save_manifest`` writes to a URI (one upload): with the dataset's own credentials by
    default, with ``storage_options`` where given; the manifest read back from the store
    reopens exactly the pinned objects, from another process too."""
    options, fs, local = s3
    uri = _upload(fs, local, "saved")
    ds = al.dataset(uri, storage_options=options).pin()
    sid = ds.save_manifest(f"s3://{BUCKET}/manifests/a.json")
    sid2 = ds.save_manifest(f"s3://{BUCKET}/manifests/b.json", storage_options=options)
    assert sid == sid2 == ds.snapshot_id
    doc = json.loads(fs.cat(f"{BUCKET}/manifests/a.json"))
    assert doc["format"] == "arrowload.snapshot_manifest" and doc["root"] == uri
    assert doc == json.loads(fs.cat(f"{BUCKET}/manifests/b.json"))
    pq.write_table(_extra(True), str(tmp_path / "x.parquet"))
    fs.put(str(tmp_path / "x.parquet"), f"{BUCKET}/saved/part-00009.parquet")  # appended after the pin
    back = al.dataset(f"s3://{BUCKET}/manifests/a.json", storage_options=options)
    assert back.snapshot_id == sid
    assert back.to_arrow().sort_by("id").equals(pds.dataset(local).to_table().sort_by("id"))
    assert al.dataset(uri, storage_options=options).count() > back.count()
    code = ("import arrowload as al, sys, json; o = json.loads(sys.argv[2]); "
            "print(al.dataset(sys.argv[1], storage_options=o).count())")
    out = subprocess.run([sys.executable, "-c", code, f"s3://{BUCKET}/manifests/a.json", json.dumps(options)],
                         check=True, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert int(out.stdout.strip()) == pq.read_table(local).num_rows
    with pytest.raises(al.InvalidArgumentError, match="storage_options"):
        ds.save_manifest(str(tmp_path / "local.json"), storage_options=options)


def test_a_same_size_rewrite_through_an_fsspec_wrapper_is_refused(tmp_path):
    """Through fsspec's DirFileSystem over a local folder, a file rewritten in place with the
    same size (and so the same inode) was read through its old footer: the new file's rows,
    silently. Its modification time now decides, as on the local disk."""
    import os

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from fsspec.implementations.dirfs import DirFileSystem
    from fsspec.implementations.local import LocalFileSystem

    import arrowload as al
    os.makedirs(tmp_path / "lake")
    path = tmp_path / "lake" / "a.parquet"
    other = tmp_path / "other.parquet"
    for target, step in ((path, 0), (other, 1)):
        pq.write_table(pa.table({"x": np.arange(0, 3000, 3) + step}), target, row_group_size=250,
                       compression="NONE")
    assert os.path.getsize(path) == os.path.getsize(other)
    ds = al.dataset("lake", filesystem=DirFileSystem(str(tmp_path), fs=LocalFileSystem()))
    assert ds.count() == 1000
    listed = os.stat(path)
    with open(path, "r+b") as f:  # rewritten in place: the same inode and size
        f.write(other.read_bytes())
    os.utime(path, ns=(listed.st_atime_ns, listed.st_mtime_ns + 1_000_000))  # whatever the clock's grain
    assert os.stat(path).st_ino == listed.st_ino
    with pytest.raises(al.SnapshotChangedError):
        ds.to_arrow()


@pytest.mark.parametrize("stream", ["1", "0"])
@pytest.mark.parametrize("shuffle", [False, "block"])
def test_a_file_rewritten_in_the_middle_of_an_epoch_is_never_read_as_the_snapshot(tmp_path, monkeypatch, stream,
                                                                                   shuffle):
    """Three local files; after the first batch the last one is rewritten in place (50 new
    rows: the counts still agree). The rest of the epoch must not hand out its new rows as
    the snapshot's: a SnapshotChangedError naming it (before: its new ids were yielded,
    through the polars stream and per unit alike; the check ran when the epoch started)."""
    monkeypatch.setenv("ARROWLOAD_STREAM", stream)
    for j in range(3):
        pq.write_table(pa.table({"id": pa.array(range(j * 50, j * 50 + 50), pa.int64())}),
                       str(tmp_path / f"f{j}.parquet"), row_group_size=10)
    ds = al.dataset(str(tmp_path))
    seen = []
    with pytest.raises(al.SnapshotChangedError, match="f2.parquet"):
        with ds.loader(10, shuffle=shuffle, seed=1, prefetch=1, output="numpy") as loader:
            for k, b in enumerate(loader):
                seen += b["id"].tolist()
                if k == 0:
                    pq.write_table(pa.table({"id": pa.array(range(1100, 1150), pa.int64())}),
                                   str(tmp_path / "f2.parquet"), row_group_size=10)
    assert set(seen) <= set(range(150))  # nothing of the new file before the error


@pytest.mark.parametrize("stream", ["1", "0"])
def test_a_manifest_listed_through_fsspec_reads_in_a_loader(tmp_path, monkeypatch, stream):
    """A manifest saved from a dataset listed through fsspec's local filesystem keeps its
    modification times as fsspec gives them (float seconds: off by under a microsecond).
    Opened, it is checked to the millisecond as a pinned snapshot is; the loader's check
    after each read must agree (a review found every loader read refused on untouched
    files when it compared to the nanosecond). Rows as DuckDB counts them."""
    import fsspec
    monkeypatch.setenv("ARROWLOAD_STREAM", stream)
    lake = tmp_path / "lake"
    lake.mkdir()
    for i in range(4):
        pq.write_table(pa.table({"x": list(range(i * 300, (i + 1) * 300))}), str(lake / f"p{i}.parquet"),
                       row_group_size=100)
    al.dataset(str(lake), filesystem=fsspec.filesystem("file")).pin().save_manifest(str(tmp_path / "m.json"))
    got = sorted(int(v) for b in al.dataset(str(tmp_path / "m.json")).loader(64, output="numpy") for v in b["x"])
    assert got == list(range(1200))
