"""The report's pictures as PNG bytes: the Pareto plot, accepted-length histograms, and one image's acceptance
map (its token grid coloured by the length of the run that emitted each token); the frontier is
:mod:`lantern.results.frontier`'s. Matplotlib draws off screen (Agg); nothing is shown or read from the network."""

from __future__ import annotations

import io
import math
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from lantern.results.render import pareto_plot
from lantern.results.tables import Table

CELL = 6  # pixels per token in an acceptance map
PREFILL = (230, 30, 30)  # the prefill's token 0: drawn by the target before any step


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(figure) -> bytes:
    plt = _pyplot()
    buffer = io.BytesIO()
    figure.tight_layout()
    figure.savefig(buffer, dpi=100, format="png")
    plt.close(figure)
    return buffer.getvalue()


def pareto_png(table: Table) -> bytes:
    """The table's Pareto plot (:func:`lantern.results.render.pareto_plot`: quality or tau against speed-up,
    with intervals)."""
    with tempfile.TemporaryDirectory() as folder:
        return pareto_plot(table, Path(folder) / "pareto.png").read_bytes()


def histogram_png(histograms: dict[str, list[int]]) -> bytes:
    """Share of steps that accepted each run length (drafts accepted + 1), one bar group per method."""
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(9, 3.6))
    shown = {method: counts for method, counts in histograms.items() if counts and sum(counts)}
    width = 0.8 / max(1, len(shown))
    for number, (method, counts) in enumerate(shown.items()):
        lengths = np.arange(1, len(counts) + 1) + (number - (len(shown) - 1) / 2) * width
        axis.bar(lengths, np.asarray(counts) / sum(counts), width=width, label=method, color=f"C{number % 10}")
    axis.set_xlabel("accepted run length (tokens one target step emitted)")
    axis.set_ylabel("share of steps")
    if shown:
        axis.legend(fontsize=7)
    else:
        axis.text(0.5, 0.5, "no speculative rows", ha="center", transform=axis.transAxes)
    axis.grid(alpha=0.3, axis="y")
    return _png(figure)


def grid_width(tokens: int) -> int:
    """Tokens per row of an image's token grid (square grids; otherwise the smallest square that holds them)."""
    return math.isqrt(tokens - 1) + 1 if tokens > 1 else 1


def map_image(lengths: torch.Tensor, longest: int, skipped: torch.Tensor | None = None) -> Image.Image:
    """An acceptance map: ``lengths`` (N,) the run length of the step that emitted each token, coloured on one
    scale up to ``longest`` (viridis: dark short runs, yellow long ones); token 0 (the prefill's) in red;
    ``skipped`` (N,) tokens committed without a target forward (VVS) with a white dot."""
    from matplotlib import colormaps

    width = grid_width(lengths.numel())
    scale = (lengths.double().numpy() - 1) / max(1, longest - 1)
    colours = (colormaps["viridis"](np.clip(scale, 0, 1))[:, :3] * 255).astype(np.uint8)  # (N, 3)
    colours[0] = PREFILL
    cells = np.full((width * width, 3), 255, dtype=np.uint8)
    cells[: len(colours)] = colours
    grid = cells.reshape(width, width, 3).repeat(CELL, 0).repeat(CELL, 1)
    if skipped is not None:
        for token in torch.nonzero(skipped).flatten().tolist():
            row, column = (CELL * i + CELL // 2 - 1 for i in divmod(token, width))  # the cell's middle 2 x 2
            grid[row : row + 2, column : column + 2] = 255
    return Image.fromarray(grid)


def legend_png(longest: int) -> bytes:
    """The maps' colour scale, run lengths 1 .. ``longest``, and the prefill's colour."""
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(6.5, 0.9))
    lengths = np.arange(1, longest + 1)
    axis.imshow(
        lengths[None, :], cmap="viridis", aspect="auto", extent=(0.5, longest + 0.5, 0, 1), vmin=1, vmax=max(2, longest)
    )
    axis.set_yticks([])
    axis.set_xticks(lengths if longest <= 12 else np.linspace(1, longest, 6).round())
    axis.set_xlabel(
        "tokens its step emitted (red: the prefill's token 0; white dot: a skip step's, no target forward)", fontsize=7
    )
    return _png(figure)


def png_bytes_of(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()
