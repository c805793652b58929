"""Speed against fidelity: speed-up and tau against the measured realised TV, one line per method over its knob.

Each table row becomes a point of its decoder's label (:attr:`~lantern.decoding.api.DecoderSettings.label`, read
from the record, so no method is named here): exact methods sit at TV 0 (their records carry 0), lossy ones at
their measured ``tv_realised`` mean. A row whose record says TV was not measured (``tv_realised`` null, e.g.
SJD-PAC with K >= 2) is drawn in a separate "TV not measured" strip beside the axes, never at 0.
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
    ``speedup``, ``tau``, ``run``."""
    labels = {r.run_dir: r.decoder_settings.label for r in records}
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
                "speedup": row["speedup"] if _known(row["speedup"]) else None,
                "tau": row["tau"],
                "run": row["run"],
            }
        )
    return points


def _axes(plt):
    """Two rows (speed-up, tau) of a wide TV axis and a narrow "TV not measured" strip sharing its y axis."""
    figure, axes = plt.subplots(
        2, 2, figsize=(11, 8), sharey="row", gridspec_kw={"width_ratios": [5, 1], "wspace": 0.05}
    )
    return figure, axes


def frontier_plot(points: list[dict], path: str | os.PathLike, title: str = "") -> Path:
    """The PNG: per label a line over its measured points (sorted by TV), the unmeasured ones in the strip."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = _axes(plt)
    labels = list(dict.fromkeys(p["label"] for p in points))
    colours = {label: plt.cm.tab10(i % 10) for i, label in enumerate(labels)}
    apart = [label for label in labels if any(p["label"] == label and p["tv"] is None for p in points)]
    for row, (key, name) in enumerate((("speedup", "speed-up over AR"), ("tau", "tau (tokens per target step)"))):
        main, strip = axes[row]
        for label in labels:
            mine = [p for p in points if p["label"] == label and p[key] is not None]
            measured = sorted((p for p in mine if p["tv"] is not None), key=lambda p: p["tv"])
            if measured:
                xs, ys = [p["tv"] for p in measured], [p[key] for p in measured]
                main.plot(xs, ys, "-o", color=colours[label], label=label, markersize=4)
                for p in measured:
                    knob = p["method"][len(label) :].strip()
                    main.annotate(knob, (p["tv"], p[key]), fontsize=5, xytext=(3, 3), textcoords="offset points")
            for j, p in enumerate(p for p in mine if p["tv"] is None):
                x = apart.index(label) + 0.2 * j  # side by side: a method's unmeasured settings
                strip.plot(x, p[key], "s", color=colours[label], markersize=5)
                knob = p["method"][len(label) :].strip()
                strip.annotate(knob, (x, p[key]), fontsize=5, xytext=(3, 3), textcoords="offset points")
        main.set_ylabel(name)
        main.grid(alpha=0.3)
        strip.set_xticks(range(len(apart)), apart, fontsize=6, rotation=45)
        strip.set_xlim(-0.5, len(apart) + 0.2)
        strip.set_title("TV not measured", fontsize=8)
        strip.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    axes[1][0].set_xlabel("realised TV per token, mean (0: exact)")
    if title:
        figure.suptitle(title, fontsize=9)
    figure.savefig(path, dpi=120, format="png", bbox_inches="tight")
    plt.close(figure)
    return Path(path)


def write_frontier(table: Table, records: list[RunRecord], out_dir: str | os.PathLike, stem: str) -> dict[str, Path]:
    """``stem_frontier.png`` and ``stem_frontier.json`` (its points) in ``out_dir``."""
    out = Path(out_dir)
    points = frontier_points(table, records)
    payload = {"points": points, "notes": ["tv null: the record says the realised TV was not measured (strip)"]}
    json_path = out / f"{stem}_frontier.json"
    json_path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return {"png": frontier_plot(points, out / f"{stem}_frontier.png", title=stem), "json": json_path}
