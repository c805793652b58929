"""2D rotary position embedding as used by LlamaGen.

Image token ``n`` on a ``G x G`` grid sits at row ``n // G`` and column ``n % G``. With
``half = head_dim // 2`` the frequencies are ``base ** (-2k / half)`` for ``k < half // 2`` and the
angle vector of a token is ``[row * freqs, col * freqs]`` (``half`` angles, one per interleaved pair
of channels ``(2j, 2j + 1)``). The ``cls_token_num`` condition positions get ``cos = sin = 0``: their
queries and keys become exactly zero. The released weights were trained that way, so this is kept.
"""

from __future__ import annotations

import torch


def rope_table_2d(grid_size: int, head_dim: int, cls_token_num: int, base: float = 10000.0) -> torch.Tensor:
    """Return the ``(cls_token_num + grid_size**2, head_dim // 2, 2)`` table of ``[cos, sin]`` (fp32)."""
    half = head_dim // 2
    freqs = 1.0 / (base ** (torch.arange(0, half, 2)[: half // 2].float() / half))  # (half/2,)
    coords = torch.arange(grid_size, dtype=torch.float32)
    per_axis = torch.outer(coords, freqs)  # (G, half/2)
    angles = torch.cat(
        [
            per_axis[:, None, :].expand(grid_size, grid_size, -1),  # row angles
            per_axis[None, :, :].expand(grid_size, grid_size, -1),  # column angles
        ],
        dim=-1,
    ).reshape(grid_size * grid_size, -1)  # (G*G, half)
    image = torch.stack([angles.cos(), angles.sin()], dim=-1)  # (G*G, half, 2)
    cond = torch.zeros(cls_token_num, image.shape[1], 2)
    return torch.cat([cond, image], dim=0)


def rope_rows(table: torch.Tensor) -> torch.Tensor:
    """The rows ``table`` (S, hd/2, 2) or (B, S, hd/2, 2) of a forward, ready for every layer's :func:`apply_rope`:
    eagerly as complex angles (S, 1, hd/2) or (B, S, 1, hd/2), built once a forward instead of once a layer;
    compiled, unchanged (Inductor has no complex numbers)."""
    if torch.compiler.is_compiling():
        return table
    return torch.view_as_complex(table.contiguous()).unsqueeze(-2)


def apply_rope(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved channel pairs of ``x`` (B, S, H, hd) by ``table``: (S, hd/2, 2) or (B, S, hd/2, 2), or
    those rows as :func:`rope_rows` prepares them (complex).

    Pair ``(x0, x1)`` becomes ``(x0 cos - x1 sin, x1 cos + x0 sin)``, computed as one complex product
    in fp32 and cast back, as in the reference (few operations: this runs twice per layer and step).
    """
    if torch.compiler.is_compiling():
        # Inductor has no code generation for complex numbers: the same product written out in reals
        # (the reference's own formula), which it fuses into one kernel.
        pairs = x.float().reshape(*x.shape[:-1], -1, 2)  # (B, S, H, hd/2, 2)
        rot = table.unsqueeze(-3)  # (S, 1, hd/2, 2) or (B, S, 1, hd/2, 2)
        cos, sin = rot[..., 0], rot[..., 1]
        real = pairs[..., 0] * cos - pairs[..., 1] * sin
        imag = pairs[..., 1] * cos + pairs[..., 0] * sin
        return torch.stack([real, imag], dim=-1).flatten(3).type_as(x)
    angles = table if table.is_complex() else rope_rows(table)  # (S, 1, hd/2) or (B, S, 1, hd/2)
    fp32 = x.dtype == torch.float32  # then the casts are no-ops: skipped (two dispatches a layer)
    pairs = torch.view_as_complex((x if fp32 else x.float()).reshape(*x.shape[:-1], -1, 2))  # (B, S, H, hd/2)
    rotated = torch.view_as_real(pairs * angles).flatten(3)
    return rotated if fp32 else rotated.type_as(x)
