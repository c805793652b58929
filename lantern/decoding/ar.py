"""Plain autoregressive decoding: one target forward per image token over a static KV cache."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import torch

from lantern import checks
from lantern.decoding.api import DecodeResult, DecoderSettings, register
from lantern.decoding.batch import ModelInputs, prefill
from lantern.decoding.compile import check_compile, compiled, mark_static
from lantern.decoding.loop import run_steps
from lantern.decoding.stats import exact_law, raster_steps
from lantern.models.condition import Condition
from lantern.models.kv_cache import KVCache
from lantern.models.sampling import SamplingConfig, guided_logits_at, next_token
from lantern.models.target import Target, prefix_causal_mask

# How attention runs. fast: PyTorch's default SDPA kernel over this decoder's cache (T + N - 1 slots).
# reference: as LlamaGen's generate(): the math SDPA backend over find_multiple(T + N, 8) cache slots, so
# bf16 runs reproduce its samples token for token (the kernel and the key count change bf16 rounding).
ATTENTION = ("fast", "reference")


def reference_cache_length(cond_len: int, num_tokens: int) -> int:
    """LlamaGen's cache length: ``T_new = T + N`` rounded up to a multiple of 8 (``find_multiple``)."""
    return -(-(cond_len + num_tokens) // 8) * 8


@register
@dataclass(frozen=True)
class ARSettings(DecoderSettings):
    """Plain AR: the baseline of every speed-up. ``attention``: which SDPA kernel and cache length."""

    kind: ClassVar[str] = "ar"
    baseline: ClassVar[bool] = True
    attention: str = "fast"

    def record(self) -> dict:
        return {**super().record(), "acceptance": None, "draft": None, "attention": self.attention}


def decode_one_token(
    model: Target,
    sampling: SamplingConfig,
    cache: KVCache,
    mask: torch.Tensor,
    keys: torch.Tensor,
    token: torch.Tensor,
    step: torch.Tensor,
) -> torch.Tensor:
    """Feed image token ``step - 1`` (``token`` (rows, 1)) and draw image token ``step`` (B,).

    ``step`` (1,) is a device tensor, so every call has the same shapes and no host value reaches the
    graph; ``mask`` (rows, 1, L, L) is the causal mask over the whole cache (one row is read per step).
    """
    position = step + (model.config.cls_token_num - 1)  # (1,) where token step-1 sits
    rows = token.shape[0]
    row_mask = mask.index_select(2, position)  # (rows, 1, 1, L)
    logits, _ = model.forward_tokens(token, position, position.expand(rows, 1), row_mask, cache)  # (rows, 1, V)
    batch = keys.shape[0]
    guided = guided_logits_at(logits, sampling, step.expand(batch, 1))[:, -1]  # (B, V)
    return next_token(guided, sampling, keys, step)


@dataclass
class ARContext:
    """Per batch shape: the model, its cache and mask at addresses fixed for the whole run, the knobs."""

    model: Target
    sampling: SamplingConfig
    cache: KVCache
    mask: torch.Tensor  # (rows, 1, L, L) causal over the whole cache
    groups: int  # CFG rows per image


class ARState(NamedTuple):
    """``codes`` (B, N) decided tokens; ``step`` (1,) the next token's index; ``keys`` (B,) RNG keys."""

    codes: torch.Tensor
    step: torch.Tensor
    keys: torch.Tensor


def ar_step(ctx: ARContext, state: ARState, audit: bool = False) -> tuple[ARState, None]:
    """Feed the last decided token, draw the next one into ``codes``; nothing is logged."""
    token = state.codes.index_select(1, state.step - 1).repeat(ctx.groups, 1)  # (rows, 1)
    drawn = decode_one_token(ctx.model, ctx.sampling, ctx.cache, ctx.mask, state.keys, token, state.step)  # (B,)
    codes = state.codes.index_copy(1, state.step, drawn[:, None])
    return state._replace(codes=codes, step=state.step + 1), None


class ARDecoder:
    """Token-by-token decoding, the baseline every speculative decoder is measured against.

    Each token is one :func:`ar_step`, compiled as ``compile`` says (``none``: eager), run by
    :func:`lantern.decoding.loop.run_steps`. Caches and masks are allocated once per batch shape and
    reused, so a compiled step keeps its graph (and, with ``reduce-overhead``, its CUDA graph) from batch
    to batch.
    """

    def __init__(
        self,
        sampling: SamplingConfig,
        *,
        compile: str = "none",
        backend: str = "inductor",
        guard=None,
        attention: str = "fast",
        name: str = "ar",
        label: str = "AR",
    ):
        self.attention = checks.choice("attention", attention, ATTENTION)
        self.sampling = sampling
        self.name, self.label = name, label
        self.guard = guard or contextlib.nullcontext  # entered around every step (e.g. a CUDA sync check)
        self.compile = check_compile(compile)
        self.backend = backend
        self._step = compiled(ar_step, compile, backend)
        self._contexts: dict[tuple, ARContext] = {}

    @property
    def settings(self) -> ARSettings:
        return ARSettings(name=self.name, label=self.label, compile=self.compile, attention=self.attention)

    def check_device(self, device: torch.device | str) -> None:
        """ConfigError unless this decoder's compile mode runs on ``device`` (checked before any work)."""
        check_compile(self.compile, device, self.backend)

    def generate(self, model: Target, condition: Condition, keys: torch.Tensor) -> DecodeResult:
        """Decode all image tokens for ``condition`` (B prompts) with per-sample RNG ``keys`` (B,)."""
        if self.attention == "reference":
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel(SDPBackend.MATH):
                return self._generate(model, condition, keys)
        return self._generate(model, condition, keys)

    def _context(self, model: Target, rows: int, batch: int, length: int, device) -> ARContext:
        shape = (model.config, rows, length, model.input_embeddings().dtype, device)
        if shape not in self._contexts:
            cache = model.new_cache(rows, length)
            mask = torch.zeros(rows, 1, length, length, dtype=torch.bool, device=device)
            if self.compile != "none":
                mark_static(*cache.tensors(), mask)
            self._contexts[shape] = ARContext(model, self.sampling, cache, mask, rows // batch)
        return self._contexts[shape]

    @torch.inference_mode()
    def _generate(self, model: Target, condition: Condition, keys: torch.Tensor) -> DecodeResult:
        cfg = model.config
        cond_len, num_tokens = cfg.cls_token_num, cfg.num_image_tokens
        inputs = ModelInputs.of(model, condition, self.sampling)
        self.check_device(inputs.device)
        length = cond_len + num_tokens - 1  # the last image token is never fed back
        if self.attention == "reference":
            length = reference_cache_length(cond_len, num_tokens)  # extra slots stay masked
        ctx = self._context(model, inputs.rows, inputs.batch, length, inputs.device)
        ctx.mask.copy_(prefix_causal_mask(inputs.cond_mask, length))

        # The prefill sees the condition's own slots; LlamaGen's (reference) attends over the whole cache.
        width = length if self.attention == "reference" else cond_len
        mask = ctx.mask[:, :, :cond_len, :width]
        codes = prefill(model, inputs, ctx.cache, keys, self.sampling, width=num_tokens, mask=mask).codes
        state = ARState(codes, torch.ones(1, dtype=torch.long, device=inputs.device), keys)
        state, _ = run_steps(ar_step, self._step, ctx, state, num_tokens - 1, guard=self.guard)
        per_sample = exact_law(torch.full((inputs.batch,), num_tokens - 1, dtype=torch.long), num_tokens)
        per_sample.token_steps = raster_steps(inputs.batch, num_tokens)
        return DecodeResult(state.codes, {"target_forwards": float(num_tokens), "steps": float(num_tokens)}, per_sample)
