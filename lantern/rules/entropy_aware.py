"""The entropy-aware acceptance rule on SJD's window (Ma et al., "Towards Better & Faster Autoregressive Image
Generation: From the Perspective of Entropy", NeurIPS 2025, arXiv 2510.09012; code krennic999/ARsample, which
releases only the entropy-driven temperature, for LlamaGen's plain AR sampling).

The paper relaxes SJD's test by the target's entropy ("entropy-aware acceptance rules in speculative decoding,
achieving near-lossless generation at about 85% of the inference cost"): where the target is uncertain (a flat
law over many interchangeable codes) a draft is accepted more easily; where it is confident, as strictly as SJD.
Its equation could not be read here (docs/entropy_aware.md), so the rule is the simplest form of that sentence
on the harness's pieces, a weighted ratio test (:mod:`lantern.rules.weighted`):

    accept a draft x with min(1, w p(x) / q(x)),    w = 1 + strength * H(p) / log V,

``H(p)`` the entropy (nats) of the target's law at the position, ``V`` the vocabulary size. The weight is >= 1,
so a rejection's residual ``norm(max(0, p - q))`` (the one SJD's step draws) is the TV-optimal resampling law,
and the rule is a relaxation composed with SJD's exact test: each position emits ``P`` of Eq. (1) there, the
law the exact test of ``P`` emits, ``TV(p, P) <= w - 1 <= strength`` (at most ``strength * H(p) / log V``, so
near 0 where the target is confident). The realised TV is recorded in closed form every ``tv_audit_every``-th
step. At temperature 0 the rule is SJD's greedy test (greedy decoding, exact).
"""

from __future__ import annotations

import math

import torch

from lantern import checks
from lantern.rules.exact import ExactWindowTest, WindowVerdict, emitted_law, realised_tv, sampled_test
from lantern.rules.weighted import weighted_acceptance

STRENGTH = 1.5  # chosen on the world (docs/entropy_aware.md): 0.83 of SJD's forwards, the paper's "about 85%"


def entropy(p: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) over the last dim (..., V) -> (...,); ``0 log 0 = 0``."""
    return -torch.special.xlogy(p, p).sum(-1)


class EntropyWeight:
    """``w = 1 + strength * H(p) / log V`` (..., ) for laws ``p`` (..., V)."""

    def __init__(self, strength: float = STRENGTH):
        self.strength = checks.real(
            "entropy_strength", strength, 0, 100, note="the weight's rise from 1 at entropy 0 to 1 + it at log V"
        )

    def __call__(self, p: torch.Tensor) -> torch.Tensor:
        return 1 + self.strength * entropy(p) / math.log(p.shape[-1])


class EntropyAwareTest(ExactWindowTest):
    """SJD's window test with the entropy-aware weight: a draft ``x`` passes when ``u q(x) < w p(x)``
    (``u < min(1, w p(x) / q(x))``), the exact test of the relaxed law ``P`` (Eq. (1) of
    :mod:`lantern.rules.weighted` with ``w``); greedy: SJD's argmax test."""

    def __init__(self, strength: float = STRENGTH):
        self.weight = EntropyWeight(strength)

    def describe(self) -> dict:
        return {"entropy_strength": self.weight.strength}

    def acceptance(self, greedy: bool) -> str:
        return "greedy" if greedy else "entropy_aware"

    def __call__(self, p, drafts, q, law, u, greedy: bool, audit: bool) -> WindowVerdict:
        """Test drafts (B, W) under target laws ``p`` (B, W, V), recorded laws ``q`` (B, W, V) and uniforms
        ``u`` (B, W); ``law`` (B, W, V) or None is what the drafts actually follow. ``merged`` is the mass the
        weight adds to a draft's ratio numerator, ``(w - 1) p(x)``."""
        if greedy:
            return super().__call__(p, drafts, q, law, u, greedy, audit)
        weight = self.weight(p)  # (B, W)
        p_x = p.gather(2, drafts[:, :, None])[:, :, 0]  # (B, W)
        q_x = q.gather(2, drafts[:, :, None])[:, :, 0]
        passed = sampled_test(weight * p_x, q_x, u)
        tv = torch.full(drafts.shape, float("nan"), dtype=torch.float32, device=p.device)  # not measured
        if audit:  # the law each position emits: drafts that follow ``law`` (q unless given), weighted test
            tv = realised_tv(p, emitted_law(p, q, law, weighted_acceptance(p, q, weight)))
        return WindowVerdict(passed, (weight - 1) * p_x, tv)
