"""Random drafts and neighbour tables the walk tests share: a stand-in drafter, a drawn chain or tree with a
target law mixed from the drafter's and noise, and a random neighbour table."""

from __future__ import annotations

import torch

from lantern import rng
from lantern.rules.relaxation import NeighbourTable

VOCAB, ROWS, DEPTH = 256, 48, 3


class RandomExpander:
    """A stand-in drafter: peaked random distributions, so candidates are often accepted and sometimes not."""

    def __init__(self, generator: torch.Generator):
        self.generator = generator
        self.root_q = self._q(ROWS, 1)[:, 0]

    def _q(self, rows: int, count: int) -> torch.Tensor:
        return torch.softmax(6 * torch.randn(rows, count, VOCAB, generator=self.generator, dtype=torch.float64), -1)

    def expand(self, tokens, parents, depth=None):
        return self._q(*tokens.shape)


def walk_inputs(structure, kind: str, seed: int = 0):
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


def neighbour_table(seed: int = 1) -> NeighbourTable:
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for code in range(VOCAB):
        order = torch.randperm(VOCAB, generator=generator)
        rows.append(order[order != code][:64])  # 64 other codes, a random "nearest first" order
    return NeighbourTable(torch.stack(rows))
