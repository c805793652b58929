"""LlamaGen's VQ image tokenizer (VQ-16 / VQ-8) and small CPU-sized variants: the tokenizer of the LlamaGen
family and, under transformers' names, of Janus (DeepSeek's ``gen_vision_model`` is LlamaGen's VQ-16; see
:mod:`lantern.models.janus.vq`), so it lives beside the families rather than in either folder.

The module tree mirrors the released checkpoints name for name, shape for shape and in the same
registration order (see ``shared/llamagen_keys/vq_VQ-*.tsv``), so the official files load strictly.

Pipeline: images (B, 3, H, W) in [-1, 1] -> ``encoder`` -> ``quant_conv`` -> l2-normalised nearest-code
lookup in ``quantize`` -> codes (B, H/ds, W/ds); codes -> normalised code vectors -> ``post_quant_conv``
-> ``decoder`` -> images (B, 3, H, W) ~[-1, 1]; :func:`lantern.models.bundle.to_uint8` turns those into pixels.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from lantern import checks
from lantern.errors import ConfigError

CODEBOOK_USED_SIZE = 65536  # length of the `quantize.codebook_used` buffer in the official files
COMMITMENT_BETA = 0.25  # weight of the commitment loss, as in LlamaGen's VQ training
_GN_EPS = 1e-6


@dataclass(frozen=True)
class VQConfig:
    """Architecture of a VQ tokenizer; the defaults are LlamaGen's VQ-16."""

    codebook_size: int = 16384
    codebook_embed_dim: int = 8
    ch: int = 128
    ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)
    z_channels: int = 256
    num_res_blocks: int = 2
    norm_groups: int = 32
    l2_norm: bool = True
    dropout: float = 0.0
    in_channels: int = 3

    def __post_init__(self) -> None:
        # A list from YAML would make the frozen config unhashable; store a tuple.
        object.__setattr__(self, "ch_mult", tuple(self.ch_mult))
        for name in ("codebook_embed_dim", "ch", "z_channels", "num_res_blocks", "norm_groups", "in_channels"):
            object.__setattr__(self, name, checks.integer(f"VQConfig.{name}", getattr(self, name), 1))
        object.__setattr__(self, "codebook_size", checks.integer("VQConfig.codebook_size", self.codebook_size, 2))
        if not self.ch_mult or not all(isinstance(m, int) and m >= 1 for m in self.ch_mult):
            raise ConfigError(f"VQConfig.ch_mult must be a non-empty list of positive integers, got {self.ch_mult!r}")
        bad = [self.ch * m for m in self.ch_mult if (self.ch * m) % self.norm_groups]
        if bad:
            raise ConfigError(
                f"VQConfig: every level width ch*ch_mult must be divisible by norm_groups={self.norm_groups}, "
                f"got widths {bad} (ch={self.ch}, ch_mult={list(self.ch_mult)})"
            )
        checks.flag("VQConfig.l2_norm", self.l2_norm)
        checks.probability("VQConfig.dropout", self.dropout, one=False)

    @property
    def downsample(self) -> int:
        """Spatial reduction factor between an image and its code grid."""
        return 2 ** (len(self.ch_mult) - 1)


VQ_PRESETS: dict[str, VQConfig] = {
    "VQ-16": VQConfig(),
    "VQ-8": VQConfig(ch_mult=(1, 2, 2, 4)),
    # Tiny tokenizers for synthetic worlds trained on CPU: 32x32 -> 4x4 codes, 64x64 -> 8x8 codes.
    "VQ-tiny": VQConfig(
        codebook_size=2048,
        codebook_embed_dim=8,
        ch=32,
        ch_mult=(1, 1, 2, 2),
        z_channels=32,
        num_res_blocks=1,
        norm_groups=8,
    ),
    # Same widths with the official downsampling factor: 64x64 -> 4x4 codes.
    "VQ-tiny16": VQConfig(
        codebook_size=2048,
        codebook_embed_dim=8,
        ch=32,
        ch_mult=(1, 1, 2, 2, 4),
        z_channels=32,
        num_res_blocks=1,
        norm_groups=8,
    ),
    # The embedded Fashion-MNIST world's tokenizer: downsample 4, 32x32 -> 8x8 codes; ~1.05M parameters
    # (~2.1 MB in fp16), trained by scripts/train_vq.py.
    "VQ-fashion": VQConfig(
        codebook_size=2048,
        codebook_embed_dim=8,
        ch=32,
        ch_mult=(1, 2, 2),
        z_channels=32,
        num_res_blocks=1,
        norm_groups=8,
    ),
}


def vq_config(name: str, **overrides) -> VQConfig:
    """Return the preset ``name`` with ``overrides`` applied (e.g. ``codebook_size=1024``)."""
    checks.choice("VQ preset", name, VQ_PRESETS)
    known = {f.name for f in fields(VQConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ConfigError(f"unknown VQConfig field(s) {unknown}; allowed: {', '.join(sorted(known))}")
    base = VQ_PRESETS[name]
    return VQConfig(**{**{f: getattr(base, f) for f in known}, **overrides})


def _norm(channels: int, groups: int) -> nn.GroupNorm:
    return nn.GroupNorm(groups, channels, eps=_GN_EPS, affine=True)


class ResBlock(nn.Module):
    """Pre-activation residual block: GN, swish, conv3x3, GN, swish, dropout, conv3x3 (+1x1 shortcut)."""

    def __init__(self, in_ch: int, out_ch: int, groups: int, dropout: float) -> None:
        super().__init__()
        self.norm1 = _norm(in_ch, groups)
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, padding=1)
        self.norm2 = _norm(out_ch, groups)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, padding=1)
        if in_ch != out_ch:
            self.nin_shortcut = nn.Conv2d(in_ch, out_ch, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))  # (B, out, H, W)
        h = self.conv2(self.dropout(F.silu(self.norm2(h))))
        if hasattr(self, "nin_shortcut"):
            x = self.nin_shortcut(x)
        return x + h


class AttnBlock(nn.Module):
    """Single-head self-attention over the H*W positions, scale 1/sqrt(C), with a residual."""

    def __init__(self, channels: int, groups: int) -> None:
        super().__init__()
        self.norm = _norm(channels, groups)
        self.q = nn.Conv2d(channels, channels, 1)
        self.k = nn.Conv2d(channels, channels, 1)
        self.v = nn.Conv2d(channels, channels, 1)
        self.proj_out = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        y = self.norm(x)
        # (B, C, H, W) -> (B, 1, H*W, C): one head whose dim is C, so SDPA's default scale is 1/sqrt(C).
        q, k, v = (t(y).reshape(b, 1, c, h * w).transpose(2, 3) for t in (self.q, self.k, self.v))
        out = F.scaled_dot_product_attention(q, k, v)  # (B, 1, H*W, C)
        out = out.transpose(2, 3).reshape(b, c, h, w)
        return x + self.proj_out(out)


class Downsample(nn.Module):
    """Stride-2 3x3 conv after zero-padding one row/column at the bottom/right only: H -> floor(H / 2)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2, padding=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Asymmetric pad (left, right, top, bottom) = (0, 1, 0, 1): even H -> H/2, odd H -> (H-1)/2.
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Upsample(nn.Module):
    """Nearest x2 upsampling computed in fp32 and cast back (as LlamaGen; older torch lacks bf16 kernels) + 3x3 conv."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        up = F.interpolate(x.float(), scale_factor=2.0, mode="nearest").to(x.dtype)  # (B, C, 2H, 2W)
        return self.conv(up)


class _Level(nn.Module):
    """One resolution level: ``res`` blocks, optional ``attn`` after each, optional resampler."""

    def __init__(self, in_ch: int, out_ch: int, n_res: int, attn: bool, cfg: VQConfig) -> None:
        super().__init__()
        self.res = nn.ModuleList(
            ResBlock(in_ch if i == 0 else out_ch, out_ch, cfg.norm_groups, cfg.dropout) for i in range(n_res)
        )
        if attn:
            self.attn = nn.ModuleList(AttnBlock(out_ch, cfg.norm_groups) for _ in range(n_res))

    def run(self, x: torch.Tensor) -> torch.Tensor:
        for i, block in enumerate(self.res):
            x = block(x)
            if hasattr(self, "attn"):
                x = self.attn[i](x)
        for name in ("downsample", "upsample"):
            if hasattr(self, name):
                x = getattr(self, name)(x)
        return x


def _mid(channels: int, cfg: VQConfig) -> nn.ModuleList:
    return nn.ModuleList(
        [
            ResBlock(channels, channels, cfg.norm_groups, cfg.dropout),
            AttnBlock(channels, cfg.norm_groups),
            ResBlock(channels, channels, cfg.norm_groups, cfg.dropout),
        ]
    )


class Encoder(nn.Module):
    """images (B, 3, H, W) -> latents (B, z_channels, H/ds, W/ds)."""

    def __init__(self, cfg: VQConfig) -> None:
        super().__init__()
        self.conv_in = nn.Conv2d(cfg.in_channels, cfg.ch, 3, padding=1)
        widths = [cfg.ch * m for m in cfg.ch_mult]
        self.conv_blocks = nn.ModuleList()
        in_ch = cfg.ch
        last = len(widths) - 1
        for i, out_ch in enumerate(widths):
            level = _Level(in_ch, out_ch, cfg.num_res_blocks, attn=i == last, cfg=cfg)
            if i != last:
                level.downsample = Downsample(out_ch)
            self.conv_blocks.append(level)
            in_ch = out_ch
        self.mid = _mid(in_ch, cfg)
        self.norm_out = _norm(in_ch, cfg.norm_groups)
        self.conv_out = nn.Conv2d(in_ch, cfg.z_channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)  # (B, ch, H, W)
        for level in self.conv_blocks:
            h = level.run(h)
        for block in self.mid:
            h = block(h)  # (B, ch*ch_mult[-1], H/ds, W/ds)
        return self.conv_out(F.silu(self.norm_out(h)))  # (B, z_channels, H/ds, W/ds)


class Decoder(nn.Module):
    """latents (B, z_channels, h, w) -> images (B, 3, h*ds, w*ds); levels stored widest first."""

    def __init__(self, cfg: VQConfig) -> None:
        super().__init__()
        widths = [cfg.ch * m for m in reversed(cfg.ch_mult)]
        in_ch = widths[0]
        self.conv_in = nn.Conv2d(cfg.z_channels, in_ch, 3, padding=1)
        self.mid = _mid(in_ch, cfg)
        self.conv_blocks = nn.ModuleList()
        last = len(widths) - 1
        for i, out_ch in enumerate(widths):
            level = _Level(in_ch, out_ch, cfg.num_res_blocks + 1, attn=i == 0, cfg=cfg)
            if i != last:
                level.upsample = Upsample(out_ch)
            self.conv_blocks.append(level)
            in_ch = out_ch
        self.norm_out = _norm(in_ch, cfg.norm_groups)
        self.conv_out = nn.Conv2d(in_ch, cfg.in_channels, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(z)  # (B, ch*ch_mult[-1], h, w)
        for block in self.mid:
            h = block(h)
        for level in self.conv_blocks:
            h = level.run(h)  # doubles H, W except at the last level
        return self.conv_out(F.silu(self.norm_out(h)))  # (B, 3, h*ds, w*ds)


class VectorQuantizer(nn.Module):
    """The codebook. ``codebook_used`` is a rolling record of the last 65536 code ids chosen in training mode.

    It is updated (as float ids, like the official files) only while ``self.training`` is true and only
    serves as a usage statistic; evaluation and decoding never read it.
    """

    def __init__(self, cfg: VQConfig) -> None:
        super().__init__()
        self.l2_norm = cfg.l2_norm
        self.register_buffer("codebook_used", torch.zeros(CODEBOOK_USED_SIZE), persistent=True)
        self.embedding = nn.Embedding(cfg.codebook_size, cfg.codebook_embed_dim)
        # Small uniform init, as LlamaGen does, so unnormalised codebooks start near the latents' scale.
        nn.init.uniform_(self.embedding.weight, -1.0 / cfg.codebook_size, 1.0 / cfg.codebook_size)

    def codebook(self) -> torch.Tensor:
        """(K, D) code vectors as used for lookup: l2-normalised rows when ``l2_norm``."""
        w = self.embedding.weight
        return F.normalize(w, p=2, dim=-1) if self.l2_norm else w

    def nearest(self, z: torch.Tensor) -> torch.Tensor:
        """Code ids (B, h, w) nearest (Euclidean) to latents z (B, D, h, w), in the normalised space when l2_norm."""
        flat = z.permute(0, 2, 3, 1).reshape(-1, z.shape[1])  # (B*h*w, D)
        book = self.codebook().to(flat.dtype)  # (K, D)
        if self.l2_norm:
            # Unit vectors: argmin ||z - e||^2 = argmax <z, e>, which avoids cancellation in |z|^2 + |e|^2 - 2<z, e>.
            ids = (F.normalize(flat, p=2, dim=-1) @ book.t()).argmax(dim=-1)
        else:
            dist = flat.pow(2).sum(-1, keepdim=True) + book.pow(2).sum(-1) - 2.0 * flat @ book.t()  # (B*h*w, K)
            ids = dist.argmin(dim=-1)
        return ids.view(z.shape[0], z.shape[2], z.shape[3])

    @torch.no_grad()
    def record_usage(self, ids: torch.Tensor) -> None:
        """Shift ``ids`` into the rolling ``codebook_used`` window (most recent at the end)."""
        ids = ids.reshape(-1)[-CODEBOOK_USED_SIZE:].to(self.codebook_used.dtype)
        n = ids.numel()
        self.codebook_used.copy_(torch.cat([self.codebook_used[n:], ids]))


class VQModel(nn.Module):
    """LlamaGen VQ tokenizer; ``state_dict()`` matches the official ``vq_ds{8,16}_*.pt`` layouts."""

    def __init__(self, config: VQConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.quantize = VectorQuantizer(config)
        self.quant_conv = nn.Conv2d(config.z_channels, config.codebook_embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(config.codebook_embed_dim, config.z_channels, 1)

    def _check_images(self, images: torch.Tensor) -> None:
        ds, c = self.config.downsample, self.config.in_channels
        if images.ndim != 4 or images.shape[1] != c:
            raise ConfigError(f"VQ expects images shaped (B, {c}, H, W), got {tuple(images.shape)}")
        if images.shape[2] % ds or images.shape[3] % ds:
            raise ConfigError(
                f"image size {images.shape[2]}x{images.shape[3]} is not divisible by the VQ downsample factor {ds}"
            )

    def latents(self, images: torch.Tensor) -> torch.Tensor:
        """images (B, 3, H, W) in [-1, 1] -> pre-quantisation latents (B, D, H/ds, W/ds)."""
        self._check_images(images)
        return self.quant_conv(self.encoder(images))

    def quantize_latents(
        self, z: torch.Tensor, beta: float = COMMITMENT_BETA
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """Quantise latents z (B, D, h, w).

        Returns ``(z_q, codes, losses)``: z_q (B, D, h, w) carries the straight-through gradient to z,
        codes (B, h, w) int64, losses ``{"codebook": ||sg[z] - e||^2, "commitment": beta * ||z - sg[e]||^2}``
        (means over elements, computed in the normalised space when ``l2_norm``).
        """
        if self.config.l2_norm:
            z = F.normalize(z, p=2, dim=1)  # unit vectors along the embedding dim
        codes = self.quantize.nearest(z)  # (B, h, w)
        e = F.embedding(codes, self.quantize.codebook()).permute(0, 3, 1, 2).to(z.dtype)  # (B, D, h, w)
        losses = {"codebook": F.mse_loss(e, z.detach()), "commitment": beta * F.mse_loss(z, e.detach())}
        if self.training:
            self.quantize.record_usage(codes)
        z_q = z + (e - z).detach()  # forward value e, gradient flows to z
        return z_q, codes, losses

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """images (B, 3, H, W) in [-1, 1], H and W divisible by ``downsample`` -> codes (B, H/ds, W/ds) int64."""
        return self.quantize.nearest(self.latents(images))  # nearest() normalises z itself when l2_norm

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Training pass: images (B, 3, H, W) -> (reconstruction (B, 3, H, W), losses).

        ``losses`` holds ``"reconstruction"`` (MSE to the input), ``"codebook"`` and ``"commitment"``;
        their sum is the plain VQ-VAE objective (the adversarial/perceptual terms are left to the trainer).
        """
        z_q, _, losses = self.quantize_latents(self.latents(images))
        recon = self.decoder(self.post_quant_conv(z_q))  # (B, 3, H, W)
        losses = {"reconstruction": F.mse_loss(recon, images), **losses}
        return recon, losses

    def codebook(self) -> torch.Tensor:
        """(codebook_size, embed_dim) code vectors used for lookup and decoding (l2-normalised if ``l2_norm``)."""
        return self.quantize.codebook()

    def raw_codebook(self) -> torch.Tensor:
        """(codebook_size, embed_dim) stored embedding rows, not normalised."""
        return self.quantize.embedding.weight

    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """codes (B, N) in raster order with N a perfect square, or (B, h, w) -> images (B, 3, h*ds, w*ds) ~[-1, 1]."""
        codes = checks.code_grid(codes, self.config.codebook_size)  # (B, h, w)
        e = F.embedding(codes, self.codebook()).permute(0, 3, 1, 2)  # (B, D, h, w)
        return self.decoder(self.post_quant_conv(e))  # (B, 3, h*ds, w*ds)
