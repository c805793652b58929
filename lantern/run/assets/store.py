"""The lock file of ``paths.assets`` and the checks of files against their pins.

``assets.lock.json`` holds, for every file fetched or derived under ``paths.assets`` (by its path there):
the asset, its source, the revision the hub resolved, its size and sha256 (and md5 where the registry pins
one), the date, any warning an unverified pin raised, and for a derived asset the hash of its recipe. It also
holds ``revisions``: the commit each hub branch or tag resolved to on the first fetch, which every later fetch
with this lock asks for, and ``expansions``: the files a folder's patterns matched there. A file is pinned by its first lock entry; every later fetch and every run compares
the file with the entry (:func:`lantern.run.assets.pins.judge`), so a changed file is refused.
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
VERSION = 2  # 2: + revisions (version 1 files are read as having none)


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
        self.revisions: dict[str, dict] = {}
        self.expansions: dict[str, dict] = {}
        if self.path.is_file():
            try:
                data = json.loads(self.path.read_text(encoding="utf-8"))
                self.entries = dict(data["files"])
                self.revisions = dict(data.get("revisions") or {})
                self.expansions = dict(data.get("expansions") or {})
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise AssetError(
                    f"asset lock file {str(self.path)!r} cannot be read ({exc}); restore it or remove it to relock"
                ) from exc

    def get(self, relative: str) -> dict | None:
        return self.entries.get(relative)

    def record(self, relative: str, entry: dict) -> None:
        """Add or replace the entry of ``relative`` (dated now) and write the file."""
        self.entries[relative] = {**entry, "date": _now()}
        self._write()

    def commit(self, repo: str, ref: str) -> str | None:
        """The commit ``repo``'s branch or tag ``ref`` was locked to (None when it never was)."""
        return (self.revisions.get(f"{repo}@{ref}") or {}).get("commit")

    def record_commit(self, repo: str, ref: str, commit: str) -> None:
        """Lock ``repo@ref`` to ``commit``: later fetches with this lock ask for that commit."""
        self.revisions[f"{repo}@{ref}"] = {"commit": commit, "date": _now()}
        self._write()

    def expanded(self, asset: str) -> list[str]:
        """The files an asset's patterns matched when it was first fetched ([] before)."""
        return list((self.expansions.get(asset) or {}).get("files") or [])

    def record_expansion(self, asset: str, revision: str, files: list[str]) -> None:
        """Record the files ``asset``'s patterns matched at ``revision`` (before any of them is downloaded)."""
        self.expansions[asset] = {"revision": revision, "files": sorted(files), "date": _now()}
        self._write()

    def _write(self) -> None:
        data = {"version": VERSION, "files": dict(sorted(self.entries.items()))}
        data["revisions"] = dict(sorted(self.revisions.items()))
        write_json_atomic(self.path, {**data, "expansions": dict(sorted(self.expansions.items()))})


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def expected(file: AssetFile, lock: Lock) -> tuple[int | None, str | None, str]:
    """(size, sha256, where the pin comes from) a file must match: its lock entry, else the registry's pin."""
    entry = lock.get(file.relative) or {}
    size = entry.get("size") if entry.get("size") is not None else file.size
    if entry.get("sha256"):
        return size, entry["sha256"], f"its lock entry of {entry.get('date', '?')}"
    if file.sha256 is not None:
        state = "verified" if "sha256" in file.verified else "unverified"
        return size, file.sha256, f"the registry's {state} pin"
    return size, None, "nothing (not yet locked)"


def entry_for(file: AssetFile, path: Path, revision: str | None = None, sha256: str | None = None, **extra) -> dict:
    """The lock entry of a checked file (``extra``: its md5, a warning an unverified pin raised)."""
    entry = {
        "asset": file.asset,
        "source": file.source.describe() if file.source else None,
        "revision": revision,
        "size": path.stat().st_size,
        "sha256": sha256 or sha256_cached(path),
    }
    return {**entry, **{k: v for k, v in extra.items() if v is not None}}
