"""SJD-SV's test on a sequence of drafts (arXiv 2609.13245): which drafts one joint ratio per run accepts.

One function, :func:`sv_covered`, shared by the Jacobi window test (:mod:`lantern.rules.window`) and the tree
decoder's chain walk (:mod:`lantern.rules.window_chain`); its own module so that neither imports the other.
"""

from __future__ import annotations

import torch


def sv_covered(ratio: torch.Tensor, p_x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Which drafts SJD-SV accepts within their run (B, W) bool; the accepted prefix is the run of them.

    ``ratio`` (B, W) each draft's own test ratio ``r_i`` (>= 0, ``inf`` allowed); ``p_x`` (B, W) the target
    probability of each draft, which splits the window into runs (a run starts at 0 and wherever ``p_x``
    drops); ``u`` (B, W) the test's uniforms: run ``k`` uses the uniform at its first position. Position ``i``
    is covered when some ``j >= i`` of its run has ``u_run < prod_{start..j} r`` (the longest passing
    prefix); a fully covered run lets the next run be tested, a partly covered one ends the accepted prefix.
    """
    batch, width = ratio.shape
    span = torch.arange(width, device=ratio.device)  # (W,)
    starts = torch.ones_like(p_x, dtype=torch.bool)
    starts[:, 1:] = p_x[:, 1:] < p_x[:, :-1]  # (B, W) a drop in target probability opens a new run
    first = torch.where(starts, span, 0).cummax(dim=1).values  # (B, W) the start of each position's run
    prefix = _run_cumsum(torch.log(ratio.double().clamp(1e-300, 1e300)), first)  # (B, W) log prod_{start..i} r
    zeros = _run_cumsum((ratio <= 0).long(), first)  # (B, W) zero ratios in the run so far: the product is 0
    passes = (torch.log(u.double().gather(1, first)) < prefix) & (zeros == 0)  # u_run < prod r (min(1, .) no-op)
    run = starts.long().cumsum(dim=1) - 1  # (B, W) run index, 0..W-1
    last = torch.full((batch, width), -1, dtype=torch.long, device=ratio.device)
    last = last.scatter_reduce(1, run, torch.where(passes, span, -1).expand(batch, -1), "amax")  # (B, W) per run
    return span <= last.gather(1, run)


def _run_cumsum(values: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """Cumulative sums (B, W) of ``values`` restarted at each run's first position ``first`` (B, W)."""
    total = values.cumsum(dim=1)
    return total - (total.gather(1, first) - values.gather(1, first))
