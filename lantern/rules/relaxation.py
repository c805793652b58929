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
  offers it to its first ``min(k, scan)`` nearest neighbours with a deficit ``q(x) > p(x)``
  (``scan=None``: all k). ``receivers=fill`` (default) tops up those deficits nearest first until the
  offer is spent; ``receivers=first`` (the law before 2026-12) offers everything to the nearest one.
  Each receiver takes at most its deficit (LANTERN++: at most ``(lambda - 1) p(x)``), sharing it
  among askers in proportion; LANTERN stops when the moved mass reaches ``delta``. Offers and deficits
  left over go round again, ``rounds`` times (default 2). Each unit moved raises ``sum min(p', q)``,
  the acceptance probability of a sampled candidate, by one unit.
  Why ``fill`` and two rounds, and what ``scan`` (the gathers' width) costs in tau: measured in
  docs/acceptance.md.

Every function is vectorised over rows and loops only over the siblings of a node (at most top-k).
"""

from __future__ import annotations

import math

import torch

from lantern import checks
from lantern.errors import ConfigError
from lantern.rules.api import Relaxed


class NeighbourTable:
    """A (V, k) int64 table of each code's nearest other codes, nearest first, and how it was built.

    ``normalize`` is True (l2-normalised rows), False (raw rows) or None (unknown: a bare tensor).
    """

    def __init__(self, indices: torch.Tensor, normalize: bool | None = None):
        if (
            not isinstance(indices, torch.Tensor)
            or indices.ndim != 2
            or indices.dtype.is_floating_point
            or indices.dtype == torch.bool
        ):
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
    high = min(table.k_max, table.num_codes - 1)
    checks.integer(
        "k",
        k,
        1,
        high,
        note=f"the neighbour table has {table.k_max} columns of {table.num_codes} codes; "
        "a larger table: model.neighbours.k_max=...",
    )
    return table


SCAN = 128  # default receiver search of the transport (columns of the neighbour table); see the module docstring
RECEIVERS = "fill"  # default receiver choice of the transport; see the module docstring
TRANSPORT_RECEIVERS = ("fill", "first")
ROUNDS = 2  # default rounds of the transport; see the module docstring


class NeighbourRelaxation:
    """LANTERN's latent proximity relaxation with a TV budget: ``delta`` (shared per node) and/or a
    per-receiver cap ``(lam - 1) p(x)``. ``delta=None`` means no shared budget (LANTERN++)."""

    def __init__(
        self,
        k: int,
        neighbours,
        delta: float | None = None,
        lam: float | None = None,
        donors: int = 256,
        scan: int | None = SCAN,
        receivers: str = RECEIVERS,
        rounds: int = ROUNDS,
    ):
        self.table = as_table(neighbours, k)
        self.k = k
        self.delta = delta
        self.lam = lam
        self.donors = donors
        scan = checks.optional(checks.integer, "scan", scan, 1, note="null = all k neighbours")
        self.scan = k if scan is None else min(k, scan)
        self.receivers = checks.choice("receivers", receivers, TRANSPORT_RECEIVERS)
        self.rounds = checks.integer("rounds", rounds, 1)

    def prepare(self, device: torch.device) -> None:
        """Put the neighbour columns a step reads on ``device``: ``k`` (the merge) and ``scan`` (the transport)."""
        for width in (self.k, self.scan):
            self.table.columns(width, device)

    def _cap(self, p: torch.Tensor, px: torch.Tensor) -> torch.Tensor:
        """The most a receiver with target mass ``px`` may gain: (R,) or (R, V)."""
        if self.lam is None:
            return torch.full_like(px, math.inf)
        return (self.lam - 1.0) * px

    def relax(
        self, p: torch.Tensor, tokens: torch.Tensor, valid: torch.Tensor, q: torch.Tensor, kind: str, depth=None
    ) -> Relaxed:
        """``p'`` for a node with target ``p`` (R, V), candidates ``tokens`` (R, K) (``valid`` marks real
        ones) and drafter ``q`` (R, V); ``kind`` is ``sampled``, ``deterministic`` or ``greedy``; the same at
        every ``depth``."""
        self.table.check(p)
        if kind == "sampled":
            return self.transport(p, q, valid.any(dim=1), tokens.shape[1])
        return self.merge(p, tokens, valid)

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
            mass = target.gather(1, near)  # (R, k)
            weight = mass.masked_fill(other, 0.0)
            cumulative = weight.cumsum(dim=1)
            limit = torch.minimum(budget, self._cap(p, p.gather(1, x[:, None])[:, 0]))  # (R,)
            # Weights are >= 0, so running sums never decrease: the sums within the limit are already a prefix.
            taken = (cumulative <= limit[:, None]) & live[:, None] & ~other  # (R, k)
            moved = (weight * taken).sum(dim=1)  # (R,)
            target = target.scatter(1, near, mass.masked_fill(taken, 0.0))
            target = target.scatter_add(1, x[:, None], moved[:, None])
            budget = budget - moved
            gain[:, slot] = moved
        return Relaxed(target=target, tv=gain.sum(dim=1), gain=gain)

    def transport(self, p: torch.Tensor, q: torch.Tensor, active: torch.Tensor, count: int = 0) -> Relaxed:
        """Move surplus mass ``p > q`` onto nearby deficits ``q > p``, within the budget.

        ``active`` (R,) marks nodes that have candidates; other rows keep ``p``. ``count``: the
        width of the returned (all-zero) ``gain``. Only the ``donors`` largest surpluses offer mass
        (they hold nearly all of it; scanning every token's k neighbours would cost O(V k) per row), and
        each searches its first ``scan`` neighbours for receivers. A round lets every donor ask
        (``fill``: for the deficits of its neighbours nearest first until its offer is spent;
        ``first``: for its whole offer at the first neighbour in deficit); a receiver asked for more
        than it may take gives every asker the same share; what is left of offers and deficits goes
        to the next round.
        """
        rows, vocab = p.shape
        table = self.table.columns(self.scan, p.device)  # (V, scan)
        surplus = (p - q).clamp_min(0) * active[:, None]  # (R, V)
        room = (q - p).clamp_min(0) * active[:, None]  # (R, V) what each may take
        if self.lam is not None:
            room = torch.minimum(room, self._cap(p, p))
        # (R, M) the largest surpluses. With ``fill`` in no particular order: a donor's order only orders the
        # sums over donors (a receiver's claims), and unsorted the selection costs half. ``first`` keeps them
        # largest first: there a receiver's leftover room of 1e-18 attracts a whole offer, so the rounding of
        # its claims is part of the law.
        offer, donor = surplus.topk(min(self.donors, vocab), dim=1, sorted=self.receivers == "first")
        near = table[donor]  # (R, M, scan) each donor's nearest codes
        budget = torch.full((rows, 1), math.inf if self.delta is None else self.delta, dtype=p.dtype, device=p.device)
        state = (p, offer, room, budget, p.new_zeros(rows, 1))  # target, offers and room left, budget, moved
        for index in range(self.rounds):
            if index > 0 and self.delta is not None and p.device.type == "cpu" and torch.compiler.is_compiling():
                # Once every row's budget is spent a round moves nothing, to the bit: a compiled graph on the
                # CPU skips it (reading the flag costs nothing there; on a GPU it would wait for the device,
                # and eagerly torch.cond costs more than the round it saves), so every other case runs it.
                state = torch.cond((state[3] <= 0).all(), _unchanged, self._round, (donor, near, *state))
            else:
                state = self._round(donor, near, *state)
        target, _, _, _, moved = state
        return Relaxed(
            target=target.clamp_min(0), tv=moved[:, 0], gain=torch.zeros(rows, count, dtype=p.dtype, device=p.device)
        )

    def _round(self, donor, near, target, offer, room, budget, moved) -> tuple[torch.Tensor, ...]:
        """One round of the transport: every donor asks, receivers grant, the budget scales (see
        :meth:`transport`). ``donor`` (R, M), ``near`` (R, M, scan); returns the next ``(target (R, V),
        offer (R, M), room (R, V), budget (R, 1), moved (R, 1))``."""
        receiver, asked = self._ask(offer, near, room)  # (R, M, W) each, W = scan (fill) or 1 (first)
        flat = receiver.flatten(1)  # (R, M * W)
        claimed = torch.zeros_like(room).scatter_add_(1, flat, asked.flatten(1))  # (R, V) asked of each receiver
        share = torch.where(
            claimed > 0, torch.clamp(room / claimed.clamp_min(1e-30), max=1.0), torch.zeros_like(room)
        )  # (R, V) the part of every ask a receiver grants
        granted = share.gather(1, flat).view_as(asked).mul_(asked)  # (R, M, W)
        if self.receivers == "fill":
            # A receiver grants every ask the same share, so it gets min(claimed, room) times the budget's
            # factor: no second scatter over the M * scan asks (and one asked for all its room keeps none),
            # and the total granted is a sum over the V receivers, not over the M * scan asks.
            intake = torch.minimum(claimed, room)  # (R, V) before the budget
            total = intake.sum(dim=1, keepdim=True)  # (R, 1) before the budget
            scale = torch.clamp(budget / total.clamp_min(1e-30), max=1.0)  # (R, 1) the budget's one factor
            sent, got, spent = granted.sum(dim=2) * scale, intake * scale, total * scale
        else:  # one ask per donor: few, and the law's rounding (a receiver's leftover room) is kept as it was
            total = granted.flatten(1).sum(dim=1, keepdim=True)  # (R, 1) before the budget
            scale = torch.clamp(budget / total.clamp_min(1e-30), max=1.0)  # (R, 1) the budget's one factor
            given = granted[:, :, 0] * scale  # (R, M)
            sent, got = given, torch.zeros_like(room).scatter_add_(1, flat, given)
            spent = given.sum(dim=1, keepdim=True)
        # Donors are distinct codes: a plain scatter (no summing scatter, which Inductor hands to ATen on CPU).
        target = target.scatter(1, donor, target.gather(1, donor) - sent) + got
        # A budget that bound this round is spent, exactly (not up to rounding), so later rounds move nothing.
        budget = torch.where(scale < 1, torch.zeros_like(budget), budget - spent)
        return target, (offer - sent).clamp_min(0), (room - got).clamp_min(0), budget, moved + spent

    def _ask(self, offer: torch.Tensor, near: torch.Tensor, room: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Where donors with ``offer`` (R, M) and neighbours ``near`` (R, M, scan) ask for how much of
        the receivers' ``room`` (R, V): (receivers, amounts), each (R, M, scan) (``fill``) or (R, M, 1)."""
        if self.receivers == "fill":
            need = room.gather(1, near.flatten(1)).view(near.shape)  # (R, M, scan)
            # In place, each the same bits as its out-of-place form (a - b is a + (-b); min(a, b) is a clamped
            # at b): eagerly the (R, M, scan) temporaries are most of the cost.
            left = need.cumsum(dim=2).sub_(need)  # (R, M, scan) room at nearer neighbours
            # (R, M, scan) offer left for each: written over ``left`` in one pass (o - x is (-x) + o, to the bit)
            left = torch.sub(offer[:, :, None], left, out=left).clamp_min_(0)
            return near, left.clamp_max_(need)  # nearest first
        needy = (room > 0).to(torch.uint8).gather(1, near.flatten(1)).view(near.shape)  # (R, M, scan)
        first = needy.argmax(dim=2, keepdim=True)  # (R, M, 1) the first neighbour with room (0 when none)
        asked = torch.where(needy.amax(dim=2).bool(), offer, torch.zeros_like(offer))  # (R, M)
        return near.gather(2, first), asked[:, :, None]


def _unchanged(donor, near, *state) -> tuple[torch.Tensor, ...]:
    """A transport round that moves nothing (``torch.cond``'s branches return fresh tensors)."""
    return tuple(part.clone() for part in state)
