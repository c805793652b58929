"""A sweep folder for one sweep at a time, and launcher configs checked before any job starts.

Hydra writes ``multirun.yaml`` into the sweep folder and each job into ``<sweep>/<job number>``. A
rerun of the same command into the same folder resumes (finished jobs are skipped by their run
folders, :mod:`lantern.run.rundir`); a sweep of other overrides, or a second sweep while one is running,
is refused with one line before anything is written.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from lantern.errors import ConfigError
from lantern.files import write_json_atomic
from lantern.results.record import RECORD_NAME
from lantern.results.tables import FAILED_NAME, failed_jobs, load_records, table_rows, write_tables
from lantern.run.lock import FolderLock

SWEEP_CONFIG = "multirun.yaml"
# Launcher fields a sweep cannot go without, by launcher class (the plugin's own schema leaves them optional).
REQUIRED = {"SlurmLauncher": ("partition", "timeout_min", "gpus_per_node", "array_parallelism")}


def check_launcher(config: DictConfig) -> None:
    """Refuse a launcher config with required fields unset (``???`` or, for SLURM, null), naming the first one."""
    launcher = config.hydra.get("launcher")
    if launcher is None:
        return
    kind = str(launcher.get("_target_", "launcher")).rsplit(".", 1)[-1]
    missing = sorted(OmegaConf.missing_keys(launcher))
    missing += [key for key in REQUIRED.get(kind, ()) if key not in missing and launcher.get(key) is None]
    if missing:
        raise ConfigError(
            f"hydra.launcher.{missing[0]} is required by {kind}: set it on the command line, "
            f"e.g. hydra.launcher.{missing[0]}=VALUE"
        )
    timeout = launcher.get("timeout_min")
    if timeout is not None and (not isinstance(timeout, int) or timeout < 1):
        raise ConfigError(f"hydra.launcher.timeout_min={timeout!r} must be an integer >= 1 (minutes)")


def claim_sweep(config: DictConfig) -> FolderLock:
    """Lock ``hydra.sweep.dir`` for this process and check it holds no sweep of other overrides.

    Returns the held lock (released when the process ends, or by the caller at the end of the sweep).
    """
    sweep = Path(config.hydra.sweep.dir)
    lock = FolderLock(sweep, what="sweep folder").acquire()
    saved = sweep / SWEEP_CONFIG
    if saved.is_file():
        try:
            before = list(OmegaConf.load(saved).hydra.overrides.task)
        except Exception:  # noqa: BLE001 - any unreadable file means we cannot tell: refuse
            before = ["<unreadable multirun.yaml>"]
        now = list(config.hydra.overrides.task)
        if before != now:
            lock.release()
            raise ConfigError(
                f"sweep folder {str(sweep)!r} holds a sweep of other overrides ({' '.join(before) or 'none'}; "
                f"this one: {' '.join(now) or 'none'}); rerun that command to resume, or choose another hydra.sweep.dir"
            )
    return lock


try:
    from hydra.experimental.callback import Callback
except ImportError:  # pragma: no cover - hydra is a dependency
    Callback = object


class SweepTable(Callback):
    """Hydra callback: one sweep per folder, and its table whatever becomes of its jobs.

    At the start of a multirun it checks the launcher config (a missing required field is one
    ``error:`` line, exit 2), takes the sweep folder's lock (a second sweep into it is refused) and
    refuses a folder that holds a sweep of other overrides. After every job it rewrites the table of
    the jobs finished so far and names failed ones (so a failed job, which stops Hydra before the end
    of the multirun, still leaves a table); at the end of the multirun it writes the table once more
    and hands it to the runs' tracker (``job.tracker``, W&B by default) once.
    """

    def __init__(self) -> None:
        self._lock = None

    def on_multirun_start(self, config, **kwargs) -> None:
        try:
            check_launcher(config)
            self._lock = claim_sweep(config)
        except ConfigError as exc:
            import sys

            print(f"error: {exc}", file=sys.stderr)
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
        self._write(Path(config.hydra.sweep.dir))

    def on_multirun_end(self, config, **kwargs) -> None:
        from hydra.utils import instantiate

        sweep = Path(config.hydra.sweep.dir)
        written = self._write(sweep)
        if written is not None:
            print(f"sweep table: {written[1]['md']}")
            tracker = config.get("job", {}).get("tracker")
            if tracker is not None:
                instantiate(tracker).log_table(sweep, table_rows(written[0]), written[1]["png"])
        if self._lock is not None:
            self._lock.release()

    @staticmethod
    def _write(sweep: Path):
        if not any(sweep.rglob(RECORD_NAME)):
            return None
        records = load_records([sweep])
        return records, write_tables(records, sweep, failed=failed_jobs([sweep]))
