"""Prompt faithfulness for the embedded world: a small Fashion-MNIST CNN classifier at 32x32.

A generated image is faithful to its prompt when the classifier assigns it the prompt's label.
The classifier sees what the world produces: 28x28 garments centred on a 32x32 background
(padding 2 px of 0, i.e. -1 after scaling), gray values in [-1, 1]. Generated uint8 (N, 32, 32, 3)
images are converted by averaging the channels and scaling ``x / 127.5 - 1``.

``scripts/train_classifier.py`` trains it (:mod:`lantern.training.classifier`) on the 60k train split and writes
``classifier.safetensors`` (fp16); :func:`load_classifier` reads that file strictly.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from lantern import REPO_ROOT, checks
from lantern.errors import ConfigError
from lantern.metrics import knobs
from lantern.metrics.bootstrap import MEAN_RESAMPLES, interval_settings, mean_fields
from lantern.metrics.features import run_images
from lantern.models.checkpoint import load_weights
from lantern.models.world.fashion_mnist import IMAGE_SIZE, NUM_CLASSES, load_split

RESOLUTION = 32
DEFAULT_WIDTH = 16
WEIGHTS_NAME = "classifier.safetensors"
DEFAULT_WEIGHTS = REPO_ROOT / "outputs" / "train" / "classifier" / WEIGHTS_NAME
EXPECTED = "Fashion-MNIST classifier (width {width})"
PAD = (RESOLUTION - IMAGE_SIZE) // 2  # 2 px of background on each side
BACKGROUND = -1.0


def _block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class FashionClassifier(nn.Module):
    """A small CNN: (N, C, 32, 32) images in [-1, 1] -> (N, 10) class logits.

    The C input channels are averaged to one gray channel first, so the world's 3-channel images
    and 1-channel training batches are treated alike. ``width`` is the channel count of the first
    stage (then 2x and 4x); the default has ~45k parameters.
    """

    def __init__(self, width: int = DEFAULT_WIDTH, num_classes: int = NUM_CLASSES, dropout: float = 0.1) -> None:
        """Build the network (no I/O; weights come from :func:`load_classifier`)."""
        super().__init__()
        if not isinstance(width, int) or width < 1:
            raise checks.refuse("classifier width", width, "an integer >= 1")
        w = width
        self.width = width
        self.features = nn.Sequential(
            _block(1, w),
            _block(w, w),
            nn.MaxPool2d(2),  # (N, w, 16, 16)
            _block(w, 2 * w),
            _block(2 * w, 2 * w),
            nn.MaxPool2d(2),  # (N, 2w, 8, 8)
            _block(2 * w, 4 * w),
            nn.MaxPool2d(2),  # (N, 4w, 4, 4)
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(dropout), nn.Linear(4 * w * 16, num_classes))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """(N, C, 32, 32) float in [-1, 1] -> (N, num_classes) logits."""
        if images.ndim != 4 or tuple(images.shape[2:]) != (RESOLUTION, RESOLUTION):
            raise ConfigError(f"classifier input must be (N, C, {RESOLUTION}, {RESOLUTION}), got {tuple(images.shape)}")
        gray = images.mean(dim=1, keepdim=True)  # (N, 1, 32, 32)
        return self.head(self.features(gray))  # (N, 10)


def load_classifier(
    path: str | os.PathLike = DEFAULT_WEIGHTS, width: int = DEFAULT_WIDTH, device: str | torch.device = "cpu"
) -> FashionClassifier:
    """Build a :class:`FashionClassifier` and load ``path`` strictly into it; returned in eval mode.

    Raises :class:`lantern.errors.CheckpointError` when the file is missing or does not match.
    """
    model = FashionClassifier(width)
    load_weights(model, path, expected=EXPECTED.format(width=width), role="metric")
    return model.to(device).eval()


def to_classifier_input(images: np.ndarray | torch.Tensor) -> torch.Tensor:
    """uint8 (N, 32, 32, 3) (or gray (N, 32, 32)) pixels -> float32 (N, 1, 32, 32) gray in [-1, 1]."""
    pixels = torch.as_tensor(np.asarray(images)) if not isinstance(images, torch.Tensor) else images
    if pixels.dtype != torch.uint8:
        raise ConfigError(f"classifier images must be uint8 pixels, got dtype {pixels.dtype}")
    if pixels.ndim == 3:
        pixels = pixels.unsqueeze(-1)  # (N, H, W, 1)
    if pixels.ndim != 4 or tuple(pixels.shape[1:3]) != (RESOLUTION, RESOLUTION) or pixels.shape[3] not in (1, 3):
        raise ConfigError(
            f"classifier images must be uint8 (N, {RESOLUTION}, {RESOLUTION}, 3), got {tuple(pixels.shape)}"
        )
    gray = pixels.float().mean(dim=3)  # (N, 32, 32) in [0, 255]
    return (gray / 127.5 - 1.0).unsqueeze(1)  # (N, 1, 32, 32)


@torch.no_grad()
def predict(classifier: nn.Module, images: np.ndarray | torch.Tensor, batch_size: int = 500) -> np.ndarray:
    """Predicted labels (N,) int64 of uint8 (N, 32, 32, 3) images, in batches, in eval mode."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise checks.refuse("batch_size", batch_size, "an integer >= 1")
    inputs = to_classifier_input(images)  # (N, 1, 32, 32)
    if len(inputs) == 0:
        raise ConfigError("no images given to the classifier")
    device = next(classifier.parameters()).device
    was_training = classifier.training
    classifier.eval()
    try:
        preds = [
            classifier(inputs[i : i + batch_size].to(device)).argmax(dim=1).cpu()  # (B,)
            for i in range(0, len(inputs), batch_size)
        ]
    finally:
        classifier.train(was_training)
    return torch.cat(preds).numpy().astype(np.int64)  # (N,)


def prompt_accuracy(
    classifier: nn.Module,
    images_uint8: np.ndarray | torch.Tensor,
    labels: Sequence[int] | np.ndarray,
    batch_size: int = 500,
) -> float:
    """Fraction of images whose predicted class equals the prompt's label (in [0, 1])."""
    labels = np.asarray(labels)
    if labels.ndim != 1 or len(labels) != len(images_uint8):
        raise ConfigError(
            f"labels must be shaped ({len(images_uint8)},) to match the images, got {tuple(labels.shape)}"
        )
    if len(labels) and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
        raise ConfigError(f"labels must be in 0..{NUM_CLASSES - 1}, found {labels.min()}..{labels.max()}")
    preds = predict(classifier, images_uint8, batch_size)  # (N,)
    return float((preds == labels).mean())


def pad_to_world(images: np.ndarray) -> np.ndarray:
    """uint8 (N, 28, 28) Fashion-MNIST -> uint8 (N, 32, 32, 3) as the world's images look (0 border)."""
    images = np.asarray(images)
    if images.dtype != np.uint8 or images.ndim != 3 or images.shape[1:] != (IMAGE_SIZE, IMAGE_SIZE):
        raise ConfigError(f"expected uint8 (N, {IMAGE_SIZE}, {IMAGE_SIZE}) images, got {images.dtype} {images.shape}")
    padded = np.pad(images, ((0, 0), (PAD, PAD), (PAD, PAD)))  # (N, 32, 32)
    return np.repeat(padded[..., None], 3, axis=3)  # (N, 32, 32, 3)


def fashion_test_images(count: int | None = None) -> np.ndarray:
    """The shipped Fashion-MNIST test split as the world's images: uint8 (N, 32, 32, 3)."""
    images, _ = load_split(None, "test")
    return pad_to_world(images[:count] if count else images)


class PromptFaithfulness:
    """Share of images the world's classifier assigns to the prompted class (labelled prompt sets only)."""

    def __init__(
        self, classifier_path: str, interval_resamples: int | None = MEAN_RESAMPLES, interval_seed: int = 0
    ) -> None:
        self.classifier_path = classifier_path
        self.interval_resamples, self.interval_seed = interval_settings(
            interval_resamples, interval_seed, "faithfulness"
        )
        self._classifier = None

    def check(self, prompts: Sequence, labels: Sequence[int] | None = None) -> None:
        """Before the first image: the prompts carry labels and the classifier loads (it is kept)."""
        if labels is None:
            raise ConfigError("prompt faithfulness needs a labelled prompt set (the world's prompts), not this one")
        self._classifier = load_classifier(self.classifier_path)

    def __call__(self, run_dir: Path, prompts: Sequence, labels: Sequence[int] | None) -> dict:
        if self._classifier is None:
            self.check(prompts, labels)
        predicted = predict(self._classifier, run_images(run_dir, len(prompts)).source)  # (N,)
        hits = (predicted == np.asarray(labels)).astype(np.float64)  # (N,) 1 where faithful
        return mean_fields("prompt_accuracy", hits, self.interval_resamples, self.interval_seed)


PromptFaithfulness.dry = knobs.dry_metric(PromptFaithfulness, "faithfulness", files=("classifier_path",))
