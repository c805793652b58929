"""A model bundle: target GPT + VQ tokenizer + conditioner, built from config and loaded from files.

The functions here are the only place model files are read; constructors stay free of I/O.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from lantern.errors import CheckpointError, ConfigError
from lantern.models.checkpoint import load_weights
from lantern.models.devices import resolve_device, resolve_dtype
from lantern.models.llamagen import hf_layout
from lantern.models.llamagen.gpt import Transformer, gpt_config
from lantern.models.llamagen.vq import VQModel, to_uint8, vq_config


@dataclass
class ModelBundle:
    """Everything needed to turn prompts into images."""

    name: str
    target: Transformer
    vq: VQModel
    conditioner: object  # ClassConditioner | TextConditioner
    device: torch.device

    @torch.inference_mode()
    def decode_images(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes (B, N) -> pixels (B, H, W, 3) uint8 (the VQ decoder runs in fp32).

        One image at a time: a CPU's convolution kernels round differently at different batch sizes (seen on
        AVX-512, tiny_random_c2i: one channel of one pixel of one image in four moved by 1 between batch 1 and
        batch 4), and an image must not change with the batch size.
        """
        return torch.cat([to_uint8(self.vq.decode_codes(codes[i : i + 1])) for i in range(codes.shape[0])])

    def save_target(self, folder: str | os.PathLike, dtype: torch.dtype = torch.float32) -> Path:
        """Write the target as the folder ``model.gpt_ckpt`` reads back (``scripts/export_hf.py``): here
        LlamaGen's, in the LANTERN release's names; a family's bundle writes its own layout."""
        return save_target_folder(self.target, folder, dtype)


def _build(gpt: Mapping, vq: Mapping) -> tuple[Transformer, VQModel, str]:
    vq_cfg = vq_config(vq["preset"], **dict(vq.get("overrides") or {}))
    gpt_cfg = gpt_config(
        gpt["preset"], gpt["model_type"], int(gpt["image_size"]), vq_cfg.downsample, **dict(gpt.get("overrides") or {})
    )
    if gpt_cfg.vocab_size != vq_cfg.codebook_size:
        raise ConfigError(
            f"GPT vocabulary {gpt_cfg.vocab_size} does not match the VQ codebook size {vq_cfg.codebook_size}"
        )
    return Transformer(gpt_cfg), VQModel(vq_cfg), f"{gpt['preset']} {gpt['model_type']}"


def _finish(name, gpt_model, vq_model, conditioner, device, dtype) -> ModelBundle:
    conditioner.check_model(gpt_model.config)
    gpt_model = gpt_model.to(device=device, dtype=dtype).eval()
    vq_model = vq_model.to(device=device).eval()
    return ModelBundle(name, gpt_model, vq_model, conditioner, device)


def _require_file(key: str, path, folders: bool = False) -> str:
    """``path`` as a string; CheckpointError unless it is a file (or, with ``folders``, an HF-layout folder)."""
    if folders and path is not None and os.path.isdir(os.fspath(path)):
        return os.fspath(hf_layout.check_folder(path))
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
    back (:func:`lantern.models.llamagen.hf_layout.save_target_folder`; the run wing reaches the family here)."""
    return hf_layout.save_target_folder(model, folder, dtype)


def load_bundle(
    name: str,
    gpt: Mapping,
    vq: Mapping,
    gpt_ckpt: str,
    vq_ckpt: str,
    conditioner: Callable,
    device: str = "cpu",
    dtype: str = "float32",
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
    return _finish(name, gpt_model, vq_model, conditioner, device, dtype)


def random_bundle(
    name: str,
    gpt: Mapping,
    vq: Mapping,
    conditioner: Callable,
    init_seed: int = 0,
    device: str = "cpu",
    dtype: str = "float32",
    gpt_ckpt: str | None = None,
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
    return _finish(name, gpt_model, vq_model, conditioner, device, dtype)


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


# ----- helpers the HF-folder families (Chameleon, Janus) share ------------------------------------------------
def finish_family_bundle(bundle_class, name, target, vq_model, conditioner, device, dtype) -> ModelBundle:
    """The conditioner checked against ``target``'s config, both models on ``device`` in eval mode (the target in
    ``dtype``, the tokenizer's VQ as it is), as a ``bundle_class`` (a :class:`ModelBundle`)."""
    conditioner.check_model(target.config)
    target = target.to(device=device, dtype=dtype).eval()
    return bundle_class(name, target, vq_model.to(device=device).eval(), conditioner, device)


def require_folder(gpt_ckpt, architecture: str, contents: str = "config.json, weights, tokenizer.json") -> str:
    """``model.gpt_ckpt`` as a string; CheckpointError unless it is a folder (of an HF ``architecture``)."""
    if gpt_ckpt is None or not os.path.isdir(os.fspath(gpt_ckpt)):
        raise CheckpointError(f"model.gpt_ckpt={gpt_ckpt!r}: expected the folder of a {architecture} ({contents})")
    return os.fspath(gpt_ckpt)


def family_drafter(config, path, name: str, init_seed: int = 0, device: str = "cpu", dtype: str = "float32"):
    """The drafter at ``path`` for a target of ``config`` (a folder or file, loaded strictly), or with no ``path``
    a seeded random one-layer drafter of the family's own kind (``config.drafter_arch()``)."""
    from lantern.models.drafter import Drafter, DrafterConfig, load_drafter_for

    if path is not None:
        return load_drafter_for(path, config, name, device, dtype)
    torch.manual_seed(init_seed)
    drafter = Drafter(DrafterConfig(config))
    return drafter.to(device=resolve_device(device), dtype=resolve_dtype(dtype)).eval()


def random_on_device(build: Callable[[], torch.nn.Module], device, dtype, init_seed: int = 0, std: float = 0.02):
    """``build()`` with random weights, made on the meta device and materialised on ``device`` directly in
    ``dtype``: a 7B model never exists in fp32 or on the host. Norm weights are 1, biases 0, every other
    parameter normal with ``std`` (drawn on ``device``); buffers a module recomputes in ``_apply`` (RoPE
    tables) are recomputed there. For timing, not quality (``scripts/gpu_check.py``). ``device="meta"`` stops
    before any memory is taken (what a preset's sizes come to, for checks)."""
    dtype = resolve_dtype(dtype)
    with torch.device("meta"):
        model = build().to(dtype=dtype)
    if str(device) == "meta":
        return model.eval()
    device = resolve_device(device)
    model = model.to_empty(device=device)
    generator = torch.Generator(device=device).manual_seed(init_seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                param.fill_(1.0)
            elif name.endswith("bias"):
                param.zero_()
            else:
                param.normal_(0.0, std, generator=generator)
    return model.eval()


@dataclass
class TimingParts:
    """What the GPU check times on a family preset: a random-weight target of the preset's architecture, a
    random one-layer drafter of the family's kind, prompt conditions of varied lengths and the codes' count."""

    target: torch.nn.Module
    drafter: torch.nn.Module
    conditions: list
    num_codes: int


def timing_parts(target_class, config, conditioner, device, dtype, init_seed: int = 0, count: int = 64) -> TimingParts:
    """:class:`TimingParts` for a ``target_class(config)`` whose prompts ``conditioner`` lays out (its
    ``random_condition``), on ``device`` in ``dtype``."""
    from lantern.models.drafter import Drafter, DrafterConfig

    target = random_on_device(lambda: target_class(config), device, dtype, init_seed)
    drafter = random_on_device(lambda: Drafter(DrafterConfig(config)), device, dtype, init_seed + 1)
    conditions = [conditioner.random_condition(i, config.text_vocab_size) for i in range(count)]
    return TimingParts(target, drafter, conditions, config.num_codes)
