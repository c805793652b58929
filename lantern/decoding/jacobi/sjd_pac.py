"""SJD-PAC as released: Proactive Drafting (a K-ary tree at the resampled token, then a chain) and Adaptive
Continuation (later columns keep their test against the stale law instead of a full redraw).

Kang et al., "SJD-PAC: Accelerating Speculative Jacobi Decoding via Proactive Drafting and Adaptive
Continuation" (CVPR 2026, arXiv 2603.18599); code KangJialiang/SJD-PAC, ``scheduler/sjd_pac_iteration_lumina_mgpt.py``
(``SJDPACSpeculativeSampler``, ``generate_tree_mask_and_retrieve``). The structure is
:class:`lantern.decoding.jacobi.pac_tree.ProactiveTree` (the decoder's window test: it verifies the tree), the step
:func:`lantern.decoding.jacobi.pac_step.pac_step`; this module is the decoder, its settings and the factory.

Defaults follow the released code (``_init_new_params`` and ``test_lumina_mgpt.py``: ``tree_width=3``,
``tree_depth=3``, ``max_num_new_tokens=64``); the README's prose names ``K=4`` as the sweet spot (docs/jacobi.md).
``window`` is the released ``L``: the nodes of one forward, the pending root included.

As released it is lossy: the longest passing path wins even where an earlier sibling on another path also passed,
so the test's outcome picks the emitted token, and the continuation draws candidates from another law than the one
it records (measured: docs/jacobi.md, tests/test_sjd_pac.py). With ``K >= 2`` no closed form of an emitted token's
law is known: the step logs NaN and the decoder names the Monte Carlo audit (:mod:`lantern.decoding.audit`); with
``K = 1`` (SJD's test and a maximal-coupling refill: lossless), greedy or the lossless selection
(:mod:`lantern.decoding.jacobi.pac_exact`) it is 0.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch

from lantern import checks, rng
from lantern.decoding.api import register
from lantern.decoding.jacobi.decoder import JacobiDecoder, JacobiSettings
from lantern.decoding.jacobi.pac_step import distinct_draws, pac_step
from lantern.decoding.jacobi.pac_tree import ProactiveTree
from lantern.models.sampling import SamplingConfig

RELEASED_WINDOW = 64  # the released max_num_new_tokens (L)


@register
@dataclass(frozen=True)
class SjdPacSettings(JacobiSettings):
    """SJD's knobs (``window`` is L, the tree and chain nodes) plus the tree's width K and depth D."""

    kind: ClassVar[str] = "sjd_pac"
    tree_width: int = 3
    tree_depth: int = 3
    selection: str = "released"  # or "lossless" (pac_exact.FirstAccepted); older records: released

    def method(self) -> str:
        text = f"{self.label} L={self.window} K={self.tree_width} D={self.tree_depth}"
        return text + (" (greedy)" if self.candidates == "greedy" else "")

    def order(self) -> tuple:
        return (2, False, self.name, 0, self.window, self.tree_width, self.tree_depth, self.candidates)

    def record(self) -> dict:
        acceptance = "sjd_pac"  # as released: lossy (the records' ``lossless`` is false)
        if self.selection == "lossless":
            acceptance = "greedy" if self.candidates == "greedy" else "exact"
        fields = {"acceptance": acceptance, "tree_width": self.tree_width, "tree_depth": self.tree_depth}
        fields["selection"] = self.selection
        return {**super().record(), **fields}


class SjdPacDecoder(JacobiDecoder):
    """A :class:`JacobiDecoder` over a :class:`ProactiveTree` (its ``test``) with SJD-PAC's step."""

    step_function = staticmethod(pac_step)

    def __init__(self, sampling: SamplingConfig, *, tree: ProactiveTree, fit: bool = False, **kwargs):
        if not isinstance(tree, ProactiveTree):
            raise checks.refuse("tree", tree, "a lantern.decoding.jacobi.pac_tree.ProactiveTree")
        super().__init__(sampling, window=tree.window, test=tree, **kwargs)
        self.fit = fit  # the window is the released L, or the image's tokens where fewer (set per model)

    def _fit(self, tokens: int) -> None:
        """``fit``: L = min(the released 64, the image's ``tokens``); the same tree (refused if it no longer fits)."""
        window = min(RELEASED_WINDOW, tokens)
        if window != self.window:
            self.test = ProactiveTree(self.test.width, self.test.depth, window, self.test.selection)
            self.window = window

    @property
    def max_accepted(self) -> int:
        return self.test.columns

    @property
    def tv_audit(self) -> str:
        """``exact`` where every token follows the target (greedy, K = 1, the lossless selection), else ``mc``: the
        emitted law has no closed form (lantern.decoding.audit)."""
        tree = self.test
        return "exact" if self.sampling.greedy or tree.width == 1 or tree.selection.lossless else "mc"

    def refresh_drafts(self, state):
        """The candidates drawn again as the tests assume they were: ``K`` draws without replacement from each
        column's recorded law (the released continuation does not draw them so: docs/jacobi.md)."""
        tree = self.test
        uniforms = rng.uniform(state.keys, state.decided, rng.AUDIT, tree.columns * tree.width)
        return state._replace(
            window=distinct_draws(state.draft_q, tree.width, uniforms.view(-1, tree.columns, tree.width))
        )

    def check_model(self, config) -> None:
        if self.fit:
            self._fit(config.num_image_tokens)
        super().check_model(config)
        if self.test.width > config.vocab_size:
            raise checks.refuse("tree_width", self.test.width, f"an integer in [1, {config.vocab_size}]", "the codes")

    def first_window(self, ctx, codes: torch.Tensor, keys: torch.Tensor):
        """K distinct uniform codes per column (B, K, C) and the uniform law (B, C, V), as the released
        ``get_multi_token_for_preparation`` (uniform laws, not point masses)."""
        tree, vocab = self.test, ctx.model.config.vocab_size
        uniform = torch.full((keys.shape[0], tree.columns, vocab), 1.0 / vocab, device=codes.device)
        step = torch.zeros(keys.shape[0], dtype=torch.long, device=codes.device)
        uniforms = rng.uniform(keys, step, rng.JACOBI_INIT, tree.columns * tree.width).view(
            -1, tree.columns, tree.width
        )
        return distinct_draws(uniform, tree.width, uniforms), uniform

    @property
    def settings(self) -> SjdPacSettings:
        base = super().settings
        fields = {field.name: getattr(base, field.name) for field in dataclasses.fields(base)}
        tree = self.test
        return SjdPacSettings(**fields, tree_width=tree.width, tree_depth=tree.depth, selection=tree.selection.name)


def sjd_pac(
    sampling: SamplingConfig,
    *,
    window: int | None = None,
    tree_width: int = 3,
    tree_depth: int = 3,
    selection=None,
    **kwargs,
) -> SjdPacDecoder:
    """SJD-PAC with the released code's defaults: L = 64 nodes, a 3-ary tree of depth 3 (13 nodes), a 51-node chain.
    ``window=None``: the released 64, or the image's tokens on a smaller image (the record says which ran).
    ``selection``: the released longest-path rule and continuation (None), or
    :class:`~lantern.decoding.jacobi.pac_exact.FirstAccepted` (lossless: ``decoding=sjd_pac_lossless``)."""
    tree = ProactiveTree(tree_width, tree_depth, RELEASED_WINDOW if window is None else window, selection)
    name, label = kwargs.pop("name", "sjd_pac"), kwargs.pop("label", "SJD-PAC")
    return SjdPacDecoder(sampling, tree=tree, fit=window is None, name=name, label=label, **kwargs)
