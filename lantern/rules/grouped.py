"""GSD's grouped window test: which tokens share a draft's acceptance mass, and the law that results.

Grouped speculative decoding (So et al. 2025, arXiv 2508.07747) replaces the speculative test's ratio
``p(x) / q(x)`` by ``p(G) / q(G)`` over a dynamic group ``G`` of the draft token ``x`` (see
:class:`Grouping`). The rejected position still draws from ``norm(max(0, p - q))``. That is not lossless:
:func:`grouped_law` gives the law each emitted token is drawn from (the emitted-law formula of
:func:`lantern.rules.exact.emitted_law` with the grouped ratio), so :class:`GroupedTest`, the Jacobi step's
test for GSD, records its realised TV.
"""

from __future__ import annotations

import copy

import torch

from lantern import checks
from lantern.rules.exact import ExactWindowTest, WindowVerdict, emitted_law, ratio_of, realised_tv, sampled_test


class Grouping:
    """GSD's dynamic groups (``scheduler/jacobi_iteration_lumina_mgpt.py``, ``SpeculativeSampler.__call__``).

    The group of a token ``x`` under a target law ``p``: the tokens whose rank in ``p`` (ascending,
    stable) lies in ``[r - radius, r + radius - 1]`` around ``x``'s rank ``r`` (the released code's
    slice ``[r-7 : r+7]``, so 7 ranks below and 6 above; ``radius=0`` is the group ``{x}``: plain
    SJD), kept when ``|p(y) - p(x)| < p_thr`` and (``d_thr`` not None) the squared Euclidean distance
    between the target's input embeddings of ``x`` and ``y`` is below ``d_thr``. ``x`` is always in
    its group (it passes both tests in the released code too).
    """

    def __init__(self, radius: int = 7, p_thr: float = 0.15, d_thr: float | None = 0.5):
        self.radius = checks.integer("gsd_radius", radius, 0, note="ranks each side of the draft; 0 = no grouping")
        self.p_thr = checks.probability("gsd_p_thr", p_thr, zero=False, note="largest |p(y) - p(x)| inside a group")
        self.d_thr = checks.optional(
            checks.real,
            "gsd_d_thr",
            d_thr,
            0,
            low_open=True,
            note="squared embedding distance; null = no distance test",
        )
        self._close: dict[tuple, torch.Tensor] = {}  # (table identity, device) -> (V, V) bool

    def describe(self) -> dict:
        return {"gsd_radius": self.radius, "gsd_p_thr": self.p_thr, "gsd_d_thr": self.d_thr}

    @property
    def offsets(self) -> list[int]:
        """Rank offsets of the group window (host constants)."""
        return [0] if self.radius == 0 else list(range(-self.radius, self.radius))

    def close_table(self, embeddings: torch.Tensor) -> torch.Tensor | None:
        """(V, V) bool: squared embedding distance below ``d_thr`` (built once per table, in row chunks
        so V = 16384 needs no V x V float matrix at once). None when there is no distance test."""
        if self.d_thr is None or self.radius == 0:
            return None
        key = (id(embeddings), embeddings.device, embeddings.shape)
        if key not in self._close:
            e = embeddings.detach().float()
            norms = (e * e).sum(1)  # (V,)
            rows = []
            for start in range(0, e.shape[0], 1024):
                block = e[start : start + 1024]
                dist = norms[start : start + 1024, None] + norms[None, :] - 2 * block @ e.T  # (b, V)
                rows.append(dist < self.d_thr)
            table = torch.cat(rows)
            table.fill_diagonal_(True)
            self._close[key] = table
        return self._close[key]

    def group_masses(
        self, p: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor, close: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``p(G_x)`` and ``q(G_x)`` (R, K) for tokens ``x`` (R, K) under laws ``p``, ``q`` (R, V)."""
        vocab = p.shape[-1]
        order = p.argsort(dim=-1, stable=True)  # (R, V) ascending, as the released code's sort
        ranks = torch.arange(vocab, device=p.device).expand_as(order)
        rank = torch.empty_like(order).scatter_(1, order, ranks)  # (R, V) each token's position in ``order``
        r = rank.gather(1, tokens)  # (R, K)
        offsets = torch.tensor(self.offsets, device=p.device)
        where = r[:, :, None] + offsets  # (R, K, O)
        inside = (where >= 0) & (where < vocab)
        members = order.gather(1, where.clamp(0, vocab - 1).flatten(1)).view(where.shape)  # (R, K, O)
        p_y = p.gather(1, members.flatten(1)).view(where.shape)
        q_y = q.gather(1, members.flatten(1)).view(where.shape)
        p_x = p.gather(1, tokens)[:, :, None]
        keep = inside & ((p_y - p_x).abs() < self.p_thr)
        if close is not None:
            keep &= close.view(-1)[(tokens[:, :, None] * vocab + members).flatten()].view(where.shape)
        keep |= offsets == 0  # x itself (offset 0 is x's own rank), whatever rounding says
        return (p_y * keep).sum(-1), (q_y * keep).sum(-1)


def grouped_law(
    p: torch.Tensor, q: torch.Tensor, grouping: Grouping, close: torch.Tensor | None, law: torch.Tensor | None = None
) -> torch.Tensor:
    """The law GSD draws a position's token from: ``P = q a + (1 - sum q a) r`` (R, V).

    ``a(x) = min(1, p(G_x) / q(G_x))`` is the chance a draft ``x ~ q`` passes; ``r = norm(max(0, p - q))``
    the residual a rejection draws from (``p`` when it is empty, as the step does). ``law`` (R, V): what the
    drafts actually follow when that is not ``q``.
    """
    vocab = p.shape[-1]
    every = torch.arange(vocab, device=p.device).expand(p.shape[0], -1)
    p_g, q_g = grouping.group_masses(p, q, every, close)  # (R, V)
    accept = torch.where(q_g > 0, (p_g / q_g.clamp_min(1e-30)).clamp_max(1.0), torch.ones_like(q_g))
    return emitted_law(p, q, law, accept)


class GroupedTest(ExactWindowTest):
    """GSD's window test: a draft ``x`` passes when ``u < min(1, p(G_x) / q(G_x))`` (greedy: when the argmax
    lies in ``x``'s group; radius 0 is SJD's test). ``radius``, ``p_thr``, ``d_thr``: :class:`Grouping`. The
    realised TV of every position's law (:func:`grouped_law`, a vocabulary-wide pass) is measured on audited
    steps; greedy positions emit a point mass, off the argmax exactly when a draft other than it passes."""

    def __init__(self, radius: int = 7, p_thr: float = 0.15, d_thr: float | None = 0.5):
        self.grouping = Grouping(radius, p_thr, d_thr)
        self.embeddings: torch.Tensor | None = None  # (V, D) the bound model's input embeddings
        self.close: torch.Tensor | None = None  # (V, V) bool distance test, once prepared for a device

    def bound(self, model) -> GroupedTest:
        """A copy of this test that reads ``model``'s input embeddings (its table built by :meth:`prepare`)."""
        bound = copy.copy(self)
        bound.embeddings, bound.close = model.input_embeddings(), None
        return bound

    def prepare(self, device: torch.device) -> None:
        """Build the distance table of the bound model's embeddings on ``device``
        (:func:`lantern.decoding.loop.prepare`; once per context, so no step builds it)."""
        if self.embeddings is None:
            raise RuntimeError("GroupedTest.prepare: bind the test to a model first (bound(model))")
        close = self.grouping.close_table(self.embeddings)
        self.close = None if close is None else close.to(device)

    def describe(self) -> dict:
        return self.grouping.describe()

    def acceptance(self, greedy: bool) -> str:
        return "gsd"  # greedy too: a draft whose group holds the argmax passes, so it is not greedy decoding

    def __call__(self, p, drafts, q, law, u, greedy: bool, audit: bool) -> WindowVerdict:
        batch, width = drafts.shape
        rows_p, rows_x = p.flatten(0, 1), drafts.flatten()  # (B*W, V), (B*W,)
        p_x = p.gather(2, drafts[:, :, None])[:, :, 0]  # (B, W)
        if greedy:  # the law is a point mass: at the draft when it passes, else at the argmax
            top = p.argmax(-1)  # (B, W)
            passed = self._in_group(rows_p, rows_x, top.flatten()).view(batch, width)
            return WindowVerdict(passed, torch.zeros_like(p_x), (passed & (drafts != top)).float())
        p_g, q_g = self.grouping.group_masses(rows_p, q.flatten(0, 1), rows_x[:, None], self.close)  # (B*W, 1)
        p_g, q_g = p_g.view(batch, width), q_g.view(batch, width)
        tv = torch.full((batch, width), float("nan"), dtype=torch.float32, device=p.device)  # not measured
        if audit:
            rows_law = None if law is None else law.flatten(0, 1)
            emitted = grouped_law(rows_p, q.flatten(0, 1), self.grouping, self.close, rows_law)  # (B*W, V)
            tv = realised_tv(rows_p, emitted).view(batch, width)
        return WindowVerdict(sampled_test(p_g, q_g, u), p_g - p_x, tv, ratio_of(p_g, q_g))

    def _in_group(self, p: torch.Tensor, drafts: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
        """(R,) whether ``top`` (R,) lies in the group of ``drafts`` (R,) under ``p`` (R, V)."""
        marker = torch.zeros_like(p).scatter(1, top[:, None], 1.0)  # all mass on the argmax: marker(G) = 1 iff top in G
        _, hit = self.grouping.group_masses(p, marker, drafts[:, None], self.close)  # (R, 1)
        return hit[:, 0] > 0.5
