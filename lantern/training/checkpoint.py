"""The training checkpoint of :class:`lantern.training.loop.Trainer` and the checks before resuming from it.

A checkpoint (``checkpoint.pt``, format ``lantern-train-checkpoint/1``) holds the step, the data position,
the model, optimizer and random generator states, the run config and the inputs it was trained from
(by content). A resumption is refused when the config differs outside the keys allowed to change, or an
input file now has other contents; the log lines the killed run wrote after its checkpoint are dropped.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lantern.errors import CheckpointError, ConfigError
from lantern.files import write_text_atomic

CHECKPOINT_NAME = "checkpoint.pt"
CHECKPOINT_FORMAT = "lantern-train-checkpoint/1"
# Config keys that may change between a run and its resumption (dotted paths, top level or nested).
DEFAULT_RESUME_IGNORE = (
    "steps",
    "max_steps",
    "ckpt_every",
    "log_every",
    "progress",
    "num_threads",
    "device",
    "out_dir",
)


def read_checkpoint(path: Path) -> dict[str, Any]:
    """The state stored in ``path``; CheckpointError when it is unreadable or not a training checkpoint."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any parse failure means an unusable checkpoint
        raise CheckpointError(f"{str(path)!r} is not a readable training checkpoint ({exc})") from exc
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{str(path)!r} is not a {CHECKPOINT_FORMAT} checkpoint")
    return state


def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def check_resume_config(
    path: Path, saved: Mapping[str, Any] | None, config: Mapping[str, Any] | None, ignore: Sequence[str]
) -> None:
    """Refuse to resume the checkpoint ``path`` written under ``saved`` with ``config`` when they differ in a
    key outside ``ignore`` (the first four differences named); a job calls it before it locks its folder."""
    if config is None or saved is None:
        return
    old, new = _flatten(saved), _flatten(config)

    def ignored(key: str) -> bool:
        return any(key == k or key.endswith(f".{k}") for k in ignore)

    diff = sorted(k for k in set(old) | set(new) if not ignored(k) and old.get(k) != new.get(k))
    if diff:
        shown = ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in diff[:4])
        raise ConfigError(
            f"{str(path)!r} was written with a different config ({shown}"
            f"{', ...' if len(diff) > 4 else ''}); use the same settings to resume or a fresh out_dir"
        )


def check_inputs(path: Path, saved: Mapping[str, Any], now: Mapping[str, Any]) -> None:
    """Refuse to resume the checkpoint ``path`` when a file it was trained from (data, tokenizer, teacher) now
    has other contents: continuing would train on two inputs. Contents, not paths, are compared."""
    for name, entry in saved.items():
        current = now.get(name)
        if current is not None and isinstance(entry, Mapping) and current.get("sha256") != entry.get("sha256"):
            raise ConfigError(
                f"{str(path)!r} was trained from {name!r} with sha256 "
                f"{str(entry.get('sha256'))[:12]}..., which now has {str(current.get('sha256'))[:12]}...; "
                "restore that file to resume, or use a fresh out_dir"
            )


def rng_state() -> dict[str, Any]:
    """The state of the Python, NumPy, torch (and CUDA) global generators, as a checkpoint stores it."""
    np_state = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore the global generators from :func:`rng_state`'s ``state``."""
    python = state["python"]
    random.setstate((python[0], tuple(python[1]), python[2]))
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def truncate_log(log: Path, step: int) -> None:
    """Drop the lines of ``log`` (JSON lines) of steps after ``step``: the killed run logged them, the resumed
    run logs them again."""
    if not log.is_file():
        return
    kept = []
    for line in log.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:  # a line cut by the kill
            continue
        if isinstance(entry, dict) and isinstance(entry.get("step"), int) and entry["step"] <= step:
            kept.append(line)
    write_text_atomic(log, "".join(f"{line}\n" for line in kept))
