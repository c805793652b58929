"""Plain autoregressive decoding: one target forward per image token over a static KV cache."""

from __future__ import annotations

import contextlib

import torch

from lantern.decoding.api import DecodeResult
from lantern.decoding.batch import guided_inputs
from lantern.decoding.compile import check_compile, compiled, mark_static
from lantern.errors import ConfigError
from lantern.models.condition import Condition
from lantern.models.kv_cache import KVCache
from lantern.models.llamagen.gpt import Transformer, prefix_causal_mask
from lantern.models.sampling import SamplingConfig, guided_logits, guided_logits_at, next_token

# How attention runs. fast: PyTorch's default SDPA kernel over this decoder's cache (T + N - 1 slots).
# reference: as LlamaGen's generate(): the math SDPA backend over find_multiple(T + N, 8) cache slots, so
# bf16 runs reproduce its samples token for token (the kernel and the key count change bf16 rounding).
ATTENTION = ("fast", "reference")


def reference_cache_length(cond_len: int, num_tokens: int) -> int:
    """LlamaGen's cache length: ``T_new = T + N`` rounded up to a multiple of 8 (``find_multiple``)."""
    return -(-(cond_len + num_tokens) // 8) * 8


def decode_one_token(
    model: Transformer,
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


class _Buffers:
    """Per batch shape: the cache and the mask at addresses that stay fixed for the whole run."""

    def __init__(self, model: Transformer, rows: int, length: int, static: bool):
        self.cache = model.new_cache(rows, length)
        self.mask = torch.zeros(rows, 1, length, length, dtype=torch.bool, device=model.tok_embeddings.weight.device)
        if static:
            mark_static(self.cache.k, self.cache.v, self.mask)


class ARDecoder:
    """Token-by-token decoding, the baseline every speculative decoder is measured against.

    Each token is one call of :func:`decode_one_token`, compiled as ``compile`` says (``none``: eager).
    Caches and masks are allocated once per batch shape and reused, so a compiled step keeps its
    graph (and, with ``reduce-overhead``, its CUDA graph) from batch to batch.
    """

    name = "ar"

    def __init__(
        self,
        sampling: SamplingConfig,
        compile: str = "none",
        backend: str = "inductor",
        guard=None,
        attention: str = "fast",
    ):
        if attention not in ATTENTION:
            raise ConfigError(f"attention={attention!r} must be one of {', '.join(ATTENTION)}")
        self.attention = attention
        self.sampling = sampling
        self.guard = guard or contextlib.nullcontext  # entered around every step (e.g. a CUDA sync check)
        self.compile = check_compile(compile)
        self.backend = backend
        self._step = compiled(decode_one_token, compile, backend)
        self._buffers: dict[tuple, _Buffers] = {}

    def check_device(self, device: torch.device | str) -> None:
        """ConfigError unless this decoder's compile mode runs on ``device`` (checked before any work)."""
        check_compile(self.compile, device, self.backend)

    def generate(self, model: Transformer, condition: Condition, keys: torch.Tensor) -> DecodeResult:
        """Decode all image tokens for ``condition`` (B prompts) with per-sample RNG ``keys`` (B,)."""
        if self.attention == "reference":
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel(SDPBackend.MATH):
                return self._generate(model, condition, keys)
        return self._generate(model, condition, keys)

    @torch.inference_mode()
    def _generate(self, model: Transformer, condition: Condition, keys: torch.Tensor) -> DecodeResult:
        cfg = model.config
        cond_len, num_tokens = cfg.cls_token_num, cfg.num_image_tokens
        cond_emb, cond_mask = guided_inputs(model, condition, self.sampling)
        rows, batch = cond_emb.shape[0], len(condition)
        device = cond_emb.device
        self.check_device(device)
        length = cond_len + num_tokens - 1  # the last image token is never fed back
        if self.attention == "reference":
            length = reference_cache_length(cond_len, num_tokens)  # extra slots stay masked
        shape = (model.config, rows, length, cond_emb.dtype, device)
        if shape not in self._buffers:
            self._buffers[shape] = _Buffers(model, rows, length, self.compile != "none")
        buffers = self._buffers[shape]
        buffers.mask.copy_(prefix_causal_mask(cond_mask, length))

        # The prefill sees the condition's own slots; LlamaGen's (reference) attends over the whole cache.
        width = length if self.attention == "reference" else cond_len
        logits, _ = model.prefill(cond_emb, buffers.mask[:, :, :cond_len, :width], buffers.cache)
        codes = torch.empty(batch, num_tokens, dtype=torch.long, device=device)
        codes[:, 0] = next_token(guided_logits(logits, self.sampling, 0), self.sampling, keys, 0)
        step = torch.ones(1, dtype=torch.long, device=device)
        for index in range(1, num_tokens):
            token = codes[:, index - 1 : index].repeat(rows // batch, 1)  # (rows, 1)
            with self.guard():
                codes[:, index] = self._step(model, self.sampling, buffers.cache, buffers.mask, keys, token, step)
            step = step + 1
        per_image = torch.full((batch,), num_tokens - 1, dtype=torch.long)
        return DecodeResult(
            codes,
            {"target_forwards": float(num_tokens), "steps": float(num_tokens)},
            {"steps": per_image, "tokens": per_image.clone()},
        )

    def describe(self) -> dict:
        """Decoder settings recorded with results (plain AR has none beyond sampling and compilation)."""
        return {"acceptance": None, "draft": None, "compile": self.compile, "attention": self.attention}
