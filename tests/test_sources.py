"""Every way of naming a source reads the same table that DuckDB or plain pyarrow reads
from the same files (or the same in-memory data).

Comparisons go through ``conftest.assert_tables_equal`` (sorted by ``id``; representation
only is normalised: list flavours, string flavours, timestamp units). Where a format's
readers legitimately infer different types, the test says so next to the comparison.
"""

from __future__ import annotations

import glob
import os
import pathlib
import shutil
import threading
import uuid
from functools import partial

import duckdb
import fsspec
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds
import pyarrow.fs as pafs
import pyarrow.ipc as ipc
import pyarrow.json as pajson
import pyarrow.parquet as pq
import pytest
from fsspec.implementations.local import LocalFileSystem
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import arrowload as al


def _files(lake: str, ext: str) -> list[str]:
    return sorted(glob.glob(os.path.join(lake, f"*.{ext}")))


def _sql_list(paths: list[str]) -> str:
    return "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in paths) + "]"


def _check(ds: al.Dataset, expected: pa.Table, assert_tables_equal) -> None:
    assert_tables_equal(ds.to_arrow(), expected)
    assert ds.count() == expected.num_rows
    assert ds.schema.names == expected.column_names


# ---------------------------------------------------------------------------
# ways to name Parquet files

SPELLINGS = {
    "dir": lambda lake: dict(source=lake),
    "dir-trailing-slash": lambda lake: dict(source=lake + os.sep),
    "pathlib": lambda lake: dict(source=pathlib.Path(lake)),
    "glob": lambda lake: dict(source=os.path.join(lake, "*.parquet")),
    "list": lambda lake: dict(source=_files(lake, "parquet")),
    "list-of-dirs-and-files": lambda lake: dict(source=[lake, _files(lake, "parquet")[0]]),
    "file-uri": lambda lake: dict(source=pathlib.Path(lake).as_uri()),
    "fsspec-local": lambda lake: dict(source=lake, filesystem=LocalFileSystem()),
    "fsspec-local-list": lambda lake: dict(source=_files(lake, "parquet"),
                                           filesystem=fsspec.filesystem("file")),
    "pyarrow-local": lambda lake: dict(source=lake, filesystem=pafs.LocalFileSystem()),
}


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_parquet_spellings_match_duckdb(parquet_lake, spelling, duck, parquet_scan,
                                        assert_tables_equal):
    kwargs = SPELLINGS[spelling](parquet_lake)
    ds = al.dataset(kwargs.pop("source"), **kwargs)
    expected = duck(f"SELECT * FROM {parquet_scan(parquet_lake)}")
    _check(ds, expected, assert_tables_equal)
    # source order: files sorted by path, then row groups: ids ascend in this lake
    assert ds.to_arrow().column("id").to_pylist() == list(range(expected.num_rows))


def test_single_file_matches_duckdb(parquet_lake, duck, assert_tables_equal):
    path = _files(parquet_lake, "parquet")[2]
    expected = duck(f"SELECT * FROM read_parquet({_sql_list([path])})")
    _check(al.dataset(path), expected, assert_tables_equal)
    assert al.dataset(path).to_arrow().column("id")[0].as_py() == 10_000  # shard 2 of 4


def test_a_folder_whose_name_holds_a_wildcard_is_read_as_itself(tmp_path):
    """``q[1]dir/`` matches nothing as a glob (its files lie deeper than the pattern): the
    folder of that name is read, and a Delta table there through its log (read as plain
    files it would show the rows a delete removed). It said "no files match the glob"."""
    from deltalake import DeltaTable, write_deltalake
    plain = tmp_path / "q[1]dir"
    plain.mkdir()
    pq.write_table(pa.table({"id": [1, 2, 3]}), str(plain / "a.parquet"))
    assert sorted(al.dataset(str(plain)).to_arrow()["id"].to_pylist()) == [1, 2, 3]
    assert sorted(al.dataset(str(plain) + "/").to_arrow()["id"].to_pylist()) == [1, 2, 3]
    table = str(tmp_path / "t?dir" / "tbl")
    write_deltalake(table, pa.table({"id": list(range(10))}))
    DeltaTable(table).delete("id < 4")
    ds = al.dataset(table)
    assert ds.snapshot_id.startswith("delta:")
    assert sorted(ds.to_arrow()["id"].to_pylist()) == sorted(DeltaTable(table).to_pyarrow_table()["id"].to_pylist())
    with pytest.raises(al.PathNotFoundError, match="no files match the glob"):
        al.dataset(str(tmp_path / "z?dir"))


def test_glob_subset_matches_duckdb(parquet_lake, duck, assert_tables_equal):
    pattern = os.path.join(parquet_lake, "part-0000[13].parquet")
    expected = duck(f"SELECT * FROM read_parquet({_sql_list([pattern])})")
    assert 0 < expected.num_rows < 20_000
    _check(al.dataset(pattern), expected, assert_tables_equal)


GLOB_FILES = {"a.parquet": 1, "b.parquet": 2, "sub/c.parquet": 3, "sub/deep/d.parquet": 4, "sub2/e.parquet": 5,
              "x/y/z/f.parquet": 6}
GLOB_HIDDEN = {"_temporary/0/g.parquet": 7, ".hidden/h.parquet": 8, "_x.parquet": 9, ".y.parquet": 10,
               "sub/_i.parquet": 11}


@pytest.mark.parametrize("pattern", ["*.parquet", "*/*.parquet", "**/*.parquet", "**", "sub/**", "*/*/*.parquet",
                                     "sub*/*.parquet", "su?/*.parquet", "[ab].parquet", "**/d.parquet",
                                     "x/**/f.parquet", "sub/*"])
def test_a_globs_wildcards_stay_within_a_folder(tmp_path, duck, pattern):
    """``*``, ``?`` and ``[...]`` match within one path component and ``**`` any number of
    folders, as in DuckDB's ``read_parquet`` (a ``*`` used to cross ``/``: ``dir/*.parquet``
    read the subfolders' files too). Hidden names (``.x``, ``_x``) match no wildcard, as a
    folder's listing skips them; named in the pattern, they are read."""
    for rel, i in {**GLOB_FILES, **GLOB_HIDDEN}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"id": [i]}), tmp_path / rel)
    got = sorted(al.dataset(str(tmp_path / pattern)).to_arrow()["id"].to_pylist())
    truth = sorted(duck(f"SELECT id FROM read_parquet('{tmp_path / pattern}')")["id"].to_pylist())
    assert got == [i for i in truth if i in GLOB_FILES.values()] and got, (pattern, truth)
    for named, ids in (("_temporary/*/*.parquet", [7]), (".hidden/*.parquet", [8]), ("_*.parquet", [9]),
                       ("sub/_*.parquet", [11])):
        assert al.dataset(str(tmp_path / named)).to_arrow()["id"].to_pylist() == ids, named


def test_list_of_paths_matches_duckdb(parquet_lake, duck, assert_tables_equal):
    files = _files(parquet_lake, "parquet")
    chosen = [files[3], files[0]]  # the order given does not matter: files sort by path
    expected = duck(f"SELECT * FROM read_parquet({_sql_list(chosen)})")
    ds = al.dataset(chosen)
    _check(ds, expected, assert_tables_equal)
    ids = ds.to_arrow().column("id").to_pylist()
    assert ids[0] == 0 and ids == sorted(ids)


def test_memory_filesystem(parquet_lake, hive_lake, duck, parquet_scan, assert_tables_equal):
    """``memory://`` URIs and an explicit fsspec MemoryFileSystem read the same bytes."""
    mem = fsspec.filesystem("memory")
    root = f"/arrowload-test-{uuid.uuid4().hex}"
    try:
        for lake, name in ((parquet_lake, "flat"), (hive_lake, "hive")):
            for path in glob.glob(os.path.join(lake, "**", "*.parquet"), recursive=True):
                rel = os.path.relpath(path, lake).replace(os.sep, "/")
                mem.pipe(f"{root}/{name}/{rel}", pathlib.Path(path).read_bytes())
        flat = duck(f"SELECT * FROM {parquet_scan(parquet_lake)}")
        _check(al.dataset(f"memory://{root}/flat"), flat, assert_tables_equal)
        _check(al.dataset(f"{root}/flat", filesystem=mem), flat, assert_tables_equal)
        _check(al.dataset(f"memory://{root}/flat/*.parquet"), flat, assert_tables_equal)
        hive = duck(f"SELECT * FROM {parquet_scan(hive_lake, hive=True)}")
        _check(al.dataset(f"memory://{root}/hive"), hive, assert_tables_equal)
        got = al.dataset(f"memory://{root}/hive").filter("country = 'DE' AND label = 1").to_arrow()
        assert_tables_equal(got, hive.filter(pc.and_(
            pc.equal(hive["country"], "DE"), pc.equal(hive["label"], 1))))
    finally:
        mem.rm(root, recursive=True)


# ---------------------------------------------------------------------------
# formats: Parquet, Arrow IPC / Feather, CSV, JSON lines


def test_ipc_matches_pyarrow_and_duckdb(ipc_lake, parquet_lake, duck, parquet_scan,
                                        assert_tables_equal):
    ds = al.dataset(ipc_lake)
    truth = pa.concat_tables(ipc.open_file(f).read_all() for f in _files(ipc_lake, "arrow"))
    _check(ds, truth, assert_tables_equal)
    assert ds.schema.equals(truth.schema.remove_metadata())  # fixed-size list stays fixed-size
    # the same rows DuckDB reads from the Parquet shards they were written from
    assert_tables_equal(ds.to_arrow(), duck(f"SELECT * FROM {parquet_scan(parquet_lake)}"))
    assert_tables_equal(ds.filter("price BETWEEN 0.05 AND 0.07 OR country IS NULL").to_arrow(),
                        duck(f"SELECT * FROM {parquet_scan(parquet_lake)} "
                             "WHERE price BETWEEN 0.05 AND 0.07 OR country IS NULL"))


@pytest.mark.parametrize("ext,fmt", [(".feather", None), (".ipc", None), (".bin", "feather"),
                                     (".dat", "arrow"), (".x", "ipc")])
def test_ipc_extensions_and_named_format(ipc_lake, tmp_path, ext, fmt, assert_tables_equal):
    for f in _files(ipc_lake, "arrow")[:2]:
        shutil.copy(f, tmp_path / (pathlib.Path(f).stem + ext))
    truth = pa.concat_tables(ipc.open_file(f).read_all() for f in _files(ipc_lake, "arrow")[:2])
    _check(al.dataset(str(tmp_path), format=fmt), truth, assert_tables_equal)


def test_csv_matches_duckdb(csv_lake, duck, assert_tables_equal):
    """Same types and values as DuckDB's CSV reader (timestamps in microseconds after
    normalisation); an empty field is NULL, also in the string ``country`` column."""
    expected = duck(f"SELECT * FROM read_csv({_sql_list([os.path.join(csv_lake, '*.csv')])})")
    ds = al.dataset(csv_lake)
    _check(ds, expected, assert_tables_equal)
    assert ds.to_arrow().column("country").null_count == expected.column("country").null_count > 0
    pred = "country IS NULL OR (price > 99.5 AND day = '2024-01-03')"
    assert_tables_equal(ds.filter(pred).to_arrow(), duck(
        f"SELECT * FROM read_csv({_sql_list([os.path.join(csv_lake, '*.csv')])}) WHERE {pred}"))


def test_csv_text_that_looks_like_a_null_marker_is_text(tmp_path, duck):
    """Only the empty field is NULL: "NA" (Namibia), "N/A", "null", "NULL" stay text and
    "nan" in a float column is a NaN, as DuckDB reads them. pyarrow's default null
    markers made them NULL: country = 'NA' found nothing, and f > 1 dropped the NaN."""
    path = tmp_path / "c.csv"
    path.write_text("id,country,f\n1,NA,nan\n2,US,2.5\n3,N/A,\n4,null,0.5\n5,NULL,NaN\n6,,3\n")
    ds = al.dataset(str(path))
    want = duck(f"SELECT id, country, f FROM read_csv('{path}') ORDER BY id")
    got = ds.to_arrow().sort_by("id")
    assert got.column("country").to_pylist() == want.column("country").to_pylist()
    assert [None if v is None else str(v) for v in got.column("f").to_pylist()] == \
        [None if v is None else str(v) for v in want.column("f").to_pylist()]
    for where in ("country = 'NA'", "country IS NULL", "f > 1", "f IS NULL", "isnan(f)"):
        n = duck(f"SELECT count(*) AS n FROM read_csv('{path}') WHERE {where}").column("n")[0].as_py()
        assert ds.filter(where).count() == n, where


_CSV_TEXT = ["NA", "N/A", "null", "NULL", "nan", "NaN", "#N/A", "None", "US", "a b", ""]
# (not "inf": DuckDB's sniffer types a column holding it VARCHAR, or DATE alone; pyarrow DOUBLE)
_CSV_FLOAT = ["nan", "NaN", "1.5", "-0.0", "", "2"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.sampled_from(_CSV_TEXT), st.sampled_from(_CSV_FLOAT)), min_size=1, max_size=12))
def test_csv_null_markers_and_special_floats_match_duckdb(tmp_path_factory, rows):
    """Generated CSV fields drawn from pyarrow's default null markers, NaNs and plain
    values: the rows and filter counts DuckDB's read_csv gives."""
    from hypothesis import assume
    assume(any(t in ("US", "a b", "NA", "N/A", "#N/A", "None") for t, _ in rows))  # a text column
    assume(any(f in ("1.5", "2", "-0.0") for _, f in rows))  # a number among the floats
    path = tmp_path_factory.mktemp("csv-markers") / "c.csv"
    path.write_text("id,t,f\n" + "".join(f"{i},{t},{f}\n" for i, (t, f) in enumerate(rows)))
    with duckdb.connect() as con:
        want = con.sql(f"SELECT id, t, f FROM read_csv('{path}') ORDER BY id").to_arrow_table()
        counts = {w: con.sql(f"SELECT count(*) FROM read_csv('{path}') WHERE {w}").fetchall()[0][0]
                  for w in ("t IS NULL", "t = 'NA'", "f > 1", "f IS NULL", "isnan(f)")}
    ds = al.dataset(str(path))
    got = ds.to_arrow().sort_by("id")
    assert got.column("t").to_pylist() == want.column("t").to_pylist()
    assert [None if v is None else str(v) for v in got.column("f").to_pylist()] == \
        [None if v is None else str(v) for v in want.column("f").to_pylist()]
    for where, n in counts.items():
        assert ds.filter(where).count() == n, where


@pytest.mark.parametrize("ext, body", [("csv", "id,s\n1,a\n2,b\n"),
                                       ("jsonl", '{"id": 1, "s": "a"}\n{"id": 2, "s": "b"}\n')])
def test_a_zero_byte_text_shard_is_left_out(tmp_path, duck, ext, body):
    """A zero-byte CSV / JSON lines shard beside good ones: the folder reads as DuckDB
    reads it (the empty file has no rows). pyarrow's dataset refused the whole folder."""
    (tmp_path / f"a.{ext}").write_text(body)
    (tmp_path / f"b.{ext}").write_text("")
    reader = "read_csv" if ext == "csv" else "read_json"
    want = duck(f"SELECT id, s FROM {reader}('{tmp_path}/*.{ext}') ORDER BY id")
    ds = al.dataset(str(tmp_path))
    assert ds.to_arrow().sort_by("id").to_pylist() == want.to_pylist()
    assert ds.filter("id > 1").count() == 1


def test_csv_named_format(csv_lake, tmp_path, duck, assert_tables_equal):
    for f in _files(csv_lake, "csv"):
        shutil.copy(f, tmp_path / (pathlib.Path(f).stem + ".txt"))
    expected = duck(f"SELECT * FROM read_csv({_sql_list([str(tmp_path / '*.txt')])})")
    _check(al.dataset(str(tmp_path), format="csv"), expected, assert_tables_equal)


def test_json_lines_matches_duckdb_and_pyarrow(json_lake, duck, assert_tables_equal):
    ds = al.dataset(json_lake)
    got = ds.to_arrow()
    truth = pa.concat_tables(pajson.read_json(f) for f in _files(json_lake, "jsonl"))
    _check(ds, truth, assert_tables_equal)
    expected = duck(f"SELECT * FROM read_json({_sql_list([os.path.join(json_lake, '*.jsonl')])})")
    # Known difference, left as pyarrow infers it: an ISO date string ("2024-01-02") is a
    # timestamp[s] at midnight for pyarrow's JSON reader, a DATE for DuckDB's. Every other
    # column has DuckDB's type; all values are equal.
    assert got.schema.field("day").type == pa.timestamp("s")
    assert expected.schema.field("day").type == pa.date32()
    others = [n for n in got.column_names if n != "day"]
    assert_tables_equal(got.select(others), expected.select(others))
    assert_tables_equal(got.select(["id", "day"]),
                        expected.select(["id", "day"]).cast(pa.schema(
                            [("id", pa.int64()), ("day", pa.timestamp("s"))])))


def test_json_lines_with_one_cpu_thread_finishes(json_lake, assert_tables_equal):
    """Regression: pyarrow's JSON dataset reader deadlocked when multi-block files (these
    are > 1 MiB each) were read concurrently with no spare CPU thread. The read runs in a
    daemon thread so that a deadlock fails the test instead of hanging the suite; the
    bound is generous and says nothing about speed."""
    truth = pa.concat_tables(pajson.read_json(f) for f in _files(json_lake, "jsonl"))
    assert all(os.path.getsize(f) > 1 << 20 for f in _files(json_lake, "jsonl"))
    result: dict = {}

    def read():
        try:
            result["table"] = al.dataset(json_lake).to_arrow()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            result["error"] = exc

    before = pa.cpu_count()
    pa.set_cpu_count(1)
    try:
        worker = threading.Thread(target=read, daemon=True)
        worker.start()
        worker.join(timeout=120)
    finally:
        pa.set_cpu_count(before)
    assert not worker.is_alive(), "reading JSON lines deadlocked"
    if "error" in result:
        raise result["error"]
    assert_tables_equal(result["table"], truth)


@pytest.mark.parametrize("ext", [".json", ".ndjson"])
def test_json_extensions(json_lake, tmp_path, ext, assert_tables_equal):
    f = _files(json_lake, "jsonl")[1]
    shutil.copy(f, tmp_path / ("part" + ext))
    _check(al.dataset(str(tmp_path)), pajson.read_json(f), assert_tables_equal)
    _check(al.dataset(str(tmp_path / ("part" + ext)), format="json"), pajson.read_json(f),
           assert_tables_equal)


def test_parquet_named_format(parquet_lake, tmp_path, duck, parquet_scan, assert_tables_equal):
    for f in _files(parquet_lake, "parquet"):
        shutil.copy(f, tmp_path / (pathlib.Path(f).stem + ".bin"))
    expected = duck(f"SELECT * FROM {parquet_scan(parquet_lake)}")
    _check(al.dataset(str(tmp_path), format="parquet"), expected, assert_tables_equal)


# ---------------------------------------------------------------------------
# hive partitions


def test_hive_lake_matches_duckdb(hive_lake, duck, parquet_scan, assert_tables_equal):
    ds = al.dataset(hive_lake)
    expected = duck(f"SELECT * FROM {parquet_scan(hive_lake, hive=True)}")
    _check(ds, expected, assert_tables_equal)
    assert ds.schema.field("country").type == pa.string()
    assert ds.filter("country IS NULL").count() == \
        duck(f"SELECT count(*) AS n FROM {parquet_scan(hive_lake, hive=True)} "
             "WHERE country IS NULL").column("n")[0].as_py() > 0


def _write_partitioned(root: pathlib.Path, folders: list[str]) -> None:
    for i, folder in enumerate(folders):
        (root / folder).mkdir(parents=True)
        pq.write_table(pa.table({"id": pa.array([2 * i, 2 * i + 1], pa.int64()),
                                 "v": pa.array([0.5 * i, None], pa.float64())}),
                       root / folder / "part-0.parquet")


def _hive_truth(duck, root) -> pa.Table:
    return duck(f"SELECT * FROM read_parquet('{root}/**/*.parquet', hive_partitioning=true)")


def test_hive_partition_types_match_duckdb(tmp_path, duck, assert_tables_equal):
    """Integers -> int64, ISO dates -> date32, anything else -> string, the default
    partition -> NULL; the same types and values as DuckDB's hive_partitioning."""
    _write_partitioned(tmp_path, [
        "year=2024/day=2024-01-02/region=eu-west/zip=007/ratio=1.5",
        "year=2025/day=2024-02-29/region=us/zip=010/ratio=2",
        "year=__HIVE_DEFAULT_PARTITION__/day=2024-03-01/region=__HIVE_DEFAULT_PARTITION__/"
        "zip=100/ratio=0.25",
        "year=-3/day=__HIVE_DEFAULT_PARTITION__/region=a%20b/zip=020/ratio=3",
    ])
    ds = al.dataset(str(tmp_path))
    got = ds.to_arrow()
    types = {f.name: f.type for f in ds.schema}
    assert types == {"id": pa.int64(), "v": pa.float64(), "year": pa.int64(),
                     "day": pa.date32(), "region": pa.string(), "zip": pa.string(),
                     "ratio": pa.string()}
    expected = _hive_truth(duck, tmp_path)
    # DuckDB lists partition columns alphabetically; arrowload in folder order: compare by name
    assert_tables_equal(got, expected.select(got.column_names))
    assert got.sort_by("id").column("zip").to_pylist()[::2] == ["007", "010", "100", "020"]
    for pred in ["year = 2024", "year IS NULL", "day >= DATE '2024-02-29'", "day IS NULL",
                 "region = 'a b'", "zip = '007'", "year > 0 AND region <> 'us'"]:
        assert_tables_equal(ds.filter(pred).to_arrow(),
                            expected.select(got.column_names).filter(
                                pc.is_in(expected["id"], duck(
                                    f"SELECT id FROM read_parquet('{tmp_path}/**/*.parquet', "
                                    f"hive_partitioning=true) WHERE {pred}")["id"])))


# folder values DuckDB types differently: by its own casts (hex, spaces, "epoch"), strictly
# (no fraction for BIGINT, no time for DATE), 19 digits, timestamps, "" and "NULL"
_HIVE_VALUES = ["1", "-7", "+7", "007", "0", "-0", "-07", "00", "1234567890123456789", "9223372036854775807",
                "9223372036854775808", "-9223372036854775808", "0x10", "0b1", " 1", "1.5", "1e3", "1_000", "2024-01-01",
                "2024-1-1", "2024-02-30", "2024-01-01 10:00:00", "2024-01-01T10:00:00", "2024-01-01 10:00:00.123",
                "2024-01-01 10:00", "NULL", "null", "", "%31", "a%20b", "true", "__HIVE_DEFAULT_PARTITION__",
                "20240101", "epoch", "x", "2024-01-01 10%3A00%3A00", "-1", "42"]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(st.sampled_from(_HIVE_VALUES), min_size=1, max_size=4))
def test_hive_partition_typing_matches_duckdb(tmp_path_factory, values):
    """Generated folder values: the key's type and every value as DuckDB's hive_partitioning
    gives them. Before, 19-digit integers and timestamps were strings, "" was NULL, and
    " 1", "0x10", "2024-1-1" were strings where DuckDB has numbers and dates."""
    root = tmp_path_factory.mktemp("hive-typing")
    for i, v in enumerate(values):
        os.makedirs(root / f"k={v}", exist_ok=True)
        pq.write_table(pa.table({"i": [i]}), str(root / f"k={v}" / f"a{i}.parquet"))
    with duckdb.connect() as con:
        truth = con.sql(f"SELECT i, k FROM read_parquet('{root}/**/*.parquet', hive_partitioning=true) "
                        "ORDER BY i").to_arrow_table()
    ds = al.dataset(str(root))
    got = ds.to_arrow().select(["i", "k"]).sort_by("i")
    want_type = truth.schema.field("k").type
    assert ds.schema.field("k").type == (pa.string() if pa.types.is_large_string(want_type) else want_type)
    assert got.column("k").to_pylist() == truth.column("k").to_pylist()
    if pa.types.is_integer(want_type):
        with duckdb.connect() as con:
            ids = con.sql(f"SELECT i FROM read_parquet('{root}/**/*.parquet', hive_partitioning=true) "
                          "WHERE k > 100 ORDER BY i").fetchnumpy()["i"].tolist()
        assert ds.filter("k > 100").to_arrow().sort_by("i").column("i").to_pylist() == ids


def test_hive_keys_in_another_order_in_some_folders_match_duckdb(tmp_path, duck):
    """``a=1/b=x`` beside ``b=y/a=2``: the same keys, so one table, as DuckDB reads it (it
    was refused); other keys are still refused."""
    for i, rel in enumerate(["a=1/b=x", "b=y/a=2", "a=3/b=z", "b=w/a=2"]):
        os.makedirs(tmp_path / rel)
        pq.write_table(pa.table({"i": [i]}), str(tmp_path / rel / "f.parquet"))
    ds = al.dataset(str(tmp_path))
    want = duck(f"SELECT i, a, b FROM read_parquet('{tmp_path}/**/*.parquet', hive_partitioning=true) ORDER BY i")
    assert ds.to_arrow().select(["i", "a", "b"]).sort_by("i").to_pylist() == want.to_pylist()
    assert ds.filter("a = 2").count() == 2 and ds.filter("b = 'y'").count() == 1
    os.makedirs(tmp_path / "a=4" / "c=1")
    pq.write_table(pa.table({"i": [9]}), str(tmp_path / "a=4" / "c=1" / "f.parquet"))
    with pytest.raises(al.SchemaMismatchError, match="hive partition folders differ"):
        al.dataset(str(tmp_path))


def test_a_partitions_folder_or_files_keep_the_lakes_partition_columns_as_duckdb(tmp_path, duck):
    """A dataset naming one partition's folder (``lake/n=1/``), a file in it, or a list of
    files from one leaf lost the partition columns above where the paths start, while a
    list spanning partitions had them all: a schema that depended on which files a
    pipeline passed. Truth: DuckDB's hive_partitioning on the same files."""
    for n, d in [(1, "2024-01-01"), (1, "2024-01-02"), (2, "2024-01-01")]:
        os.makedirs(tmp_path / f"n={n}" / f"d={d}")
        pq.write_table(pa.table({"v": [n * 10, n * 10 + 1]}), str(tmp_path / f"n={n}" / f"d={d}" / "f.parquet"))
    f1 = str(tmp_path / "n=1" / "d=2024-01-01" / "f.parquet")
    f2 = str(tmp_path / "n=2" / "d=2024-01-01" / "f.parquet")
    for spec, glob_ in [(str(tmp_path / "n=1"), f"{tmp_path}/n=1/**/*.parquet"), (f1, f1), ([f1], f1),
                        ([f1, f2], [f1, f2]), (f"{tmp_path}/n=1/**/*.parquet", f"{tmp_path}/n=1/**/*.parquet")]:
        ds = al.dataset(spec)
        want = duck(f"SELECT v, n, d FROM read_parquet({glob_!r}, hive_partitioning=true) ORDER BY v, d")
        assert ds.schema.names == ["v", "n", "d"], spec
        got = ds.to_arrow().sort_by([("v", "ascending"), ("d", "ascending")])  # v repeats across d folders
        assert got.to_pylist() == want.to_pylist(), spec
        assert ds.filter("n = 1").count() == duck(
            f"SELECT count(*) AS c FROM read_parquet({glob_!r}, hive_partitioning=true) WHERE n = 1")["c"][0].as_py()


def test_columns_differing_only_in_case_across_files_are_refused(tmp_path, duck):
    """``Id`` in one file and ``id`` in another became two half-null columns, and an
    unquoted ``id`` one of them: count(id) gave 2 where DuckDB's union by name reads one
    column and gives 4. Refused, naming both files; one file holding both stays two
    columns, as its writer made them."""
    pq.write_table(pa.table({"Id": [1, 2], "v": [1.0, 2.0]}), str(tmp_path / "a.parquet"))
    pq.write_table(pa.table({"id": [3, 4], "v": [3.0, 4.0]}), str(tmp_path / "b.parquet"))
    assert duck(f"SELECT count(id) AS n FROM read_parquet('{tmp_path}/*.parquet', union_by_name=true)")["n"][0].as_py() == 4
    with pytest.raises(al.SchemaMismatchError, match="differ only in case") as info:
        al.dataset(str(tmp_path)).schema
    assert "a.parquet" in str(info.value) and "b.parquet" in str(info.value)
    both = tmp_path / "both"
    both.mkdir()
    pq.write_table(pa.table({"Id": [1], "id": [2]}), str(both / "a.parquet"))
    pq.write_table(pa.table({"Id": [3], "id": [4]}), str(both / "b.parquet"))
    assert al.dataset(str(both)).schema.names == ["Id", "id"]


def test_hive_partition_schema_given(tmp_path):
    """``partitioning=<pyarrow.Schema>`` fixes the types; ``partitioning=False`` ignores folders."""
    _write_partitioned(tmp_path, ["k=1", "k=2"])
    typed = al.dataset(str(tmp_path), partitioning=pa.schema([("k", pa.string())]))
    assert typed.schema.field("k").type == pa.string()
    assert sorted(typed.to_arrow().column("k").to_pylist()) == ["1", "1", "2", "2"]
    plain = al.dataset(str(tmp_path), partitioning=False)
    assert plain.schema.names == ["id", "v"]
    # a key no folder has (a typo) was ignored: the column silently missing
    with pytest.raises(al.InvalidArgumentError, match="'kk'"):
        al.dataset(str(tmp_path), partitioning=pa.schema([("kk", pa.string())])).schema


# ---------------------------------------------------------------------------
# in-memory sources


def _memory_cases(table: pa.Table) -> dict:
    df = pl.from_arrow(table)
    return {
        "pyarrow-table": (table, table),
        "record-batch": (table.combine_chunks().to_batches()[0], table),
        "record-batch-reader": (table.to_reader(max_chunksize=3_000), table),
        "pyarrow-in-memory-dataset": (pds.dataset(table), table),
        "polars": (df, df.to_arrow()),
        "polars-lazy": (df.lazy(), df.to_arrow()),
        "pandas": (table.to_pandas(), pa.Table.from_pandas(table.to_pandas(), preserve_index=False)),
    }


@pytest.mark.parametrize("kind", ["pyarrow-table", "record-batch", "record-batch-reader",
                                  "pyarrow-in-memory-dataset", "polars", "polars-lazy", "pandas"])
def test_in_memory_sources(kind, lake_table, assert_tables_equal):
    source, truth = _memory_cases(lake_table)[kind]
    truth = truth.replace_schema_metadata(None)
    ds = al.dataset(source)
    _check(ds, truth, assert_tables_equal)
    _check(ds, truth, assert_tables_equal)  # a reader is drained once and kept
    pred = "label = 1 AND country IN ('US', 'DE') AND f0 > 0"
    with duckdb.connect() as con:
        con.register("t", truth)
        expected = con.sql(f"SELECT * FROM t WHERE {pred}").to_arrow_table()
    assert expected.num_rows > 0
    assert_tables_equal(ds.filter(pred).to_arrow(), expected)
    assert ds.filter(pred).count() == expected.num_rows


def test_pyarrow_file_dataset_matches_duckdb(parquet_lake, hive_lake, duck, parquet_scan,
                                             assert_tables_equal):
    flat = pds.dataset(parquet_lake, format="parquet")
    _check(al.dataset(flat), duck(f"SELECT * FROM {parquet_scan(parquet_lake)}"),
           assert_tables_equal)
    pred = "id BETWEEN 4000 AND 12000 AND label = 1"
    assert_tables_equal(al.dataset(flat).filter(pred).to_arrow(),
                        duck(f"SELECT * FROM {parquet_scan(parquet_lake)} WHERE {pred}"))


# ---------------------------------------------------------------------------
# schema unification across shards


def _write(path, table):
    pq.write_table(table, path)
    return str(path)


def test_int32_and_int64_shards_unify_to_int64(tmp_path, duck, assert_tables_equal):
    _write(tmp_path / "a.parquet", pa.table({"id": pa.array([0, 1], pa.int64()),
                                              "x": pa.array([1, -2], pa.int32())}))
    _write(tmp_path / "b.parquet", pa.table({"id": pa.array([2, 3], pa.int64()),
                                              "x": pa.array([2**40, None], pa.int64())}))
    ds = al.dataset(str(tmp_path))
    assert ds.schema.field("x").type == pa.int64()
    expected = duck(f"SELECT * FROM read_parquet('{tmp_path}/*.parquet', union_by_name=true)")
    assert expected.schema.field("x").type == pa.int64()
    _check(ds, expected, assert_tables_equal)
    assert_tables_equal(ds.filter("x > 1").to_arrow(), expected.filter(pc.greater(
        expected["x"], 1)))


def test_missing_column_reads_nulls(tmp_path, duck, assert_tables_equal):
    _write(tmp_path / "a.parquet", pa.table({"id": pa.array([0, 1], pa.int64()),
                                              "x": pa.array([1.5, 2.5]),
                                              "s": ["p", "q"]}))
    _write(tmp_path / "b.parquet", pa.table({"id": pa.array([2, 3], pa.int64()),
                                              "s": ["r", None]}))
    ds = al.dataset(str(tmp_path))
    expected = duck(f"SELECT * FROM read_parquet('{tmp_path}/*.parquet', union_by_name=true)")
    _check(ds, expected, assert_tables_equal)
    assert ds.to_arrow().sort_by("id").column("x").to_pylist() == [1.5, 2.5, None, None]
    assert ds.filter("x IS NULL").count() == 2
    assert_tables_equal(ds.filter("x IS NULL OR s = 'p'").to_arrow(),
                        duck(f"SELECT * FROM read_parquet('{tmp_path}/*.parquet', "
                             "union_by_name=true) WHERE x IS NULL OR s = 'p'"))


def test_files_from_polars_pyarrow_and_duckdb_writers_read_as_one_lake(tmp_path, duck, assert_tables_equal):
    """polars writes large strings and large lists (also inside structs), pyarrow plain
    ones, a string_view column is a third spelling: the same values, which DuckDB's
    union_by_name reads as one lake. They were refused (SchemaMismatchError); they widen to
    the large types. Truth: DuckDB over the same files, through every read path."""
    st = pa.struct([("a", pa.int64()), ("b", pa.string())])
    _write(tmp_path / "a.parquet", pa.table({
        "id": pa.array([0, 1], pa.int64()), "li": pa.array([[1], [2, 3]], pa.list_(pa.int64())),
        "st": pa.array([{"a": 1, "b": "x"}, None], st), "s": pa.array(["p", "q"], pa.string())}))
    pl.DataFrame({"id": [2, 3], "li": [[4, 5], None], "st": [{"a": 2, "b": "y"}, {"a": 3, "b": None}],
                  "s": ["r", None]}).write_parquet(tmp_path / "b.parquet")
    _write(tmp_path / "c.parquet", pa.table({
        "id": pa.array([4], pa.int64()), "li": pa.array([[6, 7, 8]], pa.list_(pa.int64())),
        "st": pa.array([{"a": 4, "b": "z"}], st), "s": pa.array(["x"], pa.string_view())}))
    kinds = {str(pq.read_schema(tmp_path / f).field("s").type) for f in ("a.parquet", "b.parquet", "c.parquet")}
    assert kinds == {"string", "large_string", "string_view"}, kinds
    assert "large_list" in str(pq.read_schema(tmp_path / "b.parquet").field("li").type)
    ds = al.dataset(str(tmp_path))
    assert ds.schema.field("li").type == pa.large_list(pa.int64())
    assert ds.schema.field("st").type == pa.struct([("a", pa.int64()), ("b", pa.large_string())])
    assert ds.schema.field("s").type == pa.large_string()
    scan = f"read_parquet('{tmp_path}/*.parquet', union_by_name=true)"
    expected = duck(f"SELECT * FROM {scan}")
    _check(ds, expected, partial(assert_tables_equal, check_types=False))
    where = "s IN ('p', 'x') OR st.b = 'y' OR len(li) > 2"
    sel = ds.filter(where)
    assert_tables_equal(sel.to_arrow(), duck(f"SELECT * FROM {scan} WHERE {where}"), check_types=False)
    assert sel.to_arrow().column("id").to_pylist() != []
    batches = list(ds.loader(2, shuffle=False, output="arrow", drop_last=False))
    assert_tables_equal(pa.Table.from_batches(batches), expected, check_types=False)


def test_timestamps_in_different_time_zones_read_as_instants_in_utc(tmp_path, duck, assert_tables_equal):
    """A file of New York timestamps beside one of UTC timestamps (DuckDB's COPY writes
    UTC): both are instants; they were refused, and read now as UTC at the finer unit, the
    instants DuckDB reads."""
    _write(tmp_path / "a.parquet", pa.table({"id": pa.array([0, 1], pa.int64()), "ts": pa.array(
        [1_700_000_000_000, 1_700_003_600_000], pa.timestamp("ms", "America/New_York"))}))
    _write(tmp_path / "b.parquet", pa.table({"id": pa.array([2], pa.int64()), "ts": pa.array(
        [1_700_001_000_000_000], pa.timestamp("us", "UTC"))}))
    ds = al.dataset(str(tmp_path))
    assert ds.schema.field("ts").type == pa.timestamp("us", "UTC")
    scan = f"read_parquet('{tmp_path}/*.parquet', union_by_name=true)"
    where = "ts >= TIMESTAMPTZ '2023-11-14 22:30:00+00'"
    got = ds.filter(where).to_arrow()
    assert_tables_equal(got, duck(f"SELECT * FROM {scan} WHERE {where}"), check_types=False)
    assert sorted(got.column("id").to_pylist()) == [1, 2]


def test_a_widened_unit_that_cannot_hold_a_files_values_is_a_schema_mismatch(tmp_path):
    """timestamp[ms] beside timestamp[ns] widens to ns, which holds no date past 2262: a
    file of ms dates in the year 3000 then failed to read as "truncated or corrupt, rewrite
    it". Neither file is corrupt (DuckDB refuses the lake as a conversion error too): the
    error is a SchemaMismatchError naming the column, the file and both types, on every
    read path."""
    import datetime as dt
    a = _write(tmp_path / "a.parquet", pa.table({"id": [1, 2], "ts": pa.array(
        [dt.datetime(3000, 1, 1), dt.datetime(2024, 1, 1)], pa.timestamp("ms"))}))
    _write(tmp_path / "b.parquet", pa.table({"id": [3], "ts": pa.array([1], pa.timestamp("ns"))}))
    ds = al.dataset(str(tmp_path))
    assert ds.schema.field("ts").type == pa.timestamp("ns")
    reads = {"to_arrow": ds.to_arrow, "filter": lambda: ds.filter("ts > '2100-01-01'").to_arrow(),
             "sql": lambda: al.sql("SELECT max(ts) AS m FROM t", t=ds).to_arrow(),
             "loader": lambda: list(ds.loader(2, shuffle=False, output="arrow", drop_last=False))}
    for what, read in reads.items():
        with pytest.raises(al.SchemaMismatchError) as info:
            read()
        msg = str(info.value)
        assert "'ts'" in msg and a in msg and "timestamp[ms]" in msg and "timestamp[ns]" in msg, (what, msg)
        assert "corrupt" not in msg.replace("Neither file is corrupt", ""), (what, msg)
    assert al.dataset(a).to_arrow().column("id").to_pylist() == [1, 2]
    # Arrow IPC: a file and a stream (read whole, not through pyarrow's fragments)
    for ext, writer in (("arrow", pa.ipc.new_file), ("arrows", pa.ipc.new_stream)):
        folder = tmp_path / ext
        folder.mkdir()
        for name, t in (("a", pa.table({"t": pa.array([dt.datetime(3000, 1, 1)], pa.timestamp("ms"))})),
                        ("b", pa.table({"t": pa.array([dt.datetime(2000, 1, 1)], pa.timestamp("ns"))}))):
            with writer(str(folder / f"{name}.{ext}"), t.schema) as w:
                w.write_table(t)
        ipc_ds = al.dataset(str(folder), format="ipc")
        for read in (ipc_ds.to_arrow, lambda: list(ipc_ds.loader(1))):
            with pytest.raises(al.SchemaMismatchError, match=r"timestamp\[ms\].*a\.arrow"):
                read()


def test_a_bound_table_named_like_a_file_is_still_a_table(tmp_path):
    """A quoted name with a dot or a slash is read as a file only where no table is bound
    under it: tables keyed by file name (al.sql(q, **{"v1.2/train": ds})) were refused."""
    t = pa.table({"a": [1, 2]})
    for name in ("a.b", "v1.2/train", "part-*"):
        got = al.sql(f'SELECT sum(a) AS s FROM "{name}"', **{name: t}).to_arrow().to_pylist()
        assert got == [{"s": 3}], name
        joined = al.sql(f'SELECT count(*) AS n FROM "{name}" x JOIN u USING (a)', **{name: t, "u": t})
        assert joined.to_arrow().to_pylist() == [{"n": 2}], name


def test_incompatible_shards_raise_schema_mismatch(tmp_path):
    a = _write(tmp_path / "a.parquet", pa.table({"id": [0, 1], "code": pa.array([1, 2], pa.int64())}))
    b = _write(tmp_path / "b.parquet", pa.table({"id": [2, 3], "code": ["x", "y"]}))
    with pytest.raises(al.SchemaMismatchError) as info:
        al.dataset(str(tmp_path)).to_arrow()
    err = info.value
    assert isinstance(err, TypeError) and isinstance(err, al.ArrowloadError)
    msg = str(err)
    assert "code" in msg and a in msg and b in msg, msg
    # reading either shard alone works
    assert al.dataset(a).to_arrow().column("code").to_pylist() == [1, 2]
    assert al.dataset(b).to_arrow().column("code").to_pylist() == ["x", "y"]


def test_schema_mismatch_names_each_files_own_type(tmp_path):
    """Three shards whose first two unify (decimal(5, 2) and decimal(10, 3) to (10, 3)) and
    a third that does not: the error gave the first file the unified type, not its own."""
    from decimal import Decimal
    paths = [_write(tmp_path / f"f{k}.parquet", pa.table({"x": pa.array([v], t)}))
             for k, (v, t) in enumerate([(Decimal("1.25"), pa.decimal128(5, 2)), (Decimal("1.250"), pa.decimal128(10, 3)),
                                         (Decimal("7"), pa.decimal128(38, 0))])]
    assert [pq.read_schema(p).field("x").type for p in paths] == \
        [pa.decimal128(5, 2), pa.decimal128(10, 3), pa.decimal128(38, 0)]
    with pytest.raises(al.SchemaMismatchError) as info:
        al.dataset(str(tmp_path)).schema
    msg = str(info.value)
    assert f"decimal128(5, 2) in {paths[0]!r}" in msg and f"decimal128(38, 0) in {paths[2]!r}" in msg, msg
    assert f"decimal128(10, 3) in {paths[0]!r}" not in msg
