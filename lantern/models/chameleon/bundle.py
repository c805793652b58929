"""Chameleon bundles (target + VQGAN + prompt conditioner) and their drafters, built from a preset's nodes.

``target`` nodes: for a folder, ``image_size`` and ``cls_token_num`` (nothing in a folder says them); for the
seeded random preset also the architecture (``n_layer``, ``n_head``, ``dim``, ``ffn_hidden``, ``num_codes``,
``words``). ``vq`` nodes are :class:`~lantern.models.chameleon.vqgan.VQGANConfig`'s fields.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch

from lantern import checks
from lantern.errors import CheckpointError, ConfigError
from lantern.models.bundle import family_drafter, finish_family_bundle, require_drafter, require_folder, timing_parts
from lantern.models.chameleon import hf
from lantern.models.chameleon.condition import ChameleonConditioner
from lantern.models.chameleon.folder import ChameleonBundle
from lantern.models.chameleon.model import ChameleonConfig, ChameleonTarget
from lantern.models.chameleon.vocab import TINY_WORDS, read_layout, tiny_vocabulary, word_tokenizer
from lantern.models.chameleon.vqgan import ChameleonVQGAN, VQGANConfig
from lantern.models.checkpoint import check_state_dict, read_state_dict, tokenizer_file
from lantern.models.devices import resolve_device, resolve_dtype
from lantern.models.drafter import load_drafter_for
from lantern.models.dry import dry_twin, family_twin
from lantern.models.llama_parts import random_prompted_target
from lantern.models.prompt_ids import load_tokenizer


def vq_config(vq: Mapping) -> VQGANConfig:
    return VQGANConfig(**dict(vq))


def _grid(target: Mapping, vq: VQGANConfig) -> int:
    size = checks.integer("model.image_size", target["image_size"], 1)
    if size % vq.downsample:
        raise ConfigError(f"image_size {size} is not a multiple of the VQGAN's {vq.downsample}x downsample")
    if size != vq.resolution:
        raise ConfigError(f"image_size {size} is not the VQGAN's resolution {vq.resolution} (model.vq.resolution)")
    return size // vq.downsample


def random_config(target: Mapping, vq: VQGANConfig) -> tuple[ChameleonConfig, dict[str, int]]:
    """The seeded random preset's architecture and its vocabulary (``tiny_vocabulary``)."""
    num_codes = checks.integer("model.target.num_codes", target["num_codes"], 1)
    if num_codes != vq.num_embeddings:
        raise ConfigError(f"{num_codes} image codes do not match the VQGAN's {vq.num_embeddings}")
    vocab = tiny_vocabulary(num_codes, tuple(target.get("words") or TINY_WORDS))
    layout = read_layout(vocab, "the random preset's vocabulary")
    config = ChameleonConfig(
        **ChameleonConfig.node_sizes(target, len(vocab)),
        grid_size=_grid(target, vq),
        cls_token_num=target["cls_token_num"],
        **vars(layout),
    )
    return config, vocab


def random_vqgan(vq: VQGANConfig, init_seed: int = 0) -> ChameleonVQGAN:
    torch.manual_seed(init_seed + 1)
    return ChameleonVQGAN(vq)


def load_vqgan(path: str | os.PathLike, vq: VQGANConfig) -> ChameleonVQGAN:
    """Meta's ``vqgan.ckpt`` (``{"state_dict": ...}``) strictly; the taming training's ``loss.*`` tensors
    (discriminator, perceptual net) are not part of the tokenizer and are set aside."""
    state = read_state_dict(path, "tokenizer")
    state = {k: v for k, v in state.items() if not k.startswith("loss.")}
    model = ChameleonVQGAN(vq)
    check_state_dict(model, state, "Chameleon's VQGAN (vqgan.yaml)", os.fspath(path))
    model.load_state_dict(state, strict=True)
    return model


def _random(node: Mapping) -> ChameleonConfig:
    """``config_of`` of the random preset's dry twins: its config, nothing built."""
    return random_config(node["target"], vq_config(node["vq"]))[0]


def _slots(node: Mapping) -> None:
    """``config_of`` of a folder preset's dry twins: what the node states (the folder says the rest)."""
    checks.integer("model.cls_token_num", node["target"]["cls_token_num"], 2)


TEMPLATES = {"template": ChameleonConditioner.templates}
DRAFTERS = "LANTERN's jadohu/anole_drafter folder, or one scripts/train_drafter.py exported"


@dry_twin(family_twin("model.bundle", _random, paths=("gpt_ckpt",), choices=TEMPLATES))
def random_bundle(
    name: str,
    target: Mapping,
    vq: Mapping,
    init_seed: int = 0,
    template: str = "anole",
    device: str = "cpu",
    dtype: str = "float32",
    gpt_ckpt: str | None = None,
    config_of=None,
    convert=None,
    target_class=ChameleonTarget,
    conditioner_class=ChameleonConditioner,
) -> ChameleonBundle:
    """The seeded random tiny Chameleon (no files): target, VQGAN and a word-level tokenizer over its
    vocabulary. ``gpt_ckpt`` (an HF folder of the same architecture), when given, replaces the target.
    ``config_of`` (the random config and vocabulary, default :func:`random_config`), ``convert``,
    ``target_class`` and ``conditioner_class``: a family variant's (Lumina-mGPT's)."""
    device, dtype = resolve_device(device), resolve_dtype(dtype)
    vq_cfg = vq_config(vq)
    config, vocab = (config_of or random_config)(target, vq_cfg)
    model = random_prompted_target(target_class, config, init_seed)
    if gpt_ckpt is not None:
        loaded, _ = hf.load_target(gpt_ckpt, config.grid_size, config.cls_token_num, convert, target_class)
        if loaded.config != config:
            raise CheckpointError(f"HF folder {os.fspath(gpt_ckpt)!r} is not the random preset's architecture")
        model = loaded
    conditioner = conditioner_class.for_model(word_tokenizer(vocab), config, template, device)
    return finish_family_bundle(
        ChameleonBundle, name, model, random_vqgan(vq_cfg, init_seed), conditioner, device, dtype
    )


@dry_twin(family_twin("model.bundle", _slots, paths=("gpt_ckpt", "vq_ckpt"), choices=TEMPLATES))
def load_bundle(
    name: str,
    gpt_ckpt: str | None,
    vq_ckpt: str | None,
    target: Mapping,
    vq: Mapping,
    template: str = "anole",
    device: str = "cpu",
    dtype: str = "float32",
    convert=None,
    target_class=ChameleonTarget,
    conditioner_class=ChameleonConditioner,
) -> ChameleonBundle:
    """A Chameleon target from an HF folder (``model.gpt_ckpt``) with Meta's VQGAN (``model.vq_ckpt``,
    ``vqgan.ckpt``, its shape from the folder's ``vq_config``, ``vq`` the defaults; its encoder side must equal
    the folder's ``model.vqmodel.*``) and the folder's tokenizer. ``convert``, ``target_class`` and ``conditioner_class``: a
    family variant's (Lumina-mGPT's, :mod:`lantern.models.chameleon.lumina_bundle`)."""
    require_folder(gpt_ckpt, hf.ARCHITECTURE)
    device, dtype = resolve_device(device), resolve_dtype(dtype)
    vq_cfg = vq_config(hf.folder_vq(gpt_ckpt, vq))  # the folder's vq_config, the preset's values as default
    cls_token_num = checks.integer("model.cls_token_num", target["cls_token_num"], 2)
    grid = _grid(target, vq_cfg)
    # Before any large read: another architecture, a missing shard, codes the VQGAN does not have.
    config = hf.check_folder(gpt_ckpt, grid, cls_token_num, convert)
    if config.num_codes != vq_cfg.num_embeddings:
        raise CheckpointError(
            f"the folder's {config.num_codes} image tokens do not match the VQGAN's {vq_cfg.num_embeddings} codes"
        )
    tokenizer = load_tokenizer(tokenizer_file(gpt_ckpt))
    if vq_ckpt is None or not os.path.isfile(os.fspath(vq_ckpt)):
        raise CheckpointError(f"model.vq_ckpt={vq_ckpt!r}: expected Chameleon's vqgan.ckpt")
    vq_model = load_vqgan(vq_ckpt, vq_cfg)
    model, stated = hf.load_target(gpt_ckpt, grid, cls_token_num, convert, target_class)
    hf.check_vq_encoder(vq_model, stated, os.fspath(vq_ckpt), os.fspath(gpt_ckpt))
    conditioner = conditioner_class.for_model(tokenizer, model.config, template, device)
    return finish_family_bundle(ChameleonBundle, name, model, vq_model, conditioner, device, dtype)


# ----- drafters and neighbours -----------------------------------------------------------------------------
@dry_twin(family_twin("model.drafter", _random, paths=("path",)))
def random_drafter(target, vq, init_seed=0, device="cpu", dtype="float32", path=None, name="tiny_random_chameleon"):
    """A seeded random one-layer drafter for the random preset (speculative smoke runs and tests), or, when
    ``path`` is given, the drafter loaded from it (an HF folder in ``jadohu/anole_drafter``'s layout, e.g. one
    ``scripts/train_drafter.py`` exported, or the trainer's ``drafter.safetensors``). Either way a drafter of
    Chameleon's own layer and 1D RoPE (:class:`~lantern.models.chameleon.model.ChameleonDrafterArch`)."""
    return family_drafter(random_config(target, vq_config(vq))[0], path, name, init_seed, device, dtype)


@dry_twin(family_twin("model.drafter", _slots, paths=("path", "gpt_ckpt"), drafter=DRAFTERS))
def load_drafter(path, gpt_ckpt, target: Mapping, vq: Mapping, device="cpu", dtype="float32", name="anole_7b"):
    """The drafter at ``path`` for the target folder ``gpt_ckpt`` (whose ``config.json`` alone is read here):
    LANTERN's ``jadohu/anole_drafter`` folder or one ``scripts/train_drafter.py`` exported."""
    require_drafter(path, DRAFTERS)
    require_folder(gpt_ckpt, hf.ARCHITECTURE)
    cls_token_num = checks.integer("model.cls_token_num", target["cls_token_num"], 2)
    config = hf.check_folder(gpt_ckpt, _grid(target, vq_config(vq)), cls_token_num)
    return load_drafter_for(path, config, name, device, dtype)


@dry_twin(family_twin("model.neighbours.codebook", lambda node: vq_config(node["vq"])))
def random_codebook(vq: Mapping, init_seed: int = 0) -> torch.Tensor:
    """The random preset's VQGAN codebook (K, D): LANTERN's neighbour tables over the codes (code c is the
    decoder's token c, so the table needs no id map)."""
    return random_vqgan(vq_config(vq), init_seed).raw_codebook().detach()


# ----- timing (scripts/gpu_check.py) ------------------------------------------------------------------------
def timing_config(architecture: Mapping | None, target: Mapping, vq: Mapping) -> ChameleonConfig:
    """The config :func:`timing` builds its target of (the fields of :class:`ChameleonConfig` but ``grid_size``
    and ``cls_token_num``, which ``target`` and ``vq`` give; ``architecture`` null: the random preset's own)."""
    vq_cfg = vq_config(vq)
    if architecture is None:
        return random_config(target, vq_cfg)[0]
    return ChameleonConfig.for_architecture(architecture, target, _grid(target, vq_cfg))


@dry_twin(family_twin("model.timing", lambda node: timing_config(node.get("architecture"), node["target"], node["vq"])))
def timing(architecture: Mapping | None, target: Mapping, vq: Mapping, device="cpu", dtype="float32", init_seed=0):
    """Random-weight parts of a preset for the GPU check: a target of :func:`timing_config` and a one-layer
    drafter, both made directly on ``device`` in ``dtype``."""
    config = timing_config(architecture, target, vq)
    return timing_parts(ChameleonTarget, config, ChameleonConditioner, device, dtype, init_seed)
