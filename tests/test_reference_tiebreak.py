"""semantics=reference at temperature 0: which of several tied paths the authors' greedy LANTERN accepts,
and the RoPE rows of draft nodes past the image grid.

Their ``evaluate_posterior`` scores every root-to-leaf path by its passing prefix and takes
``torch.argmax`` over those lengths: the first path in ``retrieve_indices`` order. For their EAGLE-2
trees at temperature 0 that is leaf by leaf in increasing node index (``leaf_order="index"``), for their
static trees the paths sorted by node-index sequence (``leaf_order="sorted"``). Each hand-built tree
below has a tie that "the first deepest passing node in node order" (our earlier rule) breaks otherwise.

Vocabulary of 6, neighbour table ``i -> i+1, i+2, ...``, k = 1, delta = 0.2: at the root row
``[0.34, 0.26, 0.10, ...]`` token 0 passes (the argmax) and so does token 1 (0.26 + its neighbour's
0.10 = 0.36 beats 0.34): two passing siblings.
"""

from __future__ import annotations

import pytest
import torch
from helpers import CountingBackend, V, greedy_draft, text_condition, tiny

from lantern.decoding.tree.decoder import SpeculativeDecoder
from lantern.decoding.tree.draft import DynamicTree
from lantern.decoding.tree.step import grid_positions
from lantern.errors import ConfigError
from lantern.models.kv_cache import NoCache
from lantern.models.sampling import SamplingConfig
from lantern.rng import keys_tensor
from lantern.rules.factory import lantern, lantern_reference
from lantern.rules.neighbours import CodebookNeighbours
from lantern.rules.reference import LanternReference

TABLE = torch.tensor([[(i + s) % V for s in range(1, V)] for i in range(V)])
ROOT = [0.34, 0.26, 0.10, 0.10, 0.10, 0.10]  # tokens 0 and 1 both pass
FAIL_5 = [0.10, 0.10, 0.10, 0.40, 0.10, 0.20]  # token 5 fails (0.2 + 0.1 < 0.4); argmax 3


def _rows(rows: dict[int, list[float]], count: int) -> torch.Tensor:
    """Target rows (1, count, V): the given ones, uniform elsewhere."""
    p = torch.full((1, count, V), 1.0 / V, dtype=torch.float64)
    for node, row in rows.items():
        p[0, node] = torch.tensor(row, dtype=torch.float64)
    return p


def _rule(leaf_order: str = "index") -> LanternReference:
    return LanternReference(1, TABLE, delta=0.2, candidates="greedy", leaf_order=leaf_order)


def _walk(rule, tokens, parents, rows):
    draft = greedy_draft(tokens, parents)
    path, next_token, _, _ = rule.walk(draft, _rows(rows, len(tokens)))
    return [n for n in path[0].tolist() if n >= 0], int(next_token)


def test_a_leaf_sibling_wins_over_an_earlier_node_with_a_failing_child():
    """Nodes 1 (token 0) and 2 (token 1) pass under the root; node 3 below node 1 fails. Both leaves (2
    and 3) have accept length 1; their EAGLE-2 order lists leaf 2 first, so node 2 is accepted (the
    node-order rule took node 1); the next token is node 2's own argmax, 4."""
    tokens, parents = [9 % V, 0, 1, 5], [-1, 0, 0, 1]
    rows = {0: ROOT, 1: FAIL_5, 2: [0.1, 0.1, 0.1, 0.1, 0.5, 0.1]}
    assert _walk(_rule("index"), tokens, parents, rows) == ([2], 4)
    # Their static trees sort the paths: [0, 1, 3] before [0, 2], so node 1 is accepted there.
    assert _walk(_rule("sorted"), tokens, parents, rows) == ([1], 3)


def test_the_tie_is_broken_at_the_longest_depth_only():
    """Depth 2: node 3 (below 1) and node 4 (below 2) both pass, node 5 below node 3 fails. Leaves in
    index order are 4, 5 (both accept length 2): path 2 -> 4 (the node-order rule: 1 -> 3)."""
    tokens, parents = [3, 0, 1, 4, 4, 5], [-1, 0, 0, 1, 2, 3]
    below = [0.1, 0.1, 0.1, 0.1, 0.5, 0.1]  # argmax 4: nodes 3 and 4 pass
    rows = {0: ROOT, 1: below, 2: below, 3: FAIL_5, 4: [0.6, 0.1, 0.1, 0.1, 0.05, 0.05]}
    assert _walk(_rule("index"), tokens, parents, rows) == ([2, 4], 0)
    assert _walk(_rule("sorted"), tokens, parents, rows) == ([1, 3], 3)


def test_sorted_order_follows_paths_not_node_indices():
    """A dynamic tree's nodes of one depth need not follow their parents' order: node 3 is below node 2,
    node 4 below node 1, both pass and are leaves. Index order: leaf 3 first (path 2 -> 3); sorted
    order: [0, 1, 4] before [0, 2, 3] (path 1 -> 4)."""
    tokens, parents = [3, 0, 1, 4, 4], [-1, 0, 0, 2, 1]
    below = [0.1, 0.1, 0.1, 0.1, 0.5, 0.1]
    rows = {0: ROOT, 1: below, 2: below, 3: [0.1, 0.5, 0.1, 0.1, 0.1, 0.1], 4: [0.1, 0.1, 0.5, 0.1, 0.1, 0.1]}
    assert _walk(_rule("index"), tokens, parents, rows) == ([2, 3], 1)
    assert _walk(_rule("sorted"), tokens, parents, rows) == ([1, 4], 2)


def test_nothing_passing_emits_the_roots_argmax():
    tokens, parents = [0, 4, 5], [-1, 0, 0]
    for order in ("index", "sorted"):
        assert _walk(_rule(order), tokens, parents, {0: ROOT}) == ([], 0)


def test_bad_options_are_refused_with_one_line():
    with pytest.raises(ConfigError, match=r"leaf_order='first': expected one of index, sorted"):
        _rule("first")
    with pytest.raises(ConfigError, match=r"past_grid='wrap': expected one of clamp, zero_rope"):
        LanternReference(1, TABLE, delta=0.2, candidates="greedy", past_grid="wrap")


def test_reference_rules_read_zero_rope_rows_past_the_grid_and_bounded_ones_clamp():
    table = CodebookNeighbours(codebook=torch.randn(8, 4), k_max=7)
    assert lantern_reference(4, 0.3, table).build("greedy").past_grid == "zero_rope"
    assert not hasattr(lantern(4, 0.3, table).build("greedy"), "past_grid")  # the step clamps
    positions = torch.tensor([[18, 19, 20, 21]])
    assert grid_positions(positions, 20, "clamp").tolist() == [[18, 19, 19, 19]]
    assert grid_positions(positions, 20, "zero_rope").tolist() == [[18, 19, 0, 0]]


def test_zero_rope_positions_equal_a_zero_padded_table():
    """What the authors' code does past the grid (tables padded with zero rows) is what position 0 (a
    condition slot, RoPE row zero) gives: target and drafter outputs equal a zero-padded table's."""
    model, drafter = tiny()
    config = model.config
    limit = config.max_seq_len
    assert not model.rope[0].any() and not drafter.rope[0].any()
    x = torch.randn(1, 4, config.dim)
    beyond = torch.tensor([[limit - 2, limit - 1, limit, limit + 1]])
    padded = torch.cat([model.rope, torch.zeros(10, *model.rope.shape[1:])])
    slots, mask = torch.arange(4)[None], torch.ones(4, 4, dtype=torch.bool).tril()[None, None]
    ours = model.forward_embeddings(x, grid_positions(beyond, limit, "zero_rope"), slots, mask, NoCache())
    saved = model.rope
    model.rope = padded
    try:
        theirs = model.forward_embeddings(x, beyond, slots, mask, NoCache())
    finally:
        model.rope = saved
    assert torch.allclose(ours, theirs, atol=1e-6)
    # The drafter: entries past its table go to entry 0 (RoPE row 1, a condition row when T >= 2).
    entries = torch.tensor([[drafter.max_entries - 1, drafter.max_entries, drafter.max_entries + 1]])
    features = torch.randn(1, 3, config.dim)
    dmask = torch.ones(3, 3, dtype=torch.bool).tril()[None, None]
    sent = torch.where(entries < drafter.max_entries, entries, 0)
    ours = drafter(x[:, :3], features, sent, slots[:, :3], dmask, NoCache())
    saved = drafter.rope
    drafter.rope = torch.cat([saved, torch.zeros(10, *saved.shape[1:])])
    try:
        theirs = drafter(x[:, :3], features, entries, slots[:, :3], dmask, NoCache())
    finally:
        drafter.rope = saved
    assert torch.allclose(ours, theirs, atol=1e-6)


def test_reference_greedy_dynamic_tree_compiles_as_one_graph_and_matches_eager():
    """The new tie-break and the past-grid positions keep the step pure and static-shape."""
    model, drafter = tiny()
    cond, keys = text_condition(), keys_tensor(1, range(4))
    sampling = SamplingConfig(temperature=0, cfg_scale=3.0)
    table = CodebookNeighbours(codebook=torch.randn(model.config.vocab_size, 4), k_max=16)
    for order in ("index", "sorted"):
        spec = lantern_reference(4, 0.3, table)
        structure = DynamicTree(4, 3, 10)
        eager = SpeculativeDecoder(sampling, drafter=drafter, draft=structure, acceptance=spec)
        eager.rule.leaf_order = order
        expected = eager.generate(model, cond, keys)
        backend = CountingBackend()
        compiled = SpeculativeDecoder(
            sampling, drafter=drafter, draft=structure, acceptance=spec, compile="default", backend=backend
        )
        compiled.rule.leaf_order = order
        for _ in range(2):
            assert torch.equal(compiled.generate(model, cond, keys).codes, expected.codes)
        assert backend.graphs == 1


def test_the_rule_takes_the_authors_path_order_of_its_draft_structure():
    """Static trees (and chains) list paths sorted, as the authors' generate_tree_buffers; EAGLE-2 trees by leaf index."""
    from lantern.decoding.tree.draft import StaticTree, chain
    from lantern.rules.factory import lantern_reference

    table = (torch.arange(16)[:, None] + torch.arange(1, 5)[None, :]) % 16  # (V, 4) other codes
    spec = lantern_reference(k=3, delta=0.1, neighbours=table)
    static = StaticTree([[0], [1], [0, 0], [1, 0]])
    assert spec.build("greedy", static).leaf_order == "sorted"
    assert spec.build("greedy", chain(3)).leaf_order == "sorted"
    assert spec.build("greedy", DynamicTree(depth=2, top_k=2, nodes=4)).leaf_order == "index"
    assert spec.build("greedy").leaf_order == "index"
