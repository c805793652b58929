"""The LlamaGen GPT target model (class- and text-conditional), with explicit decoding methods.

Module and parameter names follow the released checkpoints exactly (see ``shared/llamagen_keys``).
The model holds no decoding state: callers pass a :class:`~lantern.models.kv_cache.KVCache`, the
positions (for RoPE), the cache slots to write, and a boolean attention mask over cache slots.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from torch import nn

from lantern import checks
from lantern.errors import ConfigError
from lantern.models.kv_cache import KVCache
from lantern.models.llama_drafter import ConfigSizes
from lantern.models.llama_parts import RMSNorm  # fp32, cast back, then scaled: as LlamaGen's own
from lantern.models.llamagen import hf_layout
from lantern.models.llamagen.rope import apply_rope, rope_rows, rope_table_2d
from lantern.models.target import EmbeddingsTarget, GridShape, check_taps

MODEL_TYPES = ("c2i", "t2i")


def _ffn_hidden(dim: int, multiple_of: int = 256) -> int:
    hidden = int(2 * 4 * dim / 3)
    return multiple_of * math.ceil(hidden / multiple_of)


@dataclass(frozen=True)
class GPTConfig(GridShape):
    """Architecture of a LlamaGen GPT. ``grid_size`` (image side in tokens) is not stored in checkpoints."""

    n_layer: int
    n_head: int
    dim: int
    model_type: str = "c2i"
    grid_size: int = 16
    vocab_size: int = 16384
    num_classes: int = 1000
    caption_dim: int = 2048
    cls_token_num: int = 1
    norm_eps: float = 1e-5
    rope_base: float = 10000.0
    ffn_multiple_of: int = 256
    ffn_hidden: int = field(default=0)

    def __post_init__(self):
        checks.choice("model_type", self.model_type, MODEL_TYPES)
        if self.dim % self.n_head or (self.dim // self.n_head) % 4:
            raise ConfigError(f"dim {self.dim} must split into {self.n_head} heads with head_dim divisible by 4")
        if self.grid_size < 1 or self.cls_token_num < 1:
            raise ConfigError(f"grid_size and cls_token_num must be >= 1, got {self.grid_size}, {self.cls_token_num}")
        if self.ffn_hidden == 0:
            object.__setattr__(self, "ffn_hidden", _ffn_hidden(self.dim, self.ffn_multiple_of))

    @property
    def n_kv_head(self) -> int:
        """Key/value heads: LlamaGen's attention has as many as query heads."""
        return self.n_head

    @property
    def num_codes(self) -> int:
        """The image codes: LlamaGen's vocabulary is its codebook."""
        return self.vocab_size

    def drafter_arch(self) -> LlamaGenArch:
        """What an EAGLE drafter for this target is (:class:`~lantern.models.drafter.DrafterArch`): LlamaGen's
        own blocks and 2D RoPE, the LANTERN release's folder layout (:class:`LlamaGenArch`)."""
        return LlamaGenArch(self)


# Named architectures: (n_layer, n_head, dim). The first five are LlamaGen's; the small ones are for
# tiny worlds and tests.
GPT_PRESETS: dict[str, tuple[int, int, int]] = {
    "GPT-B": (12, 12, 768),
    "GPT-L": (24, 16, 1024),
    "GPT-XL": (36, 20, 1280),
    "GPT-XXL": (48, 24, 1536),
    "GPT-3B": (24, 32, 3200),
    "GPT-tiny": (8, 6, 384),
    "GPT-deep": (
        24,
        4,
        128,
    ),  # the world's target: LlamaGen's depth at a CPU's width (draft step ~1/24 of a target step)
    "GPT-mini": (6, 6, 192),
    "GPT-nano": (2, 2, 64),
}


def default_taps(n_layer: int) -> tuple[int, ...]:
    """EAGLE-3's taps for a target of ``n_layer`` layers: the states entering layers 2, ``n_layer // 2`` and
    ``n_layer - 3`` (low, middle, high; EAGLE-3's code taps exactly these).

    Each is clamped into ``1 .. n_layer - 1`` and a repeated one is dropped (as EAGLE-3's code, which tests
    ``idx in {...}`` per layer), in ascending order: so from 7 layers on there are three, 6 layers give
    ``(2, 3)``, 5 give ``(2,)`` and GPT-nano's 2 give ``(1,)``. A 1-layer target has no state to tap.
    """
    n_layer = checks.integer("n_layer", n_layer, 2, note="a target with taps needs a state between two layers")
    return tuple(sorted({min(max(tap, 1), n_layer - 1) for tap in (2, n_layer // 2, n_layer - 3)}))


def gpt_config(preset: str, model_type: str, image_size: int, downsample: int = 16, **overrides) -> GPTConfig:
    """Build the :class:`GPTConfig` of a named preset for ``model_type`` at ``image_size`` pixels.

    t2i models default to 120 condition tokens of dimension 2048 (FLAN-T5-XL), c2i to one class token.
    """
    checks.choice("GPT preset", preset, GPT_PRESETS)
    checks.choice("model_type", model_type, MODEL_TYPES)
    if image_size < downsample or image_size % downsample:
        raise ConfigError(
            f"image_size {image_size} is not a multiple of the tokenizer's {downsample}x downsample "
            f"(e.g. {downsample * 16} or {downsample * 24})"
        )
    n_layer, n_head, dim = GPT_PRESETS[preset]
    base = GPTConfig(
        n_layer=n_layer,
        n_head=n_head,
        dim=dim,
        model_type=model_type,
        grid_size=image_size // downsample,
        cls_token_num=120 if model_type == "t2i" else 1,
    )
    return replace(base, **overrides)


class LabelEmbedder(nn.Module):
    """Class id -> one condition token; row ``num_classes`` is the null class used for CFG."""

    def __init__(self, num_classes: int, dim: int):
        super().__init__()
        self.num_classes = num_classes
        self.embedding_table = nn.Embedding(num_classes + 1, dim)

    def forward(self, labels: torch.Tensor) -> torch.Tensor:
        return self.embedding_table(labels).unsqueeze(1)  # (B, 1, D)

    def null(self, batch: int, device: torch.device) -> torch.Tensor:
        return torch.full((batch,), self.num_classes, dtype=torch.long, device=device)


class CaptionMLP(nn.Module):
    def __init__(self, in_dim: int, dim: int):
        super().__init__()
        self.fc1 = nn.Linear(in_dim, dim, bias=False)
        self.fc2 = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class CaptionEmbedder(nn.Module):
    """Caption token states (B, T, C) -> condition tokens (B, T, D); ``uncond_embedding`` is the null caption."""

    def __init__(self, caption_dim: int, dim: int, token_num: int):
        super().__init__()
        self.register_buffer("uncond_embedding", torch.randn(token_num, caption_dim) / caption_dim**0.5)
        self.cap_proj = CaptionMLP(caption_dim, dim)

    def forward(self, captions: torch.Tensor) -> torch.Tensor:
        return self.cap_proj(captions.to(self.cap_proj.fc1.weight.dtype))

    def null(self, batch: int, device: torch.device) -> torch.Tensor:
        return self.uncond_embedding.to(device).unsqueeze(0).expand(batch, -1, -1)


def attention_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean attention mask as the additive bias (0 where True, -inf where False) in ``dtype``, the tensor SDPA
    makes of it; eagerly only (compiled, the boolean mask stays: Inductor fuses it)."""
    if torch.compiler.is_compiling() or mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


class Attention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head = config.n_head
        self.head_dim = config.head_dim
        self.wqkv = nn.Linear(config.dim, 3 * config.dim, bias=False)
        self.wo = nn.Linear(config.dim, config.dim, bias=False)

    def forward(self, x, rope, mask, slots, kv) -> torch.Tensor:
        batch, seq, dim = x.shape
        qkv = self.wqkv(x).view(batch, seq, 3 * self.n_head, self.head_dim)
        q, k = apply_rope(qkv[:, :, : 2 * self.n_head], rope).transpose(1, 2).split(self.n_head, dim=1)  # (B, H, S, hd)
        v = qkv[:, :, 2 * self.n_head :].transpose(1, 2)
        keys, values = kv.update(slots, k, v, mask.shape[-1])  # (B, H, L, hd)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, dim))


class FeedForward(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.w1 = nn.Linear(config.dim, config.ffn_hidden, bias=False)
        self.w3 = nn.Linear(config.dim, config.ffn_hidden, bias=False)
        self.w2 = nn.Linear(config.ffn_hidden, config.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.attention = Attention(config)
        self.feed_forward = FeedForward(config)
        self.attention_norm = RMSNorm(config.dim, config.norm_eps)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)

    def forward(self, x, rope, mask, slots, kv) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), rope, mask, slots, kv)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(EmbeddingsTarget, nn.Module):
    """LlamaGen GPT. Build with :func:`gpt_config`; no I/O happens here (see ``lantern.models.checkpoint``).

    Sequence layout: slots ``0 .. T-1`` hold the ``T = cls_token_num`` condition tokens; image token
    ``n`` is fed at position ``T + n`` and its output predicts token ``n + 1``; the output at ``T - 1``
    predicts token 0.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        if config.model_type == "c2i":
            self.cls_embedding = LabelEmbedder(config.num_classes, config.dim)
        else:
            self.cls_embedding = CaptionEmbedder(config.caption_dim, config.dim, config.cls_token_num)
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(TransformerBlock(config) for _ in range(config.n_layer))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        table = rope_table_2d(config.grid_size, config.head_dim, config.cls_token_num, config.rope_base)
        self.register_buffer("rope", table, persistent=False)  # (max_seq_len, hd/2, 2)

    def _apply(self, fn, recurse=True):
        # Keep the RoPE table in fp32 whatever dtype the weights are cast to (in the reference it is a
        # plain attribute that .to(dtype) leaves alone).
        super()._apply(fn, recurse)
        cfg = self.config
        table = rope_table_2d(cfg.grid_size, cfg.head_dim, cfg.cls_token_num, cfg.rope_base)
        self.rope = table.to(self.rope.device)
        return self

    # ----- inputs -------------------------------------------------------------------------------
    def embed_condition(self, condition: torch.Tensor) -> torch.Tensor:
        """Class ids (B,) or caption states (B, T, C) -> condition embeddings (B, T, D)."""
        return self.cls_embedding(condition)

    def null_condition(self, batch: int) -> torch.Tensor:
        """The unconditional input for CFG: null class ids (B,) or the learned null caption (B, T, C)."""
        return self.cls_embedding.null(batch, self.tok_embeddings.weight.device)

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """Image token ids (B, S) -> embeddings (B, S, D)."""
        return self.tok_embeddings(tokens)

    def input_embeddings(self) -> torch.Tensor:
        """The (V, D) input embedding table."""
        return self.tok_embeddings.weight

    # ----- core ---------------------------------------------------------------------------------
    def forward_embeddings(
        self, x, positions, slots, mask, cache, taps: tuple[int, ...] = ()
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Run the layers over embeddings ``x`` (B, S, D); return final-norm hidden states (B, S, D).

        ``positions`` (S,) or (B, S) index the RoPE table; ``slots`` (B, S) are the cache slots each row writes;
        ``mask`` (B, 1, S, L) bool says which of the first ``L`` cache slots each query may attend to.
        ``cache`` is a :class:`KVCache` or :class:`NoCache`.

        ``taps`` (layer indices in ``1 .. n_layer - 1``, see :func:`default_taps`): when given, the pair
        ``(hidden, features)`` is returned instead, where ``features`` (B, S, len(taps) * D) concatenates, in
        the given order, the residual stream entering each tapped layer (before any norm): what an
        EAGLE-3-style drafter reads in place of the final-norm state.
        """
        taps = check_taps(taps, self.config.n_layer) if taps else ()
        # Prepared once for every layer: the RoPE rows, the cache's write index and (eagerly) the mask as the
        # additive bias SDPA would otherwise build from the boolean mask in every layer (the same -inf / 0 values).
        rope, slots, mask = rope_rows(self.rope[positions]), cache.writes(slots), attention_bias(mask, x.dtype)
        states: dict[int, torch.Tensor] = {}
        for index, layer in enumerate(self.layers):
            if index in taps:
                states[index] = x  # (B, S, D) the input of layer ``index``
            x = layer(x, rope, mask, slots, cache.layer(index))
        hidden = self.norm(x)
        if not taps:
            return hidden
        return hidden, torch.cat([states[tap] for tap in taps], dim=-1)  # (B, S, D), (B, S, len(taps) * D)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states (..., D) -> fp32 logits (..., V)."""
        logits = self.output(hidden)
        return logits if logits.dtype == torch.float32 else logits.float()

    # ----- decoding -----------------------------------------------------------------------------
    def new_cache(self, batch: int, max_len: int | None = None) -> KVCache:
        """A zeroed cache for ``batch`` rows and ``max_len`` slots (default: the full sequence)."""
        cfg = self.config
        weight = self.tok_embeddings.weight
        return KVCache.allocate(
            cfg.n_layer, batch, cfg.n_head, max_len or cfg.max_seq_len, cfg.head_dim, weight.dtype, weight.device
        )


# ----- drafters -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LlamaGenArch(ConfigSizes):
    """LlamaGen's drafter: its :class:`TransformerBlock`, its 2D RoPE table (row ``i + 1`` for entry ``i``: the
    input token's coordinates), no input norm on layer 0, and the LANTERN release's HF layout
    (:mod:`lantern.models.llamagen.hf_layout`). It sits beside :class:`GPTConfig`, whose ``drafter_arch()``
    gives it, as Chameleon's and Janus's archs sit beside theirs."""

    config: GPTConfig
    norm_eps: float = 1e-6
    first_norm: str = "attention_norm"

    def block(self, norm_eps: float) -> nn.Module:
        return TransformerBlock(replace(self.config, n_layer=1, norm_eps=norm_eps))

    def rope_table(self) -> torch.Tensor:
        cfg = self.config
        table = rope_table_2d(cfg.grid_size, cfg.head_dim, cfg.cls_token_num, cfg.rope_base)
        return table[1:]  # (T + N - 1, hd/2, 2): entry i takes the row of position i + 1

    def folder_config(self, n_layer, norm_eps, condition_input, taps) -> dict:
        return hf_layout.drafter_config(self.config, n_layer, norm_eps, condition_input, taps)

    def check_folder_config(self, config, norm_eps, source, what) -> None:
        hf_layout.check_drafter_config(config, self.config, norm_eps, source, what)

    def to_folder(self, state_dict, embeddings) -> dict:
        return hf_layout.drafter_to_hf(state_dict, embeddings)

    def from_folder(self, state_dict, source):
        return hf_layout.drafter_from_hf(state_dict, source)

    def folder_embeddings(self, target) -> torch.Tensor:
        return target.input_embeddings()
