"""Bad input raises an arrowload exception that is also the matching builtin, and whose
message names the path, column or position at fault.

Every case is a real input (missing paths, real files truncated or overwritten on disk);
nothing in arrowload is mocked.
"""

from __future__ import annotations

import os
import pathlib
import shutil

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

import arrowload as al

ERRORS = [al.PathNotFoundError, al.ColumnNotFoundError, al.ExpressionError,
          al.SchemaMismatchError, al.CorruptFileError, al.UnsupportedError]


@pytest.mark.parametrize("cls", ERRORS, ids=lambda c: c.__name__)
def test_every_error_has_one_root(cls):
    assert issubclass(cls, al.ArrowloadError)
    assert issubclass(al.ArrowloadError, Exception)


# ---------------------------------------------------------------------------
# missing paths


def _missing_cases(lake: str, tmp: pathlib.Path) -> dict:
    empty = tmp / "empty-dir"
    empty.mkdir(exist_ok=True)
    first = sorted(pathlib.Path(lake).glob("*.parquet"))[0]
    return {
        "missing-dir": (str(tmp / "no-such-dir"), str(tmp / "no-such-dir")),
        "missing-file": (str(tmp / "nope.parquet"), "nope.parquet"),
        "glob-matches-nothing": (os.path.join(lake, "*.csv"), "*.csv"),
        "one-of-a-list": ([str(first), os.path.join(lake, "gone.parquet")], "gone.parquet"),
        "file-uri": ((tmp / "no-such-dir").as_uri(), "no-such-dir"),
        "memory-uri": ("memory://arrowload-test-surely-missing/x", "arrowload-test-surely-missing"),
        "empty-dir": (str(empty), "empty-dir"),
    }


@pytest.mark.parametrize("case", ["missing-dir", "missing-file", "glob-matches-nothing",
                                  "one-of-a-list", "file-uri", "memory-uri", "empty-dir"])
def test_missing_path(parquet_lake, tmp_path, case):
    source, named = _missing_cases(parquet_lake, tmp_path)[case]
    with pytest.raises(al.PathNotFoundError) as info:
        al.dataset(source)  # listing is eager: fails at the call that named the path
    err = info.value
    assert isinstance(err, FileNotFoundError) and isinstance(err, al.ArrowloadError)
    assert named in str(err), str(err)


def test_missing_path_with_explicit_filesystem(tmp_path):
    import fsspec
    with pytest.raises(FileNotFoundError) as info:
        al.dataset(str(tmp_path / "absent"), filesystem=fsspec.filesystem("file"))
    assert isinstance(info.value, al.PathNotFoundError)
    assert "absent" in str(info.value)


# ---------------------------------------------------------------------------
# unknown columns


def _assert_unknown_column(info, column: str, suggestion: str | None) -> None:
    err = info.value
    assert isinstance(err, KeyError) and isinstance(err, al.ArrowloadError)
    msg = str(err)
    assert repr(column) in msg, msg
    if suggestion is not None:
        assert "did you mean" in msg and repr(suggestion) in msg, msg
        assert msg.index(repr(suggestion)) > msg.index("did you mean"), msg
    assert err.column == column


UNKNOWN = {
    "sql-filter": lambda ds: ds.filter("contry = 'US'"),
    "sql-filter-nested": lambda ds: ds.filter("label = 1 AND (contry IN ('US') OR id < 3)"),
    "select-name": lambda ds: ds.select("id", "contry"),
    "select-sql-expression": lambda ds: ds.select(c="lower(contry)"),
    "arrow-filter": lambda ds: ds.filter(pc.field("contry") == "US"),
    "arrow-select": lambda ds: ds.select(c=pc.field("contry")),
    "polars-filter": lambda ds: ds.filter(pl.col("contry") == "US"),
    "filter-after-select": lambda ds: ds.select("id", "country").filter("label = 1"),
}


@pytest.mark.parametrize("case", sorted(UNKNOWN))
@pytest.mark.parametrize("lake_name", ["parquet_lake", "hive_lake"])
def test_unknown_column(request, lake_name, case):
    ds = al.dataset(request.getfixturevalue(lake_name))
    with pytest.raises(al.ColumnNotFoundError) as info:
        UNKNOWN[case](ds)
    if case == "filter-after-select":
        _assert_unknown_column(info, "label", None)
        assert "(columns: id, country)" in str(info.value)  # lists what does exist
    else:
        _assert_unknown_column(info, "contry", "country")


def test_quoted_identifier_is_case_sensitive(parquet_lake):
    ds = al.dataset(parquet_lake)
    assert ds.filter("LABEL = 1").count() == ds.filter('"label" = 1').count() > 0
    with pytest.raises(al.ColumnNotFoundError) as info:
        ds.filter('"LABEL" = 1')
    _assert_unknown_column(info, "LABEL", "label")


def test_unknown_column_in_memory_source():
    ds = al.dataset(pa.table({"user_id": [1], "user_name": ["a"]}))
    with pytest.raises(KeyError) as info:
        ds.select("usr_id")
    _assert_unknown_column(info, "usr_id", "user_id")


# ---------------------------------------------------------------------------
# unparsable or ill-typed expressions


@pytest.mark.parametrize("text,line,column", [
    ("label = = 1", 1, 9),
    ("id >", 1, 4),
    ("label = 1 label", 1, 15),
    ("label +", 1, 7),
    ("label = 1 AND\n  (country = 'US' OR)", 2, 21),
    ("country = 'US", 1, 11),                 # unterminated string
    ("label = 1 AND\n text = 'a''b' AND country = 'x", 2, 30),
])
def test_unparsable_filter_names_line_and_column(parquet_lake, text, line, column):
    ds = al.dataset(parquet_lake)
    with pytest.raises(al.ExpressionError) as info:
        ds.filter(text)
    err = info.value
    assert isinstance(err, ValueError) and isinstance(err, al.ArrowloadError)
    assert (err.line, err.col) == (line, column)
    msg = str(err)
    assert f"line {line}, column {column}" in msg, msg
    # the message quotes the offending line and puts a caret under the position
    src, caret = msg.splitlines()[-2:]
    assert src == "  " + text.splitlines()[line - 1]
    assert caret == " " * (2 + column - 1) + "^"


@pytest.mark.parametrize("text", ["", "   "])
def test_empty_filter(parquet_lake, text):
    with pytest.raises(al.ExpressionError, match="empty filter"):
        al.dataset(parquet_lake).filter(text)


def test_unparsable_projection(parquet_lake):
    with pytest.raises(ValueError) as info:
        al.dataset(parquet_lake).select(x="f0 * * 2")
    assert isinstance(info.value, al.ExpressionError)
    assert "line 1, column" in str(info.value)


def test_non_boolean_filter_is_rejected(parquet_lake):
    """``id + 1`` parses but is not a predicate: an ExpressionError by the time rows are
    asked for, saying what type it has."""
    with pytest.raises(al.ExpressionError) as info:
        al.dataset(parquet_lake).filter("id + 1").to_arrow()
    assert "int64" in str(info.value) and "boolean" in str(info.value)


def test_bad_cast_is_an_expression_error(parquet_lake):
    """A CAST that cannot convert a value fails as the expression's fault (a ValueError
    naming the target type), not as a corrupt file."""
    with pytest.raises(al.ExpressionError) as info:
        al.dataset(parquet_lake).filter("CAST(country AS INTEGER) = 1").to_arrow()
    assert isinstance(info.value, ValueError)
    assert "int32" in str(info.value).lower()
    assert not isinstance(info.value, al.CorruptFileError)


# ---------------------------------------------------------------------------
# corrupt and truncated shards


def _copy(lake: str, dest: pathlib.Path) -> pathlib.Path:
    shutil.copytree(lake, dest)
    return dest


def _truncate(path: pathlib.Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


READS = {
    "schema": lambda ds: ds.schema,
    "to_arrow": lambda ds: ds.to_arrow(),
    "to_batches": lambda ds: list(ds.to_batches()),
    "count": lambda ds: ds.count(),
    "filter": lambda ds: ds.filter("f0 > 0").to_arrow(),
}


@pytest.mark.parametrize("read", sorted(READS))
@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_corrupt_parquet_shard_is_named(parquet_lake, tmp_path, damage, read):
    lake = _copy(parquet_lake, tmp_path / "lake")
    bad = sorted(lake.glob("*.parquet"))[1]
    if damage == "truncated":
        _truncate(bad)
    elif damage == "garbage":
        bad.write_bytes(b"not a parquet file, just text\n" * 50)
    else:
        bad.write_bytes(b"")
    ds = al.dataset(str(lake))  # listing does not open files
    with pytest.raises(al.CorruptFileError) as info:
        READS[read](ds)
    err = info.value
    assert isinstance(err, OSError) and isinstance(err, al.ArrowloadError)
    assert str(bad) in str(err) and err.path == str(bad)
    for good in sorted(lake.glob("*.parquet")):
        if good != bad:  # the other shards still read alone
            assert al.dataset(str(good)).count() == pq.ParquetFile(good).metadata.num_rows


@pytest.mark.parametrize("read", ["to_arrow", "to_batches", "filter"])
def test_corrupt_data_pages_are_named(parquet_lake, tmp_path, read):
    """The footer is intact (schema and row counts come from it), the data pages are not:
    reading the rows names the file."""
    lake = _copy(parquet_lake, tmp_path / "lake")
    bad = sorted(lake.glob("*.parquet"))[3]
    data = bytearray(bad.read_bytes())
    meta = pq.ParquetFile(bad).metadata
    footer_start = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    for i in range(4, footer_start):  # deterministic garbage over every page
        data[i] = (i * 131 + 7) % 256
    bad.write_bytes(bytes(data))
    ds = al.dataset(str(lake))
    assert ds.count() == 20_000  # footers only: still answerable
    assert pq.ParquetFile(bad).metadata.num_rows == meta.num_rows
    with pytest.raises(al.CorruptFileError) as info:
        READS[read](ds)
    assert str(bad) in str(info.value)


def test_corrupt_shard_in_hive_lake(hive_lake, tmp_path):
    lake = _copy(hive_lake, tmp_path / "hive")
    bad = sorted(lake.glob("country=DE/*.parquet"))[0]
    _truncate(bad, 0.3)
    ds = al.dataset(str(lake))
    with pytest.raises(al.CorruptFileError) as info:
        ds.filter("country = 'DE'").to_arrow()
    assert str(bad) in str(info.value)


def test_corrupt_ipc_file_is_named(ipc_lake, tmp_path):
    lake = _copy(ipc_lake, tmp_path / "ipc")
    bad = sorted(lake.glob("*.arrow"))[0]
    _truncate(bad, 0.4)
    with pytest.raises(al.CorruptFileError) as info:
        al.dataset(str(lake)).to_arrow()
    assert str(bad) in str(info.value)


def test_garbage_ipc_file_is_named(tmp_path):
    good = tmp_path / "a.feather"
    feather.write_feather(pa.table({"x": [1, 2]}), str(good))
    bad = tmp_path / "b.feather"
    bad.write_bytes(b"ARROW1 but not really")
    with pytest.raises(al.CorruptFileError) as info:
        al.dataset(str(tmp_path)).count()
    assert str(bad) in str(info.value)
