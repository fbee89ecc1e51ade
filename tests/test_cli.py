"""The ``arrowload`` console script, run for real in a subprocess.

Each subcommand is checked against an independent truth where it prints numbers
(DuckDB over the same files, pyarrow's reading of the footers), and every failure mode
against the exit-status contract: 0 success, 2 usage / arrowload errors with one
``arrowload: error:`` line and no traceback, 1 unexpected errors. Starting Python costs
seconds here, so cheap checks (``--help`` of every command, the exit-1 path) run
in-process through ``arrowload.cli.main``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from arrowload import cli
from conftest import ROWS, duck, parquet_scan

COMMANDS = ("demo", "inspect", "head", "sql", "explain", "bench")


def _script() -> list[str]:
    """The console script installed next to this interpreter (what `pip install` made)."""
    here = os.path.join(os.path.dirname(sys.executable), "arrowload")
    if os.path.exists(here):
        return [here]
    found = shutil.which("arrowload")
    return [found] if found else [sys.executable, "-m", "arrowload.cli"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("cli")
    env = dict(os.environ, ARROWLOAD_PROGRESS="0", ARROWLOAD_CACHE_DIR=str(cwd / "cache"))

    def run(*args: str, rc: int = 0) -> subprocess.CompletedProcess:
        proc = subprocess.run(_script() + list(args), cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == rc, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
        assert "Traceback" not in proc.stderr
        return proc

    run.cwd = cwd
    return run


def _error_line(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert lines and lines[0].startswith("arrowload: error: "), proc.stderr
    return lines[0]


# -- subcommands ----------------------------------------------------------------------------

def test_inspect(run, parquet_lake):
    out = run("inspect", parquet_lake, "--files", "0").stdout
    for name in sorted(os.listdir(parquet_lake)):
        assert name in out
    truth = duck(f"SELECT count(*) AS n, count(*) - count(country) AS nulls, min(f0) AS lo "
                 f"FROM {parquet_scan(parquet_lake)}").to_pylist()[0]
    assert f"{truth['n']:,} rows" in out
    for col in ("id", "country", "emb", "price", "score"):
        assert f"│ {col} " in out
    country = next(line for line in out.splitlines() if line.startswith("│ country "))
    assert f" {truth['nulls']} " in country and "footer" in country


def test_inspect_exact(capsys, parquet_lake):
    assert cli.main(["inspect", parquet_lake, "--exact", "--columns", "country,label"]) == 0
    out = capsys.readouterr().out
    assert "one scan" in out and "│ country " in out and "│ f0 " not in out


def test_head(run, parquet_lake):
    out = run("head", parquet_lake, "-n", "3", "--columns", "id,f0", "--filter", "id >= 100").stdout
    ids = [int(line.split("┆")[0].strip("│ ")) for line in out.splitlines()
           if line.startswith("│ ") and line.split("┆")[0].strip("│ ").isdigit()]
    assert ids == [100, 101, 102]
    assert "f0" in out and "country" not in out


def test_sql_prints_the_result(run, parquet_lake):
    proc = run("sql", "SELECT label, count(*) AS n FROM events GROUP BY label ORDER BY label",
               "--table", f"events={parquet_lake}")
    truth = duck(f"SELECT label, count(*) AS n FROM {parquet_scan(parquet_lake)} "
                 "GROUP BY label ORDER BY label").to_pylist()
    for row in truth:
        assert any(line.startswith(f"│ {row['label']} ") and f" {row['n']} " in line
                   for line in proc.stdout.splitlines()), proc.stdout
    assert "(2 rows)" in proc.stdout


def test_sql_explain(capsys, parquet_lake):
    assert cli.main(["sql", "SELECT id FROM events WHERE id < 10", "--table", f"events={parquet_lake}",
                     "--explain"]) == 0
    plan = capsys.readouterr().out
    assert "== optimized plan ==" in plan and '"id" < 10' in plan


def test_explain(run, parquet_lake):
    out = run("explain", parquet_lake, "--columns", "f0,label", "--filter", "id < 4000",
              "--batch-size", "256", "--shuffle", "block").stdout
    assert "== scan 0" in out and "prune_row_groups" in out
    assert "== loader ==" in out and "block" in out


def test_bench_json_matches_the_data(run, parquet_lake):
    proc = run("bench", parquet_lake, "--columns", "f0,f1,label", "--filter", "country = 'US'",
               "--batch-size", "512", "--shuffle", "block", "--json")
    result = json.loads(proc.stdout)
    truth = duck(f"SELECT count(*) AS n FROM {parquet_scan(parquet_lake)} WHERE country = 'US'").to_pylist()[0]
    assert result["loader"]["rows"] == result["scan"]["rows"] == truth["n"]
    assert result["loader"]["batches"] == -(-truth["n"] // 512)
    assert result["shuffle"] == "block" and result["columns"] == ["f0", "f1", "label"]
    for side in ("loader", "scan"):
        assert result[side]["rows_per_s"] > 0 and result[side]["mb_per_s"] > 0


def test_bench_text(capsys, monkeypatch, tmp_path, parquet_lake):
    monkeypatch.setenv("ARROWLOAD_CACHE_DIR", str(tmp_path))
    assert cli.main(["bench", parquet_lake, "--columns", "id,f0", "--shuffle", "global",
                     "--batch-size", "1000"]) == 0
    out = capsys.readouterr().out
    assert "pyarrow scan (tuned)" in out and "arrowload loader" in out
    assert "rows/s" in out and "MB/s" in out and "bottleneck" in out
    assert f"{ROWS:,}" in out


def test_demo(run):
    out = run("demo", "--dir", "lake", "--rows", "30000").stdout
    assert "writing a synthetic lake" in out and "count():" in out and "to_arrow():" in out
    assert os.path.exists(os.path.join(run.cwd, "lake", ".arrowload-demo"))


# -- errors and exit status -------------------------------------------------------------------

def test_arrowload_errors_exit_2_with_one_line(run, parquet_lake):
    line = _error_line(run("head", os.path.join(parquet_lake, "missing"), rc=2))
    assert "missing" in line
    line = _error_line(run("head", parquet_lake, "--columns", "id,nope", rc=2))
    assert "'nope'" in line


@pytest.mark.parametrize("argv, says", [
    (["sql", "SELECT * FROM nowhere", "--table", "events=LAKE"], "'nowhere' is not bound"),
    (["sql", "SELECT 1", "--table", "events"], "NAME=PATH"),
    (["sql", "SELECT 1", "--table", "1x=LAKE"], "not a valid SQL identifier"),
    (["inspect", "LAKE/nothing-here"], "nothing-here"),
])
def test_more_arrowload_errors(capsys, parquet_lake, argv, says):
    assert cli.main([a.replace("LAKE", parquet_lake) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("arrowload: error: ") and says in err and "Traceback" not in err


def test_usage_errors_exit_2(run, capsys):
    proc = run("frobnicate", rc=2)
    assert "usage: arrowload" in proc.stderr
    with pytest.raises(SystemExit) as exit_:
        cli.main(["head"])
    assert exit_.value.code == 2
    assert "the following arguments are required: PATH" in capsys.readouterr().err


def test_help_for_every_command(capsys):
    for argv in ([], *([c] for c in COMMANDS)):
        with pytest.raises(SystemExit) as exit_:
            cli.main(argv + ["--help"])
        assert exit_.value.code == 0
        out = capsys.readouterr().out
        assert out.startswith("usage: arrowload" + (f" {argv[0]}" if argv else ""))
    with pytest.raises(SystemExit) as exit_:
        cli.main(["head", "somewhere", "-n", "0"])
    assert exit_.value.code == 2


def test_bad_filter_points_at_the_problem(capsys, parquet_lake):
    assert cli.main(["head", parquet_lake, "--filter", "label = = 1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("arrowload: error: cannot parse filter")


def test_unexpected_errors_exit_1(monkeypatch, capsys, parquet_lake):
    def boom(args):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(cli, "_head", boom)
    assert cli.main(["head", parquet_lake]) == 1
    err = capsys.readouterr().err
    assert "unexpected error: RuntimeError: kaboom" in err and "Traceback" not in err
    assert cli.main(["--traceback", "head", parquet_lake]) == 1
    assert "Traceback" in capsys.readouterr().err
