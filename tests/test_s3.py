"""Object storage, end to end, against a real S3 API: moto's server on 127.0.0.1.

A small generated lake is written locally and uploaded; arrowload reads it back three
ways (``storage_options`` on an ``s3://`` URI, an ``s3fs`` filesystem, pyarrow's own
``S3FileSystem``) and must give exactly what plain pyarrow gives over the local copy.
Transient faults come from an fsspec-level injector wrapped around s3fs (arrowload is
never mocked), and the concurrency of footer fetches is observed by a probing
filesystem wrapper, without any timing assertion.
"""

from __future__ import annotations

import os

import pyarrow.compute as pc
import pyarrow.dataset as pds
import pyarrow.fs as pafs
import pytest

import arrowload as al
from arrowload.datagen import write_lake
from _support import (ConcurrencyProbeFileSystem, CountingFileSystem, FaultInjectingFileSystem,
                      lake_facts, moto_s3_server)

BUCKET = "arrowload-test"
KEYS = {"key": "testing", "secret": "testing"}
FAST_RETRIES = al.Options(scan=al.ScanOptions(retries=3, retry_backoff_s=0.001))
# Planning opens and reads each Parquet footer twice: pyarrow's fetch, and arrowload's read
# of the same tail, decoded in Python before pyarrow touches column chunk metadata (which
# aborts the process on encrypted or damaged footers; see arrowload/source/footer.py).
FOOTER_READS_PER_FILE = 2


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
    assert "prune_row_groups" in ds.filter("id < 1500").explain()


@pytest.mark.parametrize("how", WAYS)
def test_hive_partitions_on_s3(how, lakes, s3_endpoint):
    _, hive = lakes
    local = pds.dataset(hive, format="parquet", partitioning="hive")
    ds = open_s3(how, f"s3://{BUCKET}/hive/", s3_endpoint)
    assert "country" in ds.schema.names
    sel = ds.filter("country IN ('DE', 'JP') AND f0 > 0").select("id", "country", "f0")
    text = sel.explain()
    assert "prune_partitions" in text
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
    assert {os.path.basename(p) for p in fs.stats.opens} == {os.path.basename(f.path) for f, _ in kept}
    assert sum(f.chunk_bytes({"id", "f2"}, [rg]) for f, rg in kept) <= fs.stats.bytes_read \
        <= sum(f.pre_buffer_bytes({"id", "f2"}, [rg]) for f, rg in kept)


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
    with pytest.raises(al.ArrowloadError) as info:
        ds.count()
    assert target in str(info.value) and "retries" in str(info.value)
    attempts = {p: n for p, n in flaky.open_attempts.items() if target in p}
    assert list(attempts.values()) == [1 + FAST_RETRIES.scan.retries]


def test_permanent_error_is_not_retried(lakes, s3_endpoint):
    target = "part-00003"
    flaky = FaultInjectingFileSystem(make_s3fs(s3_endpoint), fail_opens=1,
                                     error=FileNotFoundError, only=target)
    ds = al.dataset(f"s3://{BUCKET}/lake/", filesystem=flaky, options=FAST_RETRIES)
    with pytest.raises(al.PathNotFoundError) as info:
        ds.schema
    assert isinstance(info.value, FileNotFoundError)
    assert target in str(info.value)
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


def test_concurrency_probe_sees_serial_fetches(lakes, s3_endpoint):
    """The probe can fail: with one I/O thread, footers come one at a time."""
    probe = ConcurrencyProbeFileSystem(make_s3fs(s3_endpoint), rendezvous_s=0.5)
    serial = al.Options(scan=al.ScanOptions(io_threads=1))
    ds = al.dataset(f"s3://{BUCKET}/lake/", filesystem=probe, options=serial)
    assert ds.count() == 8000
    assert probe.max_in_flight == 1 and probe.gave_up
