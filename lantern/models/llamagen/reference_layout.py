"""What the authors' LANTERN code (jadohu/LANTERN) needs beyond the HF layout, for the benchmark against it.

The renaming both ways is :mod:`lantern.models.llamagen.hf_layout` (their LlamaGen port
``models/kv_variants/modeling_llamagen_kv.py``: ``LlamaForCausalLM``, and drafter
``models/drafters/cnets_llamagen.py``: ``Model``). One thing is not a renaming: their ``generate()``
hard-codes 120 condition slots (FLAN-T5's length) in its input ids and position offsets, so a target with
``T`` < 120 condition tokens is given 120 slots, the ``120 - T`` extra ones leading and always masked
(captions are left-padded on both sides, so the valid tokens stay last). A masked column gets an additive
``finfo.min`` there and exactly zero weight after the softmax, and condition positions carry no RoPE
(cos = sin = 0), so image positions see the same keys and values as ours: logits agree to float
rounding (checked by :func:`lantern.models.llamagen.reference_code.check_logits`).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from lantern.errors import ConfigError
from lantern.models.drafter import DrafterConfig
from lantern.models.llamagen import hf_layout
from lantern.models.llamagen.gpt import GPTConfig

# Condition slots of their generate(): `torch.zeros((B, 120))` input ids, `input_ids[:, 120:]` output.
REFERENCE_COND_SLOTS = 120


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
    out = hf_layout.target_to_hf(state_dict)
    name = "model.cls_embedding.uncond_embedding"
    null = out[name]  # (T, C) -> (120, C)
    out[name] = null.new_zeros(slots, null.shape[1])
    out[name][slots - null.shape[0] :] = null
    return out


def drafter_state_dict(state_dict: Mapping[str, torch.Tensor], embeddings: torch.Tensor) -> dict[str, torch.Tensor]:
    """Our drafter's state dict -> their drafter ``Model``'s (:func:`hf_layout.drafter_to_hf`)."""
    return hf_layout.drafter_to_hf(state_dict, embeddings)


def target_config(config: GPTConfig, max_positions: int = 512) -> dict:
    """Keyword arguments of the ``LlamaConfig`` their ``LlamaForCausalLM`` is built from for the benchmark:
    the folder's config (:func:`hf_layout.target_config`) with 120 condition slots.

    ``max_positions`` sizes their preallocated KV cache (``initialize_past_key_values``): the 120
    condition slots, the image tokens and a verification tree past the end.
    """
    if max_positions < REFERENCE_COND_SLOTS + config.num_image_tokens + 64:
        raise ConfigError(f"max_positions={max_positions} leaves no room for a tree after the last image token")
    return {
        **hf_layout.target_config(config),
        "max_position_embeddings": max_positions,
        "cls_token_num": REFERENCE_COND_SLOTS,
        "class_dropout_p": 0.0,
    }


def drafter_config(config: DrafterConfig) -> dict:
    """The drafter's ``config.json`` as their ``EConfig`` reads it (:func:`hf_layout.drafter_config`).

    Their drafter reads the target's final-norm state, so a drafter with taps has no counterpart there.
    """
    if config.taps:
        raise ConfigError(
            f"a drafter with taps {list(config.taps)} cannot run in the authors' code, whose drafter reads the "
            "target's final-norm state"
        )
    return hf_layout.drafter_config(config.target, config.n_layer, config.norm_eps)


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
