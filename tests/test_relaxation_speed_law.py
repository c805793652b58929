"""The cheaper relaxations draw every token from the law the rules had before (commit 4df88c0).

``tests/frozen_rules.py`` keeps the rules as they were (the bounded transport and merge, the composed node,
the reference node) as an oracle. On random targets, drafter laws, candidates and neighbour tables, the
relaxed law, its TV and gains, every acceptance probability and whole walks over chains and trees must
agree with it to 1e-6: bounded LANTERN and LANTERN++ on sampled, deterministic and greedy candidates, and
the reference rule.
"""

from __future__ import annotations

import frozen_rules
import pytest
import torch
from frozen_rules import FrozenComposed, FrozenReference, FrozenRelaxation
from helpers_walk import VOCAB, neighbour_table, walk_inputs

from lantern.decoding.tree.draft import chain, prior_tree
from lantern.decoding.tree.verify import walk_tree
from lantern.models import sampling as sampling_module
from lantern.models.sampling import SamplingConfig
from lantern.rules import api, reference
from lantern.rules.api import Composed
from lantern.rules.exact import EXACT
from lantern.rules.reference import LanternReference
from lantern.rules.relaxation import NeighbourRelaxation

TOL = 1e-6
ROWS, K = 96, 63  # k + 1 <= the table's 64 columns, as the reference rule needs
BOUNDED = {
    "lantern_0.1": dict(delta=0.1),
    "lantern_0.4": dict(delta=0.4),
    "lantern_pp": dict(lam=3.0),
    "lantern_first": dict(delta=0.2, receivers="first"),
    "lantern_3_rounds_all_k": dict(delta=0.3, rounds=3, scan=None),
}


def _laws(seed: int, rows: int = ROWS, siblings: int = 4):
    """Targets near (and sometimes far from) drafter laws, candidates drawn from the drafter, some missing."""
    generator = torch.Generator().manual_seed(seed)

    def law(scale):
        return torch.softmax(scale * torch.randn(rows, VOCAB, generator=generator, dtype=torch.float64), -1)

    q = law(4.0)
    share = torch.rand(rows, 1, generator=generator, dtype=torch.float64)
    p = share * q + (1 - share) * law(3.0)
    tokens = torch.multinomial(q, siblings, replacement=False, generator=generator)  # distinct, as a node's
    valid = torch.rand(rows, siblings, generator=generator) < 0.85
    valid[:, 0] |= torch.rand(rows, generator=generator) < 0.5
    return p, q, torch.where(valid, tokens, -1), valid, generator


def _close(new, old, what):
    assert new.shape == old.shape, what
    gap = (new.double() - old.double()).abs().max().item() if new.numel() else 0.0
    assert gap <= TOL, f"{what}: {gap}"


@pytest.mark.parametrize("name", sorted(BOUNDED))
@pytest.mark.parametrize("kind", ["sampled", "deterministic", "greedy"])
def test_bounded_relaxed_law_and_acceptance_equal_the_frozen_rule(name, kind):
    table = neighbour_table()
    for seed in range(3):
        p, q, tokens, valid, _ = _laws(seed, siblings=1 if kind == "sampled" else 4)
        new = NeighbourRelaxation(K, table, **BOUNDED[name]).relax(p, tokens, valid, q, kind)
        old = FrozenRelaxation(K, table, **BOUNDED[name]).relax(p, tokens, valid, q, kind)
        for field in ("target", "tv", "gain"):
            _close(getattr(new, field), getattr(old, field), f"{name} {kind} {field}")
        assert old.tv.max() > 0.05  # the relaxation moved mass: the comparison is not of two copies of p
        x = tokens.clamp_min(0)
        if kind == "sampled":  # accept x ~ q with probability min(1, p'(x) / q(x))
            accept = [torch.clamp(r.target.gather(1, x) / q.gather(1, x), max=1.0) for r in (new, old)]
        else:  # sibling s is accepted with probability p'(x_s) (the closed form's draw y ~ p')
            accept = [r.target.gather(1, x) for r in (new, old)]
        _close(*accept, f"{name} {kind} acceptance")


class Captured:
    """Records the law every ``race`` is asked to draw from (the laws a node's tokens come from)."""

    def __init__(self, monkeypatch, modules):
        self.laws = []
        for module in modules:
            monkeypatch.setattr(module, "race", self)

    def __call__(self, probs, exponential, config):
        self.laws.append(probs)
        return sampling_module.race(probs, exponential, config)


def _node_args(seed: int, kind: str, siblings: int):
    p, q, tokens, valid, generator = _laws(seed, siblings=siblings)
    u = torch.rand(ROWS, siblings, generator=generator, dtype=torch.float64)
    noise = torch.empty(ROWS, VOCAB, dtype=torch.float64).exponential_(generator=generator)
    return p, tokens, valid, q, u, noise, SamplingConfig(temperature=0.0 if kind == "greedy" else 1.0)


def _same_outcome(new, old, what):
    assert torch.equal(new.chosen, old.chosen), what
    assert (new.emitted is None) == (old.emitted is None), what
    if new.emitted is not None:
        assert torch.equal(new.emitted, old.emitted), what
    for field in ("target", "proposal", "merged"):
        _close(getattr(new, field), getattr(old, field), f"{what} {field}")
    assert torch.equal(new.tv.isnan(), old.tv.isnan()), what
    _close(new.tv.nan_to_num(), old.tv.nan_to_num(), f"{what} tv")


@pytest.mark.parametrize("kind", ["sampled", "deterministic", "greedy"])
def test_bounded_node_equals_the_frozen_node(kind, monkeypatch):
    table = neighbour_table()
    captured = Captured(monkeypatch, [api, frozen_rules])
    for name, budget in BOUNDED.items():
        new = Composed(NeighbourRelaxation(K, table, **budget), EXACT[kind]())
        old = FrozenComposed(FrozenRelaxation(K, table, **budget), EXACT[kind]())
        args = _node_args(1, kind, 1 if kind == "sampled" else 4)
        captured.laws.clear()
        _same_outcome(new.node(*args), old.node(*args), f"{name} {kind}")
        if kind != "sampled":  # both drew the node's token from p' (a sampled test draws from its residual)
            assert len(captured.laws) == 2
            _close(captured.laws[0], captured.laws[1], f"{name} {kind} law")


@pytest.mark.parametrize("kind", ["sampled", "deterministic"])
@pytest.mark.parametrize("bound", [dict(delta=0.1), dict(delta=0.4), dict(lam=3.0)])
def test_reference_node_law_and_acceptance_equal_the_frozen_node(kind, bound, monkeypatch):
    table = neighbour_table()
    captured = Captured(monkeypatch, [reference, frozen_rules])
    new, old = LanternReference(K, table, **bound, candidates=kind), FrozenReference(K, table, **bound, candidates=kind)
    for seed in range(3):
        args = _node_args(seed, kind, 1 if kind == "sampled" else 4)
        p, tokens = args[0], args[1].clamp_min(0)
        for slot in range(tokens.shape[1]):  # the relaxed test's p~(x), S_m and m on the same law
            pair = (rule.relaxed_probability(p, tokens[:, slot]) for rule in (new, old))
            for a, b in zip(*pair, strict=True):
                _close(a, b, f"{kind} {bound} relaxed probability")
        captured.laws.clear()
        _same_outcome(new.node(*args), old.node(*args), f"reference {kind} {bound}")
        if kind == "deterministic":  # the law of the node's token, every sibling and the resample in one
            _close(captured.laws[0], captured.laws[1], f"reference {bound} law")


STRUCTURES = {"chain": lambda kind: chain(3, kind), "tree": lambda kind: prior_tree(3, 3, 6, candidates=kind)}


def _old_rule(kind, semantics, budget, table):
    if semantics == "reference":
        return FrozenReference(K, table, **budget, candidates=kind, leaf_order="sorted")
    return FrozenComposed(FrozenRelaxation(K, table, **budget), EXACT[kind]())


def _new_rule(kind, semantics, budget, table):
    if semantics == "reference":
        return LanternReference(K, table, **budget, candidates=kind, leaf_order="sorted")
    return Composed(NeighbourRelaxation(K, table, **budget), EXACT[kind]())


@pytest.mark.parametrize("structure", sorted(STRUCTURES))
@pytest.mark.parametrize("kind", ["sampled", "deterministic", "greedy"])
@pytest.mark.parametrize("semantics", ["bounded", "reference"])
def test_walks_over_chains_and_trees_equal_the_frozen_rules(structure, kind, semantics):
    table = neighbour_table()
    draft, p, keys, step = walk_inputs(STRUCTURES[structure]("deterministic" if kind == "greedy" else kind), kind)
    sampling = SamplingConfig(temperature=0.0 if kind == "greedy" else 1.0)
    for budget in (dict(delta=0.1), dict(delta=0.4), dict(lam=3.0)):
        new = walk_tree(draft, p, _new_rule(kind, semantics, budget, table), sampling, keys, step)
        old = walk_tree(draft, p, _old_rule(kind, semantics, budget, table), sampling, keys, step)
        for field in ("path", "accepted", "next_token"):
            assert torch.equal(getattr(new, field), getattr(old, field)), (field, budget)
        for field in ("tv", "merged"):
            _close(getattr(new, field).nan_to_num(), getattr(old, field).nan_to_num(), f"{field} {budget}")
        assert (old.merged > 0).any() or kind == "sampled"  # candidates did take neighbour mass


def test_the_oracle_is_not_the_new_code():
    """A frozen method that silently fell through to the new one would make every test above vacuous."""
    for frozen, new, names in (
        (FrozenRelaxation, NeighbourRelaxation, ("transport", "merge", "_ask")),
        (FrozenComposed, Composed, ("node",)),
        (FrozenReference, LanternReference, ("node", "_sampled_law_tv")),
    ):
        for name in names:
            assert name in vars(frozen) and getattr(frozen, name) is not getattr(new, name), name


def test_compiled_transport_skips_spent_rounds_without_changing_the_law():
    """Under torch.compile on the CPU the rounds after a spent budget sit behind ``torch.cond``: the graph
    compiles whole, and both branches give the eager (and the frozen) law, on rows that all spend delta in
    the first round (the skip) and on rows close enough to their drafter that none does (every round runs)."""
    from lantern.decoding.compile import inductor_options

    table, delta = neighbour_table(), 0.1
    relaxation = NeighbourRelaxation(K, table, delta=delta)
    compiled = torch.compile(relaxation.transport, fullgraph=True, **inductor_options("default", "cpu"))
    generator = torch.Generator().manual_seed(5)
    p, q = (torch.softmax(3 * torch.randn(8, VOCAB, generator=generator), -1) for _ in range(2))  # far apart
    active = torch.ones(8, dtype=torch.bool)
    for target, skips in ((p, True), (0.9 * q + 0.1 * p, False)):
        got, eager = compiled(target, q, active), relaxation.transport(target, q, active)
        frozen = FrozenRelaxation(K, table, delta=delta).transport(target, q, active)
        assert bool((eager.tv >= delta - 1e-6).all()) == skips
        assert bool((eager.tv < delta - 1e-3).all()) == (not skips)
        for field in ("target", "tv"):
            _close(getattr(got, field), getattr(eager, field), f"compiled {field}")
            _close(getattr(got, field), getattr(frozen, field), f"compiled vs frozen {field}")
