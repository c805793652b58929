import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import REPO
from omegaconf import OmegaConf
from safetensors.torch import save_file

from lantern.errors import ConfigError
from lantern.models.drafter import VOCAB_KEY, Drafter, DrafterConfig, drafter_metadata, load_drafter
from lantern.models.kv_cache import NoCache
from lantern.models.llamagen.gpt import Transformer, gpt_config, prefix_causal_mask
from lantern.models.sampling import SamplingConfig
from lantern.training.drafter import DrafterObjective, evaluate_drafter, generate_codes
from lantern.training.loop import EpochBatches, Trainer

T, N, VOCAB, CAPTION_DIM = 4, 64, 64, 16
TINY_GPT = {
    "preset": "GPT-nano",
    "model_type": "t2i",
    "image_size": 32,
    "overrides": {"vocab_size": VOCAB, "caption_dim": CAPTION_DIM, "cls_token_num": T},
}
VQ = {"preset": "VQ-fashion"}  # downsample 4: 32x32 -> 8x8 tokens


def tiny_target(seed=0, **overrides):
    torch.manual_seed(seed)
    kwargs = {**TINY_GPT["overrides"], **overrides}
    return Transformer(gpt_config("GPT-nano", "t2i", 32, 4, **kwargs)).eval()


def toy_data(samples=4):
    torch.manual_seed(1)
    codes = torch.randint(0, VOCAB, (samples, N))
    codes[:, 1::2] = codes[:, ::2]  # structure the drafter can pick up
    states = torch.randn(3, T, CAPTION_DIM)
    masks = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1], [0, 0, 1, 1]], dtype=torch.bool)
    caption_ids = torch.tensor([[0, 1], [2, 0], [1, 2], [0, 2]])[:samples]
    return codes, caption_ids, states, masks


def drafter_outputs(drafter, target, seed=3, batch=2):
    """Drafter outputs on fixed random inputs (for comparing weights)."""
    generator = torch.Generator().manual_seed(seed)
    length = T + N - 2
    dim = target.config.dim
    embeds = torch.randn(batch, length, dim, generator=generator)
    features = torch.randn(batch, length, dim, generator=generator)
    entries = torch.arange(length)
    mask = prefix_causal_mask(torch.tensor([[0, 1, 1], [1, 1, 1]], dtype=torch.bool), length)
    with torch.no_grad():
        return drafter(embeds, features, entries, entries.expand(batch, length), mask, NoCache())


def test_objective_learns():
    target = tiny_target()
    torch.manual_seed(2)
    drafter = Drafter(DrafterConfig(target.config))
    codes, caption_ids, states, masks = toy_data()
    objective = DrafterObjective(target, drafter, codes, caption_ids, states, masks)
    before = evaluate_drafter(target, drafter, codes, caption_ids[:, 0], states, masks)
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=3e-3)
    for _ in range(30):
        optimizer.zero_grad()
        loss, logs = objective(torch.arange(4))
        loss.backward()
        optimizer.step()
    after = evaluate_drafter(target, drafter, codes, caption_ids[:, 0], states, masks)
    assert set(logs) == {"loss", "smooth_l1", "ce", "top1"}
    assert after["loss"] < 0.7 * before["loss"]
    assert after["top1"] > before["top1"]
    assert not any(p.requires_grad for p in target.parameters())


class OracleDrafter(torch.nn.Module):
    """Records its inputs and answers with given states (stands in for a drafter)."""

    def __init__(self, answer):
        super().__init__()
        self.answer = answer
        self.calls = []

    def check_target(self, config):
        pass

    def condition_inputs(self, target, cond_emb):
        return cond_emb[:, 1:]

    def forward(self, embeds, features, entries, slots, mask, cache):
        self.calls.append((embeds, features, entries, slots, mask))
        return self.answer


def test_alignment_inputs_and_targets():
    target = tiny_target()
    codes, caption_ids, states, masks = toy_data()
    caption = caption_ids[:, 0]
    with torch.no_grad():
        cond_emb = target.embed_condition(states[caption])  # (B, T, D)
        f = target.teacher_hidden(cond_emb, codes, masks[caption])  # (B, T+N-1, D)
    oracle = OracleDrafter(f[:, 1:])  # the exact next states: a perfect drafter
    objective = DrafterObjective(target, oracle, codes, caption, states, masks, cond_dropout=0.0, noise=0.0)
    loss, logs = objective(torch.arange(4))
    embeds, features, entries, slots, mask = oracle.calls[0]
    length = T + N - 2
    expected_embeds = torch.cat([cond_emb[:, 1:], target.embed_tokens(codes[:, : N - 1])], dim=1)
    torch.testing.assert_close(embeds, expected_embeds)
    torch.testing.assert_close(features, f[:, :length])
    assert torch.equal(entries, torch.arange(length))
    assert torch.equal(slots, torch.arange(length).expand(4, length))
    assert torch.equal(mask, prefix_causal_mask(masks[caption][:, 1:], length))
    assert logs["smooth_l1"].item() == 0.0
    assert logs["top1"].item() == 1.0
    probs = target.head(f[:, T:]).softmax(-1)
    entropy = -(probs * probs.log()).sum(-1).mean()
    torch.testing.assert_close(logs["ce"], entropy)

    # Shifted by one entry, the same states no longer match their targets.
    shifted = OracleDrafter(f[:, :-1])
    objective = DrafterObjective(target, shifted, codes, caption, states, masks, cond_dropout=0.0, noise=0.0)
    _, logs = objective(torch.arange(4))
    assert logs["smooth_l1"].item() > 0 and logs["top1"].item() < 1.0


def test_only_image_predicting_entries_are_scored():
    target = tiny_target()
    drafter = Drafter(DrafterConfig(target.config))
    codes, caption_ids, states, masks = toy_data()
    outputs = []

    def keep(module, args, out):
        out.retain_grad()
        outputs.append(out)

    handle = drafter.register_forward_hook(keep)
    objective = DrafterObjective(target, drafter, codes, caption_ids, states, masks)
    loss, _ = objective(torch.arange(4))
    loss.backward()
    handle.remove()
    grad = outputs[0].grad  # (B, T+N-2, D)
    assert grad.shape == (4, T + N - 2, target.config.dim)
    assert torch.all(grad[:, : T - 1] == 0)  # entries predicting condition states or token 0
    assert torch.all(grad[:, T - 1 :].abs().sum(-1) > 0)  # entries predicting image tokens 1..N-1


def test_condition_dropout_uses_the_null_condition():
    target = tiny_target()
    codes, caption_ids, states, masks = toy_data()
    objective = DrafterObjective(
        target, Drafter(DrafterConfig(target.config)), codes, caption_ids, states, masks, cond_dropout=1.0
    )
    seen = []
    handle = target.cls_embedding.cap_proj.register_forward_hook(lambda m, args, out: seen.append(args[0]))
    objective(torch.arange(4))
    handle.remove()
    torch.testing.assert_close(seen[0], target.null_condition(4))


def test_objective_is_generic_over_class_conditions():
    torch.manual_seed(0)
    target = Transformer(gpt_config("GPT-nano", "c2i", 32, 4, vocab_size=VOCAB, num_classes=5)).eval()
    drafter = Drafter(DrafterConfig(target.config))
    codes = torch.randint(0, VOCAB, (4, N))
    labels, label_masks = torch.arange(5), torch.ones(5, 1, dtype=torch.bool)
    objective = DrafterObjective(
        target, drafter, codes, torch.tensor([0, 1, 2, 3]), labels, label_masks, cond_dropout=1.0
    )
    seen = []
    handle = target.cls_embedding.embedding_table.register_forward_hook(lambda m, args, out: seen.append(args[0]))
    loss, logs = objective(torch.arange(4))
    handle.remove()
    assert torch.equal(seen[0], torch.full((4,), 5))
    assert torch.isfinite(loss)
    held_out = evaluate_drafter(target, drafter, codes, torch.tensor([0, 1, 2, 3]), labels, label_masks, batch_size=3)
    assert held_out["num_samples"] == 4 and 0.0 <= held_out["top1"] <= 1.0


def test_export_loads_with_load_drafter(tmp_path):
    target = tiny_target()
    torch.manual_seed(2)
    drafter = Drafter(DrafterConfig(target.config))
    codes, caption_ids, states, masks = toy_data()
    objective = DrafterObjective(target, drafter, codes, caption_ids, states, masks)
    trainer = Trainer(
        drafter,
        torch.optim.AdamW(drafter.parameters(), lr=1e-3),
        objective,
        EpochBatches(4, 2, 0, lambda idx: idx),
        max_steps=2,
        out_dir=tmp_path,
        progress=False,
        export_name="drafter.safetensors",
        export_dtype=torch.float16,
        export_metadata=drafter_metadata(drafter),
    )
    trainer.fit()
    loaded = load_drafter(tmp_path / "drafter.safetensors", gpt=TINY_GPT, vq=VQ)
    rounded = Drafter(DrafterConfig(target.config))
    rounded.load_state_dict({k: v.half().float() for k, v in drafter.state_dict().items()})
    assert torch.equal(drafter_outputs(loaded, target), drafter_outputs(rounded, target))

    wider = {**TINY_GPT, "overrides": {**TINY_GPT["overrides"], "vocab_size": 128}}
    with pytest.raises(ConfigError, match=r"vocabulary of 64 codes.*has 128"):
        load_drafter(tmp_path / "drafter.safetensors", gpt=wider, vq=VQ)


def reference_state_dict(drafter: Drafter) -> dict:
    """The drafter's weights under the LANTERN/EAGLE release's HF Llama key names."""
    names = {
        "attention.wo.weight": "self_attn.o_proj.weight",
        "feed_forward.w1.weight": "mlp.gate_proj.weight",
        "feed_forward.w3.weight": "mlp.up_proj.weight",
        "feed_forward.w2.weight": "mlp.down_proj.weight",
        "ffn_norm.weight": "post_attention_layernorm.weight",
    }
    out = {"embed_tokens.weight": torch.randn(drafter.config.vocab_size, drafter.config.dim)}
    for key, value in drafter.state_dict().items():
        if not key.startswith("layers."):
            out[key] = value.clone()
            continue
        _, index, rest = key.split(".", 2)
        if rest == "attention.wqkv.weight":
            for name, part in zip("qkv", value.chunk(3), strict=True):
                out[f"layers.{index}.self_attn.{name}_proj.weight"] = part.clone()
        else:
            out[f"layers.{index}.{names[rest]}"] = value.clone()
    return out


def test_reference_key_names_load_and_match(tmp_path):
    target = tiny_target()
    torch.manual_seed(4)
    drafter = Drafter(DrafterConfig(target.config))
    torch.nn.init.normal_(drafter.layers[0].ffn_norm.weight, 1.0, 0.1)
    state = reference_state_dict(drafter)
    assert "layers.0.self_attn.q_proj.weight" in state and "layers.0.attention.wqkv.weight" not in state
    save_file(state, str(tmp_path / "eagle.safetensors"))
    loaded = load_drafter(tmp_path / "eagle.safetensors", gpt=TINY_GPT, vq=VQ)
    assert torch.equal(drafter_outputs(loaded, target), drafter_outputs(drafter, target))

    wider = {**TINY_GPT, "overrides": {**TINY_GPT["overrides"], "vocab_size": 128}}
    with pytest.raises(ConfigError, match=r"vocabulary of 64 codes.*has 128"):
        load_drafter(tmp_path / "eagle.safetensors", gpt=wider, vq=VQ)


def test_hidden_size_mismatch_names_both_sizes(tmp_path):
    target = tiny_target()
    drafter = Drafter(DrafterConfig(target.config))
    path = tmp_path / "drafter.safetensors"
    save_file(
        {k: v.contiguous() for k, v in drafter.state_dict().items()}, str(path), metadata=drafter_metadata(drafter)
    )
    wide = {**TINY_GPT, "overrides": {**TINY_GPT["overrides"], "dim": 128}}
    with pytest.raises(ConfigError, match=r"hidden size 64.*hidden size 128"):
        load_drafter(path, gpt=wide, vq=VQ)
    assert drafter_metadata(drafter)[VOCAB_KEY] == "64"


def test_generated_codes_are_cached_and_independent_of_batching(tmp_path):
    target = tiny_target()
    _, _, states, masks = toy_data()
    ids = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    sampling = SamplingConfig(cfg_scale=3.0, temperature=1.0)
    key = {"what": "test"}
    cache = tmp_path / "codes.pt"
    first = generate_codes(target, states, masks, ids[:5], sampling, 7, cache, key, batch_size=2, progress=False)
    assert first.shape == (5, N) and first.dtype == torch.long
    more = generate_codes(target, states, masks, ids, sampling, 7, cache, key, batch_size=3, progress=False)
    assert torch.equal(more[:5], first)
    whole = generate_codes(
        target, states, masks, ids, sampling, 7, tmp_path / "other.pt", key, batch_size=8, progress=False
    )
    assert torch.equal(whole, more)
    assert torch.load(cache, weights_only=True)["codes"].shape[0] == 8
    other_seed = generate_codes(target, states, masks, ids, sampling, 8, cache, {"what": "seed 8"}, progress=False)
    assert not torch.equal(other_seed, more)


def test_config_target_matches_the_world_model_config():
    train = OmegaConf.load(REPO / "conf" / "train_drafter.yaml")
    model = OmegaConf.load(REPO / "conf" / "model" / "fashion_t2i.yaml")
    assert OmegaConf.to_container(train.gpt) == OmegaConf.to_container(model.bundle.gpt)
    assert OmegaConf.to_container(train.vq) == OmegaConf.to_container(model.bundle.vq)


def run_script(*overrides, timeout=120):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "train_drafter.py"), *overrides],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_script_rejects_a_bad_data_kind(tmp_path):
    result = run_script("data=pictures", f"out_dir={tmp_path / 'run'}")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == "error: data='pictures': expected one of self, images"
    assert not (tmp_path / "run").exists()


def test_script_self_distillation_smoke(tmp_path):
    out = tmp_path / "run"
    result = run_script(
        "data=self",
        "num_samples=8",
        "generation.batch_size=4",
        "batch_size=4",
        "steps=3",
        "warmup_steps=1",
        "eval_images=20",
        "num_threads=1",
        "progress=false",
        f"out_dir={out}",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((out / "drafter_report.json").read_text())
    assert report["training"]["steps"] == 3 and report["data"]["sequences"] == 8
    assert report["held_out"]["images"] == 20 and 0.0 <= report["held_out"]["top1"] <= 1.0
    model = OmegaConf.load(REPO / "conf" / "model" / "fashion_t2i.yaml")
    drafter = load_drafter(
        out / "drafter.safetensors",
        gpt=OmegaConf.to_container(model.bundle.gpt),
        vq=OmegaConf.to_container(model.bundle.vq),
    )
    assert drafter.config.dim == 128 and drafter.config.vocab_size == 2048  # the world target GPT-deep: 24 x 128
    assert torch.load(out / "codes_self.pt", weights_only=True)["codes"].shape == (8, 64)


@pytest.mark.parametrize("cond_dropout", [0.0, 0.5, 1.0])
def test_cached_target_states_give_the_same_loss(cond_dropout):
    """States computed once (conditional and null) give the loss and gradients of a target forward per step."""
    target = tiny_target()
    codes, _, states, masks = toy_data()
    caption = torch.tensor([[1], [0], [2], [1]])  # one condition per sequence, as data=self
    torch.manual_seed(3)
    drafter = Drafter(DrafterConfig(target.config))
    losses, grads = [], []
    for cache in (False, True):
        objective = DrafterObjective(
            target, drafter, codes, caption, states, masks, cond_dropout=cond_dropout, noise=0.2, cache_states=cache
        )
        torch.manual_seed(7)
        drafter.zero_grad()
        loss, _ = objective(torch.tensor([3, 0, 2, 1, 3]))
        loss.backward()
        losses.append(loss.detach())
        grads.append(torch.cat([p.grad.flatten() for p in drafter.parameters()]))
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-6)


def test_cached_states_need_one_condition_per_sequence():
    target = tiny_target()
    codes, caption_ids, states, masks = toy_data()
    with pytest.raises(ConfigError, match="cache_states"):
        DrafterObjective(
            target, Drafter(DrafterConfig(target.config)), codes, caption_ids, states, masks, cache_states=True
        )  # two conditions per sequence
