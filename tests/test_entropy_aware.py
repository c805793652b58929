"""The entropy-aware rule on SJD's window and the entropy-driven temperature: the weight, the law a position
emits against Monte Carlo runs of the test and the closed form (the exact test of the relaxed law), strength 0 as
SJD token for token, greedy equality with AR, one compiled graph, records, bad knobs; the temperature as the
released code computes it."""

from __future__ import annotations

import json
import math

import pytest
import torch
from helpers import CountingBackend, expected, run_in_process, text_condition, tiny
from scipy.stats import chisquare

from lantern.decoding.ar import ARDecoder
from lantern.decoding.jacobi.decoder import JacobiDecoder, sjd
from lantern.errors import ConfigError
from lantern.models.sampling import SamplingConfig, probabilities
from lantern.rng import keys_tensor
from lantern.rules.entropy_aware import EntropyAwareTest, EntropyWeight, entropy
from lantern.rules.exact import ExactWindowTest, emitted_law, realised_tv, residual
from lantern.rules.weighted import weighted_law

GREEDY = SamplingConfig(temperature=0, cfg_scale=3.0)
SAMPLED = SamplingConfig(temperature=1.0, cfg_scale=3.0)


def entropy_sjd(sampling, strength=0.5, **kwargs) -> JacobiDecoder:
    return JacobiDecoder(sampling, window=4, test=EntropyAwareTest(strength), name="entropy_aware", **kwargs)


def test_the_weight_rises_with_the_entropy_from_one():
    vocab = 16
    flat, sharp = torch.full((vocab,), 1 / vocab), torch.zeros(vocab).index_fill_(0, torch.tensor([3]), 1.0)
    weight = EntropyWeight(0.8)
    assert torch.isclose(weight(flat), torch.tensor(1.8)) and torch.isclose(weight(sharp), torch.tensor(1.0))
    p = torch.softmax(torch.randn(5, vocab), -1)
    expected = 1 + 0.8 * (-(p * p.log()).sum(-1)) / math.log(vocab)
    assert torch.allclose(weight(p), expected) and torch.allclose(entropy(p), -(p * p.log()).sum(-1))


@pytest.mark.parametrize("strength", [0.0, 0.5, 2.0])
def test_a_position_emits_the_relaxed_law_monte_carlo(strength):
    """One window position, 200k draws: draft x ~ q, the test's own verdict, else SJD's residual. The histogram
    follows the closed-form law (the exact test of P = weighted_law(p, q, w)), whose TV is what the test records
    and at most strength * H / log V; strength 0 is p itself."""
    g = torch.Generator().manual_seed(3)
    vocab, draws = 10, 200_000
    p = torch.softmax(1.2 * torch.randn(1, 1, vocab, generator=g), -1)
    q = torch.softmax(1.2 * torch.randn(1, 1, vocab, generator=g), -1)
    test = EntropyAwareTest(strength)
    weight = test.weight(p)  # (1, 1)
    law, tv = weighted_law(p, q, weight)
    assert torch.allclose(law, emitted_law(p, q, None, torch.clamp(weight[..., None] * p / q, max=1.0)), atol=1e-6)
    drafts = torch.multinomial(q[0, 0], draws, replacement=True, generator=g)[None]  # (1, N)
    u = torch.rand(1, draws, generator=g)
    wide = (p.expand(1, draws, -1), q.expand(1, draws, -1))
    verdict = test(wide[0], drafts, wide[1], None, u, greedy=False, audit=True)
    fallback = torch.multinomial(residual(p, q)[0, 0], draws, replacement=True, generator=g)
    tokens = torch.where(verdict.passed[0], drafts[0], fallback)
    counts = torch.bincount(tokens, minlength=vocab).double()
    assert chisquare(counts.numpy(), expected(law[0, 0], draws)).pvalue > 1e-3
    assert torch.allclose(verdict.tv[0, :1], tv[0], atol=1e-6)
    assert float(tv) <= strength * float(entropy(p)) / math.log(vocab) + 1e-6
    exact = ExactWindowTest()(law.expand(1, draws, -1), drafts, wide[1], None, u, greedy=False, audit=False)
    assert torch.equal(exact.passed, verdict.passed)  # SJD's exact test of the relaxed law, draw for draw
    if strength == 0:
        assert torch.allclose(law, p, atol=1e-7) and float(tv) < 1e-6
    else:
        assert float(tv) > 1e-3 and chisquare(counts.numpy(), expected(p[0, 0], draws)).pvalue < 1e-6


def test_a_draft_that_does_not_follow_its_recorded_law_is_measured_with_its_own_law():
    g = torch.Generator().manual_seed(4)
    p, q, law = (torch.softmax(torch.randn(2, 3, 7, generator=g), -1) for _ in range(3))
    drafts, u = torch.zeros(2, 3, dtype=torch.long), torch.rand(2, 3, generator=g)
    verdict = EntropyAwareTest(1.0)(p, drafts, q, law, u, greedy=False, audit=True)
    accept = torch.clamp(EntropyWeight(1.0)(p)[..., None] * p / q, max=1.0)
    assert torch.allclose(verdict.tv, realised_tv(p, emitted_law(p, q, law, accept)))
    assert torch.isnan(EntropyAwareTest(1.0)(p, drafts, q, law, u, greedy=False, audit=False).tv).all()


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_strength_zero_is_sjd_token_for_token(sampling):
    model, _ = tiny()
    cond, keys = text_condition(("a red shirt", "b", "two words here now", "x y") * 4), keys_tensor(1, range(16))
    plain = sjd(sampling, window=4).generate(model, cond, keys)
    off = entropy_sjd(sampling, strength=0.0).generate(model, cond, keys)
    assert torch.equal(off.codes, plain.codes)
    assert torch.equal(off.per_sample["histogram"], plain.per_sample["histogram"])
    on = entropy_sjd(sampling, strength=3.0).generate(model, cond, keys)
    if sampling.greedy:  # greedy is SJD's greedy test whatever the strength
        assert torch.equal(on.codes, plain.codes)
    else:
        assert on.per_sample["steps"].sum() < 0.9 * plain.per_sample["steps"].sum()  # 87 against 109 forwards
        assert float(on.per_sample["tv_realised_max"].max()) > 1e-3


@pytest.mark.parametrize("cfg_scale", [1.0, 3.0])
def test_greedy_entropy_aware_reproduces_greedy_ar(cfg_scale):
    model, _ = tiny()
    cond, keys = text_condition(), keys_tensor(0, range(4))
    sampling = SamplingConfig(temperature=0, cfg_scale=cfg_scale)
    expected = ARDecoder(sampling).generate(model, cond, keys).codes
    decoder = entropy_sjd(sampling, strength=2.0)
    result = decoder.generate(model, cond, keys)
    assert torch.equal(result.codes, expected)
    assert result.per_sample["histogram"][:, 1:].sum() > 0
    assert decoder.settings.lossless() and decoder.settings.record()["acceptance"] == "greedy"
    assert not entropy_sjd(SAMPLED).settings.lossless()


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_the_step_captures_as_one_graph_and_matches_eager(sampling):
    model, _ = tiny()
    cond, keys = text_condition(), keys_tensor(0, range(4))
    expected = entropy_sjd(sampling, strength=1.0).generate(model, cond, keys)
    backend = CountingBackend()
    decoder = entropy_sjd(sampling, strength=1.0, compile="default", backend=backend)
    for _ in range(2):
        result = decoder.generate(model, cond, keys)
        assert torch.equal(result.codes, expected.codes)
        assert torch.equal(result.per_sample["histogram"], expected.per_sample["histogram"])
    assert backend.graphs == 1


def test_bad_strength_is_refused():
    for value in (-0.1, float("inf"), 1e9, "strong"):
        with pytest.raises(ConfigError, match="entropy_strength="):
            EntropyAwareTest(value)


def test_a_run_records_the_rule_and_its_realised_tv(tmp_path, monkeypatch):
    out = tmp_path / "run"
    overrides = ["decoding=entropy_aware", "entropy_strength=2.0", "window=4", "metrics=none"]
    status, _, stderr = run_in_process(overrides, out, monkeypatch)
    assert status == 0, stderr[-2000:]
    record = json.loads((out / "metrics.json").read_text())
    assert record["lossless"] is False and record["decoding"] == "entropy_aware"
    assert 0 < record["tv_realised_mean"] <= record["tv_realised_max"] <= 1
    settings = record["settings"]
    assert settings["acceptance"] == "entropy_aware" and settings["grouping"] == {"entropy_strength": 2.0}
    assert record["entropy_temperature"] is None


# ----- the entropy-driven temperature (a sampling setting) ---------------------------------------------------


def released_sample_law(logits: torch.Tensor, temperature: float, top_k: int) -> torch.Tensor:
    """ARsample's ``sample`` (LlamaGen/autoregressive/models/generate.py), transcribed: top-k on the logits, the
    entropy of their softmax, temperature * (2.5 exp(-H/3) + 0.6), softmax of the logits over it."""
    kth = torch.topk(logits, top_k).values[..., -1:]
    kept = logits.masked_fill(logits < kth, float("-inf"))
    law = kept.softmax(-1)
    h = -(law * torch.log(law + 1e-12)).sum(-1, keepdim=True)
    return (kept / (temperature * (2.5 * torch.exp(-h / 3) + 0.6))).softmax(-1)


@pytest.mark.parametrize("temperature,top_k", [(1.0, 0), (1.4, 0), (1.0, 7)])
def test_the_entropy_temperature_is_the_released_one(temperature, top_k):
    logits = 3 * torch.randn(6, 40, generator=torch.Generator().manual_seed(2))
    config = SamplingConfig(temperature=temperature, top_k=top_k, entropy_temperature=[2.5, 3.0, 0.6])
    released = released_sample_law(logits, temperature, top_k or 40)
    assert torch.allclose(probabilities(logits, config), released, atol=1e-5)
    plain = probabilities(logits, SamplingConfig(temperature=temperature, top_k=top_k))
    assert not torch.allclose(plain, released, atol=1e-3)


@pytest.mark.parametrize("value", ["hot", [2.5, 3.0], [2.5, 0.0, 0.6], [-1.0, 3.0, 0.6], [2.5, 3.0, float("nan")]])
def test_a_bad_entropy_temperature_is_refused(value):
    with pytest.raises(ConfigError, match="entropy_temperature"):
        SamplingConfig(entropy_temperature=value)


def test_the_entropy_temperature_leaves_greedy_decoding_alone_and_is_recorded(tmp_path, monkeypatch):
    model, _ = tiny()
    cond, keys = text_condition(), keys_tensor(0, range(2))
    greedy = SamplingConfig(temperature=0, entropy_temperature=(2.5, 3.0, 0.6))
    plain = ARDecoder(SamplingConfig(temperature=0)).generate(model, cond, keys).codes
    assert torch.equal(ARDecoder(greedy).generate(model, cond, keys).codes, plain)
    out = tmp_path / "run"
    status, _, stderr = run_in_process(["entropy_temperature=[2.5,3.0,0.6]", "metrics=none"], out, monkeypatch)
    assert status == 0, stderr[-2000:]
    assert json.loads((out / "metrics.json").read_text())["entropy_temperature"] == [2.5, 3.0, 0.6]
