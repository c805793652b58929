"""Janus-Pro (1B / 7B) as a target of the family protocol.

Module and parameter names are those of transformers' ``JanusForConditionalGeneration`` for the parts image
generation runs: ``model.language_model.*`` (a Llama: ``embed_tokens``, ``layers.{i}.self_attn.{q,k,v,o}_proj``,
``layers.{i}.mlp.{gate,up,down}_proj``, ``input_layernorm``, ``post_attention_layernorm``, ``norm``),
``model.generation_embeddings`` (DeepSeek's ``gen_embed``: K x 8), ``model.generation_aligner.{fc1,
hidden_layers.{i}}`` (``gen_aligner``) and ``model.generation_head.{proj_out, vision_head}`` (``gen_head``); so a
folder's tensors load under their own names. The understanding path (``model.vision_model``, ``model.aligner``),
the text head (``lm_head``) and the VQ (``model.vqmodel``, the tokenizer's) are not part of the target.

Facts checked against transformers 5.x ``modeling_janus.py`` / ``modeling_llama.py`` (tests/test_janus.py):

* an image code ``c`` enters the LM as ``aligner(gen_embed(c))``: ``fc1`` (8 -> D), then ``depth - 1`` times
  GELU (exact, erf) and a D x D linear (``prepare_embeddings_for_image_generation``);
* the LM's last normed state goes through ``gen_head``: ``proj_out`` (D -> D), GELU, ``vision_head`` (D -> K);
  the text ``lm_head`` is never used while an image is generated;
* Llama blocks: pre-norm, fp32 RMSNorm cast back then scaled, 1D half-split RoPE with cos and sin computed in
  fp32 from the positions and cast to the model dtype, SwiGLU, no biases (the norm, MLP, attention and RoPE code
  is :mod:`lantern.models.llama_parts`, which the Chameleon family shares; Janus has no qk-norm).

Condition layout (how one batch holds prompts of different lengths and the reference's unconditional rows).
DeepSeek's ``generation_inference.py`` runs one prompt of L tokens unpadded: the conditional row is
``[BOS, text..., BOI]`` and the unconditional row the same length with every token but the first and last
replaced by the pad token, ``[BOS, pad x (L-2), BOI]``, all attended, at positions ``0 .. L-1``; image token
``n`` is at position ``L + n``. The null condition is one fixed tensor and its mask is its conditional row's
(the default :meth:`~lantern.models.target.EmbeddingsTarget.null_condition_mask`, which
:func:`lantern.decoding.batch.guided_inputs` applies), so here a prompt fills the T condition slots as
``[BOS, (T - L masked slots), text..., BOI]``: BOS in slot 0, the rest right-aligned. The null condition
``[BOS, pad x (T - 2), BOI]`` under that mask is then exactly the reference's unconditional row. RoPE positions
are not the slots: every key and query is rotated by its slot minus the masked condition slots before it
(read from the mask's condition columns), which are the reference's positions ``0 .. L-1``, ``L + n`` for
both rows, so scores equal the reference's with every decoder unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from lantern import checks
from lantern.models.llama_drafter import LlamaDrafterArch
from lantern.models.llama_parts import LlamaBody, LlamaShape, RopeTarget, rope_angles

ARCHITECTURE = "JanusForConditionalGeneration"


@dataclass(frozen=True)
class JanusConfig(LlamaShape):
    """Architecture and token layout of a Janus target.

    ``dim`` is the LM width, which the aligner's output and the head's input also have (transformers'
    ``projection_dim`` and ``image_token_embed_dim``); ``code_dim`` the generation embeddings' width (the VQ's
    ``embed_dim``, 8) and ``aligner_depth`` the aligner's linear layers. ``grid_size`` and ``cls_token_num``
    (the condition slots a prompt fills) come from the preset. ``bos_id``, ``pad_id`` and ``boi_id``
    (``<begin_of_image>``) are vocabulary ids, found by name in the folder's tokenizer.
    """

    code_dim: int
    grid_size: int
    cls_token_num: int
    bos_id: int
    pad_id: int
    boi_id: int
    aligner_depth: int = 2
    n_kv_head: int = 0  # 0: as n_head
    norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    model_type: str = "t2i"  # what the condition is (text); the decoders never read it

    def __post_init__(self):
        self.check_shape(
            ("n_layer", "n_head", "dim", "ffn_hidden", "text_vocab_size", "num_codes", "code_dim", "grid_size")
        )
        checks.integer("aligner_depth", self.aligner_depth, 1)
        for name in ("bos_id", "pad_id", "boi_id"):
            checks.integer(name, getattr(self, name), 0, self.text_vocab_size - 1)

    def drafter_arch(self) -> JanusDrafterArch:
        """What an EAGLE drafter for this target is (:class:`~lantern.models.drafter.DrafterArch`)."""
        return JanusDrafterArch(self)


def rope_positions(positions: torch.Tensor, mask: torch.Tensor, cls_token_num: int) -> torch.Tensor:
    """RoPE positions (B, S): ``positions`` (S,) or (B, S) minus the condition slots that ``mask``
    (B, 1, S, L) hides from each query among those before its position (see the module docstring)."""
    batch, _, seq, length = mask.shape
    positions = positions.expand(batch, seq) if positions.dim() == 1 else positions  # (B, S)
    width = min(cls_token_num, length)
    columns = torch.arange(width, device=mask.device)
    hidden = ~mask[:, 0, :, :width] & (columns < positions[..., None])  # (B, S, T) masked slots before it
    return positions - hidden.sum(-1)


class LanguageModel(LlamaBody):
    """``model.language_model.*`` of the HF layout."""


class Aligner(nn.Module):
    """``gen_aligner``: ``fc1`` (code_dim -> D) then ``depth - 1`` of (GELU, D x D linear)."""

    def __init__(self, config: JanusConfig):
        super().__init__()
        self.fc1 = nn.Linear(config.code_dim, config.dim)
        self.hidden_layers = nn.ModuleList(nn.Linear(config.dim, config.dim) for _ in range(config.aligner_depth - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.fc1(x)
        for layer in self.hidden_layers:
            x = layer(F.gelu(x))
        return x


class GenerationHead(nn.Module):
    """``gen_head``: ``proj_out`` (D -> D), GELU, ``vision_head`` (D -> K)."""

    def __init__(self, config: JanusConfig):
        super().__init__()
        self.proj_out = nn.Linear(config.dim, config.dim)
        self.vision_head = nn.Linear(config.dim, config.num_codes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.vision_head(F.gelu(self.proj_out(x)))


class JanusBody(nn.Module):
    """``model.*`` of the HF layout, the generation path only."""

    def __init__(self, config: JanusConfig):
        super().__init__()
        self.language_model = LanguageModel(config)
        self.generation_embeddings = nn.Embedding(config.num_codes, config.code_dim)
        self.generation_aligner = Aligner(config)
        self.generation_head = GenerationHead(config)


class JanusTarget(RopeTarget, nn.Module):
    """Janus's LM over image codes; no I/O here (see :mod:`lantern.models.janus.hf`)."""

    def __init__(self, config: JanusConfig):
        super().__init__()
        self.config = config
        self.model = JanusBody(config)
        self.init_rope()

    # ----- inputs -------------------------------------------------------------------------------
    def embed_condition(self, condition: torch.Tensor) -> torch.Tensor:
        """Prompt token ids (B, T) in the condition layout -> embeddings (B, T, D)."""
        return self.model.language_model.embed_tokens(condition)

    def null_condition(self, batch: int) -> torch.Tensor:
        """CFG's unconditional context (B, T): ``[BOS, pad ..., BOI]``; under a prompt's mask it is the
        reference's ``[BOS, pad x (L-2), BOI]`` (module docstring)."""
        cfg = self.config
        ids = torch.full((batch, cfg.cls_token_num), cfg.pad_id, dtype=torch.long, device=self.inv_freq.device)
        ids[:, 0], ids[:, -1] = cfg.bos_id, cfg.boi_id
        return ids

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """Image codes (B, S) -> ``aligner(gen_embed(codes))`` (B, S, D)."""
        return self.model.generation_aligner(self.model.generation_embeddings(tokens))

    def input_embeddings(self) -> torch.Tensor:
        """The image codes' token table, ``gen_embed`` (K, code_dim): Janus has no D-wide table (the aligner
        maps these rows to the LM's width); its dtype and device are the model's."""
        return self.model.generation_embeddings.weight

    def aligned_embeddings(self) -> torch.Tensor:
        """Every code's LM input ``aligner(gen_embed)`` (K, D): the table a drafter folder keeps a copy of."""
        return self.model.generation_aligner(self.model.generation_embeddings.weight)

    # ----- core ---------------------------------------------------------------------------------
    def forward_embeddings(
        self, x, positions, slots, mask, cache, taps: tuple[int, ...] = ()
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Run the layers over ``x`` (B, S, D) at ``positions`` (S,) or (B, S), writing cache ``slots``
        (B, S) under ``mask`` (B, 1, S, L); final-norm states (B, S, D), or with ``taps`` the pair
        ``(hidden, features)``, features (B, S, len(taps) * D) the residual streams entering those layers."""
        cos, sin = rope_angles(rope_positions(positions, mask, self.config.cls_token_num), self.inv_freq, x.dtype)
        cos, sin = cos[:, None], sin[:, None]  # (B, 1, S, hd)
        return self.run_layers(x, cos, sin, mask, slots, cache, taps)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states (..., D) -> fp32 logits over the image codes (..., K) from the generation head."""
        return self.model.generation_head(hidden).float()

    # ----- decoding -----------------------------------------------------------------------------
    def layers_and_norm(self) -> tuple[nn.ModuleList, nn.Module]:
        return self.model.language_model.layers, self.model.language_model.norm

    def cache_weight(self) -> torch.Tensor:
        return self.model.language_model.embed_tokens.weight


# ----- drafters -----------------------------------------------------------------------------------------------
# EAGLE-style drafters for Janus targets. No drafter for Janus is released, so the folder is EAGLE's own layout
# over a Llama layer (as LANTERN's releases for LlamaGen and Anole): ``config.json`` (a LlamaConfig: the target
# LM's width, heads, eps and theta, the drafter's ``num_hidden_layers``) and ``model.safetensors`` with
# ``embed_tokens.weight`` (every code's LM input ``aligner(gen_embed(c))`` (K, D), frozen: what the drafter
# reads as the next token's embedding), ``fc.{weight,bias}`` and ``layers.{i}.*`` in Llama's names, loaded
# strictly by name. Layer 0 keeps its ``input_layernorm`` (as the Anole release). Entry ``i`` (input token at
# position ``i + 1``) reads RoPE position ``i + 1``: slots, not the target's remapped positions; the drafter
# is trained and run in the same layout, and its attention over the condition is masked as the target's.


@dataclass(frozen=True)
class JanusDrafterArch(LlamaDrafterArch):
    """The :class:`~lantern.models.drafter.DrafterArch` of a Janus target (see the comment above): the Llama-style
    base as it is, over the image codes' LM inputs."""

    config: JanusConfig
    first_norm: str = ""
    family = "Janus"
    folder_note = "a LlamaForCausalLM config.json, as scripts/train_drafter.py exports"
    table_note = "every code's LM input"

    def folder_embeddings(self, target) -> torch.Tensor:
        """Every code's LM input (K, D) (:meth:`JanusTarget.aligned_embeddings`)."""
        with torch.no_grad():
            return target.aligned_embeddings()
