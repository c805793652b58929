"""The one EAGLE drafter arch of the Llama-style families (Chameleon, Janus): :class:`LlamaDrafterArch`; and
:class:`ConfigSizes`, the sizes every arch reads from its target config (LlamaGen's too).

Sizes from the target config, the family's decoder layer over RoPE rows (:class:`RopeRowsLayer`), the folder's
``config.json`` written and checked, the frozen token table beside the tensors; a family adds only what differs
(its layer, its extra ``config.json`` keys, its table). Nothing here is a family: folders only as far as every
Llama-style drafter folder is alike.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

import torch
from torch import nn

from lantern.errors import ConfigError
from lantern.models.checkpoint import check_family, check_folder_keys
from lantern.models.drafter import EMBED_KEY, own_keys, split_folder
from lantern.models.llama_parts import DecoderLayer, inv_freq, rope_angles, rope_theta_of


def drafter_cos_sin(rope: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """A drafter's RoPE rows ``rope`` (S, hd, 2) or (B, S, hd, 2) fp32 ``[cos, sin]`` -> cos, sin in ``dtype``
    shaped to broadcast as the target's: (1, 1, S, hd) or (B, 1, S, hd)."""
    cos, sin = rope[..., 0].to(dtype), rope[..., 1].to(dtype)
    if cos.dim() == 2:
        return cos[None, None], sin[None, None]
    return cos[:, None], sin[:, None]


class ConfigSizes:
    """The sizes a :class:`DrafterArch` reports, read from its target config ``self.config``, which names them
    (``dim``, ``n_head``, ``n_kv_head``, ``head_dim``, ``num_codes``, ``grid_size``, ``cls_token_num``,
    ``n_layer``); ``embedding_rows`` is the image codes unless a family's arch says otherwise."""

    @property
    def dim(self) -> int:
        return self.config.dim

    @property
    def n_head(self) -> int:
        return self.config.n_head

    @property
    def n_kv_head(self) -> int:
        return self.config.n_kv_head

    @property
    def head_dim(self) -> int:
        return self.config.head_dim

    @property
    def vocab_size(self) -> int:
        return self.config.num_codes

    @property
    def grid_size(self) -> int:
        return self.config.grid_size

    @property
    def cls_token_num(self) -> int:
        return self.config.cls_token_num

    @property
    def n_layer(self) -> int:
        return self.config.n_layer

    @property
    def embedding_rows(self) -> int:
        return self.config.num_codes


def drafter_rope_table(config) -> torch.Tensor:
    """(T + N - 1, hd, 2) fp32 ``[cos, sin]``: drafter entry ``i`` at position ``i + 1``, angles as the target's."""
    positions = torch.arange(1, config.max_seq_len)
    cos, sin = rope_angles(positions, inv_freq(config.head_dim, config.rope_theta), torch.float32)
    return torch.stack([cos, sin], dim=-1)


class RopeRowsLayer:
    """A target's decoder layer as a drafter layer: ``rope`` rows (S, hd, 2) or (B, S, hd, 2) of fp32
    ``[cos, sin]`` (:func:`drafter_rope_table`), cast to the activations' dtype as the target does. Mixed in
    before the family's layer class."""

    def forward(self, x, rope, mask, slots, kv) -> torch.Tensor:
        return super().forward(x, *drafter_cos_sin(rope, x.dtype), mask, slots, kv)


class LlamaDrafterLayer(RopeRowsLayer, DecoderLayer):
    """Llama's pre-norm layer as a drafter layer."""


class LlamaDrafterArch(ConfigSizes):
    """The :class:`~lantern.models.drafter.DrafterArch` of a Llama-style target whose config ``self.config``
    names its sizes as :class:`LlamaShape` does (``dim``, ``n_head``, ``n_kv_head``, ``num_codes``, ``grid_size``,
    ``cls_token_num``, ``n_layer``, ``norm_eps``, ``ffn_hidden``, ``rope_theta``).

    A drafter layer is the family's ``layer_class`` over the target's own 1D RoPE (entry ``i`` at position
    ``i + 1``); layer 0 keeps its input norm (``first_norm`` empty, as the Anole release). The folder is EAGLE's
    over a Llama layer: ``config.json`` with the target's width, heads, eps and theta, the drafter's
    ``num_hidden_layers``, ``vocab_size`` the rows of the frozen table (``embedding_rows``), the condition slots
    and image tokens (checked on load) and our own keys; the tensors under our names (the HF ones) beside that
    table (``embed_tokens.weight``). A family subclass (a frozen dataclass with a ``config`` field) sets
    ``layer_class``, ``family``, ``architecture``, ``model_type``, ``folder_note`` and gives
    :meth:`folder_embeddings`; :meth:`family_keys` and :meth:`checked_keys` add its own ``config.json`` keys."""

    layer_class: type = LlamaDrafterLayer
    family: str = "Llama"  # named in messages
    architecture: str = "LlamaForCausalLM"  # config.json "architectures"
    model_type: str = "llama"
    folder_note: str = "a LlamaForCausalLM config.json"  # what a folder of this family holds, for messages
    table_note: str = "the image codes' table"  # what its frozen table is, for messages
    first_norm: str = ""

    @property
    def norm_eps(self) -> float:
        return self.config.norm_eps

    # ----- layers ----------------------------------------------------------------------------------------
    def block(self, norm_eps: float) -> nn.Module:
        return self.layer_class(replace(self.config, norm_eps=norm_eps))

    def rope_table(self) -> torch.Tensor:
        """(T + N - 1, hd, 2) fp32 ``[cos, sin]``: entry ``i`` at position ``i + 1``, angles as the target's."""
        return drafter_rope_table(self.config)

    # ----- the HF folder ---------------------------------------------------------------------------------
    def family_keys(self) -> dict:
        """The family's own ``config.json`` keys, written after the common ones."""
        return {}

    def checked_keys(self) -> dict:
        """The family's own ``config.json`` keys checked on load when present."""
        return {}

    def folder_config(self, n_layer: int, norm_eps: float, condition_input: str, taps: tuple[int, ...]) -> dict:
        """``config.json``: the target's sizes, the drafter's ``num_hidden_layers`` and eps, the condition slots
        and image tokens (checked on load) and our own keys."""
        cfg = self.config
        config = {
            "architectures": [self.architecture],
            "model_type": self.model_type,
            "hidden_size": cfg.dim,
            "intermediate_size": cfg.ffn_hidden,
            "num_attention_heads": cfg.n_head,
            "num_key_value_heads": cfg.n_kv_head,
            "num_hidden_layers": n_layer,
            "rms_norm_eps": norm_eps,
            "rope_theta": cfg.rope_theta,
            "vocab_size": self.embedding_rows,
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": False,
            **self.family_keys(),
            "max_position_embeddings": max(4096, cfg.max_seq_len + 64),
            "cls_token_num": cfg.cls_token_num,
            "block_size": cfg.num_image_tokens,
        }
        return own_keys(config, condition_input, taps)

    def check_folder_config(self, config: Mapping, norm_eps: float, source: str, what: str) -> None:
        """CheckpointError unless ``config.json`` is this family's by its ``model_type`` and its ``architectures``
        (:func:`~lantern.models.checkpoint.check_family`); ConfigError naming the first key whose value does not
        fit the target (width, heads, vocabulary: required; the rest when present)."""
        wanted = f"a drafter for a {self.family} target ({self.folder_note}, model_type {self.model_type!r})"
        check_family(config, self.model_type, self.architecture, source, wanted)
        cfg = self.config
        theta = rope_theta_of(config, source)
        if not math.isclose(theta, cfg.rope_theta, rel_tol=1e-9):
            raise ConfigError(f"{source}: config.json has rope_theta={theta}, expected {cfg.rope_theta} for {what}")
        expected = {
            "hidden_size": cfg.dim,
            "num_attention_heads": cfg.n_head,
            "vocab_size": self.embedding_rows,
            "num_key_value_heads": cfg.n_kv_head,
            "intermediate_size": cfg.ffn_hidden,
            "rms_norm_eps": norm_eps,
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
            **self.checked_keys(),
            "cls_token_num": cfg.cls_token_num,
            "block_size": cfg.num_image_tokens,
        }
        required = ("hidden_size", "num_attention_heads", "vocab_size")
        check_folder_keys(config, expected, required, source, what, nullable=("num_key_value_heads",))

    def to_folder(self, state_dict: Mapping[str, torch.Tensor], embeddings: torch.Tensor) -> dict:
        """Our drafter's tensors (already the HF names) and the frozen table ``embeddings`` (``embedding_rows``, D)."""
        want = (self.embedding_rows, self.config.dim)
        if tuple(embeddings.shape) != want:
            raise ConfigError(
                f"a {self.family} drafter folder keeps {self.table_note} {want}, got {tuple(embeddings.shape)} "
                f"(pass {type(self).__name__}.folder_embeddings(target))"
            )
        return {EMBED_KEY: embeddings, **state_dict}

    def from_folder(
        self, state_dict: Mapping[str, torch.Tensor], source: str
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
        """A folder's (or file's) tensors under our names, and its frozen table (or None), only checked."""
        return split_folder(state_dict)

    def folder_embeddings(self, target) -> torch.Tensor:
        """The table (``embedding_rows``, D) of ``target`` that the folder keeps a copy of."""
        raise NotImplementedError
