"""VVS (``decoding=vvs``): without skipping it is LANTERN token for token (also through the chain step), verified
tokens follow the target given the skipped ones (the chain puts the right keys in the cache), the path rule and
the skipped tokens' laws on hand-built trees, exact counts of skipped tokens and saved target forwards, the
skipped tokens' realised TV, batch invariance, one compiled graph per step kind, the world's records, bad input."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from helpers import VOCAB, CountingBackend, run, text_condition, tiny
from helpers import neighbours_of as _neighbours

from lantern.decoding.api import settings_from_record
from lantern.decoding.batch import guided_inputs
from lantern.decoding.tree.decoder import SpeculativeDecoder
from lantern.decoding.tree.draft import DynamicTree, chain
from lantern.decoding.tree.vvs import random_path, vvs
from lantern.errors import ConfigError
from lantern.models.sampling import SamplingConfig, guided_logits_at
from lantern.rng import keys_tensor
from lantern.rules.factory import lantern, lantern_reference

GREEDY = SamplingConfig(temperature=0, cfg_scale=3.0)
SAMPLED = SamplingConfig(temperature=1.0, cfg_scale=3.0)
DRAFTS = {"chain": lambda: chain(3, candidates="sampled"), "dynamic": lambda: DynamicTree(3, 3, 8)}


def rule(delta=0.2, semantics="reference"):
    build = lantern_reference if semantics == "reference" else lantern
    return build(3, delta, _neighbours(VOCAB))


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("draft", DRAFTS, ids=list(DRAFTS))
def test_without_skips_vvs_is_lantern_also_through_the_chain_step(sampling, draft):
    model, drafter = tiny()
    cond, keys = text_condition(), keys_tensor(1, range(4))
    reference = SpeculativeDecoder(sampling, drafter=drafter, draft=DRAFTS[draft](), acceptance=rule()).generate(
        model, cond, keys
    )
    off = vvs(sampling, drafter=drafter, draft=DRAFTS[draft](), acceptance=rule(), interval=None)
    chained = vvs(sampling, drafter=drafter, draft=DRAFTS[draft](), acceptance=rule(), interval=None)
    chained.kind = lambda index: "chain"  # every step verifies through the chain step, with nothing skipped
    for decoder in (off, chained):
        result = decoder.generate(model, cond, keys)
        assert torch.equal(result.codes, reference.codes)
        assert torch.equal(result.per_sample["histogram"], reference.per_sample["histogram"])
        assert torch.allclose(result.per_sample["tv_realised_sum"], reference.per_sample["tv_realised_sum"])
        assert result.stats["target_forwards"] == reference.stats["target_forwards"]
        assert result.stats["target_forwards_saved"] == 0 and int(result.per_sample["skipped_tokens"].sum()) == 0


def teacher_argmax(model, cond, codes, sampling):
    """The greedy target token at every image position given ``codes`` (B, N), teacher-forced."""
    emb, mask = guided_inputs(model, cond, sampling)
    groups = emb.shape[0] // codes.shape[0]
    hidden = model.forward_teacher(emb, codes.repeat(groups, 1), mask)
    steps = torch.arange(codes.shape[1]).expand(codes.shape[0], -1)
    return guided_logits_at(model.head(hidden), sampling, steps).argmax(-1)


@pytest.mark.parametrize("draft", DRAFTS, ids=list(DRAFTS))
@pytest.mark.parametrize("interval", [2, 3])
def test_verified_tokens_follow_the_target_given_the_skipped_ones(draft, interval):
    """Greedy, delta 0: every token a target forward verified is the target's argmax given everything before
    it, skipped tokens included (wrong chain keys, positions or masks would break this); skipped tokens are
    free, and their recorded TV (greedy: 1 where the token is not the argmax) counts the mismatches."""
    model, drafter = tiny()
    cond, keys = text_condition(), keys_tensor(0, range(4))
    decoder = vvs(GREEDY, drafter=drafter, draft=DRAFTS[draft](), acceptance=rule(0.0), interval=interval)
    result = decoder.generate(model, cond, keys)
    with torch.inference_mode():
        target = teacher_argmax(model, cond, result.codes, GREEDY)
    skipped = decoder.last_skipped
    assert int(skipped.sum()) > 0 and not bool(skipped[:, 0].any())
    assert torch.equal(result.codes[~skipped], target[~skipped])
    mismatched = (skipped & (result.codes != target)).sum(1).double()
    unmeasured = (result.per_sample["skipped_tokens"] - result.per_sample["skipped_tv_measured"]).double()
    assert (result.per_sample["skipped_tv_sum"] <= mismatched + 1e-9).all()
    assert (mismatched <= result.per_sample["skipped_tv_sum"] + unmeasured + 1e-9).all()


def test_counts_of_skipped_tokens_and_saved_forwards_are_exact():
    """One image, a chain of depth 3, interval 2: loop step i skips iff i is odd; a skip commits
    min(3, floor(4) - 1) = 3 tokens when the image has more than 5 tokens after token 0 and waits otherwise
    (no forward, no token); every other step runs one target forward; saved forwards are committing skips."""
    model, drafter = tiny()
    cond, keys = text_condition(("a red shirt",)), keys_tensor(3, [0])
    decoder = vvs(GREEDY, drafter=drafter, draft=chain(3), acceptance=rule(), interval=2)
    trace = []

    def traced(kind, step):
        def run(ctx, state, audit):
            new, log = step(ctx, state, audit)
            trace.append((kind, int(state.spec.decided[0]), int(new.spec.decided[0])))
            return new, log

        return run

    schedule = decoder.schedule  # the loop runs the schedule's (here eager) steps
    schedule.compiled = {kind: traced(kind, step) for kind, step in schedule.compiled.items()}
    result = decoder.generate(model, cond, keys)
    stats, sample = result.stats, result.per_sample
    assert [kind for kind, _, _ in trace] == [
        ("skip" if i % 2 else "plain" if i == 0 else "chain") for i in range(len(trace))
    ]
    committed = 0
    for kind, before, after in trace:
        if kind == "skip":
            assert after - before == (3 if before - 1 > 5 else 0)
            committed += after > before
        else:
            assert after > before or before >= model.config.num_image_tokens
    assert committed > 0 and int(sample["skip_steps"][0]) == committed
    assert int(sample["skipped_tokens"][0]) == 3 * committed
    assert stats["target_forwards_saved"] == committed
    assert stats["target_forwards"] == 1 + sum(kind != "skip" for kind, _, _ in trace) == 1 + int(sample["steps"][0])
    assert trace[-1][2] >= model.config.num_image_tokens


def hand_tree(parents, depth, tokens, vocab=8):
    parents, depth = torch.tensor([parents]), torch.tensor([depth])
    count = parents.shape[1]
    ancestors = torch.eye(count, dtype=torch.bool)[None].clone()
    for _ in range(count):
        ancestors = ancestors | ancestors.gather(1, parents.clamp_min(0)[:, :, None].expand(-1, -1, count))
    return SimpleNamespace(
        parents=parents, depth=depth, tokens=torch.tensor([tokens]), ancestors=ancestors, q=torch.zeros(1, count, vocab)
    )


def test_random_path_on_hand_built_trees():
    # root -> a (-> a1 -> a11), root -> b: paths of lengths 4 and 2 (root counted), floor(mean) = 3, so a skip
    # commits min(leaf depth, 2): 2 tokens on a's path, 1 on b's; each first token with law 1/2, 1/2.
    tree = hand_tree([-1, 0, 1, 2, 0], [0, 1, 2, 3, 1], [7, 1, 2, 3, 4])
    seen = {}
    for key in range(400):
        nodes, count, laws = random_path(tree, keys_tensor(key, [0]), torch.tensor([9]), 3)
        seen[tuple(nodes[0].tolist())] = int(count[0])
        assert torch.allclose(laws[0, 0, [1, 4]], torch.tensor([0.5, 0.5])) and float(laws[0, 0].sum()) == 1.0
        if int(count[0]) == 2:
            assert float(laws[0, 1, 2]) == 1.0  # a's only child
    assert seen == {(1, 2, 3): 2, (4, 0, 0): 1}
    # root -> a (-> a1, a2), root -> b: leaves a1, a2, b; floor(8 / 3) = 2 -> one token, a with law 2/3;
    # two siblings with the same token add up.
    tree = hand_tree([-1, 0, 1, 1, 0], [0, 1, 2, 2, 1], [0, 5, 6, 6, 3])
    picks = torch.zeros(5)
    for key in range(3000):
        nodes, count, laws = random_path(tree, keys_tensor(key, [0]), torch.tensor([9]), 2)
        assert int(count[0]) == 1 and torch.allclose(laws[0, 0, [5, 3]], torch.tensor([2 / 3, 1 / 3]))
        assert float(laws[0, 1, 6]) in (0.0, 1.0)  # given a, both children hold token 6
        picks[int(nodes[0, 0])] += 1
    assert abs(float(picks[1]) / 3000 - 2 / 3) < 0.04  # a path is a uniform leaf


def test_vvs_images_do_not_depend_on_the_batch():
    model, drafter = tiny()
    cond, keys = text_condition(), keys_tensor(5, range(4))
    together = vvs(SAMPLED, drafter=drafter, draft=DynamicTree(3, 3, 8), acceptance=rule(), interval=2).generate(
        model, cond, keys
    )
    prompts = ("a red shirt", "b", "two words here now", "x y")
    for i in range(4):
        alone = vvs(SAMPLED, drafter=drafter, draft=DynamicTree(3, 3, 8), acceptance=rule(), interval=2).generate(
            model, text_condition(prompts[i : i + 1]), keys[i : i + 1]
        )
        assert torch.equal(alone.codes[0], together.codes[i])
        assert int(alone.per_sample["skipped_tokens"][0]) == int(together.per_sample["skipped_tokens"][i])


def test_vvs_steps_capture_as_one_graph_each_and_match_eager():
    model, drafter = tiny()
    cond, keys = text_condition(), keys_tensor(0, range(4))
    reference = vvs(SAMPLED, drafter=drafter, draft=DynamicTree(3, 3, 8), acceptance=rule(), interval=3).generate(
        model, cond, keys
    )
    backend = CountingBackend()
    decoder = vvs(
        SAMPLED,
        drafter=drafter,
        draft=DynamicTree(3, 3, 8),
        acceptance=rule(),
        interval=3,
        compile="default",
        backend=backend,
    )
    for _ in range(2):
        result = decoder.generate(model, cond, keys)
        assert torch.equal(result.codes, reference.codes)
        assert torch.equal(result.per_sample["skipped_tokens"], reference.per_sample["skipped_tokens"])
    assert backend.graphs == 3  # plain, skip and chain steps


# ----- the world and the command line ----------------------------------------------------------------


def test_vvs_runs_on_the_world_and_records_what_it_skipped(tmp_path):
    proc, out = run(
        tmp_path, "model=fashion_t2i", "decoding=vvs", "num_images=4", "batch_size=2", "speedup_baseline=null",
        "warmup=0", "metrics=none",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    metrics = json.loads((out / "metrics.json").read_text())
    metrics = {**metrics, **settings_from_record(metrics).record()}  # the decoder's knobs, flat
    stats = metrics["decode_stats"]
    assert metrics["decoding"] == "vvs" and metrics["skip_interval"] == 5 and metrics["delta"] == 0.2
    assert metrics["semantics"] == "reference" and metrics["k"] == 1000
    assert stats["target_forwards_saved"] > 0 and stats["target_forwards"] > 0
    assert metrics["mean_accepted_length"] > 1.0 and 0 < metrics["tv_realised_coverage"] <= 1.0
    assert metrics["tv_realised_max"] > 0.0 and metrics["lossless"] is False and metrics["tv_realised_note"] is None
    from lantern.results.tables import load_records

    assert settings_from_record(load_records([out])[0]).method().endswith("skip every 5")


def test_bad_interval_is_one_line_and_writes_nothing(tmp_path):
    proc, out = run(tmp_path, "num_images=2", "decoding=vvs", "skip_interval=1")
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "skip_interval=1" in lines[0], proc.stderr
    assert not out.exists()
    model, drafter = tiny()
    with pytest.raises(ConfigError, match="skip_interval"):
        vvs(SAMPLED, drafter=drafter, draft=chain(3), acceptance=rule(), interval=0.5)


def test_bounded_semantics_with_skips_is_one_line_and_writes_nothing(tmp_path):
    # Skipped tokens are committed unverified (~0.9 TV each on the world): delta bounds nothing there.
    proc, out = run(tmp_path, "num_images=2", "decoding=vvs", "semantics=bounded")
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "semantics=bounded" in lines[0], proc.stderr
    assert "skip_interval=5" in lines[0] and not out.exists()
    model, drafter = tiny()
    with pytest.raises(ConfigError, match="semantics=bounded"):
        vvs(SAMPLED, drafter=drafter, draft=chain(3), acceptance=rule(semantics="bounded"), interval=3)
    without = vvs(SAMPLED, drafter=drafter, draft=chain(3), acceptance=rule(semantics="bounded"), interval=None)
    assert without.settings.interval is None and without.settings.rule["semantics"] == "bounded"
