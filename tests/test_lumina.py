"""Lumina-mGPT against transformers' ChameleonForConditionalGeneration on a tiny random folder of the
tiny_random_lumina architecture (save_pretrained, its vocabulary holding Lumina's special tokens): teacher-forced
logits on the full interleaved stream (EOL after each row) with CFG's context and left padding, greedy AR
against their generate() with Lumina's logits processors (image ids only, EOL forced after each row, EOI at
the end, CFG with the unconditional context in a cache of its own), the compiled step as one graph, the cache
that moves companions."""

from __future__ import annotations

import pytest
import torch
from family_helpers import REPO, check_greedy_chain_equals_ar_in_one_graph
from helpers_chameleon import save_folder
from helpers_lumina import CODES, GRID, PIXELS, PROMPTS, SLOTS, STREAM, TARGET, VQ, hf_model, lumina_vocabulary

from lantern.decoding.ar import ARDecoder
from lantern.models.chameleon import hf
from lantern.models.chameleon.lumina import LuminaTarget, size_token
from lantern.models.chameleon.lumina_bundle import converter, random_bundle
from lantern.models.chameleon.reference_ar import LuminaCFGProcessor, LuminaImageProcessor
from lantern.models.row_ends import RowEndCache
from lantern.models.sampling import SamplingConfig
from lantern.models.target import Target
from lantern.rng import keys_tensor

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def lumina(tmp_path_factory):
    """(their model, our bundle loaded from its save_pretrained folder as run.py's tiny_random_lumina with
    model.gpt_ckpt=FOLDER loads it, the folder)."""
    reference = hf_model()
    folder = save_folder(reference, tmp_path_factory.mktemp("lumina") / "hf", shard="200KB")
    # transformers' class masks every image id in its logits (text chat); Lumina's own copy of it does so only
    # under mask_image_logits, false in the released config.json. Their generate() then samples images as Lumina's.
    reference.model.vocabulary_mapping.image_tokens = []
    bundle = random_bundle("tiny_random_lumina", TARGET, VQ, gpt_ckpt=str(folder))
    return reference, bundle, folder


def output_index(n: torch.Tensor) -> torch.Tensor:
    """Where in their interleaved sequence (condition, then rows each followed by EOL) the output predicting
    code ``n`` sits: the last condition slot for code 0, else code n-1's slot, or its EOL's when it ends a row."""
    m = n - 1
    index = SLOTS + m + m // GRID + ((m + 1) % GRID == 0).long()
    return torch.where(n == 0, torch.full_like(n, SLOTS - 1), index)


@torch.inference_mode()
def test_teacher_forced_logits_match_chameleonforconditionalgeneration_on_the_interleaved_stream(lumina):
    reference, bundle, _ = lumina
    ours = bundle.target
    condition = bundle.conditioner.encode(PROMPTS)  # left-padded, three lengths
    assert not condition.mask.all() and condition.mask[:, -3:].all()
    batch = len(PROMPTS)
    codes = torch.randint(0, CODES, (batch, GRID * GRID), generator=torch.Generator().manual_seed(1))
    null = ours.null_condition(batch)
    values = torch.cat([condition.values, null])
    mask = torch.cat([condition.mask, ours.null_condition_mask(condition.mask)])
    hidden = ours.teacher_hidden(ours.embed_condition(values), torch.cat([codes, codes]), mask)
    logits = ours.head(hidden[:, SLOTS - 1 :])  # (2B, N, K): row n predicts code n
    # Theirs: the whole stream, EOLs and EOI in it; the unconditional rows see only [BOI, H, W] onwards, at
    # positions from 0 as their CFG processor's own context.
    stream = ours.image_stream(torch.cat([codes, codes]))  # (2B, STREAM)
    ids = torch.cat([values, stream], dim=1)
    length = ids.shape[1]
    cond_pos = torch.arange(length)[None].expand(batch, -1)
    uncond_pos = (cond_pos - (SLOTS - 3)).clamp_min(0)
    attention = torch.cat([mask, torch.ones(2 * batch, STREAM, dtype=torch.bool)], dim=1).long()
    states = reference.model(
        input_ids=ids, attention_mask=attention, position_ids=torch.cat([cond_pos, uncond_pos])
    ).last_hidden_state
    index = output_index(torch.arange(GRID * GRID))
    offset = ours.config.code_offset
    theirs = reference.lm_head(states[:, index]).float()  # (2B, N, V)
    expected = theirs[..., offset : offset + CODES]
    diff = (logits - expected).abs().max().item()
    assert diff <= 1e-4, diff
    guided = lambda x: x[batch:] + (x[:batch] - x[batch:]) * 4.0  # noqa: E731 - their CFG processor's formula
    guided_diff = (guided(logits) - guided(expected)).abs().max().item()
    assert guided_diff <= 1e-4, guided_diff
    # The whole vocabulary too, and EOL is what the reference model itself would put after each row.
    full = ours.vocab_logits(hidden[:batch, SLOTS - 1 :])
    assert (full - theirs[:batch]).abs().max().item() <= 1e-4
    print(f"teacher-forced max |diff|: {diff:.2e}, with CFG 4: {guided_diff:.2e}")


@pytest.mark.parametrize("cfg_scale", [1.0, 4.0])
def test_greedy_ar_equals_their_generate_with_lumina_logits_processors_token_for_token(lumina, cfg_scale):
    reference, bundle, _ = lumina
    ours = bundle.target
    condition = bundle.conditioner.encode(PROMPTS)
    sampling = SamplingConfig(temperature=0, cfg_scale=cfg_scale)
    codes = ARDecoder(sampling).generate(ours, condition, keys_tensor(0, range(len(PROMPTS)))).codes
    equal = 0
    for row, prompt in enumerate(PROMPTS):
        ids = torch.tensor([bundle.conditioner.ids(prompt)])  # unpadded, as theirs: [BOS] question [EOT, BOI, H, W]
        processors = [LuminaImageProcessor(ids.shape[1], ours.config)]
        if cfg_scale != 1.0:
            processors.insert(0, LuminaCFGProcessor(reference, cfg_scale, ids.shape[1] - 3))
        with torch.inference_mode():
            out = reference.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=STREAM,
                logits_processor=transformers.LogitsProcessorList(processors),
                eos_token_id=None,
            )
        theirs = out[0, ids.shape[1] :]
        assert theirs.shape == (STREAM,)
        mine = ours.image_stream(codes[row : row + 1])[0]
        equal += int((theirs == mine).sum())
        assert torch.equal(theirs, mine), (theirs != mine).nonzero()[:5].flatten().tolist()
    assert len(set(codes.flatten().tolist())) > 8  # not a degenerate constant image
    print(f"cfg {cfg_scale}: {equal} of {len(PROMPTS) * STREAM} tokens equal")


def test_greedy_speculative_chain_equals_greedy_ar_and_captures_as_one_graph(lumina):
    _, bundle, _ = lumina
    check_greedy_chain_equals_ar_in_one_graph(bundle.target, bundle.conditioner.encode(PROMPTS[:2]), 4.0)


def test_the_target_satisfies_the_protocol_and_finds_lumina_ids_by_name(lumina):
    _, bundle, folder = lumina
    ours, vocab = bundle.target, lumina_vocabulary()
    assert isinstance(ours, Target) and isinstance(ours, LuminaTarget)
    cfg = ours.config
    assert (cfg.vocab_size, cfg.num_image_tokens, cfg.max_seq_len, cfg.code_offset) == (CODES, 64, SLOTS + 64, 4)
    assert cfg.eol_id == vocab["<reserved08799>"] and cfg.size_id == vocab[size_token(GRID // 2)]
    assert (cfg.bos_id, cfg.boi_id, cfg.eoi_id) == (vocab["<s>"], vocab["<racm3:break>"], vocab["<eoss>"])
    assert cfg.bos_id == 0  # the tokenizer's <s>, not the folder's bos_token_id (1 = <pad>, as Lumina's config.json)
    assert size_token(24) == "<reserved08824>" and size_token(16) == "<reserved08816>"  # 768 / 512 px: ids 8828 / 8820
    null = ours.null_condition(2)
    assert null[:, -3:].tolist() == [[cfg.boi_id, cfg.size_id, cfg.size_id]] * 2 and null[:, :-3].eq(cfg.pad_id).all()
    ids = bundle.conditioner.ids("a cat")
    words = "Generate an image of 32x32 according to the following prompt : a cat".split()
    assert ids == [0, *(vocab[w] for w in words), cfg.eot_id, cfg.boi_id, cfg.size_id, cfg.size_id]
    stream = ours.image_stream(torch.arange(64)[None] % CODES)[0]
    assert stream.shape == (STREAM,) and stream[GRID] == cfg.eol_id and stream[-2:].tolist() == [cfg.eol_id, cfg.eoi_id]
    # The physical layout: code n at T + n + n // grid, its companion one further; row ends by position.
    positions = torch.tensor([0, SLOTS - 1, SLOTS, SLOTS + GRID - 1, SLOTS + GRID, SLOTS + 63])
    assert ours.physical_positions(positions).tolist() == [0, SLOTS - 1, SLOTS, SLOTS + 7, SLOTS + 9, SLOTS + 70]
    assert ours.row_end(positions).tolist() == [False, False, False, True, False, True]
    loaded, _ = hf.load_target(folder, GRID, SLOTS, converter(PIXELS), LuminaTarget)
    assert loaded.config == cfg


def make_cache(batch=2, slots=6) -> RowEndCache:
    cache = RowEndCache.allocate(2, batch, 1, slots, 2, torch.float32, "cpu")
    for index, tensor in enumerate(cache.keys + cache.values):
        tensor.copy_(torch.arange(tensor.numel(), dtype=torch.float32).view_as(tensor) + 1000 * index)
    cache.live.copy_(torch.tensor([[False, True, False, False, True, False], [True, False, True, False, False, True]]))
    return cache


@pytest.mark.parametrize("compiled", [False, True])
def test_the_cache_move_carries_each_slot_with_its_companion_and_live_flag(compiled):
    cache, before = make_cache(), make_cache()
    assert cache.max_len == 6 and cache.keys[0].shape[2] == 12
    src, dst = torch.tensor([[3, 4], [2, 5]]), torch.tensor([[1, 2], [1, 2]])
    move = torch.compile(cache.move, fullgraph=True, backend="aot_eager") if compiled else cache.move
    move(src, dst)
    for after, old in zip(cache.keys + cache.values, before.keys + before.values, strict=True):
        for row in range(2):
            for s, d in zip(src[row].tolist(), dst[row].tolist(), strict=True):
                assert torch.equal(after[row, :, 2 * d], old[row, :, 2 * s])
                assert torch.equal(after[row, :, 2 * d + 1], old[row, :, 2 * s + 1])  # the companion moves along
            assert torch.equal(after[row, :, :2], old[row, :, :2])  # logical slot 0 untouched
    assert cache.live.tolist() == [[False, False, True, False, True, False], [True, True, True, False, False, True]]


def test_the_presets_compose_with_the_references_defaults():
    from omegaconf import OmegaConf

    for px, units in ((768, 24), (512, 16)):
        node = OmegaConf.load(REPO / f"conf/model/lumina_mgpt_7b_{px}.yaml")
        assert node.recommended.cfg_scale == 4.0 and node.recommended.top_k == 2000
        assert node.bundle.target.image_size == px and node.bundle.vq.resolution == px
        assert f"<reserved0{8800 + units}>" in (REPO / f"conf/model/lumina_mgpt_7b_{px}.yaml").read_text()
    assert OmegaConf.load(REPO / "conf/model/tiny_random_lumina.yaml").recommended.cfg_scale == 4.0


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny_random_lumina preset's bundle, drafter and codebook neighbours, and its prompts."""
    from types import SimpleNamespace

    from family_helpers import tiny_preset

    from lantern.models.chameleon import bundle as chameleon
    from lantern.models.chameleon import lumina_bundle

    family = SimpleNamespace(
        random_bundle=lumina_bundle.random_bundle,
        random_drafter=lumina_bundle.random_drafter,
        random_codebook=chameleon.random_codebook,
    )
    return tiny_preset("tiny_random_lumina", family, tmp_path_factory.mktemp("neighbours"))


def test_sampled_exact_eagle_keeps_the_lumina_targets_law_and_lantern_far_off_does_not(tiny):
    """Randomised PIT of sampled codes against the teacher-forced law of the interleaved stream (KS test)."""
    import math

    from helpers import FAIL, PASS, SAMPLING, ks_pvalue

    from lantern.decoding.tree.decoder import SpeculativeDecoder
    from lantern.decoding.tree.draft import chain
    from lantern.rules.exact import ExactSampled
    from lantern.rules.factory import lantern

    _, drafter, neighbours, _ = tiny
    for decoder in (
        ARDecoder(SAMPLING),
        SpeculativeDecoder(SAMPLING, drafter=drafter, draft=chain(3, "sampled"), acceptance=ExactSampled()),
    ):
        p = ks_pvalue(tiny, decoder)
        assert p > PASS, f"{type(decoder).__name__}: KS p = {p:.2e}"
        print(f"{type(decoder).__name__}: KS p = {p:.3f}")
    bad = ks_pvalue(
        tiny,
        SpeculativeDecoder(
            SAMPLING, drafter=drafter, draft=chain(3, "sampled"), acceptance=lantern(1000, 0.4, neighbours)
        ),
    )
    assert bad < FAIL and not math.isnan(bad), f"LANTERN delta=0.4 passed as lossless: KS p = {bad:.2e}"
    print(f"LANTERN delta 0.4: KS p = {bad:.2e}")
