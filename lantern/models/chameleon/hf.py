"""Chameleon targets from HF ``ChameleonForConditionalGeneration`` folders (Anole: ``leloy/Anole-7b-v0.1-hf``).

A folder is ``config.json`` (transformers' ``ChameleonConfig``, with its ``vocabulary_map``), the weights
(``model.safetensors`` or shards listed in ``model.safetensors.index.json``) and the tokenizer
(``tokenizer.json``). It is checked before anything is built: the architecture, then the shapes the config
implies against every tensor under its own name (missing, unexpected and mis-shaped keys in one line).
``model.vqmodel.*`` (transformers' copy of the VQ encoder) belongs to the tokenizer, not the target: it is
set aside and returned for the tokenizer to check.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch

from lantern import checks
from lantern.errors import CheckpointError
from lantern.models.chameleon.model import ARCHITECTURE, ChameleonConfig, ChameleonTarget
from lantern.models.chameleon.vocab import read_layout
from lantern.models.checkpoint import check_family, check_shards, folder_source, load_folder_target, read_folder_config
from lantern.models.llama_parts import rope_theta_of

VQ_PREFIX = "model.vqmodel."


def config_from_hf(config: Mapping, grid_size: int, cls_token_num: int, source: str) -> ChameleonConfig:
    """The :class:`ChameleonConfig` a folder's ``config.json`` describes; ``grid_size`` (image side in tokens)
    and ``cls_token_num`` (condition slots) come from the preset, as nothing in a folder says them."""
    check_family(config, "chameleon", ARCHITECTURE, source)
    for key, want in (("hidden_act", "silu"), ("attention_bias", False), ("mlp_bias", False)):
        if config.get(key, want) != want:
            raise CheckpointError(f"{source}: config.json has {key}={checks.shown(config[key])}, expected {want!r}")
    if config.get("tie_word_embeddings", False):
        raise CheckpointError(f"{source}: config.json ties lm_head to the embeddings; no Chameleon release does")
    vocab = config.get("vocabulary_map")
    if not isinstance(vocab, Mapping):
        raise CheckpointError(f"{source}: config.json has no vocabulary_map (transformers' ChameleonConfig has one)")
    try:
        sizes = {
            key: int(config[key])
            for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{source}: config.json lacks a size ({exc})") from exc
    layout = read_layout(vocab, source, config.get("bos_token_id"), config.get("pad_token_id"))
    return ChameleonConfig(
        n_layer=sizes["num_hidden_layers"],
        n_head=sizes["num_attention_heads"],
        n_kv_head=int(config.get("num_key_value_heads") or sizes["num_attention_heads"]),
        dim=sizes["hidden_size"],
        ffn_hidden=sizes["intermediate_size"],
        text_vocab_size=sizes["vocab_size"],
        norm_eps=float(config.get("rms_norm_eps", 1e-5)),
        rope_theta=rope_theta_of(config, source),
        swin_norm=bool(config.get("swin_norm", False)),
        grid_size=grid_size,
        cls_token_num=cls_token_num,
        **vars(layout),
    )


# transformers' ChameleonVQVAEConfig keys -> VQGANConfig fields (the VQ shape a folder's config.json states).
VQ_KEYS = {
    "embed_dim": "embed_dim",
    "num_embeddings": "num_embeddings",
    "latent_channels": "z_channels",
    "resolution": "resolution",
    "in_channels": "in_channels",
    "base_channels": "base_channels",
    "channel_multiplier": "channel_multiplier",
    "num_res_blocks": "num_res_blocks",
    "attn_resolutions": "attn_resolutions",
    "dropout": "dropout",
}


def folder_vq(folder: str | os.PathLike, preset: Mapping) -> dict:
    """The VQGAN's shape for ``folder``: its ``config.json`` ``vq_config`` (transformers' names), the preset's
    ``model.vq`` values only where the folder states none (a folder without ``vq_config``: the preset's)."""
    config, folder = read_folder_config(folder)
    stated = config.get("vq_config") or {}
    if not isinstance(stated, Mapping):
        raise CheckpointError(f"{folder_source(folder)}: config.json vq_config is not a mapping")
    return {**preset, **{ours: stated[key] for key, ours in VQ_KEYS.items() if stated.get(key) is not None}}


def check_vq_encoder(vqgan: torch.nn.Module, stated: Mapping[str, torch.Tensor], vq_source: str, source: str) -> None:
    """CheckpointError naming the first tensor (in name order) where the VQGAN of ``vq_source`` differs from the
    folder's own VQ encoder side (``model.vqmodel.*``, ``stated`` without the prefix): a ``vqgan.ckpt`` of the
    right shape from another model would give LANTERN's neighbours and the pixels another codebook."""
    ours = vqgan.state_dict()
    for name in sorted(stated):
        given = stated[name]
        mine = ours.get(name)
        if mine is None or mine.shape != given.shape or not torch.equal(mine.to(given.dtype), given):
            why = "is not in it" if mine is None else "differs"
            raise CheckpointError(
                f"{vq_source} is not this folder's VQGAN: {VQ_PREFIX}{name} of {source} {why} "
                f"(model.vq_ckpt must be the vqgan.ckpt released with model.gpt_ckpt)"
            )


def check_folder(folder: str | os.PathLike, grid_size: int, cls_token_num: int, convert=None) -> ChameleonConfig:
    """What can be checked before a large read: the config describes a Chameleon, and every shard its
    index names is there. Returns the target's config (passed through ``convert(config, config.json, source)``
    when given: a family variant's own ids)."""
    config, folder = read_folder_config(folder)
    model_config = config_from_hf(config, grid_size, cls_token_num, folder_source(folder))
    if convert is not None:
        model_config = convert(model_config, config, folder_source(folder))
    check_shards(folder)
    return model_config


def load_target(
    folder: str | os.PathLike, grid_size: int, cls_token_num: int, convert=None, target_class=ChameleonTarget
) -> tuple[ChameleonTarget, dict[str, torch.Tensor]]:
    """The target of ``folder``, strictly (fp32 on CPU), and the tensors under ``model.vqmodel.`` (its VQ
    encoder, without the prefix) for the tokenizer; noted as one input (role ``target``). ``convert`` and
    ``target_class``: a family variant's config (as :func:`check_folder`) and target (Lumina-mGPT's)."""
    config, folder = read_folder_config(folder)
    source = folder_source(folder)
    model_config = config_from_hf(config, grid_size, cls_token_num, source)
    if convert is not None:
        model_config = convert(model_config, config, source)
    what = f"a {ARCHITECTURE} of that config.json"
    return load_folder_target(folder, lambda: target_class(model_config), what, VQ_PREFIX)
