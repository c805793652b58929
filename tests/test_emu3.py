"""Emu3 against transformers' ``Emu3ForConditionalGeneration`` on tiny random ``save_pretrained`` folders: our
tiny_random_emu3 preset loads the folder (target, VQ, visual-token id map), its teacher-forced logits on the full
stream (EOL after each row) with BAAI's prompt template, negative prompt and left padding match theirs, greedy AR
writes the tokens of their ``generate()`` with BAAI's logits processors (unbatched CFG over the negative prompt,
the prefix-constrained image syntax), and the VQ decodes as their ``decode_image_tokens``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from family_helpers import check_greedy_chain_equals_ar_in_one_graph
from helpers_emu3 import CODES, GRID, PIXELS, PROMPTS, SLOTS, STREAM, TARGET, VQ, hf_model, save_folder

from lantern.decoding.ar import ARDecoder
from lantern.errors import CheckpointError
from lantern.models.emu3 import bundle, hf
from lantern.models.emu3.condition import NEGATIVE, POSITIVE
from lantern.models.emu3.model import Emu3Target
from lantern.models.emu3.reference_ar import image_syntax
from lantern.models.emu3.vocab import visual_token_name
from lantern.models.sampling import SamplingConfig
from lantern.models.target import Target
from lantern.rng import keys_tensor

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def emu3(tmp_path_factory):
    """(their Emu3ForConditionalGeneration, our bundle loaded from its save_pretrained folder as run.py's
    tiny_random_emu3 with model.gpt_ckpt=FOLDER loads it, the folder)."""
    reference = hf_model()
    folder = save_folder(reference, tmp_path_factory.mktemp("emu3") / "hf")
    return reference, bundle.random_bundle("tiny_random_emu3", TARGET, VQ, gpt_ckpt=str(folder)), folder


def output_index(n: torch.Tensor) -> torch.Tensor:
    """Where in their stream (condition, then rows each followed by EOL) the output predicting code ``n`` sits."""
    m = n - 1
    index = SLOTS + m + m // GRID + ((m + 1) % GRID == 0).long()
    return torch.where(n == 0, torch.full_like(n, SLOTS - 1), index)


@torch.inference_mode()
def test_teacher_forced_logits_match_emu3forconditionalgeneration_with_cfg_and_padding(emu3):
    """Emu3ForConditionalGeneration's logits at every image position (EOL outputs at row ends), both CFG halves."""
    reference, model_bundle, _ = emu3
    ours = model_bundle.target
    condition = model_bundle.conditioner.encode(PROMPTS)
    assert not condition.mask.all()
    batch = len(PROMPTS)
    codes = torch.randint(0, CODES, (batch, GRID * GRID), generator=torch.Generator().manual_seed(1))
    values = torch.cat([condition.values, ours.null_condition(batch)])
    mask = torch.cat([condition.mask, ours.null_condition_mask(condition.mask)])
    hidden = ours.teacher_hidden(ours.embed_condition(values), torch.cat([codes, codes]), mask)
    logits = ours.head(hidden[:, SLOTS - 1 :])  # (2B, N, K): row n predicts code n
    ids = torch.cat([values, ours.image_stream(torch.cat([codes, codes]))[:, :-3]], dim=1)
    attention = torch.cat([mask, torch.ones(2 * batch, ids.shape[1] - SLOTS, dtype=torch.bool)], dim=1).long()
    positions = (attention.cumsum(1) - 1).clamp_min(0)  # as their generate() numbers a left-padded row
    states = reference.model(input_ids=ids, attention_mask=attention, position_ids=positions).last_hidden_state
    theirs = reference.lm_head(states[:, output_index(torch.arange(GRID * GRID))]).float()  # (2B, N, V)
    offset = ours.config.code_offset
    expected = theirs[..., offset : offset + CODES]
    diff = (logits - expected).abs().max().item()
    assert diff <= 1e-4, diff
    guided = lambda x: x[batch:] + (x[:batch] - x[batch:]) * 3.0  # noqa: E731
    guided_diff = (guided(logits) - guided(expected)).abs().max().item()
    assert guided_diff <= 1e-4, guided_diff
    assert (ours.vocab_logits(hidden[:, SLOTS - 1 :]) - theirs).abs().max().item() <= 1e-4
    print(f"teacher-forced max |diff|: {diff:.2e}, with CFG 3: {guided_diff:.2e}")


@pytest.mark.parametrize("cfg_scale", [1.0, 3.0])
def test_greedy_ar_equals_emu3forconditionalgeneration_generate_with_baai_processors(emu3, cfg_scale):
    """Emu3ForConditionalGeneration.generate with UnbatchedClassifierFreeGuidanceLogitsProcessor over the negative
    prompt and PrefixConstrainedLogitsProcessor (BAAI's image_generation.py), greedy: the same stream as ours."""
    reference, model_bundle, _ = emu3
    ours = model_bundle.target
    condition = model_bundle.conditioner.encode(PROMPTS)
    codes = (
        ARDecoder(SamplingConfig(temperature=0, cfg_scale=cfg_scale))
        .generate(ours, condition, keys_tensor(0, range(len(PROMPTS))))
        .codes
    )
    negative = torch.tensor([ours.config.null_ids])
    for row, prompt in enumerate(PROMPTS):
        ids = torch.tensor([model_bundle.conditioner.ids(prompt)])
        processors = [transformers.PrefixConstrainedLogitsProcessor(image_syntax(ids.shape[1], ours.config), 1)]
        if cfg_scale != 1.0:
            cfg = transformers.UnbatchedClassifierFreeGuidanceLogitsProcessor(
                cfg_scale, reference, unconditional_ids=negative
            )
            processors.insert(0, cfg)
        settings = dict(do_sample=False, max_new_tokens=STREAM, eos_token_id=None, attention_mask=torch.ones_like(ids))
        with torch.inference_mode():
            out = reference.generate(ids, logits_processor=transformers.LogitsProcessorList(processors), **settings)
        theirs = out[0, ids.shape[1] :]
        assert theirs.shape == (STREAM,)
        mine = ours.image_stream(codes[row : row + 1])[0]
        assert torch.equal(theirs, mine), (theirs != mine).nonzero()[:5].flatten().tolist()
    assert len(set(codes.flatten().tolist())) > 8  # not a degenerate constant image


def test_visual_token_id_map_is_emu3forconditionalgenerations(emu3):
    """Code c <-> vocabulary id: as Emu3ForConditionalGeneration's vocabulary_mapping (img2bpe / bpe2img)."""
    reference, model_bundle, _ = emu3
    cfg = model_bundle.target.config
    mapping = reference.vocabulary_mapping
    assert all(mapping.img2bpe[c] == cfg.code_offset + c for c in range(CODES))
    assert all(mapping.bpe2img[cfg.code_offset + c] == c for c in range(CODES))
    assert mapping.eol_token_id == cfg.eol_id
    codes = torch.randint(0, CODES, (2, GRID * GRID), generator=torch.Generator().manual_seed(3))
    stream = model_bundle.target.image_stream(codes)[:, :-3].view(2, GRID, GRID + 1)
    assert torch.equal(mapping.convert_bpe2img(stream).long().flatten(1), codes)


@torch.inference_mode()
def test_vq_decode_equals_emu3forconditionalgenerations_decode_image_tokens(emu3):
    """Our bundle's VQ (loaded from the folder's model.vqmodel.*) decodes as Emu3ForConditionalGeneration does."""
    reference, model_bundle, _ = emu3
    codes = torch.randint(0, CODES, (2, GRID * GRID), generator=torch.Generator().manual_seed(4))
    stream = model_bundle.target.image_stream(codes)
    theirs = reference.model.decode_image_tokens(stream, height=GRID, width=GRID)
    ours = model_bundle.vq.decode_codes(codes)
    assert ours.shape == (2, 3, PIXELS, PIXELS)
    assert torch.equal(ours, theirs)
    assert torch.equal(model_bundle.codebook(), reference.model.vqmodel.quantize.embedding.weight)


def released_postprocess(images: torch.Tensor) -> np.ndarray:
    """transformers' Emu3ImageProcessor.postprocess with the released preprocessor config (BAAI/Emu3-Gen-hf,
    BAAI/Emu3-VisionTokenizer: mean = std = 0.5, rescale_factor 1/255), as their generation example calls it."""
    processor = transformers.Emu3ImageProcessor(
        image_mean=[0.5] * 3, image_std=[0.5] * 3, rescale_factor=0.00392156862745098
    )
    made = processor.postprocess(list(images.float()), return_tensors="PIL.Image.Image")["pixel_values"]
    return np.stack([np.asarray(image) for image in made])  # (B, H, W, 3) uint8


def test_pixels_equal_the_released_postprocess_on_random_values():
    from lantern.models.bundle import to_uint8

    generator = torch.Generator().manual_seed(0)
    images = torch.rand(4, 3, 16, 16, generator=generator) * 2.6 - 1.3  # (B, 3, H, W), past [-1, 1] both ways
    images[0, 0, 0, :4] = torch.tensor([-1.0, 1.0, 0.0, -1 / 255])  # the ends, the middle, a level's edge
    theirs = released_postprocess(images)
    assert theirs.shape == (4, 16, 16, 3) and theirs.dtype == np.uint8
    assert np.array_equal(bundle.release_pixels(images).numpy(), theirs)
    unsaturated = (images.abs() < 1).permute(0, 2, 3, 1).numpy()
    off = (to_uint8(images).numpy().astype(int) - theirs)[unsaturated]  # LlamaGen's rounding: one level above
    assert set(np.unique(off)) <= {0, 1} and 0.3 < off.mean() < 0.7, off.mean()


@torch.inference_mode()
def test_the_bundles_pngs_are_the_released_postprocess_of_their_decode(emu3):
    reference, model_bundle, _ = emu3
    codes = torch.randint(0, CODES, (2, GRID * GRID), generator=torch.Generator().manual_seed(5))
    decoded = reference.model.decode_image_tokens(model_bundle.target.image_stream(codes), height=GRID, width=GRID)
    assert np.array_equal(model_bundle.decode_images(codes).numpy(), released_postprocess(decoded))


def test_prompts_follow_baais_template_and_the_negative_prompt_is_cfgs_context(emu3):
    """BOS caption+POSITIVE BOI "8*8" <|image token|>, left-padded; CFG's rows hold NEGATIVE in the template (the
    unconditional_ids Emu3ForConditionalGeneration's CFG processor is given)."""
    _, model_bundle, _ = emu3
    cfg, conditioner = model_bundle.target.config, model_bundle.conditioner
    tokenizer = conditioner.tokenizer
    ids = conditioner.ids("a cat")
    header = tokenizer.encode("8*8", add_special_tokens=False).ids
    assert len(header) == 3
    text = tokenizer.encode("a cat" + POSITIVE, add_special_tokens=False).ids
    assert ids == [cfg.bos_id, *text, cfg.boi_id, *header, cfg.img_id]
    assert list(cfg.null_ids) == [cfg.bos_id, *tokenizer.encode(NEGATIVE).ids, cfg.boi_id, *header, cfg.img_id]
    condition = conditioner.encode(["a cat"])
    assert condition.values[0, -len(ids) :].tolist() == ids and int(condition.mask.sum()) == len(ids)
    null = model_bundle.target.null_condition(1)
    assert null[0, -len(cfg.null_ids) :].tolist() == list(cfg.null_ids)
    assert int(model_bundle.target.null_condition_mask(condition.mask).sum()) == len(cfg.null_ids)


def test_the_target_satisfies_the_protocol_and_loads_emu3forconditionalgeneration_by_name(emu3):
    """Every tensor of Emu3ForConditionalGeneration's text model and lm_head is ours under its own name."""
    reference, model_bundle, _ = emu3
    ours = model_bundle.target
    assert isinstance(ours, Target) and isinstance(ours, Emu3Target)
    theirs = {k: v for k, v in reference.state_dict().items() if not k.startswith("model.vqmodel.")}
    mine = ours.state_dict()
    assert set(mine) == set(theirs)
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)
    assert ours.config.n_kv_head == 2 and ours.config.vocab_size == CODES


def test_a_folder_of_another_architecture_is_refused_before_loading(emu3, tmp_path):
    """An Emu3ForConditionalGeneration folder whose config.json says another model_type is refused by name."""
    import json
    import shutil

    _, _, folder = emu3
    other = tmp_path / "other"
    shutil.copytree(folder, other)
    config = json.loads((other / "config.json").read_text())
    config["model_type"] = "chameleon"
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="not an Emu3ForConditionalGeneration"):
        bundle.random_bundle("tiny_random_emu3", TARGET, VQ, gpt_ckpt=str(other))


def test_a_folder_of_other_sizes_is_not_the_random_preset(tmp_path):
    """An Emu3ForConditionalGeneration folder with 4 key/value heads is not tiny_random_emu3's architecture (2)."""
    folder = save_folder(hf_model(kv_heads=4), tmp_path / "hf")
    with pytest.raises(CheckpointError, match="not the random preset's architecture"):
        bundle.random_bundle("tiny_random_emu3", TARGET, VQ, gpt_ckpt=str(folder))


def test_the_visual_tokens_must_be_contiguous(tmp_path):
    """A vocabulary_map (as Emu3ForConditionalGeneration's config holds) with a gap in its visual ids is refused."""
    from lantern.models.emu3.vocab import read_layout, tiny_vocabulary

    vocab = tiny_vocabulary(16)
    vocab[visual_token_name(5)] = len(vocab) + 7
    with pytest.raises(CheckpointError, match="contiguous"):
        read_layout(vocab, "x")
    del vocab["<|extra_200|>"]
    vocab[visual_token_name(5)] = vocab[visual_token_name(4)] + 1
    with pytest.raises(CheckpointError, match="extra_200"):
        read_layout(vocab, "x")
    assert hf.VQ_PREFIX == "model.vqmodel."


def test_greedy_speculative_chain_equals_greedy_ar_with_baais_longer_negative_prompt(emu3):
    """CFG's negative prompt is longer than the prompts (Emu3ForConditionalGeneration's CFG context): a compiled
    chain-3 speculative decoder, whose later steps mask both halves by the conditional row, writes AR's codes."""
    _, model_bundle, _ = emu3
    condition = model_bundle.conditioner.encode(PROMPTS[:2])
    assert len(model_bundle.target.config.null_ids) > int(condition.mask.sum(1).max())
    check_greedy_chain_equals_ar_in_one_graph(model_bundle.target, condition, 3.0)
