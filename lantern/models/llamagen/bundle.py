"""LlamaGen bundles (GPT target + VQ tokenizer + conditioner), built from a preset's nodes and loaded from files.

``gpt`` nodes hold ``preset``, ``model_type``, ``image_size`` (and optional ``overrides``), ``vq`` nodes
``preset`` (and optional ``overrides``). Targets are read from a file in LlamaGen's formats or an HF-layout
folder in the LANTERN release's names (:mod:`lantern.models.llamagen.hf_layout`); tokenizers from a file.
The embedded world (:mod:`lantern.models.world.load`) is a LlamaGen bundle too.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from lantern import checks
from lantern.errors import CheckpointError, ConfigError
from lantern.models.bundle import ModelBundle, finish_family_bundle
from lantern.models.checkpoint import check_hf_folder, load_weights
from lantern.models.devices import resolve_device, resolve_dtype
from lantern.models.dry import dry_twin, family_twin, overrides_of
from lantern.models.llamagen import hf_layout
from lantern.models.llamagen.gpt import GPT_PRESETS, MODEL_TYPES, GPTConfig, Transformer, gpt_config
from lantern.models.vq_model import VQ_PRESETS, VQConfig, VQModel, vq_config


@dataclass
class LlamaGenBundle(ModelBundle):
    """A :class:`ModelBundle` of LlamaGen's: its target is written back as an HF-layout folder in the LANTERN
    release's names."""

    def save_target(self, folder: str | os.PathLike, dtype: torch.dtype = torch.float32) -> Path:
        """Write the target as the folder ``model.gpt_ckpt`` reads back (``scripts/export_hf.py``)."""
        return save_target_folder(self.target, folder, dtype)


def configs(gpt: Mapping, vq: Mapping) -> tuple[GPTConfig, VQConfig]:
    """The target's and the tokenizer's configs that preset nodes ``gpt`` / ``vq`` describe (the GPT's grid is
    the image size over the VQ's downsample)."""
    vq_cfg = vq_config(vq["preset"], **dict(vq.get("overrides") or {}))
    gpt_cfg = gpt_config(
        gpt["preset"], gpt["model_type"], int(gpt["image_size"]), vq_cfg.downsample, **dict(gpt.get("overrides") or {})
    )
    return gpt_cfg, vq_cfg


def _check_vocabulary(gpt_cfg: GPTConfig, vq_cfg: VQConfig) -> None:
    if gpt_cfg.vocab_size != vq_cfg.codebook_size:
        raise ConfigError(
            f"GPT vocabulary {gpt_cfg.vocab_size} does not match the VQ codebook size {vq_cfg.codebook_size}"
        )


def dry_config(prefix: str) -> Callable[[Mapping], GPTConfig]:
    """``config_of`` for the dry twins (:func:`lantern.models.dry.family_twin`) of a node at ``prefix`` holding
    ``gpt`` and ``vq`` preset nodes: their names and overrides checked by key, the vocabulary against the codebook."""

    def config_of(node: Mapping) -> GPTConfig:
        gpt, vq = node["gpt"], node["vq"]
        checks.choice(f"{prefix}.gpt.preset", gpt.get("preset"), GPT_PRESETS)
        checks.choice(f"{prefix}.gpt.model_type", gpt.get("model_type"), MODEL_TYPES)
        checks.choice(f"{prefix}.vq.preset", vq.get("preset"), VQ_PRESETS)
        overrides_of(f"{prefix}.gpt", gpt, (f.name for f in fields(GPTConfig)))
        overrides_of(f"{prefix}.vq", vq, (f.name for f in fields(VQConfig)))
        gpt_cfg, vq_cfg = configs(gpt, vq)
        try:
            _check_vocabulary(gpt_cfg, vq_cfg)
        except ConfigError as exc:
            raise ConfigError(f"{prefix}.gpt: {exc}") from None
        return gpt_cfg

    return config_of


def _build(gpt: Mapping, vq: Mapping) -> tuple[Transformer, VQModel, str]:
    gpt_cfg, vq_cfg = configs(gpt, vq)
    _check_vocabulary(gpt_cfg, vq_cfg)
    return Transformer(gpt_cfg), VQModel(vq_cfg), f"{gpt['preset']} {gpt['model_type']}"


def _require_file(key: str, path, folders: bool = False) -> str:
    """``path`` as a string; CheckpointError unless it is a file (or, with ``folders``, an HF-layout folder)."""
    if folders and path is not None and os.path.isdir(os.fspath(path)):
        return os.fspath(check_hf_folder(path))
    if path is None or not os.path.isfile(os.fspath(path)):
        raise CheckpointError(f"{key}: checkpoint file not found: {path!r}")
    return os.fspath(path)


def load_target(model: Transformer, path: str | os.PathLike, expected: str) -> Transformer:
    """Load the target's weights strictly from a file in LlamaGen's formats or from an HF-layout folder in
    the LANTERN release's names (:func:`lantern.models.llamagen.hf_layout.load_target_folder`)."""
    if os.path.isdir(path):
        return hf_layout.load_target_folder(model, path, expected)
    return load_weights(model, path, expected=expected, role="target")


def save_target_folder(model: Transformer, folder: str | os.PathLike, dtype: torch.dtype = torch.float32) -> Path:
    """Write the target as an HF-layout folder in the LANTERN release's names, which ``model.gpt_ckpt`` reads
    back (:func:`lantern.models.llamagen.hf_layout.save_target_folder`)."""
    return hf_layout.save_target_folder(model, folder, dtype)


@dry_twin(family_twin("model.bundle", dry_config("model.bundle"), paths=("gpt_ckpt", "vq_ckpt")))
def load_bundle(
    name: str,
    gpt: Mapping,
    vq: Mapping,
    gpt_ckpt: str,
    vq_ckpt: str,
    conditioner: Callable,
    device="cpu",
    dtype="float32",
) -> ModelBundle:
    """Build the configured architectures and load their weights strictly from ``gpt_ckpt`` / ``vq_ckpt``.

    ``gpt_ckpt`` is a file (``{"model": sd}``, a raw dict, safetensors) or an HF-layout folder in the LANTERN
    release's names. ``gpt`` holds ``preset``, ``model_type``, ``image_size`` (and optional ``overrides``);
    ``vq`` holds ``preset``; ``conditioner`` is called with ``device=`` and returns the prompt conditioner.
    """
    device, dtype = resolve_device(device), resolve_dtype(dtype)
    gpt_path = _require_file("model.gpt_ckpt", gpt_ckpt, folders=True)
    vq_path = _require_file("model.vq_ckpt", vq_ckpt)
    gpt_model, vq_model, label = _build(gpt, vq)
    conditioner = conditioner(device=device)  # before the large loads: a missing text encoder fails fast
    load_weights(vq_model, vq_path, expected=vq["preset"], role="tokenizer")
    load_target(gpt_model, gpt_path, label)
    return finish_family_bundle(LlamaGenBundle, name, gpt_model, vq_model, conditioner, device, dtype)


@dry_twin(family_twin("model.bundle", dry_config("model.bundle"), paths=("gpt_ckpt",)))
def random_bundle(
    name: str,
    gpt: Mapping,
    vq: Mapping,
    conditioner: Callable,
    init_seed=0,
    device="cpu",
    dtype="float32",
    gpt_ckpt=None,
) -> ModelBundle:
    """A bundle with randomly initialised weights (seeded): for tests, smoke runs and speed benchmarks.

    ``gpt_ckpt`` (a file or an HF-layout folder), when given, replaces the random GPT's weights; the
    tokenizer stays the seeded random one.
    """
    device, dtype = resolve_device(device), resolve_dtype(dtype)
    gpt_path = None if gpt_ckpt is None else _require_file("model.gpt_ckpt", gpt_ckpt, folders=True)
    torch.manual_seed(init_seed)
    gpt_model, _, label = _build(gpt, vq)
    vq_model = random_vq(vq, init_seed)
    conditioner = conditioner(device=device)
    if gpt_path is not None:
        load_target(gpt_model, gpt_path, label)
    return finish_family_bundle(LlamaGenBundle, name, gpt_model, vq_model, conditioner, device, dtype)


def random_vq(vq: Mapping, init_seed: int = 0) -> VQModel:
    """The seeded random tokenizer of :func:`random_bundle` (seed ``init_seed + 1``)."""
    torch.manual_seed(init_seed + 1)
    return VQModel(vq_config(vq["preset"], **dict(vq.get("overrides") or {})))


def random_gpt(preset: str, model_type: str, image_size: int, init_seed: int = 0, **overrides):
    """A seeded random LlamaGen target of a named preset (speed checks at real sizes, no files)."""
    torch.manual_seed(init_seed)
    return Transformer(gpt_config(preset, model_type, image_size, **overrides))


def load_vq(preset: str, path: str | os.PathLike, **overrides) -> VQModel:
    """A tokenizer of a named preset loaded strictly from ``path`` (its input noted as the tokenizer)."""
    return load_weights(VQModel(vq_config(preset, **overrides)), path, expected=preset, role="tokenizer").eval()


def _dry_codebook(vq: Mapping, init_seed: int = 0) -> None:
    """:func:`random_codebook`'s dry twin: the tokenizer's config, nothing built."""
    family_twin("model.neighbours.codebook")(vq=vq, init_seed=init_seed)
    checks.choice("model.neighbours.codebook.vq.preset", vq.get("preset"), VQ_PRESETS)
    vq_config(vq["preset"], **overrides_of("model.neighbours.codebook.vq", vq, (f.name for f in fields(VQConfig))))


@dry_twin(_dry_codebook)
def random_codebook(vq: Mapping, init_seed: int = 0) -> torch.Tensor:
    """The random preset's VQ codebook (K, D), raw rows: LANTERN's neighbour tables over the codes (what
    ``bundle.codebook()`` gives for :func:`random_bundle`'s tokenizer)."""
    return random_vq(vq, init_seed).raw_codebook().detach()
