"""Make an FID reference folder from real images: centre-cropped to a square and Lanczos-resized.

    python scripts/fid_reference.py --images coco/val2017 --out data/coco2017_val_256 --size 256

The LANTERN protocol compares generated 256 px images with the MS-COCO val2017 images prepared this
way; the folder then serves ``metrics=fid_clip metrics.fid.reference.path=data/coco2017_val_256`` (its
Inception statistics are computed once and cached). Each ``NAME.jpg`` (or .jpeg/.png) becomes
``NAME.png``. The folder is written under a temporary name and renamed when complete, so an
interrupted run leaves no half-made reference. Bad input prints one ``error:`` line and exits 2.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from PIL import Image
from tqdm import tqdm

from lantern.cli.main import run_or_exit
from lantern.errors import ConfigError

SUFFIXES = (".jpg", ".jpeg", ".png")


def centre_square(image: Image.Image, size: int) -> Image.Image:
    """The largest centred square of ``image``, resized to ``size`` x ``size`` with Lanczos, in RGB."""
    width, height = image.size
    side = min(width, height)
    left, top = (width - side) // 2, (height - side) // 2
    square = image.convert("RGB").crop((left, top, left + side, top + side))
    return square.resize((size, size), Image.LANCZOS)


def make_reference(images: Path, out: Path, size: int, progress: bool = True) -> int:
    """Write every image of ``images`` into ``out`` as a ``size`` px PNG; return how many."""
    if not isinstance(size, int) or size < 8:
        raise ConfigError(f"size={size!r} must be an integer >= 8")
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", required=True, help="folder of real images (e.g. MS-COCO val2017)")
    parser.add_argument("--out", required=True, help="new folder for the prepared PNGs")
    parser.add_argument("--size", type=int, default=256, help="side of the output squares (the generator's resolution)")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    count = run_or_exit(lambda: make_reference(Path(args.images), Path(args.out), args.size, not args.no_progress))
    print(f"{count} reference images ({args.size} px) in {args.out}")


if __name__ == "__main__":
    main()
