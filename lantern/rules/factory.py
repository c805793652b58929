"""The rules configs build: exact decoding, LANTERN (k, delta) and LANTERN++ (k, lambda) under either semantics.

Each function returns a :class:`~lantern.rules.api.RuleSpec`: the decoder asks it for the rule of the
candidates it drafts (``spec.build(kind, draft)``) and for the settings its records keep.

* ``semantics=bounded`` (default): a relaxation with ``TV(p, p') <= delta`` per token (LANTERN) or
  ``p'(x) <= lambda p(x)`` per receiving token (LANTERN++), for every draft structure and candidate kind,
  composed with the exact test (:class:`~lantern.rules.api.Composed`).
* ``semantics=reference``: the authors' released behaviour (:class:`~lantern.rules.reference.LanternReference`);
  its realised TV is measured, every ``tv_audit_every``-th step where that needs a sum over the vocabulary.
"""

from __future__ import annotations

from lantern import checks
from lantern.errors import ConfigError
from lantern.rules.api import Composed, NoRelaxation, Rule, RuleSettings, check_candidates
from lantern.rules.exact import EXACT, ExactTest
from lantern.rules.neighbours import CodebookNeighbours
from lantern.rules.reference import LanternReference
from lantern.rules.relaxation import (
    RECEIVERS,
    ROUNDS,
    SCAN,
    TRANSPORT_RECEIVERS,
    NeighbourRelaxation,
    NeighbourTable,
    as_table,
)

SEMANTICS = ("bounded", "reference")


class ExactSpec:
    """Exact (lossless) decoding: no relaxation, the exact test of the drafted candidates.

    ``test``: a test to use for its own kind of candidates instead of the standard one (tests use this
    to run a broken rule as a negative control); other kinds keep the standard test.
    """

    tv_audit_every = 1

    def __init__(self, test: ExactTest | None = None):
        self.test = test

    def build(self, kind: str, draft=None) -> Rule:
        test = self.test if self.test is not None and self.test.candidates == kind else EXACT[check_candidates(kind)]()
        return Composed(NoRelaxation(), test)

    def settings(self, kind: str) -> RuleSettings:
        return RuleSettings(acceptance="greedy" if kind == "greedy" else "exact", candidates=kind, label="exact")


def exact(test: ExactTest | None = None) -> ExactSpec:
    """Exact speculative decoding (EAGLE's rule for every candidate kind)."""
    return ExactSpec(test)


class NeighbourSpec:
    """LANTERN or LANTERN++: a neighbour relaxation with ``delta`` or ``lam`` under ``semantics``."""

    def __init__(
        self,
        family: str,
        k: int,
        neighbours,
        semantics: str,
        tv_audit_every: int,
        scan: int | None,
        receivers: str,
        rounds: int,
        delta: float | None = None,
        lam: float | None = None,
    ):
        self.family, self.delta, self.lam = family, delta, lam
        self.semantics = checks.choice("semantics", semantics, SEMANTICS)
        self.tv_audit_every = checks.integer("tv_audit_every", tv_audit_every, 1)
        self.scan = checks.optional(checks.integer, "scan", scan, 1, note="null = all k neighbours")
        self.receivers = checks.choice("receivers", receivers, TRANSPORT_RECEIVERS)
        self.rounds = checks.integer("rounds", rounds, 1)
        self.table = as_table(_table(neighbours, self.semantics), k)
        self.k = k
        self._rules: dict[str, Rule] = {}
        if self.semantics == "reference":  # its table checks (the authors' k+1 slice) before any work
            self.build("deterministic")

    def build(self, kind: str, draft=None) -> Rule:
        kind = check_candidates(kind)
        if self.semantics == "reference" and kind == "sampled" and getattr(draft, "name", "") == "dynamic_tree":
            raise ConfigError(
                "semantics=reference with draft=dynamic_tree and draft.candidates=sampled is not supported: the "
                "authors' code samples candidates only on static trees; use draft=static_tree or draft=chain, "
                "draft.candidates=deterministic, or decoding.acceptance.semantics=bounded"
            )
        # The authors list a static tree's paths sorted by node-index sequence and an EAGLE-2 tree's leaves by
        # node index; the order decides greedy ties (LanternReference.leaf_order). A chain has one path.
        order = "sorted" if getattr(draft, "name", "") in ("static_tree", "chain") else "index"
        key = (kind, order) if self.semantics == "reference" else kind
        if key not in self._rules:
            if self.semantics == "reference":
                self._rules[key] = LanternReference(self.k, self.table, self.delta, self.lam, kind, leaf_order=order)
            else:
                relaxation = NeighbourRelaxation(
                    self.k,
                    self.table,
                    delta=self.delta,
                    lam=self.lam,
                    scan=self.scan,
                    receivers=self.receivers,
                    rounds=self.rounds,
                )
                self._rules[key] = Composed(relaxation, EXACT[kind]())
        return self._rules[key]

    def settings(self, kind: str) -> RuleSettings:
        bound = f"d={self.delta}" if self.family == "lantern" else f"l={self.lam}"
        knobs = {"neighbours_normalized": self.table.normalize}
        if self.semantics == "bounded":  # sampled candidates' transport
            knobs.update(scan=self.scan, receivers=self.receivers, rounds=self.rounds)
        else:
            knobs["tv_audit_every"] = self.tv_audit_every
        return RuleSettings(
            acceptance=self.family,
            candidates=kind,
            label=f"k={self.k} {bound}",
            k=self.k,
            delta=self.delta,
            lam=self.lam,
            semantics=self.semantics,
            knobs=knobs,
        )


def _table(neighbours, semantics: str) -> NeighbourTable:
    """The neighbour table, built in the distance space the semantics implies unless one was asked for."""
    if isinstance(neighbours, CodebookNeighbours):
        return neighbours.table(default_normalize=semantics == "bounded")
    if isinstance(neighbours, NeighbourTable):
        return neighbours
    return NeighbourTable(neighbours)


def lantern(
    k: int,
    delta: float,
    neighbours,
    semantics: str = "bounded",
    tv_audit_every: int = 1,
    scan: int | None = SCAN,
    receivers: str = RECEIVERS,
    rounds: int = ROUNDS,
) -> NeighbourSpec:
    """LANTERN (k, delta).

    ``scan``: bounded semantics, sampled candidates: how many of a surplus code's nearest neighbours are
    searched for a receiver (None: all k); ``receivers``: ``fill`` tops up those neighbours' deficits
    nearest first, ``first`` gives everything to the first one in deficit; ``rounds``: how often leftovers
    are offered again (see :mod:`lantern.rules.relaxation`).
    """
    delta = checks.probability("delta", delta, note="LANTERN's TV budget")
    return NeighbourSpec("lantern", k, neighbours, semantics, tv_audit_every, scan, receivers, rounds, delta=delta)


def lantern_pp(
    k: int,
    lam: float,
    neighbours,
    semantics: str = "bounded",
    tv_audit_every: int = 1,
    scan: int | None = SCAN,
    receivers: str = RECEIVERS,
    rounds: int = ROUNDS,
) -> NeighbourSpec:
    """LANTERN++ (k, lambda): as :func:`lantern` with the cap ``p'(x) <= lambda p(x)`` at each receiving
    token instead of a shared TV budget (its realised TV is recorded, not bounded by a delta)."""
    lam = checks.real("lambda", lam, 1, note="LANTERN++'s cap")
    return NeighbourSpec("lantern_pp", k, neighbours, semantics, tv_audit_every, scan, receivers, rounds, lam=lam)
