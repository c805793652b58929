"""``scripts/fetch.py --list``: every file a run reads, its source, size, pin and place, with no network.

:func:`rows` gives them as records (what ``tests/test_listings.py`` compares with the upstream listings in
``tests/fixtures/hub/listings/``); :func:`lines` as the text ``--list`` prints. A file a folder's index or
patterns will name, before the fetch that learns the names, is one row whose ``name`` is the rule in angle
brackets (``<files matching model*.safetensors>``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lantern.run.assets.fetching import files_of, pinned, plan
from lantern.run.assets.registry import Asset, AssetFile
from lantern.run.assets.store import Lock, expected


@dataclass(frozen=True)
class Row:
    """One listed file: ``source`` is ``hf://repo@revision``, the URL (mirrors after ``|``) or the recipe."""

    asset: str
    source: str
    repo: str | None
    revision: str | None
    name: str  # the path in the repo, the URL's file name, or <a rule> for names not known yet
    relative: str
    size: str
    pin: str
    present: bool
    licence: str

    @property
    def rule(self) -> bool:
        return self.name.startswith("<")


def _pin(file: AssetFile, lock: Lock, checksums: str | None = None) -> str:
    size, sha, where = expected(file, lock)
    if sha:
        return f"sha256 {sha[:12]}... ({where})"
    if checksums and file.md5 is None and file.source.file != checksums:
        return f"md5 from upstream's {checksums} (verified, fetched first); locked on first fetch"
    pins = [f"{k} {getattr(file, k)}" for k in ("md5", "sha256_prefix") if getattr(file, k)]
    if pins:
        state = "verified" if {"md5", "sha256_prefix"} & file.verified else "unverified"
        return ", ".join(pins) + f" ({state}); locked on first fetch"
    if file.source is not None and file.source.url is None:
        return "the hub's size and LFS sha256 at fetch; locked on first fetch"
    return "unpinned: locked on first fetch"


def _size(asset: Asset, file: AssetFile | None, first: bool, count: int, lock: Lock) -> str:
    size = expected(file, lock)[0] if file is not None else None
    if size is not None:
        return f"{size} B"
    if asset.approx_bytes and first:
        return f"~{asset.approx_bytes / 1e9:.2f} GB" + (" in all" if count > 1 else "")
    return "?"


def _source_rows(asset: Asset, root: Path, lock: Lock) -> list[Row]:
    asset = pinned(asset, lock)
    files = files_of(asset, root, lock)
    rules = []
    if asset.shards and not (root / asset.dest / asset.shards).is_file():
        rules.append(f"<weights named by {asset.shards}>")
    if asset.patterns and not lock.expanded(asset.name):
        rules += [f"<files matching {p}>" for p in asset.patterns]
    source = asset.source
    repo, revision = (source.repo, source.revision) if source.url is None else (None, None)
    out = []
    for number, file in enumerate(files + [None] * len(rules)):
        rule = rules[number - len(files)] if file is None else None
        src = file.source if file is not None else source
        name = rule or (src.file if src.url is None else src.url.rsplit("/", 1)[-1])
        relative = file.relative if file is not None else f"{asset.dest}/{rule}"
        where = f"hf://{repo}@{revision}" if src.url is None else " | ".join(src.urls())
        out.append(
            Row(
                asset.name,
                where,
                repo,
                revision,
                name,
                relative,
                _size(asset, file, number == 0, len(files) + len(rules), lock),
                _pin(file, lock, asset.checksums) if file is not None else "locked on first fetch",
                file is not None and (root / file.relative).exists(),
                asset.licence,
            )
        )
    return out


def rows(root: Path, assets: list[Asset]) -> list[Row]:
    """Every file of ``assets`` under ``root`` (derived assets as one row each)."""
    lock = Lock(root)
    out = []
    for asset in assets:
        if asset.kind != "derived":
            out += _source_rows(asset, root, lock)
            continue
        recipe = f"recipe {asset.recipe.get('_target_', '?').rsplit('.', 1)[-1]}({', '.join(asset.inputs)})"
        sha = (lock.get(asset.dest) or {}).get("sha256")
        pin = f"sha256 {sha[:12]}... (its lock entry)" if sha else "made and locked on first fetch"
        present = (root / asset.dest).exists()
        out.append(Row(asset.name, recipe, None, None, asset.dest, asset.dest, "?", pin, present, asset.licence))
    return out


def lines(root: Path, assets: list[Asset]) -> list[str]:
    """The text of ``--list``: one line per file."""
    if not assets:
        return [f"nothing to fetch: this run reads no asset of the registry (paths.assets is {root})"]
    found = rows(root, assets)
    text = [f"assets under {root} ({len(assets)}):"]
    for row in found:
        source = row.source if row.repo is None else f"{row.source}/{row.name}"
        there = "present" if row.present else "missing"
        text.append(
            f"  {row.asset}: {source} | {row.size} | {row.pin} | {root / row.relative} | {there} | {row.licence}"
        )
    return text


def listing(resolved: dict) -> list[str]:
    """One line per file: asset, source, size, pin, destination, and whether it is there (no network)."""
    return lines(*plan(resolved))
