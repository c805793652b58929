"""Compile-ready decode steps: both steps capture as one graph, compiled decoding equals eager token for
token, compilations per run are bounded, and the decode-time drafter path is exact for a perfect drafter."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import CountingBackend, text_condition, tiny
from torch import nn

from lantern.decoding.ar import ARDecoder
from lantern.decoding.compile import check_compile, inductor_options
from lantern.decoding.tree.decoder import SpeculativeDecoder
from lantern.decoding.tree.draft import DynamicTree, chain, prior_tree
from lantern.errors import ConfigError
from lantern.models.sampling import SamplingConfig
from lantern.rng import keys_tensor
from lantern.rules.exact import ExactDeterministic, ExactSampled
from lantern.rules.factory import lantern, lantern_reference
from lantern.rules.neighbours import CodebookNeighbours

REPO = Path(__file__).resolve().parents[1]


def speculative_cases():
    sampled, deterministic = (
        SamplingConfig(temperature=1.0, cfg_scale=3.0),
        SamplingConfig(temperature=0, cfg_scale=3.0),
    )
    table = CodebookNeighbours(codebook=torch.randn(8, 4), k_max=7)
    return [
        ("chain-greedy", deterministic, chain(3, "sampled"), ExactDeterministic()),
        ("chain-sampled", sampled, chain(3, "sampled"), ExactSampled()),
        ("static-deterministic", sampled, prior_tree(3, 3, 8), ExactDeterministic()),
        ("dynamic-sampled", sampled, DynamicTree(3, 3, 8, "sampled"), ExactSampled()),
        ("lantern-dynamic-sampled", sampled, DynamicTree(3, 3, 8, "sampled"), lantern(4, 0.3, table)),
        ("lantern-chain-greedy", deterministic, chain(3), lantern(4, 0.3, table)),
        # Compiled for the CPU, a chain's levels past every row's rejection are not relaxed (torch.cond).
        ("lantern-chain-sampled", sampled, chain(3, "sampled"), lantern(4, 0.3, table)),
    ]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_ar_step_captures_as_one_graph_and_matches_eager(temperature):
    model, _ = tiny()
    cond, keys = text_condition(), keys_tensor(0, range(4))
    sampling = SamplingConfig(temperature=temperature, cfg_scale=3.0)
    expected = ARDecoder(sampling).generate(model, cond, keys).codes
    backend = CountingBackend()
    decoder = ARDecoder(sampling, compile="default", backend=backend)
    for _ in range(2):  # a second batch of the same shape reuses the graph
        assert torch.equal(decoder.generate(model, cond, keys).codes, expected)
    assert backend.graphs == 1


@pytest.mark.parametrize("name,sampling,structure,rule", speculative_cases(), ids=[c[0] for c in speculative_cases()])
def test_speculative_step_captures_as_one_graph_and_matches_eager(name, sampling, structure, rule):
    model, drafter = tiny()
    cond, keys = text_condition(), keys_tensor(1, range(4))
    eager = SpeculativeDecoder(sampling, drafter=drafter, draft=structure, acceptance=rule).generate(model, cond, keys)
    backend = CountingBackend()
    decoder = SpeculativeDecoder(
        sampling, drafter=drafter, draft=structure, acceptance=rule, compile="default", backend=backend
    )
    for _ in range(2):
        result = decoder.generate(model, cond, keys)
        assert torch.equal(result.codes, eager.codes)
        assert torch.equal(result.per_sample["histogram"], eager.per_sample["histogram"])
        assert torch.allclose(result.per_sample["tv_realised_sum"], eager.per_sample["tv_realised_sum"])
    assert backend.graphs == 1, "one graph per decoder and batch shape (the audit flag is constant here)"


@pytest.mark.parametrize("every,graphs", [(3, 2), (10**6, 1)])
def test_an_audit_schedule_compiles_every_graph_in_the_first_call(every, graphs):
    """Reference semantics audit the realised TV on every N-th step: the first call compiles the step
    graphs it needs (audited and not, or only the unaudited one when no step is audited); a second call
    of the same shape compiles nothing."""
    model, drafter = tiny()
    sampling = SamplingConfig(temperature=1.0, cfg_scale=3.0)
    rule = lantern_reference(4, 0.3, CodebookNeighbours(codebook=torch.randn(8, 4), k_max=7), tv_audit_every=every)
    backend = CountingBackend()
    decoder = SpeculativeDecoder(
        sampling, drafter=drafter, draft=chain(2, "sampled"), acceptance=rule, compile="default", backend=backend
    )
    cond, keys = text_condition(), keys_tensor(0, range(4))
    for _ in range(2):
        decoder.generate(model, cond, keys)
        assert backend.graphs == graphs


def test_a_smaller_last_batch_adds_one_graph_only():
    model, drafter = tiny()
    sampling = SamplingConfig(temperature=1.0, cfg_scale=3.0)
    backend = CountingBackend()
    decoder = SpeculativeDecoder(
        sampling,
        drafter=drafter,
        draft=chain(2, "sampled"),
        acceptance=ExactSampled(),
        compile="default",
        backend=backend,
    )
    for prompts in (("a", "b c", "d"), ("e f", "g", "h"), ("i",)):
        decoder.generate(model, text_condition(prompts), keys_tensor(0, range(len(prompts))))
    assert backend.graphs == 2


def test_decoders_sharing_a_step_alternate_without_rerunning_every_guard():
    """After its first guarded call per context, a compiled step runs under Dynamo's
    ``skip_guard_eval_unsafe`` (only the guards that tell cache entries apart). Two decoders whose steps
    are the same function (exact and LANTERN chains) and an audited step, called in turn on one backend,
    must still each run their own graph: every batch equals its eager decode."""
    model, drafter = tiny()
    sampling = SamplingConfig(temperature=1.0, cfg_scale=3.0)
    table = CodebookNeighbours(codebook=torch.randn(8, 4), k_max=7)
    rules = {
        "exact": ExactSampled(),
        "lantern": lantern(4, 0.3, table),
        "reference": lantern_reference(4, 0.3, table, tv_audit_every=3),
    }
    backend = CountingBackend()
    decoders = {
        name: (
            SpeculativeDecoder(sampling, drafter=drafter, draft=chain(2, "sampled"), acceptance=rule),
            SpeculativeDecoder(
                sampling,
                drafter=drafter,
                draft=chain(2, "sampled"),
                acceptance=rule,
                compile="default",
                backend=backend,
            ),
        )
        for name, rule in rules.items()
    }
    cond = text_condition()
    for seed in range(3):
        keys = keys_tensor(seed, range(4))
        for name, (eager, compiled) in decoders.items():
            expected = eager.generate(model, cond, keys)
            result = compiled.generate(model, cond, keys)
            assert torch.equal(result.codes, expected.codes), (seed, name)
            assert torch.equal(result.per_sample["tv_measured"], expected.per_sample["tv_measured"]), (seed, name)
    assert backend.graphs == 4  # exact, lantern, reference unaudited and audited


def test_cpu_steps_compile_with_a_cpp_wrapper():
    assert inductor_options("default", "cpu") == {"options": {"cpp_wrapper": True, "max_autotune": False}}
    assert inductor_options("max-autotune", "cpu")["options"]["max_autotune"]
    assert inductor_options("reduce-overhead", "cuda") == {"mode": "reduce-overhead"}
    assert inductor_options("default", "cuda") == {}


def test_inductor_compiled_ar_equals_eager():
    model, _ = tiny()
    cond, keys = text_condition(), keys_tensor(0, range(4))
    sampling = SamplingConfig(temperature=0, cfg_scale=3.0)
    expected = ARDecoder(sampling).generate(model, cond, keys).codes
    assert torch.equal(ARDecoder(sampling, compile="default").generate(model, cond, keys).codes, expected)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name,sampling,structure,rule",
    speculative_cases()[:4] + speculative_cases()[6:],
    ids=[c[0] for c in speculative_cases()[:4] + speculative_cases()[6:]],
)
def test_inductor_compiled_speculative_equals_eager(name, sampling, structure, rule):
    model, drafter = tiny()
    cond, keys = text_condition(), keys_tensor(1, range(4))
    eager = (
        SpeculativeDecoder(sampling, drafter=drafter, draft=structure, acceptance=rule)
        .generate(model, cond, keys)
        .codes
    )
    compiled = (
        SpeculativeDecoder(sampling, drafter=drafter, draft=structure, acceptance=rule, compile="default")
        .generate(model, cond, keys)
        .codes
    )
    assert torch.equal(compiled, eager)


class TargetAsDrafter(nn.Module):
    """A stand-in drafter that runs the target itself: drafter entry ``i`` is target position ``i + 1``.

    With the condition's first slot padded (hidden from every query), the target's hidden states do not
    depend on it, so this drafter predicts the target exactly: under greedy decoding every draft token
    must be accepted. Anything wrong in the decode-time drafter path (slots, positions, masks, the
    consumption of accepted tokens) breaks that.
    """

    def __init__(self, target):
        super().__init__()
        self.target = target
        self.config = type("Config", (), {"target": target.config, "taps": ()})()  # reads the final-norm state

    def condition_inputs(self, target, cond_emb):
        return cond_emb[:, 1:]

    def target_features(self, features):
        return features

    def forward(self, embeds, features, entries, slots, mask, cache):
        positions = (entries + 1).clamp_max(self.target.config.max_seq_len - 1)  # overshoot entries are discarded
        return self.target.forward_embeddings(embeds.to(features.dtype), positions, slots, mask, cache)

    def new_cache(self, batch, max_len):
        return self.target.new_cache(batch, max_len)

    def check_target(self, config):
        assert config == self.target.config


@pytest.mark.parametrize("structure", [chain(3), prior_tree(3, 2, 6)], ids=["chain", "static_tree"])
@pytest.mark.parametrize("compile", ["none", "default"])
def test_a_perfect_drafter_has_every_draft_accepted(structure, compile):
    model, _ = tiny()
    prompts = ("a", "b c", "d e f")  # shorter than the 4 condition slots: slot 0 is padding
    cond, keys = text_condition(prompts), keys_tensor(0, range(len(prompts)))
    assert not cond.mask[:, 0].any()
    sampling = SamplingConfig(temperature=0, cfg_scale=2.0)
    decoder = SpeculativeDecoder(
        sampling,
        drafter=TargetAsDrafter(model),
        draft=structure,
        acceptance=ExactDeterministic(),
        compile=compile,
        backend=CountingBackend(),
    )
    result = decoder.generate(model, cond, keys)
    assert torch.equal(result.codes, ARDecoder(sampling).generate(model, cond, keys).codes)
    steps, histogram = result.per_sample["steps"], result.per_sample["histogram"]
    depth = structure.depth
    needed = -(-(model.config.num_image_tokens - 1) // (depth + 1))  # ceil(15 / (depth + 1))
    assert (steps == needed).all(), f"every step should accept all {depth} drafts: {histogram.tolist()}"
    assert (histogram[:, depth] >= needed - 1).all()


@pytest.mark.parametrize("compile", ["none", "default"])
def test_a_perfect_drafter_on_a_dynamic_tree_accepts_in_every_step(compile):
    """The dynamic tree may cut the greedy path below the first level (it keeps nodes by score), but its
    first level always holds the drafter's top token, which a perfect drafter's target accepts."""
    model, _ = tiny()
    prompts = ("a", "b c", "d e f")
    cond, keys = text_condition(prompts), keys_tensor(0, range(len(prompts)))
    sampling = SamplingConfig(temperature=0, cfg_scale=2.0)
    decoder = SpeculativeDecoder(
        sampling,
        drafter=TargetAsDrafter(model),
        draft=DynamicTree(3, 2, 6),
        acceptance=ExactDeterministic(),
        compile=compile,
        backend=CountingBackend(),
    )
    result = decoder.generate(model, cond, keys)
    assert torch.equal(result.codes, ARDecoder(sampling).generate(model, cond, keys).codes)
    histogram = result.per_sample["histogram"]
    assert (histogram[:, 0] == 0).all(), histogram.tolist()


def test_compile_modes_are_checked():
    assert check_compile("none", "cpu") == "none"
    with pytest.raises(
        ConfigError, match="compile='fast': expected one of none, default, reduce-overhead, max-autotune"
    ):
        check_compile("fast")
    with pytest.raises(ConfigError, match="needs device=cuda"):
        check_compile("reduce-overhead", "cpu")


@pytest.mark.parametrize(
    "override,message",
    [("compile=fast", "compile='fast'"), ("compile=reduce-overhead", "compile=reduce-overhead captures CUDA graphs")],
)
def test_bad_compile_mode_is_one_line_and_no_run_folder(tmp_path, override, message):
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "run.py",
            "model=tiny_random_c2i",
            f"hydra.run.dir={out}",
            "wandb.mode=disabled",
            "num_images=2",
            override,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], (
        proc.stderr
    )
    assert not out.exists()


def test_reference_attention_uses_llamagens_cache_length_and_the_math_kernel(monkeypatch):
    """attention=reference: every attention call sees find_multiple(T + N, 8) keys under the math SDPA
    backend (what LlamaGen's generate() does, and what makes bf16 samples agree token for token)."""
    import torch.nn.functional as F

    from lantern.models.llamagen import gpt

    model, _ = tiny()
    cond, keys = text_condition(), keys_tensor(0, range(4))
    seen = []
    original = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kwargs):
        seen.append((k.shape[2], torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()))
        return original(q, k, v, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(gpt.F, "scaled_dot_product_attention", spy)
    sampling = SamplingConfig(temperature=0, cfg_scale=2.0)
    fast = ARDecoder(sampling).generate(model, cond, keys).codes
    fast_calls, seen[:] = list(seen), []
    reference = ARDecoder(sampling, attention="reference").generate(model, cond, keys).codes
    cfg = model.config
    padded = -(-(cfg.cls_token_num + cfg.num_image_tokens) // 8) * 8
    assert {length for length, *_ in seen} == {padded} != {length for length, *_ in fast_calls}
    assert all(math and not flash for _, flash, math in seen)  # only the math kernel is enabled (CPU and CUDA)
    assert torch.equal(reference, fast)  # fp32: the kernels agree on greedy tokens
    with pytest.raises(ConfigError, match="attention='flash': expected one of fast, reference"):
        ARDecoder(sampling, attention="flash")
