"""Emu3's image tokenizer (BAAI/Emu3-VisionTokenizer, ``model.vqmodel.*`` of an HF folder) as a bundle's VQ.

The decode is transformers' own ``Emu3VQVAE`` (spatial-norm decoder, temporal upsampling; an image is one frame
whose first output frame is kept), wrapped for the :class:`~lantern.models.bundle.ImageTokenizer` protocol:
codes in raster order -> images about [-1, 1] (their image processor maps ``x * 0.5 + 0.5`` to pixels).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import torch
from torch import nn

from lantern import checks
from lantern.errors import CheckpointError
from lantern.models.checkpoint import check_state_dict

# transformers' Emu3VQVAEConfig keys a folder's vq_config may hold (the rest of its dict is bookkeeping).
VQ_KEYS = (
    "codebook_size", "embed_dim", "latent_channels", "double_latent", "in_channels", "out_channels",
    "temporal_downsample_factor", "base_channels", "channel_multiplier", "num_res_blocks", "attn_resolutions",
    "hidden_size", "num_attention_heads", "attention_dropout",
)  # fmt: skip


def vq_config(vq: Mapping):
    """transformers' ``Emu3VQVAEConfig`` of a preset's ``vq`` node or a folder's ``vq_config``."""
    from transformers import Emu3VQVAEConfig

    def plain(value):  # a preset's lists arrive as OmegaConf containers, which their strict config refuses
        return [int(v) for v in value] if isinstance(value, Sequence) and not isinstance(value, str) else value

    return Emu3VQVAEConfig(**{key: plain(value) for key, value in dict(vq).items() if key in VQ_KEYS})


def downsample(vq: Mapping) -> int:
    """Pixels per code side: ``2 ** (len(channel_multiplier) - 1)`` (Emu3's 8)."""
    return 2 ** (len(vq_config(vq).channel_multiplier) - 1)


class Emu3VQ(nn.Module):
    """transformers' ``Emu3VQVAE`` behind the bundle's tokenizer protocol; no I/O here."""

    def __init__(self, config):
        from transformers import Emu3VQVAE

        super().__init__()
        self.model = Emu3VQVAE(config)

    @property
    def num_codes(self) -> int:
        return self.model.config.codebook_size

    def raw_codebook(self) -> torch.Tensor:
        """(K, D) code vectors, code ``c`` row ``c``."""
        return self.model.quantize.embedding.weight

    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes (B, N) in raster order (N a square) or (B, h, w) -> images (B, 3, h*ds, w*ds) ~[-1, 1]."""
        return self.model.decode(checks.code_grid(codes, self.num_codes))  # (B, h, w) -> (B, 3, H, W)


def random_vq(vq: Mapping, init_seed: int = 0) -> Emu3VQ:
    """A seeded random tokenizer of the preset's ``vq`` node (transformers' own init)."""
    torch.manual_seed(init_seed + 1)
    return Emu3VQ(vq_config(vq))


def load_vq(vq: Mapping, state: Mapping[str, torch.Tensor], source: str) -> Emu3VQ:
    """The tokenizer of a folder's ``vq_config`` from its ``model.vqmodel.*`` tensors (prefix removed), strictly."""
    model = Emu3VQ(vq_config(vq))
    if not state:
        raise CheckpointError(f"{source}: the folder holds no model.vqmodel.* tensors (Emu3's image tokenizer)")
    check_state_dict(model.model, state, "Emu3's VQ (vq_config)", os.fspath(source))
    model.model.load_state_dict(dict(state), strict=True)
    return model
