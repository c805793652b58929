"""Training the world's CLIP: the job ``scripts/train_clip.py`` runs (see its docstring)."""

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
from lantern.metrics.classifier import pad_to_world
from lantern.metrics.clip import CONVENTIONS, CLIPScore, encode_images, encode_texts
from lantern.models.devices import resolve_device
from lantern.models.world.fashion_mnist import NUM_CLASSES, all_captions, caption_for, load_split
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
from lantern.training.loop import (
    DEFAULT_RESUME_IGNORE,
    MAX_BATCH,
    EpochBatches,
    Trainer,
    check_trainer_knobs,
    training_summary,
    warmup_cosine,
)

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


def _check(cfg: DictConfig) -> None:
    """Every value before any data is read."""
    checks.capped("eval_batch_size", cfg.eval_batch_size, 1, MAX_BATCH)
    for name in ("embed_dim", "vision_width", "vision_head_width", "text_width"):
        checks.capped(name, cfg[name], 1, 4096, note="channels")
    for name in ("vision_layers", "text_layers", "text_heads"):
        checks.capped(name, cfg[name], 1, 64)
    checks.capped("patch_size", cfg.patch_size, 1, 32, note="px of the 32 px images")
    checks.capped("context_length", cfg.context_length, 1, 512, note="caption tokens")
    checks.capped("max_shift", cfg.max_shift, 0, 28, note="px of a 28 px image")
    for name in ("train_limit", "eval_limit", "score_images"):
        checks.capped(name, cfg[name], 0, 10**7, note="images")
    checks.flag("augment", cfg.augment)
    checks.flag("same_class_targets", cfg.same_class_targets)
    checks.real("lr", cfg.lr, 0, low_open=True)
    checks.real("weight_decay", cfg.weight_decay, 0)
    checks.real("grad_clip", cfg.grad_clip, 0, low_open=True)
    checks.probability("prefix_prob", cfg.prefix_prob)


def evaluate(weights: Path, config_path: Path, images: np.ndarray, labels: np.ndarray, cfg, device) -> dict:
    """Zero-shot accuracy and cosines of the exported ``weights`` on uint8 (N, 32, 32, 3) ``images``.

    The model is loaded by :class:`CLIPScore` exactly as a run's ``clip`` metric loads it; the
    first ``score_images`` images are also scored by ``CLIPScore.score`` itself with matched and
    mismatched captions under both conventions.
    """
    started = time.perf_counter()
    scorer = CLIPScore(str(weights), MODEL_NAME, "lantern", str(config_path), cfg.eval_batch_size, str(device))
    clip, preprocess, tokenizer = scorer.load()
    image_emb = encode_images(clip, preprocess, images, cfg.eval_batch_size, str(device))  # (N, E)
    plain = [c for label in range(NUM_CLASSES) for c in all_captions(label)]  # (70,) class-major
    conventions = {}
    for convention, (prefix, _, _) in CONVENTIONS.items():
        text_emb = encode_texts(clip, tokenizer, [prefix + c for c in plain], cfg.eval_batch_size, str(device))
        conventions[convention] = {"caption_prefix": prefix, **zero_shot_scores(image_emb, text_emb, labels)}
    count = min(cfg.score_images, len(images))
    scored = {}
    if count:
        matched = [caption_for(int(y), i) for i, y in enumerate(labels[:count])]
        shifted = [
            caption_for((int(y) + 1 + i % (NUM_CLASSES - 1)) % NUM_CLASSES, i) for i, y in enumerate(labels[:count])
        ]
        for convention in CONVENTIONS:
            metric = CLIPScore(str(weights), MODEL_NAME, convention, str(config_path), cfg.eval_batch_size, str(device))
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


def _splits(cfg: DictConfig) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """The train and test splits, each (images (N, 28, 28) uint8, labels (N,) int64), cut to ``train_limit``
    and ``eval_limit`` when set."""
    train_images, train_labels = load_split(cfg.data_root, "train")  # (N, 28, 28) uint8, (N,) int64
    test_images, test_labels = load_split(cfg.test_root, "test")
    if cfg.train_limit:
        train_images, train_labels = train_images[: cfg.train_limit], train_labels[: cfg.train_limit]
    if cfg.eval_limit:
        test_images, test_labels = test_images[: cfg.eval_limit], test_labels[: cfg.eval_limit]
    return (train_images, train_labels), (test_images, test_labels)


@writes_under("out_dir")
def train(cfg: DictConfig) -> dict:
    """Train (or resume) the CLIP, export it, evaluate the exported file and write the report."""
    check_trainer_knobs(cfg)
    _check(cfg)
    device = resolve_device(cfg.device)
    torch.set_num_threads(cfg.num_threads)
    architecture = clip_config(**{name: getattr(cfg, name) for name in ARCHITECTURE})
    tokens = tokenize_captions(caption_table(), cfg.context_length)  # (140, context_length)
    (train_images, train_labels), (test_images, test_labels) = _splits(cfg)
    steps_per_epoch = len(train_images) // cfg.batch_size
    if steps_per_epoch < 1:
        raise ConfigError(f"batch_size={cfg.batch_size} is larger than the train set ({len(train_images)} images)")
    out_dir = Path(cfg.out_dir)
    config = OmegaConf.to_container(cfg, resolve=True).copy()

    torch.manual_seed(cfg.seed)
    model = build_clip(architecture).to(device)
    optimizer = torch.optim.AdamW(parameter_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(0.9, 0.98), eps=1e-6)
    load = functools.partial(
        clip_batch,
        torch.from_numpy(train_images),
        torch.from_numpy(train_labels),
        augment=cfg.augment,
        max_shift=cfg.max_shift,
        prefix_prob=cfg.prefix_prob,
    )
    trainer = Trainer(
        model,
        optimizer,
        ContrastiveObjective(model, tokens, cfg.same_class_targets),
        EpochBatches(len(train_images), cfg.batch_size, cfg.seed, load),
        max_steps=cfg.steps,
        out_dir=out_dir,
        ckpt_every=cfg.ckpt_every,
        log_every=cfg.log_every,
        progress=cfg.progress,
        grad_clip=cfg.grad_clip,
        lr_schedule=warmup_cosine(min(cfg.warmup_steps, cfg.steps), cfg.steps, cfg.min_lr_ratio),
        config=config,
        resume_ignore=RESUME_IGNORE,
        export_name=WEIGHTS_NAME,
        export_dtype=torch.float16,
        export_metadata={"open_clip_model": MODEL_NAME},
    )
    parameters = sum(p.numel() for p in model.parameters())
    print(
        f"training {MODEL_NAME} ({parameters / 1e6:.2f}M parameters) on {len(train_images)} images for "
        f"{cfg.steps} steps of {cfg.batch_size} ({cfg.steps / steps_per_epoch:.2f} epochs) into {out_dir}",
        flush=True,
    )
    summary = trainer.fit()
    config_path = out_dir / CONFIG_NAME
    write_json_atomic(config_path, architecture)

    # Evaluate exactly what ships: the fp16 file loaded by open_clip into a fresh fp32 model, fed uint8 images.
    weights = out_dir / WEIGHTS_NAME
    test = evaluate(weights, config_path, pad_to_world(test_images), test_labels, cfg, device)
    report = {
        "weights": str(weights),
        "weights_dtype": "float16",
        "weights_bytes": weights.stat().st_size,
        "model_config": str(config_path),
        "open_clip_model": MODEL_NAME,
        "parameters": parameters,
        "architecture": architecture,
        "input": "uint8 (N, 32, 32, 3) through open_clip's preprocess (x / 255, OpenAI mean/std; 32x32 unchanged)",
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
