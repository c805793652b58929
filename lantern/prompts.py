"""Prompt sets: what to generate. Image ``i`` of a run uses prompt ``i % len(prompts)``."""

from __future__ import annotations

import os
from collections.abc import Sequence

from lantern.errors import ConfigError

# LlamaGen's own demo classes for class-conditional sampling.
IMAGENET_DEMO_CLASSES = (207, 360, 387, 974, 88, 979, 417, 279)


class PromptSet(Sequence):
    """An indexable, named list of prompts: class ids (``kind = "class"``) or captions (``"text"``)."""

    def __init__(self, name: str, kind: str, items: Sequence):
        if kind not in ("class", "text"):
            raise ConfigError(f"prompt kind must be 'class' or 'text', got {kind!r}")
        if len(items) == 0:
            raise ConfigError(f"prompt set {name!r} is empty")
        self.name = name
        self.kind = kind
        self.items = list(items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index):
        return self.items[index]

    def for_images(self, num_images: int) -> list:
        """The prompt of each image ``0 .. num_images - 1`` (cycling through the set)."""
        return [self.items[i % len(self.items)] for i in range(num_images)]


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
