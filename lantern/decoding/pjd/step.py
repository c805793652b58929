"""One PJD step (Parallel Jacobi Decoding, Liao et al., CVPR 2026, arXiv 2606.05703) as a pure, static-shape
function: 2-D Jacobi decoding, a Jacobi window on every grid row under way, one target forward for all of them.

Each row under way (:mod:`lantern.decoding.pjd.layout`: a row starts once the row above has ``rows_ahead``
tokens) feeds its pending token and up to ``W`` drafts; the row-causal mask keeps the rows' drafts apart. The
drafts are tested with the window test (SJD's ``u < min(1, p(x) / q(x))``; any :mod:`lantern.rules.window`
scheme over it). As in the released code (boyaliao/PJD, ``scheduler/jacobi_iteration_lumina_mgpt.py``,
``SpeculativeSampler.__call__``):

* the top row (every row above it complete) commits its accepted drafts and one more token: the residual
  ``norm(max(0, p - q))`` at its first rejection, ``p`` after its last draft (SJD on one row);
* every other row commits its accepted drafts only (no residual: its laws see the rows above only as far as
  they are committed), so it stays behind the row above;
* the next drafts of a row are this forward's laws at the columns after its committed ones (the Jacobi update);
  with ``keep`` (the release's 0.5), a draft after the first rejection whose own ratio ``min(1, p(x) / q(x))``
  exceeds ``keep`` is kept with its old law instead of being redrawn; columns past the outputs are initialised
  with uniform codes (point-mass laws).

Randomness is counter-based per image: streams JACOBI_ACCEPT (tests), JACOBI_RESIDUAL (the top row's drawn
token), JACOBI_DRAFT (redraws), JACOBI_INIT (fresh codes), each keyed by ``step * R + row`` (``step`` counts
this image's steps), so a step rerun from the same state with other ``keys`` draws fresh uniforms (an audit
reruns steps so) and images do not depend on the batch. No host reads: compiles with ``fullgraph=True``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from lantern import rng
from lantern.decoding.batch import repeat_rows
from lantern.decoding.pjd.layout import Lanes, lanes, mark, pending_source, row_causal_mask
from lantern.models.sampling import SamplingConfig, draw, guided_logits_at, verification_probabilities
from lantern.models.target import Target
from lantern.rules.exact import ExactWindowTest, residual


class PJDState(NamedTuple):
    """Per image (B) unless said: ``codes`` (B, N + 1) committed tokens in raster order (column N takes
    discarded writes); ``done`` (B, R) committed tokens per grid row; ``drafts`` (B, R + 1, W) each row's drafts
    for the columns after its committed ones (row R: discarded writes) and ``draft_q`` (B, R + 1, W, V) the law
    each was drawn from; ``written`` (B, C) cache columns holding a committed token's key; ``emitted`` (B, N + 1)
    the step that committed each token (0: the prefill); ``step`` (B,) steps run; ``keys`` (B,) RNG keys;
    ``target_valid`` (rows, C) which cache columns hold real keys."""

    codes: torch.Tensor
    done: torch.Tensor
    drafts: torch.Tensor
    draft_q: torch.Tensor
    written: torch.Tensor
    emitted: torch.Tensor
    step: torch.Tensor
    keys: torch.Tensor
    target_valid: torch.Tensor


class PJDLog(NamedTuple):
    """Per step: ``drawn`` (B,) tokens committed for each image (0 once it is finished)."""

    drawn: torch.Tensor


@dataclass
class PJDContext:
    """What stays fixed for a batch shape: the model, its cache (static address), the window test and knobs."""

    model: Target
    cache: object
    sampling: SamplingConfig
    test: ExactWindowTest
    width: int  # W: drafts per row per forward
    rows_ahead: int  # tokens of the row above before a row starts
    lanes: int  # A: rows served per forward
    keep: float | None  # the release's reuse threshold (None: every untested draft is redrawn)
    groups: int  # CFG rows per image


def pjd_step(ctx: PJDContext, state: PJDState, audit: bool = True) -> tuple[PJDState, PJDLog]:
    """Verify every live row's window, commit, and refill the windows (module docstring)."""
    cfg = ctx.model.config
    side, cond_len, num_tokens = cfg.grid_size, cfg.cls_token_num, cfg.num_image_tokens
    width, span, count = ctx.width, ctx.width + 1, ctx.lanes
    batch, rows = state.done.shape
    capacity = state.written.shape[1]
    lane = lanes(state.done, count, width, side, ctx.rows_ahead)
    row_at = torch.where(lane.live, lane.row, rows)  # (B, A) rows of the state's draft arrays (R: discard)
    drafts = state.drafts.gather(1, row_at[:, :, None].expand(-1, -1, width))  # (B, A, W)
    draft_q = state.draft_q.gather(1, row_at[:, :, None, None].expand(-1, -1, width, state.draft_q.shape[-1]))

    p, keyed = _forward(ctx, state, lane, drafts)  # (B, A, J, V): output j predicts column done + j
    flat = lambda x: x.flatten(0, 1)  # noqa: E731 - (B, A, ...) -> (B*A, ...)
    keys = state.keys[:, None].expand(-1, count)
    counter = state.step[:, None] * rows + lane.row  # (B, A) one counter per (step, row)
    u = rng.uniform(flat(keys), flat(counter), rng.JACOBI_ACCEPT, width)  # (B*A, W)
    verdict = ctx.test(flat(p[:, :, :width]), flat(drafts), flat(draft_q), None, u, ctx.sampling.greedy, audit)
    tested = torch.arange(width, device=p.device) < lane.drafts[:, :, None]  # (B, A, W)
    passed = verdict.passed.view(batch, count, width) & tested
    accepted = passed.long().cumprod(dim=2).sum(dim=2)  # (B, A)

    # The top row also commits the token at its first rejection (residual) or after its last draft (p).
    top = (torch.arange(count, device=p.device) == 0)[None, :] & lane.live  # (B, A)
    at = accepted[:, :, None, None].expand(-1, -1, 1, p.shape[-1])
    q_padded = torch.cat([draft_q, torch.zeros_like(draft_q[:, :, :1])], dim=2)  # (B, A, J, V)
    rejected = (accepted < lane.drafts)[:, :, None]  # (B, A, 1) else every tested draft passed: the law is p
    law = residual(p.gather(2, at)[:, :, 0], q_padded.gather(2, at)[:, :, 0] * rejected)  # (B, A, V)
    if ctx.sampling.greedy:
        drawn = p.gather(2, at)[:, :, 0].argmax(-1)
    else:
        drawn = draw(law, rng.uniform(flat(keys), flat(counter), rng.JACOBI_RESIDUAL, 1).view(batch, count))
    commits = torch.where(lane.live, accepted + top.long(), 0)  # (B, A)
    emitted = torch.cat([drafts, drafts[:, :, :1]], dim=2).scatter(2, accepted[:, :, None], drawn[:, :, None])
    offsets = torch.arange(span, device=p.device)
    into = torch.where(offsets < commits[:, :, None], lane.raster + 1, num_tokens).flatten(1)  # (B, A*J)
    codes = state.codes.scatter(1, into, emitted.flatten(1))
    stamped = state.emitted.scatter(1, into, (state.step[:, None] + 1).expand_as(into).to(state.emitted.dtype))
    done = state.done.scatter_add(1, lane.row, commits)  # live lanes hold distinct rows; others add 0
    # Accepted drafts' keys were written at their own slots in this forward (input j + 1 is draft j).
    took = (offsets[1:] <= accepted[:, :, None]) & lane.used[:, :, 1:]  # (B, A, W)
    written = keyed | mark(cond_len + lane.raster[:, :, 1:].flatten(1), took.flatten(1), capacity)

    new_drafts, new_q = _refill(ctx, lane, p, drafts, draft_q, verdict.ratio, accepted, commits, keys, counter)
    state_drafts = state.drafts.scatter(1, row_at[:, :, None].expand(-1, -1, width), new_drafts)
    state_q = state.draft_q.scatter(1, row_at[:, :, None, None].expand_as(new_q), new_q)
    new_state = state._replace(
        codes=codes,
        done=done,
        drafts=state_drafts,
        draft_q=state_q,
        written=written,
        emitted=stamped,
        step=state.step + 1,
    )
    return new_state, PJDLog(commits.sum(1))


def _forward(ctx: PJDContext, state: PJDState, lane: Lanes, drafts: torch.Tensor):
    """One target forward over the flush query and the lanes: laws (B, A, J, V) and the cache columns holding
    committed keys after it (B, C)."""
    model, cfg = ctx.model, ctx.model.config
    side, cond_len, num_tokens = cfg.grid_size, cfg.cls_token_num, cfg.num_image_tokens
    batch, count, span = lane.raster.shape
    capacity, device = state.written.shape[1], state.done.device
    # The flush query: the last token of the row above the top one, when its key was never written.
    complete = (state.done == side).long()
    first_open = complete.cumprod(1).sum(1)  # (B,) rows complete from the top
    end = first_open * side - 1  # (B,) raster index of that row's last token (-1: none)
    # A row's pending input is a committed token at its own slot, or the true predecessor (r - 1, S - 1) once row
    # r - 1 is complete (at its slot too: it writes that key, so the top row needs no flush then); a proxy sits at
    # a scratch slot that only its own row sees.
    above = torch.where(lane.row == 0, side, state.done.gather(1, (lane.row - 1).clamp_min(0)))
    fed_true = lane.used[:, :, 0] & ((lane.done > 0) | (above == side))  # (B, A)
    unwritten = ~state.written.gather(1, (cond_len + end).clamp_min(0)[:, None])[:, 0]
    flush = (end >= 0) & (first_open < state.done.shape[1]) & unwritten & (lane.done[:, 0] > 0)
    scratch = cond_len + num_tokens + torch.arange(count * span, device=device).view(count, span)  # (A, J)
    own = lane.used & ~((torch.arange(span, device=device) == 0) & ~fed_true[:, :, None])  # inputs at their slots
    lane_slots = torch.where(own, cond_len + lane.raster, scratch)  # (B, A, J)
    flush_slot = torch.where(flush, cond_len + end, capacity - 1)  # (B,) the last scratch column when idle
    pending = state.codes.gather(1, pending_source(state.codes, state.done, lane, side))  # (B, A)
    tokens = torch.cat(
        [state.codes.gather(1, end.clamp_min(0)[:, None]), torch.cat([pending[:, :, None], drafts], 2).flatten(1)], 1
    )
    slots = torch.cat([flush_slot[:, None], lane_slots.flatten(1)], dim=1)  # (B, Q)
    query_raster = torch.cat(
        [torch.where(flush, end, -1)[:, None], torch.where(lane.used, lane.raster, -1).flatten(1)], 1
    )
    positions = torch.where(query_raster >= 0, cond_len + query_raster, slots).clamp(0, cfg.max_seq_len - 1)
    keyed = (
        state.written
        | mark(lane_slots[:, :, 0], fed_true, capacity)
        | mark(flush_slot[:, None], flush[:, None], capacity)
    )
    valid = state.target_valid[:batch]
    mask = row_causal_mask(keyed, valid, query_raster, slots, lane_slots, lane.used, cond_len)
    groups = ctx.groups
    logits, _ = model.forward_tokens(
        repeat_rows(tokens, groups),
        repeat_rows(positions, groups),
        repeat_rows(slots, groups),
        repeat_rows(mask[:, None], groups),
        ctx.cache,
    )  # (rows, Q, V)
    predicts = (query_raster + 1).clamp_min(0)  # the token index each output predicts (CFG interval)
    p = verification_probabilities(guided_logits_at(logits, ctx.sampling, predicts), ctx.sampling)
    return p[:, 1:].reshape(batch, count, span, -1), keyed


def _refill(ctx, lane, p, drafts, draft_q, ratio, accepted, commits, keys, counter):
    """The next drafts (B, A, W) and their laws (B, A, W, V): new slot ``s`` drafts column ``done' + s``, whose
    law is output ``o = commits + s`` of this forward where that exists (the Jacobi update; the release keeps an
    old draft after the first rejection when its ratio passes ``keep``), else a uniform code (a point mass)."""
    batch, count, width = drafts.shape
    vocab = p.shape[-1]
    flat = lambda x: x.flatten(0, 1)  # noqa: E731
    slots = torch.arange(width, device=p.device)
    source = commits[:, :, None] + slots  # (B, A, W) the output whose law each new slot takes
    jacobi = source <= lane.drafts[:, :, None]
    src = source.clamp_max(width)
    p_src = p.gather(2, src[:, :, :, None].expand(-1, -1, -1, vocab))  # (B, A, W, V)
    if ctx.sampling.greedy:
        fresh = p_src.argmax(-1)
    else:
        u = rng.uniform(flat(keys), flat(counter), rng.JACOBI_DRAFT, width).view(batch, count, width)
        fresh = draw(p_src, u)
    fresh_q = p_src
    if ctx.keep is not None and not ctx.sampling.greedy:
        old = src.clamp_max(width - 1)
        kept_ratio = ratio.view(batch, count, width).gather(2, old).clamp_max(1.0)
        keep = jacobi & (source > accepted[:, :, None]) & (source < lane.drafts[:, :, None]) & (kept_ratio > ctx.keep)
        fresh = torch.where(keep, drafts.gather(2, old), fresh)
        fresh_q = torch.where(keep[..., None], draft_q.gather(2, old[..., None].expand(-1, -1, -1, vocab)), p_src)
    codes = rng.uniform(flat(keys), flat(counter), rng.JACOBI_INIT, width).view(batch, count, width)
    init = (codes * vocab).long().clamp_max(vocab - 1)
    new = torch.where(jacobi, fresh, init)
    point = torch.zeros_like(p_src).scatter(3, new[..., None], 1.0)
    return new, torch.where(jacobi[..., None], fresh_q, point)
