"""The Chameleon family against transformers' ChameleonForConditionalGeneration on tiny random folders made
with save_pretrained: teacher-forced logits (with CFG's unconditional context and left padding), greedy AR
token for token against a reference loop over their model (LANTERN's ea_model_anole.py positions, masks and
CFG), strict folder loading, the compiled step as one graph, and the VQGAN's encoder against ChameleonVQVAE."""

from __future__ import annotations

import json

import pytest
import torch
from family_helpers import check_greedy_chain_equals_ar_in_one_graph
from helpers_chameleon import CODES, GRID, PROMPTS, SLOTS, VQ, hf_model, save_folder

from lantern.decoding.ar import ARDecoder
from lantern.errors import CheckpointError, ConfigError
from lantern.models.chameleon import hf
from lantern.models.chameleon.condition import ChameleonConditioner
from lantern.models.chameleon.model import ChameleonTarget
from lantern.models.chameleon.vocab import TINY_WORDS, image_token_name, read_layout, tiny_vocabulary, word_tokenizer
from lantern.models.chameleon.vqgan import ChameleonVQGAN, VQGANConfig
from lantern.models.llama_parts import random_prompted_target
from lantern.models.sampling import SamplingConfig
from lantern.models.target import Target, prefix_causal_mask
from lantern.rng import keys_tensor

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(HF model, our target loaded from its sharded save_pretrained folder, the folder)."""
    reference = hf_model()
    folder = save_folder(reference, tmp_path_factory.mktemp("chameleon") / "hf", shard="100KB")
    assert (folder / "model.safetensors.index.json").is_file()
    ours, vq = hf.load_target(folder, GRID, SLOTS)
    return reference, ours.eval(), vq, folder


def conditioner(target: ChameleonTarget) -> ChameleonConditioner:
    return ChameleonConditioner.for_model(word_tokenizer(tiny_vocabulary(CODES, TINY_WORDS)), target.config)


def reference_hidden(reference, ids, mask, positions):
    """Their final-norm states (B, L, D) for ids (B, L) with a 2D padding mask and explicit positions."""
    return reference.model(input_ids=ids, attention_mask=mask.long(), position_ids=positions).last_hidden_state


def lantern_positions(cond_mask: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions of LANTERN's generate: conditional rows arange over the padded context, the
    unconditional context [BOS, BOI] at 0, 1, then image token n at 2 + n."""
    slots = cond_mask.shape[1]
    cond = torch.arange(length)[None].expand(cond_mask.shape[0], -1)
    uncond = (cond - (slots - 2)).clamp_min(0)
    return cond, uncond


@torch.inference_mode()
def test_teacher_forced_logits_match_chameleonforconditionalgeneration_with_cfg_and_padding(pair):
    reference, ours, _, _ = pair
    condition = conditioner(ours).encode(PROMPTS)  # left-padded, three lengths
    assert not condition.mask.all() and condition.mask[:, -1].all()
    codes = torch.randint(0, CODES, (len(PROMPTS), GRID * GRID), generator=torch.Generator().manual_seed(1))
    null = ours.null_condition(len(PROMPTS))
    # Ours as every decoder calls it: [cond; uncond] rows, each half under its own mask.
    values = torch.cat([condition.values, null])
    mask = torch.cat([condition.mask, ours.null_condition_mask(condition.mask)])
    hidden = ours.teacher_hidden(ours.embed_condition(values), torch.cat([codes, codes]), mask)
    logits = ours.head(hidden[:, SLOTS - 1 :])  # (2B, N, K): row n predicts code n
    # Theirs: LANTERN's inputs, the unconditional context masked to its own two tokens.
    ids = torch.cat([values, (torch.cat([codes, codes]) + ours.config.code_offset)[:, :-1]], dim=1)
    length = ids.shape[1]
    cond_pos, uncond_pos = lantern_positions(condition.mask, length)
    image = torch.ones(len(PROMPTS), GRID * GRID - 1, dtype=torch.bool)
    cond_mask = torch.cat([condition.mask, image], dim=1)
    uncond_mask = torch.cat([null != ours.config.pad_id, image], dim=1)
    theirs = torch.cat(
        [
            reference_hidden(reference, ids[: len(PROMPTS)], cond_mask, cond_pos),
            reference_hidden(reference, ids[len(PROMPTS) :], uncond_mask, uncond_pos),
        ]
    )
    offset = ours.config.code_offset
    expected = reference.lm_head(theirs[:, SLOTS - 1 :]).float()[..., offset : offset + CODES]
    diff = (logits - expected).abs().max().item()
    assert diff <= 1e-4, diff
    guided = lambda x: x[3:] + (x[:3] - x[3:]) * 3.0  # noqa: E731 - CFG as LANTERN's cfg_logit_process
    assert (guided(logits) - guided(expected)).abs().max().item() <= 1e-4
    # The whole vocabulary too (the image-code head is a view of those rows).
    full = ours.vocab_logits(hidden[: len(PROMPTS), SLOTS - 1 :])
    assert (full - reference.lm_head(theirs[: len(PROMPTS), SLOTS - 1 :]).float()).abs().max().item() <= 1e-4


@torch.inference_mode()
def test_swin_norm_and_grouped_kv_heads_match_their_model(tmp_path):
    reference = hf_model(seed=3, swin_norm=True, num_key_value_heads=2)
    ours, _ = hf.load_target(save_folder(reference, tmp_path / "swin"), GRID, SLOTS)
    assert ours.config.swin_norm and ours.config.n_kv_head == 2
    condition = conditioner(ours).encode(PROMPTS[:2])
    codes = torch.randint(0, CODES, (2, GRID * GRID))
    hidden = ours.teacher_hidden(ours.embed_condition(condition.values), codes, condition.mask)
    ids = torch.cat([condition.values, codes[:, :-1] + ours.config.code_offset], dim=1)
    mask = torch.cat([condition.mask, torch.ones(2, GRID * GRID - 1, dtype=torch.bool)], dim=1)
    theirs = reference_hidden(reference, ids, mask, torch.arange(ids.shape[1])[None].expand(2, -1))
    assert (
        ours.head(hidden[:, SLOTS - 1 :]) - reference.lm_head(theirs[:, SLOTS - 1 :])[..., 4 : 4 + CODES]
    ).abs().max() <= 1e-4


@torch.inference_mode()
def reference_greedy(reference, condition, null, cfg_scale: float, offset: int) -> torch.Tensor:
    """Greedy AR with their model and cache, as LANTERN's Anole generate: [cond; uncond] rows, non-image ids
    masked, CFG on the logits, positions and masks as theirs. Codes (B, N)."""
    from transformers import DynamicCache

    batch, slots = condition.values.shape
    ids = torch.cat([condition.values, null])
    mask = torch.cat([condition.mask, null != 1]).long()
    cond_pos, uncond_pos = lantern_positions(condition.mask, slots)
    positions = torch.cat([cond_pos, uncond_pos])
    cache = DynamicCache(config=reference.config)
    codes = []
    for _ in range(GRID * GRID):
        hidden = reference.model(
            input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True
        )
        logits = reference.lm_head(hidden.last_hidden_state[:, -1]).float()  # (2B, V)
        logits = logits[batch:] + (logits[:batch] - logits[batch:]) * cfg_scale
        allowed = torch.zeros(logits.shape[-1], dtype=torch.bool)
        allowed[offset : offset + CODES] = True
        token = logits.masked_fill(~allowed, torch.finfo(logits.dtype).min).argmax(-1)  # (B,) vocab ids
        codes.append(token - offset)
        ids = torch.cat([token, token])[:, None]
        mask = torch.cat([mask, torch.ones(2 * batch, 1, dtype=torch.long)], dim=1)
        positions = positions[:, -1:] + 1
    return torch.stack(codes, dim=1)


@pytest.mark.parametrize("cfg_scale", [1.0, 3.0])
def test_greedy_ar_matches_a_reference_loop_over_their_model_token_for_token(pair, cfg_scale):
    reference, ours, _, _ = pair
    condition = conditioner(ours).encode(PROMPTS)
    # cfg_scale 1: no guidance, the conditional rows alone (their loop's uncond + (cond - uncond) * 1).
    expected = reference_greedy(reference, condition, ours.null_condition(len(PROMPTS)), cfg_scale, 4)
    sampling = SamplingConfig(temperature=0, cfg_scale=cfg_scale)
    codes = ARDecoder(sampling).generate(ours, condition, keys_tensor(0, range(len(PROMPTS)))).codes
    assert codes.shape == (len(PROMPTS), GRID * GRID)
    assert torch.equal(codes, expected), (codes != expected).sum().item()
    assert len(set(codes.flatten().tolist())) > 4  # not a degenerate constant image


def test_greedy_speculative_chain_equals_greedy_ar_and_captures_as_one_graph(pair):
    _, ours, _, _ = pair
    check_greedy_chain_equals_ar_in_one_graph(ours, conditioner(ours).encode(PROMPTS), 3.0)


def test_the_target_satisfies_the_protocol_and_maps_codes_to_vocabulary_ids(pair):
    _, ours, _, _ = pair
    assert isinstance(ours, Target)
    cfg = ours.config
    assert (cfg.code_offset, cfg.vocab_size, cfg.num_image_tokens, cfg.max_seq_len) == (4, CODES, 16, SLOTS + 16)
    vocab = tiny_vocabulary(CODES, TINY_WORDS)
    assert vocab[image_token_name(0)] == 4 and vocab[image_token_name(CODES - 1)] == CODES + 3
    assert (cfg.eoi_id, cfg.boi_id, cfg.eot_id) == (
        CODES + 4,
        CODES + 5,
        CODES + 6,
    )  # Anole: 8196, 8197, 8710 (by name)
    codes = torch.tensor([[0, 5, CODES - 1]])
    assert torch.equal(ours.embed_tokens(codes), ours.model.embed_tokens(codes + 4))
    assert torch.equal(ours.input_embeddings(), ours.model.embed_tokens.weight[4 : 4 + CODES])
    null = ours.null_condition(2)
    assert null[:, :-2].eq(cfg.pad_id).all() and null[:, -2:].tolist() == [[cfg.bos_id, cfg.boi_id]] * 2
    ids = conditioner(ours).ids("a cat")
    assert ids == [0, vocab["a"], vocab["cat"], cfg.eot_id, cfg.boi_id]  # [BOS] text [EOT, BOI], as LANTERN's Anole


def test_a_vocabulary_with_scattered_image_ids_or_no_special_token_is_one_error():
    vocab = tiny_vocabulary(8)
    vocab[image_token_name(3)] = 99
    with pytest.raises(CheckpointError, match="contiguous"):
        read_layout(vocab, "v")
    vocab = tiny_vocabulary(8)
    del vocab["<racm3:break>"]
    with pytest.raises(CheckpointError, match="racm3:break"):
        read_layout(vocab, "v")


def test_a_prompt_longer_than_the_condition_slots_is_one_error(pair):
    _, ours, _, _ = pair
    with pytest.raises(ConfigError, match="longer than the model's 12 condition slots"):
        conditioner(ours).check(" ".join(["cat"] * 20))


def test_folders_load_strictly_by_their_own_names(pair, tmp_path):
    reference, ours, vq, folder = pair
    own = ChameleonVQGAN(VQGANConfig(**VQ, channel_multiplier=(1, 1, 2), num_res_blocks=1)).state_dict()
    assert set(vq) == {k for k in own if not k.startswith("decoder.")}  # their VQ encoder, set aside for the tokenizer
    assert torch.equal(ours.lm_head.weight, reference.lm_head.weight)
    # A missing shard: one error naming the file.
    broken = tmp_path / "broken"
    broken.mkdir()
    for path in folder.iterdir():
        (broken / path.name).write_bytes(path.read_bytes())
    index = json.loads((broken / "model.safetensors.index.json").read_text())
    shard = sorted(set(index["weight_map"].values()))[0]
    (broken / shard).unlink()
    with pytest.raises(CheckpointError, match="not found"):
        hf.load_target(broken, GRID, SLOTS)
    # Another architecture, and a config whose sizes do not match the tensors.
    llama = tmp_path / "llama"
    transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2
    ).save_pretrained(llama)
    with pytest.raises(CheckpointError, match="not a ChameleonForConditionalGeneration"):
        hf.load_target(llama, GRID, SLOTS)
    config = json.loads((broken / "config.json").read_text())
    (broken / shard).write_bytes((folder / shard).read_bytes())
    (broken / "config.json").write_text(json.dumps({**config, "intermediate_size": 128}))
    with pytest.raises(CheckpointError, match="wrong shape"):
        hf.load_target(broken, GRID, SLOTS)


@torch.inference_mode()
def test_vqgan_encoder_equals_their_chameleonvqvae_and_decodes_codes_to_images(pair):
    reference, _, vq_state, _ = pair
    config = VQGANConfig(**VQ, channel_multiplier=(1, 1, 2), num_res_blocks=1)
    ours = ChameleonVQGAN(config).eval()
    decoder = {k: v for k, v in ours.state_dict().items() if k.startswith("decoder.")}
    ours.load_state_dict({**vq_state, **decoder}, strict=True)  # their encoder's names are the checkpoint's
    images = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(0)) * 2 - 1
    theirs = reference.model.vqmodel.encode(images, return_dict=True)
    latents = ours.quant_conv(ours.encoder(images))
    assert (latents - reference.model.vqmodel.quant_conv(theirs.last_hidden_state)).abs().max() <= 1e-5
    codes = ours.encode(images)
    assert codes.shape == (2, 4, 4) and torch.equal(codes.flatten(1), theirs.image_tokens.view(2, -1))
    pixels = ours.decode_codes(codes.flatten(1))
    assert pixels.shape == (2, 3, 16, 16) and torch.isfinite(pixels).all()


def test_vqgan_official_key_layout_at_full_size():
    """Meta's vqgan.yaml: 8192 codes of 256, 512 px -> 32 x 32; the taming VQModel names and shapes."""
    with torch.device("meta"):
        model = ChameleonVQGAN(VQGANConfig())
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert shapes["quantize.embedding.weight"] == (8192, 256)
    assert shapes["encoder.conv_in.weight"] == (128, 3, 3, 3) and shapes["encoder.conv_out.weight"] == (256, 512, 3, 3)
    assert (
        shapes["encoder.down.4.block.1.conv2.weight"] == (512, 512, 3, 3)
        and "encoder.down.4.downsample.conv.weight" not in shapes
    )
    assert shapes["decoder.conv_in.weight"] == (512, 256, 3, 3) and shapes["decoder.up.4.block.2.conv1.weight"] == (
        512,
        512,
        3,
        3,
    )
    assert (
        shapes["decoder.up.1.upsample.conv.weight"] == (128, 128, 3, 3)
        and "decoder.up.0.upsample.conv.weight" not in shapes
    )
    assert shapes["decoder.up.3.block.0.nin_shortcut.weight"] == (256, 512, 1, 1)  # channels fall going up
    assert shapes["decoder.up.1.block.0.nin_shortcut.weight"] == (128, 256, 1, 1)
    assert "decoder.up.2.block.0.nin_shortcut.weight" not in shapes and len(model.decoder.up[0].block) == 3
    assert shapes["quant_conv.weight"] == (256, 256, 1, 1) and shapes["post_quant_conv.weight"] == (256, 256, 1, 1)
    assert VQGANConfig().downsample == 16


def test_the_random_preset_target_is_seeded():
    from lantern.models.chameleon.bundle import random_config

    config, _ = random_config(
        {
            "image_size": 16,
            "cls_token_num": 8,
            "n_layer": 1,
            "n_head": 2,
            "dim": 32,
            "ffn_hidden": 64,
            "num_codes": CODES,
        },
        VQGANConfig(**VQ, channel_multiplier=(1, 1, 2), num_res_blocks=1),
    )
    one, two = random_prompted_target(ChameleonTarget, config, 0), random_prompted_target(ChameleonTarget, config, 0)
    assert all(torch.equal(a, b) for a, b in zip(one.state_dict().values(), two.state_dict().values(), strict=True))
    mask = prefix_causal_mask(torch.ones(1, 8, dtype=torch.bool), 8)
    assert mask.shape == (1, 1, 8, 8)
