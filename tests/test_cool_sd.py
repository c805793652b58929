"""Cool-SD's annealed rule: its emitted law against the paper's procedure (exact enumeration) and against Monte
Carlo runs of the rule's own node code, its closed-form TV, the draft depth reaching it, greedy equality with AR,
one compiled graph, and its records."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import CountingBackend, run_in_process, text_condition, tiny
from scipy.stats import chi2

from lantern.decoding.ar import ARDecoder
from lantern.decoding.tree.decoder import SpeculativeDecoder
from lantern.decoding.tree.draft import DynamicTree, chain, prior_tree
from lantern.errors import ConfigError
from lantern.models.sampling import SamplingConfig, race
from lantern.rng import keys_tensor
from lantern.rules.cool_sd import AnnealedRelaxation, cool_sd
from lantern.rules.exact import realised_tv, residual
from lantern.rules.weighted import weighted_law, weighted_sibling_law

V = 6
WEIGHTS = [0.4, 1.0, 1.1, 1.7, 4.0]


def laws(seed: int, rows: int = 1, vocab: int = V) -> tuple[torch.Tensor, torch.Tensor]:
    """Random target and drafter laws (rows, V) in float64, with some zeros (top-k-like supports)."""
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(rows, vocab, generator=g, dtype=torch.float64) ** 3
    q = torch.rand(rows, vocab, generator=g, dtype=torch.float64) ** 3
    p[:, 0], q[:, 1] = 0.0, 0.0  # a token the target never emits; one the drafter never drafts
    return p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)


def paper_law(p: torch.Tensor, q: torch.Tensor, w: float, resample: torch.Tensor | None = None) -> torch.Tensor:
    """The law of the paper's procedure for one sampled draft, by enumeration over the draft ``x ~ q``: accept
    with min(1, w p(x)/q(x)); otherwise draw from ``resample`` (default: norm(max(0, p - min(q, w p))))."""
    taken = torch.minimum(q, w * p)
    if resample is None:
        resample = (p - taken).clamp_min(0)
        resample = resample / resample.sum() if resample.sum() > 0 else p
    law = torch.zeros_like(p)
    for x in range(p.shape[-1]):
        if q[x] > 0:
            a = min(1.0, float(w * p[x] / q[x]))
            law[x] += q[x] * a
            law += q[x] * (1 - a) * resample
    return law


@pytest.mark.parametrize("w", WEIGHTS)
def test_the_weighted_law_is_the_papers_procedure_and_its_tv_the_closed_form(w):
    for seed in range(20):
        p, q = laws(seed)
        law, tv = weighted_law(p, q, torch.tensor([w], dtype=torch.float64))
        assert torch.allclose(law[0], paper_law(p[0], q[0], w), atol=1e-12)
        closed = (torch.minimum(q, w * p) - p).clamp_min(0).sum(-1)  # sum max(0, min(q, w p) - p)
        assert torch.allclose(tv.double(), closed, atol=1e-6)
        if w <= 1:  # a weight <= 1 is lossless with the TV-optimal resampling
            assert torch.allclose(law, p, atol=1e-12)


@pytest.mark.parametrize("w", WEIGHTS)
def test_the_resampling_law_minimises_the_tv(w):
    """Over resampling laws r, TV(p, P_r) is smallest at r* (Cool-SD's choice); the standard SD residual
    norm(max(0, p - q)) is r* only for w >= 1, and random laws never beat it."""
    g = torch.Generator().manual_seed(5)
    for seed in range(10):
        p, q = laws(seed)
        best = realised_tv(p[0], paper_law(p[0], q[0], w))
        standard = realised_tv(p[0], paper_law(p[0], q[0], w, residual(p, q)[0]))
        assert best <= standard + 1e-9
        if w >= 1:
            assert torch.isclose(best, standard, atol=1e-9)
        elif (torch.minimum(q, w * p) < torch.minimum(q, p) - 1e-9).any():
            assert standard > best + 1e-6  # the standard residual is not optimal below 1
        for _ in range(20):
            other = torch.rand(V, generator=g, dtype=torch.float64)
            assert best <= realised_tv(p[0], paper_law(p[0], q[0], w, other / other.sum())) + 1e-9


@pytest.mark.parametrize("w", [1.0, 1.1, 1.7, 4.0])
def test_the_exact_test_of_the_law_is_the_weighted_test_for_weights_from_one(w):
    """For w >= 1 the exact test of p' accepts with min(1, w p/q) and its residual is r*: the composed rule is
    the paper's test draw for draw, not only its law."""
    p, q = laws(3, rows=50)
    law, _ = weighted_law(p, q, torch.full((50,), w, dtype=torch.float64))
    assert torch.allclose(torch.minimum(q, law), torch.minimum(q, w * p), atol=1e-12)
    optimal = (p - torch.minimum(q, w * p)).clamp_min(0)
    optimal = optimal / optimal.sum(-1, keepdim=True).clamp_min(1e-300)
    has_rest = (p - torch.minimum(q, w * p)).clamp_min(0).sum(-1) > 1e-12
    assert torch.allclose(residual(law, q)[has_rest], optimal[has_rest], atol=1e-9)


def sequential_sibling_law(p: torch.Tensor, tokens: list[int], w: float) -> torch.Tensor:
    """Deterministic siblings tried in order by the paper's test with point-mass drafts, by enumeration: sibling
    s passes with min(1, w p_s(x_s)); a rejection draws the optimal residual of p_s (x_s removed when w >= 1)."""
    law, reach, current = torch.zeros_like(p), 1.0, p.clone()
    for x in tokens:
        a = min(1.0, float(max(w, 1.0) * current[x]))
        law[x] += reach * a
        reach *= 1 - a
        current[x] = 0.0
        current = current / current.sum() if current.sum() > 0 else current
    return law + reach * current


def test_the_sibling_law_is_the_sequential_test():
    for seed in range(20):
        p, _ = laws(seed, rows=1, vocab=8)
        tokens = torch.randperm(8, generator=torch.Generator().manual_seed(seed))[:3]
        for w in WEIGHTS:
            law, gain = weighted_sibling_law(p, tokens[None], torch.ones(1, 3, dtype=torch.bool), torch.tensor([w]))
            expected = sequential_sibling_law(p[0], tokens.tolist(), w)
            assert torch.allclose(law[0], expected, atol=1e-9)
            assert torch.allclose(gain[0], expected[tokens] - p[0, tokens], atol=1e-9)
            if w <= 1:
                assert torch.allclose(law, p, atol=1e-12)


def emitted_tokens(rule, p, q, tokens, valid, seed: int) -> torch.Tensor:
    """The token each row of one node emits through the rule's own node code (fresh uniforms per row)."""
    g = torch.Generator().manual_seed(seed)
    rows = p.shape[0]
    sampling = SamplingConfig(temperature=1.0)
    u = torch.rand(rows, tokens.shape[1], generator=g, dtype=p.dtype)
    noise = -torch.log(torch.rand(rows, p.shape[1], generator=g, dtype=p.dtype))
    out = rule.node(p, tokens, valid, q, u, noise, sampling, depth=torch.zeros(rows, dtype=torch.long))
    last = -torch.log(torch.rand(rows, p.shape[1], generator=g, dtype=p.dtype))
    fallback = race(out.target, last, sampling) if out.emitted is None else out.emitted
    picked = tokens.gather(1, out.chosen.clamp_min(0)[:, None])[:, 0]
    return torch.where(out.chosen >= 0, picked, fallback), out.tv


def draws_without_replacement(q: torch.Tensor, count: int, seed: int) -> torch.Tensor:
    """(R, count) draws from the rows of ``q`` without replacement, in draw order (Gumbel top-k)."""
    g = torch.Generator().manual_seed(seed)
    keys = q.log() - torch.log(-torch.log(torch.rand(q.shape, generator=g, dtype=q.dtype)))
    return keys.topk(count, dim=1).indices


ROWS = 200_000


@pytest.mark.parametrize(
    "kind,count,delta", [("sampled", 1, 1.6), ("sampled", 3, 1.6), ("deterministic", 3, 1.6), ("sampled", 1, 0.7)]
)
def test_a_node_emits_its_recorded_law_monte_carlo(kind, count, delta):
    """200k rows of one node through Composed(AnnealedRelaxation, exact test): the histogram of emitted tokens
    follows p' (chi-square), whose TV to p is what the node records; one sampled draft also matches the paper's
    procedure by enumeration."""
    p, q = laws(11)
    p, q = p.expand(ROWS, -1).contiguous(), q.expand(ROWS, -1).contiguous()
    rule = cool_sd(delta=delta, nu=0.0, mu=0.0).build(kind)
    if kind == "sampled":
        tokens = draws_without_replacement(q, count, seed=2)
    else:
        tokens = q.topk(count, dim=1).indices
    valid = torch.ones(tokens.shape, dtype=torch.bool)
    law = rule.relax(p[:1], tokens[:1], valid[:1], q[:1], torch.zeros(1, dtype=torch.long)).target[0]
    if kind == "sampled" and count == 1:
        assert torch.allclose(law, paper_law(p[0], q[0], delta), atol=1e-12)
    emitted, tv = emitted_tokens(rule, p, q, tokens, valid, seed=3)
    counts = torch.bincount(emitted, minlength=V).double()
    support = law > 0
    assert counts[~support].sum() == 0
    expected = law[support] * ROWS
    stat = float(((counts[support] - expected) ** 2 / expected).sum())
    assert stat < chi2.ppf(0.999, int(support.sum()) - 1), (counts / ROWS, law)
    assert torch.allclose(tv[:1].double(), realised_tv(p[:1], law[None]).double(), atol=1e-6)
    measured = realised_tv(p[0], counts / ROWS)
    assert abs(float(measured) - float(tv[0])) < 0.01  # the Monte Carlo TV agrees with the closed form
    if delta > 1:
        assert float(tv[0]) > 0.02  # the case relaxes something


def test_the_weight_decays_with_depth_and_every_walk_passes_the_depth(monkeypatch):
    relaxation = AnnealedRelaxation(delta=1.5, nu=0.3, mu=0.2)
    depth = torch.arange(5)
    assert torch.allclose(relaxation.weight(depth), 1.5 * torch.exp(-0.3 * depth.float() - 0.2))
    seen = []
    original = AnnealedRelaxation.relax

    def spy(self, p, tokens, valid, q, kind, depth=None):
        seen.append(depth.clone())
        return original(self, p, tokens, valid, q, kind, depth)

    monkeypatch.setattr(AnnealedRelaxation, "relax", spy)
    model, drafter = tiny()
    cond, keys = text_condition(), keys_tensor(0, range(4))
    sampling = SamplingConfig(temperature=1.0, cfg_scale=3.0)
    for name, structure in (
        ("chain", chain(3, "sampled")),
        ("dynamic", DynamicTree(3, 3, 8)),
        ("static", prior_tree(3, 3, 8, candidates="sampled")),
    ):
        seen.clear()
        SpeculativeDecoder(sampling, drafter=drafter, draft=structure, acceptance=cool_sd()).generate(model, cond, keys)
        depths = torch.cat(seen)
        assert set(depths.tolist()) == {0, 1, 2}, name
        if name == "chain":  # a chain relaxes its levels in one call, row b*D + d at depth d
            assert all(torch.equal(d, torch.arange(3).repeat(4)) for d in seen)


@pytest.mark.parametrize("cfg_scale", [1.0, 3.0])
@pytest.mark.parametrize(
    "structure", [chain(4), prior_tree(4, 4, 12), DynamicTree(4, 3, 10)], ids=["chain", "static", "dynamic"]
)
def test_greedy_cool_sd_reproduces_greedy_ar(structure, cfg_scale):
    model, drafter = tiny()
    cond, keys = text_condition(), keys_tensor(0, range(4))
    sampling = SamplingConfig(temperature=0, cfg_scale=cfg_scale)
    expected = ARDecoder(sampling).generate(model, cond, keys).codes
    decoder = SpeculativeDecoder(sampling, drafter=drafter, draft=structure, acceptance=cool_sd(delta=3.0, nu=0.1))
    result = decoder.generate(model, cond, keys)
    assert torch.equal(result.codes, expected)
    assert result.per_sample["histogram"][:, 1:].sum() > 0
    assert decoder.settings.lossless() and decoder.settings.record()["acceptance"] == "greedy"


@pytest.mark.parametrize("structure", [chain(3, "sampled"), DynamicTree(3, 3, 8)], ids=["chain-sampled", "dynamic"])
def test_the_cool_sd_step_compiles_as_one_graph_and_matches_eager(structure):
    model, drafter = tiny()
    cond, keys = text_condition(), keys_tensor(1, range(4))
    sampling = SamplingConfig(temperature=1.0, cfg_scale=3.0)
    rule = cool_sd(delta=1.6, nu=0.2)
    eager = SpeculativeDecoder(sampling, drafter=drafter, draft=structure, acceptance=rule).generate(model, cond, keys)
    backend = CountingBackend()
    decoder = SpeculativeDecoder(
        sampling, drafter=drafter, draft=structure, acceptance=rule, compile="default", backend=backend
    )
    for _ in range(2):
        result = decoder.generate(model, cond, keys)
        assert torch.equal(result.codes, eager.codes)
        assert torch.allclose(result.per_sample["tv_realised_sum"], eager.per_sample["tv_realised_sum"])
    assert backend.graphs == 1
    assert float(eager.per_sample["tv_realised_sum"].sum()) > 0


@pytest.mark.parametrize(
    "knobs,message",
    [
        ({"delta": 0.0}, "cool_delta=0.0"),
        ({"delta": -1.0}, "cool_delta=-1.0"),
        ({"nu": -0.1}, "cool_nu=-0.1"),
        ({"mu": 1e3}, "cool_mu=1000.0"),
        ({"delta": float("nan")}, "cool_delta=nan"),
    ],
)
def test_bad_knobs_are_refused(knobs, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        cool_sd(**knobs)


def test_a_run_records_a_lossy_rule_with_its_realised_tv(tmp_path, monkeypatch):
    out = tmp_path / "run"
    status, _, stderr = run_in_process(["decoding=cool_sd", "cool_delta=2.0", "metrics=none"], out, monkeypatch)
    assert status == 0, stderr[-2000:]
    record = json.loads((out / "metrics.json").read_text())
    assert record["lossless"] is False and record["decoding"] == "cool_sd"
    assert 0 < record["tv_realised_mean"] <= record["tv_realised_max"] <= 1
    rule = record["settings"]["rule"]
    assert rule["acceptance"] == "cool_sd" and rule["cool_delta"] == 2.0 and rule["cool_nu"] == 0.05
