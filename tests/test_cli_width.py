"""The CLI fits the terminal: ``head``, ``sql``, ``inspect``, ``explain`` and ``bench`` at 80
and 120 columns (``COLUMNS``, as a shell sets it).

Every line fits; a table too wide for the terminal hides its middle columns behind one
"…" column (as DuckDB and polars do) and says how many are shown, instead of cutting every
column into slivers; numbers carry thousands separators and units; paths are relative.
The text is pinned by golden snapshots under ``tests/golden/cli/`` (timings and snapshot
digests normalized); ``ARROWLOAD_UPDATE_GOLDEN=1`` rewrites them after a deliberate change.
Truth for the numbers: pyarrow's reading of the files.
"""

from __future__ import annotations

import os
import re

import pyarrow.parquet as pq
import pytest

from arrowload import cli
from arrowload.datagen import write_lake

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden", "cli")
WIDTHS = (80, 120)
ROWS = 20_000


@pytest.fixture(scope="module")
def lake_dir(tmp_path_factory) -> str:
    """A deterministic lake of 26 columns (datagen, seed 0) under a folder we chdir to."""
    root = tmp_path_factory.mktemp("width")
    write_lake(root / "lake", rows=ROWS, shards=4, row_group_size=4096)
    return str(root)


def _run(argv, width, lake_dir, capsys, monkeypatch) -> str:
    monkeypatch.setenv("COLUMNS", str(width))
    monkeypatch.setenv("ARROWLOAD_PROGRESS", "0")
    monkeypatch.chdir(lake_dir)
    capsys.readouterr()
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    too_long = [line for line in lines if len(line) > width]
    assert not too_long, "\n".join(too_long)
    return out


def _normalize(text: str) -> str:
    text = re.sub(r"files:[0-9a-f]{8,}", "files:<digest>", text)
    return re.sub(r"\d+\.\d{3}s", "<t>s", text)


def _golden(name: str, text: str) -> None:
    path = os.path.join(GOLDEN, name)
    text = _normalize(text)
    if os.environ.get("ARROWLOAD_UPDATE_GOLDEN") == "1":
        os.makedirs(GOLDEN, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    with open(path, encoding="utf-8") as f:
        assert text == f.read(), f"{name} differs from its golden snapshot (ARROWLOAD_UPDATE_GOLDEN=1 rewrites)"


def _header(out: str) -> list[str]:
    line = next(line for line in out.splitlines() if line.startswith("│ "))
    return [cell.strip() for cell in line.strip("│").split("┆")]


@pytest.mark.parametrize("width", WIDTHS)
def test_head_hides_middle_columns_behind_an_ellipsis(width, lake_dir, capsys, monkeypatch):
    out = _run(["head", "lake", "-n", "5"], width, lake_dir, capsys, monkeypatch)
    names = pq.read_schema(os.path.join(lake_dir, "lake", "part-00000.parquet")).names
    header = _header(out)
    assert "…" in header                                   # columns are hidden, and it says so
    shown = [h for h in header if h != "…"]
    assert shown == names[:len(shown) - len(shown) // 2] + names[len(names) - len(shown) // 2:]
    assert len(shown) >= 4                                   # whole columns, not 3-character slivers
    assert f"(5 rows; {len(shown)} of {len(names)} columns shown: --columns A,B picks others" in " ".join(out.split())
    first = pq.read_table(os.path.join(lake_dir, "lake", "part-00000.parquet")).slice(0, 5)
    ids = [int(line.split("┆")[0].strip("│ ")) for line in out.splitlines()
           if line.startswith("│ ") and line.split("┆")[0].strip("│ ").isdigit()]
    assert ids == first.column("id").to_pylist()
    _golden(f"head-{width}.txt", out)


@pytest.mark.parametrize("width", WIDTHS)
def test_head_shows_every_column_that_fits(width, lake_dir, capsys, monkeypatch):
    out = _run(["head", "lake", "-n", "3", "--columns", "id,country,label,f0"], width, lake_dir, capsys,
               monkeypatch)
    assert _header(out) == ["id", "country", "label", "f0"] and "columns shown" not in out
    assert "(3 rows)" in out


@pytest.mark.parametrize("width", WIDTHS)
def test_sql(width, lake_dir, capsys, monkeypatch):
    out = _run(["sql", "SELECT * FROM events WHERE id < 3 ORDER BY id", "--table", "events=lake"],
               width, lake_dir, capsys, monkeypatch)
    assert "…" in _header(out) and "(3 rows; " in out and "SELECT fewer columns" in " ".join(out.split())
    _golden(f"sql-{width}.txt", out)


@pytest.mark.parametrize("width", WIDTHS)
def test_inspect(width, lake_dir, capsys, monkeypatch):
    out = _run(["inspect", os.path.join(lake_dir, "lake")], width, lake_dir, capsys, monkeypatch)
    assert out.splitlines()[0] == "parquet: lake"          # relative to the working directory
    meta = [pq.read_metadata(os.path.join(lake_dir, "lake", f"part-0000{k}.parquet")) for k in range(4)]
    assert f"{sum(m.num_rows for m in meta):,} rows" in out
    for m, k in zip(meta, range(4)):
        row = next(line for line in out.splitlines() if line.startswith(f"│ part-0000{k}.parquet"))
        assert f" {m.num_rows:,} " in row
    assert "2.3 MiB" in out and "9.2 MiB compressed" in out
    _golden(f"inspect-{width}.txt", out)


@pytest.mark.parametrize("width", WIDTHS)
def test_explain(width, lake_dir, capsys, monkeypatch):
    out = _run(["explain", "lake", "--columns", "f0,f1,label,country,user_id,ts,price",
                "--filter", "country = 'US' AND label = 1 AND ts >= DATE '2024-01-03'"],
               width, lake_dir, capsys, monkeypatch)
    assert "  applied: predicate_pushdown, projection_pushdown" in out
    assert re.search(r"rows +\d{1,3},\d{3} before the filter", out)
    _golden(f"explain-{width}.txt", out)


@pytest.mark.parametrize("width", WIDTHS)
def test_bench_fits(width, lake_dir, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("ARROWLOAD_CACHE_DIR", str(tmp_path))
    out = _run(["bench", "lake", "--columns", "f0,f1,label", "--filter", "country = 'US'"],
               width, lake_dir, capsys, monkeypatch)
    assert out.splitlines()[0] == "bench: parquet: lake"
    assert re.search(r"arrowload loader +\d{1,3},\d{3} ", out)
    assert "batch_size=1,024" in out


def test_long_lines_break_at_word_boundaries():
    from arrowload.tables import wrap, wrap_lines
    text = ("reads    4 of 4 files, 8 of 8 row groups, 4 of 26 columns, ~215.9 KiB of 9.2 MiB (2.3%) "
            "and a_path/that/is/far/longer/than/any/line/of/the/terminal/at/all/really/not/short.parquet")
    out = wrap(text, 40, indent="")
    words = text.split()
    assert all(len(line) <= 40 for line in out.splitlines())
    # every word survives whole, except the one longer than a line; numbers stay with units
    assert [w for w in words if len(w) <= 40] == [w for w in out.split() if w in words]
    assert "9.2 MiB" in out.replace("\n", "\n ") or any("9.2 MiB" in line for line in out.splitlines())
    shaped = wrap_lines("  bottleneck  " + "word " * 30, 40)
    assert all(line.startswith("              ") for line in shaped.splitlines()[1:])
