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


def inductor_options(mode: str, device_type: str) -> dict:
    """torch.compile's keyword arguments for an Inductor ``mode`` on a device type.

    On the CPU the graph's host code is C++ (Inductor's ``cpp_wrapper``): the Python wrapper that otherwise
    calls a decode step's few hundred kernels cost 1.0 ms of a 6.2 ms world AR step and 2.3 ms of a
    speculative step, profiled (docs/speed.md). The kernels are the same, so the tokens are too. CUDA
    keeps torch.compile's own mode (``reduce-overhead`` replays CUDA graphs).
    """
    if device_type != "cpu":
        return {} if mode == "default" else {"mode": mode}
    return {"options": {"cpp_wrapper": True, "max_autotune": mode == "max-autotune"}}


class Compiled:
    """A step function compiled with ``fullgraph=True`` once per device type it is called on.

    Calls are ``step(ctx, state, *rest)``. The first call for each ``(ctx, *rest)`` runs Dynamo's guards
    (it may compile); later calls for the same context and arguments run under
    ``skip_guard_eval_unsafe``, so Dynamo only evaluates the guards that tell its cache entries apart
    (which step, which context's rule and shapes) rather than every guard on every model parameter
    (0.6 ms of a world AR step, 0.8-1.1 ms of a speculative step that shares its code with other decoders,
    profiled). That is safe here because a context fixes the models, caches and shapes, and a state of a
    context always has the same tensor shapes and dtypes: nothing a skipped guard checks can change
    between calls with the same key. ``ctx`` must be the same object for the whole decode.
    """

    def __init__(self, fn, mode: str, backend: str):
        self.fn, self.mode, self.backend = fn, mode, backend
        self._by_device: dict[str, object] = {}  # device type -> the compiled step
        # id(ctx) -> (ctx, its states' device type, the argument tuples whose first call ran guarded);
        # ctx is held so its id is not reused
        self._contexts: dict[int, tuple[object, str, set]] = {}

    def _build(self, device_type: str):
        # Dynamo keeps its compiled graphs per function; every decoder (structure, rule, batch shape)
        # is a specialisation of the same step function, and a test session builds many decoders.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit, 4096)
        options = {"fullgraph": True, "dynamic": False, "backend": self.backend}
        if self.backend == "inductor":
            options.update(inductor_options(self.mode, device_type))
        return torch.compile(self.fn, **options)

    def captured(self, ctx, *rest) -> bool:
        """Whether a call with ``ctx`` and ``rest`` has run (its graph is built; later calls only replay it)."""
        known = self._contexts.get(id(ctx))
        return known is not None and rest in known[2]

    def __call__(self, ctx, state, *rest):
        known = self._contexts.get(id(ctx))
        if known is None:  # a context's states stay on one device
            known = self._contexts[id(ctx)] = (ctx, _device_type(state), set())
        _, device_type, seen = known
        step = self._by_device.get(device_type)
        if step is None:
            step = self._by_device[device_type] = self._build(device_type)
        if rest not in seen:
            out = step(ctx, state, *rest)
            seen.add(rest)
            return out
        with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
            return step(ctx, state, *rest)


def _device_type(state) -> str:
    """The device type of the first tensor in ``state`` (a tensor or a tuple of them; CPU if none)."""
    for leaf in state if isinstance(state, tuple) else (state,):
        if isinstance(leaf, torch.Tensor):
            return leaf.device.type
        if isinstance(leaf, tuple):
            return _device_type(leaf)
    return "cpu"


def compiled(fn, mode: str, backend: str = "inductor"):
    """``fn(ctx, state, *rest)`` compiled with ``fullgraph=True`` as ``mode`` says (``fn`` itself for ``none``);
    see :class:`Compiled`.

    ``backend`` other than ``inductor`` (``eager``, ``aot_eager``) only checks capture: tests use it.
    """
    if mode == "none":
        return fn
    return Compiled(fn, mode, backend)


def mark_static(*tensors: torch.Tensor) -> None:
    """Tell Dynamo these buffers keep their address for the whole run (caches: CUDA graphs may mutate them)."""
    for tensor in tensors:
        torch._dynamo.mark_static_address(tensor)
