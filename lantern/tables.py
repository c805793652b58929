"""Result tables from run records: the paper's layout, as markdown, CSV and LaTeX, plus a Pareto plot.

Rows: AR, exact speculative decoding (per draft structure and candidate kind), LANTERN at each (k, delta),
LANTERN++ at each (k, lambda), under either semantics. Columns: tau, latency, speed-up, FID, CLIP score,
and the relaxation's promise (delta) beside the realised total variation the tokens were drawn with. A record's own ``speedup`` is used
when it has one; otherwise it is computed against the AR record of the same setting (model, prompts,
images, batch size, seed and sampling) and machine found among the records, and the table says which
baseline it used.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path

from lantern.baselines import MACHINE_KEYS, SETTING_KEYS
from lantern.errors import ConfigError
from lantern.records import write_json_atomic, write_text_atomic

RECORD_NAME = "metrics.json"
FAMILY_ORDER = {"ar": 0, "eagle": 1, "lantern": 2, "lantern_pp": 3}
COLUMNS = ("method", "tau", "latency_ms", "speedup", "fid", "clip_score", "delta", "tv_realised", "tv_realised_max", "baseline")


def load_records(paths: Iterable[str | Path]) -> list[dict]:
    """Every ``metrics.json`` under ``paths`` (files or folders), with its folder as ``run_dir``."""
    records = []
    for path in paths:
        path = Path(path)
        if not path.exists():
            raise ConfigError(f"runs path not found: {str(path)!r}")
        files = [path] if path.is_file() else sorted(path.rglob(RECORD_NAME))
        for file in files:
            try:
                record = json.loads(file.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise ConfigError(f"{str(file)!r} is not a readable run record ({exc})") from exc
            record["run_dir"] = str(file.parent)
            records.append(record)
    if not records:
        raise ConfigError(f"no {RECORD_NAME} found under {', '.join(map(str, paths))}")
    return records


def method_label(record: dict) -> str:
    """``AR``, ``EAGLE exact (chain)``, ``LANTERN k=1000 d=0.1 (dynamic_tree, sampled, reference)`` ..."""
    decoding = record.get("decoding")
    details = [record["draft"]] if record.get("draft") else []
    if record.get("candidates") == "sampled":
        details.append("sampled")
    if record.get("semantics") == "reference":
        details.append("reference")
    draft = f" ({', '.join(details)})" if details else ""
    if decoding == "ar":
        return "AR"
    if decoding == "lantern":
        return f"LANTERN k={record.get('k')} d={record.get('delta')}{draft}"
    if decoding == "lantern_pp":
        return f"LANTERN++ k={record.get('k')} l={record.get('lambda')}{draft}"
    return f"{str(decoding).upper()} exact{draft}" if decoding == "eagle" else f"{decoding}{draft}"


def _setting(record: dict) -> tuple:
    machine = record.get("environment") or {}
    return tuple(record.get(key) for key in SETTING_KEYS) + tuple(machine.get(key) for key in MACHINE_KEYS)


def table_rows(records: list[dict]) -> list[dict]:
    """One row per record in the paper's order, with speed-up filled from a matching AR run."""
    baselines = {}
    for record in records:
        if record.get("decoding") == "ar":
            baselines.setdefault(_setting(record), record)
    rows = []
    for record in records:
        latency = record.get("latency_s_per_image")
        speedup, baseline = record.get("speedup"), record.get("speedup_baseline", "same run" if record.get("speedup") else None)
        if speedup is None and latency:
            match = baselines.get(_setting(record))
            if match is not None and match.get("latency_s_per_image"):
                speedup = match["latency_s_per_image"] / latency
                baseline = match["run_dir"]
        rows.append({
            "method": method_label(record),
            "tau": record.get("mean_accepted_length"),
            "latency_ms": None if latency is None else 1000 * latency,
            "speedup": speedup,
            "fid": record.get("fid"),
            "clip_score": record.get("clip_score"),
            "delta": record.get("delta"),
            "tv_realised": 0.0 if record.get("decoding") == "ar" else record.get("tv_realised_mean"),  # AR samples p itself
            "tv_realised_max": 0.0 if record.get("decoding") == "ar" else record.get("tv_realised_max"),
            "baseline": baseline,
            "_order": (FAMILY_ORDER.get(record.get("decoding"), 9), record.get("semantics") or "", record.get("draft") or "",
                       record.get("candidates") or "", record.get("k") or 0, record.get("delta") or 0,
                       record.get("lambda") or 0, record["run_dir"]),
        })
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


def to_markdown(rows: list[dict]) -> str:
    """The table as markdown (speed-up with an x, missing values as -)."""
    lines = ["| method | tau | latency ms/image | speed-up | FID | CLIP | delta | realised TV mean / max |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        speedup = "-" if r["speedup"] is None else f"{r['speedup']:.2f}x"
        lines.append(f"| {r['method']} | {_fmt(r['tau'])} | {_fmt(r['latency_ms'], 1)} | {speedup} | "
                     f"{_fmt(r['fid'])} | {_fmt(r['clip_score'], 4)} | {_fmt(r['delta'])} | {_tv_cell(r)} |")
    return "\n".join(lines) + "\n"


def to_latex(rows: list[dict]) -> str:
    """The table as a LaTeX tabular."""
    lines = [r"\begin{tabular}{lrrrrrrr}", r"\toprule",
             r"Method & $\tau$ & Latency (ms) & Speed-up & FID & CLIP & $\delta$ & TV (mean / max) \\", r"\midrule"]
    for r in rows:
        speedup = "-" if r["speedup"] is None else f"{r['speedup']:.2f}$\\times$"
        lines.append(f"{r['method'].replace('_', chr(92) + '_')} & {_fmt(r['tau'])} & {_fmt(r['latency_ms'], 1)} & "
                     f"{speedup} & {_fmt(r['fid'])} & {_fmt(r['clip_score'], 4)} & {_fmt(r['delta'])} & {_tv_cell(r)} \\\\")
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


def pareto_plot(rows: list[dict], path: Path) -> Path:
    """Speed-up against FID (or against tau when no run has a FID), Pareto front marked, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    use_fid = any(r["fid"] is not None for r in rows)
    key, label = ("fid", "FID (lower is better)") if use_fid else ("tau", "tau (mean accepted length)")
    points = [(r["speedup"], r[key], r["method"] + ("" if not r.get("tv_realised") else f" [TV {r['tv_realised']:.3f}]"))
              for r in rows if r["speedup"] is not None and r[key] is not None]
    figure, axis = plt.subplots(figsize=(6, 4.5))
    for x, y, name in points:
        axis.scatter(x, y, color="tab:blue")
        axis.annotate(name, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    better = (lambda a, b: a <= b) if use_fid else (lambda a, b: a >= b)
    front = sorted((p for p in points if not any(q[0] >= p[0] and better(q[1], p[1]) and q[:2] != p[:2] for q in points)))
    if len(front) > 1:
        axis.plot([p[0] for p in front], [p[1] for p in front], color="tab:orange", label="Pareto front")
        axis.legend()
    axis.set_xlabel("speed-up over AR")
    axis.set_ylabel(label)
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def write_tables(records: list[dict], out_dir: str | Path, stem: str = "table") -> dict[str, Path]:
    """Write ``stem.md``, ``stem.csv``, ``stem.tex``, ``stem.json`` and ``stem_pareto.png`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = table_rows(records)
    paths = {}
    for suffix, text in (("md", to_markdown(rows)), ("csv", to_csv(rows)), ("tex", to_latex(rows))):
        paths[suffix] = out / f"{stem}.{suffix}"
        write_text_atomic(paths[suffix], text)
    write_json_atomic(out / f"{stem}.json", {"rows": rows, "runs": [r["run_dir"] for r in records]})
    paths["json"] = out / f"{stem}.json"
    paths["png"] = pareto_plot(rows, out / f"{stem}_pareto.png")
    return paths


try:
    from hydra.experimental.callback import Callback
except ImportError:  # pragma: no cover - hydra is a dependency
    Callback = object


class SweepTable(Callback):
    """Hydra callback: at the end of a multirun, write the sweep's table into its folder and hand it to
    the runs' tracker (``job.tracker``, W&B by default)."""

    def on_multirun_end(self, config, **kwargs) -> None:
        from hydra.utils import instantiate

        sweep = Path(config.hydra.sweep.dir)
        if not any(sweep.rglob(RECORD_NAME)):
            return
        records = load_records([sweep])
        paths = write_tables(records, sweep)
        print(f"sweep table: {paths['md']}")
        tracker = config.get("job", {}).get("tracker")
        if tracker is not None:
            instantiate(tracker).log_table(sweep, table_rows(records), paths["png"])
