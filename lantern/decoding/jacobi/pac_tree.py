"""SJD-PAC's draft structure: a K-ary tree of depth D rooted at the pending token, then one chain to L nodes.

Proactive Drafting (Kang et al., CVPR 2026; code KangJialiang/SJD-PAC, ``generate_tree_mask_and_retrieve`` and
``setup_speculative_tree_buffers`` in ``scheduler/sjd_pac_iteration_lumina_mgpt.py``) verifies, per target
forward, ``L`` nodes: the root (the pending token, the one the last step drew), a K-ary tree below it whose
levels ``1 .. D-1`` offer ``K`` candidate tokens each, and a single chain continuing the first branch down to
``L`` nodes in all. Every node at depth ``d`` on branch ``b`` carries the same token, candidate ``b`` of column
``d - 1`` (the candidates of a level are shared by every parent: the tree is the product of the levels' candidate
sets). So a step keeps ``K`` candidates per column, (B, K, C), with ``C = M - 1`` columns, ``M`` the main path's
length in nodes; columns ``>= D - 1`` use candidate 0 only.

Node numbering (what the cache slots follow): the main path is nodes ``0 .. M-1`` (so an accepted main path is
already in place), the other tree nodes follow in breadth-first order. Paths (leaves) are ordered by their branch
digits, most significant at depth 1: path 0 is the main path. This module builds the host tables once per
``(K, D, L)``; :meth:`ProactiveTree.prepare` puts them on the model's device for the step.
"""

from __future__ import annotations

import copy
import itertools
from typing import NamedTuple

import torch

from lantern import checks
from lantern.decoding.jacobi.pac_step import Released
from lantern.rules.exact import ExactWindowTest


class TreeTables(NamedTuple):
    """Device tables of a tree of ``L`` nodes, ``P`` paths, ``C`` columns, ``T = D - 1`` branching columns:
    ``ancestors`` (L, L) bool, node ``i`` sees node ``j``; ``depth`` (L,) long; ``token_index`` (L,) where node
    ``j >= 1`` reads its token in the flattened candidates (B, K * C) (``branch * C + depth - 1``; 0 for the root);
    ``paths`` (P, M) node at each depth of each path (-1 past a side path's leaf); ``branch`` (P, T) the branch of
    each path at each branching column; ``last`` (P, T) the path through the last sibling of that column
    (same prefix); ``node_rows`` (P, C) the node each path tests at column ``c`` (its depth ``c + 1`` node; -1: none)."""

    ancestors: torch.Tensor
    depth: torch.Tensor
    token_index: torch.Tensor
    paths: torch.Tensor
    branch: torch.Tensor
    last: torch.Tensor
    node_rows: torch.Tensor


class ProactiveTree(ExactWindowTest):
    """SJD-PAC's tree: ``width`` K >= 1, ``depth`` D >= 1 (levels, the root included), ``window`` L >= the tree's
    ``(K^D - 1) / (K - 1)`` nodes. It is the window test of :mod:`lantern.decoding.jacobi.sjd_pac`'s step (the
    verification structure the step reads), prepared per device. ``selection`` picks the emitted path and draws
    the continued columns: :class:`~lantern.decoding.jacobi.pac_step.Released` (default) or the lossless
    :class:`~lantern.decoding.jacobi.pac_exact.FirstAccepted`."""

    def __init__(self, width: int = 3, depth: int = 3, window: int = 64, selection=None):
        self.selection = Released() if selection is None else selection  # which path wins, how columns continue
        self.width = checks.integer("tree_width", width, 1, note="K, candidates per tree level")
        self.depth = checks.integer("tree_depth", depth, 1, note="D, tree levels with the root")
        self.window = checks.integer("window", window, 1, note="L, tree and chain nodes per target forward")
        k, d = self.width, self.depth
        self.tree_nodes = d if k == 1 else (k**d - 1) // (k - 1)
        if self.tree_nodes > self.window:
            raise checks.refuse(
                "window",
                window,
                f"an integer >= {self.tree_nodes}",
                f"the tree of tree_width={k}, tree_depth={d} has {self.tree_nodes} nodes",
            )
        self.main = d + self.window - self.tree_nodes  # M: nodes on the main path
        self.columns = self.main - 1  # C: draft columns
        self.branching = d - 1  # T: columns with K candidates
        self.paths = k**self.branching  # P
        self._host = self._build()
        self._prepared: dict[str, TreeTables] = {}

    def describe(self) -> None:
        return None  # an exact test: no grouping knobs

    def bound(self, model) -> ProactiveTree:
        """A copy of this tree for one context (a decoder binds its test once per context); its tables are set
        by :meth:`prepare`, and the copies share one table per device."""
        bound = copy.copy(self)
        bound.tables = None
        return bound

    def prepare(self, device: torch.device) -> None:
        """The tree's index tables on ``device`` (:func:`lantern.decoding.loop.prepare`), built once per device."""
        key = str(device)
        if key not in self._prepared:
            self._prepared[key] = TreeTables(*(t.to(device) for t in self._host))
        self.tables = self._prepared[key]

    def _build(self) -> TreeTables:
        k, t, window, main = self.width, self.branching, self.window, self.main
        digits = list(itertools.product(range(k), repeat=t))  # (P,) branch digits, path 0 = all zeros
        ids: dict[tuple, int] = {(0,) * d: d for d in range(t + 1)}  # main path's tree part: node = depth
        nodes = main
        for level in range(1, t + 1):  # other tree nodes, breadth first
            for prefix in sorted({p[:level] for p in digits}):
                if prefix not in ids:
                    ids[prefix], nodes = nodes, nodes + 1
        assert nodes == window, (nodes, window)
        parent = [-1] + list(range(main - 1)) + [0] * (window - main)
        depth = list(range(main)) + [0] * (window - main)
        token = [0] + [c for c in range(main - 1)] + [0] * (window - main)  # main path: candidate 0 of column d-1
        for prefix, node in ids.items():
            if node >= main:
                parent[node], depth[node] = ids[prefix[:-1]], len(prefix)
                token[node] = prefix[-1] * self.columns + len(prefix) - 1
        ancestors = torch.zeros(window, window, dtype=torch.bool)
        for node in range(window):
            walk = node
            while walk >= 0:
                ancestors[node, walk] = True
                walk = parent[walk]
        paths = torch.full((len(digits), main), -1, dtype=torch.long)
        for row, branches in enumerate(digits):
            paths[row, : t + 1] = torch.tensor([ids[branches[:d]] for d in range(t + 1)])
        paths[0] = torch.arange(main)
        branch = torch.tensor(digits, dtype=torch.long).view(len(digits), t)
        stride = torch.tensor([k ** (t - 1 - c) for c in range(t)], dtype=torch.long)
        rows = torch.arange(len(digits))[:, None]
        last = rows + (k - 1 - branch) * stride  # (P, T) same prefix, branch K-1 at that column
        return TreeTables(ancestors, torch.tensor(depth), torch.tensor(token), paths, branch, last, paths[:, 1:])
