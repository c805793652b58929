"""A ratio-weighted speculative test and the law it emits: accept a draft with ``min(1, w p(x) / q(x))``.

Two rules relax the speculative test by a weight ``w`` on the target's mass: Cool-SD (``w`` decays with the
draft depth, :mod:`lantern.rules.cool_sd`) and the entropy-aware rule (``w`` grows with the target's
entropy, :mod:`lantern.rules.entropy_aware`). This module is their common maths, written once.

**One sampled draft** ``x ~ q``, accepted with ``a(x) = min(1, w p(x) / q(x))``, otherwise replaced by a draw
from a resampling law ``r``: the emitted token follows ``P = A + (1 - sum A) r`` with ``A = min(q, w p)``.
Over every ``r``, ``TV(p, P)`` is smallest, and equal to ``sum max(0, A - p)``, exactly when ``(1 - sum A) r``
stays under ``max(0, p - A)``; Cool-SD's choice (the paper: the resampling law "that minimizes an upper bound
of the distance") is ``r* = norm(max(0, p - A))``, which does. So

    P = A + (1 - sum A) norm(max(0, p - A)),        TV(p, P) = sum max(0, min(q, w p) - p)        (1)

(:func:`weighted_law`). Two facts make (1) a *relaxation* in the harness's sense (:mod:`lantern.rules.api`:
a law ``p'`` fixed before the node's draws, then an exact test of ``p'``):

* for ``w >= 1``, ``min(q, P) = A`` and ``norm(max(0, P - q)) = norm(max(0, p - q)) = r*``: the exact test
  of ``P`` (accept with ``min(1, P / q)``, residual ``norm(max(0, P - q))``) *is* the weighted test with
  ``r*``, draw for draw;
* for ``w <= 1``, ``A <= p`` and ``P = p``: the weighted test is lossless but rejects drafts the exact test
  of ``p`` accepts. The rules here run the exact test there (same law, acceptance no lower) and say so.

**Deterministic candidates** (the drafter's top children, each a point mass: ``q = 1`` at ``x``): sibling
``s`` is accepted with ``min(1, w p_s(x_s))``, ``p_s`` the target after the earlier siblings were rejected
(with ``w >= 1`` the optimal residual just removes the rejected sibling, as the exact rule does); the node's
law in closed form is :func:`weighted_sibling_law`, and the exact deterministic test of it (one draw
``y ~ p'``, the sibling equal to ``y`` accepted) has the same acceptance probabilities. ``w < 1`` gives ``p``.
"""

from __future__ import annotations

import torch

from lantern.rules.exact import normalised, realised_tv


def weighted_acceptance(p: torch.Tensor, q: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``min(1, w p / q)`` elementwise (..., V) for weights ``weight`` (...,): the chance a draft ``x ~ q`` passes
    the weighted test (0 where ``q = 0``: such a token is never drafted)."""
    scaled = weight[..., None] * p
    return torch.where(q > 0, scaled / q.clamp_min(1e-30), torch.zeros_like(p)).clamp_max(1.0)


def weighted_law(p: torch.Tensor, q: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. (1): the law ``P`` (..., V) of the token a position emits when a draft ``x ~ q`` is accepted with
    ``min(1, w p(x) / q(x))`` and a rejection draws ``norm(max(0, p - min(q, w p)))``, and ``TV(p, P)`` (...,)
    in float32. ``weight`` (...,) >= 0; ``P = p`` where ``w <= 1``."""
    taken = torch.minimum(q, weight[..., None] * p)  # (..., V) A: the mass accepted drafts carry
    left = (1 - taken.sum(-1, keepdim=True)).clamp_min(0)  # (..., 1) the chance of a rejection
    law = taken + left * normalised((p - taken).clamp_min(0), p)
    return law, realised_tv(p, law)


def weighted_sibling_law(
    p: torch.Tensor, tokens: torch.Tensor, valid: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The law ``p'`` (R, V) of a node whose deterministic siblings ``tokens`` (R, K) (``valid`` marks real ones;
    distinct) are tried in order, sibling ``s`` accepted with ``min(1, w p_s(x_s))`` (``p_s``: ``p`` without
    the earlier siblings, renormalised), the node's token drawn from ``p`` without every sibling when all fail;
    and the mass moved onto each sibling, ``p'(x_s) - p(x_s)`` (R, K). ``weight`` (R,); ``max(1, w)`` is used
    (a weight below 1 emits ``p``, see the module docstring)."""
    weight = weight.clamp_min(1.0)[:, None]  # (R, 1)
    xs = tokens.clamp_min(0)
    mass = p.gather(1, xs) * valid  # (R, K) p(x_s), 0 for missing siblings
    before = mass.cumsum(1) - mass  # (R, K) mass of the siblings tried before s
    share = mass / (1 - before).clamp_min(1e-30)  # (R, K) p_s(x_s)
    accept = torch.minimum(share * weight, torch.ones_like(share)) * valid  # (R, K)
    untried = torch.cumprod(1 - accept, dim=1)  # (R, K) the chance siblings 0..s all fail
    reach = torch.cat([torch.ones_like(untried[:, :1]), untried[:, :-1]], dim=1)  # (R, K) s is tried
    chosen = reach * accept  # (R, K) p'(x_s)
    sibling = torch.zeros_like(p).scatter_add(1, xs, valid.to(p.dtype)) > 0  # (R, V) (add: order-free)
    rest = normalised(p.masked_fill(sibling, 0.0), p)  # (R, V) p without the siblings
    law = (untried[:, -1:] * rest).scatter_add(1, xs, chosen)
    return law, chosen - mass
