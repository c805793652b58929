"""Prompt sets: what to generate. Image ``i`` of a run uses prompt ``i % len(prompts)``."""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Sequence

from lantern import checks
from lantern.errors import ConfigError
from lantern.files import note_input

# LlamaGen's own demo classes for class-conditional sampling.
IMAGENET_DEMO_CLASSES = (207, 360, 387, 974, 88, 979, 417, 279)


class PromptSet(Sequence):
    """An indexable, named list of prompts: class ids (``kind = "class"``) or captions (``"text"``)."""

    def __init__(self, name: str, kind: str, items: Sequence, labels: Sequence[int] | None = None):
        checks.choice("prompt kind", kind, ("class", "text"))
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


def read_text(path: str, what: str) -> str:
    """The UTF-8 text of the file ``path`` (a ``what``: for messages), without a leading BOM; one ConfigError naming the file
    and the line for a binary file or one in another encoding."""
    with open(path, "rb") as handle:
        data = handle.read()
    if b"\x00" in data:
        line = data[: data.index(b"\x00")].count(b"\n") + 1
        raise ConfigError(
            f"{what} {path!r} is a binary file, not text (a NUL byte on line {line}); give a UTF-8 text file"
        )
    try:
        return data.decode("utf-8-sig")  # a leading byte-order mark (Windows editors write one) is not text
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ConfigError(
            f"{what} {path!r} is not UTF-8 text: line {line}, column {column} has the byte "
            f"0x{data[exc.start]:02x}; save it as UTF-8"
        ) from None


def caption_file(path: str, name: str | None = None) -> PromptSet:
    """Caption prompts from a UTF-8 text file, one per line (blank lines skipped)."""
    if not os.path.isfile(path):
        raise ConfigError(f"prompt file not found: {path!r} (expected a text file with one caption per line)")
    captions = [line.strip() for line in read_text(path, "prompt file").splitlines() if line.strip()]
    note_input(path, "prompts")
    return PromptSet(name or os.path.basename(path), "text", captions)


def fashion_prompts(count: int = 20, seed: int = 0) -> PromptSet:
    """Balanced Fashion-MNIST captions (prompt ``i`` is of class ``i % 10``), with their labels."""
    from lantern.models.world.fashion_mnist import prompt_set

    count = checks.integer("prompts.count", count, 1)
    prompts = prompt_set(count, seed)
    return PromptSet("fashion_mnist", "text", [p.caption for p in prompts], labels=[p.label for p in prompts])


PER_IMAGE = ("longest", "first", "all")


def _subset(items: list, start: int, count: int | None, source: str) -> list:
    """Items ``start .. start + count - 1`` (``count=None``: to the end), with one error for a bad range."""
    start = checks.integer("prompts.start", start, 0)
    count = checks.optional(checks.integer, "prompts.count", count, 1)
    if start >= len(items):
        raise ConfigError(f"prompt range start={start} is past the {len(items)} prompts in {source!r}")
    return items[start : None if count is None else start + count]


def coco_captions(
    path: str, per_image: str = "longest", start: int = 0, count: int | None = None, name: str | None = None
) -> PromptSet:
    """Captions from an MS-COCO ``captions_*.json`` annotation file, images in id order.

    ``per_image="longest"`` keeps each image's longest caption (the LANTERN protocol on val2017: 5,000
    prompts), ``first`` its first, ``all`` every caption (val2014's ~200k, of which LlamaGen's protocol
    uses 30k: ``count=30000``). ``start``/``count`` take a contiguous subset.
    """
    checks.choice("prompts.per_image", per_image, PER_IMAGE)
    if not os.path.isfile(path):
        raise ConfigError(f"COCO caption file not found: {path!r} (expected e.g. annotations/captions_val2017.json)")
    text = read_text(path, "COCO caption file")
    note_input(path, "prompts")
    try:
        annotations = json.loads(text)["annotations"]
        rows = [(int(a["image_id"]), int(a.get("id", 0)), str(a["caption"]).strip()) for a in annotations]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"{path!r} is not a COCO caption file: expected {{'annotations': [{{'image_id', 'caption'}}, ...]}} ({exc})"
        ) from exc
    by_image: dict[int, list[tuple[int, str]]] = {}
    for image_id, caption_id, caption in sorted(rows):
        if caption:
            by_image.setdefault(image_id, []).append((caption_id, caption))
    if per_image == "all":
        captions = [c for image_id in sorted(by_image) for _, c in by_image[image_id]]
    elif per_image == "first":
        captions = [by_image[i][0][1] for i in sorted(by_image)]
    else:
        captions = [max(by_image[i], key=lambda item: len(item[1]))[1] for i in sorted(by_image)]
    if not captions:
        raise ConfigError(f"COCO caption file {path!r} holds no captions")
    return PromptSet(name or f"coco_{per_image}", "text", _subset(captions, start, count, path))


def parti_prompts(
    path: str, start: int = 0, count: int | None = None, category: str | None = None, name: str = "parti"
) -> PromptSet:
    """PartiPrompts from its TSV (columns ``Prompt``, ``Category``, ...), optionally one category."""
    if not os.path.isfile(path):
        raise ConfigError(f"PartiPrompts file not found: {path!r} (expected PartiPrompts.tsv)")
    reader = csv.DictReader(io.StringIO(read_text(path, "PartiPrompts file"), newline=""), delimiter="\t")
    note_input(path, "prompts")
    if not reader.fieldnames or "Prompt" not in reader.fieldnames:
        raise ConfigError(f"{path!r} is not a PartiPrompts TSV: no 'Prompt' column in its header")
    rows = [r for r in reader if (r.get("Prompt") or "").strip()]
    if category is not None:
        rows = [r for r in rows if r.get("Category") == category]
    prompts = [r["Prompt"].strip() for r in rows]
    if not prompts:
        raise ConfigError(f"{path!r} holds no prompts" + (f" in category {category!r}" if category else ""))
    return PromptSet(name, "text", _subset(prompts, start, count, path))
