"""Writing images: index-named PNGs and a labelled grid."""

from __future__ import annotations

import math
import os
import textwrap

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from lantern.atomic import write_atomic


def image_name(index: int) -> str:
    """File name of image ``index``: ``000042.png``."""
    return f"{index:06d}.png"


def save_png(pixels: np.ndarray, path: str | os.PathLike) -> None:
    """Save (H, W, 3) uint8 pixels as PNG atomically, so a killed run leaves no broken file."""
    write_atomic(path, lambda tmp: Image.fromarray(pixels).save(tmp, format="PNG"))


def labelled_grid(images: list[np.ndarray], labels: list[str], columns: int = 8, cell: int = 128) -> Image.Image:
    """A grid of (H, W, 3) uint8 images, each scaled to ``cell`` px with its label printed underneath."""
    font = ImageFont.load_default()
    columns = max(1, min(columns, len(images)))
    rows = math.ceil(len(images) / columns)
    chars = max(8, cell // 6)
    # Three lines are shown: wrap only what fits in them (a prompt may be megabytes long).
    wrapped = ["\n".join(textwrap.wrap(str(label)[: 3 * chars + 1], chars)[:3]) for label in labels]
    text_height = 12 * max(1, max(w.count("\n") + 1 for w in wrapped)) + 4
    grid = Image.new("RGB", (columns * cell, rows * (cell + text_height)), "white")
    draw = ImageDraw.Draw(grid)
    for i, (pixels, text) in enumerate(zip(images, wrapped)):
        x, y = (i % columns) * cell, (i // columns) * (cell + text_height)
        grid.paste(Image.fromarray(pixels).resize((cell, cell), Image.NEAREST), (x, y))
        draw.multiline_text((x + 2, y + cell + 2), text, fill="black", font=font, spacing=1)
    return grid
