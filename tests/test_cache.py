"""``Dataset.cache()``: plan output written once and read back, keyed by plan fingerprint
and source snapshot.

Truth comes from outside arrowload: pyarrow over the source files (the map applied by hand)
and DuckDB over the same files for SQL aggregates and joins. Whether the user function ran
is counted through a file the function appends to (one line per call, with its process id),
so the count crosses processes; races use real processes started with ``subprocess``.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import threading
import time

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import arrowload as al
from arrowload import cli
from arrowload.datagen import write_lake
from arrowload.plancache import writer as cache_writer
from arrowload.plancache.documents import decode, read_commit
from _support import state_after
from test_s3 import BUCKET, KEYS, make_s3fs, s3_endpoint  # noqa: F401 - the session's moto server

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS = 6_000


@pytest.fixture()
def lake(tmp_path):
    """A fresh copy per test (tests append files to it)."""
    root = str(tmp_path / "lake")
    write_lake(root, rows=ROWS, shards=3, row_group_size=500, emb_dim=4, features=4)
    return root


def truth_table(lake: str) -> pa.Table:
    """The lake as plain pyarrow reads it, in path order (the source order)."""
    files = sorted(glob.glob(os.path.join(lake, "*.parquet")))
    return pa.concat_tables([pq.read_table(f) for f in files])


def scaled(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The 'expensive' map of the tests, applied by hand for the truth."""
    return pa.RecordBatch.from_arrays([batch.column("id"), pc.multiply(batch.column("f0"), 2.0)],
                                      names=["id", "f0x2"])


class Counted:
    """A map function that appends a line (its pid) to ``path`` per call with rows (the
    call on an empty batch that tells a map's output schema is not counted)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, batch):
        if batch.num_rows:
            with open(self.path, "a") as f:
                f.write(f"{os.getpid()}\n")
        return scaled(batch)

    def calls(self) -> int:
        if not os.path.exists(self.path):
            return 0
        with open(self.path) as f:
            return len(f.read().split())


def expected_map(lake: str) -> pa.Table:
    t = truth_table(lake)
    return pa.table({"id": t.column("id"), "f0x2": pc.multiply(t.column("f0"), 2.0)})


# -- results equal the uncached plan -------------------------------------------------------

def test_cached_map_equals_the_plan_and_runs_once(lake, tmp_path):
    root = str(tmp_path / "cache")
    fn = Counted(str(tmp_path / "calls"))
    cached = al.dataset(lake).map(fn, name="scaled-v1").cache(root)
    assert fn.calls() == 0  # lazy: cache() and schema write nothing
    assert cached.schema == pa.schema([("id", pa.int64()), ("f0x2", pa.float64())])
    assert not os.path.exists(os.path.join(root, "plans"))
    got = cached.to_arrow()
    assert got.equals(expected_map(lake))  # same rows, same order (the plan's order)
    ran = fn.calls()
    assert ran >= 1
    # a later run (a new Dataset over the same files, as a new process would build) reads it
    again = al.dataset(lake).map(fn, name="scaled-v1").cache(root)
    assert again.to_arrow().equals(got)
    assert again.count() == ROWS
    assert again.filter("id >= 5990").to_arrow().column("id").to_pylist() == list(range(5990, 6000))
    assert fn.calls() == ran
    [entry] = al.cache_entries(root)
    assert entry.state == "committed" and entry.rows == ROWS and "scaled-v1" in entry.summary


def test_cached_files_are_bounded_and_in_order(lake, tmp_path, monkeypatch):
    """Several files and row groups when the output outgrows the bounds, read back in order."""
    monkeypatch.setattr(cache_writer, "ROW_GROUP_ROWS", 700)
    monkeypatch.setattr(cache_writer, "FILE_BYTES", 20_000)
    root = str(tmp_path / "cache")
    cached = al.dataset(lake).map(scaled, name="scaled-v1").cache(root)
    assert cached.to_arrow().equals(expected_map(lake))
    [folder] = glob.glob(os.path.join(root, "plans", "*"))
    with open(os.path.join(folder, "commit.json")) as f:
        commit = read_commit(json.load(f), "commit.json")
    files = [os.path.join(folder, *c.path.split("/")) for c in commit.files]
    assert len(files) > 1
    for path, c in zip(files, commit.files):
        meta = pq.ParquetFile(path).metadata
        assert meta.num_rows == c.rows and os.path.getsize(path) == c.bytes
        assert all(meta.row_group(i).num_rows <= 700 for i in range(meta.num_row_groups))
    assert pa.concat_tables([pq.read_table(p) for p in files]).equals(expected_map(lake))


def test_ipc_format(lake, tmp_path):
    root = str(tmp_path / "cache")
    cached = al.dataset(lake).filter("label = 1").select("id", "emb", "day").cache(root, format="ipc")
    t = truth_table(lake)
    want = t.filter(pc.equal(t.column("label"), 1)).select(["id", "emb", "day"])
    assert cached.to_arrow().equals(want)
    [entry] = al.cache_entries(root)
    assert entry.data_format == "ipc"
    files = glob.glob(os.path.join(entry.uri, "*", "*.arrow"))
    assert files and pa.ipc.open_file(files[0]).schema.names == ["id", "emb", "day"]


def test_sql_aggregate_and_join_equal_duckdb(lake, tmp_path):
    root = str(tmp_path / "cache")
    scan = f"read_parquet('{lake}/*.parquet')"
    agg = al.sql("SELECT country, count(*) AS n, sum(f0) AS s FROM t GROUP BY country", t=al.dataset(lake))
    got = agg.cache(root).to_arrow().sort_by([("country", "ascending")])
    want = duckdb.sql(f"SELECT country, count(*) AS n, sum(f0) AS s FROM {scan} GROUP BY country "
                      "ORDER BY country").to_arrow_table()
    assert got.column("country").to_pylist() == want.column("country").to_pylist()
    assert got.column("n").to_pylist() == want.column("n").to_pylist()
    assert got.column("s").to_pylist() == pytest.approx(want.column("s").to_pylist(), rel=1e-9)

    left = al.dataset(lake).select("id", "f0")
    right = al.dataset(lake).filter("label = 1").select("id", "user_id")
    join = al.sql("SELECT a.id, a.f0, b.user_id FROM a JOIN b ON a.id = b.id", a=left, b=right)
    got = join.cache(root).to_arrow().sort_by("id")
    want = duckdb.sql(f"SELECT a.id, a.f0, b.user_id FROM {scan} a JOIN {scan} b ON a.id = b.id "
                      "WHERE b.label = 1 ORDER BY a.id").to_arrow_table()
    assert got.equals(want)
    assert {e.state for e in al.cache_entries(root)} == {"committed"} and len(al.cache_entries(root)) == 2


def test_cache_of_an_unordered_query_is_written_in_one_order(tmp_path):
    """Two caches of one GROUP BY (a cache cleared and written again, a copy in another
    store) hold the same rows in the same order, so a loader's positions over them agree:
    DuckDB's own order changed from run to run."""
    lake = tmp_path / "lake"
    lake.mkdir()
    for f in range(4):
        pq.write_table(pa.table({"id": pa.array(range(f * 50_000, (f + 1) * 50_000), pa.int64())}),
                       str(lake / f"p{f}.parquet"), row_group_size=20_000)
    q = "SELECT id % 50000 AS k, count(*) AS n FROM t GROUP BY 1"
    runs = [al.sql(q, t=al.dataset(str(lake))).cache(str(tmp_path / f"cache{i}")).to_arrow() for i in range(3)]
    assert runs[0].num_rows == 50_000
    for r in runs[1:]:
        assert r.equals(runs[0])


def test_sql_over_a_cached_dataset_and_a_cache_of_it(lake, tmp_path):
    """Binding SQL over a cached dataset writes nothing (it needs the schema only); a cache
    of that query keys on the inner entry's key, and the first use writes both."""
    root = str(tmp_path / "cache")
    fn = Counted(str(tmp_path / "calls"))
    inner = al.dataset(lake).map(fn, name="scaled-v1").cache(root)
    outer = al.sql("SELECT count(*) AS n, sum(f0x2) AS s FROM t WHERE id < 100", t=inner).cache(root)
    assert fn.calls() == 0 and not os.path.exists(os.path.join(root, "plans"))
    got = outer.to_arrow().to_pylist()
    want = expected_map(lake).slice(0, 100)
    assert got[0]["n"] == 100 and got[0]["s"] == pytest.approx(pc.sum(want.column("f0x2")).as_py())
    assert sorted(e.rows for e in al.cache_entries(root)) == [1, ROWS]
    ran = fn.calls()
    again = al.sql("SELECT count(*) AS n, sum(f0x2) AS s FROM t WHERE id < 100",
                   t=al.dataset(lake).map(fn, name="scaled-v1").cache(root)).cache(root)
    assert again.to_arrow().to_pylist() == got and fn.calls() == ran


# -- the key -----------------------------------------------------------------------------

def test_unnamed_map_is_refused_and_key_names_it(lake, tmp_path):
    root = str(tmp_path / "cache")
    fn = Counted(str(tmp_path / "calls"))
    with pytest.raises(al.UncacheablePlanError, match=r"map\(.*Counted.*name='fn-v1'.*key='v1'") as info:
        al.dataset(lake).map(fn).cache(root)
    assert isinstance(info.value, ValueError)
    one = al.dataset(lake).map(fn).cache(root, key="v1")
    assert one.to_arrow().equals(expected_map(lake))
    ran = fn.calls()
    assert al.dataset(lake).map(fn).cache(root, key="v1").count() == ROWS
    assert fn.calls() == ran
    al.dataset(lake).map(fn).cache(root, key="v2").count()  # another version: another entry
    assert fn.calls() > ran and len(al.cache_entries(root)) == 2


def test_a_new_snapshot_misses_and_the_old_entry_stays(lake, tmp_path):
    root = str(tmp_path / "cache")
    fn = Counted(str(tmp_path / "calls"))
    first = al.dataset(lake).map(fn, name="scaled-v1").cache(root)
    assert first.count() == ROWS
    ran = fn.calls()
    extra = pa.table({c: truth_table(lake).column(c).slice(0, 10) for c in truth_table(lake).column_names})
    extra = extra.set_column(0, "id", pa.array(range(ROWS, ROWS + 10), pa.int64()))
    pq.write_table(extra, os.path.join(lake, "part-99999.parquet"))
    second = al.dataset(lake).map(fn, name="scaled-v1").cache(root)
    assert "cache miss" in second.explain()
    assert second.to_arrow().equals(expected_map(lake))  # the new file's rows too
    assert second.count() == ROWS + 10
    assert fn.calls() > ran
    entries = al.cache_entries(root)
    assert sorted(e.rows for e in entries) == [ROWS, ROWS + 10]
    assert len({e.snapshot for e in entries}) == 2


def test_explain_says_hit_or_miss_and_never_writes(lake, tmp_path, monkeypatch):
    monkeypatch.setattr(cache_writer, "ROW_GROUP_ROWS", 1000)
    root = str(tmp_path / "cache")
    fn = Counted(str(tmp_path / "calls"))
    cached = al.dataset(lake).map(fn, name="scaled-v1").cache(root).filter("id < 10")
    text = cached.explain()
    assert "cache miss: will write" in text and root in text and "Map scaled-v1" in text
    repr(cached)
    assert fn.calls() == 0 and not os.path.exists(os.path.join(root, "plans"))
    assert cached.to_arrow().column("id").to_pylist() == list(range(10))
    text = cached.explain()
    assert f"cache hit: {root}" in text and f"{ROWS:,} rows, written" in text
    assert "row_group_pruning" in text  # the filter prunes the cached Parquet's row groups


# -- the loader over a cached dataset --------------------------------------------------------

def test_loader_keeps_its_guarantees(lake, tmp_path):
    root = str(tmp_path / "cache")

    def build():
        return al.dataset(lake).map(scaled, name="scaled-v1").cache(root)

    ids = set(range(ROWS))
    for shuffle in ("global", "block"):
        for epoch in range(2):
            seen = []
            for rank in range(2):
                with build().loader(256, shuffle=shuffle, seed=3, rank=rank, world_size=2) as loader:
                    loader.set_epoch(epoch)
                    got = [int(i) for b in loader for i in b["id"]]
                assert len(got) == len(set(got))
                seen.append(set(got))
            assert not seen[0] & seen[1] and seen[0] | seen[1] == ids  # exactly once per epoch
    with build().loader(256, shuffle="global", seed=1) as loader:
        loader.set_epoch(1)
        whole = [b["id"].tolist() for b in loader]
        state = state_after(loader, 7)
    with build().loader(256, shuffle="global", seed=1) as resumed:
        resumed.load_state_dict(state)
        rest = [b["id"].tolist() for b in resumed]
    assert rest == whole[7:]


# -- crashed writers, damaged entries, waiting ---------------------------------------------

CRASHING_WRITER = """
import os, sys
sys.path.insert(0, {repo!r})
import arrowload as al
from arrowload.plancache import writer
writer.ROW_GROUP_ROWS = 300
writer.FILE_BYTES = 5_000
calls = [0]
def crash(batch):
    calls[0] += 1
    if calls[0] == 4:
        os._exit(3)  # dies mid-write: files written, no commit, its lock left behind
    from test_cache import scaled
    return scaled(batch)
al.dataset({lake!r}).map(crash, name="scaled-v1").cache({root!r}).count()
"""


def _python(script: str, *args: str, cwd: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.path.join(REPO, "tests")]))
    return subprocess.Popen([sys.executable, "-c", script, *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_crashed_writers_files_are_ignored_and_rewritten(lake, tmp_path):
    root = str(tmp_path / "cache")
    proc = _python(CRASHING_WRITER.format(repo=REPO, lake=lake, root=root), cwd=str(tmp_path))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err
    [folder] = glob.glob(os.path.join(root, "plans", "*"))
    left = os.listdir(folder)
    assert "commit.json" not in left and "writer.lock" in left
    [attempt] = [n for n in left if os.path.isdir(os.path.join(folder, n))]
    assert glob.glob(os.path.join(folder, attempt, "*.parquet"))  # a part written, never committed
    assert [e.state for e in al.cache_entries(root)] == ["incomplete"]
    cached = al.dataset(lake).map(scaled, name="scaled-v1").cache(root)
    assert "cache miss" in cached.explain()  # uncommitted files are not an entry
    # its process is gone (same host): the lock is taken over at once, the entry rewritten
    assert cached.to_arrow().equals(expected_map(lake))
    assert attempt not in os.listdir(folder)  # the dead attempt was cleaned up
    assert [e.state for e in al.cache_entries(root)] == ["committed"]


def test_a_damaged_commit_is_rewritten(lake, tmp_path):
    root = str(tmp_path / "cache")
    fn = Counted(str(tmp_path / "calls"))
    al.dataset(lake).map(fn, name="scaled-v1").cache(root).count()
    ran = fn.calls()
    [commit] = glob.glob(os.path.join(root, "plans", "*", "commit.json"))
    with open(commit, "w") as f:
        f.write("{not json")
    assert [e.state for e in al.cache_entries(root)] == ["damaged"]
    assert al.dataset(lake).map(fn, name="scaled-v1").cache(root).to_arrow().equals(expected_map(lake))
    assert fn.calls() > ran
    # a committed file that went missing: the entry is not trusted, it is rewritten
    ran = fn.calls()
    with open(commit) as f:
        doc = read_commit(json.load(f), commit)
    os.remove(os.path.join(os.path.dirname(commit), *doc.files[0].path.split("/")))
    assert al.dataset(lake).map(fn, name="scaled-v1").cache(root).to_arrow().equals(expected_map(lake))
    assert fn.calls() > ran


def _plant_lock(folder: str, host: str, age_s: float = 0.0) -> str:
    """A lock as another writer would have written it."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "writer.lock")
    doc = {"format": "arrowload.plan_cache_lock", "version": 1, "key": os.path.basename(folder),
           "token": "0123456789abcdef", "host": host, "pid": 1, "started_at": "2025-01-01T00:00:00.000000Z",
           "beat": 0}
    with open(path, "w") as f:
        json.dump(doc, f)
    if age_s:
        t = time.time() - age_s
        os.utime(path, (t, t))
    return path


def test_waiting_on_a_live_lock_times_out_naming_it(lake, tmp_path):
    root = str(tmp_path / "cache")
    cached = al.dataset(lake).map(scaled, name="scaled-v1").cache(root, wait_timeout=0.3)
    folder = os.path.join(root, "plans", cached.plan.source.entry.key)
    lock = _plant_lock(folder, host="another-host")
    with pytest.raises(al.CacheLockTimeoutError, match="another-host:1") as info:
        cached.count()
    assert lock in str(info.value) and isinstance(info.value, TimeoutError)
    assert [e.state for e in al.cache_entries(root)] == ["writing"]
    assert al.clear_cache(root) == [] and os.path.exists(lock)  # an entry being written is left alone
    # the same lock, long without a heartbeat: stale, taken over
    _plant_lock(folder, host="another-host", age_s=3600)
    assert al.dataset(lake).map(scaled, name="scaled-v1").cache(root).to_arrow().equals(expected_map(lake))
    assert not os.path.exists(lock)


RACER = """
import json, os, sys, time
sys.path.insert(0, {repo!r})
import arrowload as al
from test_cache import Counted
go = {go!r}
while not os.path.exists(go):
    time.sleep(0.01)
fn = Counted({calls!r})
def slow(batch):
    time.sleep(0.02)
    return fn(batch)
t = al.dataset({lake!r}).map(slow, name="slow-v1").cache({root!r}).to_arrow()
print(json.dumps({{"id": t.column("id").to_pylist(), "f0x2": t.column("f0x2").to_pylist()}}))
"""


def test_racing_processes_run_the_function_once(lake, tmp_path):
    root = str(tmp_path / "cache")
    calls = str(tmp_path / "calls")
    go = str(tmp_path / "go")
    script = RACER.format(repo=REPO, go=go, calls=calls, lake=lake, root=root)
    procs = [_python(script, cwd=str(tmp_path)) for _ in range(3)]
    time.sleep(0.5)
    open(go, "w").close()
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        outs.append(json.loads(out))
    with open(calls) as f:
        pids = f.read().split()
    assert len(set(pids)) == 1  # one process ran the function ...
    single = Counted(str(tmp_path / "reference"))
    al.dataset(lake).map(single, name="x").to_arrow()
    assert len(pids) == single.calls()  # ... exactly one pass over the data
    want = expected_map(lake)
    for o in outs:  # every racer reads the same rows, the plan's rows
        assert o["id"] == want.column("id").to_pylist()
        assert o["f0x2"] == want.column("f0x2").to_pylist()


def test_racing_threads_of_one_process(lake, tmp_path):
    root = str(tmp_path / "cache")
    fn = Counted(str(tmp_path / "calls"))
    results: list = []
    errors: list = []

    def run():
        try:
            results.append(al.dataset(lake).map(fn, name="scaled-v1").cache(root).to_arrow())
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    single = Counted(str(tmp_path / "reference"))
    al.dataset(lake).map(single, name="x").to_arrow()
    assert fn.calls() == single.calls()
    assert all(r.equals(expected_map(lake)) for r in results) and len(results) == 3


def test_a_failing_plan_leaves_no_entry_and_the_next_run_writes(lake, tmp_path):
    root = str(tmp_path / "cache")

    def boom(batch):
        if batch.num_rows:
            raise RuntimeError("user function failed")
        return batch

    with pytest.raises(Exception, match="user function failed"):
        al.dataset(lake).map(boom, name="v1").cache(root).count()
    [folder] = glob.glob(os.path.join(root, "plans", "*"))
    assert os.listdir(folder) == []  # lock released, attempt removed
    assert al.dataset(lake).map(scaled, name="v1").cache(root).to_arrow().equals(expected_map(lake))


def test_default_root_is_the_user_cache_dir(lake, tmp_path, monkeypatch):
    monkeypatch.setenv("ARROWLOAD_CACHE_DIR", str(tmp_path / "env-cache"))
    al.dataset(lake).select("id").cache().count()
    assert glob.glob(str(tmp_path / "env-cache" / "plans" / "*" / "commit.json"))
    assert len(al.cache_entries()) == 1
    monkeypatch.delenv("ARROWLOAD_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    al.dataset(lake).select("id").cache().count()
    assert glob.glob(str(tmp_path / "xdg" / "arrowload" / "plans" / "*" / "commit.json"))


def test_arguments_are_checked(lake):
    ds = al.dataset(lake)
    with pytest.raises(al.InvalidArgumentError, match="'parquet' or 'ipc'"):
        ds.cache(format="csv")
    with pytest.raises(al.ArgumentTypeError, match="key"):
        ds.cache(key="")
    with pytest.raises(al.InvalidArgumentError, match="wait_timeout"):
        ds.cache(wait_timeout=-1)
    with pytest.raises(al.InvalidArgumentError, match="storage_options apply to remote URIs"):
        ds.cache("/tmp/x", storage_options={"anon": True})
    with pytest.raises(al.ArgumentTypeError, match="older_than"):
        al.clear_cache("/nonexistent", older_than="1d")


# -- object storage ------------------------------------------------------------------------

def test_s3_cache_through_moto(lake, tmp_path, s3_endpoint):  # noqa: F811
    s3 = make_s3fs(s3_endpoint)
    if not s3.exists(BUCKET):
        s3.mkdir(BUCKET)
    prefix = f"cache-{os.path.basename(str(tmp_path))}"
    for f in sorted(glob.glob(os.path.join(lake, "*.parquet"))):
        s3.put_file(f, f"{BUCKET}/{prefix}/lake/{os.path.basename(f)}")
    options = {"endpoint_url": s3_endpoint, **KEYS}
    uri = f"s3://{BUCKET}/{prefix}/cache"
    fn = Counted(str(tmp_path / "calls"))

    def build():
        src = al.dataset(f"s3://{BUCKET}/{prefix}/lake", storage_options=options)
        return src.map(fn, name="scaled-v1").cache(uri, storage_options=options)

    assert "cache miss" in build().explain()
    assert build().to_arrow().equals(expected_map(lake))
    ran = fn.calls()
    assert ran >= 1
    s3.invalidate_cache()
    [commit_key] = s3.glob(f"{BUCKET}/{prefix}/cache/plans/*/commit.json")
    doc = read_commit(decode(s3.cat_file(commit_key), commit_key), commit_key)
    assert doc.num_rows == ROWS
    assert not s3.glob(f"{BUCKET}/{prefix}/cache/plans/*/writer.lock")  # released
    # threads racing on other Dataset objects: one writer at most, here none (a hit)
    hit = build()
    assert f"cache hit: {uri}/plans/" in hit.explain()
    assert hit.to_arrow().equals(expected_map(lake)) and fn.calls() == ran
    [entry] = al.cache_entries(uri, storage_options=options)
    assert entry.state == "committed" and entry.rows == ROWS and entry.bytes > 0
    # the lock is a conditional put: a second create of the same object is refused
    from arrowload.plancache import Store
    store = Store(uri, storage_options=options)
    path = store.join("probe.lock")
    assert store.create(path, b"a") and not store.create(path, b"b")
    assert store.exclusive == "strong" and store.read(path) == b"a"
    assert not store.delete(path, if_tag='"not-its-etag"') and store.delete(path, if_tag=store.stat(path).tag)
    assert al.clear_cache(uri, storage_options=options)[0].key == entry.key
    assert al.cache_entries(uri, storage_options=options) == []


def test_s3_cache_refusals_are_arrowload_errors(lake, s3_endpoint, monkeypatch):  # noqa: F811
    """Missing credentials, a dead endpoint and a missing bucket: botocore's and s3fs' own
    exceptions came through cache(), cache_entries() and clear_cache(), where al.dataset on
    the same store raises arrowload's."""
    from _support import free_port
    small = al.dataset(lake).limit(10)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    anonymous = {"endpoint_url": s3_endpoint}
    uri = f"s3://{BUCKET}/refused-cache"
    for ask in (lambda: al.cache_entries(uri, storage_options=anonymous),
                lambda: al.clear_cache(uri, storage_options=anonymous),
                lambda: small.cache(uri, storage_options=anonymous).count()):
        with pytest.raises(al.StorageAccessError, match="no credentials"):
            ask()
    dead = {"endpoint_url": f"http://127.0.0.1:{free_port()}", **KEYS,
            "config_kwargs": {"retries": {"max_attempts": 1}}}
    for ask in (lambda: al.cache_entries(uri, storage_options=dead),
                lambda: small.cache(uri, storage_options=dead).count()):
        with pytest.raises(al.StorageEndpointError):
            ask()
    with pytest.raises(al.PathNotFoundError, match="Create the bucket"):
        small.cache("s3://no-such-bucket-here/c", storage_options={"endpoint_url": s3_endpoint, **KEYS}).count()


def test_s3_racing_threads_write_once(lake, tmp_path, s3_endpoint):  # noqa: F811
    s3 = make_s3fs(s3_endpoint)
    if not s3.exists(BUCKET):
        s3.mkdir(BUCKET)
    options = {"endpoint_url": s3_endpoint, **KEYS}
    uri = f"s3://{BUCKET}/race-{os.path.basename(str(tmp_path))}"
    fn = Counted(str(tmp_path / "calls"))
    results, errors = [], []

    def run():
        try:
            results.append(al.dataset(lake).map(fn, name="scaled-v1").cache(uri, storage_options=options)
                           .to_arrow())
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    single = Counted(str(tmp_path / "reference"))
    al.dataset(lake).map(single, name="x").to_arrow()
    assert fn.calls() == single.calls()
    assert len(results) == 3 and all(r.equals(expected_map(lake)) for r in results)


# -- the command line ------------------------------------------------------------------------

def test_cli_ls_and_clear(lake, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    root = str(tmp_path / "cache")
    assert cli.main(["cache", "ls", root]) == 0
    assert "no plan cache entries" in capsys.readouterr().out
    al.dataset(lake).map(scaled, name="scaled-v1").cache(root).count()
    al.dataset(lake).select("id").cache(root, format="ipc").count()
    keys = {e.key: e for e in al.cache_entries(root)}
    assert cli.main(["cache", "ls", root]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"2 entries under {os.path.join(root, 'plans')}")
    assert all(len(line) <= 100 for line in out.splitlines())
    for key, e in keys.items():
        assert key[:12] in out and f"{e.rows:,}" in out
    assert "Map scaled-v1" in out
    assert cli.main(["cache", "clear", root, "--older-than", "1"]) == 0  # both are newer
    assert "removed 0" in capsys.readouterr().out and len(al.cache_entries(root)) == 2
    first = sorted(keys)[0]
    assert cli.main(["cache", "clear", root, first[:8]]) == 0
    assert "removed 1 plan cache entry" in capsys.readouterr().out
    assert [e.key for e in al.cache_entries(root)] == [k for k in keys if k != first]
    assert cli.main(["cache", "clear", root, "abcdef"]) == 2
    assert "no plan cache entry 'abcdef'" in capsys.readouterr().err
    monkeypatch.setenv("ARROWLOAD_CACHE_DIR", root)
    assert cli.main(["cache", "clear"]) == 0
    assert al.cache_entries(root) == [] and os.listdir(os.path.join(root, "plans")) == []


def test_a_hit_for_a_dataset_whose_files_changed_is_a_snapshot_change(tmp_path):
    """A Dataset opened before a file was deleted: its uncached reads raise
    SnapshotChangedError, and so did cache() on a new root, but cache() over an existing
    entry served the old rows, the deleted file's included. Truth: the dataset's own read."""
    lake = tmp_path / "lake"
    write_lake(lake, rows=600, shards=3, row_group_size=100, features=1, emb_dim=2)
    root = str(tmp_path / "cache")
    ds = al.dataset(str(lake)).filter("id % 2 = 0").select("id")
    assert ds.cache(root).count() == 300
    os.remove(sorted(lake.glob("*.parquet"))[1])
    with pytest.raises(al.SnapshotChangedError):
        ds.to_arrow()
    with pytest.raises(al.SnapshotChangedError):
        ds.cache(root).to_arrow()
    assert al.dataset(str(lake)).filter("id % 2 = 0").select("id").cache(root).count() == 200


def test_in_memory_dictionaries_are_part_of_the_cache_key(tmp_path):
    """The key of in-memory data hashed each column's buffers, which for a dictionary
    column are its indices only: a table of the same indices over another dictionary (two
    polars Categorical frames) read the first one's cached rows."""
    first = pa.table({"d": pa.DictionaryArray.from_arrays(pa.array([0, 1, 0], pa.int32()), pa.array(["a", "b"]))})
    second = pa.table({"d": pa.DictionaryArray.from_arrays(pa.array([0, 1, 0], pa.int32()), pa.array(["x", "y"]))})
    nested = pa.table({"s": pa.StructArray.from_arrays([second["d"].chunk(0)], ["d"])})
    cache = str(tmp_path / "cache")
    assert al.dataset(first).cache(cache, format="ipc").to_arrow()["d"].to_pylist() == ["a", "b", "a"]
    assert al.dataset(second).cache(cache, format="ipc").to_arrow()["d"].to_pylist() == ["x", "y", "x"]
    nested_first = pa.table({"s": pa.StructArray.from_arrays([first["d"].chunk(0)], ["d"])})
    assert al.dataset(nested_first).cache(cache, format="ipc").to_arrow()["s"].to_pylist()[0] == {"d": "a"}
    assert al.dataset(nested).cache(cache, format="ipc").to_arrow()["s"].to_pylist()[0] == {"d": "x"}


def test_a_delta_table_written_again_is_not_read_from_the_old_tables_cache(tmp_path):
    """A Delta table's snapshot id is its URI and version: a table deleted and written again
    starts at version 0 once more, and its cache() read the old table's rows. The key holds
    the table's files too. Truth: deltalake's read."""
    import shutil
    deltalake = pytest.importorskip("deltalake")
    path, cache = str(tmp_path / "events"), str(tmp_path / "cache")
    deltalake.write_deltalake(path, pa.table({"x": [1, 2, 3]}))
    assert al.delta(path).cache(cache).to_arrow()["x"].to_pylist() == [1, 2, 3]
    shutil.rmtree(path)
    deltalake.write_deltalake(path, pa.table({"x": [100, 200]}))
    want = sorted(deltalake.DeltaTable(path).to_pyarrow_table()["x"].to_pylist())
    assert sorted(al.delta(path).cache(cache).to_arrow()["x"].to_pylist()) == want == [100, 200]


def test_sql_that_reads_files_itself_is_not_cached_without_a_key(tmp_path):
    """A cached al.sql query reading files through read_parquet(...) beside its bound table
    was keyed on the bound table alone: files appended to the folder it reads were never
    seen (the cache answered (3, 6) where DuckDB answers (5, 36)). It is refused without
    key=, and cached under the key the user gives."""
    folder = tmp_path / "side"
    folder.mkdir()
    pq.write_table(pa.table({"x": [1, 2, 3]}), str(folder / "a.parquet"))
    t = al.dataset(pa.table({"k": [1]}))
    query = f"SELECT count(*) AS n, sum(x) AS s FROM read_parquet('{folder}/*.parquet'), t"
    cache = str(tmp_path / "cache")
    with pytest.raises(al.UncacheablePlanError, match="reads data by itself"):
        al.sql(query, t=t).cache(cache)
    assert al.sql(query, t=t).cache(cache, key="v1").to_arrow().to_pylist() == [{"n": 3, "s": 6}]
    # bound tables alone (and the sandboxed form) stay cacheable
    assert al.sql("SELECT k + 1 AS j FROM t", t=t).cache(cache).to_arrow().to_pylist() == [{"j": 2}]
    assert al.sql("SELECT count(*) AS n FROM t", t=t, external_access=False).cache(cache).to_arrow()["n"].to_pylist() == [1]


def test_a_cached_dataset_checks_its_source_before_every_read(tmp_path):
    """The source was checked only when the cached dataset was first opened: after its file
    was rewritten, the same cached dataset kept answering the old rows where the dataset
    itself raises SnapshotChangedError. Truth: pyarrow's read of the rewritten file."""
    lake = tmp_path / "lake"
    lake.mkdir()
    pq.write_table(pa.table({"x": [1, 2, 3]}), str(lake / "p0.parquet"))
    cache = str(tmp_path / "cache")
    cached = al.dataset(str(lake)).filter("x > 1").cache(cache)
    assert cached.to_arrow()["x"].to_pylist() == [2, 3]
    time.sleep(0.01)  # (a distinct modification time)
    pq.write_table(pa.table({"x": [5, 6, 7]}), str(lake / "p0.parquet"))
    with pytest.raises(al.SnapshotChangedError, match="p0.parquet"):
        cached.to_arrow()
    with pytest.raises(al.SnapshotChangedError):
        cached.count()
    want = [x for x in pq.read_table(str(lake / "p0.parquet"))["x"].to_pylist() if x > 1]
    assert al.dataset(str(lake)).filter("x > 1").cache(cache).to_arrow()["x"].to_pylist() == want


_FULL_DISK = """
import os, resource, signal
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
import arrowload as al
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as on a full disk
table = pa.table({{"id": np.arange(400_000), "x": np.random.default_rng(0).random(400_000)}})
pq.write_table(table, {lake!r}, row_group_size=50_000)
_, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, hard))  # the soft limit: raised again below
cached = al.dataset({lake!r}).select("id", "x").cache({root!r}, key="full-v1")
try:
    cached.count()
except al.CacheWriteError as exc:
    assert isinstance(exc, OSError) and {root!r} in str(exc) and "cache(uri=" in str(exc), exc
    print("CacheWriteError")
left = [os.path.join(d, f) for d, _, fs in os.walk({root!r}) for f in fs if not f.startswith(".")]
print(len([p for p in left if p.endswith((".parquet", ".arrow"))]))
resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
print(cached.count())
"""


@pytest.mark.parametrize("limit", [1 << 20, 0])
def test_a_cache_entry_the_disk_cannot_take_is_a_cache_write_error(tmp_path, limit):
    """Writing an entry past what the storage takes (a full disk, a quota, a file size
    limit: EFBIG here) raised the storage's raw OSError; it is a CacheWriteError (an
    OSError) naming the entry and where else to cache, the partial files are removed, and
    the next run with room writes the entry. Limit 0: the entry's first write, its lock,
    already fails (a disk full before the cache starts)."""
    import subprocess
    import sys
    code = _FULL_DISK.format(lake=str(tmp_path / "t.parquet"), root=str(tmp_path / "cache"), limit=limit)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["CacheWriteError", "0", "400000"], out.stdout


def test_a_source_or_map_error_through_cache_keeps_its_own_type(tmp_path):
    """A read of the plan that fails (a corrupt source in a folder named ``quota``, a map
    whose own write meets a full disk elsewhere) raises what it raises without the cache;
    it was taken for the cache's storage being full (CacheWriteError)."""
    import errno
    folder = tmp_path / "team_quota_reports"
    folder.mkdir()
    pq.write_table(pa.table({"x": list(range(1000))}), str(folder / "p0.parquet"))
    data = bytearray((folder / "p0.parquet").read_bytes())
    data[4:40] = b"\xff" * 36  # the first data page's header
    (folder / "p0.parquet").write_bytes(bytes(data))
    with pytest.raises(al.CorruptFileError):
        al.dataset(str(folder)).to_arrow()
    with pytest.raises(al.CorruptFileError):
        al.dataset(str(folder)).cache(str(tmp_path / "c1"), key="v1").to_arrow()

    def full(batch):
        raise OSError(errno.ENOSPC, "No space left on device", "/scratch/features.bin")
    pq.write_table(pa.table({"x": [1, 2]}), str(tmp_path / "ok.parquet"))
    with pytest.raises(OSError) as info:
        al.dataset(str(tmp_path / "ok.parquet")).map(full, name="full-v1").cache(str(tmp_path / "c2")).to_arrow()
    assert not isinstance(info.value, al.CacheWriteError)
