"""Where PJD's queries sit and what each sees: the lanes, their inputs, cache slots and the row-causal mask.

PJD (Parallel Jacobi Decoding, arXiv 2606.05703) runs a Jacobi window on several grid rows at once. Every
forward has ``1 + A * J`` queries (static): one *flush* query, then ``A`` lanes of ``J = W + 1`` inputs. Lane
``k`` serves grid row ``top + k`` (``top``: the first incomplete row). A lane's inputs are the row's pending
token (its last committed one, at its own cache slot) and up to ``W`` drafts for the columns after it, at their
own slots; inputs past the row's draft count are padding at scratch slots after the image.

The ZipAR row layout (:mod:`lantern.decoding.zipar.step`) gives the rest: row ``r`` takes part once row
``r - 1`` has ``rows_ahead`` tokens, and before it has a token of its own its pending input is the predecessor
of ``(r, 0)``: the true ``(r - 1, S - 1)`` once row ``r - 1`` is complete, else a proxy (the latest token of row
``r - 2``; row 1 therefore waits for row 0 to complete). That input sits at a scratch slot with the
predecessor's position, seen by its own row only. The flush query writes the key of the last token of the row
above ``top`` when that token was drawn (not an accepted draft), so no committed token stays without its key.

The row-causal mask: a query sees the condition, every committed token (a key written in an earlier step, or
a pending / flush input of this forward) before it in raster order, and its own lane's inputs up to itself;
never another row's drafts. Rows below do not see rows above beyond what those have committed.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Lanes(NamedTuple):
    """One step's layout, per image (B) and lane (A) unless said: ``row`` grid row (clamped into the grid);
    ``live`` whether the row takes part; ``done`` its committed tokens; ``drafts`` how many of its ``W`` drafts
    are fed (<= ``W``); ``raster`` (B, A, J) raster index of each input's position (the pending one: column
    ``done - 1``, the predecessor ``r*S - 1`` when ``done = 0``); ``used`` (B, A, J) which inputs are real."""

    row: torch.Tensor
    live: torch.Tensor
    done: torch.Tensor
    drafts: torch.Tensor
    raster: torch.Tensor
    used: torch.Tensor


def lanes(done: torch.Tensor, lanes_: int, width: int, side: int, rows_ahead: int) -> Lanes:
    """The lanes of a step from ``done`` (B, R) committed tokens per grid row."""
    batch, rows = done.shape
    device = done.device
    complete = done == side  # (B, R)
    finished = complete.all(1)  # (B,)
    top = (~complete).long().argmax(1)  # (B,) first incomplete row
    row = top[:, None] + torch.arange(lanes_, device=device)  # (B, A)
    inside = (row < rows) & ~finished[:, None]
    row = row.clamp_max(rows - 1)
    mine = done.gather(1, row)
    above = torch.where(row == 0, side, done.gather(1, (row - 1).clamp_min(0)))  # (B, A)
    # A row takes part once the row above has rows_ahead tokens; row 1 waits for row 0 (no row r - 2 for a proxy).
    live = inside & (mine < side) & (above >= rows_ahead) & ((row >= 2) | (above == side))
    # Drafts: the row's pending token plus drafts never pass the row above's committed columns (the top row's
    # above is complete: its row end), and at most W of them.
    drafts = torch.where(live, ((above - mine).clamp_max(width + 1) - 1).clamp_min(0), 0)
    offsets = torch.arange(width + 1, device=device)
    raster = row[:, :, None] * side + mine[:, :, None] - 1 + offsets  # (B, A, J)
    used = live[:, :, None] & (offsets <= drafts[:, :, None])
    return Lanes(row, live, mine, drafts, raster, used)


def pending_source(codes: torch.Tensor, done: torch.Tensor, lane: Lanes, side: int) -> torch.Tensor:
    """Raster index (B, A) of the token each lane feeds first: its last committed token; before it has one,
    the true predecessor ``(r - 1, S - 1)`` once row ``r - 1`` is complete, else the proxy, row ``r - 2``'s
    latest token (ZipAR's)."""
    row = lane.row
    above = torch.where(row == 0, side, done.gather(1, (row - 1).clamp_min(0)))
    two_up = done.gather(1, (row - 2).clamp_min(0)).clamp_min(1)
    proxy = (row - 2).clamp_min(0) * side + two_up - 1
    own = lane.raster[:, :, 0]  # r*S + done - 1 (the predecessor's index when done = 0)
    return torch.where((lane.done == 0) & (above < side), proxy, own).clamp(0, codes.shape[1] - 1)


def mark(columns: torch.Tensor, flags: torch.Tensor, capacity: int) -> torch.Tensor:
    """(B, capacity) bool: True at ``columns`` (B, K) where ``flags`` (B, K)."""
    out = torch.zeros(columns.shape[0], capacity + 1, dtype=torch.bool, device=columns.device)
    return out.scatter(1, torch.where(flags, columns, capacity), True)[:, :capacity]


def row_causal_mask(
    keyed: torch.Tensor,
    valid: torch.Tensor,
    query_raster: torch.Tensor,
    slots: torch.Tensor,
    lane_slots: torch.Tensor,
    lane_used: torch.Tensor,
    cond_len: int,
) -> torch.Tensor:
    """The mask (B, Q, C) over the whole cache.

    ``keyed`` (B, C) columns holding committed tokens' keys after this forward's writes; ``valid`` (B, C) real
    columns (padded condition slots are not); ``query_raster`` (B, Q) each query's raster index (-1: sees no
    image key); ``slots`` (B, Q) each query's own column; ``lane_slots`` (B, A, J) and ``lane_used`` (B, A, J)
    the lanes' inputs (the flush query is ``Q - A*J`` queries before them and has no lane).
    """
    batch, capacity = keyed.shape
    columns = torch.arange(capacity, device=keyed.device)
    raster = columns - cond_len  # image columns: their raster index; scratch columns are never keyed
    condition = (columns < cond_len)[None, :] & valid  # (B, C)
    seen = keyed[:, None, :] & (raster[None, None, :] < query_raster[:, :, None])  # (B, Q, C)
    own_self = columns[None, None, :] == slots[:, :, None]
    _, lanes_, span = lane_slots.shape
    earlier = torch.ones(span, span, dtype=torch.bool, device=keyed.device).tril()  # (J, J) inputs i <= j
    hit = torch.zeros(batch, lanes_, span, capacity + 1, dtype=torch.bool, device=keyed.device)
    target = torch.where(lane_used, lane_slots, capacity)[:, :, None, :].expand(-1, -1, span, -1)  # (B, A, J, J)
    own = hit.scatter(3, torch.where(earlier, target, capacity), True)[..., :capacity].flatten(1, 2)
    lane_part = torch.cat([torch.zeros_like(own[:, : slots.shape[1] - own.shape[1]]), own], dim=1)  # (B, Q, C)
    return condition[:, None, :] | seen | own_self | lane_part
