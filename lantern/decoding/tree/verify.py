"""Walking a draft tree with an acceptance rule: which path is accepted and what comes next.

From the root, the candidates of the current node are handed to the rule
(:meth:`~lantern.rules.api.Rule.node`), which relaxes the node's target (or not), draws the node's
token ``y`` where its test has a closed form, and tries the candidates in order. An accepted candidate that is a tree node becomes the current node; an accepted candidate
outside the tree (a sampled draw the tree dropped) is the step's last token; when none is accepted
the node's token is ``y`` or a draw from the rule's residual. After a full path the next token is
drawn at its last node. Everything is vectorised over rows; the loop runs over depth only, and
nothing synchronises with the device (eagerly on the CPU, where reading a flag waits for nothing, the loop
stops at the first level no row reaches: :func:`lantern.models.devices.needed`). A rule with a ``walk`` hook (the authors' greedy LANTERN)
chooses among whole paths instead. On a chain every level tests a node known before the walk (node
``d`` at level ``d``), so a rule with a ``relax`` hook relaxes all of them in one call first: one
relaxation over ``B * D`` rows instead of ``D`` over ``B`` (a third of the kernels and calls on a
chain(3)), with the same values row by row. Compiled for the CPU the deepest level is left out of that call
and relaxed only when some row reaches it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lantern import rng
from lantern.decoding.tree.draft import Draft
from lantern.models.devices import needed
from lantern.models.sampling import SamplingConfig, as_exponentials, race
from lantern.rules.api import Relaxed, Rule


@dataclass
class Walk:
    """The outcome for B rows.

    ``path`` (B, D) accepted tree nodes by depth (-1 past the end); ``accepted`` (B,) how many;
    ``next_token`` (B,) the token after the last accepted node; ``tv`` (B, D+1) the realised total
    variation of the law each emitted token was drawn from (entry j for the j-th token of the step,
    j <= accepted; NaN where not measured); ``merged`` (B, D) the mass the relaxation moved onto each
    accepted candidate (0 for exact rules).
    """

    path: torch.Tensor
    accepted: torch.Tensor
    next_token: torch.Tensor
    tv: torch.Tensor
    merged: torch.Tensor


def walk_tree(
    draft: Draft,
    p: torch.Tensor,
    rule: Rule,
    sampling: SamplingConfig,
    keys: torch.Tensor,
    step: torch.Tensor,
    audit: bool = True,
) -> Walk:
    """Verify ``draft`` against the target distributions ``p`` (B, N+1, V) at every node.

    ``rule`` is the rule for the draft's kind of candidates. Uniforms come from the
    counter-based generator keyed by ``(keys, step)`` (one ``step`` (B,) per verification step), so a
    row's outcome depends only on its own sample. ``audit``: measure costly realised TVs this step.
    """
    batch, count, vocab = p.shape
    depth_max = draft.max_depth
    if rule.walk is not None:
        path, next_token, tv, merged = rule.walk(draft, p, sampling, keys, step, audit)
        return Walk(path=path, accepted=(path >= 0).sum(-1), next_token=next_token, tv=tv, merged=merged)
    siblings = draft.candidates.shape[2]
    device = p.device
    rows = torch.arange(batch, device=device)
    uniforms, races = _walk_randomness(keys, step, sampling, depth_max, siblings, vocab)
    current = torch.zeros(batch, dtype=torch.long, device=device)
    alive = torch.ones(batch, dtype=torch.bool, device=device)
    path = torch.full((batch, depth_max), -1, dtype=torch.long, device=device)
    tv = torch.zeros(batch, depth_max + 1, dtype=p.dtype, device=device)
    merged = torch.zeros(batch, depth_max, dtype=p.dtype, device=device)
    stop_token = torch.full((batch,), -1, dtype=torch.long, device=device)  # token fixed at the stopping level
    target = p[:, 0]  # (B, V) the law to draw the final token from if nothing fixed it
    ahead = draft.chain and rule.relax is not None
    # A compiled CPU graph reads a device flag for free: there the deepest level is relaxed only when some row
    # reaches it, the others together (their rows are what the CPU threads split). On a GPU the read would wait
    # for the device, and eagerly a branch costs more than it saves: every level in one call.
    lazy = ahead and device.type == "cpu" and torch.compiler.is_compiling()
    levels = depth_max - 1 if lazy else depth_max  # relaxed in one call before the walk
    ahead = _relax_chain(draft, p, rule, levels) if ahead and levels > 0 else None
    for level in range(depth_max):
        if level and not needed(alive):  # eager CPU: no row reaches this level, and later levels change nothing
            break
        kids = draft.children[rows, current]  # (B, K) tree nodes (-1: not in the tree)
        tokens = draft.candidates[rows, current]  # (B, K)
        valid = alive[:, None] & (tokens >= 0)
        node_p, node_q = p[rows, current], draft.q[rows, current]  # (B, V) each
        extra = {"depth": torch.full((batch,), level, dtype=torch.long, device=device)}  # (B,) draft depth
        if ahead is not None and level < ahead[1].shape[1]:
            extra["relaxed"] = Relaxed(*(part[:, level] for part in ahead))
        elif lazy:
            extra["relaxed"] = _relax_reached(rule, node_p, tokens, valid, node_q, alive, extra["depth"], level)
        outcome = rule.node(
            node_p,
            tokens,
            valid,
            node_q,
            uniforms[:, level * siblings : (level + 1) * siblings],
            None if races is None else races[:, level],
            sampling,
            audit,
            **extra,
        )
        got = outcome.chosen >= 0
        slot = outcome.chosen.clamp_min(0)[:, None]
        node = torch.where(got, kids.gather(1, slot)[:, 0], -1)
        descend = alive & got & (node >= 0)
        ends_here = alive & ~descend  # this node's token ends the step
        tv[:, level] = torch.where(alive, outcome.tv, tv[:, level])
        fixed = torch.where(got, tokens.gather(1, slot)[:, 0], -1)  # a dropped draw that was accepted
        if outcome.emitted is not None:
            fixed = torch.where(got, fixed, outcome.emitted)
        stop_token = torch.where(ends_here, fixed, stop_token)
        target = torch.where(ends_here[:, None], outcome.target, target)
        path[:, level] = torch.where(descend, node, -1)
        merged[:, level] = torch.where(descend, outcome.merged, 0.0)
        alive = descend
        current = torch.where(descend, node, current)
    target = torch.where(alive[:, None], p[rows, current], target)  # rows that reached the deepest level
    drawn = race(target, None if races is None else races[:, depth_max], sampling)
    next_token = torch.where(stop_token >= 0, stop_token, drawn)
    return Walk(path=path, accepted=(path >= 0).sum(-1), next_token=next_token, tv=tv, merged=merged)


def _walk_randomness(keys, step, sampling: SamplingConfig, depth_max: int, siblings: int, vocab: int):
    """The walk's uniforms (B, D*K) for the candidates' tests and, when sampling, the exponential races
    (B, D+1, V) that draw a level's token (None when greedy)."""
    tests = (rng.ACCEPT, max(1, depth_max * siblings))
    if sampling.greedy:
        return rng.uniform(keys, step, *tests), None
    # Both streams in one pass (the same numbers as two uniform() calls).
    uniforms, levels = rng.uniforms(keys, step, (tests, (rng.LEVEL, (depth_max + 1) * vocab)))
    return uniforms, as_exponentials(levels, depth_max + 1, vocab)


def _relax_chain(
    draft: Draft, p: torch.Tensor, rule: Rule, depth: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The relaxed laws of a chain's nodes ``0 .. depth-1`` in one call: ``target`` (B, depth, V), ``tv``
    (B, depth), ``gain`` (B, depth, K).

    A row that stops before level ``d`` still gets node ``d`` relaxed (as if its candidates were live);
    the walk never reads that row's outcome at that level, so only the work is spent, not the result.
    """
    batch, _, vocab = p.shape
    tokens = draft.candidates[:, :depth]  # (B, D, K)
    relaxed = rule.relax(
        p[:, :depth].reshape(batch * depth, vocab),
        tokens.reshape(batch * depth, -1),
        (tokens >= 0).reshape(batch * depth, -1),
        draft.q[:, :depth].reshape(batch * depth, vocab),
        torch.arange(depth, device=p.device).repeat(batch),  # (B*D,) row b*D + d tests depth d
    )
    return (
        relaxed.target.view(batch, depth, vocab),
        relaxed.tv.view(batch, depth),
        relaxed.gain.view(batch, depth, -1),
    )


def _relax_reached(rule: Rule, p, tokens, valid, q, alive: torch.Tensor, depth: torch.Tensor, level: int) -> Relaxed:
    """The relaxed law of the nodes at ``level`` (``p``, ``q`` (B, V), candidates ``tokens`` (B, K), draft depth
    ``depth`` (B,)), computed only if some row is ``alive`` there (level 0: always); otherwise ``p`` unrelaxed,
    which no live row reads. On a chain at batch 1 every level past the first rejection is skipped: a chain(3)
    at tau 2.5 relaxes about two of its three nodes a step."""
    if level == 0:
        return rule.relax(p, tokens, valid, q, depth)

    def relax(p, tokens, valid, q, depth):
        relaxed = rule.relax(p, tokens, valid, q, depth)
        return relaxed.target.clone(), relaxed.tv, relaxed.gain  # a branch may not return its input (p' = p)

    def skip(p, tokens, valid, q, depth):
        return p.clone(), p.new_zeros(p.shape[0]), p.new_zeros(tokens.shape)

    return Relaxed(*torch.cond(alive.any(), relax, skip, (p, tokens, valid, q, depth)))
