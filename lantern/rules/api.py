"""The rule contract: how a tree walk asks a rule about one node, and what a rule records.

A rule has one per-node method, :meth:`Rule.node`: given the target law ``p`` at a tree node, the node's
candidate tokens (in the order they are to be tried), the drafter law ``q`` they came from and the
node's random numbers, it says which candidate is accepted and, when none is, how the node's token is
drawn. Almost every rule is a relaxation composed with an exact candidate test (:class:`Composed`):
the relaxation fixes the law ``p'`` the node samples from before anything random happens there, and the
test is lossless for ``p'``. A rule that chooses among whole paths instead (the authors' greedy LANTERN)
sets the optional :attr:`Rule.walk` hook, and the walk asks it once per step. A rule whose law at a node
is fixed before the walk reaches it sets :attr:`Rule.relax`: a walk that knows which node every level
tests (a chain) may then relax all of them in one call and hand each level its row. Every call also says the
draft depth of the candidates it tests (``depth`` (R,): 0 for a step's first draft token), which a rule whose
law changes with depth (Cool-SD's annealed weights) reads and every other rule ignores.

Configs build a :class:`RuleSpec` (``lantern.rules.factory``); a decoder asks it for the rule of the
candidates it drafts (``sampled``, ``deterministic`` or ``greedy``) and for the settings its records keep.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import torch

from lantern import checks
from lantern.models.sampling import SamplingConfig, race

CANDIDATES = ("sampled", "deterministic", "greedy")


def check_candidates(kind: str) -> str:
    return checks.choice("candidates", kind, CANDIDATES)


@dataclass(frozen=True)
class Relaxed:
    """``target`` (R, V) the relaxed law ``p'``; ``tv`` (R,) ``TV(p, p')``; ``gain`` (R, K) the mass
    moved onto each candidate (zeros for sampled candidates, whose gains are spread over the vocabulary)."""

    target: torch.Tensor
    tv: torch.Tensor
    gain: torch.Tensor


@dataclass(frozen=True)
class SiblingOutcome:
    """The outcome of trying K sibling candidates of one node, per row.

    ``chosen`` (R,) the slot of the accepted sibling (-1 if none); ``target`` (R, V) the law after the
    rejections before it and ``proposal`` (R, V) the drafter law after the same rejections; ``emitted``
    (R,) the token to emit when no sibling is accepted, or ``None`` when it is to be drawn from ``target``.
    """

    chosen: torch.Tensor
    target: torch.Tensor
    proposal: torch.Tensor
    emitted: torch.Tensor | None = None


@dataclass(frozen=True)
class NodeOutcome:
    """The outcome at one tree node, per row: a :class:`SiblingOutcome` plus what the records keep.

    ``tv`` (R,) the realised total variation between the target and the law of the token emitted at this
    node (NaN where not measured); ``merged`` (R,) the mass the relaxation moved onto the accepted
    candidate (0 for exact rules).
    """

    chosen: torch.Tensor
    target: torch.Tensor
    proposal: torch.Tensor
    emitted: torch.Tensor | None
    tv: torch.Tensor
    merged: torch.Tensor


class PathChoice(NamedTuple):
    """A whole step's choice by a rule's walk hook: ``path`` (B, D) accepted nodes by depth (-1 past the
    end), ``next_token`` (B,), ``tv`` (B, D+1) realised TV per emitted token, ``merged`` (B, D)."""

    path: torch.Tensor
    next_token: torch.Tensor
    tv: torch.Tensor
    merged: torch.Tensor


class Rule(Protocol):
    """What a tree walk needs from an acceptance rule."""

    candidates: str  # the kind of candidates it tests: sampled, deterministic or greedy
    # Optional: ``walk(draft, p, sampling, keys, step, audit) -> PathChoice`` for rules that choose among whole
    # paths (the authors' greedy LANTERN; SJD-SV's chain, lantern.rules.window_chain), with the step's random keys
    # and counter as the per-node walk has them; None otherwise.
    walk: Callable | None
    # Optional: ``relax(p, tokens, valid, q, depth) -> Relaxed``, the node's law as a function of its own
    # inputs only (row by row), for rules whose node accepts it back as ``relaxed``; None otherwise.
    relax: Callable | None

    def node(
        self,
        p: torch.Tensor,
        tokens: torch.Tensor,
        valid: torch.Tensor,
        q: torch.Tensor,
        u: torch.Tensor,
        noise: torch.Tensor | None,
        sampling: SamplingConfig,
        audit: bool,
        relaxed: Relaxed | None = None,
        depth: torch.Tensor | None = None,
    ) -> NodeOutcome:
        """Test the candidates ``tokens`` (R, K) (``valid`` marks real ones) of one node against ``p`` (R, V).

        ``q`` (R, V) the drafter law they came from; ``u`` (R, K) one uniform per sibling; ``noise`` (R, V)
        the exponentials of the node's own draw (None when greedy); ``audit``: measure the realised TV
        where that costs a pass over the vocabulary; ``relaxed``: what :attr:`relax` gave for these rows
        (computed here when None; only passed to rules that set :attr:`relax`); ``depth`` (R,) the draft
        depth of the candidates (0: a step's first draft token; None: 0).
        """
        ...


class Relaxation(Protocol):
    def relax(self, p, tokens, valid, q, kind: str, depth: torch.Tensor | None = None) -> Relaxed:
        """The law ``p'`` the node samples from, fixed before the node's draws; ``depth`` (R,) the draft depth
        of the candidates (None: 0)."""
        ...


class CandidateTest(Protocol):
    candidates: str

    def try_siblings(self, p, x, valid, q, u, y) -> SiblingOutcome:
        """Try siblings ``x`` (R, K) in order against ``p`` (R, V); ``y`` (R,) a token drawn from ``p`` (None for
        sampled candidates, whose test draws from its residual instead)."""
        ...


class NoRelaxation:
    """``p' = p``: the exact rules."""

    def relax(self, p, tokens, valid, q, kind: str, depth=None) -> Relaxed:
        gain = torch.zeros(tokens.shape, dtype=p.dtype, device=p.device)
        return Relaxed(target=p, tv=p.new_zeros(p.shape[0]), gain=gain)


class Composed:
    """A relaxation composed with an exact candidate test: the node's token follows the relaxed law ``p'``.

    The relaxation fixes ``p'`` from ``p``, the candidates (or ``q`` for sampled ones) before any draw;
    one token ``y ~ p'`` is drawn with the node's exponentials (the argmax when greedy); the test then
    tries the siblings against ``p'``. So the emitted token's law is ``p'`` and its realised TV is the
    relaxation's ``TV(p, p')``, in closed form.
    """

    walk = None

    def __init__(self, relaxation: Relaxation, test: CandidateTest):
        self.relaxation, self.test = relaxation, test
        self.candidates = test.candidates

    def prepare(self, device: torch.device) -> None:
        """Build the tables the relaxation reads on ``device`` (called through
        :func:`lantern.decoding.loop.prepare` when a decoder builds a context; exact tests read none)."""
        hook = getattr(self.relaxation, "prepare", None)
        if hook is not None:
            hook(device)

    def relax(self, p, tokens, valid, q, depth=None) -> Relaxed:
        """``p'`` for rows of nodes (each row on its own: rows of several nodes, of any depths ``depth`` (R,),
        may come in one call)."""
        return self.relaxation.relax(p, tokens, valid, q, self.candidates, depth)

    def node(
        self,
        p,
        tokens,
        valid,
        q,
        u,
        noise,
        sampling: SamplingConfig,
        audit: bool = True,
        relaxed: Relaxed | None = None,
        depth: torch.Tensor | None = None,
    ) -> NodeOutcome:
        if relaxed is None and isinstance(self.relaxation, NoRelaxation):  # exact: p' = p, nothing moved, TV 0
            drawn = None if self.candidates == "sampled" else race(p, noise, sampling)
            outcome = self.test.try_siblings(p, tokens, valid, q, u, drawn)
            zero = p.new_zeros(p.shape[0])
            return NodeOutcome(outcome.chosen, outcome.target, outcome.proposal, outcome.emitted, zero, zero)
        if relaxed is None:
            relaxed = self.relax(p, tokens, valid, q, depth)
        # (R,) y ~ p' (the argmax when greedy). A test of sampled candidates never uses it: after a rejection
        # the token comes from its residual, so that pass over the vocabulary is skipped.
        drawn = None if self.candidates == "sampled" else race(relaxed.target, noise, sampling)
        outcome = self.test.try_siblings(relaxed.target, tokens, valid, q, u, drawn)
        merged = relaxed.gain.gather(1, outcome.chosen.clamp_min(0)[:, None])[:, 0]  # (R,)
        return NodeOutcome(
            chosen=outcome.chosen,
            target=outcome.target,
            proposal=outcome.proposal,
            emitted=outcome.emitted,
            tv=relaxed.tv,
            merged=torch.where(outcome.chosen >= 0, merged, torch.zeros_like(merged)),
        )


@dataclass(frozen=True)
class RuleSettings:
    """What a rule records beside its results, and how a table names it.

    ``acceptance``: the rule family (exact, greedy, lantern, lantern_pp); ``label``: its part of a table
    row's name (``exact``, ``k=1000 d=0.1``); ``knobs``: every other setting (semantics, transport,
    audit cadence, the neighbour space).
    """

    acceptance: str
    candidates: str
    label: str
    k: int | None = None
    delta: float | None = None
    lam: float | None = None
    semantics: str | None = None
    knobs: dict = field(default_factory=dict)

    def record(self) -> dict:
        """The record's flat entries."""
        flat = {
            "acceptance": self.acceptance,
            "candidates": self.candidates,
            "semantics": self.semantics,
            "k": self.k,
            "delta": self.delta,
            "lambda": self.lam,
        }
        return {**flat, **self.knobs}


class RuleSpec(Protocol):
    """What a config builds: a rule for each kind of candidates a decoder may draft."""

    tv_audit_every: int  # measure costly realised TVs on every N-th step

    def build(self, kind: str, draft=None) -> Rule:
        """The rule for candidates of ``kind``; refuses a draft structure it cannot verify."""
        ...

    def settings(self, kind: str) -> RuleSettings:
        """The settings of the rule :meth:`build` gives for ``kind``."""
        ...
