"""Weights & Biases logging of a finished run (the record's scalars, the resolved config and the grid) and
of a finished sweep's table (a W&B table and the Pareto plot).

``mode="offline"`` (the default) writes the run under ``<run dir>/wandb`` with no account or network
(`wandb sync` uploads it later); ``online`` logs live; ``disabled`` does nothing. The logger is handed
the finished record, so a failed run logs nothing.
"""

from __future__ import annotations

from pathlib import Path

from lantern.errors import ConfigError

MODES = ("offline", "online", "disabled")


def scalars(record: dict) -> dict:
    """The record's top-level numbers and strings (what a W&B summary holds)."""
    return {k: v for k, v in record.items() if isinstance(v, (int, float, str, bool)) or v is None}


class WandbLogger:
    """Log one run to W&B. Constructing it does nothing; :meth:`log_run` starts and finishes a W&B run."""

    def __init__(self, mode: str = "offline", project: str = "lantern", group: str | None = None):
        if mode not in MODES:
            raise ConfigError(f"wandb.mode={mode!r} must be one of {', '.join(MODES)}")
        self.mode, self.project, self.group = mode, project, group

    def log_run(self, out_dir: Path, record: dict) -> None:
        """Log ``record`` (and ``grid.png`` when present) for the run in ``out_dir``."""
        if self.mode == "disabled":
            return
        import wandb

        name = f"{record.get('decoding')}-{Path(out_dir).name}"
        run = wandb.init(
            project=self.project, group=self.group, name=name, dir=str(out_dir), mode=self.mode,
            config=record.get("config") or {}, reinit="create_new",
        )
        try:
            summary = scalars(record)
            grid = Path(out_dir) / "grid.png"
            if grid.is_file():
                summary["grid"] = wandb.Image(str(grid))
            run.log(summary)
        finally:
            run.finish()

    def log_table(self, out_dir: Path, rows: list[dict], plot: Path | None = None) -> None:
        """Log a sweep's table ``rows`` (and its Pareto ``plot``) as one W&B run under ``out_dir``."""
        if self.mode == "disabled" or not rows:
            return
        import wandb

        columns = list(rows[0])
        run = wandb.init(
            project=self.project, group=self.group, name=f"table-{Path(out_dir).name}", dir=str(out_dir),
            mode=self.mode, job_type="table", reinit="create_new",
        )
        try:
            logged = {"table": wandb.Table(columns=columns, data=[[row.get(c) for c in columns] for row in rows])}
            if plot is not None and Path(plot).is_file():
                logged["pareto"] = wandb.Image(str(plot))
            run.log(logged)
        finally:
            run.finish()
