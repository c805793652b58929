"""The papers' own prompt files and caption choices, read as their authors' code reads them.

* :func:`json_list`: a JSON list of captions in file order, as published (LANTERN's
  ``data/prompts/captions_val2017_longest.json``: 5,000 captions, not stripped).
* :func:`llamagen_csv`: LlamaGen's ``evaluations/t2i/coco_captions.csv`` as its ``sample_t2i_ddp.py`` reads it
  (``pandas.read_csv(path, delimiter='\\t')['Prompt']``: one column, quotes taken as CSV quoting, no stripping).
* :func:`lantern_longest`: the rule of LANTERN's ``data/prompts/preprocess.py`` that made that list from the COCO
  annotations: images in order of their first annotation, each one's first longest caption (a later caption
  replaces it only when strictly longer), unstripped.
* :func:`sjd_running_max`: SJD's ``MSCOCOPromptBench`` (``dataset_tools/dataset_templates.py``): images in id
  order (``sorted(coco.imgs)``), captions in annotation order; the longest-caption length and its position are
  kept across images, so an image whose captions are all shorter than the longest seen so far gets its caption
  at the position of that longest one, not its own longest.
"""

from __future__ import annotations

import csv
import io
import json
import os

from lantern.errors import ConfigError
from lantern.files import note_input
from lantern.run.prompts import PromptSet, _subset, read_text


def _annotations(path: str) -> tuple[list[dict], list[int]]:
    """(annotations, image ids in the order of the file's ``images``) of a COCO caption file."""
    if not os.path.isfile(path):
        raise ConfigError(f"COCO caption file not found: {path!r} (expected e.g. annotations/captions_val2017.json)")
    try:
        data = json.loads(read_text(path, "COCO caption file"))
        rows = [{"image_id": int(a["image_id"]), "caption": str(a["caption"])} for a in data["annotations"]]
        images = [int(i["id"]) for i in data.get("images") or []] or sorted({r["image_id"] for r in rows})
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"{path!r} is not a COCO caption file: expected {{'annotations': [{{'image_id', 'caption'}}, ...]}} ({exc})"
        ) from exc
    note_input(path, "prompts")
    return rows, images


def lantern_longest(rows: list[dict]) -> list[str]:
    """LANTERN's rule: first-appearance order of images, each one's first strictly-longest caption."""
    chosen: dict[int, str] = {}
    for row in rows:
        if row["image_id"] not in chosen or len(chosen[row["image_id"]]) < len(row["caption"]):
            chosen[row["image_id"]] = row["caption"]
    return list(chosen.values())


def sjd_running_max(rows: list[dict], images: list[int]) -> list[str]:
    """SJD's rule (see the module docstring); ConfigError where SJD's code would index past an image's captions."""
    by_image: dict[int, list[str]] = {}
    for row in rows:
        by_image.setdefault(row["image_id"], []).append(row["caption"])
    longest, position, chosen = 0, 0, []
    for image in sorted(images):
        captions = by_image.get(image, [])
        for index, caption in enumerate(captions):
            if longest < len(caption):
                longest, position = len(caption), index
        if position >= len(captions):
            raise ConfigError(f"image {image} has {len(captions)} captions; SJD's rule takes caption {position}")
        chosen.append(captions[position])
    return chosen


def coco_paper_captions(
    path: str, rule: str, start: int = 0, count: int | None = None, name: str | None = None
) -> PromptSet:
    """Captions of a COCO caption file chosen by a paper's rule: ``lantern`` or ``sjd``."""
    rules = {"lantern": lambda r, i: lantern_longest(r), "sjd": sjd_running_max}
    if rule not in rules:
        raise ConfigError(f"prompts.rule={rule!r}: expected one of {sorted(rules)}")
    rows, images = _annotations(path)
    captions = rules[rule](rows, images)
    if not captions:
        raise ConfigError(f"COCO caption file {path!r} holds no captions")
    return PromptSet(name or f"coco_{rule}", "text", _subset(captions, start, count, path))


def json_list(path: str, start: int = 0, count: int | None = None, name: str | None = None) -> PromptSet:
    """Captions from a JSON list of strings, in file order, as published."""
    if not os.path.isfile(path):
        raise ConfigError(f"prompt list not found: {path!r} (expected a JSON list of captions)")
    try:
        items = json.loads(read_text(path, "prompt list"))
    except ValueError as exc:
        raise ConfigError(f"{path!r} is not JSON ({exc})") from exc
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items) or not items:
        raise ConfigError(f"{path!r} is not a JSON list of captions (strings)")
    note_input(path, "prompts")
    return PromptSet(name or os.path.basename(path), "text", _subset(items, start, count, path))


def llamagen_csv(path: str, start: int = 0, count: int | None = None, name: str | None = None) -> PromptSet:
    """The ``Prompt`` column of a tab-separated file with CSV quoting, rows in file order (LlamaGen's reading)."""
    if not os.path.isfile(path):
        raise ConfigError(f"prompt file not found: {path!r} (expected LlamaGen's coco_captions.csv)")
    reader = csv.DictReader(io.StringIO(read_text(path, "prompt file"), newline=""), delimiter="\t")
    if not reader.fieldnames or "Prompt" not in reader.fieldnames:
        raise ConfigError(f"{path!r} has no 'Prompt' column in its header (LlamaGen's coco_captions.csv has)")
    prompts = [row["Prompt"] for row in reader if row.get("Prompt")]
    if not prompts:
        raise ConfigError(f"{path!r} holds no prompts")
    note_input(path, "prompts")
    return PromptSet(name or "llamagen_coco_captions", "text", _subset(prompts, start, count, path))
