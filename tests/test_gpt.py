import pytest
import torch
from conftest import read_layout

from lantern.errors import CheckpointError, ConfigError
from lantern.models.checkpoint import load_weights
from lantern.models.llamagen.gpt import Transformer, gpt_config
from lantern.models.llamagen.rope import rope_table_2d
from lantern.models.target import prefix_causal_mask


def layout_of(model):
    return [(k, tuple(v.shape)) for k, v in model.state_dict().items()]


@pytest.mark.parametrize(
    "preset,model_type,tsv",
    [
        ("GPT-B", "c2i", "c2i_GPT-B.tsv"),
        ("GPT-L", "c2i", "c2i_GPT-L.tsv"),
        ("GPT-XL", "c2i", "c2i_GPT-XL.tsv"),
        ("GPT-XXL", "c2i", "c2i_GPT-XXL.tsv"),
        ("GPT-XL", "t2i", "t2i_GPT-XL.tsv"),
    ],
)
def test_preset_layout_matches_official(preset, model_type, tsv):
    with torch.device("meta"):
        model = Transformer(gpt_config(preset, model_type, 256))
    assert layout_of(model) == read_layout(tsv)


def test_gpt_3b_follows_the_same_naming():
    with torch.device("meta"):
        model = Transformer(gpt_config("GPT-3B", "c2i", 384))
    shapes = dict(layout_of(model))
    assert model.config.head_dim == 100 and model.config.ffn_hidden == 8704
    assert shapes["layers.23.attention.wqkv.weight"] == (9600, 3200)
    assert shapes["cls_embedding.embedding_table.weight"] == (1001, 3200)
    assert "layers.24.attention.wo.weight" not in shapes


def test_ffn_hidden_rule():
    expected = {"GPT-B": 2048, "GPT-L": 2816, "GPT-XL": 3584, "GPT-XXL": 4096, "GPT-3B": 8704}
    for preset, hidden in expected.items():
        assert gpt_config(preset, "c2i", 256).ffn_hidden == hidden


def test_bad_configs_raise_one_clear_error():
    with pytest.raises(ConfigError, match="GPT preset='GPT-Q': expected one of GPT-B"):
        gpt_config("GPT-Q", "c2i", 256)
    with pytest.raises(ConfigError, match="model_type.*'i2i'"):
        gpt_config("GPT-B", "i2i", 256)
    with pytest.raises(ConfigError, match="image_size 250"):
        gpt_config("GPT-B", "c2i", 250)


def test_rope_condition_rows_are_zero_and_grid_is_raster():
    grid, head_dim, cond = 4, 16, 3
    table = rope_table_2d(grid, head_dim, cond)
    assert table.shape == (cond + grid * grid, head_dim // 2, 2)
    assert torch.count_nonzero(table[:cond]) == 0
    half = head_dim // 2
    freqs = 1.0 / (10000 ** (torch.arange(0, half, 2)[: half // 2].float() / half))
    for n in range(grid * grid):
        row, col = divmod(n, grid)
        angles = torch.cat([row * freqs, col * freqs])
        torch.testing.assert_close(table[cond + n, :, 0], angles.cos())
        torch.testing.assert_close(table[cond + n, :, 1], angles.sin())


def test_condition_queries_and_keys_are_zero():
    torch.manual_seed(0)
    model = Transformer(gpt_config("GPT-nano", "c2i", 64)).eval()
    captured = {}
    layer = model.layers[0].attention

    def hook(module, args, output):
        captured["qkv"] = output

    handle = layer.wqkv.register_forward_hook(hook)
    from lantern.models.llamagen.rope import apply_rope

    cache = model.new_cache(1)
    cond = model.embed_condition(torch.tensor([3]))
    model.prefill(cond, prefix_causal_mask(torch.ones(1, 1, dtype=torch.bool), 1), cache)
    handle.remove()
    q = captured["qkv"][..., :64].view(1, 1, 2, 32)
    assert torch.count_nonzero(apply_rope(q, model.rope[:1])) == 0
    assert torch.count_nonzero(cache.k[:, :, :, 0]) == 0


def _tiny(model_type, **kw):
    cfg = gpt_config("GPT-nano", model_type, 64, caption_dim=12, cls_token_num=5 if model_type == "t2i" else 1, **kw)
    torch.manual_seed(0)
    return Transformer(cfg).eval()


@pytest.mark.parametrize("model_type", ["c2i", "t2i"])
def test_cached_decoding_matches_full_forward(model_type):
    model = _tiny(model_type)
    cfg = model.config
    batch, steps = 3, 10
    if model_type == "c2i":
        cond = model.embed_condition(torch.tensor([1, 5, 1000]))
        cond_mask = torch.ones(batch, 1, dtype=torch.bool)
    else:
        cond = model.embed_condition(torch.randn(batch, cfg.cls_token_num, cfg.caption_dim))
        cond_mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]], dtype=torch.bool)
    tokens = torch.randint(0, cfg.vocab_size, (batch, steps + 1))
    with torch.no_grad():
        full = model.head(model.forward_teacher(cond, tokens, cond_mask))  # (B, steps + 1, V)
        T = cfg.cls_token_num
        length = T + steps
        cache = model.new_cache(batch, length)
        mask = prefix_causal_mask(cond_mask, length)
        first, _ = model.prefill(cond, mask[:, :, :T, :T], cache)
        outs = [first]
        for n in range(steps):
            pos = torch.tensor([T + n])
            logits, _ = model.forward_tokens(
                tokens[:, n : n + 1], pos, pos.expand(batch, 1), mask[:, :, T + n : T + n + 1, : T + n + 1], cache
            )
            outs.append(logits[:, 0])
        # A chunk of several tokens at once gives the same logits as one at a time.
        cache2 = model.new_cache(batch, length)
        model.prefill(cond, mask[:, :, :T, :T], cache2)
        pos = torch.arange(T, T + steps)
        chunk, _ = model.forward_tokens(tokens[:, :steps], pos, pos.expand(batch, steps), mask[:, :, T:, :], cache2)
    incremental = torch.stack(outs, dim=1)
    torch.testing.assert_close(incremental, full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(chunk, full[:, 1:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cache.k, cache2.k, atol=1e-5, rtol=1e-5)


def test_prefix_mask_hides_padded_caption_columns_and_keeps_diagonal():
    cond_mask = torch.tensor([[False, True, True]])
    mask = prefix_causal_mask(cond_mask, 5)[0, 0]
    assert not mask[:, 0][1:].any() and mask[0, 0]  # padded column hidden except on its own row
    assert mask[4].tolist() == [False, True, True, True, True]
    assert not mask[1, 2]  # causal


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "inductor"])
def test_kv_cache_move_compacts_per_row(compiled):
    model = _tiny("c2i")
    cache = model.new_cache(2, 8)
    for buffer in cache.tensors():  # one (B, H, L, hd) tensor per layer and kind
        buffer.normal_()
    src = torch.tensor([[4, 6], [3, 7]])  # row 1 overlaps: slot 3 is read before it is written
    dst = torch.tensor([[2, 3], [2, 3]])
    before = {"k": cache.k.clone(), "v": cache.v.clone()}  # (layers, B, H, L, hd) each
    # compiled, the move is an index_put_ in place (the eager path is a scatter_): both must move alike
    move = torch.compile(cache.move, fullgraph=True, dynamic=False) if compiled else cache.move
    move(src, dst)
    for name, old in before.items():  # keys and values move alike
        expected = old.clone()
        for row in range(2):
            for s, d in zip(src[row].tolist(), dst[row].tolist(), strict=True):
                expected[:, row, :, d] = old[:, row, :, s]
        assert torch.equal(getattr(cache, name), expected), name  # moved slots, and every other slot unchanged
        assert not torch.equal(expected, old)


@pytest.fixture(scope="module")
def gpt_b_file(tmp_path_factory):
    torch.manual_seed(0)
    model = Transformer(gpt_config("GPT-B", "c2i", 256))
    path = tmp_path_factory.mktemp("ckpt") / "c2i_B_256.pt"
    sd = model.state_dict()
    torch.save({"model": sd}, path)
    return path, sd


@pytest.mark.slow  # ~20 s at GPT-B size; the damaged-file tests below keep the strict loader in the default suite
def test_random_official_format_gpt_b_loads_strictly(gpt_b_file, tmp_path):
    path, sd = gpt_b_file
    model = Transformer(gpt_config("GPT-B", "c2i", 256))
    load_weights(model, path, expected="GPT-B c2i")
    torch.testing.assert_close(model.output.weight, sd["output.weight"])
    raw = tmp_path / "raw.pt"
    torch.save({**sd, "freqs_cis": torch.zeros(3)}, raw)  # FSDP-style raw dict with a stray buffer
    load_weights(Transformer(gpt_config("GPT-B", "c2i", 256)), raw, expected="GPT-B c2i")


@pytest.mark.parametrize(
    "damage,pattern",
    [
        ("rename", r"missing 1: layers\.3\.ffn_norm\.weight.*unexpected 1: layers\.3\.ffn_norm\.weights"),
        ("drop", r"missing 1: output\.weight"),
        ("reshape", r"wrong shape 1: tok_embeddings\.weight \(16384, 700\) != \(16384, 768\)"),
    ],
)
def test_damaged_checkpoint_fails_clearly(gpt_b_file, tmp_path, damage, pattern):
    _, sd = gpt_b_file
    sd = dict(sd)
    if damage == "rename":
        sd["layers.3.ffn_norm.weights"] = sd.pop("layers.3.ffn_norm.weight")
    elif damage == "drop":
        del sd["output.weight"]
    else:
        sd["tok_embeddings.weight"] = torch.zeros(16384, 700)
    path = tmp_path / "bad.pt"
    torch.save({"model": sd}, path)
    with pytest.raises(CheckpointError, match=r"does not match GPT-B c2i: " + pattern):
        load_weights(Transformer(gpt_config("GPT-B", "c2i", 256)), path, expected="GPT-B c2i")


def test_not_a_checkpoint_fails_clearly(tmp_path):
    model = _tiny("c2i")
    junk = tmp_path / "junk.pt"
    junk.write_text("hello")
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        load_weights(model, junk, expected="GPT-nano c2i")
    with pytest.raises(CheckpointError, match="not found"):
        load_weights(model, tmp_path / "absent.pt", expected="GPT-nano c2i")
    torch.save({"model": [1, 2]}, tmp_path / "list.pt")
    with pytest.raises(CheckpointError, match="not a state dict"):
        load_weights(model, tmp_path / "list.pt", expected="GPT-nano c2i")


def test_rows_can_write_different_slots():
    from lantern.models.kv_cache import KVCache

    cache = KVCache.allocate(1, 2, 2, 8, 4, torch.float32, "cpu")
    k, v = torch.randn(2, 2, 2, 4), torch.randn(2, 2, 2, 4)
    keys, _ = cache.layer(0).update(torch.tensor([[1, 2], [5, 6]]), k, v, length=7)
    torch.testing.assert_close(keys[0, :, 1:3], k[0])
    torch.testing.assert_close(keys[1, :, 5:7], k[1])
    assert torch.count_nonzero(keys[0, :, 5:7]) == 0 and torch.count_nonzero(keys[1, :, 1:3]) == 0


def test_apply_rope_matches_the_pairwise_formula():
    from lantern.models.llamagen.rope import apply_rope

    torch.manual_seed(0)
    x = torch.randn(2, 5, 3, 8)
    table = rope_table_2d(2, 8, 1)[:5]  # (5, 4, 2)
    cos, sin = table[None, :, None, :, 0], table[None, :, None, :, 1]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    expected = torch.stack([x0 * cos - x1 * sin, x1 * cos + x0 * sin], dim=-1).flatten(3)
    torch.testing.assert_close(apply_rope(x, table), expected)
    per_row = table.expand(2, -1, -1, -1)  # (B, S, hd/2, 2)
    torch.testing.assert_close(apply_rope(x, per_row), expected)
    assert apply_rope(x.bfloat16(), table).dtype == torch.bfloat16


def test_a_llamagen_config_gives_its_drafter_arch_as_every_family_does():
    """The drafter reads no family: LlamaGen's GPTConfig names its arch itself, and a config that names none
    is refused with one message (there is no isinstance fallback)."""
    from lantern.models.drafter import Drafter, DrafterConfig, drafter_arch
    from lantern.models.llamagen.gpt import LlamaGenArch, TransformerBlock

    config = gpt_config("GPT-nano", "c2i", 32, downsample=8, vocab_size=64)
    arch = config.drafter_arch()
    assert arch == LlamaGenArch(config) and drafter_arch(config) == arch
    assert (arch.dim, arch.vocab_size, arch.n_layer, arch.first_norm) == (64, 64, 2, "attention_norm")
    drafter = Drafter(DrafterConfig(config))
    assert isinstance(drafter.layers[0], TransformerBlock) and drafter.max_entries == config.max_seq_len - 1
    with pytest.raises(ConfigError, match="no drafter_arch"):
        drafter_arch(object())
