"""Judging a file against its pins and its lock entry: what refuses it and what only warns.

* A **verified** registry pin (size, sha256, md5 or sha256 prefix checked against a published source) that the
  file contradicts refuses it: a download is deleted, a file already in place is left alone and refused.
* An **unverified** pin (nobody could check it against a published source) never deletes or refuses anything:
  the contradiction is a warning, and the file is locked with what it holds (the lock entry keeps the warning).
* A **lock entry** pins what the first fetch saw: a file that differs from it later is refused.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from lantern.files import sha256_cached
from lantern.run.assets.registry import AssetFile

CHUNK = 1 << 20


@dataclass(frozen=True)
class Verdict:
    """``refuse``: why the file must not be used (None: it may); ``warn``: unverified pins it contradicts."""

    refuse: str | None = None
    warn: str | None = None


def digests(path: Path, md5: bool = False) -> tuple[str, str | None]:
    """(sha256, md5 or None) of a file; both in one pass when ``md5`` is asked for."""
    if not md5:
        return sha256_cached(path), None
    sha, mdf = hashlib.sha256(), hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            sha.update(block)
            mdf.update(block)
    return sha.hexdigest(), mdf.hexdigest()


def _contradictions(file: AssetFile, size: int, sha256: str, md5: str | None) -> list[tuple[str, str]]:
    """(pin name, sentence) for every registry pin the file's size or digests contradict."""
    found = []
    if file.size is not None and size != file.size:
        found.append(("size", f"has {size} bytes; the registry's pin says {file.size}"))
    if file.sha256 is not None and sha256 != file.sha256:
        found.append(("sha256", f"has sha256 {sha256[:16]}...; the registry's pin says {file.sha256[:16]}..."))
    if file.sha256_prefix is not None and not sha256.startswith(file.sha256_prefix):
        found.append(("sha256_prefix", f"has sha256 {sha256[:16]}...; its published prefix is {file.sha256_prefix}"))
    if file.md5 is not None and md5 is not None and md5 != file.md5:
        found.append(
            ("md5", f"has md5 {md5}; its md5 pin (the registry's or upstream's checksum list) says {file.md5}")
        )
    return found


def judge(
    file: AssetFile, path: Path, entry: dict | None, sha256: str | None = None, md5: str | None = None
) -> Verdict:
    """The verdict on ``path`` as ``file``, given its lock entry (None when it was never locked).

    A locked file is checked against its entry (and any verified pin, in case the registry learnt one since);
    an unlocked one against every pin, verified pins refusing and unverified ones warning.
    """
    size = path.stat().st_size
    if entry:
        when = f"its lock entry of {entry.get('date', '?')}"
        if entry.get("size") is not None and size != entry["size"]:
            return Verdict(refuse=f"has {size} bytes; {when} says {entry['size']}")
        sha256 = sha256 or sha256_cached(path)
        if entry.get("sha256") and sha256 != entry["sha256"]:
            return Verdict(refuse=f"has sha256 {sha256[:16]}...; {when} says {entry['sha256'][:16]}...")
        md5 = md5 or entry.get("md5")
    if not any(getattr(file, k) is not None for k in ("size", "sha256", "sha256_prefix", "md5")):
        return Verdict()
    needs_md5 = file.md5 is not None and md5 is None and (not entry or "md5" in file.verified)
    if sha256 is None or needs_md5:
        sha256, md5 = digests(path, md5=needs_md5) if needs_md5 else (sha256_cached(path), md5)
    found = _contradictions(file, size, sha256, md5)
    refusals = [why for key, why in found if key in file.verified]
    warnings = [why for key, why in found if key not in file.verified]
    if refusals:
        return Verdict(refuse=refusals[0])
    if entry:  # judged when it was locked
        return Verdict()
    return Verdict(warn="; ".join(warnings) + " (an unverified pin: kept and locked)" if warnings else None)
