"""Make an FID reference folder from real images: centre-cropped to a square and Lanczos-resized.

    python scripts/fid_reference.py --images coco/val2017 --out data/coco2017_val_256 --size 256

The LANTERN protocol compares generated 256 px images with the MS-COCO val2017 images prepared this
way; the folder then serves ``metrics=fid_clip metrics.fid.reference.path=data/coco2017_val_256`` (its
Inception statistics are computed once and cached). Each ``NAME.jpg`` (or .jpeg/.png) becomes
``NAME.png``. The folder is written under a temporary name and renamed when complete, so an
interrupted run leaves no half-made reference. Bad input prints one ``error:`` line and exits 2.
"""

from __future__ import annotations

from pathlib import Path

from lantern.cli.main import ArgumentParser, run_or_exit
from lantern.metrics.reference import make_reference


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(__doc__)
    parser.add_argument("--images", required=True, help="folder of real images (e.g. MS-COCO val2017)")
    parser.add_argument("--out", required=True, help="new folder for the prepared PNGs")
    parser.add_argument("--size", type=int, default=256, help="side of the output squares (the generator's resolution)")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse(argv)
    count = run_or_exit(lambda: make_reference(Path(args.images), Path(args.out), args.size, not args.no_progress))
    print(f"{count} reference images ({args.size} px) in {args.out}")


if __name__ == "__main__":
    main()
