"""Window tests: how the drafts' own tests make the accepted prefix (SJD's token by token, or SJD-SV's).

A Jacobi window (and a drafted chain) is a sequence of drafts ``x_1 .. x_W``, each with its own test
``u_i < min(1, r_i)`` from the rule (SJD: ``r = p(x) / q(x)``; GSD: ``p(G) / q(G)``; LANTERN: ``p'(x) / q(x)``).
A *window-test scheme* says how those tests become the accepted prefix; the config group
``conf/window_test`` builds one, and it composes with any rule:

* :class:`PerToken` (``window_test=token``, the default): the run of passes, the first failure drawn from
  the rule's residual (SJD, GSD, LANTERN as they are);
* :class:`SubsequenceVerification` (``window_test=sv``; SJD-SV, ICML 2026, arXiv 2609.13245): the drafts
  are split into sub-sequences (runs) of non-decreasing target probability ``p_i(x_i)``; a run is accepted
  whole when one joint ratio passes, ``u < min(1, prod r_i)``; when it fails, the longest prefix of the run
  whose joint ratio passes (the same uniform) is accepted ("progressive fallback"); the position after it is
  drawn from the rule's residual, as SJD does. Lossy: the joint ratio lets a draft with ``r > 1`` carry one
  with ``r < 1``; its law has no closed form here (the realised TV is left unmeasured, NaN). Greedy
  (temperature 0): every ``r`` is 0 or 1, so the joint test is the per-token one and SJD-SV is its rule's
  greedy test (greedy SJD-SV equals greedy AR). The choices the paper leaves open: docs/sjd_sv.md.

A scheme has two faces: :meth:`over` a Jacobi window test (:class:`~lantern.rules.exact.ExactWindowTest`, the
interface the Jacobi step calls) and :meth:`spec` a tree decoder's rule spec (a chain's walk,
:mod:`lantern.rules.window_chain`).
"""

from __future__ import annotations

import torch

from lantern import checks
from lantern.rules.exact import ExactWindowTest, WindowVerdict


class Scheme:
    """A window-test scheme: ``over`` a Jacobi window test, ``spec`` over a tree decoder's rule spec."""

    name: str

    def over(self, test: ExactWindowTest) -> ExactWindowTest:
        raise NotImplementedError

    def spec(self, spec):
        raise NotImplementedError


def checked(window_test) -> Scheme:
    """``window_test`` (None: :class:`PerToken`); ConfigError when it is not a scheme (a decoder built in Python
    with a name instead of ``SubsequenceVerification()``)."""
    if window_test is None:
        return PerToken()
    if not isinstance(window_test, Scheme):
        raise checks.refuse("window_test", window_test, "a window-test scheme (lantern.rules.window: token, sv)")
    return window_test


class PerToken(Scheme):
    """The drafts' own tests decide: the accepted prefix is the run of passes (the rules as they are)."""

    name = "token"

    def over(self, test: ExactWindowTest) -> ExactWindowTest:
        return test

    def spec(self, spec):
        return spec


class SubsequenceVerification(Scheme):
    """SJD-SV's scheme: one joint ratio per run of non-decreasing target probability, with a progressive
    fallback to the run's longest passing prefix (module docstring)."""

    name = "sv"

    def over(self, test: ExactWindowTest) -> SVWindowTest:
        return SVWindowTest(test)

    def spec(self, spec):
        from lantern.rules.window_chain import SVSpec  # the tree side imports the tree's rule contract

        return SVSpec(spec)


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


class SVWindowTest(ExactWindowTest):
    """SJD-SV over a Jacobi window test ``base`` (SJD's exact test or GSD's grouped one): the base gives each
    draft's ratio, :func:`sv_covered` the accepted drafts; the rejected position draws the base's residual
    in the step, as with the base alone."""

    scheme = "sv"
    tv_audit = "mc"  # the emitted law has no closed form: a Monte Carlo audit reruns the step (docs/sjd_sv.md)

    def __init__(self, base: ExactWindowTest):
        self.base = base

    def bound(self, model) -> SVWindowTest:
        return SVWindowTest(self.base.bound(model))

    def prepare(self, device: torch.device) -> None:
        self.base.prepare(device)

    def describe(self) -> dict | None:
        return self.base.describe()

    def __call__(self, p, drafts, q, law, u, greedy: bool, audit: bool) -> WindowVerdict:
        verdict = self.base(p, drafts, q, law, u, greedy, False)
        if greedy:  # every ratio is 0 or 1: the joint test of a run is the run of per-token passes
            return verdict
        p_x = p.gather(2, drafts[:, :, None])[:, :, 0]  # (B, W)
        passed = sv_covered(verdict.ratio, p_x, u)
        tv = torch.full_like(verdict.tv, float("nan"))  # no closed form for the law SJD-SV emits
        return WindowVerdict(passed, verdict.merged, tv, verdict.ratio)
