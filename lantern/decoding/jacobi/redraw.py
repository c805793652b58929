"""How a Jacobi step draws its untested drafts again: one class per method, one interface the step calls once.

After the test, every window position past the first rejection was predicted by this forward from a prefix
that has now changed; the Jacobi update gives each such token a new draft from this forward's law ``p``. A
:class:`Redraw` says how (:class:`~lantern.decoding.jacobi.state.Redrawing` is what it reads,
:class:`~lantern.decoding.jacobi.state.Redrawn` what it returns):

* :class:`Independent` (SJD): a fresh draw from ``p``, stream JACOBI_DRAFT.
* :class:`MaximalCoupling` (MC-SJD's ``mc``; So et al. 2025, arXiv 2510.24211, code junhyukso/SCD): the new
  draft is *coupled* with the old draft ``x ~ q`` of the same token so that it repeats ``x`` as often as the
  two laws allow: keep ``x`` when ``u < min(1, p(x) / q(x))`` (the speculative test itself, with the
  position's test uniform), else draw ``norm(max(0, p - q))``; the new draft follows ``p`` and equals ``x``
  with probability ``1 - TV(p, q)``, the most any coupling can give.
* :class:`GumbelCoupling` (MC-SJD's ``gumbel``): every image token owns one fixed vector of exponentials
  ``E`` (counter-based, keyed by the token's index, never by the step), and each redraw is ``argmax(p / E)``
  (the Gumbel-max trick), so the same noise picks the token at every iteration and a slightly changed ``p``
  picks the same token.
* :class:`KeepConfident` (the harness's lossless ``reuse``): keep the old draft when its own law's top mass
  is at least ``reuse``; the choice reads only the old law, never the drawn token, so the kept draft still
  follows the law recorded for it.
* :class:`ConfidentReuse` (SJD++'s released rule, :mod:`lantern.decoding.jacobi.sjd_pp`): keep the old draft
  ``x`` when ``p(x) / (q(x) + 1e-7) > threshold`` and record ``p`` for it either way; lossy, so it carries
  each draft's actual law for the test's realised TV.

For the first three the new draft's law is ``p``, fixed before it is drawn, and its randomness is
independent of everything at earlier positions, so the emitted tokens keep the target's joint law
(docs/jacobi.md). Greedy decoding redraws the argmax whatever the method (SJD++'s keep rule still applies).
A new method is a new subclass (in a file of its own if it likes) and a yaml that names it.
"""

from __future__ import annotations

import torch

from lantern import checks, rng
from lantern.decoding.jacobi.state import JacobiState, Redrawing, Redrawn
from lantern.models.sampling import draw
from lantern.rules.exact import residual, sampled_test

EPS = 1e-7  # SJD++'s released code: the guard in the keep ratio's denominator


class Redraw:
    """A redraw method: ``redraw(r)`` gives the new drafts for the Jacobi slots, their recorded laws and (for a
    lossy method) their actual laws. Subclasses that only change how a sampled draft is drawn override
    :meth:`draw`; ``coupling`` and ``reuse`` are what records call the method."""

    coupling: str = "none"
    reuse: float | None = None

    def initial_law(self, draft_q: torch.Tensor) -> torch.Tensor | None:
        """The actual law (B, W, V) of the first window's drafts, tracked only by a method whose drafts may
        leave their recorded law ``draft_q`` (None: they never do)."""
        return None

    def __call__(self, r: Redrawing) -> Redrawn:
        drafts = r.p_src.argmax(-1) if r.greedy else self.draw(r)  # (B, W)
        return Redrawn(drafts, r.p_src)  # every sampled redraw follows this forward's law

    def draw(self, r: Redrawing) -> torch.Tensor:
        """Sampled drafts (B, W) distributed as ``r.p_src``."""
        raise NotImplementedError


def checked_redraw(base: Redraw | None) -> Redraw:
    """``base``, or :class:`Independent` when None; ConfigError when it is not a redraw."""
    if base is None:
        return Independent()
    if not isinstance(base, Redraw):
        raise checks.refuse("redraw", base, "a redraw method (lantern.decoding.jacobi.redraw)")
    return base


class Independent(Redraw):
    """SJD: each untested position draws afresh from this forward's law (stream JACOBI_DRAFT)."""

    def draw(self, r: Redrawing) -> torch.Tensor:
        width = r.src.shape[1]
        return draw(r.p_src, rng.uniform(r.state.keys, r.state.decided, rng.JACOBI_DRAFT, width))  # (B, W)


class MaximalCoupling(Redraw):
    """MC-SJD's maximal coupling with the old draft of the same token (:func:`maximal_coupling`)."""

    coupling = "mc"

    def draw(self, r: Redrawing) -> torch.Tensor:
        window = r.state.window
        p_draft = r.p[:, : window.shape[1]].gather(2, window[:, :, None])[:, :, 0]  # (B, W) p(x) at each old draft
        return maximal_coupling(r.state, p_draft, r.u, r.src, r.p_src)


class GumbelCoupling(Redraw):
    """MC-SJD's Gumbel coupling: one fixed noise vector per image token (:func:`gumbel_coupling`)."""

    coupling = "gumbel"

    def draw(self, r: Redrawing) -> torch.Tensor:
        return gumbel_coupling(r.state.keys, r.new_decided, r.p_src)


class KeepConfident(Redraw):
    """Lossless reuse: keep an untested draft when its law's top mass is at least ``reuse`` (in (0, 1]), else
    take ``base``'s redraw (default :class:`Independent`). Greedy decoding ignores it."""

    def __init__(self, reuse: float, base: Redraw | None = None):
        self.reuse = checks.probability("reuse", reuse, zero=False, note="top draft mass to keep a draft")
        self.base = checked_redraw(base)
        self.coupling = self.base.coupling

    def __call__(self, r: Redrawing) -> Redrawn:
        fresh = self.base(r)
        return fresh if r.greedy else self.keep(r.state, r.src, r.jacobi, fresh)

    def keep(self, state: JacobiState, src: torch.Tensor, jacobi: torch.Tensor, fresh: Redrawn) -> Redrawn:
        """``fresh`` with the old draft of token ``n + src`` (old window slot ``src``) kept where confident."""
        window, draft_q = state.window, state.draft_q
        width, vocab = window.shape[1], draft_q.shape[-1]
        old = src.clamp_max(width - 1)  # (B, W) old window slot of token n + src
        old_q = draft_q.gather(1, old[:, :, None].expand(-1, -1, vocab))  # (B, W, V)
        keep = jacobi & (src < width) & (old_q.amax(-1) >= self.reuse)  # (B, W)
        drafts = torch.where(keep, window.gather(1, old), fresh.drafts)
        return Redrawn(drafts, torch.where(keep[:, :, None], old_q, fresh.recorded))


class ConfidentReuse(Redraw):
    """SJD++'s redraft rule: keep an untested draft ``x`` when ``p(x) / (q(x) + 1e-7) > threshold``, else take
    ``base``'s redraw (default :class:`Independent`); the recorded law is ``p`` either way, so a kept draft
    leaves it and the state tracks its actual law (``JacobiState.draft_law``)."""

    def __init__(self, threshold: float = 0.5, base: Redraw | None = None):
        self.threshold = checks.real("sjd_pp_threshold", threshold, 0, note="SJD++'s p/q ratio to keep a draft")
        self.base = checked_redraw(base)
        self.coupling = self.base.coupling

    def initial_law(self, draft_q: torch.Tensor) -> torch.Tensor:
        return draft_q.clone()  # initial drafts follow their laws

    def __call__(self, r: Redrawing) -> Redrawn:
        fresh = self.base(r)
        return self.keep(r.state, r.src, r.jacobi, fresh.drafts, fresh.recorded)

    def keep(self, state, src, jacobi, fresh, fresh_q) -> Redrawn:
        """Next drafts (B, W), recorded laws (B, W, V) and actual laws (B, W, V) for new slots whose source
        output is ``src`` (B, W) (the Jacobi update where ``jacobi``); ``fresh``/``fresh_q`` are the base's
        redraws and their law (this forward's ``p`` at ``src``). Old window slot of token ``n + src`` is ``src``."""
        window, draft_q = state.window, state.draft_q
        width, vocab = window.shape[1], draft_q.shape[-1]
        has_old = jacobi & (src < width)  # (B, W) the token had an untested draft (output W never does)
        old = src.clamp_max(width - 1)
        x_old = window.gather(1, old)  # (B, W)
        q_old = draft_q.gather(1, old[:, :, None].expand(-1, -1, vocab))  # (B, W, V) its recorded law
        ratio_ok = fresh_q > self.threshold * (q_old + EPS)  # (B, W, V) p(z) / (q(z) + eps) > t, for every z
        keep = has_old & ratio_ok.gather(2, x_old[:, :, None])[:, :, 0]  # (B, W)
        drafts = torch.where(keep, x_old, fresh)
        if state.draft_law is None:  # nothing tracked: the recorded laws are all there is
            return Redrawn(drafts, fresh_q)
        old_law = state.draft_law.gather(1, old[:, :, None].expand(-1, -1, vocab))  # (B, W, V)
        kept = old_law * ratio_ok  # (B, W, V) the old draft's mass that would be kept
        law = kept + (1 - kept.sum(-1, keepdim=True)).clamp_min(0) * fresh_q
        return Redrawn(drafts, fresh_q, torch.where(has_old[:, :, None], law, fresh_q))


def maximal_coupling(
    state: JacobiState, p_draft: torch.Tensor, u: torch.Tensor, src: torch.Tensor, p_src: torch.Tensor
) -> torch.Tensor:
    """MC-SJD's redraw (B, W): the new draft for output ``src`` (B, W) (token ``n + src``) is the old draft
    of that token (window slot ``src``) when it passes the exact test ``u < min(1, p(x) / q(x))`` against
    this forward's law, else a draw from ``norm(max(0, p - q))``: distributed as ``p_src`` (B, W, V) and
    equal to the old draft with probability ``1 - TV(p, q)``. Output ``W`` has no old draft (``q = 0``:
    a plain draw from ``p``).

    The keep decision reuses the position's test uniform ``u`` (B, W) (the paper's "single-line" change:
    the released code runs its test loop over the whole window without stopping at the first
    rejection); only positions past the first rejection read it here, and the test read it only for
    positions up to that rejection, so no uniform decides two things. ``p_draft`` (B, W) is ``p(x)``
    at each old draft. The exact ratio is used even when the step's own test is grouped (GSD), so the
    redraw follows ``p`` whatever the test."""
    window, draft_q = state.window, state.draft_q
    width, vocab = window.shape[1], draft_q.shape[-1]
    q_draft = draft_q.gather(2, window[:, :, None])[:, :, 0]  # (B, W) q(x) > 0
    keep = sampled_test(p_draft, q_draft, u)  # (B, W) per old slot
    has_old = src < width  # (B, W)
    old = src.clamp_max(width - 1)  # old window slot of token n + src
    old_q = draft_q.gather(1, old[:, :, None].expand(-1, -1, vocab)) * has_old[:, :, None]  # (B, W, V)
    uniforms = rng.uniform(state.keys, state.decided, rng.JACOBI_DRAFT, width)  # (B, W)
    redrawn = draw(residual(p_src, old_q), uniforms)  # (B, W); q = 0 leaves p
    kept = has_old & keep.gather(1, old)
    return torch.where(kept, window.gather(1, old), redrawn)


def gumbel_coupling(keys: torch.Tensor, new_decided: torch.Tensor, p_src: torch.Tensor) -> torch.Tensor:
    """MC-SJD's Gumbel coupling (B, W): new slot ``k`` drafts image token ``n' + k`` and takes
    ``argmax(p / E)`` with ``E`` (V,) Exp(1) variables keyed by (sample, token index) alone, so every
    iteration that redraws that token races the same noise (the released code keeps a table of
    uniforms per window slot and shifts it with the accepted tokens; keying by the token index is the
    same thing without state). One hash per vocabulary entry and slot: W * V per row and step."""
    batch, width, vocab = p_src.shape
    tokens = new_decided[:, None] + torch.arange(width, device=p_src.device)  # (B, W) absolute token index
    flat_keys = keys[:, None].expand(-1, width).reshape(-1)  # (B*W,)
    u = rng.uniform(flat_keys, tokens.reshape(-1), rng.JACOBI_COUPLE, vocab)  # (B*W, V)
    exponential = -torch.log(u).view(batch, width, vocab)  # (B, W, V) Exp(1)
    return (p_src / exponential).argmax(-1)
