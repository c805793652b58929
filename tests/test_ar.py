import pytest
import torch
from helpers import FakeEncoder

from lantern.decoding.ar import ARDecoder
from lantern.models.condition import ClassConditioner, TextConditioner
from lantern.models.llamagen.gpt import Transformer, gpt_config
from lantern.models.sampling import SamplingConfig, combine_cfg
from lantern.rng import keys_tensor


def tiny(model_type="c2i", seed=0):
    torch.manual_seed(seed)
    cfg = gpt_config(
        "GPT-nano",
        model_type,
        64,
        vocab_size=256,
        num_classes=10,
        caption_dim=8,
        cls_token_num=4 if model_type == "t2i" else 1,
    )
    return Transformer(cfg).eval()


def test_greedy_cfg_decoding_is_the_argmax_of_the_teacher_forced_model():
    model = tiny()
    sampling = SamplingConfig(temperature=0, cfg_scale=3.0)
    cond = ClassConditioner(10).encode([1, 4, 7])
    codes = ARDecoder(sampling).generate(model, cond, keys_tensor(0, range(3))).codes
    with torch.no_grad():
        labels = torch.cat([cond.values, model.null_condition(3)])
        mask = torch.ones(6, 1, dtype=torch.bool)
        logits = model.head(model.forward_teacher(model.embed_condition(labels), codes.repeat(2, 1), mask))
    assert torch.equal(combine_cfg(logits, 3.0).argmax(-1), codes)
    again = ARDecoder(sampling).generate(model, cond, keys_tensor(5, range(3))).codes
    assert torch.equal(codes, again)  # greedy ignores the seed and is deterministic


def test_text_conditioned_greedy_matches_teacher_forcing_with_padding():
    model = tiny("t2i")
    sampling = SamplingConfig(temperature=0, cfg_scale=2.0)
    cond = TextConditioner(FakeEncoder()).encode(["a shoe", "a long red coat here", "bag"])
    codes = ARDecoder(sampling).generate(model, cond, keys_tensor(0, range(3))).codes
    with torch.no_grad():
        values = torch.cat([cond.values, model.null_condition(3)])
        logits = model.head(
            model.forward_teacher(model.embed_condition(values), codes.repeat(2, 1), cond.mask.repeat(2, 1))
        )
    assert torch.equal(combine_cfg(logits, 2.0).argmax(-1), codes)


def test_sampled_images_do_not_depend_on_batch_size_or_order():
    model = tiny()
    decoder = ARDecoder(SamplingConfig(temperature=1.0, top_k=50, top_p=0.9, cfg_scale=2.5))
    conditioner = ClassConditioner(10)
    prompts = [3, 3, 8, 0]
    together = decoder.generate(model, conditioner.encode(prompts), keys_tensor(11, range(4))).codes
    alone = torch.cat(
        [decoder.generate(model, conditioner.encode([prompts[i]]), keys_tensor(11, [i])).codes for i in range(4)]
    )
    assert torch.equal(together, alone)
    reversed_order = decoder.generate(model, conditioner.encode(prompts[::-1]), keys_tensor(11, [3, 2, 1, 0])).codes
    assert torch.equal(reversed_order.flip(0), together)
    assert not torch.equal(together[0], together[1])  # same prompt, different index -> different sample
    other_seed = decoder.generate(model, conditioner.encode(prompts), keys_tensor(12, range(4))).codes
    assert not torch.equal(other_seed, together)


def test_cfg_scale_one_runs_a_single_stream():
    model = tiny()
    calls = []
    handle = model.tok_embeddings.register_forward_hook(lambda m, a, out: calls.append(out.shape[0]))
    ARDecoder(SamplingConfig(cfg_scale=1.0)).generate(
        model, ClassConditioner(10).encode([1, 2]), keys_tensor(0, [0, 1])
    )
    handle.remove()
    assert set(calls) == {2}
    calls.clear()
    handle = model.tok_embeddings.register_forward_hook(lambda m, a, out: calls.append(out.shape[0]))
    ARDecoder(SamplingConfig(cfg_scale=4.0)).generate(
        model, ClassConditioner(10).encode([1, 2]), keys_tensor(0, [0, 1])
    )
    handle.remove()
    assert set(calls) == {4}


def test_bfloat16_weights_decode_with_fp32_rope_and_logits():
    model = tiny().to(torch.bfloat16)
    assert model.rope.dtype == torch.float32 and model.output.weight.dtype == torch.bfloat16
    cond = ClassConditioner(10).encode([1, 2])
    codes = (
        ARDecoder(SamplingConfig(temperature=1.0, cfg_scale=2.0)).generate(model, cond, keys_tensor(0, [0, 1])).codes
    )
    assert codes.shape == (2, model.config.num_image_tokens) and 0 <= codes.min() and codes.max() < 256
    cache = model.new_cache(2)
    assert cache.k.dtype == torch.bfloat16


def _teacher_logits(model, cond, codes):
    """Teacher-forced [cond; uncond] logits (2B, N, V) of ``codes`` (B, N) for class prompts ``cond``."""
    with torch.no_grad():
        labels = torch.cat([cond.values, model.null_condition(len(cond))])
        mask = torch.ones(2 * len(cond), 1, dtype=torch.bool)
        return model.head(model.forward_teacher(model.embed_condition(labels), codes.repeat(2, 1), mask))


@pytest.mark.parametrize("interval", [0, 3, 10])
def test_cfg_interval_follows_llamagen_token_for_token(interval):
    model = tiny()
    cond = ClassConditioner(10).encode([1, 4, 7])
    codes = (
        ARDecoder(SamplingConfig(temperature=0, cfg_scale=4.0, cfg_interval=interval))
        .generate(model, cond, keys_tensor(0, range(3)))
        .codes
    )
    cond_logits, uncond_logits = _teacher_logits(model, cond, codes).chunk(2)
    # LlamaGen: the prefill's token 0 is guided; decode step i makes token i + 1, guided until i > interval.
    for t in range(codes.shape[1]):
        guided = t == 0 or not (t - 1 > interval)
        logits = uncond_logits[:, t] + (cond_logits[:, t] - uncond_logits[:, t]) * 4.0 if guided else cond_logits[:, t]
        assert torch.equal(logits.argmax(-1), codes[:, t]), t
    shifted = (
        ARDecoder(SamplingConfig(temperature=0, cfg_scale=4.0, cfg_interval=interval + 1))
        .generate(model, cond, keys_tensor(0, range(3)))
        .codes
    )
    if interval < 10:  # the interval matters on this model, so the check above can fail
        assert not torch.equal(shifted, codes)


def test_scale_below_one_samples_the_conditional_stream_alone_unless_mix_is_asked():
    model = tiny()
    cond, keys = ClassConditioner(10).encode([1, 2]), keys_tensor(0, [0, 1])
    calls = []
    handle = model.tok_embeddings.register_forward_hook(lambda m, a, out: calls.append(out.shape[0]))
    half = ARDecoder(SamplingConfig(temperature=1.0, cfg_scale=0.5)).generate(model, cond, keys).codes
    handle.remove()
    assert set(calls) == {2}  # one stream, as LlamaGen for cfg_scale <= 1
    assert torch.equal(
        half, ARDecoder(SamplingConfig(temperature=1.0, cfg_scale=1.0)).generate(model, cond, keys).codes
    )
    mixed = (
        ARDecoder(SamplingConfig(temperature=0, cfg_scale=0.5, cfg_below_one="mix")).generate(model, cond, keys).codes
    )
    cond_logits, uncond_logits = _teacher_logits(model, cond, mixed).chunk(2)
    assert torch.equal((uncond_logits + 0.5 * (cond_logits - uncond_logits)).argmax(-1), mixed)
    plain = ARDecoder(SamplingConfig(temperature=0, cfg_scale=0.5)).generate(model, cond, keys).codes
    assert torch.equal(_teacher_logits(model, cond, plain).chunk(2)[0].argmax(-1), plain)  # conditional argmax
    assert not torch.equal(plain, mixed)
