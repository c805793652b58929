"""Prompt sets: what to generate. Image ``i`` of a run uses prompt ``i % len(prompts)``."""

from __future__ import annotations

import os
from collections.abc import Sequence

from lantern.errors import ConfigError

# LlamaGen's own demo classes for class-conditional sampling.
IMAGENET_DEMO_CLASSES = (207, 360, 387, 974, 88, 979, 417, 279)


class PromptSet(Sequence):
    """An indexable, named list of prompts: class ids (``kind = "class"``) or captions (``"text"``)."""

    def __init__(self, name: str, kind: str, items: Sequence, labels: Sequence[int] | None = None):
        if kind not in ("class", "text"):
            raise ConfigError(f"prompt kind must be 'class' or 'text', got {kind!r}")
        if len(items) == 0:
            raise ConfigError(f"prompt set {name!r} is empty")
        self.name = name
        self.kind = kind
        self.items = list(items)
        # Ground-truth class of each prompt where one exists (prompt-faithfulness metrics use it).
        self.labels = list(labels) if labels is not None else None

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index):
        return self.items[index]

    def for_images(self, num_images: int) -> list:
        """The prompt of each image ``0 .. num_images - 1`` (cycling through the set)."""
        return [self.items[i % len(self.items)] for i in range(num_images)]

    def labels_for_images(self, num_images: int) -> list[int] | None:
        """The class of each image ``0 .. num_images - 1`` when the set carries labels."""
        if self.labels is None:
            return None
        return [self.labels[i % len(self.labels)] for i in range(num_images)]


def class_prompts(ids: Sequence[int] = IMAGENET_DEMO_CLASSES, name: str = "classes") -> PromptSet:
    """Class-id prompts for class-conditional models."""
    return PromptSet(name, "class", [int(i) for i in ids])


def caption_prompts(captions: Sequence[str], name: str = "captions") -> PromptSet:
    """Caption prompts given inline."""
    return PromptSet(name, "text", [str(c) for c in captions])


def caption_file(path: str, name: str | None = None) -> PromptSet:
    """Caption prompts from a UTF-8 text file, one per line (blank lines skipped)."""
    if not os.path.isfile(path):
        raise ConfigError(f"prompt file not found: {path!r} (expected a text file with one caption per line)")
    with open(path, encoding="utf-8") as handle:
        captions = [line.strip() for line in handle if line.strip()]
    return PromptSet(name or os.path.basename(path), "text", captions)


def fashion_prompts(count: int = 20, seed: int = 0) -> PromptSet:
    """Balanced Fashion-MNIST captions (prompt ``i`` is of class ``i % 10``), with their labels."""
    from lantern.data.fashion_mnist import prompt_set

    if count < 1:
        raise ConfigError(f"prompt count {count!r} must be >= 1")
    prompts = prompt_set(count, seed)
    return PromptSet("fashion_mnist", "text", [p.caption for p in prompts], labels=[p.label for p in prompts])
