"""Shipped model worlds: a folder of weights plus a manifest that pins every file by sha256.

The embedded Fashion-MNIST world lives in ``worlds/fashion_mnist/``. Its manifest records, for each
file, the sha256, the size, the command that produced it, the data and the commit. Loading checks
every hash first, so a missing or altered file is reported before anything is built.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

from lantern import REPO_ROOT
from lantern.errors import CheckpointError
from lantern.files import note_input
from lantern.models.bundle import ModelBundle
from lantern.models.dry import dry_twin, family_twin
from lantern.models.llamagen.bundle import dry_config, load_bundle

MANIFEST_NAME = "manifest.json"
DEFAULT_WORLD = REPO_ROOT / "worlds" / "fashion_mnist"


def read_manifest(folder: str | Path) -> dict:
    """The manifest of ``folder``; CheckpointError when it is missing or unreadable."""
    path = Path(folder) / MANIFEST_NAME
    if not path.is_file():
        raise CheckpointError(f"world manifest not found: {str(path)!r} (is {str(folder)!r} a shipped world folder?)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"world manifest {str(path)!r} is not valid JSON ({exc})") from exc
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise CheckpointError(f"world manifest {str(path)!r} has no 'files' table")
    return manifest


def world_member(folder: Path, name) -> Path:
    """``folder / name`` for a file the manifest names; CheckpointError unless it stays inside ``folder``
    (a manifest must not make the loader hash, or point at, files elsewhere)."""
    root = folder.resolve()
    if not isinstance(name, str) or not name or Path(name).is_absolute():
        raise CheckpointError(
            f"world manifest {str(folder / MANIFEST_NAME)!r} names {name!r}: "
            "only relative paths inside the world folder are allowed"
        )
    path = (folder / name).resolve()
    if not path.is_relative_to(root):
        raise CheckpointError(
            f"world manifest {str(folder / MANIFEST_NAME)!r} names {name!r}, which is outside "
            f"the world folder {str(folder)!r}; only files inside it are allowed"
        )
    return folder / name


def restore_hint(path: Path) -> str:
    """How to get a shipped file back: ``git checkout`` when it is tracked in this repository."""
    absolute = path.resolve()
    if absolute.is_relative_to(REPO_ROOT.resolve()):
        relative = absolute.relative_to(REPO_ROOT.resolve())
        tracked = (
            subprocess.run(
                ["git", "ls-files", "--error-unmatch", str(relative)], cwd=REPO_ROOT, capture_output=True, timeout=30
            ).returncode
            == 0
        )
        if tracked:
            return f"restore it with `git checkout -- {relative}`"
    return "restore it from where the world folder came from"


def _verify_member(folder: Path, manifest: dict, name: str) -> Path:
    """``folder / name`` after checking it against its manifest entry; CheckpointError when it has no entry
    (a world is pinned whole: deleting an entry must not switch its check off), is missing or was altered."""
    where = str(folder / MANIFEST_NAME)
    entry = manifest["files"].get(name)
    if entry is None:
        raise CheckpointError(
            f"world manifest {where!r} has no entry for {name!r}, which the world loads; every file of a world "
            f"is pinned by sha256: {restore_hint(folder / MANIFEST_NAME)}, or ship the file with scripts/ship_world.py"
        )
    path = world_member(folder, name)
    if not isinstance(entry, dict):
        raise CheckpointError(f"world manifest {where!r}: the entry of {name!r} is not a table")
    if not path.is_file():
        raise CheckpointError(
            f"world file {str(path)!r} is missing; {restore_hint(path)} or rebuild it with `{entry.get('command', '?')}`"
        )
    actual = note_input(path, f"world:{name}")
    if actual != entry.get("sha256"):
        raise CheckpointError(
            f"world file {str(path)!r} was altered (sha256 {actual[:12]}..., manifest {str(entry.get('sha256'))[:12]}...); "
            f"{restore_hint(path)} or rebuild it with `{entry.get('command', '?')}`"
        )
    return path


def verify_world(folder: str | Path, loads: tuple[str, ...] = ()) -> dict:
    """Check every file of the manifest against its sha256, and that each file in ``loads`` has an entry;
    return the manifest. A missing, unpinned or altered file raises one CheckpointError that says how to
    restore or rebuild it."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    for name in dict.fromkeys([*manifest["files"], *loads]):
        _verify_member(folder, manifest, name)
    return manifest


def _dry_world_file(folder: str | None, name: str, replacement: str | None = None) -> str:
    """:func:`world_file`'s dry twin: the path it would give, nothing read (the world is verified when it loads)."""
    if replacement is not None:
        return str(replacement)
    return str((Path(folder) if folder else DEFAULT_WORLD) / str(name))


@dry_twin(_dry_world_file)
def world_file(folder: str | None, name: str, replacement: str | None = None) -> str:
    """Path of file ``name`` in a world folder (``None``: the shipped world), checked against its manifest entry;
    or ``replacement`` as given when it is not None (a file or folder of the user's, which its loader checks)."""
    if replacement is not None:
        return str(replacement)
    root = Path(folder) if folder else DEFAULT_WORLD
    return str(_verify_member(root, read_manifest(root), name))


@dry_twin(family_twin("model.bundle", dry_config("model.bundle"), paths=("folder", "gpt_ckpt")))
def load_world(
    name: str,
    gpt: Mapping,
    vq: Mapping,
    conditioner: Callable,
    folder: str | None = None,
    gpt_file: str = "gpt.safetensors",
    vq_file: str = "vq.safetensors",
    device: str = "cpu",
    dtype: str = "float32",
    gpt_ckpt: str | None = None,
) -> ModelBundle:
    """Verify a shipped world's manifest, then load its GPT and VQ strictly (see :func:`load_bundle`).

    ``gpt_ckpt`` (a GPT file or an HF-layout folder), when given, is loaded instead of the world's GPT; the
    tokenizer and the conditioner stay the world's, and the manifest is checked all the same.
    """
    folder = Path(folder) if folder else DEFAULT_WORLD
    verify_world(folder, loads=(vq_file,) if gpt_ckpt is not None else (gpt_file, vq_file))
    gpt_path = str(folder / gpt_file) if gpt_ckpt is None else gpt_ckpt
    return load_bundle(name, gpt, vq, gpt_path, str(folder / vq_file), conditioner, device, dtype)
