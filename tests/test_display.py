"""Rich display: the text repr and notebook HTML of Datasets, Loaders and profiles.

The HTML must be well formed (every tag closed, in order), escape whatever comes from the
data (column names, paths, filter text) and name every column of the schema. The numbers
it shows are checked against pyarrow's own reading of the footers, and showing a Dataset
must read no data: the counting filesystem sees nothing after the footers.
"""

from __future__ import annotations

import glob
import os
from html.parser import HTMLParser

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import arrowload as al
from _support import CountingLocalFileSystem

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class StrictHTML(HTMLParser):
    """Collects text; fails on an end tag that does not close the innermost open tag, on
    stray end tags, and (in ``check``) on tags left open."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.text: list[str] = []
        self.tags: list[str] = []
        self.errors: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.append(tag)

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1] if self.stack else 'nothing'}")
        else:
            self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)

    @classmethod
    def check(cls, markup: str) -> "StrictHTML":
        p = cls()
        p.feed(markup)
        p.close()
        assert not p.errors, p.errors
        assert not p.stack, f"tags left open: {p.stack}"
        assert "script" not in p.tags
        return p

    @property
    def all_text(self) -> str:
        return "".join(self.text)


def test_strict_parser_catches_broken_markup():
    with pytest.raises(AssertionError):
        StrictHTML.check("<div><table></div></table>")
    with pytest.raises(AssertionError):
        StrictHTML.check("<div><span>open")
    StrictHTML.check("<div><img src='x'/><br></div>")


def _row_groups(lake: str) -> list[tuple[int, int, int]]:
    """(file, row group, min id) of every row group, from pyarrow's own footer reading."""
    out = []
    for i, path in enumerate(sorted(glob.glob(os.path.join(lake, "*.parquet")))):
        meta = pq.ParquetFile(path).metadata
        id_col = meta.schema.names.index("id")
        for rg in range(meta.num_row_groups):
            out.append((i, rg, meta.row_group(rg).column(id_col).statistics.min))
    return out


def test_dataset_html_is_valid_and_names_every_column(parquet_lake):
    ds = al.dataset(parquet_lake)
    page = StrictHTML.check(ds._repr_html_())
    text = page.all_text
    for name in ds.schema.names:
        assert name in text
    groups = _row_groups(parquet_lake)
    assert f"{len(groups)} row groups" in text
    assert f"{len({f for f, _, _ in groups})} files" in text
    assert "arrowload.Dataset" in text


def test_repr_reports_what_pushdown_keeps(parquet_lake):
    ds = al.dataset(parquet_lake)
    sel = ds.filter("id < 4000").select("id", "f0", label="CAST(label AS INTEGER)")
    groups = _row_groups(parquet_lake)
    kept = sum(1 for _, _, lo in groups if lo < 4000)
    text = repr(sel)
    assert text.splitlines()[0] == f"arrowload.Dataset(parquet: {parquet_lake})"
    assert "columns: id: int64, f0: float, label: int32" in text
    assert f"{kept} of {len(groups)} row groups" in text
    assert f"3 of {len(ds.schema)} columns" in text          # id, f0 and label are read
    assert '"id" < 4000' in text                                # the pushed filter is named
    html = StrictHTML.check(sel._repr_html_()).all_text
    assert f"{kept} of {len(groups)} row groups" in html
    for name in ("id", "f0", "label"):
        assert name in html


def test_html_escapes_names_paths_and_filters(tmp_path):
    nasty = ['<b>bold</b>', 'a&b', 'quote"d', "<script>alert(1)</script>"]
    table = pa.table({n: [1, 2, 3] for n in nasty})
    path = tmp_path / "we<ird&dir"
    path.mkdir()
    pq.write_table(table, path / "part-0.parquet")
    ds = al.dataset(str(path)).filter('"<b>bold</b>" > 1')
    markup = ds._repr_html_()
    page = StrictHTML.check(markup)          # would fail on a raw <b> or <script>
    for n in nasty:
        assert n in page.all_text            # shown as text, decoded back exactly
    assert "we<ird&dir" in page.all_text
    assert "<b>bold" not in markup and "<script>" not in markup


def test_sql_and_memory_datasets_display(parquet_lake):
    events = al.dataset(parquet_lake)
    agg = al.sql("SELECT country, count(*) AS n FROM events GROUP BY country", events=events)
    page = StrictHTML.check(agg._repr_html_()).all_text
    assert "country" in page and "DuckDB" in page
    mem = al.dataset(pa.table({"x": [1, 2, 3], "y": ["a", "b", "c"]}))
    assert "x" in StrictHTML.check(mem._repr_html_()).all_text
    assert "3 rows" in repr(mem)


def test_display_never_raises(parquet_lake):
    def broken(batch):
        raise RuntimeError("boom")

    ds = al.dataset(parquet_lake).map(broken, columns=["id"])
    text = repr(ds)
    assert "schema unavailable" in text and "boom" in text
    page = StrictHTML.check(ds._repr_html_()).all_text
    assert "unavailable" in page


def test_showing_a_dataset_reads_no_data(parquet_lake):
    fs = CountingLocalFileSystem()
    ds = al.dataset(parquet_lake, filesystem=fs).filter("id < 4000 AND label = 1").select("f0", "label")
    ds.schema                                    # footers (read synchronously, no readahead)
    fs.reset()
    repr(ds)
    ds._repr_html_()
    assert fs.stats.bytes_read == 0


def test_loader_repr_and_html(parquet_lake, tmp_path):
    sel = al.dataset(parquet_lake).filter("label = 1").select("f0", "f1", "label")
    with sel.loader(64, shuffle="block", seed=3, cache_dir=str(tmp_path)) as loader:
        text = repr(loader)
        first = text.splitlines()[0]
        assert first.startswith("arrowload.Loader(batch_size=64, shuffle='block'")
        assert "shuffle   block" in text and "(seed 3)" in text
        assert f"{loader.num_rows:,} selected" in text
        page = StrictHTML.check(loader._repr_html_()).all_text
        for name in ("f0", "f1", "label"):
            assert name in page
        assert "block" in page
        for _ in zip(range(3), loader):
            pass
        assert "last run" in repr(loader)
        StrictHTML.check(loader._repr_html_())


def test_profile_html_is_valid(parquet_lake, tmp_path):
    pytest.importorskip("matplotlib")
    with al.dataset(parquet_lake).select("f0", "label").loader(256, cache_dir=str(tmp_path)) as loader:
        prof = loader.profile(5)
    page = StrictHTML.check(prof._repr_html_())
    assert "img" in page.tags
    assert prof.verdict().finding in page.all_text and prof.verdict().advice in page.all_text
    for group in ("readers", "producer", "consumer", "layout", "epoch"):
        assert group in page.all_text


# -- head() in a notebook -----------------------------------------------------------------------

def test_head_rows_html_golden_and_escaped():
    from arrowload.display import rows_html
    table = pa.table({"id": pa.array([1, 2, None], pa.int64()), "name<&>": ["<b>x</b>", "y" * 100, None],
                      "emb": pa.array([[0.5, 1.0, 2.0, 3.0, 4.0], [], None], pa.list_(pa.float32()))})
    markup = rows_html(table)
    parsed = StrictHTML.check(markup)
    assert "<b>" not in markup and "&lt;b&gt;x&lt;/b&gt;" in markup and "name&lt;&amp;&gt;" in markup
    assert "3 rows, 3 columns" in parsed.all_text and "int64" in parsed.all_text
    assert 'title="' + "y" * 100 + '"' in markup          # cut, with the full value as a tooltip
    assert "[0.5, 1.0, 2.0, 3.0, …]" in parsed.all_text
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden", "display", "head.html")
    if os.environ.get("ARROWLOAD_UPDATE_GOLDEN") == "1":
        with open(path, "w", encoding="utf-8") as f:
            f.write(markup)
    with open(path, encoding="utf-8") as f:
        assert markup == f.read(), "head.html differs from its golden snapshot (ARROWLOAD_UPDATE_GOLDEN=1)"


def test_head_rows_html_hides_middle_columns_past_40():
    from arrowload.display import rows_html
    table = pa.table({f"c{i}": [i] for i in range(50)})
    parsed = StrictHTML.check(rows_html(table))
    text = parsed.all_text
    assert "c0" in text and "c19" in text and "c20" not in text.replace("c20…", "") and "c49" in text
    assert "…" in text and "40 of 50 columns shown" in text


def test_head_displays_as_rows_in_ipython_and_stays_a_pyarrow_table(parquet_lake):
    pytest.importorskip("IPython")
    from IPython.core.interactiveshell import InteractiveShell

    from arrowload import display
    shell = InteractiveShell.instance()
    try:
        formatter = shell.display_formatter.formatters["text/html"]
        formatter.for_type(pa.Table, lambda t: "<i>someone's own</i>")  # a user's formatter stays in charge
        head = al.dataset(parquet_lake).select("id", "country").head(3)
        assert type(head) is pa.Table                                   # the contract: a pyarrow.Table
        assert head.equals(pq.read_table(min(glob.glob(os.path.join(parquet_lake, "*.parquet"))),
                                         columns=["id", "country"]).slice(0, 3))
        shown, _ = shell.display_formatter.format(head)
        StrictHTML.check(shown["text/html"])
        assert "arrowload-rows" in shown["text/html"] and ">country<" in shown["text/html"]
        other, _ = shell.display_formatter.format(pa.table({"x": [1]}))
        assert other.get("text/html") == "<i>someone's own</i>"
    finally:
        display._PREVIOUS.pop(id(shell), None)
        InteractiveShell.clear_instance()



# -- the loader's batch layout and golden displays -------------------------------------------

import re  # noqa: E402

from arrowload.pipeline.layout import of_batch, predicted  # noqa: E402


def _first(loader):
    it = iter(loader)
    try:
        return next(it)
    finally:
        it.close()


@pytest.mark.parametrize("kw", [
    {"stack": {"x": ["f0", "f1", "f2"]}},
    {"output": "arrow"},
    {"pad_lists": True},
    {"shuffle": "global"},
    {"drop_last": True, "world_size": 2, "rank": 1},
], ids=["stack", "arrow", "pad", "global", "ranks"])
def test_layout_matches_the_first_batch(parquet_lake, tmp_path, kw):
    """The layout shown before anything is read is the real first batch's (its keys,
    dtypes, shapes and devices, read off the arrays themselves)."""
    sel = al.dataset(parquet_lake).select("f0", "f1", "f2", "emb", "label", "text", "day")
    with sel.loader(128, cache_dir=str(tmp_path), **kw) as loader:
        shown = [k.text() for k in predicted(loader)]
        batch = _first(loader)
        text, html, explained = repr(loader), loader._repr_html_(), loader.explain()
        prof = loader.profile(2)
    if isinstance(batch, pa.RecordBatch):
        truth = [f"{n} {batch.column(i).type} [{len(batch)}] cpu" for i, n in enumerate(batch.schema.names)]
    else:
        truth = []
        for key, value in batch.items():
            if isinstance(value, list):
                truth.append(f"{key} list[{type(value[0]).__name__}] [{len(value)}] cpu")
            else:
                truth.append(f"{key} {value.dtype} [{', '.join(map(str, value.shape))}] cpu")
    assert shown == truth
    assert [k.text() for k in of_batch(batch)] == truth == [k.text() for k in prof.layout]
    page = StrictHTML.check(html).all_text
    for line in truth:
        assert line in text and line in explained and line in str(prof)
    for k in predicted(loader):
        assert k.key in page and k.dtype in page and "[" + ", ".join(map(str, k.shape)) + "]" in page
    n_batches = len(loader)
    assert f"{n_batches:,} batches" in text and "rows per rank" in text


def test_layout_torch(parquet_lake, tmp_path):
    torch = pytest.importorskip("torch")
    sel = al.dataset(parquet_lake).select("f0", "f1", "label")
    with sel.loader(64, output="torch", stack={"x": ["f0", "f1"]}, cache_dir=str(tmp_path)) as loader:
        shown = [k.text() for k in predicted(loader)]
        batch = _first(loader)
    assert isinstance(batch["x"], torch.Tensor)
    assert shown == [f"{k} {str(v.dtype).removeprefix('torch.')} [{', '.join(map(str, v.shape))}] {v.device}"
                     for k, v in batch.items()] == ["x float32 [64, 2] cpu", "label int8 [64] cpu"]


def _normalize(text: str, lake: str) -> str:
    text = text.replace(lake, "<lake>")
    text = re.sub(r"\d[\d,.]*\s?(s|ms|min)\b", "<t>", text)                 # durations
    text = re.sub(r"\d[\d.]*[kMG]? rows/s", "<rate>", text)                 # rates
    return text


GOLDEN_TEXT = """\
arrowload.Loader(batch_size=64, shuffle='block', rank=0/1, rows=<rows>, batches=<batches>, output='numpy', source=scan)
  shuffle   block, window of 8 units (seed 3)
  rows      <rows,> selected; rank 0 of 1
  batches   <batches> per epoch of 64 rows (drop_last=False)
  layout    x float32 [64, 2] cpu
            emb float32 [64, 8] cpu
            label int8 [64] cpu
  epoch     <batches> batches, <rows,> rows per rank
  position  epoch 0, 0 of <batches> batches delivered
  source    scan, 12 units
  output    numpy
  prefetch  256.0 MiB budget, reader threads autotuned, at most io_threads=2"""

GOLDEN_AFTER = """\
  epoch     <batches> batches, <rows,> rows per rank; epoch ~<t> at the last profile's <rate>"""

GOLDEN_HTML = (
    '<div class="arrowload-repr" style="font-family:monospace,monospace;font-size:12px"><div><strong>'
    'arrowload.Loader</strong> <span>batch_size=64, shuffle=block, output=numpy</span></div><table>'
    "<tbody><tr><td>shuffle</td><td>block, window of 8 units (seed 3)</td></tr>"
    "<tr><td>rows</td><td><rows,> selected; rank 0 of 1</td></tr>"
    "<tr><td>batches</td><td><batches> per epoch of 64 rows (drop_last=False)</td></tr>"
    "<tr><td>epoch</td><td><batches> batches, <rows,> rows per rank</td></tr>"
    "<tr><td>position</td><td>epoch 0, 0 of <batches> batches delivered</td></tr>"
    "<tr><td>source</td><td>scan, 12 units</td></tr><tr><td>output</td><td>numpy</td></tr>"
    "<tr><td>prefetch</td><td>256.0 MiB budget, reader threads autotuned, at most io_threads=2</td></tr>"
    "</tbody></table><details open><summary>batch layout (3 keys)</summary><table><thead><tr>"
    "<th>key</th><th>dtype</th><th>shape</th><th>device</th></tr></thead><tbody>"
    "<tr><td>x</td><td>float32</td><td>[64, 2]</td><td>cpu</td></tr>"
    "<tr><td>emb</td><td>float32</td><td>[64, 8]</td><td>cpu</td></tr>"
    "<tr><td>label</td><td>int8</td><td>[64]</td><td>cpu</td></tr></tbody></table></details>")


def test_loader_display_golden(parquet_lake, tmp_path):
    """The loader's own part of its text and HTML displays, exactly (the dataset part is
    the Dataset display's, tested above); counts from pyarrow, times normalized."""
    sel = al.dataset(parquet_lake).filter("label = 1").select("f0", "f1", "emb", "label")
    rows = pq.read_table(parquet_lake, columns=["label"]).column("label").to_pylist().count(1)
    batches = -(-rows // 64)

    def fill(golden: str) -> str:
        return (golden.replace("<rows,>", f"{rows:,}").replace("<rows>", f"{rows:_}")
                .replace("<batches>", str(batches)))

    with sel.loader(64, shuffle="block", seed=3, io_threads=2, stack={"x": ["f0", "f1"]},
                    cache_dir=str(tmp_path)) as loader:
        text = repr(loader)
        html = loader._repr_html_()
        loader.profile(3)
        after = repr(loader)
    own = text.split("\n  dataset:")[0]
    assert own == fill(GOLDEN_TEXT)
    page = re.sub(r' style="[^"]*"', "", html.split("<details><summary>dataset")[0])
    page = page.replace('<div class="arrowload-repr">', '<div class="arrowload-repr" style="font-family:monospace,'
                        'monospace;font-size:12px">')
    assert page == fill(GOLDEN_HTML)
    epoch = [ln for ln in _normalize(after, parquet_lake).splitlines() if ln.startswith("  epoch")]
    assert epoch == [fill(GOLDEN_AFTER)]
