"""SJD-SV (``window_test=sv``): the sub-sequence test, its law against the per-token test, greedy = AR, records."""

from __future__ import annotations

import pytest
import torch
from helpers import CountingBackend, run, text_condition, tiny

from lantern.decoding.ar import ARDecoder
from lantern.decoding.jacobi.decoder import gsd, sjd
from lantern.decoding.tree.decoder import SpeculativeDecoder
from lantern.decoding.tree.draft import DynamicTree, chain
from lantern.errors import ConfigError
from lantern.models.sampling import SamplingConfig
from lantern.rng import keys_tensor
from lantern.rules.factory import exact, lantern, lantern_reference
from lantern.rules.window import PerToken, SubsequenceVerification, sv_covered

GREEDY = SamplingConfig(temperature=0, cfg_scale=3.0)
SAMPLED = SamplingConfig(temperature=1.0, cfg_scale=3.0)
SV = SubsequenceVerification()


def test_runs_split_where_the_target_probability_drops():
    ratio = torch.tensor([[0.5, 1.9, 0.3, 0.9, 0.0, 5.0]])
    p_x = torch.tensor([[0.1, 0.2, 0.05, 0.3, 0.2, 0.4]])  # runs [0, 1], [2, 3], [4, 5]
    u = torch.tensor([[0.9, 0.01, 0.2, 0.01, 0.5, 0.01]])  # each run reads the uniform at its start
    # run 0: 0.9 < 0.5 fails, 0.9 < 0.5*1.9 passes -> both; run 1: 0.2 < 0.3, 0.27 -> both; run 2: ratio 0 -> none
    assert sv_covered(ratio, p_x, u).tolist() == [[True, True, True, True, False, False]]
    u[0, 0] = 0.97  # run 0 now fails whole and at its prefix: the accepted prefix is empty
    assert sv_covered(ratio, p_x, u)[0, :2].tolist() == [False, False]


def test_the_longest_passing_prefix_is_taken_when_the_whole_run_fails():
    ratio = torch.tensor([[0.8, 0.9, 0.5]])
    p_x = torch.tensor([[0.1, 0.2, 0.3]])  # one run
    u = torch.tensor([[0.6, 0.0, 0.0]])  # prefixes 0.8, 0.72 pass, 0.36 fails
    assert sv_covered(ratio, p_x, u).tolist() == [[True, True, False]]


def accepted_lengths(ratio: torch.Tensor, p_x: torch.Tensor, draws: int, sv: bool) -> torch.Tensor:
    """Monte Carlo: accepted prefix lengths (draws,) of one window under SJD-SV or the per-token test."""
    gen = torch.Generator().manual_seed(0)
    u = torch.rand(draws, ratio.shape[0], generator=gen)
    ratios, probs = ratio.expand(draws, -1), p_x.expand(draws, -1)
    passed = sv_covered(ratios, probs, u) if sv else u < ratios.clamp_max(1)
    return passed.long().cumprod(1).sum(1)


def test_with_ratios_at_most_one_the_acceptance_law_is_the_per_token_one():
    """Fresh window slots have point-mass laws (ratio p(x) <= 1): SJD-SV then accepts k drafts exactly as often
    as SJD does (P(>= k) = prod r), whatever the runs."""
    ratio, p_x = torch.tensor([0.9, 0.7, 0.95, 0.4]), torch.tensor([0.1, 0.3, 0.2, 0.25])
    sv, token = accepted_lengths(ratio, p_x, 400_000, True), accepted_lengths(ratio, p_x, 400_000, False)
    expected = torch.cat([torch.ones(1), ratio.cumprod(0)])  # P(accepted >= k), k = 0..4
    for k in range(5):
        assert abs(float((sv >= k).double().mean()) - float(expected[k])) < 3e-3
        assert abs(float((token >= k).double().mean()) - float(expected[k])) < 3e-3


def test_a_confident_draft_carries_a_doubtful_one_in_its_run():
    """The joint ratio is SJD-SV's gain and its loss: min(1, 2.5 * 0.3) = 0.75 for the pair, where the
    per-token test accepts both with 1 * 0.3."""
    ratio, p_x = torch.tensor([2.5, 0.3]), torch.tensor([0.2, 0.4])
    sv, token = accepted_lengths(ratio, p_x, 400_000, True), accepted_lengths(ratio, p_x, 400_000, False)
    assert abs(float((sv == 2).double().mean()) - 0.75) < 3e-3
    assert abs(float((token == 2).double().mean()) - 0.3) < 3e-3


@pytest.mark.parametrize("window", [1, 4, 16])
def test_greedy_sjd_sv_is_greedy_ar(window):
    model, _ = tiny()
    cond, keys = text_condition(), keys_tensor(0, range(4))
    expected = ARDecoder(GREEDY).generate(model, cond, keys).codes
    result = sjd(GREEDY, window=window, window_test=SV).generate(model, cond, keys)
    assert torch.equal(result.codes, expected)
    assert result.per_sample["histogram"][:, 1:].sum() > 0
    grouped = gsd(GREEDY, window=window, p_thr=1.0, d_thr=None)
    assert torch.equal(
        gsd(GREEDY, window=window, p_thr=1.0, d_thr=None, window_test=SV).generate(model, cond, keys).codes,
        grouped.generate(model, cond, keys).codes,
    )


@pytest.mark.parametrize("candidates", ["sampled", "deterministic"])
def test_greedy_eagle_and_lantern_sv_on_a_chain_are_their_rules(candidates):
    model, drafter = tiny()
    cond, keys = text_condition(), keys_tensor(0, range(4))
    expected = ARDecoder(GREEDY).generate(model, cond, keys).codes
    decoder = SpeculativeDecoder(
        GREEDY, drafter=drafter, draft=chain(3, candidates), acceptance=exact(), window_test=SV
    )
    assert torch.equal(decoder.generate(model, cond, keys).codes, expected)
    assert decoder.settings.lossless()


def test_sampled_sv_decodes_records_sv_and_is_lossy():
    model, drafter = tiny()
    cond, keys = text_condition(), keys_tensor(3, range(4))
    plain = sjd(SAMPLED, window=4)
    sv = sjd(SAMPLED, window=4, window_test=SV)
    assert plain.settings.lossless() and not sv.settings.lossless()
    assert plain.tv_audit is None and sv.tv_audit == "mc"  # no closed form: the Monte Carlo audit's
    assert sjd(GREEDY, window=4, window_test=SV).tv_audit is None
    assert sv.settings.record()["window_test"] == "sv" and "SV" in sv.settings.method()
    result = sv.generate(model, cond, keys)
    assert result.codes.shape == (4, model.config.num_image_tokens)
    assert int(result.per_sample["tv_measured"].sum()) == 0  # no closed form: left to a Monte Carlo audit
    table = torch.stack([torch.roll(torch.arange(model.config.vocab_size), -s) for s in range(1, 9)], dim=1)
    tree = SpeculativeDecoder(
        SAMPLED, drafter=drafter, draft=chain(3, "sampled"), acceptance=lantern(3, 0.1, table), window_test=SV
    )
    assert not tree.settings.lossless() and tree.settings.rule["window_test"] == "sv" and tree.tv_audit == "mc"
    assert (
        tree.settings.method()
        != SpeculativeDecoder(
            SAMPLED, drafter=drafter, draft=chain(3, "sampled"), acceptance=lantern(3, 0.1, table)
        ).settings.method()
    )
    out = tree.generate(model, cond, keys)
    assert int(out.per_sample["tv_measured"].sum()) == 0 and out.per_sample["histogram"][:, 1:].sum() > 0


def test_per_token_scheme_changes_nothing():
    model, _ = tiny()
    cond, keys = text_condition(), keys_tensor(2, range(4))
    plain = sjd(SAMPLED, window=4).generate(model, cond, keys)
    token = sjd(SAMPLED, window=4, window_test=PerToken()).generate(model, cond, keys)
    assert torch.equal(plain.codes, token.codes)


def test_sv_needs_a_chain_and_a_fixed_relaxed_law():
    _, drafter = tiny()
    table = torch.stack([torch.roll(torch.arange(64), -s) for s in range(1, 9)], dim=1)
    with pytest.raises(ConfigError, match="draft=chain"):
        SpeculativeDecoder(SAMPLED, drafter=drafter, draft=DynamicTree(3, 2, 4, "sampled"), window_test=SV)
    with pytest.raises(ConfigError, match="semantics=bounded"):
        SpeculativeDecoder(
            SAMPLED, drafter=drafter, draft=chain(3, "deterministic"), acceptance=lantern_reference(3, 0.1, table),
            window_test=SV,
        )  # fmt: skip
    with pytest.raises(ConfigError, match="window_test"):
        sjd(SAMPLED, window=4, window_test="sv")


@pytest.mark.parametrize("kind", ["jacobi", "chain"])
def test_sv_steps_capture_as_one_graph_and_match_eager(kind):
    model, drafter = tiny()
    cond, keys = text_condition(), keys_tensor(0, range(4))

    def build(**kw):
        if kind == "jacobi":
            return sjd(SAMPLED, window=3, window_test=SV, **kw)
        return SpeculativeDecoder(SAMPLED, drafter=drafter, draft=chain(3, "sampled"), window_test=SV, **kw)

    expected = build().generate(model, cond, keys)
    backend = CountingBackend()
    result = build(compile="default", backend=backend).generate(model, cond, keys)
    assert torch.equal(result.codes, expected.codes) and backend.graphs == 1


def test_run_py_composes_window_test_sv(tmp_path):
    proc, out = run(tmp_path, "decoding=gsd", "window_test=sv", "num_images=1", "speedup_baseline=null")
    assert proc.returncode == 0, proc.stderr[-2000:]
    import json

    record = json.loads((out / "metrics.json").read_text())
    assert record["settings"]["window_test"] == "sv" and record["lossless"] is False
    assert record["tv_realised_note"] == "lossy, TV not measured"
    bad, _ = run(tmp_path, "decoding=gsd", "window_test=nope", "num_images=1", name="bad")
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error:") and len(bad.stderr.strip().splitlines()) == 1
