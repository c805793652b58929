"""One speculative Jacobi step (SJD, and GSD's grouped acceptance) as a pure, static-shape function.

Speculative Jacobi decoding (Teng et al. 2024, arXiv 2410.01699) needs no drafter: each row keeps a
window of ``W`` draft tokens for the image tokens after its pending one, each with the law ``q`` it
was drawn from. One target forward over ``[pending, window]`` (causal inside the window) gives the
target law ``p`` at every window position; drafts are tested left to right with the speculative
sampling test ``u < min(1, p(x) / q(x))``; the first rejected position draws from the residual
``norm(max(0, p - q))`` (the position after the window, when every draft passed, draws from ``p``).
The untested positions are redrawn from the laws this forward gave them (the Jacobi update), and the
window is filled up to ``W`` with freshly initialised tokens whose law is a point mass (``q = 1``
at the token, so they pass with probability ``p(x)``). Every draft is drawn before the uniforms
that test it and its law is fixed before it is drawn, so the emitted tokens follow the target's
joint law exactly (see docs/jacobi.md).

GSD (So et al. 2025, arXiv 2508.07747) replaces the ratio ``p(x) / q(x)`` by ``p(G) / q(G)`` over a
dynamic group ``G`` of the draft token ``x``: the tokens within a few ranks of ``x`` in ``p``'s order
whose target mass is within ``p_thr`` of ``p(x)`` and whose input embedding lies within squared
distance ``d_thr`` of ``x``'s (:class:`Grouping`). The rejected position still draws from
``norm(max(0, p - q))``. That is not lossless: the law each emitted token is drawn from is
``P = q a + (1 - sum(q a)) r`` with ``a(x) = min(1, p(G_x) / q(G_x))`` and ``r`` the residual, and the
step records ``TV(p, P)`` for it (:func:`grouped_law`).

MC-SJD (So et al. 2025, arXiv 2510.24211; code junhyukso/SCD) changes only how the untested positions
are redrawn (``coupling``): instead of an independent draw from this forward's law ``p``, the new
draft is *coupled* with the old draft ``x ~ q`` of the same token so that it repeats ``x`` as often as
the two laws allow. ``mc`` (maximal coupling): keep ``x`` when ``u < min(1, p(x) / q(x))`` (the
speculative test itself, with the position's test uniform), else draw ``norm(max(0, p - q))``; the
new draft follows ``p`` and equals ``x`` with probability ``1 - TV(p, q)``, the most any coupling can
give. ``gumbel``: every image token owns one fixed vector of exponentials ``E`` (counter-based, keyed by
the token's index, never by the step), and each redraw is ``argmax(p / E)`` (the Gumbel-max trick), so
the same noise picks the token at every iteration and a slightly changed ``p`` picks the same token.
Either way the new draft's law is ``p``, fixed before it is drawn, and its randomness is independent of
everything at earlier positions, so the emitted tokens keep the target's joint law (docs/jacobi.md).

Cache layout as in :mod:`lantern.decoding.tree.step`: per row ``n`` decided tokens, ``L = T + n - 1``
valid cache slots; the pending token (``codes[n-1]``) and the window go to slots ``L .. L+W``. The
accepted prefix of the window already sits at the slots it keeps, so nothing moves; entries past it
are overwritten by the next step. No host reads, so the step compiles with ``fullgraph=True``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from lantern import rng
from lantern.decoding.batch import repeat_rows, tree_attention_mask
from lantern.decoding.jacobi.grouping import Grouping, grouped_law
from lantern.models.sampling import SamplingConfig, draw, guided_logits_at, verification_probabilities
from lantern.models.target import Target
from lantern.rules.exact import residual, sampled_test

# How fresh window tokens (the tail after a step's accepted tokens) are initialised. ``random``: a
# uniform code (SJD's default, `multi_token_init_scheme='random'`); ``horizon``: the token to its left
# in the image (the previous token in raster order; a uniform code at column 0), SJD's
# `horizon_repeat`; ``vertical``: the token above it (a uniform code in the first row), which SJD's
# code has commented out.
INITS = ("random", "horizon", "vertical")

# How the untested window positions are redrawn from this forward's laws. ``none``: independently
# (SJD); ``mc``: maximal coupling with the old draft of the same token (MC-SJD); ``gumbel``: Gumbel-max
# with one fixed noise vector per image token (MC-SJD's Gumbel coupling). Greedy decoding ignores it
# (every redraw is the argmax).
COUPLINGS = ("none", "mc", "gumbel")


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
    draft_law: torch.Tensor | None = None  # (B, W, V) what each draft actually follows, when a redraft rule
    # (SJD++) keeps drafts whose recorded law ``draft_q`` is not their law; None: the two agree


class JacobiLog(NamedTuple):
    """Per step, as :class:`lantern.decoding.tree.step.StepLog`: ``accepted`` (B,) drafts accepted (-1 for a
    finished row); ``tv`` (B, W+1) realised TV of the law of the token each position would emit;
    ``merged`` (B, W) target mass the grouping added to each draft's acceptance ratio numerator
    (``p(G) - p(x)``; zeros for SJD)."""

    accepted: torch.Tensor
    tv: torch.Tensor
    merged: torch.Tensor


@dataclass
class JacobiContext:
    """What stays fixed for a batch shape: the model, its cache (static address) and the knobs."""

    model: Target
    cache: object
    sampling: SamplingConfig
    window: int
    init: str
    num_tokens: int
    groups: int  # CFG rows per image
    grouping: Grouping | None = None
    close: torch.Tensor | None = None  # grouping's (V, V) distance test, on the model's device
    reuse: float | None = None  # SJD++-style reuse: keep an untested draft when its law's top mass >= this
    coupling: str = "none"  # how untested positions are redrawn (COUPLINGS)
    redraft: object | None = None  # a rule that may keep old drafts (lantern.decoding.jacobi.sjd_pp)
    warm: bool = False  # whether a step has run eagerly with this context (lazy tables filled)


def initial_tokens(ctx: JacobiContext, keys: torch.Tensor, step: torch.Tensor, count: int) -> torch.Tensor:
    """``count`` uniform codes per row (B, count), stream JACOBI_INIT."""
    vocab = ctx.model.config.vocab_size
    u = rng.uniform(keys, step, rng.JACOBI_INIT, count)  # (B, count)
    return (u * vocab).long().clamp_max(vocab - 1)


def jacobi_step(ctx: JacobiContext, state: JacobiState, audit: bool = True) -> tuple[JacobiState, JacobiLog]:
    """Verify the window, emit the accepted prefix and one drawn token, refill the window."""
    model, sampling, width = ctx.model, ctx.sampling, ctx.window
    decided, length, keys = state.decided, state.length, state.keys
    batch, device = decided.shape[0], decided.device
    vocab = model.config.vocab_size
    span = torch.arange(width + 1, device=device)  # (W+1,)
    active = decided < ctx.num_tokens  # (B,) finished rows run along without advancing

    # 1. One target forward over [pending, window] at slots/positions L .. L+W, causal in the window.
    pending = state.codes.gather(1, (decided - 1)[:, None])  # (B, 1)
    inputs = torch.cat([pending, state.window], dim=1)  # (B, W+1)
    chain = torch.ones(width + 1, width + 1, dtype=torch.bool, device=device).tril().expand(batch, -1, -1)
    mask = tree_attention_mask(state.target_valid[:batch], length, chain)  # (B, 1, W+1, S)
    slots = length[:, None] + span  # (B, W+1)
    positions = slots.clamp_max(model.config.max_seq_len - 1)  # past the image: junk rows, never kept
    groups = ctx.groups
    logits, _ = model.forward_tokens(
        repeat_rows(inputs, groups),
        repeat_rows(positions, groups),
        repeat_rows(slots, groups),
        repeat_rows(mask, groups),
        ctx.cache,
    )  # (rows, W+1, V)
    # Output j predicts token n + j from inputs 0..j (pending and drafts before it).
    p = verification_probabilities(guided_logits_at(logits, sampling, decided[:, None] + span), sampling)  # (B, W+1, V)

    # 2. Test the drafts left to right; ``accepted`` (B,) is the length of the passing prefix.
    window, draft_q = state.window, state.draft_q
    p_draft = p[:, :width].gather(2, window[:, :, None])[:, :, 0]  # (B, W) p(x) at each draft
    top = p[:, :width].argmax(-1)  # (B, W)
    merged = torch.zeros(batch, width, dtype=p.dtype, device=device)
    if sampling.greedy:
        if ctx.grouping is None:
            passed = window == top
        else:  # a draft passes when the greedy token is in its group (radius 0: the draft itself)
            passed = _in_group(ctx, p[:, :width].flatten(0, 1), window.flatten(), top.flatten()).view(batch, width)
    else:
        q_draft = draft_q.gather(2, window[:, :, None])[:, :, 0]  # (B, W) > 0: each draft was drawn from it
        p_test, q_test = p_draft, q_draft  # the exact test; GSD tests the group's masses instead
        if ctx.grouping is not None:
            p_g, q_g = ctx.grouping.group_masses(
                p[:, :width].flatten(0, 1), draft_q.flatten(0, 1), window.flatten()[:, None], ctx.close
            )
            p_g, q_g = p_g.view(batch, width), q_g.view(batch, width)
            p_test, q_test = p_g, q_g
            merged = p_g - p_draft
        u = rng.uniform(keys, decided, rng.JACOBI_ACCEPT, width)  # (B, W)
        passed = sampled_test(p_test, q_test, u)  # the tree verifier's test: u < min(1, p / q)
    accepted = passed.long().cumprod(dim=1).sum(dim=1)  # (B,) in 0..W

    # 3. The token at position ``accepted``: the residual after a rejection, p after a full window.
    q_padded = torch.cat([draft_q, torch.zeros_like(draft_q[:, :1])], dim=1)  # (B, W+1, V)
    at = accepted[:, None, None].expand(-1, 1, vocab)
    p_at, q_at = p.gather(1, at)[:, 0], q_padded.gather(1, at)[:, 0]  # (B, V)
    if sampling.greedy:
        next_token = p_at.argmax(-1)
    else:
        next_token = draw(residual(p_at, q_at), rng.uniform(keys, decided, rng.JACOBI_RESIDUAL, 1)[:, 0])

    # 4. Realised TV of the law each position emits from (exact SJD: 0).
    tv = torch.zeros(batch, width + 1, dtype=torch.float32, device=device)
    if ctx.grouping is not None:
        if sampling.greedy:  # the law is a point mass: at the draft when it passes, else at the argmax
            tv[:, :width] = (passed & (window != top)).float()
        elif audit:
            law = grouped_law(p[:, :width].flatten(0, 1), draft_q.flatten(0, 1), ctx.grouping, ctx.close)
            tv[:, :width] = 0.5 * (law - p[:, :width].flatten(0, 1)).abs().sum(-1).view(batch, width).float()
        else:
            tv[:, :width] = float("nan")
    if ctx.redraft is not None:  # the drafts' actual laws differ from the recorded ones
        tv[:, :width] = ctx.redraft.realised_tv(state, p[:, :width], sampling, audit)

    # 5. Emit: drafts 0..a-1, then the drawn token at a. Their cache entries are already in place.
    emitted = torch.cat([window, window[:, :1]], dim=1).scatter(1, accepted[:, None], next_token[:, None])  # (B, W+1)
    codes = state.codes.scatter(1, decided[:, None] + span, emitted)
    advance = torch.where(active, accepted + 1, torch.zeros_like(accepted))
    new_decided = decided + advance

    # 6. Refill: new slot k is token n' + k = n + a + 1 + k, predicted by output j = a + 1 + k.
    # Jacobi update where j <= W (a fresh draw from this forward's law there), else initialisation.
    source = accepted[:, None] + 1 + span[None, :width]  # (B, W)
    jacobi = source <= width
    src = source.clamp_max(width)
    p_src = p.gather(1, src[:, :, None].expand(-1, -1, vocab))  # (B, W, V)
    if sampling.greedy:
        fresh = p_src.argmax(-1)
    elif ctx.coupling == "mc":
        fresh = _maximal_coupling(state, p_draft, u, src, p_src)
    elif ctx.coupling == "gumbel":
        fresh = _gumbel_coupling(keys, new_decided, p_src)
    else:
        fresh = draw(p_src, rng.uniform(keys, decided, rng.JACOBI_DRAFT, width))  # (B, W)
    fresh_q = p_src  # every coupling's redraw follows this forward's law
    if ctx.reuse is not None and not sampling.greedy:
        # Keep the untested old draft for that token (its law was confident enough); the choice reads
        # only the old law, never the drawn token, so the kept draft is still distributed as its law.
        old = src.clamp_max(width - 1)  # old window slot of token n + j is j
        old_q = draft_q.gather(1, old[:, :, None].expand(-1, -1, vocab))
        keep = jacobi & (src < width) & (old_q.amax(-1) >= ctx.reuse)  # (B, W)
        fresh = torch.where(keep, window.gather(1, old), fresh)
        fresh_q = torch.where(keep[:, :, None], old_q, fresh_q)
    fresh_law = None
    if ctx.redraft is not None:
        fresh, fresh_q, fresh_law = ctx.redraft.redraw(state, p, src, jacobi, fresh, fresh_q)
    new_window, new_q = _refill(ctx, state, codes, new_decided, jacobi, fresh, fresh_q, next_token)
    if fresh_law is not None:  # fresh tails follow their point masses, as recorded
        state = state._replace(draft_law=torch.where(jacobi[:, :, None], fresh_law, new_q))

    log = JacobiLog(torch.where(active, accepted, -1), tv, merged)
    new_state = state._replace(
        codes=codes, decided=new_decided, length=length + advance, window=new_window, draft_q=new_q
    )
    return new_state, log


def _maximal_coupling(
    state: JacobiState, p_draft: torch.Tensor, u: torch.Tensor, src: torch.Tensor, p_src: torch.Tensor
) -> torch.Tensor:
    """MC-SJD's redraw (B, W): the new draft for output ``src`` (B, W) (token ``n + src``) is the old draft
    of that token (window slot ``src``) when it passes the exact test ``u < min(1, p(x) / q(x))`` against
    this forward's law, else a draw from ``norm(max(0, p - q))``: distributed as ``p_src`` (B, W, V) and
    equal to the old draft with probability ``1 - TV(p, q)``. Output ``W`` has no old draft (``q = 0``:
    a plain draw from ``p``).

    The keep decision reuses the position's test uniform ``u`` (B, W) (the paper's "single-line" change:
    the released code runs its test loop over the whole window without stopping at the first
    rejection); only positions past the first rejection read it here, and the test read it only for
    positions up to that rejection, so no uniform decides two things. ``p_draft`` (B, W) is ``p(x)``
    at each old draft. The exact ratio is used even when the step's own test is grouped (GSD), so the
    redraw follows ``p`` whatever the test."""
    window, draft_q = state.window, state.draft_q
    width, vocab = window.shape[1], draft_q.shape[-1]
    q_draft = draft_q.gather(2, window[:, :, None])[:, :, 0]  # (B, W) q(x) > 0
    keep = sampled_test(p_draft, q_draft, u)  # (B, W) per old slot
    has_old = src < width  # (B, W)
    old = src.clamp_max(width - 1)  # old window slot of token n + src
    old_q = draft_q.gather(1, old[:, :, None].expand(-1, -1, vocab)) * has_old[:, :, None]  # (B, W, V)
    uniforms = rng.uniform(state.keys, state.decided, rng.JACOBI_DRAFT, width)  # (B, W)
    redrawn = draw(residual(p_src, old_q), uniforms)  # (B, W); q = 0 leaves p
    kept = has_old & keep.gather(1, old)
    return torch.where(kept, window.gather(1, old), redrawn)


def _gumbel_coupling(keys: torch.Tensor, new_decided: torch.Tensor, p_src: torch.Tensor) -> torch.Tensor:
    """MC-SJD's Gumbel coupling (B, W): new slot ``k`` drafts image token ``n' + k`` and takes
    ``argmax(p / E)`` with ``E`` (V,) Exp(1) variables keyed by (sample, token index) alone, so every
    iteration that redraws that token races the same noise (the released code keeps a table of
    uniforms per window slot and shifts it with the accepted tokens; keying by the token index is the
    same thing without state). One hash per vocabulary entry and slot: W * V per row and step."""
    batch, width, vocab = p_src.shape
    tokens = new_decided[:, None] + torch.arange(width, device=p_src.device)  # (B, W) absolute token index
    flat_keys = keys[:, None].expand(-1, width).reshape(-1)  # (B*W,)
    u = rng.uniform(flat_keys, tokens.reshape(-1), rng.JACOBI_COUPLE, vocab)  # (B*W, V)
    exponential = -torch.log(u).view(batch, width, vocab)  # (B, W, V) Exp(1)
    return (p_src / exponential).argmax(-1)


def _in_group(ctx: JacobiContext, p: torch.Tensor, drafts: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
    """(R,) whether ``top`` (R,) lies in the group of ``drafts`` (R,) under ``p`` (R, V)."""
    marker = torch.zeros_like(p).scatter(1, top[:, None], 1.0)  # all mass on the argmax: marker(G) = 1 iff top in G
    _, hit = ctx.grouping.group_masses(p, marker, drafts[:, None], ctx.close)  # (R, 1)
    return hit[:, 0] > 0.5


def _refill(ctx, state, codes, new_decided, jacobi, fresh, fresh_q, next_token):
    """The next window (B, W) and its laws (B, W, V): Jacobi draws where ``jacobi``, else initialised tokens
    (point-mass laws), built left to right so a repeat init can copy the slot before it."""
    width, vocab = ctx.window, ctx.model.config.vocab_size
    batch, device = new_decided.shape[0], new_decided.device
    side = ctx.model.config.grid_size
    uniform = initial_tokens(ctx, state.keys, state.decided, width)  # (B, W)
    slots = []
    for k in range(width):  # W is a host constant: the loop unrolls
        token_index = new_decided + k  # (B,) image token this slot drafts
        if ctx.init == "random":
            tail = uniform[:, k]
        elif ctx.init == "horizon":
            previous = next_token if k == 0 else slots[k - 1]
            tail = torch.where(token_index % side == 0, uniform[:, k], previous)
        else:  # vertical: the token one row up, decided or earlier in this window
            above = token_index - side
            decided_value = codes.gather(1, above.clamp_min(0)[:, None])[:, 0]
            if k >= side:
                decided_value = torch.where(above >= new_decided, slots[k - side], decided_value)
            tail = torch.where(above < 0, uniform[:, k], decided_value)
        slots.append(torch.where(jacobi[:, k], fresh[:, k], tail))
    window = torch.stack(slots, dim=1)  # (B, W)
    point = torch.zeros(batch, width, vocab, dtype=fresh_q.dtype, device=device).scatter(2, window[:, :, None], 1.0)
    return window, torch.where(jacobi[:, :, None], fresh_q, point)
