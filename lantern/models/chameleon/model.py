"""The Chameleon architecture (Anole, Lumina-mGPT) as a target of the family protocol.

Module and parameter names are those of transformers' ``ChameleonForConditionalGeneration`` without its
VQ encoder (``model.vqmodel.*``, the tokenizer's part): ``model.embed_tokens``, ``model.layers.{i}.self_attn.
{q,k,v,o}_proj``, ``self_attn.{q,k}_norm.{weight,bias}`` (per-head LayerNorm affine, (H, hd)),
``model.layers.{i}.mlp.{gate,up,down}_proj``, ``input_layernorm``, ``post_attention_layernorm``,
``model.norm``, ``lm_head``; so a folder's tensors load under their own names.

Facts checked against transformers 5.x ``modeling_chameleon.py``:

* qk-norm: q and k are reshaped to (.., H, hd), normalised over hd by a LayerNorm without affine and with
  eps 1e-5 (hard-coded there, not the config's), then scaled and shifted by per-head weight and bias (H, hd).
* RoPE: 1D, half-split (``rotate_half``): angles ``position * theta^(-2j/hd)`` for j < hd/2, duplicated over
  the two halves; cos and sin computed in fp32 from the positions and cast to the model dtype, as theirs.
* Block (``swin_norm`` false, Chameleon-7B, Anole, Lumina-mGPT-7B): pre-norm ``h = x + attn(in_norm(x))``,
  ``out = h + mlp(post_norm(h))``; with ``swin_norm`` the norms follow the sublayers
  (``h = x + in_norm(attn(x))``, ``out = h + post_norm(mlp(h))``). RMSNorm in fp32, cast back, then scaled.
* SwiGLU ``down(silu(gate(x)) * up(x))``; no biases; ``lm_head`` not tied to the embeddings.

The decoder's vocabulary is the image codes: ``head`` returns logits over the image-code rows of ``lm_head``
only (every other id is masked while an image is generated, as LANTERN's ``ea_model_anole.py`` does with
``non_image_tokens``), ``embed_tokens`` maps code ``c`` to vocabulary id ``code_offset + c`` (Anole: c + 4,
from the folder's vocabulary map). The condition is a left-padded sequence of prompt token ids.

Positions are cache slots. Chameleon's RoPE is 1D, so attention scores depend only on position
differences: a left-padded row whose positions start at its pads gives the reference's scores, whose
positions start at the first real token (and the unconditional row of CFG, whose context is shorter,
likewise), up to fp rounding of the angles.

Padded condition slots: the unconditional context of CFG is shorter than the conditional one, so the null
condition comes with its own mask (:meth:`ChameleonTarget.null_condition_mask`, its two real slots), which
the prefill applies to the unconditional rows (``lantern.decoding.batch.guided_inputs``). Later steps of some
decoders build the condition columns of both CFG halves from the conditional row's validity, so the cache
keeps which slots hold real keys as the prefill's mask stated them (:class:`~lantern.models.kv_cache.ValidityCache`) and every call
hides the others: each row sees exactly its own context. A query always sees its own slot (a padded query
row stays finite; its output is never read).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from lantern import checks
from lantern.errors import ConfigError
from lantern.models.llama_drafter import LlamaDrafterArch, RopeRowsLayer
from lantern.models.llama_parts import Attention, DecoderLayer, LlamaBody, LlamaShape, PromptedTarget

QK_NORM_EPS = 1e-5  # transformers' ChameleonLayerNorm ignores the config's eps
ARCHITECTURE = "ChameleonForConditionalGeneration"


@dataclass(frozen=True)
class ChameleonConfig(LlamaShape):
    """Architecture and token layout of a Chameleon target.

    ``text_vocab_size`` is the full vocabulary (65536 for the 7B models) and ``vocab_size`` the image codes the
    decoders see: code ``c`` is vocabulary id ``code_offset + c``. ``grid_size`` and ``cls_token_num`` (the
    fixed number of condition slots prompts are left-padded to) are not stored in a folder: they come from the
    preset. ``bos_id``, ``pad_id``, ``eot_id`` (Meta's end-of-turn, ``<reserved08706>``), ``boi_id``
    (``<racm3:break>``) and ``eoi_id`` (``<eoss>``) are vocabulary ids.
    """

    code_offset: int
    grid_size: int
    cls_token_num: int
    bos_id: int
    pad_id: int
    eot_id: int
    boi_id: int
    eoi_id: int
    n_kv_head: int = 0  # 0: as n_head
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    swin_norm: bool = False
    model_type: str = "t2i"  # what the condition is (text); the decoders never read it

    def __post_init__(self):
        self.check_shape(("n_layer", "n_head", "dim", "ffn_hidden", "text_vocab_size", "num_codes", "grid_size"))
        if not 0 <= self.code_offset <= self.text_vocab_size - self.num_codes:
            raise ConfigError(
                f"image codes {self.code_offset}..{self.code_offset + self.num_codes - 1} do not fit the "
                f"vocabulary of {self.text_vocab_size}"
            )
        for name in ("bos_id", "pad_id", "eot_id", "boi_id", "eoi_id"):
            value = checks.integer(name, getattr(self, name), 0, self.text_vocab_size - 1)
            if self.code_offset <= value < self.code_offset + self.num_codes:
                raise ConfigError(f"{name}={value} is one of the image codes' vocabulary ids")

    def drafter_arch(self) -> ChameleonDrafterArch:
        """What an EAGLE drafter for this target is (:class:`~lantern.models.drafter.DrafterArch`): Chameleon's
        own layer and 1D RoPE, LANTERN's ``jadohu/anole_drafter`` folder layout."""
        return ChameleonDrafterArch(self)


class HeadNorm(nn.Module):
    """qk-norm: LayerNorm over each head's channels (no affine, eps 1e-5), then a per-head affine (H, hd)."""

    def __init__(self, heads: int, head_dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(heads, head_dim))
        self.bias = nn.Parameter(torch.zeros(heads, head_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, S, H, hd)
        return F.layer_norm(x, x.shape[-1:], None, None, eps=QK_NORM_EPS) * self.weight + self.bias


class ChameleonAttention(Attention):
    """Llama attention with Chameleon's qk-norm (``self_attn.{q,k}_norm``) on q and k before RoPE."""

    def __init__(self, config: ChameleonConfig):
        super().__init__(config)
        self.q_norm = HeadNorm(config.n_head, config.head_dim)
        self.k_norm = HeadNorm(config.n_kv_head, config.head_dim)

    def normed(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.q_norm(q), self.k_norm(k)  # (B, S, H, hd), (B, S, Hkv, hd)


class ChameleonLayer(DecoderLayer):
    """Llama's block with Chameleon's attention; with ``swin_norm`` the norms follow the sublayers
    (Chameleon-30B's layout)."""

    attention = ChameleonAttention

    def __init__(self, config: ChameleonConfig):
        super().__init__(config)
        self.swin_norm = config.swin_norm

    def forward(self, x, cos, sin, mask, slots, kv) -> torch.Tensor:
        if not self.swin_norm:
            return super().forward(x, cos, sin, mask, slots, kv)
        h = x + self.input_layernorm(self.self_attn(x, cos, sin, mask, slots, kv))
        return h + self.post_attention_layernorm(self.mlp(h))


class ChameleonBody(LlamaBody):
    """``model.*`` of the HF layout (without ``vqmodel``)."""

    layer_class = ChameleonLayer


class ChameleonTarget(PromptedTarget):
    """A Chameleon decoder over image codes; no I/O here (see :mod:`lantern.models.chameleon.hf`).

    Sequence layout as every target: condition slots ``0 .. T-1`` hold the left-padded prompt context
    (its last slot is the image-start token), image token ``n`` is fed at slot ``T + n``.
    """

    body_class = ChameleonBody

    def null_condition(self, batch: int) -> torch.Tensor:
        """The unconditional context of CFG (B, T): ``[pad ..., BOS, BOI]``, as LANTERN's ``ea_model_anole.py``."""
        cfg, ids = self.config, self.padded_condition(batch)
        ids[:, -2], ids[:, -1] = cfg.bos_id, cfg.boi_id
        return ids

    def null_condition_mask(self, mask: torch.Tensor) -> torch.Tensor:
        """(B, T): only the null context's last two slots (BOS, BOI) are real, whatever the prompt's ``mask``."""
        null = torch.zeros_like(mask)
        null[:, -2:] = True
        return null


# ----- drafters -----------------------------------------------------------------------------------------------
# EAGLE-style drafters for Chameleon targets, in the layout of LANTERN's ``jadohu/anole_drafter``.
#
# LANTERN's Anole drafter (``models/drafters/cnets_anole.py``, ``Model``; loaded by ``models/ea_model_anole.py``)
# is ``fc`` (Linear 2D -> D, with bias) over ``[embedding of the next input; target state]`` and then
# ``num_hidden_layers`` of Chameleon's own decoder layer: qk-norm (per-head LayerNorm affine (H, hd)), 1D
# half-split RoPE with the target's ``rope_theta``, SwiGLU, RMSNorm with the config's ``rms_norm_eps``. Unlike
# LlamaGen's release, layer 0 keeps its ``input_layernorm``. Its folder is ``config.json`` (the target's own
# ``ChameleonConfig`` with ``num_hidden_layers`` set to the drafter's: the README's CAUTIONS; their
# ``data/configs/anole_config.json``) and ``pytorch_model.bin`` or ``model.safetensors`` holding, strictly,
# ``embed_tokens.weight`` (the whole vocabulary's table (65536, D), frozen), ``fc.weight``, ``fc.bias`` and
# ``layers.{i}.self_attn.{q,k,v,o}_proj.weight``, ``layers.{i}.self_attn.{q,k}_norm.{weight,bias}``,
# ``layers.{i}.mlp.{gate,up,down}_proj.weight``, ``layers.{i}.input_layernorm.weight``,
# ``layers.{i}.post_attention_layernorm.weight``. Those are our module names too, so a folder loads by name.
#
# Positions: their drafter entry ``i`` (reading the state at position ``i`` and the token at ``i + 1``) sits
# at position ``i`` (the unconditional CFG row shifted by a constant); ours sits at ``i + 1``, the target
# position of its input token, as LlamaGen's drafter. Chameleon's RoPE is 1D, so scores depend only on
# position differences and both give the same attention up to fp rounding of the angles.
#
# The target's head already restricts logits to the image codes, as their ``non_image_tokens`` mask does; what
# condition entries read is the prompt tokens' embeddings (``condition_input: embedding``), as theirs.


class DrafterLayer(RopeRowsLayer, ChameleonLayer):
    """Chameleon's decoder layer as a drafter layer over RoPE rows (:class:`~lantern.models.llama_drafter.RopeRowsLayer`)."""


@dataclass(frozen=True)
class ChameleonDrafterArch(LlamaDrafterArch):
    """The :class:`~lantern.models.drafter.DrafterArch` of a Chameleon target (see the comment above): the
    Llama-style base with Chameleon's layer, its ``ChameleonConfig`` keys and the whole vocabulary's table."""

    config: ChameleonConfig
    first_norm: str = ""  # layer 0 keeps input_layernorm, as the release
    layer_class = DrafterLayer
    family = "Chameleon"
    architecture = ARCHITECTURE
    model_type = "chameleon"
    folder_note = f"LANTERN's anole_drafter layout: the target's {ARCHITECTURE} config.json"
    table_note = "the whole vocabulary's table"

    @property
    def embedding_rows(self) -> int:
        return self.config.text_vocab_size  # their drafter keeps the whole vocabulary's table

    def family_keys(self) -> dict:
        """The rest of the target's ``ChameleonConfig`` keys their ``Model`` reads."""
        cfg = self.config
        return {
            "rope_scaling": None,
            "attention_dropout": 0.0,
            "model_parallel_size": 1,
            "swin_norm": cfg.swin_norm,
            "bos_token_id": cfg.bos_id,
            "pad_token_id": cfg.pad_id,
            "boi_token_id": cfg.boi_id,
            "eoi_token_id": cfg.eoi_id,
        }

    def checked_keys(self) -> dict:
        return {"swin_norm": self.config.swin_norm}

    def folder_embeddings(self, target) -> torch.Tensor:
        """The target's whole embedding table (V, D)."""
        return target.model.embed_tokens.weight
