"""The drafter factory's knobs, checked before anything is loaded or written (:mod:`lantern.training.jobs.drafter`)."""

from __future__ import annotations

import re

from omegaconf import DictConfig

from lantern import checks
from lantern.training.drafter_features import FEATURE_DTYPES
from lantern.training.loop import check_trainer_knobs

STAGES = ("data", "features", "train", "export", "all")
DATA_KINDS = ("self", "images")
DRAFTER_KINDS = ("eagle", "eagle3")


def check_config(cfg: DictConfig) -> None:
    """Every knob of the factory, before anything is loaded or written (one ConfigError naming the value)."""
    check_trainer_knobs(cfg)
    check_name("model.name", cfg.model.name, "out_dir's default folder")
    checks.choice("stage", cfg.stage, STAGES)
    checks.choice("data", cfg.data, DATA_KINDS)
    if cfg.data == "self" or cfg.num_samples is not None:
        checks.integer("num_samples", cfg.num_samples, 2)
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
    checks.integer("eval_batch_size", cfg.eval_batch_size, 1)
    checks.integer("top_k", cfg.top_k, 1)
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
