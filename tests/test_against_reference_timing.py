"""The timing half of scripts/bench_against_reference.py: tau on one footing, the refusal of a speed ratio where
the two sides' tau differ beyond noise, per-step and per-phase figures, and their drafter reading our inputs.

Pure functions on made-up per-step data (no reference code needed), except the last test, which needs their
code (docs/against_reference.md's side environment) and is skipped elsewhere.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from lantern.models.llamagen import reference_code as theirs
from lantern.models.llamagen.reference_drafter import condition_layout
from lantern.run.bench.reference_report import markdown, phase_table, speed_table
from lantern.run.bench.reference_timing import compare, our_step_tokens, tau_agreement, their_step_tokens

ROW = {"mode": "eagle-2 dynamic tree", "ours": [], "theirs": {"lantern": False}}


def _steps(rng: random.Random, tau: float, images: int = 6, tokens: int = 64) -> list[list[int]]:
    """Per image, the tokens appended by each step: 1 + Binomial(4, (tau - 1) / 4), until ``tokens - 1``."""
    out = []
    for _ in range(images):
        steps, total = [], 0
        while total < tokens - 1:
            step = 1 + sum(rng.random() < (tau - 1) / 4 for _ in range(4))
            steps.append(step)
            total += step
        out.append(steps)
    return out


def _compare(ours_tokens, theirs_tokens, speculative=True):
    times = {"ours": [[0.6, 0.62]] * 2, "theirs": [[1.0, 1.1]] * 2}
    steps = {"ours": [[30, 30]] * 2, "theirs": [[32, 32]] * 2}
    phases = {
        "ours": {"drafter": 0.3, "target": 1.0, "walk": 0.2, "advance": 0.2, "prefill": 0.02},
        "theirs": {"drafter": 0.6, "target": 1.5, "walk": 0.4, "advance": 0.3, "prefill": 0.05},
    }
    tokens = {"ours": ours_tokens, "theirs": theirs_tokens}
    return compare(ROW, times, steps, tokens, phases, speculative)


def test_our_steps_come_from_the_histogram():
    assert sorted(our_step_tokens(torch.tensor([2, 0, 1, 3]))) == [1, 1, 3, 4, 4, 4]


def test_their_steps_are_cut_where_the_image_is_decided():
    # 64 tokens: the pending token is apart, so the image is decided once 63 are appended
    accepted = [4] * 12 + [2, 1, 3]  # 60 appended after 12 steps, 63 after the 13th, then overshoot
    assert their_step_tokens(accepted, 64) == [5] * 12 + [3]


def test_taus_agree_within_noise_and_not_beyond():
    rng = random.Random(0)
    same = tau_agreement(_steps(rng, 1.9), _steps(rng, 1.9))
    assert same["tau_agree"] and same["tau_se"] > 0 and same["tau_z"] < 3
    apart = tau_agreement(_steps(rng, 1.86), _steps(rng, 1.53))
    assert not apart["tau_agree"] and apart["tau_z"] > 3
    greedy = tau_agreement([[2, 3, 1]], [[2, 3, 1]])  # no spread at all: equal or not
    assert greedy["tau_agree"] and not tau_agreement([[2, 2]], [[3, 3]])["tau_agree"]


def test_a_ratio_is_refused_where_tau_differs_beyond_noise():
    rng = random.Random(1)
    refused = _compare(_steps(rng, 1.86), _steps(rng, 1.53))
    assert refused["ratio"] is None and refused["step_ratio"] is None
    assert refused["refused"].startswith("tau differs beyond noise: ours 1.8")
    assert refused["ours_ms_per_step"] > 0  # the per-side figures stay
    kept = _compare(_steps(rng, 1.86), _steps(rng, 1.86))
    assert kept["refused"] is None and kept["ratio"] == pytest.approx(2.44 / 4.2)
    assert kept["step_ratio"] == pytest.approx((2.44 / 120) / (4.2 / 128))
    # phases per verification step, the rest of the time as "other", the prefill per image
    ours = kept["ours_phases_ms"]
    assert ours["target"] == pytest.approx(1000 * 1.0 / 120) and ours["prefill_per_image"] == pytest.approx(5.0)
    covered = sum(ours[p] for p in ("drafter", "target", "walk", "advance", "other"))
    assert covered + 1000 * 0.02 / 120 == pytest.approx(kept["ours_ms_per_step"])
    # the report shows the refusal in place of the ratio, and the phases of both sides
    speed = "\n".join(speed_table([dict(refused, ours_overrides=[], dtype="float32", threads=2)]))
    assert "refused: tau differs beyond noise" in speed
    phases = phase_table([kept])
    assert len(phases) == 4 and phases[2].startswith("| eagle-2 dynamic tree | ours | 2.50 | 8.33 |")


def test_ar_rows_are_never_refused():
    record = _compare([[1] * 63], [[1] * 63], speculative=False)
    assert record["ratio"] is not None and record["tau_agree"]


def test_the_report_says_which_drafter_inputs_ran():
    report = {
        "environment": {"commit": "abcdef0", "dirty": False, "device_name": "cpu", "versions": {"torch": "x"}},
        "args": {"argv": [], "threads": 2, "images": 1, "runs": 1, "drafter_inputs": "released"},
        "sampling": {"cfg": 3.0, "temperature": 1.0, "top_k": 0, "top_p": 1.0},
        "reference": {"folder": "ref", "commit": None, "transformers": "4.45.2"},
        "conversion_check": {
            "target_logits_max_abs_diff": 1e-6,
            "drafter_logits_max_abs_diff": 1e-6,
            "drafter_prefill_matched_max_abs_diff": 2e-6,
            "drafter_prefill_released_max_abs_diff": 3.5,
            "drafter_prefill_logits_scale": 9.0,
        },
        "greedy": [],
        "records": [],
        "tree": {"top_k": 10, "nodes": 58, "depth": 5},
    }
    text = markdown(report)
    assert "`--drafter-inputs released`" in text and "2.0e-06 with their drafter reading our" in text


def test_condition_layout_puts_our_slots_last_and_masks_entries_as_ours():
    cond_emb = torch.arange(2 * 4 * 3, dtype=torch.float32).view(2, 4, 3)
    mask = torch.tensor([[False, False, True, True], [False, True, True, True]])
    laid = condition_layout(cond_emb, mask, -cond_emb)
    embeds, entries = laid.embeds, laid.entries
    assert embeds.shape == (2, 120, 3) and torch.equal(embeds[:, 116:], cond_emb) and not embeds[:, :116].any()
    assert torch.equal(laid.states[:, 116:], -cond_emb) and laid.padded.shape == (2, 120, 1)
    assert laid.padded[0, :, 0].nonzero()[:, 0].tolist() == list(range(118))
    # entry j reads slot j + 1: real from slot 118 (row 0) / 117 (row 1) on; the last entry reads token 0
    assert entries[0].nonzero()[:, 0].tolist() == [117, 118, 119]
    assert entries[1].nonzero()[:, 0].tolist() == [116, 117, 118, 119]


def test_their_drafter_reads_our_condition_entries_on_random_weights():
    """Needs their code and transformers 4.45 (skipped elsewhere): with our inputs their drafter's prefill gives
    our drafter's logits; as released it does not."""
    try:
        modules = theirs.import_reference(theirs.reference_folder(None))
    except theirs.ReferenceUnavailable as exc:
        pytest.skip(str(exc))
    from lantern.models.condition import Condition
    from lantern.models.drafter import Drafter, DrafterConfig
    from lantern.models.llamagen.gpt import Transformer, gpt_config
    from lantern.models.llamagen.reference_drafter import OurDrafterInputs
    from lantern.rules.neighbours import neighbour_table
    from lantern.run.bench.reference_checks import check_drafter_prefill

    torch.manual_seed(2)
    gpt = Transformer(gpt_config("GPT-nano", "t2i", 64, 16, vocab_size=64, caption_dim=24, cls_token_num=6)).eval()
    drafter = Drafter(DrafterConfig(gpt.config)).eval()
    table = neighbour_table(torch.randn(gpt.config.vocab_size, 4), gpt.config.vocab_size - 1, normalize=False)
    bundle = SimpleNamespace(gpt=gpt, target=gpt)
    reference = theirs.build_reference(modules, bundle, drafter, table, depth=3, top_k=4, nodes=10)
    inputs = OurDrafterInputs(reference.eagle.ea_layer)
    mask = torch.tensor([[False, False, True, True, True, True]])
    condition = Condition(torch.randn(1, gpt.config.cls_token_num, gpt.config.caption_dim), mask)
    diffs = check_drafter_prefill(bundle, drafter, reference, inputs, condition)
    assert diffs["drafter_prefill_matched_max_abs_diff"] < 1e-4
    assert diffs["drafter_prefill_released_max_abs_diff"] > 1e-2
