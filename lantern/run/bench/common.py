"""What the benchmarks share: what a decoder actually ran with, and the output check (timing: lantern.run.timing.timed)."""

from __future__ import annotations

import os
from pathlib import Path

from lantern import REPO_ROOT
from lantern.files import write_json_atomic


def _dtype(module) -> str | None:
    parameter = next(iter(module.parameters()), None) if module is not None else None
    return None if parameter is None else str(parameter.dtype).removeprefix("torch.")


def ran_with(decoder, target) -> dict:
    """How ``decoder`` ran on ``target``, read from the objects themselves (not from what was asked):
    its steps' compile mode, the target's (and drafter's) dtype, and its attention kernel (``fast``:
    PyTorch's default SDPA kernel, what every decoder without an ``attention`` setting runs)."""
    settings = decoder.settings
    ran = {"compile": settings.compile, "dtype": _dtype(target), "attention": getattr(settings, "attention", "fast")}
    drafter = getattr(decoder, "drafter", None)
    if drafter is not None:
        ran["drafter_dtype"] = _dtype(drafter)
    return ran


def check_writable(path: Path) -> None:
    """Create ``path``'s folder and prove a file can be written there, before hours of timing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"status": "benchmark running; this file is replaced by its results"})


def repo_relative(text: str) -> str:
    """``text`` (a path, or an override holding one) with this checkout's absolute paths written relative to
    the repository (``worlds/...``, ``../ref/LANTERN``), so a committed result names no machine's folders."""
    root = str(REPO_ROOT.resolve())
    if os.path.isabs(text):
        return os.path.relpath(text, root)
    key, sep, value = text.partition("=")
    return f"{key}={os.path.relpath(value, root)}" if sep and os.path.isabs(value) else text
