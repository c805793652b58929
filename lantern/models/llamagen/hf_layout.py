"""LlamaGen targets and EAGLE-style drafters in the HF layout of LANTERN's releases, in both directions.

The LANTERN authors release LlamaGen as HF folders (``jadohu/LlamaGen-T2I``, ``jadohu/LlamaGen-T2I-2``:
their ``LlamaForCausalLM`` port, ``models/kv_variants/modeling_llamagen_kv.py``) and their drafters alike
(``jadohu/llamagen_drafter``, ``jadohu/llamagen2_drafter``: ``models/drafters/cnets_llamagen.py``'s
``Model``): a ``config.json`` and ``model.safetensors``, or shards listed in
``model.safetensors.index.json``. The names are HF Llama's with separate q/k/v projections. Our fused
``wqkv`` holds the rows ``[q | k | v]`` and both sides rotate LlamaGen's interleaved pairs (no half-split
RoPE, so unlike HF's own Llama conversion no q/k rows are permuted): converting is a renaming plus a split
or a concatenation of ``wqkv``, exact in both directions.

A folder is checked before anything is converted: its ``config.json`` against the preset's architecture
(one error naming the key, its value and the expected one), then its tensors under their HF names (one
error naming the missing, unexpected or mis-shaped keys), so a message speaks the folder's own names.
:mod:`lantern.models.llamagen.reference_layout` adds on top of this module what only the authors'
``generate()`` needs (its 120 condition slots).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import torch

from lantern.errors import CheckpointError, ConfigError
from lantern.models.checkpoint import check_family, check_folder_keys, check_shapes, read_folder, write_folder
from lantern.models.drafter import EMBED_KEY, own_keys

# LlamaGen's GPTConfig and Transformer (:mod:`lantern.models.llamagen.gpt`) are not imported here: gpt.py
# imports this module for its drafter arch's folder.
# LlamaGen's null class is trained by dropping labels at this rate; their LabelEmbedder only has the null
# row (num_classes + 1 rows, as our checkpoints) when the config's rate is > 0.
CLASS_DROPOUT = 0.1
# What a target or drafter folder's config.json names itself: HF Llama, both ways (checked on load).
ARCHITECTURE, MODEL_TYPE = "LlamaForCausalLM", "llama"
_LAYOUT = f"LlamaGen's HF layout ({ARCHITECTURE}, model_type {MODEL_TYPE!r})"

# Per-layer names, ours -> theirs (the q/k/v split of wqkv is done separately).
_LAYER_NAMES = {
    "attention.wo.weight": "self_attn.o_proj.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
_FROM_HF = {theirs: ours for ours, theirs in _LAYER_NAMES.items()}
_QKV = ("q", "k", "v")
_QKV_NAMES = {f"self_attn.{name}_proj.weight": name for name in _QKV}
# The target's other tensors, ours -> theirs (the condition embedder moves under ``model.`` unchanged).
_TARGET_NAMES = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_TARGET_FROM_HF = {theirs: ours for ours, theirs in _TARGET_NAMES.items()}


# ----- tensors ---------------------------------------------------------------------------------------
def layer_to_hf(key: str, value: torch.Tensor, prefix: str) -> dict[str, torch.Tensor]:
    """One of our ``layers.{i}.*`` tensors under their names (``prefix`` + ``layers.{i}.*``)."""
    _, index, rest = key.split(".", 2)
    head = f"{prefix}layers.{index}."
    if rest == "attention.wqkv.weight":  # (3D, D): rows [q | k | v]
        return {head + f"self_attn.{name}_proj.weight": part for name, part in zip(_QKV, value.chunk(3), strict=True)}
    if rest not in _LAYER_NAMES:
        raise ConfigError(f"no HF-layout name for the layer tensor {key!r}")
    return {head + _LAYER_NAMES[rest]: value}


def _layers_from_hf(state_dict: Mapping[str, torch.Tensor], prefix: str, source: str) -> dict[str, torch.Tensor]:
    """Their ``prefix + layers.{i}.*`` tensors under our names, q/k/v concatenated into ``wqkv``; every other
    key is passed through unchanged (for the caller to rename or to refuse)."""
    out: dict[str, torch.Tensor] = {}
    qkv: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in state_dict.items():
        parts = key[len(prefix) :].split(".", 2) if key.startswith(prefix + "layers.") else []
        if len(parts) < 3:
            out[key] = value
            continue
        _, index, rest = parts
        if rest in _QKV_NAMES:
            qkv.setdefault(index, {})[_QKV_NAMES[rest]] = value
        elif rest in _FROM_HF:
            out[f"layers.{index}.{_FROM_HF[rest]}"] = value
        else:
            out[key] = value
    for index, found in qkv.items():
        missing = [f"{prefix}layers.{index}.self_attn.{name}_proj.weight" for name in _QKV if name not in found]
        if missing:
            raise CheckpointError(
                f"{source}: missing {', '.join(missing)} (layer {index} has {sorted(found)} of q/k/v)"
            )
        out[f"layers.{index}.attention.wqkv.weight"] = torch.cat([found[name] for name in _QKV])  # (3D, D)
    return out


def target_to_hf(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our GPT's state dict (c2i or t2i) -> their ``LlamaForCausalLM``'s (``model.*`` and ``lm_head.weight``)."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        if key.startswith("layers."):
            out.update(layer_to_hf(key, value, "model."))
        elif key in _TARGET_NAMES:
            out[_TARGET_NAMES[key]] = value
        elif key.startswith("cls_embedding."):  # cap_proj.fc1/fc2 and uncond_embedding, or embedding_table
            out["model." + key] = value
        else:
            raise ConfigError(f"no HF-layout name for the GPT tensor {key!r}")
    return out


def target_from_hf(state_dict: Mapping[str, torch.Tensor], source: str = "HF state dict") -> dict[str, torch.Tensor]:
    """Their ``LlamaForCausalLM`` state dict -> our GPT's; keys of neither layout are passed through (the strict
    load then names them)."""
    out: dict[str, torch.Tensor] = {}
    for key, value in _layers_from_hf(state_dict, "model.", source).items():
        if key in _TARGET_FROM_HF:
            out[_TARGET_FROM_HF[key]] = value
        elif key.startswith("model.cls_embedding."):
            out[key[len("model.") :]] = value
        else:
            out[key] = value
    return out


def drafter_to_hf(state_dict: Mapping[str, torch.Tensor], embeddings: torch.Tensor) -> dict[str, torch.Tensor]:
    """Our drafter's state dict -> their drafter ``Model``'s; ``embeddings`` (V, D) is the target's frozen
    token table, of which their drafter keeps a copy (``embed_tokens.weight``). Our first layer has no input
    norm and neither has theirs (``index == 0``). A drafter with taps keeps ``fuse.weight`` under our name
    (see :data:`lantern.models.drafter.FOLDER_TAPS_KEY`)."""
    out = {EMBED_KEY: embeddings}
    for key, value in state_dict.items():
        if key.startswith("layers."):
            out.update(layer_to_hf(key, value, ""))
        elif key in ("fc.weight", "fc.bias", "fuse.weight"):
            out[key] = value
        else:
            raise ConfigError(f"no HF-layout name for the drafter tensor {key!r}")
    return out


def drafter_from_hf(
    state_dict: Mapping[str, torch.Tensor], source: str = "drafter"
) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
    """A LANTERN/EAGLE drafter state dict (``layers.0.self_attn.q_proj.weight``, ...) under our names.

    Returns the renamed dict and the file's frozen ``embed_tokens.weight`` (or ``None``): our drafter
    reads the target's own table, so that copy is only checked. Our names pass through unchanged, so a
    file in either layout reads the same.
    """
    renamed = _layers_from_hf(state_dict, "", source)
    return {k: v for k, v in renamed.items() if k != EMBED_KEY}, renamed.get(EMBED_KEY)


def _shapes(state_dict: Mapping[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    return {key: tuple(value.shape) for key, value in state_dict.items()}


# ----- config.json -------------------------------------------------------------------------------------
def target_config(config) -> dict:
    """The target's ``config.json``: the ``LlamaConfig`` their ``LlamaForCausalLM`` is built from, with
    everything :func:`check_target_config` reads (LlamaGen's keys: ``block_size`` is the number of image
    tokens, ``cls_token_num`` the condition tokens, ``input_type`` c2i or t2i)."""
    return {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        "hidden_size": config.dim,
        "intermediate_size": config.ffn_hidden,
        "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head,
        "num_key_value_heads": config.n_head,
        "hidden_act": "silu",
        "rms_norm_eps": config.norm_eps,
        "vocab_size": config.vocab_size,
        # sizes their preallocated KV cache: condition, image and a verification tree past the end
        "max_position_embeddings": max(2048, config.max_seq_len + 64),
        "tie_word_embeddings": False,
        "attention_bias": False,
        "pretraining_tp": 1,
        "rope_scaling": None,
        # Their LlamaModel's own keys (read by its constructor):
        "block_size": config.num_image_tokens,
        "cls_token_num": config.cls_token_num,
        "caption_dim": config.caption_dim,
        "input_type": config.model_type,
        "num_classes": config.num_classes,
        "class_dropout_p": CLASS_DROPOUT,
        "token_dropout_p": 0.0,
        "resid_dropout_p": 0.0,
        "ffn_dropout_p": 0.0,
        "rope_base": config.rope_base,
    }


def drafter_config(
    target, n_layer: int = 1, norm_eps: float = 1e-6, condition_input: str = "", taps: tuple[int, ...] = ()
) -> dict:
    """The drafter's ``config.json``: the keys their ``EConfig`` reads (``bias``: fc has one), the target's
    ``cls_token_num`` and ``block_size`` (checked on load) and, when given, our own keys
    (:func:`lantern.models.drafter.own_keys`)."""
    config = {
        "architectures": [ARCHITECTURE],
        "hidden_act": "silu",
        "hidden_size": target.dim,
        "intermediate_size": target.ffn_hidden,
        "max_position_embeddings": 512,
        "model_type": MODEL_TYPE,
        "num_attention_heads": target.n_head,
        "num_hidden_layers": n_layer,
        "num_key_value_heads": target.n_head,
        "pretraining_tp": 1,
        "rms_norm_eps": norm_eps,
        "rope_scaling": None,
        "tie_word_embeddings": False,
        "vocab_size": target.vocab_size,
        "input_type": target.model_type,
        "bias": True,
        "cls_token_num": target.cls_token_num,
        "block_size": target.num_image_tokens,
    }
    return own_keys(config, condition_input, taps)


def check_target_config(config: Mapping, expected, source: str, what: str) -> None:
    """CheckpointError unless a target folder's ``config.json`` names HF Llama (its ``model_type`` and
    ``architectures``, :func:`~lantern.models.checkpoint.check_family`); ConfigError unless it describes
    ``expected`` (see :func:`target_config`).

    The keys that fix shapes are required; the others are checked when present. Nothing in a LlamaGen
    checkpoint says its RMSNorm epsilon, so a folder that states another one is refused too: pass the
    folder's value as ``+model.bundle.gpt.overrides.norm_eps=...`` if it is right.
    """
    check_family(config, MODEL_TYPE, ARCHITECTURE, source, f"a {what} target in {_LAYOUT}")
    keys = target_config(expected)
    wanted = {
        key: keys[key]
        for key in (
            "input_type",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "vocab_size",
            "block_size",
            "cls_token_num",
            "caption_dim" if expected.model_type == "t2i" else "num_classes",
            "intermediate_size",
            "num_key_value_heads",
            "rms_norm_eps",
            "rope_base",
            "hidden_act",
            "tie_word_embeddings",
        )
    }
    required = ("input_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
    required += ("block_size", "cls_token_num", "caption_dim" if expected.model_type == "t2i" else "num_classes")
    check_folder_keys(config, wanted, required, source, what)


def check_drafter_config(config: Mapping, target, norm_eps: float, source: str, what: str) -> None:
    """ConfigError unless a drafter folder's ``config.json`` fits ``target``: width, heads, FFN size and
    vocabulary (required), and when present the target's ``cls_token_num`` and ``block_size``, the
    drafter's ``rms_norm_eps`` (``norm_eps``), ``bias`` (fc has one) and the activation; CheckpointError
    unless it names HF Llama (as a target folder)."""
    check_family(config, MODEL_TYPE, ARCHITECTURE, source, f"{what} in {_LAYOUT}")
    keys = drafter_config(target, norm_eps=norm_eps)
    names = ("hidden_size", "num_attention_heads", "vocab_size", "intermediate_size", "num_key_value_heads")
    wanted = {key: keys[key] for key in (*names, "cls_token_num", "block_size", "rms_norm_eps", "bias", "hidden_act")}
    check_folder_keys(config, wanted, ("hidden_size", "num_attention_heads", "vocab_size"), source, what)


# ----- folders -----------------------------------------------------------------------------------------
def _source(folder) -> str:
    return f"HF folder {os.fspath(folder)!r}"


def load_target_folder(model: torch.nn.Module, folder: str | os.PathLike, what: str) -> torch.nn.Module:
    """Load a target folder into ``model`` strictly: config, then tensors by HF name, then our names."""
    config, given = read_folder(folder, "target")
    source = _source(folder)
    check_target_config(config, model.config, source, what)
    check_shapes(_shapes(target_to_hf(model.state_dict())), given, what, os.fspath(folder))
    model.load_state_dict(target_from_hf(given, source), strict=True)
    return model


def save_target_folder(model: torch.nn.Module, folder: str | os.PathLike, dtype: torch.dtype = torch.float32) -> Path:
    """Our GPT as a target folder (``config.json`` + ``model.safetensors``) that
    :func:`load_target_folder` and their ``LlamaForCausalLM.from_pretrained`` read."""
    return write_folder(folder, target_config(model.config), target_to_hf(model.state_dict()), dtype)
