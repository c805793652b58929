"""The asset registry: every file a model preset, protocol or metric reads, where it comes from and its pins.

The table is the YAML files of ``conf/assets/`` (one per family or dataset), read into :class:`Asset`
records. An asset is one file (``hub`` + ``file``, or ``url`` with mirrors), a folder of hub files (``hub`` +
``files`` and/or ``patterns``, the weight shards named by the folder's index file, its ``checksums`` file
pinning the others), or a derived file or folder (``recipe`` + ``inputs``). ``dest`` is its place under
``paths.assets``; ``hub.revision`` a branch, tag or 40-hex commit; ``size``/``sha256``/``md5`` are published pins
or null (then the first fetch records them in ``assets.lock.json``, :mod:`lantern.run.assets.store`), and
``verified`` says which pins were checked against a published source (:mod:`lantern.run.assets.places`).

Presets name what they read: ``model.assets`` maps a model key (``gpt_ckpt``) to an asset (or a list of
assets sharing one folder), the top-level ``assets.protocol`` maps a config key (``prompts/path``) to one, and
``assets.extra`` lists assets a protocol derives without reading them. :func:`needed` picks those a run reads.
"""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath

import yaml

from lantern import REPO_ROOT
from lantern.errors import ConfigError
from lantern.metrics.protocol import select
from lantern.run.assets import places

REGISTRY_DIR = REPO_ROOT / "conf" / "assets"
KEYS = {"dest", "hub", "url", "files", "patterns", "shards", "checksums", "recipe", "inputs", "hosts", "pins"}
KEYS |= {"size", "sha256", "md5", "sha256_prefix", "verified", "licence", "approx_bytes", "note", "evidence"}
NO_PINS = {"size": None, "sha256": None, "md5": None, "sha256_prefix": None, "verified": frozenset()}


@dataclass(frozen=True)
class Source:
    """Where one file comes from: a hub repo file at a revision, or an HTTP(S) URL and its mirrors (tried in
    order, each checked against the same pins) with the other hosts its bytes may be redirected to."""

    repo: str | None = None
    file: str | None = None
    revision: str = "main"
    url: str | None = None
    mirrors: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ()

    def describe(self) -> str:
        """``hf://repo@revision/file`` or the URL: what messages and the lock file name."""
        return self.url if self.url else f"hf://{self.repo}@{self.revision}/{self.file}"

    def location(self) -> str:
        """The URL the bytes come from (a hub file: under the hub endpoint, ``HF_ENDPOINT``)."""
        return self.url or f"{hub_endpoint()}/{self.repo}/resolve/{self.revision}/{self.file}"

    def urls(self) -> tuple[str, ...]:
        """Every URL to try, in order (a hub file: its one location)."""
        return (self.url, *self.mirrors) if self.url else (self.location(),)

    def at(self, revision: str) -> Source:
        """The same hub file at another revision (the commit a branch was locked to)."""
        return replace(self, revision=revision)


def hub_endpoint() -> str:
    """The hub's address: ``HF_ENDPOINT`` as this process sees it now (a mirror, or a test server), else huggingface.co."""
    return os.environ.get("HF_ENDPOINT", "").rstrip("/") or "https://huggingface.co"


@dataclass(frozen=True)
class AssetFile:
    """One file of an asset: its path under ``paths.assets``, its source and its pins (``verified``: the pin
    names checked against a published source; see :mod:`lantern.run.assets.places`)."""

    asset: str
    relative: str
    source: Source | None  # None: made by a recipe
    size: int | None = None
    sha256: str | None = None
    sha256_prefix: str | None = None
    md5: str | None = None
    verified: frozenset = frozenset()


@dataclass(frozen=True)
class Asset:
    """One entry of the registry (see the module docstring)."""

    name: str
    dest: str
    licence: str
    source: Source | None = None
    files: tuple[str, ...] = ()
    patterns: tuple[str, ...] = ()
    shards: str | None = None
    checksums: str | None = None
    recipe: dict | None = None
    inputs: tuple[str, ...] = ()
    pinned: dict = field(default_factory=lambda: dict(NO_PINS))
    approx_bytes: float | None = None
    note: str = ""
    pins: dict = field(default_factory=dict)

    @property
    def kind(self) -> str:
        """``file``, ``folder`` (hub files under one folder) or ``derived``."""
        if self.recipe is not None:
            return "derived"
        return "folder" if (self.files or self.patterns) else "file"

    @property
    def sha256(self) -> str | None:
        return self.pinned["sha256"]

    def path(self, root: str | os.PathLike) -> Path:
        """Where the asset lies under ``root`` (``paths.assets``)."""
        return Path(root) / self.dest

    def listed_files(self, root: str | os.PathLike | None = None, expanded: list[str] | None = None) -> list[AssetFile]:
        """Its downloadable files: its checksum list first, then the one file or the folder's named files, the
        shards its index names once the index is under ``root``, and ``expanded`` (the files its patterns
        matched when it was first fetched: :meth:`~lantern.run.assets.store.Lock.expanded`). Once the checksum
        list is under ``root``, its md5 lines pin the others (verified: upstream's own list at the pinned
        revision). A derived asset has none."""
        if self.kind == "derived":
            return []
        listed = [self.checksum_file()] if self.checksums else []
        folder = str(PurePosixPath(self.checksums).parent) if self.checksums else "."
        md5s = checksum_lines(Path(root) / listed[0].relative, folder) if listed and root is not None else {}
        if self.kind == "file":
            pins = self._with_md5(self.pinned, md5s.get(self.source.file or ""))
            return listed + [AssetFile(self.name, self.dest, self.source, **pins)]
        names = [n for n in self.files if n != self.checksums]
        if self.shards is not None and root is not None:
            index = places.inside(root, f"{self.dest}/{self.shards}", f"asset {self.name}")
            names += [n for n in shard_names(index) if n not in names]
        names += [n for n in expanded or () if n not in names]
        return listed + [self.member(name, md5s.get(name)) for name in names]

    def checksum_file(self) -> AssetFile:
        """The upstream checksum list (``checksums:``), beside the file or inside the folder it pins."""
        base = self.dest if self.kind == "folder" else str(PurePosixPath(self.dest).parent)
        relative = f"{base}/{self.checksums if self.kind == 'folder' else PurePosixPath(self.checksums).name}"
        return AssetFile(self.name, relative, replace(self.source, file=self.checksums, url=None))

    def member(self, name: str, md5: str | None = None) -> AssetFile:
        """The folder's file ``name`` with its pins (``pins:`` of the entry, or an md5 line of its checksum list)."""
        pins = self._with_md5(self.pins.get(name) or NO_PINS, md5)
        source = Source(repo=self.source.repo, file=name, revision=self.source.revision)
        return AssetFile(self.name, f"{self.dest}/{name}", source, **pins)

    @staticmethod
    def _with_md5(pins: dict, md5: str | None) -> dict:
        if md5 is None or pins["md5"] is not None:
            return pins
        return {**pins, "md5": md5, "verified": pins["verified"] | {"md5"}}


def checksum_lines(path: Path, folder: str = ".") -> dict[str, str]:
    """md5 by repo path from an ``md5sum``-format list whose names are relative to ``folder`` in the repo."""
    if not path.is_file():
        return {}
    found = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        match = re.match(r"^([0-9a-fA-F]{32})\s+\*?(?:\./)?(\S.*)$", line.strip())
        if match:
            name = str(PurePosixPath(folder) / match.group(2).strip())
            found[name] = match.group(1).lower()
    return found


def shard_names(index: Path) -> list[str]:
    """The weight files a ``*.index.json`` maps tensors to (sorted); [] when the index is not there yet."""
    if not index.is_file():
        return []
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        names = sorted({str(name) for name in weight_map.values()})
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{str(index)!r} is not a weight index (expected a 'weight_map'): {exc}") from exc
    return [places.check_relative(str(index), "a shard of its weight_map", name) for name in names]


def _source(name: str, entry: dict) -> Source | None:
    where = f"asset {name}"
    hub, url = entry.get("hub"), entry.get("url")
    hosts = tuple(str(h) for h in entry.get("hosts") or ())
    if hub is not None:
        if not isinstance(hub, dict) or "repo" not in hub:
            raise ConfigError(f"{where}: hub: expected {{repo, revision[, file]}}")
        revision = places.check_revision(where, hub.get("revision", "main"))
        file = None if hub.get("file") is None else places.check_relative(where, "hub.file", hub["file"])
        return Source(repo=str(hub["repo"]), file=file, revision=revision, hosts=hosts)
    if url is None:
        return None
    urls = [str(u) for u in (url if isinstance(url, (list, tuple)) else [url])]
    for each in urls:
        if not each.startswith(("https://", "http://")):
            raise ConfigError(f"{where}: url {each!r} is not an HTTP(S) URL")
    return Source(url=urls[0], mirrors=tuple(urls[1:]), hosts=hosts)


def _names(where: str, key: str, values) -> tuple[str, ...]:
    return tuple(places.check_relative(where, key, v) for v in values or ())


def _asset(name: str, entry: dict) -> Asset:
    where = f"asset {name}"
    if not isinstance(entry, dict) or "dest" not in entry:
        raise ConfigError(f"{where}: expected a table with at least 'dest'")
    unknown = set(entry) - KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}")
    source = _source(name, entry)
    if (source is None) == (entry.get("recipe") is None):
        raise ConfigError(f"{where}: give exactly one of hub, url or recipe")
    pins = {str(k): places.pins_of(f"{where}: pins.{k}", dict(v or {})) for k, v in (entry.get("pins") or {}).items()}
    _names(where, "pins", pins)
    checksums = entry.get("checksums")
    return Asset(
        name=name,
        dest=places.check_relative(where, "dest", entry["dest"]),
        licence=str(entry.get("licence", "unknown")),
        source=source,
        files=_names(where, "files", entry.get("files")),
        patterns=tuple(str(p) for p in entry.get("patterns") or ()),
        shards=None if entry.get("shards") is None else places.check_relative(where, "shards", entry["shards"]),
        checksums=None if checksums is None else places.check_relative(where, "checksums", checksums),
        recipe=entry.get("recipe"),
        inputs=tuple(entry.get("inputs") or ()),
        pinned=places.pins_of(where, entry),
        approx_bytes=None if entry.get("approx_bytes") is None else float(entry["approx_bytes"]),
        note=str(entry.get("note", "")),
        pins=pins,
    )


def load_registry(folder: str | None = None) -> dict[str, Asset]:
    """Every asset of the YAML files in ``folder`` (default ``LANTERN_ASSET_REGISTRY`` or ``conf/assets/``),
    by name (a name defined twice is refused)."""
    return _load(folder or os.environ.get("LANTERN_ASSET_REGISTRY") or str(REGISTRY_DIR))


@functools.lru_cache(maxsize=8)
def _load(folder: str) -> dict[str, Asset]:
    table: dict[str, Asset] = {}
    for path in sorted(Path(folder).glob("*.yaml")):
        entries = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for name, entry in entries.items():
            if name in table:
                raise ConfigError(f"asset {name} is defined twice (again in {path.name})")
            table[name] = _asset(name, entry)
    for asset in table.values():
        for needed in asset.inputs:
            if needed not in table:
                raise ConfigError(f"asset {asset.name}: input {needed!r} is not in the registry")
    return table


def _strings(tree) -> set[str]:
    if isinstance(tree, dict):
        return set().union(*(_strings(v) for v in tree.values())) if tree else set()
    if isinstance(tree, (list, tuple)):
        return set().union(*(_strings(v) for v in tree)) if tree else set()
    return {os.path.normpath(tree)} if isinstance(tree, str) and tree else set()


def named(resolved: dict) -> list[tuple[str, str]]:
    """(config key, asset name) of every asset the composed presets name, model first; ``-`` for extras."""
    model = resolved.get("model") or {}
    pairs = [(f"model.{key}", name) for key, names in (model.get("assets") or {}).items() for name in _each(names)]
    listed = resolved.get("assets") or {}
    protocol = (listed.get("protocol") or {}).items()
    pairs += [(str(key).replace("/", "."), name) for key, names in protocol for name in _each(names)]
    return pairs + [("-", name) for name in listed.get("extra") or ()]


def _each(names) -> list[str]:
    """An asset name, or a list of names whose files share one place (a folder completed from another repo)."""
    return [str(n) for n in names] if isinstance(names, (list, tuple)) else [str(names)]


def needed(resolved: dict, registry: dict[str, Asset] | None = None) -> list[tuple[str, Asset]]:
    """(config key, asset) of the assets a run of ``resolved`` reads at their registry place.

    A key overridden to another path is the user's file, not an asset. A key counts as read when its path
    appears where the run uses it: any section but ``model``, ``model.bundle``, or ``model.drafter`` when the
    decoder has a ``drafter`` key (it is handed the model's: :func:`lantern.run.compose.build_decoder`), so
    ``decoding=ar`` needs no drafter.
    """
    registry = load_registry() if registry is None else registry
    root = select(resolved, "paths.assets")
    if not root or not named(resolved):
        return []
    used = _strings({k: v for k, v in resolved.items() if k not in ("model", "assets")})
    model = resolved.get("model") or {}
    used |= _strings(model.get("bundle"))
    if "drafter" in (resolved.get("decoding") or {}):
        used |= _strings(model.get("drafter"))
    found = []
    for key, name in named(resolved):
        if name not in registry:
            raise ConfigError(f"{key}: asset {name!r} is not in the registry (conf/assets/)")
        asset = registry[name]
        target = os.path.normpath(asset.path(root))
        value = select(resolved, key)
        if key == "-" or (isinstance(value, str) and os.path.normpath(value) == target and target in used):
            found.append((key, asset))
    return found


def with_inputs(assets: list[Asset], registry: dict[str, Asset]) -> list[Asset]:
    """``assets`` and, before each derived one, the inputs its recipe reads (each once, in dependency order)."""
    ordered: dict[str, Asset] = {}

    def visit(asset: Asset, trail: tuple[str, ...]) -> None:
        if asset.name in trail:
            raise ConfigError(f"asset {asset.name}: its recipe's inputs form a cycle ({' -> '.join(trail)})")
        for name in asset.inputs:
            visit(registry[name], (*trail, asset.name))
        ordered.setdefault(asset.name, asset)

    for asset in assets:
        visit(asset, ())
    return list(ordered.values())
