"""Plain autoregressive decoding: one target forward per image token over a static KV cache."""

from __future__ import annotations

import torch

from lantern.conditioning import Condition
from lantern.decoding.base import DecodeResult, guided_inputs
from lantern.models.gpt import Transformer, prefix_causal_mask
from lantern.sampling import SamplingConfig, guided_logits, next_token


class ARDecoder:
    """Token-by-token decoding, the baseline every speculative decoder is measured against.

    The cache, the full attention mask and the position index are built once per batch; each step
    slices them with host integers, so no step synchronises with the device.
    """

    name = "ar"

    def __init__(self, sampling: SamplingConfig):
        self.sampling = sampling

    @torch.inference_mode()
    def generate(self, model: Transformer, condition: Condition, keys: torch.Tensor) -> DecodeResult:
        """Decode all image tokens for ``condition`` (B prompts) with per-sample RNG ``keys`` (B,)."""
        cfg = model.config
        cond_len, num_tokens = cfg.cls_token_num, cfg.num_image_tokens
        cond_emb, cond_mask = guided_inputs(model, condition, self.sampling)
        rows, batch = cond_emb.shape[0], len(condition)
        length = cond_len + num_tokens - 1  # the last image token is never fed back
        cache = model.new_cache(rows, length)
        mask = prefix_causal_mask(cond_mask, length)  # (rows, 1, L, L)
        positions = torch.arange(length, device=cond_emb.device)
        slots = positions.expand(rows, length)  # (rows, L): every row writes the same slots

        logits, _ = model.prefill(cond_emb, mask[:, :, :cond_len, :cond_len], cache)
        codes = torch.empty(batch, num_tokens, dtype=torch.long, device=cond_emb.device)
        codes[:, 0] = next_token(guided_logits(logits, self.sampling, 0), self.sampling, keys, 0)
        for step in range(1, num_tokens):
            pos = cond_len + step - 1
            token = codes[:, step - 1 : step].repeat(rows // batch, 1)  # (rows, 1)
            logits, _ = model.forward_tokens(
                token, positions[pos : pos + 1], slots[:, pos : pos + 1], mask[:, :, pos : pos + 1, : pos + 1], cache
            )
            codes[:, step] = next_token(guided_logits(logits[:, -1], self.sampling, step), self.sampling, keys, step)
        per_image = torch.full((batch,), num_tokens - 1, dtype=torch.long)
        return DecodeResult(
            codes, {"target_forwards": float(num_tokens), "steps": float(num_tokens)},
            {"steps": per_image, "tokens": per_image.clone()},
        )

    def describe(self) -> dict:
        """Decoder settings recorded with results (plain AR has none beyond sampling)."""
        return {"acceptance": None, "draft": None}
