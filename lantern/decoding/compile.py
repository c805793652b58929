"""The ``compile`` knob: how decode steps run (eager, or ``torch.compile(fullgraph=True)``).

Modes are torch.compile's: ``default``, ``reduce-overhead`` (CUDA graphs; CUDA only) and
``max-autotune``; ``none`` runs eagerly. A speed-up is only meaningful against a baseline compiled
the same way, so decoders and their AR baseline take the same knob and records say which it was.
"""

from __future__ import annotations

import shutil

import torch
import torch._dynamo

from lantern import checks
from lantern.errors import ConfigError

COMPILE_MODES = ("none", "default", "reduce-overhead", "max-autotune")


def check_compile(mode: str, device: torch.device | str | None = None, backend: str = "inductor") -> str:
    """``mode`` if it can run on ``device`` (None: any) with this torch build, else a ConfigError naming why."""
    checks.choice("compile", mode, COMPILE_MODES)
    if mode == "none" or device is None:
        return mode
    device = torch.device(device)
    if not torch._dynamo.is_dynamo_supported():
        raise ConfigError(
            f"compile={mode} needs torch.compile, which this Python/torch build does not support; use compile=none"
        )
    if mode == "reduce-overhead" and device.type != "cuda":
        raise ConfigError(
            f"compile=reduce-overhead captures CUDA graphs and needs device=cuda (got device={device.type}); "
            "use compile=default on the CPU"
        )
    if backend == "inductor" and device.type == "cpu" and shutil.which("g++") is None and shutil.which("c++") is None:
        raise ConfigError(
            f"compile={mode} on the CPU needs a C++ compiler (g++) for Inductor; install one or use compile=none"
        )
    return mode


def compiled(fn, mode: str, backend: str = "inductor"):
    """``fn`` compiled with ``fullgraph=True`` as ``mode`` says (``fn`` itself for ``none``).

    ``backend`` other than ``inductor`` (``eager``, ``aot_eager``) only checks capture: tests use it.
    """
    if mode == "none":
        return fn
    # Dynamo keeps its compiled graphs per function; every decoder (structure, rule, batch shape)
    # is a specialisation of the same step function, and a test session builds many decoders.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit, 4096)
    options = {"fullgraph": True, "dynamic": False, "backend": backend}
    if backend == "inductor" and mode != "default":
        options["mode"] = mode
    return torch.compile(fn, **options)


def mark_static(*tensors: torch.Tensor) -> None:
    """Tell Dynamo these buffers keep their address for the whole run (caches: CUDA graphs may mutate them)."""
    for tensor in tensors:
        torch._dynamo.mark_static_address(tensor)
