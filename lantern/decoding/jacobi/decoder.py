"""Speculative Jacobi decoding (SJD, optionally with SJD++-style draft reuse or MC-SJD's coupled redraws)
and grouped speculative decoding (GSD): training-free peers of LANTERN, each step one target forward over
a window of drafts.

Each step is :func:`~lantern.decoding.jacobi.step.jacobi_step`, a pure static-shape function (compiled
as ``compile`` says), run by :func:`lantern.decoding.loop.run_steps`; this file prefills and
summarises, as :class:`~lantern.decoding.tree.decoder.SpeculativeDecoder` does. Records use the same per-sample
tensors (``steps``, ``tokens``, ``histogram`` (B, W+1), realised TV...), so ``mean_accepted_length``
is tokens per target forward after the first token. Paper-vs-code choices: docs/jacobi.md.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import ClassVar

import torch

from lantern import checks
from lantern.decoding.api import DecodeResult, DecoderSettings, register
from lantern.decoding.batch import column_validity, guided_inputs, prefill_condition
from lantern.decoding.compile import check_compile, compiled, mark_static
from lantern.decoding.jacobi.grouping import Grouping
from lantern.decoding.jacobi.step import COUPLINGS, INITS, JacobiContext, JacobiState, initial_tokens, jacobi_step
from lantern.decoding.loop import default_sync_every, run_steps, summarise
from lantern.models.condition import Condition
from lantern.models.sampling import SamplingConfig, guided_logits, next_token
from lantern.models.target import Target


@register
@dataclass(frozen=True)
class JacobiSettings(DecoderSettings):
    """A window of drafts verified per target forward; ``grouping`` (GSD's knobs) when the test is grouped."""

    kind: ClassVar[str] = "jacobi"
    window: int = 16
    init: str = "random"
    reuse: float | None = None
    candidates: str = "sampled"
    grouping: dict | None = None
    coupling: str = "none"  # older records have none: they are plain SJD

    def method(self) -> str:
        text = f"{self.label} W={self.window} {self.init}" + (f" reuse={self.reuse}" if self.reuse else "")
        if self.coupling != "none":
            text += f" coupling={self.coupling}"
        if self.grouping:
            g = self.grouping
            text += f" r={g['gsd_radius']} p={g['gsd_p_thr']} d={g['gsd_d_thr']}"
        return text + (" (greedy)" if self.candidates == "greedy" else "")

    def order(self) -> tuple:
        return (
            2,
            self.grouping is not None,
            self.name,
            COUPLINGS.index(self.coupling) if self.coupling in COUPLINGS else len(COUPLINGS),
            self.window,
            self.init,
            self.reuse or 0,
            self.candidates,
        )

    def record(self) -> dict:
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
        }
        return {**super().record(), **flat, **(self.grouping or {})}


class JacobiDecoder:
    """SJD over a window of ``window`` drafts; ``grouping`` (a :class:`Grouping`) makes it GSD.

    ``init``: how fresh window slots start (``random``, ``horizon``, ``vertical``; see
    :data:`lantern.decoding.jacobi.step.INITS`). ``reuse`` (None or a number in (0, 1]): keep an untested
    draft when its law's top mass is at least this, instead of redrawing it (SJD++'s token reuse, in a
    form that stays lossless). ``coupling`` (see :data:`lantern.decoding.jacobi.step.COUPLINGS`): how the
    untested positions are redrawn; ``mc`` and ``gumbel`` are MC-SJD's maximal and Gumbel couplings,
    ``none`` SJD's independent redraw. ``tv_audit_every``: GSD computes the realised TV of every position's law
    (a vocabulary-wide pass) on every N-th step.
    """

    def __init__(
        self,
        sampling: SamplingConfig,
        window: int = 16,
        init: str = "random",
        reuse: float | None = None,
        grouping: Grouping | None = None,
        coupling: str = "none",
        name: str = "sjd",
        label: str | None = None,
        compile: str = "none",
        backend: str = "inductor",
        sync_every: int | None = None,
        tv_audit_every: int = 1,
        guard=None,
        redraft=None,
    ):
        self.sampling = sampling
        self.redraft = redraft  # a rule that may keep old drafts (SJD++: lantern.decoding.jacobi.sjd_pp)
        self.window = checks.integer("window", window, 1, note="draft tokens verified per target forward")
        self.init = checks.choice("init", init, INITS, note="how fresh window slots start")
        self.reuse = checks.optional(
            checks.probability, "reuse", reuse, zero=False, note="top draft mass to keep a draft; null = off"
        )
        self.coupling = checks.choice("coupling", coupling, COUPLINGS, note="how untested drafts are redrawn")
        self.tv_audit_every = checks.integer("tv_audit_every", tv_audit_every, 1)
        self.grouping = grouping
        self.name, self.label = name, label or name.upper()
        self.compile = check_compile(compile)
        self.backend = backend
        self.sync_every = sync_every
        self.guard = guard or contextlib.nullcontext
        self._step = compiled(jacobi_step, compile, backend)
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
            reuse=self.reuse,
            coupling=self.coupling,
            candidates="greedy" if self.sampling.greedy else "sampled",
            grouping=None if self.grouping is None else self.grouping.describe(),
        )

    def _context(self, model: Target, rows: int, batch: int, capacity: int, device) -> JacobiContext:
        shape = (model.config, rows, batch, capacity, model.input_embeddings().dtype, device)
        if shape not in self._contexts:
            cache = model.new_cache(rows, capacity)
            if self.compile != "none":
                mark_static(*cache.tensors())
            close = self.grouping.close_table(model.input_embeddings()) if self.grouping is not None else None
            self._contexts[shape] = JacobiContext(
                model=model,
                cache=cache,
                sampling=self.sampling,
                window=self.window,
                init=self.init,
                num_tokens=model.config.num_image_tokens,
                groups=rows // batch,
                grouping=self.grouping,
                close=close,
                reuse=self.reuse,
                coupling=self.coupling,
                redraft=self.redraft,
            )
        return self._contexts[shape]

    @torch.inference_mode()
    def generate(self, model: Target, condition: Condition, keys: torch.Tensor) -> DecodeResult:
        """Decode all image tokens for ``condition`` (B prompts) with per-sample RNG ``keys`` (B,)."""
        cfg, sampling, width = model.config, self.sampling, self.window
        self.check_model(cfg)
        cond_len, num_tokens, vocab = cfg.cls_token_num, cfg.num_image_tokens, cfg.vocab_size
        cond_emb, cond_mask = guided_inputs(model, condition, sampling)
        rows, batch = cond_emb.shape[0], len(condition)
        device = cond_emb.device
        self.check_device(device)
        # Rows may run W+1 tokens past the image before the loop notices; the window needs W+1 slots.
        capacity = cond_len + num_tokens + 2 * width + 2
        ctx = self._context(model, rows, batch, capacity, device)

        hidden = prefill_condition(model, cond_emb, cond_mask, ctx.cache, capacity)  # (rows, T, D)
        codes = torch.zeros(batch, num_tokens + 2 * width + 2, dtype=torch.long, device=device)
        codes[:, 0] = next_token(guided_logits(model.head(hidden[:, -1]), sampling, 0), sampling, keys, 0)
        # The first window: initialised tokens (point-mass laws) for tokens 1..W. Step 0 of the init
        # stream is never reused: every step's ``decided`` is >= 1.
        decided = torch.ones(batch, dtype=torch.long, device=device)
        window = initial_tokens(ctx, keys, torch.zeros_like(decided), width)
        if (
            self.init != "random"
        ):  # repeat inits start from token 0 (row 0: horizon copies it, vertical has no row above)
            if self.init == "horizon":
                column = torch.arange(1, width + 1, device=device) % cfg.grid_size
                window = torch.where(column == 0, window, codes[:, :1])
        draft_q = torch.zeros(batch, width, vocab, device=device).scatter(2, window[:, :, None], 1.0)
        state = JacobiState(
            codes=codes,
            decided=decided,
            length=torch.full((batch,), cond_len, dtype=torch.long, device=device),
            window=window,
            draft_q=draft_q,
            keys=keys,
            target_valid=column_validity(cond_mask, capacity),
            draft_law=None if self.redraft is None else draft_q.clone(),  # initial drafts follow their laws
        )

        state, logs = run_steps(  # every step decides at least one token per active row
            jacobi_step,
            self._step,
            ctx,
            state,
            num_tokens - 1,
            audit_every=self.tv_audit_every,
            done=lambda s: s.decided >= num_tokens,
            sync_every=default_sync_every(device, self.sync_every),
            guard=self.guard,
        )
        steps_run = len(logs)
        per_sample = summarise(logs, num_tokens, width)
        if self.grouping is None:
            # Exact rules: every emitted token's law is the target's (TV 0, measured by construction).
            per_sample["merged_sum"].zero_()
            per_sample["merged_max"].zero_()
        stats = {"target_forwards": float(1 + steps_run), "steps": float(1 + steps_run)}
        return DecodeResult(state.codes[:, :num_tokens], stats, per_sample)


def sjd(
    sampling: SamplingConfig,
    window: int = 16,
    init: str = "random",
    reuse: float | None = None,
    coupling: str = "none",
    **kwargs,
) -> JacobiDecoder:
    """Speculative Jacobi decoding (``reuse`` set: with SJD++-style draft reuse; ``coupling`` mc or
    gumbel: MC-SJD)."""
    return JacobiDecoder(
        sampling, window=window, init=init, reuse=reuse, coupling=coupling, name=kwargs.pop("name", "sjd"), **kwargs
    )


def gsd(
    sampling: SamplingConfig,
    window: int = 16,
    init: str = "random",
    radius: int = 7,
    p_thr: float = 0.15,
    d_thr: float | None = 0.5,
    **kwargs,
) -> JacobiDecoder:
    """Grouped speculative decoding: SJD whose test reads the mass of the draft's dynamic group."""
    return JacobiDecoder(
        sampling,
        window=window,
        init=init,
        grouping=Grouping(radius, p_thr, d_thr),
        name=kwargs.pop("name", "gsd"),
        **kwargs,
    )
