"""What is derived from a Parquet file's schema alone (its leaf columns, physical types,
the fast decoders' per-file facts, UUID / JSON columns) is worked out once per distinct
schema (``footer.per_schema``): a lake of thousands of small files from one writer paid it
per file. The key must tell apart every schema that reads differently, including the same
Parquet schema typed otherwise by a stored Arrow schema (``ARROW:schema``)."""

from __future__ import annotations

import uuid

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

import arrowload as al
from arrowload.scan import decoders
from arrowload.source import files, footer


def _meta(path):
    return pq.ParquetFile(path).metadata


def test_the_key_tells_apart_what_reads_differently(tmp_path):
    t = pa.table({"s": pa.array(["a", "b"], pa.large_string()),
                  "ts": pa.array([1, 2], pa.timestamp("ms", "Asia/Tokyo")),
                  "st": pa.array([{"x": 1}, {"x": 2}])})
    pq.write_table(t, tmp_path / "a.parquet")
    pq.write_table(t, tmp_path / "a2.parquet")
    pq.write_table(t, tmp_path / "plain.parquet", store_schema=False)  # same Parquet schema, no Arrow types
    dotted = t.rename_columns(["s", "ts", "st.x"]).set_column(2, "st.x", pa.array([1, 2]))
    pq.write_table(dotted, tmp_path / "dotted.parquet")  # the leaf path "st.x" of another column
    a, a2, plain, dot = (_meta(tmp_path / f"{n}.parquet") for n in ("a", "a2", "plain", "dotted"))
    assert str(a.schema).split("\n", 1)[1] == str(plain.schema).split("\n", 1)[1]
    assert footer.schema_key(a) == footer.schema_key(a2)
    assert footer.schema_key(a) != footer.schema_key(plain)  # string / UTC there: typed otherwise
    assert footer.schema_key(a) != footer.schema_key(dot)
    assert footer.leaf_columns(a) == ("s", "ts", "st")
    assert footer.leaf_columns(dot) == ("s", "ts", "st.x")
    assert [p for _, p, _ in footer.leaf_facts(a)] == ["s", "ts", "st.x"]


def test_files_of_one_schema_share_its_facts_and_read_as_duckdb(tmp_path, monkeypatch):
    """Forty files of one schema (with a UUID column pyarrow types as ``arrow.uuid`` only
    from the footer's logical type) and one of another: the facts are worked out twice,
    and every file reads as DuckDB reads the lake."""
    ids = [uuid.UUID(int=i) for i in range(41)]
    for i in range(40):
        pq.write_table(pa.table({"id": pa.array([i], pa.int64()), "u": pa.array([ids[i].bytes], pa.uuid()),
                                 "x": pa.array([float(i)], pa.float32())}), tmp_path / f"p{i:02d}.parquet",
                       store_schema=False)
    duckdb.sql(f"COPY (SELECT 40::BIGINT AS id, '{ids[40]}'::UUID AS u, 40.0::DOUBLE AS x) "
               f"TO '{tmp_path / 'p40.parquet'}' (FORMAT parquet)")
    footer.forget_schema_facts()
    computed = []

    def counted(module, name):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a: computed.append(name) or real(*a))

    counted(footer, "_leaf_columns")
    counted(files, "_logical_kinds")
    counted(decoders, "_FileFacts")
    ds = al.dataset(str(tmp_path))
    got = ds.to_arrow().sort_by("id")
    monkeypatch.setenv("ARROWLOAD_DECODER", "polars")  # the fast decoders' facts, per file
    rows = [b for b in ds.select("id", "x").loader(8, shuffle=False, output="arrow")]
    assert sorted(computed) == ["_FileFacts"] * 2 + ["_leaf_columns"] * 2 + ["_logical_kinds"] * 2
    want = duckdb.sql(f"SELECT id, CAST(u AS VARCHAR) AS u, CAST(x AS DOUBLE) AS x "
                      f"FROM read_parquet('{tmp_path}/*.parquet') ORDER BY id").fetchall()
    assert [(r["id"], str(r["u"]), r["x"]) for r in got.to_pylist()] == want
    assert sorted(i for b in rows for i in b.column("id").to_pylist()) == list(range(41))


def test_schemas_that_print_alike_are_told_apart(tmp_path):
    """A binary column named ``x (String)`` and a string column ``x`` print as the same
    schema text (names are not quoted): one key gave the second file the first one's facts,
    and the loader read ``x`` as nulls there. Truth: DuckDB."""
    pq.write_table(pa.table({"x (String)": pa.array([b"aa", b"bb"], pa.binary())}), tmp_path / "a.parquet",
                   store_schema=False)
    pq.write_table(pa.table({"x": pa.array(["cc", "dd"], pa.string())}), tmp_path / "b.parquet", store_schema=False)
    a, b = _meta(tmp_path / "a.parquet"), _meta(tmp_path / "b.parquet")
    assert str(a.schema).split("\n", 1)[1] == str(b.schema).split("\n", 1)[1]
    assert footer.schema_key(a) != footer.schema_key(b)
    want = sorted(str(r[0]) for r in duckdb.sql(
        f"SELECT x FROM read_parquet('{tmp_path}/*.parquet', union_by_name=true)").fetchall())
    ds = al.dataset(str(tmp_path)).select("x")
    got = sorted(str(v) for batch in ds.loader(4, output="arrow") for v in batch["x"].to_pylist())
    assert got == want == ["None", "None", "cc", "dd"]


def test_the_shared_facts_are_bounded(tmp_path):
    """Facts of many wide schemas are not all kept: at most ``_PER_SCHEMA_LEAVES`` leaf
    columns' worth (a process opening datasets of hundreds of different wide schemas held
    hundreds of MiB)."""
    for k in range(12):
        path = tmp_path / f"s{k}.parquet"
        pq.write_table(pa.table({f"c{k}_{i}": [i] for i in range(2_500)}), path)
        ds = al.dataset(str(path))
        assert len(list(ds.loader(1, output="arrow"))) == 1
        assert footer._per_schema_leaves <= footer._PER_SCHEMA_LEAVES
    assert sum(k[1][1] for k in footer._PER_SCHEMA) == footer._per_schema_leaves
