"""The one decode loop: after a decoder's prefill, pure steps, with the host's few duties between them.

Every decoder (AR, tree speculative, VVS, ZipAR, Jacobi) hands this loop a :class:`Schedule` (which step
function each loop index runs: one for most decoders, plain / skip / chain for VVS), a context (models,
caches at fixed addresses, knobs) and the first state. The loop owns what happens between steps:

* **preparation**: a decoder calls :func:`prepare` on its pieces (draft structure, rule, grouping) once,
  when it builds a context, so every table a step reads is on the device before any graph is captured;
  a step never fills a table;
* **schedule**: loop step ``i`` runs ``schedule.kind(i)``, a host decision (each kind is its own pure,
  static-shape function, compiled on its own);
* **guard**: a compiled step's first call for a context and arguments (the call that captures its
  graph) runs outside ``guard`` (e.g. a CUDA host-sync detector: compiling syncs); every other call runs
  inside it;
* **audit cadence**: steps ``N-1, 2N-1, ...`` get ``audit=True`` (costly realised-TV measurements); never
  the first step, so the first call compiles every graph later calls use;
* **sync cadence**: every ``sync_every`` steps the host reads ``done(state)`` (all rows finished?) and
  stops early; no other host read happens;
* **phase timing**: with a :class:`PhaseTimer` (eager decoders) a kind's ``timed`` form (its step with
  time marks between phases) runs, or the whole step is timed as ``{kind}_step``; timing stays outside
  the step functions;
* **observation**: ``observe(kind, step, ctx, state, index)``, when given, sees every step's input before it
  runs, with the kind's eager step (the Monte Carlo TV audit reruns steps from it: lantern/decoding/audit.py),
  and the last state once more (kind and step None); it runs between steps, never inside one.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from lantern.decoding.compile import Compiled, compiled

Step = Callable[[Any, Any, bool], tuple[Any, Any]]


def prepare(device: torch.device | str, *pieces) -> None:
    """Put every table of ``pieces`` (draft structures, rules, groupings; None skipped) on ``device``:
    each piece with a ``prepare(device)`` method makes its own. Called once per context, before any step."""
    for piece in pieces:
        hook = getattr(piece, "prepare", None)
        if hook is not None:
            hook(torch.device(device))


@dataclass
class Schedule:
    """Which step each loop index runs.

    ``steps`` maps a kind to its eager step ``step(ctx, state, audit) -> (state, log)``; ``compiled`` to the
    same step as the decoder compiled it (built by :meth:`of`); ``kind(index)`` picks one (a host
    decision; the first kind when None); ``timed`` maps a kind to its phase-timed form
    ``timed(ctx, state, audit, timer)`` (eager only).
    """

    steps: dict[str, Step]
    compiled: dict[str, Step] = field(default_factory=dict)
    kind: Callable[[int], str] | None = None
    timed: dict[str, Callable] = field(default_factory=dict)

    @classmethod
    def of(cls, steps: dict[str, Step], mode: str, backend: str = "inductor", **kwargs) -> Schedule:
        """A schedule whose steps are compiled as ``mode`` says (``none``: eager)."""
        built = {kind: compiled(fn, mode, backend) for kind, fn in steps.items()}
        return cls(steps=dict(steps), compiled=built, **kwargs)

    def pick(self, index: int) -> str:
        """The kind loop step ``index`` runs."""
        return next(iter(self.steps)) if self.kind is None else self.kind(index)

    def kinds(self, count: int) -> list[str]:
        """The kinds of the first ``count`` loop steps."""
        return [self.pick(index) for index in range(count)]


def _guarded(step: Step, ctx, audit: bool, guard):
    """``guard()``, except for a compiled step's first call with these arguments (it captures a graph)."""
    if isinstance(step, Compiled) and not step.captured(ctx, audit):
        return contextlib.nullcontext()
    return guard()


def run_schedule(
    schedule: Schedule,
    ctx,
    state,
    steps: int,
    *,
    audit_every: int | None = None,
    done: Callable[[Any], torch.Tensor] | None = None,
    sync_every: int = 1,
    guard=contextlib.nullcontext,
    timer=None,
    observe: Callable | None = None,
) -> tuple[Any, list]:
    """Run at most ``steps`` steps of ``schedule`` from ``state``; return the last state and every step's log.

    ``done(state)`` (B,) bool, read every ``sync_every`` steps, stops the loop when every row is finished
    (None: always run ``steps``). The kinds the steps ran are ``schedule.kinds(len(logs))``.
    """
    logs = []
    for index in range(steps):
        audit = audit_every is not None and (index + 1) % audit_every == 0
        kind = schedule.pick(index)
        if observe is not None:
            observe(kind, schedule.steps[kind], ctx, state, index)
        if timer is not None and kind in schedule.timed:
            with guard():
                state, log = schedule.timed[kind](ctx, state, audit, timer)
        else:
            step = schedule.compiled.get(kind, schedule.steps[kind])
            started = timer.now() if timer is not None else None
            with _guarded(step, ctx, audit, guard):
                state, log = step(ctx, state, audit)
            if timer is not None:
                timer.add(f"{kind}_step", started, timer.now())
        logs.append(log)
        if done is not None and (index + 1) % sync_every == 0 and bool(done(state).all()):
            break
    if observe is not None:
        observe(None, None, ctx, state, len(logs))
    return state, logs


def run_steps(step: Step, compiled_step: Step, ctx, state, steps: int, *, timed: Callable | None = None, **kwargs):
    """:func:`run_schedule` of a decoder with one step kind: ``step`` eager, ``compiled_step`` as the decoder
    compiled it (``step`` itself when eager), ``timed`` its phase-timed form."""
    schedule = Schedule({"step": step}, {"step": compiled_step}, timed={} if timed is None else {"step": timed})
    return run_schedule(schedule, ctx, state, steps, **kwargs)


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
