"""Train the embedded world's small CLIP on Fashion-MNIST in one command.

    python scripts/train_clip.py                                        # 60k train split
    python scripts/train_clip.py --steps 50 --out-dir outputs/train/clip_try

The train split comes from ``--data-root`` (default ``/usr/share/datasets/fashion-mnist``, apt
package ``dataset-fashion-mnist``); the evaluation uses the shipped 10k test split (``--test-root``
to override). The model, its batches and its objective are described in
:mod:`lantern.training.clip`. Rerunning the same command resumes from ``out_dir/checkpoint.pt``.
At the end ``out_dir`` holds ``clip.safetensors`` (fp16 open_clip state dict, loadable with
``open_clip.create_model_and_transforms("lantern-fashion-clip", pretrained=FILE)`` once the config
is registered), ``lantern-fashion-clip.json`` (the open_clip architecture; register it with
``open_clip.add_model_config``), ``clip_report.json`` (zero-shot accuracy over the 7 caption
templates per class and matched/mismatched cosines under both CLIP-score conventions, measured on
the exported file through :class:`lantern.metrics.clip.CLIPScore`'s own loading path, plus the
config and the environment), ``config.yaml`` and ``log.jsonl``. User errors (missing data, bad
values) print one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

import numpy as np
import torch

from lantern.cli.main import run_or_exit
from lantern.errors import ConfigError
from lantern.files import write_json_atomic
from lantern.metrics.classifier import pad_to_world
from lantern.metrics.clip import CONVENTIONS, CLIPScore, encode_images, encode_texts
from lantern.models.devices import resolve_device
from lantern.models.world.fashion_mnist import NUM_CLASSES, SYSTEM_DATA_ROOT, all_captions, caption_for, load_split
from lantern.results.provenance import environment
from lantern.training.clip import (
    CONFIG_NAME,
    MODEL_NAME,
    WEIGHTS_NAME,
    ContrastiveObjective,
    build_clip,
    caption_table,
    clip_batch,
    clip_config,
    parameter_groups,
    tokenize_captions,
    zero_shot_scores,
)
from lantern.training.loop import DEFAULT_RESUME_IGNORE, EpochBatches, Trainer, training_summary, warmup_cosine

REPORT_NAME = "clip_report.json"
RESUME_IGNORE = (*DEFAULT_RESUME_IGNORE, "test_root", "eval_batch_size", "eval_limit", "score_images")
ARCHITECTURE = (
    "embed_dim",
    "vision_width",
    "vision_layers",
    "patch_size",
    "vision_head_width",
    "text_width",
    "text_heads",
    "text_layers",
    "context_length",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description="Train the embedded world's small CLIP on Fashion-MNIST.")
    parser.add_argument("--data-root", default=SYSTEM_DATA_ROOT, help="folder with the train-* IDX files")
    parser.add_argument("--test-root", default=None, help="folder with the t10k-* IDX files (default: shipped)")
    parser.add_argument("--out-dir", default="outputs/train/clip")
    parser.add_argument("--steps", type=int, default=1500, help="optimizer steps (6.4 epochs of 60k at batch 256)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--warmup-steps", type=int, default=50)
    parser.add_argument("--min-lr-ratio", type=float, default=0.05)
    parser.add_argument("--grad-clip", type=float, default=1.0)
    parser.add_argument("--embed-dim", type=int, default=64)
    parser.add_argument("--vision-width", type=int, default=96)
    parser.add_argument("--vision-layers", type=int, default=4)
    parser.add_argument(
        "--patch-size", type=int, default=8, help="8: a 4x4 grid of patches, 2.5x faster than 4 on a CPU"
    )
    parser.add_argument("--vision-head-width", type=int, default=32)
    parser.add_argument(
        "--text-width",
        type=int,
        default=64,
        help="the token embedding (49408 x width) dominates the file: 64 -> 6.0 MiB in fp16",
    )
    parser.add_argument("--text-heads", type=int, default=4)
    parser.add_argument("--text-layers", type=int, default=3)
    parser.add_argument("--context-length", type=int, default=32)
    parser.add_argument(
        "--prefix-prob", type=float, default=0.5, help="fraction of training captions prefixed with 'A photo depicts '"
    )
    parser.add_argument(
        "--same-class-targets",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="soft InfoNCE targets over same-class pairs (no false negatives)",
    )
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
        help="torch threads; 1 is fastest for this small model on a busy 2-core machine",
    )
    parser.add_argument("--eval-batch-size", type=int, default=500)
    parser.add_argument("--eval-limit", type=int, default=0, help="evaluate on the first N test images (0: all)")
    parser.add_argument(
        "--score-images",
        type=int,
        default=1000,
        help="test images scored through CLIPScore.score itself, per convention",
    )
    parser.add_argument("--ckpt-every", type=int, default=100)
    parser.add_argument("--log-every", type=int, default=25)
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True)
    return parser.parse_args(argv)


def _check(args: argparse.Namespace) -> None:
    positive = {
        "steps": args.steps,
        "batch_size": args.batch_size,
        "num_threads": args.num_threads,
        "eval_batch_size": args.eval_batch_size,
        "ckpt_every": args.ckpt_every,
        "log_every": args.log_every,
    }
    for name, value in positive.items():
        if value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if not args.lr > 0 or args.weight_decay < 0:
        raise ConfigError(f"--lr must be > 0 and --weight-decay >= 0, got {args.lr} and {args.weight_decay}")
    if not args.grad_clip > 0:
        raise ConfigError(f"--grad-clip must be > 0, got {args.grad_clip}")
    if args.max_shift < 0 or args.train_limit < 0 or args.eval_limit < 0 or args.score_images < 0:
        raise ConfigError("--max-shift, --train-limit, --eval-limit and --score-images must be >= 0")
    if not 0.0 <= args.prefix_prob <= 1.0:
        raise ConfigError(f"--prefix-prob must be in [0, 1], got {args.prefix_prob}")
    if args.warmup_steps < 0:
        raise ConfigError(f"--warmup-steps must be >= 0, got {args.warmup_steps}")


def evaluate(weights: Path, config_path: Path, images: np.ndarray, labels: np.ndarray, args, device) -> dict:
    """Zero-shot accuracy and cosines of the exported ``weights`` on uint8 (N, 32, 32, 3) ``images``.

    The model is loaded by :class:`CLIPScore` exactly as a run's ``clip`` metric loads it; the
    first ``--score-images`` images are also scored by ``CLIPScore.score`` itself with matched and
    mismatched captions under both conventions.
    """
    started = time.perf_counter()
    scorer = CLIPScore(str(weights), MODEL_NAME, "lantern", str(config_path), args.eval_batch_size, str(device))
    clip, preprocess, tokenizer = scorer.load()
    image_emb = encode_images(clip, preprocess, images, args.eval_batch_size, str(device))  # (N, E)
    plain = [c for label in range(NUM_CLASSES) for c in all_captions(label)]  # (70,) class-major
    conventions = {}
    for convention, (prefix, _, _) in CONVENTIONS.items():
        text_emb = encode_texts(clip, tokenizer, [prefix + c for c in plain], args.eval_batch_size, str(device))
        conventions[convention] = {"caption_prefix": prefix, **zero_shot_scores(image_emb, text_emb, labels)}
    count = min(args.score_images, len(images))
    scored = {}
    if count:
        matched = [caption_for(int(y), i) for i, y in enumerate(labels[:count])]
        shifted = [
            caption_for((int(y) + 1 + i % (NUM_CLASSES - 1)) % NUM_CLASSES, i) for i, y in enumerate(labels[:count])
        ]
        for convention in CONVENTIONS:
            metric = CLIPScore(
                str(weights), MODEL_NAME, convention, str(config_path), args.eval_batch_size, str(device)
            )
            scored[convention] = {
                "matched": metric.score(images[:count], matched),
                "mismatched": metric.score(images[:count], shifted),
            }
    return {
        "images": int(len(images)),
        "conventions": conventions,
        "clip_score": {"images": count, "captions": "caption_for(label, i); mismatched: another class's", **scored},
        "eval_s": time.perf_counter() - started,
    }


def train_clip(args: argparse.Namespace) -> dict:
    """Train (or resume) the CLIP, export it, evaluate the exported file and write the report."""
    _check(args)
    device = resolve_device(args.device)
    torch.set_num_threads(args.num_threads)
    architecture = clip_config(**{name: getattr(args, name) for name in ARCHITECTURE})
    tokens = tokenize_captions(caption_table(), args.context_length)  # (140, context_length)
    train_images, train_labels = load_split(args.data_root, "train")  # (N, 28, 28) uint8, (N,) int64
    test_images, test_labels = load_split(args.test_root, "test")
    if args.train_limit:
        train_images, train_labels = train_images[: args.train_limit], train_labels[: args.train_limit]
    if args.eval_limit:
        test_images, test_labels = test_images[: args.eval_limit], test_labels[: args.eval_limit]
    steps_per_epoch = len(train_images) // args.batch_size
    if steps_per_epoch < 1:
        raise ConfigError(f"--batch-size {args.batch_size} is larger than the train set ({len(train_images)} images)")
    out_dir = Path(args.out_dir)
    config = vars(args).copy()

    torch.manual_seed(args.seed)
    model = build_clip(architecture).to(device)
    optimizer = torch.optim.AdamW(parameter_groups(model, args.weight_decay), lr=args.lr, betas=(0.9, 0.98), eps=1e-6)
    load = functools.partial(
        clip_batch,
        torch.from_numpy(train_images),
        torch.from_numpy(train_labels),
        augment=args.augment,
        max_shift=args.max_shift,
        prefix_prob=args.prefix_prob,
    )
    trainer = Trainer(
        model,
        optimizer,
        ContrastiveObjective(model, tokens, args.same_class_targets),
        EpochBatches(len(train_images), args.batch_size, args.seed, load),
        max_steps=args.steps,
        out_dir=out_dir,
        ckpt_every=args.ckpt_every,
        log_every=args.log_every,
        progress=args.progress,
        grad_clip=args.grad_clip,
        lr_schedule=warmup_cosine(min(args.warmup_steps, args.steps), args.steps, args.min_lr_ratio),
        config=config,
        resume_ignore=RESUME_IGNORE,
        export_name=WEIGHTS_NAME,
        export_dtype=torch.float16,
        export_metadata={"open_clip_model": MODEL_NAME},
    )
    parameters = sum(p.numel() for p in model.parameters())
    print(
        f"training {MODEL_NAME} ({parameters / 1e6:.2f}M parameters) on {len(train_images)} images for "
        f"{args.steps} steps of {args.batch_size} ({args.steps / steps_per_epoch:.2f} epochs) into {out_dir}",
        flush=True,
    )
    summary = trainer.fit()
    config_path = out_dir / CONFIG_NAME
    write_json_atomic(config_path, architecture)

    # Evaluate exactly what ships: the fp16 file loaded by open_clip into a fresh fp32 model, fed uint8 images.
    weights = out_dir / WEIGHTS_NAME
    test = evaluate(weights, config_path, pad_to_world(test_images), test_labels, args, device)
    report = {
        "weights": str(weights),
        "weights_dtype": "float16",
        "weights_bytes": weights.stat().st_size,
        "model_config": str(config_path),
        "open_clip_model": MODEL_NAME,
        "parameters": parameters,
        "architecture": architecture,
        "input": "uint8 (N, 32, 32, 3) through open_clip's preprocess (x / 255, OpenAI mean/std; 32x32 unchanged)",
        "test_split": str(Path(args.test_root)) if args.test_root else "shipped (data/fashion_mnist)",
        "test": test,
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
    report = run_or_exit(lambda: train_clip(args), args.out_dir)
    lantern = report["test"]["conventions"]["lantern"]
    print(
        f"{report['weights']}: zero-shot accuracy {100 * lantern['zero_shot_accuracy']:.2f}% on "
        f"{report['test']['images']} test images, cosine matched {lantern['matched_cosine']:.3f} / mismatched "
        f"{lantern['mismatched_cosine']:.3f} ({report['weights_bytes'] / 2**20:.2f} MiB fp16); "
        f"report in {Path(args.out_dir) / REPORT_NAME}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
