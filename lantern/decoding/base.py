"""What every decoder shares: the result type and the CFG batch layout."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lantern.conditioning import Condition
from lantern.models.gpt import Transformer
from lantern.sampling import SamplingConfig


@dataclass
class DecodeResult:
    """Image token codes (B, N) in raster order, per-batch counters (e.g. target forwards, phase times)
    and per-sample CPU tensors with a leading batch dimension: ``steps`` (target steps after the
    first token) and ``tokens`` (tokens they produced), plus decoder-specific ones (a speculative
    decoder adds ``histogram`` (B, D+1), ``tv_realised_sum``, ``tv_realised_max``, ``tv_measured``,
    ``merged_sum``, ``merged_max`` and ``accepted_drafts``).
    """

    codes: torch.Tensor
    stats: dict[str, float] = field(default_factory=dict)
    per_sample: dict[str, torch.Tensor] = field(default_factory=dict)


def guided_inputs(model: Transformer, condition: Condition, sampling: SamplingConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Condition embeddings and mask for the model batch: (B, T, D), (B, T), or (2B, ...) as ``[cond; uncond]``.

    With CFG the unconditional half uses the null condition and the same caption mask as its
    conditional row, as in the reference.
    """
    values, mask = condition.values, condition.mask
    if sampling.uses_cfg:
        values = torch.cat([values, model.null_condition(len(condition)).to(values.dtype)])
        mask = torch.cat([mask, mask])
    return model.embed_condition(values), mask


def prefill_condition(model: Transformer, cond_emb: torch.Tensor, cond_mask: torch.Tensor, cache, capacity: int) -> torch.Tensor:
    """Write the condition (rows, T, D) into cache slots ``0..T-1`` with a mask over the whole
    ``capacity``; return the final-norm hidden states (rows, T, D) (the last predicts image token 0)."""
    from lantern.models.gpt import prefix_causal_mask

    rows, cond_len = cond_emb.shape[:2]
    index = torch.arange(cond_len, device=cond_emb.device)
    mask = torch.zeros(rows, 1, cond_len, capacity, dtype=torch.bool, device=cond_emb.device)
    mask[..., :cond_len] = prefix_causal_mask(cond_mask, cond_len)
    return model.forward_embeddings(cond_emb, index, index.expand(rows, -1), mask, cache)
