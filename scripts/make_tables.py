"""Turn run records into the paper's table: markdown, CSV, LaTeX, JSON and a speed-up/FID Pareto plot.

    python scripts/make_tables.py outputs/multirun/2026-11-30_10-00-00 [more runs ...] --out results/table

Every ``metrics.json`` under the given folders is one row (AR, exact speculative decoding, LANTERN at
each (k, delta), LANTERN++). Speed-up comes from the record, or from the AR record of the same setting.
``--latency FOLDER`` (repeatable) takes each row's latency and speed-up from the run of the same method
and setting in those folders (the papers' batch-1 timing, e.g. ``+experiment=paper_table_latency``) and
keeps the quality run's own speed-up as a throughput column. Each record is validated first
(lantern.results.record): a malformed one is refused with one line naming the file and the field, and
nothing is written. ``--out`` is a folder.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lantern.cli.main import run_or_exit
from lantern.errors import ConfigError
from lantern.results.render import to_markdown, write_tables
from lantern.results.tables import build_table, failed_jobs, load_records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="run or sweep folders, or metrics.json files")
    parser.add_argument(
        "--out",
        default=None,
        help="folder for table.{md,csv,tex,json} and table_pareto.png (created if missing; "
        "default: the first runs folder)",
    )
    parser.add_argument("--stem", default="table")
    parser.add_argument(
        "--latency",
        action="append",
        default=[],
        metavar="RUNS",
        help="run or sweep folders whose latency and speed-up the rows take (same method and setting)",
    )
    args = parser.parse_args()

    def make() -> dict:
        out = Path(args.out) if args.out else Path(args.runs[0])
        if out.exists() and not out.is_dir():
            raise ConfigError(f"--out={str(out)!r} is a file; give a folder (the tables are written into it)")
        records = load_records(args.runs)  # every record validated before anything is written
        latency = load_records(args.latency) if args.latency else None
        paths = write_tables(records, out, args.stem, failed=failed_jobs(args.runs), latency=latency)
        print(to_markdown(build_table(records, latency), failed_jobs(args.runs), out))
        return paths

    paths = run_or_exit(make)
    print("wrote " + ", ".join(str(p) for p in paths.values()))


if __name__ == "__main__":
    main()
