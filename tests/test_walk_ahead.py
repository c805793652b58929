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

from lantern import rng
from lantern.decoding.tree.draft import chain, prior_tree
from lantern.decoding.tree.verify import walk_tree
from lantern.models.sampling import SamplingConfig
from lantern.rules.factory import exact, lantern, lantern_pp
from lantern.rules.relaxation import NeighbourTable

VOCAB, ROWS, DEPTH = 256, 48, 3


class RandomExpander:
    """A stand-in drafter: peaked random distributions, so candidates are often accepted and sometimes not."""

    def __init__(self, generator: torch.Generator):
        self.generator = generator
        self.root_q = self._q(ROWS, 1)[:, 0]

    def _q(self, rows: int, count: int) -> torch.Tensor:
        return torch.softmax(6 * torch.randn(rows, count, VOCAB, generator=self.generator, dtype=torch.float64), -1)

    def expand(self, tokens, parents):
        return self._q(*tokens.shape)


def _inputs(structure, kind: str, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    keys = rng.keys_tensor(seed, range(ROWS))
    step = torch.arange(ROWS) % 5
    if hasattr(structure, "prepare"):  # a static structure's tables, made before a tree is grown
        structure.prepare(torch.device("cpu"))
    draft = structure.grow(
        RandomExpander(generator), torch.randint(VOCAB, (ROWS,), generator=generator), keys, step, kind
    )
    # The target is the drafter mixed with noise in a random proportion per node, so that every kind of
    # candidate is accepted at some nodes and rejected at others, and paths of every length occur.
    noise = torch.softmax(3 * torch.randn(ROWS, draft.num_nodes, VOCAB, generator=generator, dtype=torch.float64), -1)
    share = torch.rand(ROWS, draft.num_nodes, 1, generator=generator, dtype=torch.float64)
    p = share * draft.q + (1 - share) * noise
    p[:, -1] = noise[:, -1]  # the leaf has no drafter row
    return draft, p, keys, step


def _table(seed: int = 1) -> NeighbourTable:
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for code in range(VOCAB):
        order = torch.randperm(VOCAB, generator=generator)
        rows.append(order[order != code][:64])  # 64 other codes, a random "nearest first" order
    return NeighbourTable(torch.stack(rows))


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
    draft, p, keys, step = _inputs(structure, kind)
    assert draft.chain
    rule = SPECS[name](_table()).build(kind, structure)
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
        assert calls == [ROWS * DEPTH] + [ROWS] * DEPTH
    finally:
        del rule.relaxation.relax
    for field in dataclasses.fields(ahead):
        assert torch.equal(getattr(ahead, field.name), getattr(per_level, field.name)), field.name
    lengths = ahead.accepted.bincount(minlength=DEPTH + 1)
    assert (lengths > 0).all(), lengths  # rows stop at every level, so skipped nodes were relaxed too


def test_only_a_chain_is_marked_as_one():
    assert not _inputs(prior_tree(3, 3, 6), "deterministic")[0].chain
