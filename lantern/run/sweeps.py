"""A sweep folder for one sweep at a time, and launcher configs checked before any job starts.

Hydra writes ``multirun.yaml`` into the sweep folder and each job into ``<sweep>/<job number>``. A
rerun of the same command into the same folder resumes (finished jobs are skipped by their run
folders, :mod:`lantern.run.rundir`); a sweep of other overrides, or a second sweep while one is running,
is refused with one line before anything is written.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from lantern import checks
from lantern.errors import ConfigError
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
    if timeout is not None:
        checks.integer("hydra.launcher.timeout_min", timeout, 1, note="minutes")


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
