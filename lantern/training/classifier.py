"""Training the world's Fashion-MNIST classifier (the model itself is in :mod:`lantern.metrics.classifier`).

Augmented batches at the world's 32x32 layout and the cross-entropy objective for
:class:`lantern.training.loop.Trainer`; ``scripts/train_classifier.py`` drives them.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

from lantern.metrics.classifier import BACKGROUND, PAD, RESOLUTION, FashionClassifier


def training_batch(
    images: torch.Tensor, labels: torch.Tensor, indices: torch.Tensor, augment: bool = True, max_shift: int = 2
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch ``(x (B, 1, 32, 32) in [-1, 1], y (B,))`` from uint8 (N, 28, 28) images and (N,) labels.

    Without augmentation ``x`` equals ``FashionMNISTImages(..., resolution=32)`` (one channel). With
    it, each image is shifted by up to ``max_shift`` px (background fills in) and mirrored left-right
    with probability 1/2, using the global torch generator (checkpointed by the training loop).
    """
    x = images[indices].float().div(127.5).sub(1.0).unsqueeze(1)  # (B, 1, 28, 28)
    y = labels[indices]
    if not augment:
        return F.pad(x, (PAD, PAD, PAD, PAD), value=BACKGROUND), y  # (B, 1, 32, 32)
    margin = PAD + max_shift
    canvas = F.pad(x, (margin, margin, margin, margin), value=BACKGROUND)  # (B, 1, 32 + 2s, 32 + 2s)
    offsets = torch.randint(0, 2 * max_shift + 1, (len(x), 2))  # (B, 2)
    flips = torch.rand(len(x)) < 0.5  # (B,)
    out = torch.stack(
        [canvas[i, :, dy : dy + RESOLUTION, dx : dx + RESOLUTION] for i, (dy, dx) in enumerate(offsets.tolist())]
    )  # (B, 1, 32, 32)
    out[flips] = out[flips].flip(-1)
    return out, y


class ClassifierObjective:
    """Cross-entropy step for :class:`lantern.training.loop.Trainer`: ``(x, y) -> (loss, {"acc": ...})``."""

    def __init__(self, model: FashionClassifier, label_smoothing: float = 0.0) -> None:
        """Wrap ``model``; ``label_smoothing`` as in :func:`torch.nn.functional.cross_entropy`."""
        self.model = model
        self.label_smoothing = float(label_smoothing)

    def __call__(self, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, Mapping[str, torch.Tensor]]:
        """Loss and batch accuracy of one ``(x (B, 1, 32, 32), y (B,))`` batch."""
        device = next(self.model.parameters()).device
        x, y = batch[0].to(device), batch[1].to(device)
        logits = self.model(x)  # (B, 10)
        loss = F.cross_entropy(logits, y, label_smoothing=self.label_smoothing)
        acc = (logits.detach().argmax(dim=1) == y).float().mean()
        return loss, {"acc": acc}
