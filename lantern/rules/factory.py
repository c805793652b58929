"""The rules configs build: exact decoding, LANTERN (k, delta) and LANTERN++ (k, lambda) under either semantics.

Each function returns a :class:`~lantern.rules.api.RuleSpec`: the decoder asks it for the rule of the
candidates it drafts (``spec.build(kind, draft)``) and for the settings its records keep.

The two semantics are two classes with their own factories, which configs name as ``_target_``
(``conf/semantics/{bounded,reference}.yaml``; ``semantics=reference`` on the command line):

* :func:`bounded` (default): a relaxation with ``TV(p, p') <= delta`` per token (LANTERN) or
  ``p'(x) <= lambda p(x)`` per receiving token (LANTERN++), for every draft structure and candidate kind,
  composed with the exact test (:class:`~lantern.rules.api.Composed`).
* :func:`reference`: the authors' released behaviour (:class:`~lantern.rules.reference.LanternReference`);
  its realised TV is measured, every ``tv_audit_every``-th step where that needs a sum over the vocabulary.
"""

from __future__ import annotations

from typing import ClassVar

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
    """LANTERN or LANTERN++: a neighbour relaxation with ``delta`` (``family`` lantern) or ``lam`` (lantern_pp)
    over the ``k`` nearest codes; :class:`BoundedSpec` and :class:`ReferenceSpec` say how its rule is built."""

    semantics: ClassVar[str]
    tv_audit_every = 1

    def __init__(self, family: str, k: int, neighbours, delta: float | None = None, lam: float | None = None):
        self.family, self.delta, self.lam, self.k = family, delta, lam, k
        self.table = as_table(_table(neighbours, self.semantics), k)
        self._rules: dict[tuple, Rule] = {}

    def build(self, kind: str, draft=None) -> Rule:
        kind = check_candidates(kind)
        key = self._key(kind, draft)
        if key not in self._rules:
            self._rules[key] = self._rule(kind, draft)
        return self._rules[key]

    def _key(self, kind: str, draft) -> tuple:
        return (kind,)

    def _rule(self, kind: str, draft) -> Rule:
        raise NotImplementedError

    def knobs(self) -> dict:
        """The semantics' own knobs, as records keep them."""
        return {}

    def settings(self, kind: str) -> RuleSettings:
        bound = f"d={self.delta}" if self.family == "lantern" else f"l={self.lam}"
        return RuleSettings(
            acceptance=self.family,
            candidates=kind,
            label=f"k={self.k} {bound}",
            k=self.k,
            delta=self.delta,
            lam=self.lam,
            semantics=self.semantics,
            knobs={"neighbours_normalized": self.table.normalize, **self.knobs()},
        )


class BoundedSpec(NeighbourSpec):
    """The bounded semantics: a relaxation with ``TV(p, p') <= delta`` per token (LANTERN) or
    ``p'(x) <= lambda p(x)`` per receiving token (LANTERN++), for every draft structure and candidate kind,
    composed with the exact test (:class:`~lantern.rules.api.Composed`). ``scan``, ``receivers``, ``rounds``:
    how sampled candidates' surplus mass is moved (:mod:`lantern.rules.relaxation`)."""

    semantics = "bounded"

    def __init__(self, family, k, neighbours, scan: int | None, receivers: str, rounds: int, delta=None, lam=None):
        self.scan = checks.optional(checks.integer, "scan", scan, 1, note="null = all k neighbours")
        self.receivers = checks.choice("receivers", receivers, TRANSPORT_RECEIVERS)
        self.rounds = checks.integer("rounds", rounds, 1)
        super().__init__(family, k, neighbours, delta, lam)

    def _rule(self, kind: str, draft) -> Rule:
        relaxation = NeighbourRelaxation(
            self.k,
            self.table,
            delta=self.delta,
            lam=self.lam,
            scan=self.scan,
            receivers=self.receivers,
            rounds=self.rounds,
        )
        return Composed(relaxation, EXACT[kind]())

    def knobs(self) -> dict:
        return {"scan": self.scan, "receivers": self.receivers, "rounds": self.rounds}


class ReferenceSpec(NeighbourSpec):
    """The authors' released behaviour (:class:`~lantern.rules.reference.LanternReference`); its realised TV
    is measured, every ``tv_audit_every``-th step where that needs a sum over the vocabulary."""

    semantics = "reference"

    def __init__(self, family, k, neighbours, tv_audit_every: int, delta=None, lam=None):
        self.tv_audit_every = checks.integer("tv_audit_every", tv_audit_every, 1)
        super().__init__(family, k, neighbours, delta, lam)
        self.build("deterministic")  # its table checks (the authors' k+1 slice) before any work

    def _key(self, kind: str, draft) -> tuple:
        if kind == "sampled" and getattr(draft, "name", "") == "dynamic_tree":
            raise ConfigError(
                "semantics=reference with draft=dynamic_tree and draft.candidates=sampled is not supported: the "
                "authors' code samples candidates only on static trees; use draft=static_tree or draft=chain, "
                "draft.candidates=deterministic, or semantics=bounded"
            )
        # The authors list a static tree's paths sorted by node-index sequence and an EAGLE-2 tree's leaves by
        # node index; the order decides greedy ties (LanternReference.leaf_order). A chain has one path.
        return (kind, "sorted" if getattr(draft, "name", "") in ("static_tree", "chain") else "index")

    def _rule(self, kind: str, draft) -> Rule:
        order = self._key(kind, draft)[1]
        return LanternReference(self.k, self.table, self.delta, self.lam, kind, leaf_order=order)

    def knobs(self) -> dict:
        return {"tv_audit_every": self.tv_audit_every}


def _table(neighbours, semantics: str) -> NeighbourTable:
    """The neighbour table, built in the distance space the semantics implies unless one was asked for."""
    if isinstance(neighbours, CodebookNeighbours):
        return neighbours.table(default_normalize=semantics == "bounded")
    if isinstance(neighbours, NeighbourTable):
        return neighbours
    return NeighbourTable(neighbours)


def _family(delta, lam) -> tuple[str, float | None, float | None]:
    """(family, delta, lambda) from the one bound given: LANTERN's TV budget or LANTERN++'s cap."""
    if (delta is None) == (lam is None):
        raise ConfigError("a neighbour relaxation takes one bound: delta (LANTERN) or lambda (LANTERN++)")
    if delta is not None:
        return "lantern", checks.probability("delta", delta, note="LANTERN's TV budget"), None
    return "lantern_pp", None, checks.real("lambda", lam, 1, note="LANTERN++'s cap")


def bounded(
    k: int,
    neighbours,
    delta: float | None = None,
    lam: float | None = None,
    scan: int | None = SCAN,
    receivers: str = RECEIVERS,
    rounds: int = ROUNDS,
) -> BoundedSpec:
    """LANTERN (``delta``) or LANTERN++ (``lam``) under the bounded semantics (``conf/semantics/bounded.yaml``).

    ``scan``: sampled candidates: how many of a surplus code's nearest neighbours are searched for a receiver
    (None: all k); ``receivers``: ``fill`` tops up those neighbours' deficits nearest first, ``first`` gives
    everything to the first one in deficit; ``rounds``: how often leftovers are offered again.
    """
    family, delta, lam = _family(delta, lam)
    return BoundedSpec(family, k, neighbours, scan, receivers, rounds, delta=delta, lam=lam)


def reference(k: int, neighbours, delta: float | None = None, lam: float | None = None, tv_audit_every: int = 1):
    """LANTERN (``delta``) or LANTERN++ (``lam``) as the authors' code runs it (``conf/semantics/reference.yaml``)."""
    family, delta, lam = _family(delta, lam)
    return ReferenceSpec(family, k, neighbours, tv_audit_every, delta=delta, lam=lam)


def lantern(k: int, delta: float, neighbours, **knobs) -> BoundedSpec:
    """LANTERN (k, delta), bounded (:func:`bounded`'s knobs)."""
    return bounded(k, neighbours, delta=delta, **knobs)


def lantern_reference(k: int, delta: float, neighbours, tv_audit_every: int = 1) -> ReferenceSpec:
    """LANTERN (k, delta) under the authors' semantics."""
    return reference(k, neighbours, delta=delta, tv_audit_every=tv_audit_every)


def lantern_pp(k: int, lam: float, neighbours, **knobs) -> BoundedSpec:
    """LANTERN++ (k, lambda): as :func:`lantern` with the cap ``p'(x) <= lambda p(x)`` at each receiving
    token instead of a shared TV budget (its realised TV is recorded, not bounded by a delta)."""
    return bounded(k, neighbours, lam=lam, **knobs)


def lantern_pp_reference(k: int, lam: float, neighbours, tv_audit_every: int = 1) -> ReferenceSpec:
    """LANTERN++ (k, lambda) under the authors' semantics."""
    return reference(k, neighbours, lam=lam, tv_audit_every=tv_audit_every)
