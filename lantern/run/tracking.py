"""Weights & Biases logging of a finished run (the record's scalars, the resolved config and the grid) and
of a finished sweep's table (a W&B table and the Pareto plot).

``mode="offline"`` (the default) writes the run under ``<run dir>/wandb`` with no account or network
(`wandb sync` uploads it later); ``online`` logs live, after :meth:`WandbLogger.check` has made sure,
before any work, that there is a key and the server answers; ``disabled`` does nothing. The logger is
handed the finished record, so a failed run logs nothing. ``quiet`` (the default) keeps W&B's own
console lines off the terminal. The runs of a sweep share a group named after the sweep folder and are
named from their overrides (:func:`run_identity`).
"""

from __future__ import annotations

import os
from pathlib import Path

from lantern import checks
from lantern.errors import ConfigError

MODES = ("offline", "online", "disabled")
NAME_MAX = 128  # W&B's limit on a project name
NAME_FORBIDDEN = "/\\#?%:"  # characters W&B refuses in a project name (its entity names are plainer still)


def check_name(key: str, value, what: str) -> str:
    """``value`` as a W&B ``what`` name (project or entity): 1 to 128 printable characters, none of ``/ \\ # ? %
    :`` and, for an entity, no spaces; W&B itself refuses the others only when the run is logged, after the work."""
    spaces = what == "entity"
    text = value if isinstance(value, str) else ""
    bad = not text or len(text) > NAME_MAX or not text.isprintable() or any(c in NAME_FORBIDDEN for c in text)
    if bad or (spaces and any(c.isspace() for c in text)):
        forbidden = " ".join(NAME_FORBIDDEN) + (" or a space" if spaces else "")
        raise checks.refuse(key, value, f"a W&B {what} name of 1 to {NAME_MAX} characters, none of {forbidden}")
    return text


def check_tracker(node) -> None:
    """Check a tracker's settings (``job.tracker`` of a resolved run config: mode, project, entity) before any
    work, as its constructor does; anything but a W&B tracker node is left alone."""
    if isinstance(node, dict) and str(node.get("_target_", "")).endswith(".WandbLogger"):
        WandbLogger(**{k: v for k, v in node.items() if k in ("mode", "project", "entity")})


def scalars(record: dict) -> dict:
    """The record's top-level numbers and strings (what a W&B summary holds)."""
    return {k: v for k, v in record.items() if isinstance(v, (int, float, str, bool)) or v is None}


def run_identity() -> tuple[str | None, str | None]:
    """(group, name) of this Hydra job for W&B: a multirun's jobs share ``sweep-<sweep folder>`` and are
    named from their overrides (``decoding=eagle,delta=0.1``); a single run is named from its overrides.
    (None, None) outside Hydra."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return None, None
    hydra = HydraConfig.get()
    name = hydra.job.override_dirname or None
    if name is not None and len(name) > 120:
        name = name[:117] + "..."
    if hydra.mode == RunMode.MULTIRUN:
        return f"sweep-{Path(hydra.sweep.dir).name}", name or f"job-{hydra.job.num}"
    return None, name


def _cell(value):
    """A table cell W&B accepts: lists (interquartile ranges) as text."""
    return str(value) if isinstance(value, (list, dict)) else value


class WandbLogger:
    """Log one run to W&B. Constructing it does nothing; :meth:`log_run` starts and finishes a W&B run."""

    def __init__(
        self,
        mode: str = "offline",
        project: str = "lantern",
        group: str | None = None,
        name: str | None = None,
        quiet: bool = True,
        timeout_s: int = 15,
        entity: str | None = None,
    ):
        checks.choice("wandb.mode", mode, MODES)
        check_name("wandb.project", project, "project")
        if entity is not None:
            check_name("wandb.entity", entity, "entity")
        elif os.environ.get("WANDB_ENTITY"):  # W&B reads the variable when no entity is given
            entity = check_name("WANDB_ENTITY", os.environ["WANDB_ENTITY"], "entity")
        self.mode, self.project, self.entity, self.group, self.name = mode, project, entity, group, name
        self.quiet, self.timeout_s = quiet, timeout_s
        if quiet:
            os.environ.setdefault("WANDB_SILENT", "true")  # W&B reads it when it starts, also in its service process

    def check(self) -> None:
        """Before any work: online logging needs an API key and a W&B server that answers; one line otherwise."""
        if self.mode != "online":
            return
        import wandb

        host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")
        hint = "or log with wandb.mode=offline (then `wandb sync`) or wandb.mode=disabled"
        no_key = ConfigError(
            f"wandb.mode=online but no W&B API key is set: set WANDB_API_KEY or run `wandb login`, {hint}"
        )
        try:
            if not wandb.login(prompt=False, verify=True, timeout=self.timeout_s):  # False: no key found
                raise no_key
        except wandb.errors.UsageError:
            raise no_key from None
        except wandb.errors.Error as exc:
            reason = (str(exc).splitlines() or [type(exc).__name__])[0]
            raise ConfigError(f"wandb.mode=online but W&B at {host} does not answer ({reason}); {hint}") from None

    def _settings(self):
        import wandb

        return wandb.Settings(silent=True, console="off") if self.quiet else None

    def log_run(self, out_dir: Path, record: dict) -> None:
        """Log ``record`` (and ``grid.png`` when present) for the run in ``out_dir``."""
        if self.mode == "disabled":
            return
        import wandb

        name = self.name or f"{record.get('decoding')}-{Path(out_dir).name}"
        run = wandb.init(
            project=self.project,
            entity=self.entity,
            group=self.group,
            name=name,
            dir=str(out_dir),
            mode=self.mode,
            config=record.get("config") or {},
            reinit="create_new",
            settings=self._settings(),
        )
        try:
            summary = scalars(record)
            grid = Path(out_dir) / "grid.png"
            if grid.is_file():
                summary["grid"] = wandb.Image(str(grid))
            run.log(summary)
        finally:
            run.finish()

    def log_table(self, out_dir: Path, rows: list[dict], plot: Path | None = None, report=None) -> None:
        """Log a sweep's table ``rows`` (and its Pareto ``plot``) as one W&B run under ``out_dir``; with the
        ``report``'s grid (:class:`lantern.results.report.ReportData`) its images, acceptance maps and histograms."""
        if self.mode == "disabled" or not rows:
            return
        import wandb

        columns = list(rows[0])
        run = wandb.init(
            project=self.project,
            entity=self.entity,
            group=self.group or f"sweep-{Path(out_dir).name}",
            name=f"table-{Path(out_dir).name}",
            dir=str(out_dir),
            mode=self.mode,
            job_type="table",
            reinit="create_new",
            settings=self._settings(),
        )
        try:
            logged = {
                "table": wandb.Table(columns=columns, data=[[_cell(row.get(c)) for c in columns] for row in rows])
            }
            if plot is not None and Path(plot).is_file():
                logged["pareto"] = wandb.Image(str(plot))
            if report is not None:
                logged.update(report_panels(report))
            run.log(logged)
        finally:
            run.finish()


def report_panels(report) -> dict:
    """W&B panels of a sweep's report: ``images`` and ``acceptance_maps`` (tables, rows: prompts, columns: the
    methods in table order, each image captioned with its tau and latency) and ``accepted_length`` (a line per
    method: the share of steps that emitted each run length)."""
    import wandb

    from lantern.results.report_plots import map_image

    columns = ["prompt", *report.methods]
    images, maps = [], []
    for caption, cells in zip(report.captions, report.cells, strict=True):
        images.append([caption] + [wandb.Image(str(c.image), caption=c.caption()) if c.image else None for c in cells])
        maps.append(
            [caption]
            + [
                wandb.Image(map_image(c.lengths, report.longest, c.skipped), caption=c.caption())
                if c.lengths is not None
                else None
                for c in cells
            ]
        )
    panels = {
        "images": wandb.Table(columns=columns, data=images),
        "acceptance_maps": wandb.Table(columns=columns, data=maps),
    }
    shown = {method: counts for method, counts in report.histograms.items() if counts and sum(counts)}
    if shown:
        longest = max(len(counts) for counts in shown.values())
        panels["accepted_length"] = wandb.plot.line_series(
            xs=list(range(1, longest + 1)),
            ys=[[n / sum(counts) for n in counts] + [0.0] * (longest - len(counts)) for counts in shown.values()],
            keys=list(shown),
            title="share of steps by accepted run length",
            xname="run length",
        )
    return panels
