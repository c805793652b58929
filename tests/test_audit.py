"""The realised-TV audits (lantern/decoding/audit.py): the Monte Carlo audit agrees with the closed forms within its
standard error (LANTERN and LANTERN++ on a chain, deterministic and sampled drafts; GSD), sits at 0 within its
standard error for lossless decoders (its noise floor), measures the released SJD-PAC's loss (slow), and lands in the
record with its cost, outside every timing."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import neighbours_of, run_in_process, text_condition, tiny
from markov_target import MarkovTarget, markov_chain

from lantern.decoding.audit import MonteCarlo, named_audit, replicate_state, with_audit
from lantern.decoding.audit_estimate import counted, step_estimate
from lantern.decoding.jacobi.decoder import gsd, sjd
from lantern.decoding.jacobi.pac_exact import FirstAccepted
from lantern.decoding.jacobi.sjd_pac import sjd_pac
from lantern.decoding.tree.decoder import SpeculativeDecoder
from lantern.decoding.tree.draft import chain
from lantern.errors import ConfigError
from lantern.models.condition import Condition
from lantern.models.sampling import SamplingConfig
from lantern.rng import keys_tensor
from lantern.rules.factory import lantern, lantern_pp

SAMPLED = SamplingConfig(temperature=1.0, cfg_scale=3.0)
PLAIN = SamplingConfig(temperature=1.0, cfg_scale=1.0)


def measured(decoder, model, condition, keys, reruns: int, every: int = 1) -> tuple[float, float, int]:
    """(Monte Carlo TV mean, its standard error, tokens measured) of one batch."""
    stats, cost = MonteCarlo("always", reruns, every, None, chunk=reruns // 2).audit(decoder, model, condition, keys)
    tokens = int(stats["tv_measured"].sum())
    assert cost["tv_audit_forwards"] == 2 * cost["tv_audit_steps"] > 0
    return float(stats["tv_realised_sum"].sum()) / tokens, float(stats["tv_realised_var"].sum()) ** 0.5 / tokens, tokens


def closed_form(decoder, model, condition, keys) -> tuple[float, int]:
    """(the decoder's own closed-form TV mean, tokens measured) of the same batch."""
    stats = decoder.generate(model, condition, keys).per_sample
    return float(stats["tv_realised_sum"].sum()) / int(stats["tv_measured"].sum()), int(stats["tv_measured"].sum())


@pytest.mark.parametrize(
    "rule,candidates",
    [
        (lambda n: lantern(7, 0.2, n), "deterministic"),
        (lambda n: lantern(7, 0.2, n), "sampled"),
        (lambda n: lantern_pp(7, 3.0, n), "deterministic"),
        (lambda n: lantern_pp(7, 3.0, n), "sampled"),
    ],
    ids=["lantern-det", "lantern-sampled", "lantern_pp-det", "lantern_pp-sampled"],
)
def test_the_monte_carlo_tv_agrees_with_the_closed_form_within_its_standard_error(rule, candidates):
    """On the GPT-nano target (V = 8), every step of 2 images audited (800 reruns with deterministic drafts, 1,600
    with sampled ones): the Monte Carlo mean TV per token is the closed form's within 3 standard errors. Nearly every
    token is measured (a sampled chain's deep tokens have too few reruns with their prefix: at most a fifth left)."""
    model, drafter = tiny()
    condition, keys = text_condition(("a red shirt", "b")), keys_tensor(0, range(2))
    decoder = SpeculativeDecoder(
        PLAIN, drafter=drafter, draft=chain(3, candidates), acceptance=rule(neighbours_of(8)), name="lantern"
    )
    exact, tokens = closed_form(decoder, model, condition, keys)
    mean, se, audited = measured(decoder, model, condition, keys, 800 if candidates == "deterministic" else 1600)
    assert audited >= 0.8 * tokens and exact > 0.02
    assert abs(mean - exact) < 3 * se + 1e-3, f"Monte Carlo {mean:.4f} +- {se:.4f}, closed form {exact:.4f}"


def test_the_monte_carlo_tv_agrees_with_gsds_closed_form_and_reads_jacobi_windows_from_their_law():
    """GSD's closed form averages over the window's drafts drawn from their law; the audit draws them again from that
    law (:meth:`JacobiDecoder.refresh_drafts`), so the two agree (Markov target, V = 4, 3,000 reruns per step)."""
    transition, start = markov_chain(4)
    model = MarkovTarget(transition, start, 4)
    condition = Condition(torch.zeros(6, dtype=torch.long), torch.ones(6, 1, dtype=torch.bool))
    keys = keys_tensor(0, range(6))
    decoder = gsd(PLAIN, window=5, radius=1, p_thr=1.0, d_thr=None)
    exact, _ = closed_form(decoder, model, condition, keys)
    mean, se, _ = measured(decoder, model, condition, keys, 3000)
    assert exact > 0.02 and abs(mean - exact) < 3 * se + 1e-3, f"Monte Carlo {mean:.4f} +- {se:.4f}, {exact:.4f}"


@pytest.mark.parametrize(
    "make",
    [
        lambda: sjd(PLAIN, window=6),
        lambda: sjd_pac(PLAIN, window=13, tree_width=3, tree_depth=3, selection=FirstAccepted()),
    ],
    ids=["sjd", "sjd_pac_lossless"],
)
def test_lossless_decoders_audit_to_zero_within_the_standard_error(make):
    """The noise floor: on the Markov target the estimate of a lossless decoder is 0 within 3 standard errors (the
    plug-in beside it is not: its bias is what the split-sample estimate removes)."""
    transition, start = markov_chain(4)
    model = MarkovTarget(transition, start, 4)
    condition = Condition(torch.zeros(6, dtype=torch.long), torch.ones(6, 1, dtype=torch.bool))
    mean, se, tokens = measured(make(), model, condition, keys_tensor(0, range(6)), 2000)
    assert tokens > 20 and abs(mean) < 3 * se, f"{mean:.4f} +- {se:.4f}"


def peaked_chain(vocab: int = 4, power: float = 4.0) -> MarkovTarget:
    """A Markov target on 4 x 4 tokens whose rows are peaked (entries uniform ** ``power``), a uniform start."""
    generator = torch.Generator().manual_seed(1)
    transition = torch.rand(vocab, vocab, generator=generator).pow(power) + 1e-3
    return MarkovTarget(transition / transition.sum(1, keepdim=True), torch.full((vocab,), 1.0 / vocab), 4)


@pytest.mark.slow
def test_the_audit_measures_the_released_sjd_pacs_loss_and_not_the_lossless_variants():
    """The released tree (K 3, D 3, L 13) on a peaked Markov target, every step of 32 images rerun 4,000 times: a TV
    per token above 3 standard errors (the longest-path rule, mechanism (a) of docs/jacobi.md; the audit draws the
    candidates from the recorded law, so (b1) is not in it); the lossless variant's is 0 within 3 of them. (8 images
    and 2,000 reruns measured 0.0088 +- 0.0034 released, -0.0001 +- 0.0029 lossless.)"""
    model, rows = peaked_chain(), 32
    condition = Condition(torch.zeros(rows, dtype=torch.long), torch.ones(rows, 1, dtype=torch.bool))
    keys = keys_tensor(0, range(rows))
    released = measured(sjd_pac(PLAIN, window=13, tree_width=3, tree_depth=3), model, condition, keys, 4000)
    lossless = measured(
        sjd_pac(PLAIN, window=13, tree_width=3, tree_depth=3, selection=FirstAccepted()), model, condition, keys, 4000
    )
    print(f"released {released}, lossless {lossless}")
    assert released[0] > 3 * released[1], released
    assert abs(lossless[0]) < 3 * lossless[1], lossless


def synthetic(source: torch.Tensor, reruns: int, generator) -> tuple:
    """One audited position whose reruns draw independently from ``source`` (V,): (record, codes, laws key)."""
    from lantern.decoding.audit import Audited

    tokens = torch.multinomial(source, reruns, replacement=True, generator=generator)
    record = Audited(torch.tensor([[3]]), torch.tensor([[True]]), tokens.view(1, reruns, 1).to(torch.int32))
    return record, torch.zeros(8, dtype=torch.long)


def test_the_estimate_is_unbiased_at_zero_tight_on_a_concentrated_surplus_and_its_standard_error_holds():
    """The estimator alone, 300 audits of one position with 800 reruns each: drawn from the target itself the
    estimates average 0 (the plug-in beside them does not), and the standard error is at least their spread and at
    most 1.7 times it (conservative); with the target's mass moved onto one token (TV 0.1) they average within 0.01 of
    it."""
    generator = torch.Generator().manual_seed(0)
    law = torch.rand(50, generator=generator, dtype=torch.float64).pow(3)
    law /= law.sum()
    moved = law * 0.9
    moved[law.argmin()] += 0.1  # TV 0.1, the surplus on one token
    for source, tv in ((law, 0.0), (moved, 0.1)):
        values, errors, plugins = [], [], []
        for _ in range(300):
            record, codes = synthetic(source, 800, generator)
            result = step_estimate(record, 0, codes, {(0, 3): law}, chained=False)
            values.append(result.estimate)
            errors.append(result.variance**0.5)
            plugins.append(result.plugin)
        values = torch.tensor(values)
        assert abs(float(values.mean()) - tv) < 0.01, (tv, float(values.mean()))
        assert 1.0 < (sum(errors) / len(errors)) / float(values.std()) < 1.7
        assert sum(plugins) / len(plugins) > tv + 0.02  # the plug-in's upward bias


def test_chained_positions_count_the_reruns_that_emitted_the_reference_prefix():
    tokens = torch.tensor([[1, 2, 3], [1, 4, -1], [5, -1, -1], [1, 2, -1]])
    reference = torch.tensor([1, 2, 9])
    assert counted(tokens, reference, chained=True).tolist() == [
        [True, True, True],
        [True, True, False],  # emitted the reference's token 0, then another at 1: it counts there
        [True, False, False],
        [True, True, False],
    ]
    assert counted(tokens, reference, chained=False).tolist() == (tokens >= 0).tolist()
    rows = torch.tensor([[1, 2, 7, 8], [5, 2, 7, -1], [1, -1, 6, 8]])  # two chains of two (PJD's grid rows)
    assert counted(rows, torch.tensor([1, 2, 7, 8]), chained=True, chain=2).tolist() == [
        [True, True, True, True],
        [True, False, True, False],  # a miss in the first chain leaves the second one counted
        [True, False, True, False],
    ]


def test_a_rerun_state_repeats_each_image_in_place_keeping_the_cfg_layout():
    from lantern.decoding.jacobi.state import JacobiState

    state = JacobiState(
        codes=torch.tensor([[1], [2]]),
        decided=torch.tensor([1, 1]),
        length=torch.tensor([3, 3]),
        window=torch.tensor([[7], [8]]),
        draft_q=torch.zeros(2, 1, 3),
        keys=torch.tensor([10, 20]),
        target_valid=torch.tensor([[True], [False], [True], [False]]),  # [cond b0, cond b1, uncond b0, uncond b1]
    )
    copies = replicate_state(state, groups=2, copies=3, keys=torch.arange(6))
    assert copies.codes[:, 0].tolist() == [1, 1, 1, 2, 2, 2] and copies.keys.tolist() == list(range(6))
    assert copies.target_valid[:, 0].tolist() == [True] * 3 + [False] * 3 + [True] * 3 + [False] * 3


def test_decoders_name_their_audit():
    model, drafter = tiny()
    assert named_audit(sjd(SAMPLED)) == "exact" and named_audit(gsd(SAMPLED)) == "closed_form"
    assert named_audit(sjd_pac(SAMPLED)) == "mc" and named_audit(sjd_pac(SAMPLED, tree_width=1)) == "exact"
    assert named_audit(sjd_pac(SAMPLED, selection=FirstAccepted())) == "exact"
    tree = SpeculativeDecoder(SAMPLED, drafter=drafter, draft=chain(3), acceptance=lantern(7, 0.1, neighbours_of(8)))
    assert named_audit(tree) == "closed_form"
    auto, always = MonteCarlo(), MonteCarlo("always")
    assert auto.wants(sjd_pac(SAMPLED)) and not auto.wants(tree) and always.wants(tree)
    assert not always.wants(sjd_pac(SamplingConfig(temperature=0)))  # greedy: nothing to sample
    stats = with_audit(sjd(SAMPLED).generate(model, text_condition(), keys_tensor(0, range(4))).per_sample, None)
    assert stats.tv_realised_max is None and int(stats.tv_measured.sum()) == 0


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(mode="sometimes"), "tv_audit.mode"),
        (dict(reruns=7), "tv_audit.reruns=7"),
        (dict(reruns=2), "tv_audit.reruns=2"),
        (dict(every=0), "tv_audit.every=0"),
        (dict(images=0), "tv_audit.images=0"),
        (dict(chunk=0), "tv_audit.chunk=0"),
    ],
)
def test_bad_audit_knobs_are_refused(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        MonteCarlo(**kwargs)


def recorded(tmp_path, monkeypatch, name: str, *overrides: str) -> dict:
    """The record of ``run.py model=tiny_random_c2i OVERRIDES`` (4 images, batch 2, no AR baseline), in process."""
    out = tmp_path / name
    status, _, stderr = run_in_process(
        ["num_images=4", "batch_size=2", "speedup_baseline=null", "warmup=0", *overrides], out, monkeypatch
    )
    assert status == 0, stderr[-2000:]
    return json.loads((out / "metrics.json").read_text())


def test_run_py_records_the_monte_carlo_audit_its_cost_and_which_audit_ran(tmp_path, monkeypatch):
    """SJD-PAC as released names the Monte Carlo audit: the record carries the estimate, its standard error,
    ``tv_audit: mc`` and the audit's seconds, forwards and steps (timed apart); the lossless variant records ``exact``
    and TV 0; ``tv_audit=off`` leaves the released one's TV unmeasured, and says so."""
    knobs = ("tv_audit.reruns=32", "tv_audit.every=2")
    metrics = recorded(tmp_path, monkeypatch, "pac", "decoding=sjd_pac", *knobs)
    assert metrics["tv_audit"] == "mc" and metrics["tv_realised_se"] > 0 and metrics["tv_realised_mean"] is not None
    mc = metrics["tv_audit_mc"]
    assert mc["reruns"] == 32 and mc["every"] == 2 and mc["forwards"] > 0 and mc["s"] > 0 and mc["tokens"] > 0
    assert mc["timed_apart"] is True and metrics["tv_realised_max"] is None and metrics["tv_realised_note"] is None
    lossless = recorded(tmp_path, monkeypatch, "lossless", "decoding=sjd_pac_lossless", *knobs)
    assert lossless["tv_audit"] == "exact" and lossless["tv_realised_mean"] == 0 and lossless["lossless"] is True
    off = recorded(tmp_path, monkeypatch, "off", "decoding=sjd_pac", "tv_audit=off")
    assert off["tv_audit"] is None and off["tv_realised_note"] == "lossy, TV not measured"
