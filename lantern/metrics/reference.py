"""FID reference folders from real images: centre-cropped to a square and Lanczos-resized (LANTERN's protocol).

The folder is written under a temporary name and renamed when complete, so an interrupted run leaves no
half-made reference; ``scripts/fid_reference.py`` is its command line.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from PIL import Image
from tqdm import tqdm

from lantern import checks
from lantern.errors import ConfigError, writes_under

SUFFIXES = (".jpg", ".jpeg", ".png")


def centre_square(image: Image.Image, size: int) -> Image.Image:
    """The largest centred square of ``image``, resized to ``size`` x ``size`` with Lanczos, in RGB."""
    width, height = image.size
    side = min(width, height)
    left, top = (width - side) // 2, (height - side) // 2
    square = image.convert("RGB").crop((left, top, left + side, top + side))
    return square.resize((size, size), Image.LANCZOS)


@writes_under("--out")
def make_reference(images: Path, out: Path, size: int, progress: bool = True) -> int:
    """Write every image of ``images`` into ``out`` as a ``size`` px PNG; return how many."""
    size = checks.capped("--size", size, 8, 4096, note="the side of a square in px: the generators make at most 1024")
    if not images.is_dir():
        raise ConfigError(f"image folder not found: {str(images)!r}")
    files = sorted(p for p in images.iterdir() if p.suffix.lower() in SUFFIXES)
    if not files:
        raise ConfigError(f"no {'/'.join(SUFFIXES)} images in {str(images)!r}")
    if out.exists():
        raise ConfigError(f"output folder {str(out)!r} already exists; remove it or choose another")
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for path in tqdm(files, desc="reference images", unit="img", disable=not progress):
        try:
            with Image.open(path) as image:
                centre_square(image, size).save(partial / f"{path.stem}.png")
        except OSError as exc:
            shutil.rmtree(partial)
            raise ConfigError(f"cannot read image {str(path)!r} ({exc})") from exc
    partial.rename(out)
    return len(files)
