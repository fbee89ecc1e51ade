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
    # -n 0 (ds.head(0)): the columns alone; the CLI refused it
    out = run("head", parquet_lake, "-n", "0", "--columns", "id,f0").stdout
    assert "(0 rows)" in out and "f0" in out


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
    assert "== scan 0" in out and "row_group_pruning" in out
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
    # the second binding silently replaced the first
    (["sql", "SELECT count(*) FROM ev", "--table", "ev=LAKE", "--table", "ev=LAKE/other"], "given twice"),
    (["inspect", "LAKE/nothing-here"], "nothing-here"),
    # an empty --filter / --columns (a shell variable unset) gave every row, exit 0
    (["head", "LAKE", "--filter", ""], "empty filter"),
    (["head", "LAKE", "--columns", ""], "names no column"),
    (["head", "LAKE", "--columns", ","], "names no column"),
    (["demo", "--dir", "LAKE/part-00000.parquet", "--rows", "1000"], "is a file"),
    # loader options without a loader were ignored
    (["explain", "LAKE", "--fill-null", "0"], "pass --batch-size N"),
    (["explain", "LAKE", "--shuffle", "global"], "pass --batch-size N"),
])
def test_more_arrowload_errors(capsys, parquet_lake, argv, says):
    assert cli.main([a.replace("LAKE", parquet_lake) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("arrowload: error: ") and says in err and "Traceback" not in err


_LOGGED_TRACEBACK = """
import logging, sys
from arrowload import StorageRetryError, cli

def logs_and_fails(args):
    try:
        raise ConnectionError("connection reset")
    except ConnectionError:
        logging.getLogger("gcsfs").exception("_request out of retries on exception")
    raise StorageRetryError("kept failing")

parser = cli.build_parser()
parse = parser.parse_args

def parse_args(argv=None):
    args = parse(argv)
    args.func = logs_and_fails
    return args

parser.parse_args = parse_args
cli.build_parser = lambda: parser
sys.exit(cli.main(["head", sys.argv[1]]))
"""


def test_a_client_librarys_logged_traceback_is_not_printed(parquet_lake):
    """gcsfs logs each failed request with logger.exception; with no handler configured,
    logging's last-resort handler printed a 51-line traceback before the one-line error.
    (In a fresh process: pytest's own log handlers would hide it.)"""
    proc = subprocess.run([sys.executable, "-c", _LOGGED_TRACEBACK, parquet_lake], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["arrowload: error: kept failing"], proc.stderr


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
        cli.main(["head", "somewhere", "-n", "-1"])  # (-n 0 prints the columns alone)
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


# -- every arrowload error: exit 2, one line, the fix in command-line terms -------------------

def _cli(args: list[str], cwd, **env) -> subprocess.CompletedProcess:
    full = dict(os.environ, ARROWLOAD_PROGRESS="0", **env)
    return subprocess.run(_script() + args, cwd=cwd, env=full, capture_output=True, text=True,
                          timeout=300)


def _one_error_line(proc) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("arrowload: error: "), proc.stderr
    assert "Traceback" not in proc.stderr and "unexpected error" not in proc.stderr
    assert "al.sql(" not in lines[0] and "al.dataset(" not in lines[0]
    return lines[0]


def test_parse_and_binding_errors_name_cli_fixes(capsys, parquet_lake, tmp_path):
    cases = [
        (["head", parquet_lake, "--filter", "label = 1 AND\n(id > 3"], ["cannot parse filter",
                                                                       "never closed", "line 2"]),
        (["sql", "SELECT * FROM nowhere", "--table", f"events={parquet_lake}"],
         ["'nowhere' is not bound", "--table nowhere=PATH"]),
        (["sql", f"SELECT * FROM '{parquet_lake}/x.parquet'", "--table", f"events={parquet_lake}"],
         ["--table t=PATH", "FROM t"]),
        (["sql", "SELECT id FROM events WHERE", "--table", f"events={parquet_lake}"],
         ["cannot parse SQL"]),
        (["head", parquet_lake, "--format", "csv", "--storage-option", "anon=true"],
         ["--storage-option applies to remote URIs only"]),
    ]
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "data.bin").write_bytes(b"x")
    cases.append((["head", str(odd)], ["--format parquet|ipc|csv|json"]))
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"a": [1.0, None, 3.0]}), tmp_path / "nulls.parquet")
    cases += [
        (["bench", str(tmp_path / "nulls.parquet"), "--batch-size", "2", "--no-baseline"],
         ["--fill-null VALUE", '--filter "a IS NOT NULL"']),
        (["head", parquet_lake, "--columns", "id,nope"], ["'nope' not found", "--columns"]),
        (["head", parquet_lake, "--filter", "nope > 1"], ["'nope' not found", "--filter"]),
        (["sql", "SELECT 1 AS x", "--table", f"events={parquet_lake}"], ["--table t=PATH"]),
        # a filter is an expression over the row: a subquery is refused, pointing at `arrowload sql`
        (["head", parquet_lake, "--filter", "id IN (SELECT 1)"], ["arrowload sql"]),
    ]
    for argv, says in cases:
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("arrowload: error: "), err
        assert "al.sql" not in err and "format=" not in err and "storage_options" not in err, err
        assert "fill_null" not in err and ".filter(" not in err, err
        for word in says:
            assert word in err, (word, err)


def test_object_store_errors_exit_2_with_one_line(tmp_path):
    """Through the console script as a user runs it: a wrong endpoint (a closed loopback
    port) and missing credentials. Nothing but loopback is contacted."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    base = {"AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": str(tmp_path / "none"),
            "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(base)
    keys = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}

    def cli_(args, **extra):
        return subprocess.run(_script() + args, cwd=tmp_path, env=dict(env, ARROWLOAD_PROGRESS="0", **extra),
                              capture_output=True, text=True, timeout=120)

    line = _one_error_line(cli_(["head", "s3://bucket/lake/", "--storage-option",
                                 f"endpoint_url=http://127.0.0.1:{port}"], **keys))
    assert f"127.0.0.1:{port}" in line and "s3://bucket/lake" in line
    assert "--storage-option endpoint_url=" in line and "AWS_ENDPOINT_URL" in line
    line = _one_error_line(cli_(["head", "s3://bucket/lake/", "--storage-option",
                                 f"endpoint_url=http://127.0.0.1:{port}"]))
    assert "no credentials" in line and "AWS_ACCESS_KEY_ID" in line and "--storage-option key=" in line


def test_sql_no_external_access(run, capsys, parquet_lake, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("one\ntwo\n")
    query = f"SELECT count(*) AS n FROM (SELECT DISTINCT label FROM events), read_text('{notes}')"
    assert cli.main(["sql", query, "--table", f"events={parquet_lake}"]) == 0
    assert "(1 row)" in capsys.readouterr().out
    line = _one_error_line(run("sql", query, "--table", f"events={parquet_lake}",
                               "--no-external-access", rc=2))
    assert "--no-external-access" in line and "--table NAME=PATH" in line
    assert cli.main(["sql", "SELECT label, count(*) AS n FROM events GROUP BY label ORDER BY label",
                     "--table", f"events={parquet_lake}", "--no-external-access"]) == 0
    out = capsys.readouterr().out
    truth = duck(f"SELECT label, count(*) AS n FROM {parquet_scan(parquet_lake)} "
                 "GROUP BY label ORDER BY label").to_pylist()
    for row in truth:
        assert any(line.startswith(f"│ {row['label']} ") and f" {row['n']} " in line
                   for line in out.splitlines()), out


# -- inspect fits the terminal ------------------------------------------------------------------

@pytest.fixture(scope="module")
def wide_file(tmp_path_factory) -> str:
    """A schema no terminal is wide enough for: long names, nested types, long strings."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    n = 20
    table = pa.table({
        "id": pa.array(range(n), pa.int64()),
        "a_column_name_far_longer_than_any_terminal_cell_should_show_in_full": pa.array(
            [i / 7 for i in range(n)]),
        "nested": pa.array([{"inner_struct_field": {"timestamps_inside": [1, 2], "label": "x"}, "b": i}
                            for i in range(n)]),
        "text": pa.array(["lorem ipsum dolor sit amet, consectetur adipiscing elit " * 3 + str(i)
                          for i in range(n)]),
        "amount": pa.array([i for i in range(n)], pa.decimal128(38, 10)),
        **{f"feature_with_a_long_name_{k:02d}": pa.array([float(k)] * n) for k in range(6)},
    })
    folder = tmp_path_factory.mktemp("wide") / "a_folder_with_a_rather_long_name_for_the_listing"
    folder.mkdir()
    pq.write_table(table, folder / "part-0000-with-a-long-file-name-as-spark-writes-them.parquet")
    return str(folder)


def _inspect_at(width: int, path: str, capsys, monkeypatch) -> str:
    monkeypatch.setenv("COLUMNS", str(width))  # what shutil.get_terminal_size() reads first
    assert cli.main(["inspect", path]) == 0
    return capsys.readouterr().out


def test_inspect_fits_the_terminal_console_script(wide_file, tmp_path):
    proc = _cli(["inspect", wide_file], tmp_path, COLUMNS="80")
    assert proc.returncode == 0, proc.stderr
    assert max(len(line) for line in proc.stdout.splitlines()) <= 80
    assert "left out to fit 80 columns" in proc.stdout


@pytest.mark.parametrize("width", [100, 80, 60, 40])
def test_inspect_fits_the_terminal(wide_file, width, capsys, monkeypatch):
    out = _inspect_at(width, wide_file, capsys, monkeypatch)
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= width, "\n".join(x for x in lines if len(x) > width)
    rows = [line for line in lines if line.startswith("│ ")]
    for name in ("id", "nested", "text", "amount"):
        assert any(line.startswith(f"│ {name} ") for line in rows), out
    assert any("…" in line and line.startswith("│ a_col") for line in rows)  # cut, and marked
    assert "left out to fit" in out
    # a path is cut at its start: its end tells files apart
    assert any(line.startswith("│ …") and ".parquet" in line for line in rows), out


def test_inspect_shows_everything_on_a_wide_terminal(wide_file, capsys, monkeypatch):
    out = _inspect_at(400, wide_file, capsys, monkeypatch)
    assert "left out" not in out
    header = next(line for line in out.splitlines() if line.startswith("│ column"))
    for col in ("type", "nulls", "min", "max", "compressed", "uncompressed"):
        assert f" {col} " in header
    assert max(len(line) for line in out.splitlines()) <= 400


# -- what a new user met (a review of the README and the CLI) -------------------------------

def test_inspect_names_files_relative_to_the_root_however_the_path_is_written(run, parquet_lake):
    """``../lake`` listed absolute paths where ``lake/`` listed relative ones."""
    rel = os.path.relpath(parquet_lake, run.cwd)
    names = sorted(os.listdir(parquet_lake))
    for path in (parquet_lake, rel, rel + "/"):
        table = run("inspect", path, "--files", "0").stdout.split("files:")[1]
        assert all(f"│ {n} " in table for n in names), table
        assert os.path.dirname(parquet_lake) not in table


def test_explain_takes_the_fill_null_its_loader_error_names(run, parquet_lake):
    """The loader's null error said "pass --fill-null VALUE", which explain did not take."""
    err = _error_line(run("explain", parquet_lake, "--columns", "id,score", "--batch-size", "64", rc=2))
    assert "--fill-null VALUE" in err
    out = run("explain", parquet_lake, "--columns", "id,score", "--batch-size", "64", "--fill-null", "0").stdout
    assert "batch" in out


def test_cli_error_lines_speak_cli(run, parquet_lake):
    err = _error_line(run("sql", "SELECT count(*) AS n FROM events, read_parquet('nope/*.parquet') p",
                          "--table", f"events={parquet_lake}", rc=2))
    assert "--table t=PATH" in err and "al.sql(" not in err
    err = _error_line(run("head", parquet_lake, "--format", "csv", rc=2))  # Parquet bytes read as CSV
    assert not any(ord(ch) < 32 for ch in err) and len(err) < 1000
    err = _error_line(run("sql", "SELECT id FROM events WHERE", "--table", f"events={parquet_lake}", rc=2))
    assert "WHERE needs a condition after it" in err


def test_head_prints_control_characters_as_escapes(capsys, tmp_path):
    """Cells went to the terminal raw: an ANSI escape recoloured it and a newline split one
    row into two lines that looked like two rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    path = str(tmp_path / "t.parquet")
    pq.write_table(pa.table({"s": ["ok", "red\x1b[31mX", "two\nlines", None], "n": [1, 2, 3, 4]}), path)
    assert cli.main(["head", path]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "red\\x1b[31mX" in out and "two\\nlines" in out
    rows = [line for line in out.splitlines() if line.startswith("│") and line.rstrip("│ ").split("┆")[-1].strip().isdigit()]
    assert len(rows) == 4, out
