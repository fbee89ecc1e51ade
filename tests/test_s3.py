"""Object storage, end to end, against a real S3 API: moto's server on 127.0.0.1.

A small generated lake is written locally and uploaded; arrowload reads it back three
ways (``storage_options`` on an ``s3://`` URI, an ``s3fs`` filesystem, pyarrow's own
``S3FileSystem``) and must give exactly what plain pyarrow gives over the local copy.
Transient faults come from an fsspec-level injector wrapped around s3fs (arrowload is
never mocked), and the concurrency of footer fetches is observed by a probing
filesystem wrapper, without any timing assertion.
"""

from __future__ import annotations

import json
import os
import urllib.request

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds
import pyarrow.parquet as pq
import pyarrow.fs as pafs
import pytest
from fsspec.implementations.arrow import ArrowFSWrapper

import arrowload as al
from arrowload.datagen import write_lake
from _support import (ConcurrencyProbeFileSystem, CountingFileSystem, FaultInjectingFileSystem,
                      WrappedFileSystem, free_port, lake_facts, moto_s3_server)

BUCKET = "arrowload-test"
KEYS = {"key": "testing", "secret": "testing"}
FAST_RETRIES = al.Options(scan=al.ScanOptions(retries=3, retry_backoff_s=0.001))
# Planning opens and reads each Parquet footer once on an object store: pyarrow's fetch.
# arrowload's own read of the same tail, decoded in Python before pyarrow touches column
# chunk metadata (which aborts the process on encrypted or damaged footers; see
# arrowload/source/footer.py), comes when a file is first checked (pruning, describe,
# explain), side by side for many files: a file a partition filter skips is read once.
# (On local disk both reads are made when planning: tests/test_pushdown_bytes.py.)
FOOTER_READS_PER_FILE = 1
CHECK_READS_PER_FILE = 1


@pytest.fixture(scope="session")
def s3_endpoint():
    """moto's S3 server on loopback for the whole session; its endpoint URL."""
    with moto_s3_server() as url:
        yield url


_S3FS: dict = {}


def make_s3fs(url):
    """One s3fs instance per server (a new one costs about a second to set up); tests
    wrap it rather than change it."""
    if url not in _S3FS:
        import s3fs
        _S3FS[url] = s3fs.S3FileSystem(endpoint_url=url, skip_instance_cache=True, **KEYS)
    return _S3FS[url]


def upload(s3, local: str, prefix: str) -> None:
    for folder, _, names in os.walk(local):
        for name in names:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, local).replace(os.sep, "/")
            s3.put_file(path, f"{BUCKET}/{prefix}/{rel}")


@pytest.fixture(scope="module")
def lakes(s3_endpoint, tmp_path_factory):
    """(local flat lake, local hive lake), both also uploaded under s3://BUCKET/."""
    s3 = make_s3fs(s3_endpoint)
    if not s3.exists(BUCKET):
        s3.mkdir(BUCKET)
    flat = str(tmp_path_factory.mktemp("s3_flat"))
    write_lake(flat, rows=8000, shards=8, row_group_size=500, emb_dim=4, features=4)
    hive = str(tmp_path_factory.mktemp("s3_hive"))
    write_lake(hive, rows=4000, shards=2, row_group_size=500, emb_dim=4, features=4,
               partition_by="country")
    upload(s3, flat, "lake")
    upload(s3, hive, "hive")
    return flat, hive


def open_s3(how: str, uri: str, url: str, **kw):
    if how == "storage_options":
        return al.dataset(uri, storage_options={"endpoint_url": url, **KEYS}, **kw)
    if how == "s3fs":
        return al.dataset(uri, filesystem=make_s3fs(url), **kw)
    if how == "pyarrow":
        fs = pafs.S3FileSystem(endpoint_override=url.split("://", 1)[1], scheme="http",
                               access_key=KEYS["key"], secret_key=KEYS["secret"],
                               region="us-east-1")
        return al.dataset(uri, filesystem=fs, **kw)
    raise AssertionError(how)


WAYS = ["storage_options", "s3fs", "pyarrow"]


@pytest.mark.parametrize("how", WAYS)
def test_read_matches_local_copy(how, lakes, s3_endpoint):
    flat, _ = lakes
    local = pds.dataset(flat, format="parquet")
    ds = open_s3(how, f"s3://{BUCKET}/lake/", s3_endpoint)
    assert ds.schema == local.schema
    assert ds.count() == local.count_rows() == 8000
    got = ds.filter("id >= 1234 AND id < 5678 AND label = 1").select("id", "f2", "emb").to_arrow()
    expected = local.to_table(
        filter=(pc.field("id") >= 1234) & (pc.field("id") < 5678) & (pc.field("label") == 1),
        columns=["id", "f2", "emb"])
    assert got.num_rows > 0 and got.equals(expected)
    assert ds.filter("id < 1500").count() == 1500
    assert ds.head(3).equals(local.head(3))
    assert "row_group_pruning" in ds.filter("id < 1500").explain()


@pytest.mark.parametrize("how", WAYS)
def test_hive_partitions_on_s3(how, lakes, s3_endpoint):
    _, hive = lakes
    local = pds.dataset(hive, format="parquet", partitioning="hive")
    ds = open_s3(how, f"s3://{BUCKET}/hive/", s3_endpoint)
    assert "country" in ds.schema.names
    sel = ds.filter("country IN ('DE', 'JP') AND f0 > 0").select("id", "country", "f0")
    text = sel.explain()
    assert "partition_pruning" in text
    expected = local.to_table(filter=pc.field("country").isin(["DE", "JP"]) & (pc.field("f0") > 0),
                              columns=["id", "country", "f0"])
    got = sel.to_arrow()
    assert got.num_rows > 0
    assert got.sort_by("id").equals(expected.sort_by("id"))
    assert ds.filter("country IS NULL").count() == local.count_rows(filter=pc.field("country").is_null())


@pytest.mark.parametrize("how", WAYS)
@pytest.mark.parametrize("where", ["s3://no-such-bucket/lake/", f"s3://{BUCKET}/no-such-prefix/",
                                   f"s3://{BUCKET}/lake/part-99999.parquet"])
def test_missing_bucket_or_key(how, where, lakes, s3_endpoint):
    with pytest.raises(al.PathNotFoundError) as info:
        open_s3(how, where, s3_endpoint)
    assert isinstance(info.value, FileNotFoundError)
    assert where.split("://", 1)[1].rstrip("/") in str(info.value)


def test_pushdown_reads_little_over_s3(lakes, s3_endpoint):
    """The counting wrapper around s3fs (no block cache in between): count() fetches
    footers only, a selective one-column query reads that column of the kept row groups."""
    flat, _ = lakes
    facts = {os.path.basename(p): f for p, f in lake_facts(flat).items()}
    fs = CountingFileSystem(make_s3fs(s3_endpoint))
    ds = al.dataset(f"s3://{BUCKET}/lake/", filesystem=fs)
    assert ds.count() == 8000
    for r in fs.stats.reads:
        assert facts[os.path.basename(r.path)].is_footer_read(r), r
    assert len(fs.stats.reads) == FOOTER_READS_PER_FILE * len(facts)

    fs.reset()
    got = ds.filter("id < 1200").select("f2").to_arrow()
    assert got.equals(pds.dataset(flat, format="parquet").to_table(
        filter=pc.field("id") < 1200, columns=["f2"]))
    kept = [(f, rg) for f in facts.values() for rg in range(f.num_row_groups)
            if f.stats("id", rg).min < 1200]
    # the footer checks row-group pruning needs (each file's tail once), then the kept chunks
    checks = [r for r in fs.stats.reads if facts[os.path.basename(r.path)].is_footer_read(r)]
    data = [r for r in fs.stats.reads if r not in checks]
    assert sorted(os.path.basename(r.path) for r in checks) == sorted(CHECK_READS_PER_FILE * list(facts))
    assert {os.path.basename(r.path) for r in data} == {os.path.basename(f.path) for f, _ in kept}
    assert sum(f.chunk_bytes({"id", "f2"}, [rg]) for f, rg in kept) <= sum(r.nbytes for r in data) \
        <= sum(f.pre_buffer_bytes({"id", "f2"}, [rg]) for f, rg in kept)


@pytest.mark.parametrize("how", ["storage_options", "s3fs"])
def test_bytes_downloaded_are_the_kept_chunks(how, lakes, s3_endpoint, monkeypatch):
    """What s3fs downloads from the server, counted where it fetches a file's bytes
    (``S3File._fetch_range``, wrapped to count): a selective one-column query downloads
    the kept row groups' chunks (at most what pyarrow's pre-buffering coalesces), not the
    files. s3fs' default read cache ("readahead") fetched on past every ranged read: the
    whole of every file opened. A filesystem whose user chose a cache keeps it."""
    import s3fs
    flat, _ = lakes
    facts = {os.path.basename(p): f for p, f in lake_facts(flat).items()}
    fetched: list[int] = []
    fetch = s3fs.core.S3File._fetch_range

    def counted(self, start, end):
        fetched.append(end - start)
        return fetch(self, start, end)
    monkeypatch.setattr(s3fs.core.S3File, "_fetch_range", counted)
    ds = open_s3(how, f"s3://{BUCKET}/lake/", s3_endpoint)
    assert ds.count() == 8000
    fetched.clear()
    got = ds.filter("id < 700").select("f2").to_arrow()
    assert got.equals(pds.dataset(flat, format="parquet").to_table(filter=pc.field("id") < 700, columns=["f2"]))
    kept = [(f, rg) for f in facts.values() for rg in range(f.num_row_groups) if f.stats("id", rg).min < 700]
    files = {f.path for f, _ in kept}
    # the kept chunks, and each file's footer once for the checks row-group pruning needs
    checks = sum(f.footer for f in facts.values())
    assert sum(f.chunk_bytes({"id", "f2"}, [rg]) for f, rg in kept) <= sum(fetched) - checks \
        <= sum(f.pre_buffer_bytes({"id", "f2"}, [rg]) for f, rg in kept) < sum(os.path.getsize(p) for p in files)
    cached = s3fs.S3FileSystem(endpoint_url=s3_endpoint, skip_instance_cache=True, default_cache_type="bytes",
                               default_block_size=1 << 20, **KEYS)
    ds = al.dataset(f"s3://{BUCKET}/lake/", filesystem=cached)
    assert ds.count() == 8000
    ds.filter("id < 700").explain()  # (the footer checks, read now)
    fetched.clear()
    assert ds.filter("id < 700").select("f2").to_arrow().equals(got)
    # its cache's 1 MiB blocks, the user's choice: about the whole file
    assert sum(fetched) > 0.9 * sum(os.path.getsize(p) for p in files)


def test_a_file_rewritten_under_a_dataset_is_a_snapshot_change_not_corruption(lakes, s3_endpoint):
    """An S3 file rewritten with another layout after the dataset read its footers (remote
    files are not stat-checked before each read): the read fails on footers that no longer
    describe it, and the error says the data changed, naming the file, not that a healthy
    file is corrupt (it said "the file is truncated or corrupt; remove or rewrite it")."""
    import io

    import numpy as np

    s3 = make_s3fs(s3_endpoint)
    key = f"{BUCKET}/rewritten/part.parquet"

    def write(table, row_group_size):
        buf = io.BytesIO()
        pq.write_table(table, buf, row_group_size=row_group_size)
        s3.pipe(key, buf.getvalue())
    write(pa.table({"id": np.arange(1_000)}), 100)
    ds = open_s3("storage_options", f"s3://{BUCKET}/rewritten/", s3_endpoint)
    assert ds.count() == 1_000
    write(pa.table({"id": np.arange(5_000)[::-1].copy(), "y": np.ones(5_000)}), 700)
    with pytest.raises(al.SnapshotChangedError) as got:
        ds.filter("id >= 950").to_arrow()
    assert got.value.path.endswith("rewritten/part.parquet") and "open the dataset again" in str(got.value)
    again = open_s3("storage_options", f"s3://{BUCKET}/rewritten/", s3_endpoint).filter("id >= 4990").to_arrow()
    assert sorted(again["id"].to_pylist()) == list(range(4990, 5000))


def _ids_parquet(lo: int, n: int) -> bytes:
    import io
    buf = io.BytesIO()
    pq.write_table(pa.table({"id": pa.array(range(lo, lo + n), pa.int64())}), buf, row_group_size=25,
                   compression="NONE", use_dictionary=False)
    return buf.getvalue()


@pytest.mark.parametrize("how", ["storage_options", "s3fs"])
def test_a_file_overwritten_in_the_same_layout_is_refused_not_misread(how, lakes, s3_endpoint):
    """A file overwritten after listing by a larger one of the same layout: its footer, read
    at listing, decoded the new bytes into 100 rows of neither version (ids 1000..1099,
    where the listed file held 100..199 and the new one 1000..1149), a filter on the new ids
    found nothing, and a loader built before yielded them, all silently."""
    s3 = make_s3fs(s3_endpoint)
    prefix = f"{BUCKET}/overwritten-{how}"
    s3.pipe(f"{prefix}/f0.parquet", _ids_parquet(0, 100))
    s3.pipe(f"{prefix}/f1.parquet", _ids_parquet(100, 100))
    ds = open_s3(how, f"s3://{prefix}/", s3_endpoint)
    loader = ds.loader(50, output="numpy")
    assert ds.count() == 200 and ds.schema.names == ["id"]
    s3.pipe(f"{prefix}/f1.parquet", _ids_parquet(1000, 150))
    for read in (lambda: ds.to_arrow(), lambda: ds.filter("id >= 150").to_arrow(),
                 lambda: [b for b in loader]):
        with pytest.raises(al.SnapshotChangedError) as got:
            read()
        assert got.value.path.endswith("f1.parquet")
    fresh = open_s3(how, f"s3://{prefix}/", s3_endpoint).to_arrow()["id"].to_pylist()
    assert sorted(fresh) == list(range(100)) + list(range(1000, 1150))


def test_a_file_deleted_after_listing_is_a_snapshot_change(lakes, s3_endpoint):
    """It was a bare FileNotFoundError for to_arrow(), count() and filters (a loader and
    al.sql said the data changed)."""
    s3 = make_s3fs(s3_endpoint)
    prefix = f"{BUCKET}/deleted"
    s3.pipe(f"{prefix}/f0.parquet", _ids_parquet(0, 100))
    s3.pipe(f"{prefix}/f1.parquet", _ids_parquet(100, 100))
    ds = open_s3("storage_options", f"s3://{prefix}/", s3_endpoint)
    assert ds.count() == 200
    s3.rm(f"{prefix}/f1.parquet")
    # (a count the footers decide, as "id >= 150" by row-group bounds, reads nothing)
    for read in (lambda: ds.to_arrow(), lambda: ds.filter("id % 2 = 0").count(),
                 lambda: list(ds.to_batches())):
        with pytest.raises(al.SnapshotChangedError) as got:
            read()
        assert got.value.path.endswith("f1.parquet")
    # deleted before its footer was first read: the same (it was PathNotFoundError,
    # "disappeared after listing", where a rewrite said the data changed)
    s3.pipe(f"{prefix}/f1.parquet", _ids_parquet(100, 100))
    ds = open_s3("storage_options", f"s3://{prefix}/", s3_endpoint)
    s3.rm(f"{prefix}/f1.parquet")
    with pytest.raises(al.SnapshotChangedError) as got:
        ds.count()
    assert got.value.path.endswith("f1.parquet") and "al.dataset(" in str(got.value)


def test_credentials_refused_after_listing_are_a_storage_access_error(lakes, s3_endpoint):
    """Keys valid when the dataset was listed, refused when it is read (revoked, expired):
    s3fs' isfile() answered False for the refusal, and the read said the file was missing."""
    s3 = make_s3fs(s3_endpoint)
    s3.pipe(f"{BUCKET}/revoked/f0.parquet", _ids_parquet(0, 100))
    ds = open_s3("storage_options", f"s3://{BUCKET}/revoked/", s3_endpoint)
    loader = ds.loader(50)
    assert ds.count() == 100
    _post(s3_endpoint + "/moto-api/reset-auth", b"0")  # every key unknown from here
    try:
        for read in (lambda: ds.to_arrow(), lambda: [b for b in loader]):
            with pytest.raises(al.StorageAccessError) as got:
                read()
            assert isinstance(got.value, PermissionError)
    finally:
        _post(s3_endpoint + "/moto-api/reset-auth", b"inf")


def test_an_endpoint_gone_after_listing_is_a_storage_endpoint_error(tmp_path):
    """The same: a dead endpoint at read time looked like a missing file."""
    with moto_s3_server() as url:
        import s3fs
        s3 = s3fs.S3FileSystem(endpoint_url=url, skip_instance_cache=True, **KEYS)
        s3.mkdir("gone")
        s3.pipe("gone/f0.parquet", _ids_parquet(0, 100))
        ds = al.dataset("s3://gone/", storage_options={
            "endpoint_url": url, **KEYS, "config_kwargs": {"retries": {"max_attempts": 1}}})
        assert ds.count() == 100
    with pytest.raises(al.StorageEndpointError) as got:
        ds.to_arrow()
    assert isinstance(got.value, ConnectionError) and url.split("://")[1] in str(got.value)


def test_an_object_and_a_folder_of_one_name_read_as_the_path_says(lakes, s3_endpoint):
    """``both`` an object and ``both/`` a folder: ``s3://b/both/`` is the folder (it read the
    object, and with format= said it "disappeared after listing"); ``s3://b/both`` the object."""
    s3 = make_s3fs(s3_endpoint)
    s3.pipe(f"{BUCKET}/both", _ids_parquet(1, 1))
    s3.pipe(f"{BUCKET}/both/x.parquet", _ids_parquet(2, 1))
    assert open_s3("storage_options", f"s3://{BUCKET}/both/", s3_endpoint).to_arrow()["id"].to_pylist() == [2]
    assert open_s3("storage_options", f"s3://{BUCKET}/both/", s3_endpoint,
                   format="parquet").to_arrow()["id"].to_pylist() == [2]
    assert open_s3("storage_options", f"s3://{BUCKET}/both", s3_endpoint,
                   format="parquet").to_arrow()["id"].to_pylist() == [1]


def test_an_option_the_client_refuses_is_an_invalid_argument(lakes, s3_endpoint):
    """s3fs takes any keyword and passes it to its session at the first request: a raw
    TypeError there."""
    with pytest.raises(al.InvalidArgumentError, match="bogus") as got:
        al.dataset(f"s3://{BUCKET}/lake/", storage_options={"endpoint_url": s3_endpoint, **KEYS, "bogus": 1})
    assert got.value.argument == "storage_options"


def test_requests_per_file(lakes, s3_endpoint, monkeypatch):
    """What opening and reading a folder of small files asks S3, counted where s3fs sends its
    requests: the listing's ETags are kept (a HEAD per file asked them again), and a file
    opened with a fresh HEAD (the check that it is still the version listed) is not asked
    again by s3fs' first read. Per file: 1 HEAD + 1 GET to open (pyarrow's footer read, see
    FOOTER_READS_PER_FILE), 1 HEAD + 1 GET to read; it was 4 + 2 and 2 + 1, then 2 + 2 and
    1 + 1 while arrowload's footer check was read when planning. The check's read (a HEAD
    and a GET) comes with the first step that needs it: a filter's pruning here."""
    import collections

    import s3fs
    s3 = make_s3fs(s3_endpoint)
    n = 12
    for i in range(n):
        s3.pipe(f"{BUCKET}/small-files/f{i:02d}.parquet", _ids_parquet(i, 1))
    calls = collections.Counter()
    real = s3fs.S3FileSystem._call_s3

    async def counted(self, method, *args, **kwargs):
        calls[method] += 1
        return await real(self, method, *args, **kwargs)
    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", counted)
    ds = open_s3("storage_options", f"s3://{BUCKET}/small-files/", s3_endpoint)
    assert ds.count() == n
    assert calls["get_object"] == FOOTER_READS_PER_FILE * n
    assert calls["head_object"] <= FOOTER_READS_PER_FILE * n + 4, calls  # (+ a few for the root)
    calls.clear()
    assert sorted(ds.to_arrow()["id"].to_pylist()) == list(range(n))
    assert dict(calls) == {"head_object": n, "get_object": n}
    calls.clear()
    # a filtered count the footers' statistics answer: each footer checked once, no data read
    assert ds.filter("id >= 0").count() == n
    assert calls["get_object"] == CHECK_READS_PER_FILE * n and calls["head_object"] <= n + 4, calls
    calls.clear()
    assert ds.filter("id >= 1").count() == n - 1  # checked once per dataset
    assert calls["get_object"] == 0, calls
    # a new dataset over the same objects: their checks are remembered by version (the
    # listing's ETags: an fsspec listing gives no modification time), not read again
    calls.clear()
    again = open_s3("storage_options", f"s3://{BUCKET}/small-files/", s3_endpoint)
    assert again.filter("id >= 1").count() == n - 1
    assert calls["get_object"] == FOOTER_READS_PER_FILE * n, calls  # pyarrow's footers only


# ---------------------------------------------------------------------------
# transient and permanent errors


def test_transient_open_errors_are_retried(lakes, s3_endpoint):
    flaky = FaultInjectingFileSystem(make_s3fs(s3_endpoint), fail_opens=3)
    ds = al.dataset(f"s3://{BUCKET}/lake/", filesystem=flaky, options=FAST_RETRIES)
    assert ds.count() == 8000
    assert flaky.injected == 3
    # the three failed opens were tried again: one more attempt per fault
    assert sum(flaky.open_attempts.values()) == FOOTER_READS_PER_FILE * 8 + 3
    assert max(flaky.open_attempts.values()) >= 2


def test_transient_read_errors_are_retried(lakes, s3_endpoint):
    flat, _ = lakes
    flaky = FaultInjectingFileSystem(make_s3fs(s3_endpoint), fail_reads=3)
    ds = al.dataset(f"s3://{BUCKET}/lake/", filesystem=flaky, options=FAST_RETRIES)
    assert ds.schema == pds.dataset(flat, format="parquet").schema
    assert flaky.injected == 3
    assert sum(flaky.open_attempts.values()) == FOOTER_READS_PER_FILE * 8 + 3
    assert ds.count() == 8000


def test_transient_errors_give_up_after_the_retry_budget(lakes, s3_endpoint):
    target = "part-00002"
    flaky = FaultInjectingFileSystem(make_s3fs(s3_endpoint), fail_opens=1000, only=target)
    ds = al.dataset(f"s3://{BUCKET}/lake/", filesystem=flaky, options=FAST_RETRIES)
    with pytest.raises(al.StorageRetryError) as info:
        ds.count()
    assert isinstance(info.value, ConnectionError)
    assert target in str(info.value) and "retries" in str(info.value)
    attempts = {p: n for p, n in flaky.open_attempts.items() if target in p}
    assert list(attempts.values()) == [1 + FAST_RETRIES.scan.retries]


def test_permanent_error_is_not_retried(lakes, s3_endpoint):
    target = "part-00003"
    flaky = FaultInjectingFileSystem(make_s3fs(s3_endpoint), fail_opens=1,
                                     error=FileNotFoundError, only=target)
    ds = al.dataset(f"s3://{BUCKET}/lake/", filesystem=flaky, options=FAST_RETRIES)
    with pytest.raises(al.SnapshotChangedError) as info:  # listed, then not found: the data changed
        ds.schema
    assert target in info.value.path
    attempts = [n for p, n in flaky.open_attempts.items() if target in p]
    assert attempts == [1]
    assert flaky.injected == 1


# ---------------------------------------------------------------------------
# concurrency of footer fetches


def test_footers_are_fetched_concurrently(lakes, s3_endpoint):
    probe = ConcurrencyProbeFileSystem(make_s3fs(s3_endpoint))
    ds = al.dataset(f"s3://{BUCKET}/lake/", filesystem=probe)
    assert ds.count() == 8000
    assert probe.opens == FOOTER_READS_PER_FILE * 8
    assert probe.max_in_flight > 1 and not probe.gave_up


@pytest.mark.parametrize("step", ["prune", "describe", "explain"])
def test_footer_checks_are_read_concurrently_when_first_needed(lakes, s3_endpoint, step):
    """On an object store arrowload's footer check reads each file's tail when a step first
    needs it (row-group pruning, describe, explain), not when the dataset is planned: those
    reads go side by side, one per file; a serial read per file would pay each request's
    latency in turn (the probe's rendezvous fails: gave_up)."""
    flat, _ = lakes
    probe = ConcurrencyProbeFileSystem(make_s3fs(s3_endpoint))
    ds = al.dataset(f"s3://{BUCKET}/lake/", filesystem=probe)
    assert ds.count() == 8000
    probe.max_in_flight, probe.opens = 0, 0
    if step == "prune":
        got = ds.filter("id < 700").select("f2").to_arrow()
        assert got.num_rows == pds.dataset(flat, format="parquet").count_rows(filter=pc.field("id") < 700)
    elif step == "describe":
        assert ds.describe()["rows"].to_list()[0] == 8000
    else:
        assert "row groups" in ds.filter("id < 700").explain()
    assert probe.opens >= CHECK_READS_PER_FILE * 8
    assert probe.max_in_flight > 1 and not probe.gave_up


@pytest.mark.parametrize("planned", ["damaged", "healthy"])
def test_a_file_replaced_after_planning_is_a_snapshot_change_when_first_checked(lakes, s3_endpoint, tmp_path, planned):
    """Through pyarrow's own S3FileSystem (no per-open check that a file is the version
    listed), a file replaced between planning and its first footer check: the check read
    the new object's bytes, passed them (no footer at the old offset: nothing to check),
    and pyarrow then used the old, damaged column metadata and aborted the process; a
    healthy file rewritten smaller was called corrupt. The footer read then must be the
    one planned: a SnapshotChangedError. Each call in a fresh process (an abort is a
    return code, not an exception)."""
    import subprocess
    import sys

    from test_real_files import write_damaged_type
    first = str(tmp_path / "first.parquet")
    if planned == "damaged":
        write_damaged_type(first)
    else:
        pq.write_table(pa.table({"a": pa.array(range(1000), pa.int64())}), first)
    bigger, smaller = str(tmp_path / "bigger.parquet"), str(tmp_path / "smaller.parquet")
    pq.write_table(pa.table({"a": pa.array(range(5000), pa.int64())}), bigger)
    pq.write_table(pa.table({"a": pa.array([5], pa.int64())}), smaller)
    s3 = make_s3fs(s3_endpoint)
    calls = ["ds.filter('a > 3').count()", "ds.describe()", "ds.explain()",
             "list(ds.filter('a > 3').loader(16, output='numpy'))"]
    for replacement in (bigger, smaller):
        for k, call in enumerate(calls):
            key = f"{BUCKET}/replaced-{planned}-{os.path.basename(replacement)}-{k}/f.parquet"
            s3.put_file(first, key)
            code = f"""
import json, s3fs, pyarrow.fs as pafs, arrowload as al
pfs = pafs.S3FileSystem(endpoint_override={s3_endpoint.split('://', 1)[1]!r}, scheme="http",
                        access_key="testing", secret_key="testing", region="us-east-1")
ds = al.dataset("s3://{key.rsplit('/', 1)[0]}/", filesystem=pfs)
ds.count()  # planned: the footers pyarrow read
s3fs.S3FileSystem(endpoint_url={s3_endpoint!r}, skip_instance_cache=True, key="testing",
                  secret="testing").put_file({replacement!r}, {key!r})
try:
    {call}
    print(json.dumps(["ok", ""]))
except al.ArrowloadError as e:
    print(json.dumps([type(e).__name__, str(e)]))
"""
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
            assert out.returncode == 0, (call, replacement, out.returncode, out.stderr[-500:])
            kind, msg = json.loads(out.stdout.strip().splitlines()[-1])
            assert kind == "SnapshotChangedError" and "f.parquet" in msg, (call, replacement, kind, msg)


def test_concurrency_probe_sees_serial_fetches(lakes, s3_endpoint):
    """The probe can fail: with one I/O thread, footers come one at a time."""
    probe = ConcurrencyProbeFileSystem(make_s3fs(s3_endpoint), rendezvous_s=0.5)
    serial = al.Options(scan=al.ScanOptions(io_threads=1))
    ds = al.dataset(f"s3://{BUCKET}/lake/", filesystem=probe, options=serial)
    assert ds.count() == 8000
    assert probe.max_in_flight == 1 and probe.gave_up


# ---------------------------------------------------------------------------
# credentials, permissions and endpoints: typed errors, named URL, no retries


class CallCountingFileSystem(WrappedFileSystem):
    """Counts every metadata call and open that reaches the real filesystem underneath."""

    def __init__(self, inner, **kwargs) -> None:
        super().__init__(inner, **kwargs)
        self.calls: list[str] = []

    def info(self, path, **kwargs):
        self.calls.append("info")
        return super().info(path, **kwargs)

    def ls(self, path, detail=True, **kwargs):
        self.calls.append("ls")
        return super().ls(path, detail=detail, **kwargs)

    def find(self, path, *args, **kwargs):
        self.calls.append("find")
        return super().find(path, *args, **kwargs)

    def open(self, path, mode="rb", **kwargs):
        self.calls.append("open")
        return super().open(path, mode, **kwargs)


def _post(url: str, body: bytes) -> None:
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "text/plain"})
    urllib.request.urlopen(req, timeout=10).read()


@pytest.fixture(scope="module")
def auth_user(s3_endpoint):
    """An IAM user ``lister`` that may list ``auth-bucket`` and read everything in it but
    the data files; its keys. The file lies at the bucket's root: moto (5.2) miscomputes
    signatures of listings whose query holds a ``/``."""
    import botocore.session

    session = botocore.session.get_session()
    kw = dict(endpoint_url=s3_endpoint, region_name="us-east-1", aws_access_key_id="testing",
              aws_secret_access_key="testing")
    s3, iam = session.create_client("s3", **kw), session.create_client("iam", **kw)
    s3.create_bucket(Bucket="auth-bucket")
    s3.put_object(Bucket="auth-bucket", Key="part-0.parquet",
                  Body=_parquet_bytes())
    iam.create_user(UserName="lister")
    key = iam.create_access_key(UserName="lister")["AccessKey"]
    policy = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": ["s3:*"], "Resource": "*"},
        {"Effect": "Deny", "Action": ["s3:GetObject"],
         "Resource": "arn:aws:s3:::auth-bucket/part-*"}]}
    arn = iam.create_policy(PolicyName="no-data", PolicyDocument=json.dumps(policy))["Policy"]["Arn"]
    iam.attach_user_policy(UserName="lister", PolicyArn=arn)
    return {"key": key["AccessKeyId"], "secret": key["SecretAccessKey"]}


@pytest.fixture()
def auth(auth_user, s3_endpoint):
    """moto with request authentication on (its /moto-api/reset-auth switch) for one test:
    unknown keys are refused, IAM policies apply."""
    _post(s3_endpoint + "/moto-api/reset-auth", b"0")
    try:
        yield auth_user
    finally:
        _post(s3_endpoint + "/moto-api/reset-auth", b"inf")


def _parquet_bytes() -> bytes:
    import pyarrow.parquet as pq
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"id": [1, 2, 3]}), sink)
    return sink.getvalue().to_pybytes()


def _pyarrow_s3(url: str, key: str, secret: str) -> pafs.S3FileSystem:
    return pafs.S3FileSystem(endpoint_override=url.split("://", 1)[1], scheme="http",
                             access_key=key, secret_key=secret, region="us-east-1")


@pytest.mark.parametrize("how", WAYS)
def test_rejected_credentials_are_a_storage_access_error(how, auth, s3_endpoint):
    uri = "s3://auth-bucket/lake/"
    wrong = {"key": "AKIANOBODY", "secret": "wrong"}
    if how == "storage_options":
        make = lambda: al.dataset(uri, storage_options={"endpoint_url": s3_endpoint, **wrong})  # noqa: E731
        counted = None
    else:
        import s3fs
        inner = (s3fs.S3FileSystem(endpoint_url=s3_endpoint, skip_instance_cache=True, **wrong)
                 if how == "s3fs" else
                 ArrowFSWrapper(_pyarrow_s3(s3_endpoint, wrong["key"], wrong["secret"])))
        counted = CallCountingFileSystem(inner)
        make = lambda: al.dataset(uri, filesystem=counted, options=FAST_RETRIES)  # noqa: E731
    with pytest.raises(al.StorageAccessError) as info:
        make()
    err = info.value
    assert isinstance(err, PermissionError) and isinstance(err, al.ArrowloadError)
    assert "auth-bucket/lake" in str(err)
    assert "AWS_ACCESS_KEY_ID" in str(err) and "storage_options" in str(err)
    if counted is not None:
        assert counted.calls == ["info"]  # refused once, not retried


def test_policy_denial_at_read_names_the_file(auth, s3_endpoint):
    """Listing is allowed, reading the data files is denied by policy: the error is an access
    error naming the file, not a 'corrupt file'. (pyarrow's S3FileSystem
    only: moto 5.2 miscomputes the signature of s3fs's listing requests under
    authentication; s3fs's denials take the same path as in the test above.)"""
    ds = al.dataset("s3://auth-bucket/", filesystem=_pyarrow_s3(s3_endpoint, auth["key"], auth["secret"]))
    with pytest.raises(al.StorageAccessError) as info:
        ds.schema
    assert isinstance(info.value, PermissionError)
    assert "auth-bucket/part-0.parquet" in str(info.value)
    assert "s3:GetObject" in str(info.value)


def test_missing_credentials_name_what_to_set(s3_endpoint, lakes, monkeypatch, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                 "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                 "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # never ask an instance-metadata service
    with pytest.raises(al.StorageAccessError) as info:
        al.dataset(f"s3://{BUCKET}/lake/", storage_options={"endpoint_url": s3_endpoint})
    msg = str(info.value)
    assert f"s3://{BUCKET}/lake/" in msg and "no credentials" in msg
    assert "AWS_ACCESS_KEY_ID" in msg and "anon" in msg


class _AttemptCounter:
    """Counts the HTTP requests botocore is about to send (its ``before-send`` event): one per
    attempt, retries included, whether or not a connection is then made."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, **kwargs):
        self.n += 1
        return None


def test_unreachable_endpoint_fails_fast_storage_options():
    """A closed loopback port as endpoint: a configuration error, named with the fix, after
    at most one quick retry by botocore (its default is four, with backoff, per request)."""
    from aiobotocore.session import AioSession
    port = free_port()  # nothing listens there
    endpoint = f"http://127.0.0.1:{port}"
    session = AioSession()
    attempts = _AttemptCounter()
    session.register("before-send.s3", attempts)
    with pytest.raises(al.StorageEndpointError) as info:
        al.dataset("s3://some-bucket/lake/", storage_options={
            "endpoint_url": endpoint, "key": "k", "secret": "s", "session": session})
    err = info.value
    assert isinstance(err, ConnectionError) and isinstance(err, al.ArrowloadError)
    assert f"127.0.0.1:{port}" in str(err) and "s3://some-bucket/lake/" in str(err)
    assert "endpoint_url" in str(err) and "AWS_ENDPOINT_URL" in str(err)
    assert 1 <= attempts.n <= 2


@pytest.mark.parametrize("how", ["s3fs", "pyarrow"])
def test_unreachable_endpoint_is_not_retried(how):
    """A user's own filesystem on a closed port: arrowload adds no retry of its own."""
    import s3fs
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    inner = (s3fs.S3FileSystem(endpoint_url=endpoint, key="k", secret="s", skip_instance_cache=True,
                               config_kwargs={"retries": {"mode": "standard", "max_attempts": 0}})
             if how == "s3fs" else
             ArrowFSWrapper(pafs.S3FileSystem(endpoint_override=f"127.0.0.1:{port}", scheme="http",
                                              access_key="k", secret_key="s", region="us-east-1",
                                              retry_strategy=pafs.AwsStandardS3RetryStrategy(1))))
    counted = CallCountingFileSystem(inner)
    with pytest.raises(al.StorageEndpointError) as info:
        al.dataset("s3://some-bucket/lake/", filesystem=counted, options=FAST_RETRIES)
    assert f"127.0.0.1:{port}" in str(info.value)
    assert counted.calls == ["info"]


def test_transient_errors_are_still_retried_after_classification(lakes, s3_endpoint):
    """The other side of fail-fast: a connection reset is transient and retried."""
    flaky = FaultInjectingFileSystem(make_s3fs(s3_endpoint), fail_opens=2, error=ConnectionResetError)
    ds = al.dataset(f"s3://{BUCKET}/lake/", filesystem=flaky, options=FAST_RETRIES)
    assert ds.count() == 8000
    assert flaky.injected == 2 and sum(flaky.open_attempts.values()) == 8 * FOOTER_READS_PER_FILE + 2


def _client_error(code: str, status: int):
    from botocore.exceptions import ClientError
    return ClientError({"Error": {"Code": code, "Message": code},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject")


def test_error_classes_of_real_library_exceptions():
    """What botocore, s3fs, pyarrow's S3 and the OS raise, sorted into retry / fail fast.
    (The end-to-end tests above raise them for real; this pins the less reachable ones.)"""
    import socket

    from botocore.exceptions import (ConnectTimeoutError, EndpointConnectionError, NoCredentialsError,
                                     ReadTimeoutError)

    from arrowload.source.retry import ENDPOINT, PERMANENT, TRANSIENT, classify
    cases = [
        (NoCredentialsError(), PERMANENT),
        (EndpointConnectionError(endpoint_url="http://127.0.0.1:1"), ENDPOINT),
        (ConnectTimeoutError(endpoint_url="http://127.0.0.1:1"), TRANSIENT),
        (ReadTimeoutError(endpoint_url="http://127.0.0.1:1"), TRANSIENT),
        (_client_error("AccessDenied", 403), PERMANENT),
        (_client_error("InvalidAccessKeyId", 403), PERMANENT),
        (_client_error("InternalError", 500), TRANSIENT),
        (_client_error("SlowDown", 503), TRANSIENT),
        (PermissionError("Forbidden"), PERMANENT),
        (FileNotFoundError("nope"), PERMANENT),
        (ConnectionResetError("reset by peer"), TRANSIENT),
        (ConnectionRefusedError("refused"), ENDPOINT),
        (socket.gaierror("Name or service not known"), ENDPOINT),
        (TimeoutError("timed out"), TRANSIENT),
        (OSError("When reading information for key 'a' in bucket 'b': AWS Error NETWORK_CONNECTION "
                 "during HeadObject operation: curlCode: 7, Could not connect to server"), ENDPOINT),
        (OSError("AWS Error NETWORK_CONNECTION during GetObject operation: curlCode: 28, Timeout was "
                 "reached"), TRANSIENT),
        (OSError("AWS Error SLOW_DOWN during GetObject operation: Please reduce your request rate."),
         TRANSIENT),
        (OSError("AWS Error ACCESS_DENIED during HeadObject operation: No response body."), PERMANENT),
        (OSError("Couldn't deserialize thrift: TProtocolException: Invalid data"), PERMANENT),
        (al.CorruptFileError("x"), PERMANENT),
    ]
    for exc, expected in cases:
        assert classify(exc) == expected, (exc, classify(exc), expected)


class _ServiceUnavailable:
    """botocore ``before-send`` hook: the first ``fail`` object reads (GET of a key, not a
    listing) answer HTTP 503 ServiceUnavailable, as a busy S3 front end does."""

    def __init__(self, fail: int) -> None:
        self.fail, self.failed = fail, 0

    def __call__(self, request, **kwargs):
        from aiobotocore.awsrequest import AioAWSResponse
        if request.method != "GET" or "list-type=" in request.url or self.failed >= self.fail:
            return None
        self.failed += 1

        class Body:
            async def read(self):
                return b"<Error><Code>ServiceUnavailable</Code><Message>try again</Message></Error>"
        return AioAWSResponse(request.url, 503, {"Content-Type": "application/xml"}, Body())


def test_reads_keep_the_clients_retries_of_transient_errors(s3_endpoint, tmp_path):
    """Failing fast is for the listing (a wrong endpoint); reads through an s3fs arrowload
    builds keep botocore's retries, so a 503 is retried by the client even where arrowload
    itself does not retry (here: retries=0; in general: the middle of a streaming scan)."""
    from aiobotocore.session import AioSession
    s3 = make_s3fs(s3_endpoint)
    s3.mkdir("retry-bucket")
    table = pa.table({"x": list(range(1000))})
    pq.write_table(table, tmp_path / "x.parquet")
    s3.put(str(tmp_path / "x.parquet"), "retry-bucket/lake/x.parquet")
    session = AioSession()
    flaky = _ServiceUnavailable(fail=2)
    session.register("before-send.s3", flaky)
    ds = al.dataset("s3://retry-bucket/lake/", options=al.Options(scan=al.ScanOptions(retries=0)),
                    storage_options={"endpoint_url": s3_endpoint, **KEYS, "session": session})
    assert ds.to_arrow().equals(table)
    assert flaky.failed == 2  # both 503s were sent, and retried by the client
