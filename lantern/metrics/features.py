"""Images and features shared by every metric of a run: read once, extracted once per network.

A run's metrics (FID, KID, IS on Inception; precision/recall on VGG16; CLIP, HPS) all start from the
same images. :func:`run_images` reads a run folder's first ``count`` images once per process (keyed by
the folder, the count and the files' sizes and modification times) and fingerprints their pixels;
:func:`features` memoises the features of an image set per (network id, fingerprint), and with a
``cache_dir`` also keeps them on disk as ``features/<net_id>-<fingerprint>.npz`` with the digest of their
content (for reference sets, which every run reads; an altered file is recomputed, with a line on stderr).
A network is built at most once per key (:func:`shared`); extractors load it on first use, so nothing is
loaded when every feature is cached.

An image source is a uint8 (N, H, W, 3) array (gray (N, H, W) is replicated) or a folder of PNGs
(sorted recursively, read a batch at a time; sizes may differ).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
from PIL import Image

from lantern.errors import ConfigError
from lantern.files import cache_mismatch, content_digest, image_name, write_atomic

ImageSource = np.ndarray | str | os.PathLike
MEMORY_ENTRIES = 8
"""Feature arrays kept in memory (the generated and reference sets of a few networks)."""


def as_rgb_batch(images: np.ndarray) -> np.ndarray:
    """Check and normalise an image array to (N, H, W, 3) uint8 (gray (N, H, W[, 1]) is replicated)."""
    images = np.asarray(images)
    if images.dtype != np.uint8:
        raise ConfigError(f"metric images must be uint8 pixels in [0, 255], got dtype {images.dtype}")
    if images.ndim == 3:
        images = images[..., None]  # (N, H, W, 1)
    if images.ndim != 4 or images.shape[-1] not in (1, 3):
        raise ConfigError(f"metric images must be shaped (N, H, W, 3) (or gray (N, H, W)), got {images.shape}")
    if images.shape[-1] == 1:
        images = np.repeat(images, 3, axis=-1)  # (N, H, W, 3)
    return images


def list_pngs(folder: str | os.PathLike) -> list[Path]:
    """The PNG files under ``folder`` (recursively, like clean-fid), sorted; ConfigError if there are none."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(f"image folder not found: {str(folder)!r}")
    files = sorted(p for p in folder.rglob("*") if p.suffix.lower() == ".png" and p.is_file())
    if not files:
        raise ConfigError(f"no .png images in {str(folder)!r}")
    return files


def read_png(path: Path) -> np.ndarray:
    """One image file as (H, W, 3) uint8 RGB; ConfigError naming it if it cannot be read."""
    try:
        with Image.open(path) as image:
            return np.asarray(image.convert("RGB"))  # (H, W, 3) uint8
    except OSError as exc:
        raise ConfigError(f"{str(path)!r} is not a readable image ({exc})") from exc


def count(source: ImageSource) -> int:
    """How many images ``source`` holds."""
    return len(source) if isinstance(source, np.ndarray) else len(list_pngs(source))


def iter_batches(source: ImageSource, batch_size: int) -> Iterator[Sequence[np.ndarray]]:
    """Batches of (H, W, 3) uint8 images from an array or a PNG folder (a folder is read a batch at a time)."""
    if isinstance(source, np.ndarray):
        images = as_rgb_batch(source)
        for start in range(0, len(images), batch_size):
            yield images[start : start + batch_size]
        return
    files = list_pngs(source)
    for start in range(0, len(files), batch_size):
        yield [read_png(p) for p in files[start : start + batch_size]]


def fingerprint(source: ImageSource) -> str:
    """SHA-256 of an array's shape and pixels, or of a folder's relative file names and bytes."""
    digest = hashlib.sha256()
    if isinstance(source, np.ndarray):
        array = np.ascontiguousarray(as_rgb_batch(source))  # (N, H, W, 3)
        digest.update(repr(array.shape).encode())
        digest.update(array.tobytes())
        return digest.hexdigest()
    root = Path(source)
    for path in list_pngs(root):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


@dataclass(frozen=True)
class ImageSet:
    """An image source with its fingerprint (computed once)."""

    source: ImageSource
    fingerprint: str

    def __len__(self) -> int:
        return count(self.source)


_FOLDERS: dict[tuple, str] = {}


def image_set(source: ImageSource) -> ImageSet:
    """``source`` with its fingerprint; a folder's is memoised by its files' names, sizes and times."""
    if isinstance(source, np.ndarray):
        return ImageSet(source, fingerprint(source))
    files = list_pngs(source)
    key = (os.path.realpath(source), tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files))
    if key not in _FOLDERS:
        _FOLDERS[key] = fingerprint(source)
    return ImageSet(source, _FOLDERS[key])


_RUNS: OrderedDict[tuple, ImageSet] = OrderedDict()


def run_images(run_dir: str | os.PathLike, count: int) -> ImageSet:
    """A run's first ``count`` index-named images as one uint8 (N, H, W, 3) set, read once per process.

    The key holds every file's size and modification time, so images rewritten in place are read again.
    """
    folder = Path(run_dir)
    paths = [folder / image_name(i) for i in range(count)]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise ConfigError(f"{str(folder)!r} lacks {len(missing)} of its {count} images (first: {missing[0]})")
    key = (os.path.realpath(folder), tuple((s.st_size, s.st_mtime_ns) for s in (p.stat() for p in paths)))
    if key not in _RUNS:
        _RUNS[key] = image_set(np.stack([read_png(p) for p in paths]))  # (N, H, W, 3)
        while len(_RUNS) > 2:
            _RUNS.popitem(last=False)
    _RUNS.move_to_end(key)
    return _RUNS[key]


class Extractor(Protocol):
    """A feature network: a stable id (network and preprocessing) and features of an image source."""

    net_id: str

    def features(self, images: ImageSource, batch_size: int = ..., progress: bool = ...) -> np.ndarray:
        """(N, D) features of an image array or PNG folder."""


_NETWORKS: dict[tuple, object] = {}
_FEATURES: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()


def weights_net_id(base: str, weights: str | os.PathLike) -> str:
    """``base`` with a digest of the weights file: features and statistics cached under one network name are
    reused only for the same bytes (two files of one architecture give other features)."""
    from lantern.files import sha256_cached

    return f"{base}-w{sha256_cached(weights)[:16]}"


def shared(key: tuple, build: Callable[[], object]) -> object:
    """The object ``build()`` made for ``key`` in this process (a network is loaded once per run)."""
    if key not in _NETWORKS:
        _NETWORKS[key] = build()
    return _NETWORKS[key]


def _disk_path(cache_dir: str | os.PathLike, net_id: str, digest: str) -> Path:
    return Path(cache_dir) / "features" / f"{re.sub(r'[^A-Za-z0-9._-]+', '_', net_id)}-{digest[:32]}.npz"


def _save_npz(path: Path, values: np.ndarray) -> None:
    digest = content_digest({"values": values})

    def write(tmp: str) -> None:
        with open(tmp, "wb") as handle:  # a handle, so numpy does not append .npz to the temporary name
            np.savez(handle, values=values, digest=np.str_(digest))

    write_atomic(path, write)


def _load_npz(path: Path, rows: int) -> np.ndarray | None:
    """The (rows, D) features cached in ``path``, or None (reported on stderr when the file is there but its
    content differs from its digest or its shape from the set's)."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            values, digest = data["values"], str(data["digest"])
    except (OSError, ValueError, KeyError, EOFError):
        values, digest = None, None
    if values is None or digest != content_digest({"values": values}):
        cache_mismatch(path)
        return None
    if values.ndim != 2 or len(values) != rows:
        cache_mismatch(path, f"holds features shaped {values.shape}, not ({rows}, D)")
        return None
    return values


def features(
    extractor: Extractor,
    images: ImageSet,
    *,
    batch_size: int = 32,
    progress: bool = True,
    cache_dir: str | os.PathLike | None = None,
) -> np.ndarray:
    """(N, D) features of ``images`` under ``extractor.net_id``, computed at most once per process.

    ``extractor.features`` runs only when the features are neither in memory nor, with ``cache_dir``,
    on disk (so an extractor that loads its network on first use loads nothing for cached sets).
    The returned array is read-only.
    """
    key = (extractor.net_id, images.fingerprint)
    if key in _FEATURES:
        _FEATURES.move_to_end(key)
        return _FEATURES[key]
    path = None if cache_dir is None else _disk_path(cache_dir, extractor.net_id, images.fingerprint)
    values = None if path is None else _load_npz(path, len(images))
    if values is None:
        values = np.asarray(extractor.features(images.source, batch_size=batch_size, progress=progress))
        if path is not None:
            _save_npz(path, values)
    values.setflags(write=False)
    _FEATURES[key] = values
    while len(_FEATURES) > MEMORY_ENTRIES:
        _FEATURES.popitem(last=False)
    return values


def forget() -> None:
    """Drop every memoised image set, network and feature array (tests; a long process between runs)."""
    _RUNS.clear()
    _FOLDERS.clear()
    _NETWORKS.clear()
    _FEATURES.clear()
