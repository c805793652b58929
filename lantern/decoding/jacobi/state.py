"""The types a Jacobi step reads and writes: its state, its log, and the context fixed for a batch shape.

The step (:mod:`lantern.decoding.jacobi.step`) is one function over these; what varies between Jacobi methods
sits in two objects of the context: ``test`` (a window test from :mod:`lantern.rules`: SJD's exact test or
GSD's grouped one) and ``redraw`` (how the untested drafts are drawn again:
:mod:`lantern.decoding.jacobi.redraw`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from lantern.models.sampling import SamplingConfig
from lantern.models.target import Target

# How fresh window tokens (the tail after a step's accepted tokens) are initialised. ``random``: a
# uniform code (SJD's default, `multi_token_init_scheme='random'`); ``horizon``: the token to its left
# in the image (the previous token in raster order; a uniform code at column 0), SJD's
# `horizon_repeat`; ``vertical``: the token above it (a uniform code in the first row), which SJD's
# code has commented out.
INITS = ("random", "horizon", "vertical")


class JacobiState(NamedTuple):
    """Per image row (B) unless said: ``codes`` (B, C) decided tokens (C leaves room for overrun);
    ``decided`` (B,) how many (``n``); ``length`` (B,) valid cache slots ``L = T + n - 1``;
    ``window`` (B, W) drafts for tokens ``n .. n+W-1``; ``draft_q`` (B, W, V) the law each was drawn
    from; ``keys`` (B,) RNG keys; ``target_valid`` (rows, S) which cache columns hold real keys."""

    codes: torch.Tensor
    decided: torch.Tensor
    length: torch.Tensor
    window: torch.Tensor
    draft_q: torch.Tensor
    keys: torch.Tensor
    target_valid: torch.Tensor
    draft_law: torch.Tensor | None = None  # (B, W, V) what each draft actually follows, when a redraw
    # (SJD++) keeps drafts whose recorded law ``draft_q`` is not their law; None: the two agree


class JacobiLog(NamedTuple):
    """Per step, as :class:`lantern.decoding.tree.step.StepLog`: ``accepted`` (B,) drafts accepted (-1 for a
    finished row); ``tv`` (B, W+1) realised TV of the law of the token each position would emit;
    ``merged`` (B, W) target mass the grouping added to each draft's acceptance ratio numerator
    (``p(G) - p(x)``; zeros for SJD)."""

    accepted: torch.Tensor
    tv: torch.Tensor
    merged: torch.Tensor


class Redrawing(NamedTuple):
    """What a redraw reads: the step's input ``state`` (old window, its laws, keys, ``decided``); this
    forward's laws ``p`` (B, W+1, V); ``src`` (B, W) the output whose law each new slot takes (new slot ``k``
    is token ``n' + k``, predicted by output ``a + 1 + k``); ``jacobi`` (B, W) whether that output lies in
    the window (``src <= W``: a Jacobi update; else the slot is initialised and the redraw is discarded);
    ``p_src`` (B, W, V) the law at ``src``; ``u`` (B, W) the test's uniforms; ``new_decided`` (B,) ``n'``;
    ``greedy`` whether sampling is greedy (every redraw is then the argmax, unless the method says otherwise)."""

    state: JacobiState
    p: torch.Tensor
    src: torch.Tensor
    jacobi: torch.Tensor
    p_src: torch.Tensor
    u: torch.Tensor
    new_decided: torch.Tensor
    greedy: bool


class Redrawn(NamedTuple):
    """A redraw's result for the new window's Jacobi slots: ``drafts`` (B, W), ``recorded`` (B, W, V) the law
    each is tested against next step, ``law`` (B, W, V) the law each actually follows (None: ``recorded``)."""

    drafts: torch.Tensor
    recorded: torch.Tensor
    law: torch.Tensor | None = None


@dataclass
class JacobiContext:
    """What stays fixed for a batch shape: the model, its cache (static address), the knobs, the window
    test (bound to this model, its tables prepared on the model's device) and the redraw."""

    model: Target
    cache: object
    sampling: SamplingConfig
    window: int
    init: str
    num_tokens: int
    groups: int  # CFG rows per image
    test: object  # a window test: lantern.rules.exact.ExactWindowTest or lantern.rules.grouped.GroupedTest
    redraw: object  # a lantern.decoding.jacobi.redraw.Redraw
