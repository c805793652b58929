"""Training the world's VQ tokenizer: the job ``scripts/train_vq.py`` runs (see its docstring for the data and files)."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from lantern import checks
from lantern.errors import ConfigError, writes_under
from lantern.files import save_png, write_json_atomic
from lantern.models.bundle import to_uint8
from lantern.models.checkpoint import load_weights
from lantern.models.devices import resolve_device
from lantern.models.vq_model import VQModel, vq_config
from lantern.models.world.fashion_mnist import NUM_CLASSES, FashionMNISTImages
from lantern.results.provenance import environment
from lantern.training.loop import MAX_BATCH, EpochBatches, Trainer, check_trainer_knobs, training_summary, warmup_cosine
from lantern.training.vq import VQObjective, evaluate_vq, image_batch

WEIGHTS_NAME = "vq.safetensors"
REPORT_NAME = "vq_report.json"
RECON_NAME = "recon.png"
_CELL_SCALE = 4  # recon.png shows every pixel as a 4x4 block


def _recon_indices(dataset: FashionMNISTImages, count: int) -> list[int]:
    """The first ``count`` test items taken class by class in turn (two per class for count 20)."""
    labels = dataset.labels.tolist()
    per_class = [[i for i, y in enumerate(labels) if y == c] for c in range(NUM_CLASSES)]
    picked = []
    for k in range(count):
        pool = per_class[k % NUM_CLASSES]
        if k // NUM_CLASSES < len(pool):
            picked.append(pool[k // NUM_CLASSES])
    return picked


def _load_batch(dataset: FashionMNISTImages, memory_format: torch.memory_format, indices: torch.Tensor) -> torch.Tensor:
    """Images (B, 3, R, R) of ``dataset`` at ``indices`` in ``memory_format``."""
    return image_batch(dataset, indices).contiguous(memory_format=memory_format)


@torch.no_grad()
def save_recon_grid(model: VQModel, dataset: FashionMNISTImages, count: int, path: Path) -> None:
    """Save a PNG with rows of 10 test images, each row followed by a row of their reconstructions."""
    model.eval()
    device = model.quantize.embedding.weight.device
    x = image_batch(dataset, torch.tensor(_recon_indices(dataset, count))).to(device)  # (n, 3, R, R)
    recon = model.decode_codes(model.encode(x))  # (n, 3, R, R)
    originals, recons = to_uint8(x).cpu().numpy(), to_uint8(recon).cpu().numpy()  # (n, R, R, 3)
    res, gap, cols = originals.shape[1], 2, NUM_CLASSES
    pairs = -(-len(originals) // cols)
    step = res + gap
    grid = np.full((pairs * 2 * step - gap, cols * step - gap, 3), 255, np.uint8)  # white canvas
    for i, (image, rec) in enumerate(zip(originals, recons, strict=True)):
        top, left = (i // cols) * 2 * step, (i % cols) * step
        grid[top : top + res, left : left + res] = image
        grid[top + step : top + step + res, left : left + res] = rec
    grid = grid.repeat(_CELL_SCALE, axis=0).repeat(_CELL_SCALE, axis=1)
    save_png(grid, path)


@writes_under("out_dir")
def train(cfg: DictConfig) -> dict:
    """Train (or resume) the tokenizer described by ``cfg``, export it and write the report; returns it."""
    check_trainer_knobs(cfg)
    checks.probability("restart.until_fraction", cfg.restart.until_fraction)
    checks.capped("resolution", cfg.resolution, 1, 1024, note="px of the square images")
    checks.capped("eval_batch_size", cfg.eval_batch_size, 1, MAX_BATCH)
    checks.capped("recon_images", cfg.recon_images, 1, 1000, note="test images in recon.png")
    checks.flag("channels_last", cfg.channels_last)
    config = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    vq_cfg = vq_config(cfg.preset, **config["vq_overrides"])
    if cfg.resolution % vq_cfg.downsample:
        raise ConfigError(
            f"resolution {cfg.resolution} is not divisible by the preset's downsample {vq_cfg.downsample}"
        )
    device = resolve_device(cfg.device)
    torch.set_num_threads(int(cfg.num_threads))
    out_dir = Path(cfg.out_dir)
    train = FashionMNISTImages.from_folder(cfg.data_root, "train", cfg.resolution)
    test = FashionMNISTImages.from_folder(cfg.test_root, "test", cfg.resolution)

    torch.manual_seed(cfg.seed)
    model = VQModel(vq_cfg).to(device)
    # channels_last speeds up the CPU convolutions; the exported tensors are made contiguous again.
    memory_format = torch.channels_last if cfg.channels_last else torch.contiguous_format
    model = model.to(memory_format=memory_format)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
    objective = VQObjective(
        model,
        l1_weight=cfg.loss.l1,
        mse_weight=cfg.loss.mse,
        codebook_weight=cfg.loss.codebook,
        commitment_weight=cfg.loss.commitment,
        restart_every=cfg.restart.every,
        restart_until=int(cfg.restart.until_fraction * cfg.steps),
        restart_min_count=cfg.restart.min_count,
        buffer_size=cfg.restart.buffer_size,
    )
    load = functools.partial(_load_batch, train, memory_format)
    batches = EpochBatches(len(train), cfg.batch_size, cfg.seed, load)
    trainer = Trainer(
        model,
        optimizer,
        objective,
        batches,
        max_steps=cfg.steps,
        out_dir=out_dir,
        ckpt_every=cfg.ckpt_every,
        log_every=cfg.log_every,
        progress=cfg.progress,
        grad_clip=cfg.grad_clip,
        lr_schedule=warmup_cosine(cfg.warmup_steps, cfg.steps, cfg.min_lr_ratio),
        config=config,
        export_name=WEIGHTS_NAME,
        export_dtype=torch.float16,
    )
    print(
        f"training {cfg.preset} ({sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters) on "
        f"{len(train)} images for {cfg.steps} steps of {cfg.batch_size} into {out_dir}",
        flush=True,
    )
    summary = trainer.fit()

    # Evaluate exactly what ships: the fp16 file loaded strictly into a fresh fp32 model.
    shipped = load_weights(VQModel(vq_cfg), out_dir / WEIGHTS_NAME, f"{cfg.preset} tokenizer").to(device)
    metrics = evaluate_vq(shipped, test, batch_size=cfg.eval_batch_size)
    save_recon_grid(shipped, test, cfg.recon_images, out_dir / RECON_NAME)
    report = {
        "weights": str(out_dir / WEIGHTS_NAME),
        "weights_dtype": "float16",
        "codebook_used_buffer": "kept (ids < 2048 are exact in fp16; the file loads strictly)",
        "preset": cfg.preset,
        "vq_config": {k: list(v) if isinstance(v, tuple) else v for k, v in vq_cfg.__dict__.items()},
        "test_split": str(Path(cfg.test_root)) if cfg.test_root else "shipped (data/fashion_mnist)",
        "test": metrics,
        "training": training_summary(summary, images_seen=summary["steps"] * cfg.batch_size),
        "config": config,
        "environment": environment(device),
    }
    write_json_atomic(out_dir / REPORT_NAME, report)
    return report
