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
from lantern.rules.subsequence import sv_covered


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

    def acceptance(self, greedy: bool) -> str:
        """The base's name (GSD's ``gsd``, SJD's ``exact``): the record's ``window_test`` says ``sv``."""
        return self.base.acceptance(greedy)

    def __call__(self, p, drafts, q, law, u, greedy: bool, audit: bool) -> WindowVerdict:
        verdict = self.base(p, drafts, q, law, u, greedy, False)
        if greedy:  # every ratio is 0 or 1: the joint test of a run is the run of per-token passes
            return verdict
        p_x = p.gather(2, drafts[:, :, None])[:, :, 0]  # (B, W)
        passed = sv_covered(verdict.ratio, p_x, u)
        tv = torch.full_like(verdict.tv, float("nan"))  # no closed form for the law SJD-SV emits
        return WindowVerdict(passed, verdict.merged, tv, verdict.ratio)
