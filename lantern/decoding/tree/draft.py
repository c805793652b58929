"""Draft structures: which candidate tokens a drafter proposes each step, as a tree.

A structure grows a :class:`Draft` for every row at once through an :class:`Expander` (the
decoder's view of the drafter): given new nodes (tokens and parent entries) the expander returns
the drafter's next-token distribution at each of them. Structures know nothing about the drafter's
internals or the acceptance rule; they only choose children:

* ``deterministic`` / ``greedy`` candidates: a node's children are the top ranks of its ``q``;
* ``sampled`` candidates: children are drawn from ``q`` without replacement (an exponential race
  on counter-based uniforms, so drafts depend only on the sample key and the step).

:class:`StaticTree` has a fixed topology given as rank paths (``(0,)``, ``(1,)``, ``(0, 0)``...);
:func:`chain` is its single-path case and :func:`prior_tree` builds a LANTERN++-style default shape.
:class:`DynamicTree` is EAGLE-2's: expand the best ``top_k`` nodes per level by cumulative drafter
log-probability, then keep the ``nodes`` best candidates overall.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch

from lantern import checks, rng
from lantern.errors import ConfigError

CANDIDATE_MODES = ("deterministic", "sampled")
MAX_DEPTH = 32  # draft RNG steps are numbered step * 64 + level


@dataclass
class Draft:
    """One draft tree per row. Node 0 is the root: the pending token the target has not seen yet.

    ``tokens`` (B, N+1) long; ``parents`` (B, N+1) long (-1 at the root); ``depth`` (B, N+1) long;
    ``candidates`` (B, N+1, K) long: the tokens each node's level tests, in the order they are to be
    tried (-1 = none); ``children`` (B, N+1, K) long: the tree node holding each candidate, or -1
    when the candidate is not in the tree (a sampled draw the tree dropped: it can still be accepted,
    as the step's last token, but nothing below it was verified); ``q`` (B, N+1, V) the drafter
    distribution each node's candidates were chosen from (zero rows for nodes without candidates);
    ``ancestors`` (B, N+1, N+1) bool, ``ancestors[b, i, j]`` iff node j is node i or one of its
    ancestors; ``max_depth`` a host bound on ``depth``; ``chain`` (host) whether node d is the only node
    at depth d for every d (a chain), so a walk knows before it starts which node each level tests.
    Nodes are in topological order (a parent precedes its children), so the node at depth d has index >= d.

    Why sampled candidates keep dropped draws: recursive rejection sampling is lossless only if the
    candidates tested at a node are the drafter's draws without replacement, in draw order. A tree
    that keeps some draws by their values (EAGLE-2's reranking by cumulative log q, or a static tree
    with a rank gap) would test a value-selected subset, whose law is not the one the rule assumes.
    Testing every draw and stopping after a dropped one keeps the law exact.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depth: torch.Tensor
    candidates: torch.Tensor
    children: torch.Tensor
    q: torch.Tensor
    ancestors: torch.Tensor
    max_depth: int
    chain: bool = False

    @property
    def num_nodes(self) -> int:
        """Nodes including the root."""
        return self.tokens.shape[1]


class Expander(Protocol):
    """What a structure needs from the drafter: feed nodes, get next-token distributions back."""

    root_q: torch.Tensor  # (B, V) the drafter distribution after the pending token

    def expand(self, tokens: torch.Tensor, parents: torch.Tensor, depth: int | None = None) -> torch.Tensor:
        """Feed nodes ``tokens`` (B, n) whose parents are the entries ``parents`` (B, n) (0 = root); ``depth``:
        the depth of every new node when the structure knows it (one level's nodes), else None.

        The new nodes become entries ``E, E+1, ...`` in call order; returns their ``q`` (B, n, V).
        """
        ...


def choose_children(
    q: torch.Tensor, count: int, mode: str, keys: torch.Tensor, step: torch.Tensor, level: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` children per distribution of ``q`` (B, m, V): tokens (B, m, count) and their log q.

    Deterministic (and greedy) children are the top ranks; sampled children are an exponential race on
    uniforms keyed by ``(keys, step * 64 + level)``, i.e. sequential draws without replacement. Children with
    zero probability get log q = -inf (a sampled candidate of zero probability is never tried).
    """
    if mode == "sampled":
        batch, m, vocab = q.shape
        uniforms = rng.uniform(keys, step * 64 + level, rng.DRAFT, m * vocab).view(batch, m, vocab)
        race = q / -torch.log(uniforms)  # (B, m, V)
        tokens = race.topk(count, dim=-1).indices  # (B, m, count)
        return tokens, torch.log(q.gather(-1, tokens))
    top = q.topk(count, dim=-1)  # the top ranks and their masses (the values q holds at them)
    return top.indices, torch.log(top.values)  # (B, m, count) each


def finish_draft(tokens, parents, depth, q, draws, slots, max_depth: int, mode: str, chain: bool = False) -> Draft:
    """Assemble a :class:`Draft` from per-node ``tokens``, ``parents``, ``depth`` (B, N+1) and ``q``.

    ``draws`` (B, N+1, K): the tokens drawn (or ranked) at each node, in order, -1 where none;
    ``slots`` (B, N+1): the slot of each node in its parent's ``draws`` (ignored at the root).
    ``max_depth`` (a host integer, so nothing synchronises) bounds the depth of every node; ``chain``
    (host) says the tree is a single path (see :class:`Draft`).

    Deterministic and greedy candidates are the node's children only (any subset of the ranks is
    exact for these rules). Sampled candidates are every draw whose drafter probability is positive
    (see :class:`Draft`); a draw of probability 0 only comes after the drafter's support is used up,
    so dropping it leaves a prefix of the draw order.
    """
    batch, count = tokens.shape
    width = draws.shape[2]
    device = tokens.device
    index = torch.arange(count, device=device)
    child_parent = parents[:, 1:].clamp_min(0)  # (B, N)
    flat = child_parent * width + slots[:, 1:]  # (B, N) the slot each child occupies
    children = torch.full((batch, count * width), -1, dtype=torch.long, device=device)
    children.scatter_(1, flat, index[1:].expand(batch, -1))
    children = children.view(batch, count, width)  # (B, N+1, K)
    if mode == "sampled":
        possible = (draws >= 0) & (q.gather(2, draws.clamp_min(0)) > 0)  # (B, N+1, K)
        candidates = torch.where(possible, draws, -1)
        children = torch.where(possible, children, -1)
    else:
        candidates = torch.where(children >= 0, draws, -1)
    ancestors = torch.eye(count, dtype=torch.bool, device=device).expand(batch, count, count).clone()
    safe_parents = parents.clamp_min(0)  # root points at itself
    for _ in range(max_depth):
        ancestors = ancestors | ancestors.gather(1, safe_parents[:, :, None].expand(-1, -1, count))
    return Draft(
        tokens=tokens,
        parents=parents,
        depth=depth,
        candidates=candidates,
        children=children,
        q=q,
        ancestors=ancestors,
        max_depth=max_depth,
        chain=chain,
    )


def _check_mode(candidates: str) -> str:
    return checks.choice("draft.candidates", candidates, CANDIDATE_MODES)


class StaticTree:
    """A fixed topology: node ``(r_1, ..., r_d)`` is the rank-``r_d`` child of node ``(r_1, ..., r_{d-1})``.

    Every prefix of a path must itself be a path. One drafter forward per level feeds the nodes
    that have children.
    """

    name = "static_tree"

    def __init__(self, paths, candidates: str = "deterministic"):
        self.candidates = _check_mode(candidates)
        cleaned = []
        for path in paths:
            path = tuple(path)
            if not path or any(not isinstance(r, int) or isinstance(r, bool) or r < 0 for r in path):
                raise checks.refuse("draft.paths", list(path), "a non-empty list of ranks >= 0 per path")
            cleaned.append(path)
        if not cleaned:
            raise ConfigError("a static tree needs at least one path")
        if len(set(cleaned)) != len(cleaned):
            raise ConfigError("tree paths must be distinct")
        known = set(cleaned)
        for path in cleaned:
            if len(path) > 1 and path[:-1] not in known:
                raise ConfigError(f"tree path {list(path)!r} has no parent path {list(path[:-1])!r}")
        checks.integer("draft depth", max(len(p) for p in cleaned), 1, MAX_DEPTH)
        self.paths = sorted(cleaned, key=lambda p: (len(p), p))  # breadth-first, ranks in order
        node_of = {(): 0} | {p: i + 1 for i, p in enumerate(self.paths)}
        self._parent = [-1] + [node_of[p[:-1]] for p in self.paths]
        self._rank = [0] + [p[-1] for p in self.paths]
        self._depth = [0] + [len(p) for p in self.paths]
        has_children = {node_of[p[:-1]] for p in self.paths}
        self.depth = max(self._depth)
        self.nodes = len(self.paths)
        # Per level, on the host once: the nodes, their parents, where each node's token sits in the
        # parents' top-ranked choices, and which nodes are fed to the drafter under which entry.
        entry = {0: 0}
        self._levels = []
        for level in range(1, self.depth + 1):
            nodes = [i for i in range(1, self.nodes + 1) if self._depth[i] == level]
            parents = sorted({self._parent[i] for i in nodes})
            width = max(self._rank[i] for i in nodes) + 1
            slot = {p: j for j, p in enumerate(parents)}
            pick = [slot[self._parent[i]] * width + self._rank[i] for i in nodes]
            fed = [i for i in nodes if i in has_children]
            fed_parents = [entry[self._parent[i]] for i in fed]
            for i in fed:
                entry[i] = len(entry)
            self._levels.append((nodes, parents, width, pick, fed, fed_parents))
        self.max_width = max(level[2] for level in self._levels)  # draws per node: the largest rank + 1
        self._constants: dict[torch.device, list] = {}

    def prepare(self, device: torch.device) -> None:
        """Put the per-level index tensors on ``device`` (once per device; before a step grows a tree there)."""
        if device not in self._constants:
            as_tensor = lambda values: torch.tensor(values, dtype=torch.long, device=device)  # noqa: E731
            self._constants[device] = [
                (as_tensor(nodes), as_tensor(parents), width, as_tensor(pick), as_tensor(fed), as_tensor(fed_parents))
                for nodes, parents, width, pick, fed, fed_parents in self._levels
            ] + [(as_tensor(self._parent), as_tensor(self._depth), as_tensor(self._rank))]

    def _on(self, device: torch.device) -> list:
        """The per-level index tensors on ``device`` (:meth:`prepare`d before: a step never makes them)."""
        tables = self._constants.get(device)
        if tables is None:
            raise RuntimeError(f"{self.name}: prepare({str(device)!r}) was not called before growing a tree there")
        return tables

    @property
    def expansions(self) -> int:
        """Drafter forwards per draft: one per level that feeds nodes with children."""
        return sum(1 for level in self._levels if level[4])

    def describe(self) -> dict:
        """Settings recorded with results."""
        return {"draft": self.name, "depth": self.depth, "nodes": self.nodes, "candidates": self.candidates}

    def grow(
        self, expander: Expander, root_token: torch.Tensor, keys: torch.Tensor, step: torch.Tensor, mode: str
    ) -> Draft:
        """Grow the tree below ``root_token`` (B,); ``mode`` is ``deterministic``, ``sampled`` or ``greedy``."""
        batch, device = root_token.shape[0], root_token.device
        count = self.nodes + 1
        vocab = expander.root_q.shape[-1]
        *levels, (all_parents, all_depth, all_rank) = self._on(device)
        tokens = torch.zeros(batch, count, dtype=torch.long, device=device)
        tokens[:, 0] = root_token
        q = torch.zeros(batch, count, vocab, dtype=expander.root_q.dtype, device=device)
        q[:, 0] = expander.root_q
        draws = torch.full((batch, count, self.max_width), -1, dtype=torch.long, device=device)  # (B, N+1, K)
        for level, (nodes, parents, width, pick, fed, fed_parents) in enumerate(levels, start=1):
            chosen, _ = choose_children(q[:, parents], width, mode, keys, step, level)  # (B, P, width)
            draws[:, parents, :width] = chosen
            tokens[:, nodes] = chosen.flatten(1)[:, pick]
            if fed.numel():
                q[:, fed] = expander.expand(tokens[:, fed], fed_parents.expand(batch, -1), level)
        parents = all_parents.expand(batch, -1)
        depth = all_depth.expand(batch, -1)
        return finish_draft(
            tokens, parents, depth, q, draws, all_rank.expand(batch, -1), self.depth, mode, self.nodes == self.depth
        )


def _place_rows(rows: torch.Tensor, nodes: torch.Tensor, values: torch.Tensor, fill) -> torch.Tensor:
    """``rows`` (B, N+1, X) with ``values`` (B, F, X) written at rows ``nodes`` (B, F); node 0 means dropped
    (those go to a spill row past the end, which is cut off)."""
    batch, count, width = rows.shape
    target = torch.where(nodes > 0, nodes, torch.full_like(nodes, count))  # dropped -> spill row
    spill = torch.full((batch, count + 1, width), fill, dtype=rows.dtype, device=rows.device)
    spill[:, :count] = rows
    spill.scatter_(1, target[:, :, None].expand(-1, -1, width), values)
    return spill[:, :count]


def chain(depth: int, candidates: str = "deterministic") -> StaticTree:
    """A chain of ``depth`` candidates, one per level (the top-ranked or a sampled child)."""
    depth = checks.integer("draft.depth", depth, 1, MAX_DEPTH)
    tree = StaticTree([(0,) * d for d in range(1, depth + 1)], candidates)
    tree.name = "chain"
    return tree


def prior_tree(
    depth: int = 5, top_k: int = 10, nodes: int = 58, decay: float = 0.6, candidates: str = "deterministic"
) -> StaticTree:
    """A static tree with the ``nodes`` most likely paths under a rank prior.

    The prior accepts the rank-r child with weight ``decay ** r / 2`` and a path with the product
    of its ranks' weights; this gives the wide-and-shallow shape of EAGLE/LANTERN++ trees (about 60
    nodes, depth 5, up to ``top_k`` children at the root).
    """
    depth = checks.integer("draft.depth", depth, 1, MAX_DEPTH)
    top_k, nodes = checks.integer("draft.top_k", top_k, 1), checks.integer("draft.nodes", nodes, 1)
    decay = checks.real("draft.decay", decay, 0, 1, low_open=True, high_open=True)
    weight = [math.log(0.5 * decay**r) for r in range(top_k)]
    frontier = [((r,), weight[r]) for r in range(top_k)]
    chosen: list[tuple[int, ...]] = []
    while frontier and len(chosen) < nodes:
        frontier.sort(key=lambda item: (-item[1], item[0]))
        path, score = frontier.pop(0)
        chosen.append(path)
        if len(path) < depth:
            frontier.extend((path + (r,), score + weight[r]) for r in range(top_k))
    tree = StaticTree(chosen, candidates)
    return tree


class DynamicTree:
    """EAGLE-2's dynamic tree: per level keep the ``top_k`` best nodes by cumulative log q, expand each
    into ``top_k`` children, and finally keep the ``nodes`` best of all candidates.

    A candidate's score never exceeds its parent's, and ties keep the earlier (parent) first, so the
    kept set is always a tree. ``depth - 1`` drafter forwards of ``top_k`` nodes each.
    """

    name = "dynamic_tree"

    def __init__(self, depth: int = 5, top_k: int = 10, nodes: int = 58, candidates: str = "deterministic"):
        depth = checks.integer("draft.depth", depth, 1, MAX_DEPTH)
        top_k, nodes = checks.integer("draft.top_k", top_k, 1), checks.integer("draft.nodes", nodes, 1)
        total = top_k + (depth - 1) * top_k * top_k
        if nodes > total:
            raise ConfigError(
                f"dynamic tree nodes={nodes} exceeds the {total} candidates of depth {depth} and top_k {top_k}"
            )
        self.depth, self.top_k, self.nodes = depth, top_k, nodes
        self.candidates = _check_mode(candidates)

    @property
    def expansions(self) -> int:
        """Drafter forwards per draft: one per level below the root's children."""
        return self.depth - 1

    def describe(self) -> dict:
        """Settings recorded with results."""
        return {
            "draft": self.name,
            "depth": self.depth,
            "top_k": self.top_k,
            "nodes": self.nodes,
            "candidates": self.candidates,
        }

    def grow(
        self, expander: Expander, root_token: torch.Tensor, keys: torch.Tensor, step: torch.Tensor, mode: str
    ) -> Draft:
        """Grow the tree below ``root_token`` (B,); ``mode`` is ``deterministic``, ``sampled`` or ``greedy``."""
        k = self.top_k
        root_q = expander.root_q  # (B, V)
        batch, vocab = root_q.shape
        device = root_q.device
        tok, logq = choose_children(root_q[:, None], k, mode, keys, step, 1)  # (B, 1, k)
        cand_tokens, cand_scores = [tok[:, 0]], [logq[:, 0]]
        cand_parents = [torch.full((batch, k), -1, dtype=torch.long, device=device)]
        frontier = torch.arange(k, device=device).expand(batch, k)  # candidate indices (B, k)
        frontier_scores = logq[:, 0]
        frontier_entries = torch.zeros(batch, k, dtype=torch.long, device=device)  # root
        fed_q, fed_cands, fed_draws = [], [], []
        offset = k
        for level in range(2, self.depth + 1):
            new_q = expander.expand(
                cand_tokens[-1].gather(1, frontier - (offset - cand_tokens[-1].shape[1])), frontier_entries, level - 1
            )  # (B, k, V)
            entries = 1 + (level - 2) * k + torch.arange(k, device=device)  # entry ids of the nodes just fed
            fed_q.append(new_q)
            fed_cands.append(frontier)
            tok, logq = choose_children(new_q, k, mode, keys, step, level)  # (B, k, k)
            fed_draws.append(tok)
            scores = (frontier_scores[:, :, None] + logq).flatten(1)  # (B, k*k)
            cand_tokens.append(tok.flatten(1))
            cand_scores.append(scores)
            cand_parents.append(frontier[:, :, None].expand(-1, -1, k).flatten(1))
            if level < self.depth:
                order = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :k]  # (B, k) best first
                frontier = offset + order
                frontier_scores = scores.gather(1, order)
                frontier_entries = entries.expand(batch, -1).gather(1, order // k)
            offset += k * k
        tokens_all = torch.cat(cand_tokens, dim=1)  # (B, C)
        scores_all = torch.cat(cand_scores, dim=1)
        parents_all = torch.cat(cand_parents, dim=1)
        chosen = torch.sort(
            torch.sort(scores_all, dim=1, descending=True, stable=True).indices[:, : self.nodes], dim=1
        ).values  # (B, N)
        count = chosen.shape[1] + 1
        node_of = torch.zeros(batch, tokens_all.shape[1], dtype=torch.long, device=device)
        node_of.scatter_(1, chosen, torch.arange(1, count, device=device).expand(batch, -1))
        parent_cand = parents_all.gather(1, chosen)  # (B, N), -1 for depth 1
        parents = torch.where(
            parent_cand < 0, torch.zeros_like(parent_cand), node_of.gather(1, parent_cand.clamp_min(0))
        )
        levels = torch.cat(
            [torch.ones(k, dtype=torch.long, device=device)]
            + [torch.full((k * k,), d, dtype=torch.long, device=device) for d in range(2, self.depth + 1)]
        )
        q = torch.zeros(batch, count, vocab, dtype=root_q.dtype, device=device)
        q[:, 0] = root_q
        draws = torch.full((batch, count, k), -1, dtype=torch.long, device=device)  # (B, N+1, k)
        draws[:, 0] = cand_tokens[0]
        if fed_q:
            fed_nodes = node_of.gather(1, torch.cat(fed_cands, dim=1))  # (B, F); 0 when not kept
            q = _place_rows(q, fed_nodes, torch.cat(fed_q, dim=1), 0)
            draws = _place_rows(draws, fed_nodes, torch.cat(fed_draws, dim=1), -1)
        root = torch.full((batch, 1), -1, dtype=torch.long, device=device)
        slots = torch.cat(
            [torch.zeros(batch, 1, dtype=torch.long, device=device), chosen % k], dim=1
        )  # rank under the parent
        return finish_draft(
            torch.cat([root_token[:, None], tokens_all.gather(1, chosen)], dim=1),
            torch.cat([root, parents], dim=1),
            torch.cat([torch.zeros(batch, 1, dtype=torch.long, device=device), levels[chosen]], dim=1),
            q,
            draws,
            slots,
            self.depth,
            mode,
        )
