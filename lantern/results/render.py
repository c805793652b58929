"""The table rendered from one pandas DataFrame: Markdown, LaTeX, CSV and JSON, and the Pareto plot.

:func:`frame` turns :class:`~lantern.results.tables.Table` rows into a DataFrame of raw values (CSV and
JSON read it); :func:`shown` formats it for reading (Markdown via ``DataFrame.to_markdown``, LaTeX via
``Styler.to_latex``); the Pareto plot (matplotlib) reads the raw frame. :func:`write_tables` writes every
file as a set: into a temporary folder first, then renamed into place, so a failure leaves none of them.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import tempfile
from pathlib import Path

import pandas as pd

from lantern.errors import ConfigError
from lantern.results import batch_sweep
from lantern.results.published import attach_published
from lantern.results.record import LOSSY_UNMEASURED, RunRecord
from lantern.results.tables import COLUMNS, Table, build_table

# Quality columns shown only when some row has the figure: name -> (title, digits).
OPTIONAL_QUALITY = {
    "prompt_accuracy": ("accuracy", 3),
    "precision": ("precision", 3),
    "recall": ("recall", 3),
    "hps": ("HPS", 4),
    "inception_score": ("IS", 2),
    "kid": ("KID", 4),
}
# The published figures' columns (lantern.results.published), shown as one block when a table has them.
PAPER_TITLES = {
    "paper_step_compression": "paper step",
    "paper_speedup": "paper latency",
    "paper_fid": "paper FID",
    "paper_clip": "paper CLIP",
}
NOTE_INTERVALS = (
    "Quality figures: value ± half-width of the 95% percentile bootstrap interval over prompts (FID, precision/"
    "recall, KID: the generated set resampled against fixed reference statistics); CSV and JSON hold [lo, hi]."
)
NOTE_LATENCY = (
    "Latency: decode time per image, mean [interquartile range over batches]. Speed-up: AR time / decoder time "
    "[interquartile range of per-batch ratios]; vs compiled AR: over our AR compiled like the decoder, whose time is "
    "AR ms/image (interleaved in the same run, or the named AR run of the same setting); vs reference AR: over the "
    "papers' own loop, eager (transformers' or LlamaGen's generate(), timed on the same batches; baseline=both), "
    "whose time is reference AR ms/image."
)


def _speedup_cell(value, spread, times: str) -> str:
    """A speed-up as ``1.23x [q1, q3]``, ``-`` where there is none."""
    return "-" if _number(value, 2) == "-" else f"{value:.2f}{times}" + _range(spread, 2)


def _tv_cell(row: dict) -> str:
    """Realised TV as ``mean / max``; a lossy decoder without a measured TV (ZipAR) says so, never a blank
    beside lossless rows."""
    if _number(row["tv_realised"], 3) != "-":
        return f"{row['tv_realised']:.3f} / {_number(row['tv_realised_max'], 3)}"
    return LOSSY_UNMEASURED if row["lossless"] is False else "-"


def frame(table: Table) -> pd.DataFrame:
    """The rows as a DataFrame with the columns :data:`~lantern.results.tables.COLUMNS` (raw values)."""
    return pd.DataFrame(table.rows, columns=list(COLUMNS))


def _joined(data: pd.DataFrame) -> bool:
    """Whether the rows carry latency from separate runs (``build_table(..., latency=...)``)."""
    return bool(data["throughput_batch"].notna().any())


def _number(value, digits: int) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _estimate(row: dict, name: str, digits: int) -> str:
    """A quality figure as ``value ± half-width`` of its interval (``value`` alone when it has none)."""
    value, interval = row[name], row[name + "_ci"]
    if _number(value, digits) == "-":
        return "-"
    if not isinstance(interval, list):
        return _number(value, digits)
    return f"{value:.{digits}f} ± {(interval[1] - interval[0]) / 2:.{digits}f}"


def _range(values, digits: int) -> str:
    return "" if not isinstance(values, list) else f" [{values[0]:.{digits}f}, {values[1]:.{digits}f}]"


def _short_run(run, root: Path | None) -> str:
    if not isinstance(run, str) or not run:
        return "-"
    if root is not None:
        try:
            return Path(run).resolve().relative_to(Path(root).resolve()).as_posix() or "."
        except ValueError:
            pass
    return run


def _protocol(name, subset) -> str:
    """The protocol cell: its name, `` (subset)`` when the run used its first N prompts, ``-`` without one (a
    row without a protocol beside rows with one reads back from pandas as NaN, never as None)."""
    if not isinstance(name, str) or not name:
        return "-"
    return name + (" (subset)" if not pd.isna(subset) and bool(subset) else "")


def run_name(run: str, sweeps, out: Path | None = None) -> str:
    """``run`` (a folder) named relative to the sweep folder in ``sweeps`` that holds it: its path under the
    sweep, after the sweep folder's own name unless the sweep is ``out`` (where the table is written), so
    no table names the absolute path of the machine that made it. A run under no sweep keeps its last name."""
    path = Path(run).resolve()
    for sweep in map(Path, sweeps):
        root = sweep.resolve()
        if path.is_relative_to(root):
            under = path.relative_to(root).as_posix()
            if out is not None and root == Path(out).resolve():
                return under
            return root.name if under == "." else f"{root.name}/{under}"
    return path.name


def with_run_names(table: Table, failed: list[dict], sweeps, out: Path) -> tuple[Table, list[dict]]:
    """``table`` and ``failed`` with every run folder (the rows' ``run`` and ``latency_run``, wherever a cell or
    note names one, the failed jobs) named by :func:`run_name`."""
    runs = [row.get(key) for row in table.rows for key in ("run", "latency_run")] + [job["run"] for job in failed]
    named = {run: run_name(run, sweeps, out) for run in runs if isinstance(run, str) and run}
    longest_first = sorted(named, key=len, reverse=True)  # a longer path first: it may contain a shorter one

    def rename(value):
        if not isinstance(value, str):
            return value
        if value in named:
            return named[value]
        for run in longest_first:
            value = value.replace(run, named[run])
        return value

    rows = [{key: rename(value) for key, value in row.items()} for row in table.rows]
    failed = [{**job, "run": rename(job["run"])} for job in failed]
    return Table(rows=rows, notes=[rename(note) for note in table.notes]), failed


def shown(table: Table, root: Path | None = None, times: str = "x") -> pd.DataFrame:
    """The table formatted for reading: one text column per shown quantity, ``-`` where a value is missing."""
    data = frame(table)
    joined = _joined(data)
    timed = bool(data["throughput_speedup"].notna().any())  # quality runs whose own times are shown
    extra = {name for name in OPTIONAL_QUALITY if data[name].notna().any()}  # columns only where some row has one
    protocols = bool(data["protocol"].notna().any())
    stepped = bool(data["step_compression"].notna().any())
    batched = batch_sweep.is_batch_sweep(data)
    referenced = bool(data["speedup_reference"].notna().any())
    paper = bool(data[list(PAPER_TITLES)].notna().any().any())  # the published block, when one was attached
    rows = []
    for row in data.to_dict("records"):
        speedup = _speedup_cell(row["speedup"], row["speedup_iqr"], times)
        tv = _tv_cell(row)
        out = {
            "method": row["method"],
            "tau": _number(row["tau"], 2),
            "latency ms/image [IQR]": _number(row["latency_ms"], 1) + _range(row["latency_iqr_ms"], 1),
            "speed-up vs compiled AR [IQR]": speedup,
        }
        if referenced:  # rows timed beside the reference-grade AR too (baseline=both)
            reference = _speedup_cell(row["speedup_reference"], row["speedup_reference_iqr"], times)
            out.update(
                {"speed-up vs reference AR [IQR]": reference, "reference AR ms/image": _number(row["reference_ms"], 1)}
            )
        out["AR ms/image"] = _number(row["baseline_ms"], 1)
        if batched:  # +experiment=batch_sweep: each row's batch, throughput and memory
            out.update(batch_sweep.shown_cells(row))
        if stepped:  # AR's forwards over the decoder's, and speed-up over it (records with target_steps)
            out["step compression"] = _number(row["step_compression"], 2)
            out["latency / step"] = _number(row["latency_per_step"], 2)
        if joined and timed:
            throughput = row["throughput_speedup"]
            out["throughput speed-up"] = "-" if _number(throughput, 2) == "-" else f"{throughput:.2f}{times}"
        out.update(
            {
                "FID": _estimate(row, "fid", 2),
                "CLIP": _estimate(row, "clip_score", 4),
                **{
                    title: _estimate(row, name, digits)
                    for name, (title, digits) in OPTIONAL_QUALITY.items()
                    if name in extra
                },
                "delta": _number(row["delta"], 2),
                "realised TV mean / max": tv,
                "run": _short_run(row["run"], root),
            }
        )
        if protocols:
            out["protocol"] = _protocol(row["protocol"], row["protocol_subset"])
        if paper:
            out.update({title: _number(row[name], 2) for name, title in PAPER_TITLES.items()})
            claim = row["paper_lossless"]
            out["paper lossless (claimed)"] = "-" if pd.isna(claim) else ("yes" if claim else "no")
        if joined:
            out["latency run"] = _short_run(row["latency_run"], root)
        rows.append(out)
    return pd.DataFrame(rows, columns=None if rows else ["method"])


def notes(table: Table, failed: list[dict] | None = None, root: Path | None = None) -> list[str]:
    """The lines under the table: how it was measured, why cells are empty, failed sweep jobs."""
    data = frame(table)
    lines = [NOTE_LATENCY]
    if len(data) and any(data[name + "_ci"].notna().any() for name in ("fid", "clip_score", *OPTIONAL_QUALITY)):
        lines.append(NOTE_INTERVALS)
    if len(data) and _joined(data):
        batches = lambda key: "/".join(str(int(b)) for b in sorted(set(data[key].dropna()))) or "-"  # noqa: E731
        own = (
            f"throughput speed-up is the quality run's own, at batch {batches('throughput_batch')}"
            if data["throughput_speedup"].notna().any()
            else "the quality runs' own times are not shown (make_tables --no-throughput)"
        )
        lines.append(
            f"Latency, speed-up and AR ms/image come from the latency runs at batch {batches('latency_batch')} "
            f"(latency run column); tau, FID, CLIP and TV from the quality runs (run column); {own}. "
            "Per-sample seeds make a sample the same at any batch size."
        )
    lines += table.notes + (batch_sweep.batch_notes(data) if batch_sweep.is_batch_sweep(data) else [])
    for job in failed or []:
        lines.append(f"FAILED job {_short_run(job['run'], root)} ({' '.join(job['overrides'])}): {job['error']}")
    return lines


def to_markdown(table: Table, failed: list[dict] | None = None, root: Path | None = None) -> str:
    """The table as Markdown (``DataFrame.to_markdown``), then its notes and any failed jobs.

    ``root``: run folders are shown relative to it (the sweep or output folder) where they lie under it.
    """
    body = shown(table, root).to_markdown(index=False, tablefmt="pipe", disable_numparse=True)
    return body + "\n\n" + "\n".join(notes(table, failed, root)) + "\n"


def to_latex(table: Table, failed: list[dict] | None = None, root: Path | None = None) -> str:
    """The table as a LaTeX tabular with booktabs rules (``Styler.to_latex``), notes as comments."""
    data = shown(table, root, times=r"$\times$").drop(columns=["run", "latency run"], errors="ignore")
    escaped = data.copy()
    for column in escaped.columns:
        if not column.startswith("speed-up") and column != "throughput speed-up":
            escaped[column] = escaped[column].map(_tex)
    escaped.columns = [_tex(c) for c in escaped.columns]
    styler = escaped.style.hide(axis="index")
    tabular = styler.to_latex(hrules=True, column_format="l" + "r" * (len(escaped.columns) - 1))
    comments = ["% Needs \\usepackage{booktabs} (\\toprule, \\midrule, \\bottomrule)."]
    comments += [f"% {_tex(line)}" for line in notes(table, failed, root)]
    return "\n".join(comments) + "\n" + tabular


def _tex(text: str) -> str:
    return str(text).replace("\\", "/").replace("_", "\\_").replace("%", "\\%").replace("&", "\\&").replace("#", "\\#")


def to_csv(table: Table) -> str:
    """The table as CSV with raw numbers (``DataFrame.to_csv``; ranges as ``[q1, q3]``)."""
    data = frame(table)
    for column in (
        "latency_iqr_ms",
        "speedup_iqr",
        "speedup_reference_iqr",
        *(c for c in data.columns if c.endswith("_ci")),
    ):
        data[column] = data[column].map(lambda v: json.dumps(v) if isinstance(v, list) else v)
    return data.to_csv(index=False)


def to_json(
    table: Table, records: list[RunRecord], latency: list[RunRecord] | None, failed: list[dict], names=None
) -> str:
    """``{"rows": [...], "notes": [...], "runs": [...], "latency_runs": [...], "failed": [...]}`` from the frame
    (``runs`` and ``latency_runs``: the folders as the rows name them, :func:`with_run_names`)."""
    data = frame(table).astype(object).where(frame(table).notna(), None)
    payload = {
        "rows": data.to_dict("records"),
        "notes": table.notes,
        "runs": [r.run_dir for r in records],
        "latency_runs": [r.run_dir for r in latency or []],
        "failed": failed,
    }
    if names is not None:
        payload["runs"] = [names(run) for run in payload["runs"]]
        payload["latency_runs"] = [names(run) for run in payload["latency_runs"]]
    return json.dumps(payload, indent=2, default=str) + "\n"


def _far_outliers(values: list[float]) -> set[float]:
    """Values above twice the median (a broken mode's FID beside working ones)."""
    if len(values) < 3:
        return set()
    median = statistics.median(values)
    return {v for v in values if v > 2 * median}


def pareto_plot(table: Table, path: str | os.PathLike) -> Path:
    """Speed-up against FID (or against tau when no run has a FID), Pareto front marked, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = frame(table)
    use_fid = bool(data["fid"].notna().any())
    key, label = ("fid", "FID (lower is better)") if use_fid else ("tau", "tau (mean accepted length)")
    points = [
        (r["speedup"], r[key], r["method"] + ("" if not r["tv_realised"] else f" [TV {r['tv_realised']:.3f}]"))
        for r in data.to_dict("records")
        if pd.notna(r["speedup"]) and pd.notna(r[key])
    ]
    # Intervals as error bars: FID's bootstrap interval, the speed-up's interquartile range over batches.
    bars = {
        (r["speedup"], r[key]): (r.get(key + "_ci"), r["speedup_iqr"])
        for r in data.to_dict("records")
        if pd.notna(r["speedup"]) and pd.notna(r[key])
    }
    figure, axis = plt.subplots(figsize=(9, 6))
    outliers = _far_outliers([y for _, y, _ in points]) if use_fid else set()
    kept = [p for p in points if p[1] not in outliers]
    for i, (x, y, name) in enumerate(kept):
        axis.scatter(x, y, color="tab:blue")
        ci, iqr = bars.get((x, y), (None, None))
        if isinstance(ci, list) or isinstance(iqr, list):
            # A mean may lie outside its batches' quartiles: clamp, never a negative bar.
            yerr = [[max(0.0, y - ci[0])], [max(0.0, ci[1] - y)]] if isinstance(ci, list) else None
            xerr = [[max(0.0, x - iqr[0])], [max(0.0, iqr[1] - x)]] if isinstance(iqr, list) else None
            axis.errorbar(x, y, yerr=yerr, xerr=xerr, color="tab:blue", alpha=0.5, capsize=2, linewidth=0.8)
        axis.annotate(name, (x, y), fontsize=6, xytext=(3, 3 + 7 * (i % 3)), textcoords="offset points")
    if outliers:  # rows far above the rest would squash every other point into one line
        off = [f"{name}: FID {y:.1f}, {x:.2f}x" for x, y, name in points if y in outliers]
        axis.text(0.01, 0.99, "off the chart:\n" + "\n".join(off), transform=axis.transAxes, fontsize=6, va="top")
    better = (lambda a, b: a <= b) if use_fid else (lambda a, b: a >= b)
    front = sorted(p for p in points if not any(q[0] >= p[0] and better(q[1], p[1]) and q[:2] != p[:2] for q in points))
    if len(front) > 1:
        axis.plot([p[0] for p in front], [p[1] for p in front], color="tab:orange", label="Pareto front")
        axis.legend()
    axis.set_xlabel("speed-up over AR")
    axis.set_ylabel(label)
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120, format="png")
    plt.close(figure)
    return Path(path)


def write_tables(
    records: list[RunRecord],
    out_dir: str | os.PathLike,
    stem: str = "table",
    failed: list[dict] | None = None,
    latency: list[RunRecord] | None = None,
    notes: list[str] | None = None,
    throughput: bool = True,
    sweeps=(),
    published: dict | None = None,
) -> dict[str, Path]:
    """Write ``stem.md``, ``stem.csv``, ``stem.tex``, ``stem.json`` and ``stem_pareto.png`` into ``out_dir``.

    ``failed``: sweep jobs without a record (:func:`~lantern.results.tables.failed_jobs`), named under the
    table. ``latency``: runs that lend the rows their latency and speed-up. ``notes``: more lines for the
    table's notes. ``sweeps``: the folders the runs were found in (default: ``out_dir``); every file names a
    run relative to its sweep (:func:`run_name`). ``published``: the paper column block
    (:func:`~lantern.results.published.attach_published`). Every file is written into a
    temporary folder in ``out_dir`` first and renamed into place only when all are written.
    """
    out, failed = Path(out_dir), failed or []
    table = build_table(records, latency, throughput)  # a refused join writes nothing
    table.notes.extend(notes or [])
    sweeps = list(sweeps) or [out]
    table, failed = with_run_names(table, failed, sweeps, out)
    if published:  # the paper column block (a bad CSV or model is refused before anything is written)
        attach_published(table, published)
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{stem}.", suffix=".tmp", dir=out))
    try:
        texts = {
            "md": to_markdown(table, failed),
            "csv": to_csv(table),
            "tex": to_latex(table, failed),
            "json": to_json(table, records, latency, failed, lambda run: run_name(run, sweeps, out)),
        }
        names = {suffix: f"{stem}.{suffix}" for suffix in texts} | {"png": f"{stem}_pareto.png"}
        for suffix, text in texts.items():
            (scratch / names[suffix]).write_text(text, encoding="utf-8")
        pareto_plot(table, scratch / names["png"])
        if batch_sweep.is_batch_sweep(frame(table)):  # speed-up against batch size, a line per method
            names["batch_png"] = f"{stem}_batch.png"
            batch_sweep.batch_plot(frame(table), scratch / names["batch_png"])
        for name in names.values():
            with open(scratch / name, "rb+") as handle:
                os.fsync(handle.fileno())
        paths = {}
        for suffix, name in names.items():
            os.replace(scratch / name, out / name)
            paths[suffix] = out / name
        return paths
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def make_tables(
    runs: list[str],
    out: str | None = None,
    stem: str = "table",
    latency: list[str] | None = None,
    throughput: bool = True,
) -> tuple[Table, dict[str, Path]]:
    """``scripts/make_tables.py``: every record under ``runs`` (and ``latency``) validated, then the table
    written into ``out`` (default: the first runs folder) as the set of files :func:`write_tables` makes."""
    from lantern.results.tables import failed_jobs, load_records

    if not stem or Path(stem).name != stem or stem in (".", ".."):
        raise ConfigError(f"--stem={stem!r}: expected a plain file name (no folders)")
    folder = Path(out) if out else Path(runs[0])
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"--out={str(folder)!r} is a file; give a folder (the tables are written into it)")
    for path in latency or []:  # checked with the flags, before the runs are read
        if not Path(path).exists():
            raise ConfigError(f"--latency={str(path)!r}: expected an existing run or sweep folder, or a metrics.json")
    repeated: list[str] = []
    records = load_records(runs, repeated)  # every record validated before anything is written
    timed = load_records(latency) if latency else None
    table = build_table(records, timed, throughput)
    notes = [f"{path}: given more than once, shown once" for path in repeated]
    table.notes.extend(notes)
    paths = write_tables(
        records,
        folder,
        stem,
        failed=failed_jobs(runs),
        latency=timed,
        notes=notes,
        throughput=throughput,
        sweeps=[*runs, *(latency or [])],
    )
    return table, paths
