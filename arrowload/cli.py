"""The ``arrowload`` command.

    arrowload demo                          # the README's main job on a generated lake
    arrowload inspect PATH                  # files, row groups, schema, sizes, statistics
    arrowload head PATH -n 5 --columns id,f0 --filter "label = 1"
    arrowload sql "SELECT country, count(*) FROM events GROUP BY 1" --table events=PATH
    arrowload explain PATH --columns f0,label --filter "country = 'US'"
    arrowload bench PATH --columns f0,f1,label --batch-size 1024 --shuffle block
    arrowload cache ls [URI]                # plan cache entries (Dataset.cache())
    arrowload cache clear [URI] [--older-than DAYS] [KEY ...]

Exit status: 0 on success, 2 on a usage error or an arrowload error (one line on
stderr, ``arrowload: error: ...``), 1 on an unexpected error (``--traceback`` shows it).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import time
import traceback

from .order import SHUFFLE_CHOICES
from .tables import fit_table, fmt_count, shown_path, terminal_width, wrap_lines


# -- helpers ---------------------------------------------------------------------------

def _columns(values: list[str] | None) -> list[str] | None:
    """``--columns a,b --columns c`` -> ["a", "b", "c"]."""
    if values is None:
        return None
    out = [c.strip() for v in values for c in v.split(",") if c.strip()]
    if not out:  # `--columns "$COLS"` with COLS unset: not every column, silently
        raise _UsageError(f"--columns {' '.join(map(repr, values))} names no column")
    return out


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


def _storage_options(specs: list[str] | None) -> dict | None:
    """``--storage-option key=value`` (repeatable) -> fsspec storage_options; values are
    read as JSON where they parse (``anon=true``, ``retries=3``), else kept as text."""
    if not specs:
        return None
    options = {}
    for spec in specs:
        key, sep, value = spec.partition("=")
        if not sep or not key.strip():
            raise _UsageError(f"--storage-option expects KEY=VALUE, got {spec!r}")
        try:
            options[key.strip()] = json.loads(value)
        except ValueError:
            options[key.strip()] = value
    return options


def _open(path: str, fmt: str | None, args: argparse.Namespace | None = None):
    import arrowload as al
    from arrowload.source.filesystem import protocol_of
    options = _storage_options(getattr(args, "storage_option", None))
    if options and (protocol_of(path) or "file") in ("file", "local") and getattr(args, "table", None):
        options = None  # `sql`: --storage-option serves its remote tables, not the local ones
    return al.dataset(path, format=fmt, storage_options=options)


def _selection(args: argparse.Namespace):
    ds = _open(args.path, args.format, args)
    if getattr(args, "filter", None) is not None:  # (an empty one is refused by filter())
        ds = ds.filter(args.filter)
    cols = _columns(getattr(args, "columns", None))
    if cols:
        ds = ds.select(*cols)
    if getattr(args, "limit", None) is not None:
        ds = ds.limit(args.limit)
    return ds


def _wrap(text: str, width: int, indent: str = "  ") -> str:
    from .tables import wrap
    return wrap(text, width, indent=indent)


def _fit_rows(table, width: int, lead: str, pick: str = "--columns A,B picks others") -> str:
    """A result table fitted to ``width`` columns, then ``(lead)``, and where middle
    columns are hidden, how many are shown and what shows the others."""
    from .tables import fit_frame
    text, shown = fit_frame(table, width)
    if shown < table.num_columns:
        lead += f"; {shown} of {table.num_columns} columns shown: {pick} or widen the terminal"
    return text + "\n" + _wrap(f"({lead})", width, indent="")


def _fmt_bytes(n) -> str:
    from arrowload.display import fmt_bytes
    return fmt_bytes(n)


# -- demo --------------------------------------------------------------------------------

def _demo(args: argparse.Namespace) -> int:
    import arrowload as al
    from arrowload.datagen import write_lake

    lake = args.dir
    marker = os.path.join(lake, ".arrowload-demo")
    if os.path.exists(lake) and not os.path.isdir(lake):
        raise _UsageError(f"--dir {lake!r} is a file, not a folder to write the demo lake into")
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
    head = sel.head(3)
    print(_fit_rows(head, terminal_width(), fmt_count(head.num_rows, "row")))
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

    from arrowload.description import text_table
    from arrowload.display import plural, summarize_scan, unit_name
    from arrowload.plan.nodes import scans

    ds = _open(args.path, args.format, args)
    scan = scans(ds.plan)[0]
    src = scan.source
    summary = summarize_scan(scan)
    units = src.units()
    desc = ds.describe(_columns(args.columns), exact=args.exact)
    width = terminal_width()
    line = summary.source_line()
    uncompressed = desc["uncompressed_bytes"]
    if args.columns is None and desc.height and uncompressed.null_count() == 0:
        line += f" ({_fmt_bytes(int(uncompressed.sum()))} uncompressed)"
    print(_wrap(f"{src.kind}: {shown_path(src.display)}", width, indent=""))
    print(_wrap(line, width))
    if src.partition_schema.names:
        print(_wrap("partitions: " + ", ".join(f"{f.name} ({f.type})" for f in src.partition_schema),
                    width))

    by_file: dict[int, list] = {}
    for u in units:
        by_file.setdefault(u.file, []).append(u)
    files = sorted(by_file.items())
    # (the root as the filesystem spells it: ../lake and /abs/lake alike)
    prefix = (getattr(src, "base", None) or src.display).rstrip("/") + "/"
    listed = files if args.files == 0 else files[: args.files]
    rows = []
    for _, us in listed:
        path = us[0].path
        shown = path[len(prefix):] if path.startswith(prefix) else shown_path(path)
        nrows = sum(u.num_rows for u in us) if all(u.num_rows is not None for u in us) else None
        size = sum(u.bytes_for(None) for u in us) if all(u.bytes_for(None) is not None for u in us) else None
        row = {"file": shown, "rows": fmt_count(nrows) if nrows is not None else None,
               "bytes": _fmt_bytes(size) if size is not None else None}
        if src.kind == "parquet":
            row[unit_name(src.kind)] = fmt_count(len(us))
        rows.append(row)
    print(f"\n{plural(len(files), 'file')}:")
    text, _ = fit_table(pl.DataFrame(rows), width, drop=(unit_name(src.kind), "bytes"), left=("file",),
                        wide=("file",))
    print(text)
    if len(listed) < len(files):
        print(_wrap(f"... and {len(files) - len(listed):,} more (--files 0 lists all)", width))

    print("\n" + _wrap(f"schema and statistics "
                       f"({'one scan' if args.exact else 'from footers; --exact scans'}):", width, indent=""))
    text, dropped = text_table(desc, width)
    print(text)
    if dropped:
        print(_wrap(f"({', '.join(dropped)} left out to fit {width} columns: --columns A,B or a "
                    "wider terminal shows them)", width, indent=""))
    return 0


# -- head / sql / explain ----------------------------------------------------------------

def _head(args: argparse.Namespace) -> int:
    table = _selection(args).head(args.n)
    print(_fit_rows(table, terminal_width(), fmt_count(table.num_rows, "row")))
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
        if name.strip() in tables:
            raise _UsageError(f"--table {name.strip()} is given twice ({tables[name.strip()]!r} and "
                              f"{path.strip()!r}); give each table its own name")
        tables[name.strip()] = path.strip()
    return tables


def _sql(args: argparse.Namespace) -> int:
    import arrowload as al

    tables = {name: _open(path, args.format, args) for name, path in _parse_tables(args.table).items()}
    ds = al.sql(args.query, external_access=not args.no_external_access, **tables)
    if args.explain:
        print(wrap_lines(ds.explain(), terminal_width()))
        return 0
    shown = ds.head(args.max_rows + 1)
    more = shown.num_rows > args.max_rows
    lead = f"first {args.max_rows:,} rows; --max-rows N shows more" if more else fmt_count(shown.num_rows, "row")
    print(_fit_rows(shown.slice(0, args.max_rows), terminal_width(), lead,
                    pick="SELECT fewer columns to see the others"))
    return 0


def _explain(args: argparse.Namespace) -> int:
    if args.batch_size is None and (args.fill_null is not None or args.shuffle != "none"):
        given = "--fill-null" if args.fill_null is not None else "--shuffle"
        raise _UsageError(f"{given} describes a loader: pass --batch-size N to explain one")
    ds = _selection(args)
    if args.batch_size is not None:
        with ds.loader(args.batch_size, shuffle=_shuffle(args.shuffle),
                       fill_null=None if args.fill_null is None else {"*": args.fill_null}) as loader:
            print(wrap_lines(loader.explain(), terminal_width()))
    else:
        print(wrap_lines(ds.explain(), terminal_width()))
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

    width = terminal_width()
    out = [f"bench: {kept.kind}: {shown_path(kept.display)}",
           f"  columns  {', '.join(result['columns'])}"]
    if args.filter:
        out.append(f"  filter   {args.filter}")
    out.append(f"  reads    {kept.reads_line()}")
    out.append(f"  loader   batch_size={args.batch_size:,}, shuffle={loader.shuffle_kind}, output={args.output}, "
               f"io_threads={'auto' if args.io_threads is None else args.io_threads}; built in {build:.3f}s "
               f"(counting the selection{', random-access table' if loader.source_kind != 'scan' else ''})")
    out.append("")
    table = [("one epoch", "rows", "seconds", "rows/s", "MB/s")]
    if baseline is None:
        pass
    elif "skipped" in baseline:
        out_skipped = f"  pyarrow scan (tuned): skipped: {baseline['skipped']}"
    else:
        table.append(("pyarrow scan (tuned)", f"{baseline['rows']:,}", f"{baseline['seconds']:.3f}",
                      f"{baseline['rows_per_s']:,.0f}", f"{baseline['mb_per_s']:,.1f}"))
    lo = result["loader"]
    table.append(("arrowload loader", f"{lo['rows']:,}", f"{lo['seconds']:.3f}", f"{lo['rows_per_s']:,.0f}",
                  f"{lo['mb_per_s']:,.1f}"))
    sizes = [max(len(row[i]) for row in table) for i in range(5)]
    for row in table:
        out.append("  " + row[0].ljust(sizes[0]) + "".join(f"  {c:>{n}}" for c, n in zip(row[1:], sizes[1:])))
    if baseline is not None and "skipped" in baseline:
        out.append(out_skipped)
    if baseline and "skipped" not in baseline and baseline["rows_per_s"] > 0:
        out.append(f"  loader / scan: {lo['rows_per_s'] / baseline['rows_per_s']:.2f}x the rows/s "
                   "(MB/s: decoded Arrow bytes delivered)")
    out.append("")
    out.append("where the loader spends its time (infinitely fast consumer):")
    out.extend("  " + line for line in str(prof).splitlines()[1:])
    print(wrap_lines("\n".join(out), width))
    return 0


# -- cache -------------------------------------------------------------------------------

def _when(t) -> str:
    return t.astimezone().strftime("%Y-%m-%d %H:%M") if t is not None else ""


def _cache_ls(args: argparse.Namespace) -> int:
    import polars as pl

    from arrowload.plancache import Store, cache_entries
    options = _storage_options(args.storage_option)
    entries = cache_entries(args.uri, storage_options=options)
    where = Store(args.uri, options)
    root = where.url(where.join("plans"))
    if not entries:
        print(f"no plan cache entries under {root}")
        return 0
    width = terminal_width()
    frame = pl.DataFrame({
        "key": [e.key[:12] for e in entries],
        "state": [e.state for e in entries],
        "rows": [f"{e.rows:,}" if e.rows is not None else "" for e in entries],
        "bytes": [_fmt_bytes(e.bytes) for e in entries],
        "written": [_when(e.written_at) for e in entries],
        "snapshot": [(e.snapshot or "")[:8] for e in entries],
        "plan": [(e.name + ": " if e.name else "") + (e.summary or "") for e in entries],
    })
    text, dropped = fit_table(frame, width, drop=("snapshot",), drop_late=("state",), wide=("plan",))
    total = sum(e.bytes for e in entries)
    count = f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}"
    print(_wrap(f"{count} under {root}, "
                f"{_fmt_bytes(total)}", width, indent=""))
    print(text)
    if dropped:
        print(_wrap(f"(left out to fit {width} columns: {', '.join(dropped)})", width, indent=""))
    return 0


def _cache_clear(args: argparse.Namespace) -> int:
    from arrowload.plancache import cache_entries, clear_cache
    options = _storage_options(args.storage_option)
    before = cache_entries(args.uri, storage_options=options)
    removed = clear_cache(args.uri, keys=args.keys or None, older_than=args.older_than,
                          storage_options=options)
    busy = [e for e in before if e.state == "writing" and (not args.keys or
                                                         any(e.key.startswith(k) for k in args.keys))]
    freed = sum(e.bytes for e in removed)
    print(f"removed {len(removed)} plan cache entr{'y' if len(removed) == 1 else 'ies'} ({_fmt_bytes(freed)})")
    for e in removed:
        print(f"  {e.key[:12]}  {e.state}")
    if busy:
        print(f"left {len(busy)} being written: " + ", ".join(e.key[:12] for e in busy))
    return 0


def _looks_like_key(text: str) -> bool:
    return bool(re.fullmatch(r"[0-9a-f]{6,32}", text)) and not os.path.exists(text)


def _days(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of days, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected days >= 0, got {value}")
    return value


# -- errors ------------------------------------------------------------------------------

# Fixes named in Python terms -> the same fix on the command line.
_CLI_TERMS = (
    ("storage_options={'endpoint_url': 'http://host:port'}", "--storage-option endpoint_url=http://host:port"),
    ("storage_options={'key': ..., 'secret': ...}", "--storage-option key=... --storage-option secret=..."),
    ("storage_options={'anon': True}", "--storage-option anon=true"),
    (" (for a filesystem you built: its endpoint, e.g. pyarrow S3FileSystem(endpoint_override=...))", ""),
    ("storage_options apply", "--storage-option applies"),
    ("drop storage_options", "drop --storage-option"),
    ("Bind the data as a table (al.sql(query, name=...))", "Bind the data with --table NAME=PATH"),
    ("bind the data as a table: al.sql('SELECT ... FROM t', t=al.dataset(PATH))",
     "bind the data as a table: --table t=PATH and FROM t"),
    ("external_access=True allows the rest, for SQL you trust",
     "without --no-external-access the rest is allowed, for SQL you trust"),
    ("external_access=False", "--no-external-access"),
    ("pass format='parquet' | 'ipc' | 'csv' | 'json'", "pass --format parquet|ipc|csv|json"),
    ("pass format=", "pass --format"),
    ("bind one by keyword: al.sql('SELECT ... FROM t', t=al.dataset(PATH))", "bind one with --table t=PATH and FROM t"),
    ("Run queries with al.sql('SELECT ... FROM t WHERE ...', t=ds)",
     "Run queries with arrowload sql \"SELECT ... FROM t WHERE ...\" --table t=PATH"),
    ("al.sql()", "arrowload sql"),
)
# the same with patterns: fill_null={'x': <value>} ..., .filter("x IS NOT NULL")
_CLI_PATTERNS = (
    (r"pass fill_null=\{[^}]*\}(?: \(or \{'\*': <value>\} for every numeric column\))?",
     "pass --fill-null VALUE"),
    (r"\.filter\((\"[^\"]*\")\)", r"--filter \1"),
)


def error_line(exc: BaseException) -> str:
    """An arrowload error as one line, its fix in command-line terms."""
    from arrowload.errors import ColumnNotFoundError, ExpressionError, TableNotFoundError
    if isinstance(exc, TableNotFoundError):
        bound = ", ".join(exc.bound) or "none"
        name = exc.table if exc.table.isidentifier() else "t"
        text = (f"table {exc.table!r} is not bound; bound tables: {bound}. Bind it with "
                f"--table {name}=PATH")
        if name != exc.table:
            text += f" and write FROM {name}"
    elif isinstance(exc, ExpressionError) and exc.text is not None and exc.line is not None \
            and exc.col is not None:
        head = str(exc).splitlines()[0].rstrip(":")
        lines = exc.text.splitlines() or [exc.text]
        rest = lines[exc.line - 1][exc.col - 1:] if exc.line - 1 < len(lines) else ""
        near = rest[:24] + ("…" if len(rest) > 24 else "")
        text = f"{head} (near {near!r})" if near.strip() else f"{head} (at the end)"
    elif isinstance(exc, ColumnNotFoundError):
        text = str(exc) + ("; fix --columns" if "in select" in str(exc) else
                           "; fix the name in --filter / --columns / the query")
    else:
        text = str(exc)
    for python, cli in _CLI_TERMS:
        text = text.replace(python, cli)
    for pattern, cli in _CLI_PATTERNS:
        text = re.sub(pattern, cli, text)
    return " ".join(text.split())


# -- the parser --------------------------------------------------------------------------

class _UsageError(Exception):
    """A command line that parses but makes no sense (exit status 2)."""


def _add_format(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", choices=("parquet", "ipc", "arrow", "feather", "csv", "json"),
                   help="file format (default: from the file extensions)")
    p.add_argument("--storage-option", action="append", metavar="KEY=VALUE",
                   help="an option of a remote URI's filesystem (repeatable), e.g. "
                        "endpoint_url=http://127.0.0.1:9000, anon=true, key=..., secret=...")


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
    head.add_argument("-n", type=lambda text: _positive_int(text, 0), default=10, metavar="N",
                      help="rows to print (default 10; 0 prints the columns alone)")
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
    sql.add_argument("--no-external-access", action="store_true",
                     help="sandbox the query: it reads only the --table datasets (no files, network, "
                          "extensions or settings); use it for SQL you did not write")
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
    explain.add_argument("--fill-null", type=float, metavar="VALUE",
                         help="the loader fills nulls in numeric columns with VALUE (with --batch-size; "
                              "default: a null is an error)")
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
    bench.add_argument("--io-threads", type=_positive_int, default=None, metavar="N",
                       help="at most N reader threads (default: automatic, at most one per core)")
    bench.add_argument("--fill-null", type=float, metavar="VALUE",
                       help="fill nulls in numeric columns with VALUE (default: a null is an error)")
    bench.add_argument("--no-baseline", action="store_true", help="skip the raw pyarrow scan")
    bench.add_argument("--json", action="store_true", help="print the results as JSON")
    bench.set_defaults(func=_bench)

    cache = sub.add_parser("cache", help="list or clear the plan cache (Dataset.cache())",
                           description="Entries written by Dataset.cache(): one per plan and snapshot "
                                       "of its sources. URI: the cache root (default: $ARROWLOAD_CACHE_DIR, "
                                       "else $XDG_CACHE_HOME/arrowload, else ~/.cache/arrowload).")
    actions = cache.add_subparsers(dest="action", required=True, metavar="ACTION")
    ls = actions.add_parser("ls", help="list entries: key, state, rows, bytes, written at, snapshot, plan")
    ls.add_argument("uri", metavar="URI", nargs="?", help="cache root: a folder or s3://bucket/prefix")
    ls.add_argument("--storage-option", action="append", metavar="KEY=VALUE",
                    help="an option of a remote URI's filesystem (repeatable)")
    ls.set_defaults(func=_cache_ls)
    clear = actions.add_parser("clear", help="remove entries (all, or by key, or by age)",
                               description="Remove plan cache entries: those named by KEY (a key or its "
                                           "first digits, as `cache ls` shows them), else all; with "
                                           "--older-than only those written more than DAYS ago. Entries "
                                           "being written are left alone; a crashed writer's leftovers "
                                           "are removed by any clear.")
    clear.add_argument("uri", metavar="URI", nargs="?",
                       help="cache root (a folder or s3://...); a KEY alone is read as a key")
    clear.add_argument("keys", metavar="KEY", nargs="*", help="entries to remove (default: all)")
    clear.add_argument("--older-than", type=_days, metavar="DAYS", help="only entries written more than DAYS ago")
    clear.add_argument("--storage-option", action="append", metavar="KEY=VALUE",
                       help="an option of a remote URI's filesystem (repeatable)")
    clear.set_defaults(func=_cache_clear)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # usage errors exit 2 here, with the usage line
    # a client library's retry log (gcsfs' logger.exception) would print its traceback
    # through logging's last-resort handler before the one-line error
    logging.getLogger().addHandler(logging.NullHandler())
    if getattr(args, "action", None) == "clear" and args.uri is not None and _looks_like_key(args.uri):
        args.keys, args.uri = [args.uri, *args.keys], None  # `cache clear KEY`: the default root
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
            print(f"arrowload: error: {error_line(exc)}", file=sys.stderr)
            return 2
        if args.traceback:
            traceback.print_exc()
        print(f"arrowload: unexpected error: {type(exc).__name__}: {exc} "
              "(run with --traceback for details)", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
