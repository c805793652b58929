"""Before a run does any work: every asset it reads at its registry place is there and matches its verified
pins and lock entry (a hash is remembered under the file's size, times and inode and trusted only while a
digest of sampled blocks of its bytes still matches, :func:`lantern.files.sha256_cached`, so a large file is hashed
once). The loaders then record the same sha256 of every file they read in the run's record."""

from __future__ import annotations

from pathlib import Path

from lantern.run.assets import places
from lantern.run.assets.pins import judge
from lantern.run.assets.registry import Asset, needed
from lantern.run.assets.store import AssetError, Lock, content_sha256


def fetch_command(resolved: dict) -> str:
    """The ``scripts/fetch.py`` command that fetches what this run reads."""
    parts = ["python scripts/fetch.py", f"model={(resolved.get('model') or {}).get('name', '?')}"]
    if resolved.get("protocol"):
        parts.append(f"protocol={resolved['protocol'].get('name', '?')}")
    return " ".join(parts)


def check_assets(resolved: dict) -> None:
    """AssetError (one line) for the first asset of ``resolved`` that is missing, unverified or altered."""
    found = needed(resolved)
    if not found:
        return
    root = Path(resolved["paths"]["assets"])
    lock = Lock(root)
    for key, asset in found:
        _check(key, asset, root, lock, resolved)


def _check(key: str, asset: Asset, root: Path, lock: Lock, resolved: dict) -> None:
    path = asset.path(root)
    fix = f"fetch it with `{fetch_command(resolved)}`" + (f", or set {key}=PATH" if key != "-" else "")
    if not path.exists():
        raise AssetError(f"{key} is required: {str(path)!r} (asset {asset.name}) is not there; {fix}")
    if asset.kind == "derived":
        entry = lock.get(asset.dest) or {}
        digest = content_sha256(path)[0]
        if digest != entry.get("sha256"):
            state = "was not made by scripts/fetch.py" if not entry else "was altered since it was made"
            raise AssetError(f"{str(path)!r} (asset {asset.name}) {state}; remove it and {fix}")
        return
    for file in asset.listed_files(root, lock.expanded(asset.name)):
        member = places.inside(root, file.relative, f"asset {asset.name}")
        if not member.is_file():
            raise AssetError(f"{key} is required: {str(member)!r} (asset {asset.name}) is not there; {fix}")
        verdict = judge(file, member, lock.get(file.relative))
        if verdict.refuse is not None:
            raise AssetError(
                f"{str(member)!r} (asset {asset.name}) {verdict.refuse}: it changed since it was fetched; {fix}"
            )
        if not ({"sha256"} & file.verified) and lock.get(file.relative) is None:
            raise AssetError(
                f"{str(member)!r} (asset {asset.name}) is not verified yet; {fix} (it checks and locks it)"
            )
