"""Recipes of derived assets: ``recipe(inputs, out, **params)`` writes ``out`` (a file or a folder) from the
paths of its input assets. ``out`` is a fresh staging path; the caller moves it into place and locks it with
the recipe's hash (:func:`recipe_sha256`), so an interrupted recipe leaves nothing under the asset's path.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import stat
import zipfile
from pathlib import Path, PurePosixPath

from lantern.errors import ConfigError


def recipe_sha256(recipe: dict, inputs: dict[str, str]) -> str:
    """sha256 of a recipe's parameters and its inputs' sha256s: what the lock entry of its output carries."""
    text = json.dumps({"recipe": recipe, "inputs": inputs}, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _safe_names(archive: zipfile.ZipFile, names: list[str], where: str) -> None:
    """ConfigError (one line) for the first member that is absolute, leaves its folder or is a link."""
    for name in names:
        info = archive.getinfo(name)
        if stat.S_ISLNK(info.external_attr >> 16):
            raise ConfigError(f"{where}: member {name!r} is a link; refused, nothing was written")
        parts = PurePosixPath(name.replace("\\", "/")).parts
        if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name) or ".." in parts:
            raise ConfigError(
                f"{where}: member {name!r} would be written outside its folder; refused, nothing was written"
            )


def unzip(inputs: list[Path], out: Path, member: str) -> None:
    """One member of a zip archive: a file (``annotations/captions_val2017.json``) or, ending in ``/``, a
    folder's files (``val2017/``) with the folder prefix dropped. Every member to be written is checked first
    (:func:`_safe_names`): one that is absolute, climbs out with ``..`` or is a link refuses the whole archive."""
    (archive_path,) = inputs
    where = f"{str(archive_path)!r}"
    try:
        with zipfile.ZipFile(archive_path) as archive:
            if not member.endswith("/"):
                _safe_names(archive, [member], where)
                with archive.open(member) as source, open(out, "wb") as target:
                    shutil.copyfileobj(source, target, 1 << 20)
                return
            names = [n for n in archive.namelist() if n.startswith(member) and not n.endswith("/")]
            if not names:
                raise ConfigError(f"{where} has no files under {member!r}")
            _safe_names(archive, names, where)
            out.mkdir(parents=True)
            for name in names:
                target = out / name[len(member) :]
                target.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(name) as source, open(target, "wb") as handle:
                    shutil.copyfileobj(source, handle, 1 << 20)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise ConfigError(f"{where}: cannot extract {member!r} ({exc})") from exc


def fid_reference(inputs: list[Path], out: Path, size: int) -> None:
    """A FID reference folder: every image centre-cropped and Lanczos-resized to ``size`` px
    (:func:`lantern.metrics.reference.make_reference`, what ``scripts/fid_reference.py`` runs)."""
    from lantern.metrics.reference import make_reference

    (images,) = inputs
    make_reference(Path(images), out, size)


def decoded_pngs(inputs: list[Path], out: Path) -> None:
    """Every image of a folder decoded as pytorch-fid decodes it (``PIL.Image.open(path).convert("RGB")``) and
    written as a PNG of the same pixels, no crop or resize: SJD's FID reference is raw val2017 through
    pytorch-fid at batch 1, and the metric reads PNG folders."""
    from PIL import Image

    (images,) = inputs
    files = sorted(p for p in Path(images).iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    if not files:
        raise ConfigError(f"{str(images)!r} holds no images")
    out.mkdir(parents=True)
    for file in files:
        with Image.open(file) as image:
            image.convert("RGB").save(out / (file.stem + ".png"))


def prompt_list(inputs: list[Path], out: Path, per_image: str = "longest", count: int | None = None) -> None:
    """A protocol's prompt list from a COCO caption file, as a JSON list in protocol order: its sha256 is the
    protocol's ``prompts.sha256`` (:func:`lantern.metrics.protocol.prompt_list_sha256`). ``per_image``:
    ``longest``, ``first`` or ``all`` (:func:`lantern.run.prompts.coco_captions`), or a paper's rule, ``lantern``
    or ``sjd`` (:func:`lantern.run.paper_prompts.coco_paper_captions`)."""
    from lantern.run.paper_prompts import coco_paper_captions
    from lantern.run.prompts import coco_captions

    (captions,) = inputs
    if per_image in ("lantern", "sjd"):
        prompts = coco_paper_captions(str(captions), rule=per_image, count=count)
    else:
        prompts = coco_captions(str(captions), per_image=per_image, count=count)
    out.write_bytes(json.dumps(list(prompts), ensure_ascii=False).encode("utf-8"))
