"""Real-world files: encrypted and damaged Parquet footers never abort the process;
formats and types pyarrow reads are read the same way.

Calls that used to abort (an uncaught C++ exception in pyarrow's column-chunk accessors)
run in a subprocess: an abort fails the test (exit code), it does not kill pytest.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import textwrap

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import arrowload as al

REPO = os.path.dirname(os.path.dirname(os.path.abspath(al.__file__)))

# ---------------------------------------------------------------------------
# helpers


def run_isolated(code: str) -> dict:
    """Run ``code`` in a fresh interpreter with this checkout first on the path; it must
    exit 0 (no abort) and print one JSON object as its last line."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0, f"the process died (exit {proc.returncode}):\n{proc.stderr[-2000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


RISKY_CALLS = r"""
import json, sys
import arrowload as al
path = sys.argv[1] if len(sys.argv) > 1 else PATH
out = {}
def attempt(name, fn):
    try:
        value = fn()
        out[name] = {"ok": True, "text": str(value)}
    except Exception as exc:
        out[name] = {"ok": False, "type": type(exc).__name__, "text": str(exc),
                     "arrowload": isinstance(exc, al.ArrowloadError),
                     "corrupt": isinstance(exc, al.CorruptFileError),
                     "path": getattr(exc, "path", None)}
d = al.dataset(path)
attempt("repr", lambda: repr(d))
attempt("describe", lambda: d.describe().select("column", "source").rows())
attempt("explain", lambda: d.explain())
attempt("repr_filtered", lambda: repr(d.filter("a > 3")))
attempt("explain_filtered", lambda: d.filter("a > 3").explain())
attempt("describe_filtered", lambda: d.filter("a > 3").describe().select("column", "source").rows())
attempt("count", lambda: d.count())
attempt("to_arrow", lambda: d.to_arrow())
attempt("filtered_count", lambda: d.filter("a > 3").count())
attempt("filtered_to_arrow", lambda: d.filter("a > 3").to_arrow())
attempt("loader", lambda: sum(len(b["a"]) for b in d.loader(16)))
print(json.dumps(out))
"""


def risky_calls(path: str) -> dict:
    return run_isolated(f"PATH = {path!r}\n" + RISKY_CALLS)


def table() -> pa.Table:
    return pa.table({"a": pa.array(range(100), pa.int64()), "s": [f"v{i}" for i in range(100)]})


class _InTestKms:
    """A KMS client for pyarrow.parquet.encryption that wraps keys in base64 (test only)."""

    @staticmethod
    def factory():
        import pyarrow.parquet.encryption as pe

        class Client(pe.KmsClient):
            def __init__(self, config):
                super().__init__()

            def wrap_key(self, key_bytes, master_key_identifier):
                return base64.b64encode(key_bytes)

            def unwrap_key(self, wrapped_key, master_key_identifier):
                return base64.b64decode(wrapped_key)

        return Client


def write_encrypted(path: str, plaintext_footer: bool) -> None:
    import pyarrow.parquet.encryption as pe
    factory = pe.CryptoFactory(lambda config: _InTestKms.factory()(config))
    config = pe.EncryptionConfiguration(footer_key="footer", column_keys={"col": ["a"]},
                                        plaintext_footer=plaintext_footer, double_wrapping=False)
    props = factory.file_encryption_properties(pe.KmsConnectionConfig(), config)
    t = table()
    with pq.ParquetWriter(path, t.schema, encryption_properties=props) as w:
        w.write_table(t)


def write_damaged_type(path: str) -> None:
    """A file whose footer says column ``a`` (INT64) holds DOUBLE values: the physical type
    in its ColumnMetaData is rewritten (Thrift compact: ColumnChunk field 3 header 0x1C,
    then ColumnMetaData field 1 header 0x15 and zigzag(2 = INT64) = 0x04)."""
    pq.write_table(table().select(["a"]), path, compression="none", write_statistics=True)
    data = bytearray(open(path, "rb").read())
    footer_len = int.from_bytes(data[-8:-4], "little")
    start = len(data) - 8 - footer_len
    pattern = b"\x1c\x15\x04"
    at = data.find(pattern, start)
    assert at > 0 and data.find(pattern, at + 1) == -1, "the footer layout changed; rebuild the test"
    data[at + 2] = 0x0A  # zigzag(5) = DOUBLE
    open(path, "wb").write(bytes(data))
    assert pq.read_metadata(path).num_rows == 100  # the footer still parses


# ---------------------------------------------------------------------------
# never abort


def _assert_survives_and_refuses_reads(result: dict, path: str, column_word: str) -> None:
    for name in ("repr", "describe", "explain", "repr_filtered", "explain_filtered",
                 "describe_filtered", "count"):
        assert result[name]["ok"], (name, result[name])
    assert "unreadable" in result["explain_filtered"]["text"]
    for name in ("to_arrow", "filtered_count", "filtered_to_arrow", "loader"):
        r = result[name]
        assert not r["ok"] and r["corrupt"], (name, r)
        assert os.path.basename(path) in r["text"] and column_word in r["text"], (name, r["text"])
        assert r["path"] is not None and r["path"].endswith(os.path.basename(path))
    assert result["count"]["text"] == "100"  # row counts live in the readable part of the footer


@pytest.mark.parametrize("plaintext_footer", [True, False], ids=["plaintext-footer", "encrypted-footer"])
def test_encrypted_parquet_never_aborts(tmp_path, plaintext_footer):
    path = str(tmp_path / "secret.parquet")
    write_encrypted(path, plaintext_footer)
    # the truth: pyarrow without keys cannot read it either
    with pytest.raises(Exception):
        pq.read_table(path)
    result = risky_calls(path)
    if plaintext_footer:
        _assert_survives_and_refuses_reads(result, path, "'a'")
        assert "encrypt" in result["explain"]["text"] and "encrypt" in result["repr"]["text"]
        assert "encrypt" in result["describe"]["text"]
        assert "decrypt" in result["to_arrow"]["text"]  # says what would fix it
    else:  # the footer itself is encrypted: nothing is known, every call says so
        assert result["repr"]["ok"] and "encrypted" in result["repr"]["text"]
        for name in ("describe", "explain", "to_arrow", "count"):
            assert not result[name]["ok"] and result[name]["corrupt"], (name, result[name])
            assert "secret.parquet" in result[name]["text"]
            assert "footer is encrypted" in result[name]["text"] and "decrypt" in result[name]["text"]


def test_damaged_column_metadata_never_aborts(tmp_path):
    path = str(tmp_path / "damaged.parquet")
    write_damaged_type(path)
    result = risky_calls(path)
    _assert_survives_and_refuses_reads(result, path, "'a'")
    assert "DOUBLE" in result["to_arrow"]["text"] and "INT64" in result["to_arrow"]["text"]
    assert "unreadable" in result["explain"]["text"] and "unreadable" in result["describe"]["text"]


def test_footer_check_costs_one_exact_footer_read_and_can_be_switched_off(tmp_path):
    """The check reads each footer once more, exactly its bytes, at planning; with
    ``check_footers=False`` only pyarrow's own footer fetch remains."""
    from _support import CountingLocalFileSystem, footer_size
    paths = []
    for k in range(3):
        paths.append(str(tmp_path / f"part-{k}.parquet"))
        pq.write_table(table(), paths[-1])
    for check, per_file in ((True, 2), (False, 1)):
        fs = CountingLocalFileSystem()
        d = al.dataset(str(tmp_path), filesystem=fs, options=al.Options(scan=al.ScanOptions(check_footers=check)))
        d.schema
        reads = fs.stats.reads
        assert sorted(r.path for r in reads) == sorted(per_file * paths), (check, reads)
        if check:
            exact = [r for r in reads if r.nbytes == footer_size(r.path)]
            assert sorted(r.path for r in exact) == sorted(paths)
        fs.stats.reset()
        d.filter("a > 3").explain()
        repr(d.filter("a > 3"))
        assert fs.stats.bytes_read == 0  # nothing read after planning, whatever the setting


def test_truncated_parquet_is_a_typed_error(tmp_path):
    path = str(tmp_path / "truncated.parquet")
    pq.write_table(table(), path)
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])
    result = risky_calls(path)
    assert result["repr"]["ok"]
    for name in ("describe", "explain", "to_arrow", "count"):
        assert not result[name]["ok"] and result[name]["corrupt"], (name, result[name])
        assert "truncated.parquet" in result[name]["text"]


def test_good_file_beside_damaged_one_reads_when_selected_alone(tmp_path):
    """The check is per file: a good shard in the same folder still reads on its own (as
    pyarrow reads it), and the folder describes itself, naming the damaged shard."""
    good = str(tmp_path / "good.parquet")
    pq.write_table(table(), good)
    write_damaged_type(str(tmp_path / "zz_damaged.parquet"))
    result = run_isolated(f"""
        import json
        import arrowload as al
        good = al.dataset({good!r}).to_arrow().to_pydict()
        both = al.dataset({str(tmp_path)!r}).select("a")
        described = dict(both.describe().select("column", "source").rows())
        try:
            both.to_arrow()
            error = None
        except al.CorruptFileError as exc:
            error = str(exc)
        print(json.dumps({{"good": good, "described": described, "error": error}}))
    """)
    assert result["good"] == pq.read_table(good).to_pydict()
    assert result["described"]["a"].startswith("footer unreadable")
    assert result["error"] is not None and "zz_damaged.parquet" in result["error"]


# ---------------------------------------------------------------------------
# Arrow IPC streams and Hugging Face save_to_disk folders


def _hf_table(start: int, n: int) -> pa.Table:
    ids = list(range(start, start + n))
    return pa.table({"id": pa.array(ids, pa.int64()), "text": [f"row {i}" for i in ids],
                     "label": pa.array([i % 3 for i in ids], pa.int64()),
                     "emb": pa.array([[float(i), float(-i)] for i in ids], pa.list_(pa.float32(), 2))})


def write_hf_folder(folder) -> list[str]:
    """The layout ``datasets.Dataset.save_to_disk`` writes: IPC *stream* shards named
    ``data-0000k-of-0000n.arrow`` beside ``dataset_info.json`` and ``state.json``."""
    os.makedirs(folder, exist_ok=True)
    paths = []
    for k, (start, n) in enumerate([(0, 700), (700, 500)]):
        path = os.path.join(folder, f"data-{k:05d}-of-00002.arrow")
        t = _hf_table(start, n)
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, t.schema) as w:
            for batch in t.to_batches(max_chunksize=256):
                w.write_batch(batch)
        paths.append(path)
    with open(os.path.join(folder, "dataset_info.json"), "w") as f:
        json.dump({"citation": "", "description": "", "features": {"id": {"dtype": "int64"}}}, f, indent=2)
    with open(os.path.join(folder, "state.json"), "w") as f:
        json.dump({"_data_files": [{"filename": os.path.basename(p)} for p in paths],
                   "_fingerprint": "abc", "_format_type": None}, f, indent=2)
    return paths


def _read_streams(paths) -> pa.Table:
    return pa.concat_tables(pa.ipc.open_stream(p).read_all() for p in paths)


def test_hugging_face_save_to_disk_folder_reads_like_pyarrow(tmp_path, assert_tables_equal):
    folder = str(tmp_path / "hf")
    paths = write_hf_folder(folder)
    truth = _read_streams(paths)
    d = al.dataset(folder)
    assert d.schema == truth.schema
    assert d.count() == truth.num_rows
    assert_tables_equal(d.to_arrow(), truth)
    assert d.head(5).equals(truth.slice(0, 5))
    import pyarrow.compute as pc
    assert_tables_equal(d.filter("label = 1 AND id > 600").to_arrow(),
                        truth.filter(pc.and_(pc.equal(truth["label"], 1), pc.greater(truth["id"], 600))))
    assert d.filter("label = 2").count() == pc.sum(pc.equal(truth["label"], 2)).as_py()
    seen = []
    with d.loader(128, shuffle=True, seed=1) as loader:
        for batch in loader:
            seen.extend(batch["id"].tolist())
            assert batch["emb"].shape[1:] == (2,)
    assert sorted(seen) == truth.column("id").to_pylist()
    assert "2 files" in repr(d) and "1,200 rows" in repr(d)


def test_single_ipc_stream_file_and_a_mix_with_ipc_files(tmp_path, assert_tables_equal):
    stream_path = str(tmp_path / "a.arrow")
    t = _hf_table(0, 300)
    with pa.OSFile(stream_path, "wb") as sink, pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    assert_tables_equal(al.dataset(stream_path).to_arrow(), pa.ipc.open_stream(stream_path).read_all())
    file_path = str(tmp_path / "b.arrow")
    u = _hf_table(300, 200)
    with pa.OSFile(file_path, "wb") as sink, pa.ipc.new_file(sink, u.schema) as w:
        w.write_table(u)
    both = al.dataset(str(tmp_path))
    assert both.count() == 500
    assert_tables_equal(both.to_arrow(), pa.concat_tables([t, pa.ipc.open_file(file_path).read_all()]))
    # ".arrows", the extension Arrow recommends for the stream format, is found by a folder
    os.makedirs(tmp_path / "streams")
    os.replace(stream_path, tmp_path / "streams" / "a.arrows")
    assert_tables_equal(al.dataset(str(tmp_path / "streams")).to_arrow(), t)


def test_ipc_stream_on_a_remote_filesystem(tmp_path, assert_tables_equal):
    """Through an fsspec filesystem (memory://): rows unknown until read, same result."""
    import fsspec
    fs = fsspec.filesystem("memory")
    t = _hf_table(0, 400)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    fs.pipe("/hfremote/data-00000-of-00001.arrow", sink.getvalue().to_pybytes())
    fs.pipe("/hfremote/state.json", b'{"_fingerprint": "x"}')
    d = al.dataset("memory://hfremote")
    assert d.count() == 400
    assert_tables_equal(d.to_arrow(), t)


# ---------------------------------------------------------------------------
# integrity: page checksums, snapshot identity


def write_corrupt_page(path: str) -> int:
    """A file written with page checksums whose one data page has a flipped bit (the
    footer intact); returns the row whose value the flip changed."""
    values = pa.array(range(1000, 2000), pa.int64())
    pq.write_table(pa.table({"x": values}), path, compression="none", use_dictionary=False,
                   write_statistics=False, write_page_checksum=True)
    data = bytearray(open(path, "rb").read())
    at = data.find((1500).to_bytes(8, "little", signed=True))
    assert at > 0 and data.count((1500).to_bytes(8, "little", signed=True)) == 1
    data[at] ^= 0x01
    open(path, "wb").write(bytes(data))
    return 500


def test_corrupt_page_raises_with_page_checksums(tmp_path, assert_tables_equal):
    path = str(tmp_path / "bitrot.parquet")
    row = write_corrupt_page(path)
    # the truth: without verification the flip is silent, with it pyarrow refuses the page
    assert pq.read_table(path).column("x")[row].as_py() == 1501
    with pytest.raises(OSError, match="CRC"):
        pq.read_table(path, page_checksum_verification=True)
    checked = al.ScanOptions(page_checksums=True)
    for d in (al.dataset(path, options=al.Options(scan=checked)), al.dataset(path).with_options(scan=checked)):
        for call in (lambda: d.to_arrow(), lambda: d.filter("x > 1200").to_arrow(),
                     lambda: d.filter("x > 1200").count(), lambda: list(d.loader(100)),
                     lambda: d.head(600)):
            with pytest.raises(al.CorruptFileError, match="bitrot.parquet") as info:
                call()
            assert "checksum" in str(info.value).lower()
    # SQL that DuckDB runs itself (aggregate, self-join) reads the table inside DuckDB: the
    # failure is still the file's, not the query's
    d = al.dataset(path, options=al.Options(scan=checked))
    for query in ("SELECT count(*), sum(x) FROM t", "SELECT a.x FROM t a JOIN t b ON a.x = b.x"):
        with pytest.raises(al.CorruptFileError, match="bitrot.parquet") as info:
            al.sql(query, t=d).to_arrow()
        assert "checksum" in str(info.value).lower()
    # verification off: what pyarrow returns without it (the option is honoured both ways)
    off = al.dataset(path).with_options(scan=al.ScanOptions(page_checksums=False))
    assert off.to_arrow().equals(pq.read_table(path))
    # an intact file with checksums reads the same with verification on
    good = str(tmp_path / "good.parquet")
    pq.write_table(table(), good, write_page_checksum=True)
    assert_tables_equal(al.dataset(good, options=al.Options(scan=checked)).to_arrow(), pq.read_table(good), key="a")


def test_local_rewrite_with_same_size_and_mtime_is_detected(tmp_path):
    path = tmp_path / "part.parquet"
    pq.write_table(pa.table({"x": [1, 2, 3]}), path)
    d = al.dataset(str(tmp_path))
    src = d.plan.source
    before = src.fingerprint()
    st = os.stat(path)
    # a writer's usual rewrite: a new file renamed over the old one (a new inode), here with
    # the same size and the old modification time to the nanosecond
    tmp = tmp_path / "part.parquet.tmp"
    pq.write_table(pa.table({"x": [7, 8, 9]}), tmp)
    assert os.path.getsize(tmp) == st.st_size
    os.replace(tmp, path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == st.st_mtime_ns and os.stat(path).st_ino != st.st_ino
    assert src.changed_files() == [str(path)]
    assert al.dataset(str(tmp_path)).plan.source.fingerprint() != before
    # and an untouched lake is not reported as changed
    assert al.dataset(str(tmp_path)).plan.source.changed_files() == []


def test_a_local_file_rewritten_with_the_same_layout_is_not_read_with_stale_statistics(tmp_path):
    """An unpinned local dataset checks its files' sizes and modification times before each
    read (one batched stat): a file rewritten with the same size and row groups but other
    values was read with the footers of the old one, whose statistics pruned the row groups
    that now hold the rows (``id >= 95`` found nothing, and ``count()`` said 0)."""
    import numpy as np

    path = tmp_path / "part.parquet"

    def write(ids):
        pq.write_table(pa.table({"id": ids}), path, row_group_size=10, use_dictionary=False, compression="none")
    write(np.arange(100))
    ds = al.dataset(str(tmp_path))
    assert ds.filter("id >= 95").to_arrow()["id"].to_pylist() == [95, 96, 97, 98, 99]
    size, mtime = os.path.getsize(path), os.stat(path).st_mtime_ns
    write(np.arange(100)[::-1].copy())
    os.utime(path, ns=(mtime + 1_000_000_000, mtime + 1_000_000_000))  # a later write, whatever the clock's grain
    assert os.path.getsize(path) == size
    for read in (lambda d: d.to_arrow(), lambda d: d.count(), lambda d: d.head(3), lambda d: d.loader(8)):
        with pytest.raises(al.SnapshotChangedError) as got:
            read(ds.filter("id >= 95"))
        assert got.value.path == str(path)
    assert al.dataset(str(tmp_path)).filter("id >= 95").to_arrow()["id"].to_pylist() == [99, 98, 97, 96, 95]


def test_s3_rewrite_with_same_size_is_detected_by_etag(tmp_path):
    import s3fs
    from _support import moto_s3_server
    with moto_s3_server() as url:
        s3 = s3fs.S3FileSystem(endpoint_url=url, key="testing", secret="testing", skip_instance_cache=True)
        s3.mkdir("snapshots")
        first, second = pa.BufferOutputStream(), pa.BufferOutputStream()
        pq.write_table(pa.table({"x": [1, 2, 3]}), first)
        pq.write_table(pa.table({"x": [7, 8, 9]}), second)
        assert first.getvalue().size == second.getvalue().size
        s3.pipe("snapshots/lake/part.parquet", first.getvalue().to_pybytes())
        options = {"endpoint_url": url, "key": "testing", "secret": "testing"}
        d = al.dataset("s3://snapshots/lake", storage_options=options)
        src = d.plan.source
        before = src.fingerprint()
        assert src.changed_files() == []
        s3.pipe("snapshots/lake/part.parquet", second.getvalue().to_pybytes())
        assert src.changed_files() == ["snapshots/lake/part.parquet"]
        assert al.dataset("s3://snapshots/lake", storage_options=options).plan.source.fingerprint() != before


# ---------------------------------------------------------------------------
# types and writers pyarrow reads


def test_duplicate_field_names_are_an_error_only_where_ambiguous(tmp_path):
    path = str(tmp_path / "dup.parquet")
    dup = pa.Table.from_arrays([pa.array([1, 2, 3]), pa.array([4, 5, 6]), pa.array([7, 8, 9])],
                               names=["x", "x", "y"])
    pq.write_table(dup, path)
    truth = pq.ParquetFile(path).read()  # pyarrow's file reader keeps both x columns
    d = al.dataset(path)
    assert d.schema.names == truth.schema.names
    assert d.count() == truth.num_rows
    assert d.select("y").to_arrow().column("y").equals(truth.column(2))
    assert d.filter("y > 7").select("y").to_arrow().column("y").to_pylist() == [8, 9]
    assert [b["y"].tolist() for b in d.select("y").loader(3)] == [[7, 8, 9]]
    described = d.describe().select("column", "max").rows()
    assert described[-1] == ("y", "9") and [c for c, _ in described] == ["x", "x", "y"]
    assert "x: int64, x: int64, y: int64" in repr(d)
    for call in (d.to_arrow, lambda: d.head(1), lambda: list(d.loader(2))):
        with pytest.raises(al.AmbiguousColumnError) as info:
            call()
        assert isinstance(info.value, KeyError) and info.value.column == "x"
        assert "dup.parquet" in str(info.value) and "'y'" in str(info.value)
    # naming the shared name is refused when the selection is built, whatever the spelling
    import polars as pl
    import pyarrow.compute as pc
    for build in (lambda: d.select("x"), lambda: d.select(z="x + 1"), lambda: d.filter("x > 1"),
                  lambda: d.filter(pc.field("x") > 1), lambda: d.filter(pl.col("x") > 1),
                  lambda: d.filter("y > 7").select("y", "x"), lambda: d.map(lambda b: b, columns=["x"])):
        with pytest.raises(al.AmbiguousColumnError) as info:
            build()
        assert isinstance(info.value, KeyError) and info.value.column == "x"
        assert "dup.parquet" in str(info.value) and "'x'" in str(info.value) and "'y'" in str(info.value)
    # the other columns keep working, computed ones included
    assert d.select(z="y * 2").to_arrow().column("z").to_pylist() == \
        pc.multiply(truth.column(2), 2).to_pylist()
    assert "schema unavailable" not in repr(d.select("y"))


def test_float16_describes_numbers_and_converts_to_float16(tmp_path):
    import numpy as np
    import pyarrow.compute as pc
    values = np.array([1.5, -2.25, 65504.0, 0.0009765625, 3.0], dtype=np.float16)
    path = str(tmp_path / "half.parquet")
    pq.write_table(pa.table({"h": pa.array(values)}), path)
    truth = pq.read_table(path).column("h")
    lo_hi = pc.min_max(truth.cast(pa.float32())).as_py()
    d = al.dataset(path)
    for exact in (False, True):
        row = dict(zip(("min", "max"), d.describe(exact=exact).select("min", "max").row(0)))
        assert float(row["min"]) == lo_hi["min"] and float(row["max"]) == lo_hi["max"], (exact, row)
    batch = next(iter(d.loader(5)))
    assert batch["h"].dtype == np.float16 and batch["h"].tolist() == truth.to_numpy().tolist()


def test_structs_of_timestamps_past_python_datetime(tmp_path):
    import numpy as np
    far = 253402300800000000 * 10  # microseconds: year 82269, past datetime.MAXYEAR
    st = pa.array([{"t": far, "d": 10}, None, {"t": -far, "d": None}],
                  pa.struct([("t", pa.timestamp("us")), ("d", pa.date32())]))
    path = str(tmp_path / "far.parquet")
    pq.write_table(pa.table({"st": st, "t2": pa.array([far, 0, None], pa.timestamp("us"))}), path)
    truth = pq.read_table(path)
    with pytest.raises(OverflowError):  # why: Python's datetime cannot hold these
        truth.column("st").to_pylist()
    d = al.dataset(path)
    got = next(iter(d.select("st").loader(3)))["st"]
    raw_t = truth.column("st").combine_chunks().field("t").view(pa.int64()).to_pylist()
    assert got[1] is None
    assert [np.datetime64(r["t"]).astype("datetime64[us]").astype(np.int64) for r in (got[0], got[2])] == \
        [raw_t[0], raw_t[2]]
    assert got[0]["d"] == np.datetime64(10, "D") and got[2]["d"] is None
    for exact in (False, True):
        row = d.describe(exact=exact).filter(__import__("polars").col("column") == "t2").row(0, named=True)
        assert row["max"].startswith("82269-"), (exact, row)
    assert d.head(3).equals(truth)


def test_interval_uuid_json_and_view_types_read_as_pyarrow_reads_them(tmp_path, assert_tables_equal):
    import uuid
    ids = pa.array([1, 2, 3])
    uuids = [uuid.UUID(int=i * 7919) for i in range(3)]
    ipc_table = pa.table({
        "id": ids,
        "iv": pa.array([pa.MonthDayNano([1, 2, 3]), None, pa.MonthDayNano([-1, 0, 5])],
                       pa.month_day_nano_interval()),
        "sv": pa.array(["a", None, "ccc"], pa.string_view()),
        "bv": pa.array([b"a", b"", None], pa.binary_view()),
        "u": pa.array([u.bytes for u in uuids], pa.uuid()),
    })
    ipc_path = str(tmp_path / "types.arrow")
    with pa.OSFile(ipc_path, "wb") as sink, pa.ipc.new_file(sink, ipc_table.schema) as w:
        w.write_table(ipc_table)
    truth = pa.ipc.open_file(ipc_path).read_all()
    d = al.dataset(ipc_path)
    assert d.schema == truth.schema
    assert d.to_arrow().equals(truth)
    batch = next(iter(d.loader(3)))
    assert batch["iv"] == truth.column("iv").to_pylist()
    assert batch["u"] == uuids
    parquet_table = pa.table({"id": ids, "u": ipc_table["u"],
                              "j": pa.array(['{"a": 1}', None, "[]"], pa.json_(pa.string())),
                              "sv": ipc_table["sv"]})
    pq_path = str(tmp_path / "types.parquet")
    pq.write_table(parquet_table, pq_path)
    truth = pq.read_table(pq_path)
    d = al.dataset(pq_path)
    assert d.schema == truth.schema
    assert isinstance(d.schema.field("u").type, pa.UuidType)
    assert d.to_arrow().equals(truth)
    assert d.describe().height == 4


@pytest.mark.parametrize("type_", [
    pa.month_day_nano_interval(), pa.struct([("a", pa.month_day_nano_interval())]),
    pa.list_(pa.month_day_nano_interval()), pa.decimal256(40, 2), pa.list_view(pa.int32()),
    pa.dense_union([pa.field("a", pa.int32())])], ids=str)
def test_to_polars_refuses_types_polars_cannot_import(tmp_path, type_):
    import polars as pl
    t = pa.table({"id": [1, 2], "odd": pa.nulls(2, type_)})
    path = str(tmp_path / "odd.arrow")
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, t.schema) as w:
        w.write_table(t)
    # the truth: polars itself refuses the column (some of these it does not raise for, it
    # panics: a BaseException)
    with pytest.raises(BaseException):
        pl.from_arrow(pa.table({"odd": t.column("odd")}))
    d = al.dataset(path)
    with pytest.raises(al.UnsupportedError) as info:
        d.to_polars()
    assert isinstance(info.value, NotImplementedError)
    msg = str(info.value)
    assert "'odd'" in msg and str(type_) in msg and "odd.arrow" in msg and ".select('id')" in msg
    # the ways out the message names work
    assert d.select("id").to_polars().to_arrow().column("id").to_pylist() == [1, 2]
    assert d.to_arrow().equals(pa.ipc.open_file(path).read_all())


def test_to_polars_of_an_interval_cast_in_sql_and_cli_head(tmp_path):
    import contextlib
    import io

    import duckdb

    from arrowload import cli
    t = pa.table({"id": [1, 2], "iv": pa.array([pa.MonthDayNano([1, 2, 0]), None],
                                                pa.month_day_nano_interval())})
    path = str(tmp_path / "iv.arrow")
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, t.schema) as w:
        w.write_table(t)
    cast = al.dataset(path).select(iv="CAST(iv AS VARCHAR)").to_polars()
    con = duckdb.connect()
    con.register("t", pa.ipc.open_file(path).read_all())
    truth = con.sql("SELECT CAST(iv AS VARCHAR) AS iv FROM t").fetchall()
    assert cast.rows() == truth
    # the CLI shows the rows (it raised polars' ComputeError as an unexpected error)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["head", path]) == 0
    assert "MonthDayNano(months=1, days=2" in out.getvalue()


@pytest.mark.filterwarnings("ignore::polars.exceptions.PolarsInefficientMapWarning")
def test_polars_expressions_leave_the_other_columns_alone(tmp_path):
    """A polars filter or computed column reads only its own columns: the others (an
    interval polars cannot import, a UUID it would turn into binary) keep their values and
    types; one naming an unimportable column is refused when built."""
    import polars as pl
    import pyarrow.compute as pc
    t = pa.table({"id": [1, 2, 3],
                  "iv": pa.array([pa.MonthDayNano([1, 2, 3]), None, pa.MonthDayNano([0, 0, 9])],
                                 pa.month_day_nano_interval()),
                  "u": pa.array([bytes([i]) * 16 for i in range(3)], pa.uuid())})
    path = str(tmp_path / "mixed.arrow")
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, t.schema) as w:
        w.write_table(t)
    truth = pa.ipc.open_file(path).read_all()
    d = al.dataset(path)
    # map_elements: no SQL translation, so polars evaluates it
    odd = pl.col("id").map_elements(lambda v: v % 2 == 1, return_dtype=pl.Boolean)
    assert d.filter(odd).to_arrow().equals(truth.filter(pc.equal(pc.bit_wise_and(truth["id"], 1), 1)))
    assert d.filter(pl.col("id").sum() > 0).to_arrow().equals(truth)  # a scalar broadcasts
    got = d.select("u", z=pl.col("id").cum_sum()).to_arrow()
    assert got.column("u").equals(truth.column("u")) and got.column("z").to_pylist() == [1, 3, 6]
    with pytest.raises(al.UnsupportedError, match="'iv'"):
        d.filter(pl.col("iv").map_elements(lambda v: v is None, return_dtype=pl.Boolean))
    with pytest.raises(al.ExpressionError, match="not booleans"):
        d.filter(pl.col("id").cum_sum()).to_arrow()


def test_invalid_utf8_path_in_column_metadata(tmp_path):
    """A column chunk whose ``path_in_schema`` is not UTF-8 (one byte of it rewritten; the
    schema's own name intact): pyarrow reads the file; footers, describe and explain must
    too (describe raised UnicodeDecodeError)."""
    path = str(tmp_path / "badpath.parquet")
    pq.write_table(pa.table({"abcdef": [1, 2, 3], "other": [4.0, 5.0, 6.0]}), path, compression="none")
    data = bytearray(open(path, "rb").read())
    at = data.rfind(b"abcdef", 0, len(data) - 8)  # the last one: the column chunk's path_in_schema
    data[at] = 0xFF
    open(path, "wb").write(bytes(data))
    with pytest.raises(UnicodeDecodeError):  # why: the chunk's path is not UTF-8
        pq.read_metadata(path).row_group(0).column(0).path_in_schema
    truth = pq.read_table(path)
    d = al.dataset(path)
    assert d.to_arrow().equals(truth)
    rows = {r[0]: r for r in d.describe().select("column", "min", "max", "compressed_bytes").rows()}
    assert rows["abcdef"][1:3] == ("1", "3") and rows["other"][1:3] == ("4.0", "6.0")
    assert rows["abcdef"][3] > 0
    assert "~? of ?" not in d.select("abcdef").explain()


def _writers_table():
    import datetime as dt
    return pa.table({
        "id": pa.array(range(6), pa.int64()),
        "f": pa.array([0.5, None, 3.25, -1.0, 2.0, 1e300]),
        "s": ["a", None, "", "d%_\\", "ü", "f"],
        "ts": pa.array([dt.datetime(2020, 1, 1), None, dt.datetime(1969, 12, 31, 23, 59),
                        dt.datetime(2038, 1, 19), dt.datetime(2000, 2, 29), dt.datetime(1900, 1, 1)],
                       pa.timestamp("us")),
        "l": pa.array([[1, 2], [], None, [3], [4, 5, 6], [7]], pa.list_(pa.int64())),
        "b": [True, False, None, True, True, False],
    })


@pytest.mark.parametrize("writer", ["pyarrow", "polars", "duckdb", "pandas"])
def test_files_written_by_other_libraries(tmp_path, writer, assert_tables_equal):
    t = _writers_table()
    path = str(tmp_path / f"{writer}.parquet")
    if writer == "pyarrow":
        pq.write_table(t, path)
    elif writer == "polars":
        import polars as pl
        pl.from_arrow(t).write_parquet(path)
    elif writer == "duckdb":
        import duckdb
        con = duckdb.connect()
        con.register("t", t)
        con.execute(f"COPY (SELECT * FROM t) TO '{path}' (FORMAT parquet)")
        con.close()
    else:
        t.to_pandas().to_parquet(path)
    truth = pq.read_table(path)
    d = al.dataset(path)
    got = d.to_arrow()
    assert got.schema.names == truth.schema.names
    assert_tables_equal(got, truth)
    assert d.count() == truth.num_rows
    assert d.describe().height == len(truth.schema.names)
    assert "Dataset" in repr(d) and "scan 0" in d.explain()


def test_not_null_columns_read_whole_and_in_part(tmp_path):
    """DuckDB's COPY writes a table's NOT NULL columns as REQUIRED, and pyarrow keeps the
    flag beside a nullable file: `select(...).head(n)` and `limit(n).to_arrow()` raised
    ArrowInvalid (the scan's projected schema said nullable, its batches not null)."""
    import duckdb
    con = duckdb.connect()
    con.execute("CREATE TABLE t (id BIGINT NOT NULL, s VARCHAR NOT NULL, f DOUBLE)")
    con.execute("INSERT INTO t SELECT i, 'v' || i, i / 2 FROM range(50) r(i)")
    con.execute(f"COPY t TO '{tmp_path / 'required.parquet'}' (FORMAT parquet)")
    pq.write_table(pa.table({"id": pa.array([50, None], pa.int64()), "s": ["w", None], "f": [1.0, None]}),
                   str(tmp_path / "optional.parquet"))
    assert not pq.read_schema(str(tmp_path / "required.parquet")).field("id").nullable
    key = str  # None beside numbers
    for path in (str(tmp_path / "required.parquet"), str(tmp_path)):
        every = sorted(con.execute(f"SELECT id, s FROM read_parquet('{path}')").fetchall(), key=key)
        small = sorted(con.execute(f"SELECT id, s FROM read_parquet('{path}') WHERE id < 7").fetchall(), key=key)
        d = al.dataset(path)
        for got, want in ((d.select("id", "s").head(100), every), (d.select("id", "s").limit(100).to_arrow(), every),
                          (d.select("s", "id").filter("id < 7").head(20).select(["id", "s"]), small),
                          (d.select(k="id", s="s").head(100).rename_columns(["id", "s"]), every),
                          (d.select("id", "s").head(3), None)):
            rows = list(zip(*got.to_pydict().values()))
            assert (sorted(rows, key=key) == want) if want is not None else (len(rows) == 3 and set(rows) <= set(every))


def test_hive_partitioned_ipc_streams(tmp_path, assert_tables_equal):
    """Stream files in hive folders: the partition column comes from the folder names, and
    a filter on it returns what pyarrow's hive reading of the same rows gives."""
    import pyarrow.compute as pc
    parts = []
    for k, country in enumerate(["DE", "US"]):
        folder = tmp_path / f"country={country}"
        folder.mkdir()
        t = _hf_table(k * 100, 100)
        with pa.OSFile(str(folder / "data-00000-of-00001.arrow"), "wb") as sink, \
                pa.ipc.new_stream(sink, t.schema) as w:
            w.write_table(t)
        parts.append(t.append_column("country", pa.array([country] * t.num_rows)))
    truth = pa.concat_tables(parts)
    d = al.dataset(str(tmp_path))
    assert_tables_equal(d.to_arrow(), truth)
    got = d.filter("country = 'US' AND label = 1").to_arrow()
    assert_tables_equal(got, truth.filter(pc.and_(pc.equal(truth["country"], "US"), pc.equal(truth["label"], 1))))
    assert d.filter("country = 'DE'").count() == 100


@pytest.mark.parametrize("decoder", [None, "pyarrow", "polars", "dataset", "polars-stream"])
def test_int96_timestamps_read_in_microseconds_as_duckdb_reads_them(tmp_path, monkeypatch, decoder):
    """Legacy INT96 timestamps (Spark, Hive, Impala) with the sentinels those write
    (9999-12-31, 0001-01-01): read in microseconds, as DuckDB reads them, by every decoder
    and loader path. pyarrow's default, nanoseconds, wrapped them (9999-12-31 read as
    1816-03-30) and a filter past 2262 found nothing."""
    import datetime as dt

    import duckdb
    import numpy as np

    if decoder is not None:
        monkeypatch.setenv("ARROWLOAD_DECODER", decoder)
    n = 4_000
    rng = np.random.default_rng(3)
    base = [dt.datetime(9999, 12, 31, 23, 59, 59, 999_999), dt.datetime(1, 1, 1), dt.datetime(2020, 5, 1, 12),
            dt.datetime(1677, 9, 21), dt.datetime(2262, 4, 12), None]
    values = [base[i] for i in rng.integers(0, len(base), n)]
    path = tmp_path / "int96.parquet"
    pq.write_table(pa.table({"id": np.arange(n), "t": pa.array(values, pa.timestamp("us")),
                             "x": rng.random(n).astype(np.float32)}),
                   path, use_deprecated_int96_timestamps=True, row_group_size=500)
    ds = al.dataset(str(path))
    assert ds.schema.field("t").type == pa.timestamp("us")
    con = duckdb.connect()

    def truth(where: str) -> list:
        return con.sql(f"SELECT id, t FROM read_parquet('{path}') WHERE {where} ORDER BY id").fetchall()
    for where in ("true", "t > TIMESTAMP '2100-01-01'", "t < TIMESTAMP '1600-01-01'", "t IS NULL",
                  "t = TIMESTAMP '2020-05-01 12:00:00'"):
        got = ds.filter(where).select("id", "t").to_arrow().sort_by("id")
        assert list(zip(got["id"].to_pylist(), got["t"].to_pylist())) == truth(where), where
        assert ds.filter(where).count() == len(truth(where))
    want = dict(truth("t IS NOT NULL"))
    for shuffle in (False, "block", "global"):
        with ds.filter("t IS NOT NULL").select("id", "t").loader(
                333, shuffle=shuffle, seed=1, output="numpy", cache_dir=str(tmp_path / "cache")) as loader:
            seen = {i: t for b in loader for i, t in zip(b["id"].tolist(), b["t"].tolist())}
        assert seen == want, shuffle


@pytest.mark.parametrize("decoder", [None, "pyarrow", "polars", "dataset", "polars-stream"])
def test_integers_past_2_53_unified_with_floats_round_as_in_duckdb(tmp_path, monkeypatch, decoder):
    """A column that is int64 in one file and double in another reads as double, as in
    DuckDB's union_by_name: integers past 2**53 round to the nearest double. pyarrow's
    checked cast refused them, and the read said the healthy file was "truncated or
    corrupt"."""
    import duckdb
    import numpy as np

    if decoder is not None:
        monkeypatch.setenv("ARROWLOAD_DECODER", decoder)
    big = np.array([1, 2**53 + 1, 2**62 + 12_345, -2**63, 7] * 400, np.int64)
    pq.write_table(pa.table({"x": big, "k": np.arange(2_000)}), str(tmp_path / "a.parquet"), row_group_size=300)
    pq.write_table(pa.table({"x": np.linspace(0, 1e18, 1_000), "k": np.arange(2_000, 3_000)}),
                   str(tmp_path / "b.parquet"), row_group_size=300)
    scan = f"read_parquet('{tmp_path}/*.parquet', union_by_name=true)"
    con = duckdb.connect()
    ds = al.dataset(str(tmp_path))
    assert ds.schema.field("x").type == pa.float64()
    for where in ("true", "x > 1e17", "x < 0", "x = 9007199254740992", "k > 2500"):
        want = con.sql(f"SELECT k, x FROM {scan} WHERE {where} ORDER BY k").fetchall()
        got = ds.filter(where).select("k", "x").to_arrow().sort_by("k")
        assert list(zip(got["k"].to_pylist(), got["x"].to_pylist())) == want, where
        assert ds.filter(where).count() == len(want), where
    want = dict(con.sql(f"SELECT k, x FROM {scan}").fetchall())
    for shuffle in (False, "block", "global"):
        with ds.loader(256, shuffle=shuffle, seed=1, cache_dir=str(tmp_path / "cache")) as loader:
            seen = {k: x for b in loader for k, x in zip(b["k"].tolist(), b["x"].tolist())}
        assert seen == want, shuffle


@pytest.mark.parametrize("decoder", [None, "pyarrow", "polars", "dataset"])
def test_integers_past_2_53_inside_structs_and_lists_round_as_in_duckdb(tmp_path, monkeypatch, decoder):
    """The same rule inside a struct or a list (int64 there in one file, double in another,
    e.g. polars' large list beside pyarrow's list): the values past 2**53 were refused as
    not fitting the unified type, where the top-level column rounds and DuckDB rounds both.
    Null structs, null lists, null elements and row groups (sliced children) kept; a
    timestamp in the same struct that does not fit the unified unit is still refused."""
    import datetime as dt

    import duckdb

    if decoder is not None:
        monkeypatch.setenv("ARROWLOAD_DECODER", decoder)
    big = 2**53 + 1
    st_int = pa.struct([("v", pa.int64()), ("w", pa.string())])
    n = 900
    vals = [None if i % 7 == 0 else {"v": None if i % 5 == 0 else big + i, "w": f"s{i % 3}"} for i in range(n)]
    lists = [None if i % 6 == 0 else [big, None, -2**62 - i][: i % 4] for i in range(n)]
    pq.write_table(pa.table({"k": pa.array(range(n), pa.int64()), "st": pa.array(vals, st_int),
                             "li": pa.array(lists, pa.list_(pa.int64()))}),
                   str(tmp_path / "a.parquet"), row_group_size=200)
    pq.write_table(pa.table({"k": pa.array([n, n + 1], pa.int64()),
                             "st": pa.array([{"v": 0.5, "w": "x"}, None], pa.struct([("v", pa.float64()), ("w", pa.string())])),
                             "li": pa.array([[0.25], None], pa.large_list(pa.float64()))}), str(tmp_path / "b.parquet"))
    ds = al.dataset(str(tmp_path))
    assert ds.schema.field("st").type == pa.struct([("v", pa.float64()), ("w", pa.string())])
    assert ds.schema.field("li").type == pa.large_list(pa.float64())
    scan = f"read_parquet('{tmp_path}/*.parquet', union_by_name=true)"
    con = duckdb.connect()
    for where in ("true", "st.v > 9.1e15", "len(li) = 2", "k > 850"):
        want = con.sql(f"SELECT k, st, li FROM {scan} WHERE {where} ORDER BY k").fetchall()
        got = ds.filter(where).select("k", "st", "li").to_arrow().sort_by("k")
        assert [(r["k"], r["st"], r["li"]) for r in got.to_pylist()] == want, where
    want = {k: (s, li) for k, s, li in con.sql(f"SELECT k, st, li FROM {scan}").fetchall()}
    for shuffle in (False, "block", "global"):
        with ds.loader(128, shuffle=shuffle, seed=1, output="arrow", cache_dir=str(tmp_path / "cache")) as loader:
            seen = {r["k"]: (r["st"], r["li"]) for b in loader for r in b.to_pylist()}
        assert seen == want, shuffle
    # a struct that also holds a timestamp past the ns range: still a SchemaMismatchError
    late = tmp_path / "late"
    late.mkdir()
    pq.write_table(pa.table({"st": pa.array([{"v": big, "t": dt.datetime(3000, 1, 1)}],
                                            pa.struct([("v", pa.int64()), ("t", pa.timestamp("ms"))]))}),
                   str(late / "a.parquet"))
    pq.write_table(pa.table({"st": pa.array([{"v": 0.5, "t": 1}], pa.struct([("v", pa.float64()), ("t", pa.timestamp("ns"))]))}),
                   str(late / "b.parquet"))
    with pytest.raises(al.SchemaMismatchError, match="timestamp"):
        al.dataset(str(late)).to_arrow()


def test_widening_a_sliced_list_with_nulls_keeps_every_row(tmp_path):
    """A row group larger than one scan batch (131,072 rows) reaches the widening as sliced
    arrays: a list<int64> with null lists beside list<double> (and polars' large lists)
    raised "values do not fit" (pyarrow refuses a null mask beside sliced offsets). Every
    row, as DuckDB reads it; the widening of slices checked alone against a plain cast."""
    import duckdb
    import polars as pl

    from arrowload.source.schema import widen
    n = 140_000
    vals = [None if i % 7 == 0 else [i, 2**53 + 1] for i in range(n)]
    pyarrow_lake, polars_lake = tmp_path / "pa", tmp_path / "pl"
    pyarrow_lake.mkdir(), polars_lake.mkdir()
    pq.write_table(pa.table({"v": pa.array(vals, pa.list_(pa.int64()))}), str(pyarrow_lake / "a.parquet"))
    pq.write_table(pa.table({"v": pa.array([[0.5]], pa.list_(pa.float64()))}), str(pyarrow_lake / "b.parquet"))
    pl.DataFrame({"v": vals}, schema={"v": pl.List(pl.Int64)}).write_parquet(polars_lake / "a.parquet")
    pl.DataFrame({"v": [[0.5]]}, schema={"v": pl.List(pl.Float64)}).write_parquet(polars_lake / "b.parquet")
    for lake in (pyarrow_lake, polars_lake):
        want = duckdb.sql(f"SELECT v FROM read_parquet('{lake}/*.parquet', union_by_name=true)").fetchall()
        got = al.dataset(str(lake)).to_arrow().column("v").to_pylist()
        assert len(got) == n + 1 and sum(v is None for v in got) == n // 7
        assert sorted(got, key=repr) == sorted((v for (v,) in want), key=repr), lake
    for unified, kind in ((pa.list_(pa.float64()), pa.list_), (pa.large_list(pa.float64()), pa.large_list)):
        arr = pa.array([[1], None, [2, 3], [], None, [2**53 + 1]], kind(pa.int64()))
        for lo, size in ((1, 5), (2, 3), (3, 2), (0, 6), (4, 0)):
            part = arr.slice(lo, size)
            assert widen(part, unified).to_pylist() == part.cast(unified, safe=False).to_pylist(), (unified, lo, size)
            chunked = pa.chunked_array([arr.slice(0, 2), part], type=arr.type)
            assert widen(chunked, unified).to_pylist() == chunked.cast(unified, safe=False).to_pylist()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ints=st.lists(st.integers(-2**63, 2**63 - 1), min_size=1, max_size=30),
       floats=st.lists(st.floats(allow_nan=False, width=64), min_size=1, max_size=30),
       cut=st.floats(-1e19, 1e19, allow_nan=False, allow_infinity=False))
def test_generated_int64_and_double_shards_read_as_duckdb_reads_them(tmp_path_factory, ints, floats, cut):
    """Any int64 values beside any doubles: the doubles and the filter counts DuckDB's
    union_by_name gives (integers past 2**53 rounded to the nearest double)."""
    import duckdb
    root = tmp_path_factory.mktemp("int-float")
    pq.write_table(pa.table({"k": pa.array(range(len(ints)), pa.int64()), "x": pa.array(ints, pa.int64())}),
                   str(root / "a.parquet"))
    pq.write_table(pa.table({"k": pa.array(range(100, 100 + len(floats)), pa.int64()), "x": floats}),
                   str(root / "b.parquet"))
    scan = f"read_parquet('{root}/*.parquet', union_by_name=true)"
    with duckdb.connect() as con:
        want = con.sql(f"SELECT k, x FROM {scan} ORDER BY k").fetchall()
        above = con.sql(f"SELECT count(*) FROM {scan} WHERE x > {cut!r}").fetchall()[0][0]
    ds = al.dataset(str(root))
    got = ds.to_arrow().sort_by("k")
    assert list(zip(got["k"].to_pylist(), got["x"].to_pylist())) == want
    assert ds.filter(f"x > {cut!r}").count() == above



@pytest.mark.parametrize("shuffle", [False, "block", "global", "global-spilled"])
def test_view_typed_columns_in_every_shuffle_and_mixture(tmp_path, shuffle):
    """string_view / binary_view columns (and lists of them): pyarrow has no take kernel for
    them, so every shuffle's gather raised ArrowNotImplementedError. Rows and types as
    pyarrow reads the file, in every shuffle and in a mixture."""
    n = 300
    table = pa.table({"id": pa.array(range(n), pa.int64()),
                      "s": pa.array([None if i % 7 == 0 else f"v{i}" * (i % 5) for i in range(n)], pa.string_view()),
                      "b": pa.array([str(i).encode() for i in range(n)], pa.binary_view()),
                      "l": pa.array([[f"x{i}", "y"] for i in range(n)], pa.list_(pa.string_view()))})
    path = str(tmp_path / "views.parquet")
    pq.write_table(table, path, row_group_size=40)
    truth = pq.read_table(path)
    assert truth.schema.field("s").type == pa.string_view()
    by_id = {r["id"]: r for r in truth.to_pylist()}
    kind = "global" if shuffle == "global-spilled" else shuffle
    extra = {"memory_budget": 1} if shuffle == "global-spilled" else {}
    d = al.dataset(path).filter("id % 3 <> 1")
    want = sorted(i for i in range(n) if i % 3 != 1)
    loader = d.loader(16, shuffle=kind, seed=4, output="arrow", cache_dir=str(tmp_path / "cache"), **extra)
    rows = [r for b in loader for r in b.to_pylist()]
    assert sorted(r["id"] for r in rows) == want and all(r == by_id[r["id"]] for r in rows)
    assert next(iter(loader)).schema == truth.schema
    if shuffle in (False, "global"):
        m = al.mix({"a": d.filter("id < 150"), "b": d.filter("id >= 150")}, weights={"a": 1, "b": 1},
                   cache_dir=str(tmp_path / "cache"))
        rows = [r for b in m.loader(16, shuffle=kind, output="arrow") for r in b.to_pylist()]
        assert rows and all(r == by_id[r["id"]] for r in rows) and len({r["id"] for r in rows}) == len(rows)


def test_polars_ipc_files_shuffle_globally(tmp_path):
    """polars writes Arrow IPC files with string_view columns: a global shuffle of such a lake
    (a random-access source read in place) raised ArrowNotImplementedError."""
    import polars as pl
    for k in range(2):
        pl.DataFrame({"id": range(k * 500, (k + 1) * 500),
                      "s": [f"v{i}" for i in range(k * 500, (k + 1) * 500)]}).write_ipc(str(tmp_path / f"p{k}.arrow"))
    d = al.dataset(str(tmp_path))
    assert d.schema.field("s").type == pa.string_view()
    rows = [r for b in d.loader(64, shuffle="global", seed=1, output="arrow") for r in b.to_pylist()]
    assert sorted(r["id"] for r in rows) == list(range(1000)) and all(r["s"] == f"v{r['id']}" for r in rows)
    assert [r["id"] for r in rows] != list(range(1000))


def test_rare_arrow_types_in_shuffles_maps_caches_and_pandas(tmp_path):
    """Types pyarrow reads but has no take / empty-array / Parquet-writer support for:
    run-end encoded columns, maps of string views, dictionaries of string views (polars'
    categoricals through write_ipc), lists of string views. Shuffles, map(), al.sql,
    cache() and to_pandas() raised bare pyarrow errors; now they give the values pyarrow
    reads (checked by id), or a typed error naming what to do."""
    import pyarrow.compute as pc
    n = 40
    table = pa.table({
        "id": pa.array(range(n), pa.int64()),
        "r": pc.run_end_encode(pa.array([i // 7 for i in range(n)], pa.int64())),
        "m": pa.array([[("k", f"v{i}")] for i in range(n)], pa.map_(pa.string(), pa.string_view())),
        "d": pa.array([f"c{i % 3}" for i in range(n)], pa.string_view()).dictionary_encode(),
        "l": pa.array([[f"x{i}"] for i in range(n)], pa.list_(pa.string_view())),
    })
    path = str(tmp_path / "rare.arrow")
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    truth = {r["id"]: r for r in pa.ipc.open_file(path).read_all().to_pylist()}
    for d in (al.dataset(path), al.dataset(table)):
        for shuffle in (False, "block", "global"):
            batches = list(d.loader(6, shuffle=shuffle, seed=2, output="arrow", cache_dir=str(tmp_path / "c")))
            rows = [r for b in batches for r in b.to_pylist()]
            assert sorted(r["id"] for r in rows) == list(range(n)) and all(r == truth[r["id"]] for r in rows)
            assert batches[0].schema == table.schema
        assert d.map(lambda b: b, name="same").to_arrow().to_pylist() == table.to_pylist()
        assert al.sql("SELECT id, r FROM t ORDER BY id DESC LIMIT 3", t=d.select("id", "r")).to_arrow()["r"].to_pylist() \
            == [5, 5, 5]
        frame = d.select("id", "l").to_pandas()
        assert [list(v) for v in frame["l"]] == [[f"x{i}"] for i in range(n)]
    with pytest.raises(al.SchemaMismatchError, match=r"format='ipc'"):
        al.dataset(path).cache(str(tmp_path / "plans")).to_arrow()
    assert al.dataset(path).cache(str(tmp_path / "plans"), format="ipc").to_arrow().to_pylist() == table.to_pylist()
    nested = pa.table({"id": [0, 1], "s": pa.StructArray.from_arrays([pc.run_end_encode(pa.array([1, 2]))], names=["x"])})
    with pytest.raises(al.UnsupportedError, match="column 's'"):
        list(al.dataset(nested).loader(1, shuffle="global", output="arrow"))


def test_polars_expression_errors_are_expression_errors():
    """A polars expression polars refuses over the columns' types raised polars' own
    exception; every error is an al.ArrowloadError."""
    import polars as pl
    d = al.dataset(pa.table({"id": [1, 2], "l": [[1, 2], [3]]}))
    with pytest.raises(pl.exceptions.PolarsError):
        pl.from_arrow(d.to_arrow()).filter(pl.col("l").cast(pl.String).str.len_chars() > 3)
    with pytest.raises(al.ExpressionError, match="polars expression"):
        d.filter(pl.col("l").cast(pl.String).str.len_chars() > 3).to_arrow()


@pytest.mark.parametrize("decoder", [None, "pyarrow", "polars", "dataset", "polars-stream"])
def test_parquet_uuid_and_json_logical_types_read_as_pyarrow_reads_them(tmp_path, monkeypatch, decoder):
    """DuckDB writes UUID and JSON columns as Parquet logical types without a stored Arrow
    schema. pyarrow's readers give them as arrow.uuid / arrow.json; arrowload gave their
    storage types, so `CAST(u AS VARCHAR)` was 16 raw bytes where DuckDB and pyarrow give
    the UUID's text. Every decoder, filter, SQL and loader path now reads them as pyarrow."""
    import duckdb
    if decoder is not None:
        monkeypatch.setenv("ARROWLOAD_DECODER", decoder)
    path = str(tmp_path / "duck.parquet")
    con = duckdb.connect()
    con.execute(f"""COPY (SELECT i AS id, ('00000000-0000-0000-0000-' || lpad(i::VARCHAR, 12, '0'))::UUID AS u,
                     ('{{"k": ' || i || '}}')::JSON AS j FROM range(3000) r(i))
                    TO '{path}' (FORMAT parquet, ROW_GROUP_SIZE 500)""")
    truth = pq.read_table(path)
    assert isinstance(truth.schema.field("u").type, pa.UuidType)
    d = al.dataset(path)
    assert d.schema == truth.schema
    assert d.to_arrow().equals(truth)
    text = d.filter("id % 7 = 3").select("id", s="CAST(u AS VARCHAR)").to_arrow().sort_by("id")
    want = con.sql(f"SELECT id, CAST(u AS VARCHAR) AS s FROM read_parquet('{path}') WHERE id % 7 = 3 ORDER BY id")
    assert text.to_pylist() == want.to_arrow_table().to_pylist()
    q = "SELECT CAST(u AS VARCHAR) AS s, count(*) AS n FROM t WHERE id < 20 GROUP BY ALL ORDER BY s"
    assert al.sql(q, t=d).to_arrow().to_pylist() == \
        con.sql(q.replace("FROM t", f"FROM read_parquet('{path}')")).to_arrow_table().to_pylist()
    uuids = dict(zip(truth["id"].to_pylist(), truth["u"].to_pylist()))
    for shuffle in (False, "block", "global"):
        with d.loader(256, shuffle=shuffle, seed=1, output="arrow", cache_dir=str(tmp_path / "cache")) as loader:
            seen = {r["id"]: r["u"] for b in loader for r in b.to_pylist()}
        assert seen == uuids, shuffle
