"""PJD (``decoding=pjd``): row-by-row = greedy AR, the 2-D schedule, the row-causal mask, compile, batch, knobs."""

from __future__ import annotations

import json
import math

import pytest
import torch
from helpers import CountingBackend, run, text_condition, tiny
from markov_target import MarkovTarget, markov_chain

from lantern.decoding.ar import ARDecoder
from lantern.decoding.audit import MonteCarlo
from lantern.decoding.pjd.decoder import default_rows_ahead, pjd
from lantern.decoding.pjd.layout import lanes
from lantern.decoding.pjd.step import _forward, pjd_step
from lantern.errors import ConfigError
from lantern.models.condition import Condition
from lantern.models.sampling import SamplingConfig
from lantern.rng import keys_tensor
from lantern.rules.window import SubsequenceVerification

SAMPLED = SamplingConfig(temperature=1.0, cfg_scale=3.0)
SIDE = 4  # the GPT-nano target: 4 x 4 tokens


@pytest.mark.parametrize("cfg_scale", [1.0, 3.0])
@pytest.mark.parametrize("window,keep", [(1, 0.5), (3, 0.5), (3, None), (7, 0.5)])
def test_rows_one_at_a_time_are_greedy_ar(window, keep, cfg_scale):
    """``rows_ahead`` = the grid width: a row starts when the one above is complete, so PJD is SJD on one row at a
    time, exact, and greedy PJD is greedy AR (the window never crosses a row end)."""
    model, _ = tiny()
    cond, keys = text_condition(), keys_tensor(0, range(4))
    sampling = SamplingConfig(temperature=0, cfg_scale=cfg_scale)
    expected = ARDecoder(sampling).generate(model, cond, keys).codes
    result = pjd(sampling, window=window, rows_ahead=SIDE, keep=keep).generate(model, cond, keys)
    assert torch.equal(result.codes, expected)
    if window > 1:
        assert (result.per_sample["steps"] < model.config.num_image_tokens - 1).any(), "drafts should be accepted"


def test_the_schedule_keeps_each_row_behind_the_one_above():
    """A row starts once the row above has ``rows_ahead`` tokens; a token (r, j) of a row below the top one is
    committed only after (r - 1, j + 1) (its drafts never pass the row above's committed columns), and rows run
    together (fewer steps than one row at a time)."""
    model, _ = tiny()
    cond, keys = text_condition(), keys_tensor(4, range(4))
    for ahead in (3, 2, 1):
        result = pjd(SAMPLED, window=3, rows_ahead=ahead).generate(model, cond, keys)
        steps = result.per_sample["token_steps"].long().view(4, SIDE, SIDE)  # (B, R, S)
        assert (steps[:, 1:, 0] > steps[:, :-1, ahead - 1]).all()
        assert (steps[:, 1:, :-1] > steps[:, :-1, 1:]).all()
        assert (steps[:, :, 1:] >= steps[:, :, :-1]).all()  # a row commits left to right
    one_by_one = pjd(SAMPLED, window=3, rows_ahead=SIDE).generate(model, cond, keys).per_sample["steps"]
    assert result.per_sample["steps"].sum() < one_by_one.sum()


def test_one_lane_is_one_row_at_a_time():
    model, _ = tiny()
    cond, keys = text_condition(), keys_tensor(2, range(4))
    narrow = pjd(SAMPLED, window=3, rows_ahead=1, lanes=1).generate(model, cond, keys)
    rowwise = pjd(SAMPLED, window=3, rows_ahead=SIDE).generate(model, cond, keys)
    assert torch.equal(narrow.codes, rowwise.codes)


@torch.inference_mode()
def test_the_row_causal_mask_keeps_rows_drafts_apart():
    """The laws of a row below the top one do not depend on the top row's drafts (the row-causal mask), and the
    top row's do (its own drafts are its context)."""
    model, _ = tiny()
    cond, keys = text_condition(), keys_tensor(7, range(4))
    decoder = pjd(SAMPLED, window=3, rows_ahead=1)
    ctx, state = decoder.start(model, cond, keys)
    checked = 0
    for _ in range(8):
        lane = lanes(state.done, ctx.lanes, ctx.width, SIDE, ctx.rows_ahead)
        both = lane.live[:, 1] & (lane.drafts[:, 0] >= 2)  # a second row under way beside a top row with drafts
        if both.any():
            rows = lane.row[:, :, None].expand(-1, -1, ctx.width)
            before, _ = _forward(ctx, state, lane, state.drafts.gather(1, rows))
            changed = state.drafts.clone()
            top = changed[torch.arange(4), lane.row[:, 0]]
            changed[torch.arange(4), lane.row[:, 0]] = (top + 1) % model.config.vocab_size
            after, _ = _forward(ctx, state, lane, changed.gather(1, rows))
            assert torch.allclose(before[both, 1], after[both, 1], atol=1e-6)
            assert not torch.allclose(before[both, 0, 1:], after[both, 0, 1:], atol=1e-4)
            checked += int(both.sum())
        state, _ = pjd_step(ctx, state)
    assert checked >= 2


@torch.inference_mode()
def test_a_step_rerun_with_other_keys_draws_afresh_from_the_same_state():
    model, _ = tiny()
    cond, keys = text_condition(), keys_tensor(1, range(4))
    ctx, state = pjd(SAMPLED, window=3, rows_ahead=2).start(model, cond, keys)
    for _ in range(3):
        state, _ = pjd_step(ctx, state)
    again, _ = pjd_step(ctx, state)
    same, _ = pjd_step(ctx, state)
    assert torch.equal(again.codes, same.codes) and torch.equal(again.drafts, same.drafts)
    other = [pjd_step(ctx, state._replace(keys=keys_tensor(seed, range(4))))[0] for seed in range(50, 58)]
    assert any(not torch.equal(o.codes, again.codes) or not torch.equal(o.drafts, again.drafts) for o in other)


def test_images_do_not_depend_on_the_batch():
    model, _ = tiny()
    prompts = ("a red shirt", "b", "two words here now", "x y")
    cond, keys = text_condition(prompts), keys_tensor(5, range(4))
    together = pjd(SAMPLED, window=3, rows_ahead=2).generate(model, cond, keys)
    for i in range(4):
        alone = pjd(SAMPLED, window=3, rows_ahead=2).generate(
            model, text_condition(prompts[i : i + 1]), keys[i : i + 1]
        )
        assert torch.equal(alone.codes[0], together.codes[i])


@pytest.mark.parametrize("window_test", [None, SubsequenceVerification()], ids=["token", "sv"])
def test_the_step_captures_as_one_graph_and_matches_eager(window_test):
    model, _ = tiny()
    cond, keys = text_condition(), keys_tensor(0, range(4))
    expected = pjd(SAMPLED, window=3, rows_ahead=2, window_test=window_test).generate(model, cond, keys)
    backend = CountingBackend()
    decoder = pjd(SAMPLED, window=3, rows_ahead=2, window_test=window_test, compile="default", backend=backend)
    for _ in range(2):
        assert torch.equal(decoder.generate(model, cond, keys).codes, expected.codes)
    assert backend.graphs == 1


def test_settings_and_defaults():
    assert default_rows_ahead(32) == 6 and default_rows_ahead(48) == 6 and default_rows_ahead(8) == 4
    assert default_rows_ahead(4) == 2 and default_rows_ahead(1) == 1
    model, _ = tiny()
    decoder = pjd(SAMPLED)
    decoder.generate(model, text_condition(), keys_tensor(0, range(4)))
    settings = decoder.settings
    assert settings.rows_ahead == 2 and settings.lanes == 3 and not settings.lossless()
    assert settings.record()["acceptance"] == "pjd" and settings.method().startswith("PJD-2")


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"rows_ahead": 0}, "rows_ahead"),
        ({"window": 0}, "window"),
        ({"keep": 1.5}, "pjd_keep"),
        ({"lanes": 0}, "pjd_lanes"),
    ],
)
def test_bad_knobs_in_python(kwargs, name):
    with pytest.raises(ConfigError, match=name):
        pjd(SAMPLED, **kwargs)
    model, _ = tiny()
    with pytest.raises(ConfigError, match="rows_ahead"):
        pjd(SAMPLED, rows_ahead=SIDE + 1).generate(model, text_condition(), keys_tensor(0, range(4)))


def test_run_py_records_pjd(tmp_path):
    """The record of a default run (``tv_audit=auto``): PJD names the Monte Carlo audit, which measures its TV."""
    knobs = ("tv_audit.reruns=64", "tv_audit.every=2")  # the tiny target's 16 tokens take a few steps
    proc, out = run(tmp_path, "decoding=pjd", "num_images=2", "batch_size=2", "speedup_baseline=null", *knobs)
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads((out / "metrics.json").read_text())
    assert record["lossless"] is False and record["tv_audit"] == "mc" and record["tv_realised_note"] is None
    assert math.isfinite(record["tv_realised_mean"]) and math.isfinite(record["tv_realised_se"])
    assert record["tv_realised_se"] > 0 and record["tv_audit_mc"]["tokens"] > 0
    assert record["settings"]["rows_ahead"] >= 1 and record["mean_accepted_length"] > 1
    bad, folder = run(tmp_path, "decoding=pjd", "rows_ahead=-3", name="bad")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "rows_ahead" in bad.stderr
    assert not folder.exists()


@torch.inference_mode()
def test_what_an_audit_reads_from_a_step():
    """The audit's view of a step: ``tv_audit`` names the Monte Carlo audit, :func:`pjd_emission` lists what the step
    committed (row by row, in raster order), :func:`redraw_drafts` draws the rows' drafts again from their laws."""
    from lantern.decoding.pjd.decoder import pjd_emission, redraw_drafts
    from lantern.rng import JACOBI_DRAFT

    model, _ = tiny()
    cond, keys = text_condition(), keys_tensor(3, range(4))
    decoder = pjd(SAMPLED, window=3, rows_ahead=1)
    assert decoder.tv_audit == "mc"
    ctx, state = decoder.start(model, cond, keys)
    fresh = redraw_drafts(state, JACOBI_DRAFT)  # the first drafts are point masses: nothing changes
    assert torch.equal(fresh.drafts, state.drafts)
    for _ in range(3):
        after, log = pjd_step(ctx, state)
        emission = pjd_emission(ctx, state, after)
        assert torch.equal(emission.valid.sum(1), log.drawn)
        assert torch.equal(emission.tokens[emission.valid], after.codes.gather(1, emission.positions)[emission.valid])
        assert (state.codes.gather(1, emission.positions)[emission.valid] == 0).all()  # not committed before
        state = after
    redrawn = redraw_drafts(state, JACOBI_DRAFT)
    laws = state.draft_q.gather(3, redrawn.drafts[..., None])[..., 0]
    assert (laws > 0).all()  # every redrawn draft lies in its law's support


def test_sampled_rows_one_at_a_time_are_exact_and_the_audit_reads_zero_there_and_a_loss_with_rows_under_way():
    """On a Markov target (V = 4, 4 x 4 tokens) whose law of every token is known: with ``rows_ahead`` the grid width
    (one row at a time, no keep) PJD is SJD row by row, so (a) every position's marginal over 6,000 images is the
    target's within sampling noise (a row's last column once drew its bonus token from the residual of an untested
    draft's law: TV 0.11 there), and (b) the Monte Carlo audit (every step of 6 images, 1,000 reruns, each row's run
    a chain of its own) reads 0 within 3 standard errors; with rows under way together (``rows_ahead=1``), whose
    rows below the top one commit accepted drafts only, it reads a loss above 3 standard errors."""
    transition, start = markov_chain(4)
    model = MarkovTarget(transition, start, SIDE)
    plain = SamplingConfig(temperature=1.0, cfg_scale=1.0)
    images = 6000
    condition = Condition(torch.zeros(images, dtype=torch.long), torch.ones(images, 1, dtype=torch.bool))
    codes = pjd(plain, window=3, rows_ahead=SIDE, keep=None).generate(model, condition, keys_tensor(0, range(images)))
    law = start.double()
    for position in range(SIDE * SIDE):
        share = torch.bincount(codes.codes[:, position], minlength=4).double() / images
        assert 0.5 * float((share - law).abs().sum()) < 0.025, position  # noise: about 0.01
        law = law @ transition.double()
    audit = MonteCarlo("always", reruns=1000, every=1, images=None, chunk=500)
    condition, keys = (
        Condition(torch.zeros(6, dtype=torch.long), torch.ones(6, 1, dtype=torch.bool)),
        keys_tensor(0, range(6)),
    )
    for ahead, lossy in ((SIDE, False), (1, True)):
        stats, _ = audit.audit(pjd(plain, window=3, rows_ahead=ahead, keep=None), model, condition, keys)
        tokens = int(stats["tv_measured"].sum())
        mean, se = float(stats["tv_realised_sum"].sum()) / tokens, float(stats["tv_realised_var"].sum()) ** 0.5 / tokens
        assert tokens > 60 and se > 0
        assert (mean > 3 * se) if lossy else (abs(mean) < 3 * se), (ahead, mean, se)
