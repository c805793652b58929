"""Result tables from run records: the paper's layout, as markdown, CSV and LaTeX, plus a Pareto plot.

Rows: AR, exact speculative decoding (per draft structure and candidate kind), LANTERN at each (k, delta),
LANTERN++ at each (k, lambda), under either semantics. Columns: tau, latency with its interquartile range
over batches, speed-up with its interquartile range, the AR time the speed-up was measured against, FID,
CLIP score, and the relaxation's promise (delta) beside the realised total variation. A record's own
``speedup`` (AR interleaved in the same run) is used when it has one; otherwise it is computed against
the AR record of the same setting (model, prompts, images, batch size, seed and sampling), machine and
thread count found among the records. Every row names the run it comes from; rows whose settings differ say how.
Records are read through :class:`lantern.results.record.RunRecord`, so a malformed one is refused.

Latency from other runs: the papers time batch 1, while quality needs many images, which a large batch
decodes faster and (per-sample seeds) identically. ``table_rows(records, latency=...)`` takes each row's
latency and speed-up from the latency run of the same method and setting (any image count and batch
size) and keeps the quality run's own speed-up as the throughput column.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable
from pathlib import Path

from lantern.errors import ConfigError
from lantern.files import write_atomic, write_json_atomic, write_text_atomic
from lantern.results.baselines import MACHINE_KEYS, SETTING_KEYS
from lantern.results.record import RECORD_NAME, RunRecord, read_record

FAILED_NAME = ".failed.json"  # beside a sweep job's images when the job raised (written by SweepTable)
FAMILY_ORDER = {"ar": 0, "eagle": 1, "lantern": 2, "lantern_pp": 3, "sjd": 4, "gsd": 5}
COLUMNS = (
    "method",
    "tau",
    "latency_ms",
    "latency_iqr_ms",
    "speedup",
    "speedup_iqr",
    "baseline_ms",
    "fid",
    "clip_score",
    "delta",
    "tv_realised",
    "tv_realised_max",
    "baseline",
    "run",
    "latency_batch",
    "latency_run",
    "throughput_speedup",
    "throughput_batch",
)
# What a latency run must share with a quality run to lend it its timing (not the image count or batch size).
LATENCY_KEYS = tuple(key for key in SETTING_KEYS if key not in ("num_images", "batch_size"))


def load_records(paths: Iterable[str | Path]) -> list[RunRecord]:
    """Every ``metrics.json`` under ``paths`` (files or folders), validated (:func:`read_record`)."""
    paths = list(paths)
    records = []
    for path in paths:
        path = Path(path)
        if not path.exists():
            raise ConfigError(f"runs path not found: {str(path)!r}")
        files = [path] if path.is_file() else sorted(path.rglob(RECORD_NAME))
        records.extend(read_record(file) for file in files)
    if not records:
        raise ConfigError(f"no {RECORD_NAME} found under {', '.join(map(str, paths))}")
    return records


def failed_jobs(paths: Iterable[str | Path]) -> list[dict]:
    """Sweep jobs under ``paths`` that failed and have no record: ``{"run", "overrides", "error"}`` each."""
    failed = []
    for path in map(Path, paths):
        for marker in sorted(path.rglob(FAILED_NAME)) if path.is_dir() else []:
            if not (marker.parent / RECORD_NAME).is_file():
                try:
                    entry = json.loads(marker.read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    entry = {}
                failed.append(
                    {
                        "run": str(marker.parent),
                        "overrides": entry.get("overrides", []),
                        "error": entry.get("error", "unknown"),
                    }
                )
    return failed


def method_label(record: RunRecord) -> str:
    """``AR``, ``EAGLE exact (chain)``, ``LANTERN k=1000 d=0.1 (dynamic_tree, sampled, reference)`` ..."""
    decoding = record.decoding
    details = [record.draft] if record.draft else []
    if record.candidates == "sampled":
        details.append("sampled")
    if record.semantics == "reference":
        details.append("reference")
    draft = f" ({', '.join(details)})" if details else ""
    if decoding == "ar":
        return "AR"
    if decoding == "lantern":
        return f"LANTERN k={record.k} d={record.delta}{draft}"
    if decoding == "lantern_pp":
        return f"LANTERN++ k={record.k} l={record.lambda_}{draft}"
    if decoding in ("sjd", "gsd"):  # the Jacobi decoders (docs/jacobi.md): window and initialisation
        jacobi = f"W={record.get('window')} {record.get('init')}" + (
            f" reuse={record.get('reuse')}" if record.get("reuse") else ""
        )
        if decoding == "gsd":
            jacobi += f" r={record.get('gsd_radius')} p={record.get('gsd_p_thr')} d={record.get('gsd_d_thr')}"
        return f"{decoding.upper()} {jacobi}" + (" (greedy)" if record.candidates == "greedy" else "")
    return f"{str(decoding).upper()} exact{draft}" if decoding == "eagle" else f"{decoding}{draft}"


def _setting(record: RunRecord) -> tuple:
    return tuple(record.get(key) for key in SETTING_KEYS) + tuple(record.environment.get(key) for key in MACHINE_KEYS)


def _timing_setting(record: RunRecord) -> tuple:
    """What an AR run must share with a record to time it: the setting, the machine and its thread count."""
    return _setting(record) + (record.environment.get("num_threads"),)


def _setting_notes(records: list[RunRecord]) -> dict[int, str]:
    """For each record (by id), the setting entries in which the records differ: ``[seed=1, batch_size=4]``.

    Empty when all records share one setting, so rows only carry what tells them apart.
    """
    keys = SETTING_KEYS + tuple(f"environment.{key}" for key in MACHINE_KEYS)
    values = {id(r): dict(zip(keys, _setting(r), strict=True)) for r in records}
    differing = [key for key in keys if len({repr(v[key]) for v in values.values()}) > 1]
    return {
        ident: (" [" + ", ".join(f"{key.split('.')[-1]}={v[key]}" for key in differing) + "]") if differing else ""
        for ident, v in values.items()
    }


def _quartiles(values: list[float]) -> list[float] | None:
    if not values:
        return None
    if len(values) == 1:
        return [values[0], values[0]]
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return [q1, q3]


def _batch_ratios(baseline: RunRecord, record: RunRecord) -> list[float]:
    """Per-batch AR / decoder time over the batches (same indices) both runs decoded and timed."""
    times = {tuple(b["indices"]): b["seconds"] for b in baseline.per_batch or [] if b.get("seconds")}
    return [
        times[tuple(b["indices"])] / b["seconds"]
        for b in record.per_batch or []
        if b.get("seconds") and tuple(b["indices"]) in times
    ]


def _speed(record: RunRecord, baselines: dict) -> dict:
    """Latency, speed-up (with its spread) and the AR time behind it: the record's own, or a matching AR run's."""
    latency = record.latency_s_per_image
    speedup, spread, baseline_s = record.speedup, record.speedup_iqr, record.baseline_latency_s_per_image
    source = record.speedup_baseline
    if speedup is None and latency and record.decoding != "ar":
        match = baselines.get(_timing_setting(record))
        if match is not None:
            speedup, baseline_s, source = match.latency_s_per_image / latency, match.latency_s_per_image, match.run_dir
            spread = _quartiles(_batch_ratios(match, record))
    if record.decoding == "ar":
        speedup, spread, baseline_s, source = 1.0, None, latency, f"itself ({record.run_dir})"
    iqr = record.latency_s_iqr
    return {
        "latency_ms": None if latency is None else 1000 * latency,
        "latency_iqr_ms": None if iqr is None else [1000 * v for v in iqr],
        "speedup": speedup,
        "speedup_iqr": spread,
        "baseline_ms": None if baseline_s is None else 1000 * baseline_s,
        "baseline": source,
        "latency_batch": record.get("batch_size"),
        "latency_run": record.run_dir,
    }


def _baselines(records: list[RunRecord]) -> dict:
    baselines = {}
    for record in records:
        if record.decoding == "ar" and record.latency_s_per_image:
            baselines.setdefault(_timing_setting(record), record)
    return baselines


def _method_key(record: RunRecord) -> tuple:
    """A method under one setting, whatever the image count and batch size (matches quality and latency runs)."""
    return (
        (method_label(record),)
        + tuple(repr(record.get(key)) for key in LATENCY_KEYS)
        + tuple(record.environment.get(key) for key in MACHINE_KEYS)
    )


def table_rows(records: list[RunRecord], latency: list[RunRecord] | None = None) -> list[dict]:
    """One row per record in the paper's order, with speed-up (and its spread) from the record or a matching AR run.

    ``latency``: runs that time the same methods in another batch size (batch 1, as the papers do). A row
    whose method and setting one of them shares takes its latency and speed-up from it; the record's own
    speed-up becomes ``throughput_speedup`` at ``throughput_batch``. Two latency runs of one method are refused.
    """
    baselines = _baselines(records)
    timing: dict[tuple, dict] = {}
    if latency:
        latency_baselines = _baselines(latency)
        for record in latency:
            key = _method_key(record)
            if key in timing:
                raise ConfigError(
                    f"two latency runs of {method_label(record)}: {timing[key]['latency_run']} and {record.run_dir}"
                )
            timing[key] = _speed(record, latency_baselines)
    notes = _setting_notes(records)
    rows = []
    for record in records:
        own = _speed(record, baselines)
        speed, throughput = own, {"throughput_speedup": None, "throughput_batch": None}
        if latency:
            throughput = {"throughput_speedup": own["speedup"], "throughput_batch": record.get("batch_size")}
            speed = timing.get(_method_key(record), {key: None for key in own})
        rows.append(
            {
                "method": method_label(record) + notes[id(record)],
                "tau": record.mean_accepted_length,
                **{
                    key: speed[key] for key in ("latency_ms", "latency_iqr_ms", "speedup", "speedup_iqr", "baseline_ms")
                },
                "fid": record.fid,
                "clip_score": record.clip_score,
                "delta": record.delta,
                "tv_realised": 0.0 if record.decoding == "ar" else record.tv_realised_mean,  # AR samples p itself
                "tv_realised_max": 0.0 if record.decoding == "ar" else record.tv_realised_max,
                "baseline": speed["baseline"],
                "run": record.run_dir,
                "latency_batch": speed["latency_batch"],
                "latency_run": speed["latency_run"],
                **throughput,
                "_order": (
                    FAMILY_ORDER.get(record.decoding, 9),
                    record.semantics or "",
                    record.draft or "",
                    record.candidates or "",
                    record.k or 0,
                    record.delta or 0,
                    record.lambda_ or 0,
                    record.run_dir,
                ),
            }
        )
    rows.sort(key=lambda row: row["_order"])
    for row in rows:
        del row["_order"]
    return rows


def _fmt(value, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _tv_cell(row: dict) -> str:
    if row["tv_realised"] is None:
        return "-"
    return f"{row['tv_realised']:.3f} / {_fmt(row['tv_realised_max'], 3)}"


def _range(values: list[float] | None, digits: int, suffix: str = "") -> str:
    return "" if values is None else f" [{values[0]:.{digits}f}, {values[1]:.{digits}f}]{suffix}"


def _speedup_cell(row: dict, times: str = "x") -> str:
    if row["speedup"] is None:
        return "-"
    return f"{row['speedup']:.2f}{times}" + _range(row["speedup_iqr"], 2)


def _short_run(run: str, root: Path | None) -> str:
    if root is not None:
        try:
            return Path(run).resolve().relative_to(root.resolve()).as_posix() or "."
        except ValueError:
            pass
    return run


def _joined(rows: list[dict]) -> bool:
    """Whether the rows carry latency from separate runs (``table_rows(..., latency=...)``)."""
    return any(r.get("throughput_batch") is not None for r in rows)


def _batches(rows: list[dict], key: str) -> str:
    return "/".join(str(b) for b in sorted({r[key] for r in rows if r.get(key) is not None})) or "-"


def _throughput_cell(row: dict, times: str = "x") -> str:
    return "-" if row.get("throughput_speedup") is None else f"{row['throughput_speedup']:.2f}{times}"


def _notes(failed: list[dict], root: Path | None, rows: list[dict] | None = None) -> list[str]:
    lines = [
        "Latency: decode time per image, mean [interquartile range over batches]. Speed-up: AR time / "
        "decoder time [interquartile range of per-batch ratios]; AR ms/image is the AR time it was measured "
        "against (interleaved in the same run, or the named AR run)."
    ]
    if rows and _joined(rows):
        lines.append(
            f"Latency, speed-up and AR ms/image come from the latency runs at batch {_batches(rows, 'latency_batch')} "
            f"(latency run column); tau, FID, CLIP and TV from the quality runs (run column); throughput "
            f"speed-up is the quality run's own, at batch {_batches(rows, 'throughput_batch')}. Per-sample seeds "
            "make a sample the same at any batch size."
        )
    for job in failed:
        lines.append(f"FAILED job {_short_run(job['run'], root)} ({' '.join(job['overrides'])}): {job['error']}")
    return lines


def to_markdown(rows: list[dict], failed: list[dict] | None = None, root: Path | None = None) -> str:
    """The table as markdown (speed-up with an x, missing values as -), then notes and any failed jobs.

    ``root``: run folders are shown relative to it (the sweep or output folder) where they lie under it.
    Rows with latency from separate runs add a throughput column and the latency run.
    """
    joined = _joined(rows)
    lines = [
        "| method | tau | latency ms/image [IQR] | speed-up [IQR] | AR ms/image | "
        + ("throughput speed-up | " if joined else "")
        + "FID | CLIP | delta | realised TV mean / max | run |"
        + (" latency run |" if joined else ""),
        "|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if joined else ""),
    ]
    for r in rows:
        lines.append(
            f"| {r['method']} | {_fmt(r['tau'])} | {_fmt(r['latency_ms'], 1)}{_range(r['latency_iqr_ms'], 1)} | "
            f"{_speedup_cell(r)} | {_fmt(r['baseline_ms'], 1)} | "
            + (f"{_throughput_cell(r)} | " if joined else "")
            + f"{_fmt(r['fid'])} | {_fmt(r['clip_score'], 4)} | "
            f"{_fmt(r['delta'])} | {_tv_cell(r)} | {_short_run(r['run'], root)} |"
            + (f" {_short_run(r['latency_run'] or '-', root)} |" if joined else "")
        )
    return "\n".join(lines + [""] + _notes(failed or [], root, rows)) + "\n"


def _tex(text: str) -> str:
    return text.replace("\\", "/").replace("_", "\\_").replace("%", "\\%").replace("&", "\\&").replace("#", "\\#")


def to_latex(rows: list[dict], failed: list[dict] | None = None, root: Path | None = None) -> str:
    """The table as a LaTeX tabular (booktabs rules), its notes and failed jobs as comments."""
    joined = _joined(rows)
    lines = [
        "% Needs \\usepackage{booktabs} (\\toprule, \\midrule, \\bottomrule).",
        *(f"% {_tex(note)}" for note in _notes(failed or [], root, rows)),
        r"\begin{tabular}{lrrrrrrrr" + ("r" if joined else "") + "}",
        r"\toprule",
        r"Method & $\tau$ & Latency (ms) & Speed-up & AR (ms) & "
        + (r"Throughput & " if joined else "")
        + r"FID & CLIP & $\delta$ & TV (mean / max) \\",
        r"\midrule",
    ]
    times = r"$\times$"
    for r in rows:
        lines.append(
            f"{_tex(r['method'])} & {_fmt(r['tau'])} & {_fmt(r['latency_ms'], 1)}{_range(r['latency_iqr_ms'], 1)} & "
            f"{_speedup_cell(r, times)} & {_fmt(r['baseline_ms'], 1)} & "
            + (f"{_throughput_cell(r, times)} & " if joined else "")
            + f"{_fmt(r['fid'])} & "
            f"{_fmt(r['clip_score'], 4)} & {_fmt(r['delta'])} & {_tv_cell(r)} \\\\"
        )
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def to_csv(rows: list[dict]) -> str:
    """The table as CSV with raw numbers."""
    import csv
    import io

    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def _far_outliers(values: list[float]) -> set[float]:
    """Values above twice the median (a broken mode's FID beside working ones)."""
    if len(values) < 3:
        return set()
    median = statistics.median(values)
    return {v for v in values if v > 2 * median}


def pareto_plot(rows: list[dict], path: Path) -> Path:
    """Speed-up against FID (or against tau when no run has a FID), Pareto front marked, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    use_fid = any(r["fid"] is not None for r in rows)
    key, label = ("fid", "FID (lower is better)") if use_fid else ("tau", "tau (mean accepted length)")
    points = [
        (r["speedup"], r[key], r["method"] + ("" if not r.get("tv_realised") else f" [TV {r['tv_realised']:.3f}]"))
        for r in rows
        if r["speedup"] is not None and r[key] is not None
    ]
    figure, axis = plt.subplots(figsize=(9, 6))
    outliers = _far_outliers([y for _, y, _ in points]) if use_fid else set()
    shown = [p for p in points if p[1] not in outliers]
    for i, (x, y, name) in enumerate(shown):
        axis.scatter(x, y, color="tab:blue")
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
    figure.savefig(path, dpi=120, format="png")  # path may be a temporary name without .png
    plt.close(figure)
    return path


def write_tables(
    records: list[RunRecord],
    out_dir: str | Path,
    stem: str = "table",
    failed: list[dict] | None = None,
    latency: list[RunRecord] | None = None,
) -> dict[str, Path]:
    """Write ``stem.md``, ``stem.csv``, ``stem.tex``, ``stem.json`` and ``stem_pareto.png`` into ``out_dir``.

    ``failed``: sweep jobs without a record (:func:`failed_jobs`), named under the table. ``latency``: runs
    that lend the rows their latency and speed-up (see :func:`table_rows`).
    """
    out = Path(out_dir)
    rows, failed = table_rows(records, latency), failed or []  # a refused join writes nothing
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for suffix, text in (
        ("md", to_markdown(rows, failed, out)),
        ("csv", to_csv(rows)),
        ("tex", to_latex(rows, failed, out)),
    ):
        paths[suffix] = write_text_atomic(out / f"{stem}.{suffix}", text)
    paths["json"] = write_json_atomic(
        out / f"{stem}.json",
        {
            "rows": rows,
            "runs": [r.run_dir for r in records],
            "latency_runs": [r.run_dir for r in latency or []],
            "failed": failed,
        },
    )
    paths["png"] = write_atomic(out / f"{stem}_pareto.png", lambda tmp: pareto_plot(rows, tmp))
    return paths
