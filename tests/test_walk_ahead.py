"""A chain's nodes relaxed in one call before the walk give the walk of one relaxation per level, bit for bit.

The walk relaxes every node of a chain at once (``lantern.decoding.tree.verify``). That is only a change
of how many rows a call sees: the accepted path, the drawn token, the recorded TV and merged mass must be
the same tensors as with one relaxation per level, for every candidate kind and rule, including rows that
stop early (whose later nodes are relaxed ahead but never read).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers_walk import DEPTH, ROWS, neighbour_table, walk_inputs

from lantern.decoding.tree.draft import chain, prior_tree
from lantern.decoding.tree.verify import walk_tree
from lantern.models.sampling import SamplingConfig
from lantern.rules.factory import exact, lantern, lantern_pp

SPECS = {
    "exact": lambda table: exact(),
    "lantern_0.1": lambda table: lantern(64, 0.1, table),
    "lantern_0.4": lambda table: lantern(64, 0.4, table),
    "lantern_pp": lambda table: lantern_pp(10, 3.0, table),
}


@pytest.mark.parametrize("kind", ["sampled", "deterministic", "greedy"])
@pytest.mark.parametrize("name", sorted(SPECS))
def test_relaxing_a_chain_ahead_walks_as_one_relaxation_per_level(kind, name):
    structure = chain(DEPTH, "deterministic" if kind == "greedy" else kind)
    draft, p, keys, step = walk_inputs(structure, kind)
    assert draft.chain
    rule = SPECS[name](neighbour_table()).build(kind, structure)
    sampling = SamplingConfig(temperature=0.0 if kind == "greedy" else 1.0)

    calls = []
    relax = rule.relaxation.relax

    def counted(p_rows, *args):
        calls.append(p_rows.shape[0])
        return relax(p_rows, *args)

    rule.relaxation.relax = counted
    try:
        ahead = walk_tree(draft, p, rule, sampling, keys, step)
        assert calls == [ROWS * DEPTH]  # one call over every node of every row
        per_level = walk_tree(dataclasses.replace(draft, chain=False), p, rule, sampling, keys, step)
        # level by level a relaxed rule relaxes each level's rows; the exact rule's node takes p itself
        assert calls == [ROWS * DEPTH] + ([] if name == "exact" else [ROWS] * DEPTH)
    finally:
        del rule.relaxation.relax
    for field in dataclasses.fields(ahead):
        assert torch.equal(getattr(ahead, field.name), getattr(per_level, field.name)), field.name
    lengths = ahead.accepted.bincount(minlength=DEPTH + 1)
    assert (lengths > 0).all(), lengths  # rows stop at every level, so skipped nodes were relaxed too


def test_only_a_chain_is_marked_as_one():
    assert not walk_inputs(prior_tree(3, 3, 6), "deterministic")[0].chain
