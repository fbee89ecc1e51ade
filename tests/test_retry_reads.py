"""Transient errors while reading data (not only footers) are retried: a whole-scan read
and every loader unit read are idempotent, so a connection reset costs a retry, not the
epoch. Faults are injected at the fsspec level, beneath arrowload."""

from __future__ import annotations

import numpy as np
import pyarrow.dataset as pads
import pytest
from fsspec.implementations.local import LocalFileSystem

import arrowload as al
from arrowload.datagen import write_lake

from _support import FaultInjectingFileSystem


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    path = tmp_path_factory.mktemp("retry") / "lake"
    write_lake(path, rows=6_000, shards=3, row_group_size=1_000, emb_dim=0)
    return str(path)


def _flaky_after_footers(lake: str, faults: int) -> tuple[al.Dataset, FaultInjectingFileSystem]:
    fs = FaultInjectingFileSystem(LocalFileSystem())
    ds = al.dataset(lake, filesystem=fs)
    _ = ds.schema  # footers read cleanly; the faults hit data reads below
    fs.fail_reads = faults
    return ds, fs


def test_to_arrow_survives_transient_read_errors(lake):
    ds, fs = _flaky_after_footers(lake, faults=2)
    got = ds.select("id", "f0").to_arrow()
    assert fs.injected == 2
    expected = pads.dataset(lake).to_table(columns=["id", "f0"])
    assert got.equals(expected)


def test_loader_survives_transient_read_errors(lake, tmp_path):
    ds, fs = _flaky_after_footers(lake, faults=3)
    loader = ds.select("id").loader(500, cache_dir=str(tmp_path))
    ids = np.concatenate([b["id"] for b in loader])
    assert fs.injected == 3
    np.testing.assert_array_equal(ids, np.arange(6_000))


def test_permanent_errors_are_not_retried(lake):
    ds, fs = _flaky_after_footers(lake, faults=0)
    fs.fail_reads, fs.error = 1, PermissionError
    with pytest.raises(Exception) as info:
        ds.select("id").to_arrow()
    assert fs.injected == 1  # one failure, no retry of a permission error
    assert not isinstance(info.value, ConnectionError)


def test_without_retries_the_same_fault_fails(lake):
    """The control: the faults above are real failures, absorbed only by the retries."""
    fs = FaultInjectingFileSystem(LocalFileSystem())
    ds = al.dataset(lake, filesystem=fs, options=al.Options(scan=al.ScanOptions(retries=0)))
    _ = ds.schema
    fs.fail_reads = 1
    with pytest.raises((ConnectionError, al.ArrowloadError)):
        ds.select("id", "f0").to_arrow()


def test_transient_errors_past_the_retries_are_storage_errors_not_corrupt_files(lake):
    """A transient fault that outlasts the retries is the storage's, not the file's: a
    StorageRetryError (a ConnectionError) naming the file, never "corrupt; remove it"."""
    fast = al.Options(scan=al.ScanOptions(retries=1, retry_backoff_s=0.001))
    # while reading footers
    fs = FaultInjectingFileSystem(LocalFileSystem(), fail_opens=10**6, only="part-00001")
    with pytest.raises(al.StorageRetryError) as info:
        al.dataset(lake, filesystem=fs, options=fast).count()
    assert isinstance(info.value, ConnectionError) and "part-00001" in str(info.value)
    assert "retries" in str(info.value) and "corrupt" not in str(info.value)
    # while reading data, for a whole-table read and for the loader
    fs = FaultInjectingFileSystem(LocalFileSystem(), only="part-00002")
    ds = al.dataset(lake, filesystem=fs, options=fast)
    _ = ds.schema
    fs.fail_reads = 10**6
    for call in (lambda: ds.select("id").to_arrow(), lambda: list(ds.select("id").loader(500))):
        with pytest.raises(al.StorageRetryError) as info:
            call()
        assert isinstance(info.value, ConnectionError) and "part-00002" in str(info.value)
        assert "corrupt" not in str(info.value)
    # the truth: the file itself is intact
    fs.fail_reads = 0
    assert ds.select("id").to_arrow().equals(pads.dataset(lake).to_table(columns=["id"]))


def test_a_read_failure_no_file_reproduces_is_a_scan_error(lake):
    """A non-transient fault that happens once (so it is not retried) and not again when
    each file is re-read: no file is blamed, the error is typed and an OSError."""
    fs = FaultInjectingFileSystem(LocalFileSystem(), error=IsADirectoryError)
    ds = al.dataset(lake, filesystem=fs)
    _ = ds.schema
    fs.fail_reads = 1
    with pytest.raises(al.ScanError) as info:
        ds.select("id").to_arrow()
    assert isinstance(info.value, OSError) and "no file is at fault" in str(info.value)
    assert fs.injected == 1
    # the truth: read again, every row is there
    assert ds.select("id").to_arrow().equals(pads.dataset(lake).to_table(columns=["id"]))


@pytest.mark.parametrize("read", ["filtered count", "limit"])
def test_one_transient_fault_in_counts_and_limits(lake, read):
    """One transient fault while counting a filter or reading a limit: both retry their
    read (idempotent) and answer as the clean read does. They raised StorageRetryError
    ("kept failing") after a single fault."""
    import duckdb
    truth = {
        "filtered count": duckdb.sql(f"SELECT count(*) FROM '{lake}/*.parquet' WHERE label = 1 AND id > 17").fetchall()[0][0],
        "limit": list(range(2_500)),
    }
    ds, fs = _flaky_after_footers(lake, faults=1)
    if read == "filtered count":
        assert ds.filter("label = 1 AND id > 17").count() == truth[read]
    else:
        assert ds.select("id").limit(2_500).to_arrow()["id"].to_pylist() == truth[read]
    assert fs.injected == 1


_SQL_FAULT = """
import sys
sys.path.insert(0, {tests!r})
import duckdb
from fsspec.implementations.local import LocalFileSystem
from _support import FaultInjectingFileSystem
import arrowload as al
fs = FaultInjectingFileSystem(LocalFileSystem())
ds = al.dataset({lake!r}, filesystem=fs)
_ = ds.schema
fs.fail_reads = 1
query = "SELECT label, count(*) AS n FROM t GROUP BY ALL ORDER BY label"
got = al.sql(query, t=ds).to_arrow().to_pylist()
want = duckdb.sql(query.replace("FROM t", "FROM '{lake}/*.parquet'")).to_arrow_table().to_pylist()
assert got == want
print("rows")
assert fs.injected == 1
"""


def test_one_transient_fault_in_a_sql_table_read_is_retried_where_it_happened(lake):
    """One transient fault in a bound table's read, under DuckDB's scan of the pyarrow
    dataset: the read is tried again where it failed (the filesystem handler's
    ``_RetryingFile``), and the answer is DuckDB's own. Before, the fault reached DuckDB,
    which reported it (an ExpressionError, then a ScanError) and could then hang or abort
    the process (DuckDB 2.0 after a failed dataset scan through a Python filesystem). Run
    in a process of its own, with a timeout, for that hang."""
    import subprocess
    import sys
    from pathlib import Path
    code = _SQL_FAULT.format(tests=str(Path(__file__).parent), lake=lake)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "rows"
