""""Read as little as possible", measured: bytes that pyarrow actually pulled through a
counting fsspec filesystem (``_support.CountingLocalFileSystem``), passed to arrowload as
any user would pass a filesystem, compared with what the files hold (Parquet metadata,
read independently) and with what plain ``pyarrow.dataset`` reads through the same kind
of filesystem. Every claim also checks the rows against plain pyarrow.

A note on footers: pyarrow fetches each Parquet footer with one speculative read of the
file's last 64 KiB (``_support.PYARROW_FOOTER_READ``), larger than the footers here (a
few KiB). The tests therefore call a read a *footer read* when it ends at the end of the
file, covers the whole footer and is no longer than that fetch; every other read is a
*data read*.
"""

from __future__ import annotations

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds
import pyarrow.parquet as pq
import pytest

import arrowload as al
from arrowload.datagen import write_lake
from _support import PYARROW_FOOTER_READ, CountingLocalFileSystem, lake_facts

ROWS, SHARDS, ROW_GROUP = 100_000, 8, 2048


# Each Parquet footer is read twice when a source is planned: pyarrow's own fetch, and
# arrowload's read of the same tail, decoded in Python before pyarrow touches column chunk
# metadata (pyarrow aborts the process on encrypted or damaged column metadata; see
# arrowload/source/footer.py). Both happen once per file and source, before any data read.
FOOTER_READS_PER_FILE = 2

@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    """8 shards of 12,500 rows, row groups of 2,048 rows (7 per file, ids ascending)."""
    path = tmp_path_factory.mktemp("bytes_lake")
    write_lake(path, rows=ROWS, shards=SHARDS, row_group_size=ROW_GROUP, emb_dim=16)
    return str(path), lake_facts(str(path))


@pytest.fixture(scope="module")
def hive(tmp_path_factory):
    """The events partitioned by country; files large enough that a footer fetch is not
    the whole file for most partitions."""
    path = tmp_path_factory.mktemp("bytes_hive")
    write_lake(path, rows=60_000, shards=2, row_group_size=8192, emb_dim=16,
               partition_by="country")
    return str(path), lake_facts(str(path))


def fresh(root: str):
    """A new counting filesystem and a new Dataset over it (no footer cached yet, nor a
    footer check remembered from an earlier dataset in this process)."""
    from arrowload.source.footer import forget_checks
    forget_checks()
    fs = CountingLocalFileSystem()
    return fs, al.dataset(root, filesystem=fs)


def footers_loaded(root: str):
    """A Dataset whose footers are already fetched, with the counters then reset."""
    fs, ds = fresh(root)
    ds.schema
    fs.reset()
    return fs, ds


def split_reads(fs, facts):
    """(footer reads, data reads) of everything ``fs`` recorded."""
    footer, data = [], []
    for r in fs.stats.reads:
        (footer if facts[r.path].is_footer_read(r) else data).append(r)
    return footer, data


def plain(root: str, **kw) -> pds.Dataset:
    return pds.dataset(root, format="parquet", **kw)


# ---------------------------------------------------------------------------
# head


def test_head_reads_one_row_group(lake):
    root, facts = lake
    first = next(iter(facts.values()))

    fs, ds = fresh(root)
    got = ds.head(5)
    al_bytes = fs.stats.bytes_read
    footer, data = split_reads(fs, facts)

    # the rows: the first five in source order, as plain pyarrow reads them
    assert got.equals(plain(root).head(5))

    # the first file's footer (it holds 5 rows: no other footer is read), then one row
    # group of that file, nothing else
    assert len(footer) == FOOTER_READS_PER_FILE and {r.path for r in footer} == {first.path}
    assert {r.path for r in data} == {first.path}
    start, end = first.row_group_range(0)
    assert all(start <= r.offset and r.offset + r.nbytes <= end for r in data)
    rg0 = first.chunk_bytes(row_groups=[0])
    data_bytes = sum(r.nbytes for r in data)
    assert 0.9 * rg0 <= data_bytes <= rg0, (data_bytes, rg0)
    # about one row group's worth: less than the data of a single file
    assert al_bytes < first.size - first.footer

    # plain pyarrow, through the same kind of counting filesystem
    pfs = CountingLocalFileSystem()
    pa_head = plain(root, filesystem=pfs).head(5)
    pa_bytes = pfs.stats.bytes_read  # what it had read when head() returned
    pfs.stats.settle(quiet_s=1.0)  # its readahead goes on reading in the background
    assert pa_head.equals(got)
    assert al_bytes * 2 < pa_bytes, (al_bytes, pa_bytes)
    print(f"\nhead(5): arrowload {al_bytes} B ({data_bytes} B data = row group 0 of "
          f"{rg0} B); plain pyarrow {pa_bytes} B when head() returned, "
          f"{pfs.stats.bytes_read} B after its readahead settled")


def test_head_of_a_folder_reads_footers_in_file_order_and_stops(tmp_path):
    """``head(n)`` of a freshly opened folder of 50 files opens the first file only (its
    footer holds the rows, so no later footer is read); more rows read footers in file
    order up to the file that completes them. Rows as plain pyarrow reads them."""
    write_lake(tmp_path, rows=50 * 400, shards=50, row_group_size=200, emb_dim=4)
    root = str(tmp_path)
    paths = sorted(str(p) for p in tmp_path.glob("*.parquet"))
    assert len(paths) == 50

    fs, ds = fresh(root)
    got = ds.head(5)
    assert got.equals(plain(root).head(5))
    assert set(fs.stats.opens) == {paths[0]}, sorted(fs.stats.opens)

    fs, ds = fresh(root)
    got = ds.head(1000)  # 400 rows a file: the first three files
    assert got.equals(plain(root).head(1000))
    assert set(fs.stats.opens) == set(paths[:3]), sorted(fs.stats.opens)

    fs, ds = fresh(root)
    assert ds.schema == plain(root).schema  # footers known: head reads no other footer
    fs.reset()
    assert ds.head(5).equals(plain(root).head(5))
    assert set(fs.stats.opens) == {paths[0]}


def test_head_has_the_same_columns_whether_or_not_the_schema_was_read_first(tmp_path):
    """Shards that differ: ``head(n)`` takes the columns of the files that hold its rows
    (as pyarrow's scan takes the first file's), and that answer does not depend on whether
    ``schema`` (which unifies every file) was asked before. Truth: pyarrow on those files."""
    pq.write_table(pa.table({"a": [1, 2, 3]}), tmp_path / "p0.parquet")
    pq.write_table(pa.table({"a": [4], "b": ["x"]}), tmp_path / "p1.parquet")
    fresh_head = al.dataset(str(tmp_path)).head(2)
    seen = al.dataset(str(tmp_path))
    assert seen.schema.names == ["a", "b"]
    assert seen.head(2).equals(fresh_head)
    assert fresh_head.equals(pq.read_table(tmp_path / "p0.parquet").slice(0, 2))
    both = seen.head(4)  # needs both files: their unified columns
    assert both.schema.names == ["a", "b"] and both.column("b").to_pylist() == [None, None, None, "x"]

def test_head_of_selection_reads_only_selected_columns(lake):
    root, facts = lake
    first = next(iter(facts.values()))
    fs, ds = footers_loaded(root)
    got = ds.select("id", "f1").head(3)
    assert got.equals(plain(root).head(3, columns=["id", "f1"]))
    assert set(fs.stats.bytes_by_path()) == {first.path}
    assert first.chunk_bytes({"id", "f1"}, [0]) <= fs.stats.bytes_read \
        <= first.pre_buffer_bytes({"id", "f1"}, [0])


def test_head_past_a_residual_filter_or_a_map_stops_early(lake):
    """A limit cannot move past a polars UDF filter or a map, yet head() must still stop
    after the row groups it needed, with no readahead through the rest of the lake."""
    root, facts = lake
    first = next(iter(facts.values()))
    udf = pl.col("f0").map_batches(lambda s: s, return_dtype=pl.Float32) > 0

    fs, ds = footers_loaded(root)
    got = ds.filter(udf).select("id", "f0").head(5)
    fs.stats.settle()  # count whatever was still being read in the background, too
    t = plain(root).head(1000, columns=["id", "f0"])
    assert got.equals(t.filter(pc.field("f0") > 0).slice(0, 5))
    assert set(fs.stats.bytes_by_path()) == {first.path}
    assert fs.stats.bytes_read <= first.chunk_bytes(None, [0])

    fs, ds = footers_loaded(root)
    got = ds.map(lambda b: b.select(["id", "label"]), name="pick").head(5)
    fs.stats.settle()
    assert got.equals(plain(root).head(5, columns=["id", "label"]))
    assert set(fs.stats.bytes_by_path()) == {first.path}
    assert fs.stats.bytes_read <= first.chunk_bytes(None, [0])


# ---------------------------------------------------------------------------
# count


def test_count_reads_only_footers(lake):
    root, facts = lake
    fs, ds = fresh(root)
    n = ds.count()
    assert n == plain(root).count_rows() == ROWS

    footer, data = split_reads(fs, facts)
    assert data == [], f"count() read data pages: {data[:3]}"
    assert sorted(r.path for r in footer) == sorted(FOOTER_READS_PER_FILE * list(facts))  # each footer once (x2)
    assert all(c == FOOTER_READS_PER_FILE for c in fs.stats.opens.values())
    footers = sum(f.footer for f in facts.values())
    # footer sizes plus pyarrow's speculative tail (at most one 64 KiB read per file)
    assert fs.stats.bytes_read <= FOOTER_READS_PER_FILE * (footers + len(facts) * PYARROW_FOOTER_READ)
    assert fs.stats.bytes_read * (20 // FOOTER_READS_PER_FILE) < sum(f.size for f in facts.values())

    print(f"\ncount(): {len(footer)} footer reads, {fs.stats.bytes_read} B "
          f"(the footers themselves: {footers} B; the files: "
          f"{sum(f.size for f in facts.values())} B)")
    fs.reset()
    assert ds.count() == ROWS and fs.stats.bytes_read == 0  # footers are cached


def test_a_second_dataset_over_the_same_files_reads_each_footer_once(lake):
    """The footer check (source/footer.py) is remembered per file version (path, size,
    mtime, identity) in the process once made (here by row-group pruning): a new dataset
    over the unchanged files reads pyarrow's footer only."""
    root, facts = lake
    fresh(root)[1].filter("id < 5000").count()
    fs = CountingLocalFileSystem()
    assert al.dataset(root, filesystem=fs).count() == ROWS
    footer, data = split_reads(fs, facts)
    assert data == [] and sorted(r.path for r in footer) == sorted(facts)


def test_filtered_count_reads_only_the_filter_column_of_kept_row_groups(lake):
    root, facts = lake
    fs, ds = footers_loaded(root)
    n = ds.filter("id < 5000").count()
    assert n == plain(root).count_rows(filter=pc.field("id") < 5000) == 5000
    kept = [(f, rg) for f in facts.values() for rg in range(f.num_row_groups)
            if f.stats("id", rg).min < 5000]
    id_bytes = sum(f.chunk_bytes({"id"}, [rg]) for f, rg in kept)
    assert 0 < fs.stats.bytes_read <= id_bytes, (fs.stats.bytes_read, id_bytes)


def test_filtered_count_reads_no_row_group_that_checked_statistics_decide(lake):
    """``id < 5000`` on ascending ids: row groups whose checked statistics say every id is
    below 5000 are counted from the footer; only the row groups straddling 5000 are read
    (the id column alone). The count is the truth's, DuckDB's and plain pyarrow's."""
    root, facts = lake
    fs, ds = footers_loaded(root)
    n = ds.filter("id < 5000").count()
    assert n == plain(root).count_rows(filter=pc.field("id") < 5000) == 5000
    straddling = [(f, rg) for f in facts.values() for rg in range(f.num_row_groups)
                  if f.stats("id", rg).min < 5000 <= f.stats("id", rg).max]
    all_true = [(f, rg) for f in facts.values() for rg in range(f.num_row_groups)
                if f.stats("id", rg).max < 5000]
    assert straddling and all_true
    id_bytes = sum(f.chunk_bytes({"id"}, [rg]) for f, rg in straddling)
    assert 0 < fs.stats.bytes_read <= id_bytes, (fs.stats.bytes_read, id_bytes)


def test_loader_reads_no_filter_column_of_row_groups_checked_statistics_keep_whole(lake, tmp_path, monkeypatch):
    """``id < 5000`` on ascending ids, ``id`` not selected: a row group whose checked
    statistics put every id below 5000 is read without the predicate (its ``id`` chunk never
    read, its rows not filtered), as DuckDB skips a filter its zone maps prove true; only the
    straddling row groups read ``id``. The rows are plain pyarrow's, in order."""
    monkeypatch.setenv("ARROWLOAD_DECODER", "pyarrow")  # one decoder: no measured trial reads
    root, facts = lake
    fs, ds = footers_loaded(root)
    got = pa.Table.from_batches(list(ds.filter("id < 5000").select("f0", "label").loader(
        1000, output="arrow", cache_dir=str(tmp_path))))
    truth = plain(root).to_table(columns=["f0", "label"], filter=pc.field("id") < 5000)
    assert got.equals(truth)
    whole = [(p, rg) for p, f in facts.items() for rg in range(f.num_row_groups)
             if f.stats("id", rg).max < 5000]
    straddling = [(p, rg) for p, f in facts.items() for rg in range(f.num_row_groups)
                  if f.stats("id", rg).min < 5000 <= f.stats("id", rg).max]
    assert whole and straddling

    def id_reads(cells):
        spans = {(p, span) for p, rg in cells for span in facts[p].chunk_spans({"id"}, [rg])}
        return [r for r in fs.stats.reads for p, (a, b) in spans
                if r.path == p and r.offset < b and a < r.offset + r.nbytes]
    assert not id_reads(whole)
    assert id_reads(straddling)


def test_float_filters_are_counted_by_reading(tmp_path):
    """Float statistics leave NaN out of min / max: a row group with {1.0, NaN} has max 1.0,
    and "all rows <= 10" would count the NaN row, which DuckDB's order (NaN above every
    number) rejects. Such counts read the column; the answer is DuckDB's."""
    import duckdb
    import pyarrow.parquet as pq
    path = str(tmp_path / "nan.parquet")
    pq.write_table(pa.table({"f": [1.0, float("nan"), 2.0, 3.0]}), path, row_group_size=2)
    # the truth: DuckDB over the rows as Arrow (its own Parquet reader trusts the statistics
    # here and counts the NaN row too, against its own NaN order)
    rows = pq.read_table(path)  # noqa: F841 - scanned by DuckDB by name
    want = duckdb.sql("SELECT count(*) FROM rows WHERE f <= 10").fetchall()[0][0]
    assert want == 3
    assert al.dataset(path).filter("f <= 10").count() == want
    assert al.dataset(path).filter("f <= 10").to_arrow().num_rows == want


# ---------------------------------------------------------------------------
# filters: row-group pruning


def test_selective_filter_reads_a_small_fraction(lake):
    root, facts = lake
    cols = ["id", "f0", "emb"]
    expected = plain(root).to_table(filter=pc.field("id") < 5000, columns=cols)

    fs, ds = footers_loaded(root)
    sel = ds.filter("id < 5000").select(*cols)
    text = sel.explain()
    assert fs.stats.bytes_read == 0  # explain reads no data
    got = sel.to_arrow()
    assert got.equals(expected)
    filtered = fs.stats.bytes_read

    fs.reset()
    assert ds.select(*cols).to_arrow().num_rows == ROWS
    full = fs.stats.bytes_read

    # the truth from the files: row groups whose id statistics admit id < 5000
    kept = [(f, rg) for f in facts.values() for rg in range(f.num_row_groups)
            if f.stats("id", rg).min < 5000]
    total_rgs = sum(f.num_row_groups for f in facts.values())
    kept_bytes = sum(f.chunk_bytes(set(cols), [rg]) for f, rg in kept)
    assert f"row_group_pruning  row groups {total_rgs} -> {len(kept)}" in text
    assert f"row groups  {len(kept)} of {total_rgs}" in text
    # exactly the kept row groups' chunks of these columns (plus the small holes between
    # them that pyarrow's pre_buffer reads across)
    assert kept_bytes <= filtered <= sum(f.pre_buffer_bytes(set(cols), [rg]) for f, rg in kept)
    assert filtered * 10 < full, (filtered, full)
    print(f"\nfilter id < 5000: {filtered} B vs full scan of the same columns {full} B "
          f"({len(kept)} of {total_rgs} row groups)")


def test_row_group_pruning_switched_off_reads_more_and_returns_the_same(lake):
    root, _ = lake
    off = al.Options(optimizer=al.OptimizerOptions(row_group_pruning=False,
                                                   predicate_pushdown=False))
    fs, ds = footers_loaded(root)
    sel = ds.filter("id >= 97000 AND f0 > 0").select("id", "f0")
    on_rows = sel.to_arrow()
    on_bytes = fs.stats.bytes_read
    fs.reset()
    off_rows = sel.with_options(off).to_arrow()
    off_bytes = fs.stats.bytes_read
    expected = plain(root).to_table(filter=(pc.field("id") >= 97000) & (pc.field("f0") > 0),
                                    columns=["id", "f0"])
    assert on_rows.equals(expected) and off_rows.equals(expected)
    assert on_bytes * 5 < off_bytes, (on_bytes, off_bytes)


# ---------------------------------------------------------------------------
# projection


def test_one_column_select_reads_that_column(lake):
    root, facts = lake
    fs, ds = fresh(root)
    got = ds.select("f3").to_arrow()
    assert got.equals(plain(root).to_table(columns=["f3"]))

    footer, data = split_reads(fs, facts)
    f3 = sum(f.chunk_bytes({"f3"}) for f in facts.values())
    everything = sum(f.chunk_bytes() for f in facts.values())
    data_bytes = sum(r.nbytes for r in data)
    assert len(footer) == FOOTER_READS_PER_FILE * len(facts)
    assert f3 <= data_bytes <= f3 * 1.02 + 4096, (data_bytes, f3)
    assert fs.stats.bytes_read <= f3 * 1.02 + 4096 + FOOTER_READS_PER_FILE * len(facts) * PYARROW_FOOTER_READ
    assert fs.stats.bytes_read * 5 < everything
    # each data read lies inside an f3 column chunk
    for r in data:
        spans = facts[r.path].chunk_spans({"f3"})
        assert any(s <= r.offset and r.offset + r.nbytes <= e for s, e in spans), r
    print(f"\nselect(f3): {data_bytes} B data (f3 chunks: {f3} B) + "
          f"{fs.stats.bytes_read - data_bytes} B footers; all columns: {everything} B")


def test_computed_column_reads_only_its_inputs(lake):
    root, facts = lake
    fs, ds = footers_loaded(root)
    got = ds.select(s="f1 + f2").to_arrow()
    t = plain(root).to_table(columns=["f1", "f2"])
    assert got.column("s").equals(pc.add(t.column("f1"), t.column("f2")))
    inputs = sum(f.chunk_bytes({"f1", "f2"}) for f in facts.values())
    assert inputs <= fs.stats.bytes_read <= sum(f.pre_buffer_bytes({"f1", "f2"})
                                                for f in facts.values())


# ---------------------------------------------------------------------------
# partitions


def test_partition_pruning_never_reads_other_partitions(hive):
    root, facts = hive
    mine = {p for p in facts if "/country=DE/" in p}
    others = set(facts) - mine
    assert mine and others
    cols = ["id", "country", "f0"]
    expected = plain(root, partitioning="hive").to_table(
        filter=(pc.field("country") == "DE") & (pc.field("label") == 1), columns=cols)

    # fresh: planning fetches every footer (the schema is the union of all shards), but a
    # file of another partition gets that one footer read and nothing else
    fs, ds = fresh(root)
    sel = ds.filter("country = 'DE' AND label = 1").select(*cols)
    got = sel.to_arrow()
    assert got.equals(expected)
    for p in others:
        reads = fs.stats.reads_of(p)
        assert fs.stats.opens[p] == FOOTER_READS_PER_FILE and len(reads) == FOOTER_READS_PER_FILE, (p, reads)
        assert all(facts[p].is_footer_read(r) for r in reads), reads
    data_paths = {r.path for r in split_reads(fs, facts)[1]}
    assert data_paths and data_paths <= mine

    # footers known: the query opens the DE files only
    fs, ds = footers_loaded(root)
    sel = ds.filter("country = 'DE' AND label = 1").select(*cols)
    assert "partition_pruning  files" in sel.explain()
    assert sel.to_arrow().equals(expected)
    assert set(fs.stats.opens) == mine
    needed = {"id", "label", "f0"}
    assert sum(facts[p].chunk_bytes(needed) for p in mine) <= fs.stats.bytes_read \
        <= sum(facts[p].pre_buffer_bytes(needed) for p in mine)

    # and a count over one partition is answered from footers alone
    fs.reset()
    assert ds.filter("country = 'DE'").count() == plain(root, partitioning="hive").count_rows(
        filter=pc.field("country") == "DE")
    assert fs.stats.bytes_read == 0
    print(f"\nhive country = 'DE': opened {len(mine)} of {len(facts)} files, "
          f"{got.num_rows} rows")


def test_partition_and_row_group_pruning_combine(hive):
    root, facts = hive
    fs, ds = footers_loaded(root)
    sel = ds.filter("country = 'FR' AND id < 9000").select("id", "country")
    text = sel.explain()
    assert "partition_pruning" in text and "row_group_pruning" in text
    expected = plain(root, partitioning="hive").to_table(
        filter=(pc.field("country") == "FR") & (pc.field("id") < 9000), columns=["id", "country"])
    assert sel.to_arrow().equals(expected)
    fr = [p for p in facts if "/country=FR/" in p]
    kept = [(facts[p], rg) for p in fr for rg in range(facts[p].num_row_groups)
            if facts[p].stats("id", rg).min < 9000]
    assert set(fs.stats.opens) <= {f.path for f, _ in kept}
    assert fs.stats.bytes_read <= sum(f.chunk_bytes({"id"}, [rg]) for f, rg in kept)


def test_schema_matches_plain_pyarrow(lake):
    """The comparisons above use ``Table.equals``, which compares schemas too; the
    schemas agree from the start."""
    root, _ = lake
    _, ds = fresh(root)
    assert ds.schema == plain(root).schema
    assert isinstance(ds.head(1), pa.Table)
