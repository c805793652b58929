"""LANTERN as the authors' released code runs it (``semantics=reference``), with its realised TV measured.

Read from jadohu/LANTERN (commit 3a56e45), ``models/ea_model_llamagen.py`` (``evaluate_posterior``
for EAGLE-2 trees, ``evaluate_posterior_v1`` for static trees) and ``entrypoints/generate_codebook.py``.
Where that code departs from the paper's text, this module follows the code; each departure is named
where it happens:

* neighbour tables from the raw codebook rows (``generate_codebook.py``: ``torch.cdist`` on
  ``quantize.embedding.weight``), while the tokenizer quantises in the l2-normalised space; this is
  the default table distance under this semantics (``model.neighbours.normalize`` overrides it);
* ``p~(x) = p(x) + S_m`` on the *current* (already modified) distribution, accepted iff ``u <= p~``;
* after a rejection, ``x`` is zeroed and, only if at least one neighbour was merged, the slice
  ``nearest_latents[x, :k+1]`` (k+1 entries, one more than the k the test used); renormalised; the
  next sibling is tested on that; the final resample draws from it;
* sampled candidates (the static-tree variant): accept iff ``u <= p~(x) / q'(x)`` with ``q'`` the
  drafter distribution without the earlier siblings; on rejection the neighbour slice is zeroed in
  ``q'`` (not renormalised) before ``p <- norm(max(0, p - q'))``;
* greedy: every root-to-leaf path is tested on the unmodified ``p`` (``x`` passes iff it is the argmax
  of the row with ``p(x)`` replaced by ``p~(x)``, first index on ties); the path with the longest
  passing prefix wins, and when several tie (frequent: the relaxed test lets several siblings pass)
  the first one in the reference's ``retrieve_indices`` order, i.e. ``torch.argmax`` over the paths'
  accept lengths: for its EAGLE-2 trees at temperature 0 paths come leaf by leaf in increasing node
  index (unsorted), for its static trees sorted by node-index sequence (``leaf_order``); the step
  accepts that path up to its deepest passing node; then the argmax of the unmodified ``p`` there is
  emitted. The reference takes that softmax unfiltered; here it is after top-k/top-p (the same when
  both are off);
* draft nodes past the last image position (the final steps' overshoot) read zero RoPE rows, as the
  reference pads its tables with zeros (``past_grid="zero_rope"``; bounded semantics clamp to the last
  row). Their tokens are never emitted, but their pass or fail lengthens paths and so decides greedy
  ties on the last image tokens, and in the drafter their features decide which nodes a dynamic tree
  keeps.

None of these laws is bounded by ``delta``. Their realised TV per emitted token is computed exactly:
in closed form for deterministic and greedy candidates (greedy: the mass merged onto an accepted
candidate), and for a single sampled candidate per node as the mixture over ``x ~ q`` (on every
``tv_audit_every``-th step, as it sums over the vocabulary). With several sampled siblings per node
the law has no tractable closed form: those tokens are recorded as unmeasured (NaN).
"""

from __future__ import annotations

import math

import torch

from lantern import checks
from lantern.errors import ConfigError
from lantern.models.devices import needed, share
from lantern.models.sampling import SamplingConfig, race
from lantern.rules.api import NodeOutcome, PathChoice, check_candidates
from lantern.rules.exact import first, without
from lantern.rules.relaxation import NeighbourTable, as_table

LEAF_ORDERS = ("index", "sorted")  # see LanternReference.tie_keys
PAST_GRID = ("clamp", "zero_rope")  # see lantern.decoding.tree.step.grid_positions


def _renormalised(weights: torch.Tensor) -> torch.Tensor:
    """Rows of ``weights`` over their sum; a row with no mass becomes uniform (as the reference's ``ones``)."""
    total = weights.sum(dim=-1, keepdim=True)  # (R, 1)
    return torch.where(total > 0, weights / total.clamp_min(1e-30), 1.0 / weights.shape[-1])


class LanternReference:
    """The authors' LANTERN (``delta``) or LANTERN++ (``lam``) rule for candidates of one kind; see the
    module docstring. Greedy candidates choose among whole paths (:attr:`walk`).

    ``leaf_order``: how the reference lists paths, which decides greedy ties (:meth:`tie_keys`):
    ``index`` (its EAGLE-2 dynamic trees) or ``sorted`` (its static trees). ``past_grid``: the RoPE rows
    of draft nodes past the last image position, read by the decoding step: ``zero_rope`` (the
    reference's zero-padded rows) or ``clamp`` (the last image position's row, as bounded semantics).
    """

    def __init__(
        self,
        k: int,
        neighbours: NeighbourTable,
        delta: float | None = None,
        lam: float | None = None,
        candidates: str = "deterministic",
        leaf_order: str = "index",
        past_grid: str = "zero_rope",
    ):
        self.leaf_order = checks.choice(
            "leaf_order", leaf_order, LEAF_ORDERS, note="the reference's path order for greedy ties"
        )
        self.past_grid = checks.choice(
            "past_grid", past_grid, PAST_GRID, note="positions of draft nodes past the image grid"
        )
        self.table = as_table(neighbours, k)
        if k + 1 > self.table.k_max:
            raise ConfigError(
                f"semantics=reference zeroes k+1={k + 1} neighbours after a rejection (the authors' slice "
                f"nearest_latents[x, :k+1]) but the neighbour table has k_max={self.table.k_max} columns: "
                f"set model.neighbours.k_max>={k + 1} or k<={self.table.k_max - 1}"
            )
        self.k, self.delta, self.lam = k, delta, lam
        self.candidates = check_candidates(candidates)
        self.walk = self.select_path if self.candidates == "greedy" else None
        self.relax = None  # each sibling is tested on the law the earlier rejections left: nothing to do ahead

    # ------------------------------------------------------------------ the relaxed test, one candidate per row

    def prepare(self, device: torch.device) -> None:
        """Put the neighbour columns a step reads on ``device``: ``k`` (the relaxed test) and ``k + 1``
        (the authors' zeroing after a rejection)."""
        for width in (self.k, self.k + 1):
            self.table.columns(width, device)

    def _bound(self, px: torch.Tensor) -> torch.Tensor | float:
        """The most neighbour mass a candidate with target mass ``px`` may take: ``delta``, or ``(lam - 1) px``
        with a trailing unit dimension (to compare with running sums over its neighbours)."""
        return self.delta if self.lam is None else ((self.lam - 1.0) * px)[..., None]

    def relaxed_probability(
        self, p: torch.Tensor, x: torch.Tensor, near: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(p~(x), S_m, m)`` (R,) for candidates ``x`` (R,) on ``p`` (R, V): ``S_m`` is the mass of the
        longest prefix of x's k nearest neighbours within the bound (zero-mass ones fill prefix slots).
        ``near`` (R, k): those neighbours, when the caller looked them up already."""
        self.table.check(p)
        near = self.table.columns(self.k, p.device)[x] if near is None else near  # (R, k)
        px = p.gather(1, x[:, None])[:, 0]
        cumulative = p.gather(1, near).cumsum(dim=1)  # (R, k)
        # A running sum of masses never decreases (rounding is monotone too), so the sums within the bound
        # are a prefix and the largest of them is the prefix's mass.
        merged = cumulative <= self._bound(px)  # (R, k) a prefix
        moved = torch.where(merged, cumulative, 0.0).amax(dim=1)  # (R,) 0 when nothing fits
        return px + moved, moved, merged.sum(dim=1)

    @staticmethod
    def rejected(x: torch.Tensor, wide: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        """(R, k+2) the codes the reference zeroes in ``p`` after rejecting ``x``: ``x`` and, when
        ``m >= 1``, the slice ``nearest_latents[x, :k+1]`` (``wide``, (R, k+1); ``x`` again in its place otherwise)."""
        return torch.cat([x[:, None], torch.where((m > 0)[:, None], wide, x[:, None])], dim=1)

    def zeroed(self, p: torch.Tensor, x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        """(R, V) bool: the entries the reference zeroes after rejecting ``x``: the slice
        ``nearest_latents[x, :k+1]`` when ``m >= 1`` (``x`` itself is added by the caller where it applies)."""
        near = self.table.columns(self.k + 1, p.device)[x]  # (R, k+1): one more than the test used
        mask = torch.zeros(p.shape, dtype=torch.bool, device=p.device)
        return mask.scatter_(1, near, (m > 0)[:, None].expand_as(near))

    # ------------------------------------------------------------------ one tree node

    def node(
        self, p, tokens, valid, q, u, noise, sampling: SamplingConfig, audit: bool = True, depth=None
    ) -> NodeOutcome:
        """Siblings in order on the modified distribution (see the module docstring); the same at every ``depth``."""
        if self.candidates == "sampled":
            return self._sampled(p, tokens, valid, q, u, audit)
        # Deterministic (the greedy walk goes through :meth:`select_path` instead). On the all-reject
        # path the modified distribution does not depend on the uniforms, so the law of the node's token
        # is L = sum_s reach_s p~_s delta_{x_s} + reach_{K+1} p_K (every tested sibling is zero in p_K).
        # One draw y ~ L then decides the step exactly as the sequential test would: sibling s is
        # accepted iff y = x_s (the same coupling as the exact rule's closed form, so delta = 0 gives
        # the exact rule's tokens).
        rows, count = tokens.shape
        self.table.check(p)
        xs = tokens.clamp_min(0)  # (R, K)
        # Every sibling's k+1 nearest codes in one lookup: the test reads the first k, a rejection zeroes all.
        wide = self.table.columns(self.k + 1, p.device)[xs]  # (R, K, k+1)
        # Per sibling: one gather reads x's mass and its k neighbours' (relaxed_probability's two gathers); a
        # rejection zeroes x and its k+1 nearest codes when something was merged (rejected()), else x alone.
        reads = torch.cat([xs[:, :, None], wide[:, :, : self.k]], dim=2).unbind(1)  # K x (R, 1+k)
        zeroes = torch.cat([xs[:, :, None], wide], dim=2)  # (R, K, k+2)
        alone = xs[:, :, None].expand_as(zeroes).unbind(1)  # K x (R, k+2)
        current = p
        reach = torch.ones(rows, dtype=p.dtype, device=p.device)  # (R,) probability that sibling s is tested
        gains, mass = [], []
        for slot, (live, read, zero) in enumerate(zip(valid.unbind(1), reads, zeroes.unbind(1), strict=True)):
            rows_live = share(live)  # eager CPU: "none" for a sibling no row has (nothing changes), "all" at batch 1
            if rows_live == "none":
                gains.append(torch.zeros_like(reach))
                mass.append(torch.zeros_like(reach))
                continue
            masses = current.gather(1, read)  # (R, 1+k): p(x), then x's neighbours nearest first
            px = masses[:, 0]
            cumulative = masses[:, 1:].cumsum(dim=1)  # (R, k) as relaxed_probability: the merged sums are a prefix
            merged = cumulative <= self._bound(px)
            moved = torch.where(merged, cumulative, 0.0).amax(dim=1)  # (R,) S_m, 0 when nothing fits
            p_tilde = px + moved
            gains.append(moved)
            index = torch.where(merged[:, :1], zero, alone[slot])  # m >= 1 iff the prefix is not empty
            rejected = _renormalised(current.scatter(1, index, 0.0))
            if rows_live == "all":  # every row tests this sibling: the selections below would take every new value
                mass.append(reach * p_tilde)
                reach, current = reach * (1 - p_tilde).clamp_min(0), rejected
                continue
            mass.append(torch.where(live, reach * p_tilde, 0.0))  # (R,) the law's mass at x_s
            reach = torch.where(live, reach * (1 - p_tilde).clamp_min(0), reach)
            current = torch.where(live[:, None], rejected, current)
        # Every tested sibling is zero in the final law, so adding the siblings' masses onto it in one scatter
        # gives the same sums as adding them one by one first.
        law = (reach[:, None] * current).scatter_add(1, xs, torch.stack(mass, dim=1))  # (R, V)
        drawn = race(law, noise, sampling)  # (R,)
        chosen = first(valid & (tokens == drawn[:, None]))
        moved = torch.stack(gains, dim=1).gather(1, chosen.clamp_min(0)[:, None])[:, 0]  # (R,)
        merged = torch.where(chosen >= 0, moved, 0.0)
        tv = 0.5 * (law - p).abs().sum(dim=1)
        return NodeOutcome(chosen=chosen, target=current, proposal=q, emitted=drawn, tv=tv, merged=merged)

    def _sampled(self, p, tokens, valid, q, u, audit: bool) -> NodeOutcome:
        """The static-tree variant: ``u <= p~(x) / q'(x)``; neighbours zeroed in ``q'`` on rejection."""
        rows, count = tokens.shape
        tv = self._sampled_law_tv(p, q) if audit else torch.full((rows,), math.nan, dtype=p.dtype, device=p.device)
        tv = torch.where(valid.sum(dim=1) > 1, math.nan, tv)  # several sampled siblings: no closed form
        tv = torch.where(valid.any(dim=1), tv, torch.zeros_like(tv))
        current, proposal = p, q
        chosen = torch.full((rows,), -1, dtype=torch.long, device=p.device)
        merged = torch.zeros(rows, dtype=p.dtype, device=p.device)
        for slot in range(count):
            x = tokens[:, slot].clamp_min(0)
            trying = valid[:, slot] & (chosen < 0)
            if not needed(trying):  # eager CPU: no row tries this sibling, so nothing below changes
                continue
            p_tilde, moved, m = self.relaxed_probability(current, x)
            qx = proposal.gather(1, x[:, None])[:, 0]
            accept = trying & (qx > 0) & (u[:, slot] * qx <= p_tilde)
            chosen = torch.where(accept, slot, chosen)
            merged = torch.where(accept, moved, merged)
            reject = trying & ~accept
            q_zeroed = proposal.masked_fill(self.zeroed(current, x, m), 0.0)  # not renormalised, as the reference
            current = torch.where(reject[:, None], _renormalised((current - q_zeroed).clamp_min(0)), current)
            proposal = torch.where(reject[:, None], without(proposal, x), proposal)
        return NodeOutcome(chosen=chosen, target=current, proposal=proposal, emitted=None, tv=tv, merged=merged)

    def _sampled_law_tv(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """TV(p, law) for ONE sampled candidate ``x ~ q`` under the reference rule, summed over every x.

        Rejecting x leaves ``norm(max(0, p - q_x))`` with ``q_x`` = ``q`` zeroed on Z_x (x's k+1
        neighbours when m(x) >= 1): that is ``r0 + min(p, q) on Z_x`` over its sum, with
        ``r0 = max(0, p - q)``, so the mixture needs O(V k) work per row, not O(V^2).
        """
        rows, vocab = p.shape
        near = self.table.columns(self.k, p.device)  # (V, k)
        wide = self.table.columns(self.k + 1, p.device)  # (V, k+1)
        # Gathers by index_select: the same values as p[:, near], several times faster than advanced indexing on CPU.
        cumulative = p.index_select(1, near.flatten()).view(rows, vocab, -1).cumsum(dim=2)  # (R, V, k) of every x
        # The sums within the bound are a prefix (see relaxed_probability): its length is where the bound
        # falls among the running sums, and its mass the last sum in it; no (R, V, k) mask or copy.
        bound = torch.as_tensor(self._bound(p), dtype=p.dtype, device=p.device).expand(rows, vocab, 1)
        m = torch.searchsorted(cumulative, bound.contiguous(), right=True)[..., 0]  # (R, V)
        last = cumulative.gather(2, (m - 1).clamp_min(0)[..., None])[..., 0]  # (R, V)
        moved = torch.where(m > 0, last, torch.zeros_like(last))  # (R, V)
        accept = torch.where(
            q > 0, torch.clamp((p + moved) / q.clamp_min(1e-30), max=1.0), torch.zeros_like(p)
        )  # (R, V)
        r0 = (p - q).clamp_min(0)
        overlap = torch.minimum(p, q)
        extra = torch.where(
            m > 0, overlap.index_select(1, wide.flatten()).view(rows, vocab, -1).sum(dim=2), torch.zeros_like(p)
        )  # (R, V) mass freed on Z_x
        norm = r0.sum(dim=1, keepdim=True) + extra  # (R, V)
        weight = q * (1 - accept)  # (R, V) probability of drawing x and rejecting it
        spread = torch.where(norm > 0, weight / norm.clamp_min(1e-30), torch.zeros_like(p))
        on_zeroed = torch.zeros_like(p).scatter_add_(
            1,
            wide.reshape(1, -1).expand(rows, -1),
            (spread * (m > 0))[:, :, None].expand(-1, -1, wide.shape[1]).reshape(rows, -1),
        )
        empty = torch.where(norm > 0, torch.zeros_like(p), weight).sum(dim=1, keepdim=True) / vocab
        law = q * accept + r0 * spread.sum(dim=1, keepdim=True) + overlap * on_zeroed + empty
        return 0.5 * (law - p).abs().sum(dim=1)

    # ------------------------------------------------------------------ greedy: the longest accepted path

    def select_path(self, draft, p: torch.Tensor, *_) -> PathChoice:
        """The greedy walk: each node passes on its parent's unmodified row; among the root-to-leaf paths
        with the longest fully passing prefix the first one in the reference's path order wins (see
        :meth:`tie_keys`), accepted up to its deepest passing node; then the unmodified argmax there is next.
        Greedy: the walk hook's sampling, keys, step and audit arguments are not needed.

        Returns ``(path (B, D), next_token (B,), tv (B, D+1), merged (B, D))``.
        """
        batch, count, vocab = p.shape
        depth_max = draft.max_depth
        parents = draft.parents.clamp_min(0)  # (B, N+1)
        rows_p = p.gather(1, parents[:, :, None].expand(-1, -1, vocab)).reshape(batch * count, vocab)  # parent rows
        x = draft.tokens.reshape(-1)
        p_tilde, moved, _ = self.relaxed_probability(rows_p, x)
        relaxed_row = rows_p.scatter(1, x[:, None], p_tilde[:, None])
        passes = (relaxed_row.argmax(dim=1) == x).view(batch, count)
        passes[:, 0] = True  # the root is the pending token
        whole = ~(draft.ancestors & ~passes[:, None, :]).any(dim=2)  # (B, N+1) every node on the path passes
        longest = torch.where(whole, draft.depth, -1).amax(dim=1, keepdim=True)  # (B, 1) the longest prefix
        # The tied candidates are the whole nodes at that depth: every leaf below one of them has that
        # accept length and no other leaf has. The first path in the reference's order runs through the
        # candidate with the smallest key.
        tied = whole & (draft.depth == longest)  # (B, N+1)
        keys = self.tie_keys(draft)
        best = torch.where(tied, keys, count + 1).argmin(dim=1)  # (B,)
        on_path = draft.ancestors[torch.arange(batch, device=p.device), best] & (draft.depth > 0)  # (B, N+1)
        levels = torch.where(on_path, draft.depth - 1, depth_max)  # (B, N+1) slot by depth
        path = torch.full((batch, depth_max + 1), -1, dtype=torch.long, device=p.device)
        path.scatter_(1, levels, torch.where(on_path, torch.arange(count, device=p.device).expand(batch, -1), -1))
        merged = torch.zeros(batch, depth_max + 1, dtype=p.dtype, device=p.device)
        merged.scatter_(1, levels, torch.where(on_path, moved.view(batch, count), 0.0))
        merged = merged[:, :depth_max]
        tv = torch.cat([merged, torch.zeros(batch, 1, dtype=p.dtype, device=p.device)], dim=1)
        next_token = p[torch.arange(batch, device=p.device), best].argmax(dim=1)
        return PathChoice(path[:, :depth_max], next_token, tv, merged)

    def tie_keys(self, draft) -> torch.Tensor:
        """(B, N+1) long: for each node, where the first root-to-leaf path through it comes in the
        reference's ``retrieve_indices`` order, on which ``torch.argmax`` over accept lengths breaks ties.

        ``leaf_order="index"`` (EAGLE-2 trees at temperature 0, ``cnets_llamagen.topK_genrate``: paths are
        listed leaf by leaf in increasing node index, unsorted): the smallest leaf index below the node.
        ``leaf_order="sorted"`` (static trees, ``utils.generate_tree_buffers``: paths sorted by their
        node-index sequences): the node's rank in that lexicographic order. Distinct nodes of one depth
        get distinct keys (their subtrees, resp. their paths, differ).
        """
        batch, count = draft.tokens.shape
        device = draft.tokens.device
        index = torch.arange(count, device=device)
        if self.leaf_order == "index":
            has_child = torch.zeros(batch, count + 1, dtype=torch.bool, device=device)
            has_child.scatter_(1, torch.where(draft.parents >= 0, draft.parents, count), True)
            leaf = ~has_child[:, :count]  # (B, N+1)
            # ancestors[b, i, j]: node j is on node i's path, so the leaves below j are the i with it set.
            below = draft.ancestors & leaf[:, :, None]  # (B, i, j)
            return torch.where(below, index[None, :, None], count).amin(dim=1)  # (B, N+1) first leaf below j
        # Each node's path as node indices by depth, padded past its depth with ``count`` (the
        # reference pads with -1 and sorts those after every index).
        levels = torch.arange(draft.max_depth + 1, device=device)
        at = draft.ancestors[:, :, :, None] & (draft.depth[:, None, :, None] == levels)  # (B, i, j, D+1)
        seq = torch.where(at.any(dim=2), at.to(torch.long).argmax(dim=2), count)  # (B, N+1, D+1)
        a, b = seq[:, :, None, :], seq[:, None, :, :]  # (B, N+1, 1, D+1), (B, 1, N+1, D+1)
        differ = a != b  # (B, i, j, D+1)
        first = differ.to(torch.long).argmax(dim=3, keepdim=True)  # (B, i, j, 1) the first differing depth
        before = differ.any(dim=3) & (
            a.expand_as(differ).gather(3, first)[..., 0] < b.expand_as(differ).gather(3, first)[..., 0]
        )  # (B, i, j): node i's path sorts before node j's
        return before.sum(dim=1)  # (B, N+1) how many paths sort before each node's
