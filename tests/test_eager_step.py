"""The eager step's shortcuts compute exactly what the general forms compute (bit for bit, or the same booleans):
the tree mask by a scatter, the cache's prepared writes and its one-buffer move, the additive attention mask, the
RoPE rows prepared once a forward, RMSNorm without no-op casts, several RNG streams in one pass, and the CPU-only
skips of work no row needs (:func:`lantern.models.devices.needed`)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lantern import rng
from lantern.decoding.batch import _scattered_tree, _tree_by_product, prefix_columns, tree_attention_mask
from lantern.models.devices import needed, share
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
    assert [share(torch.tensor(f)) for f in ([False, False], [True, True], [True, False])] == ["none", "all", "some"]
    assert (
        torch.compile(lambda flag: torch.where(flag, 1, 0) if needed(flag) else flag, fullgraph=True)(
            torch.zeros(2, dtype=torch.bool)
        ).dtype
        != torch.bool
    )  # compiled, the work is always in the graph


def test_a_drafts_mask_rows_are_the_masks_its_ancestry_builds():
    from types import SimpleNamespace

    from lantern.decoding.tree.session import DraftSession
    from lantern.models.sampling import SamplingConfig

    class Model:
        config = SimpleNamespace(cls_token_num=4)

        def head(self, hidden):
            return hidden[..., :8].float()

        def embed_tokens(self, tokens):
            return torch.zeros(*tokens.shape, 16)

    class Recorder:
        max_entries = 100

        def __init__(self):
            self.masks = []

        def __call__(self, embeds, features, positions, slots, mask, cache):
            self.masks.append(mask.clone())
            return torch.ones_like(features)

    generator = torch.Generator().manual_seed(4)
    batch, width, entries = 2, 30, 12
    valid = torch.rand(batch, width, generator=generator) > 0.3
    base, decided = torch.tensor([6, 9]), torch.tensor([2, 3])
    sessions = []
    for eager in (True, False):
        drafter = Recorder()
        session = DraftSession(
            Model(), drafter, None, SamplingConfig(), torch.randn(batch, 16), base, decided, valid, entries
        )
        if not eager:  # the compiled path: an ancestry table and the mask builder
            session.eager = False
            session.ancestors = torch.eye(entries).repeat(batch, 1, 1)
        sessions.append((session, drafter))
    count = 1
    for n in (3, 4, 2):
        parents = torch.randint(0, count, (batch, n), generator=generator)
        tokens = torch.randint(0, 8, (batch, n), generator=generator)
        for session, _ in sessions:
            session.expand(tokens, parents)
        count += n
    (_, eager), (_, built) = sessions
    assert len(eager.masks) == 3 and all(torch.equal(a, b) for a, b in zip(eager.masks, built.masks, strict=True))


def test_the_dynamic_trees_ranking_and_masses_are_the_general_forms():
    generator = torch.Generator().manual_seed(5)
    scores = torch.randint(-3, 2, (4, 40), generator=generator).float()  # many ties
    scores[:, ::7] = float("-inf")
    descending = torch.sort(scores, dim=1, descending=True, stable=True).indices
    assert torch.equal(descending, torch.sort(-scores, dim=1, stable=True).indices)  # ties keep node order
    q = torch.softmax(torch.randn(3, 5, 50, generator=generator), -1)
    q[..., :10] = 0.0  # children of zero mass: log q = -inf either way
    top = q.topk(12, dim=-1)
    assert torch.equal(torch.log(top.values), torch.log(q.gather(-1, top.indices)))


@pytest.mark.parametrize("case", ["reference-dynamic", "exact-dynamic-sampled", "exact-static-guided-window"])
def test_the_eager_shortcuts_emit_what_the_general_forms_emit(case, monkeypatch):
    """End to end on a tiny model: the eager step (its shortcuts) against the same step with every shortcut off
    (the general forms a compiled step runs, taken by making ``torch.compiler.is_compiling`` say so): the same
    keys give the same codes, acceptance histograms and realised TV."""
    from helpers import VOCAB, text_condition, tiny

    from lantern.decoding.tree.decoder import SpeculativeDecoder
    from lantern.decoding.tree.draft import DynamicTree, prior_tree
    from lantern.models.sampling import SamplingConfig
    from lantern.rng import keys_tensor
    from lantern.rules.exact import ExactSampled
    from lantern.rules.factory import lantern_reference
    from lantern.rules.neighbours import CodebookNeighbours

    torch.manual_seed(7)
    table = CodebookNeighbours(codebook=torch.randn(VOCAB, 4), k_max=7)
    sampled = SamplingConfig(temperature=1.0, cfg_scale=3.0)
    sampling, structure, rule = {
        "reference-dynamic": (sampled, DynamicTree(4, 3, 10), lantern_reference(4, 0.2, table)),
        "exact-dynamic-sampled": (sampled, DynamicTree(4, 3, 10, "sampled"), ExactSampled()),
        "exact-static-guided-window": (
            SamplingConfig(temperature=1.0, top_k=20, cfg_scale=2.0, cfg_interval=5),
            prior_tree(4, 4, 12, candidates="sampled"),
            ExactSampled(),
        ),
    }[case]
    model, drafter = tiny(seed=1)
    decode = lambda: SpeculativeDecoder(sampling, drafter=drafter, draft=structure, acceptance=rule).generate(  # noqa: E731
        model, text_condition(), keys_tensor(3, range(4))
    )
    eager = decode()
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    general = decode()
    assert eager.per_sample["histogram"][:, 1:].sum() > 0, "the test should exercise accepted drafts"
    assert torch.equal(eager.codes, general.codes)
    assert torch.equal(eager.per_sample["histogram"], general.per_sample["histogram"])
    assert torch.equal(eager.per_sample["tv_realised_sum"], general.per_sample["tv_realised_sum"])
