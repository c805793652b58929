"""What every decoder returns."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class DecodeResult:
    """Image token codes (B, N) in raster order, per-batch counters (e.g. target forwards, phase times)
    and per-sample CPU tensors with a leading batch dimension: ``steps`` (target steps after the
    first token) and ``tokens`` (tokens they produced), plus decoder-specific ones (a speculative
    decoder adds ``histogram`` (B, D+1), ``tv_realised_sum``, ``tv_realised_max``, ``tv_measured``,
    ``merged_sum``, ``merged_max`` and ``accepted_drafts``).
    """

    codes: torch.Tensor
    stats: dict[str, float] = field(default_factory=dict)
    per_sample: dict[str, torch.Tensor] = field(default_factory=dict)
