"""The drafter factory's checks (:mod:`lantern.training.jobs.drafter`): its knobs, before anything is loaded, and
each stage's inputs, before its folder is locked or made (a refused command leaves the tree as it was)."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import torch
from omegaconf import DictConfig

from lantern import checks
from lantern.errors import ConfigError
from lantern.models.drafter import CONDITION_INPUTS
from lantern.training.checkpoint import CHECKPOINT_NAME, DEFAULT_RESUME_IGNORE, check_resume_config
from lantern.training.drafter_features import FEATURE_DTYPES
from lantern.training.loop import MAX_BATCH, check_trainer_knobs
from lantern.training.shards import ShardStore

STAGES = ("data", "features", "train", "export", "all")
DATA_KINDS = ("self", "images")
DRAFTER_KINDS = ("eagle", "eagle3")
# Settings that change nothing the drafter learns, so a resumed training may change them.
RESUME_IGNORE = (
    *DEFAULT_RESUME_IGNORE,
    "stage",
    "generation.batch_size",
    "features.batch_size",
    "eval_batch_size",
    "compare_with",
)


def check_config(cfg: DictConfig) -> None:
    """Every knob of the factory, before anything is loaded or written (one ConfigError naming the value)."""
    check_trainer_knobs(cfg)
    check_name("model.name", cfg.model.name, "out_dir's default folder")
    checks.choice("stage", cfg.stage, STAGES)
    checks.choice("data", cfg.data, DATA_KINDS)
    if cfg.data == "self" or cfg.num_samples is not None:
        checks.capped("num_samples", cfg.num_samples, 2, 10**7)
    checks.integer("generation.batch_size", cfg.generation.batch_size, 1)
    checks.integer("generation.seed", cfg.generation.seed, 0)
    checks.integer("features.batch_size", cfg.features.batch_size, 1)
    checks.choice("features.dtype", cfg.features.dtype, tuple(FEATURE_DTYPES))
    checks.probability("features.cond_dropout", cfg.features.cond_dropout)
    checks.real("held_out", cfg.held_out, 0, 1, low_open=True, high_open=True)
    drafter = cfg.drafter
    checks.choice("drafter.kind", drafter.kind, DRAFTER_KINDS)
    checks.integer("drafter.n_layer", drafter.n_layer, 1)
    checks.integer("drafter.ttt_steps", drafter.ttt_steps, 1)
    checks.real("drafter.noise", drafter.noise, 0)
    checks.real("drafter.feature_weight", drafter.feature_weight, 0)
    checks.real("drafter.ce_weight", drafter.ce_weight, 0)
    if drafter.taps is not None and not all(checks.is_number(t) and int(t) == t for t in drafter.taps):
        raise checks.refuse("drafter.taps", list(drafter.taps), "a list of layer indices or null")
    checks.capped("eval_batch_size", cfg.eval_batch_size, 1, MAX_BATCH)
    checks.capped("top_k", cfg.top_k, 1, 1000, note="the report's top-k agreement")
    checks.choice("compare_condition_input", cfg.compare_condition_input, CONDITION_INPUTS)
    if len(cfg.betas) != 2:
        raise checks.refuse("betas", list(cfg.betas), "two numbers in [0, 1)")
    for beta in cfg.betas:
        checks.real("betas", beta, 0, 1, high_open=True)


def check_name(key: str, value, where: str) -> str:
    """``value`` as a plain name (letters, digits, ``._-``; no ``..``, no separator, not absolute): a name
    that becomes a path (``where``) must stay inside its folder."""
    text = value if isinstance(value, str) else ""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", text) or ".." in text:
        raise checks.refuse(key, value, "a plain name (letters, digits, '.', '_', '-'; no '..' or '/')", where)
    return text


def require(store: ShardStore, rows: int, stage: str) -> None:
    """Refuse a later stage while ``store`` holds fewer than ``rows`` rows."""
    if store.rows < rows:
        raise ConfigError(
            f"{str(store.folder)!r} holds {store.rows} of {rows} rows: run stage={stage} (or stage=all) first"
        )


def trained_weights(out_dir: Path, steps: int) -> Path:
    """The trained weights file, refused unless it holds the weights of the last step."""
    from safetensors import safe_open

    weights = Path(out_dir) / "train" / "drafter.safetensors"
    if not weights.is_file():
        raise ConfigError(f"{str(weights)!r} is missing: run stage=train (or stage=all) first")
    with safe_open(str(weights), framework="pt") as handle:
        step = (handle.metadata() or {}).get("step")
    if step != str(int(steps)):
        raise ConfigError(
            f"{str(weights)!r} holds the weights of step {step}, not of steps={steps}: "
            "run stage=train (or stage=all) to finish training first"
        )
    return weights


def check_ready(factory) -> None:
    """Refuse a stage whose inputs are not there yet, or a resume under other settings, before the folder is
    locked or anything written (``factory``: :class:`lantern.training.jobs.drafter.Factory`)."""
    cfg, size = factory.cfg, factory.world.size
    if cfg.stage in ("train", "all") and int(cfg.batch_size) % size:
        raise checks.refuse("batch_size", cfg.batch_size, f"a multiple of the {size} torchrun processes")
    if cfg.stage == "features":
        require(factory.data, factory.total_rows, "data")
    if cfg.stage in ("train", "export"):
        require(factory.features, factory.total_rows, "features")
    if cfg.stage == "export":
        trained_weights(factory.out_dir, cfg.steps)
    checkpoint = factory.out_dir / "train" / CHECKPOINT_NAME
    if cfg.stage == "train" and checkpoint.is_file():  # stage=all extends data and features first, then refuses
        saved = None
        with contextlib.suppress(Exception):  # an unreadable checkpoint: the trainer names the fault
            saved = torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True).get("config")
        check_resume_config(checkpoint, saved, factory.train_config(), RESUME_IGNORE)
