"""The bundle protocol: a family's target, its image tokenizer and its prompt conditioner, and the helpers
every family's loaders share.

A family builds its bundles in its own folder (``llamagen/bundle.py``, ``chameleon/bundle.py``,
``janus/bundle.py``); those loaders are the only place model files are read, and constructors stay free of
I/O. Nothing here names a family: the bundle is typed by :class:`~lantern.models.target.Target` and
:class:`ImageTokenizer`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from lantern.errors import CheckpointError, ConfigError
from lantern.models.devices import resolve_device, resolve_dtype
from lantern.models.target import Target


class ImageTokenizer(Protocol):
    """What a bundle asks of a family's image tokenizer (its VQ)."""

    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes (B, N) -> images (B, 3, H, W), about [-1, 1]."""
        ...

    def raw_codebook(self) -> torch.Tensor:
        """The codebook's stored rows (K, D), code ``c`` being row ``c`` (not normalised)."""
        ...


def to_uint8(images: torch.Tensor) -> torch.Tensor:
    """Decoder output (B, 3, H, W) ~[-1, 1] -> pixels (B, H, W, 3) uint8 via clamp(127.5*x + 128, 0, 255)."""
    if images.ndim != 4:
        raise ConfigError(f"to_uint8 expects (B, C, H, W) images, got {tuple(images.shape)}")
    pixels = torch.clamp(127.5 * images.float() + 128.0, 0.0, 255.0)
    return pixels.permute(0, 2, 3, 1).to(torch.uint8)  # truncation toward zero, as LlamaGen's sample scripts


@dataclass
class ModelBundle:
    """Everything needed to turn prompts into images. A family subclasses it where its pixels or its folder
    differ (:meth:`decode_images`, :meth:`save_target`)."""

    name: str
    target: Target
    vq: ImageTokenizer
    conditioner: object  # ClassConditioner | TextConditioner | a family's prompt conditioner
    device: torch.device

    @torch.inference_mode()
    def decode_images(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes (B, N) -> pixels (B, H, W, 3) uint8 (the VQ decoder runs in fp32).

        One image at a time: a CPU's convolution kernels round differently at different batch sizes (seen on
        AVX-512, tiny_random_c2i: one channel of one pixel of one image in four moved by 1 between batch 1 and
        batch 4), and an image must not change with the batch size.
        """
        return torch.cat([to_uint8(self.vq.decode_codes(codes[i : i + 1])) for i in range(codes.shape[0])])

    def codebook(self) -> torch.Tensor:
        """The tokenizer's codebook rows (K, D), detached: what neighbour tables are built over, for any family."""
        return self.vq.raw_codebook().detach()

    def save_target(self, folder: str | os.PathLike, dtype: torch.dtype = torch.float32) -> Path:
        """Write the target as the folder ``model.gpt_ckpt`` reads back (``scripts/export_hf.py``); a family's
        bundle writes its own layout, and one that has none refuses."""
        raise ConfigError(f"model={self.name}: this family's bundle writes no target folder")


# ----- helpers every family's loaders share -----------------------------------------------------
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


def drafterless_decoders() -> list[str]:
    """The decoders that need no drafter: the options of ``conf/decoding`` whose ``decoding`` node has no
    ``drafter`` key (the run hands the model's drafter only to a decoder that has one,
    :func:`lantern.run.compose.build_decoder`)."""
    import yaml

    from lantern import REPO_ROOT

    names = []
    for path in sorted((REPO_ROOT / "conf" / "decoding").glob("*.yaml")):
        node = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("decoding")
        if isinstance(node, dict) and "drafter" not in node:
            names.append(path.stem)
    return names


def require_drafter(path, where: str) -> None:
    """ConfigError when no drafter is given: ``where`` says what this family's ``model.drafter_ckpt`` may be; the
    message names the decoders that need none (:func:`drafterless_decoders`)."""
    if path is None:
        names = drafterless_decoders()
        listed = ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else "".join(names)
        raise ConfigError(
            f"no drafter checkpoint given: pass model.drafter_ckpt=PATH ({where}); decoding={listed} need no drafter"
        )


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


def timing_parts(
    target_class, config, conditioner_class, device, dtype, init_seed: int = 0, count: int = 64
) -> TimingParts:
    """:class:`TimingParts` for a ``target_class(config)`` whose prompts a ``conditioner_class`` (a
    :class:`~lantern.models.prompt_ids.PromptConditioner`) lays out, on ``device`` in ``dtype``."""
    from lantern.models.drafter import Drafter, DrafterConfig

    conditioner = conditioner_class.for_model(None, config, device=device)
    target = random_on_device(lambda: target_class(config), device, dtype, init_seed)
    drafter = random_on_device(lambda: Drafter(DrafterConfig(config)), device, dtype, init_seed + 1)
    conditions = [conditioner.random_condition(i, config.text_vocab_size) for i in range(count)]
    return TimingParts(target, drafter, conditions, config.num_codes)
