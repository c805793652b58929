"""SJD-SV on a drafted chain: the tree decoder's side of ``window_test=sv`` (EAGLE, LANTERN, LANTERN++).

SJD-SV (arXiv 2609.13245) is "a plug-in on SJD, GSD and LANTERN": a drafted chain is a window of drafts, each
tested by the rule (``u < min(1, p'(x) / q(x))`` for sampled candidates, where ``p'`` is the rule's relaxed law
at the node and ``p' = p`` for exact decoding; accepted with probability ``p'(x)`` for deterministic ones). The
scheme (:func:`lantern.rules.subsequence.sv_covered`) turns those ratios into the accepted prefix; the level after
it draws from the rule's residual, or from the target after a fully accepted chain. :class:`SVSpec` wraps a
config's rule spec and builds :class:`SVChainRule`, a rule whose walk hook (:attr:`lantern.rules.api.Rule.walk`)
does this in one pass over the chain.

Greedy decoding keeps the rule as it is (SJD-SV's joint test of 0/1 ratios is the per-token test). A chain is
required (a tree's siblings have no sequence to split), and a rule whose relaxed law is fixed before the test
(``semantics=bounded``; the authors' reference rule tests each sibling on a law the earlier rejections left).
"""

from __future__ import annotations

import dataclasses

import torch

from lantern import rng
from lantern.errors import ConfigError
from lantern.models.sampling import SamplingConfig, exponentials, race
from lantern.rules.api import Composed, PathChoice, Rule, RuleSettings
from lantern.rules.exact import ratio_of
from lantern.rules.subsequence import sv_covered


class SVSpec:
    """A rule spec (:class:`~lantern.rules.api.RuleSpec`) whose chains are walked by SJD-SV."""

    def __init__(self, base):
        self.base = base
        self.tv_audit_every = base.tv_audit_every

    def build(self, kind: str, draft=None) -> Rule:
        rule = self.base.build(kind, draft)
        if kind == "greedy":  # 0/1 ratios: the joint test is the per-token test
            return rule
        if getattr(draft, "name", None) != "chain":
            raise ConfigError(
                f"window_test=sv verifies a sequence of drafts: it needs draft=chain, not draft="
                f"{getattr(draft, 'name', draft)} (or window_test=token)"
            )
        if not isinstance(rule, Composed):
            raise ConfigError(
                "window_test=sv needs a rule whose relaxed law is fixed before the test (semantics=bounded); "
                "the authors' reference rule (semantics=reference) tests each draft on what earlier rejections left"
            )
        return SVChainRule(rule)

    def settings(self, kind: str) -> RuleSettings:
        settings = self.base.settings(kind)
        return dataclasses.replace(
            settings, label=f"{settings.label} SV", knobs={**settings.knobs, "window_test": "sv"}
        )


class SVChainRule:
    """A composed rule (relaxation + exact test) whose chain is walked by SJD-SV (module docstring)."""

    relax = None  # the walk hook relaxes the whole chain itself
    tv_audit = "mc"  # the emitted law has no closed form: a Monte Carlo audit reruns the step

    def __init__(self, base: Composed):
        self.base = base
        self.candidates = base.candidates
        self.walk = self.sv_walk

    def prepare(self, device: torch.device) -> None:
        self.base.prepare(device)

    def node(self, *args, **kwargs):
        return self.base.node(*args, **kwargs)

    def sv_walk(
        self, draft, p: torch.Tensor, sampling: SamplingConfig, keys: torch.Tensor, step: torch.Tensor, audit: bool
    ) -> PathChoice:
        """Accept the chain's SJD-SV prefix and draw the next token: ``(path (B, D), next (B,), tv (B, D+1),
        merged (B, D))``. Uniforms and draws come from the streams the per-node walk uses (ACCEPT, LEVEL)."""
        batch, _, vocab = p.shape
        depth = draft.max_depth
        tokens = draft.candidates[:, :depth, 0]  # (B, D) the candidate level d tests (node d + 1's token)
        valid = tokens >= 0
        x = tokens.clamp_min(0)
        q = draft.q[:, :depth]  # (B, D, V)
        relaxed = self.base.relax(
            p[:, :depth].reshape(batch * depth, vocab), x.reshape(-1, 1), valid.reshape(-1, 1), q.reshape(-1, vocab)
        )
        target = relaxed.target.view(batch, depth, vocab)  # (B, D, V) p' per level
        t_x = target.gather(2, x[:, :, None])[:, :, 0]  # (B, D)
        if self.candidates == "sampled":
            ratio = ratio_of(t_x, q.gather(2, x[:, :, None])[:, :, 0])
        else:  # deterministic: accepted with probability p'(x), a ratio against a point mass
            ratio = t_x
        ratio = torch.where(valid, ratio, torch.zeros_like(ratio))
        p_x = p[:, :depth].gather(2, x[:, :, None])[:, :, 0]
        covered = sv_covered(ratio, p_x, rng.uniform(keys, step, rng.ACCEPT, depth)) & valid  # (B, D)
        accepted = covered.long().cumprod(dim=1).sum(dim=1)  # (B,)
        levels = torch.arange(depth, device=p.device)
        path = torch.where(levels[None, :] < accepted[:, None], draft.children[:, :depth, 0], -1)  # (B, D)

        rows = torch.arange(batch, device=p.device)
        stop = accepted.clamp_max(depth - 1)  # (B,) the level whose token the step draws (if not past the chain)
        t_stop, x_stop = target[rows, stop], x[rows, stop]
        rejected = self.base.test.residual(t_stop, q[rows, stop], x_stop)  # (B, V) the rule's residual
        stop_law = torch.where(valid[rows, stop][:, None], rejected, t_stop)
        leaf = draft.children[rows, depth - 1, 0].clamp_min(0)  # the chain's last node
        law = torch.where((accepted == depth)[:, None], p[rows, leaf], stop_law)
        races = None if sampling.greedy else exponentials(keys, step, rng.LEVEL, depth + 1, vocab)
        next_token = race(law, None if races is None else races[rows, accepted], sampling)

        tv = torch.full((batch, depth + 1), float("nan"), dtype=p.dtype, device=p.device)  # no closed form
        gain = relaxed.gain.view(batch, depth, -1)[:, :, 0]
        merged = torch.where(levels[None, :] < accepted[:, None], gain, torch.zeros_like(gain))
        return PathChoice(path, next_token, tv, merged)
