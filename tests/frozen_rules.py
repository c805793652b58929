"""FROZEN ORACLE, do not edit: the relaxations and reference node as they were at commit 4df88c0.

``tests/test_relaxation_speed_law.py`` checks that the rewritten, cheaper rules (``lantern.rules``) give the
same relaxed laws and acceptance probabilities as these, and ``scripts/bench_rules.py`` times the two side by
side. Only the methods the rewrite changed are frozen here; everything else is inherited.
"""

from __future__ import annotations

import math

import torch

from lantern.models.sampling import SamplingConfig, race
from lantern.rules.api import Composed, NodeOutcome, Relaxed
from lantern.rules.exact import first
from lantern.rules.reference import LanternReference, _renormalised
from lantern.rules.relaxation import NeighbourRelaxation


class FrozenRelaxation(NeighbourRelaxation):
    """``NeighbourRelaxation`` at 4df88c0."""

    def merge(self, p: torch.Tensor, tokens: torch.Tensor, valid: torch.Tensor) -> Relaxed:
        """Move neighbour mass onto fixed candidates, siblings in order, within the budget."""
        rows, count = tokens.shape
        table = self.table.columns(self.k, p.device)  # (V, k)
        target = p.clone()  # (R, V)
        sibling = torch.zeros(p.shape, dtype=torch.bool, device=p.device).scatter_(
            1, tokens.clamp_min(0), valid
        )  # (R, V)
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
        """The transport at 4df88c0 (see ``NeighbourRelaxation.transport``)."""
        rows, vocab = p.shape
        table = self.table.columns(self.scan, p.device)  # (V, scan)
        surplus = (p - q).clamp_min(0) * active[:, None]  # (R, V)
        room = torch.minimum((q - p).clamp_min(0) * active[:, None], self._cap(p, p))  # (R, V) what each may take
        offer, donor = surplus.topk(min(self.donors, vocab), dim=1)  # (R, M) the largest surpluses
        near = table[donor]  # (R, M, scan) each donor's nearest codes
        budget = torch.full((rows, 1), math.inf if self.delta is None else self.delta, dtype=p.dtype, device=p.device)
        target, moved = p, p.new_zeros(rows)
        for _ in range(self.rounds):
            receiver, asked = self._ask(offer, near, room)  # (R, A) each
            claimed = torch.zeros_like(p).scatter_add_(1, receiver, asked)  # (R, V) asked of each receiver
            share = torch.where(
                claimed > 0, torch.clamp(room / claimed.clamp_min(1e-30), max=1.0), torch.zeros_like(room)
            )
            given = asked * share.gather(1, receiver)  # (R, A)
            given = given * torch.clamp(budget / given.sum(dim=1, keepdim=True).clamp_min(1e-30), max=1.0)
            sent = given.view(rows, donor.shape[1], -1).sum(dim=2)  # (R, M) what each donor gave
            got = torch.zeros_like(p).scatter_add_(1, receiver, given)  # (R, V) what each receiver took
            target = target.scatter_add(1, donor, -sent) + got
            offer, room = (offer - sent).clamp_min(0), (room - got).clamp_min(0)
            budget = budget - given.sum(dim=1, keepdim=True)
            moved = moved + given.sum(dim=1)
        return Relaxed(
            target=target.clamp_min(0), tv=moved, gain=torch.zeros(rows, count, dtype=p.dtype, device=p.device)
        )

    def _ask(self, offer: torch.Tensor, near: torch.Tensor, room: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Where donors with ``offer`` (R, M) and neighbours ``near`` (R, M, scan) ask for how much of
        the receivers' ``room`` (R, V): (receivers, amounts), each (R, M * scan) or (R, M)."""
        if self.receivers == "fill":
            need = room.gather(1, near.flatten(1)).view(near.shape)  # (R, M, scan)
            before = need.cumsum(dim=2) - need  # (R, M, scan) room at nearer neighbours
            asked = torch.minimum(need, (offer[:, :, None] - before).clamp_min(0))  # nearest first
            return near.flatten(1), asked.flatten(1)
        needy = (room > 0).to(torch.uint8).gather(1, near.flatten(1)).view(near.shape)  # (R, M, scan)
        first = needy.argmax(dim=2)  # (R, M) the first neighbour with room (0 when none)
        receiver = near.gather(2, first[:, :, None])[:, :, 0]  # (R, M)
        return receiver, torch.where(needy.amax(dim=2).bool(), offer, torch.zeros_like(offer))


class FrozenComposed(Composed):
    """``Composed`` at 4df88c0."""

    def node(self, p, tokens, valid, q, u, noise, sampling, audit=True, relaxed=None, depth=None) -> NodeOutcome:
        if relaxed is None:
            relaxed = self.relax(p, tokens, valid, q)
        drawn = race(relaxed.target, noise, sampling)  # (R,) y ~ p' (the argmax when greedy)
        outcome = self.test.try_siblings(relaxed.target, tokens, valid, q, u, drawn)
        merged = relaxed.gain.gather(1, outcome.chosen.clamp_min(0)[:, None])[:, 0]  # (R,)
        return NodeOutcome(
            chosen=outcome.chosen,
            target=outcome.target,
            proposal=outcome.proposal,
            emitted=outcome.emitted,
            tv=relaxed.tv,
            merged=torch.where(outcome.chosen >= 0, merged, torch.zeros_like(merged)),
        )


class FrozenReference(LanternReference):
    """``LanternReference.node`` and its sampled TV audit at 4df88c0 (the rest, unchanged, is inherited)."""

    def node(
        self, p, tokens, valid, q, u, noise, sampling: SamplingConfig, audit: bool = True, depth=None
    ) -> NodeOutcome:
        """Siblings in order on the modified distribution (see the module docstring); ``depth`` is not read."""
        if self.candidates == "sampled":
            return self._sampled(p, tokens, valid, q, u, audit)
        # Deterministic (the greedy walk goes through :meth:`select_path` instead). On the all-reject
        # path the modified distribution does not depend on the uniforms, so the law of the node's token
        # is L = sum_s reach_s p~_s delta_{x_s} + reach_{K+1} p_K (every tested sibling is zero in p_K).
        # One draw y ~ L then decides the step exactly as the sequential test would: sibling s is
        # accepted iff y = x_s (the same coupling as the exact rule's closed form, so delta = 0 gives
        # the exact rule's tokens).
        rows, count = tokens.shape
        xs = tokens.clamp_min(0)  # (R, K)
        # Every sibling's k+1 nearest codes in one lookup: the test reads the first k, a rejection zeroes all.
        wide = self.table.columns(self.k + 1, p.device)[xs]  # (R, K, k+1)
        current = p
        law = torch.zeros_like(p)  # (R, V)
        reach = torch.ones(rows, dtype=p.dtype, device=p.device)  # (R,) probability that sibling s is tested
        gains = []
        for slot in range(count):
            x, live = xs[:, slot], valid[:, slot]
            p_tilde, moved, m = self.relaxed_probability(current, x, wide[:, slot, : self.k])
            gains.append(moved)
            law = law.scatter_add(1, x[:, None], torch.where(live, reach * p_tilde, 0.0)[:, None])
            reach = torch.where(live, reach * (1 - p_tilde).clamp_min(0), reach)
            rejected = _renormalised(current.scatter(1, self.rejected(x, wide[:, slot], m), 0.0))
            current = torch.where(live[:, None], rejected, current)
        law = law + reach[:, None] * current
        drawn = race(law, noise, sampling)  # (R,)
        chosen = first(valid & (tokens == drawn[:, None]))
        moved = torch.stack(gains, dim=1).gather(1, chosen.clamp_min(0)[:, None])[:, 0]  # (R,)
        merged = torch.where(chosen >= 0, moved, 0.0)
        tv = 0.5 * (law - p).abs().sum(dim=1)
        return NodeOutcome(chosen=chosen, target=current, proposal=q, emitted=drawn, tv=tv, merged=merged)

    def _sampled_law_tv(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """The sampled candidate's realised TV at 4df88c0 (see ``LanternReference._sampled_law_tv``)."""
        rows, vocab = p.shape
        near = self.table.columns(self.k, p.device)  # (V, k)
        wide = self.table.columns(self.k + 1, p.device)  # (V, k+1)
        cumulative = p[:, near].cumsum(dim=2)  # (R, V, k): neighbour mass of every x
        merged = cumulative <= self._bound(p)  # (R, V, k) a prefix (see relaxed_probability)
        m = merged.sum(dim=2)  # (R, V)
        moved = torch.where(merged, cumulative, 0.0).amax(dim=2)  # (R, V)
        accept = torch.where(
            q > 0, torch.clamp((p + moved) / q.clamp_min(1e-30), max=1.0), torch.zeros_like(p)
        )  # (R, V)
        r0 = (p - q).clamp_min(0)
        overlap = torch.minimum(p, q)
        extra = torch.where(m > 0, overlap[:, wide].sum(dim=2), torch.zeros_like(p))  # (R, V) mass freed on Z_x
        norm = r0.sum(dim=1, keepdim=True) + extra  # (R, V)
        weight = q * (1 - accept)  # (R, V) probability of drawing x and rejecting it
        spread = torch.where(norm > 0, weight / norm.clamp_min(1e-30), torch.zeros_like(p))
        on_zeroed = torch.zeros_like(p).scatter_add_(
            1,
            wide.reshape(1, -1).expand(rows, -1),
            (spread * (m > 0))[:, :, None].expand(-1, -1, wide.shape[1]).reshape(rows, -1),
        )
        empty = torch.where(norm > 0, torch.zeros_like(p), weight).sum(dim=1, keepdim=True) / vocab
        law = q * accept + r0 * spread.sum(dim=1, keepdim=True) + overlap * on_zeroed + empty
        return 0.5 * (law - p).abs().sum(dim=1)
