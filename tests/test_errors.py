"""Bad input raises an arrowload exception that is also the matching builtin, and whose
message names the path, column or position at fault.

Every case is a real input (missing paths, real files truncated or overwritten on disk);
nothing in arrowload is mocked.
"""

from __future__ import annotations

import os
import pathlib
import shutil

import hypothesis
import hypothesis.strategies as st
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


def test_quoted_identifier_matches_case_insensitively_as_in_duckdb(parquet_lake):
    ds = al.dataset(parquet_lake)
    assert ds.filter("LABEL = 1").count() == ds.filter('"label" = 1').count() == \
        ds.filter('"LABEL" = 1').count() > 0
    with pytest.raises(al.ColumnNotFoundError) as info:
        ds.filter('"LABLE" = 1')
    _assert_unknown_column(info, "LABLE", "label")


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
    ("label = 1 label", 1, 11),
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


# ---------------------------------------------------------------------------
# every error class is public, one root, and a builtin


def _error_classes() -> list[type]:
    import inspect

    import arrowload.errors as errors
    return [obj for name, obj in vars(errors).items()
            if inspect.isclass(obj) and issubclass(obj, BaseException)
            and obj.__module__ == errors.__name__ and not name.startswith("_")]


def test_every_error_class_is_exported_and_a_builtin():
    classes = _error_classes()
    assert len(classes) >= 17
    for cls in classes:
        assert getattr(al, cls.__name__, None) is cls, f"al.{cls.__name__} is not exported"
        assert cls.__name__ in al.__all__
        assert issubclass(cls, al.ArrowloadError)
        if cls is not al.ArrowloadError:
            builtins_ = [b for b in cls.__mro__ if b.__module__ == "builtins"
                         and b not in (Exception, BaseException, object)]
            assert builtins_, f"{cls.__name__} subclasses no builtin exception besides Exception"
    assert al.__all__ == sorted(al.__all__)


# ---------------------------------------------------------------------------
# missing packages, unusable paths, bad arguments


@pytest.mark.parametrize("uri,package", [("gs://bucket/lake/", "gcsfs"), ("az://container/lake/", "adlfs"),
                                         ("abfs://container/lake/", "adlfs")])
def test_missing_cloud_package_is_an_import_error(uri, package, monkeypatch):
    """The package is made absent for the test (importing it fails, as when it is not
    installed), whether or not this environment has it."""
    import sys

    import fsspec  # noqa: F401 - loads fsspec.registry, the module (fsspec.registry is a mapping)
    registry = sys.modules["fsspec.registry"]
    monkeypatch.setitem(sys.modules, package, None)  # `import package` raises ImportError
    for proto in ("gs", "gcs", "az", "abfs", "abfss"):
        monkeypatch.delitem(registry._registry, proto, raising=False)
    with pytest.raises(al.MissingDependencyError) as info:
        al.dataset(uri)
    err = info.value
    assert isinstance(err, ImportError) and isinstance(err, al.ArrowloadError)
    assert 'pip install "arrowload[cloud]"' in str(err) and package in str(err) and uri in str(err)


def test_unknown_uri_scheme():
    with pytest.raises(al.InvalidArgumentError) as info:
        al.dataset("nosuchscheme://x/y")
    assert isinstance(info.value, ValueError) and "nosuchscheme://" in str(info.value)


def _non_utf8_lake(tmp_path) -> bytes:
    folder = os.fsencode(tmp_path / "lake")
    os.mkdir(folder)
    pq.write_table(pa.table({"a": [1, 2]}), os.fsdecode(os.path.join(folder, b"ok.parquet")))
    shutil.copy(os.path.join(folder, b"ok.parquet"), os.path.join(folder, b"caf\xe9.parquet"))
    return folder


@pytest.mark.parametrize("how", ["folder", "glob", "bytes-name", "surrogate-name", "bytes-list"])
def test_non_utf8_paths_are_a_typed_error(tmp_path, how):
    folder = _non_utf8_lake(tmp_path)
    bad = os.path.join(folder, b"caf\xe9.parquet")
    source = {"folder": os.fsdecode(folder), "glob": os.fsdecode(folder) + "/*.parquet",
              "bytes-name": bad, "surrogate-name": os.fsdecode(bad), "bytes-list": [bad]}[how]
    with pytest.raises(al.PathEncodingError) as info:
        al.dataset(source)
    err = info.value
    assert isinstance(err, UnicodeError) and isinstance(err, ValueError)
    assert "caf\\xe9" in str(err) and "rename" in str(err)


def test_bytes_paths_that_decode_are_read(tmp_path):
    folder = os.fsencode(tmp_path / "lake")
    os.mkdir(folder)
    pq.write_table(pa.table({"a": [1, 2, 3]}), os.fsdecode(os.path.join(folder, b"ok.parquet")))
    assert al.dataset(folder).to_arrow().equals(pq.read_table(os.fsdecode(folder)))
    assert al.dataset([os.path.join(folder, b"ok.parquet")]).count() == 3


def test_format_errors_are_typed(tmp_path, parquet_lake):
    with pytest.raises(al.InvalidArgumentError) as info:
        al.dataset(parquet_lake, format="orc")
    assert isinstance(info.value, ValueError) and "'orc'" in str(info.value) and "parquet" in str(info.value)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    pq.write_table(pa.table({"a": [1]}), mixed / "a.parquet")
    feather.write_feather(pa.table({"a": [1]}), mixed / "b.arrow")
    with pytest.raises(al.InvalidArgumentError) as info:
        al.dataset(str(mixed))
    assert "several formats" in str(info.value) and "format=" in str(info.value)
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "data.bin").write_bytes(b"x")
    with pytest.raises(al.InvalidArgumentError) as info:
        al.dataset(str(odd))
    assert "data.bin" in str(info.value) and "format=" in str(info.value)


def test_dataset_argument_errors_are_typed(tmp_path, parquet_lake):
    with pytest.raises(al.InvalidArgumentError) as info:
        al.dataset([])
    assert isinstance(info.value, ValueError)
    with pytest.raises(al.ArgumentTypeError) as info:
        al.dataset(42)
    assert isinstance(info.value, TypeError) and "int" in str(info.value)
    with pytest.raises(al.ArgumentTypeError) as info:
        al.dataset(parquet_lake, filesystem=object())
    assert isinstance(info.value, TypeError) and "fsspec" in str(info.value)
    with pytest.raises(al.InvalidArgumentError) as info:
        al.dataset(parquet_lake, storage_options={"anon": True})
    assert isinstance(info.value, ValueError) and "storage_options" in str(info.value)
    with pytest.raises(al.InvalidArgumentError) as info:
        al.dataset([parquet_lake, "memory://x/y"])
    assert "several filesystems" in str(info.value)
    with pytest.raises(al.InvalidArgumentError):
        al.set_progress("sometimes")


# ---------------------------------------------------------------------------
# parse errors speak SQL: what is wrong, where, never the parser's internals

_PARSER_WORDS = ("sqlglot", "<class", "Required keyword", "expressions.core", "Condition")

MISTAKES = [
    # text, what the message says, (line, column) of the caret
    ("label = 1 AND", "AND needs an operand on its right", (1, 11)),
    ("AND label = 1", "AND needs an operand on its left", (1, 1)),
    ("label = 1 OR\n", "OR needs an operand on its right", (1, 11)),
    ("label = 1 AND AND f0 > 0", "AND needs an operand on its right", (1, 15)),
    ("f0 >", "> needs an operand on its right", (1, 4)),
    ("NOT", "NOT needs an operand", (1, 1)),
    ("(label = 1 AND (f0 > 0)", "'(' is never closed", (1, 1)),
    ("label = 1)", "')' closes nothing", (1, 10)),
    ("country IN ('US', 'DE'", "'(' is never closed", (1, 12)),
    ("country = 'US", "unterminated string", (1, 11)),
    ("label = 1,", "trailing comma", (1, 10)),
    ("country IN 'US', 'DE'", "list outside parentheses", (1, 16)),
    ("label = WHERE", "a keyword where a value is expected: WHERE after =", (1, 9)),
    ("label = SELECT", "a keyword where a value is expected: SELECT after =", (1, 9)),
    ("label = 1 f0 > 0", "two values without an operator", (1, 11)),
    ("f0 BETWEEN 1", "BETWEEN low AND high", None),
    ("CAST(f0 AS )", "CAST needs a type", (1, 12)),
    ("label IS", "unexpected keyword IS", (1, 7)),
    ('country = "US', "unterminated quoted name", (1, 11)),
    ("label = 1 /* note", "unterminated comment", (1, 11)),
    ("emb = [1, 2", "'[' is never closed", None),
]


@pytest.mark.parametrize("text,says,where", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_parse_errors_speak_sql(parquet_lake, text, says, where):
    with pytest.raises(al.ExpressionError) as info:
        al.dataset(parquet_lake).filter(text)
    msg = str(info.value)
    assert says in msg, msg
    assert msg.startswith("cannot parse filter: ")
    assert not any(w in msg for w in _PARSER_WORDS), msg
    if where is not None:
        assert (info.value.line, info.value.col) == where, msg
        assert f"at line {where[0]}, column {where[1]}:" in msg
        assert msg.splitlines()[-1] == " " * (2 + where[1] - 1) + "^"


_IN_SQL = [m for m in MISTAKES[:14] if "," not in m[0]]  # a comma after WHERE ... is SQL's FROM list


@pytest.mark.parametrize("text,says,where", _IN_SQL, ids=[m[0] for m in _IN_SQL])
def test_sql_parse_errors_speak_sql(parquet_lake, text, says, where):
    query = f"SELECT id FROM t WHERE {text}"
    with pytest.raises(al.ExpressionError) as info:
        al.sql(query, t=al.dataset(parquet_lake))
    msg = str(info.value)
    assert says in msg and msg.startswith("cannot parse SQL: "), msg
    assert not any(w in msg for w in _PARSER_WORDS), msg
    if where is not None:
        assert (info.value.line, info.value.col) == (where[0], where[1] + len("SELECT id FROM t WHERE ")), msg


def test_double_quoted_string_is_explained(parquet_lake):
    """Double quotes name a column in SQL (DuckDB says the same: column "US" not found)."""
    with pytest.raises(al.ColumnNotFoundError) as info:
        al.dataset(parquet_lake).filter('country = "US"')
    assert "for the string write 'US'" in str(info.value)


@pytest.mark.parametrize("text", ["label == 1", "label IN (0, 1,)"])
def test_duckdb_spellings_that_parse(parquet_lake, text):
    """DuckDB accepts ``==`` and a trailing comma inside IN (...): so does the filter, with
    DuckDB's answer."""
    import duckdb
    files = os.path.join(parquet_lake, "*.parquet")
    expected = duckdb.sql(f"SELECT count(*) FROM read_parquet('{files}') WHERE {text}").fetchall()[0][0]
    assert al.dataset(parquet_lake).filter(text).count() == expected


def test_select_argument_errors_are_typed(parquet_lake):
    ds = al.dataset(parquet_lake)
    with pytest.raises(al.ArgumentTypeError) as info:
        ds.select(3)
    assert isinstance(info.value, TypeError) and "select(x='a + b')" in str(info.value)
    with pytest.raises(al.InvalidArgumentError) as info:
        ds.select()
    assert isinstance(info.value, ValueError)


def test_permission_denied_on_local_disk_is_about_permissions():
    """A denial on local disk names file permissions, never object-store credentials (the
    tests run as root here, so the real PermissionError is built, not provoked)."""
    import errno

    from arrowload.source.filesystem import storage_error
    exc = PermissionError(errno.EACCES, "Permission denied", "/data/lake/a.parquet")
    local = storage_error(exc, "/data/lake/a.parquet", local=True)
    assert isinstance(local, al.StorageAccessError) and isinstance(local, PermissionError)
    assert "permission" in str(local) and "AWS" not in str(local) and "/data/lake/a.parquet" in str(local)
    remote = storage_error(PermissionError("Forbidden"), "s3://bucket/a.parquet")
    assert isinstance(remote, al.StorageAccessError) and "AWS_ACCESS_KEY_ID" in str(remote)
    assert storage_error(OSError("Couldn't deserialize thrift"), "/data/lake/a.parquet", local=True) is None


_TOKENS = ["x", "label", "=", "==", "<>", ">", "AND", "OR", "NOT", "(", ")", "'a'", "'", '"', "1",
           "2.5", ",", "IN", "IS", "NULL", "BETWEEN", "LIKE", "CAST", "AS", "INT", "+", "-", "*",
           "%", "[", "]", "{", "}", "SELECT", "WHERE", ";", "--", "/*", "*/", "CASE", "WHEN", "THEN",
           "END", "::", ".", "?", "@", "\n"]


@hypothesis.settings(max_examples=300, deadline=None, derandomize=True)
@hypothesis.given(st.lists(st.sampled_from(_TOKENS), min_size=1, max_size=8))
def test_any_token_soup_parses_or_fails_in_sql_terms(tokens):
    """Whatever the text, parsing a filter gives a tree or an ExpressionError that points at
    a position and names no parser internals."""
    from arrowload.plan.sqlexpr import parse
    text = " ".join(tokens)
    try:
        parse(text, "filter")
    except al.ExpressionError as exc:
        msg = str(exc)
        assert msg.startswith(("cannot parse filter: ", "empty filter")), msg
        assert not any(w in msg for w in _PARSER_WORDS), msg


# ---------------------------------------------------------------------------
# public-API misuse: every error typed, the builtin too, the argument named

@pytest.fixture(scope="module")
def small(tmp_path_factory):
    path = tmp_path_factory.mktemp("misuse") / "small.parquet"
    pq.write_table(pa.table({"a": [1, 2, 3, 4], "b": [1.0, 2.0, 3.0, 4.0]}), path)
    return al.dataset(str(path)), str(path)


MISUSE = {  # name: (call, arrowload class, builtin, words the message must hold)
    "limit-negative": (lambda d: d.limit(-1), al.InvalidArgumentError, ValueError, ["limit(n)", "-1"]),
    "limit-float": (lambda d: d.limit(2.5), al.ArgumentTypeError, TypeError, ["limit(n)", "2.5"]),
    "limit-bool": (lambda d: d.limit(True), al.ArgumentTypeError, TypeError, ["limit(n)", "True"]),
    "head-negative": (lambda d: d.head(-2), al.InvalidArgumentError, ValueError, ["head(n)", "-2"]),
    "select-repeated-name": (lambda d: d.select("a", a="b + 1"), al.InvalidArgumentError, ValueError,
                             ["select()", "'a'"]),
    "filter-not-an-expression": (lambda d: d.filter(42), al.ArgumentTypeError, TypeError, ["filter", "int"]),
    "select-not-an-expression": (lambda d: d.select(x=3.5), al.ArgumentTypeError, TypeError,
                                 ["select(x=...)", "float"]),
    "stack-column-twice": (lambda d: d.loader(2, stack={"x": ["a", "b"], "y": ["a"]}),
                           al.InvalidArgumentError, ValueError, ["stack", "'a'", "twice"]),
    "stack-shadows-a-column": (lambda d: d.loader(2, stack={"a": ["b"]}), al.InvalidArgumentError,
                               ValueError, ["stack output 'a'", "shadow"]),
    "devices-without-cuda-torch": (lambda d: d.loader(2, devices=["cpu"]), al.InvalidArgumentError,
                                   ValueError, ["devices="]),
    "sharding-without-jax": (lambda d: d.loader(2, sharding=object()), al.InvalidArgumentError,
                             ValueError, ["sharding=", "output='jax'"]),
    "profile-zero-batches": (lambda d: d.loader(2).profile(0), al.InvalidArgumentError, ValueError,
                             ["n_batches", "0"]),
    "profile-float-batches": (lambda d: d.loader(2).profile(1.5), al.ArgumentTypeError, TypeError,
                              ["n_batches", "1.5"]),
    "map-returns-no-batch": (lambda d: d.map(lambda b: 5).to_arrow(), al.ArgumentTypeError, TypeError,
                             ["must return a pyarrow RecordBatch", "int"]),
    "splits-of-a-join": (lambda d: al.sql("SELECT * FROM t JOIN u USING (a)", t=d, u=d).splits(),
                         al.UnsupportedError, NotImplementedError, ["splits()", "2 scans"]),
    "closed-loader": (lambda d: (lambda ld: (ld.close(), iter(ld)))(d.loader(2)), al.LoaderClosedError,
                      ValueError, ["closed", "Dataset.loader()"]),
    "describe-columns-not-names": (lambda d: d.describe(5), al.ArgumentTypeError, TypeError,
                                   ["describe(columns=...)", "5"]),
    "sql-query-not-text": (lambda d: al.sql(5, t=d), al.ArgumentTypeError, TypeError, ["al.sql()", "int"]),
    "map-not-a-function": (lambda d: d.map(5), al.ArgumentTypeError, TypeError, ["map()", "int"]),
    "map-columns-a-string": (lambda d: d.map(lambda b: b, columns="ab"), al.ArgumentTypeError, TypeError,
                             ["map(columns=...)", "['ab']"]),
    "map-output-schema-not-a-schema": (lambda d: d.map(lambda b: b, output_schema=5), al.ArgumentTypeError,
                                       TypeError, ["output_schema", "int"]),
    "map-returns-other-than-its-schema": (lambda d: d.map(lambda b: b.select(["a"]), output_schema=d.schema)
                                          .to_arrow(), al.SchemaMismatchError, TypeError,
                                          ["output_schema", "a: int64, b: double"]),
    "scan-options-negative": (lambda d: al.ScanOptions(batch_rows=-1), al.InvalidArgumentError, ValueError,
                              ["batch_rows", "-1", ">= 1"]),
    "scan-options-wrong-type": (lambda d: al.ScanOptions(retries="x"), al.ArgumentTypeError, TypeError,
                                ["retries", "str"]),
    "optimizer-options-not-bool": (lambda d: al.OptimizerOptions(predicate_pushdown=1), al.ArgumentTypeError,
                                   TypeError, ["predicate_pushdown", "bool"]),
    "options-scan-not-scan-options": (lambda d: al.Options(scan=5), al.ArgumentTypeError, TypeError,
                                      ["Options(scan=...)", "int"]),
    "with-options-not-options": (lambda d: d.with_options(5), al.ArgumentTypeError, TypeError,
                                 ["with_options()", "al.Options"]),
    "dataset-options-not-options": (lambda d: al.dataset(d.plan.source.entries[0].path,
                                                         options=al.ScanOptions()),
                                    al.ArgumentTypeError, TypeError, ["options=", "ScanOptions"]),
    "sql-reads-a-missing-file": (lambda d: al.sql("SELECT * FROM t, read_csv('no/such/file.csv')", t=d)
                                 .to_arrow(), al.PathNotFoundError, FileNotFoundError, ["no/such/file.csv"]),
    "sql-io-error-in-duckdb": (lambda d: al.sql("SELECT * FROM t, read_text('/proc/self/mem')", t=d)
                               .to_arrow(), al.QueryError, RuntimeError, ["/proc/self/mem"]),
}


@pytest.mark.parametrize("case", sorted(MISUSE))
def test_public_api_misuse_is_typed(small, case):
    call, cls, builtin, words = MISUSE[case]
    with pytest.raises(cls) as info:
        call(small[0])
    err = info.value
    assert isinstance(err, al.ArrowloadError) and isinstance(err, builtin)
    for w in words:
        assert w in str(err), (w, str(err))


def test_limit_accepts_numpy_integers(small):
    import numpy as np
    d, path = small
    assert d.limit(np.int64(2)).to_arrow().equals(pq.read_table(path).slice(0, 2))
    assert d.head(np.int32(3)).equals(pq.read_table(path).slice(0, 3))
    assert al.ScanOptions(io_threads=np.int64(2)).io_threads == 2


def test_a_map_whose_empty_output_is_untyped_is_a_schema_mismatch_naming_the_fix(tmp_path):
    """A map without output_schema building a column from Python lists is null-typed on
    the empty batch the plan's schema comes from; on data it is int64, and to_arrow() raised
    pyarrow's ArrowInvalid, cache() its ArrowNotImplementedError. Both are the
    SchemaMismatchError that says to pass output_schema, which then works."""
    ds = al.dataset(pa.table({"x": [1, 2, 3]}))

    def fn(b):
        return pa.RecordBatch.from_pydict({"y": [v * 100 for v in b.column("x").to_pylist()]})

    untyped = ds.map(fn, name="fn-v2")
    with pytest.raises(al.SchemaMismatchError, match="output_schema"):
        untyped.to_arrow()
    with pytest.raises(al.SchemaMismatchError, match="output_schema"):
        untyped.cache(str(tmp_path / "cache")).to_arrow()
    typed = ds.map(fn, name="fn-v2", output_schema=pa.schema([("y", pa.int64())]))
    assert typed.to_arrow()["y"].to_pylist() == [100, 200, 300]


def _non_utf8_column(path, byte: int) -> None:
    """A Parquet file whose column ``abcdef`` has its third byte replaced in the footer (a
    name that is not UTF-8, as a writer that does not check its encoding leaves it)."""
    pq.write_table(pa.table({"abcdef": [1, 2], "other": [4.0, 5.0]}), path, compression="none", store_schema=False)
    data = bytearray(open(path, "rb").read())
    at = data.find(b"abcdef", len(data) - 8 - int.from_bytes(data[-8:-4], "little"))
    data[at + 2] = byte
    open(path, "wb").write(bytes(data))


def test_a_column_name_that_is_not_utf8_is_a_corrupt_file(tmp_path):
    """pyarrow reads such a footer but raises UnicodeDecodeError on first use of the name: a
    folder holding the file raised it raw, the file alone a PathEncodingError about a file
    name. Both are a CorruptFileError naming the file."""
    (tmp_path / "lake").mkdir()
    _non_utf8_column(str(tmp_path / "lake" / "a.parquet"), 0xFF)
    pq.write_table(pa.table({"abcdef": [3], "other": [6.0]}), str(tmp_path / "lake" / "b.parquet"))
    for path in (tmp_path / "lake", tmp_path / "lake" / "a.parquet"):
        with pytest.raises(al.CorruptFileError, match="a.parquet.*not valid UTF-8"):
            al.dataset(str(path)).to_arrow()
    assert al.dataset(str(tmp_path / "lake" / "b.parquet")).to_arrow().num_rows == 1


class _Array2D(pa.ExtensionType):
    """An extension type over lists of lists, as Hugging Face ``datasets``' Array2D is."""

    def __init__(self):
        super().__init__(pa.list_(pa.list_(pa.float32())), "test.array2d")

    def __arrow_ext_serialize__(self):
        return b""

    @classmethod
    def __arrow_ext_deserialize__(cls, storage_type, serialized):
        return cls()

    def __hash__(self):  # (as datasets' own extension types define it)
        return hash((type(self), str(self.storage_type)))


@pytest.mark.parametrize("shuffle", [False, "block", "global"])
def test_an_extension_column_no_array_holds_is_refused_by_every_loader(tmp_path, shuffle):
    """A registered extension type over lists of lists (Hugging Face's Array2D, read in a
    process that imported ``datasets``): the global shuffle's build check asked Arrow for
    the extension's list lengths and raised pyarrow's ArrowNotImplementedError; every
    loader now raises UnsupportedError naming the column, as the others did."""
    t = _Array2D()
    try:
        pa.register_extension_type(t)
    except pa.ArrowKeyError:
        pass  # registered by an earlier parametrization
    storage = pa.array([[[float(i)] * 3, [i + 1.0] * 3] for i in range(40)], t.storage_type)
    table = pa.table({"id": pa.array(range(40), pa.int64()), "a2": pa.ExtensionArray.from_storage(t, storage)})
    pq.write_table(table, str(tmp_path / "a.parquet"))
    ds = al.dataset(str(tmp_path / "a.parquet"))
    assert isinstance(ds.schema.field("a2").type, _Array2D)
    with pytest.raises(al.UnsupportedError, match="'a2'"):
        next(iter(ds.loader(16, shuffle=shuffle, output="numpy", cache_dir=str(tmp_path / "c"))))


@pytest.mark.parametrize("kw", [{"pad_lists": True}, {"pad_lists": ("v",), "pad_to": 8}, {"pad_to": 8}])
def test_padding_with_arrow_output_is_refused_not_ignored(tmp_path, kw):
    """``output="arrow"`` hands out Arrow lists as they are: ``pad_lists`` / ``pad_to`` were
    silently ignored there (no padding, no ``<name>_lengths``); nothing asked for is dropped
    silently, so the loader refuses them."""
    pq.write_table(pa.table({"v": pa.array([[1], [2, 3]])}), str(tmp_path / "a.parquet"))
    ds = al.dataset(str(tmp_path / "a.parquet"))
    with pytest.raises(al.InvalidArgumentError, match="output='arrow'"):
        ds.loader(2, output="arrow", **kw)
    assert ds.loader(2, output="numpy", **({"pad_lists": True} | kw)) is not None
