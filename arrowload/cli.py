"""The ``arrowload`` command."""

from __future__ import annotations

import argparse
import os
import sys
import time


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
    return 0


def _show(table) -> str:
    """A table as text, long cells shortened (embeddings are 64 floats wide)."""
    import polars as pl
    with pl.Config(fmt_str_lengths=40, tbl_width_chars=140, fmt_table_cell_list_len=4):
        return str(pl.from_arrow(table))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="arrowload", description="Train models straight off a columnar data lake.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="generate a small lake and run a selection over it")
    demo.add_argument("--dir", default="demo-lake", help="where to write the lake (default: ./demo-lake)")
    demo.add_argument("--rows", type=int, default=200_000, help="rows to generate (default 200,000)")
    demo.set_defaults(func=_demo)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except Exception as exc:  # noqa: BLE001 - the CLI reports errors, it does not dump tracebacks
        from arrowload.errors import ArrowloadError
        if isinstance(exc, ArrowloadError):
            print(f"arrowload: error: {exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
