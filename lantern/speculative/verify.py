"""Walking a draft tree with an acceptance rule: which path is accepted and what comes next.

From the root, the children of the current node are tried in order with the rule. An accepted
child becomes the current node; when every child is rejected (or there are none) the walk stops and
one more token is drawn from the rule's residual (or, at a leaf or after the last accepted node with
no children tried, from the target distribution there). With sampled candidates a rejected sibling's
token is also removed from ``q`` before the next sibling is tried (recursive rejection sampling,
which is lossless for siblings drawn without replacement). Everything is vectorised over rows; the
loops run over depth and siblings only, and nothing synchronises with the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lantern import rng
from lantern.sampling import SamplingConfig, draw
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


def _without(q: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``q`` (R, V) with token ``x`` (R,) removed and renormalised (left as is if nothing remains)."""
    removed = q.scatter(1, x[:, None], 0.0)
    total = removed.sum(-1, keepdim=True)
    return torch.where(total > 0, removed / total.clamp_min(1e-30), q)


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
    current = torch.zeros(batch, dtype=torch.long, device=device)
    alive = torch.ones(batch, dtype=torch.bool, device=device)
    target = p[:, 0]  # (B, V)
    proposal = draft.q[:, 0]
    path = torch.full((batch, depth_max), -1, dtype=torch.long, device=device)
    tv = torch.zeros(batch, depth_max, dtype=p.dtype, device=device)
    sampled = rule.candidates == "sampled"
    for level in range(depth_max):
        kids = draft.children[rows, current]  # (B, K)
        chosen = torch.full((batch,), -1, dtype=torch.long, device=device)
        moved = torch.zeros(batch, dtype=p.dtype, device=device)
        for slot in range(siblings):
            node = kids[:, slot]
            trying = alive & (node >= 0) & (chosen < 0)  # (B,)
            token = draft.tokens[rows, node.clamp_min(0)]
            verdict = rule.verify(target, token, proposal, uniforms[:, level * siblings + slot])
            accept = trying & verdict.accept
            reject = trying & ~verdict.accept
            chosen = torch.where(accept, node, chosen)
            moved = torch.where(accept, verdict.tv.to(p.dtype), moved)
            target = torch.where(reject[:, None], rule.residual(target, proposal, token), target)
            if sampled:
                proposal = torch.where(reject[:, None], _without(proposal, token), proposal)
        got = chosen >= 0
        path[:, level] = chosen
        tv[:, level] = moved
        alive = alive & got
        current = torch.where(got, chosen, current)
        target = torch.where(got[:, None], p[rows, current], target)
        proposal = torch.where(got[:, None], draft.q[rows, current], proposal)
    accepted = (path >= 0).sum(-1)
    next_token = draw(target, sampling, keys, step, rng.RESIDUAL)
    return Walk(path=path, accepted=accepted, next_token=next_token, tv=tv)
