"""Our target GPT and drafter in the HF layout of the authors' LANTERN code (jadohu/LANTERN).

Their LlamaGen port (``models/kv_variants/modeling_llamagen_kv.py``: ``LlamaForCausalLM``) and drafter
(``models/drafters/cnets_llamagen.py``: ``Model``) use HF Llama names, separate q/k/v projections and
the same interleaved-pair 2D RoPE as LlamaGen, so the conversion is a renaming plus a split of ``wqkv``
(no permutation of q/k rows). One thing is not a renaming: their ``generate()`` hard-codes 120 condition
slots (FLAN-T5's length) in its input ids and position offsets, so a target with ``T`` < 120 condition
tokens is given 120 slots, the ``120 - T`` extra ones leading and always masked (captions are
left-padded on both sides, so the valid tokens stay last). A masked column gets an additive
``finfo.min`` there and exactly zero weight after the softmax, and condition positions carry no RoPE
(cos = sin = 0), so image positions see the same keys and values as ours: logits agree to float
rounding (checked by :func:`lantern.models.llamagen.reference_code.check_logits`).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from lantern.errors import ConfigError
from lantern.models.drafter import DrafterConfig
from lantern.models.llamagen.gpt import GPTConfig

# Condition slots of their generate(): `torch.zeros((B, 120))` input ids, `input_ids[:, 120:]` output.
REFERENCE_COND_SLOTS = 120

# Per-layer names, ours -> theirs (the q/k/v split of wqkv is done separately).
_LAYER_NAMES = {
    "attention.wo.weight": "self_attn.o_proj.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}


def _layer_keys(key: str, value: torch.Tensor, prefix: str) -> dict[str, torch.Tensor]:
    """One of our ``layers.{i}.*`` tensors under their names (``prefix`` + ``layers.{i}.*``)."""
    _, index, rest = key.split(".", 2)
    head = f"{prefix}layers.{index}."
    if rest == "attention.wqkv.weight":  # (3D, D): rows [q | k | v]
        q, k, v = value.chunk(3, dim=0)
        return {
            head + "self_attn.q_proj.weight": q,
            head + "self_attn.k_proj.weight": k,
            head + "self_attn.v_proj.weight": v,
        }
    if rest not in _LAYER_NAMES:
        raise ConfigError(f"no HF-layout name for the layer tensor {key!r}")
    return {head + _LAYER_NAMES[rest]: value}


def target_state_dict(state_dict: Mapping[str, torch.Tensor], config: GPTConfig) -> dict[str, torch.Tensor]:
    """Our t2i GPT's state dict -> their ``LlamaForCausalLM``'s (``model.*`` and ``lm_head.weight``).

    The null caption ``uncond_embedding`` (T, C) becomes (120, C): our rows last, zero rows before them
    (they sit in the always-masked leading slots, see the module docstring).
    """
    if config.model_type != "t2i":
        raise ConfigError(f"the reference benchmark converts text-to-image GPTs, not {config.model_type}")
    slots = REFERENCE_COND_SLOTS
    if config.cls_token_num > slots:
        raise ConfigError(
            f"the reference code takes at most {slots} condition tokens, the GPT has {config.cls_token_num}"
        )
    out: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        if key.startswith("layers."):
            out.update(_layer_keys(key, value, "model."))
        elif key == "tok_embeddings.weight":
            out["model.embed_tokens.weight"] = value
        elif key == "norm.weight":
            out["model.norm.weight"] = value
        elif key == "output.weight":
            out["lm_head.weight"] = value
        elif key == "cls_embedding.uncond_embedding":  # (T, C) -> (120, C)
            padded = value.new_zeros(slots, value.shape[1])
            padded[slots - value.shape[0] :] = value
            out["model.cls_embedding.uncond_embedding"] = padded
        elif key.startswith("cls_embedding.cap_proj."):
            out["model." + key] = value
        else:
            raise ConfigError(f"no HF-layout name for the GPT tensor {key!r}")
    return out


def drafter_state_dict(state_dict: Mapping[str, torch.Tensor], embeddings: torch.Tensor) -> dict[str, torch.Tensor]:
    """Our drafter's state dict -> their drafter ``Model``'s; ``embeddings`` (V, D) is the target's frozen
    token table, which their drafter keeps a copy of (``embed_tokens.weight``). Our first layer has no
    input norm and neither has theirs (``index == 0``)."""
    out = {"embed_tokens.weight": embeddings}
    for key, value in state_dict.items():
        if key.startswith("layers."):
            out.update(_layer_keys(key, value, ""))
        elif key in ("fc.weight", "fc.bias"):
            out[key] = value
        else:
            raise ConfigError(f"no HF-layout name for the drafter tensor {key!r}")
    return out


def target_config(config: GPTConfig, max_positions: int = 512) -> dict:
    """Keyword arguments of the ``LlamaConfig`` their ``LlamaForCausalLM`` is built from.

    ``max_positions`` sizes their preallocated KV cache (``initialize_past_key_values``): the 120
    condition slots, the image tokens and a verification tree past the end.
    """
    if max_positions < REFERENCE_COND_SLOTS + config.num_image_tokens + 64:
        raise ConfigError(f"max_positions={max_positions} leaves no room for a tree after the last image token")
    return {
        "hidden_size": config.dim,
        "intermediate_size": config.ffn_hidden,
        "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head,
        "num_key_value_heads": config.n_head,
        "hidden_act": "silu",
        "rms_norm_eps": config.norm_eps,
        "vocab_size": config.vocab_size,
        "max_position_embeddings": max_positions,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "pretraining_tp": 1,
        "rope_scaling": None,
        # Their LlamaModel's own keys (read by its constructor):
        "block_size": config.num_image_tokens,
        "cls_token_num": REFERENCE_COND_SLOTS,
        "caption_dim": config.caption_dim,
        "input_type": "t2i",
        "num_classes": config.num_classes,
        "class_dropout_p": 0.0,
        "token_dropout_p": 0.0,
        "resid_dropout_p": 0.0,
        "ffn_dropout_p": 0.0,
        "rope_base": config.rope_base,
    }


def drafter_config(config: DrafterConfig) -> dict:
    """The drafter's ``config.json`` as their ``EConfig`` reads it (``bias``: fc has one)."""
    target = config.target
    return {
        "architectures": ["LlamaForCausalLM"],
        "hidden_act": "silu",
        "hidden_size": target.dim,
        "intermediate_size": target.ffn_hidden,
        "max_position_embeddings": 512,
        "model_type": "llama",
        "num_attention_heads": target.n_head,
        "num_hidden_layers": config.n_layer,
        "num_key_value_heads": target.n_head,
        "pretraining_tp": 1,
        "rms_norm_eps": config.norm_eps,
        "rope_scaling": None,
        "tie_word_embeddings": False,
        "vocab_size": target.vocab_size,
        "input_type": "t2i",
        "bias": True,
    }


def caption_inputs(values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Our left-padded caption (values (B, T, C), mask (B, T) bool) as their T5 embedder returns one:
    (B, 120, C) with the valid tokens first, and a (B, 120) long mask. Their ``generate()`` then rotates
    each row to left padding, which puts our tokens in the last slots, as :func:`target_state_dict`
    placed the null caption."""
    batch, _, width = values.shape
    slots = REFERENCE_COND_SLOTS
    states = values.new_zeros(batch, slots, width)
    flags = torch.zeros(batch, slots, dtype=torch.long, device=values.device)
    for row in range(batch):
        valid = values[row][mask[row]]  # (n, C), in order
        states[row, : valid.shape[0]] = valid
        flags[row, : valid.shape[0]] = 1
    return states, flags
