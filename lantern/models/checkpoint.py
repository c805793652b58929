"""Strict loading of model weights, and HF-layout folders read and written for every family.

Weight files: ``torch.save({"model": state_dict})`` (LlamaGen's releases; FSDP-saved ones are a raw
state dict), ``{"state_dict": ...}`` or safetensors, tensors only. We load with ``weights_only=True``,
accept both wrappers, ignore only a stray ``freqs_cis`` buffer, and refuse any other mismatch with
one message naming the missing, unexpected and wrongly shaped keys.

HF-layout folders (``config.json`` and the weights it describes, one file or shards): read and written
here with no family's names (:func:`read_folder`, :func:`write_folder`), and their ``config.json``
compared to what a family expects key by key (:func:`check_folder_keys`); each family says which keys.
"""

from __future__ import annotations

import json
import math
import os
import re
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from torch import nn

from lantern import checks
from lantern.errors import CheckpointError, ConfigError, one_line
from lantern.files import note_input, write_folder_atomic

IGNORED_KEYS = frozenset({"freqs_cis"})
# HF-layout folders (a config.json and the weights it describes), read by every family's loaders.
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
# Weight files in the order HF's loaders try them; each may instead be sharded under NAME.index.json.
WEIGHT_FILES = (WEIGHTS_NAME, "pytorch_model.bin")
INDEX_SUFFIX = ".index.json"
# Buffers that older transformers versions saved beside the weights; they hold no weights.
STRAY_SUFFIXES = (".rotary_emb.inv_freq",)
TOKENIZER_NAME = "tokenizer.json"  # a folder's prompt tokenizer (the ``tokenizers`` library's file)
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


# ----- HF-layout folders -------------------------------------------------------------------------------
def folder_source(folder) -> str:
    """How messages name an HF-layout folder."""
    return f"HF folder {os.fspath(folder)!r}"


def check_hf_folder(folder: str | os.PathLike) -> Path:
    """``folder`` as a Path; CheckpointError unless it holds a ``config.json`` (a folder of anything else
    is not a model)."""
    folder = Path(folder)
    if not (folder / CONFIG_NAME).is_file():
        raise CheckpointError(
            f"{os.fspath(folder)!r} is a folder without {CONFIG_NAME}: expected a checkpoint file or an HF-layout "
            f"folder ({CONFIG_NAME} and {WEIGHTS_NAME}, as scripts/export_hf.py writes and LANTERN releases)"
        )
    return folder


def read_hf_config(folder: Path) -> dict:
    path = folder / CONFIG_NAME
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{str(path)!r} is not valid JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise CheckpointError(f"{str(path)!r} is not a JSON object")
    return config


def _shard_names(folder: Path, index: Path) -> dict[str, str]:
    """``weight_map`` of a shard index (tensor -> shard file), each shard a plain name inside ``folder``."""
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
    except (OSError, ValueError, AttributeError) as exc:
        raise CheckpointError(f"{str(index)!r} is not a shard index ({exc})") from exc
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{str(index)!r} has no weight_map")
    for shard in set(weight_map.values()):
        if not isinstance(shard, str) or Path(shard).name != shard or shard in ("", ".", ".."):
            raise CheckpointError(f"{str(index)!r} names the shard {shard!r}: only files of the folder itself are read")
    return weight_map


def read_hf_weights(folder: Path) -> dict[str, torch.Tensor]:
    for name in WEIGHT_FILES:
        index = folder / (name + INDEX_SUFFIX)
        if index.is_file():
            weight_map = _shard_names(folder, index)
            state: dict[str, torch.Tensor] = {}
            for shard in sorted(set(weight_map.values())):
                for key, value in read_tensors(folder / shard).items():
                    if key in state:
                        raise CheckpointError(f"{folder_source(folder)}: {key} is in two shards (the second: {shard})")
                    state[key] = value
            absent = sorted(key for key, shard in weight_map.items() if key not in state)
            if absent:
                raise CheckpointError(
                    f"{folder_source(folder)}: missing {absent[0]}, which {index.name} puts in {weight_map[absent[0]]}"
                )
            return state
        if (folder / name).is_file():
            return read_tensors(folder / name)
    raise CheckpointError(
        f"{folder_source(folder)} has {CONFIG_NAME} but no weights: expected {WEIGHTS_NAME} "
        f"(or {WEIGHTS_NAME}{INDEX_SUFFIX} and its shards, or pytorch_model.bin)"
    )


def read_folder_config(folder: str | os.PathLike) -> tuple[dict, Path]:
    """A folder's ``config.json`` and the folder as a Path (CheckpointError unless it has one)."""
    folder = check_hf_folder(folder)
    return read_hf_config(folder), folder


def tokenizer_file(folder: str | os.PathLike) -> Path:
    """The folder's ``tokenizer.json``; CheckpointError when it has none."""
    path = Path(folder) / TOKENIZER_NAME
    if not path.is_file():
        raise CheckpointError(f"{folder_source(folder)} has no {TOKENIZER_NAME} (the prompt tokenizer)")
    return path


def shard_index(folder: Path) -> tuple[Path, dict[str, str]] | None:
    """The folder's shard index and its ``weight_map`` (tensor -> shard file), or None for unsharded weights."""
    for name in WEIGHT_FILES:
        index = folder / (name + INDEX_SUFFIX)
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
                if not isinstance(weight_map, dict):
                    raise TypeError("weight_map is not an object")
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise CheckpointError(f"{str(index)!r} is not a shard index ({exc})") from exc
            return index, weight_map
    return None


def check_shards(folder: Path) -> None:
    """CheckpointError naming the first shard an index names that is not in ``folder`` (before a large read)."""
    found = shard_index(folder)
    if found is None:
        return
    index, weight_map = found
    for shard in sorted(set(map(str, weight_map.values()))):
        if not (folder / shard).is_file():
            raise CheckpointError(f"{folder_source(folder)}: shard {shard!r}, named in {index.name}, is not there")


def read_tensor(folder: str | os.PathLike, key: str) -> torch.Tensor:
    """One tensor of a folder's weights, reading only the file that holds it (a codebook for LANTERN's
    neighbour tables without loading 7B weights)."""
    from safetensors import safe_open

    folder = check_hf_folder(folder)
    found = shard_index(folder)
    if found is not None:
        index, weight_map = found
        if key not in weight_map:
            raise CheckpointError(f"{folder_source(folder)}: {index.name} names no {key}")
        path = folder / str(weight_map[key])
    else:
        path = folder / WEIGHT_FILES[0]
    if not path.is_file() or path.suffix != ".safetensors":
        raise CheckpointError(f"{folder_source(folder)}: {key} is not in a safetensors file there ({path.name})")
    with safe_open(os.fspath(path), framework="pt") as handle:
        if key not in handle.keys():
            raise CheckpointError(f"{folder_source(folder)}: {path.name} holds no {key}")
        return handle.get_tensor(key)


def load_folder_target(
    folder: Path,
    build: Callable[[], nn.Module],
    what: str,
    vq_prefix: str,
    set_aside: tuple[str, ...] = (),
    rename: Callable[[str], str] | None = None,
) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """``build()`` loaded strictly from a folder's tensors under their own names (fp32 on CPU), and the tensors
    under ``vq_prefix`` (without it) for the tokenizer; tensors under ``set_aside`` prefixes are not read into
    the target. ``rename`` maps a stored name to the in-memory one first (transformers 5 writes some models in
    their original checkpoint's names). The shapes are checked on a meta-device model first (one error naming
    every misfit, ``what`` the architecture); the folder is noted as one input (role ``target``)."""
    given = {k: v for k, v in read_hf_weights(folder).items() if not k.endswith(STRAY_SUFFIXES)}
    if rename is not None:
        given = {rename(k): v for k, v in given.items()}
    vq = {k[len(vq_prefix) :]: v for k, v in given.items() if k.startswith(vq_prefix)}
    own = {k: v for k, v in given.items() if not k.startswith((vq_prefix, *set_aside))}
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in build().state_dict().items()}
    check_shapes(shapes, own, what, os.fspath(folder))
    model = build()
    model.load_state_dict(own, strict=True)
    note_input(folder, "target")
    return model, vq


def read_folder(folder: str | os.PathLike, role: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """An HF-layout folder's ``config.json`` and its tensors (one file or the shards of an index, stray RoPE
    buffers left out), noted as one input of the current job under ``role`` (the whole folder: a changed
    config counts)."""
    folder = check_hf_folder(folder)
    config = read_hf_config(folder)
    state = {k: v for k, v in read_hf_weights(folder).items() if not k.endswith(STRAY_SUFFIXES)}
    note_input(folder, role)
    return config, state


def write_folder(
    folder: str | os.PathLike, config: Mapping, state_dict: Mapping[str, torch.Tensor], dtype: torch.dtype
) -> Path:
    """``config.json`` and ``model.safetensors`` (tensors cast to ``dtype``) into ``folder``, atomically
    (:func:`lantern.files.write_folder_atomic`: an interrupted export leaves no folder that loads)."""
    from safetensors.torch import save_file

    # Own copies: tensors that share storage (the q/k/v parts of a fused matrix) are refused by safetensors.
    tensors = {
        key: value.detach().to(device="cpu", dtype=dtype).clone().contiguous() for key, value in state_dict.items()
    }
    text = json.dumps({**config, "torch_dtype": str(dtype).removeprefix("torch.")}, indent=2) + "\n"

    def write(staging: Path) -> None:
        save_file(tensors, str(staging / WEIGHTS_NAME), metadata={"format": "pt"})
        (staging / CONFIG_NAME).write_text(text, encoding="utf-8")

    return write_folder_atomic(folder, write)


def same_json(have, want) -> bool:
    """Equal as JSON values: numbers by value (``1e-05`` is ``1e-5``, ``10000`` is ``10000.0``), a bool or a
    string only to its own kind."""
    if isinstance(want, (bool, str)):
        return type(have) is type(want) and have == want
    if checks.is_number(want):
        return checks.is_number(have) and math.isclose(float(have), float(want), rel_tol=1e-9, abs_tol=0.0)
    return have == want


def check_folder_keys(
    config: Mapping,
    expected: Mapping,
    required: tuple[str, ...],
    source: str,
    what: str,
    nullable: tuple[str, ...] = (),
) -> None:
    """ConfigError naming the first key of ``expected`` whose value in ``config`` does not fit (a key of
    ``required`` must be there; the others, or a key of ``nullable`` set to null, are checked when present);
    ``what`` names the architecture the expected values come from."""
    for key, want in expected.items():
        if key not in config or (key in nullable and config[key] is None):
            if key in required:
                raise ConfigError(f"{source}: config.json has no {key!r}; expected {checks.shown(want)} for {what}")
            continue
        if not same_json(config[key], want):
            raise ConfigError(
                f"{source}: config.json has {key}={checks.shown(config[key])}, expected {checks.shown(want)} for {what}"
            )


def check_family(config: Mapping, model_type: str, architecture: str, source: str, wanted: str = "") -> None:
    """CheckpointError unless ``config.json`` names one family both ways it can: ``model_type`` (when it has
    one) must be the family's and ``architectures`` (when listed) must hold one of the family's classes (a
    name starting as ``architecture``'s prefix before ``For``, so a release's variant class passes); a
    config with neither is refused too. A folder whose two names disagree is another model's. ``wanted``
    says what was expected, for the message (default: the architecture and its model_type)."""
    kind, listed = config.get("model_type"), config.get("architectures") or []
    family = architecture.split("For")[0]
    ours = [name for name in listed if isinstance(name, str) and name.startswith(family)]
    if (kind is None and not listed) or (kind is not None and kind != model_type) or (listed and not ours):
        found = ", ".join(map(str, listed)) or "no architecture"
        wanted = wanted or f"a {architecture} (model_type {model_type!r})"
        raise CheckpointError(f"{source} holds {found} (model_type {kind!r}), not {wanted}")
