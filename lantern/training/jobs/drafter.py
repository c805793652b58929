"""Training an EAGLE-style drafter for the world's GPT: the job ``scripts/train_drafter.py`` runs (see its docstring for the data and files)."""

from __future__ import annotations

import functools
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from lantern import checks
from lantern.files import sha256_file, write_json_atomic
from lantern.models.condition import load_minilm_conditioner
from lantern.models.drafter import Drafter, DrafterConfig, drafter_metadata, load_drafter
from lantern.models.sampling import SamplingConfig
from lantern.models.world.fashion_mnist import NUM_CLASSES, FashionMNISTImages
from lantern.models.world.load import DEFAULT_WORLD, load_world
from lantern.results.provenance import environment
from lantern.training.drafter import DrafterObjective, evaluate_drafter, generate_codes
from lantern.training.fashion import caption_table, tokenize
from lantern.training.loop import (
    DEFAULT_RESUME_IGNORE,
    EpochBatches,
    Trainer,
    check_trainer_knobs,
    training_summary,
    warmup_cosine,
)

WEIGHTS_NAME = "drafter.safetensors"
REPORT_NAME = "drafter_report.json"
DATA_KINDS = ("self", "images")
# Settings that change nothing the drafter sees, so a resumed run may change them.
RESUME_IGNORE = (*DEFAULT_RESUME_IGNORE, "generation.batch_size", "eval_images", "eval_batch_size", "test_root")


def _subset(dataset: FashionMNISTImages, count: int | None) -> FashionMNISTImages:
    if not count:
        return dataset
    count = min(int(count), len(dataset))
    return FashionMNISTImages(dataset.images[:count].numpy(), dataset.labels[:count].numpy(), dataset.resolution)


def self_distillation_data(cfg: DictConfig, bundle, gpt_path: Path, states, masks, class_captions, out_dir: Path):
    """Codes (M, N) sampled by the target and their caption ids (M, 1); see the module docstring."""
    gen = cfg.generation
    sampling = SamplingConfig(temperature=gen.temperature, top_k=gen.top_k, top_p=gen.top_p, cfg_scale=gen.cfg_scale)
    index = torch.arange(int(cfg.num_samples))
    per_class = class_captions.shape[1]
    caption_ids = class_captions[index % NUM_CLASSES, (index // NUM_CLASSES) % per_class]  # (M,)
    key = {
        "gpt_sha256": sha256_file(gpt_path),
        "seed": int(gen.seed),
        "cfg_scale": float(gen.cfg_scale),
        "temperature": float(gen.temperature),
        "top_k": int(gen.top_k),
        "top_p": float(gen.top_p),
        "text_max_length": int(cfg.text_max_length),
        "conditions": "fashion captions: class i % 10, template (i // 10) % 7",
    }
    codes = generate_codes(
        bundle.gpt,
        states,
        masks,
        caption_ids,
        sampling,
        int(gen.seed),
        out_dir / "codes_self.pt",
        key,
        batch_size=int(gen.batch_size),
        progress=cfg.progress,
    )
    return codes, caption_ids[:, None]


def image_data(cfg: DictConfig, bundle, train: FashionMNISTImages, vq_hash: str, class_captions, out_dir: Path):
    """Codes (M, N) of the VQ-tokenised train split and each image's class captions (M, K)."""
    codes = tokenize(bundle.vq, train, out_dir / "codes_train.pt", vq_hash, progress=cfg.progress)
    return codes, class_captions[train.labels]


def train(cfg: DictConfig) -> dict:
    """Build the data, train (or resume) the drafter, export it, evaluate the export and write the report."""
    check_trainer_knobs(cfg)
    started = time.perf_counter()
    checks.choice("data", cfg.data, DATA_KINDS)
    if int(cfg.eval_images) < 1:
        raise checks.refuse("eval_images", cfg.eval_images, "an integer >= 1")
    if cfg.data == "self" and int(cfg.num_samples) < int(cfg.batch_size):
        raise checks.refuse("num_samples", cfg.num_samples, f"an integer >= batch_size={cfg.batch_size}")
    config = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    torch.set_num_threads(int(cfg.num_threads))
    out_dir = Path(cfg.out_dir)
    folder = Path(cfg.world) if cfg.world else DEFAULT_WORLD
    bundle = load_world(
        "drafter-target",
        config["gpt"],
        config["vq"],
        functools.partial(load_minilm_conditioner, max_length=int(cfg.text_max_length)),
        folder=str(folder),
        device=cfg.device,
    )
    target, device = bundle.gpt, bundle.device
    states, masks, class_captions = caption_table(int(cfg.text_max_length), bundle.conditioner.encoder)
    states, masks = states.cpu(), masks.cpu()
    vq_hash = sha256_file(folder / "vq.safetensors")

    # Read both splits before any long computation, so missing files fail fast.
    resolution = int(cfg.gpt.image_size)
    test = _subset(FashionMNISTImages.from_folder(cfg.test_root, "test", resolution), cfg.eval_images)
    train = None
    if cfg.data == "images":
        train = _subset(FashionMNISTImages.from_folder(cfg.data_root, "train", resolution), cfg.max_train_images)
    test_codes = tokenize(bundle.vq, test, out_dir / "codes_test.pt", vq_hash, progress=cfg.progress)
    test_ids = class_captions[test.labels, torch.arange(len(test)) % class_captions.shape[1]]  # (E,)

    data_started = time.perf_counter()
    if cfg.data == "self":
        codes, caption_ids = self_distillation_data(
            cfg, bundle, folder / "gpt.safetensors", states, masks, class_captions, out_dir
        )
    else:
        codes, caption_ids = image_data(cfg, bundle, train, vq_hash, class_captions, out_dir)
    data_wall_s = time.perf_counter() - data_started

    torch.manual_seed(cfg.seed)
    drafter = Drafter(DrafterConfig(target.config, n_layer=int(cfg.n_layer))).to(device)
    optimizer = torch.optim.AdamW(
        drafter.parameters(), lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay
    )
    objective = DrafterObjective(
        target,
        drafter,
        codes,
        caption_ids,
        states,
        masks,
        cond_dropout=cfg.cond_dropout,
        noise=cfg.noise,
        ce_weight=cfg.ce_weight,
        cache_states=bool(cfg.cache_states) and caption_ids.shape[1] == 1,
        progress=cfg.progress,
    )
    trainer = Trainer(
        drafter,
        optimizer,
        objective,
        EpochBatches(codes.shape[0], cfg.batch_size, cfg.seed, lambda idx: idx),
        max_steps=cfg.steps,
        out_dir=out_dir,
        ckpt_every=cfg.ckpt_every,
        log_every=cfg.log_every,
        progress=cfg.progress,
        grad_clip=cfg.grad_clip,
        lr_schedule=warmup_cosine(cfg.warmup_steps, cfg.steps, cfg.min_lr_ratio),
        config=config,
        resume_ignore=RESUME_IGNORE,
        export_name=WEIGHTS_NAME,
        export_dtype=torch.float16,
        export_metadata=drafter_metadata(drafter),
    )
    params = sum(p.numel() for p in drafter.parameters()) / 1e6
    print(
        f"training a {cfg.n_layer}-layer drafter ({params:.2f}M parameters) for {cfg.gpt.preset} on "
        f"{codes.shape[0]} {'self-distilled' if cfg.data == 'self' else 'train-split'} sequences for "
        f"{cfg.steps} steps of {cfg.batch_size} into {out_dir}",
        flush=True,
    )
    summary = trainer.fit()

    # Evaluate exactly what ships: the fp16 file loaded by the decoders' loader into fp32.
    shipped = load_drafter(out_dir / WEIGHTS_NAME, gpt=config["gpt"], vq=config["vq"], device=str(device))
    held_out = evaluate_drafter(
        target,
        shipped,
        test_codes,
        test_ids,
        states,
        masks,
        batch_size=int(cfg.eval_batch_size),
        ce_weight=cfg.ce_weight,
    )
    train_steps = summary["steps"] - (summary["resumed_from"] or 0)
    report = {
        "weights": str(out_dir / WEIGHTS_NAME),
        "weights_dtype": "float16",
        "target": {
            "world": str(folder),
            "gpt": config["gpt"],
            "vq": config["vq"],
            "gpt_sha256": sha256_file(folder / "gpt.safetensors"),
        },
        "drafter": {"n_layer": int(cfg.n_layer), "parameters": sum(p.numel() for p in drafter.parameters())},
        "data": {
            "kind": cfg.data,
            "sequences": int(codes.shape[0]),
            "wall_s_this_run": data_wall_s,
            **({"generation": config["generation"]} if cfg.data == "self" else {"data_root": cfg.data_root}),
        },
        "held_out": {
            "split": str(cfg.test_root) if cfg.test_root else "shipped test split (data/fashion_mnist)",
            "images": len(test),
            **held_out,
        },
        "training": training_summary(
            summary,
            steps_per_s_this_run=train_steps / summary["wall_s"] if summary["wall_s"] > 0 else None,
            sequences_seen=summary["steps"] * cfg.batch_size,
        ),
        "wall_s_this_run": time.perf_counter() - started,
        "config": config,
        "environment": environment(device),
    }
    write_json_atomic(out_dir / REPORT_NAME, report)
    return report
