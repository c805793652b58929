"""Exact candidate tests: lossless for the law they are given, and the residual every rejection draws from.

Every test sees a batch of R rows, one tree node each: the target law ``p[r]`` (after CFG, temperature,
top-k and top-p, or a relaxation of it), the node's candidate tokens ``x[r]`` in the order they are to
be tried, the drafter law ``q[r]`` they came from and uniforms ``u[r]``:

* sampled candidates (``x ~ q`` without replacement): accept iff ``u < min(1, p(x) / q(x))``
  (:func:`sampled_test`); after a rejection ``p <- norm(max(0, p - q))`` (:func:`residual`) and ``x``
  leaves ``q`` (recursive rejection sampling);
* deterministic candidates (EAGLE-2 top-k children): accept with probability ``p(x)``; after a
  rejection ``p(x) <- 0``, renormalised; in closed form: draw ``y ~ p``, accept the sibling equal to
  ``y``, else emit ``y``;
* greedy: accept iff ``x`` is the argmax.

The Jacobi decoders run the same :func:`sampled_test` and :func:`residual` through a window test
(:class:`ExactWindowTest`; GSD's grouped form is :class:`lantern.rules.grouped.GroupedTest`). The law a
position emits when a draft that follows some law passes with some probability and a rejection draws the
residual is :func:`emitted_law`, the one formula every lossy rule's realised TV is read from. No test loops
over rows or the vocabulary in Python or synchronises with the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from lantern.models.devices import needed
from lantern.rules.api import CANDIDATES, SiblingOutcome


@dataclass(frozen=True)
class Verdict:
    """The outcome of testing R candidates: ``accept`` (R,) bool and ``p_x`` (R,) the target mass tested."""

    accept: torch.Tensor
    p_x: torch.Tensor


def normalised(weights: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """Rows of ``weights`` renormalised to sum 1; rows that sum to 0 take ``fallback`` instead."""
    total = weights.sum(dim=-1, keepdim=True)  # (R, 1)
    empty = total <= 0  # (R, 1)
    safe = torch.where(empty, torch.ones_like(total), total)  # (R, 1)
    return torch.where(empty, fallback, weights / safe)  # (R, V)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``norm(max(0, p - q))`` over the last dim, or ``p`` where that is empty (only reachable by rounding)."""
    return normalised((p - q).clamp_min(0), p)


def sampled_test(p_x: torch.Tensor, q_x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``u < min(1, p_x / q_x)``, written without division (u < 1 always; q_x = 0 accepts iff p_x > 0)."""
    return u * q_x < p_x


def acceptance(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``min(1, p / q)`` elementwise (..., V): the chance a draft ``x ~ q`` passes the exact test (0 where
    ``q = 0``: such a token is never drafted)."""
    return torch.where(q > 0, p / q.clamp_min(1e-30), torch.zeros_like(p)).clamp_max(1.0)


def emitted_law(
    p: torch.Tensor, q: torch.Tensor, law: torch.Tensor | None = None, accept: torch.Tensor | None = None
) -> torch.Tensor:
    """The law (..., V) of the token a position emits: ``P = law a + (1 - sum(law a)) norm(max(0, p - q))``.

    The draft follows ``law`` (default ``q``: it follows the law it is tested against) and passes with
    probability ``accept`` (default :func:`acceptance`, the exact test; GSD's grouped ratio is another);
    a rejection draws the residual of ``p`` and ``q``. With both defaults ``P = p``: the exact test is
    lossless. ``law``'s support lies inside ``q``'s.
    """
    taken = (q if law is None else law) * (acceptance(p, q) if accept is None else accept)  # (..., V)
    return taken + (1 - taken.sum(-1, keepdim=True)).clamp_min(0) * residual(p, q)


def realised_tv(p: torch.Tensor, law: torch.Tensor) -> torch.Tensor:
    """``TV(p, law)`` over the last dim, in float32 (..., ): what a lossy rule records per emitted token."""
    return (0.5 * (law - p).abs().sum(-1)).float()


def at(p: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``p[r, x[r]]`` for every row: (R,)."""
    return p.gather(1, x.long().unsqueeze(1)).squeeze(1)


def without(q: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``q`` (R, V) with token ``x`` (R,) removed and renormalised (left as is if nothing remains)."""
    removed = q.scatter(1, x[:, None], 0.0)
    total = removed.sum(-1, keepdim=True)
    return torch.where(total > 0, removed / total.clamp_min(1e-30), q)


def first(accept: torch.Tensor) -> torch.Tensor:
    """Index of the first true entry per row of ``accept`` (R, K), or -1: (R,)."""
    slots = torch.arange(accept.shape[1], device=accept.device)
    found = torch.where(accept, slots, accept.shape[1]).min(dim=1).values
    return torch.where(found < accept.shape[1], found, -1)


class ExactTest:
    """An exact candidate test: ``verify(p, x, q, u)``, ``residual(p, q, x)`` and the sibling loop."""

    candidates: str = "sampled"

    def verify(self, p: torch.Tensor, x: torch.Tensor, q: torch.Tensor | None, u: torch.Tensor | None) -> Verdict:
        """Test candidates ``x`` (R,) against target ``p`` (R, V), drafter ``q`` (R, V), uniforms ``u`` (R,)."""
        raise NotImplementedError

    def residual(self, p: torch.Tensor, q: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
        """The (R, V) law to resample from when candidate ``x`` of each row is rejected."""
        raise NotImplementedError

    def try_siblings(self, p, x, valid, q, u, y) -> SiblingOutcome:
        """Try sibling candidates ``x`` (R, K) in order (``valid`` (R, K) marks real ones) against ``p`` (R, V).

        ``u`` (R, K) are uniforms, one per sibling, and ``y`` (R,) a token drawn from ``p`` (the argmax
        when greedy). This generic form loops over the siblings: each rejection turns ``p`` into the
        test's residual before the next sibling is tried, and with sampled candidates (drawn from ``q``
        without replacement) the rejected token also leaves ``q`` (recursive rejection sampling).
        Deterministic and greedy tests override it with one vectorised test on ``y``.
        """
        rows = p.shape[0]
        chosen = torch.full((rows,), -1, dtype=torch.long, device=p.device)
        for slot in range(x.shape[1]):
            token = x[:, slot].clamp_min(0)  # -1 (no candidate) rows are not trying
            trying = valid[:, slot] & (chosen < 0)  # (R,)
            if not needed(trying):  # eager CPU: no row tries this sibling, so nothing below changes
                continue
            accept = trying & self.verify(p, token, q, u[:, slot]).accept
            reject = trying & ~accept
            chosen = torch.where(accept, slot, chosen)
            p = torch.where(reject[:, None], self.residual(p, q, token), p)
            if self.candidates == "sampled":
                q = torch.where(reject[:, None], without(q, token), q)
        return SiblingOutcome(chosen=chosen, target=p, proposal=q)


class ExactSampled(ExactTest):
    """Lossless test for sampled candidates ``x ~ q``: accept iff ``u < min(1, p(x)/q(x))``.

    The residual is ``norm(max(0, p - q))`` (``p`` itself on rows where that is all zero).
    """

    candidates = "sampled"

    def verify(self, p, x, q, u) -> Verdict:
        p_x = at(p, x)  # (R,)
        return Verdict(accept=sampled_test(p_x, at(q, x), u), p_x=p_x)

    def residual(self, p, q, x) -> torch.Tensor:
        return residual(p, q)  # (R, V)


class ExactDeterministic(ExactTest):
    """Lossless test for deterministic candidates: accept with probability ``p(x)``.

    The residual is ``p`` with ``p(x) = 0``, renormalised: the target for the next sibling, or for
    the final resample (``p`` itself on rows where nothing is left).
    """

    candidates = "deterministic"

    def verify(self, p, x, q=None, u=None) -> Verdict:
        p_x = at(p, x)  # (R,)
        return Verdict(accept=u < p_x, p_x=p_x)

    def residual(self, p, q, x) -> torch.Tensor:
        return normalised(p.scatter(1, x.long().unsqueeze(1), 0.0), p)  # (R, V)

    def try_siblings(self, p, x, valid, q, u, y) -> SiblingOutcome:
        """Accept the sibling equal to ``y ~ p``; if there is none, ``y`` itself is the next token.

        This is the sequential test in closed form: trying distinct siblings in order with
        probability ``p(x)`` each, renormalising after every rejection, accepts sibling s with
        probability ``p(x_s)`` and otherwise draws from ``p`` without the siblings, exactly as here.
        """
        return SiblingOutcome(chosen=first(valid & (x == y[:, None])), target=p, proposal=q, emitted=y)


class Greedy(ExactTest):
    """Accept iff ``x`` is the argmax of ``p``; on rejection the residual is one-hot at that argmax."""

    candidates = "greedy"

    def verify(self, p, x, q=None, u=None) -> Verdict:
        return Verdict(accept=p.argmax(dim=-1) == x, p_x=at(p, x))

    def residual(self, p, q, x) -> torch.Tensor:
        return torch.zeros_like(p).scatter_(1, p.argmax(dim=-1, keepdim=True), 1.0)  # (R, V) first index on ties

    def try_siblings(self, p, x, valid, q, u, y) -> SiblingOutcome:
        """The sibling equal to the argmax ``y``, if any; else the argmax is the next token."""
        return SiblingOutcome(chosen=first(valid & (x == y[:, None])), target=p, proposal=q, emitted=y)


class WindowVerdict(NamedTuple):
    """A window test's outcome for B rows of W drafts: ``passed`` (B, W) bool, each draft's own test (the
    accepted prefix is the run of passes); ``merged`` (B, W) target mass the test added to a draft's ratio
    numerator (0 for the exact test); ``tv`` (B, W) float32 realised TV of the law each position emits
    (NaN: not measured this step); ``ratio`` (B, W) the ratio each draft's own uniform is compared with
    (``u < min(1, ratio)``: ``p(x) / q(x)`` for SJD, ``p(G) / q(G)`` for GSD; None when greedy), which a
    window-level scheme such as SJD-SV's (:mod:`lantern.rules.window`) combines across drafts."""

    passed: torch.Tensor
    merged: torch.Tensor
    tv: torch.Tensor
    ratio: torch.Tensor | None = None


def ratio_of(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """``p_x / q_x`` elementwise, ``inf`` where ``q_x = 0 < p_x`` and 0 where both are 0: the ratio
    :func:`sampled_test` compares its uniform with (``u < min(1, ratio)``)."""
    safe = torch.where(q_x > 0, q_x, torch.ones_like(q_x))
    return torch.where(q_x > 0, p_x / safe, torch.where(p_x > 0, torch.full_like(p_x, float("inf")), 0.0))


class ExactWindowTest:
    """SJD's test of a window of drafts, each drawn from its recorded law: ``u < min(1, p(x) / q(x))``
    (greedy: ``x`` is the argmax). A rejection draws from :func:`residual`, so each position emits ``p``
    when its draft follows its recorded law; when a redraw keeps drafts that do not (``law`` given, SJD++),
    the realised TV is that of :func:`emitted_law`, measured on audited steps.

    This is the window-test interface every Jacobi decoder calls (``bound``, ``prepare``, ``describe``,
    ``__call__``); ``scheme`` says how the drafts' own tests make the accepted prefix: ``token``, the run of
    passes (SJD's, GSD's), or a window-level scheme wrapping a per-token test (:mod:`lantern.rules.window`)."""

    scheme = "token"
    tv_audit: str | None = None  # the audit its decoder names (None: by losslessness; lantern.decoding.audit)

    def bound(self, model) -> ExactWindowTest:
        """This test for ``model`` (a decoder binds its test once per context; the exact test reads nothing
        of the model)."""
        return self

    def prepare(self, device: torch.device) -> None:
        """Build the tables a step reads on ``device`` (:func:`lantern.decoding.loop.prepare`): none here."""

    def describe(self) -> dict | None:
        """The test's knobs for records (None: the exact test has none)."""
        return None

    def acceptance(self, greedy: bool) -> str:
        """The rule's name in records (``acceptance``): ``exact``, or ``greedy`` at temperature 0; a record's
        ``lossless`` is true for these two (:data:`lantern.decoding.api.LOSSLESS_ACCEPTANCE`)."""
        return "greedy" if greedy else "exact"

    def __call__(self, p, drafts, q, law, u, greedy: bool, audit: bool) -> WindowVerdict:
        """Test drafts (B, W) under target laws ``p`` (B, W, V), recorded laws ``q`` (B, W, V) and uniforms
        ``u`` (B, W); ``law`` (B, W, V) or None is what the drafts actually follow."""
        p_x = p.gather(2, drafts[:, :, None])[:, :, 0]  # (B, W)
        ratio = None
        if greedy:
            passed = drafts == p.argmax(-1)
        else:
            q_x = q.gather(2, drafts[:, :, None])[:, :, 0]  # q(x) > 0: x was drawn from q
            passed, ratio = sampled_test(p_x, q_x, u), ratio_of(p_x, q_x)
        tv = torch.zeros(drafts.shape, dtype=torch.float32, device=p.device)  # (B, W) p itself is emitted
        if law is not None and not greedy:  # greedy: every emitted token is the argmax whatever the drafts
            tv = realised_tv(p, emitted_law(p, q, law)) if audit else torch.full_like(tv, float("nan"))
        return WindowVerdict(passed, torch.zeros_like(p_x), tv, ratio)


EXACT: dict[str, type[ExactTest]] = {"sampled": ExactSampled, "deterministic": ExactDeterministic, "greedy": Greedy}
assert tuple(EXACT) == CANDIDATES
