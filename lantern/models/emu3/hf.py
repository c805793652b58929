"""Emu3 targets and tokenizers from HF ``Emu3ForConditionalGeneration`` folders (BAAI/Emu3-Gen as transformers
converts it: ``config.json`` with ``text_config``, ``vq_config`` and ``vocabulary_map``; ``model.safetensors`` or
shards with their index; ``tokenizer.json``).

A folder is checked before anything large is read: the architecture (``model_type`` ``emu3``), the sizes, the
vocabulary's visual tokens and special tokens, every shard its index names. Then the target loads strictly under
its own names (``model.text_model.*``, ``lm_head``; stored by transformers 5 as ``text_model.model.*``,
``text_model.lm_head``) and the VQ from ``model.vqmodel.*`` (stored ``vqmodel.*``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch

from lantern import checks
from lantern.errors import CheckpointError
from lantern.models.checkpoint import check_shards, folder_source, load_folder_target, read_folder_config
from lantern.models.emu3.condition import negative_ids
from lantern.models.emu3.model import ARCHITECTURE, Emu3Config, Emu3Target
from lantern.models.emu3.vocab import read_layout
from lantern.models.llama_parts import rope_theta_of

VQ_PREFIX = "model.vqmodel."
# transformers 5 writes an Emu3ForConditionalGeneration in the original checkpoint's names; the model's own are
# read as they are.
STORED = (("text_model.model.", "model.text_model."), ("text_model.lm_head.", "lm_head."), ("vqmodel.", VQ_PREFIX))
SIZES = ("num_hidden_layers", "num_attention_heads", "hidden_size", "intermediate_size", "vocab_size")


def sections(config: Mapping, source: str) -> tuple[Mapping, Mapping, Mapping]:
    """The folder's ``text_config``, ``vq_config`` and ``vocabulary_map``; CheckpointError unless it is an Emu3."""
    if config.get("model_type") != "emu3":
        found = ", ".join(map(str, config.get("architectures") or [])) or "no architecture"
        raise CheckpointError(
            f"{source} holds {found} (model_type {config.get('model_type')!r}), not an {ARCHITECTURE}"
        )
    parts = tuple(config.get(key) for key in ("text_config", "vq_config", "vocabulary_map"))
    if not all(isinstance(part, Mapping) for part in parts):
        raise CheckpointError(f"{source}: config.json lacks text_config, vq_config or vocabulary_map")
    return parts


def config_from_hf(config: Mapping, grid_size: int, cls_token_num: int, tokenizer, source: str) -> Emu3Config:
    """The :class:`Emu3Config` a folder's ``config.json`` describes; ``grid_size`` and ``cls_token_num`` come from
    the preset, CFG's negative prompt is tokenised by ``tokenizer``."""
    text, _, vocab = sections(config, source)
    for key, want in (("hidden_act", "silu"), ("attention_bias", False), ("mlp_bias", False)):
        if text.get(key, want) != want:
            raise CheckpointError(f"{source}: text_config has {key}={checks.shown(text[key])}, expected {want!r}")
    if config.get("tie_word_embeddings", False) or text.get("tie_word_embeddings", False):
        raise CheckpointError(f"{source}: config.json ties lm_head to the embeddings; no Emu3 release does")
    try:
        n_layer, heads, dim, ffn, vocab_size = (int(text[key]) for key in SIZES)
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{source}: text_config lacks a size ({exc})") from exc
    if text.get("head_dim") not in (None, dim // heads):
        raise CheckpointError(f"{source}: text_config has head_dim={text['head_dim']}, expected {dim // heads}")
    layout = read_layout(vocab, source)
    return Emu3Config(
        n_layer=n_layer,
        n_head=heads,
        n_kv_head=int(text.get("num_key_value_heads") or heads),
        dim=dim,
        ffn_hidden=ffn,
        text_vocab_size=vocab_size,
        norm_eps=float(text.get("rms_norm_eps", 1e-5)),
        rope_theta=rope_theta_of(text, source),
        grid_size=grid_size,
        cls_token_num=cls_token_num,
        null_ids=negative_ids(tokenizer, layout, grid_size),
        **layout,
    )


def check_folder(folder: str | os.PathLike, grid_size: int, cls_token_num: int, tokenizer) -> Emu3Config:
    """What can be checked before a large read (module docstring); the target's config."""
    config, folder = read_folder_config(folder)
    model_config = config_from_hf(config, grid_size, cls_token_num, tokenizer, folder_source(folder))
    check_shards(folder)
    return model_config


def vq_section(folder: str | os.PathLike) -> Mapping:
    """The folder's ``vq_config``."""
    config, folder = read_folder_config(folder)
    return sections(config, folder_source(folder))[1]


def in_memory_name(name: str) -> str:
    """A stored tensor name as the model's (``text_model.model.X`` -> ``model.text_model.X``, ...)."""
    for stored, own in STORED:
        if name.startswith(stored):
            return own + name[len(stored) :]
    return name


def load_target(folder: str | os.PathLike, config: Emu3Config) -> tuple[Emu3Target, dict[str, torch.Tensor]]:
    """The target of ``folder`` for ``config`` (:func:`check_folder`'s), strictly (fp32 on CPU), and the VQ's
    tensors (without ``model.vqmodel.``); noted as one input (role ``target``)."""
    _, folder = read_folder_config(folder)
    what = f"an {ARCHITECTURE} of that config.json"
    return load_folder_target(folder, lambda: Emu3Target(config), what, VQ_PREFIX, rename=in_memory_name)
