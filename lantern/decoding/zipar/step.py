"""One ZipAR step (He et al. 2024, arXiv 2412.04062): next-set decoding over the 2-D token grid, as a pure,
static-shape function.

Raster AR decodes one token per target forward. ZipAR uses spatial locality: row ``r`` of the ``R x S`` grid
starts once row ``r - 1`` has decoded ``window`` tokens, so several rows advance together, one token per
started row per forward. A token of row ``r`` then sees the rows above only as far as they are decoded
(the columns of row ``r - 1`` beyond its own few are not there yet); the result is not the target's
law (ZipAR is lossy, as the paper says), traded for fewer forwards: about ``S + (R - 2) * window + S``
steps instead of ``R * S - 1`` (LlamaGen-L at 24 x 24 with window 16: 576 -> ~400).

The first token of row ``r`` is predicted by the output at the last slot of row ``r - 1``, whose token is
not decoded yet when row ``r`` starts. As in the released code (``decode_n_tokens_zipar``), a proxy stands
in for it: the latest decoded token of row ``r - 2`` (the token above the missing one once row ``r - 2``
is complete), fed at the missing token's position; row 1 has no row ``r - 2`` and so starts only when
row 0 is complete. When row ``r - 1`` is complete at the start, its true last token is fed instead
(then the step is exact raster AR there). A completed row whose successor already started feeds its
last token once more (a "flush") so its true key/value replaces the proxy's in the cache.

Every forward has one query per grid row (``R``, static): a started row feeds its latest token (its output
draws the row's next token), a starting row its proxy, a completed row its flush once, every other row
a scratch slot past the image that nobody attends to. Attention: the condition, every cache slot that
holds a decoded token's key (``written``, plus this step's true inputs) at a raster position not after
the query's, and the query itself; a proxy's key is seen by its own query only. Tokens are drawn with
the AR sampler's counter-based uniform of their raster index, so ``window >= S`` (every row waits for
the one above) is raster AR, token for token. No host reads: compiles with ``fullgraph=True``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from lantern.models.sampling import SamplingConfig, guided_logits_at, next_token
from lantern.models.target import Target


class ZipARState(NamedTuple):
    """Per image (B) unless said: ``codes`` (B, N + 1) decoded tokens in raster order (column N takes the
    writes of slots that draw nothing); ``done`` (B, R) tokens decoded per grid row; ``flushed`` (B, R)
    whether a completed row's last key is the true one; ``written`` (B, C) cache columns holding a
    decoded token's key; ``keys`` (B,) RNG keys; ``target_valid`` (rows, C) which columns hold real keys
    (padded condition slots do not)."""

    codes: torch.Tensor
    done: torch.Tensor
    flushed: torch.Tensor
    written: torch.Tensor
    keys: torch.Tensor
    target_valid: torch.Tensor


class ZipARLog(NamedTuple):
    """Per step: ``drawn`` (B,) tokens this forward drew for each image (0 once it is finished)."""

    drawn: torch.Tensor


@dataclass
class ZipARContext:
    """What stays fixed for a batch shape: the model, its cache (static address) and the knobs."""

    model: Target
    cache: object
    sampling: SamplingConfig
    window: int  # tokens of the row above decoded before a row starts (<= S)
    groups: int  # CFG rows per image


def _repeat(x: torch.Tensor, groups: int) -> torch.Tensor:
    return x.repeat(groups, *([1] * (x.dim() - 1)))


def zipar_step(ctx: ZipARContext, state: ZipARState, audit: bool = True) -> tuple[ZipARState, ZipARLog]:
    """Advance every started row by one token (and start the rows whose row above is a window ahead)."""
    model, sampling, window = ctx.model, ctx.sampling, ctx.window
    cfg = model.config
    side, cond_len, num_tokens = cfg.grid_size, cfg.cls_token_num, cfg.num_image_tokens
    codes, done, flushed, written = state.codes, state.done, state.flushed, state.written
    batch, rows = done.shape
    device = done.device
    row = torch.arange(rows, device=device)  # (R,)

    # 1. What each grid row does this step.
    above = torch.cat([torch.full_like(done[:, :1], side), done[:, :-1]], dim=1)  # (B, R) row r-1's count
    above_complete = above == side
    # Row 1 has no proxy (no row r - 2): it waits for row 0 to complete.
    can_proxy = (row >= 2)[None, :] | above_complete
    start = (done == 0) & (above >= window) & can_proxy  # (B, R)
    advancing = (done > 0) & (done < side)  # (B, R) started rows with tokens left
    drawing = advancing | start  # (B, R) slots whose output draws a token
    starts_next = torch.cat([start[:, 1:], torch.zeros_like(start[:, :1])], dim=1)  # (B, R) row r+1 starts
    complete = done == side
    # A completed row rewrites its last key unless the row below starts now on the true token itself.
    flush = complete & ~flushed & (row < rows - 1)[None, :] & ~starts_next

    # 2. The input of each slot: raster index of the fed token's position, and the token.
    latest = row[None, :] * side + done - 1  # (B, R) a started row's latest token
    proxy_position = row[None, :] * side - 1  # (r-1, S-1): the missing predecessor of (r, 0)
    two_up = (torch.cat([torch.full_like(done[:, :2], side), done[:, :-2]], dim=1)).clamp_min(1)  # row r-2's count
    proxy_source = torch.where(above_complete, proxy_position, (row[None, :] - 2) * side + two_up - 1)
    fed_at = torch.where(start, proxy_position, latest)  # (B, R) raster index of the input's position
    source = torch.where(start, proxy_source, latest)  # (B, R) raster index of the fed token
    active = drawing | flush
    tokens = codes.gather(1, source.clamp(0, num_tokens - 1))  # (B, R)
    true_input = (advancing | flush | (start & above_complete)) & active  # its key is a decoded token's
    scratch = cond_len + num_tokens + row[None, :].expand(batch, -1)  # (B, R) one junk slot per grid row
    slots = torch.where(active, cond_len + fed_at, scratch)  # (B, R) cache column of each input
    positions = slots.clamp_max(cfg.max_seq_len - 1)  # scratch slots: any position, never kept

    # 3. Attention over the whole cache: condition, decoded keys not after the query, itself.
    capacity = written.shape[1]
    columns = torch.arange(capacity, device=device)  # (C,)
    fresh = torch.zeros_like(written).scatter(1, torch.where(true_input, slots, scratch), true_input)  # (B, C)
    keyed = written | fresh  # (B, C) columns holding decoded tokens' keys after this step's writes
    valid = state.target_valid[:batch]  # (B, C)
    condition = (columns < cond_len)[None, :] & valid  # (B, C)
    seen = keyed[:, None, :] & (columns[None, None, :] <= slots[:, :, None])  # (B, R, C)
    mask = condition[:, None, :] | seen | (columns[None, None, :] == slots[:, :, None])  # (B, R, C)
    groups = ctx.groups
    logits, _ = model.forward_tokens(
        _repeat(tokens, groups),
        _repeat(positions, groups),
        _repeat(slots, groups),
        _repeat(mask[:, None], groups),
        ctx.cache,
    )  # (rows, R, V)

    # 4. Draw the next token of every drawing row: raster index r * S + done (the first of a starting row).
    target = row[None, :] * side + done  # (B, R)
    guided = guided_logits_at(logits, sampling, target)  # (B, R, V)
    flat_keys = state.keys[:, None].expand(-1, rows).reshape(-1)  # (B*R,)
    drawn = next_token(guided.flatten(0, 1), sampling, flat_keys, target.reshape(-1)).view(batch, rows)
    codes = codes.scatter(1, torch.where(drawing, target, num_tokens), drawn)  # column N: discarded writes

    new_state = state._replace(
        codes=codes,
        done=done + drawing.long(),
        flushed=flushed | flush | torch.cat([start[:, 1:] & complete[:, :-1], torch.zeros_like(start[:, :1])], 1),
        written=keyed,
    )
    return new_state, ZipARLog(drawing.sum(1))
