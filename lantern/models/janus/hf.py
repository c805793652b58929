"""Janus targets from HF ``JanusForConditionalGeneration`` folders (``deepseek-community/Janus-Pro-1B`` / ``-7B``:
DeepSeek's releases converted by transformers' ``convert_janus_weights_to_hf.py``).

A folder is ``config.json`` (transformers' ``JanusConfig``: ``text_config`` a Llama, ``vq_config``,
``vision_config``), the weights (``model.safetensors`` or shards listed in ``model.safetensors.index.json``) and
``tokenizer.json``. It is checked before anything is built: the architecture, the shards its index names, the
special tokens in the tokenizer; then the shapes the config implies against every tensor under its own name
(missing, unexpected and mis-shaped keys in one line). Tensors the image generation path does not run are set
aside by prefix: ``model.vqmodel.*`` (the VQ, returned for the tokenizer to check and load),
``model.vision_model.*`` and ``model.aligner.*`` (the understanding path) and ``lm_head.*`` (the text head).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import torch

from lantern import checks
from lantern.errors import CheckpointError
from lantern.models.checkpoint import check_family, check_shards, folder_source, load_folder_target, read_folder_config
from lantern.models.janus.model import ARCHITECTURE, JanusConfig, JanusTarget
from lantern.models.llama_parts import rope_theta_of

VQ_PREFIX = "model.vqmodel."
SET_ASIDE = ("model.vision_model.", "model.aligner.", "lm_head.")  # understanding path and text head
# Special tokens, by name as DeepSeek's VLChatProcessor and transformers' JanusProcessor find them.
BOS, PAD, BOI = "<｜begin▁of▁sentence｜>", "<｜▁pad▁｜>", "<begin_of_image>"


def _sizes(config: Mapping, keys: tuple[str, ...], source: str, where: str) -> dict[str, int]:
    try:
        return {key: int(config[key]) for key in keys}
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{source}: config.json {where} lacks a size ({exc})") from exc


def architecture_check(config: Mapping, source: str) -> tuple[Mapping, Mapping]:
    """The folder's ``text_config`` and ``vq_config``; CheckpointError unless it is a Janus."""
    check_family(config, "janus", ARCHITECTURE, source)
    text, vq = config.get("text_config"), config.get("vq_config")
    if not isinstance(text, Mapping) or not isinstance(vq, Mapping):
        raise CheckpointError(
            f"{source}: config.json has no text_config / vq_config (transformers' JanusConfig has both)"
        )
    return text, vq


def config_from_hf(
    config: Mapping, special: Mapping[str, int], grid_size: int, cls_token_num: int, source: str
) -> JanusConfig:
    """The :class:`JanusConfig` a folder's ``config.json`` describes; ``special`` the ids of BOS, pad and BOI
    (:func:`special_ids`); ``grid_size`` and ``cls_token_num`` from the preset."""
    text, vq = architecture_check(config, source)
    if text.get("model_type", "llama") != "llama":
        raise CheckpointError(f"{source}: text_config is a {text.get('model_type')!r}, expected a llama")
    for key, want in (("hidden_act", "silu"), ("attention_bias", False), ("mlp_bias", False)):
        if text.get(key, want) != want:
            raise CheckpointError(f"{source}: text_config has {key}={checks.shown(text[key])}, expected {want!r}")
    if vq.get("hidden_act", "gelu") != "gelu":
        raise CheckpointError(f"{source}: vq_config has hidden_act={checks.shown(vq['hidden_act'])}, expected 'gelu'")
    sizes = _sizes(
        text,
        ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"),
        source,
        "text_config",
    )
    dim, heads = sizes["hidden_size"], sizes["num_attention_heads"]
    if text.get("head_dim") not in (None, dim // heads):
        raise CheckpointError(f"{source}: text_config has head_dim={text['head_dim']}, expected {dim // heads}")
    vq_sizes = _sizes(vq, ("embed_dim", "num_embeddings"), source, "vq_config")
    for key in ("projection_dim", "image_token_embed_dim"):
        if int(vq.get(key, dim)) != dim:
            raise CheckpointError(
                f"{source}: vq_config has {key}={vq[key]}, expected the LM's hidden size {dim} "
                "(the aligner's output and the generation head's input are the LM's width)"
            )
    return JanusConfig(
        n_layer=sizes["num_hidden_layers"],
        n_head=heads,
        n_kv_head=int(text.get("num_key_value_heads") or heads),
        dim=dim,
        ffn_hidden=sizes["intermediate_size"],
        text_vocab_size=sizes["vocab_size"],
        num_codes=vq_sizes["num_embeddings"],
        code_dim=vq_sizes["embed_dim"],
        aligner_depth=int(vq.get("num_hidden_layers", 2)),
        norm_eps=float(text.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta_of(text, source),
        grid_size=grid_size,
        cls_token_num=cls_token_num,
        bos_id=special["bos_id"],
        pad_id=special["pad_id"],
        boi_id=special["boi_id"],
    )


def special_ids(tokenizer, source: str) -> dict[str, int]:
    """BOS, pad and BOI ids of a ``tokenizers`` Tokenizer, by name; one CheckpointError naming a missing one."""
    ids = {}
    for key, name in (("bos_id", BOS), ("pad_id", PAD), ("boi_id", BOI)):
        index = tokenizer.token_to_id(name)
        if index is None:
            raise CheckpointError(f"{source}: the tokenizer has no {name!r} token")
        ids[key] = int(index)
    return ids


def check_folder(folder: str | os.PathLike, grid_size: int, cls_token_num: int, tokenizer) -> JanusConfig:
    """What can be checked before a large read: a Janus config, every shard there, the special tokens."""
    config, folder = read_folder_config(folder)
    source = folder_source(folder)
    architecture_check(config, source)
    model_config = config_from_hf(config, special_ids(tokenizer, source), grid_size, cls_token_num, source)
    check_shards(folder)
    return model_config


def vq_section(folder: str | os.PathLike) -> Mapping:
    """The folder's ``vq_config``."""
    config, folder = read_folder_config(folder)
    return architecture_check(config, folder_source(folder))[1]


def load_target(folder: str | os.PathLike, config: JanusConfig) -> tuple[JanusTarget, dict[str, torch.Tensor]]:
    """The target of ``folder`` for ``config`` (:func:`check_folder`'s), strictly (fp32 on CPU), and the VQ's
    tensors (without ``model.vqmodel.``); noted as one input (role ``target``)."""
    build, what = (lambda: JanusTarget(config)), f"a {ARCHITECTURE} of that config.json"
    return load_folder_target(Path(folder), build, what, VQ_PREFIX, SET_ASIDE)
