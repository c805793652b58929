"""The model batch every decoder builds: CFG rows, cache-column validity, masks over the whole cache.

Per image b the model batch holds ``groups`` rows (``[cond; uncond]`` with CFG): per-image tensors
(B, ...) become model-row tensors (groups * B, ...) with :func:`repeat_rows`. Masks always span the
whole cache capacity, so every step of a decoder has the same shapes.

:func:`prefill` is every decoder's prefill: the condition into the target's cache and image token 0
drawn from the state after it (:class:`ModelInputs` first gives the model batch and its sizes, so the
decoder can build its context, and so its cache, in between).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from lantern.models.condition import Condition
from lantern.models.sampling import SamplingConfig, guided_logits, next_token
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


@dataclass(frozen=True)
class ModelInputs:
    """The model batch of one ``generate`` call: condition embeddings (rows, T, D) and their mask (rows, T)
    (:func:`guided_inputs`) for ``batch`` images, ``rows = groups * batch`` model rows."""

    cond_emb: torch.Tensor
    cond_mask: torch.Tensor
    batch: int

    @classmethod
    def of(cls, model: Target, condition: Condition, sampling: SamplingConfig) -> ModelInputs:
        cond_emb, cond_mask = guided_inputs(model, condition, sampling)
        return cls(cond_emb, cond_mask, len(condition))

    @property
    def rows(self) -> int:
        return self.cond_emb.shape[0]

    @property
    def groups(self) -> int:
        return self.rows // self.batch

    @property
    def device(self) -> torch.device:
        return self.cond_emb.device

    def valid(self, capacity: int, skip: int = 0) -> torch.Tensor:
        """(rows, capacity) bool: which cache columns hold real keys (:func:`column_validity`); ``skip``
        drops the first condition slots (a drafter's cache, which starts one entry later)."""
        return column_validity(self.cond_mask[:, skip:], capacity)


class Prefilled(NamedTuple):
    """``codes`` (B, C) zeros but image token 0 in column 0; ``hidden`` (rows, T, D) the final-norm states
    over the condition; ``features`` (rows, T, F) what a drafter reads (``hidden``, or the tapped states)."""

    codes: torch.Tensor
    hidden: torch.Tensor
    features: torch.Tensor


def prefill(
    model: Target,
    inputs: ModelInputs,
    cache,
    keys: torch.Tensor,
    sampling: SamplingConfig,
    *,
    width: int,
    capacity: int | None = None,
    mask: torch.Tensor | None = None,
    taps: tuple[int, ...] = (),
) -> Prefilled:
    """Write the condition into ``cache`` slots ``0..T-1`` and draw image token 0 with ``keys`` (B,) into a
    (B, ``width``) code buffer.

    The prefill attends under ``mask`` (rows, 1, T, W) when given, else under the condition's causal mask
    spread over the whole ``capacity`` (:func:`prefill_condition`). ``taps``: an EAGLE-3-style drafter's
    (``features`` are then the tapped states).
    """
    if mask is None:
        states = prefill_condition(model, inputs.cond_emb, inputs.cond_mask, cache, capacity, taps)
    else:
        index = torch.arange(inputs.cond_emb.shape[1], device=inputs.device)
        states = model.forward_embeddings(inputs.cond_emb, index, index.expand(inputs.rows, -1), mask, cache, taps)
    hidden, features = states if taps else (states, states)  # (rows, T, D), (rows, T, F)
    codes = torch.zeros(inputs.batch, width, dtype=torch.long, device=inputs.device)
    codes[:, 0] = next_token(guided_logits(model.head(hidden[:, -1]), sampling, 0), sampling, keys, 0)
    return Prefilled(codes, hidden, features)


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
    valid: torch.Tensor,
    base: torch.Tensor,
    ancestors: torch.Tensor,
    offset: int = 0,
    prefix: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention mask (B, 1, n, W) over every cache column for ``n`` tree queries.

    ``valid`` (B, W) says which columns hold real keys (padded condition slots do not); ``base`` (B,)
    is each row's prefix length ``L``; ``ancestors`` (B, n, E) bool (or 0/1) says which tree entries each query
    sees (itself and its ancestors). Entry ``e`` lives at column ``L + e - offset``; columns before
    ``L`` are the prefix every query sees. Entries at columns below ``L`` (the drafter's root,
    ``offset = 1``) are already part of the prefix. ``prefix`` (B, W): :func:`prefix_columns` of ``valid`` and
    ``base`` when the caller has it (one draft's expansions share it).

    Eagerly the entries' rows are scattered into their columns (:func:`_scattered_tree`); compiled, a one-hot
    product builds the same mask (:func:`_tree_by_product`), as Inductor's CPU code for that scatter into a bool
    mask does not compile (torch 2.14).
    """
    if prefix is None:
        prefix = prefix_columns(valid, base)
    build = _tree_by_product if torch.compiler.is_compiling() else _scattered_tree
    return (prefix[:, None, :] | build(valid.shape[1], base, ancestors, offset))[:, None]


def prefix_columns(valid: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """(B, W) bool: the columns every tree query sees, those before ``base`` (B,) that ``valid`` (B, W) marks."""
    columns = torch.arange(valid.shape[1], device=valid.device)
    return (columns[None, :] < base[:, None]) & valid


def _scattered_tree(width: int, base: torch.Tensor, ancestors: torch.Tensor, offset: int) -> torch.Tensor:
    """(B, n, W) bool: query ``i`` sees column ``L + e - offset`` iff entry ``e >= offset`` is one of its ancestors
    (entries past the last column are dropped into spill columns)."""
    batch, count, entries = ancestors.shape
    placed = entries - offset
    columns = base[:, None] + torch.arange(placed, device=base.device)  # (B, E - offset)
    tree = torch.zeros(batch, count, width + placed, dtype=torch.bool, device=base.device)
    seen = ancestors[:, :, offset:]
    tree.scatter_(2, columns[:, None, :].expand(-1, count, -1), seen if seen.dtype == torch.bool else seen > 0.5)
    return tree[:, :, :width]


def _tree_by_product(width: int, base: torch.Tensor, ancestors: torch.Tensor, offset: int) -> torch.Tensor:
    """:func:`_scattered_tree` as a one-hot product (B, n, E) x (B, E, W), for compiled steps."""
    entries = ancestors.shape[2]
    columns = torch.arange(width, device=base.device)
    entry = columns[None, :] - base[:, None] + offset  # (B, W) the entry each column holds
    inside = (columns[None, :] >= base[:, None]) & (entry < entries)  # (B, W)
    # Which entry each column holds, one-hot (B, W, E), then a product with the ancestry: the same as a
    # gather, but Inductor's CPU code for a fused masked bool gather does not compile (torch 2.14).
    holds = ((entry[:, :, None] == torch.arange(entries, device=base.device)) & inside[:, :, None]).to(torch.float32)
    return torch.bmm(ancestors.to(torch.float32), holds.transpose(1, 2)) > 0.5  # (B, n, W)


def column_validity(cond_mask: torch.Tensor, width: int) -> torch.Tensor:
    """(rows, width) bool: columns under ``cond_mask`` (rows, C) follow it, later columns are valid."""
    valid = torch.ones(cond_mask.shape[0], width, dtype=torch.bool, device=cond_mask.device)
    valid[:, : cond_mask.shape[1]] = cond_mask
    return valid


def repeat_rows(x: torch.Tensor, groups: int) -> torch.Tensor:
    """(B, ...) -> (groups * B, ...): the CFG layout ``[cond; uncond]`` of per-image tensors."""
    return x.repeat(groups, *([1] * (x.dim() - 1)))
