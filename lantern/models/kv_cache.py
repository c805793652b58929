"""A static, preallocated key/value cache.

The cache is allocated once per generation with room for the whole sequence (plus any scratch
slots a speculative decoder asks for). Writing, accepting and rejecting tokens only index into it;
nothing is reallocated while decoding. Keys are stored after RoPE.
"""

from __future__ import annotations

import torch


class KVCache:
    """Keys and values for every layer: ``k``, ``v`` of shape (n_layer, B, H, max_len, head_dim)."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor):
        if k.shape != v.shape or k.dim() != 5:
            raise ValueError(f"k and v must share a 5-d shape, got {tuple(k.shape)} and {tuple(v.shape)}")
        self.k = k
        self.v = v

    @classmethod
    def allocate(
        cls,
        n_layer: int,
        batch: int,
        n_head: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> KVCache:
        """Zero-filled cache for ``batch`` rows and ``max_len`` slots."""
        shape = (n_layer, batch, n_head, max_len, head_dim)
        return cls(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    def layer(self, index: int) -> LayerCache:
        """View of one layer's slots, handed to that layer's attention."""
        return LayerCache(self.k[index], self.v[index])

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy slots ``src`` to ``dst`` in every layer, per row: ``src``, ``dst`` are (B, n) long.

        Used after a speculative step to move the accepted path's entries into contiguous positions.
        ``src`` and ``dst`` may overlap when ``dst <= src`` elementwise (values are gathered first).
        """
        n_layer, batch, n_head, _, head_dim = self.k.shape
        index = src[None, :, None, :, None].expand(n_layer, batch, n_head, src.shape[1], head_dim)
        target = dst[None, :, None, :, None].expand_as(index)
        for cache in (self.k, self.v):
            cache.scatter_(3, target, cache.gather(3, index))


class LayerCache:
    """One layer's slice of a :class:`KVCache`; attention writes new keys and reads the prefix."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor):
        self.k = k  # (B, H, L, hd)
        self.v = v

    def update(
        self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor, length: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``k``, ``v`` (B, H, S, hd) at per-row ``slots`` (B, S) and return the first ``length`` slots.

        Rows may write different slots (speculative rows accept different numbers of tokens).
        """
        index = slots[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[3])  # (B, H, S, hd)
        self.k.scatter_(2, index, k)
        self.v.scatter_(2, index, v)
        return self.k[:, :, :length], self.v[:, :, :length]


class NoCache:
    """Stand-in for training and teacher forcing: attention sees exactly the keys it was given."""

    def layer(self, index: int) -> NoCache:
        return self

    def update(
        self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor, length: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return k, v
