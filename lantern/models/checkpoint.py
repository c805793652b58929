"""Strict loading of model weights in the official LlamaGen formats.

Released LlamaGen files are ``torch.save({"model": state_dict})`` (FSDP-saved ones are a raw
state dict), fp32, tensors only. We load with ``weights_only=True``, accept both wrappers and
safetensors files, ignore only a stray ``freqs_cis`` buffer, and refuse any other mismatch with
one message naming the missing, unexpected and wrongly shaped keys.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Mapping

import torch
from torch import nn

from lantern.errors import CheckpointError, one_line
from lantern.files import note_input

IGNORED_KEYS = frozenset({"freqs_cis"})
_MAX_LISTED = 4
# torch names the first class or function a weights-only load refused in one of these phrasings.
_REFUSED_GLOBAL = re.compile(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) ([\w.]+)")


def unreadable_reason(exc: BaseException) -> str:
    """Why torch/safetensors could not read a weights file, in one short line.

    A pickle holding more than tensors (training arguments, a whole module, or code) is refused by
    ``weights_only=True``; the message then names the offending global and how to fix the file.
    """
    text = str(exc)
    refused = _REFUSED_GLOBAL.search(text)
    if refused:
        return (
            f"it holds a pickled {refused.group(1)}, not only tensors, and is not loaded (a pickle can run code); "
            "re-save the state dict alone: torch.save(model.state_dict(), path)"
        )
    return one_line(text.strip().splitlines()[0] if text.strip() else type(exc).__name__, 200)


def read_tensors(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The state dict in ``path`` (see :func:`read_state_dict`), without noting the file as an input: for
    callers that note a whole folder instead (the shards of an HF-layout folder)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint file not found: {path!r}")
    try:
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file

            obj = load_file(path, device="cpu")
        else:
            with warnings.catch_warnings():  # torch warns about refused pickles; the error line below says it
                warnings.simplefilter("ignore")
                obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure to parse means "not a checkpoint"
        raise CheckpointError(f"{path!r} is not a readable checkpoint: {unreadable_reason(exc)}") from exc
    if isinstance(obj, Mapping):
        for wrapper in ("model", "state_dict"):
            if wrapper in obj and isinstance(obj[wrapper], Mapping):
                obj = obj[wrapper]
                break
    if (
        not isinstance(obj, Mapping)
        or not obj
        or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items())
    ):
        raise CheckpointError(
            f"{path!r} is not a state dict: expected a mapping of names to tensors, "
            f'optionally wrapped as {{"model": state_dict}}'
        )
    return dict(obj)


def read_state_dict(path: str | os.PathLike, role: str = "weights") -> dict[str, torch.Tensor]:
    """Read a state dict from ``path`` (``.pt``/``.pth``/``.bin`` via torch, ``.safetensors``).

    Accepts ``{"model": sd}``, ``{"state_dict": sd}`` or a raw ``{name: tensor}`` dict.
    Raises :class:`CheckpointError` when the file is missing or is not a checkpoint. The file is noted as
    an input of the current job under ``role`` (:func:`lantern.files.note_input`).
    """
    state_dict = read_tensors(path)
    note_input(path, role)
    return state_dict


def _listing(names: list[str]) -> str:
    shown = ", ".join(names[:_MAX_LISTED])
    more = len(names) - _MAX_LISTED
    return shown + (f" (+{more} more)" if more > 0 else "")


def check_shapes(
    own: Mapping[str, tuple[int, ...]], state_dict: Mapping[str, torch.Tensor], expected: str, source: str
) -> None:
    """Raise :class:`CheckpointError` unless ``state_dict`` has exactly the names of ``own`` (name -> shape),
    each with that shape; the message names the missing, unexpected and wrongly shaped keys.

    ``expected`` names the architecture (e.g. ``"GPT-B c2i"``) and ``source`` the file, for the message.
    """
    given = {k: v for k, v in state_dict.items() if k not in IGNORED_KEYS}
    missing = sorted(k for k in own if k not in given)
    unexpected = sorted(k for k in given if k not in own)
    wrong = [
        f"{k} {tuple(given[k].shape)} != {tuple(own[k])}"
        for k in own
        if k in given and tuple(given[k].shape) != tuple(own[k])
    ]
    problems = []
    if missing:
        problems.append(f"missing {len(missing)}: {_listing(missing)}")
    if unexpected:
        problems.append(f"unexpected {len(unexpected)}: {_listing(unexpected)}")
    if wrong:
        problems.append(f"wrong shape {len(wrong)}: {_listing(wrong)}")
    if problems:
        raise CheckpointError(f"{source!r} does not match {expected}: " + "; ".join(problems))


def check_state_dict(module: nn.Module, state_dict: Mapping[str, torch.Tensor], expected: str, source: str) -> None:
    """Raise :class:`CheckpointError` unless ``state_dict`` matches ``module`` name for name and shape
    (:func:`check_shapes`)."""
    check_shapes({k: tuple(v.shape) for k, v in module.state_dict().items()}, state_dict, expected, source)


def load_weights(module: nn.Module, path: str | os.PathLike, expected: str, role: str = "weights") -> nn.Module:
    """Load ``path`` into ``module`` strictly (see :func:`check_state_dict`); returns ``module``."""
    state_dict = read_state_dict(path, role)
    check_state_dict(module, state_dict, expected, os.fspath(path))
    module.load_state_dict({k: v for k, v in state_dict.items() if k not in IGNORED_KEYS}, strict=True)
    return module
