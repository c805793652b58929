"""Relaxations: the law a speculative step samples from, fixed before any draw, within a TV budget.

A relaxation turns the target distribution ``p`` at a tree node into a relaxed target ``p'`` from
``p``, the codebook neighbour table and what is already fixed before anything random happens at
that node: its deterministic candidates, or the drafter distribution ``q`` its sampled candidates
will be drawn from. The candidate test then runs an exact (lossless) rule against ``p'``, so the
token emitted at the node is distributed exactly as ``p'`` and its realised total variation from the
target is ``TV(p, p') = sum of the moved mass``, known in closed form. The bound is therefore a
property of the relaxation alone, whatever the draft structure or candidate kind:

* deterministic and greedy candidates (``merge``): siblings in order each take the longest prefix of
  their k nearest codebook neighbours (by distance; other siblings count as 0 and are never taken)
  whose target mass fits the budget left; the prefix's mass is moved onto the sibling. LANTERN's
  budget is ``delta`` shared by all siblings of the node; LANTERN++ caps each sibling at
  ``(lambda - 1) p(x)``. With one candidate this is exactly LANTERN's ``A(x)``, ``p~(x) = p(x) + S_m``.
* sampled candidates (``transport``): every token ``y`` with surplus ``p(y) > q(y)`` (the 256 largest)
  offers it to its nearest neighbour with a deficit ``q(x) > p(x)``, searched among its first
  ``min(k, scan)`` neighbours (``scan=None``: all k). The search is the walk's largest cost (a gather
  and an arg-max over donors x columns), so ``scan`` defaults to 128: on the 6-layer world shipped
  before 3bbc836 (LANTERN d 0.4, sampled chain, 8 images) 3.6% of the donors' first deficit
  neighbour lay beyond column 128, holding 0.6% of the offered mass (beyond 32: 16% and 6.5%), which then stays where it is; each receiver takes at
  most its deficit (LANTERN++: at most ``(lambda - 1) p(x)``), and LANTERN scales all transfers so
  they sum to at most ``delta``. Each unit moved raises ``sum min(p', q)``, the acceptance
  probability of a sampled candidate, by one unit.

Every function is vectorised over rows and loops only over the siblings of a node (at most top-k).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from lantern.errors import ConfigError


@dataclass(frozen=True)
class Relaxed:
    """``target`` (R, V) the relaxed law ``p'``; ``tv`` (R,) ``TV(p, p')``; ``gain`` (R, K) the mass
    moved onto each candidate (zeros for sampled candidates, whose gains are spread over the vocabulary)."""

    target: torch.Tensor
    tv: torch.Tensor
    gain: torch.Tensor


def identity(p: torch.Tensor, tokens: torch.Tensor) -> Relaxed:
    """No relaxation: ``p' = p``."""
    return Relaxed(target=p, tv=p.new_zeros(p.shape[0]), gain=torch.zeros(tokens.shape, dtype=p.dtype, device=p.device))


class NeighbourTable:
    """A (V, k) int64 table of each code's nearest other codes, nearest first, and how it was built.

    ``normalize`` is True (l2-normalised rows), False (raw rows) or None (unknown: a bare tensor).
    """

    def __init__(self, indices: torch.Tensor, normalize: bool | None = None):
        if not isinstance(indices, torch.Tensor) or indices.ndim != 2 or indices.dtype.is_floating_point or indices.dtype == torch.bool:
            shape = tuple(indices.shape) if isinstance(indices, torch.Tensor) else type(indices).__name__
            raise ConfigError(f"neighbours must be a (V, k_max) integer table, got {shape}")
        self.indices = indices.to(torch.int64)
        self.normalize = normalize
        self._on: dict[tuple[torch.device, int], torch.Tensor] = {}  # (device, k) -> columns

    @property
    def num_codes(self) -> int:
        return self.indices.shape[0]

    @property
    def k_max(self) -> int:
        return self.indices.shape[1]

    def columns(self, k: int, device: torch.device) -> torch.Tensor:
        """The first ``k`` columns on ``device`` (copied there once)."""
        key = (device, k)
        if key not in self._on:
            self._on[key] = self.indices[:, :k].contiguous().to(device)
        return self._on[key]

    def check(self, p: torch.Tensor) -> None:
        """Refuse a target over another vocabulary (a table made for another codebook)."""
        if p.shape[-1] != self.num_codes:
            raise ConfigError(
                f"neighbour table has {self.num_codes} rows but the target distribution has {p.shape[-1]} codes: "
                "it was built for another codebook"
            )


def as_table(neighbours, k: int) -> NeighbourTable:
    """``neighbours`` (a :class:`NeighbourTable` or an integer tensor) checked to hold ``k`` columns."""
    table = neighbours if isinstance(neighbours, NeighbourTable) else NeighbourTable(neighbours)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= table.k_max:
        raise ConfigError(
            f"k={k!r} must be an integer in [1, {table.k_max}] (the neighbour table has k_max={table.k_max} columns; "
            "a larger table: model.neighbours.k_max=...)"
        )
    if k >= table.num_codes:
        raise ConfigError(f"k={k!r} must be < the codebook size V={table.num_codes}")
    return table


def check_delta(delta) -> float:
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not math.isfinite(delta) or not 0 <= delta <= 1:
        raise ConfigError(f"delta={delta!r} must be a number in [0, 1]")
    return float(delta)


SCAN = 128  # default receiver search of the transport (columns of the neighbour table); see the module docstring


def check_scan(scan) -> int | None:
    if scan is not None and (isinstance(scan, bool) or not isinstance(scan, int) or scan < 1):
        raise ConfigError(f"scan={scan!r} must be an integer >= 1 or null (all k neighbours)")
    return scan


def check_lambda(lam) -> float:
    if isinstance(lam, bool) or not isinstance(lam, (int, float)) or not math.isfinite(lam) or not lam >= 1:
        raise ConfigError(f"lambda={lam!r} must be a finite number >= 1")
    return float(lam)


class NeighbourRelaxation:
    """LANTERN's latent proximity relaxation with a TV budget: ``delta`` (shared per node) and/or a
    per-receiver cap ``(lam - 1) p(x)``. ``delta=None`` means no shared budget (LANTERN++)."""

    def __init__(self, k: int, neighbours, delta: float | None = None, lam: float | None = None, donors: int = 256,
                 scan: int | None = SCAN):
        self.table = as_table(neighbours, k)
        self.k = k
        self.delta = delta
        self.lam = lam
        self.donors = donors
        self.scan = k if scan is None else min(k, check_scan(scan))

    def _cap(self, p: torch.Tensor, px: torch.Tensor) -> torch.Tensor:
        """The most a receiver with target mass ``px`` may gain: (R,) or (R, V)."""
        if self.lam is None:
            return torch.full_like(px, math.inf)
        return (self.lam - 1.0) * px

    def relax(self, p: torch.Tensor, tokens: torch.Tensor, valid: torch.Tensor, q: torch.Tensor, kind: str) -> Relaxed:
        """``p'`` for a node with target ``p`` (R, V), candidates ``tokens`` (R, K) (``valid`` marks real
        ones) and drafter ``q`` (R, V); ``kind`` is ``sampled``, ``deterministic`` or ``greedy``."""
        self.table.check(p)
        if kind == "sampled":
            return self.transport(p, q, valid.any(dim=1), tokens.shape[1])
        return self.merge(p, tokens, valid)

    def merge(self, p: torch.Tensor, tokens: torch.Tensor, valid: torch.Tensor) -> Relaxed:
        """Move neighbour mass onto fixed candidates, siblings in order, within the budget."""
        rows, count = tokens.shape
        table = self.table.columns(self.k, p.device)  # (V, k)
        target = p.clone()  # (R, V)
        sibling = torch.zeros(p.shape, dtype=torch.bool, device=p.device).scatter_(1, tokens.clamp_min(0), valid)  # (R, V)
        budget = torch.full((rows,), math.inf if self.delta is None else self.delta, dtype=p.dtype, device=p.device)
        gain = torch.zeros(rows, count, dtype=p.dtype, device=p.device)
        for slot in range(count):
            x = tokens[:, slot].clamp_min(0)  # (R,)
            live = valid[:, slot]
            near = table[x]  # (R, k) nearest first
            other = sibling.gather(1, near)  # (R, k) siblings are never taken
            weight = target.gather(1, near).masked_fill(other, 0.0)  # (R, k)
            cumulative = weight.cumsum(dim=1)
            limit = torch.minimum(budget, self._cap(p, p.gather(1, x[:, None])[:, 0]))  # (R,)
            taken = (cumulative <= limit[:, None]).to(torch.int64).cumprod(dim=1).bool() & live[:, None] & ~other
            moved = (weight * taken).sum(dim=1)  # (R,)
            target = target.scatter(1, near, target.gather(1, near).masked_fill(taken, 0.0))
            target = target.scatter_add(1, x[:, None], moved[:, None])
            budget = budget - moved
            gain[:, slot] = moved
        return Relaxed(target=target, tv=gain.sum(dim=1), gain=gain)

    def transport(self, p: torch.Tensor, q: torch.Tensor, active: torch.Tensor, count: int = 0) -> Relaxed:
        """Move surplus mass ``p > q`` to the nearest deficit neighbour ``q > p``, within the budget.

        ``active`` (R,) marks nodes that have candidates; other rows keep ``p``. ``count``: the
        width of the returned (all-zero) ``gain``. Only the ``donors`` largest surpluses offer mass
        (they hold nearly all of it; scanning every token's k neighbours would cost O(V k) per row), and
        each searches its first ``scan`` neighbours for a receiver.
        """
        rows, vocab = p.shape
        table = self.table.columns(self.scan, p.device)  # (V, scan)
        surplus = (p - q).clamp_min(0) * active[:, None]  # (R, V)
        deficit = (q - p).clamp_min(0) * active[:, None]
        offer, donor = surplus.topk(min(self.donors, vocab), dim=1)  # (R, M) the largest surpluses
        needy = (deficit > 0).to(torch.uint8)  # (R, V)
        near = table[donor]  # (R, M, scan) each donor's nearest codes
        near_needy = needy.gather(1, near.flatten(1)).view(near.shape)  # (R, M, scan): in deficit?
        first = near_needy.argmax(dim=2)  # (R, M) the first such neighbour (0 when none)
        found = near_needy.amax(dim=2).bool()  # (R, M)
        receiver = near.gather(2, first[:, :, None])[:, :, 0]  # (R, M) where each offer goes
        offer = torch.where(found, offer, torch.zeros_like(offer))
        claimed = torch.zeros_like(p).scatter_add_(1, receiver, offer)  # (R, V) offers per receiver
        cap = torch.minimum(deficit, self._cap(p, p))  # (R, V)
        share = torch.where(claimed > 0, torch.clamp(cap / claimed.clamp_min(1e-30), max=1.0), torch.zeros_like(cap))
        given = offer * share.gather(1, receiver)  # (R, M)
        if self.delta is not None:
            total = given.sum(dim=1, keepdim=True)  # (R, 1)
            given = given * torch.clamp(self.delta / total.clamp_min(1e-30), max=1.0)
        target = p.scatter_add(1, donor, -given).scatter_add(1, receiver, given).clamp_min(0)  # (R, V)
        return Relaxed(target=target, tv=given.sum(dim=1), gain=torch.zeros(rows, count, dtype=p.dtype, device=p.device))
