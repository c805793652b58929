"""Training the world's prompt-faithfulness classifier: the job ``scripts/train_classifier.py`` runs (see its docstring)."""

from __future__ import annotations

import functools
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from lantern import checks
from lantern.errors import ConfigError, writes_under
from lantern.files import write_json_atomic
from lantern.metrics.classifier import WEIGHTS_NAME, FashionClassifier, load_classifier, pad_to_world, predict
from lantern.models.devices import resolve_device
from lantern.models.world.fashion_mnist import CLASS_NAMES, NUM_CLASSES, load_split
from lantern.results.provenance import environment
from lantern.training.classifier import ClassifierObjective, training_batch
from lantern.training.loop import (
    DEFAULT_RESUME_IGNORE,
    MAX_BATCH,
    EpochBatches,
    Trainer,
    check_trainer_knobs,
    training_summary,
    warmup_cosine,
)

REPORT_NAME = "classifier_report.json"
RESUME_IGNORE = (*DEFAULT_RESUME_IGNORE, "epochs", "eval_batch_size", "device")


def _check(cfg: DictConfig) -> None:
    """Every value before any data is read."""
    checks.capped("epochs", cfg.epochs, 1, 10**4)
    checks.capped("width", cfg.width, 1, 1024, note="channels of the first stage; the last has 4x")
    checks.capped("eval_batch_size", cfg.eval_batch_size, 1, MAX_BATCH)
    checks.capped("max_shift", cfg.max_shift, 0, 28, note="px of a 28 px image")
    checks.capped("train_limit", cfg.train_limit, 0, 10**7, note="images; 0: all of the split")
    checks.flag("augment", cfg.augment)
    checks.real("lr", cfg.lr, 0, low_open=True)
    checks.real("weight_decay", cfg.weight_decay, 0)
    checks.probability("label_smoothing", cfg.label_smoothing, one=False)
    checks.probability("min_lr_ratio", cfg.min_lr_ratio)


def _evaluate_shipped(
    weights: Path, cfg: DictConfig, device: torch.device, test_images: np.ndarray, test_labels: np.ndarray
) -> tuple[FashionClassifier, dict]:
    """Evaluate exactly what ships: the fp16 file loaded strictly into a fresh fp32 model, fed uint8 images.

    Returns the loaded model and the report's ``test`` block (accuracy overall and per class)."""
    started = time.perf_counter()
    shipped = load_classifier(weights, cfg.width, device)
    preds = predict(shipped, pad_to_world(test_images), cfg.eval_batch_size)  # (N,)
    eval_s = time.perf_counter() - started
    correct = preds == test_labels
    per_class = {
        CLASS_NAMES[c]: float(correct[test_labels == c].mean()) for c in range(NUM_CLASSES) if (test_labels == c).any()
    }
    test = {
        "images": int(len(test_labels)),
        "accuracy": float(correct.mean()),
        "per_class_accuracy": per_class,
        "eval_s": eval_s,
    }
    return shipped, test


@writes_under("out_dir")
def train(cfg: DictConfig) -> dict:
    """Train (or resume) the classifier, export it, evaluate the exported file and write the report."""
    check_trainer_knobs(cfg)
    _check(cfg)
    device = resolve_device(cfg.device)
    torch.set_num_threads(cfg.num_threads)
    train_images, train_labels = load_split(cfg.data_root, "train")  # (N, 28, 28) uint8, (N,) int64
    test_images, test_labels = load_split(cfg.test_root, "test")
    if cfg.train_limit:
        train_images, train_labels = train_images[: cfg.train_limit], train_labels[: cfg.train_limit]
    steps_per_epoch = len(train_images) // cfg.batch_size
    if steps_per_epoch < 1:
        raise ConfigError(f"batch_size={cfg.batch_size} is larger than the train set ({len(train_images)} images)")
    steps = cfg.steps if cfg.steps is not None else cfg.epochs * steps_per_epoch
    out_dir = Path(cfg.out_dir)
    config = {**OmegaConf.to_container(cfg, resolve=True), "steps": steps}

    torch.manual_seed(cfg.seed)
    model = FashionClassifier(cfg.width).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    load = functools.partial(
        training_batch,
        torch.from_numpy(train_images),
        torch.from_numpy(train_labels),
        augment=cfg.augment,
        max_shift=cfg.max_shift,
    )
    trainer = Trainer(
        model,
        optimizer,
        ClassifierObjective(model, cfg.label_smoothing),
        EpochBatches(len(train_images), cfg.batch_size, cfg.seed, load),
        max_steps=steps,
        out_dir=out_dir,
        ckpt_every=cfg.ckpt_every,
        log_every=cfg.log_every,
        progress=cfg.progress,
        lr_schedule=warmup_cosine(min(cfg.warmup_steps, steps), steps, cfg.min_lr_ratio),
        config=config,
        resume_ignore=RESUME_IGNORE,
        export_name=WEIGHTS_NAME,
        export_dtype=torch.float16,
    )
    print(
        f"training the classifier ({sum(p.numel() for p in model.parameters()) / 1e3:.1f}k parameters) on "
        f"{len(train_images)} images for {steps} steps of {cfg.batch_size} "
        f"({steps / steps_per_epoch:.2f} epochs) into {out_dir}",
        flush=True,
    )
    summary = trainer.fit()

    shipped, test = _evaluate_shipped(out_dir / WEIGHTS_NAME, cfg, device, test_images, test_labels)
    weights = out_dir / WEIGHTS_NAME
    report = {
        "weights": str(weights),
        "weights_dtype": "float16",
        "weights_bytes": weights.stat().st_size,
        "parameters": sum(p.numel() for p in shipped.parameters()),
        "width": cfg.width,
        "input": "uint8 (N, 32, 32, 3); gray = channel mean, scaled x / 127.5 - 1",
        "test_split": str(Path(cfg.test_root)) if cfg.test_root else "shipped (data/fashion_mnist)",
        "test": test,
        "training": training_summary(
            summary, train_images=int(len(train_images)), epochs=summary["steps"] / steps_per_epoch
        ),
        "config": config,
        "environment": environment(device),
    }
    write_json_atomic(out_dir / REPORT_NAME, report)
    return report
