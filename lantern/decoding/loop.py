"""The one decode loop: after a decoder's prefill, pure steps, with the host's few duties between them.

Every decoder (AR, tree speculative, Jacobi) hands this loop its step, a context (models, caches at fixed
addresses, knobs) and the first state. The loop owns what happens between steps:

* **compilation**: a compiled step's first call for a context runs the step eagerly and unguarded, so the
  lazy per-device tables of its pieces (tree indices, neighbour columns) exist before a graph is captured;
  later calls run the compiled step inside ``guard`` (e.g. a CUDA host-sync detector);
* **audit cadence**: steps ``N-1, 2N-1, ...`` get ``audit=True`` (costly realised-TV measurements); never
  the first step, so the first call compiles every graph later calls use;
* **sync cadence**: every ``sync_every`` steps the host reads ``done(state)`` (all rows finished?) and
  stops early; no other host read happens;
* **phase timing**: an eager decoder may pass ``timed`` (its step with time marks between phases) and a
  :class:`PhaseTimer`; timing stays outside the step functions.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import torch

Step = Callable[[Any, Any, bool], tuple[Any, Any]]


def run_steps(
    step: Step,
    compiled: Step,
    ctx,
    state,
    steps: int,
    *,
    audit_every: int | None = None,
    done: Callable[[Any], torch.Tensor] | None = None,
    sync_every: int = 1,
    guard=contextlib.nullcontext,
    timed: Callable | None = None,
    timer=None,
) -> tuple[Any, list]:
    """Run at most ``steps`` steps from ``state``; return the last state and every step's log.

    ``step(ctx, state, audit) -> (state, log)`` is the eager step and ``compiled`` the same step as the
    decoder compiled it (the same function when eager); ``ctx.warm`` says whether this context's first
    step has run. ``done(state)`` (B,) bool, read every ``sync_every`` steps, stops the loop when every
    row is finished (None: always run ``steps``).
    """
    logs = []
    for index in range(steps):
        audit = audit_every is not None and (index + 1) % audit_every == 0
        if timed is not None and timer is not None:
            with guard():
                state, log = timed(ctx, state, audit, timer)
        elif compiled is not step and not ctx.warm:
            state, log = step(ctx, state, audit)  # fills the pieces' lazy tables before a graph is captured
        else:
            with guard():
                state, log = compiled(ctx, state, audit)
        ctx.warm = True
        logs.append(log)
        if done is not None and (index + 1) % sync_every == 0 and bool(done(state).all()):
            break
    return state, logs


def default_sync_every(device: torch.device, sync_every: int | None) -> int:
    """How often the loop reads ``done``: every step on the CPU (reads are free there), every 8 on a GPU."""
    return sync_every or (8 if device.type == "cuda" else 1)


class PhaseTimer:
    """Seconds per phase of eager steps, measured between the phase calls (never inside them).

    CUDA events are read once at the end; on the CPU, where work is synchronous, ``perf_counter``.
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: dict[str, list] = {}

    def now(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def add(self, phase: str, start, stop) -> None:
        self.marks.setdefault(phase, []).append((start, stop))

    def totals(self) -> dict[str, float]:
        """Seconds per phase (synchronises once on CUDA)."""
        if self.cuda and self.marks:
            torch.cuda.synchronize()
            return {k: sum(a.elapsed_time(b) for a, b in v) / 1000 for k, v in self.marks.items()}
        return {k: sum(b - a for a, b in v) for k, v in self.marks.items()}


def summarise(logs: list, num_tokens: int, depth: int) -> dict[str, torch.Tensor]:
    """Per-sample CPU tensors from speculative step logs: steps, the acceptance histogram, realised TV, merged mass.

    Each log has ``accepted`` (B,) drafts accepted (-1 once a row finished), ``tv`` (B, D+1) the realised TV
    of each emitted token's law (NaN: not measured) and ``merged`` (B, D) the mass moved onto accepted
    drafts. A row's last step may overrun the image; its extra tokens are cut from the codes and not counted.
    """
    accepted_log = torch.stack([log.accepted for log in logs], dim=1)  # (B, S), -1 once a row finished
    tv_log = torch.stack([log.tv for log in logs], dim=1).double()  # (B, S, D+1)
    merged_log = torch.stack([log.merged for log in logs], dim=1).double()  # (B, S, D)
    batch, device = accepted_log.shape[0], accepted_log.device
    span = torch.arange(depth + 1, device=device)
    ran = accepted_log >= 0  # (B, S)
    histogram = torch.zeros(batch, depth + 2, dtype=torch.long, device=device)
    histogram.scatter_add_(1, torch.where(ran, accepted_log, depth + 1), torch.ones_like(accepted_log))
    emitted = span[None, None, :] <= accepted_log[:, :, None]  # (B, S, D+1) tokens each step emitted
    produced = torch.cumsum(emitted.sum(2), dim=1) - emitted.sum(2)  # (B, S) tokens before each step
    emitted &= (produced[:, :, None] + span[None, None, :]) < num_tokens - 1
    measured = emitted & ~torch.isnan(tv_log)
    realised = torch.where(measured, tv_log, 0.0)
    levels = span[None, None, :-1] < accepted_log[:, :, None]  # (B, S, D) accepted draft tokens
    moved = torch.where(levels, merged_log, 0.0)
    return {
        "steps": ran.sum(1).cpu(),
        "tokens": torch.full((batch,), num_tokens - 1, dtype=torch.long),
        "histogram": histogram[:, : depth + 1].cpu(),
        "tv_realised_sum": realised.sum((1, 2)).cpu(),
        "tv_realised_max": realised.amax((1, 2)).cpu(),
        "tv_measured": measured.sum((1, 2)).cpu(),
        "merged_sum": moved.sum((1, 2)).cpu(),
        "merged_max": moved.amax((1, 2)).cpu(),
        "accepted_drafts": levels.sum((1, 2)).cpu(),
    }
