"""The ``arrowload`` command.

    arrowload demo                          # the README's main job on a generated lake
    arrowload inspect PATH                  # files, row groups, schema, sizes, statistics
    arrowload head PATH -n 5 --columns id,f0 --filter "label = 1"
    arrowload sql "SELECT country, count(*) FROM events GROUP BY 1" --table events=PATH
    arrowload explain PATH --columns f0,label --filter "country = 'US'"
    arrowload bench PATH --columns f0,f1,label --batch-size 1024 --shuffle block

Exit status: 0 on success, 2 on a usage error or an arrowload error (one line on
stderr, ``arrowload: error: ...``), 1 on an unexpected error (``--traceback`` shows it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

from .order import SHUFFLE_CHOICES


# -- helpers ---------------------------------------------------------------------------

def _columns(values: list[str] | None) -> list[str] | None:
    """``--columns a,b --columns c`` -> ["a", "b", "c"]."""
    if not values:
        return None
    out = [c.strip() for v in values for c in v.split(",") if c.strip()]
    return out or None


def _positive_int(text: str, least: int = 1) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"expected an integer >= {least}, got {value}")
    return value


def _count(text: str) -> int:
    return _positive_int(text, least=0)


def _open(path: str, fmt: str | None):
    import arrowload as al
    return al.dataset(path, format=fmt)


def _selection(args: argparse.Namespace):
    ds = _open(args.path, args.format)
    if getattr(args, "filter", None):
        ds = ds.filter(args.filter)
    cols = _columns(getattr(args, "columns", None))
    if cols:
        ds = ds.select(*cols)
    if getattr(args, "limit", None) is not None:
        ds = ds.limit(args.limit)
    return ds


def _show(table, rows: int | None = None, *, dtypes: bool = True) -> str:
    """A table as text, long cells shortened (embeddings are 64 floats wide)."""
    import polars as pl
    frame = table if isinstance(table, pl.DataFrame) else pl.from_arrow(table)
    with pl.Config(fmt_str_lengths=40, tbl_width_chars=160, fmt_table_cell_list_len=4,
                   tbl_rows=rows if rows is not None else max(frame.height, 1), tbl_cols=-1,
                   tbl_hide_dataframe_shape=True, tbl_hide_column_data_types=not dtypes):
        return str(frame)


def _fmt_bytes(n) -> str:
    from arrowload.display import fmt_bytes
    return fmt_bytes(n)


# -- demo --------------------------------------------------------------------------------

def _demo(args: argparse.Namespace) -> int:
    import arrowload as al
    from arrowload.datagen import write_lake

    lake = args.dir
    marker = os.path.join(lake, ".arrowload-demo")
    if not os.path.exists(marker):
        print(f"writing a synthetic lake of {args.rows:,} rows to {lake}/ ...", flush=True)
        t0 = time.perf_counter()
        write_lake(lake, rows=args.rows, shards=8, row_group_size=16_384)
        with open(marker, "w") as f:
            f.write(f"rows={args.rows}\n")
        print(f"  done in {time.perf_counter() - t0:.1f}s")
    ds = al.dataset(lake)
    print(f"\n{ds.count():,} rows in {len(ds.splits())} row groups; schema:")
    print("  " + ", ".join(f"{f.name}: {f.type}" for f in ds.schema))
    sel = (ds.filter("country IN ('US', 'DE') AND ts >= DATE '2024-01-20' AND label = 1")
             .select("user_id", "f0", "f1", "emb", label="CAST(label AS TINYINT)"))
    print("\nselection: country IN ('US','DE') AND ts >= DATE '2024-01-20' AND label = 1")
    print(sel.explain())
    t0 = time.perf_counter()
    n = sel.count()
    print(f"\ncount(): {n:,} rows ({time.perf_counter() - t0:.3f}s)")
    print("\nhead(3):")
    print(_show(sel.head(3)))
    t0 = time.perf_counter()
    table = sel.to_arrow()
    print(f"\nto_arrow(): {table.num_rows:,} rows, {table.nbytes / 2**20:.1f} MiB "
          f"in {time.perf_counter() - t0:.3f}s")

    # the main job: shuffled, sharded, resumable batches for training
    feats = [f"f{i}" for i in range(16)]
    train = ds.filter("label IS NOT NULL").select(*feats, "label")
    cache = os.path.join(lake, ".arrowload-cache")
    print("\nloader: 2 ranks x 2 epochs, batch 4096, global shuffle, f0..f15 stacked to x [4096, 16]")
    for rank in range(2):
        with train.loader(4096, shuffle=True, seed=0, drop_last=True, rank=rank, world_size=2,
                          stack={"x": feats}, cache_dir=cache) as loader:
            if rank == 0:
                print(f"  {loader!r}")
            for epoch in range(2):
                loader.set_epoch(epoch)
                t0 = time.perf_counter()
                rows = 0
                for batch in loader:
                    rows += len(batch["label"])
                secs = time.perf_counter() - t0
                print(f"  rank {rank} epoch {epoch}: {len(loader)} batches, {rows:,} rows in {secs:.2f}s "
                      f"({rows / secs:,.0f} rows/s); consumer waited {loader.stats().wait_s:.2f}s")
            loader.set_epoch(1)
            it = iter(loader)
            k = max(0, min(3, len(loader) - 1))  # stop mid-epoch, leaving at least one batch
            for _ in range(k):
                next(it)
            state = loader.state_dict()
        with train.loader(4096, shuffle=True, seed=0, drop_last=True, rank=rank, world_size=2,
                          stack={"x": feats}, cache_dir=cache) as resumed:
            resumed.load_state_dict(state)
            rest = sum(1 for _ in resumed)
            print(f"  rank {rank}: state_dict() after {k} batches -> {state['position']:,} rows in; "
                  f"a fresh loader resumes there and yields the remaining {rest} of {len(resumed)} batches")
    return 0


# -- inspect -----------------------------------------------------------------------------

def _inspect(args: argparse.Namespace) -> int:
    import polars as pl

    from arrowload.display import plural, summarize_scan, unit_name
    from arrowload.plan.nodes import scans

    ds = _open(args.path, args.format)
    scan = scans(ds.plan)[0]
    src = scan.source
    summary = summarize_scan(scan)
    units = src.units()
    desc = ds.describe(_columns(args.columns), exact=args.exact)
    line = summary.source_line()
    uncompressed = desc["uncompressed_bytes"]
    if args.columns is None and desc.height and uncompressed.null_count() == 0:
        line += f" ({_fmt_bytes(int(uncompressed.sum()))} uncompressed)"
    print(f"{src.kind}: {src.display}")
    print(f"  {line}")
    if src.partition_schema.names:
        print("  partitions: " + ", ".join(f"{f.name} ({f.type})" for f in src.partition_schema))

    by_file: dict[int, list] = {}
    for u in units:
        by_file.setdefault(u.file, []).append(u)
    files = sorted(by_file.items())
    prefix = src.display.rstrip("/") + "/"
    listed = files if args.files == 0 else files[: args.files]
    rows = []
    for _, us in listed:
        path = us[0].path
        shown = path[len(prefix):] if path.startswith(prefix) else path
        nrows = sum(u.num_rows for u in us) if all(u.num_rows is not None for u in us) else None
        size = sum(u.bytes_for(None) for u in us) if all(u.bytes_for(None) is not None for u in us) else None
        row = {"file": shown, "rows": nrows, "bytes": _fmt_bytes(size) if size is not None else None}
        if src.kind == "parquet":
            row[unit_name(src.kind)] = len(us)
        rows.append(row)
    print(f"\n{plural(len(files), 'file')}:")
    print(_show(pl.DataFrame(rows), dtypes=False))
    if len(listed) < len(files):
        print(f"  ... and {len(files) - len(listed)} more (--files 0 lists all)")

    print(f"\nschema and statistics ({'one scan' if args.exact else 'from footers; --exact scans'}):")
    keep = [c for c in desc.columns if c in ("column", "type") or desc[c].null_count() < desc.height]
    shown = desc.select(keep).with_columns(
        pl.col(c).map_elements(_fmt_bytes, return_dtype=pl.String)
        for c in ("compressed_bytes", "uncompressed_bytes") if c in keep)
    print(_show(shown, dtypes=False))
    return 0


# -- head / sql / explain ----------------------------------------------------------------

def _head(args: argparse.Namespace) -> int:
    table = _selection(args).head(args.n)
    print(_show(table, rows=args.n))
    return 0


def _parse_tables(specs: list[str] | None) -> dict:
    tables = {}
    for spec in specs or []:
        name, sep, path = spec.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise _UsageError(f"--table expects NAME=PATH, got {spec!r}")
        if not name.strip().isidentifier():
            raise _UsageError(f"--table name {name.strip()!r} is not a valid SQL identifier "
                              "(letters, digits and _; not starting with a digit)")
        tables[name.strip()] = path.strip()
    return tables


def _sql(args: argparse.Namespace) -> int:
    import arrowload as al

    tables = {name: _open(path, args.format) for name, path in _parse_tables(args.table).items()}
    ds = al.sql(args.query, **tables)
    if args.explain:
        print(ds.explain())
        return 0
    shown = ds.head(args.max_rows + 1)
    more = shown.num_rows > args.max_rows
    print(_show(shown.slice(0, args.max_rows)))
    if more:
        print(f"(first {args.max_rows} rows; --max-rows N shows more)")
    else:
        print(f"({plural_rows(shown.num_rows)})")
    return 0


def plural_rows(n: int) -> str:
    return f"{n:,} row" + ("" if n == 1 else "s")


def _explain(args: argparse.Namespace) -> int:
    ds = _selection(args)
    if args.batch_size is not None:
        with ds.loader(args.batch_size, shuffle=_shuffle(args.shuffle)) as loader:
            print(loader.explain())
    else:
        print(ds.explain())
    return 0


# -- bench -------------------------------------------------------------------------------

def _shuffle(kind: str):
    return kind  # the loader takes the CLI's spellings (order.SHUFFLE_CHOICES) as they are


def _raw_scan(ds, filter_text: str | None) -> dict:
    """One pass of the tuned pyarrow scan over the same files: the source's own pyarrow
    dataset, same columns and filter, row-group sized batches, pre_buffer."""
    import pyarrow.dataset as pads

    from arrowload.plan.expr import make_expr
    from arrowload.plan.nodes import scans

    src = scans(ds.plan)[0].source
    base = src.schema
    filt = None
    if filter_text:
        expr = make_expr(filter_text, base, "filter")
        if not expr.pushable:
            return {"skipped": "the filter does not compile to a pyarrow expression"}
        filt = expr.to_arrow(base, predicate=True)
    rows = [u.num_rows for u in src.units() if u.num_rows]
    kwargs = dict(columns=list(ds.schema.names), filter=filt, use_threads=True,
                  batch_size=max(rows, default=131_072))
    if src.kind == "parquet":
        kwargs["fragment_scan_options"] = pads.ParquetFragmentScanOptions(pre_buffer=True)
    t0 = time.perf_counter()
    scanner = pads.Scanner.from_dataset(src.dataset(None), **kwargs)
    n = nbytes = 0
    for batch in scanner.to_batches():
        n += batch.num_rows
        nbytes += batch.nbytes
    secs = time.perf_counter() - t0
    return {"rows": n, "seconds": secs, "decoded_bytes": nbytes}


def _rate(rows: int, nbytes: int, secs: float) -> tuple[float, float]:
    return (rows / secs if secs > 0 else 0.0, nbytes / 1e6 / secs if secs > 0 else 0.0)


def _bench(args: argparse.Namespace) -> int:
    from arrowload.display import summarize_scan
    from arrowload.plan.nodes import scans

    ds = _selection(args)
    opt = ds.optimized_plan()
    kept = summarize_scan(scans(opt)[0])
    result: dict = {"path": args.path, "columns": list(ds.schema.names), "filter": args.filter,
                    "batch_size": args.batch_size, "output": args.output}
    baseline = None if args.no_baseline else _raw_scan(ds, args.filter)
    t0 = time.perf_counter()
    loader = ds.loader(args.batch_size, shuffle=_shuffle(args.shuffle), seed=args.seed,
                       output=args.output, io_threads=args.io_threads,
                       fill_null=None if args.fill_null is None else {"*": args.fill_null})
    build = time.perf_counter() - t0
    with loader:
        prof = loader.profile()
    result.update(shuffle=loader.shuffle_kind, loader_build_s=build)
    lrows, lbytes, lsecs = prof.rows, prof.stats.bytes_decoded, prof.wall_s
    result["loader"] = {"rows": lrows, "batches": prof.batches, "seconds": lsecs, "decoded_bytes": lbytes,
                        "rows_per_s": _rate(lrows, lbytes, lsecs)[0], "mb_per_s": _rate(lrows, lbytes, lsecs)[1],
                        "stages": prof.stages(), "bottleneck": prof.bottleneck()}
    if baseline is not None and "skipped" not in baseline:
        r, m = _rate(baseline["rows"], baseline["decoded_bytes"], baseline["seconds"])
        baseline.update(rows_per_s=r, mb_per_s=m)
    result["scan"] = baseline
    if args.json:
        print(json.dumps(result, indent=2))
        return 0

    print(f"bench: {kept.kind}: {kept.display}")
    print(f"  columns  {', '.join(result['columns'])}")
    if args.filter:
        print(f"  filter   {args.filter}")
    print(f"  reads    {kept.reads_line()}")
    print(f"  loader   batch_size={args.batch_size}, shuffle={loader.shuffle_kind}, output={args.output}, "
          f"io_threads={args.io_threads}; built in {build:.3f}s (counting the selection"
          f"{', random-access table' if loader.source_kind != 'scan' else ''})")
    print()
    header = f"  {'one epoch':<26}{'rows':>12}{'seconds':>10}{'rows/s':>14}{'MB/s':>10}"
    print(header)
    if baseline is None:
        pass
    elif "skipped" in baseline:
        print(f"  {'pyarrow scan (tuned)':<26}  skipped: {baseline['skipped']}")
    else:
        print(f"  {'pyarrow scan (tuned)':<26}{baseline['rows']:>12,}{baseline['seconds']:>10.3f}"
              f"{baseline['rows_per_s']:>14,.0f}{baseline['mb_per_s']:>10.1f}")
    lo = result["loader"]
    print(f"  {'arrowload loader':<26}{lo['rows']:>12,}{lo['seconds']:>10.3f}"
          f"{lo['rows_per_s']:>14,.0f}{lo['mb_per_s']:>10.1f}")
    if baseline and "skipped" not in baseline and baseline["rows_per_s"] > 0:
        print(f"  loader / scan: {lo['rows_per_s'] / baseline['rows_per_s']:.2f}x the rows/s "
              "(MB/s: decoded Arrow bytes delivered)")
    print()
    print("where the loader spends its time (infinitely fast consumer):")
    print("\n".join("  " + line for line in str(prof).splitlines()[1:]))
    return 0


# -- the parser --------------------------------------------------------------------------

class _UsageError(Exception):
    """A command line that parses but makes no sense (exit status 2)."""


def _add_format(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", choices=("parquet", "ipc", "arrow", "feather", "csv", "json"),
                   help="file format (default: from the file extensions)")


def _add_selection(p: argparse.ArgumentParser, *, limit: bool = False) -> None:
    p.add_argument("path", metavar="PATH", help="a file, directory, glob or URI (s3://, gs://, ...)")
    p.add_argument("--columns", action="append", metavar="A,B,...",
                   help="columns to select, comma-separated (repeatable; default: all)")
    p.add_argument("--filter", metavar="EXPR", help="SQL filter, e.g. \"country = 'US' AND label = 1\"")
    if limit:
        p.add_argument("--limit", type=_positive_int, metavar="N", help="at most N rows")
    _add_format(p)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="arrowload", description="Train models straight off a columnar data lake.",
        epilog="Exit status: 0 success, 2 usage or arrowload error, 1 unexpected error. "
               "'arrowload COMMAND --help' describes each command.")
    parser.add_argument("--traceback", action="store_true", help="show the traceback of an unexpected error")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser("demo", help="generate a small lake, select from it and train-load it",
                          description="Write a synthetic events lake (once), run the README's "
                                      "selection over it (count, explain, head, to_arrow), then the "
                                      "main job: two ranks of a shuffled, stacked loader for two "
                                      "epochs, with a mid-epoch state_dict and resume.")
    demo.add_argument("--dir", default="demo-lake", help="where to write the lake (default: ./demo-lake)")
    demo.add_argument("--rows", type=_positive_int, default=200_000, help="rows to generate (default 200,000)")
    demo.set_defaults(func=_demo)

    inspect = sub.add_parser("inspect", help="files, row groups, schema, sizes and statistics of a dataset",
                             description="Describe a dataset from its footers: files, row groups, rows, "
                                         "bytes, schema and per-column statistics (min, max, nulls, "
                                         "sizes). No data page is read unless --exact.")
    inspect.add_argument("path", metavar="PATH", help="a file, directory, glob or URI")
    inspect.add_argument("--columns", action="append", metavar="A,B,...",
                         help="only these columns' statistics (comma-separated)")
    inspect.add_argument("--exact", action="store_true",
                         help="scan the data for exact statistics and a distinct estimate")
    inspect.add_argument("--files", type=_count, default=20, metavar="N",
                         help="list at most N files (0: all; default 20)")
    _add_format(inspect)
    inspect.set_defaults(func=_inspect)

    head = sub.add_parser("head", help="print the first rows of a selection",
                          description="Print the first rows, reading as little as possible.")
    _add_selection(head)
    head.add_argument("-n", type=_positive_int, default=10, metavar="N", help="rows to print (default 10)")
    head.set_defaults(func=_head)

    sql = sub.add_parser("sql", help="run a SQL query over datasets bound with --table",
                         description="Run SQL (DuckDB dialect) over datasets bound by name; "
                                     "select-project-filter queries use arrowload's pushdown, "
                                     "the rest runs in DuckDB over arrowload's scans.")
    sql.add_argument("query", metavar="QUERY", help='e.g. "SELECT country, count(*) FROM events GROUP BY 1"')
    sql.add_argument("--table", action="append", metavar="NAME=PATH",
                     help="bind a dataset under a name (repeatable)")
    sql.add_argument("--max-rows", type=_positive_int, default=20, metavar="N",
                     help="print at most N rows (default 20)")
    sql.add_argument("--explain", action="store_true", help="print the plan instead of the result")
    _add_format(sql)
    sql.set_defaults(func=_sql)

    explain = sub.add_parser("explain", help="show the plan: what is pushed down, files / row groups / bytes kept",
                             description="Print the plan before and after optimization and, per scan, "
                                         "the files / row groups / columns / bytes kept (from footers). "
                                         "With --batch-size, also the loader built over the selection.")
    _add_selection(explain, limit=True)
    explain.add_argument("--batch-size", type=_positive_int, metavar="N", help="also explain a loader")
    explain.add_argument("--shuffle", choices=SHUFFLE_CHOICES, default="none",
                         help="the loader's shuffle (with --batch-size)")
    explain.set_defaults(func=_explain)

    bench = sub.add_parser("bench", help="epoch throughput of a loader on your data vs the raw pyarrow scan",
                           description="Run one epoch of a loader over the selection into an infinitely "
                                       "fast consumer and one pass of a tuned pyarrow scan over the same "
                                       "files (same columns and filter); print rows/s and MB/s of each "
                                       "and where the loader spends its time.")
    _add_selection(bench)
    bench.add_argument("--batch-size", type=_positive_int, default=1024, metavar="N",
                       help="rows per batch (default 1024)")
    bench.add_argument("--shuffle", choices=SHUFFLE_CHOICES, default="none",
                       help="shuffle kind (default none)")
    bench.add_argument("--seed", type=int, default=0, help="shuffle seed (default 0)")
    bench.add_argument("--output", choices=("numpy", "arrow", "torch", "jax"), default="numpy",
                       help="batch type (default numpy)")
    bench.add_argument("--io-threads", type=_positive_int, default=4, metavar="N",
                       help="reader threads (default 4)")
    bench.add_argument("--fill-null", type=float, metavar="VALUE",
                       help="fill nulls in numeric columns with VALUE (default: a null is an error)")
    bench.add_argument("--no-baseline", action="store_true", help="skip the raw pyarrow scan")
    bench.add_argument("--json", action="store_true", help="print the results as JSON")
    bench.set_defaults(func=_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # usage errors exit 2 here, with the usage line
    try:
        return args.func(args)
    except _UsageError as exc:
        print(f"arrowload: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("arrowload: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `arrowload head ... | head -1`
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except OSError:
            pass
        return 0
    except Exception as exc:  # noqa: BLE001 - the CLI reports errors, it does not dump tracebacks
        from arrowload.errors import ArrowloadError
        if isinstance(exc, ArrowloadError):
            print(f"arrowload: error: {exc}", file=sys.stderr)
            return 2
        if args.traceback:
            traceback.print_exc()
        print(f"arrowload: unexpected error: {type(exc).__name__}: {exc} "
              "(run with --traceback for details)", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
