"""One speculative Jacobi step (SJD, MC-SJD, SJD++, GSD...) as a pure, static-shape function.

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

The methods differ in two objects of the context, each called once per step: the window test
(``ctx.test``: :class:`lantern.rules.exact.ExactWindowTest`, or GSD's
:class:`lantern.rules.grouped.GroupedTest`, which tests a draft's dynamic group and records the realised
TV of the law that results) and the redraw of the untested positions (``ctx.redraw``: SJD's independent
draw, MC-SJD's couplings, the lossless ``reuse``, SJD++'s confident reuse; :mod:`.redraw`).

Cache layout as in :mod:`lantern.decoding.tree.step`: per row ``n`` decided tokens, ``L = T + n - 1``
valid cache slots; the pending token (``codes[n-1]``) and the window go to slots ``L .. L+W``. The
accepted prefix of the window already sits at the slots it keeps, so nothing moves; entries past it
are overwritten by the next step. No host reads, so the step compiles with ``fullgraph=True``.
"""

from __future__ import annotations

import torch

from lantern import rng
from lantern.decoding.batch import repeat_rows, tree_attention_mask
from lantern.decoding.jacobi.state import JacobiContext, JacobiLog, JacobiState, Redrawing
from lantern.models.sampling import draw, guided_logits_at, verification_probabilities
from lantern.rules.exact import residual


def initial_tokens(ctx: JacobiContext, keys: torch.Tensor, step: torch.Tensor, count: int) -> torch.Tensor:
    """``count`` uniform codes per row (B, count), stream JACOBI_INIT."""
    vocab = ctx.model.config.vocab_size
    u = rng.uniform(keys, step, rng.JACOBI_INIT, count)  # (B, count)
    return (u * vocab).long().clamp_max(vocab - 1)


def jacobi_step(ctx: JacobiContext, state: JacobiState, audit: bool = True) -> tuple[JacobiState, JacobiLog]:
    """Verify the window, emit the accepted prefix and one drawn token, refill the window."""
    sampling, width, vocab = ctx.sampling, ctx.window, ctx.model.config.vocab_size
    decided, keys, greedy = state.decided, state.keys, sampling.greedy
    span = torch.arange(width + 1, device=decided.device)  # (W+1,)
    active = decided < ctx.num_tokens  # (B,) finished rows run along without advancing
    p = _window_laws(ctx, state, span)  # (B, W+1, V)

    # 2. Test the drafts; ``accepted`` (B,) is the length of the passing prefix.
    u = rng.uniform(keys, decided, rng.JACOBI_ACCEPT, width)  # (B, W)
    verdict = ctx.test(p[:, :width], state.window, state.draft_q, state.draft_law, u, greedy, audit)
    accepted = verdict.passed.long().cumprod(dim=1).sum(dim=1)  # (B,) in 0..W

    # 3. The token at position ``accepted``: the residual after a rejection, p after a full window.
    q_padded = torch.cat([state.draft_q, torch.zeros_like(state.draft_q[:, :1])], dim=1)  # (B, W+1, V)
    at = accepted[:, None, None].expand(-1, 1, vocab)
    p_at, q_at = p.gather(1, at)[:, 0], q_padded.gather(1, at)[:, 0]  # (B, V)
    if greedy:
        next_token = p_at.argmax(-1)
    else:
        next_token = draw(residual(p_at, q_at), rng.uniform(keys, decided, rng.JACOBI_RESIDUAL, 1)[:, 0])

    # 4. Emit: drafts 0..a-1, then the drawn token at a. Their cache entries are already in place.
    window = state.window
    emitted = torch.cat([window, window[:, :1]], dim=1).scatter(1, accepted[:, None], next_token[:, None])  # (B, W+1)
    codes = state.codes.scatter(1, decided[:, None] + span, emitted)
    advance = torch.where(active, accepted + 1, torch.zeros_like(accepted))
    new_decided = decided + advance

    # 5. Refill: new slot k is token n' + k = n + a + 1 + k, predicted by output j = a + 1 + k.
    # Jacobi update where j <= W (the redraw of this forward's law there), else initialisation.
    source = accepted[:, None] + 1 + span[None, :width]  # (B, W)
    jacobi = source <= width
    src = source.clamp_max(width)
    p_src = p.gather(1, src[:, :, None].expand(-1, -1, vocab))  # (B, W, V)
    fresh = ctx.redraw(Redrawing(state, p, src, jacobi, p_src, u, new_decided, greedy))
    new_window, new_q = _refill(ctx, state, codes, new_decided, jacobi, fresh.drafts, fresh.recorded, next_token)
    # A lossy redraw's drafts follow ``fresh.law``; fresh tails follow their point masses, as recorded.
    law = state.draft_law if fresh.law is None else torch.where(jacobi[:, :, None], fresh.law, new_q)

    # (B, W+1) the token after a full window follows p: TV 0 when the window's laws were accounted for (NaN stays
    # NaN: an unaudited step, or a test whose law has no closed form, SJD-SV's)
    tv = torch.cat([verdict.tv, verdict.tv[:, -1:] * 0], dim=1)
    log = JacobiLog(torch.where(active, accepted, -1), tv, verdict.merged)
    new_state = state._replace(
        codes=codes, decided=new_decided, length=state.length + advance, window=new_window, draft_q=new_q, draft_law=law
    )
    return new_state, log


def _window_laws(ctx: JacobiContext, state: JacobiState, span: torch.Tensor) -> torch.Tensor:
    """1. One target forward over [pending, window], causal in the window: the target law (B, W+1, V) at each
    window position (output j predicts token n + j from inputs 0..j)."""
    width = ctx.window
    pending = state.codes.gather(1, (state.decided - 1)[:, None])  # (B, 1)
    inputs = torch.cat([pending, state.window], dim=1)  # (B, W+1)
    chain = torch.ones(width + 1, width + 1, dtype=torch.bool, device=span.device).tril()
    return structure_laws(ctx, state, inputs, chain, span)


def structure_laws(
    ctx: JacobiContext, state: JacobiState, inputs: torch.Tensor, ancestors: torch.Tensor, depth: torch.Tensor
) -> torch.Tensor:
    """One target forward over a draft structure's nodes ``inputs`` (B, N) (node 0: the pending token), node ``i``
    at cache slot ``L + i`` and position ``L + depth[i]``, seeing the prefix and the nodes ``ancestors`` (N, N)
    marks (a chain: ``tril``, ``depth = arange``; SJD-PAC's tree). The target law (B, N, V) after each node."""
    model, groups, sampling = ctx.model, ctx.groups, ctx.sampling
    decided, length = state.decided, state.length
    batch, nodes = inputs.shape
    mask = tree_attention_mask(state.target_valid[:batch], length, ancestors.expand(batch, -1, -1))  # (B, 1, N, S)
    slots = length[:, None] + torch.arange(nodes, device=inputs.device)  # (B, N)
    positions = (length[:, None] + depth).clamp_max(model.config.max_seq_len - 1)  # past the image: junk rows
    logits, _ = model.forward_tokens(
        repeat_rows(inputs, groups),
        repeat_rows(positions, groups),
        repeat_rows(slots, groups),
        repeat_rows(mask, groups),
        ctx.cache,
    )  # (rows, N, V)
    return verification_probabilities(guided_logits_at(logits, sampling, decided[:, None] + depth), sampling)


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
