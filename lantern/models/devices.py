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


def needed(flag: torch.Tensor) -> bool:
    """Whether work that matters only where ``flag`` (bool, any shape) is set has to run.

    Eagerly on the CPU it reads ``flag.any()``: there a tensor is host memory and reading it waits for
    nothing, so a step may skip a tree level or a sibling no row reaches. Compiled, or on a GPU, it is
    ``True`` without reading (a graph holds the work, and a GPU read would wait for the device). Skipping is
    only used for work whose results every row then discards (``where`` on the flag), so a step's outputs,
    shapes and compiled graph are the same either way.
    """
    if torch.compiler.is_compiling() or flag.device.type != "cpu":
        return True
    return bool(flag.any())


def share(flag: torch.Tensor) -> str:
    """``"none"``, ``"all"`` or ``"some"``: how many entries of ``flag`` (bool) are set, read as :func:`needed`
    reads it (eagerly on the CPU, one read); ``"some"`` compiled or on a GPU. Where it says ``"all"`` a step may
    drop its ``where(flag, ...)`` selections (they would pick every row's new value), where ``"none"`` the work."""
    if torch.compiler.is_compiling() or flag.device.type != "cpu":
        return "some"
    count = int(flag.sum())
    return "none" if count == 0 else "all" if count == flag.numel() else "some"
