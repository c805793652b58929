"""``scripts/fetch.py``: list, download, verify and lock the assets a composed run reads, then derive the rest.

One fetch at a time per ``paths.assets`` (a second one waits on :class:`lantern.run.lock.FolderLock`). A
present file is checked against its pin or lock entry; a missing one is fetched only once every source
answers (:func:`lantern.run.assets.download.probe`) and the disk holds what is coming; each download is
checked before it is moved into place, and a wrong one is deleted.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from hydra.utils import get_method

from lantern.errors import ConfigError
from lantern.run.assets import download as dl
from lantern.run.assets.recipes import recipe_sha256
from lantern.run.assets.registry import Asset, AssetFile, Source, load_registry, needed, with_inputs
from lantern.run.assets.store import AssetError, Lock, content_sha256, entry_for, expected, mismatch
from lantern.run.lock import FolderLock

Say = Callable[[str], None]


def plan(resolved: dict) -> tuple[Path, list[Asset]]:
    """``paths.assets`` and the assets a run of ``resolved`` reads, each derived one after its inputs."""
    root = (resolved.get("paths") or {}).get("assets")
    if not root:
        raise ConfigError("paths.assets is not set; it is where assets are fetched to (conf/paths/default.yaml)")
    registry = load_registry()
    return Path(root), with_inputs([asset for _, asset in needed(resolved, registry)], registry)


def listing(resolved: dict) -> list[str]:
    """One line per file: asset, source, size, pin, destination, and whether it is there (no network)."""
    root, assets = plan(resolved)
    lock = Lock(root)
    if not assets:
        return [f"nothing to fetch: this run reads no asset of the registry (paths.assets is {root})"]
    lines = [f"assets under {root} ({len(assets)}):"]
    for asset in assets:
        files = asset.listed_files(root) or [AssetFile(asset.name, asset.dest, None)]
        if asset.shards and not (root / asset.dest / asset.shards).is_file():
            shards = Source(
                repo=asset.source.repo, file=f"<weights named by {asset.shards}>", revision=asset.source.revision
            )
            files.append(AssetFile(asset.name, f"{asset.dest}/<weights named by {asset.shards}>", shards))
        lines += [_row(asset, file, number, len(files), root, lock) for number, file in enumerate(files)]
    return lines


def _row(asset: Asset, file: AssetFile, number: int, count: int, root: Path, lock: Lock) -> str:
    """One line of :func:`listing`; a folder's approximate size is on its first file."""
    size, sha, where = expected(file, lock)
    unpinned = "unpinned: locked on first fetch"
    if asset.kind == "derived":
        source = f"recipe {asset.recipe.get('_target_', '?').rsplit('.', 1)[-1]}({', '.join(asset.inputs)})"
        sha = (lock.get(file.relative) or {}).get("sha256")
        where, unpinned = "its lock entry", "made and locked on first fetch"
    else:
        source = file.source.describe()
    shown = f"{size} B" if size is not None else "?"
    if size is None and asset.approx_bytes and number == 0:
        shown = f"~{asset.approx_bytes / 1e9:.2f} GB" + (" in all" if count > 1 else "")
    pin = f"sha256 {sha[:12]}... ({where})" if sha else unpinned
    if not sha and file.sha256_prefix:
        pin = f"sha256 prefix {file.sha256_prefix} (published)"
    there = "present" if (root / file.relative).exists() else "missing"
    return f"  {asset.name}: {source} | {shown} | {pin} | {root / file.relative} | {there} | {asset.licence}"


def _holding(root: Path, say: Say) -> FolderLock:
    try:
        return FolderLock(root, what="asset folder").acquire()
    except ConfigError:
        say(f"another fetch is writing {root}; waiting for it to finish")
        return FolderLock(root, wait=True, what="asset folder").acquire()


def fetch(resolved: dict, say: Say = print, progress: bool = True) -> list[Asset]:
    """Make every asset of ``resolved`` present and verified under ``paths.assets``; return them."""
    root, assets = plan(resolved)
    holder = _holding(root, say)
    try:
        lock = Lock(root)
        sources = [a for a in assets if a.kind != "derived"]
        missing = _verify_present([f for a in sources for f in a.listed_files(root)], root, lock)
        pending = [a for a in sources if a.shards and not (root / a.dest / a.shards).is_file()]
        if missing or pending:
            _preflight(missing, pending, root)
            _get_all(missing, root, lock, progress, say)
            shards = [f for a in pending for f in a.listed_files(root)]
            _get_all(_verify_present(shards, root, lock), root, lock, progress, say)
        for asset in assets:
            if asset.kind == "derived":
                _derive(asset, root, lock, say)
    finally:
        holder.release()
    say(f"{len(assets)} assets present and verified under {root}")
    return assets


def _verify_present(files: list[AssetFile], root: Path, lock: Lock) -> list[AssetFile]:
    """Check the files that are there (locking unpinned ones); return those that are missing."""
    missing = []
    for file in files:
        path = root / file.relative
        if not path.is_file():
            missing.append(file)
            continue
        why = mismatch(file, path, lock)
        if why is not None:
            raise AssetError(f"{str(path)!r} ({file.source.describe()}) {why}; remove it and fetch again")
        if lock.get(file.relative) is None:
            lock.record(file.relative, entry_for(file, path))
    return missing


def _preflight(missing: list[AssetFile], pending: list[Asset], root: Path) -> None:
    """Before the first byte: offline mode, every host answering, the disk holding what is coming."""
    first = missing[0] if missing else pending[0].listed_files(root)[0]
    if dl.offline():
        raise AssetError(
            f"HF_HUB_OFFLINE is set and {first.source.describe()} is not at {str(root / first.relative)!r}: "
            "copy the file there, or fetch where there is network"
        )
    seen: dict[str, str | None] = {}
    for file in missing + [a.listed_files(root)[0] for a in pending]:
        host = file.source.location().split("/")[2]
        if host not in seen:
            seen[host] = dl.probe(file.source)
        if seen[host] is not None:
            raise AssetError(
                f"cannot reach {file.source.describe()} ({seen[host]}): copy the file to "
                f"{str(root / file.relative)!r}, or run scripts/fetch.py where there is network"
            )
    coming = sum(_size(f) or 0 for f in missing) + sum(a.approx_bytes or 0 for a in pending)
    dl.check_space(root, coming, f"fetching {len(missing)} files")


def _size(file: AssetFile) -> int | None:
    return file.size if file.size is not None else dl.remote_size(file.source)[0]


def _get_all(files: list[AssetFile], root: Path, lock: Lock, progress: bool, say: Say) -> None:
    for file in files:
        path = root / file.relative
        size, revision, published = (file.size, None, None) if file.source.url else dl.remote_size(file.source)
        if size is not None:
            dl.check_space(root, size, file.source.describe())
        say(f"fetching {file.source.describe()} -> {path}")
        staged = dl.download(file.source, root, file.relative, progress)
        digest = content_sha256(staged)[0]
        why = mismatch(file, staged, lock, digest)
        if why is None and published is not None and digest != published:
            why = f"has sha256 {digest[:16]}...; the hub publishes {published[:16]}..."
        if why is not None:
            staged.unlink(missing_ok=True)
            raise AssetError(f"{file.source.describe()} {why}; the download was removed (the upstream file changed?)")
        path.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staged, path)
        lock.record(file.relative, entry_for(file, path, revision, digest))


def _derive(asset: Asset, root: Path, lock: Lock, say: Say) -> None:
    """Make a derived asset from its inputs unless its lock entry says it was made by this recipe from them."""
    registry = load_registry()
    inputs = {name: content_sha256(registry[name].path(root))[0] for name in asset.inputs}
    recipe_hash = recipe_sha256(asset.recipe, inputs)
    path, entry = asset.path(root), lock.get(asset.dest) or {}
    if path.exists() and entry.get("recipe") == recipe_hash:
        digest = content_sha256(path)[0]
        if digest != entry.get("sha256"):
            raise AssetError(
                f"{str(path)!r} (asset {asset.name}) was altered (sha256 {digest[:16]}..., locked "
                f"{str(entry.get('sha256'))[:16]}...); remove it and fetch again to remake it"
            )
        return
    say(f"making {asset.name} -> {path}")
    staged = root / dl.PARTIAL_DIR / "derived" / asset.dest
    _remove(staged)
    staged.parent.mkdir(parents=True, exist_ok=True)
    params = {k: v for k, v in asset.recipe.items() if k != "_target_"}
    try:
        get_method(asset.recipe["_target_"])([registry[n].path(root) for n in asset.inputs], staged, **params)
    except BaseException:
        _remove(staged)
        raise
    _remove(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.replace(staged, path)
    digest, size = content_sha256(path)
    entry = {"asset": asset.name, "source": f"recipe {asset.recipe['_target_']}", "recipe": recipe_hash}
    lock.record(asset.dest, {**entry, "inputs": inputs, "revision": None, "size": size, "sha256": digest})


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
