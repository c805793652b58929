"""The Janus family against transformers' JanusForConditionalGeneration on tiny random folders made with
save_pretrained: teacher-forced generation logits with CFG (each prompt's conditional and unconditional rows in
one batch of theirs, three prompts of different lengths in one batch of ours), greedy AR token for token against
a loop over their model written as DeepSeek's generation_inference.py, strict folder loading, the compiled steps
as one graph, and the VQ decode against JanusVQVAE.decode."""

from __future__ import annotations

import json

import pytest
import torch
from family_helpers import check_greedy_chain_equals_ar_in_one_graph
from helpers_janus import CFG, CODES, GRID, PROMPTS, SLOTS, hf_model, load, save_folder

from lantern.decoding.ar import ARDecoder
from lantern.errors import CheckpointError, ConfigError
from lantern.models.janus import hf
from lantern.models.janus.bundle import JanusBundle, folder_codebook
from lantern.models.janus.condition import JanusConditioner, tiny_vocabulary, word_tokenizer
from lantern.models.janus.model import JanusTarget
from lantern.models.janus.vq import load_vq, theirs, vq_config
from lantern.models.sampling import SamplingConfig
from lantern.models.target import Target
from lantern.rng import keys_tensor

transformers = pytest.importorskip("transformers")
from transformers import JanusVQVAE, JanusVQVAEConfig  # noqa: E402


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(HF model, our target loaded from its sharded save_pretrained folder, the VQ tensors, the folder)."""
    reference = hf_model()
    folder = save_folder(reference, tmp_path_factory.mktemp("janus") / "hf", shard="100KB")
    assert (folder / "model.safetensors.index.json").is_file()
    ours, vq = load(folder)
    return reference, ours.eval(), vq, folder


def conditioner(target: JanusTarget) -> JanusConditioner:
    return JanusConditioner.for_model(word_tokenizer(tiny_vocabulary()), target.config)


def reference_rows(ids: list[int], pad_id: int) -> torch.Tensor:
    """generation_inference.py's pair for one prompt: the ids, and the same with ids[1:-1] set to the pad id."""
    tokens = torch.tensor([ids, ids])
    tokens[1, 1:-1] = pad_id
    return tokens


@torch.inference_mode()
def test_teacher_forced_generation_logits_match_januses_with_cfg(pair):
    reference, ours, _, _ = pair
    cond = conditioner(ours)
    condition = cond.encode(PROMPTS)  # three lengths in one batch
    assert not condition.mask.all() and condition.mask[:, 0].all() and condition.mask[:, -1].all()
    codes = torch.randint(0, CODES, (len(PROMPTS), GRID * GRID), generator=torch.Generator().manual_seed(1))
    null = ours.null_condition(len(PROMPTS))
    # Ours as every decoder calls it: [cond; uncond] rows, the conditional mask on both halves.
    values, mask = torch.cat([condition.values, null]), torch.cat([condition.mask, condition.mask])
    hidden = ours.teacher_hidden(ours.embed_condition(values), torch.cat([codes, codes]), mask)
    logits = ours.head(hidden[:, SLOTS - 1 :])  # (2B, N, K): row n predicts code n
    worst = worst_guided = 0.0
    for row, prompt in enumerate(PROMPTS):  # theirs: each prompt's [cond, uncond] pair in one batch, unpadded
        ids = cond.ids(prompt)
        tokens = reference_rows(ids, ours.config.pad_id)
        image = reference.prepare_embeddings_for_image_generation(codes[row, :-1].repeat(2, 1))  # (2, N-1, D)
        embeds = torch.cat([reference.get_input_embeddings()(tokens), image], dim=1)
        states = reference.model.language_model(inputs_embeds=embeds).last_hidden_state
        expected = reference.model.generation_head(states[:, len(ids) - 1 :]).float()  # (2, N, K)
        mine = torch.stack([logits[row], logits[len(PROMPTS) + row]])
        worst = max(worst, (mine - expected).abs().max().item())
        guided = lambda x: x[1] + CFG * (x[0] - x[1])  # noqa: E731 - generation_inference.py's CFG
        worst_guided = max(worst_guided, (guided(mine) - guided(expected)).abs().max().item())
    assert worst <= 1e-4 and worst_guided <= 1e-4, (worst, worst_guided)
    print(f"teacher-forced max |diff|: logits {worst:.2e}, CFG logits {worst_guided:.2e}")


@torch.inference_mode()
def reference_greedy(reference, ids: list[int], pad_id: int, cfg_weight: float) -> torch.Tensor:
    """Greedy generation_inference.py over their model and cache (argmax for multinomial). Codes (N,)."""
    from transformers import DynamicCache

    embeds = reference.get_input_embeddings()(reference_rows(ids, pad_id))
    cache = DynamicCache(config=reference.config.text_config)
    codes = []
    for _ in range(GRID * GRID):
        out = reference.model.language_model(inputs_embeds=embeds, cache=cache, use_cache=True)
        logits = reference.model.generation_head(out.last_hidden_state[:, -1, :])
        logits = logits[1] + cfg_weight * (logits[0] - logits[1])
        token = logits.argmax(-1)
        codes.append(token)
        embeds = reference.prepare_embeddings_for_image_generation(torch.stack([token, token]))[:, None]
    return torch.stack(codes)


def test_greedy_ar_matches_generation_inference_token_for_token(pair):
    reference, ours, _, _ = pair
    cond = conditioner(ours)
    condition = cond.encode(PROMPTS)
    expected = torch.stack([reference_greedy(reference, cond.ids(p), ours.config.pad_id, CFG) for p in PROMPTS])
    sampling = SamplingConfig(temperature=0, cfg_scale=CFG)
    codes = ARDecoder(sampling).generate(ours, condition, keys_tensor(0, range(len(PROMPTS)))).codes
    assert codes.shape == (len(PROMPTS), GRID * GRID)
    equal = (codes == expected).sum().item()
    print(f"greedy AR: {equal} of {codes.numel()} tokens equal to the reference loop")
    assert torch.equal(codes, expected), (codes != expected).sum().item()
    assert all(len(set(row.tolist())) > 2 for row in codes)  # not a degenerate constant image


def test_greedy_speculative_chain_equals_greedy_ar_and_captures_as_one_graph(pair):
    _, ours, _, _ = pair
    check_greedy_chain_equals_ar_in_one_graph(ours, conditioner(ours).encode(PROMPTS), CFG)


def test_the_target_satisfies_the_protocol_and_lays_out_the_reference_rows(pair):
    reference, ours, _, _ = pair
    assert isinstance(ours, Target)
    cfg = ours.config
    assert (cfg.vocab_size, cfg.num_image_tokens, cfg.max_seq_len, cfg.n_kv_head) == (CODES, 16, SLOTS + 16, 2)
    vocab = tiny_vocabulary()
    cond = conditioner(ours)
    ids = cond.ids("a cat")  # BOS, then "<|User|>: a cat\n\n<|Assistant|>:<begin_of_image>"
    assert ids == [cfg.bos_id, vocab["<|User|>"], vocab[":"], vocab["a"], vocab["cat"], vocab["<|Assistant|>"]] + [
        vocab[":"],
        cfg.boi_id,
    ]
    condition = cond.encode(["a cat"])
    null = ours.null_condition(1)
    # Under the prompt's mask the null row is generation_inference.py's [BOS, pad x (L-2), BOI].
    assert null[condition.mask].tolist() == reference_rows(ids, cfg.pad_id)[1].tolist()
    assert condition.values[condition.mask].tolist() == ids
    codes = torch.tensor([[0, 5, CODES - 1]])
    with torch.inference_mode():
        assert torch.allclose(ours.embed_tokens(codes), reference.prepare_embeddings_for_image_generation(codes))
    assert torch.equal(ours.input_embeddings(), reference.model.generation_embeddings.weight)


def test_a_prompt_longer_than_the_condition_slots_is_one_error(pair):
    _, ours, _, _ = pair
    with pytest.raises(ConfigError, match="longer than the model's 24 condition slots"):
        conditioner(ours).check(" ".join(["cat"] * 30))


def test_folders_load_strictly_by_their_own_names(pair, tmp_path):
    reference, ours, vq, folder = pair
    assert torch.equal(
        ours.model.generation_head.vision_head.weight, reference.model.generation_head.vision_head.weight
    )
    assert set(vq) == {k[len(hf.VQ_PREFIX) :] for k in reference.state_dict() if k.startswith(hf.VQ_PREFIX)}
    # LANTERN's neighbour tables read the codebook alone, from the shard the index names.
    assert torch.equal(folder_codebook(folder), reference.model.vqmodel.quantize.embedding.weight)
    broken = tmp_path / "broken"
    broken.mkdir()
    for path in folder.iterdir():
        (broken / path.name).write_bytes(path.read_bytes())
    index = json.loads((broken / "model.safetensors.index.json").read_text())
    shard = sorted(set(index["weight_map"].values()))[0]
    (broken / shard).unlink()
    with pytest.raises(CheckpointError, match=f"shard {shard!r}"):
        load(broken)
    llama = tmp_path / "llama"
    transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2
    ).save_pretrained(llama)
    with pytest.raises(CheckpointError, match="not a JanusForConditionalGeneration"):
        load(llama)
    (broken / shard).write_bytes((folder / shard).read_bytes())
    config = json.loads((broken / "config.json").read_text())
    config["text_config"]["intermediate_size"] = 128
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="wrong shape"):
        load(broken)


@torch.inference_mode()
def test_vq_decode_equals_their_janusvqvae_decode(pair):
    reference, ours, vq_state, folder = pair
    vq = load_vq(vq_state, vq_config(hf.vq_section(folder)), "folder").eval()
    codes = torch.randint(0, CODES, (2, GRID * GRID), generator=torch.Generator().manual_seed(3))
    theirs_images = reference.model.vqmodel.decode(codes)
    mine = vq.decode_codes(codes)
    assert mine.shape == (2, 3, GRID * 4, GRID * 4)
    diff = (mine - theirs_images).abs().max().item()
    print(f"VQ decode max |diff|: {diff:.2e}")
    assert diff <= 1e-5
    # Pixels as generation_inference.py: clip((x + 1) / 2 * 255, 0, 255) truncated.
    bundle = JanusBundle("t", ours, vq, None, torch.device("cpu"))
    expected = ((theirs_images.permute(0, 2, 3, 1).numpy() + 1) / 2 * 255).clip(0, 255).astype("uint8")
    assert (bundle.decode_images(codes).numpy().astype(int) - expected.astype(int)).__abs__().max() <= 1
    # A VQ tensor missing is one error naming it in their names.
    broken = {k: v for k, v in vq_state.items() if k != "decoder.mid.attn_1.q.weight"}
    with pytest.raises(CheckpointError, match="missing 1: model.vqmodel.decoder.mid.attn_1.q.weight"):
        load_vq(broken, vq_config(hf.vq_section(folder)), "folder")


def test_vq_names_map_onto_janusvqvae_at_full_size():
    """Janus-Pro's VQ (16384 x 8, 384 px -> 24 x 24): every tensor of theirs is one of ours, same shape."""
    with torch.device("meta"):
        their = JanusVQVAE(JanusVQVAEConfig(num_patches=24))
        config = vq_config(their.config.to_dict())
        from lantern.models.vq_model import VQModel

        mine = VQModel(config)
    their_shapes = {k: tuple(v.shape) for k, v in their.state_dict().items()}
    mapped = {theirs(k): tuple(v.shape) for k, v in mine.state_dict().items() if k != "quantize.codebook_used"}
    assert mapped == their_shapes
    assert their_shapes["quantize.embedding.weight"] == (16384, 8) and config.downsample == 16
