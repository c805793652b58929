"""Janus bundles (target + VQ + prompt conditioner) and their drafters, built from a preset's nodes.

``target`` nodes: ``image_size`` and ``cls_token_num`` (nothing in a folder says the condition slots), for a
folder optionally ``architecture`` (sizes the folder must have: a 1B preset refuses a 7B folder), for the seeded
random preset the architecture itself (``n_layer``, ``n_head``, ``dim``, ``ffn_hidden``, ``num_codes``,
``words``). ``vq`` nodes (random preset only; a folder's is its ``vq_config``) take transformers'
``JanusVQVAEConfig`` keys (:func:`lantern.models.janus.vq.vq_config`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from lantern import checks
from lantern.errors import CheckpointError, ConfigError
from lantern.models.bundle import (
    ModelBundle,
    family_drafter,
    finish_family_bundle,
    require_drafter,
    require_folder,
    timing_parts,
)
from lantern.models.checkpoint import read_tensor, tokenizer_file
from lantern.models.devices import resolve_device, resolve_dtype
from lantern.models.drafter import load_drafter_for
from lantern.models.dry import dry_twin, family_twin
from lantern.models.janus import hf
from lantern.models.janus.condition import TINY_WORDS, JanusConditioner, tiny_vocabulary, word_tokenizer
from lantern.models.janus.model import JanusConfig, JanusTarget
from lantern.models.janus.vq import load_vq, random_vq, vq_config
from lantern.models.llama_parts import seeded_weights
from lantern.models.prompt_ids import load_tokenizer
from lantern.models.vq_model import VQConfig

CODEBOOK_KEY = hf.VQ_PREFIX + "quantize.embedding.weight"
# The sizes a folder preset's ``target.architecture`` may require of its folder.
ARCHITECTURE_KEYS = ("n_layer", "n_head", "n_kv_head", "dim", "ffn_hidden", "num_codes", "code_dim", "text_vocab_size")


@dataclass
class JanusBundle(ModelBundle):
    """A :class:`ModelBundle` whose pixels are DeepSeek's: ``clip((x + 1) / 2 * 255, 0, 255)`` truncated to
    uint8 (``generation_inference.py``), not LlamaGen's ``127.5 x + 128``."""

    @torch.inference_mode()
    def decode_images(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes (B, N) -> pixels (B, H, W, 3) uint8, one image at a time (see :meth:`ModelBundle.decode_images`)."""
        images = [self.vq.decode_codes(codes[i : i + 1]).float() for i in range(codes.shape[0])]
        pixels = torch.clamp((torch.cat(images) + 1) / 2 * 255, 0, 255)
        return pixels.permute(0, 2, 3, 1).to(torch.uint8)

    def save_target(self, folder, dtype: torch.dtype = torch.float32):
        """Refused: a target keeps only a folder's generation path (the understanding encoder, aligner and text
        head are set aside when it is read); the presets say so (``target_export_refused``), and
        ``scripts/export_hf.py`` refuses before building anything."""
        raise ConfigError(f"model={self.name}: a Janus target cannot be written back as a folder")


def _grid(target: Mapping, vq: VQConfig, patches: int | None = None) -> int:
    size = checks.integer("model.bundle.target.image_size", target["image_size"], 1)
    if size % vq.downsample:
        raise ConfigError(
            f"model.bundle.target.image_size={size}: expected a multiple of the VQ's {vq.downsample}x downsample"
        )
    grid = size // vq.downsample
    if patches is not None and grid != patches:
        raise ConfigError(
            f"model.bundle.target.image_size={size}: expected {patches * vq.downsample} (the folder's VQ decodes "
            f"{patches} x {patches} codes, vq_config.num_patches)"
        )
    return grid


def random_config(target: Mapping, vq: Mapping) -> tuple[JanusConfig, dict[str, int]]:
    """The seeded random preset's architecture and its vocabulary (:func:`tiny_vocabulary`)."""
    vq_cfg = vq_config(vq)
    num_codes = checks.integer("model.bundle.target.num_codes", target["num_codes"], 1)
    if num_codes != vq_cfg.codebook_size:
        raise ConfigError(f"{num_codes} image codes do not match the VQ's {vq_cfg.codebook_size}")
    vocab = tiny_vocabulary(tuple(target.get("words") or TINY_WORDS))
    config = JanusConfig(
        **JanusConfig.node_sizes(target, len(vocab)),
        num_codes=num_codes,
        code_dim=vq_cfg.codebook_embed_dim,
        grid_size=_grid(target, vq_cfg),
        cls_token_num=target["cls_token_num"],
        **hf.special_ids(word_tokenizer(vocab), "the random preset's vocabulary"),
    )
    return config, vocab


def random_target(config: JanusConfig, init_seed: int = 0) -> JanusTarget:
    """A seeded random target: weights and biases of std 0.2 (at transformers' 0.02 a tiny target's greedy
    decoding repeats one code), RMSNorm weights perturbed around 1 and generation embeddings of unit scale."""

    def law(name: str) -> tuple[float, float]:
        if name.endswith("norm.weight"):
            return 1.0, 0.1
        return 0.0, 1.0 if name == "model.generation_embeddings.weight" else 0.2

    return seeded_weights(JanusTarget(config), init_seed, law)


def _random(node: Mapping) -> JanusConfig:
    """``config_of`` of the random preset's dry twins: its config, nothing built."""
    return random_config(node["target"], node["vq"])[0]


def _slots(node: Mapping) -> None:
    """``config_of`` of a folder preset's dry twins: what the node states (the folder says the rest)."""
    target = node["target"]
    checks.integer("model.cls_token_num", target["cls_token_num"], 2)
    for key, want in dict(target.get("architecture") or {}).items():
        if key not in ARCHITECTURE_KEYS:
            expected = f"a size named one of {', '.join(ARCHITECTURE_KEYS)}"
            raise checks.refuse(f"model.bundle.target.architecture.{key}", want, expected)


TEMPLATES = {"template": JanusConditioner.templates}
DRAFTERS = "one scripts/train_drafter.py exported; none is released for Janus"


def _folder(gpt_ckpt) -> str:
    return require_folder(gpt_ckpt, hf.ARCHITECTURE, "config.json, safetensors weights, tokenizer.json")


@dry_twin(family_twin("model.bundle", _random, paths=("gpt_ckpt",), choices=TEMPLATES))
def random_bundle(
    name, target: Mapping, vq: Mapping, init_seed=0, template="janus_pro", device="cpu", dtype="float32", gpt_ckpt=None
) -> JanusBundle:
    """The seeded random tiny Janus (no files): target, VQ and a word-level tokenizer over its vocabulary.
    ``gpt_ckpt`` (an HF folder of the same architecture), when given, replaces the target."""
    device, dtype = resolve_device(device), resolve_dtype(dtype)
    config, vocab = random_config(target, vq)
    tokenizer = word_tokenizer(vocab)
    model = random_target(config, init_seed)
    if gpt_ckpt is not None:
        folder = _folder(gpt_ckpt)
        loaded = hf.check_folder(folder, config.grid_size, config.cls_token_num, tokenizer)
        if loaded != config:
            raise CheckpointError(f"HF folder {folder!r} is not the random preset's architecture")
        model, _ = hf.load_target(folder, loaded)
    conditioner = JanusConditioner.for_model(tokenizer, config, template, device)
    return finish_family_bundle(
        JanusBundle, name, model, random_vq(vq_config(vq), init_seed), conditioner, device, dtype
    )


def _check_architecture(config: JanusConfig, architecture: Mapping | None, folder: str) -> None:
    """CheckpointError unless the folder's config has the preset's ``architecture`` sizes."""
    for key, want in dict(architecture or {}).items():
        if key not in ARCHITECTURE_KEYS:
            raise checks.refuse(
                f"model.bundle.target.architecture.{key}", want, f"a size named one of {', '.join(ARCHITECTURE_KEYS)}"
            )
        have = getattr(config, key)
        if have != want:
            raise CheckpointError(
                f"HF folder {folder!r} has {key}={checks.shown(have)}, but this preset is for {key}={checks.shown(want)}"
            )


def _folder_parts(gpt_ckpt, target: Mapping):
    """Checks before any large read, then the folder's config, VQ config, tokenizer and path."""
    folder = _folder(gpt_ckpt)
    cls_token_num = checks.integer("model.cls_token_num", target["cls_token_num"], 2)
    vq_section = hf.vq_section(folder)
    vq_cfg = vq_config(vq_section)
    patches = vq_section.get("num_patches")
    grid = _grid(target, vq_cfg, None if patches is None else int(patches))
    tokenizer = load_tokenizer(tokenizer_file(folder))
    config = hf.check_folder(folder, grid, cls_token_num, tokenizer)
    _check_architecture(config, target.get("architecture"), folder)
    return config, vq_cfg, tokenizer, folder


@dry_twin(family_twin("model.bundle", _slots, paths=("gpt_ckpt",), choices=TEMPLATES))
def load_bundle(
    name: str, gpt_ckpt: str | None, target: Mapping, template="janus_pro", device="cpu", dtype="float32"
) -> JanusBundle:
    """A Janus target, its VQ (``model.vqmodel.*``) and its tokenizer from one HF folder (``model.gpt_ckpt``)."""
    device, dtype = resolve_device(device), resolve_dtype(dtype)
    config, vq_cfg, tokenizer, folder = _folder_parts(gpt_ckpt, target)
    model, vq_state = hf.load_target(folder, config)
    vq_model = load_vq(vq_state, vq_cfg, folder)
    conditioner = JanusConditioner.for_model(tokenizer, model.config, template, device)
    return finish_family_bundle(JanusBundle, name, model, vq_model, conditioner, device, dtype)


# ----- drafters and neighbours -----------------------------------------------------------------------------
@dry_twin(family_twin("model.drafter", _random, paths=("path",)))
def random_drafter(target, vq, init_seed=0, device="cpu", dtype="float32", path=None, name="tiny_random_janus"):
    """A seeded random one-layer drafter for the random preset, or, when ``path`` is given, the drafter loaded
    from it (a folder ``scripts/train_drafter.py`` exported, or the trainer's ``drafter.safetensors``)."""
    return family_drafter(random_config(target, vq)[0], path, name, init_seed, device, dtype)


@dry_twin(family_twin("model.drafter", _slots, paths=("path", "gpt_ckpt"), drafter=DRAFTERS))
def load_drafter(path, gpt_ckpt, target: Mapping, device: str = "cpu", dtype: str = "float32", name: str = "janus"):
    """The drafter at ``path`` for the target folder ``gpt_ckpt`` (whose config and tokenizer alone are read)."""
    require_drafter(path, DRAFTERS)
    config, _, _, _ = _folder_parts(gpt_ckpt, target)
    return load_drafter_for(path, config, name, device, dtype)


@dry_twin(family_twin("model.neighbours.codebook", lambda node: vq_config(node["vq"])))
def random_codebook(vq: Mapping, init_seed: int = 0) -> torch.Tensor:
    """The random preset's VQ codebook (K, 8), raw rows: LANTERN's neighbour tables over the codes."""
    return random_vq(vq_config(vq), init_seed).raw_codebook().detach()


@dry_twin(family_twin("model.neighbours.codebook", paths=("folder",)))
def folder_codebook(folder: str | os.PathLike) -> torch.Tensor:
    """A folder's VQ codebook (K, 8) (``model.vqmodel.quantize.embedding.weight``), read alone."""
    return read_tensor(_folder(folder), CODEBOOK_KEY).float()


# ----- timing (scripts/gpu_check.py) ------------------------------------------------------------------------
def timing_config(architecture: Mapping | None, target: Mapping, vq=None) -> JanusConfig:
    """The config :func:`timing` builds its target of (``vq`` null: the release's VQ-16)."""
    if architecture is None:
        return random_config(target, vq or {})[0]
    return JanusConfig.for_architecture(architecture, target, _grid(target, vq_config(vq or {})))


@dry_twin(
    family_twin("model.timing", lambda node: timing_config(node.get("architecture"), node["target"], node.get("vq")))
)
def timing(architecture: Mapping | None, target: Mapping, vq=None, device="cpu", dtype="float32", init_seed=0):
    """Random-weight parts of a preset for the GPU check: a target of ``architecture`` (the fields of
    :class:`JanusConfig` but ``grid_size`` and ``cls_token_num``, which ``target`` and ``vq`` give, ``vq``
    null the release's VQ-16; ``architecture`` null: the random preset's own) and a one-layer drafter, both
    made directly on ``device`` in ``dtype``."""
    config = timing_config(architecture, target, vq)
    return timing_parts(JanusTarget, config, JanusConditioner, device, dtype, init_seed)
