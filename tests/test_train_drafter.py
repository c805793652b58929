"""The drafter factory's pieces: shards, features, the EAGLE objective on them (the script: test_drafter_factory.py)."""

import json
import os

import pytest
import torch
from safetensors.torch import save_file

from lantern.errors import CheckpointError, ConfigError
from lantern.models.condition import Condition
from lantern.models.drafter import VOCAB_KEY, Drafter, DrafterConfig, drafter_metadata
from lantern.models.kv_cache import NoCache
from lantern.models.llamagen.drafter import load_drafter
from lantern.models.llamagen.gpt import Transformer, gpt_config
from lantern.models.target import prefix_causal_mask
from lantern.training.drafter import FeatureObjective, evaluate_features
from lantern.training.drafter_data import module_digest
from lantern.training.drafter_features import null_rows, teacher_features
from lantern.training.shards import ShardStore

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
    return Transformer(gpt_config("GPT-nano", "t2i", 32, 4, **kwargs)).eval().requires_grad_(False)


class TableConditioner:
    """Prompts are indices into a fixed table of caption states and masks (stands in for a text encoder)."""

    kind = "text"

    def __init__(self, states, masks):
        self.states, self.masks = states, masks

    def encode(self, prompts):
        index = torch.tensor(prompts)
        return Condition(self.states[index], self.masks[index])


def toy_conditioner():
    torch.manual_seed(1)
    states = torch.randn(3, T, CAPTION_DIM)
    masks = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1], [0, 0, 1, 1]], dtype=torch.bool)
    return TableConditioner(states, masks)


def toy_data(folder, rows=6, shard=4):
    """A data store of structured codes under prompts 0, 1, 2, 0, ..."""
    torch.manual_seed(1)
    codes = torch.randint(0, VOCAB, (rows, N))
    codes[:, 1::2] = codes[:, ::2]  # structure the drafter can pick up
    prompt = torch.arange(rows) % 3
    store = ShardStore(folder, {"what": "toy"}, "toy data")
    for start in range(0, rows, shard):
        store.append({"codes": codes[start : start + shard].int(), "prompt": prompt[start : start + shard]})
    return store, codes, prompt


def toy_features(tmp_path, target, rows=6, cond_dropout=0.0, batch_size=4, name="features", seed=0):
    data, codes, prompt = toy_data(tmp_path / "data", rows)
    store = ShardStore(tmp_path / name, {"what": name}, "toy features")
    teacher_features(
        store, data, target, toy_conditioner(), [0, 1, 2], seed, cond_dropout, torch.float32, batch_size, False
    )
    return store, codes, prompt


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


# -- shards --------------------------------------------------------------------------------------------


def test_shards_read_rows_in_any_order_across_shards(tmp_path):
    store, codes, prompt = toy_data(tmp_path / "data", rows=10, shard=4)
    assert store.rows == 10 and len(store.shards) == 3
    rows = torch.tensor([9, 0, 5, 4, 3, 9])
    got = store.read(rows)
    assert torch.equal(got["codes"].long(), codes[rows]) and torch.equal(got["prompt"], prompt[rows])
    again = ShardStore(tmp_path / "data", {"what": "toy"}, "toy data")  # reopened: resumes after the last shard
    assert again.rows == 10 and torch.equal(again.read(torch.tensor([7]))["codes"].long(), codes[7:8])


def test_shards_refuse_another_key_and_a_cut_shard(tmp_path):
    toy_data(tmp_path / "data", rows=8, shard=4)
    with pytest.raises(ConfigError, match=r"made for other inputs \(what: 'toy' \(stored\) vs 'other'"):
        ShardStore(tmp_path / "data", {"what": "other"}, "toy data")
    shard = tmp_path / "data" / "shard_00001.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match=r"shard_00001.safetensors' has \d+ bytes, the index says"):
        ShardStore(tmp_path / "data", {"what": "toy"}, "toy data")


def test_shards_refuse_an_altered_shard_of_the_same_size(tmp_path):
    """Rows changed in place (size kept, a later edit) are never read: the index's sha256 says so, in one message."""
    _, codes, _ = toy_data(tmp_path / "data", rows=8, shard=4)
    shard = tmp_path / "data" / "shard_00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # a byte of the last tensor's rows; the header and the size are kept
    shard.write_bytes(bytes(data))
    later = shard.stat().st_mtime_ns + 1_000_000_000
    os.utime(shard, ns=(later, later))
    with pytest.raises(CheckpointError, match=r"shard_00001.safetensors' does not match the sha256 the index lists"):
        ShardStore(tmp_path / "data", {"what": "toy"}, "toy data")
    index = tmp_path / "data" / "index.json"
    saved = json.loads(index.read_text())
    shard.write_bytes(bytes(data[:-1] + bytes([data[-1] ^ 0xFF])))  # back as written
    reopened = ShardStore(tmp_path / "data", {"what": "toy"}, "toy data")
    assert torch.equal(reopened.read(torch.tensor([7]))["codes"].long(), codes[7:8])
    for entry in saved["shards"]:
        entry.pop("sha256")
    index.write_text(json.dumps(saved))  # an index written before shard digests is not trusted either
    with pytest.raises(CheckpointError, match=r"shard_00000.safetensors' has no sha256 in the index"):
        ShardStore(tmp_path / "data", {"what": "toy"}, "toy data")


def test_a_temporary_shard_left_by_a_kill_is_ignored(tmp_path):
    store, _, _ = toy_data(tmp_path / "data", rows=4, shard=4)
    (tmp_path / "data" / ".shard_00001.safetensors.host.1.1.tmp").write_bytes(b"half")
    again = ShardStore(tmp_path / "data", {"what": "toy"}, "toy data")
    assert again.rows == 4
    again.append({"codes": torch.zeros(2, N, dtype=torch.int32), "prompt": torch.zeros(2, dtype=torch.long)})
    assert ShardStore(tmp_path / "data", {"what": "toy"}, "toy data").rows == 6


# -- features ------------------------------------------------------------------------------------------


def test_features_are_the_targets_states_and_independent_of_batching(tmp_path):
    target = tiny_target()
    store, codes, prompt = toy_features(tmp_path, target, rows=6, cond_dropout=0.5, batch_size=4)
    other, _, _ = toy_features(tmp_path, target, rows=6, cond_dropout=0.5, batch_size=5, name="other")
    null = null_rows(0, range(6), 0.5)
    assert 0 < int(null.sum()) < 6  # both streams occur at this share
    rows = store.read(torch.arange(6))
    assert torch.equal(rows["null"], null) and torch.equal(rows["row"], torch.arange(6))
    for name, tensor in other.read(torch.arange(6)).items():
        assert torch.equal(tensor, rows[name]), name
    conditioner = toy_conditioner()
    condition = conditioner.encode(prompt.tolist())
    values = torch.where(null.view(-1, 1, 1), target.null_condition(6), condition.values)
    cond_emb = target.embed_condition(values)
    torch.testing.assert_close(rows["cond"], cond_emb)
    torch.testing.assert_close(rows["hidden"], target.teacher_hidden(cond_emb, codes, condition.mask))
    assert torch.equal(rows["mask"], condition.mask)
    assert torch.equal(null_rows(0, range(3, 6), 0.5), null[3:])  # a row's draw does not depend on the others


class OracleDrafter(torch.nn.Module):
    """Records its inputs and answers with given states (stands in for a drafter)."""

    def __init__(self, answer):
        super().__init__()
        self.answer = answer
        self.calls = []

    def condition_inputs(self, target, cond_emb):
        return cond_emb[:, 1:]

    def forward(self, embeds, features, entries, slots, mask, cache):
        self.calls.append((embeds, features, entries, slots, mask))
        return self.answer


def test_alignment_inputs_and_targets(tmp_path):
    target = tiny_target()
    store, codes, prompt = toy_features(tmp_path, target, rows=4)
    rows = store.read(torch.arange(4))
    cond_emb, f, mask4 = rows["cond"], rows["hidden"], rows["mask"]
    oracle = OracleDrafter(f[:, 1:])  # the exact next states: a perfect drafter
    objective = FeatureObjective(target, oracle, store, torch.arange(4), noise=0.0)
    loss, logs = objective(torch.arange(4))
    embeds, features, entries, slots, mask = oracle.calls[0]
    length = T + N - 2
    expected_embeds = torch.cat([cond_emb[:, 1:], target.embed_tokens(codes[:, : N - 1])], dim=1)
    torch.testing.assert_close(embeds, expected_embeds)
    torch.testing.assert_close(features, f[:, :length])
    assert torch.equal(entries, torch.arange(length))
    assert torch.equal(slots, torch.arange(length).expand(4, length))
    assert torch.equal(mask, prefix_causal_mask(mask4[:, 1:], length))
    assert logs["smooth_l1"].item() == 0.0 and logs["top1"].item() == 1.0 and logs["top5"].item() == 1.0
    probs = target.head(f[:, T:]).softmax(-1)
    entropy = -(probs * probs.log()).sum(-1).mean()
    torch.testing.assert_close(logs["ce"], entropy)

    # Shifted by one entry, the same states no longer match their targets.
    shifted = OracleDrafter(f[:, :-1])
    _, logs = FeatureObjective(target, shifted, store, torch.arange(4), noise=0.0)(torch.arange(4))
    assert logs["smooth_l1"].item() > 0 and logs["top1"].item() < 1.0


def test_only_image_predicting_entries_are_scored(tmp_path):
    target = tiny_target()
    store, _, _ = toy_features(tmp_path, target, rows=4)
    drafter = Drafter(DrafterConfig(target.config))
    outputs = []

    def keep(module, args, out):
        out.retain_grad()
        outputs.append(out)

    handle = drafter.register_forward_hook(keep)
    loss, _ = FeatureObjective(target, drafter, store, torch.arange(4))(torch.arange(4))
    loss.backward()
    handle.remove()
    grad = outputs[0].grad  # (B, T+N-2, D)
    assert grad.shape == (4, T + N - 2, target.config.dim)
    assert torch.all(grad[:, : T - 1] == 0)  # entries predicting condition states or token 0
    assert torch.all(grad[:, T - 1 :].abs().sum(-1) > 0)  # entries predicting image tokens 1..N-1


def test_objective_learns_on_feature_shards(tmp_path):
    target = tiny_target()
    store, _, _ = toy_features(tmp_path, target, rows=6, cond_dropout=0.3)
    torch.manual_seed(2)
    drafter = Drafter(DrafterConfig(target.config))
    rows = torch.arange(4)
    before = evaluate_features(target, drafter, store, rows, batch_size=3)
    objective = FeatureObjective(target, drafter, store, rows)
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=3e-3)
    for _ in range(30):
        optimizer.zero_grad()
        loss, logs = objective(torch.arange(4))
        loss.backward()
        optimizer.step()
    after = evaluate_features(target, drafter, store, rows, batch_size=3)
    assert set(logs) == {"loss", "smooth_l1", "ce", "top1", "top5"}
    assert after["loss"] < 0.7 * before["loss"] and after["top1"] > before["top1"] and after["rows"] == 4
    assert not any(p.requires_grad for p in target.parameters())


def test_ranks_split_the_batch_and_draw_the_same_noise(tmp_path):
    """Two ranks' halves average to the single-process loss and gradient: what DDP relies on."""
    target = tiny_target()
    store, _, _ = toy_features(tmp_path, target, rows=6, cond_dropout=0.5)
    torch.manual_seed(2)
    drafter = Drafter(DrafterConfig(target.config))
    batch = torch.tensor([3, 0, 5, 1])

    def loss_and_grad(rank, ranks):
        torch.manual_seed(11)
        drafter.zero_grad()
        loss, _ = FeatureObjective(target, drafter, store, torch.arange(6), rank=rank, ranks=ranks)(batch)
        loss.backward()
        return loss.detach(), torch.cat([p.grad.flatten() for p in drafter.parameters()])

    whole = loss_and_grad(0, 1)
    halves = [loss_and_grad(rank, 2) for rank in (0, 1)]
    torch.testing.assert_close((halves[0][0] + halves[1][0]) / 2, whole[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close((halves[0][1] + halves[1][1]) / 2, whole[1], rtol=1e-4, atol=1e-6)


def test_features_are_generic_over_class_conditions(tmp_path):
    torch.manual_seed(0)
    target = Transformer(gpt_config("GPT-nano", "c2i", 32, 4, vocab_size=VOCAB, num_classes=5)).eval()
    data, _, prompt = toy_data(tmp_path / "data", rows=4)

    class Classes:
        kind = "class"

        def encode(self, prompts):
            return Condition(torch.tensor(prompts), torch.ones(len(prompts), 1, dtype=torch.bool))

    store = ShardStore(tmp_path / "features", {"what": "c2i"}, "features")
    seen = []
    handle = target.cls_embedding.embedding_table.register_forward_hook(lambda m, args, out: seen.append(args[0]))
    teacher_features(store, data, target, Classes(), [0, 1, 2], 0, 1.0, torch.float16, 4, False)
    handle.remove()
    assert torch.equal(seen[0], torch.full((4,), 5))  # every row under the null class at cond_dropout=1
    rows = store.read(torch.arange(4))
    assert rows["hidden"].dtype == torch.float16 and rows["cond"].shape == (4, 1, target.config.dim)
    held = evaluate_features(target, Drafter(DrafterConfig(target.config)), store, torch.arange(4), batch_size=3)
    assert held["rows"] == 4 and 0.0 <= held["top1"] <= held["top5"] <= 1.0


def test_module_digest_follows_the_weights():
    first, same, other = tiny_target(0), tiny_target(0), tiny_target(1)
    assert module_digest(first) == module_digest(same) != module_digest(other)


# -- the drafter file format -----------------------------------------------------------------------------


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


# -- EAGLE-3 style: tapped layers and the training-time test ---------------------------------------------


def decode_time_output(drafter, target, embeds, first, cond_mask, entry, depth):
    """The drafter's output at ``entry`` as a node at draft ``depth`` sees it while decoding: the prefix
    ``0 .. entry - depth`` read the target's features ``first``, then a chain of ``depth`` entries each
    reading the previous entry's output (computed step by step over a growing causal sequence)."""
    start = entry - depth  # the last entry that reads the target's features
    features = first[:, : start + 1]
    for _ in range(depth):
        length = features.shape[1]
        index = torch.arange(length)
        mask = prefix_causal_mask(cond_mask[:, 1:], length)
        outputs = drafter(embeds[:, :length], features, index, index.expand(first.shape[0], length), mask, NoCache())
        features = torch.cat([features, outputs[:, -1:]], dim=1)  # the next entry reads this estimate
    length = features.shape[1]
    index = torch.arange(length)
    mask = prefix_causal_mask(cond_mask[:, 1:], length)
    return drafter(embeds[:, :length], features, index, index.expand(first.shape[0], length), mask, NoCache())[:, -1]


def test_the_unrolled_passes_see_what_a_drafted_node_sees(tmp_path):
    from lantern.training.drafter import unrolled_estimates

    target = tiny_target()
    store, codes, _ = toy_features(tmp_path, target, rows=2)
    rows = store.read(torch.arange(2))
    torch.manual_seed(5)
    drafter = Drafter(DrafterConfig(target.config)).eval()
    passes = unrolled_estimates(target, drafter, rows["cond"], rows["mask"], codes, rows["hidden"], steps=3)
    assert [p[0].shape[1] for p in passes] == [N - 1, N - 2, N - 3]  # pass k scores entries T-1+k ..
    assert all(torch.equal(f, rows["hidden"][:, T + k :]) for k, (_, f) in enumerate(passes))
    length = T + N - 2
    embeds = torch.cat([rows["cond"][:, 1:], target.embed_tokens(codes[:, : N - 1])], dim=1)
    first = rows["hidden"][:, :length]
    with torch.no_grad():
        for k in (1, 2):
            for entry in (T - 1 + k, T + 10, length - 1):
                expected = decode_time_output(drafter, target, embeds, first, rows["mask"], entry, k)
                got = passes[k][0][:, entry - (T - 1 + k)]
                torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        base = passes[0][0]
        torch.testing.assert_close(base, drafter_outputs_teacher(drafter, target, rows, codes), rtol=1e-6, atol=1e-6)


def drafter_outputs_teacher(drafter, target, rows, codes):
    from lantern.training.drafter import drafter_estimates

    return drafter_estimates(target, drafter, rows["cond"], rows["mask"], codes, rows["hidden"])[0]


def test_a_tapped_drafter_trains_with_the_training_time_test(tmp_path):
    target = tiny_target(n_layer=6)
    data, codes, _ = toy_data(tmp_path / "data", rows=6)
    store = ShardStore(tmp_path / "features", {"what": "taps"}, "features")
    taps = (1, 3, 5)
    teacher_features(store, data, target, toy_conditioner(), [0, 1, 2], 0, 0.3, torch.float32, 4, False, taps)
    rows = store.read(torch.arange(6))
    hidden, tapped = target.teacher_hidden(rows["cond"], codes, rows["mask"], taps=taps)
    torch.testing.assert_close(rows["taps"], tapped)
    assert rows["taps"].shape == (6, T + N - 1, 3 * target.config.dim)
    torch.manual_seed(2)
    drafter = Drafter(DrafterConfig(target.config, taps=taps))
    train = torch.arange(4)
    before = evaluate_features(target, drafter, store, train, batch_size=3, ce_weight=1.0, feature_weight=0.0)
    objective = FeatureObjective(target, drafter, store, train, noise=0.0, ce_weight=1.0, steps=3, feature_weight=0.0)
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=3e-3)
    for _ in range(30):
        optimizer.zero_grad()
        loss, logs = objective(torch.arange(4))
        loss.backward()
        optimizer.step()
    assert {"top1_pass1", "top1_pass2"} <= set(logs)
    assert drafter.fuse.weight.grad is not None and drafter.fuse.weight.grad.abs().sum() > 0
    after = evaluate_features(target, drafter, store, train, batch_size=3, ce_weight=1.0, feature_weight=0.0)
    assert after["ce"] < before["ce"] and after["top1"] > before["top1"]
