"""Walking a draft tree with an acceptance rule: which path is accepted and what comes next.

From the root, the children of the current node are handed to the rule
(:meth:`~lantern.speculative.acceptance.AcceptanceRule.try_siblings`), which tries them in order.
At every level a token ``y`` is drawn from the current node's target distribution (the argmax
when greedy); deterministic and greedy rules accept the sibling that ``y`` selects and, when none
does, emit ``y`` itself, which is exactly the sequential test in one step. Rules without such a form
(sampled candidates) try siblings in order and leave a residual to draw from. An accepted child
becomes the current node; after the last accepted node of a full path the next token is drawn
there. Everything is vectorised over rows; the loop runs over depth only (rules loop over siblings
where no closed form exists), and nothing synchronises with the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lantern import rng
from lantern.sampling import SamplingConfig, exponentials, race
from lantern.speculative.acceptance import AcceptanceRule
from lantern.speculative.draft import Draft


@dataclass
class Walk:
    """The outcome for B rows.

    ``path`` (B, D) accepted node indices by depth (-1 past the end); ``accepted`` (B,) how many;
    ``next_token`` (B,) the token drawn after the last accepted node; ``tv`` (B, D) the realised
    total-variation mass of each accepted candidate (0 for exact rules).
    """

    path: torch.Tensor
    accepted: torch.Tensor
    next_token: torch.Tensor
    tv: torch.Tensor


def walk_tree(
    draft: Draft, p: torch.Tensor, rule: AcceptanceRule, sampling: SamplingConfig, keys: torch.Tensor, step: torch.Tensor,
) -> Walk:
    """Verify ``draft`` against the target distributions ``p`` (B, N+1, V) at every node.

    ``rule`` must already be set for the draft's kind of candidates. Uniforms come from the
    counter-based generator keyed by ``(keys, step)`` (one ``step`` (B,) per verification step), so a
    row's outcome depends only on its own sample.
    """
    batch, count, vocab = p.shape
    depth_max = draft.max_depth
    siblings = draft.children.shape[2]
    device = p.device
    rows = torch.arange(batch, device=device)
    uniforms = rng.uniform(keys, step, rng.ACCEPT, max(1, depth_max * siblings))  # (B, D*K)
    races = None if sampling.greedy else exponentials(keys, step, rng.LEVEL, depth_max + 1, vocab)  # (B, D+1, V)
    current = torch.zeros(batch, dtype=torch.long, device=device)
    alive = torch.ones(batch, dtype=torch.bool, device=device)
    target = p[:, 0]  # (B, V)
    proposal = draft.q[:, 0]
    path = torch.full((batch, depth_max), -1, dtype=torch.long, device=device)
    tv = torch.zeros(batch, depth_max, dtype=p.dtype, device=device)
    emitted = torch.full((batch,), -1, dtype=torch.long, device=device)  # token fixed by the stopping level
    for level in range(depth_max):
        kids = draft.children[rows, current]  # (B, K)
        tokens = draft.tokens.gather(1, kids.clamp_min(0))  # (B, K)
        valid = alive[:, None] & (kids >= 0)
        drawn = race(target, None if races is None else races[:, level], sampling)  # (B,) y ~ p at the current node
        outcome = rule.try_siblings(
            target, tokens, valid, proposal, uniforms[:, level * siblings : (level + 1) * siblings], drawn
        )
        got = outcome.chosen >= 0
        chosen = torch.where(got, kids.gather(1, outcome.chosen.clamp_min(0)[:, None])[:, 0], -1)
        path[:, level] = chosen
        tv[:, level] = torch.where(got, outcome.tv, 0.0)
        if outcome.emitted is not None:
            emitted = torch.where(alive & ~got, outcome.emitted, emitted)
        target = torch.where(alive[:, None], outcome.target, target)
        proposal = torch.where(alive[:, None], outcome.proposal, proposal)
        alive = alive & got
        current = torch.where(got, chosen, current)
        target = torch.where(got[:, None], p[rows, current], target)
        proposal = torch.where(got[:, None], draft.q[rows, current], proposal)
    accepted = (path >= 0).sum(-1)
    drawn = race(target, None if races is None else races[:, depth_max], sampling)
    next_token = torch.where(emitted >= 0, emitted, drawn)
    return Walk(path=path, accepted=accepted, next_token=next_token, tv=tv)
