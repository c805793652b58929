"""Copy trained world files into a shipped world folder and write its manifest.

    python scripts/ship_world.py --world worlds/fashion_mnist \
        --file vq.safetensors=outputs/train/vq/vq.safetensors="python scripts/train_vq.py" \
        --file gpt.safetensors=outputs/train/gpt/gpt.safetensors="python scripts/train_gpt.py"

Each ``--file NAME=SOURCE=COMMAND`` copies SOURCE to WORLD/NAME and records its sha256, size, the
command that produced it, the data, the commit and, when SOURCE's folder has one, the training
config and report. Files already in the manifest and not named again are kept as they are.
"""

from __future__ import annotations

from lantern.cli.main import ArgumentParser, run_or_exit
from lantern.run.ship import DATA, ship


def main() -> None:
    parser = ArgumentParser(__doc__)
    parser.add_argument("--world", required=True, help="the shipped world folder")
    parser.add_argument("--file", action="append", default=[], help="NAME=SOURCE=COMMAND")
    parser.add_argument("--data", default=DATA)
    args = parser.parse()
    run_or_exit(lambda: ship(args.world, args.file, args.data))


if __name__ == "__main__":
    main()
