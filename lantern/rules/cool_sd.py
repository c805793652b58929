"""Cool-SD (Li, Zhang, Du, Ji, "Annealed Relaxation of Speculative Decoding for Faster Autoregressive Image
Generation", AAAI 2026, arXiv 2601.09212; the repository xingyaoL/COOL-SD holds a README only).

A draft token at draft depth ``i`` (0: a step's first draft token) is accepted with ``min(1, w_i p(x) / q(x))``,
``w_i = delta exp(-nu i - mu)``: the relaxation is annealed, strongest at the first draft token and decaying
with depth. A rejection draws the resampling law that minimises the TV to the target, ``norm(max(0, p -
min(q, w_i p)))`` (:mod:`lantern.rules.weighted`, Eq. (1)). The rule is a relaxation composed with the exact
candidate test (:class:`~lantern.rules.api.Composed`): :class:`AnnealedRelaxation` fixes the law a node emits,
``p' = P`` of Eq. (1) with ``w = w_i``, before the node's draws, and the exact test samples ``p'``; so the
realised TV is ``TV(p, p')``, recorded in closed form for every draft structure and candidate kind.

What is the paper's and what is chosen here (docs/cool_sd.md): one sampled candidate per node with
``w_i >= 1`` is the paper's test and resampling draw for draw; where ``w_i < 1`` the paper's test is stricter
than the exact test with the same law (``p``), and the exact test runs; several sampled siblings share the
node's one relaxed law (the first is tested with ``w_i``, later ones exactly against the residual);
deterministic candidates are point-mass drafts (``min(1, w_i p_s(x))`` per sibling); at temperature 0 the
target is a point mass, ``w_i`` cannot move it, and the rule is greedy decoding.
"""

from __future__ import annotations

import math

import torch

from lantern import checks
from lantern.rules.api import Composed, Relaxed, Rule, RuleSettings, check_candidates
from lantern.rules.exact import EXACT
from lantern.rules.weighted import weighted_law, weighted_sibling_law

DELTA, NU, MU = 1.1, 0.05, 0.0  # delta: the paper's Lumina-mGPT setting; nu, mu: chosen (docs/cool_sd.md)
MU_RANGE = 20.0  # |mu| bound: exp(20) already accepts every draft of positive target mass


class AnnealedRelaxation:
    """The law a Cool-SD node emits, ``p' = P`` of :func:`~lantern.rules.weighted.weighted_law` (sampled
    candidates) or :func:`~lantern.rules.weighted.weighted_sibling_law` (deterministic ones) with the weight
    ``w_i = delta exp(-nu i - mu)`` of the candidates' draft depth ``i``; ``p`` itself when greedy."""

    def __init__(self, delta: float = DELTA, nu: float = NU, mu: float = MU):
        self.delta, self.nu, self.mu = delta, nu, mu

    def weight(self, depth: torch.Tensor) -> torch.Tensor:
        """``w_i`` (R,) for draft depths ``depth`` (R,)."""
        return self.delta * torch.exp(-self.nu * depth.float() - self.mu)

    def relax(self, p, tokens, valid, q, kind: str, depth=None) -> Relaxed:
        """``p'`` for nodes with target ``p`` (R, V), candidates ``tokens`` (R, K) (``valid`` marks real ones),
        drafter law ``q`` (R, V), at draft depths ``depth`` (R,) (None: 0)."""
        rows = p.shape[0]
        gain = torch.zeros(tokens.shape, dtype=p.dtype, device=p.device)
        if kind == "greedy":  # a point-mass target: w p / q is 0 off the argmax whatever w is
            return Relaxed(target=p, tv=p.new_zeros(rows), gain=gain)
        depth = torch.zeros(rows, dtype=torch.long, device=p.device) if depth is None else depth
        weight = self.weight(depth).to(p.dtype)  # (R,)
        if kind == "sampled":
            law, _ = weighted_law(p, q, weight)
            law = torch.where(valid.any(dim=1, keepdim=True), law, p)  # a node without candidates draws from p
        else:
            law, gain = weighted_sibling_law(p, tokens, valid, weight)
        return Relaxed(target=law, tv=0.5 * (law - p).abs().sum(-1), gain=gain)


class CoolSdSpec:
    """Cool-SD's rule for every candidate kind (:class:`~lantern.rules.api.RuleSpec`): the annealed relaxation
    composed with the exact test of the kind. ``delta`` > 0, ``nu`` >= 0 (the decay per draft depth), ``mu``
    (an offset: ``delta exp(-mu)`` is the first draft token's weight)."""

    tv_audit_every = 1  # the realised TV is the relaxation's, computed with the law at every node

    def __init__(self, delta: float = DELTA, nu: float = NU, mu: float = MU):
        self.delta = checks.real("cool_delta", delta, 0, 1e6, low_open=True, note="Cool-SD's weight at depth 0")
        self.nu = checks.real("cool_nu", nu, 0, 1e6, note="Cool-SD's decay of the weight per draft depth")
        self.mu = checks.real("cool_mu", mu, -MU_RANGE, MU_RANGE, note="Cool-SD's offset: w_i = delta exp(-nu i - mu)")
        self._rules: dict[str, Rule] = {}

    def build(self, kind: str, draft=None) -> Rule:
        kind = check_candidates(kind)
        if kind not in self._rules:
            self._rules[kind] = Composed(AnnealedRelaxation(self.delta, self.nu, self.mu), EXACT[kind]())
        return self._rules[kind]

    def settings(self, kind: str) -> RuleSettings:
        """Greedy decoding is exact (``acceptance: greedy``); sampling is recorded as ``cool_sd``, lossy."""
        return RuleSettings(
            acceptance="greedy" if kind == "greedy" else "cool_sd",
            candidates=kind,
            label=f"d={self.delta} nu={self.nu} mu={self.mu}",
            knobs={"cool_delta": self.delta, "cool_nu": self.nu, "cool_mu": self.mu, "first_weight": self.first()},
        )

    def first(self) -> float:
        """The first draft token's weight ``delta exp(-mu)`` (above 1: the rule is relaxed there)."""
        return self.delta * math.exp(-self.mu)


def cool_sd(delta: float = DELTA, nu: float = NU, mu: float = MU) -> CoolSdSpec:
    """Cool-SD's annealed relaxed acceptance (``conf/decoding/cool_sd.yaml``)."""
    return CoolSdSpec(delta, nu, mu)
