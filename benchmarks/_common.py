"""What every benchmark script shares, importing nothing heavier than arrowload's data
generator: the benchmark lake (``ensure_lake``) and RESULTS.md's sections
(``replace_section``). Scripts that run where polars and DuckDB are not installed (the GPU
machine) import these from here; the others get them through bench_scan."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import time
from pathlib import Path

from arrowload.datagen import write_lake

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DATA = HERE / "data"
RESULTS = HERE / "RESULTS.md"
LAKE_PARAMS = dict(shards=8, row_group_size=65_536, emb_dim=64)  # seed 0, zstd: write_lake defaults


def ensure_lake(rows: int, *, partition_by: str | None = None, log=print) -> Path:
    """The lake for ``rows`` under benchmarks/data/, written once and reused.

    A marker ``events-<rows>.json`` next to the lake records the generation parameters
    and each file's size; it is written last, so an interrupted generation is redone.
    ``partition_by="country"`` gives the hive-partitioned copy of the same rows,
    ``events-<rows>-country/country=US/part-00000.parquet`` ...
    """
    if rows < 1:  # (--rows 0 ran the full size, --rows -5 wrote events--5/)
        raise SystemExit(f"--rows must be at least 1, got {rows}")
    params = {"generator": "arrowload.datagen.write_lake", "rows": rows, "seed": 0,
              "compression": "zstd", **LAKE_PARAMS}
    name = f"events-{rows}"
    if partition_by is not None:
        params["partition_by"] = partition_by
        name += f"-{partition_by}"
    lake, marker = DATA / name, DATA / f"{name}.json"
    if marker.is_file():
        try:
            recorded = json.loads(marker.read_text())
        except ValueError:
            recorded = {}
        files = recorded.get("files") or {}
        if recorded.get("params") == params and files and all(
                (lake / f).is_file() and (lake / f).stat().st_size == size for f, size in files.items()):
            log(f"data: reusing {lake.relative_to(REPO)} ({rows:,} rows)")
            return lake
    shutil.rmtree(lake, ignore_errors=True)
    marker.unlink(missing_ok=True)
    log(f"data: writing {lake.relative_to(REPO)} ({rows:,} rows, {LAKE_PARAMS}) ...")
    t0 = time.perf_counter()
    paths = write_lake(lake, rows=rows, partition_by=partition_by, **LAKE_PARAMS)
    seconds = time.perf_counter() - t0
    files = {Path(p).relative_to(lake).as_posix(): Path(p).stat().st_size for p in paths}
    marker.write_text(json.dumps({"params": params, "files": files,
                                  "seconds": round(seconds, 1)}, indent=1) + "\n")
    log(f"data: wrote {len(files)} files, {sum(files.values()) / 2**20:.0f} MiB in {seconds:.0f} s")
    return lake


def emit(body: str, write: bool, begin: str, end: str, title: str, log=print) -> None:
    """Print a benchmark's table; with ``write``, record it in RESULTS.md under ``title``
    between the markers ``begin`` / ``end`` (replacing the last run's)."""
    print()
    print(body)
    if write:
        replace_section(begin, end, f"{begin}\n{title}\n\n{body}\n{end}\n")
        log("recorded in benchmarks/RESULTS.md")


def rotated(variants, reps: int, run) -> dict:
    """``run(variant)`` ``reps`` times per variant, after one warm-up of each, the order of
    the variants reversed every other repetition: {variant: [results]}."""
    variants = list(variants)
    for v in variants:
        run(v)
    out: dict = {v: [] for v in variants}
    for rep in range(reps):
        for v in (variants if rep % 2 == 0 else variants[::-1]):
            out[v].append(run(v))
    return out


def replace_section(begin: str, end: str, block: str) -> None:
    """Put ``block`` (which starts with ``begin`` and ends with ``end``) into RESULTS.md,
    replacing the section between those markers if there is one, appending it otherwise."""
    text = RESULTS.read_text() if RESULTS.exists() else ""
    if not text.startswith(RESULTS_HEADER.splitlines()[0]):
        text = RESULTS_HEADER + "\n" + text.lstrip("\n")
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end) + r"\n?", re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        text = text.rstrip("\n") + "\n\n" + block
    RESULTS.write_text(text)


RESULTS_HEADER = """\
# Benchmark results

Figures written by the scripts in this folder (`--write`). Every ratio in a table is
taken between medians of the same run, on the same files, on the same machine: compare
ratios across sections, never raw seconds across machines. Sections are replaced when
the same benchmark is rerun at the same size. See README.md for what each column means.
"""


def bench_parser(doc: str, reps: int = 5) -> argparse.ArgumentParser:
    """The arguments of a benchmark timing variants in fresh processes: its module ``doc`` as
    the help, ``--reps`` (timed runs per variant); the script adds its own, then
    ``bench_args`` adds ``--write`` and parses."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=doc)
    p.add_argument("--reps", type=int, default=reps, help=f"timed runs per variant (default {reps})")
    return p


def bench_args(p: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``argv`` parsed by ``bench_parser``'s ``p`` with ``--write`` (record the table in
    RESULTS.md); fewer than 3 reps refused."""
    p.add_argument("--write", action="store_true", help="record the table in benchmarks/RESULTS.md")
    args = p.parse_args(argv)
    if args.reps < 3:
        p.error("--reps must be at least 3 (medians of fewer runs are noise)")
    return args
