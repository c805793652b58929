"""The model batch every decoder builds: CFG rows, cache-column validity, masks over the whole cache.

Per image b the model batch holds ``groups`` rows (``[cond; uncond]`` with CFG): per-image tensors
(B, ...) become model-row tensors (groups * B, ...) with :func:`repeat_rows`. Masks always span the
whole cache capacity, so every step of a decoder has the same shapes.
"""

from __future__ import annotations

import torch

from lantern.models.condition import Condition
from lantern.models.sampling import SamplingConfig
from lantern.models.target import Target, prefix_causal_mask


def guided_inputs(model: Target, condition: Condition, sampling: SamplingConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Condition embeddings and mask for the model batch: (B, T, D), (B, T), or (2B, ...) as ``[cond; uncond]``.

    With CFG the unconditional half uses the null condition under its own mask
    (:meth:`~lantern.models.target.Target.null_condition_mask`; LlamaGen's is its conditional row's, as in
    the reference).
    """
    values, mask = condition.values, condition.mask
    if sampling.uses_cfg:
        values = torch.cat([values, model.null_condition(len(condition)).to(values.dtype)])
        mask = torch.cat([mask, model.null_condition_mask(mask)])
    return model.embed_condition(values), mask


def prefill_condition(
    model: Target, cond_emb: torch.Tensor, cond_mask: torch.Tensor, cache, capacity: int, taps: tuple[int, ...] = ()
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Write the condition (rows, T, D) into cache slots ``0..T-1`` with a mask over the whole
    ``capacity``; return the final-norm hidden states (rows, T, D) (the last predicts image token 0).

    With ``taps`` (an EAGLE-3-style drafter's), the pair ``(hidden, features)`` as
    :meth:`~lantern.models.target.Target.forward_embeddings` returns it, features (rows, T, len(taps) * D).
    """
    rows, cond_len = cond_emb.shape[:2]
    index = torch.arange(cond_len, device=cond_emb.device)
    mask = torch.zeros(rows, 1, cond_len, capacity, dtype=torch.bool, device=cond_emb.device)
    mask[..., :cond_len] = prefix_causal_mask(cond_mask, cond_len)
    return model.forward_embeddings(cond_emb, index, index.expand(rows, -1), mask, cache, taps)


def tree_attention_mask(
    valid: torch.Tensor, base: torch.Tensor, ancestors: torch.Tensor, offset: int = 0
) -> torch.Tensor:
    """Attention mask (B, 1, n, W) over every cache column for ``n`` tree queries.

    ``valid`` (B, W) says which columns hold real keys (padded condition slots do not); ``base`` (B,)
    is each row's prefix length ``L``; ``ancestors`` (B, n, E) bool (or 0/1) says which tree entries each query
    sees (itself and its ancestors). Entry ``e`` lives at column ``L + e - offset``; columns before
    ``L`` are the prefix every query sees. Entries at columns below ``L`` (the drafter's root,
    ``offset = 1``) are already part of the prefix.
    """
    width, entries = valid.shape[1], ancestors.shape[2]
    columns = torch.arange(width, device=valid.device)
    entry = columns[None, :] - base[:, None] + offset  # (B, W) the entry each column holds
    prefix = (columns[None, :] < base[:, None]) & valid
    inside = (columns[None, :] >= base[:, None]) & (entry < entries)  # (B, W)
    # Which entry each column holds, one-hot (B, W, E), then a product with the ancestry: the same as a
    # gather, but Inductor's CPU code for a fused masked bool gather does not compile (torch 2.14).
    holds = ((entry[:, :, None] == torch.arange(entries, device=valid.device)) & inside[:, :, None]).to(torch.float32)
    tree = torch.bmm(ancestors.to(torch.float32), holds.transpose(1, 2)) > 0.5  # (B, n, W)
    return (prefix[:, None, :] | tree)[:, None]


def column_validity(cond_mask: torch.Tensor, width: int) -> torch.Tensor:
    """(rows, width) bool: columns under ``cond_mask`` (rows, C) follow it, later columns are valid."""
    valid = torch.ones(cond_mask.shape[0], width, dtype=torch.bool, device=cond_mask.device)
    valid[:, : cond_mask.shape[1]] = cond_mask
    return valid


def repeat_rows(x: torch.Tensor, groups: int) -> torch.Tensor:
    """(B, ...) -> (groups * B, ...): the CFG layout ``[cond; uncond]`` of per-image tensors."""
    return x.repeat(groups, *([1] * (x.dim() - 1)))
