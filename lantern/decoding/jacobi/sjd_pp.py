"""SJD++ as its released code does it: SJD whose untested drafts are kept when the new forward still rates them.

SJD++ (Teng et al., arXiv 2512.07503) "reuses high-confidence draft tokens after each verification phase
instead of resampling them all". The released implementation (Haodong-Lei-Ray/PathSpec,
``scheduler/oneline_utils.py`` ``SpeculativeSampler_PlusPlus``, driven by
``scheduler/jacobi_iteration_lumina_mgpt_sjd_pp.py`` and ``--method sjd++ --sjd_pp_threshold 0.5`` in
``main.py``) verifies the window exactly as SJD does; then, for every untested position past the first
rejection, it compares the new forward's law ``p`` with the law ``q`` the old draft ``x`` was drawn from:

    keep ``x`` as the next draft of that token when ``p(x) / (q(x) + 1e-7) > threshold``, else take the
    fresh draw from ``p``; either way the law recorded for the next test is ``p``.

This module is that rule as a redraft hook of :func:`lantern.decoding.jacobi.step.jacobi_step` (the SJD step:
test, residual, emission, initialisation and RNG streams are SJD's own), plus the bookkeeping that makes its
cost in fidelity visible. A kept draft is *not* distributed as the recorded ``p``: its law is
``Q'(z) = Q(z) k(z) + (1 - sum_w Q(w) k(w)) p(z)`` with ``k(z) = [p(z) / (q(z) + 1e-7) > threshold]`` and ``Q`` the
old draft's own law. So SJD++ is lossy. The step carries each draft's actual law ``Q`` beside its recorded law
(``JacobiState.draft_law``) and records, per emitted token, the exact TV between the target's law and the law
that token was emitted from, ``P = Q a + (1 - sum(Q a)) norm(max(0, p - q))`` with ``a = min(1, p / q)``
(every ``tv_audit_every``-th step; a vocabulary-wide pass per window position).

The harness's own lossless variant is ``decoding=sjd reuse=...`` (it keeps a draft by its old law's top mass,
never by the drawn token); see docs/jacobi.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch

from lantern import checks
from lantern.decoding.api import register
from lantern.decoding.jacobi.decoder import JacobiDecoder, JacobiSettings
from lantern.models.sampling import SamplingConfig
from lantern.rules.exact import residual

EPS = 1e-7  # the released code's guard in the ratio's denominator


class ConfidentReuse:
    """SJD++'s redraft rule: keep an untested draft ``x`` when ``p(x) / (q(x) + 1e-7) > threshold``."""

    def __init__(self, threshold: float = 0.5):
        self.threshold = checks.real("sjd_pp_threshold", threshold, 0, note="SJD++'s p/q ratio to keep a draft")

    def redraw(self, state, p, src, jacobi, fresh, fresh_q):
        """Next drafts (B, W), recorded laws (B, W, V) and actual laws (B, W, V) for new slots whose source
        output is ``src`` (B, W) (the Jacobi update where ``jacobi``); ``fresh``/``fresh_q`` are SJD's redraws
        and their law (this forward's ``p`` at ``src``). Old window slot of token ``n + src`` is ``src``."""
        window, draft_q = state.window, state.draft_q
        width, vocab = window.shape[1], draft_q.shape[-1]
        has_old = jacobi & (src < width)  # (B, W) the token had an untested draft (output W never does)
        old = src.clamp_max(width - 1)
        x_old = window.gather(1, old)  # (B, W)
        q_old = draft_q.gather(1, old[:, :, None].expand(-1, -1, vocab))  # (B, W, V) its recorded law
        ratio_ok = fresh_q > self.threshold * (q_old + EPS)  # (B, W, V) p(z) / (q(z) + eps) > t, for every z
        keep = has_old & ratio_ok.gather(2, x_old[:, :, None])[:, :, 0]  # (B, W)
        drafts = torch.where(keep, x_old, fresh)
        if state.draft_law is None:  # greedy: every emitted token is the argmax whatever the drafts
            return drafts, fresh_q, None
        old_law = state.draft_law.gather(1, old[:, :, None].expand(-1, -1, vocab))  # (B, W, V)
        kept = old_law * ratio_ok  # (B, W, V) the old draft's mass that would be kept
        law = kept + (1 - kept.sum(-1, keepdim=True)).clamp_min(0) * fresh_q
        return drafts, fresh_q, torch.where(has_old[:, :, None], law, fresh_q)

    def realised_tv(self, state, p, sampling: SamplingConfig, audit: bool) -> torch.Tensor:
        """(B, W) TV between the target's law ``p`` (B, W, V) at each window position and the law the token
        emitted there follows when the draft follows ``draft_law`` but is tested against ``draft_q``."""
        batch, width = p.shape[:2]
        if sampling.greedy or state.draft_law is None:
            return torch.zeros(batch, width, dtype=torch.float32, device=p.device)
        if not audit:
            return torch.full((batch, width), float("nan"), dtype=torch.float32, device=p.device)
        emitted = emitted_law(p, state.draft_q, state.draft_law)
        return (0.5 * (emitted - p).abs().sum(-1)).float()


def emitted_law(p: torch.Tensor, q: torch.Tensor, law: torch.Tensor) -> torch.Tensor:
    """The law (..., V) of the token a position emits when its draft follows ``law`` but the speculative test
    and residual use ``q``: ``law * a + (1 - sum(law * a)) * norm(max(0, p - q))``, ``a = min(1, p / q)``
    (``law``'s support lies inside ``q``'s). Equals ``p`` when ``law == q``."""
    ratio = torch.where(q > 0, p / q.clamp_min(1e-30), torch.zeros_like(p)).clamp_max(1.0)
    accepted = law * ratio
    return accepted + (1 - accepted.sum(-1, keepdim=True)).clamp_min(0) * residual(p, q)


@register
@dataclass(frozen=True)
class SjdPlusPlusSettings(JacobiSettings):
    """SJD's knobs plus SJD++'s keep threshold."""

    kind: ClassVar[str] = "sjd_pp"
    threshold: float = 0.5

    def method(self) -> str:
        text = f"{self.label} W={self.window} {self.init} t={self.threshold}"
        return text + (" (greedy)" if self.candidates == "greedy" else "")

    def order(self) -> tuple:
        return (2, False, self.name, 0, self.window, self.init, self.threshold, self.candidates)

    def record(self) -> dict:
        return {**super().record(), "acceptance": "sjd_pp", "sjd_pp_threshold": self.threshold}


class SjdPlusPlusDecoder(JacobiDecoder):
    """:class:`JacobiDecoder` with :class:`ConfidentReuse` as its redraft rule; only the settings differ."""

    @property
    def settings(self) -> SjdPlusPlusSettings:
        base = super().settings
        fields = {field.name: getattr(base, field.name) for field in dataclasses.fields(base)}
        return SjdPlusPlusSettings(**fields, threshold=self.redraft.threshold)


def sjd_pp(
    sampling: SamplingConfig, window: int = 16, init: str = "random", threshold: float = 0.5, **kwargs
) -> SjdPlusPlusDecoder:
    """SJD++ with the released code's defaults: window 16, random initialisation, keep threshold 0.5."""
    return SjdPlusPlusDecoder(
        sampling,
        window=window,
        init=init,
        redraft=ConfidentReuse(threshold),
        name=kwargs.pop("name", "sjd_pp"),
        label=kwargs.pop("label", "SJD++"),
        **kwargs,
    )
