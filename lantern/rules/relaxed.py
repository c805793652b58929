"""A relaxation composed with an exact candidate test: LANTERN's and LANTERN++'s bounded rules."""

from __future__ import annotations

import torch

from lantern.rules.exact import _EXACT, AcceptanceRule, SiblingOutcome, Verdict, _check_kind
from lantern.rules.relaxation import NeighbourRelaxation, Relaxed


class RelaxedRule(AcceptanceRule):
    """A relaxation composed with an exact candidate test (``semantics=bounded``).

    The relaxation fixes ``p'`` at each node before the node's draws; the exact test is lossless for
    ``p'``, so every emitted token is distributed as ``p'``, with ``TV(p, p') <= delta`` (LANTERN) or
    ``p'(x) <= lambda p(x)`` at every receiving token (LANTERN++).
    """

    def __init__(self, relaxation: NeighbourRelaxation, test: AcceptanceRule, settings: dict):
        self.relaxation, self.test, self.settings = relaxation, test, settings
        self.candidates = test.candidates

    def relax(self, p, tokens, valid, q) -> Relaxed:
        """``p'`` from ``p``, the neighbour table and the node's candidates (or ``q`` when sampled)."""
        return self.relaxation.relax(p, tokens, valid, q, self.candidates)

    def try_siblings(self, p, x, valid, q, u, y) -> SiblingOutcome:
        """The exact test's sibling loop, on whatever law it is handed."""
        return self.test.try_siblings(p, x, valid, q, u, y)

    def verify(self, p, x, q=None, u=None) -> Verdict:
        """The exact test of one candidate per row against ``p'`` (relaxed for that candidate alone)."""
        relaxed = self.relax(p, x[:, None], torch.ones_like(x[:, None], dtype=torch.bool), q)
        verdict = self.test.verify(relaxed.target, x, q, u)
        return Verdict(accept=verdict.accept, p_tilde=verdict.p_tilde, tv=relaxed.tv, size=verdict.size)

    def residual(self, p, q, x) -> torch.Tensor:
        """The exact test's residual of ``p'`` after rejecting ``x`` alone."""
        relaxed = self.relax(p, x[:, None], torch.ones_like(x[:, None], dtype=torch.bool), q)
        return self.test.residual(relaxed.target, q, x)

    def for_candidates(self, kind: str) -> RelaxedRule:
        """The same relaxation with the exact test for candidates of ``kind``."""
        return (
            self
            if _check_kind(kind) == self.candidates
            else RelaxedRule(self.relaxation, _EXACT[kind](), self.settings)
        )

    def describe(self) -> dict:
        """Settings recorded with results."""
        return {
            **self.settings,
            "candidates": self.candidates,
            "semantics": "bounded",
            "neighbours_normalized": self.relaxation.table.normalize,
        }
