"""The asset registry: every file a model preset, protocol or metric reads, where it comes from and its pins.

The table is the YAML files of ``conf/assets/`` (one per family or dataset), read into :class:`Asset`
records. An asset is one file (``hub`` + ``file``, or ``url``), a folder of hub files (``hub`` + ``files``,
with the weight shards named by the folder's index file), or a derived file or folder (``recipe`` +
``inputs``). ``dest`` is its place under ``paths.assets``; ``size``/``sha256`` are published pins or null
(then the first fetch records them in ``assets.lock.json``, :mod:`lantern.run.assets.store`).

Presets name what they read: ``model.assets`` maps a model key (``gpt_ckpt``) to an asset, the top-level
``assets.protocol`` maps a config key (``prompts/path``) to one, and ``assets.extra`` lists assets a
protocol derives without reading them (its prompt list). :func:`needed` picks those a composed run reads.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from lantern import REPO_ROOT, checks
from lantern.errors import ConfigError
from lantern.metrics.protocol import select

REGISTRY_DIR = REPO_ROOT / "conf" / "assets"
HEX = set("0123456789abcdef")
KEYS = {"dest", "hub", "url", "files", "shards", "recipe", "inputs", "size", "sha256", "sha256_prefix"}
KEYS |= {"licence", "approx_bytes", "note", "pins"}


@dataclass(frozen=True)
class Source:
    """Where one file comes from: a hub repo file at a revision, or an HTTPS URL."""

    repo: str | None = None
    file: str | None = None
    revision: str = "main"
    url: str | None = None

    def describe(self) -> str:
        """``hf://repo@revision/file`` or the URL: what messages and the lock file name."""
        return self.url if self.url else f"hf://{self.repo}@{self.revision}/{self.file}"

    def location(self) -> str:
        """The URL the bytes come from (a hub file: under the hub endpoint, ``HF_ENDPOINT``)."""
        return self.url or f"{hub_endpoint()}/{self.repo}/resolve/{self.revision}/{self.file}"


def hub_endpoint() -> str:
    """The hub's address: ``HF_ENDPOINT`` as this process sees it now (a mirror, or a test server), else huggingface.co."""
    return os.environ.get("HF_ENDPOINT", "").rstrip("/") or "https://huggingface.co"


@dataclass(frozen=True)
class AssetFile:
    """One file of an asset: its path under ``paths.assets``, its source and its published pins."""

    asset: str
    relative: str
    source: Source | None  # None: made by a recipe
    size: int | None = None
    sha256: str | None = None
    sha256_prefix: str | None = None


@dataclass(frozen=True)
class Asset:
    """One entry of the registry (see the module docstring)."""

    name: str
    dest: str
    licence: str
    source: Source | None = None
    files: tuple[str, ...] = ()
    shards: str | None = None
    recipe: dict | None = None
    inputs: tuple[str, ...] = ()
    size: int | None = None
    sha256: str | None = None
    sha256_prefix: str | None = None
    approx_bytes: float | None = None
    note: str = ""
    pins: dict = field(default_factory=dict)

    @property
    def kind(self) -> str:
        """``file``, ``folder`` (hub files under one folder) or ``derived``."""
        return "derived" if self.recipe is not None else ("folder" if self.files else "file")

    def path(self, root: str | os.PathLike) -> Path:
        """Where the asset lies under ``root`` (``paths.assets``)."""
        return Path(root) / self.dest

    def listed_files(self, root: str | os.PathLike | None = None) -> list[AssetFile]:
        """Its downloadable files: the one file, or the folder's named files plus the shards its index
        names when the index is already under ``root``. A derived asset has none."""
        if self.kind == "derived":
            return []
        if self.kind == "file":
            return [AssetFile(self.name, self.dest, self.source, self.size, self.sha256, self.sha256_prefix)]
        names = list(self.files)
        if self.shards is not None and root is not None:
            names += [n for n in shard_names(self.path(root) / self.shards) if n not in names]
        return [self._member(name) for name in names]

    def _member(self, name: str) -> AssetFile:
        pin = self.pins.get(name) or {}
        source = Source(repo=self.source.repo, file=name, revision=self.source.revision)
        return AssetFile(self.name, f"{self.dest}/{name}", source, pin.get("size"), pin.get("sha256"))


def shard_names(index: Path) -> list[str]:
    """The weight files a ``*.index.json`` maps tensors to (sorted); [] when the index is not there yet."""
    if not index.is_file():
        return []
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        return sorted({str(name) for name in weight_map.values()})
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{str(index)!r} is not a weight index (expected a 'weight_map'): {exc}") from exc


def _sha(name: str, key: str, value) -> str | None:
    if value is None:
        return None
    text = str(value).lower()
    if not set(text) <= HEX or (key == "sha256" and len(text) != 64):
        raise ConfigError(f"asset {name}: {key}={value!r} is not a hex sha256")
    return text


def _asset(name: str, entry: dict) -> Asset:
    if not isinstance(entry, dict) or "dest" not in entry:
        raise ConfigError(f"asset {name}: expected a table with at least 'dest'")
    unknown = set(entry) - KEYS
    if unknown:
        raise ConfigError(f"asset {name}: unknown keys {sorted(unknown)}")
    hub, url = entry.get("hub"), entry.get("url")
    source = None
    if hub is not None:
        source = Source(repo=hub["repo"], file=hub.get("file"), revision=str(hub.get("revision", "main")))
    elif url is not None:
        if not str(url).startswith(("https://", "http://")):
            raise ConfigError(f"asset {name}: url {url!r} is not an HTTP(S) URL")
        source = Source(url=str(url))
    if (source is None) == (entry.get("recipe") is None):
        raise ConfigError(f"asset {name}: give exactly one of hub, url or recipe")
    size = entry.get("size")
    return Asset(
        name=name,
        dest=str(entry["dest"]),
        licence=str(entry.get("licence", "unknown")),
        source=source,
        files=tuple(entry.get("files") or ()),
        shards=entry.get("shards"),
        recipe=entry.get("recipe"),
        inputs=tuple(entry.get("inputs") or ()),
        size=None if size is None else checks.integer(f"asset {name}: size", size, 0),
        sha256=_sha(name, "sha256", entry.get("sha256")),
        sha256_prefix=_sha(name, "sha256_prefix", entry.get("sha256_prefix")),
        approx_bytes=None if entry.get("approx_bytes") is None else float(entry["approx_bytes"]),
        note=str(entry.get("note", "")),
        pins=dict(entry.get("pins") or {}),
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
    pairs = [(f"model.{key}", name) for key, name in (model.get("assets") or {}).items()]
    listed = resolved.get("assets") or {}
    pairs += [(str(key).replace("/", "."), name) for key, name in (listed.get("protocol") or {}).items()]
    return pairs + [("-", name) for name in listed.get("extra") or ()]


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
