"""The lock file of ``paths.assets`` and the checks of files against their pins.

``assets.lock.json`` holds, for every file fetched or derived under ``paths.assets`` (by its path there):
the asset, its source, the revision the hub resolved, its size and sha256, the date, and for a derived
asset the hash of its recipe. A file whose registry pin is null is pinned by its first lock entry; every
later fetch and every run compares the file with the pin or the entry, so a changed file is refused.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
from pathlib import Path

from lantern.errors import ConfigError
from lantern.files import sha256_cached, write_json_atomic
from lantern.run.assets.registry import AssetFile

LOCK_NAME = "assets.lock.json"
VERSION = 1


class AssetError(ConfigError):
    """An asset is missing, unverified or altered: one line saying which and what to do."""


def folder_sha256(folder: Path) -> str:
    """sha256 over a folder's files (sorted relative path and sha256 of each), as run records hash folders."""
    digest = hashlib.sha256()
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(f"{file.relative_to(folder).as_posix()}\0{sha256_cached(file)}\n".encode())
    return digest.hexdigest()


def content_sha256(path: Path) -> tuple[str, int]:
    """(sha256, bytes) of a file, or of a folder's files (:func:`folder_sha256`)."""
    if path.is_dir():
        return folder_sha256(path), sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return sha256_cached(path), path.stat().st_size


class Lock:
    """``paths.assets/assets.lock.json``: read once, updated entry by entry (each write atomic)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.path = self.root / LOCK_NAME
        self.entries: dict[str, dict] = {}
        if self.path.is_file():
            try:
                data = json.loads(self.path.read_text(encoding="utf-8"))
                self.entries = dict(data["files"])
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise AssetError(
                    f"asset lock file {str(self.path)!r} cannot be read ({exc}); restore it or remove it to relock"
                ) from exc

    def get(self, relative: str) -> dict | None:
        return self.entries.get(relative)

    def record(self, relative: str, entry: dict) -> None:
        """Add or replace the entry of ``relative`` (dated now) and write the file."""
        stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        self.entries[relative] = {**entry, "date": stamp}
        write_json_atomic(self.path, {"version": VERSION, "files": dict(sorted(self.entries.items()))})


def expected(file: AssetFile, lock: Lock) -> tuple[int | None, str | None, str]:
    """(size, sha256, where the pin comes from) a file must match: the registry's pin, else its lock entry."""
    entry = lock.get(file.relative) or {}
    size = file.size if file.size is not None else entry.get("size")
    if file.sha256 is not None:
        return size, file.sha256, "the registry's pin"
    if entry.get("sha256"):
        return size, entry["sha256"], f"its lock entry of {entry.get('date', '?')}"
    return size, None, "nothing (not yet locked)"


def mismatch(file: AssetFile, path: Path, lock: Lock, sha256: str | None = None) -> str | None:
    """Why ``path`` is not ``file`` as pinned or locked (a sentence), or None when it matches.

    A file pinned by neither is checked against its published sha256 prefix only (then locked by the caller).
    """
    size, pinned, where = expected(file, lock)
    actual_size = path.stat().st_size
    if size is not None and actual_size != size:
        return f"has {actual_size} bytes; {where} says {size}"
    if pinned is None and file.sha256_prefix is None:
        return None
    actual = sha256 or sha256_cached(path)
    if pinned is not None and actual != pinned:
        return f"has sha256 {actual[:16]}...; {where} says {pinned[:16]}..."
    if file.sha256_prefix is not None and not actual.startswith(file.sha256_prefix):
        return f"has sha256 {actual[:16]}...; its published prefix is {file.sha256_prefix}"
    return None


def entry_for(file: AssetFile, path: Path, revision: str | None = None, sha256: str | None = None) -> dict:
    """The lock entry of a verified file."""
    return {
        "asset": file.asset,
        "source": file.source.describe() if file.source else None,
        "revision": revision,
        "size": path.stat().st_size,
        "sha256": sha256 or sha256_cached(path),
    }
