"""Training the world's text-to-image GPT: the job ``scripts/train_gpt.py`` runs (see its docstring for the data and files)."""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from lantern import checks
from lantern.errors import writes_under
from lantern.files import sha256_file
from lantern.models.checkpoint import load_weights
from lantern.models.llamagen.gpt import GPT_PRESETS, Transformer, gpt_config
from lantern.models.vq_model import VQModel, vq_config
from lantern.models.world.fashion_mnist import FashionMNISTImages
from lantern.training.fashion import caption_table, tokenize
from lantern.training.gpt import GPTObjective
from lantern.training.loop import EpochBatches, Trainer, check_trainer_knobs, warmup_cosine

WEIGHTS_NAME = "gpt.safetensors"


def _check(cfg: DictConfig) -> None:
    """Every knob, then the tokenizer's file, before anything is loaded or written."""
    check_trainer_knobs(cfg)
    checks.capped("resolution", cfg.resolution, 1, 1024, note="px of the square images")
    checks.optional(checks.capped, "max_train_images", cfg.max_train_images, 0, 10**7, note="0: all")
    checks.capped("text_max_length", cfg.text_max_length, 1, 512, note="caption tokens; MiniLM has 512 positions")
    checks.probability("cond_dropout", cfg.cond_dropout)
    checks.choice("preset", cfg.preset, GPT_PRESETS)
    vq_config(cfg.vq_preset)
    checks.path("vq_weights", cfg.vq_weights)


@writes_under("out_dir")
def train(cfg: DictConfig) -> dict:
    _check(cfg)
    config = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    torch.set_num_threads(int(cfg.num_threads))
    out_dir = Path(cfg.out_dir)
    vq = load_weights(VQModel(vq_config(cfg.vq_preset)), cfg.vq_weights, f"{cfg.vq_preset} tokenizer").eval()
    train = FashionMNISTImages.from_folder(cfg.data_root, "train", cfg.resolution)
    if cfg.max_train_images:
        count = min(int(cfg.max_train_images), len(train))
        train = FashionMNISTImages(train.images[:count].numpy(), train.labels[:count].numpy(), cfg.resolution)
    codes = tokenize(vq, train, out_dir / "codes_train.pt", sha256_file(cfg.vq_weights))
    states, masks, class_captions = caption_table(cfg.text_max_length)
    caption_ids = class_captions[torch.as_tensor(train.labels, dtype=torch.long)]  # (N, K)

    torch.manual_seed(cfg.seed)
    gpt_cfg = gpt_config(
        cfg.preset,
        "t2i",
        cfg.resolution,
        vq.config.downsample,
        vocab_size=vq.config.codebook_size,
        caption_dim=states.shape[-1],
        cls_token_num=cfg.text_max_length,
    )
    model = Transformer(gpt_cfg)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=tuple(cfg.betas),
    )
    objective = GPTObjective(model, codes, caption_ids, states, masks, cfg.cond_dropout)
    trainer = Trainer(
        model,
        optimizer,
        objective,
        EpochBatches(len(train), cfg.batch_size, cfg.seed, lambda idx: idx),
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
    params = sum(p.numel() for p in model.parameters()) / 1e6
    print(
        f"training {cfg.preset} t2i ({params:.2f}M parameters, {gpt_cfg.grid_size}x{gpt_cfg.grid_size} tokens, "
        f"vocab {gpt_cfg.vocab_size}) for {cfg.steps} steps of {cfg.batch_size} into {out_dir}",
        flush=True,
    )
    return trainer.fit()
