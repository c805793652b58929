"""Acceptance rules for speculative decoding: a relaxation composed with an exact candidate test.

Every rule sees a batch of R rows, one tree node each: the target distribution ``p[r]`` (after CFG,
temperature, top-k and top-p), the node's candidate tokens ``x[r]`` in the order they are to be
tried, the drafter distribution ``q[r]`` they came from and uniforms ``u[r]``. The exact candidate
tests are lossless for the law they are given:

* sampled candidates (``x ~ q`` without replacement): accept iff ``u < min(1, p(x) / q(x))``; after a
  rejection ``p <- norm(max(0, p - q))`` and ``x`` leaves ``q`` (recursive rejection sampling);
* deterministic candidates (EAGLE-2 top-k children): accept with probability ``p(x)``; after a
  rejection ``p(x) <- 0``, renormalised; in closed form: draw ``y ~ p``, accept the sibling equal to
  ``y``, else emit ``y``;
* greedy: accept iff ``x`` is the argmax.

A relaxed rule (:class:`RelaxedRule`, built by :func:`lantern` and :func:`lantern_pp`) first turns ``p``
into a relaxed law ``p'`` fixed before anything random happens at the node
(:mod:`lantern.rules.relaxation`), then runs the exact test against ``p'``. So the emitted
token's law is ``p'`` and its realised total variation ``TV(p, p')`` is known in closed form and
bounded by construction, for every draft structure and candidate kind (``semantics=bounded``).
``semantics=reference`` reproduces the authors' released code instead
(:mod:`lantern.rules.reference`). No rule loops over rows or the vocabulary in Python or
synchronises with the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lantern.errors import ConfigError
from lantern.models.sampling import SamplingConfig, race
from lantern.rules.relaxation import Relaxed, identity

CANDIDATES = ("sampled", "deterministic", "greedy")


@dataclass(frozen=True)
class Verdict:
    """The outcome of testing R candidates.

    ``accept`` (R,) bool; ``p_tilde`` (R,) the relaxed target probability of the candidate used in
    the test (``p(x)`` for exact rules); ``tv`` (R,) the realised total-variation mass ``S_m`` moved
    onto the candidate (0 for exact rules); ``size`` (R,) int64 the number ``m`` of neighbours merged.
    """

    accept: torch.Tensor
    p_tilde: torch.Tensor
    tv: torch.Tensor
    size: torch.Tensor


def _normalised(weights: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """Rows of ``weights`` renormalised to sum 1; rows that sum to 0 take ``fallback`` instead."""
    total = weights.sum(dim=-1, keepdim=True)  # (R, 1)
    empty = total <= 0  # (R, 1)
    safe = torch.where(empty, torch.ones_like(total), total)  # (R, 1)
    return torch.where(empty, fallback, weights / safe)  # (R, V)


def _one_hot_argmax(p: torch.Tensor) -> torch.Tensor:
    """The one-hot distribution at each row's argmax (first index on ties)."""
    out = torch.zeros_like(p)  # (R, V)
    return out.scatter_(1, p.argmax(dim=-1, keepdim=True), 1.0)


def _at(p: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``p[r, x[r]]`` for every row: (R,)."""
    return p.gather(1, x.long().unsqueeze(1)).squeeze(1)


def _sampled_test(p_tilde: torch.Tensor, qx: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``u < min(1, p_tilde / qx)``, written without division (u < 1 always; qx = 0 accepts iff p_tilde > 0)."""
    return u * qx < p_tilde


class AcceptanceRule:
    """An exact candidate test: ``verify(p, x, q, u) -> Verdict``, ``residual(p, q, x) -> (R, V)`` and
    the sibling loop ``try_siblings``; :meth:`level` runs it at a tree node (no relaxation here)."""

    candidates: str = "sampled"
    longest_path: bool = False  # True: the walk picks the longest accepted root-to-leaf path (reference greedy)
    tv_audit_every: int = 1  # measure costly realised TVs on every N-th step (only the reference rule has any)

    def relax(self, p, tokens, valid, q) -> Relaxed:
        """The law the node samples from: ``p`` itself for exact rules."""
        return identity(p, tokens)

    def level(self, p, tokens, valid, q, u, noise, sampling: SamplingConfig, audit: bool = True) -> LevelOutcome:
        """Test the candidates ``tokens`` (R, K) of one node against target ``p`` (R, V).

        ``noise`` (R, V) are the exponentials of the node's target draw (None when greedy); ``audit``
        whether to measure the realised TV where that is costly (unused by rules with a closed form).
        """
        relaxed = self.relax(p, tokens, valid, q)
        drawn = race(relaxed.target, noise, sampling)  # (R,) y ~ p' (the argmax when greedy)
        outcome = self.try_siblings(relaxed.target, tokens, valid, q, u, drawn)
        merged = relaxed.gain.gather(1, outcome.chosen.clamp_min(0)[:, None])[:, 0]  # (R,)
        return LevelOutcome(
            chosen=outcome.chosen,
            target=outcome.target,
            proposal=outcome.proposal,
            emitted=outcome.emitted,
            tv=relaxed.tv,
            merged=torch.where(outcome.chosen >= 0, merged, torch.zeros_like(merged)),
        )

    def verify(self, p: torch.Tensor, x: torch.Tensor, q: torch.Tensor | None, u: torch.Tensor | None) -> Verdict:
        """Test candidates ``x`` (R,) against target ``p`` (R, V), drafter ``q`` (R, V), uniforms ``u`` (R,)."""
        raise NotImplementedError

    def residual(self, p: torch.Tensor, q: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
        """The (R, V) distribution to resample from when candidate ``x`` of each row is rejected."""
        raise NotImplementedError

    def __call__(self, p, x, q=None, u=None) -> Verdict:
        """Alias of :meth:`verify`."""
        return self.verify(p, x, q, u)

    def try_siblings(self, p, x, valid, q, u, y) -> SiblingOutcome:
        """Try sibling candidates ``x`` (R, K) in order (``valid`` (R, K) marks real ones) against ``p`` (R, V).

        ``u`` (R, K) are uniforms, one per sibling, and ``y`` (R,) a token drawn from ``p`` (the argmax
        when greedy). This generic form loops over the siblings: each rejection turns ``p`` into the
        rule's residual before the next sibling is tried, and with sampled candidates (drawn from ``q``
        without replacement) the rejected token also leaves ``q`` (recursive rejection sampling).
        Deterministic and greedy rules override it with one vectorised test on ``y``.
        """
        rows = p.shape[0]
        chosen = torch.full((rows,), -1, dtype=torch.long, device=p.device)
        for slot in range(x.shape[1]):
            token = x[:, slot].clamp_min(0)  # -1 (no candidate) rows are not trying
            trying = valid[:, slot] & (chosen < 0)  # (R,)
            verdict, residual = self._step(p, token, q, u[:, slot])
            accept = trying & verdict.accept
            reject = trying & ~verdict.accept
            chosen = torch.where(accept, slot, chosen)
            p = torch.where(reject[:, None], residual, p)
            if self.candidates == "sampled":
                q = torch.where(reject[:, None], _without(q, token), q)
        return SiblingOutcome(chosen=chosen, target=p, proposal=q)

    def _step(self, p, x, q, u) -> tuple[Verdict, torch.Tensor]:
        """Verdict and residual for one candidate per row (rules may share work between the two)."""
        return self.verify(p, x, q, u), self.residual(p, q, x)

    def for_candidates(self, kind: str) -> AcceptanceRule:
        """The same rule for candidates of ``kind`` (sampled, deterministic or greedy)."""
        return self if _check_kind(kind) == self.candidates else _EXACT[kind]()

    def check_draft(self, draft) -> None:
        """Refuse a draft structure this rule cannot verify (every structure is fine for exact rules)."""

    def describe(self) -> dict:
        """Settings recorded with results: the rule family and its parameters."""
        return {"acceptance": "exact" if self.candidates != "greedy" else "greedy", "candidates": self.candidates}


def _check_kind(kind: str) -> str:
    if kind not in CANDIDATES:
        raise ConfigError(f"candidates={kind!r} must be one of {', '.join(CANDIDATES)}")
    return kind


@dataclass(frozen=True)
class LevelOutcome:
    """The outcome at one tree node, per row.

    ``chosen`` (R,) the slot of the accepted candidate (-1 if none); ``target`` (R, V) the law to
    draw the node's token from when none is accepted and ``emitted`` is None; ``proposal`` (R, V) the
    drafter distribution after the rejections; ``emitted`` (R,) the token when no candidate is
    accepted, or None; ``tv`` (R,) the realised total variation between the target and the law of
    the token emitted at this node (NaN where not measured); ``merged`` (R,) the mass the relaxation
    moved onto the accepted candidate (0 for exact rules).
    """

    chosen: torch.Tensor
    target: torch.Tensor
    proposal: torch.Tensor
    emitted: torch.Tensor | None
    tv: torch.Tensor
    merged: torch.Tensor


@dataclass(frozen=True)
class SiblingOutcome:
    """The outcome of trying K sibling candidates of one node, per row.

    ``chosen`` (R,) the slot of the accepted sibling (-1 if none);
    ``target`` (R, V) the distribution after the rejections before it and ``proposal`` (R, V) the
    drafter distribution after the same rejections; ``emitted`` (R,) the token to emit when no sibling
    is accepted, or ``None`` when it is to be drawn from ``target``.
    """

    chosen: torch.Tensor
    target: torch.Tensor
    proposal: torch.Tensor
    emitted: torch.Tensor | None = None


def _without(q: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``q`` (R, V) with token ``x`` (R,) removed and renormalised (left as is if nothing remains)."""
    removed = q.scatter(1, x[:, None], 0.0)
    total = removed.sum(-1, keepdim=True)
    return torch.where(total > 0, removed / total.clamp_min(1e-30), q)


def _first(accept: torch.Tensor) -> torch.Tensor:
    """Index of the first true entry per row of ``accept`` (R, K), or -1: (R,)."""
    slots = torch.arange(accept.shape[1], device=accept.device)
    first = torch.where(accept, slots, accept.shape[1]).min(dim=1).values
    return torch.where(first < accept.shape[1], first, -1)


def _exact_verdict(accept: torch.Tensor, px: torch.Tensor) -> Verdict:
    """A verdict with no relaxation."""
    return Verdict(accept=accept, p_tilde=px, tv=torch.zeros_like(px), size=torch.zeros_like(accept, dtype=torch.int64))


class ExactSampled(AcceptanceRule):
    """Lossless rule for sampled candidates ``x ~ q``: accept iff ``u < min(1, p(x)/q(x))``.

    The residual is ``norm(max(0, p - q))`` (``p`` itself on rows where that is all zero).
    """

    candidates = "sampled"

    def verify(self, p, x, q, u) -> Verdict:
        """See :class:`AcceptanceRule`."""
        px = _at(p, x)  # (R,)
        return _exact_verdict(_sampled_test(px, _at(q, x), u), px)

    def residual(self, p, q, x) -> torch.Tensor:
        """``norm(max(0, p - q))``, falling back to ``p``."""
        return _normalised((p - q).clamp_min(0), p)  # (R, V)


class ExactDeterministic(AcceptanceRule):
    """Lossless rule for deterministic candidates: accept with probability ``p(x)``.

    The residual is ``p`` with ``p(x) = 0``, renormalised: the target for the next sibling, or for
    the final resample (``p`` itself on rows where nothing is left).
    """

    candidates = "deterministic"

    def verify(self, p, x, q=None, u=None) -> Verdict:
        """See :class:`AcceptanceRule`; ``q`` is ignored."""
        px = _at(p, x)  # (R,)
        return _exact_verdict(u < px, px)

    def residual(self, p, q, x) -> torch.Tensor:
        """``p`` with the candidate zeroed, renormalised."""
        return _normalised(p.scatter(1, x.long().unsqueeze(1), 0.0), p)  # (R, V)

    def try_siblings(self, p, x, valid, q, u, y) -> SiblingOutcome:
        """Accept the sibling equal to ``y ~ p``; if there is none, ``y`` itself is the next token.

        This is the sequential test in closed form: trying distinct siblings in order with
        probability ``p(x)`` each, renormalising after every rejection, accepts sibling s with
        probability ``p(x_s)`` and otherwise draws from ``p`` without the siblings, exactly as here.
        """
        chosen = _first(valid & (x == y[:, None]))
        return SiblingOutcome(chosen=chosen, target=p, proposal=q, emitted=y)


class Greedy(AcceptanceRule):
    """Accept iff ``x`` is the argmax of ``p``; on rejection the residual is one-hot at that argmax."""

    candidates = "greedy"

    def verify(self, p, x, q=None, u=None) -> Verdict:
        """See :class:`AcceptanceRule`; ``q`` and ``u`` are ignored."""
        return _exact_verdict(p.argmax(dim=-1) == x, _at(p, x))

    def residual(self, p, q, x) -> torch.Tensor:
        """One-hot at the argmax of ``p``."""
        return _one_hot_argmax(p)  # (R, V)

    def try_siblings(self, p, x, valid, q, u, y) -> SiblingOutcome:
        """The sibling equal to the argmax ``y``, if any; else the argmax is the next token."""
        chosen = _first(valid & (x == y[:, None]))
        return SiblingOutcome(chosen=chosen, target=p, proposal=q, emitted=y)


_EXACT = {"sampled": ExactSampled, "deterministic": ExactDeterministic, "greedy": Greedy}


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``norm(max(0, p - q))`` over the last dim, or ``p`` where that is empty (only reachable by rounding)."""
    rest = (p - q).clamp_min(0)
    total = rest.sum(-1, keepdim=True)
    return torch.where(total > 0, rest / total.clamp_min(1e-30), p)
