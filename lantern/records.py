"""Provenance of every artifact and result row, and atomic writes."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]


def git_commit() -> dict:
    """The commit of this checkout and whether it has uncommitted changes ("unknown" outside git)."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT, capture_output=True,
            text=True, check=True, timeout=10,
        ).stdout.strip() != ""
        return {"commit": commit, "dirty": dirty}
    except (OSError, subprocess.SubprocessError):
        return {"commit": "unknown", "dirty": None}


def device_name(device: torch.device) -> str:
    """A human-readable name of ``device`` (GPU model, or the CPU's)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def environment(device: torch.device) -> dict:
    """Library versions, machine and commit, recorded beside every result."""
    versions = {"python": sys.version.split()[0], "torch": torch.__version__}
    for module in ("hydra", "transformers", "numpy"):
        try:
            versions[module] = __import__(module).__version__
        except ImportError:
            continue
    return {
        **git_commit(),
        "device": str(device),
        "device_name": device_name(device),
        "num_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "versions": versions,
    }


def write_atomic(path: str | os.PathLike, write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)`` on a temporary file beside ``path``, then rename it over ``path``.

    Readers see the old file or the whole new one, never a half-written one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = str(path.with_name(f".{path.name}.{os.getpid()}.tmp"))  # same folder, so the rename is atomic
    try:
        write(tmp)
        os.chmod(tmp, 0o644)  # some writers create 0600 files; outputs are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`write_atomic`)."""
    write_atomic(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def write_json_atomic(path: str | os.PathLike, payload: dict) -> None:
    """Write ``payload`` as JSON to ``path`` atomically (:func:`write_atomic`)."""
    write_text_atomic(path, json.dumps(payload, indent=2, sort_keys=False, default=str) + "\n")


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
