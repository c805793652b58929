"""Turn run records into the paper's table: markdown, CSV, LaTeX, JSON and a speed-up/FID Pareto plot.

    python scripts/make_tables.py outputs/multirun/2026-11-30_10-00-00 [more runs ...] --out results/table

Every ``metrics.json`` under the given folders is one row (AR, exact speculative decoding, LANTERN at
each (k, delta), LANTERN++). Speed-up comes from the record, or from the AR record of the same setting.
Each record is validated first (lantern.run_record): a malformed one is refused with one line naming the
file and the field, and nothing is written. ``--out`` is a folder.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lantern.cli import run_or_exit
from lantern.errors import ConfigError
from lantern.tables import failed_jobs, load_records, table_rows, to_markdown, write_tables


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="run or sweep folders, or metrics.json files")
    parser.add_argument("--out", default=None,
                        help="folder for table.{md,csv,tex,json} and table_pareto.png (created if missing; "
                             "default: the first runs folder)")
    parser.add_argument("--stem", default="table")
    args = parser.parse_args()

    def make() -> dict:
        out = Path(args.out) if args.out else Path(args.runs[0])
        if out.exists() and not out.is_dir():
            raise ConfigError(f"--out={str(out)!r} is a file; give a folder (the tables are written into it)")
        records = load_records(args.runs)  # every record validated before anything is written
        paths = write_tables(records, out, args.stem, failed=failed_jobs(args.runs))
        print(to_markdown(table_rows(records), failed_jobs(args.runs), out))
        return paths

    paths = run_or_exit(make)
    print("wrote " + ", ".join(str(p) for p in paths.values()))


if __name__ == "__main__":
    main()
