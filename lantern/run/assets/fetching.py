"""``scripts/fetch.py``: download, verify and lock the assets a composed run reads, then derive the rest.

One fetch at a time per ``paths.assets`` (a second one waits on :class:`lantern.run.lock.FolderLock`). A
present file is judged against its pins and lock entry (:func:`lantern.run.assets.pins.judge`); a missing one
is fetched only once every source answers (:func:`lantern.run.assets.download.probe`) and the disk holds what
is coming. A hub branch is resolved to a commit on the first fetch and locked (every later fetch asks for that
commit); a folder's patterns are matched against the hub's tree at that commit and the matches locked. Each
download is judged before it is moved into place: a verified pin it contradicts deletes it (a URL then tries
its next mirror), an unverified one is a warning. The list (``--list``) is :mod:`lantern.run.assets.listing`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from hydra.utils import get_method

from lantern.errors import ConfigError
from lantern.run.assets import download as dl
from lantern.run.assets import places
from lantern.run.assets.pins import digests, judge
from lantern.run.assets.recipes import recipe_sha256
from lantern.run.assets.registry import Asset, AssetFile, Source, load_registry, needed, with_inputs
from lantern.run.assets.store import AssetError, Lock, content_sha256, entry_for
from lantern.run.lock import FolderLock

Say = Callable[[str], None]


def plan(resolved: dict) -> tuple[Path, list[Asset]]:
    """``paths.assets`` and the assets a run of ``resolved`` reads, each derived one after its inputs."""
    root = (resolved.get("paths") or {}).get("assets")
    if not root:
        raise ConfigError("paths.assets is not set; it is where assets are fetched to (conf/paths/default.yaml)")
    registry = load_registry()
    return Path(root), with_inputs([asset for _, asset in needed(resolved, registry)], registry)


def _holding(root: Path, say: Say) -> FolderLock:
    try:
        return FolderLock(root, what="asset folder").acquire()
    except ConfigError:
        say(f"another fetch is writing {root}; waiting for it to finish")
        return FolderLock(root, wait=True, what="asset folder").acquire()


def locked_source(source: Source, lock: Lock) -> Source:
    """``source`` at the commit its branch or tag was locked to (as it is when none was, or it pins one)."""
    if source is None or source.url is not None or places.is_commit(source.revision):
        return source
    commit = lock.commit(source.repo, source.revision)
    return source.at(commit) if commit else source


def pinned(asset: Asset, lock: Lock) -> Asset:
    """``asset`` with its hub revision replaced by the commit the lock holds for it."""
    return asset if asset.source is None else replace(asset, source=locked_source(asset.source, lock))


def files_of(asset: Asset, root: Path, lock: Lock) -> list[AssetFile]:
    return asset.listed_files(root, lock.expanded(asset.name))


def fetch(resolved: dict, say: Say = print, progress: bool = True) -> list[Asset]:
    """Make every asset of ``resolved`` present and verified under ``paths.assets``; return them."""
    root, assets = plan(resolved)
    holder = _holding(root, say)
    try:
        lock = Lock(root)
        for round_ in range(6):  # checksum lists, then what they pin; index files or patterns, then their files
            sources = [pinned(a, lock) for a in assets if a.kind != "derived"]
            missing = _verify_present([f for a in sources for f in files_of(a, root, lock)], root, lock, say)
            lists = {a.checksum_file().relative for a in sources if a.checksums}
            waiting = {f.asset for f in missing if f.relative in lists}  # its files wait for its checksum list
            missing = [f for f in missing if f.relative in lists or f.asset not in waiting]
            pending = [a for a in sources if _unexpanded(a, root, lock)]
            if not missing and not pending:
                break
            if round_ == 5:
                first = (missing or pending[0].listed_files(root))[0]
                raise AssetError(f"{first.source.describe()} is still missing after five rounds; rerun to resume")
            if round_ == 0:
                _preflight(missing, pending, root)
            _get_all(missing, root, lock, progress, say)
            for asset in pending:
                _expand(pinned(asset, lock), root, lock, say)
        for asset in assets:
            if asset.kind == "derived":
                _derive(asset, root, lock, say)
    finally:
        holder.release()
    say(f"{len(assets)} assets present and verified under {root}")
    return assets


def _unexpanded(asset: Asset, root: Path, lock: Lock) -> bool:
    """A folder whose patterns were never matched, or whose index (hence its shards) is not there yet."""
    if asset.patterns and asset.name not in lock.expansions:
        return True
    return asset.shards is not None and not (root / asset.dest / asset.shards).is_file()


def _verify_present(files: list[AssetFile], root: Path, lock: Lock, say: Say) -> list[AssetFile]:
    """Judge the files that are there (locking new ones); return those that are missing."""
    missing = []
    for file in files:
        path = places.inside(root, file.relative, f"asset {file.asset}")
        if not path.is_file():
            missing.append(file)
            continue
        entry = lock.get(file.relative)
        verdict = judge(file, path, entry)
        if verdict.refuse is not None:
            raise AssetError(f"{str(path)!r} ({file.source.describe()}) {verdict.refuse}; remove it and fetch again")
        if entry is None:
            if verdict.warn:
                say(f"warning: {str(path)!r} {verdict.warn}")
            sha, md5 = digests(path, md5=file.md5 is not None)
            lock.record(file.relative, entry_for(file, path, None, sha, md5=md5, warning=verdict.warn))
    return missing


def _preflight(missing: list[AssetFile], pending: list[Asset], root: Path) -> None:
    """Before the first byte: offline mode, every host answering, the disk holding what is coming."""
    first = missing[0] if missing else pending[0].listed_files(root)[0]
    if dl.offline():
        raise AssetError(
            f"HF_HUB_OFFLINE is set and {first.source.describe()} is not at {str(root / first.relative)!r}: "
            "copy the file there, or fetch where there is network"
        )
    seen: dict = {}
    for file in missing + [a.listed_files(root)[0] for a in pending]:
        why = dl.probe(file.source, seen)
        if why is not None:
            raise AssetError(
                f"cannot reach {file.source.describe()} ({why}): copy the file to "
                f"{str(root / file.relative)!r}, or run scripts/fetch.py where there is network"
            )
    coming = sum(file.size or 0 for file in missing) + sum(a.approx_bytes or 0 for a in pending)
    dl.check_space(root, coming, f"fetching {len(missing) + len(pending)} files")


def _commit_for(source: Source, lock: Lock) -> tuple[Source, tuple]:
    """``source`` at a commit (resolving and locking its branch on first use) and the hub's HEAD of it."""
    head = dl.remote_size(source)
    if places.is_commit(source.revision) or not head[1]:
        return source, head
    lock.record_commit(source.repo, source.revision, head[1])
    return source.at(head[1]), head


def _get_all(files: list[AssetFile], root: Path, lock: Lock, progress: bool, say: Say) -> None:
    for file in files:
        if file.source.url is not None:
            _get_url(file, root, lock, progress, say)
            continue
        source, (size, revision, published) = _commit_for(locked_source(file.source, lock), lock)
        file = replace(file, source=source)
        if size is not None:
            dl.check_space(root, size, source.describe())
        say(f"fetching {source.describe()} -> {root / file.relative}")
        staged = dl.download(source, root, file.relative, progress)
        _place(file, staged, root, lock, say, revision or source.revision, (size, published))


def _get_url(file: AssetFile, root: Path, lock: Lock, progress: bool, say: Say) -> None:
    """A URL file from its source, else from each mirror in turn, each judged against the same pins."""
    reasons = []
    for url in file.source.urls():
        one = replace(file, source=replace(file.source, url=url, mirrors=()))
        say(f"fetching {url} -> {root / file.relative}")
        try:
            staged = dl.download(one.source, root, file.relative, progress)
            _place(file, staged, root, lock, say, None)
            return
        except AssetError as exc:
            reasons.append(str(exc))
            dl.staging_path(root, file.relative).unlink(missing_ok=True)
    tried = f" (tried {len(reasons)} sources; the first said: {reasons[0]})" if len(reasons) > 1 else ""
    raise AssetError(reasons[-1] + tried)


def _place(file: AssetFile, staged: Path, root: Path, lock: Lock, say: Say, revision, stated=(None, None)) -> None:
    """Judge a download (its pins, lock entry, and the size and LFS sha256 the hub ``stated`` for it), move it
    into place and lock it; a refusal deletes it and raises."""
    sha, md5 = digests(staged, md5=file.md5 is not None)
    verdict = judge(file, staged, lock.get(file.relative), sha, md5)
    refuse = verdict.refuse
    if refuse is None and stated[0] is not None and staged.stat().st_size != stated[0]:
        refuse = f"has {staged.stat().st_size} bytes; the hub states {stated[0]}"
    if refuse is None and stated[1] is not None and sha != stated[1]:
        refuse = f"has sha256 {sha[:16]}...; the hub publishes {stated[1][:16]}..."
    if refuse is not None:
        staged.unlink(missing_ok=True)
        raise AssetError(f"{file.source.describe()} {refuse}; the download was removed (the upstream file changed?)")
    if verdict.warn:
        say(f"warning: {file.source.describe()} {verdict.warn}")
    path = places.inside(root, file.relative, f"asset {file.asset}")
    path.parent.mkdir(parents=True, exist_ok=True)
    os.replace(staged, path)
    lock.record(file.relative, entry_for(file, path, revision, sha, md5=md5, warning=verdict.warn))


def _expand(asset: Asset, root: Path, lock: Lock, say: Say) -> None:
    """Match a folder's patterns against the hub's tree at its (locked) commit and lock the list."""
    if not asset.patterns or asset.name in lock.expansions:
        return
    source = locked_source(replace(asset.source, file=asset.files[0] if asset.files else None), lock)
    if not places.is_commit(source.revision) and source.file is not None:
        source, _ = _commit_for(source, lock)
    found = dl.list_matching(source, asset.patterns)
    if not found:
        raise AssetError(f"hf://{asset.source.repo}@{source.revision}: no file matches {list(asset.patterns)}")
    names = [places.check_relative(f"asset {asset.name}", "a matched file", name) for name, _, _ in found]
    say(f"{asset.name}: {len(names)} files match {list(asset.patterns)} at {source.revision}")
    lock.record_expansion(asset.name, source.revision, names)


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
