"""Files: atomic writes (the one mechanism every writer of the project uses), index-named PNGs and hashes.

A file is written under a temporary name beside its final path, unique to the writing process and
thread (``.<name>.<host>.<pid>.<thread>.tmp``), then renamed over the path. Readers see the old file
or the whole new one; two processes writing the same path never share a temporary file; a killed
writer leaves at most its own ``.tmp`` file, which :func:`remove_stale_temps` clears.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import socket
import sys
import textwrap
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

TEMP_SUFFIX = ".tmp"


def temp_name(path: str | os.PathLike) -> Path:
    """The temporary name this process and thread write ``path`` under (same folder: the rename is atomic)."""
    path = Path(path)
    host = socket.gethostname().split(".")[0] or "host"  # pids repeat across the nodes of a cluster
    return path.with_name(f".{path.name}.{host}.{os.getpid()}.{threading.get_ident()}{TEMP_SUFFIX}")


def write_atomic(path: str | os.PathLike, write: Callable[[str], None], mode: int = 0o644) -> Path:
    """Call ``write(tmp_path)`` on this process's temporary file beside ``path``, then rename it over ``path``.

    The file is flushed to disk before the rename, so a crash never leaves an empty file under the
    final name. On any failure (a full disk, an exception, Ctrl-C) the temporary file is removed and
    ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(path)
    try:
        write(str(tmp))
        with open(tmp, "rb+") as handle:  # some writers (torch.save, PIL) close without fsync
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)  # mkstemp-style writers create 0600 files; outputs are meant to be shared
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        _name_the_file(exc, path)
    return path


def _name_the_file(exc: BaseException, path: Path) -> None:
    """Re-raise a failed write's ``exc`` naming ``path``: an OSError gets the file name a full disk or a read-only
    folder refused (an errno-less OSError would print as "[Errno None] None: path" and lose its own message); a
    writer that reports the system's error as text (safetensors: ``... (os error 27)``) becomes that OSError."""
    if isinstance(exc, OSError) and exc.errno is not None and exc.filename is None:
        exc.filename = str(path)
    found = None if isinstance(exc, OSError) else re.search(r"\(os error (\d+)\)", str(exc))
    if isinstance(exc, Exception) and found:
        code = int(found.group(1))
        raise OSError(code, os.strerror(code), str(path)) from exc
    raise exc


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (:func:`write_atomic`)."""
    return write_atomic(path, lambda tmp: Path(tmp).write_bytes(data))


def save_torch_atomic(path: str | os.PathLike, obj) -> Path:
    """``torch.save(obj)`` to ``path`` atomically. The bytes are serialised in memory and written by Python,
    so a full disk is an ``OSError`` naming the file (torch's own writer reports it as a C++ iostream error)."""
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return write_bytes_atomic(path, buffer.getvalue())


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`write_atomic`)."""
    return write_atomic(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def write_json_atomic(path: str | os.PathLike, payload) -> Path:
    """Write ``payload`` as indented JSON to ``path`` atomically (:func:`write_atomic`)."""
    return write_text_atomic(path, json.dumps(payload, indent=2, sort_keys=False, default=str) + "\n")


def copy_atomic(source: str | os.PathLike, target: str | os.PathLike) -> Path:
    """Copy ``source`` to ``target`` atomically (:func:`write_atomic`)."""
    import shutil

    return write_atomic(target, lambda tmp: shutil.copyfile(source, tmp))


def write_folder_atomic(folder: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Call ``write(staging)`` on an empty folder beside ``folder``, then rename it to ``folder``.

    A model folder is read as a whole (a config and the weights it describes), so it is replaced as a
    whole: readers see the old folder, none, or the complete new one, never a new config beside old
    weights. The staging folder (``.<name>.<host>.<pid>.<thread>.partial``) is flushed file by file
    before the rename; on any failure (a full disk, Ctrl-C) it is removed and ``folder`` is left as it
    was. An existing ``folder`` is first renamed aside and removed once the new one is in place (a kill
    between those two renames leaves no ``folder`` and the old one under a dot-name, never half a folder).
    """
    import shutil

    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = temp_name(folder).with_suffix(".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    aside = None
    try:
        write(staging)
        for file in sorted(staging.rglob("*")):
            if file.is_file():
                with open(file, "rb+") as handle:
                    os.fsync(handle.fileno())
                os.chmod(file, 0o644)
        os.chmod(staging, 0o755)
        if folder.exists() or folder.is_symlink():
            aside = temp_name(folder).with_suffix(".old")
            os.replace(folder, aside)
        os.replace(staging, folder)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if aside is not None and not folder.exists():
            os.replace(aside, folder)  # the new folder did not go in: the old one comes back
        _name_the_file(exc, folder)
    if aside is not None:
        if aside.is_dir() and not aside.is_symlink():
            shutil.rmtree(aside, ignore_errors=True)
        else:
            aside.unlink(missing_ok=True)
    return folder


def remove_stale_temps(folder: str | os.PathLike) -> int:
    """Remove the temporary files killed writers left directly in ``folder``; return how many.

    Only safe while the caller holds the folder's lock (:mod:`lantern.runlock`): no live writer then.
    """
    removed = 0
    for tmp in Path(folder).glob(f".*{TEMP_SUFFIX}"):
        tmp.unlink(missing_ok=True)
        removed += 1
    return removed


def content_digest(named: Mapping[str, object]) -> str:
    """sha256 over named arrays, tensors or JSON-able values (name, dtype, shape, bytes): the digest of its own
    content that every cache stores with it and checks on load, so an altered or cut file is never used."""
    digest = hashlib.sha256()
    for name in sorted(named):
        value = named[name]
        if hasattr(value, "detach"):  # a torch tensor (bfloat16 has no numpy dtype: its bytes are hashed)
            import torch

            tensor = value.detach().to("cpu").contiguous()
            digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
            digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(value, (np.ndarray, np.generic)) and value.dtype.kind not in "USO":
            array = np.ascontiguousarray(value)
            digest.update(f"{name}|{array.dtype.str}|{array.shape}|".encode())
            digest.update(array.tobytes())
        else:
            text = json.dumps(value.item() if isinstance(value, np.generic) else value, sort_keys=True, default=str)
            digest.update(f"{name}|json|{text}|".encode())
    return digest.hexdigest()


def cache_mismatch(path: str | os.PathLike, why: str = "does not match the digest of its content") -> None:
    """Say on stderr, in one line, that the cache ``path`` is not used and is recomputed (the caller does so)."""
    print(f"warning: cache {str(path)!r} {why}; recomputing it", file=sys.stderr, flush=True)


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# sha256 of files, trusted only as far as their content can be checked at each run. A file under
# HASH_FULL_BYTES is hashed in full once per run (what note_input's first call of a job sees). A larger one
# is remembered in <cache>/sha256.json under its real path, size, mtime, inode and ctime (rewriting a file in
# place and setting its mtime back still moves its ctime) with a digest of SAMPLE_BLOCKS blocks spread over
# it, which is read again and compared at each run: a mismatch means the file was edited, and it is hashed
# in full. The cache file carries the digest of its own entries; an altered one is recomputed.
HASH_FULL_BYTES = 64 << 20
SAMPLE_BLOCKS, SAMPLE_BYTES = 64, 64 << 10
_HASHES: dict[tuple, str] = {}  # this run's hashes by the file's stat key (cleared by forget_inputs)
_CACHE_FOLDER: Path | None = None  # paths.cache, once an entry point has said it (use_hash_cache_folder)


def use_hash_cache_folder(folder: str | os.PathLike | None) -> None:
    """Keep the sha256 cache in ``folder`` (a run's ``paths.cache``); None: where ``paths.cache`` points by
    default (``$LANTERN_CACHE``, else ``<repo>/outputs``). Never under the home folder."""
    global _CACHE_FOLDER
    _CACHE_FOLDER = None if folder is None else Path(folder)


def _hash_cache_file() -> Path:
    from lantern import REPO_ROOT

    folder = _CACHE_FOLDER or Path(os.environ.get("LANTERN_CACHE") or REPO_ROOT / "outputs")
    return folder / "sha256.json"


def _stat_key(real: str) -> tuple:
    """What must stay the same for a remembered hash to be looked at: (path, size, mtime, device, inode, ctime)."""
    stat = os.stat(real)
    return (real, stat.st_size, stat.st_mtime_ns, stat.st_dev, stat.st_ino, stat.st_ctime_ns)


def sampled_digest(path: str | os.PathLike, size: int) -> str:
    """sha256 of ``SAMPLE_BLOCKS`` blocks of ``SAMPLE_BYTES`` spread evenly over a file of ``size`` bytes (the
    first and the last included), with their offsets: a cheap check of a large file's content."""
    digest = hashlib.sha256(f"{size}|".encode())
    last = max(size - SAMPLE_BYTES, 0)
    offsets = sorted({round(i * last / (SAMPLE_BLOCKS - 1)) for i in range(SAMPLE_BLOCKS)})
    with open(path, "rb") as handle:
        for offset in offsets:
            handle.seek(offset)
            digest.update(f"{offset}|".encode() + handle.read(SAMPLE_BYTES))
    return digest.hexdigest()


def _read_hash_cache(cache: Path) -> dict[str, dict]:
    """The entries of the sha256 cache; an altered file (its digest differs) is reported and dropped."""
    try:
        saved = json.loads(cache.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        saved = None
    entries = saved.get("entries") if isinstance(saved, dict) else None
    if not isinstance(entries, dict) or saved.get("digest") != content_digest({"entries": entries}):
        cache_mismatch(cache)
        return {}
    return entries


def _remembered(entry) -> tuple[str, str] | None:
    """(sha256, sampled digest) of a well-formed cache entry, else None."""
    if not isinstance(entry, dict):
        return None
    digest, sample = entry.get("sha256"), entry.get("sample")
    if all(isinstance(v, str) and re.fullmatch(r"[0-9a-f]{64}", v) for v in (digest, sample)):
        return digest, sample
    return None


def sha256_cached(path: str | os.PathLike) -> str:
    """:func:`sha256_file`, checked against the file's content at each run: a file under ``HASH_FULL_BYTES`` is
    hashed in full once per run; a larger one is remembered in ``<paths.cache>/sha256.json`` by its real path,
    size, mtime, inode and ctime, and trusted only while a sampled-block digest of its bytes still matches
    (:func:`sampled_digest`), else hashed again. A cache whose entries do not match their digest is recomputed."""
    real = os.path.realpath(path)
    key = _stat_key(real)
    if key in _HASHES:
        return _HASHES[key]
    if key[1] < HASH_FULL_BYTES:
        _HASHES[key] = sha256_file(real)
        return _HASHES[key]
    cache = _hash_cache_file()
    entry = "|".join(str(part) for part in key)
    stored = _read_hash_cache(cache)
    sample = sampled_digest(real, key[1])
    remembered = _remembered(stored.get(entry))
    if remembered is not None and remembered[1] == sample:
        digest = remembered[0]
    else:  # new, changed, or edited in place with its size and times kept: the content decides
        digest = sha256_file(real)
        stored = {k: v for k, v in stored.items() if not k.startswith(f"{real}|")}
        stored[entry] = {"sha256": digest, "sample": sample}
        try:  # a cache that cannot be written is skipped
            write_json_atomic(cache, {"entries": stored, "digest": content_digest({"entries": stored})})
        except OSError:
            pass
    _HASHES[key] = digest
    return digest


# What the current job read: absolute path -> {"role", "sha256", "bytes"}. Loaders note what they read
# (lantern.models.checkpoint, prompt files, text encoders, metric weights, worlds); the job records it and a
# resume compares it with what the run folder's first images were made from.
_INPUTS: dict[str, dict] = {}


def note_input(path: str | os.PathLike, role: str) -> str:
    """Record that the current job reads ``path`` as ``role`` (target, tokenizer, drafter, prompts, ...); a
    folder counts as the sorted list of its files' hashes. Returns the sha256."""
    real = os.path.realpath(path)
    if os.path.isdir(real):
        files = sorted(p for p in Path(real).rglob("*") if p.is_file())
        digest = hashlib.sha256()
        for file in files:
            digest.update(f"{file.relative_to(real).as_posix()}\0{sha256_cached(file)}\n".encode())
        value, size = digest.hexdigest(), sum(f.stat().st_size for f in files)
    else:
        value, size = sha256_cached(real), os.path.getsize(real)
    _INPUTS[real] = {"role": role, "sha256": value, "bytes": size}
    return value


def inputs_read() -> dict[str, dict]:
    """Every input noted since :func:`forget_inputs`, by absolute path (sorted)."""
    return {path: dict(entry) for path, entry in sorted(_INPUTS.items())}


def forget_inputs() -> None:
    """Start a new job's list of inputs; every file it reads is checked against its content again."""
    _INPUTS.clear()
    _HASHES.clear()


def image_name(index: int) -> str:
    """File name of image ``index``: ``000042.png``."""
    return f"{index:06d}.png"


def png_bytes(pixels: np.ndarray) -> bytes:
    """(H, W, 3) uint8 pixels encoded as PNG."""
    import io

    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def save_png(pixels: np.ndarray, path: str | os.PathLike) -> None:
    """Save (H, W, 3) uint8 pixels as PNG atomically, so a killed run leaves no broken file."""
    write_bytes_atomic(path, png_bytes(pixels))


def labelled_grid(images: list[np.ndarray], labels: list[str], columns: int = 8, cell: int = 128) -> Image.Image:
    """A grid of (H, W, 3) uint8 images, each scaled to ``cell`` px with its label printed underneath."""
    font = ImageFont.load_default()
    columns = max(1, min(columns, len(images)))
    rows = math.ceil(len(images) / columns)
    chars = max(8, cell // 6)
    # Three lines are shown: wrap only what fits in them (a prompt may be megabytes long).
    wrapped = ["\n".join(textwrap.wrap(str(label)[: 3 * chars + 1], chars)[:3]) for label in labels]
    text_height = 12 * max(1, max(w.count("\n") + 1 for w in wrapped)) + 4
    grid = Image.new("RGB", (columns * cell, rows * (cell + text_height)), "white")
    draw = ImageDraw.Draw(grid)
    for i, (pixels, text) in enumerate(zip(images, wrapped, strict=True)):
        x, y = (i % columns) * cell, (i // columns) * (cell + text_height)
        grid.paste(Image.fromarray(pixels).resize((cell, cell), Image.NEAREST), (x, y))
        draw.multiline_text((x + 2, y + cell + 2), text, fill="black", font=font, spacing=1)
    return grid


def read_images(run_dir: str | os.PathLike, count: int) -> np.ndarray:
    """A run's first ``count`` index-named images as uint8 (N, H, W, 3)."""
    return np.stack([np.asarray(Image.open(Path(run_dir) / image_name(i)).convert("RGB")) for i in range(count)])
