"""Chameleon's VQGAN (Meta's ``tokenizer/vqgan.ckpt`` + ``vqgan.yaml``, taming-transformers' ``VQModel`` layout).

Names as the checkpoint's: ``encoder.*`` (conv_in, down.{i}.block.{j}, down.{i}.attn.{j}, down.{i}.downsample,
mid.block_1/attn_1/block_2, norm_out, conv_out), ``quant_conv``, ``quantize.embedding``, ``post_quant_conv``,
``decoder.*`` (conv_in, mid, up.{i}.block.{j} (num_res_blocks + 1 each), up.{i}.attn.{j}, up.{i}.upsample,
norm_out, conv_out). The encoder, quant_conv and quantizer equal transformers' ``ChameleonVQVAE`` (same
names under ``model.vqmodel.`` of an HF folder; tested against it); the decoder, which transformers lacks,
follows taming's ``Decoder``: nearest-neighbour 2x upsampling then a 3x3 conv, GroupNorm(32, eps 1e-6),
swish, the levels in reverse. 512 px -> 32 x 32 codes of 8192 x 256.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from lantern import checks
from lantern.errors import ConfigError


@dataclass(frozen=True)
class VQGANConfig:
    """``vqgan.yaml``'s ``model.params``: ``embed_dim``, ``n_embed`` and ``ddconfig`` (Meta's values as defaults)."""

    embed_dim: int = 256
    num_embeddings: int = 8192
    z_channels: int = 256
    resolution: int = 512
    in_channels: int = 3
    out_channels: int = 3
    base_channels: int = 128
    channel_multiplier: tuple[int, ...] = (1, 1, 2, 2, 4)
    num_res_blocks: int = 2
    attn_resolutions: tuple[int, ...] = ()
    dropout: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "channel_multiplier", tuple(int(m) for m in self.channel_multiplier))
        object.__setattr__(self, "attn_resolutions", tuple(int(r) for r in self.attn_resolutions or ()))
        channels = [self.base_channels * m for m in (1, *self.channel_multiplier)]
        if any(c % 32 for c in channels):
            raise ConfigError(f"VQGAN channels {channels} must be multiples of 32 (GroupNorm of 32 groups)")

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.channel_multiplier) - 1)


def _norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(32, channels, eps=1e-6, affine=True)


class ResnetBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, dropout: float):
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        self.norm1 = _norm(in_channels)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, 1, 1)
        self.norm2 = _norm(out_channels)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1)
        if in_channels != out_channels:
            self.nin_shortcut = nn.Conv2d(in_channels, out_channels, 1, 1, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(self.dropout(F.silu(self.norm2(h))))
        return (self.nin_shortcut(x) if self.in_channels != self.out_channels else x) + h


class AttnBlock(nn.Module):
    """Single-head self-attention over the h*w positions (1x1 conv projections)."""

    def __init__(self, channels: int):
        super().__init__()
        self.norm = _norm(channels)
        self.q, self.k, self.v = (nn.Conv2d(channels, channels, 1) for _ in range(3))
        self.proj_out = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, channels, height, width = x.shape
        h = self.norm(x)
        q = self.q(h).reshape(batch, channels, -1).transpose(1, 2)  # (B, hw, C)
        k = self.k(h).reshape(batch, channels, -1)  # (B, C, hw)
        weights = torch.softmax(torch.bmm(q, k) * channels**-0.5, dim=2)  # (B, hw_q, hw_k)
        v = self.v(h).reshape(batch, channels, -1)  # (B, C, hw)
        out = torch.bmm(v, weights.transpose(1, 2)).reshape(batch, channels, height, width)
        return x + self.proj_out(out)


class Downsample(nn.Module):
    """3x3 stride-2 conv after padding right and bottom by one (taming's asymmetric padding)."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, 2, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Upsample(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


def _mid(channels: int, dropout: float) -> nn.Module:
    mid = nn.Module()
    mid.block_1 = ResnetBlock(channels, channels, dropout)
    mid.attn_1 = AttnBlock(channels)
    mid.block_2 = ResnetBlock(channels, channels, dropout)
    return mid


class Encoder(nn.Module):
    def __init__(self, config: VQGANConfig):
        super().__init__()
        mult, base = config.channel_multiplier, config.base_channels
        self.conv_in = nn.Conv2d(config.in_channels, base, 3, 1, 1)
        resolution, block_in = config.resolution, base
        self.down = nn.ModuleList()
        for level, m in enumerate(mult):
            down = nn.Module()
            down.block, down.attn = nn.ModuleList(), nn.ModuleList()
            block_out = base * m
            for _ in range(config.num_res_blocks):
                down.block.append(ResnetBlock(block_in, block_out, config.dropout))
                block_in = block_out
                if resolution in config.attn_resolutions:
                    down.attn.append(AttnBlock(block_in))
            if level != len(mult) - 1:
                down.downsample = Downsample(block_in)
                resolution //= 2
            self.down.append(down)
        self.mid = _mid(block_in, config.dropout)
        self.norm_out = _norm(block_in)
        self.conv_out = nn.Conv2d(block_in, config.z_channels, 3, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 3, H, W) -> (B, z, H/ds, W/ds)
        h = self.conv_in(x)
        for level, down in enumerate(self.down):
            for index, block in enumerate(down.block):
                h = block(h)
                if len(down.attn):
                    h = down.attn[index](h)
            if level != len(self.down) - 1:
                h = down.downsample(h)
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(h)))
        return self.conv_out(F.silu(self.norm_out(h)))


class Decoder(nn.Module):
    def __init__(self, config: VQGANConfig):
        super().__init__()
        mult, base = config.channel_multiplier, config.base_channels
        block_in = base * mult[-1]
        resolution = config.resolution // config.downsample
        self.conv_in = nn.Conv2d(config.z_channels, block_in, 3, 1, 1)
        self.mid = _mid(block_in, config.dropout)
        levels: list[nn.Module] = []
        for level in reversed(range(len(mult))):
            up = nn.Module()
            up.block, up.attn = nn.ModuleList(), nn.ModuleList()
            block_out = base * mult[level]
            for _ in range(config.num_res_blocks + 1):
                up.block.append(ResnetBlock(block_in, block_out, config.dropout))
                block_in = block_out
                if resolution in config.attn_resolutions:
                    up.attn.append(AttnBlock(block_in))
            if level != 0:
                up.upsample = Upsample(block_in)
                resolution *= 2
            levels.insert(0, up)  # up[i] is level i, as taming stores it
        self.up = nn.ModuleList(levels)
        self.norm_out = _norm(block_in)
        self.conv_out = nn.Conv2d(block_in, config.out_channels, 3, 1, 1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:  # (B, z, h, w) -> (B, 3, h*ds, w*ds)
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(self.conv_in(z))))
        for level in reversed(range(len(self.up))):
            up = self.up[level]
            for index, block in enumerate(up.block):
                h = block(h)
                if len(up.attn):
                    h = up.attn[index](h)
            if level != 0:
                h = up.upsample(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class Quantizer(nn.Module):
    def __init__(self, config: VQGANConfig):
        super().__init__()
        self.embedding = nn.Embedding(config.num_embeddings, config.embed_dim)

    def nearest(self, z: torch.Tensor) -> torch.Tensor:
        """Codes (B, h, w) nearest to latents (B, D, h, w), by transformers' |z|^2 + |e|^2 - 2 z.e."""
        flat = z.permute(0, 2, 3, 1).reshape(-1, z.shape[1])  # (B*h*w, D)
        book = self.embedding.weight
        distances = flat.pow(2).sum(1, keepdim=True) + book.pow(2).sum(1) - 2 * flat @ book.t()
        return distances.argmin(1).view(z.shape[0], z.shape[2], z.shape[3])


class ChameleonVQGAN(nn.Module):
    """Encoder, quantizer and decoder of Chameleon's image tokenizer; no I/O here."""

    def __init__(self, config: VQGANConfig):
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.quant_conv = nn.Conv2d(config.z_channels, config.embed_dim, 1)
        self.quantize = Quantizer(config)
        self.post_quant_conv = nn.Conv2d(config.embed_dim, config.z_channels, 1)
        self.decoder = Decoder(config)

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """Images (B, 3, H, W) in [-1, 1] -> codes (B, H/ds, W/ds) int64."""
        return self.quantize.nearest(self.quant_conv(self.encoder(images)))

    def raw_codebook(self) -> torch.Tensor:
        """(K, D) code vectors (LANTERN's neighbour tables are built on them)."""
        return self.quantize.embedding.weight

    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes (B, N) in raster order (N a square) or (B, h, w) -> images (B, 3, h*ds, w*ds) ~[-1, 1]."""
        codes = checks.code_grid(codes, self.config.num_embeddings)  # (B, h, w)
        z = self.quantize.embedding(codes).permute(0, 3, 1, 2)  # (B, D, h, w)
        return self.decoder(self.post_quant_conv(z))
