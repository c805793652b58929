"""LANTERN++'s static trees as draft presets (``draft=naive_extend_57``, ``draft=mc_sim_7b_63``): the node
lists of jadohu/LANTERN's ``models/drafters/choices.py`` as data in conf/draft/, checked for node count,
shape (nodes per level, children per node) and parents, and run end to end."""

from __future__ import annotations

from collections import Counter

import pytest
from helpers import REPO
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from lantern.decoding.tree.draft import StaticTree
from lantern.rng import keys_tensor
from lantern.run.compose import ModelParts, build_decoder

# name: (nodes, nodes per level, children of the root, of its best child, of that one's best child)
PRESETS = {"naive_extend_57": (57, [5, 13, 16, 14, 9], [5, 4, 4]), "mc_sim_7b_63": (25, [4, 8, 8, 3, 2], [4, 3, 3])}


def _compose(*overrides):
    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "conf")):
        return compose("config", overrides=list(overrides))


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_has_their_node_count_shape_and_parents(name):
    nodes, per_level, best_line = PRESETS[name]
    tree = instantiate(_compose(f"draft={name}").draft)
    assert isinstance(tree, StaticTree) and tree.candidates == "deterministic"
    assert tree.nodes == nodes and tree.depth == len(per_level)
    assert [Counter(len(p) for p in tree.paths)[d] for d in range(1, tree.depth + 1)] == per_level
    children = Counter(tree._parent[1:])  # node index -> how many children
    line = [0, tree.paths.index((0,)) + 1, tree.paths.index((0, 0)) + 1]  # root, (0), (0, 0)
    assert [children[n] for n in line] == best_line
    # Parents: every node's parent is the node of its path minus the last rank, listed before it.
    node_of = {(): 0} | {p: i + 1 for i, p in enumerate(tree.paths)}
    for path, index in node_of.items():
        if path:
            assert tree._parent[index] == node_of[path[:-1]] < index
            assert tree._rank[index] == path[-1] and tree._depth[index] == len(path)
    # Ranks below a node are contiguous from 0 (a static tree drafts a node's top ranks).
    for parent in set(tree._parent[1:]):
        ranks = sorted(tree._rank[i] for i in range(1, nodes + 1) if tree._parent[i] == parent)
        assert ranks == list(range(len(ranks)))


def test_naive_extend_57_parents_of_a_few_nodes():
    """Spot checks by hand from their list: [4, 0] hangs below [4] (node 5), [0, 0, 2, 0, 0] (the last
    node) below [0, 0, 2, 0]."""
    tree = instantiate(_compose("draft=naive_extend_57").draft)
    node = {p: i + 1 for i, p in enumerate(tree.paths)}
    assert node[(4,)] == 5 and tree._parent[node[(4, 0)]] == 5
    assert tree._parent[57] == node[(0, 0, 2, 0)] and tree.paths[-1] == (0, 0, 2, 0, 0)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_decodes(name):
    cfg = _compose(
        "model=tiny_random_c2i",
        "decoding=lantern_pp",
        f"draft={name}",
        "model.neighbours.cache_dir=outputs/test_neighbours",
    )
    bundle = instantiate(cfg.model.bundle)
    decoder = build_decoder(cfg.decoding, ModelParts(cfg.model, bundle=bundle))
    assert decoder.settings.record()["nodes"] == PRESETS[name][0]
    result = decoder.generate(bundle.target, bundle.conditioner.encode([1]), keys_tensor(0, [0]))
    assert result.codes.shape == (1, bundle.target.config.num_image_tokens)
