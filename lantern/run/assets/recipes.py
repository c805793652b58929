"""Recipes of derived assets: ``recipe(inputs, out, **params)`` writes ``out`` (a file or a folder) from the
paths of its input assets. ``out`` is a fresh staging path; the caller moves it into place and locks it with
the recipe's hash (:func:`recipe_sha256`), so an interrupted recipe leaves nothing under the asset's path.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import zipfile
from pathlib import Path

from lantern.errors import ConfigError


def recipe_sha256(recipe: dict, inputs: dict[str, str]) -> str:
    """sha256 of a recipe's parameters and its inputs' sha256s: what the lock entry of its output carries."""
    text = json.dumps({"recipe": recipe, "inputs": inputs}, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def unzip(inputs: list[Path], out: Path, member: str) -> None:
    """One member of a zip archive: a file (``annotations/captions_val2017.json``) or, ending in ``/``, a
    folder's files (``val2017/``) with the folder prefix dropped."""
    (archive_path,) = inputs
    try:
        with zipfile.ZipFile(archive_path) as archive:
            if not member.endswith("/"):
                with archive.open(member) as source, open(out, "wb") as target:
                    shutil.copyfileobj(source, target, 1 << 20)
                return
            names = [n for n in archive.namelist() if n.startswith(member) and not n.endswith("/")]
            if not names:
                raise ConfigError(f"{str(archive_path)!r} has no files under {member!r}")
            out.mkdir(parents=True)
            for name in names:
                target = out / name[len(member) :]
                target.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(name) as source, open(target, "wb") as handle:
                    shutil.copyfileobj(source, handle, 1 << 20)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise ConfigError(f"{str(archive_path)!r}: cannot extract {member!r} ({exc})") from exc


def fid_reference(inputs: list[Path], out: Path, size: int) -> None:
    """A FID reference folder: every image centre-cropped and Lanczos-resized to ``size`` px
    (:func:`lantern.metrics.reference.make_reference`, what ``scripts/fid_reference.py`` runs)."""
    from lantern.metrics.reference import make_reference

    (images,) = inputs
    make_reference(Path(images), out, size)


def prompt_list(inputs: list[Path], out: Path, per_image: str = "longest", count: int | None = None) -> None:
    """A protocol's prompt list from a COCO caption file, as a JSON list in protocol order: its sha256 is the
    protocol's ``prompts.sha256`` (:func:`lantern.metrics.protocol.prompt_list_sha256`)."""
    from lantern.run.prompts import coco_captions

    (captions,) = inputs
    prompts = coco_captions(str(captions), per_image=per_image, count=count)
    out.write_bytes(json.dumps(list(prompts), ensure_ascii=False).encode("utf-8"))
