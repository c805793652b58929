"""Reference statistics for FID: mean and covariance of a feature set, and their cache on disk.

Reference statistics are cached as ``.npz`` files keyed by (reference set name, resolution,
feature network id, number of images); each file also stores its key, a fingerprint of the
images and a digest of its own content: a file whose stored key or fingerprint differs is recomputed,
never reused, and one whose content differs from its digest is also recomputed, with a line on stderr.
A shipped world's statistics of exactly the same set are taken before the cache (:func:`shipped_stats`).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from lantern import REPO_ROOT
from lantern.errors import ConfigError
from lantern.files import cache_mismatch, content_digest, write_atomic
from lantern.metrics import features as shared_features
from lantern.metrics.features import ImageSource, as_rgb_batch, list_pngs, read_png

DEFAULT_STATS_DIR = REPO_ROOT / "outputs" / "fid_stats"


FeatureExtractor = shared_features.Extractor
"""What the statistics cache needs from a feature network (a ``net_id`` and ``features``)."""


@dataclass(frozen=True)
class FIDStats:
    """Mean (D,) and covariance (D, D), float64, of ``count`` feature vectors."""

    mu: np.ndarray
    sigma: np.ndarray
    count: int

    @classmethod
    def from_features(cls, features: np.ndarray) -> FIDStats:
        """Statistics of (N, D) features (N >= 2), with the unbiased covariance as clean-fid uses."""
        features = np.asarray(features, dtype=np.float64)
        if features.ndim != 2 or len(features) < 2:
            raise ConfigError(f"FID needs at least 2 feature vectors shaped (N, D), got {features.shape}")
        mu = features.mean(axis=0)  # (D,)
        sigma = np.cov(features, rowvar=False)  # (D, D)
        return cls(mu, sigma, len(features))


@dataclass(frozen=True)
class StatsKey:
    """Identity of cached reference statistics."""

    name: str
    resolution: int
    feature_net: str
    count: int

    def filename(self) -> str:
        """``<name>-<resolution>px-<feature_net>-n<count>.npz`` with unsafe characters replaced."""

        def safe(text: str) -> str:
            return re.sub(r"[^A-Za-z0-9._-]+", "_", text)

        return f"{safe(self.name)}-{self.resolution}px-{safe(self.feature_net)}-n{self.count}.npz"


def _source_key_and_fingerprint(name: str, images: ImageSource, feature_net: str) -> tuple[StatsKey, str]:
    """The cache key of an image set and a SHA-256 of its pixels (arrays) or file bytes (folders)."""
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"reference set name must be a non-empty string, got {name!r}")
    if isinstance(images, np.ndarray):
        images = as_rgb_batch(images)  # (N, H, W, 3)
        (height, width), count = images.shape[1:3], len(images)
    else:
        files = list_pngs(images)
        (height, width), count = read_png(files[0]).shape[:2], len(files)
    if count < 2:
        raise ConfigError(f"reference set {name!r} needs at least 2 images, got {count}")
    # A set of one square size is keyed by it; a raw set (SJD's val2017 as it is: sizes vary) by 0. Either way the
    # fingerprint of its pixels or file bytes decides whether cached statistics are this set's.
    resolution = int(height) if height == width else 0
    return StatsKey(name, resolution, feature_net, int(count)), shared_features.image_set(images).fingerprint


def _stats_digest(mu: np.ndarray, sigma: np.ndarray, count: int, key: str, fingerprint: str) -> str:
    return content_digest({"mu": mu, "sigma": sigma, "count": np.int64(count), "key": key, "fingerprint": fingerprint})


def load_cached_stats(path: str | os.PathLike, key: StatsKey, fingerprint: str | None = None) -> FIDStats | None:
    """The statistics in ``path`` if it exists and was written for ``key`` (and ``fingerprint``), else None.

    A file whose content differs from the digest stored with it (altered, cut short, or written before
    digests) is reported on stderr and never used."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            stored_key, stored_fingerprint = str(data["key"]), str(data["fingerprint"])
            mu, sigma, count, digest = data["mu"], data["sigma"], int(data["count"]), str(data["digest"])
    except (OSError, ValueError, KeyError, EOFError):
        digest = None
    if digest is None or digest != _stats_digest(mu, sigma, count, stored_key, stored_fingerprint):
        cache_mismatch(path)
        return None
    if json.loads(stored_key) != asdict(key) or (fingerprint is not None and stored_fingerprint != fingerprint):
        return None
    if count != key.count or mu.ndim != 1 or sigma.shape != (len(mu), len(mu)):
        return None
    return FIDStats(mu, sigma, count)


def save_stats(path: str | os.PathLike, stats: FIDStats, key: StatsKey, fingerprint: str) -> Path:
    """Write ``stats`` with its ``key``, ``fingerprint`` and content digest to ``path`` atomically
    (:func:`lantern.files.write_atomic`)."""
    stored_key = json.dumps(asdict(key), sort_keys=True)
    digest = _stats_digest(stats.mu, stats.sigma, stats.count, stored_key, fingerprint)

    def write(tmp: str) -> None:
        with open(tmp, "wb") as handle:  # a handle, so numpy does not append .npz to the temporary name
            np.savez(
                handle,
                mu=stats.mu,
                sigma=stats.sigma,
                count=np.int64(stats.count),
                key=np.str_(stored_key),
                fingerprint=np.str_(fingerprint),
                digest=np.str_(digest),
            )

    return write_atomic(path, write)


def shipped_stats(key: StatsKey, fingerprint: str) -> FIDStats | None:
    """Statistics a shipped world carries for exactly this set (``worlds/*/<key file name>``, float32, pinned in
    the world's manifest and checked like its other files), so a first run extracts no reference features."""
    from lantern.models.world.load import world_file

    for folder in sorted((REPO_ROOT / "worlds").glob("*")):
        if (folder / key.filename()).is_file():
            stats = load_cached_stats(world_file(str(folder), key.filename()), key, fingerprint)
            return (
                None
                if stats is None
                else FIDStats(stats.mu.astype(np.float64), stats.sigma.astype(np.float64), stats.count)
            )
    return None


def reference_stats(
    name: str,
    images: ImageSource,
    extractor: FeatureExtractor,
    cache_dir: str | os.PathLike = DEFAULT_STATS_DIR,
    *,
    batch_size: int = 32,
    progress: bool = True,
) -> FIDStats:
    """Statistics of a named reference set, from ``cache_dir`` when cached for exactly this set.

    ``images`` is a uint8 (N, H, W, 3) array or a folder of PNGs. The key is (``name``, resolution,
    ``extractor.net_id``, N); a cached file whose stored key or image fingerprint differs is
    recomputed and overwritten. A shipped world's statistics of exactly this set come first (:func:`shipped_stats`).
    """
    key, fingerprint = _source_key_and_fingerprint(name, images, extractor.net_id)
    shipped = shipped_stats(key, fingerprint)
    if shipped is not None:
        return shipped
    path = Path(cache_dir) / key.filename()
    cached = load_cached_stats(path, key, fingerprint)
    if cached is not None:
        return cached
    stats = FIDStats.from_features(extractor.features(images, batch_size=batch_size, progress=progress))
    save_stats(path, stats, key, fingerprint)
    return stats
