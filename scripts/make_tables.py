"""Turn run records into the paper's table: markdown, CSV, LaTeX, JSON and a speed-up/FID Pareto plot.

    python scripts/make_tables.py outputs/multirun/2026-11-30_10-00-00 [more runs ...] --out results/table

Every ``metrics.json`` under the given folders is one row (AR, exact speculative decoding, LANTERN at
each (k, delta), LANTERN++). Speed-up comes from the record, or from the AR record of the same setting.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lantern.cli import run_or_exit
from lantern.tables import load_records, to_markdown, table_rows, write_tables


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="run folders or metrics.json files")
    parser.add_argument("--out", default=None, help="folder for table.{md,csv,tex,json} and table_pareto.png (default: the first runs folder)")
    parser.add_argument("--stem", default="table")
    args = parser.parse_args()

    def make() -> dict:
        records = load_records(args.runs)
        out = Path(args.out) if args.out else Path(args.runs[0])
        paths = write_tables(records, out if out.is_dir() or not out.suffix else out.parent, args.stem)
        print(to_markdown(table_rows(records)))
        return paths

    paths = run_or_exit(make)
    print("wrote " + ", ".join(str(p) for p in paths.values()))


if __name__ == "__main__":
    main()
