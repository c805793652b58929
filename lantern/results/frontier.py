"""Speed against fidelity: speed-up and tau against the measured realised TV, one line per method over its knob.

Each table row becomes a point of its decoder's label (:attr:`~lantern.decoding.api.DecoderSettings.label`, read
from the record, so no method is named here): exact methods sit at TV 0 (their records carry 0), lossy ones at
their measured ``tv_realised`` mean, measured in closed form or by the Monte Carlo audit (``tv_audit: mc``, drawn
hollow with its standard error as a horizontal bar; lantern/decoding/audit.py). Every decoder has an audit, so every
row has a TV; a row whose record has none (``tv_audit=off``, a record older than the audit) is not drawn, never at
0: the figure's footnote and the JSON's ``unmeasured`` name it.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from lantern.results.record import RunRecord
from lantern.results.tables import Table


def _known(value) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def frontier_points(table: Table, records: list[RunRecord]) -> list[dict]:
    """One point per row with a speed-up or tau: ``label``, ``method``, ``tv`` (None: not measured), ``tv_max``,
    ``tv_se`` (the Monte Carlo audit's standard error; None: exact or closed form), ``tv_audit`` (which audit
    measured it), ``speedup``, ``tau``, ``run``."""
    labels = {r.run_dir: r.decoder_settings.label for r in records}
    audits = {r.run_dir: (r.tv_audit, r.tv_realised_se) for r in records}
    points = []
    for row in table.rows:
        if not (_known(row["speedup"]) or _known(row["tau"])):
            continue
        tv = row["tv_realised"] if _known(row["tv_realised"]) else None
        points.append(
            {
                "label": labels.get(row["run"], row["method"]),
                "method": row["method"],
                "tv": tv,
                "tv_max": row["tv_realised_max"] if _known(row["tv_realised_max"]) else None,
                "tv_se": audits.get(row["run"], (None, None))[1] if tv is not None else None,
                "tv_audit": audits.get(row["run"], (None, None))[0],
                "speedup": row["speedup"] if _known(row["speedup"]) else None,
                "tau": row["tau"],
                "run": row["run"],
            }
        )
    return points


def _draw(axis, points: list[dict], key: str, colour, label: str) -> None:
    """One method's line over its measured points (sorted by TV), Monte Carlo ones hollow with their error bars."""
    measured = sorted((p for p in points if p["tv"] is not None and p[key] is not None), key=lambda p: p["tv"])
    if not measured:
        return
    axis.plot([p["tv"] for p in measured], [p[key] for p in measured], "-", color=colour, label=label, linewidth=1)
    for p in measured:
        hollow = p["tv_se"] is not None
        axis.errorbar(
            p["tv"],
            p[key],
            xerr=p["tv_se"] if hollow else None,
            fmt="o",
            markersize=4,
            color=colour,
            markerfacecolor="white" if hollow else colour,
            capsize=2,
        )
        knob = p["method"][len(label) :].strip()
        axis.annotate(knob, (p["tv"], p[key]), fontsize=5, xytext=(3, 3), textcoords="offset points")


def frontier_plot(points: list[dict], path: str | os.PathLike, title: str = "") -> Path:
    """The PNG: speed-up (top) and tau (bottom) against the TV, a line per label; unmeasured rows in a footnote."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 1, figsize=(9, 8), sharex=True)
    labels = list(dict.fromkeys(p["label"] for p in points))
    colours = {label: plt.cm.tab10(i % 10) for i, label in enumerate(labels)}
    for axis, (key, name) in zip(
        axes, (("speedup", "speed-up over AR"), ("tau", "tau (tokens per target step)")), strict=True
    ):
        for label in labels:
            _draw(axis, [p for p in points if p["label"] == label], key, colours[label], label)
        axis.set_ylabel(name)
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    axes[1].set_xlabel("realised TV per token, mean (0: exact; hollow: Monte Carlo audit, bar: 1 standard error)")
    unmeasured = unmeasured_methods(points)
    if unmeasured:
        figure.text(0.01, 0.0, "not drawn, TV not measured: " + "; ".join(unmeasured), fontsize=6, va="top")
    if title:
        figure.suptitle(title, fontsize=9)
    figure.savefig(path, dpi=120, format="png", bbox_inches="tight")
    plt.close(figure)
    return Path(path)


def unmeasured_methods(points: list[dict]) -> list[str]:
    """The methods of the rows whose record carries no realised TV (not drawn)."""
    return list(dict.fromkeys(p["method"] for p in points if p["tv"] is None))


def frontier_png(table: Table, records: list[RunRecord], title: str = "") -> bytes:
    """The frontier's PNG as bytes (the report embeds it)."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        return frontier_plot(frontier_points(table, records), Path(folder) / "frontier.png", title).read_bytes()


def write_frontier(
    table: Table, records: list[RunRecord], out_dir: str | os.PathLike, stem: str, sweeps=()
) -> dict[str, Path]:
    """``stem_frontier.png`` and ``stem_frontier.json`` (its points) in ``out_dir``; each point's run folder named
    under the folder of ``sweeps`` that holds it (:func:`~lantern.results.render.run_name`: no machine's path)."""
    from lantern.results.render import run_name

    out = Path(out_dir)
    points = [{**p, "run": run_name(p["run"], sweeps, out)} for p in frontier_points(table, records)]
    payload = {
        "points": points,
        "unmeasured": unmeasured_methods(points),
        "notes": [
            "tv: realised TV per token, mean; tv_audit: exact, closed_form or mc (tv_se: its standard error)",
            "tv null: the record carries no realised TV (tv_audit=off or an older record): not drawn",
        ],
    }
    json_path = out / f"{stem}_frontier.json"
    json_path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return {"png": frontier_plot(points, out / f"{stem}_frontier.png", title=stem), "json": json_path}
