"""SJD++ as released (``decoding=sjd_pp``): greedy equality with AR (codes and PNGs on the world), the keep rule
against the released code's comparison, the kept drafts' actual law and the exact realised TV it gives (a
Monte Carlo run of the keep rule and the test), SJD untouched, batch invariance, one compiled graph, the
world's records, bad input."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from helpers import CountingBackend, expected, run, run_images, text_condition, tiny
from scipy.stats import chisquare

from lantern.decoding.ar import ARDecoder
from lantern.decoding.jacobi.decoder import sjd
from lantern.decoding.jacobi.redraw import ConfidentReuse
from lantern.decoding.jacobi.sjd_pp import sjd_pp
from lantern.errors import ConfigError
from lantern.models.sampling import SamplingConfig
from lantern.rng import keys_tensor
from lantern.rules.exact import emitted_law, residual

GREEDY = SamplingConfig(temperature=0, cfg_scale=3.0)
SAMPLED = SamplingConfig(temperature=1.0, cfg_scale=3.0)


@pytest.mark.parametrize("cfg_scale", [1.0, 3.0])
@pytest.mark.parametrize("window,init,threshold", [(1, "random", 0.5), (4, "horizon", 0.5), (16, "random", 0.1)])
def test_greedy_sjd_pp_reproduces_greedy_ar(window, init, threshold, cfg_scale):
    model, _ = tiny()
    cond, keys = text_condition(), keys_tensor(0, range(4))
    sampling = SamplingConfig(temperature=0, cfg_scale=cfg_scale)
    expected_codes = ARDecoder(sampling).generate(model, cond, keys).codes
    result = sjd_pp(sampling, window=window, init=init, threshold=threshold).generate(model, cond, keys)
    assert torch.equal(result.codes, expected_codes)
    assert float(result.per_sample["tv_realised_max"].max()) == 0.0


def test_sjd_is_untouched_and_sjd_pp_changes_sampled_images():
    model, _ = tiny()
    cond, keys = text_condition(), keys_tensor(2, range(4))
    plain = sjd(SAMPLED, window=4).generate(model, cond, keys)
    assert float(plain.per_sample["tv_realised_max"].max()) == 0.0
    pp = sjd_pp(SAMPLED, window=4).generate(model, cond, keys)
    assert not torch.equal(pp.codes, plain.codes)
    assert int(pp.per_sample["tv_measured"].sum()) == int(pp.per_sample["tokens"].sum())  # every token audited
    # A threshold no ratio exceeds keeps nothing: SJD's images exactly, with TV 0.
    never = sjd_pp(SAMPLED, window=4, threshold=1e9).generate(model, cond, keys)
    assert torch.equal(never.codes, plain.codes)
    assert float(never.per_sample["tv_realised_max"].max()) < 1e-6  # rounding only


def test_sjd_pp_images_do_not_depend_on_the_batch():
    model, _ = tiny()
    cond, keys = text_condition(), keys_tensor(5, range(4))
    together = sjd_pp(SAMPLED, window=4).generate(model, cond, keys)
    prompts = ("a red shirt", "b", "two words here now", "x y")
    for i in range(4):
        alone = sjd_pp(SAMPLED, window=4).generate(model, text_condition(prompts[i : i + 1]), keys[i : i + 1])
        assert torch.equal(alone.codes[0], together.codes[i])
        assert torch.allclose(alone.per_sample["tv_realised_sum"][0], together.per_sample["tv_realised_sum"][i])


# ----- the keep rule and the law it leaves, one position at a time ---------------------------------

ROWS = 200_000


def redraw_one(rule, x, q, law, p, generator):
    """:meth:`ConfidentReuse.keep` for one token per row: old draft ``x`` (R,) recorded with ``q`` (R, V) and
    following ``law`` (R, V); the new forward's ``p`` (R, V); the fresh draw from ``p``. Window slot 1 holds
    the token (the first rejection was at slot 0), new slot 0 takes it from output 1."""
    rows = x.shape[0]
    state = SimpleNamespace(
        window=torch.stack([x, x], 1), draft_q=torch.stack([q, q], 1), draft_law=torch.stack([law, law], 1)
    )
    src = torch.tensor([[1, 2]]).expand(rows, -1)
    jacobi = torch.ones(rows, 2, dtype=torch.bool)
    fresh = torch.multinomial(p, 1, replacement=True, generator=generator)[:, 0]
    drafts, recorded, actual = rule.keep(state, src, jacobi, torch.stack([fresh, fresh], 1), torch.stack([p, p], 1))
    return drafts[:, 0], recorded[:, 0], actual[:, 0]


def test_keep_rule_is_the_released_comparison():
    """Keep iff ``p(x) / (q(x) + 1e-7) > threshold`` (strict), the recorded law is the new ``p`` either way;
    the output slot past the window (no old draft) is always the fresh draw."""
    rule = ConfidentReuse(0.5)
    q = torch.tensor([[0.5, 0.5, 0.0], [0.5, 0.5, 0.0], [0.2, 0.8, 0.0]])
    p = torch.tensor([[0.25, 0.75, 0.0], [0.2, 0.8, 0.0], [0.1, 0.1, 0.8]])
    x = torch.tensor([0, 0, 1])
    state = SimpleNamespace(window=torch.stack([x, x], 1), draft_q=torch.stack([q, q], 1), draft_law=None)
    fresh = torch.full((3, 2), 2)
    drafts, recorded, law = rule.keep(
        state, torch.tensor([[1, 2]] * 3), torch.ones(3, 2, dtype=torch.bool), fresh, torch.stack([p, p], 1)
    )
    # ratios 0.25/0.5 = 0.5 (not > 0.5: redrawn), 0.2/0.5 = 0.4 (redrawn), 0.1/0.8 = 0.125 (redrawn)...
    assert drafts[:, 0].tolist() == [2, 2, 2] and law is None
    drafts, _, _ = ConfidentReuse(0.45).keep(
        state, torch.tensor([[1, 2]] * 3), torch.ones(3, 2, dtype=torch.bool), fresh, torch.stack([p, p], 1)
    )
    assert drafts[:, 0].tolist() == [0, 2, 2] and drafts[:, 1].tolist() == [2, 2, 2]  # ... 0.5 > 0.45: kept
    assert torch.equal(recorded, torch.stack([p, p], 1))


def test_kept_drafts_leave_the_law_the_recorded_tv_measures():
    """Three iterations of one token from a point-mass start (keep rule after the first two forwards, the
    test at the third): the emitted token follows :func:`emitted_law` of the tracked law (chi-square), not
    the target's ``p3`` -- SJD++ is lossy, and the TV the decoder records is the TV of what it emits."""
    vocab, rule = 6, ConfidentReuse(0.5)
    generator = torch.Generator().manual_seed(7)
    p1, p2, p3 = (torch.softmax(1.5 * torch.randn(vocab, generator=generator), -1) for _ in range(3))
    x = torch.full((ROWS,), 2)
    q = law = torch.nn.functional.one_hot(x, vocab).float()
    for p in (p1, p2):
        x, q, law = redraw_one(rule, x, q, law, p.expand(ROWS, -1).contiguous(), generator)
    assert torch.allclose(law, law[:1].expand(ROWS, -1))  # the tracked law depends on the laws alone
    u = torch.rand(ROWS, generator=generator)
    passed = u * q.gather(1, x[:, None])[:, 0] < p3[x]
    fallback = torch.multinomial(residual(p3.expand(ROWS, -1), q), 1, generator=generator)[:, 0]
    counts = torch.bincount(torch.where(passed, x, fallback), minlength=vocab).double()
    predicted = emitted_law(p3[None], q[:1], law[:1])[0]
    assert chisquare(counts.numpy(), expected(predicted, ROWS)).pvalue > 1e-3
    assert chisquare(counts.numpy(), expected(p3, ROWS)).pvalue < 1e-6
    tv = 0.5 * float((predicted - p3).abs().sum())
    assert tv > 0.01
    # With the recorded law as the actual law (SJD), the same formula gives p3 exactly.
    assert torch.allclose(emitted_law(p3[None], q[:1], q[:1])[0], p3, atol=1e-6)


def test_sjd_pp_step_captures_as_one_graph_and_matches_eager():
    model, _ = tiny()
    cond, keys = text_condition(), keys_tensor(0, range(4))
    for sampling in (SAMPLED, GREEDY):
        reference = sjd_pp(sampling, window=3).generate(model, cond, keys)
        backend = CountingBackend()
        decoder = sjd_pp(sampling, window=3, compile="default", backend=backend)
        for _ in range(2):
            result = decoder.generate(model, cond, keys)
            assert torch.equal(result.codes, reference.codes)
            assert torch.allclose(result.per_sample["tv_realised_sum"], reference.per_sample["tv_realised_sum"])
        assert backend.graphs == 1


# ----- the world and the command line ----------------------------------------------------------------


def test_greedy_sjd_pp_pngs_equal_greedy_ar_on_the_world(tmp_path):
    _, ar = run_images(tmp_path, "ar", "decoding=ar", "temperature=0")
    metrics, pp = run_images(tmp_path, "pp", "temperature=0", "decoding=sjd_pp")
    assert pp == ar
    assert metrics["decoding"] == "sjd_pp" and metrics["mean_accepted_length"] > 1.0
    assert metrics["tv_realised_max"] == 0.0


@pytest.mark.slow  # ~8 s through run.py; the in-process tests cover the TV bookkeeping
def test_sampled_sjd_pp_records_its_realised_tv_on_the_world(tmp_path):
    metrics, _ = run_images(tmp_path, "pp", "decoding=sjd_pp")
    assert metrics["acceptance"] == "sjd_pp" and metrics["sjd_pp_threshold"] == 0.5 and metrics["window"] == 16
    assert metrics["tv_realised_coverage"] == 1.0 and 0.0 < metrics["tv_realised_mean"] < 0.5
    assert sum(metrics["acceptance_histogram"]) == metrics["target_steps"]
    from lantern.decoding.api import settings_from_record
    from lantern.results.tables import load_records

    assert settings_from_record(load_records([tmp_path / "pp"])[0]).method() == "SJD++ W=16 random t=0.5"


def test_bad_threshold_is_one_line_and_writes_nothing(tmp_path):
    proc, out = run(tmp_path, "num_images=2", "decoding=sjd_pp", "sjd_pp_threshold=-1")
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "sjd_pp_threshold=-1" in lines[0], proc.stderr
    assert not out.exists()
    with pytest.raises(ConfigError, match="sjd_pp_threshold"):
        sjd_pp(SAMPLED, threshold="high")
