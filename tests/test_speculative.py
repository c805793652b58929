"""Speculative decoding end to end on tiny random models: greedy equality with AR, lossless sampling,
LANTERN's degenerate cases, and the cache left behind."""

import sys

import pytest
import torch
from helpers import VOCAB, chi2_statistic, exact_marginals, neighbours_of, text_condition, tiny
from scipy.stats import chi2

from lantern.decoding.ar import ARDecoder
from lantern.decoding.tree.decoder import SpeculativeDecoder
from lantern.decoding.tree.draft import DynamicTree, chain, prior_tree
from lantern.errors import ConfigError
from lantern.models import devices
from lantern.models.condition import ClassConditioner
from lantern.models.drafter import Drafter, DrafterConfig
from lantern.models.kv_cache import KVCache
from lantern.models.llamagen.gpt import gpt_config
from lantern.models.sampling import SamplingConfig
from lantern.models.target import prefix_causal_mask
from lantern.rng import keys_tensor
from lantern.rules.exact import ExactDeterministic, ExactSampled, ExactTest
from lantern.rules.factory import lantern, lantern_pp, lantern_pp_reference, lantern_reference


def structures(candidates="deterministic"):
    return [chain(4, candidates), prior_tree(4, 4, 12, candidates=candidates), DynamicTree(4, 3, 10, candidates)]


@pytest.mark.parametrize("cfg_scale", [1.0, 3.0])
@pytest.mark.parametrize("structure", structures(), ids=["chain", "static_tree", "dynamic_tree"])
def test_greedy_speculative_reproduces_greedy_ar(structure, cfg_scale):
    model, drafter = tiny()
    cond, keys = text_condition(), keys_tensor(0, range(4))
    sampling = SamplingConfig(temperature=0, cfg_scale=cfg_scale)
    expected = ARDecoder(sampling).generate(model, cond, keys).codes
    result = SpeculativeDecoder(sampling, drafter=drafter, draft=structure, acceptance=ExactDeterministic()).generate(
        model, cond, keys
    )
    assert torch.equal(result.codes, expected)
    histogram = result.per_sample["histogram"]
    assert histogram[:, 1:].sum() > 0, "the test should exercise accepted drafts"
    assert torch.equal(histogram.sum(1), result.per_sample["steps"])
    tokens = (histogram * torch.arange(histogram.shape[1])).sum(1) + result.per_sample["steps"]
    assert (tokens >= model.config.num_image_tokens - 1).all()


@pytest.mark.parametrize("semantics", ["bounded", "reference"])
def test_greedy_lantern_with_zero_delta_reproduces_greedy_ar(semantics):
    model, drafter = tiny()
    cond, keys = text_condition(), keys_tensor(0, range(4))
    sampling = SamplingConfig(temperature=0, cfg_scale=2.0)
    expected = ARDecoder(sampling).generate(model, cond, keys).codes
    table = torch.stack([torch.roll(torch.arange(VOCAB), -s) for s in range(1, VOCAB)], dim=1)  # (V, V-1)
    rule = (lantern if semantics == "bounded" else lantern_reference)(3, 0.0, table)
    for structure in structures():
        result = SpeculativeDecoder(sampling, drafter=drafter, draft=structure, acceptance=rule).generate(
            model, cond, keys
        )
        assert torch.equal(result.codes, expected)


@pytest.mark.parametrize("semantics", ["bounded", "reference"])
@pytest.mark.parametrize("relaxed", ["lantern", "lantern_pp"])
@pytest.mark.parametrize("candidates", ["deterministic", "sampled"])
def test_zero_relaxation_is_exact_token_for_token(relaxed, semantics, candidates):
    model, drafter = tiny()
    cond, keys = text_condition(), keys_tensor(3, range(4))
    sampling = SamplingConfig(temperature=1.0, cfg_scale=2.0)
    table = neighbours_of(VOCAB)
    build = {
        ("lantern", "bounded"): lantern,
        ("lantern", "reference"): lantern_reference,
        ("lantern_pp", "bounded"): lantern_pp,
        ("lantern_pp", "reference"): lantern_pp_reference,
    }[relaxed, semantics]
    rule = build(4, 0.0 if relaxed == "lantern" else 1.0, table)
    # The authors' rule at delta = 0 is exact only while no zero-mass neighbour opens a prefix: after a
    # sibling is rejected its mass is 0, and if it is a later sibling's nearest code the reference zeroes
    # k+1 neighbours (see test_acceptance); with one candidate per level (a chain) that never happens.
    chosen = structures(candidates) if semantics == "bounded" else [chain(4, candidates)]
    for structure in chosen:
        exact = SpeculativeDecoder(
            sampling, drafter=drafter, draft=structure, acceptance=ExactDeterministic()
        ).generate(model, cond, keys)
        relaxed_run = SpeculativeDecoder(sampling, drafter=drafter, draft=structure, acceptance=rule).generate(
            model, cond, keys
        )
        assert torch.equal(exact.codes, relaxed_run.codes), structure.name
        assert float(exact.per_sample["tv_realised_max"].max()) == 0.0
        measured = relaxed_run.per_sample["tv_measured"].sum()
        assert measured > 0 and float(relaxed_run.per_sample["tv_realised_max"].max()) < 1e-5


class _WrongResidual(ExactSampled):
    """A broken rule for the negative control: resamples from p instead of norm(max(0, p - q))."""

    def residual(self, p, q, x):
        return p


class _WrongSiblingResidual(ExactDeterministic):
    """A broken rule for the negative control: a rejected sibling keeps its mass in p (tried in order)."""

    def residual(self, p, q, x):
        return p

    def try_siblings(self, p, x, valid, q, u, y):
        return ExactTest.try_siblings(self, p, x, valid, q, u, y)


class _SequentialDeterministic(ExactDeterministic):
    """The exact deterministic rule through the generic sibling loop (the closed form's reference)."""

    def try_siblings(self, p, x, valid, q, u, y):
        return ExactTest.try_siblings(self, p, x, valid, q, u, y)


SAMPLES = 3000


def _marginal_statistics(rule, structure):
    """Chi-square statistics (stat, dof) of image tokens 1 and 2 over SAMPLES speculative samples, against
    the exact AR marginals, and the acceptance histogram."""
    model, drafter = tiny(model_type="c2i", seed=1)
    sampling = SamplingConfig(temperature=1.0, cfg_scale=2.0)
    marginals = exact_marginals(model, ClassConditioner(10).encode([3]), sampling)
    many = ClassConditioner(10).encode([3] * SAMPLES)
    result = SpeculativeDecoder(sampling, drafter=drafter, draft=structure, acceptance=rule).generate(
        model, many, keys_tensor(9, range(SAMPLES))
    )
    stats = [
        chi2_statistic(torch.bincount(result.codes[:, position], minlength=VOCAB).double(), marginal.double(), SAMPLES)
        for position, marginal in zip((1, 2), marginals, strict=True)
    ]
    return stats, result.per_sample["histogram"]


@pytest.mark.parametrize(
    "rule, structure",
    [
        (ExactSampled(), chain(3, "sampled")),
        (ExactSampled(), prior_tree(3, 3, 8, candidates="sampled")),
        (ExactDeterministic(), DynamicTree(3, 3, 8)),
        pytest.param(ExactDeterministic(), prior_tree(3, 3, 8), marks=pytest.mark.slow),  # ~16 s each; the other
        pytest.param(_SequentialDeterministic(), DynamicTree(3, 3, 8), marks=pytest.mark.slow),  # three stay default
    ],
    ids=[
        "sampled_chain",
        "sampled_static_tree",
        "deterministic_dynamic_tree",
        "deterministic_static_tree",
        "deterministic_sequential_loop",
    ],
)
def test_exact_speculative_sampling_preserves_the_target_marginals(rule, structure):
    stats, histogram = _marginal_statistics(rule, structure)
    assert histogram[:, 1:].sum() > SAMPLES  # drafts were accepted along the way
    for position, (stat, dof) in zip((1, 2), stats, strict=True):
        assert stat < chi2.ppf(0.999, dof), f"token {position}: chi2 {stat:.1f} >= {chi2.ppf(0.999, dof):.1f}"


@pytest.mark.parametrize(
    "rule, structure",
    [(_WrongResidual(), chain(3, "sampled")), (_WrongSiblingResidual(), DynamicTree(3, 3, 8))],
    ids=["sampled_chain", "deterministic_dynamic_tree"],
)
def test_the_marginal_test_catches_a_wrong_residual(rule, structure):
    stats, _ = _marginal_statistics(rule, structure)
    assert any(stat > chi2.ppf(0.999, dof) for stat, dof in stats)


@pytest.mark.parametrize(
    "structure", [*structures(), chain(4, "sampled")], ids=["chain", "static_tree", "dynamic_tree", "sampled_chain"]
)
def test_cache_after_speculative_decoding_equals_the_ar_cache(structure):
    """Trees move their accepted paths into place; a chain's path is in place already (no move runs)."""
    model, drafter = tiny()
    cond, keys = text_condition(), keys_tensor(0, range(4))
    sampling = SamplingConfig(temperature=1.0, cfg_scale=3.0)
    caches = []
    original = model.new_cache

    def capture(batch, max_len=None):
        cache = original(batch, max_len)
        caches.append(cache)
        return cache

    model.new_cache = capture
    try:
        result = SpeculativeDecoder(sampling, drafter=drafter, draft=structure).generate(model, cond, keys)
    finally:
        del model.new_cache
    cache = caches[0]
    cfg = model.config
    length = cfg.cls_token_num + cfg.num_image_tokens - 1
    values = torch.cat([cond.values, model.null_condition(4)])
    mask = torch.cat([cond.mask, cond.mask])
    x = torch.cat([model.embed_condition(values), model.embed_tokens(result.codes[:, :-1].repeat(2, 1))], dim=1)
    reference = KVCache.allocate(cfg.n_layer, 8, cfg.n_head, length, cfg.head_dim, torch.float32, "cpu")
    positions = torch.arange(length)
    with torch.no_grad():
        model.forward_embeddings(x, positions, positions.expand(8, -1), prefix_causal_mask(mask, length), reference)
    torch.testing.assert_close(cache.k[:, :, :, :length], reference.k, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(cache.v[:, :, :, :length], reference.v, atol=1e-5, rtol=1e-4)


def test_images_do_not_depend_on_batch_composition():
    model, drafter = tiny()
    prompts = ["a red shirt", "b", "two words here now", "x y"]
    sampling = SamplingConfig(temperature=1.0, cfg_scale=2.0)
    decoder = SpeculativeDecoder(
        sampling, drafter=drafter, draft=DynamicTree(4, 3, 10), acceptance=ExactDeterministic()
    )
    together = decoder.generate(model, text_condition(prompts), keys_tensor(4, range(4))).codes
    alone = torch.cat(
        [decoder.generate(model, text_condition([prompts[i]]), keys_tensor(4, [i])).codes for i in range(4)]
    )
    assert torch.equal(together, alone)


def test_drafter_for_another_target_is_refused():
    model, _ = tiny()
    other = gpt_config("GPT-nano", "t2i", 64, vocab_size=16, caption_dim=8, cls_token_num=4)
    decoder = SpeculativeDecoder(
        SamplingConfig(temperature=0),
        drafter=Drafter(DrafterConfig(other)),
        draft=chain(2),
        acceptance=ExactDeterministic(),
    )
    with pytest.raises(ConfigError, match="vocabulary 16.*vocabulary 8"):
        decoder.generate(model, text_condition(["a"]), keys_tensor(0, [0]))


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: chain(0), "depth=0"),
        (lambda: DynamicTree(3, 2, 100), "nodes=100"),
        (lambda: prior_tree(5, 10, 58, candidates="random"), "candidates='random'"),
        (lambda: DynamicTree(top_k=0), "top_k=0"),
    ],
)
def test_bad_draft_settings_are_refused(build, message):
    with pytest.raises(ConfigError, match=message):
        build()


# Tensor methods and torch functions that make the host wait for the device (on a GPU), patched on the
# CPU to count host reads. Indexing syncs only with a boolean mask, repeat_interleave only with tensor repeats.
HOST_READS = (
    "item",
    "tolist",
    "__bool__",
    "__int__",
    "__float__",
    "__index__",
    "__complex__",
    "numpy",
    "__array__",
    "__format__",
    "__repr__",
    "nonzero",
    "masked_select",
    "unique",
    "unique_consecutive",
    "argwhere",
)
HOST_READ_FUNCTIONS = ("nonzero", "masked_select", "unique", "unique_consecutive", "argwhere")


def _count_host_reads(monkeypatch, calls: list) -> None:
    """Record in ``calls`` every host read a CPU run makes (see HOST_READS), except those of
    :func:`lantern.models.devices.needed` and ``share``: they read only eagerly on the CPU, where a read waits
    for nothing, and on a GPU (or compiled) answer without reading."""

    def counted(original, name, when=lambda *a, **k: True):
        def wrapper(*args, **kwargs):
            if when(*args, **kwargs) and sys._getframe(1).f_code.co_filename != devices.__file__:
                calls.append(name)
            return original(*args, **kwargs)

        return wrapper

    def bool_index(self, index, *rest):
        parts = index if isinstance(index, tuple) else (index,)
        return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts)

    for name in HOST_READS:
        monkeypatch.setattr(torch.Tensor, name, counted(getattr(torch.Tensor, name), name))
    for name in HOST_READ_FUNCTIONS:
        monkeypatch.setattr(torch, name, counted(getattr(torch, name), f"torch.{name}"))
    for name in ("__getitem__", "__setitem__"):
        monkeypatch.setattr(torch.Tensor, name, counted(getattr(torch.Tensor, name), f"{name}[bool]", bool_index))
    tensor_repeats = lambda self, repeats=None, *a, **k: isinstance(repeats, torch.Tensor)  # noqa: E731
    monkeypatch.setattr(
        torch.Tensor, "repeat_interleave", counted(torch.Tensor.repeat_interleave, "repeat_interleave", tensor_repeats)
    )


def test_the_host_read_counter_sees_each_kind_of_read(monkeypatch):
    calls = []
    _count_host_reads(monkeypatch, calls)
    x = torch.arange(6.0)
    (
        x.sum().item(),
        bool(x.any()),
        x[x > 2],
        x.nonzero(),
        torch.unique(x),
        x.repeat_interleave(torch.ones(6, dtype=torch.long)),
    )
    x[torch.tensor([0, 1])], x[1:3], x.repeat_interleave(2)  # not host reads
    assert calls == ["item", "__bool__", "__getitem__[bool]", "nonzero", "torch.unique", "repeat_interleave"]


def test_at_most_one_host_synchronisation_per_verification_step(monkeypatch):
    model, drafter = tiny()
    cond, keys = text_condition(), keys_tensor(0, range(4))
    calls = []
    _count_host_reads(monkeypatch, calls)
    for sampling in (
        SamplingConfig(temperature=0, cfg_scale=2.0),
        SamplingConfig(temperature=1.0, top_k=5, cfg_scale=2.0),
    ):
        for structure in structures() + [chain(3, "sampled"), DynamicTree(4, 3, 10, "sampled")]:
            calls.clear()
            result = SpeculativeDecoder(
                sampling, drafter=drafter, draft=structure, acceptance=ExactDeterministic()
            ).generate(model, cond, keys)
            steps = int(result.stats["target_forwards"]) - 1  # prefill is not a verification step
            assert len(calls) <= steps + 1, f"{structure.name}: {len(calls)} reads for {steps} steps: {set(calls)}"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA's own sync detector needs a GPU")
def test_at_most_one_host_synchronisation_per_step_on_cuda():
    """On a GPU, CUDA's sync debug mode reports every synchronising call, whatever Python method made it."""
    import warnings

    model, drafter = tiny()
    model, drafter = model.cuda(), drafter.cuda()
    cond = text_condition()
    cond = type(cond)(cond.values.cuda(), cond.mask.cuda())
    keys = keys_tensor(0, range(4), "cuda")
    for sampling in (
        SamplingConfig(temperature=0, cfg_scale=2.0),
        SamplingConfig(temperature=1.0, top_k=5, cfg_scale=2.0),
    ):
        for structure in structures() + [chain(3, "sampled"), DynamicTree(4, 3, 10, "sampled")]:
            decoder = SpeculativeDecoder(sampling, drafter=drafter, draft=structure, acceptance=ExactDeterministic())
            decoder.generate(model, cond, keys)  # warm-up: lazy initialisation may synchronise once
            torch.cuda.synchronize()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    result = decoder.generate(model, cond, keys)
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            syncs = [w for w in caught if "synchroniz" in str(w.message)]
            steps = int(result.stats["target_forwards"]) - 1
            assert len(syncs) <= steps + 1, f"{structure.name}: {len(syncs)} syncs for {steps} steps"


def test_condition_inputs_follow_the_drafter_config():
    model, _ = tiny()
    cond_emb = torch.randn(2, 4, model.config.dim)
    ours = Drafter(DrafterConfig(model.config))
    assert torch.equal(ours.condition_inputs(model, cond_emb), cond_emb[:, 1:])
    release = Drafter(DrafterConfig(model.config, condition_input="token0"))
    expected = model.tok_embeddings.weight[0].expand(2, 3, -1)
    assert torch.equal(release.condition_inputs(model, cond_emb), expected)
    with pytest.raises(ConfigError, match="condition_input='text'"):
        DrafterConfig(model.config, condition_input="text")


@pytest.mark.parametrize("decoding", ["eagle", "lantern", "lantern_pp"])
@pytest.mark.parametrize("draft", ["chain", "static_tree", "static_paths", "dynamic_tree"])
def test_every_decoding_and_draft_config_instantiates_and_decodes(decoding, draft):
    from helpers import REPO
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "conf")):
        cfg = compose(
            "config",
            overrides=[
                "model=tiny_random_c2i",
                f"decoding={decoding}",
                f"draft={draft}",
                "model.neighbours.cache_dir=outputs/test_neighbours",
            ],
        )
    from lantern.run.compose import ModelParts, build_decoder

    bundle = instantiate(cfg.model.bundle)
    decoder = build_decoder(cfg.decoding, ModelParts(cfg.model, bundle=bundle))
    assert decoder.name == decoding and decoder.settings.record()["draft"] == draft.replace(
        "static_paths", "static_tree"
    )
    result = decoder.generate(bundle.target, bundle.conditioner.encode([1]), keys_tensor(0, [0]))
    assert result.codes.shape == (1, bundle.target.config.num_image_tokens)
