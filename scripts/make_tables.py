"""Turn run records into the paper's table: markdown, CSV, LaTeX, JSON and a speed-up/FID Pareto plot.

    python scripts/make_tables.py outputs/multirun/2026-11-30_10-00-00 [more runs ...] --out results/table

Every ``metrics.json`` under the given folders is one row (AR, exact speculative decoding, LANTERN at
each (k, delta), LANTERN++). Speed-up comes from the record, or from the AR record of the same setting.
``--latency FOLDER`` (repeatable) takes each row's latency and speed-up from the run of the same method
and setting in those folders (the papers' batch-1 timing, e.g. ``+experiment=paper_table_latency``) and
keeps the quality run's own speed-up as a throughput column. Each record is validated first
(lantern.results.record): a malformed one is refused with one line naming the file and the field, and
nothing is written. ``--out`` is a folder. ``--report`` also writes ``report.html`` there: the table, plots,
the images of the first ``--report-prompts`` prompts under every method, with acceptance maps, and provenance.
``--frontier`` adds STEM_frontier.png and STEM_frontier.json: speed-up and tau against the measured realised
TV, one line per method over its knob (exact methods at TV 0, rows whose TV was not measured in a strip of
their own).
"""

from __future__ import annotations

import sys

from lantern.cli.main import ArgumentParser, run_or_exit
from lantern.results.frontier import write_frontier
from lantern.results.render import make_tables, to_markdown
from lantern.results.report import parse_prompts, write_report
from lantern.results.tables import failed_jobs, load_records


def main() -> None:
    parser = ArgumentParser(__doc__)
    parser.add_argument("runs", nargs="+", help="run or sweep folders, or metrics.json files")
    parser.add_argument(
        "--out",
        default=None,
        help="folder for STEM.{md,csv,tex,json} and STEM_pareto.png (created if missing; default: the first runs folder)",
    )
    parser.add_argument("--stem", default="table", help="a plain file name (no folders)")
    parser.add_argument(
        "--latency",
        action="append",
        default=[],
        metavar="RUNS",
        help="run or sweep folders whose latency and speed-up the rows take (same method and setting)",
    )
    parser.add_argument(
        "--no-throughput",
        action="store_true",
        help="with --latency: leave out the quality runs' own speed-ups (runs timed on a shared or loaded machine)",
    )
    parser.add_argument("--report", action="store_true", help="also write report.html into the --out folder")
    parser.add_argument(
        "--report-prompts",
        default="8",
        metavar="N|I,J,...",
        help="the report's grid: the first N images, or the named image indices (default 8)",
    )
    parser.add_argument(
        "--frontier",
        action="store_true",
        help="also STEM_frontier.{png,json}: speed-up and tau against the realised TV, a line per method over its knob",
    )
    args = parser.parse()
    prompts = run_or_exit(lambda: parse_prompts(args.report_prompts, "--report-prompts"))
    table, paths = run_or_exit(
        lambda: make_tables(args.runs, args.out, args.stem, args.latency, throughput=not args.no_throughput)
    )
    if args.report:
        records = run_or_exit(lambda: load_records(args.runs))
        timed = run_or_exit(lambda: load_records(args.latency)) if args.latency else None
        page, _ = write_report(
            records,
            paths["md"].parent,
            prompts,
            latency=timed,
            throughput=not args.no_throughput,
            command="python " + " ".join(sys.argv),
            failed=failed_jobs(args.runs),
        )
        paths["report"] = page
    print(to_markdown(table, failed_jobs(args.runs), paths["md"].parent))
    if args.frontier:
        paths |= {
            f"frontier_{k}": v
            for k, v in write_frontier(table, load_records(args.runs), paths["md"].parent, args.stem, args.runs).items()
        }
    print("wrote " + ", ".join(str(p) for p in paths.values()))


if __name__ == "__main__":
    main()
