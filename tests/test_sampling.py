import math

import pytest
import torch

from lantern import rng
from lantern.errors import ConfigError
from lantern.models.sampling import (
    SamplingConfig,
    combine_cfg,
    filter_logits,
    guided_logits,
    guided_logits_at,
    probabilities,
    sample,
)


def test_uniforms_are_a_pure_function_of_key_step_stream_index():
    keys = rng.keys_tensor(7, [0, 1, 2, 3])
    a = rng.uniform(keys, 5, rng.SAMPLE, 100)
    b = rng.uniform(keys[[2, 0]], 5, rng.SAMPLE, 100)
    torch.testing.assert_close(a[[2, 0]], b)  # batch composition does not matter
    assert not torch.equal(a, rng.uniform(keys, 6, rng.SAMPLE, 100))
    assert not torch.equal(a, rng.uniform(keys, 5, rng.ACCEPT, 100))
    assert rng.sample_key(7, 0) != rng.sample_key(8, 0) != rng.sample_key(7, 1)


def test_uniforms_look_uniform_and_independent():
    keys = rng.keys_tensor(0, range(64))
    u = rng.uniform(keys, 3, rng.SAMPLE, 4096).double()
    assert 0 < u.min() and u.max() < 1
    assert abs(u.mean().item() - 0.5) < 0.003
    assert abs(u.var().item() - 1 / 12) < 0.001
    counts = torch.histc(u.float(), bins=16, min=0, max=1)
    expected = u.numel() / 16
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < 45  # 15 dof: p < 1e-4 beyond this
    neighbours = torch.corrcoef(torch.stack([u[:, :-1].flatten(), u[:, 1:].flatten()]))[0, 1]
    assert abs(neighbours.item()) < 0.01


def test_exponential_race_samples_the_distribution():
    torch.manual_seed(0)
    probs = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05, 0.0])
    draws = 20000
    keys = rng.keys_tensor(1, range(draws))
    tokens = sample(probs.expand(draws, -1), keys, step=0)
    counts = torch.bincount(tokens, minlength=6).double()
    assert counts[5] == 0  # zero-probability tokens are never drawn
    expected = probs[:5].double() * draws
    chi2 = ((counts[:5] - expected) ** 2 / expected).sum().item()
    assert chi2 < 18.5  # 4 dof, p = 0.001


def test_cfg_combines_conditional_first():
    cond, uncond = torch.randn(2, 7), torch.randn(2, 7)
    out = combine_cfg(torch.cat([cond, uncond]), 3.0)
    torch.testing.assert_close(out, uncond + 3.0 * (cond - uncond))
    # LlamaGen: token 0 (prefill) is guided, decode step i makes token i + 1 and is guided while i <= n.
    cfg = SamplingConfig(cfg_scale=3.0, cfg_interval=4)
    torch.testing.assert_close(guided_logits(torch.cat([cond, uncond]), cfg, 5), out)  # step i = 4
    torch.testing.assert_close(guided_logits(torch.cat([cond, uncond]), cfg, 6), cond)  # step i = 5 > 4
    no_cfg = SamplingConfig(cfg_scale=1.0)
    assert not no_cfg.uses_cfg
    torch.testing.assert_close(guided_logits(cond, no_cfg, 0), cond)


@pytest.mark.parametrize("interval", [0, 1, 3, 10])
def test_cfg_interval_guides_the_tokens_llamagen_guides(interval):
    # The reference loop: prefill token 0 guided; decode step i (token i + 1) guided until i > interval.
    expected = [True] + [not (interval > -1 and i > interval) for i in range(20)]
    config = SamplingConfig(cfg_scale=2.0, cfg_interval=interval)
    assert [config.guidance_on(t) for t in range(21)] == expected
    cond, uncond = torch.randn(1, 21, 5), torch.randn(1, 21, 5)
    steps = torch.arange(21)[None]  # (B, S): the token index each position predicts
    per_position = guided_logits_at(torch.cat([cond, uncond]), config, steps)
    for t in range(21):
        want = combine_cfg(torch.cat([cond[:, t], uncond[:, t]]), 2.0) if expected[t] else cond[:, t]
        torch.testing.assert_close(per_position[:, t], want)
        torch.testing.assert_close(guided_logits(torch.cat([cond[:, t], uncond[:, t]]), config, t), want)


@pytest.mark.parametrize("scale", [0.0, 0.5, 0.99, 1.0])
def test_scales_up_to_one_use_the_conditional_stream_alone_as_llamagen(scale):
    config = SamplingConfig(cfg_scale=scale)
    assert not config.uses_cfg and not config.guidance_on(0)
    cond = torch.randn(2, 7)
    torch.testing.assert_close(guided_logits(cond, config, 0), cond)


def test_mixing_below_one_is_a_named_option():
    cond, uncond = torch.randn(2, 7), torch.randn(2, 7)
    mix = SamplingConfig(cfg_scale=0.5, cfg_below_one="mix")
    assert mix.uses_cfg and mix.guidance_on(0)
    torch.testing.assert_close(guided_logits(torch.cat([cond, uncond]), mix, 0), uncond + 0.5 * (cond - uncond))
    assert not SamplingConfig(cfg_scale=1.0, cfg_below_one="mix").uses_cfg
    assert SamplingConfig(cfg_scale=3.0, cfg_below_one="mix").uses_cfg == SamplingConfig(cfg_scale=3.0).uses_cfg


def test_top_k_and_top_p_filters_match_a_direct_computation():
    logits = torch.tensor([[3.0, 1.0, 2.0, 0.0, -1.0]])
    kept = filter_logits(logits, 2, 1.0)
    assert torch.isfinite(kept).tolist() == [[True, False, True, False, False]]
    probs = logits.softmax(-1)[0]  # sorted: 0 (.64), 2 (.24), 1 (.09), ...
    for top_p, expect in [(0.5, [0]), (0.7, [0, 2]), (0.95, [0, 2, 1]), (1.0, [0, 1, 2, 3, 4])]:
        keep = torch.isfinite(filter_logits(logits, 0, top_p))[0].nonzero().flatten().tolist()
        assert sorted(keep) == sorted(expect), (top_p, probs)


def test_greedy_is_one_hot_and_temperature_sharpens():
    logits = torch.tensor([[0.0, 2.0, 1.0]])
    assert probabilities(logits, SamplingConfig(temperature=0)).tolist() == [[0.0, 1.0, 0.0]]
    hot = probabilities(logits, SamplingConfig(temperature=0.5))
    torch.testing.assert_close(hot, (logits / 0.5).softmax(-1))


@pytest.mark.parametrize(
    "field,value",
    [
        ("temperature", -0.1),
        ("temperature", math.nan),
        ("temperature", math.inf),
        ("temperature", "hot"),
        ("temperature", True),
        ("top_k", -1),
        ("top_k", 2.5),
        ("top_k", "abc"),
        ("top_k", math.inf),
        ("top_p", 0.0),
        ("top_p", 1.01),
        ("top_p", math.nan),
        ("top_p", "all"),
        ("cfg_scale", -1.0),
        ("cfg_scale", math.inf),
        ("cfg_scale", -math.inf),
        ("cfg_scale", math.nan),
        ("cfg_scale", None),
        ("cfg_interval", -2),
        ("cfg_interval", 1.5),
        ("cfg_interval", "x"),
        ("cfg_below_one", "average"),
    ],
)
def test_bad_sampling_values_name_the_field(field, value):
    with pytest.raises(ConfigError, match=f"^{field}="):
        SamplingConfig(**{field: value})


def test_integral_floats_become_ints():
    config = SamplingConfig(top_k=5.0, cfg_interval=3.0)
    assert config.top_k == 5 and isinstance(config.top_k, int) and isinstance(config.cfg_interval, int)


def _split_mul32(x, c):
    """The hash's first form of ``(x * c) mod 2**32``: 16-bit halves of ``c``, no product above 2**48."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & 0xFFFFFFFF


def _split_uniform(keys, step, stream, n):
    def mix(x):
        x = x ^ (x >> 16)
        x = _split_mul32(x, 0x7FEB352D)
        x = x ^ (x >> 15)
        x = _split_mul32(x, 0x846CA68B)
        return x ^ (x >> 16)

    step = torch.as_tensor(step, dtype=torch.long).expand(keys.shape)
    base = mix(mix(keys & 0xFFFFFFFF) ^ (keys >> 32))
    base = mix(base ^ (step & 0xFFFFFFFF))
    base = mix(base ^ _split_mul32(torch.full_like(base, stream), 0x9E3779B9))
    index = _split_mul32(torch.arange(n, dtype=torch.long), 0x9E3779B9)
    bits = mix(mix((base[:, None] + index[None, :]) & 0xFFFFFFFF) ^ base[:, None])
    return ((bits >> 8).float() + 0.5) * (1.0 / (1 << 24))


def test_the_two_op_multiply_is_bit_identical_to_the_split_one():
    """Every image ever drawn stays the same: the hash's products agree with the overflow-free split form
    on 200,000 random 32-bit lanes and the range's edges, and the uniforms agree bit for bit."""
    gen = torch.Generator().manual_seed(0)
    x = torch.cat(
        [
            torch.randint(0, 1 << 32, (200_000,), generator=gen, dtype=torch.long),
            torch.tensor([0, 1, (1 << 31) - 1, 1 << 31, (1 << 32) - 1]),
        ]
    )
    for c in (0x7FEB352D, 0x846CA68B, 0x9E3779B9, 0xFFFFFFFF, 1, 1 << 31):
        assert torch.equal(rng._mul32(x, c), _split_mul32(x, c)), hex(c)
    keys = torch.cat([rng.keys_tensor(3, range(50)), torch.tensor([0, (1 << 63) - 1])])
    steps = torch.randint(0, 1 << 20, keys.shape, generator=gen)
    for stream in (rng.SAMPLE, rng.ACCEPT, rng.DRAFT, rng.LEVEL, rng.JACOBI_INIT):
        assert torch.equal(rng.uniform(keys, steps, stream, 3000), _split_uniform(keys, steps, stream, 3000))
