"""The Llama-style pieces the Chameleon, Janus and Emu3 families share (transformers' ``modeling_llama`` /
``modeling_chameleon`` maths), so each family's ``model.py`` keeps only what differs.

* :class:`RMSNorm` (normalised in fp32, cast back, then scaled), :class:`MLP` (SwiGLU, no biases),
  1D half-split RoPE (:func:`inv_freq`, :func:`rope_angles`: cos and sin computed in fp32 from the positions
  and cast to the model dtype, as theirs);
* :class:`Attention` over a static cache (no biases, grouped key/value heads; a family adds qk-norm through
  :meth:`Attention.normed`) and the pre-norm :class:`DecoderLayer` (``self_attn``, ``mlp``,
  ``input_layernorm``, ``post_attention_layernorm``: the HF names, so folders load by name);
* :class:`LlamaShape`, the shape facts and checks both configs state the same way; :class:`RopeTarget`, the
  protocol's methods both targets write the same way over their layers (fp32 RoPE frequencies, the layer loop
  with taps, the static cache);
* :class:`PromptedTarget`, a target prompted by left-padded ids of its whole vocabulary that decodes the image
  codes' slice, over a :class:`~lantern.models.kv_cache.ValidityCache` (Chameleon, Lumina-mGPT, Emu3);
* :func:`seeded_weights`, the seeded init of a random preset's target, and :func:`random_prompted_target`, the
  law a random :class:`PromptedTarget` draws from. The one EAGLE drafter arch the families build on is
  :mod:`lantern.models.llama_drafter`.

Nothing here is a family: it holds no layout of prompts, vocabularies or folders.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from lantern import checks
from lantern.errors import CheckpointError, ConfigError
from lantern.models.kv_cache import KVCache, ValidityCache
from lantern.models.target import EmbeddingsTarget, GridShape, check_taps


class RMSNorm(nn.Module):
    """transformers' Llama/Chameleon RMSNorm: normalised in fp32, cast back, then scaled."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # the casts are no-ops there: the same values, two dispatches fewer a norm
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


class MLP(nn.Module):
    """SwiGLU ``down(silu(gate(x)) * up(x))``, no biases; ``config`` has ``dim`` and ``ffn_hidden``."""

    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.dim, config.ffn_hidden, bias=False)
        self.up_proj = nn.Linear(config.dim, config.ffn_hidden, bias=False)
        self.down_proj = nn.Linear(config.ffn_hidden, config.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    """(hd/2,) fp32 RoPE frequencies ``theta^(-2j/hd)``."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))


def rope_angles(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (S, hd) or (B, S, hd) for ``positions`` (S,) or (B, S), computed as transformers does."""
    freqs = positions[..., None].float() * inv_freq  # (..., S, hd/2)
    angles = torch.cat([freqs, freqs], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def rope_theta_of(config: Mapping, source: str) -> float:
    """The RoPE theta an HF ``config.json`` states (5.x ``rope_parameters`` or 4.x ``rope_theta``); only the default RoPE."""
    rope = config.get("rope_parameters") or {}
    kind = rope.get("rope_type", "default") if isinstance(rope, Mapping) else "default"
    scaling = config.get("rope_scaling")
    if kind != "default" or (isinstance(scaling, Mapping) and scaling.get("rope_type", "default") != "default"):
        raise CheckpointError(f"{source}: config.json asks for RoPE type {kind!r}; only the default RoPE is supported")
    theta = rope.get("rope_theta", config.get("rope_theta", 10000.0)) if isinstance(rope, Mapping) else 10000.0
    return float(theta)


class Attention(nn.Module):
    """Attention without biases over a static cache, grouped key/value heads; ``normed`` is where a family's
    qk-norm goes (none here)."""

    def __init__(self, config):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.n_kv_head, config.head_dim
        kv_dim = config.n_kv_head * config.head_dim
        self.q_proj = nn.Linear(config.dim, config.dim, bias=False)
        self.k_proj = nn.Linear(config.dim, kv_dim, bias=False)
        self.v_proj = nn.Linear(config.dim, kv_dim, bias=False)
        self.o_proj = nn.Linear(config.dim, config.dim, bias=False)

    def normed(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q (B, S, H, hd) and k (B, S, Hkv, hd) before RoPE: as they are."""
        return q, k

    def forward(self, x, cos, sin, mask, slots, kv) -> torch.Tensor:
        batch, seq, dim = x.shape
        q = self.q_proj(x).view(batch, seq, self.n_head, self.head_dim)
        k = self.k_proj(x).view(batch, seq, self.n_kv_head, self.head_dim)
        q, k = self.normed(q, k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, H, S, hd), (B, Hkv, S, hd)
        v = self.v_proj(x).view(batch, seq, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, Hkv, S, hd)
        q = q * cos + rotate_half(q) * sin  # cos, sin broadcast as (1 or B, 1, S, hd)
        k = k * cos + rotate_half(k) * sin
        keys, values = kv.update(slots, k, v, mask.shape[-1])  # (B, Hkv, L, hd)
        if self.n_kv_head != self.n_head:
            groups = self.n_head // self.n_kv_head
            keys, values = keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)  # (B, H, S, hd)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, dim))


class DecoderLayer(nn.Module):
    """Llama's pre-norm block: ``h = x + attn(in_norm(x))``, ``out = h + mlp(post_norm(h))``; a family picks its
    attention class (``attention``)."""

    attention = Attention

    def __init__(self, config):
        super().__init__()
        self.self_attn = self.attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.dim, config.norm_eps)
        self.post_attention_layernorm = RMSNorm(config.dim, config.norm_eps)

    def forward(self, x, cos, sin, mask, slots, kv) -> torch.Tensor:
        h = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, slots, kv)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaBody(nn.Module):
    """A Llama body in HF's names: ``embed_tokens`` over the whole vocabulary (``text_vocab_size``), ``layers``
    of the family's ``layer_class``, the final ``norm``."""

    layer_class = DecoderLayer

    def __init__(self, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.text_vocab_size, config.dim)
        self.layers = nn.ModuleList(self.layer_class(config) for _ in range(config.n_layer))
        self.norm = RMSNorm(config.dim, config.norm_eps)


def seeded_weights(model: torch.nn.Module, init_seed: int, law: Callable[[str], tuple[float, float]]):
    """``model`` with every parameter drawn in order from one CPU generator seeded ``init_seed``:
    ``mean + std * randn`` (just ``std * randn`` for mean 0), ``law(name)`` giving (mean, std). The seeded
    random presets' targets (a family's ``random_target`` says its law)."""
    generator = torch.Generator().manual_seed(init_seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            mean, std = law(name)
            draw = std * torch.randn(param.shape, generator=generator)
            param.copy_(draw if mean == 0 else mean + draw)
    return model


@dataclass(frozen=True)
class LlamaShape(GridShape):
    """The sizes every Llama-style family config starts with, and their shape facts and checks. A family's
    config is a frozen dataclass over it that adds its own fields (``n_kv_head``, ``grid_size``,
    ``cls_token_num`` among them) and calls :meth:`check_shape` from its ``__post_init__``."""

    n_layer: int
    n_head: int
    dim: int
    ffn_hidden: int
    text_vocab_size: int  # the whole vocabulary (the body's embedding rows)
    num_codes: int  # the image codes decoders sample from

    @classmethod
    def for_architecture(cls, architecture: Mapping, target: Mapping, grid_size: int, **extra):
        """The config of a preset's ``architecture`` (its fields but the grid and the condition slots, which
        ``grid_size`` and ``target``'s ``cls_token_num`` give): random-weight timing at a real model's sizes."""
        cls_token_num = checks.integer("model.cls_token_num", target["cls_token_num"], 2)
        return cls(**dict(architecture), grid_size=grid_size, cls_token_num=cls_token_num, **extra)

    @staticmethod
    def node_sizes(target: Mapping, text_vocab_size: int) -> dict:
        """The sizes a random preset's ``target`` node states (``n_layer``, ``n_head``, ``dim``, ``ffn_hidden``)
        and the size of its vocabulary, as config fields."""
        sizes = {key: target[key] for key in ("n_layer", "n_head", "dim", "ffn_hidden")}
        return {**sizes, "text_vocab_size": text_vocab_size}

    def check_shape(self, integers: tuple[str, ...]) -> None:
        """ConfigError unless ``integers`` are positive, the condition holds BOS and BOI and the width splits
        into heads; ``n_kv_head`` 0 becomes ``n_head``."""
        for name in integers:
            checks.integer(name, getattr(self, name), 1)
        checks.integer("cls_token_num", self.cls_token_num, 2, note="a prompt context needs at least BOS and BOI")
        if self.n_kv_head == 0:
            object.__setattr__(self, "n_kv_head", self.n_head)
        if self.dim % self.n_head or (self.dim // self.n_head) % 2 or self.n_head % self.n_kv_head:
            raise ConfigError(
                f"hidden size {self.dim} must split into {self.n_head} heads of even size, "
                f"and {self.n_head} heads into {self.n_kv_head} key/value heads"
            )

    @property
    def vocab_size(self) -> int:
        """What decoders sample from: the image codes."""
        return self.num_codes


class RopeTarget(EmbeddingsTarget):
    """What a family target over :class:`DecoderLayer` layers writes the same way: the fp32 ``inv_freq`` buffer,
    the layer loop with taps and the static cache. A family sets ``cache_class``, calls :meth:`init_rope` in
    its ``__init__`` and gives :meth:`layers_and_norm` and :meth:`cache_weight` (its dtype and device are the
    cache's). Inherited before ``nn.Module``."""

    cache_class = KVCache

    def init_rope(self) -> None:
        self.register_buffer("inv_freq", inv_freq(self.config.head_dim, self.config.rope_theta), persistent=False)

    def _apply(self, fn, recurse=True):
        # The RoPE frequencies stay fp32 whatever dtype the weights take (a non-persistent fp32 buffer in theirs).
        super()._apply(fn, recurse)
        self.inv_freq = inv_freq(self.config.head_dim, self.config.rope_theta).to(self.inv_freq.device)
        return self

    def layers_and_norm(self) -> tuple[nn.ModuleList, nn.Module]:
        raise NotImplementedError

    def cache_weight(self) -> torch.Tensor:
        raise NotImplementedError

    def run_layers(self, x, cos, sin, mask, slots, cache, taps: tuple[int, ...] = ()):
        """The layers over ``x`` (B, S, D) with RoPE ``cos``, ``sin`` (1 or B, 1, S, hd): final-norm states
        (B, S, D), or with ``taps`` the pair ``(hidden, features)``, features (B, S, len(taps) * D) the residual
        streams entering those layers."""
        layers, norm = self.layers_and_norm()
        taps = check_taps(taps, len(layers)) if taps else ()
        states: dict[int, torch.Tensor] = {}
        for index, layer in enumerate(layers):
            if index in taps:
                states[index] = x
            x = layer(x, cos, sin, mask, slots, cache.layer(index))
        hidden = norm(x)
        if not taps:
            return hidden
        return hidden, torch.cat([states[tap] for tap in taps], dim=-1)

    def new_cache(self, batch: int, max_len: int | None = None):
        cfg, weight = self.config, self.cache_weight()
        return self.cache_class.allocate(
            cfg.n_layer, batch, cfg.n_kv_head, max_len or cfg.max_seq_len, cfg.head_dim, weight.dtype, weight.device
        )


class PromptedTarget(RopeTarget, nn.Module):
    """A Llama-style target prompted by left-padded token ids of its whole vocabulary, decoding the slice of
    image codes: code ``c`` is vocabulary id ``config.code_offset + c`` (Chameleon, Lumina-mGPT, Emu3). Its
    cache is a :class:`ValidityCache`, so every call hides the condition slots the prefill's mask hid (CFG's
    unconditional context has a length of its own). A family gives ``body_class`` (the HF layout's ``model.*``;
    ``lm_head`` is over the whole vocabulary), ``null_condition`` and ``null_condition_mask``."""

    cache_class = ValidityCache
    body_class: type[nn.Module]  # ``model.*``: ``embed_tokens`` over the whole vocabulary, ``layers``, ``norm``

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.model = self.body_class(config)
        self.lm_head = nn.Linear(config.dim, config.text_vocab_size, bias=False)
        self.init_rope()

    # ----- inputs -------------------------------------------------------------------------------
    def embed_condition(self, condition: torch.Tensor) -> torch.Tensor:
        """Prompt token ids (B, T), left-padded with the pad id -> embeddings (B, T, D)."""
        return self.model.embed_tokens(condition)

    def padded_condition(self, batch: int) -> torch.Tensor:
        """(B, T) of the pad id: a null condition's ids before the family writes its real slots at the end."""
        cfg = self.config
        return torch.full((batch, cfg.cls_token_num), cfg.pad_id, dtype=torch.long, device=self.inv_freq.device)

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """Image codes (B, S) -> embeddings of their vocabulary ids (B, S, D)."""
        return self.model.embed_tokens(tokens + self.config.code_offset)

    def input_embeddings(self) -> torch.Tensor:
        """The image codes' rows of the embedding table (K, D), a view."""
        cfg = self.config
        return self.model.embed_tokens.weight.narrow(0, cfg.code_offset, cfg.num_codes)

    # ----- core ---------------------------------------------------------------------------------
    def forward_embeddings(
        self, x, positions, slots, mask, cache, taps: tuple[int, ...] = ()
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Run the layers over ``x`` (B, S, D) at ``positions`` (S,) or (B, S), writing cache ``slots``
        (B, S) under ``mask`` (B, 1, S, L); return final-norm states (B, S, D), or with ``taps`` the pair
        ``(hidden, features)``, features (B, S, len(taps) * D) the residual streams entering those layers."""
        cos, sin = rope_angles(positions, self.inv_freq, x.dtype)
        cos, sin = (cos[None, None], sin[None, None]) if cos.dim() == 2 else (cos[:, None], sin[:, None])
        return self.run_layers(x, cos, sin, self.visible(slots, mask, cache), slots, cache, taps)

    def visible(self, slots: torch.Tensor, mask: torch.Tensor, cache) -> torch.Tensor:
        """``mask`` (B, 1, S, L) with the slots the prefill's mask hid hidden, recording this call's validity in
        a :class:`ValidityCache`; as it is for any other cache. A query always sees its own slot (a padded
        query row stays finite; its output is never read)."""
        if not isinstance(cache, ValidityCache):
            return mask
        length = mask.shape[-1]
        valid = cache.write_valid(slots, mask, self.config.cls_token_num)[:, :length]  # (B, L)
        own = torch.arange(length, device=slots.device)[None, None, :] == slots[:, :, None]  # (B, S, L)
        return mask & (valid[:, None, None, :] | own[:, None])

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states (..., D) -> fp32 logits over the image codes (..., K)."""
        cfg = self.config
        return F.linear(hidden, self.lm_head.weight.narrow(0, cfg.code_offset, cfg.num_codes)).float()

    def vocab_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states (..., D) -> fp32 logits over the whole vocabulary (..., V), for checks."""
        return self.lm_head(hidden).float()

    # ----- decoding -----------------------------------------------------------------------------
    def layers_and_norm(self) -> tuple[nn.ModuleList, nn.Module]:
        return self.model.layers, self.model.norm

    def cache_weight(self) -> torch.Tensor:
        return self.model.embed_tokens.weight


def random_prompted_target(target_class: type[PromptedTarget], config, init_seed: int = 0) -> PromptedTarget:
    """A seeded random :class:`PromptedTarget` of ``target_class`` (std 0.02 weights as transformers' init;
    LayerNorm/RMSNorm weights perturbed so the norms matter in tests; the pad id's embedding row zero, as
    transformers' ``padding_idx`` row)."""

    def law(name: str) -> tuple[float, float]:
        if name.endswith("norm.weight"):
            return 1.0, 0.1
        return 0.0, 0.1 if name.endswith("norm.bias") else 0.02

    model = seeded_weights(target_class(config), init_seed, law)
    with torch.no_grad():
        model.model.embed_tokens.weight[config.pad_id].zero_()
    return model
