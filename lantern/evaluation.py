"""Quality metrics computed at the end of a run, chosen by the ``metrics`` config group.

Each metric is called with the run folder (the index-named PNGs), the prompts and, where the prompt
set has them, the class labels, and returns the entries it adds to ``metrics.json``. Constructors do
no I/O: reference images, statistics and weights are read when the metric is computed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from lantern.errors import ConfigError
from lantern.images import image_name


def read_images(run_dir: str | Path, count: int) -> np.ndarray:
    """The run's first ``count`` images as uint8 (N, H, W, 3)."""
    from PIL import Image

    return np.stack([np.asarray(Image.open(Path(run_dir) / image_name(i)).convert("RGB")) for i in range(count)])


def fashion_test_images(count: int | None = None) -> np.ndarray:
    """The shipped Fashion-MNIST test split as the world's images: uint8 (N, 32, 32, 3)."""
    from lantern.data.fashion_mnist import load_split
    from lantern.metrics.classifier import pad_to_world

    images, _ = load_split(None, "test")
    return pad_to_world(images[:count] if count else images)


def image_folder(path: str) -> str:
    """A reference folder of images, checked to exist (its statistics are computed and cached by FID)."""
    if not Path(path).is_dir():
        raise ConfigError(f"FID reference folder not found: {path!r}")
    return str(path)


class FID:
    """FID of the run's images against a reference set, with clean-fid's resize and Inception features.

    ``reference`` returns the reference images (uint8 array) or a folder of images; its statistics are
    cached under ``cache_dir`` keyed by ``reference_name``, resolution, feature network and size.
    """

    def __init__(
        self, reference_name: str, reference: Callable[[], np.ndarray | str], batch_size: int = 64,
        cache_dir: str = "outputs/fid_stats", device: str = "cpu", progress: bool = True,
    ):
        self.reference_name, self.reference = reference_name, reference
        self.batch_size, self.cache_dir, self.device, self.progress = batch_size, cache_dir, device, progress
        self._reference = None

    def check(self, prompts: Sequence, labels: Sequence[int] | None = None) -> None:
        """Before the first image: the Inception weights are installed and the reference set is there
        (a folder must hold PNGs); the reference is kept for :meth:`__call__`."""
        from lantern.metrics.fid import inception_path, list_pngs

        inception_path()
        self._reference = self.reference()
        if not isinstance(self._reference, np.ndarray):
            list_pngs(self._reference)

    def __call__(self, run_dir: Path, prompts: Sequence, labels: Sequence[int] | None) -> dict:
        from lantern.metrics.fid import FIDStats, InceptionFeatures, fid_from_stats, reference_stats

        start = time.perf_counter()
        extractor = InceptionFeatures(self.device)
        images = read_images(run_dir, len(prompts))
        reference_images = self._reference if self._reference is not None else self.reference()
        reference = reference_stats(
            f"{self.reference_name}_{len(reference_images)}" if isinstance(reference_images, np.ndarray) else self.reference_name,
            reference_images, extractor, self.cache_dir, batch_size=self.batch_size, progress=self.progress,
        )
        generated = FIDStats.from_features(extractor.features(images, batch_size=self.batch_size, progress=self.progress))
        return {"fid": fid_from_stats(generated, reference), "fid_reference": self.reference_name,
                "fid_seconds": time.perf_counter() - start}


class PromptFaithfulness:
    """Share of images the world's classifier assigns to the prompted class (labelled prompt sets only)."""

    def __init__(self, classifier_path: str):
        self.classifier_path = classifier_path
        self._classifier = None

    def check(self, prompts: Sequence, labels: Sequence[int] | None = None) -> None:
        """Before the first image: the prompts carry labels and the classifier loads (it is kept)."""
        from lantern.metrics.classifier import load_classifier

        if labels is None:
            raise ConfigError("prompt faithfulness needs a labelled prompt set (the world's prompts), not this one")
        self._classifier = load_classifier(self.classifier_path)

    def __call__(self, run_dir: Path, prompts: Sequence, labels: Sequence[int] | None) -> dict:
        from lantern.metrics.classifier import predict

        if self._classifier is None:
            self.check(prompts, labels)
        predicted = predict(self._classifier, read_images(run_dir, len(prompts)))
        return {"prompt_accuracy": float((predicted == np.asarray(labels)).mean())}
