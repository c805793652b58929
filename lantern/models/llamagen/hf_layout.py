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

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path

import torch

from lantern import checks
from lantern.errors import CheckpointError, ConfigError
from lantern.files import note_input, write_folder_atomic
from lantern.models.checkpoint import (  # noqa: F401 - the folder names and checks, re-exported for callers
    CONFIG_NAME,
    INDEX_SUFFIX,
    WEIGHT_FILES,
    WEIGHTS_NAME,
    check_hf_folder,
    check_shapes,
    read_hf_config,
    read_hf_weights,
)
from lantern.models.llamagen.gpt import GPTConfig, Transformer

# Our own config.json key: what the drafter reads at condition entries (see DrafterConfig.condition_input).
# Their releases do not carry it (their drafter feeds code 0 there); a folder that does overrides the preset.
CONDITION_KEY = "lantern_condition_input"
# Our own config.json key: the target layers an EAGLE-3-style drafter taps (a list of ints; see
# DrafterConfig.taps); their fusion is the tensor ``fuse.weight``, under our own name. Absent: none (their releases).
TAPS_KEY = "lantern_taps"
# Buffers that older transformers versions saved beside the weights; they hold no weights.
_STRAY_SUFFIXES = (".rotary_emb.inv_freq",)
# LlamaGen's null class is trained by dropping labels at this rate; their LabelEmbedder only has the null
# row (num_classes + 1 rows, as our checkpoints) when the config's rate is > 0.
CLASS_DROPOUT = 0.1

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
    (see :data:`TAPS_KEY`)."""
    out = {"embed_tokens.weight": embeddings}
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
    return {k: v for k, v in renamed.items() if k != "embed_tokens.weight"}, renamed.get("embed_tokens.weight")


def _shapes(state_dict: Mapping[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    return {key: tuple(value.shape) for key, value in state_dict.items()}


def _without_strays(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in state_dict.items() if not k.endswith(_STRAY_SUFFIXES)}


# ----- config.json -------------------------------------------------------------------------------------
def target_config(config: GPTConfig) -> dict:
    """The target's ``config.json``: the ``LlamaConfig`` their ``LlamaForCausalLM`` is built from, with
    everything :func:`check_target_config` reads (LlamaGen's keys: ``block_size`` is the number of image
    tokens, ``cls_token_num`` the condition tokens, ``input_type`` c2i or t2i)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
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
    target: GPTConfig, n_layer: int = 1, norm_eps: float = 1e-6, condition_input: str = "", taps: tuple[int, ...] = ()
) -> dict:
    """The drafter's ``config.json``: the keys their ``EConfig`` reads (``bias``: fc has one), the target's
    ``cls_token_num`` and ``block_size`` (checked on load) and, when given, our :data:`CONDITION_KEY` and
    :data:`TAPS_KEY`."""
    config = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_act": "silu",
        "hidden_size": target.dim,
        "intermediate_size": target.ffn_hidden,
        "max_position_embeddings": 512,
        "model_type": "llama",
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
    if condition_input:
        config[CONDITION_KEY] = condition_input
    if taps:
        config[TAPS_KEY] = [int(tap) for tap in taps]
    return config


def _same(have, want) -> bool:
    """Equal as JSON values: numbers by value (``1e-05`` is ``1e-5``, ``10000`` is ``10000.0``), a bool only
    to a bool."""
    if isinstance(want, (bool, str)):
        return type(have) is type(want) and have == want
    if checks.is_number(want):
        return checks.is_number(have) and math.isclose(float(have), float(want), rel_tol=1e-9, abs_tol=0.0)
    return have == want


def _check_config(config: Mapping, expected: Mapping, required: tuple[str, ...], source: str, what: str) -> None:
    """ConfigError naming the first key of ``expected`` that ``config`` gives another value (or lacks, for
    ``required`` keys); ``what`` names the architecture the values come from."""
    for key, want in expected.items():
        if key not in config:
            if key in required:
                raise ConfigError(f"{source}: config.json has no {key!r}; expected {checks.shown(want)} for {what}")
            continue
        if not _same(config[key], want):
            raise ConfigError(
                f"{source}: config.json has {key}={checks.shown(config[key])}, expected {checks.shown(want)} for {what}"
            )


def check_target_config(config: Mapping, expected: GPTConfig, source: str, what: str) -> None:
    """ConfigError unless a target folder's ``config.json`` describes ``expected`` (see :func:`target_config`).

    The keys that fix shapes are required; the others are checked when present. Nothing in a LlamaGen
    checkpoint says its RMSNorm epsilon, so a folder that states another one is refused too: pass the
    folder's value as ``+model.bundle.gpt.overrides.norm_eps=...`` if it is right.
    """
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
    _check_config(config, wanted, required, source, what)


def check_drafter_config(config: Mapping, target: GPTConfig, norm_eps: float, source: str, what: str) -> None:
    """ConfigError unless a drafter folder's ``config.json`` fits ``target``: width, heads, FFN size and
    vocabulary (required), and when present the target's ``cls_token_num`` and ``block_size``, the
    drafter's ``rms_norm_eps`` (``norm_eps``), ``bias`` (fc has one) and the activation."""
    keys = drafter_config(target, norm_eps=norm_eps)
    names = ("hidden_size", "num_attention_heads", "vocab_size", "intermediate_size", "num_key_value_heads")
    wanted = {key: keys[key] for key in (*names, "cls_token_num", "block_size", "rms_norm_eps", "bias", "hidden_act")}
    _check_config(config, wanted, ("hidden_size", "num_attention_heads", "vocab_size"), source, what)


# ----- folders -----------------------------------------------------------------------------------------
def _source(folder) -> str:
    return f"HF folder {os.fspath(folder)!r}"


check_folder = check_hf_folder


def read_folder(folder: str | os.PathLike, role: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """An HF-layout folder's ``config.json`` and its tensors (one file or the shards of an index), noted as
    one input of the current job under ``role`` (the whole folder's contents: a changed config counts)."""
    folder = check_hf_folder(folder)
    config = read_hf_config(folder)
    state = _without_strays(read_hf_weights(folder))
    note_input(folder, role)
    return config, state


def load_target_folder(model: Transformer, folder: str | os.PathLike, what: str) -> Transformer:
    """Load a target folder into ``model`` strictly: config, then tensors by HF name, then our names."""
    config, given = read_folder(folder, "target")
    source = _source(folder)
    check_target_config(config, model.config, source, what)
    check_shapes(_shapes(target_to_hf(model.state_dict())), given, what, os.fspath(folder))
    model.load_state_dict(target_from_hf(given, source), strict=True)
    return model


def write_folder(
    folder: str | os.PathLike, config: Mapping, state_dict: Mapping[str, torch.Tensor], dtype: torch.dtype
) -> Path:
    """``config.json`` and ``model.safetensors`` (tensors cast to ``dtype``) into ``folder``, atomically
    (:func:`lantern.files.write_folder_atomic`: an interrupted export leaves no folder that loads)."""
    from safetensors.torch import save_file

    # Own copies: the q/k/v parts of wqkv share its storage, which safetensors refuses.
    tensors = {
        key: value.detach().to(device="cpu", dtype=dtype).clone().contiguous() for key, value in state_dict.items()
    }
    text = json.dumps({**config, "torch_dtype": str(dtype).removeprefix("torch.")}, indent=2) + "\n"

    def write(staging: Path) -> None:
        save_file(tensors, str(staging / WEIGHTS_NAME), metadata={"format": "pt"})
        (staging / CONFIG_NAME).write_text(text, encoding="utf-8")

    return write_folder_atomic(folder, write)


def save_target_folder(model: Transformer, folder: str | os.PathLike, dtype: torch.dtype = torch.float32) -> Path:
    """Our GPT as a target folder (``config.json`` + ``model.safetensors``) that
    :func:`load_target_folder` and their ``LlamaForCausalLM.from_pretrained`` read."""
    return write_folder(folder, target_config(model.config), target_to_hf(model.state_dict()), dtype)
