"""Shared fixtures: small generated lakes, written once per test session.

Every lake holds the same rows: the synthetic "events" table of
``arrowload.datagen.events_table`` with ``ROWS`` rows (ids ``0..ROWS-1``, unique, so
tests compare results sorted by ``id``), split into ``SHARDS`` shards of
``ROWS // SHARDS`` consecutive ids. Shard ``k`` of every lake holds the same rows.

Columns (see ``arrowload.datagen``): ``id`` int64, ``ts`` timestamp[us], ``day`` date32,
``user_id`` int64, ``country`` string (about 1% nulls), ``label`` int8,
``f0..f15`` float32, ``emb`` fixed_size_list<float32>[EMB_DIM], ``price``
decimal128(10, 2), ``text`` string, ``score`` float64 (about 2% nulls).

Fixtures (session-scoped; each returns the lake's directory as ``str``):

``parquet_lake``  ``part-0000k.parquet``, zstd, ``ROW_GROUP_SIZE`` rows per row group
                  (so several row groups per file).
``hive_lake``     the same rows under ``country=XX/part-0000k.parquet`` folders; rows
                  whose country is null sit in ``country=__HIVE_DEFAULT_PARTITION__``.
                  The files themselves have no ``country`` column.
``ipc_lake``      ``part-0000k.arrow``: Arrow IPC *file* format (Feather v2), one file
                  per Parquet shard, all columns with their Parquet types.
``csv_lake``      ``part-0000k.csv`` written by ``pyarrow.csv.write_csv`` without the
                  ``emb`` list column. Nulls are written as empty unquoted fields, strings
                  are quoted.
``json_lake``     ``part-0000k.jsonl`` (JSON lines) without ``emb``: dates and timestamps
                  as ISO strings (``"2024-01-01"``, ``"2024-01-01 00:00:37"``), ``price``
                  as a JSON number, nulls as ``null``. Each file is > 1 MiB (several
                  default JSON read blocks).
``lake_table``    all rows as one ``pyarrow.Table`` (plain pyarrow reading the Parquet
                  shards), sorted by ``id``: the truth for in-memory sources.

Helpers (plain functions, also offered as fixtures of the same name):

``duck(sql)``                     run SQL in DuckDB, return a ``pyarrow.Table``.
``parquet_scan(lake, hive=False)``  the DuckDB ``read_parquet(...)`` call for a lake.
``normalize(table)``               representational normalisation, documented below.
``assert_tables_equal(a, b)``      same columns, types and values after ``normalize``,
                                   both sorted by ``id``.

The lakes are read-only by contract: a test that needs to change files copies them to
its own ``tmp_path`` first.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
import threading

import duckdb
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

from arrowload.datagen import write_lake

# Ray (tests/test_ray.py) binds every server to 127.0.0.1 only when it runs as a one-machine
# "cluster" (its node address is then the loopback one); read by Ray when it is imported.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

# The user cache dir (loader caches, remembered footer checks and decoder choices) is the
# test session's own, never ~/.cache; every test gets an empty one (``_own_cache_dir``).
os.environ["ARROWLOAD_CACHE_DIR"] = _SESSION_CACHE = tempfile.mkdtemp(prefix="arrowload-tests-cache-")
atexit.register(shutil.rmtree, _SESSION_CACHE, True)  # not left behind in /tmp by every run


@pytest.fixture(scope="module")
def opened(lake):
    """The module's ``lake`` opened twice: as is, and with the optimizer off (differential
    tests run every case both ways)."""
    import arrowload as al
    from arrowload.options import OptimizerOptions
    base = al.dataset(lake)
    return base, base.with_options(optimizer=OptimizerOptions.none())


@pytest.fixture(autouse=True)
def _own_cache_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("ARROWLOAD_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    # and this process's memory of checked footers forgotten, as a new process starts: what a
    # test counts (footer reads, requests) never depends on the tests run before it
    from arrowload.source import footer
    footer.forget_checks()

ROWS = 20_000
SHARDS = 4
ROW_GROUP_SIZE = 2_000
EMB_DIM = 8


# ---------------------------------------------------------------------------
# helpers

_DUCK: dict[int, duckdb.DuckDBPyConnection] = {}


def duck(sql: str) -> pa.Table:
    """Run ``sql`` in DuckDB (one in-memory connection per process and thread; opening one
    costs more than a small query) and return the whole result as a ``pyarrow.Table``."""
    key = threading.get_ident()
    con = _DUCK.get(key)
    if con is None:
        con = _DUCK[key] = duckdb.connect()
    return con.sql(sql).to_arrow_table()


def parquet_scan(lake: str, hive: bool = False) -> str:
    """DuckDB's table function over every Parquet file under ``lake``."""
    pattern = os.path.join(lake, "**", "*.parquet").replace("'", "''")
    return f"read_parquet('{pattern}', hive_partitioning={'true' if hive else 'false'})"


def _normalize_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_fixed_size_list(t) or pa.types.is_large_list(t) or pa.types.is_list(t):
        return pa.list_(_normalize_type(t.value_type))
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", t.tz)
    if pa.types.is_dictionary(t):
        return _normalize_type(t.value_type)
    return t


def normalize(table: pa.Table) -> pa.Table:
    """Undo differences that are representation only, never value or type class:

    * any list type (fixed-size, large, DuckDB's ``list<l: ...>``) -> ``list<item: ...>``
      (DuckDB reads Arrow's fixed-size list from Parquet as a LIST; the values are equal);
    * large / view strings and binaries -> ``string`` / ``binary``; dictionary -> values;
    * timestamps of any unit -> microseconds (a cast that would lose precision raises,
      so a real difference is never hidden);
    * chunking and schema metadata are dropped; field nullability is ignored.

    Integer widths, float widths, decimals, dates vs timestamps are *not* normalised.
    """
    fields = [pa.field(f.name, _normalize_type(f.type)) for f in table.schema]
    arrays = [col.cast(f.type) if not col.type.equals(f.type) else col
              for col, f in zip(table.columns, fields)]
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields)).combine_chunks()


def sort_by_id(table: pa.Table, key: str = "id") -> pa.Table:
    return table.sort_by([(key, "ascending")]) if key in table.column_names else table


def assert_tables_equal(actual: pa.Table, expected: pa.Table, *, key: str = "id",
                        check_types: bool = True) -> None:
    """``actual`` and ``expected`` hold the same columns in the same order, with the same
    (normalised) types and the same rows. Both are sorted by ``key`` when they have it
    (ids are unique in the test lakes); otherwise rows must already be in the same order.
    Floats compare exactly (both sides read the same bytes; NaN equals NaN)."""
    a, e = normalize(actual), normalize(expected)
    assert a.column_names == e.column_names, f"columns differ:\n  {a.column_names}\n  {e.column_names}"
    if check_types:
        assert a.schema.equals(e.schema), f"types differ:\n{a.schema}\n--- vs ---\n{e.schema}"
    else:
        e = e.cast(a.schema)
    assert a.num_rows == e.num_rows, f"{a.num_rows} rows vs {e.num_rows} expected"
    a, e = sort_by_id(a, key), sort_by_id(e, key)
    for name in a.column_names:
        ca, ce = a.column(name), e.column(name)
        if not ca.equals(ce):
            bad = _first_difference(ca, ce)
            raise AssertionError(f"column {name!r} differs at row {bad}: "
                                 f"{ca[bad].as_py()!r} != {ce[bad].as_py()!r} (expected)")


def _first_difference(a: pa.ChunkedArray, b: pa.ChunkedArray) -> int:
    la, lb = a.to_pylist(), b.to_pylist()
    for i, (x, y) in enumerate(zip(la, lb)):
        if x != y and not (x != x and y != y):  # NaN == NaN here
            return i
    return min(len(la), len(lb))


# ---------------------------------------------------------------------------
# lakes

@pytest.fixture(scope="session")
def parquet_lake(tmp_path_factory) -> str:
    """Parquet shards with several row groups each (see the module docstring)."""
    path = tmp_path_factory.mktemp("parquet_lake")
    write_lake(path, rows=ROWS, shards=SHARDS, row_group_size=ROW_GROUP_SIZE, emb_dim=EMB_DIM)
    return str(path)


@pytest.fixture(scope="session")
def hive_lake(tmp_path_factory) -> str:
    """The same rows partitioned by ``country`` in hive folders (nulls in
    ``country=__HIVE_DEFAULT_PARTITION__``)."""
    path = tmp_path_factory.mktemp("hive_lake")
    written = write_lake(path, rows=ROWS, shards=SHARDS, row_group_size=ROW_GROUP_SIZE,
                         emb_dim=EMB_DIM, partition_by="country")
    assert any("__HIVE_DEFAULT_PARTITION__" in p for p in written), "expected a null partition"
    return str(path)


def _parquet_shards(lake: str) -> list[tuple[str, pa.Table]]:
    names = sorted(n for n in os.listdir(lake) if n.endswith(".parquet"))
    return [(os.path.splitext(n)[0], pq.read_table(os.path.join(lake, n))) for n in names]


@pytest.fixture(scope="session")
def ipc_lake(tmp_path_factory, parquet_lake) -> str:
    """The Parquet shards rewritten as Arrow IPC files (``.arrow``, Feather v2)."""
    path = tmp_path_factory.mktemp("ipc_lake")
    for stem, table in _parquet_shards(parquet_lake):
        feather.write_feather(table, str(path / f"{stem}.arrow"), compression="uncompressed")
    return str(path)


@pytest.fixture(scope="session")
def csv_lake(tmp_path_factory, parquet_lake) -> str:
    """The Parquet shards as CSV without the ``emb`` list column."""
    path = tmp_path_factory.mktemp("csv_lake")
    for stem, table in _parquet_shards(parquet_lake):
        pacsv.write_csv(table.drop_columns(["emb"]), str(path / f"{stem}.csv"))
    return str(path)


def _json_value(v):
    if hasattr(v, "isoformat"):
        return v.isoformat(sep=" ") if hasattr(v, "hour") else v.isoformat()
    return float(v)  # Decimal price


@pytest.fixture(scope="session")
def json_lake(tmp_path_factory, parquet_lake) -> str:
    """The Parquet shards as JSON lines without the ``emb`` list column."""
    path = tmp_path_factory.mktemp("json_lake")
    for stem, table in _parquet_shards(parquet_lake):
        with open(path / f"{stem}.jsonl", "w", encoding="utf-8") as f:
            for row in table.drop_columns(["emb"]).to_pylist():
                f.write(json.dumps(row, default=_json_value) + "\n")
    return str(path)


@pytest.fixture(scope="session")
def lake_table(parquet_lake) -> pa.Table:
    """All rows of the lakes, as plain pyarrow reads the Parquet shards (sorted by id)."""
    tables = [t for _, t in _parquet_shards(parquet_lake)]
    return sort_by_id(pa.concat_tables(tables))


# helpers as fixtures, for tests that prefer injection over imports
@pytest.fixture(scope="session", name="duck")
def _duck_fixture():
    return duck


@pytest.fixture(scope="session", name="assert_tables_equal")
def _assert_tables_equal_fixture():
    return assert_tables_equal


@pytest.fixture(scope="session", name="parquet_scan")
def _parquet_scan_fixture():
    return parquet_scan


__all__ = ["ROWS", "SHARDS", "ROW_GROUP_SIZE", "EMB_DIM", "duck", "parquet_scan", "normalize",
           "assert_tables_equal", "sort_by_id"]
