"""The rules configs build: LANTERN (k, delta) and LANTERN++ (k, lambda) under either semantics."""

from __future__ import annotations

from lantern.errors import ConfigError
from lantern.rules.exact import _EXACT, AcceptanceRule, _check_kind
from lantern.rules.neighbours import CodebookNeighbours
from lantern.rules.reference import LanternReference
from lantern.rules.relaxation import (
    RECEIVERS,
    ROUNDS,
    SCAN,
    NeighbourRelaxation,
    NeighbourTable,
    check_delta,
    check_lambda,
    check_receivers,
    check_rounds,
    check_scan,
)
from lantern.rules.relaxed import RelaxedRule

SEMANTICS = ("bounded", "reference")


def _table(neighbours, semantics: str) -> NeighbourTable:
    """The neighbour table, built in the distance space the semantics implies unless one was asked for."""
    if isinstance(neighbours, CodebookNeighbours):
        return neighbours.table(default_normalize=semantics == "bounded")
    if isinstance(neighbours, NeighbourTable):
        return neighbours
    return NeighbourTable(neighbours)


def _check_semantics(semantics: str) -> str:
    if semantics not in SEMANTICS:
        raise ConfigError(f"semantics={semantics!r} must be one of {', '.join(SEMANTICS)}")
    return semantics


def _check_audit(tv_audit_every) -> int:
    if isinstance(tv_audit_every, bool) or not isinstance(tv_audit_every, int) or tv_audit_every < 1:
        raise ConfigError(f"tv_audit_every={tv_audit_every!r} must be an integer >= 1")
    return tv_audit_every


def _neighbour_rule(
    settings: dict,
    neighbours,
    semantics: str,
    candidates: str,
    tv_audit_every: int,
    scan: int | None = SCAN,
    receivers: str = RECEIVERS,
    rounds: int = ROUNDS,
    **bound,
) -> AcceptanceRule:
    """The rule for a neighbour relaxation with ``bound`` (``delta=`` or ``lam=``) under ``semantics``."""
    semantics, kind, every = _check_semantics(semantics), _check_kind(candidates), _check_audit(tv_audit_every)
    table = _table(neighbours, semantics)
    if semantics == "reference":
        return LanternReference(settings["k"], table, settings, candidates=kind, tv_audit_every=every, **bound)
    settings = {**settings, "scan": scan, "receivers": receivers, "rounds": rounds}  # sampled candidates' transport
    relaxation = NeighbourRelaxation(settings["k"], table, scan=scan, receivers=receivers, rounds=rounds, **bound)
    return RelaxedRule(relaxation, _EXACT[kind](), settings)


def lantern(
    k: int,
    delta: float,
    neighbours,
    semantics: str = "bounded",
    candidates: str = "deterministic",
    tv_audit_every: int = 1,
    scan: int | None = SCAN,
    receivers: str = RECEIVERS,
    rounds: int = ROUNDS,
) -> AcceptanceRule:
    """LANTERN (k, delta).

    ``bounded`` (default): a relaxation with ``TV(p, p') <= delta`` per token for every structure and
    candidate kind, then the exact test. ``reference``: the authors' released behaviour
    (:class:`~lantern.rules.reference.LanternReference`); its realised TV is measured, every
    ``tv_audit_every``-th step where that needs a sum over the vocabulary. ``scan``: bounded semantics,
    sampled candidates: how many of a surplus code's nearest neighbours are searched for a receiver
    (None: all k); ``receivers``: ``fill`` tops up those neighbours' deficits nearest first, ``first``
    gives everything to the first one in deficit; ``rounds``: how often leftovers are offered again
    (see :mod:`lantern.rules.relaxation`).
    """
    delta, scan, receivers, rounds = (
        check_delta(delta),
        check_scan(scan),
        check_receivers(receivers),
        check_rounds(rounds),
    )
    settings = {"acceptance": "lantern", "k": k, "delta": delta}
    return _neighbour_rule(
        settings, neighbours, semantics, candidates, tv_audit_every, scan, receivers, rounds, delta=delta
    )


def lantern_pp(
    k: int,
    lam: float,
    neighbours,
    semantics: str = "bounded",
    candidates: str = "deterministic",
    tv_audit_every: int = 1,
    scan: int | None = SCAN,
    receivers: str = RECEIVERS,
    rounds: int = ROUNDS,
) -> AcceptanceRule:
    """LANTERN++ (k, lambda): as :func:`lantern` with the cap ``p'(x) <= lambda p(x)`` at each receiving
    token instead of a shared TV budget (its realised TV is recorded, not bounded by a delta)."""
    lam, scan, receivers, rounds = check_lambda(lam), check_scan(scan), check_receivers(receivers), check_rounds(rounds)
    settings = {"acceptance": "lantern_pp", "k": k, "lambda": lam}
    return _neighbour_rule(
        settings, neighbours, semantics, candidates, tv_audit_every, scan, receivers, rounds, lam=lam
    )
