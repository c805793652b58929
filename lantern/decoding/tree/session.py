"""The drafter's decode state: prefill, drafting a tree, consuming accepted tokens.

The drafter keeps its own static cache, laid out like the target's: per row ``L`` valid slots (the
condition entries and one entry per decided token except the pending one). Drafted nodes go to
scratch slots after ``L`` and are overwritten by the next step. Every mask covers the whole cache
capacity, so shapes never change between steps and a step can be compiled or captured.

:func:`lantern.decoding.batch.tree_attention_mask` is the one builder of tree masks: the target's
verification, the drafter's expansions and the drafter's consumption of an accepted path all use it.
"""

from __future__ import annotations

import torch

from lantern.decoding.batch import prefix_columns, repeat_rows, tree_attention_mask
from lantern.models.drafter import Drafter
from lantern.models.sampling import SamplingConfig, guided_logits_at, verification_probabilities
from lantern.models.target import Target, prefix_causal_mask


def drafter_prefill(
    model: Target,
    drafter: Drafter,
    cache,
    cond_emb: torch.Tensor,
    features: torch.Tensor,
    first: torch.Tensor,
    cond_mask: torch.Tensor,
    capacity: int,
) -> torch.Tensor:
    """Feed the condition entries and image token 0; return the root feature (rows, D).

    ``cond_emb`` (rows, T, D) and ``features`` come from the target's prefill: its final-norm states
    (rows, T, D), or the tapped states (rows, T, len(taps) * D) of a drafter with taps, which
    :meth:`~lantern.models.drafter.Drafter.target_features` fuses here. ``first`` (B,) is image token 0.
    Entry ``i < T`` reads ``[e_{i+1}; f_i]``, so the last entry reads token 0.
    """
    rows, cond_len = cond_emb.shape[:2]
    groups = rows // first.shape[0]
    index = torch.arange(cond_len, device=cond_emb.device)
    embeds = torch.cat(
        [drafter.condition_inputs(model, cond_emb), model.embed_tokens(repeat_rows(first[:, None], groups))], dim=1
    )
    mask = torch.zeros(rows, 1, cond_len, capacity, dtype=torch.bool, device=cond_emb.device)
    mask[..., :cond_len] = prefix_causal_mask(cond_mask[:, 1:], cond_len)
    fused = drafter.target_features(features)  # (rows, T, D)
    return drafter(embeds, fused, index, index.expand(rows, -1), mask, cache)[:, -1].contiguous()  # (rows, D)


def drafter_consume(
    model: Target,
    drafter: Drafter,
    cache,
    tokens: torch.Tensor,
    features: torch.Tensor,
    base: torch.Tensor,
    valid: torch.Tensor,
    chain: torch.Tensor,
) -> torch.Tensor:
    """Feed an accepted path to the drafter with its true target features; return its outputs (rows, S, D).

    ``tokens`` (B, S) are the inputs at entries ``L .. L+S-1`` (``base`` = L), ``features`` the target's
    features before them (rows, S, D), or (rows, S, len(taps) * D) for a drafter with taps, fused here:
    only the path's positions, not the whole verified tree; ``chain`` (B, S, S) the lower-triangular
    ancestry of a path.
    """
    groups = features.shape[0] // tokens.shape[0]
    entries = base[:, None] + torch.arange(tokens.shape[1], device=tokens.device)  # (B, S)
    mask = tree_attention_mask(valid, base, chain)
    return drafter(
        model.embed_tokens(repeat_rows(tokens, groups)),
        drafter.target_features(features),  # (rows, S, D)
        repeat_rows(entries, groups),
        repeat_rows(entries, groups),
        repeat_rows(mask, groups),
        cache,
    )


class DraftSession:
    """The drafter's side of one draft: implements the ``Expander`` protocol of the draft structures.

    Entry 0 is the root (the pending token, whose drafter feature ``root_feature`` was computed when
    the previous step's tokens were consumed, and whose drafter key sits at slot ``L - 1``); entry
    ``e >= 1`` is written at drafter cache slot ``L + e - 1`` and attends to the valid prefix and to
    its ancestor entries. ``max_entries`` bounds the entries of one draft (a host constant).

    ``past_grid`` (see :func:`lantern.decoding.tree.step.grid_positions`): entries past the drafter's
    RoPE table (nodes past the last image token) are clamped into it by the drafter (``clamp``), or, for
    ``zero_rope``, sent to entry 0, whose row is a condition position's zero row when there are at least
    two condition slots (with one, the drafter's table has no zero row and they stay clamped).
    """

    def __init__(
        self,
        model: Target,
        drafter: Drafter,
        cache,
        sampling: SamplingConfig,
        root_feature: torch.Tensor,
        base: torch.Tensor,
        decided: torch.Tensor,
        valid: torch.Tensor,
        max_entries: int,
        past_grid: str = "clamp",
    ):
        self.model, self.drafter, self.cache, self.sampling = model, drafter, cache, sampling
        self.base, self.decided = base, decided
        self.zero_past_grid = past_grid == "zero_rope" and model.config.cls_token_num >= 2
        batch, rows = base.shape[0], root_feature.shape[0]
        self.groups = rows // batch
        self.valid = valid[:batch]  # (B, W) rows of one CFG half share the condition mask
        self.prefix = prefix_columns(self.valid, base)  # (B, W) what every node of this draft sees before its own
        device = base.device
        self.features = torch.zeros(rows, max_entries, root_feature.shape[-1], dtype=root_feature.dtype, device=device)
        self.features[:, 0] = root_feature
        self.depth = torch.zeros(batch, max_entries, dtype=torch.long, device=device)
        self.eager = not torch.compiler.is_compiling()
        if self.eager:
            # (B, E, W) bool: every entry's mask row, its parent's plus its own column (the root's: the prefix,
            # which holds the root's column L - 1): a node's row is one gather and one scatter away.
            self.rows = torch.zeros(batch, max_entries, self.valid.shape[1], dtype=torch.bool, device=device)
            self.rows[:, 0] = self.prefix
        else:
            # (B, E, E) 0/1 in float32, not bool: Inductor's CPU code for the masked bool or-update below does
            # not compile (torch 2.14, a VecMask type clash), and the mask builder multiplies it as float anyway.
            self.ancestors = torch.eye(max_entries, dtype=torch.float32, device=device).repeat(batch, 1, 1)
        self.count = 1  # entries so far (a host integer: the same sequence every step)
        self.forwards = 0
        logits = model.head(root_feature)[:, None]  # (rows, 1, V)
        self.root_q = verification_probabilities(guided_logits_at(logits, sampling, decided[:, None]), sampling)[:, 0]

    def expand(self, tokens: torch.Tensor, parents: torch.Tensor, depth: int | None = None) -> torch.Tensor:
        """Feed nodes ``tokens`` (B, n) under entries ``parents`` (B, n), all at ``depth`` when it is given (else
        each one below its parent); return their q (B, n, V)."""
        n = tokens.shape[1]
        start, stop = self.count, self.count + n
        if depth is None:
            depth = self.depth.gather(1, parents) + 1  # (B, n)
            self.depth[:, start:stop] = depth
        else:
            self.depth[:, start:stop] = depth
        slots = self.base[:, None] + torch.arange(start - 1, stop - 1, device=tokens.device)  # (B, n)
        if self.eager:  # each node sees what its parent sees, and itself
            rows = self.rows.gather(1, parents[:, :, None].expand(-1, -1, self.rows.shape[2]))  # (B, n, W)
            rows.scatter_(2, slots[:, :, None], True)
            self.rows[:, start:stop] = rows
            mask = rows[:, None]  # (B, 1, n, W)
        else:
            inherited = self.ancestors.gather(1, parents[:, :, None].expand(-1, -1, self.ancestors.shape[2]))
            self.ancestors[:, start:stop] = torch.maximum(self.ancestors[:, start:stop], inherited)
            # Entries not yet written (>= stop) are not ancestors of anything, so the full table is safe.
            mask = tree_attention_mask(
                self.valid, self.base, self.ancestors[:, start:stop], offset=1, prefix=self.prefix
            )  # (B, 1, n, W)
        positions = (self.base[:, None] - 1 + depth).expand(-1, n)  # drafter entry index of each node
        if self.zero_past_grid:  # entry 0 reads RoPE row 1, a condition row: zero
            positions = torch.where(positions < self.drafter.max_entries, positions, torch.zeros_like(positions))
        parent_features = self.features.gather(
            1, repeat_rows(parents, self.groups)[:, :, None].expand(-1, -1, self.features.shape[-1])
        )
        out = self.drafter(
            self.model.embed_tokens(repeat_rows(tokens, self.groups)),
            parent_features,
            repeat_rows(positions, self.groups),
            repeat_rows(slots, self.groups),
            repeat_rows(mask, self.groups),
            self.cache,
        )  # (rows, n, D)
        self.features[:, start:stop] = out
        self.count = stop
        self.forwards += 1
        logits = self.model.head(out)  # (rows, n, V)
        # The token index each node predicts matters only when guidance stops at some token.
        steps = None if self.sampling.last_guided_token is None else (self.decided[:, None] + depth).expand(-1, n)
        return verification_probabilities(guided_logits_at(logits, self.sampling, steps), self.sampling)
