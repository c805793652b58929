"""The eager step's shortcuts compute exactly what the general forms compute (bit for bit, or the same booleans):
the tree mask by a scatter, the cache's prepared writes and its one-buffer move, the additive attention mask, the
RoPE rows prepared once a forward, RMSNorm without no-op casts, several RNG streams in one pass, and the CPU-only
skips of work no row needs (:func:`lantern.models.devices.needed`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lantern import rng
from lantern.decoding.batch import _scattered_tree, _tree_by_product, prefix_columns, tree_attention_mask
from lantern.models.devices import needed
from lantern.models.kv_cache import KVCache, SlotWrites
from lantern.models.llama_parts import RMSNorm
from lantern.models.llamagen.gpt import attention_bias
from lantern.models.llamagen.rope import apply_rope, rope_rows, rope_table_2d


def test_the_scattered_tree_mask_is_the_product_mask():
    generator = torch.Generator().manual_seed(0)
    for trial in range(40):
        batch, count, entries, width = 3, int(torch.randint(1, 7, (1,), generator=generator)), 6, 20
        offset = trial % 2
        base = torch.randint(0, width - 2, (batch,), generator=generator)
        ancestors = torch.rand(batch, count, entries, generator=generator) > 0.5
        for given in (ancestors, ancestors.float()):  # the drafter keeps its ancestry as 0/1 floats
            want = _tree_by_product(width, base, given, offset)
            assert torch.equal(_scattered_tree(width, base, given, offset), want)
        valid = torch.rand(batch, width, generator=generator) > 0.2
        mask = tree_attention_mask(valid, base, ancestors, offset)
        same = tree_attention_mask(valid, base, ancestors, offset, prefix=prefix_columns(valid, base))
        assert mask.shape == (batch, 1, count, width) and torch.equal(mask, same)
        assert torch.equal(mask[:, 0], prefix_columns(valid, base)[:, None] | want)


def test_prepared_writes_and_the_stacked_move_are_the_plain_ones():
    torch.manual_seed(0)
    plain = KVCache.allocate(3, 2, 4, 12, 8, torch.float32, "cpu")
    stacked = KVCache.allocate(3, 2, 4, 12, 8, torch.float32, "cpu").stacked()
    assert stacked.buffer is not None and stacked.keys[1].data_ptr() == stacked.buffer[1].data_ptr()
    slots = torch.tensor([[3, 4, 5], [6, 7, 8]])
    prepared = stacked.writes(slots)
    assert isinstance(prepared, SlotWrites) and isinstance(
        KVCache.allocate(1, 1, 1, 4, 2, torch.float32, "cpu"), KVCache
    )
    for layer in range(3):
        k, v = torch.randn(2, 5, 4, 8).transpose(1, 2)[:, :, :3], torch.randn(2, 4, 3, 8)  # (B, H, S, hd)
        keys, values = plain.layer(layer).update(slots, k, v, 10)
        keys2, values2 = stacked.layer(layer).update(prepared, k, v, 10)
        assert torch.equal(keys, keys2) and torch.equal(values, values2) and keys2.shape[2] == 10
        full, _ = stacked.layer(layer).update(prepared, k, v, 12)
        assert full.data_ptr() == stacked.keys[layer].data_ptr()  # no slicing over the whole capacity
    src, dst = torch.tensor([[5, 3], [8, 7]]), torch.tensor([[3, 4], [6, 7]])
    plain.move(src, dst)
    stacked.move(src, dst)
    assert torch.equal(plain.k, stacked.k) and torch.equal(plain.v, stacked.v)


def test_the_additive_mask_gives_sdpa_the_same_attention():
    torch.manual_seed(1)
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 9, 8), torch.randn(2, 4, 9, 8)
    mask = torch.rand(2, 1, 5, 9) > 0.4
    mask[..., 0] = True
    bias = attention_bias(mask, torch.float32)
    assert bias.dtype == torch.float32 and attention_bias(bias, torch.float32) is bias
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.equal(F.scaled_dot_product_attention(q, k, v, attn_mask=bias), want)


def test_prepared_rope_rows_rotate_as_the_table_does():
    torch.manual_seed(2)
    table = rope_table_2d(4, 16, 3)
    positions = torch.tensor([[0, 3, 5, 9], [1, 2, 18, 4]])
    x = torch.randn(2, 4, 6, 16)
    rows = table[positions]
    assert torch.equal(apply_rope(x, rope_rows(rows)), apply_rope(x, rows))
    half = x.to(torch.bfloat16)
    assert (
        torch.equal(apply_rope(half, rope_rows(rows)), apply_rope(half, rows))
        and apply_rope(half, rows).dtype == half.dtype
    )


def test_rmsnorm_in_fp32_skips_only_no_op_casts():
    torch.manual_seed(3)
    norm = RMSNorm(16, 1e-5)
    norm.weight.data = torch.randn(16)
    x = torch.randn(3, 5, 16)
    xf = x.float()
    want = norm.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype)
    assert torch.equal(norm(x), want)


def test_several_streams_in_one_pass_are_the_single_streams():
    keys = rng.keys_tensor(0, [0, 5, 9])
    step = torch.tensor([3, 0, 11])
    together = rng.uniforms(keys, step, ((rng.ACCEPT, 7), (rng.LEVEL, 300)))
    assert torch.equal(together[0], rng.uniform(keys, step, rng.ACCEPT, 7))
    assert torch.equal(together[1], rng.uniform(keys, step, rng.LEVEL, 300))


def test_work_is_skipped_only_eagerly_on_the_cpu():
    assert needed(torch.tensor([False, True])) and not needed(torch.zeros(3, dtype=torch.bool))
    assert (
        torch.compile(lambda flag: torch.where(flag, 1, 0) if needed(flag) else flag, fullgraph=True)(
            torch.zeros(2, dtype=torch.bool)
        ).dtype
        != torch.bool
    )  # compiled, the work is always in the graph
