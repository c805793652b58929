"""The multirun's Hydra callback: every job checked first, one sweep per folder, its table whatever happens."""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import OmegaConf

from lantern.cli.main import use_cache_folder
from lantern.cli.preflight import check_sweep_jobs
from lantern.errors import user_message
from lantern.files import write_json_atomic
from lantern.results.published import check_published
from lantern.results.record import RECORD_NAME
from lantern.results.render import write_tables
from lantern.results.report import parse_prompts, write_report
from lantern.results.tables import FAILED_NAME, failed_jobs, load_records, table_rows
from lantern.run.sweeps import check_launcher, claim_sweep

try:
    from hydra.experimental.callback import Callback
except ImportError:  # pragma: no cover - hydra is a dependency
    Callback = object


def report_prompts(config) -> int | list[int]:
    """The config's ``report.prompts`` (8 when absent), checked (ConfigError)."""
    value = config.report.prompts if "report" in config else 8
    return parse_prompts(OmegaConf.to_object(value) if OmegaConf.is_config(value) else value)


class SweepTable(Callback):
    """Hydra callback: one sweep per folder, and its table whatever becomes of its jobs.

    At the start of a multirun it checks the launcher config (a missing required field is one
    ``error:`` line, exit 2) and every job's config (:func:`lantern.cli.preflight.check_sweep_jobs`: one
    bad value in any job and nothing runs), takes the sweep folder's lock (a second sweep into it is refused) and
    refuses a folder that holds a sweep of other overrides. After every job it rewrites the table of
    the jobs finished so far and names failed ones (so a failed job, which stops Hydra before the end
    of the multirun, still leaves a table); at the end of the multirun it writes the table once more
    and hands it to the runs' tracker (``job.tracker``, W&B by default) once.
    """

    def __init__(self) -> None:
        self._lock = None

    def on_multirun_start(self, config, **kwargs) -> None:
        use_cache_folder(config)  # the jobs' preflight hashes the files it checks
        try:
            check_launcher(config)
            check_sweep_jobs(config)  # every job's config, before any folder is made
            report_prompts(config)
            if _published(config) is not None:  # the paper column block's CSV and model, before any job
                check_published(_published(config))
            self._lock = claim_sweep(config)
        except Exception as exc:  # noqa: BLE001 - Hydra would warn and re-raise; a user error is one line here
            message = user_message(exc)  # ConfigError, or a file where the sweep folder goes (hydra.sweep.dir)
            if message is None:
                raise
            print(f"error: {message}", file=sys.stderr)
            sys.exit(2)

    def on_job_end(self, config, job_return, **kwargs) -> None:
        from hydra.core.utils import JobStatus

        run_dir = Path(config.hydra.runtime.output_dir)
        if job_return.status == JobStatus.FAILED:
            error = job_return._return_value
            write_json_atomic(
                run_dir / FAILED_NAME,
                {
                    "overrides": list(job_return.overrides or []),
                    "error": f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}",
                },
            )
        elif (run_dir / FAILED_NAME).is_file():
            (run_dir / FAILED_NAME).unlink()
        # The report once at the end, or now when a job failed (Hydra stops the multirun there).
        self._write(
            Path(config.hydra.sweep.dir), config, _published(config), report=job_return.status == JobStatus.FAILED
        )

    def on_multirun_end(self, config, **kwargs) -> None:
        from hydra.utils import instantiate

        sweep = Path(config.hydra.sweep.dir)
        written = self._write(sweep, config, _published(config))
        if written is not None:
            print(f"sweep table: {written[1]['md']}" + (f", report: {written[2][0]}" if written[2] else ""))
            tracker = config.get("job", {}).get("tracker")
            if tracker is not None:
                report = written[2][1] if written[2] else None
                instantiate(tracker).log_table(sweep, table_rows(written[0]), written[1]["png"], report)
        if self._lock is not None:
            self._lock.release()

    @staticmethod
    def _write(sweep: Path, config, published: dict | None = None, report: bool = True):
        """The table, then (``report``) ``report.html`` beside it (a report that fails is named on stderr; the
        table stands)."""
        if not any(sweep.rglob(RECORD_NAME)):
            return None
        records, failed = load_records([sweep]), failed_jobs([sweep])
        paths = write_tables(records, sweep, failed=failed, published=published)
        if not report:
            return records, paths, None
        command = "python run.py -m " + " ".join(config.hydra.overrides.task)
        try:
            return records, paths, write_report(records, sweep, report_prompts(config), command=command, failed=failed)
        except Exception as exc:  # the report is a view of the table; never the reason a sweep fails
            print(f"report.html not written: {type(exc).__name__}: {exc}", file=sys.stderr)
            return records, paths, None


def _published(config) -> dict | None:
    """The experiment's paper column block (``published:``, e.g. +experiment=sjd_pac_table), or None."""
    from omegaconf import OmegaConf

    block = config.get("published")
    return None if block is None else OmegaConf.to_container(block, resolve=True)
