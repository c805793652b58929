"""SJD++ as its released code does it: SJD whose untested drafts are kept when the new forward still rates them.

SJD++ (Teng et al., arXiv 2512.07503) "reuses high-confidence draft tokens after each verification phase
instead of resampling them all". The released implementation (Haodong-Lei-Ray/PathSpec,
``scheduler/oneline_utils.py`` ``SpeculativeSampler_PlusPlus``, driven by
``scheduler/jacobi_iteration_lumina_mgpt_sjd_pp.py`` and ``--method sjd++ --sjd_pp_threshold 0.5`` in
``main.py``) verifies the window exactly as SJD does; then, for every untested position past the first
rejection, it compares the new forward's law ``p`` with the law ``q`` the old draft ``x`` was drawn from:

    keep ``x`` as the next draft of that token when ``p(x) / (q(x) + 1e-7) > threshold``, else take the
    fresh draw from ``p``; either way the law recorded for the next test is ``p``.

The rule is :class:`lantern.decoding.jacobi.redraw.ConfidentReuse`, the redraw of an SJD decoder (the SJD step:
test, residual, emission, initialisation and RNG streams are SJD's own); this module is its decoder and settings.
A kept draft is *not* distributed as the recorded ``p``: its law is
``Q'(z) = Q(z) k(z) + (1 - sum_w Q(w) k(w)) p(z)`` with ``k(z) = [p(z) / (q(z) + 1e-7) > threshold]`` and ``Q`` the
old draft's own law. So SJD++ is lossy. The step carries each draft's actual law ``Q`` beside its recorded law
(``JacobiState.draft_law``) and the exact window test records, per emitted token, the exact TV between the target's
law and the law that token was emitted from, ``P = Q a + (1 - sum(Q a)) norm(max(0, p - q))`` with
``a = min(1, p / q)`` (:func:`lantern.rules.exact.emitted_law`; every ``tv_audit_every``-th step, a
vocabulary-wide pass per window position).

The harness's own lossless variant is ``decoding=sjd reuse=...`` (it keeps a draft by its old law's top mass,
never by the drawn token); see docs/jacobi.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from lantern.decoding.api import register
from lantern.decoding.jacobi.decoder import JacobiDecoder, JacobiSettings
from lantern.decoding.jacobi.redraw import ConfidentReuse
from lantern.models.sampling import SamplingConfig


@register
@dataclass(frozen=True)
class SjdPlusPlusSettings(JacobiSettings):
    """SJD's knobs plus SJD++'s keep threshold."""

    kind: ClassVar[str] = "sjd_pp"
    threshold: float = 0.5

    def method(self) -> str:
        text = f"{self.label} W={self.window} {self.init} t={self.threshold}"
        text += f" coupling={self.coupling}" if self.coupling != "none" else ""
        return text + (" (greedy)" if self.candidates == "greedy" else "")

    def order(self) -> tuple:
        return (2, False, self.name, 0, self.window, self.init, self.threshold, self.candidates)

    def record(self) -> dict:
        return {**super().record(), "acceptance": "sjd_pp", "sjd_pp_threshold": self.threshold}


class SjdPlusPlusDecoder(JacobiDecoder):
    """:class:`JacobiDecoder` with :class:`ConfidentReuse` as its redraw; only the settings differ."""

    @property
    def settings(self) -> SjdPlusPlusSettings:
        base = super().settings
        fields = {field.name: getattr(base, field.name) for field in dataclasses.fields(base)}
        return SjdPlusPlusSettings(**fields, threshold=self.redraw.threshold)


def sjd_pp(
    sampling: SamplingConfig, *, window: int = 16, init: str = "random", threshold: float = 0.5, **kwargs
) -> SjdPlusPlusDecoder:
    """SJD++ with the released code's defaults: window 16, random initialisation, keep threshold 0.5."""
    return SjdPlusPlusDecoder(
        sampling,
        window=window,
        init=init,
        redraw=ConfidentReuse(threshold),
        name=kwargs.pop("name", "sjd_pp"),
        label=kwargs.pop("label", "SJD++"),
        **kwargs,
    )
