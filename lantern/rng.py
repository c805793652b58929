"""Counter-based random numbers: a pure function of (sample key, step, stream, index).

Every sample owns a 64-bit key derived from ``(seed, prompt index)``; a uniform number is a hash of
that key, the decoding step, a stream id (what the number is for) and its index. So an image never
depends on batch size, batch composition, sharding or device, and drawing needs no generator state
and no host synchronisation. The hash works on 32-bit lanes held in int64 tensors. A product with a
32-bit constant ``c`` uses ``c`` or ``c - 2**32``, whichever is below ``2**31`` in magnitude: both agree
mod ``2**32``, and a 32-bit lane times it stays inside int64, so no intermediate overflows and one
multiply and one mask give the low 32 bits (two ops; the hash is op-bound on small tensors).
"""

from __future__ import annotations

import torch

_MASK32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9

# Stream ids: one per purpose, so numbers for different uses never coincide.
SAMPLE = 1
ACCEPT = 2
# 3: unused since the residual draw became part of LEVEL; not reassigned, so old streams never recur.
DRAFT = 4
LEVEL = 5  # the per-level target draw of a tree walk
# Speculative Jacobi decoding (lantern/decoding/jacobi/step.py); step = the row's decided count.
JACOBI_ACCEPT = 6  # the test of each window draft
JACOBI_DRAFT = 7  # Jacobi redraws of the untested window positions
JACOBI_RESIDUAL = 8  # the token drawn at the first rejection (or after a full window)
JACOBI_INIT = 9  # uniform codes initialising fresh window slots
TRAIN_COND_DROPOUT = (
    10  # drafter training data: whether a row takes the null condition (lantern/training/drafter_features.py)
)
JACOBI_COUPLE = 11  # MC-SJD's Gumbel coupling: step = the image token's index (fixed noise per token)
VVS_PATH = 12  # VVS: the draft path a verification-skipping step commits (step = the row's decided count)
AUDIT = 13  # the Monte Carlo TV audit's reruns of a step (lantern/decoding/audit.py): keys of independent reruns


def _signed(c: int) -> int:
    """``c`` (a 32-bit constant) as the residue mod ``2**32`` of magnitude below ``2**31``."""
    c &= _MASK32
    return c - (1 << 32) if c >= 1 << 31 else c


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``(x * c) mod 2**32`` for ``x`` in [0, 2**32): ``|x * signed(c)| < 2**63``, and the mask of a negative
    int64 (two's complement) keeps the same low 32 bits."""
    return (x * _signed(c)) & _MASK32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser with good avalanche (xor-shift-multiply)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def sample_key(seed: int, index: int) -> int:
    """The 64-bit key of sample ``index`` under ``seed`` (computed on the host, once per image)."""
    x = (seed * 0x9E3779B97F4A7C15 + index * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) & ((1 << 64) - 1)
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & ((1 << 64) - 1)
    x ^= x >> 31
    return x >> 1  # 63 bits: fits a signed int64 tensor


def keys_tensor(seed: int, indices, device: torch.device | str = "cpu") -> torch.Tensor:
    """Keys (B,) int64 of the samples ``indices`` under ``seed``."""
    return torch.tensor([sample_key(seed, int(i)) for i in indices], dtype=torch.long, device=device)


def bits(keys: torch.Tensor, step, stream: int, n: int) -> torch.Tensor:
    """32-bit hashes (B, n) in int64 lanes of ``(keys[b], step, stream, j)`` (what :func:`uniform` scales)."""
    step = torch.as_tensor(step, dtype=torch.long, device=keys.device).expand(keys.shape)
    base = _mix32(keys & _MASK32)
    base = _mix32(base ^ (keys >> 32))
    base = _mix32(base ^ (step & _MASK32))
    base = _mix32(base ^ ((stream * _GOLDEN) & _MASK32))  # (B,); the stream's constant on the host
    index = _mul32(torch.arange(n, device=keys.device, dtype=torch.long), _GOLDEN)  # (n,)
    return _mix32(_mix32((base[:, None] + index[None, :]) & _MASK32) ^ base[:, None])  # (B, n)


def _unit(hashed: torch.Tensor) -> torch.Tensor:
    """32-bit hashes -> float32 uniforms in (0, 1) from their top 24 bits."""
    return ((hashed >> 8).float() + 0.5) * (1.0 / (1 << 24))


def uniform(keys: torch.Tensor, step, stream: int, n: int) -> torch.Tensor:
    """Uniform numbers in (0, 1), shape (B, n) float32, for ``keys`` (B,) at ``step`` (int or (B,)).

    Number ``j`` of row ``b`` depends only on ``(keys[b], step, stream, j)``.
    """
    return _unit(bits(keys, step, stream, n))


def uniforms(keys: torch.Tensor, step, streams) -> list[torch.Tensor]:
    """:func:`uniform` of several ``streams`` ((stream, n), ...) at one ``step``, each (B, n): the same numbers,
    hashed in one pass (the key and step are mixed once for all streams: a tree walk draws two streams a step)."""
    if len(streams) == 1:
        return [uniform(keys, step, *streams[0])]
    step = torch.as_tensor(step, dtype=torch.long, device=keys.device).expand(keys.shape)
    base = _mix32(keys & _MASK32)
    base = _mix32(base ^ (keys >> 32))
    base = _mix32(base ^ (step & _MASK32))  # (B,)
    sizes = [n for _, n in streams]
    constants = torch.tensor([(stream * _GOLDEN) & _MASK32 for stream, _ in streams], device=keys.device)
    mixed = _mix32(base[:, None] ^ constants)  # (B, S) one base per stream
    per = torch.cat([mixed[:, i : i + 1].expand(-1, n) for i, n in enumerate(sizes)], dim=1)  # (B, sum n)
    numbers = _mul32(torch.arange(max(sizes), device=keys.device, dtype=torch.long), _GOLDEN)
    index = torch.cat([numbers[:n] for n in sizes])[None, :]  # (1, sum n) each stream's own indices
    return list(_unit(_mix32(_mix32((per + index) & _MASK32) ^ per)).split(sizes, dim=1))


def derived_keys(keys: torch.Tensor, step, stream: int, n: int) -> torch.Tensor:
    """``n`` new 63-bit sample keys per row (B, n) int64, functions of ``(keys[b], step, stream, j)``: the keys of
    independent reruns of a sample's randomness (the Monte Carlo TV audit)."""
    lanes = bits(keys, step, stream, 2 * n).view(keys.shape[0], n, 2)
    return ((lanes[..., 0] & 0x7FFFFFFF) << 32) | lanes[..., 1]
