"""ZipAR (He et al. 2024, arXiv 2412.04062; code ThisisBillhe/ZipAR): training-free next-set decoding over
the 2-D token grid, each forward one token for every grid row already under way.

Each step is :func:`~lantern.decoding.zipar.step.zipar_step`, a pure static-shape function (compiled as
``compile`` says), run by :func:`lantern.decoding.loop.run_steps`; this file prefills and summarises.
Records: ``steps`` (target forwards after the prefill) and ``tokens`` (the N - 1 tokens they drew), so
``mean_accepted_length`` is tokens per target forward, as for every decoder. ZipAR is lossy (tokens see
the rows above only as far as they are decoded) and no realised TV is recorded: the law a token is drawn
from is the target's under a different context, not a rule's relaxation of it; quality is measured
instead (FID, classifier accuracy). Paper-vs-code notes: docs/zipar.md.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import ClassVar

import torch

from lantern import checks
from lantern.decoding.api import DecodeResult, DecoderSettings, register
from lantern.decoding.audit import Emission, RerunPlan
from lantern.decoding.batch import ModelInputs, prefill
from lantern.decoding.compile import check_compile, compiled, mark_static
from lantern.decoding.loop import default_sync_every, run_steps
from lantern.decoding.stats import DecodeStats, zipar_token_steps
from lantern.decoding.zipar.step import ZipARContext, ZipARState, zipar_step
from lantern.models.condition import Condition
from lantern.models.sampling import SamplingConfig
from lantern.models.target import Target


@register
@dataclass(frozen=True)
class ZipARSettings(DecoderSettings):
    """Next-set decoding: a grid row starts once the row above has decoded ``window`` tokens."""

    kind: ClassVar[str] = "zipar"
    window: int | None = None  # None: the model's default, not yet resolved (no model seen)

    def method(self) -> str:
        return self.label if self.window is None else f"{self.label}-{self.window}"

    def order(self) -> tuple:
        return (3, self.name, self.window or 0)

    def record(self) -> dict:
        return {**super().record(), "acceptance": None, "draft": "next_set", "window": self.window}


PAPER_WINDOW = 16  # the paper's headline ZipAR-16 (LlamaGen-L, rows 24 tokens wide)


def default_window(width: int) -> int:
    """The window ``window: null`` means on a grid ``width`` tokens wide: the paper's 16 where rows are
    wider than 16 tokens, else half the row (at least 1), so the default always decodes rows in parallel
    (a window of the full width is raster AR). LlamaGen-L (24): 16; the world (8): 4; 16 wide: 8."""
    return PAPER_WINDOW if width > PAPER_WINDOW else max(1, width // 2)


class ZipARDecoder:
    """ZipAR with ``window`` (the paper's ZipAR-n: n tokens of the row above before a row starts; the
    released LlamaGen script's default is 8, the paper's headline LlamaGen-L figure is ZipAR-16).
    ``window`` at least the grid's width is raster AR (every row waits for the row above); ``None`` takes
    :func:`default_window` of the model's grid width."""

    def __init__(
        self,
        sampling: SamplingConfig,
        *,
        window: int | None = None,
        name: str = "zipar",
        label: str | None = None,
        compile: str = "none",
        backend: str = "inductor",
        sync_every: int | None = None,
        guard=None,
    ):
        self.sampling = sampling
        self.window = (
            None
            if window is None
            else checks.integer("window", window, 1, note="tokens of the row above decoded before a row starts")
        )
        self._resolved: int | None = self.window  # the window of the last model seen (recorded)
        self.name, self.label = name, label or "ZipAR"
        self.compile = check_compile(compile)
        self.backend = backend
        self.sync_every = sync_every
        self.guard = guard or contextlib.nullcontext
        self._step = compiled(zipar_step, compile, backend)
        self._contexts: dict[tuple, ZipARContext] = {}
        self.observer = None  # the Monte Carlo TV audit's, while it decodes a batch again (lantern.decoding.audit)

    tv_audit = "mc"  # a token's law is the target's under a partial context: no forward of the run computes the TV

    @property
    def rerun_plan(self) -> RerunPlan:
        """How the Monte Carlo TV audit reruns a step: every started row draws one token, independently."""
        return RerunPlan(caches=("cache",), emitted=zipar_emission, chained=False)

    def check_device(self, device: torch.device | str) -> None:
        """ConfigError unless this decoder's compile mode runs on ``device`` (checked before any work)."""
        check_compile(self.compile, device, self.backend)

    def check_model(self, config) -> int:
        """The window used on ``config``'s grid; ConfigError when a given window is wider than the image's
        rows or the grid is not whole rows."""
        side = config.grid_size
        window = default_window(side) if self.window is None else self.window
        if window > side:
            raise checks.refuse(
                "window", window, f"an integer in [1, {side}]", f"tokens per grid row of this model: {side}"
            )
        if config.num_image_tokens % side:
            raise checks.refuse("model", config.num_image_tokens, f"a multiple of the grid width {side}")
        return window

    @property
    def settings(self) -> ZipARSettings:
        return ZipARSettings(name=self.name, label=self.label, compile=self.compile, window=self._resolved)

    def _context(self, model: Target, rows: int, batch: int, capacity: int, device, window: int) -> ZipARContext:
        shape = (model.config, rows, batch, capacity, model.input_embeddings().dtype, device, window)
        if shape not in self._contexts:
            cache = model.new_cache(rows, capacity)
            if self.compile != "none":
                mark_static(*cache.tensors())
            self._contexts[shape] = ZipARContext(
                model=model, cache=cache, sampling=self.sampling, window=window, groups=rows // batch
            )
        return self._contexts[shape]

    @torch.inference_mode()
    def generate(self, model: Target, condition: Condition, keys: torch.Tensor) -> DecodeResult:
        """Decode all image tokens for ``condition`` (B prompts) with per-sample RNG ``keys`` (B,)."""
        cfg, sampling = model.config, self.sampling
        self._resolved = window = self.check_model(cfg)
        cond_len, num_tokens, side = cfg.cls_token_num, cfg.num_image_tokens, cfg.grid_size
        grid_rows = num_tokens // side
        inputs = ModelInputs.of(model, condition, sampling)
        batch, device = inputs.batch, inputs.device
        self.check_device(device)
        capacity = cond_len + num_tokens + grid_rows  # one scratch slot per grid row after the image
        ctx = self._context(model, inputs.rows, batch, capacity, device, window)

        codes = prefill(model, inputs, ctx.cache, keys, sampling, width=num_tokens + 1, capacity=capacity).codes
        done = torch.zeros(batch, grid_rows, dtype=torch.long, device=device)
        done[:, 0] = 1
        written = torch.zeros(batch, capacity, dtype=torch.bool, device=device)
        state = ZipARState(
            codes=codes,
            done=done,
            flushed=torch.zeros(batch, grid_rows, dtype=torch.bool, device=device),
            written=written,
            keys=keys,
            target_valid=inputs.valid(capacity),
        )
        state, logs = run_steps(  # every step draws at least one token per unfinished image
            zipar_step,
            self._step,
            ctx,
            state,
            num_tokens - 1,
            done=lambda s: (s.done == side).all(1),
            sync_every=default_sync_every(device, self.sync_every),
            guard=self.guard,
            observe=self.observer,
        )
        drawn = torch.stack([log.drawn for log in logs], dim=1)  # (B, S) tokens per step, 0 once finished
        per_sample = DecodeStats(
            steps=(drawn > 0).sum(1).cpu(),
            tokens=torch.full((batch,), num_tokens - 1, dtype=torch.long),
            tokens_per_step_max=drawn.amax(1).cpu(),
            token_steps=zipar_token_steps(batch, side, grid_rows, window),
        )
        stats = {"target_forwards": float(1 + len(logs)), "steps": float(1 + len(logs))}
        return DecodeResult(state.codes[:, :num_tokens], stats, per_sample)


def zipar_emission(ctx: ZipARContext, before: ZipARState, after: ZipARState) -> Emission:
    """The tokens a ZipAR step drew (B, R): one per grid row that advanced, at raster ``r * S + done[r]``."""
    side = ctx.model.config.grid_size
    rows = torch.arange(before.done.shape[1], device=before.done.device)
    positions = rows[None, :] * side + before.done  # (B, R)
    valid = after.done > before.done
    return Emission(positions, after.codes.gather(1, positions.clamp_max(after.codes.shape[1] - 1)), valid)


def zipar(sampling: SamplingConfig, *, window: int | None = None, **kwargs) -> ZipARDecoder:
    """ZipAR next-set decoding with ``window`` (ZipAR-``window``; None: :func:`default_window`)."""
    return ZipARDecoder(sampling, window=window, **kwargs)
