"""EAGLE-style drafters for Chameleon targets, in the layout of LANTERN's ``jadohu/anole_drafter``.

LANTERN's Anole drafter (``models/drafters/cnets_anole.py``, ``Model``; loaded by ``models/ea_model_anole.py``)
is ``fc`` (Linear 2D -> D, with bias) over ``[embedding of the next input; target state]`` and then
``num_hidden_layers`` of Chameleon's own decoder layer: qk-norm (per-head LayerNorm affine (H, hd)), 1D
half-split RoPE with the target's ``rope_theta``, SwiGLU, RMSNorm with the config's ``rms_norm_eps``. Unlike
LlamaGen's release, layer 0 keeps its ``input_layernorm``. Its folder is ``config.json`` (the target's own
``ChameleonConfig`` with ``num_hidden_layers`` set to the drafter's: the README's CAUTIONS; their
``data/configs/anole_config.json``) and ``pytorch_model.bin`` or ``model.safetensors`` holding, strictly,
``embed_tokens.weight`` (the whole vocabulary's table (65536, D), frozen), ``fc.weight``, ``fc.bias`` and
``layers.{i}.self_attn.{q,k,v,o}_proj.weight``, ``layers.{i}.self_attn.{q,k}_norm.{weight,bias}``,
``layers.{i}.mlp.{gate,up,down}_proj.weight``, ``layers.{i}.input_layernorm.weight``,
``layers.{i}.post_attention_layernorm.weight``. Those are our module names too, so a folder loads by name.

Positions: their drafter entry ``i`` (reading the state at position ``i`` and the token at ``i + 1``) sits
at position ``i`` (the unconditional CFG row shifted by a constant); ours sits at ``i + 1``, the target
position of its input token, as LlamaGen's drafter. Chameleon's RoPE is 1D, so scores depend only on
position differences and both give the same attention up to fp rounding of the angles.

The target's head already restricts logits to the image codes, as their ``non_image_tokens`` mask does; what
condition entries read is the prompt tokens' embeddings (``condition_input: embedding``), as theirs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch
from torch import nn

from lantern import checks
from lantern.errors import CheckpointError, ConfigError
from lantern.models.chameleon.hf import ARCHITECTURE, _rope_theta
from lantern.models.chameleon.model import ChameleonConfig, DecoderLayer, _inv_freq, rope_angles

EMBED_KEY = "embed_tokens.weight"
# Our own config.json keys (the same names as LlamaGen's drafter folders): what condition entries read, the
# tapped target layers; their loader ignores both.
CONDITION_KEY = "lantern_condition_input"
TAPS_KEY = "lantern_taps"


class DrafterLayer(DecoderLayer):
    """Chameleon's decoder layer as a drafter layer: ``rope`` rows (S, hd, 2) or (B, S, hd, 2) of fp32
    ``[cos, sin]`` (:meth:`ChameleonDrafterArch.rope_table`), cast to the activations' dtype as the target does."""

    def forward(self, x, rope, mask, slots, kv) -> torch.Tensor:
        cos, sin = rope[..., 0].to(x.dtype), rope[..., 1].to(x.dtype)  # (S, hd) or (B, S, hd)
        if cos.dim() == 2:
            cos, sin = cos[None, None], sin[None, None]  # (1, 1, S, hd): broadcast over rows and heads
        else:
            cos, sin = cos[:, None], sin[:, None]  # (B, 1, S, hd)
        return super().forward(x, cos, sin, mask, slots, kv)


@dataclass(frozen=True)
class ChameleonDrafterArch:
    """The :class:`~lantern.models.drafter.DrafterArch` of a Chameleon target (see the module docstring)."""

    config: ChameleonConfig
    first_norm: str = ""  # layer 0 keeps input_layernorm, as the release

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
        return self.config.text_vocab_size  # their drafter keeps the whole vocabulary's table

    @property
    def norm_eps(self) -> float:
        return self.config.norm_eps  # their drafter's RMSNorm takes the config's rms_norm_eps

    def block(self, norm_eps: float) -> nn.Module:
        return DrafterLayer(replace(self.config, norm_eps=norm_eps))

    def rope_table(self) -> torch.Tensor:
        """(T + N - 1, hd, 2) fp32 ``[cos, sin]``: entry ``i`` at position ``i + 1``, angles as the target's."""
        cfg = self.config
        positions = torch.arange(1, cfg.max_seq_len)
        cos, sin = rope_angles(positions, _inv_freq(cfg), torch.float32)  # (T + N - 1, hd) each
        return torch.stack([cos, sin], dim=-1)

    # ----- the HF folder ---------------------------------------------------------------------------------
    def folder_config(self, n_layer: int, norm_eps: float, condition_input: str, taps: tuple[int, ...]) -> dict:
        """``config.json``: the target's ``ChameleonConfig`` keys their ``Model`` reads, with ``num_hidden_layers``
        the drafter's, plus the condition slots and image tokens (checked on load) and our own keys."""
        cfg = self.config
        config = {
            "architectures": [ARCHITECTURE],
            "model_type": "chameleon",
            "hidden_size": cfg.dim,
            "intermediate_size": cfg.ffn_hidden,
            "num_attention_heads": cfg.n_head,
            "num_key_value_heads": cfg.n_kv_head,
            "num_hidden_layers": n_layer,
            "rms_norm_eps": norm_eps,
            "rope_theta": cfg.rope_theta,
            "rope_scaling": None,
            "vocab_size": cfg.text_vocab_size,
            "hidden_act": "silu",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "mlp_bias": False,
            "model_parallel_size": 1,
            "swin_norm": cfg.swin_norm,
            "tie_word_embeddings": False,
            "bos_token_id": cfg.bos_id,
            "pad_token_id": cfg.pad_id,
            "boi_token_id": cfg.boi_id,
            "eoi_token_id": cfg.eoi_id,
            "max_position_embeddings": max(4096, cfg.max_seq_len + 64),
            "cls_token_num": cfg.cls_token_num,
            "block_size": cfg.num_image_tokens,
        }
        if condition_input:
            config[CONDITION_KEY] = condition_input
        if taps:
            config[TAPS_KEY] = [int(tap) for tap in taps]
        return config

    def check_folder_config(self, config: Mapping, norm_eps: float, source: str, what: str) -> None:
        """CheckpointError unless ``config.json`` describes a Chameleon; ConfigError naming the first key whose
        value does not fit the target (width, heads, vocabulary: required; the rest when present)."""
        architectures = config.get("architectures") or []
        if config.get("model_type") != "chameleon" and ARCHITECTURE not in architectures:
            found = ", ".join(map(str, architectures)) or "no architecture"
            raise CheckpointError(
                f"{source} holds {found} (model_type {config.get('model_type')!r}), not a drafter for a Chameleon "
                f"target (LANTERN's anole_drafter layout: the target's {ARCHITECTURE} config.json)"
            )
        cfg = self.config
        theta = _rope_theta(config, source)
        if not math.isclose(theta, cfg.rope_theta, rel_tol=1e-9):
            raise ConfigError(f"{source}: config.json has rope_theta={theta}, expected {cfg.rope_theta} for {what}")
        expected = {
            "hidden_size": cfg.dim,
            "num_attention_heads": cfg.n_head,
            "vocab_size": cfg.text_vocab_size,
            "num_key_value_heads": cfg.n_kv_head,
            "intermediate_size": cfg.ffn_hidden,
            "rms_norm_eps": norm_eps,
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
            "swin_norm": cfg.swin_norm,
            "cls_token_num": cfg.cls_token_num,
            "block_size": cfg.num_image_tokens,
        }
        required = ("hidden_size", "num_attention_heads", "vocab_size")
        for key, want in expected.items():
            if key not in config or (key == "num_key_value_heads" and config[key] is None):
                if key in required:
                    raise ConfigError(f"{source}: config.json has no {key!r}; expected {checks.shown(want)} for {what}")
                continue
            if not _same(config[key], want):
                raise ConfigError(
                    f"{source}: config.json has {key}={checks.shown(config[key])}, expected {checks.shown(want)} "
                    f"for {what}"
                )

    def to_folder(self, state_dict: Mapping[str, torch.Tensor], embeddings: torch.Tensor) -> dict:
        """Our drafter's tensors (already the release's names) and the frozen table ``embeddings`` (V, D)."""
        want = (self.config.text_vocab_size, self.config.dim)
        if tuple(embeddings.shape) != want:
            raise ConfigError(
                f"a Chameleon drafter folder keeps the whole vocabulary's table {want}, got {tuple(embeddings.shape)} "
                "(pass ChameleonDrafterArch.folder_embeddings(target), not the image codes' rows)"
            )
        return {EMBED_KEY: embeddings, **state_dict}

    def from_folder(
        self, state_dict: Mapping[str, torch.Tensor], source: str
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
        """A folder's (or file's) tensors under our names, and its frozen table (or None), only checked."""
        return {k: v for k, v in state_dict.items() if k != EMBED_KEY}, state_dict.get(EMBED_KEY)

    def folder_embeddings(self, target) -> torch.Tensor:
        """The target's whole embedding table (V, D)."""
        return target.model.embed_tokens.weight


def _same(have, want) -> bool:
    """Equal as JSON values: numbers by value (``1e-05`` is ``1e-5``), a bool or a string only to its kind."""
    if isinstance(want, (bool, str)):
        return type(have) is type(want) and have == want
    if checks.is_number(want):
        return checks.is_number(have) and math.isclose(float(have), float(want), rel_tol=1e-9, abs_tol=0.0)
    return have == want
