"""Speculative decoding: a drafter proposes a tree, the target verifies it in one forward.

Any drafter, draft structure and acceptance rule combine here. Per row (image) the decoder keeps
``n`` decided tokens and ``L = T + n - 1`` valid cache slots in both the target's and the drafter's
static caches; the last decided token is pending (not yet in the target cache) and is the root of
the next draft. Each step is :func:`~lantern.decoding.tree.step.speculative_step`, a pure function of
device tensors (compiled as ``compile`` says), run by :func:`lantern.decoding.loop.run_steps`. This
file only prefills and summarises.

Rows accept different numbers of tokens; every index is per row. Finished rows run along without
advancing until the whole batch is done; the loop reads "all rows finished?" from the device every
``sync_every`` steps (every step on the CPU, where reading is free).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import ClassVar

import torch

from lantern.decoding.api import DecodeResult, DecoderSettings, register
from lantern.decoding.audit import RerunPlan, chained_emission
from lantern.decoding.batch import ModelInputs, prefill
from lantern.decoding.compile import check_compile, compiled, mark_static
from lantern.decoding.loop import PhaseTimer, default_sync_every, prepare, run_steps
from lantern.decoding.stats import summarise
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
from lantern.models.kv_cache import KVCache
from lantern.models.sampling import SamplingConfig
from lantern.models.target import Target
from lantern.rules.api import RuleSpec
from lantern.rules.exact import ExactTest
from lantern.rules.factory import exact
from lantern.rules.window import checked as checked_scheme


@register
@dataclass(frozen=True)
class TreeSettings(DecoderSettings):
    """A drafter, a draft structure (``draft``: its settings) and a rule (``rule``: its settings)."""

    kind: ClassVar[str] = "tree"
    draft: dict | None = None
    rule: dict | None = None

    def method(self) -> str:
        rule, draft = self.rule or {}, self.draft or {}
        details = [str(draft.get("draft"))]
        if rule.get("candidates") is not None:  # every row names its draft kind: rules compare within one
            details.append(str(rule["candidates"]))
        if rule.get("semantics") not in (None, "bounded"):
            details.append(str(rule["semantics"]))
        return f"{self.label} {rule.get('label', '')} ({', '.join(details)})"

    def draft_kind(self) -> str | None:
        return (self.rule or {}).get("candidates")

    def order(self) -> tuple:
        rule = self.rule or {}
        bound = rule.get("delta") if rule.get("delta") is not None else rule.get("lambda")
        return (
            1,
            rule.get("candidates") or "",  # one block of rows per draft kind, each rule beside its exact baseline
            rule.get("acceptance") not in ("exact", "greedy"),
            self.name,
            rule.get("semantics") or "",
            str((self.draft or {}).get("draft")),
            rule.get("k") or 0,
            bound or 0,
        )

    def columns(self) -> dict:
        return {"delta": (self.rule or {}).get("delta")}

    def record(self) -> dict:
        return {**super().record(), **(self.draft or {}), **(self.rule or {})}


def timed_step(ctx: StepContext, state: SpecState, audit: bool, timer: PhaseTimer) -> tuple[SpecState, StepLog]:
    """:func:`speculative_step` with a time mark between phases (eager only)."""
    t0 = timer.now()
    draft, root = draft_phase(ctx, state)
    t1 = timer.now()
    p, features = verify_phase(ctx, state, draft)
    t2 = timer.now()
    walk = walk_phase(ctx, state, draft, p, audit)
    t3 = timer.now()
    result = advance_phase(ctx, state, draft, root, walk, features)
    t4 = timer.now()
    for phase, start, stop in (("drafter", t0, t1), ("target", t1, t2), ("walk", t2, t3), ("advance", t3, t4)):
        timer.add(phase, start, stop)
    return result


class SpeculativeDecoder:
    """Draft with ``drafter`` in the shape of ``draft``, verify with the rule ``acceptance`` builds.

    The rule is the one for the candidates the structure produces: greedy decoding (temperature 0)
    drafts the drafter's top-ranked children whatever ``draft.candidates`` says (sampled drafts
    degenerate to them) and uses the rule's greedy form, recorded as ``candidates: greedy``; sampling
    uses the structure's ``candidates`` (deterministic top-k children, or children sampled without
    replacement). ``window_test``: a scheme of :mod:`lantern.rules.window` laid over the rule (None: token by
    token; SJD-SV's ``sv`` walks a chain with :mod:`lantern.rules.window_chain`). ``name`` and ``label`` name the
    records and table rows (eagle / EAGLE, lantern / LANTERN...).
    ``compile``: see :mod:`lantern.decoding.compile`; eager runs also time each phase.
    """

    def __init__(
        self,
        sampling: SamplingConfig,
        *,
        drafter: Drafter,
        draft,
        acceptance: RuleSpec | ExactTest | None = None,
        window_test=None,
        name: str = "speculative",
        label: str | None = None,
        compile: str = "none",
        backend: str = "inductor",
        sync_every: int | None = None,
        guard=None,
    ):
        self.sampling = sampling
        self.drafter = drafter
        self.draft = draft
        self.mode = "greedy" if sampling.greedy else draft.candidates
        # An exact test alone (ExactSampled(), ...) is exact decoding with that test for its kind.
        self.spec = exact(acceptance) if acceptance is None or isinstance(acceptance, ExactTest) else acceptance
        self.spec = checked_scheme(window_test).spec(self.spec)
        self.rule = self.spec.build(self.mode, draft)
        self.name, self.label = name, label or name.upper()
        self.compile = check_compile(compile)
        self.backend = backend
        self.sync_every = sync_every
        self.guard = guard or contextlib.nullcontext  # entered around every step (e.g. a CUDA sync check)
        self._step = compiled(speculative_step, compile, backend)
        self._contexts: dict[tuple, StepContext] = {}
        self.observer = None  # the Monte Carlo TV audit's, while it decodes a batch again (lantern.decoding.audit)

    @property
    def rerun_plan(self) -> RerunPlan:
        """How the Monte Carlo TV audit reruns a step: drafting is part of the step, so nothing is drawn again."""
        width = self.draft.depth + 1
        return RerunPlan(
            caches=("target_cache", "drafter_cache"),
            emitted=lambda ctx, before, after: chained_emission(ctx, before, after, width),
        )

    @property
    def tv_audit(self) -> str | None:
        """The realised-TV audit this decoder names when its rule says (SJD-SV's chain walk: ``mc``); None: by
        losslessness (exact, or the rule's closed form)."""
        return getattr(self.rule, "tv_audit", None)

    @property
    def settings(self) -> TreeSettings:
        """The settings records keep (``candidates`` as decoded: greedy at temperature 0)."""
        rule = self.spec.settings(self.mode)
        return TreeSettings(
            name=self.name,
            label=self.label,
            compile=self.compile,
            draft={**self.draft.describe(), "candidates": self.mode},
            rule=rule.record() | {"label": rule.label},
        )

    def check_device(self, device: torch.device | str) -> None:
        """ConfigError unless this decoder's compile mode runs on ``device`` (checked before any work)."""
        check_compile(self.compile, device, self.backend)

    def _context(self, model: Target, rows: int, batch: int, capacity: int, device) -> StepContext:
        """The step context of this batch shape: caches allocated once, at fixed addresses."""
        shape = (model.config, rows, batch, capacity, model.input_embeddings().dtype, device)
        if shape not in self._contexts:
            target_cache, drafter_cache = model.new_cache(rows, capacity), self.drafter.new_cache(rows, capacity)
            if self.compile != "none":
                mark_static(*target_cache.tensors(), *drafter_cache.tensors())
            elif isinstance(target_cache, KVCache):  # eager: each step's move of the accepted path is one copy
                target_cache = target_cache.stacked()
            prepare(device, self.draft, self.rule)  # the draft's and the rule's tables, before any step
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

    def capacity(self, config) -> int:
        """Cache slots per row: condition, image, a last step's overrun and one draft's scratch slots."""
        return config.cls_token_num + config.num_image_tokens + self.draft.depth + self.draft.nodes + 2

    @torch.inference_mode()
    def generate(self, model: Target, condition: Condition, keys: torch.Tensor) -> DecodeResult:
        """Decode all image tokens for ``condition`` (B prompts) with per-sample RNG ``keys`` (B,)."""
        ctx, state, timer, _ = self.prefill(model, condition, keys)
        num_tokens, depth = model.config.num_image_tokens, self.draft.depth
        state, logs = run_steps(  # every step decides at least one token per active row
            speculative_step,
            self._step,
            ctx,
            state,
            num_tokens - 1,
            audit_every=self.spec.tv_audit_every,
            done=lambda s: s.decided >= num_tokens,
            sync_every=default_sync_every(state.codes.device, self.sync_every),
            guard=self.guard,
            timed=timed_step,
            timer=timer,
            observe=self.observer,
        )
        stats = {
            "target_forwards": float(1 + len(logs)),
            "drafter_forwards": float(1 + len(logs) * (self.draft.expansions + 1)),
        }
        if timer:
            stats.update({f"{phase}_time_s": seconds for phase, seconds in timer.totals().items()})
        return DecodeResult(state.codes[:, :num_tokens], stats, summarise(logs, num_tokens, depth))

    def prefill(self, model: Target, condition: Condition, keys: torch.Tensor):
        """The step context, the first state, the phase timer (eager only, else None; the prefill's time is
        in it) and the target's feature before token 0 (rows, F) (what the drafter read with it)."""
        cfg, sampling, drafter = model.config, self.sampling, self.drafter
        drafter.check_target(cfg)
        cond_len, num_tokens = cfg.cls_token_num, cfg.num_image_tokens
        inputs = ModelInputs.of(model, condition, sampling)
        device, batch = inputs.device, inputs.batch
        self.check_device(device)
        capacity = self.capacity(cfg)
        ctx = self._context(model, inputs.rows, batch, capacity, device)
        timer = PhaseTimer(device) if self.compile == "none" else None
        started = time.perf_counter() if timer else None

        # Prefill (eager, once per batch): the condition into both caches, then image token 0. Token 0 comes
        # from the final-norm state; the drafter reads the target's features (the same state, or its taps).
        width = num_tokens + 2 * self.draft.depth + 2
        codes, _, features = prefill(
            model, inputs, ctx.target_cache, keys, sampling, width=width, capacity=capacity, taps=drafter.config.taps
        )
        root_feature = drafter_prefill(
            model, drafter, ctx.drafter_cache, inputs.cond_emb, features, codes[:, 0], inputs.cond_mask, capacity
        )
        state = SpecState(
            codes=codes,
            decided=torch.ones(batch, dtype=torch.long, device=device),
            length=torch.full((batch,), cond_len, dtype=torch.long, device=device),
            root_feature=root_feature,
            keys=keys,
            target_valid=inputs.valid(capacity),
            drafter_valid=inputs.valid(capacity, skip=1),
        )
        if timer:
            timer.add("prefill", started, time.perf_counter())
        return ctx, state, timer, features[:, -1]
