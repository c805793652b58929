"""Speculative decoding: a drafter proposes a tree, the target verifies it in one forward.

Any drafter, draft structure and acceptance rule combine here. Per row (image) the decoder keeps
``n`` decided tokens and ``L = T + n - 1`` valid cache slots in both the target's and the drafter's
static caches; the last decided token is pending (not yet in the target cache) and is the root of
the next draft. Each step is :func:`~lantern.decoding.tree.step.speculative_step`, a pure function of
device tensors (compiled as ``compile`` says). This file only prefills, loops and summarises.

Rows accept different numbers of tokens; every index is per row. Finished rows run along without
advancing until the whole batch is done; the loop reads "all rows finished?" from the device every
``sync_every`` steps (every step on the CPU, where reading is free).
"""

from __future__ import annotations

import contextlib
import time

import torch

from lantern.decoding.api import DecodeResult
from lantern.decoding.batch import column_validity, guided_inputs, prefill_condition
from lantern.decoding.compile import check_compile, compiled, mark_static
from lantern.decoding.tree.session import drafter_prefill
from lantern.decoding.tree.step import (
    SpecState,
    StepContext,
    StepLog,
    advance_phase,
    draft_phase,
    speculative_step,
    verify_phase,
    walk_phase,
)
from lantern.models.condition import Condition
from lantern.models.drafter import Drafter
from lantern.models.llamagen.gpt import Transformer
from lantern.models.sampling import SamplingConfig, guided_logits, next_token
from lantern.rules.exact import AcceptanceRule


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


def timed_step(ctx: StepContext, state: SpecState, audit: bool, timer: PhaseTimer) -> tuple[SpecState, StepLog]:
    """:func:`speculative_step` with a time mark between phases (eager only)."""
    t0 = timer.now()
    draft, root = draft_phase(ctx, state)
    t1 = timer.now()
    p, hidden = verify_phase(ctx, state, draft)
    t2 = timer.now()
    walk = walk_phase(ctx, state, draft, p, audit)
    t3 = timer.now()
    result = advance_phase(ctx, state, draft, root, walk, hidden)
    t4 = timer.now()
    for phase, start, stop in (("drafter", t0, t1), ("target", t1, t2), ("walk", t2, t3), ("advance", t3, t4)):
        timer.add(phase, start, stop)
    return result


class SpeculativeDecoder:
    """Draft with ``drafter`` in the shape of ``draft``, verify with ``acceptance``.

    The rule is specialised to the candidates the structure produces: greedy decoding (temperature 0)
    drafts the drafter's top-ranked children whatever ``draft.candidates`` says (sampled drafts
    degenerate to them) and uses the rule's greedy form, recorded as ``candidates: greedy``; sampling
    uses the structure's ``candidates`` (deterministic top-k children, or children sampled without
    replacement). ``name`` labels the records (eagle, lantern...). ``compile``: see
    :mod:`lantern.decoding.compile`; eager runs also time each phase.
    """

    def __init__(
        self,
        sampling: SamplingConfig,
        drafter: Drafter,
        draft,
        acceptance: AcceptanceRule,
        name: str = "speculative",
        compile: str = "none",
        backend: str = "inductor",
        sync_every: int | None = None,
        guard=None,
    ):
        self.sampling = sampling
        self.drafter = drafter
        self.draft = draft
        self.mode = "greedy" if sampling.greedy else draft.candidates
        self.rule = acceptance.for_candidates(self.mode)
        self.rule.check_draft(draft)
        self.name = name
        self.compile = check_compile(compile)
        self.backend = backend
        self.sync_every = sync_every
        self.guard = guard or contextlib.nullcontext  # entered around every step (e.g. a CUDA sync check)
        self._step = compiled(speculative_step, compile, backend)
        self._contexts: dict[tuple, StepContext] = {}

    def check_device(self, device: torch.device | str) -> None:
        """ConfigError unless this decoder's compile mode runs on ``device`` (checked before any work)."""
        check_compile(self.compile, device, self.backend)

    def describe(self) -> dict:
        """Decoder settings recorded with results (``candidates`` as decoded: greedy at temperature 0)."""
        return {**self.draft.describe(), **self.rule.describe(), "candidates": self.mode, "compile": self.compile}

    def _context(self, model: Transformer, rows: int, batch: int, capacity: int, device) -> StepContext:
        """The step context of this batch shape: caches allocated once, at fixed addresses."""
        shape = (model.config, rows, batch, capacity, model.tok_embeddings.weight.dtype, device)
        if shape not in self._contexts:
            target_cache, drafter_cache = model.new_cache(rows, capacity), self.drafter.new_cache(rows, capacity)
            if self.compile != "none":
                mark_static(target_cache.k, target_cache.v, drafter_cache.k, drafter_cache.v)
            self._contexts[shape] = StepContext(
                model=model,
                drafter=self.drafter,
                target_cache=target_cache,
                drafter_cache=drafter_cache,
                sampling=self.sampling,
                draft=self.draft,
                rule=self.rule,
                mode=self.mode,
                num_tokens=model.config.num_image_tokens,
                groups=rows // batch,
            )
        return self._contexts[shape]

    @torch.inference_mode()
    def generate(self, model: Transformer, condition: Condition, keys: torch.Tensor) -> DecodeResult:
        """Decode all image tokens for ``condition`` (B prompts) with per-sample RNG ``keys`` (B,)."""
        cfg, sampling, drafter = model.config, self.sampling, self.drafter
        drafter.check_target(cfg)
        cond_len, num_tokens = cfg.cls_token_num, cfg.num_image_tokens
        depth = self.draft.depth
        cond_emb, cond_mask = guided_inputs(model, condition, sampling)
        rows, batch = cond_emb.shape[0], len(condition)
        device = cond_emb.device
        self.check_device(device)
        capacity = cond_len + num_tokens + depth + self.draft.nodes + 2
        ctx = self._context(model, rows, batch, capacity, device)
        timer = PhaseTimer(device) if self.compile == "none" else None
        started = time.perf_counter() if timer else None

        # Prefill (eager, once per batch): the condition into both caches, then image token 0.
        hidden = prefill_condition(model, cond_emb, cond_mask, ctx.target_cache, capacity)  # (rows, T, D)
        codes = torch.zeros(batch, num_tokens + 2 * depth + 2, dtype=torch.long, device=device)
        codes[:, 0] = next_token(guided_logits(model.head(hidden[:, -1]), sampling, 0), sampling, keys, 0)
        drafter_valid = column_validity(cond_mask[:, 1:], capacity)
        root_feature = drafter_prefill(
            model, drafter, ctx.drafter_cache, cond_emb, hidden, codes[:, 0], cond_mask, capacity
        )
        state = SpecState(
            codes=codes,
            decided=torch.ones(batch, dtype=torch.long, device=device),
            length=torch.full((batch,), cond_len, dtype=torch.long, device=device),
            root_feature=root_feature,
            keys=keys,
            target_valid=column_validity(cond_mask, capacity),
            drafter_valid=drafter_valid,
        )
        if timer:
            timer.add("prefill", started, time.perf_counter())

        sync_every = self.sync_every or (8 if device.type == "cuda" else 1)
        logs: list[StepLog] = []
        for step_index in range(num_tokens - 1):  # every step decides at least one token per active row
            # Audit steps N-1, 2N-1, ...: never the first step, which runs eagerly in a context's first
            # call, so every graph a later call uses is compiled in the first one.
            audit = (step_index + 1) % self.rule.tv_audit_every == 0
            if not (timer or ctx.warm):
                # The first step of a batch shape runs eagerly and unguarded: it fills the pieces' lazy
                # per-device tables (tree index tensors, neighbour columns), which a graph must find ready.
                state, log = speculative_step(ctx, state, audit)
                ctx.warm = True
            else:
                with self.guard():
                    state, log = timed_step(ctx, state, audit, timer) if timer else self._step(ctx, state, audit)
            logs.append(log)
            if (step_index + 1) % sync_every == 0 and bool((state.decided >= num_tokens).all()):
                break
        steps_run = len(logs)
        stats = {
            "target_forwards": float(1 + steps_run),
            "drafter_forwards": float(1 + steps_run * (self.draft.expansions + 1)),
        }
        if timer:
            stats.update({f"{phase}_time_s": seconds for phase, seconds in timer.totals().items()})
        per_sample = summarise(logs, num_tokens, depth)
        return DecodeResult(state.codes[:, :num_tokens], stats, per_sample)


def summarise(logs: list[StepLog], num_tokens: int, depth: int) -> dict[str, torch.Tensor]:
    """Per-sample CPU tensors from the step logs: steps, the acceptance histogram, realised TV, merged mass.

    A row's last step may overrun the image; its extra tokens are cut from the codes and not counted.
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
