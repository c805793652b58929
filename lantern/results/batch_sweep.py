"""A table's batch view (``+experiment=batch_sweep``): per method and batch size, latency per image, images per
second, peak memory and the speed-up over AR at the same batch (each run times its AR on its own batches); a plot
of speed-up against batch size per method; and a note per method saying up to which batch speculation pays.

Shown whenever a table's rows ran at more than one batch size; nothing here names a decoder (a row's method is its
settings' :meth:`~lantern.decoding.api.DecoderSettings.method`).
"""

from __future__ import annotations

import io
import math

import pandas as pd


def batch_cells(record, settings) -> dict:
    """A row's batch-view cells: images per second (1 / latency per image), peak memory, the method alone (None
    for a baseline)."""
    latency = record.latency_s_per_image
    return {
        "images_per_s": 1.0 / latency if latency else None,
        "peak_memory_mb": record.peak_memory_mb,
        "decoder": None if settings.baseline else settings.method(),  # AR is the 1x line
    }


def is_batch_sweep(data: pd.DataFrame) -> bool:
    """Whether the rows ran at more than one batch size."""
    return len(data) > 0 and data["latency_batch"].dropna().nunique() > 1


def shown_cells(row: dict) -> dict:
    """The batch view's text cells of one row."""
    batch, rate, memory = row["latency_batch"], row["images_per_s"], row["peak_memory_mb"]
    return {
        "batch": "-" if _missing(batch) else str(int(batch)),
        "images/s": "-" if _missing(rate) else f"{rate:.2f}",
        "peak memory MiB": "-" if _missing(memory) else f"{memory:.0f}",
    }


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _curves(data: pd.DataFrame) -> dict[str, list[tuple[int, float]]]:
    """Speed-up over AR by batch size, per method with a speed-up (AR's own rows left out)."""
    curves: dict[str, list[tuple[int, float]]] = {}
    for row in data.to_dict("records"):
        if _missing(row["speedup"]) or _missing(row["latency_batch"]) or not isinstance(row["decoder"], str):
            continue
        curves.setdefault(row["decoder"], []).append((int(row["latency_batch"]), float(row["speedup"])))
    return {method: sorted(points) for method, points in curves.items()}


def batch_notes(data: pd.DataFrame) -> list[str]:
    """One line per method: its speed-up at each batch, and the largest batch at which it still beats AR."""
    lines = []
    for method, points in _curves(data).items():
        shown = ", ".join(f"{s:.2f}x at {b}" for b, s in points)
        paying = [b for b, s in points if s > 1]
        if not paying:
            verdict = "does not pay at any batch here"
        elif max(paying) == points[-1][0]:
            verdict = f"still pays at batch {points[-1][0]}"
        else:
            verdict = f"pays up to batch {max(paying)}, not beyond"
        lines.append(f"Batch sweep, {method}: {shown}; {verdict}.")
    if lines:
        lines.insert(0, "Batch sweep: speed-up over AR at the same batch size (AR interleaved on the same batches).")
    return lines


def batch_plot(data: pd.DataFrame, path):
    """Speed-up over AR against batch size (log2 axis), a line per method, AR's 1x marked; a PNG at ``path`` (a
    file path or a binary buffer)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 5))
    for method, points in _curves(data).items():
        axis.plot([b for b, _ in points], [s for _, s in points], marker="o", label=method)
    axis.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="AR")
    axis.set_xscale("log", base=2)
    axis.set_xlabel("batch size")
    axis.set_ylabel("speed-up over AR at the same batch")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120, format="png")
    plt.close(figure)
    return path


def batch_png(data: pd.DataFrame) -> bytes:
    """:func:`batch_plot` as PNG bytes (the report embeds it)."""
    buffer = io.BytesIO()
    batch_plot(data, buffer)
    return buffer.getvalue()
