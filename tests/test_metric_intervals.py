"""Intervals on the world's metrics: the resampled FID equals a recomputed FID, every figure carries its _ci."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from lantern.errors import ConfigError
from lantern.files import image_name
from lantern.metrics.bootstrap import SHIFTED
from lantern.metrics.classifier import PromptFaithfulness
from lantern.metrics.features import forget
from lantern.metrics.fid import FID, FIDStats, fid_from_stats
from lantern.metrics.frechet_bootstrap import ResampledFrechet
from lantern.metrics.intervals import bootstrap, bootstrap_mean, resample_indices


@pytest.fixture(autouse=True)
def _fresh_features():
    forget()
    yield
    forget()


def _sets(n: int, dim: int, seed: int = 0) -> tuple[np.ndarray, FIDStats]:
    rng = np.random.default_rng(seed)
    generated = rng.normal(0.2, 1.0, size=(n, dim)) @ rng.normal(size=(dim, dim)) / np.sqrt(dim)  # (n, D)
    reference = FIDStats.from_features(rng.gamma(2.0, 1.0, size=(3 * dim, dim)))  # full rank
    return generated, reference


@pytest.mark.parametrize("n, dim", [(40, 64), (200, 32)])  # fewer rows than dims (Gram route) and more
def test_resampled_fid_equals_the_fid_of_the_resampled_rows(n, dim):
    features, reference = _sets(n, dim)
    resampled = ResampledFrechet(features, reference.mu, reference.sigma)
    identity = np.arange(n)
    assert resampled(identity) == pytest.approx(fid_from_stats(FIDStats.from_features(features), reference), rel=1e-9)
    for draw in np.random.default_rng(1).integers(0, n, size=(3, n)):  # repeats, as in a bootstrap draw
        expected = fid_from_stats(FIDStats.from_features(features[draw]), reference)
        assert resampled(draw) == pytest.approx(expected, rel=1e-9)
    assert resampled(np.array([0, 0, 1, 2, 2, 2])) != pytest.approx(resampled(np.array([0, 1, 2])), rel=1e-3)


class StubExtractor:
    """A fixed random projection of the pixels standing in for Inception (net id of its own)."""

    net_id = "stub-projection"

    def __init__(self) -> None:
        self.projection = np.random.default_rng(0).normal(size=(8 * 8 * 3, 16))

    def features(self, images, batch_size=32, progress=True):
        return np.asarray(images, np.float64).reshape(len(images), -1) @ self.projection  # (N, 16)


def _run_dir(folder, images: np.ndarray):
    folder.mkdir()
    for i, image in enumerate(images):
        Image.fromarray(image).save(folder / image_name(i))
    return folder


def test_fid_records_its_interval_from_fixed_reference_stats(tmp_path):
    rng = np.random.default_rng(3)
    reference = rng.integers(0, 256, (60, 8, 8, 3), dtype=np.uint8)
    generated = np.clip(rng.normal(110, 40, (30, 8, 8, 3)), 0, 255).astype(np.uint8)
    run_dir = _run_dir(tmp_path / "run", generated)
    prompts = ["p"] * 30
    metric = FID(
        "toy",
        lambda: reference,
        cache_dir=str(tmp_path / "stats"),
        progress=False,
        interval_resamples=50,
        extractor=StubExtractor(),
    )
    metric.check(prompts)
    fields = metric(run_dir, prompts, None)
    stub = StubExtractor()
    ref_stats = FIDStats.from_features(stub.features(reference))
    gen = stub.features(generated)
    assert fields["fid"] == pytest.approx(fid_from_stats(FIDStats.from_features(gen), ref_stats), rel=1e-9)
    draws = [fid_from_stats(FIDStats.from_features(gen[rows]), ref_stats) for rows in resample_indices(30, 50, 0)]
    slow = bootstrap(30, lambda rows: fid_from_stats(FIDStats.from_features(gen[rows]), ref_stats), 50, 0)
    assert np.mean(draws) > fields["fid"]  # draws hold ~63 % distinct images: FID is biased upwards
    offset = fields["fid"] - np.mean(draws)
    ci = fields["fid_ci"]
    assert (ci["lo"], ci["hi"]) == pytest.approx((slow.lo + offset, slow.hi + offset), rel=1e-8)
    assert ci["resamples"] == 50 and ci["seed"] == 0 and ci["lo"] < fields["fid"] < ci["hi"]
    assert ci["method"] == SHIFTED
    plain = FID(
        "toy",
        lambda: reference,
        cache_dir=str(tmp_path / "stats"),
        progress=False,
        interval_resamples=50,
        interval_shift=False,
        extractor=StubExtractor(),
    )(run_dir, prompts, None)["fid_ci"]
    assert (plain["lo"], plain["hi"]) == pytest.approx((slow.lo, slow.hi), rel=1e-8)
    assert plain["method"] == "percentile bootstrap over prompts"
    off = FID(
        "toy",
        lambda: reference,
        cache_dir=str(tmp_path / "stats"),
        progress=False,
        interval_resamples=None,
        extractor=StubExtractor(),
    )
    assert "fid_ci" not in off(run_dir, prompts, None)


class FirstPixelClassifier(torch.nn.Module):
    """Predicts class ``gray / 20`` of the top-left pixel (an exact, known classifier)."""

    def __init__(self) -> None:
        super().__init__()
        self.dummy = torch.nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gray = (x[:, 0, 0, 0] + 1) * 127.5  # (N,) pixel (0, 0) back in [0, 255]
        return torch.nn.functional.one_hot(torch.round(gray / 20).long(), 10).float() + self.dummy  # (N, 10)


def test_prompt_accuracy_interval_is_the_bootstrap_of_the_hits(tmp_path):
    labels = np.arange(40) % 10
    images = np.zeros((40, 32, 32, 3), np.uint8)
    images[:, 0, 0] = (labels * 20)[:, None]
    images[:7, 0, 0] = ((labels[:7] + 1) * 20)[:, None]  # 7 images of the next class
    run_dir = _run_dir(tmp_path / "run", images)
    metric = PromptFaithfulness("unused.safetensors", interval_resamples=400, interval_seed=5)
    metric._classifier = FirstPixelClassifier()
    fields = metric(run_dir, ["p"] * 40, labels.tolist())
    hits = np.ones(40)
    hits[:7] = 0
    assert fields["prompt_accuracy"] == pytest.approx(33 / 40)
    expected = bootstrap_mean(hits, 400, 5)
    assert (fields["prompt_accuracy_ci"]["lo"], fields["prompt_accuracy_ci"]["hi"]) == (expected.lo, expected.hi)


@pytest.mark.parametrize("value", [1, 0, -3, 2.5, "many"])
def test_bad_interval_settings_are_one_line(value):
    with pytest.raises(ConfigError, match="interval_resamples"):
        PromptFaithfulness("x", interval_resamples=value)
    with pytest.raises(ConfigError, match="interval_seed"):
        PromptFaithfulness("x", interval_seed=-1)
