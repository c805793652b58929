"""PJD, Parallel Jacobi Decoding (Liao et al., CVPR 2026, arXiv 2606.05703; code boyaliao/PJD): training-free
2-D Jacobi decoding, a Jacobi window on every grid row under way, one target forward for all of them.

Each step is :func:`~lantern.decoding.pjd.step.pjd_step`, a pure static-shape function (compiled as ``compile``
says), run by :func:`lantern.decoding.loop.run_steps`; this file prefills and summarises. Records: ``steps``
(target forwards after the prefill) and ``tokens`` (N - 1), so ``mean_accepted_length`` is tokens per target
forward as for every decoder. PJD is lossy (rows below the top one are tested on laws that see the rows above
only as far as they are committed): ``lossless`` false, no closed-form realised TV: the Monte Carlo audit measures it
(:attr:`PJDDecoder.rerun_plan`: each row's run a chain of its own). Choices: docs/pjd.md.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import ClassVar

import torch

from lantern import checks, rng
from lantern.decoding.api import DecodeResult, DecoderSettings, register
from lantern.decoding.audit import Emission, RerunPlan
from lantern.decoding.batch import ModelInputs, prefill
from lantern.decoding.compile import check_compile, compiled, mark_static
from lantern.decoding.loop import default_sync_every, prepare, run_steps
from lantern.decoding.pjd.step import PJDContext, PJDState, pjd_step
from lantern.decoding.stats import DecodeStats
from lantern.models.condition import Condition
from lantern.models.sampling import SamplingConfig, draw
from lantern.models.target import Target
from lantern.rules.exact import ExactWindowTest
from lantern.rules.window import checked as checked_scheme

MAX = 16384  # the largest grid width / lane count a knob may name (checked against the model later)
PAPER_ROWS_AHEAD = 6  # the paper's LlamaGen-XL setting (c = 6; its Lumina-mGPT one is c = 11)


@register
@dataclass(frozen=True)
class PJDSettings(DecoderSettings):
    """2-D Jacobi: ``window`` drafts per row, a row starts once the row above has ``rows_ahead`` tokens."""

    kind: ClassVar[str] = "pjd"
    window: int = 7
    rows_ahead: int | None = None  # None: the model's default, not yet resolved
    lanes: int | None = None  # rows served per forward (None: not yet resolved)
    keep: float | None = 0.5
    window_test: str = "token"
    candidates: str = "sampled"

    def method(self) -> str:
        text = f"{self.label}-{self.rows_ahead} W={self.window}" if self.rows_ahead else f"{self.label} W={self.window}"
        text += f" keep={self.keep}" if self.keep is not None else " keep=off"
        text += f" {self.window_test.upper()}" if self.window_test != "token" else ""
        return text + (" (greedy)" if self.candidates == "greedy" else "")

    def order(self) -> tuple:
        return (3, self.name, self.rows_ahead or 0, self.window, self.keep or 0, self.window_test, self.candidates)

    def record(self) -> dict:
        flat = {
            "acceptance": "pjd",
            "draft": "jacobi_2d",
            "window": self.window,
            "rows_ahead": self.rows_ahead,
            "pjd_lanes": self.lanes,
            "pjd_keep": self.keep,
            "window_test": self.window_test,
            "candidates": self.candidates,
        }
        return {**super().record(), **flat}


def default_rows_ahead(width: int) -> int:
    """``rows_ahead: null`` on a grid ``width`` tokens wide: the paper's LlamaGen-XL ``c = 6`` where rows are at
    least 12 wide, else half the row (at least 1), so a default run always has rows under way together."""
    return PAPER_ROWS_AHEAD if width >= 2 * PAPER_ROWS_AHEAD else max(1, width // 2)


class PJDDecoder:
    """PJD with ``window`` drafts per row (the release feeds 8 tokens a row, its pending one included: 7),
    ``rows_ahead`` (the paper's ``c``; None: :func:`default_rows_ahead`; the grid width is row-by-row SJD),
    ``keep`` (the release's reuse of drafts whose ratio exceeds 0.5 after a rejection; None: off), ``lanes``
    (rows served per forward; None: every row that can be under way, ``min(R, S - rows_ahead + 1)``, so no row
    ever waits for a lane) and ``window_test`` (a :mod:`lantern.rules.window` scheme over SJD's test)."""

    def __init__(
        self,
        sampling: SamplingConfig,
        *,
        window: int = 7,
        rows_ahead: int | None = None,
        keep: float | None = 0.5,
        lanes: int | None = None,
        window_test=None,
        name: str = "pjd",
        label: str | None = None,
        compile: str = "none",
        backend: str = "inductor",
        sync_every: int | None = None,
        guard=None,
    ):
        self.sampling = sampling
        self.window = checks.capped("window", window, 1, MAX, note="draft tokens per row per target forward")
        note = "tokens of the row above committed before a row starts"
        self.rows_ahead = checks.optional(checks.capped, "rows_ahead", rows_ahead, 1, MAX, note=note)
        self.keep = checks.optional(checks.probability, "pjd_keep", keep, note="ratio above which a draft is kept")
        self.lanes = checks.optional(checks.capped, "pjd_lanes", lanes, 1, MAX, note="rows served per forward")
        self.test = checked_scheme(window_test).over(ExactWindowTest())
        self.name, self.label = name, label or "PJD"
        self.compile = check_compile(compile)
        self.backend = backend
        self.sync_every = sync_every
        self.guard = guard or contextlib.nullcontext
        self._resolved: tuple[int | None, int | None] = (self.rows_ahead, self.lanes)
        self._step = compiled(pjd_step, compile, backend)
        self._contexts: dict[tuple, PJDContext] = {}
        self.observer = None  # the Monte Carlo TV audit's, while it decodes a batch again (lantern.decoding.audit)

    tv_audit = "mc"  # a token's law is the target's under a partial context: no forward of the run gives the TV

    @property
    def rerun_plan(self) -> RerunPlan:
        """How the Monte Carlo TV audit reruns a step: the rows' drafts drawn again from their laws; each row's run
        of up to ``W + 1`` tokens is a chain (each read by the next), the rows independent given the state."""
        return RerunPlan(
            caches=("cache",),
            emitted=pjd_emission,
            refresh=lambda state: redraw_drafts(state, rng.AUDIT),
            chain=self.window + 1,
        )

    def check_device(self, device: torch.device | str) -> None:
        """ConfigError unless this decoder's compile mode runs on ``device`` (checked before any work)."""
        check_compile(self.compile, device, self.backend)

    def check_model(self, config) -> tuple[int, int]:
        """``(rows_ahead, lanes)`` on ``config``'s grid; ConfigError when ``rows_ahead`` is wider than a row or
        the image is not whole rows."""
        side = config.grid_size
        if config.num_image_tokens % side:
            raise checks.refuse("model", config.num_image_tokens, f"a multiple of the grid width {side}")
        ahead = default_rows_ahead(side) if self.rows_ahead is None else self.rows_ahead
        if ahead > side:
            raise checks.refuse("rows_ahead", ahead, f"an integer in [1, {side}]", f"tokens per grid row: {side}")
        bound = min(config.num_image_tokens // side, side - ahead + 1)
        return ahead, bound if self.lanes is None else min(self.lanes, bound)

    @property
    def settings(self) -> PJDSettings:
        ahead, lanes = self._resolved
        return PJDSettings(
            name=self.name,
            label=self.label,
            compile=self.compile,
            window=self.window,
            rows_ahead=ahead,
            lanes=lanes,
            keep=self.keep,
            window_test=self.test.scheme,
            candidates="greedy" if self.sampling.greedy else "sampled",
        )

    def _context(self, model: Target, rows: int, batch: int, capacity: int, device, ahead: int, lanes: int):
        shape = (model.config, rows, batch, capacity, model.input_embeddings().dtype, device, ahead, lanes)
        if shape not in self._contexts:
            cache = model.new_cache(rows, capacity)
            if self.compile != "none":
                mark_static(*cache.tensors())
            test = self.test.bound(model)
            prepare(device, test)
            self._contexts[shape] = PJDContext(
                model=model,
                cache=cache,
                sampling=self.sampling,
                test=test,
                width=self.window,
                rows_ahead=ahead,
                lanes=lanes,
                keep=self.keep,
                groups=rows // batch,
            )
        return self._contexts[shape]

    @torch.inference_mode()
    def start(self, model: Target, condition: Condition, keys: torch.Tensor) -> tuple[PJDContext, PJDState]:
        """The context and the state after the prefill for ``condition`` (B prompts) with RNG ``keys`` (B,): what
        :func:`~lantern.decoding.pjd.step.pjd_step` runs on. A step is pure: rerun from the same state with
        other ``keys`` it draws fresh uniforms (every random number is keyed by ``keys`` and the state's
        counters), which is what a Monte Carlo audit of the law it emits needs."""
        cfg, sampling = model.config, self.sampling
        ahead, lanes = self._resolved = self.check_model(cfg)
        cond_len, num_tokens, side = cfg.cls_token_num, cfg.num_image_tokens, cfg.grid_size
        grid_rows, width, vocab = num_tokens // side, self.window, cfg.vocab_size
        inputs = ModelInputs.of(model, condition, sampling)
        batch, device = inputs.batch, inputs.device
        self.check_device(device)
        capacity = cond_len + num_tokens + lanes * (width + 1) + 1  # scratch: lane inputs, an idle flush slot
        ctx = self._context(model, inputs.rows, batch, capacity, device, ahead, lanes)
        codes = prefill(model, inputs, ctx.cache, keys, sampling, width=num_tokens + 1, capacity=capacity).codes
        done = torch.zeros(batch, grid_rows, dtype=torch.long, device=device)
        done[:, 0] = 1
        u = _uniform_codes(keys, grid_rows + 1, width)  # every row's first drafts: uniform codes, point masses
        drafts = (u * vocab).long().clamp_max(vocab - 1)  # (B, R + 1, W)
        draft_q = torch.zeros(batch, grid_rows + 1, width, vocab, device=device).scatter(3, drafts[..., None], 1.0)
        state = PJDState(
            codes=codes,
            done=done,
            drafts=drafts,
            draft_q=draft_q,
            written=torch.zeros(batch, capacity, dtype=torch.bool, device=device),
            emitted=torch.zeros(batch, num_tokens + 1, dtype=torch.long, device=device),
            step=torch.zeros(batch, dtype=torch.long, device=device),
            keys=keys,
            target_valid=inputs.valid(capacity),
        )
        return ctx, state

    @torch.inference_mode()
    def generate(self, model: Target, condition: Condition, keys: torch.Tensor) -> DecodeResult:
        """Decode all image tokens for ``condition`` (B prompts) with per-sample RNG ``keys`` (B,)."""
        ctx, state = self.start(model, condition, keys)
        cfg = model.config
        num_tokens, side, batch = cfg.num_image_tokens, cfg.grid_size, keys.shape[0]
        state, logs = run_steps(  # the top row commits at least one token a step
            pjd_step,
            self._step,
            ctx,
            state,
            num_tokens - 1,
            done=lambda s: (s.done == side).all(1),
            sync_every=default_sync_every(keys.device, self.sync_every),
            guard=self.guard,
            observe=self.observer,
        )
        drawn = torch.stack([log.drawn for log in logs], dim=1)  # (B, S) tokens per step, 0 once finished
        per_sample = DecodeStats(
            steps=(drawn > 0).sum(1).cpu(),
            tokens=torch.full((batch,), num_tokens - 1, dtype=torch.long),
            tokens_per_step_max=drawn.amax(1).cpu(),
            token_steps=state.emitted[:, :num_tokens].to(torch.int16).cpu(),
        )
        stats = {"target_forwards": float(1 + len(logs)), "steps": float(1 + len(logs))}
        return DecodeResult(state.codes[:, :num_tokens], stats, per_sample)


def pjd_emission(ctx: PJDContext, before: PJDState, after: PJDState) -> Emission:
    """The tokens a step committed (what a Monte Carlo audit histograms over reruns of the step from ``before``), per
    image (B, E) with ``E = R * (W + 1)``: entries ``r * (W + 1) + j`` are row ``r``'s ``j``-th token this step, in
    raster order within the row (each read by the next: chained per row); rows are independent given the state."""
    side, span = ctx.model.config.grid_size, ctx.width + 1
    rows = torch.arange(before.done.shape[1], device=before.done.device)
    offsets = torch.arange(span, device=before.done.device)
    positions = rows[None, :, None] * side + before.done[:, :, None] + offsets  # (B, R, J)
    valid = offsets < (after.done - before.done)[:, :, None]
    tokens = after.codes.gather(1, positions.flatten(1).clamp_max(after.codes.shape[1] - 1))
    return Emission(positions.flatten(1), tokens, valid.flatten(1))


def redraw_drafts(state: PJDState, stream: int) -> PJDState:
    """The rows' drafts drawn again from their recorded laws ``draft_q`` with the state's keys on ``stream`` (for
    an audit's reruns; a point mass keeps its token). A draft the keep rule kept follows its recorded law only
    approximately (it was kept for its ratio), as with SJD++."""
    batch, rows, width, _ = state.draft_q.shape
    counters = (state.step[:, None] * rows + torch.arange(rows, device=state.step.device)).reshape(-1)
    u = rng.uniform(state.keys[:, None].expand(-1, rows).reshape(-1), counters, stream, width)
    return state._replace(drafts=draw(state.draft_q, u.view(batch, rows, width)))


def _uniform_codes(keys: torch.Tensor, rows: int, width: int) -> torch.Tensor:
    """(B, rows, W) uniforms for the rows' first drafts (stream JACOBI_INIT; counter ``-1 - row``, below every
    step's ``step * R + row``)."""
    batch = keys.shape[0]
    counters = (-1 - torch.arange(rows, device=keys.device)).expand(batch, -1).reshape(-1)
    flat = keys[:, None].expand(-1, rows).reshape(-1)
    return rng.uniform(flat, counters, rng.JACOBI_INIT, width).view(batch, rows, width)


def pjd(sampling: SamplingConfig, **kwargs) -> PJDDecoder:
    """PJD with the released code's window (7 drafts a row), keep threshold 0.5 and the model's ``rows_ahead``."""
    return PJDDecoder(sampling, **kwargs)
