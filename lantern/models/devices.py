"""Devices and dtypes by name, as configs spell them (``cuda:1``, ``bfloat16``), checked with one-line errors.

Its own module so that metrics, drafters and scripts can resolve a device without importing the model
bundle (which imports the speculative decoders).
"""

from __future__ import annotations

import torch

from lantern import checks

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    """``cpu``, ``cuda`` or ``cuda:N`` -> torch.device; ConfigError when unknown or unavailable."""
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as exc:
        raise checks.refuse("device", name, "cpu, cuda or cuda:N") from exc
    if device.type not in ("cpu", "cuda"):
        raise checks.refuse("device", name, "cpu, cuda or cuda:N")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise checks.refuse("device", name, "cpu", "CUDA is not available on this machine")
    return device


def resolve_dtype(name: str) -> torch.dtype:
    """``float32`` / ``bfloat16`` / ``float16`` -> torch.dtype; ConfigError otherwise."""
    return DTYPES[checks.choice("dtype", name, DTYPES)]
