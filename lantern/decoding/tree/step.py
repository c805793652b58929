"""One speculative decoding step as a pure, static-shape function of tensors.

:func:`speculative_step` maps a :class:`SpecState` to the next one: draft a tree, verify it with one
target forward, walk it with the acceptance rule, then move the accepted path into place (target
cache entries, codes, the drafter's consumption). Every shape depends only on the batch and the
draft structure; masks span the whole cache capacity; positions, lengths and counters are device
tensors; nothing reads the device from the host. So the step compiles with
``torch.compile(fullgraph=True)`` and, on a GPU, can be captured as a CUDA graph.

The phases are separate functions so a runner can time them from outside (eager mode only; a
compiled step is timed as a whole).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from lantern.decoding.batch import repeat_rows, tree_attention_mask
from lantern.decoding.tree.draft import Draft
from lantern.decoding.tree.session import DraftSession, drafter_consume
from lantern.decoding.tree.verify import Walk, walk_tree
from lantern.models.drafter import Drafter
from lantern.models.sampling import SamplingConfig, guided_logits_at, verification_probabilities
from lantern.models.target import Target
from lantern.rules.api import Rule


class SpecState(NamedTuple):
    """What changes from step to step, per image row (B) or model row (rows = groups * B).

    ``codes`` (B, C) decided tokens (C leaves room for a last step's overrun); ``decided`` (B,) how many
    (``n``); ``length`` (B,) valid cache slots ``L = T + n - 1``; ``root_feature`` (rows, D) the drafter's
    feature after the pending token; ``keys`` (B,) the per-sample RNG keys; ``target_valid`` and
    ``drafter_valid`` (rows, W) which cache columns hold real keys (padded condition slots do not).
    """

    codes: torch.Tensor
    decided: torch.Tensor
    length: torch.Tensor
    root_feature: torch.Tensor
    keys: torch.Tensor
    target_valid: torch.Tensor
    drafter_valid: torch.Tensor


class StepLog(NamedTuple):
    """Per-step outcome for the records: ``accepted`` (B,) drafts accepted (-1 for a finished row),
    ``tv`` (B, D+1) realised TV per emitted token, ``merged`` (B, D) mass moved onto accepted drafts."""

    accepted: torch.Tensor
    tv: torch.Tensor
    merged: torch.Tensor


@dataclass
class StepContext:
    """What stays fixed for a batch shape: models, caches (static addresses), and the strategy pieces."""

    model: Target
    drafter: Drafter
    target_cache: object
    drafter_cache: object
    sampling: SamplingConfig
    draft: object  # a draft structure (StaticTree, DynamicTree)
    rule: Rule
    mode: str  # deterministic | sampled | greedy
    num_tokens: int
    groups: int


def past_grid(rule: Rule) -> str:
    """How positions past the last image slot are handled for ``rule``: its ``past_grid`` attribute
    (the authors' reference rule: ``zero_rope``), else ``clamp``."""
    return getattr(rule, "past_grid", "clamp")


def grid_positions(positions: torch.Tensor, limit: int, mode: str) -> torch.Tensor:
    """Positions (any shape) into a RoPE table of ``limit`` rows whose row 0 is a condition row.

    Only draft nodes past the last image token (a final step's overshoot) fall outside the table.
    ``clamp``: they take the last row. ``zero_rope``: they take row 0, a condition position whose RoPE
    row is zero (cos = sin = 0, LlamaGen's layout), which is what the authors' code gives them: its
    tables are padded with zero rows past the grid. Static shapes either way (one elementwise op).
    """
    if mode == "zero_rope":
        return torch.where(positions < limit, positions, torch.zeros_like(positions))
    return positions.clamp_max(limit - 1)


def draft_phase(ctx: StepContext, state: SpecState) -> tuple[Draft, torch.Tensor]:
    """Grow the draft below each row's pending token; returns the draft and the root tokens (B,)."""
    root = state.codes.gather(1, (state.decided - 1)[:, None])[:, 0]
    session = DraftSession(
        ctx.model,
        ctx.drafter,
        ctx.drafter_cache,
        ctx.sampling,
        state.root_feature,
        state.length,
        state.decided,
        state.drafter_valid,
        ctx.draft.nodes + 1,
        past_grid(ctx.rule),
    )
    return ctx.draft.grow(session, root, state.keys, state.decided, ctx.mode), root


def verify_phase(ctx: StepContext, state: SpecState, draft: Draft) -> tuple[torch.Tensor, torch.Tensor]:
    """One target forward over ``[root, nodes]`` at slots ``L .. L+N``; returns p (B, N+1, V), from the
    final-norm state, and the features the drafter reads (rows, N+1, D), or (rows, N+1, len(taps) * D)
    for a drafter with taps (the target's states entering those layers, fused once the path is known)."""
    model, groups = ctx.model, ctx.groups
    count = draft.num_nodes
    mask = tree_attention_mask(
        state.target_valid[: state.length.shape[0]], state.length, draft.ancestors
    )  # (B, 1, N+1, W)
    slots = state.length[:, None] + torch.arange(count, device=state.length.device)  # (B, N+1)
    positions = grid_positions(state.length[:, None] + draft.depth, model.config.max_seq_len, past_grid(ctx.rule))
    logits, features = model.forward_tokens(
        repeat_rows(draft.tokens, groups),
        repeat_rows(positions, groups),
        repeat_rows(slots, groups),
        repeat_rows(mask, groups),
        ctx.target_cache,
        ctx.drafter.config.taps,
    )  # (rows, N+1, V), (rows, N+1, D or len(taps) * D)
    steps = None if ctx.sampling.last_guided_token is None else state.decided[:, None] + draft.depth
    p = verification_probabilities(guided_logits_at(logits, ctx.sampling, steps), ctx.sampling)
    return p, features


def walk_phase(ctx: StepContext, state: SpecState, draft: Draft, p: torch.Tensor, audit: bool) -> Walk:
    """Accept a path and draw the next token (see :func:`walk_tree`)."""
    return walk_tree(draft, p, ctx.rule, ctx.sampling, state.keys, state.decided, audit=audit)


def advance_phase(
    ctx: StepContext, state: SpecState, draft: Draft, root: torch.Tensor, walk: Walk, features: torch.Tensor
) -> tuple[SpecState, StepLog]:
    """Write the accepted tokens, move their target cache entries into place, let the drafter consume them
    with their target ``features`` (as :func:`verify_phase` returns them)."""
    groups, depth = ctx.groups, draft.max_depth
    decided, length = state.decided, state.length
    batch = decided.shape[0]
    device = decided.device
    span = torch.arange(depth + 1, device=device)
    active = decided < ctx.num_tokens  # (B,) finished rows run along without advancing
    accepted = walk.accepted
    advance = torch.where(active, accepted + 1, torch.zeros_like(accepted))
    path_nodes = torch.cat([torch.zeros(batch, 1, dtype=torch.long, device=device), walk.path], dim=1)  # (B, D+1)
    on_path = (span[None, :] <= accepted[:, None]) & active[:, None]
    source = torch.where(on_path, path_nodes.clamp_min(0), span[None, :])  # self-copies past the path
    new_tokens = torch.cat([draft.tokens.gather(1, walk.path.clamp_min(0)), root[:, None]], dim=1)
    new_tokens.scatter_(1, accepted[:, None], walk.next_token[:, None])  # (B, D+1): path, then the drawn token
    codes = state.codes.scatter(1, decided[:, None] + span[None, :], new_tokens)
    if not draft.chain:  # a chain's node d sits at slot L + d, so its accepted path is already in place
        ctx.target_cache.move(
            repeat_rows(length[:, None] + source, groups), repeat_rows(length[:, None] + span[None, :], groups)
        )

    path_features = features.gather(
        1, repeat_rows(source, groups)[:, :, None].expand(-1, -1, features.shape[-1])
    )  # (rows, D+1, F): F = D, or len(taps) * D
    chain = torch.ones(depth + 1, depth + 1, dtype=torch.bool, device=device).tril().expand(batch, -1, -1)
    out = drafter_consume(
        ctx.model, ctx.drafter, ctx.drafter_cache, new_tokens, path_features, length, state.drafter_valid[:batch], chain
    )
    root_feature = out.gather(1, repeat_rows(accepted, groups)[:, None, None].expand(-1, 1, out.shape[-1]))[:, 0]

    log = StepLog(torch.where(active, accepted, -1), walk.tv, walk.merged)
    new_state = state._replace(
        codes=codes, decided=decided + advance, length=length + advance, root_feature=root_feature
    )
    return new_state, log


def speculative_step(ctx: StepContext, state: SpecState, audit: bool = True) -> tuple[SpecState, StepLog]:
    """Draft, verify, walk, advance. ``audit``: measure the rule's costly realised TVs this step."""
    draft, root = draft_phase(ctx, state)
    p, features = verify_phase(ctx, state, draft)
    walk = walk_phase(ctx, state, draft, p, audit)
    return advance_phase(ctx, state, draft, root, walk, features)
