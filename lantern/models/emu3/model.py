"""Emu3 (BAAI/Emu3-Gen) as a target of the family protocol: a Llama decoder over an image stream with row ends.

Module and parameter names are those of transformers' ``Emu3ForConditionalGeneration`` without its VQ
(``model.vqmodel.*``, the tokenizer's part): ``model.text_model.embed_tokens``, ``model.text_model.layers.{i}.
self_attn.{q,k,v,o}_proj``, ``mlp.{gate,up,down}_proj``, ``input_layernorm``, ``post_attention_layernorm``,
``model.text_model.norm``, ``lm_head``; so a folder's tensors load under their own names. Facts checked against
transformers 5.x ``modeling_emu3.py``: Llama's pre-norm block without qk-norm or biases, RMSNorm in fp32 cast
back then scaled, SwiGLU, 1D half-split RoPE (Emu3-Gen: theta 1e6, 8 key/value heads of 32), ``lm_head`` untied.

An image (BAAI's ``Emu3PrefixConstrainedLogitsHelper``) is, after the prompt's ``<|image token|>``, ``grid`` rows
of ``grid`` visual tokens each followed by EOL (``<|extra_200|>``, the last row too), then EOF, EOI, EOS: the
row-end syntax of Lumina-mGPT. The decoders address image code ``n`` at logical slot ``T + n`` and must not see
the EOLs, so this target hides them as Lumina-mGPT's does, with :class:`lantern.models.row_ends.RowEndTarget`
(two physical cache slots per logical one, an EOL companion live after each row's last code, the row end's
output being its EOL's): it reads only the config's ids and sizes and the body's ``embed_tokens``, ``layers``
and ``norm``. The head is the visual tokens' rows of ``lm_head`` (their
prefix-constrained processor masks every other id inside a row; EOL, EOF, EOI are forced, never sampled).

CFG as BAAI's ``image_generation.py``: the unconditional context is the negative prompt in the same template
(``null_ids``, set by the bundle from its tokenizer), with a cache of its own; their processor mixes
log-softmaxes, ``s * (lc - lu) + lu``, which differs from mixing the raw logits by a constant per row, so after
the visual-token mask every distribution (and every greedy choice) is the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from lantern import checks
from lantern.errors import ConfigError
from lantern.models.kv_cache import ValidityCache
from lantern.models.llama_drafter import LlamaDrafterArch
from lantern.models.llama_parts import LlamaBody, LlamaShape
from lantern.models.row_ends import RowEndTarget

ARCHITECTURE = "Emu3ForConditionalGeneration"
IDS = ("bos_id", "pad_id", "boi_id", "img_id", "eol_id", "eof_id", "eoi_id", "eos_id")


@dataclass(frozen=True)
class Emu3Config(LlamaShape):
    """Architecture and token layout of an Emu3 target.

    ``text_vocab_size`` is the whole vocabulary (184622 for Emu3-Gen), ``vocab_size`` the image codes the
    decoders see: code ``c`` is vocabulary id ``code_offset + c``. ``grid_size`` and ``cls_token_num`` come
    from the preset. ``null_ids`` is CFG's unconditional context (the negative prompt in the template).
    """

    code_offset: int
    grid_size: int
    cls_token_num: int
    bos_id: int
    pad_id: int
    boi_id: int
    img_id: int
    eol_id: int
    eof_id: int
    eoi_id: int
    eos_id: int
    null_ids: tuple[int, ...] = ()
    n_kv_head: int = 0  # 0: as n_head
    norm_eps: float = 1e-5
    rope_theta: float = 1000000.0
    model_type: str = "t2i"  # what the condition is (text); the decoders never read it

    def __post_init__(self):
        self.check_shape(("n_layer", "n_head", "dim", "ffn_hidden", "text_vocab_size", "num_codes", "grid_size"))
        note = f"the {self.num_codes} image codes' first id in a vocabulary of {self.text_vocab_size}"
        checks.integer("code_offset", self.code_offset, 0, self.text_vocab_size - self.num_codes, note=note)
        object.__setattr__(self, "null_ids", tuple(int(i) for i in self.null_ids))
        for name, value in [*((name, getattr(self, name)) for name in IDS), *(("null_ids", i) for i in self.null_ids)]:
            checks.integer(name, value, 0, self.text_vocab_size - 1)
            if self.code_offset <= value < self.code_offset + self.num_codes:
                raise ConfigError(f"{name}={value} is one of the image codes' vocabulary ids")
        if not 2 <= len(self.null_ids) <= self.cls_token_num:
            raise ConfigError(
                f"the negative prompt is {len(self.null_ids)} tokens with the template; it must fit the "
                f"{self.cls_token_num} condition slots (model.cls_token_num)"
            )

    def drafter_arch(self) -> Emu3DrafterArch:
        """What an EAGLE drafter for this target is: the shared Llama-style arch (Emu3's layer is Llama's)."""
        return Emu3DrafterArch(self)


class Emu3Body(nn.Module):
    """``model.*`` of the HF layout without ``vqmodel``: ``text_model`` a Llama body; its embeddings, layers and
    final norm are also reachable under the names the row-end machinery reads."""

    def __init__(self, config: Emu3Config):
        super().__init__()
        self.text_model = LlamaBody(config)

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self.text_model.embed_tokens

    @property
    def layers(self) -> nn.ModuleList:
        return self.text_model.layers

    @property
    def norm(self) -> nn.Module:
        return self.text_model.norm


class Emu3Target(RowEndTarget):
    """An Emu3 decoder over image codes with the EOL tokens hidden (module docstring); no I/O here."""

    body_class = Emu3Body

    def null_condition(self, batch: int) -> torch.Tensor:
        """CFG's unconditional context (B, T): the negative prompt's ids, left-padded as a prompt."""
        cfg, ids = self.config, self.padded_condition(batch)
        ids[:, cfg.cls_token_num - len(cfg.null_ids) :] = torch.tensor(cfg.null_ids, device=ids.device)
        return ids

    def null_condition_mask(self, mask: torch.Tensor) -> torch.Tensor:
        """(B, T): the negative prompt's slots are real, whatever the prompt's ``mask``."""
        null = torch.zeros_like(mask)
        null[:, mask.shape[1] - len(self.config.null_ids) :] = True
        return null

    def visible(self, slots: torch.Tensor, mask: torch.Tensor, cache) -> torch.Tensor:
        """As :meth:`PromptedTarget.visible` (hide the slots the prefill's mask hid), and also show an image query
        every condition slot the prefill's mask held real: some decoders build both CFG halves' condition columns
        from the conditional row's validity, and Emu3's unconditional context (the negative prompt) is longer than
        most prompts, so its rows hold real slots where the conditional row has pads. Each row then sees exactly
        its own context."""
        mask = super().visible(slots, mask, cache)
        if not isinstance(cache, ValidityCache):
            return mask
        length, cond_len = mask.shape[-1], self.config.cls_token_num
        valid = cache.valid[:, :length] & (torch.arange(length, device=slots.device) < cond_len)  # (B, L)
        image_query = slots >= cond_len  # (B, S): every call but the prefill's
        return mask | (image_query[:, None, :, None] & valid[:, None, None, :])

    def image_stream(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes (B, N) -> the reference's vocabulary ids after ``<|image token|>``: rows each followed by EOL,
        then EOF, EOI, EOS (B, grid * (grid + 1) + 3); for checks."""
        cfg = self.config
        rows = (codes + cfg.code_offset).view(codes.shape[0], cfg.grid_size, cfg.grid_size)
        stream = torch.cat([rows, torch.full_like(rows[:, :, :1], cfg.eol_id)], dim=2).flatten(1)
        tail = torch.tensor([cfg.eof_id, cfg.eoi_id, cfg.eos_id], device=codes.device).expand(codes.shape[0], 3)
        return torch.cat([stream, tail], dim=1)


@dataclass(frozen=True)
class Emu3DrafterArch(LlamaDrafterArch):
    """The :class:`~lantern.models.drafter.DrafterArch` of an Emu3 target: the Llama-style base as it is (Llama's
    layer and 1D RoPE with the target's theta) over the image codes' rows of the embedding table. No drafter for
    Emu3 is released; the folder is the layout ``scripts/train_drafter.py`` exports (a LlamaForCausalLM
    ``config.json``, ``embed_tokens.weight`` (K, D) frozen, ``fc.*``, ``layers.{i}.*``)."""

    config: Emu3Config
    first_norm: str = ""  # layer 0 keeps input_layernorm, as the Anole and Janus drafters
    family = "Emu3"
    folder_note = "a LlamaForCausalLM config.json, as scripts/train_drafter.py exports"

    def folder_embeddings(self, target) -> torch.Tensor:
        """The image codes' rows of the target's embedding table (K, D)."""
        return target.input_embeddings()
