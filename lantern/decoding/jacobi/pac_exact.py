"""A lossless SJD-PAC: the released Proactive Drafting tree and Adaptive Continuation, with the path selection and
the continued columns' draws done as recursive rejection sampling (RRS) requires.

The released sampler (:class:`~lantern.decoding.jacobi.pac_step.Released`) departs from RRS in three places, each
lossy on its own (docs/jacobi.md, "SJD-PAC as released"): (a) the longest passing path wins, though a sibling's test
is valid only when the siblings before it failed; (b1) a continued column's candidates ``1 .. K-1`` are drawn from
its test's residual but tested next step as draws from the recorded law without replacement; (b2) a continued tree
column whose draft failed is redrawn from the residual after all ``K`` siblings, which the path's own test did not
try. :class:`FirstAccepted` keeps the tree, the node tests, the recorded laws and the uniforms, and changes only:

1. **selection**: at each branching column the first sibling (in drawn order) whose test passed under the chosen
   parent; the first column where none passed emits a draw from the residual after those ``K`` siblings (all of
   them were tried); past the branching columns only the main path has a chain;
2. **continuation**: a continued column's candidate 0 is the outcome of its own test, the first passing sibling
   under the chosen parent or, where none passed, a draw from the residual of the siblings tried (a chain column:
   the draft if it passed, else ``norm(max(0, p - q))``), which follows the column's recorded law ``R`` exactly
   (RRS); candidates ``1 .. K-1`` are drawn from ``R`` without the earlier ones. So every column's candidates are
   ``K`` draws from ``R`` without replacement: what the next step's sibling tests assume.

By induction from the first window (``K`` distinct uniform codes, law uniform) every draft follows the law it is
tested against, and each node uniform decides one emitted outcome at most, so every emitted token follows the
target's law (tested: tests/test_sjd_pac.py, Markov-chain Monte Carlo and the pooled PIT).
"""

from __future__ import annotations

import torch

from lantern.decoding.jacobi.pac_step import distinct_draws
from lantern.models.sampling import draw


def first_accepted(tree, passed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The path (B,) RRS picks from ``passed`` (B, P, C): at each branching column the first passing sibling under
    the chosen parent (sibling 0 where none passed: the continuation reads its laws), and the accepted length (B,):
    the columns passed before the first that failed, the chain counted only on the main path."""
    width, branching = tree.width, tree.branching
    batch, device = passed.shape[0], passed.device
    row = torch.zeros(batch, dtype=torch.long, device=device)
    alive = torch.ones(batch, dtype=torch.bool, device=device)
    accepted = torch.zeros(batch, dtype=torch.long, device=device)
    siblings = torch.arange(width, device=device)
    for c in range(branching):  # T is a host constant: the loop unrolls
        stride = width ** (branching - 1 - c)
        tested = passed[:, :, c].gather(1, row[:, None] + siblings[None, :] * stride)  # (B, K) in drawn order
        row = row + tested.long().argmax(dim=1) * stride  # the first passing sibling; 0 where none passed
        alive = alive & tested.any(dim=1)
        accepted = accepted + alive.long()
    chain = passed[:, 0, branching:].long().cumprod(dim=1).sum(dim=1)  # (B,) the main path's chain
    return row, accepted + torch.where(alive & (row == 0), chain, torch.zeros_like(chain))


class FirstAccepted:
    """The lossless selection and continuation of SJD-PAC (module docstring); ``lossless`` for the records."""

    name = "lossless"
    lossless = True
    select = staticmethod(first_accepted)

    @staticmethod
    def candidates(recorded, law, passed, token, uniforms) -> torch.Tensor:
        """(B, K, C): candidate 0 of each column is its draft ``token`` (B, C) where the column's test passed
        (``passed`` (B, C)), else a draw from ``law`` (B, C, V), the residual of the siblings tried; then ``K - 1``
        draws without replacement from ``recorded`` (B, C, V) without candidate 0. ``uniforms`` (B, C, K)."""
        width = uniforms.shape[-1]
        first = torch.where(passed, token, draw(law, uniforms[..., 0]))  # (B, C) follows ``recorded`` exactly
        if width == 1:
            return first[:, None]
        rest = recorded.scatter(-1, first[..., None], 0.0)
        others = distinct_draws(rest, width - 1, uniforms[..., 1:])  # (B, K-1, C)
        return torch.cat([first[:, None], others], dim=1)
