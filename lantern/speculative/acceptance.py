"""Acceptance rules for speculative decoding, vectorised over rows of candidate positions.

Every rule sees a batch of R rows. Row r holds the target distribution ``p[r]`` (after CFG,
temperature, top-k and top-p), the candidate token ``x[r]``, the drafter distribution ``q[r]`` that
proposed it (only needed by sampled candidates) and a uniform ``u[r]`` in (0, 1). A rule returns a
:class:`Verdict` (accept or not, the relaxed target probability ``p~(x)`` the test used, and the
total-variation mass moved) and offers ``residual(p, q, x)``: the distribution to draw from when
the candidate is rejected. Rules know nothing about drafters or trees:

* sampled candidates (``x ~ q``): accept iff ``u < min(1, p~(x) / q(x))``;
* deterministic candidates (EAGLE-2 top-k children, siblings tried in order): accept iff
  ``u < p~(x)``; on rejection the residual becomes the ``p`` of the next sibling, and of the final
  resample when every sibling fails;
* greedy: accept iff ``x`` is the argmax of the row (after relaxation for greedy LANTERN).

The exact rules have ``p~(x) = p(x)``. LANTERN moves the target mass of a prefix ``n_1..n_m`` of
``x``'s nearest codebook neighbours onto ``x`` (``S_m <= delta``; LANTERN++: ``S_m <= (lam - 1) p(x)``).
No rule loops over rows or the vocabulary in Python or synchronises with the device.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch

from lantern.errors import ConfigError

CANDIDATES = ("sampled", "deterministic", "greedy")
RESIDUALS = ("consistent", "reference")


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
    """Common interface: ``verify(p, x, q, u) -> Verdict`` and ``residual(p, q, x) -> (R, V)``."""

    candidates: str = "sampled"

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
        tv = torch.zeros(rows, dtype=p.dtype, device=p.device)
        for slot in range(x.shape[1]):
            token = x[:, slot]
            trying = valid[:, slot] & (chosen < 0)  # (R,)
            verdict, residual = self._step(p, token, q, u[:, slot])
            accept = trying & verdict.accept
            reject = trying & ~verdict.accept
            chosen = torch.where(accept, slot, chosen)
            tv = torch.where(accept, verdict.tv.to(p.dtype), tv)
            p = torch.where(reject[:, None], residual, p)
            if self.candidates == "sampled":
                q = torch.where(reject[:, None], _without(q, token), q)
        return SiblingOutcome(chosen=chosen, tv=tv, target=p, proposal=q)

    def _step(self, p, x, q, u) -> tuple[Verdict, torch.Tensor]:
        """Verdict and residual for one candidate per row (rules may share work between the two)."""
        return self.verify(p, x, q, u), self.residual(p, q, x)

    def for_candidates(self, kind: str) -> "AcceptanceRule":
        """The same rule for candidates of ``kind`` (sampled, deterministic or greedy)."""
        if kind not in CANDIDATES:
            raise ConfigError(f"candidates={kind!r} must be one of {', '.join(CANDIDATES)}")
        return self if kind == self.candidates else _EXACT[kind]()

    def describe(self) -> dict:
        """Settings recorded with results: the rule family and its parameters."""
        return {"acceptance": "exact" if self.candidates != "greedy" else "greedy", "candidates": self.candidates}


@dataclass(frozen=True)
class SiblingOutcome:
    """The outcome of trying K sibling candidates of one node, per row.

    ``chosen`` (R,) the slot of the accepted sibling (-1 if none); ``tv`` (R,) the mass moved onto it;
    ``target`` (R, V) the distribution after the rejections before it and ``proposal`` (R, V) the
    drafter distribution after the same rejections; ``emitted`` (R,) the token to emit when no sibling
    is accepted, or ``None`` when it is to be drawn from ``target``.
    """

    chosen: torch.Tensor
    tv: torch.Tensor
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
        return SiblingOutcome(chosen=chosen, tv=torch.zeros_like(p[:, 0]), target=p, proposal=q, emitted=y)


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
        return SiblingOutcome(chosen=chosen, tv=torch.zeros_like(p[:, 0]), target=p, proposal=q, emitted=y)


class _Relaxed(AcceptanceRule):
    """Shared machinery of LANTERN and LANTERN++: the proximity set A(x) and the relaxed test."""

    def __init__(self, k: int, neighbours: torch.Tensor, residual: str, candidates: str):
        if neighbours.ndim != 2 or neighbours.dtype.is_floating_point or neighbours.dtype == torch.bool:
            raise ConfigError(f"neighbours must be a (V, k_max) integer table, got {neighbours.dtype} of shape {tuple(neighbours.shape)}")
        num_codes, k_max = neighbours.shape
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= k_max:
            raise ConfigError(
                f"k={k!r} must be an integer in [1, {k_max}] (the neighbour table has k_max={k_max} columns; "
                "a larger table: model.neighbours.k_max=...)"
            )
        if k >= num_codes:
            raise ConfigError(f"k={k!r} must be < the codebook size V={num_codes}")
        if residual not in RESIDUALS:
            raise ConfigError(f"residual={residual!r} must be one of {', '.join(RESIDUALS)}")
        if candidates not in CANDIDATES:
            raise ConfigError(f"candidates={candidates!r} must be one of {', '.join(CANDIDATES)}")
        self.k = k
        self.num_codes = num_codes
        self.residual_mode = residual
        self.candidates = candidates
        self._table = neighbours[:, :k].to(torch.int64).contiguous()  # (V, k)

    def _bound(self, px: torch.Tensor) -> torch.Tensor:
        """The largest mass that may be merged into each candidate: (R,)."""
        raise NotImplementedError

    def for_candidates(self, kind: str) -> "_Relaxed":
        """The same relaxation (k, bound, residual, table) for candidates of ``kind``."""
        if kind not in CANDIDATES:
            raise ConfigError(f"candidates={kind!r} must be one of {', '.join(CANDIDATES)}")
        rule = copy.copy(self)
        rule.candidates = kind
        return rule

    def _table_on(self, device: torch.device) -> torch.Tensor:
        if self._table.device != device:
            self._table = self._table.to(device)
        return self._table

    def _check(self, p: torch.Tensor) -> None:
        if p.shape[-1] != self.num_codes:
            raise ConfigError(
                f"neighbour table has {self.num_codes} rows but the target distribution has {p.shape[-1]} codes: "
                "it was built for another codebook"
            )

    def relax(self, p: torch.Tensor, x: torch.Tensor):
        """``(p_tilde, tv, m, neighbours, merged)`` for candidates ``x`` under target ``p``.

        ``neighbours`` (R, k) are x's first k neighbours in distance order; ``merged`` (R, k) bool marks
        the prefix n_1..n_m whose cumulative target mass S_j stays within the bound; ``tv`` = S_m.
        """
        self._check(p)
        x = x.long()
        nb = self._table_on(p.device)[x]  # (R, k)
        px = _at(p, x)  # (R,)
        cum = p.gather(1, nb).cumsum(dim=1)  # (R, k)
        within = (cum <= self._bound(px).unsqueeze(1)).to(torch.int64)  # (R, k)
        merged = within.cumprod(dim=1).bool()  # (R, k) a prefix by construction
        m = merged.sum(dim=1)  # (R,)
        last = cum.gather(1, (m - 1).clamp_min(0).unsqueeze(1)).squeeze(1)  # (R,)
        tv = torch.where(m > 0, last, torch.zeros_like(last))  # (R,)
        return px + tv, tv, m, nb, merged

    def merged_mask(self, p: torch.Tensor, x: torch.Tensor, relaxed=None) -> torch.Tensor:
        """A(x) = {x, n_1..n_m} as an (R, V) bool mask (``relaxed``: a precomputed :meth:`relax`)."""
        _, _, _, nb, merged = relaxed if relaxed is not None else self.relax(p, x)
        mask = torch.zeros(p.shape, dtype=torch.bool, device=p.device)  # (R, V)
        mask.scatter_(1, nb, merged)
        return mask.scatter_(1, x.long().unsqueeze(1), True)

    def verify(self, p, x, q=None, u=None, relaxed=None) -> Verdict:
        """The relaxed test for this rule's kind of candidates (see the module docstring)."""
        p_tilde, tv, m, _, _ = relaxed if relaxed is not None else self.relax(p, x)
        if self.candidates == "sampled":
            accept = _sampled_test(p_tilde, _at(q, x), u)
        elif self.candidates == "deterministic":
            accept = u < p_tilde
        else:
            row = p.scatter(1, x.long().unsqueeze(1), p_tilde.unsqueeze(1))  # (R, V)
            accept = row.argmax(dim=-1) == x
        return Verdict(accept=accept, p_tilde=p_tilde, tv=tv, size=m)

    def _step(self, p, x, q, u) -> tuple[Verdict, torch.Tensor]:
        """Verdict and residual from one :meth:`relax`."""
        relaxed = self.relax(p, x)
        return self.verify(p, x, q, u, relaxed), self.residual(p, q, x, relaxed)

    def try_siblings(self, p, x, valid, q, u, y) -> SiblingOutcome:
        """All siblings at once against the same ``p``; the first that passes wins.

        Deterministic candidates: with ``y ~ p``, sibling s passes iff ``y`` lies in its proximity set
        ``A(x_s)``; when none does, ``y`` is the next token. For one candidate this is exactly the
        relaxed test with the consistent residual (``x`` with probability ``p~(x)``, otherwise a draw
        from ``p`` with A(x) removed); with siblings, each A(x_s) is computed on ``p`` itself.
        Greedy candidates: sibling s passes iff it is the argmax of its relaxed row; otherwise the
        argmax ``y`` is next. Sampled candidates are tried in order (the generic loop).
        """
        if self.candidates == "sampled" or self.residual_mode == "reference":
            return super().try_siblings(p, x, valid, q, u, y)
        rows, count = x.shape
        flat_x = x.reshape(-1)  # (R*K,)
        flat_p = p[:, None].expand(-1, count, -1).reshape(rows * count, -1)  # (R*K, V)
        relaxed = self.relax(flat_p, flat_x)
        _, tv, _, neighbours, merged = relaxed
        if self.candidates == "greedy":
            passes = self.verify(flat_p, flat_x, relaxed=relaxed).accept.view(rows, count)
        else:
            drawn = y.repeat_interleave(count)  # (R*K,)
            passes = ((flat_x == drawn) | ((neighbours == drawn[:, None]) & merged).any(dim=1)).view(rows, count)
        chosen = _first(valid & passes)
        moved = tv.view(rows, count).gather(1, chosen.clamp_min(0)[:, None])[:, 0]
        return SiblingOutcome(
            chosen=chosen, tv=torch.where(chosen >= 0, moved, 0.0).to(p.dtype), target=p, proposal=q, emitted=y,
        )

    def residual(self, p, q, x, relaxed=None) -> torch.Tensor:
        """The distribution to resample from after a relaxed rejection.

        ``consistent``: zero exactly A(x) in ``p``; ``reference``: zero x and all k neighbours (as the
        reference code does). Deterministic candidates then renormalise; greedy takes the argmax of
        that ``p'``; sampled candidates take ``norm(max(0, p' - q))`` where, in consistent mode, ``p'``
        is the relaxed target (A(x)'s mass moved onto x, so ``p'(x) = p~(x)``). Rows left with no mass
        fall back to ``p``.
        """
        if self.residual_mode == "consistent":
            relaxed = relaxed if relaxed is not None else self.relax(p, x)
            zeroed = self.merged_mask(p, x, relaxed)  # (R, V)
            if self.candidates == "sampled":
                p_tilde = relaxed[0]  # (R,)
                target = p.masked_fill(zeroed, 0.0).scatter(1, x.long().unsqueeze(1), p_tilde.unsqueeze(1))  # (R, V)
                return _normalised((target - q).clamp_min(0), _normalised(target, p))  # (R, V)
        else:
            self._check(p)
            zeroed = torch.zeros(p.shape, dtype=torch.bool, device=p.device)  # (R, V)
            zeroed.scatter_(1, self._table_on(p.device)[x.long()], True)
            zeroed.scatter_(1, x.long().unsqueeze(1), True)
        kept = p.masked_fill(zeroed, 0.0)  # (R, V)
        if self.candidates == "sampled":
            return _normalised((kept - q).clamp_min(0), _normalised(kept, p))  # (R, V)
        if self.candidates == "greedy":
            fallback = kept.sum(dim=-1, keepdim=True) <= 0  # (R, 1)
            return _one_hot_argmax(torch.where(fallback, p, kept))  # (R, V)
        return _normalised(kept, p)  # (R, V)


class Lantern(_Relaxed):
    """LANTERN (k, delta): merge the longest prefix of x's k nearest neighbours with mass <= delta.

    ``p~(x) = p(x) + S_m``, with ``S_m <= delta`` the realised total variation per token. ``candidates``
    selects the sampled, deterministic or greedy test; ``residual`` the consistent or reference
    resampling distribution.
    """

    def __init__(
        self,
        k: int,
        delta: float,
        neighbours: torch.Tensor,
        residual: str = "consistent",
        candidates: str = "deterministic",
    ):
        if isinstance(delta, bool) or not isinstance(delta, (int, float)) or math.isnan(delta) or not 0 <= delta <= 1:
            raise ConfigError(f"delta={delta!r} must be a number in [0, 1]")
        super().__init__(k, neighbours, residual, candidates)
        self.delta = float(delta)

    def _bound(self, px: torch.Tensor) -> torch.Tensor:
        return torch.full_like(px, self.delta)

    def describe(self) -> dict:
        """Settings recorded with results."""
        return {"acceptance": "lantern", "candidates": self.candidates, "k": self.k, "delta": self.delta, "residual": self.residual_mode}


class LanternPP(_Relaxed):
    """LANTERN++ (k, lam): as :class:`Lantern` with the bound ``S_j <= (lam - 1) p(x)``, so ``p~(x) <= lam p(x)``."""

    def __init__(
        self,
        k: int,
        lam: float,
        neighbours: torch.Tensor,
        residual: str = "consistent",
        candidates: str = "deterministic",
    ):
        if isinstance(lam, bool) or not isinstance(lam, (int, float)) or math.isnan(lam) or not lam >= 1 or math.isinf(lam):
            raise ConfigError(f"lambda={lam!r} must be a finite number >= 1")
        super().__init__(k, neighbours, residual, candidates)
        self.lam = float(lam)

    def _bound(self, px: torch.Tensor) -> torch.Tensor:
        return (self.lam - 1.0) * px

    def describe(self) -> dict:
        """Settings recorded with results."""
        return {"acceptance": "lantern_pp", "candidates": self.candidates, "k": self.k, "lambda": self.lam, "residual": self.residual_mode}


class GreedyLantern(Lantern):
    """Greedy LANTERN: ``p(x)`` is replaced by ``p~(x)`` in the row and ``x`` is accepted iff it is then the argmax."""

    def __init__(self, k: int, delta: float, neighbours: torch.Tensor, residual: str = "consistent"):
        super().__init__(k, delta, neighbours, residual=residual, candidates="greedy")


_EXACT = {"sampled": ExactSampled, "deterministic": ExactDeterministic, "greedy": Greedy}
