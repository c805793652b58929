"""Train the prompt-faithfulness classifier of the embedded world on Fashion-MNIST in one command.

    python scripts/train_classifier.py                                  # 60k train split, 3 epochs
    python scripts/train_classifier.py --epochs 1 --out-dir outputs/train/classifier_try

The train split comes from ``--data-root`` (default ``/usr/share/datasets/fashion-mnist``, apt
package ``dataset-fashion-mnist``); the test accuracy is measured on the shipped 10k test split
(``--test-root`` to override), fed exactly as generated images arrive: uint8 (N, 32, 32, 3).
Rerunning the same command resumes from ``out_dir/checkpoint.pt``. At the end ``out_dir`` holds
``classifier.safetensors`` (fp16 weights), ``classifier_report.json`` (test accuracy of the
exported fp16 weights, per class, the config and the environment), ``config.yaml`` and
``log.jsonl``. User errors (missing data, bad values) print one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

import torch

from lantern.cli.main import run_or_exit
from lantern.errors import ConfigError
from lantern.files import write_json_atomic
from lantern.metrics.classifier import WEIGHTS_NAME, FashionClassifier, load_classifier, pad_to_world, predict
from lantern.models.devices import resolve_device
from lantern.models.world.fashion_mnist import CLASS_NAMES, NUM_CLASSES, SYSTEM_DATA_ROOT, load_split
from lantern.results.provenance import environment
from lantern.training.classifier import ClassifierObjective, training_batch
from lantern.training.loop import DEFAULT_RESUME_IGNORE, EpochBatches, Trainer, training_summary, warmup_cosine

REPORT_NAME = "classifier_report.json"
RESUME_IGNORE = (*DEFAULT_RESUME_IGNORE, "epochs", "eval_batch_size", "device")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description="Train the Fashion-MNIST prompt-faithfulness classifier.")
    parser.add_argument("--data-root", default=SYSTEM_DATA_ROOT, help="folder with the train-* IDX files")
    parser.add_argument("--test-root", default=None, help="folder with the t10k-* IDX files (default: shipped)")
    parser.add_argument("--out-dir", default="outputs/train/classifier")
    parser.add_argument("--epochs", type=int, default=3, help="passes over the train split (unless --steps)")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps; overrides --epochs")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--weight-decay", type=float, default=1e-4)
    parser.add_argument("--warmup-steps", type=int, default=100)
    parser.add_argument("--min-lr-ratio", type=float, default=0.05)
    parser.add_argument("--label-smoothing", type=float, default=0.0)
    parser.add_argument("--width", type=int, default=16, help="channels of the first stage (then 2x, 4x)")
    parser.add_argument(
        "--augment",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="random shifts of up to --max-shift px and left-right flips",
    )
    parser.add_argument("--max-shift", type=int, default=2)
    parser.add_argument("--train-limit", type=int, default=0, help="use only the first N train images (0: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--num-threads",
        type=int,
        default=1,
        help="torch threads; 1 is fastest for this small CNN on a busy 2-core machine",
    )
    parser.add_argument("--eval-batch-size", type=int, default=500)
    parser.add_argument("--ckpt-every", type=int, default=200)
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True)
    return parser.parse_args(argv)


def _check(args: argparse.Namespace) -> None:
    positive = {
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "width": args.width,
        "num_threads": args.num_threads,
        "eval_batch_size": args.eval_batch_size,
        "ckpt_every": args.ckpt_every,
        "log_every": args.log_every,
    }
    for name, value in positive.items():
        if value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.steps is not None and args.steps < 1:
        raise ConfigError(f"--steps must be >= 1, got {args.steps}")
    if args.lr <= 0:
        raise ConfigError(f"--lr must be > 0, got {args.lr}")
    if args.max_shift < 0 or args.train_limit < 0:
        raise ConfigError("--max-shift and --train-limit must be >= 0")
    if not 0.0 <= args.label_smoothing < 1.0:
        raise ConfigError(f"--label-smoothing must be in [0, 1), got {args.label_smoothing}")


def train_classifier(args: argparse.Namespace) -> dict:
    """Train (or resume) the classifier, export it, evaluate the exported file and write the report."""
    _check(args)
    device = resolve_device(args.device)
    torch.set_num_threads(args.num_threads)
    train_images, train_labels = load_split(args.data_root, "train")  # (N, 28, 28) uint8, (N,) int64
    test_images, test_labels = load_split(args.test_root, "test")
    if args.train_limit:
        train_images, train_labels = train_images[: args.train_limit], train_labels[: args.train_limit]
    steps_per_epoch = len(train_images) // args.batch_size
    if steps_per_epoch < 1:
        raise ConfigError(f"--batch-size {args.batch_size} is larger than the train set ({len(train_images)} images)")
    steps = args.steps if args.steps is not None else args.epochs * steps_per_epoch
    out_dir = Path(args.out_dir)
    config = {**vars(args), "steps": steps}

    torch.manual_seed(args.seed)
    model = FashionClassifier(args.width).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    load = functools.partial(
        training_batch,
        torch.from_numpy(train_images),
        torch.from_numpy(train_labels),
        augment=args.augment,
        max_shift=args.max_shift,
    )
    trainer = Trainer(
        model,
        optimizer,
        ClassifierObjective(model, args.label_smoothing),
        EpochBatches(len(train_images), args.batch_size, args.seed, load),
        max_steps=steps,
        out_dir=out_dir,
        ckpt_every=args.ckpt_every,
        log_every=args.log_every,
        progress=args.progress,
        lr_schedule=warmup_cosine(min(args.warmup_steps, steps), steps, args.min_lr_ratio),
        config=config,
        resume_ignore=RESUME_IGNORE,
        export_name=WEIGHTS_NAME,
        export_dtype=torch.float16,
    )
    print(
        f"training the classifier ({sum(p.numel() for p in model.parameters()) / 1e3:.1f}k parameters) on "
        f"{len(train_images)} images for {steps} steps of {args.batch_size} "
        f"({steps / steps_per_epoch:.2f} epochs) into {out_dir}",
        flush=True,
    )
    summary = trainer.fit()

    # Evaluate exactly what ships: the fp16 file loaded strictly into a fresh fp32 model, fed uint8 images.
    started = time.perf_counter()
    shipped = load_classifier(out_dir / WEIGHTS_NAME, args.width, device)
    preds = predict(shipped, pad_to_world(test_images), args.eval_batch_size)  # (N,)
    eval_s = time.perf_counter() - started
    correct = preds == test_labels
    per_class = {
        CLASS_NAMES[c]: float(correct[test_labels == c].mean()) for c in range(NUM_CLASSES) if (test_labels == c).any()
    }
    weights = out_dir / WEIGHTS_NAME
    report = {
        "weights": str(weights),
        "weights_dtype": "float16",
        "weights_bytes": weights.stat().st_size,
        "parameters": sum(p.numel() for p in shipped.parameters()),
        "width": args.width,
        "input": "uint8 (N, 32, 32, 3); gray = channel mean, scaled x / 127.5 - 1",
        "test_split": str(Path(args.test_root)) if args.test_root else "shipped (data/fashion_mnist)",
        "test": {
            "images": int(len(test_labels)),
            "accuracy": float(correct.mean()),
            "per_class_accuracy": per_class,
            "eval_s": eval_s,
        },
        "training": training_summary(
            summary, train_images=int(len(train_images)), epochs=summary["steps"] / steps_per_epoch
        ),
        "config": config,
        "environment": environment(device),
    }
    write_json_atomic(out_dir / REPORT_NAME, report)
    return report


def main(argv: list[str] | None = None) -> int:
    """Entry point: train, report, print a one-line summary; user errors print one line and exit 2."""
    args = parse_args(argv)
    report = run_or_exit(lambda: train_classifier(args))
    test = report["test"]
    print(
        f"{report['weights']}: test accuracy {100 * test['accuracy']:.2f}% on {test['images']} images "
        f"({report['weights_bytes'] / 1024:.0f} KiB fp16); report in {Path(args.out_dir) / REPORT_NAME}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
