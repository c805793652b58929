"""Speculative Jacobi decoding (SJD, optionally with lossless draft reuse or MC-SJD's coupled redraws)
and grouped speculative decoding (GSD): training-free peers of LANTERN, each step one target forward over
a window of drafts.

A :class:`JacobiDecoder` is a window, an initialisation, a window test (:mod:`lantern.rules`) and a redraw
(:mod:`lantern.decoding.jacobi.redraw`). Each step is :func:`~lantern.decoding.jacobi.step.jacobi_step`, a
pure static-shape function (compiled as ``compile`` says), run by :func:`lantern.decoding.loop.run_steps`;
this file prefills and summarises, as :class:`~lantern.decoding.tree.decoder.SpeculativeDecoder` does.
Records use the same per-sample tensors (``steps``, ``tokens``, ``histogram`` (B, W+1), realised TV...), so
``mean_accepted_length`` is tokens per target forward after the first token. Paper-vs-code choices: docs/jacobi.md.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import ClassVar

import torch

from lantern import checks, rng
from lantern.decoding.api import DecodeResult, DecoderSettings, register
from lantern.decoding.audit import RerunPlan, chained_emission
from lantern.decoding.batch import ModelInputs, prefill
from lantern.decoding.compile import check_compile, compiled, mark_static
from lantern.decoding.jacobi.redraw import KeepConfident, Redraw, checked_redraw
from lantern.decoding.jacobi.state import INITS, JacobiContext, JacobiState
from lantern.decoding.jacobi.step import initial_tokens, jacobi_step
from lantern.decoding.loop import default_sync_every, prepare, run_steps
from lantern.decoding.stats import summarise
from lantern.models.condition import Condition
from lantern.models.sampling import SamplingConfig, draw
from lantern.models.target import Target
from lantern.rules.exact import ExactWindowTest
from lantern.rules.grouped import GroupedTest
from lantern.rules.window import checked as checked_scheme

# The couplings' order in tables (records name a redraw by its ``coupling``; older records have none).
COUPLING_ORDER = ("none", "mc", "gumbel")


@register
@dataclass(frozen=True)
class JacobiSettings(DecoderSettings):
    """A window of drafts verified per target forward; ``grouping`` (GSD's knobs) when the test is grouped."""

    kind: ClassVar[str] = "jacobi"
    window: int = 16
    init: str = "random"
    reuse: float | None = None
    candidates: str = "sampled"
    grouping: dict | None = None  # the window test's knobs (GSD's grouping, the entropy-aware rule's strength)
    coupling: str = "none"  # older records have none: they are plain SJD
    acceptance: str | None = None  # the window test's name (its ``acceptance``); older records: from ``grouping``
    window_test: str = "token"  # how the drafts' tests make the accepted prefix (lantern.rules.window); older: token

    def method(self) -> str:
        text = f"{self.label} W={self.window} {self.init}" + (f" reuse={self.reuse}" if self.reuse else "")
        if self.window_test != "token":
            text += f" {self.window_test.upper()}"
        if self.coupling != "none":
            text += f" coupling={self.coupling}"
        g = self.grouping or {}
        if "gsd_radius" in g:
            text += f" r={g['gsd_radius']} p={g['gsd_p_thr']} d={g['gsd_d_thr']}"
        else:
            text += "".join(f" {key}={value}" for key, value in g.items())
        return text + (" (greedy)" if self.candidates == "greedy" else "")

    def order(self) -> tuple:
        return (
            2,
            self.grouping is not None,
            self.name,
            COUPLING_ORDER.index(self.coupling) if self.coupling in COUPLING_ORDER else len(COUPLING_ORDER),
            self.window,
            self.init,
            self.reuse or 0,
            self.candidates,
            self.window_test,
        )

    def record(self) -> dict:
        acceptance = self.acceptance
        if acceptance is None:  # a record written before the field: its test was SJD's or GSD's
            exact = self.grouping is None
            acceptance = ("greedy" if self.candidates == "greedy" else "exact") if exact else "gsd"
        flat = {
            "acceptance": acceptance,
            "draft": "jacobi",
            "window": self.window,
            "init": self.init,
            "reuse": self.reuse,
            "coupling": self.coupling,
            "candidates": self.candidates,
            "window_test": self.window_test,
        }
        return {**super().record(), **flat, **(self.grouping or {})}


class JacobiDecoder:
    """Jacobi decoding over a window of ``window`` drafts.

    ``init``: how fresh window slots start (``random``, ``horizon``, ``vertical``; see
    :data:`lantern.decoding.jacobi.state.INITS`). ``test``: the window test (default
    :class:`~lantern.rules.exact.ExactWindowTest`, SJD; :class:`~lantern.rules.grouped.GroupedTest` makes it
    GSD). ``window_test``: how the drafts' own tests make the accepted prefix, a scheme of
    :mod:`lantern.rules.window` laid over ``test`` (None: token by token; SJD-SV's ``sv``). ``redraw``: how the
    untested drafts are drawn again (default
    :class:`~lantern.decoding.jacobi.redraw.Independent`, SJD; MC-SJD's couplings, lossless reuse, SJD++'s
    rule: :mod:`lantern.decoding.jacobi.redraw`). ``tv_audit_every``: a lossy test computes the realised TV
    of every position's law (a vocabulary-wide pass) on every N-th step.

    A draft structure other than the chain (SJD-PAC's tree) is a subclass that names its own ``step_function``
    and overrides :meth:`first_window` and :attr:`max_accepted`.
    """

    step_function = staticmethod(jacobi_step)  # (ctx, state, audit) -> (state, log)
    observer = None  # the Monte Carlo TV audit's, while it decodes a batch again (lantern.decoding.audit)

    def __init__(
        self,
        sampling: SamplingConfig,
        *,
        window: int = 16,
        init: str = "random",
        test: ExactWindowTest | None = None,
        window_test=None,
        redraw: Redraw | None = None,
        name: str = "sjd",
        label: str | None = None,
        compile: str = "none",
        backend: str = "inductor",
        sync_every: int | None = None,
        tv_audit_every: int = 1,
        guard=None,
    ):
        self.sampling = sampling
        self.window = checks.integer("window", window, 1, note="draft tokens verified per target forward")
        self.init = checks.choice("init", init, INITS, note="how fresh window slots start")
        if test is not None and not isinstance(test, ExactWindowTest):
            raise checks.refuse("test", test, "a window test (lantern.rules.exact or lantern.rules.grouped)")
        self.test = checked_scheme(window_test).over(ExactWindowTest() if test is None else test)
        self.redraw = checked_redraw(redraw)
        self.tv_audit_every = checks.integer("tv_audit_every", tv_audit_every, 1)
        self.name, self.label = name, label or name.upper()
        self.compile = check_compile(compile)
        self.backend = backend
        self.sync_every = sync_every
        self.guard = guard or contextlib.nullcontext
        self._step = compiled(self.step_function, compile, backend)
        self._contexts: dict[tuple, JacobiContext] = {}

    def check_device(self, device: torch.device | str) -> None:
        """ConfigError unless this decoder's compile mode runs on ``device`` (checked before any work)."""
        check_compile(self.compile, device, self.backend)

    def check_model(self, config) -> None:
        """ConfigError when the window is longer than the image."""
        if self.window > config.num_image_tokens:
            raise checks.refuse(
                "window", self.window, f"an integer in [1, {config.num_image_tokens}]", "the image's tokens"
            )

    @property
    def settings(self) -> JacobiSettings:
        return JacobiSettings(
            name=self.name,
            label=self.label,
            compile=self.compile,
            window=self.window,
            init=self.init,
            reuse=self.redraw.reuse,
            coupling=self.redraw.coupling,
            candidates="greedy" if self.sampling.greedy else "sampled",
            grouping=self.test.describe(),
            acceptance=self.test.acceptance(self.sampling.greedy),
            window_test=getattr(self.test, "scheme", "token"),
        )

    def _context(self, model: Target, rows: int, batch: int, capacity: int, device) -> JacobiContext:
        shape = (model.config, rows, batch, capacity, model.input_embeddings().dtype, device)
        if shape not in self._contexts:
            cache = model.new_cache(rows, capacity)
            if self.compile != "none":
                mark_static(*cache.tensors())
            test = self.test.bound(model)  # this test for the model (GSD: the table of its embeddings)
            prepare(device, test, self.redraw)  # every table a step reads, built before any step
            self._contexts[shape] = JacobiContext(
                model=model,
                cache=cache,
                sampling=self.sampling,
                window=self.window,
                init=self.init,
                num_tokens=model.config.num_image_tokens,
                groups=rows // batch,
                test=test,
                redraw=self.redraw,
            )
        return self._contexts[shape]

    @property
    def tv_audit(self) -> str | None:
        """The realised-TV audit this decoder names when its test says (SJD-SV's: ``mc``, no closed form); None:
        by losslessness (exact, or the test's closed form). Greedy: the test is exact."""
        return None if self.sampling.greedy else self.test.tv_audit

    @property
    def max_accepted(self) -> int:
        """The most drafts one step can accept (the acceptance histogram has this many bins plus one)."""
        return self.window

    @property
    def rerun_plan(self) -> RerunPlan:
        """How the Monte Carlo TV audit reruns a step: the window's drafts drawn again (:meth:`refresh_drafts`)."""
        return RerunPlan(
            caches=("cache",),
            emitted=lambda ctx, before, after: chained_emission(ctx, before, after, self.max_accepted + 1),
            refresh=self.refresh_drafts,
        )

    def refresh_drafts(self, state: JacobiState) -> JacobiState:
        """The window drawn again from the law its drafts follow (``draft_law`` where a redraw tracks it, else the
        recorded ``draft_q``; a point mass keeps its token), with the state's keys (stream ``rng.AUDIT``)."""
        law = state.draft_q if state.draft_law is None else state.draft_law  # (B, W, V)
        return state._replace(window=draw(law, rng.uniform(state.keys, state.decided, rng.AUDIT, law.shape[1])))

    def first_window(self, ctx: JacobiContext, codes: torch.Tensor, keys: torch.Tensor):
        """The first window (B, W) for tokens 1..W and its laws (B, W, V): initialised tokens with point-mass
        laws. Step 0 of the init stream is never reused: every step's ``decided`` is >= 1."""
        width, vocab, device = self.window, ctx.model.config.vocab_size, codes.device
        window = initial_tokens(ctx, keys, torch.zeros(keys.shape[0], dtype=torch.long, device=device), width)
        if self.init == "horizon":  # repeat inits start from token 0 (row 0: vertical has no row above)
            column = torch.arange(1, width + 1, device=device) % ctx.model.config.grid_size
            window = torch.where(column == 0, window, codes[:, :1])
        draft_q = torch.zeros(window.shape[0], width, vocab, device=device).scatter(2, window[:, :, None], 1.0)
        return window, draft_q

    @torch.inference_mode()
    def generate(self, model: Target, condition: Condition, keys: torch.Tensor) -> DecodeResult:
        """Decode all image tokens for ``condition`` (B prompts) with per-sample RNG ``keys`` (B,)."""
        self.check_model(model.config)  # first: a decoder may fit its window to the model (SJD-PAC's default)
        cfg, sampling, width = model.config, self.sampling, self.window
        cond_len, num_tokens = cfg.cls_token_num, cfg.num_image_tokens
        inputs = ModelInputs.of(model, condition, sampling)
        batch, device = inputs.batch, inputs.device
        self.check_device(device)
        # Rows may run W+1 tokens past the image before the loop notices; the window needs W+1 slots.
        capacity = cond_len + num_tokens + 2 * width + 2
        ctx = self._context(model, inputs.rows, batch, capacity, device)
        width_codes = num_tokens + 2 * width + 2  # (B, C) codes, room for the overrun
        codes = prefill(model, inputs, ctx.cache, keys, sampling, width=width_codes, capacity=capacity).codes
        decided = torch.ones(batch, dtype=torch.long, device=device)
        window, draft_q = self.first_window(ctx, codes, keys)
        state = JacobiState(
            codes=codes,
            decided=decided,
            length=torch.full((batch,), cond_len, dtype=torch.long, device=device),
            window=window,
            draft_q=draft_q,
            keys=keys,
            target_valid=inputs.valid(capacity),
            draft_law=self.redraw.initial_law(draft_q),
        )

        state, logs = run_steps(  # every step decides at least one token per active row
            self.step_function,
            self._step,
            ctx,
            state,
            num_tokens - 1,
            audit_every=self.tv_audit_every,
            done=lambda s: s.decided >= num_tokens,
            sync_every=default_sync_every(device, self.sync_every),
            guard=self.guard,
            observe=self.observer,
        )
        steps_run = len(logs)
        per_sample = summarise(logs, num_tokens, self.max_accepted)
        stats = {"target_forwards": float(1 + steps_run), "steps": float(1 + steps_run)}
        return DecodeResult(state.codes[:, :num_tokens], stats, per_sample)


def sjd(
    sampling: SamplingConfig,
    *,
    window: int = 16,
    init: str = "random",
    reuse: float | None = None,
    redraw: Redraw | None = None,
    **kwargs,
) -> JacobiDecoder:
    """Speculative Jacobi decoding: ``redraw`` says how untested drafts are drawn again (default independent;
    MC-SJD: :class:`~lantern.decoding.jacobi.redraw.MaximalCoupling` or ``GumbelCoupling``); ``reuse`` (None
    or a number in (0, 1]) keeps an untested draft whose law's top mass is at least that
    (:class:`~lantern.decoding.jacobi.redraw.KeepConfident` over ``redraw``)."""
    reuse = checks.optional(checks.probability, "reuse", reuse, zero=False, note="top draft mass to keep a draft")
    redraw = checked_redraw(redraw) if reuse is None else KeepConfident(reuse, redraw)
    return JacobiDecoder(sampling, window=window, init=init, redraw=redraw, name=kwargs.pop("name", "sjd"), **kwargs)


def gsd(
    sampling: SamplingConfig,
    *,
    window: int = 16,
    init: str = "random",
    radius: int = 7,
    p_thr: float = 0.15,
    d_thr: float | None = 0.5,
    **kwargs,
) -> JacobiDecoder:
    """Grouped speculative decoding: SJD whose test reads the mass of the draft's dynamic group."""
    test = GroupedTest(radius, p_thr, d_thr)
    return JacobiDecoder(sampling, window=window, init=init, test=test, name=kwargs.pop("name", "gsd"), **kwargs)
