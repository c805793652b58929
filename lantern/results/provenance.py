"""Provenance of every artifact and result row: commit, machine, thread count and library versions."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import torch

from lantern import REPO_ROOT


def git_commit() -> dict:
    """The commit of this checkout and whether it has uncommitted changes ("unknown" outside git)."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
        dirty = (
            subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=REPO_ROOT,
                capture_output=True,
                text=True,
                check=True,
                timeout=10,
            ).stdout.strip()
            != ""
        )
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
