"""The law one tree node actually emits, enumerated through the rules' own code, on real target and
drafter distributions of the shipped world (CFG 3, temperature 1).

``bounded`` must emit exactly its relaxed target p' with TV(p, p') <= delta and equal to what the
records get; ``reference`` (the authors' rule) is checked against a literal transcription of their
loop, and its recorded TV against the enumerated law."""

from __future__ import annotations

import pytest
import torch
from world_fixture import WORLD_SAMPLING, World

import lantern.decoding.tree.step as speculative_module  # where the step calls walk_tree
from lantern.decoding.tree.decoder import SpeculativeDecoder
from lantern.decoding.tree.draft import DynamicTree, chain
from lantern.models.sampling import SamplingConfig
from lantern.rules.exact import ExactDeterministic, ExactSampled
from lantern.rules.factory import lantern, lantern_pp, lantern_reference

NODES = 8  # nodes per kind, each enumerated over the whole vocabulary


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return World(tmp_path_factory.mktemp("neighbours"))


@pytest.fixture(scope="module")
def roots(world):
    """Root nodes (p, candidates, q) met while decoding 4 prompts: a deterministic dynamic tree (10
    top-ranked children per root) and a sampled chain (one drawn child)."""
    captured = {}
    original = speculative_module.walk_tree
    for kind, structure, rule in (
        ("deterministic", DynamicTree(5, 10, 58), ExactDeterministic()),
        ("sampled", chain(3, "sampled"), ExactSampled()),
    ):
        nodes = []

        def spy(draft, p, *args, _nodes=nodes, **kwargs):
            for row in range(p.shape[0]):
                _nodes.append((p[row, 0].double(), draft.candidates[row, 0], draft.q[row, 0].double()))
            return original(draft, p, *args, **kwargs)

        speculative_module.walk_tree = spy
        try:
            world.decode(SpeculativeDecoder(WORLD_SAMPLING, drafter=world.drafter, draft=structure, acceptance=rule), 4)
        finally:
            speculative_module.walk_tree = original
        step = max(1, len(nodes) // NODES)
        captured[kind] = [nodes[i] for i in range(0, step * NODES, step)]
    return captured


def _tv(a, b):
    return 0.5 * (a - b).abs().sum(-1)


def _deterministic_law(rule, p, tokens, q):
    """Enumerate the node's draw y over the vocabulary (one row per y; the exponential race picks y
    with probability p'(y)); return (law of the emitted token, p', recorded tv)."""
    vocab = p.shape[0]
    valid = (tokens >= 0)[None].expand(vocab, -1)
    relaxed = rule.relaxation.relax(p[None], tokens[None], valid[:1], q[None], rule.candidates)
    noise = torch.full((vocab, vocab), 1e300, dtype=p.dtype)
    noise.fill_diagonal_(1.0)  # row y: the race picks y whenever p'(y) > 0
    out = rule.node(
        p.expand(vocab, -1),
        tokens.expand(vocab, -1),
        valid,
        q.expand(vocab, -1),
        torch.zeros(vocab, tokens.shape[0], dtype=p.dtype),
        noise,
        SamplingConfig(),
    )
    emitted = torch.where(out.chosen >= 0, tokens.clamp_min(0)[out.chosen.clamp_min(0)], out.emitted)
    weights = relaxed.target[0]
    law = torch.zeros_like(p).scatter_add_(0, emitted, weights)
    return law, relaxed.target[0], float(out.tv[0])


@pytest.mark.parametrize("siblings", [1, 10])
@pytest.mark.parametrize(
    "build",
    [
        lambda w: lantern(1000, 0.1, w.neighbours),
        lambda w: lantern(1000, 0.4, w.neighbours),
        lambda w: lantern_pp(10, 3.0, w.neighbours),
    ],
    ids=["delta0.1", "delta0.4", "lambda3"],
)
def test_bounded_deterministic_node_emits_its_relaxed_target(world, roots, build, siblings):
    spec = build(world)
    rule, delta = spec.build("deterministic"), spec.delta
    realised = []
    for p, _candidates, q in roots["deterministic"]:
        tokens = q.topk(siblings).indices  # the drafter's top-ranked children (EAGLE-2's candidates)
        law, relaxed, recorded = _deterministic_law(rule, p, tokens, q)
        assert torch.allclose(law, relaxed, atol=1e-9)  # the closed form emits exactly p'
        tv = float(_tv(law, p))
        assert tv == pytest.approx(recorded, abs=1e-6)
        if delta is not None:
            assert tv <= delta + 1e-6
        realised.append(tv)
    assert max(realised) > 0  # the relaxation did something on these distributions


@pytest.mark.parametrize("delta", [0.05, 0.1, 0.4])
def test_bounded_sampled_node_emits_its_relaxed_target(world, roots, delta):
    """One sampled candidate x ~ q: accept with min(1, p'(x)/q(x)), else the rule's residual; the
    mixture over x must be p' itself, within delta of p."""
    rule = lantern(1000, delta, world.neighbours).build("sampled")
    vocab = world.bundle.target.config.vocab_size
    for p, _, q in roots["sampled"]:
        xs = torch.arange(vocab)
        relaxed = rule.relaxation.relax(
            p[None], xs[:1, None], torch.ones(1, 1, dtype=torch.bool), q[None], "sampled"
        )  # fixed before x is drawn
        target = relaxed.target.expand(vocab, -1)
        verdict = rule.test.verify(target, xs, q.expand(vocab, -1), torch.zeros(vocab, dtype=p.dtype))
        accept = torch.where(q > 0, torch.clamp(verdict.p_x / q.clamp_min(1e-300), max=1.0), 0.0)
        residual = rule.test.residual(target, q.expand(vocab, -1), xs)  # (V, V) row x: the law after rejecting x
        law = q * accept + ((q * (1 - accept))[:, None] * residual).sum(0)
        assert torch.allclose(law, relaxed.target[0], atol=1e-7)  # the exact test emits p' itself
        assert float(_tv(law, p)) == pytest.approx(float(relaxed.tv[0]), abs=1e-6)
        assert float(_tv(law, p)) <= delta + 1e-6
        out = rule.node(
            p[None],
            xs[:1, None],
            torch.ones(1, 1, dtype=torch.bool),
            q[None],
            torch.rand(1, 1, dtype=p.dtype),
            torch.ones(1, vocab, dtype=p.dtype),
            SamplingConfig(),
        )
        assert float(out.tv[0]) == pytest.approx(float(relaxed.tv[0]), abs=1e-9)  # what the records get


def _authors_loop_law(p, tokens, table, k, delta):
    """The authors' sibling loop (ea_model_llamagen.py, evaluate_posterior), transcribed literally,
    returning the exact law of the emitted token."""
    law, reach, current = torch.zeros_like(p), 1.0, p.clone()
    for x in tokens.tolist():
        near = table[x, :k]
        cumsum = current[near].cumsum(0)
        merged = torch.nonzero(cumsum <= delta).flatten()
        last = int(merged[-1]) if len(merged) and int(merged[0]) == 0 else -1  # a prefix from the nearest
        p_tilde = float(current[x]) + (float(cumsum[last]) if last >= 0 else 0.0)
        law[x] += reach * p_tilde
        reach *= 1 - p_tilde
        current[x] = 0
        if last >= 0:
            current[table[x, : k + 1]] = 0
        current = current / current.sum() if current.sum() > 0 else torch.full_like(current, 1 / len(current))
    return law + reach * current


def test_reference_siblings_follow_the_authors_loop_and_drift_past_delta(world, roots):
    delta, k = 0.1, 1000
    rule = lantern_reference(k, delta, world.neighbours).build("deterministic")
    table = rule.table.indices
    drifts = []
    for p, _candidates, q in roots["deterministic"]:
        tokens = q.topk(10).indices  # a full 10-sibling level
        out = rule.node(
            p[None],
            tokens[None],
            torch.ones(1, len(tokens), dtype=torch.bool),
            q[None],
            torch.zeros(1, len(tokens), dtype=p.dtype),
            torch.ones(1, p.shape[0], dtype=p.dtype),
            SamplingConfig(),
        )
        law = _authors_loop_law(p, tokens, table, k, delta)
        assert float(out.tv[0]) == pytest.approx(float(_tv(law, p)), abs=1e-6)
        drifts.append(float(out.tv[0]))
    assert max(drifts) > delta  # the authors' sibling loop is not bounded by delta (recorded, not hidden)


def test_reference_sampled_closed_form_matches_the_enumerated_mixture(world, roots):
    k, delta = 1000, 0.1
    rule = lantern_reference(k, delta, world.neighbours).build("sampled")
    vocab = world.bundle.target.config.vocab_size
    for p, _, q in roots["sampled"][:6]:
        xs = torch.arange(vocab)
        ps, qs = p.expand(vocab, -1), q.expand(vocab, -1)
        p_tilde, _, _ = rule.relaxed_probability(ps, xs)
        accept = torch.where(q > 0, torch.clamp(p_tilde / q.clamp_min(1e-300), max=1.0), 0.0)
        out = rule.node(
            ps,
            xs[:, None],
            torch.ones(vocab, 1, dtype=torch.bool),
            qs,
            torch.ones(vocab, 1, dtype=p.dtype),
            None,
            SamplingConfig(),
            audit=False,
        )  # u = 1: every x with p~ < q is rejected
        law = q * accept + ((q * (1 - accept))[:, None] * out.target).sum(0)
        recorded = rule.node(
            p[None],
            xs[:1, None],
            torch.ones(1, 1, dtype=torch.bool),
            q[None],
            torch.ones(1, 1, dtype=p.dtype),
            None,
            SamplingConfig(),
            audit=True,
        ).tv
        assert float(recorded[0]) == pytest.approx(float(_tv(law, p)), abs=1e-6)
        assert float(_tv(law, p)) > 0
