"""The ``data`` stage of the drafter factory: token sequences for any target, in shards.

Two sources, both ending in rows ``codes`` (S, N) int32 and ``prompt`` (S,) int64 (an index into the
prompt table ``prompts.json`` beside the shards):

* ``self``: the target samples its own sequences (self-distillation) at the given sampling (by default
  the model's recommended one). Row ``i`` takes prompt ``i % P`` and the RNG key of ``(seed, i)``, so a
  row never depends on the batch size and a larger ``num_samples`` only adds rows.
* ``images``: images tokenised by the target's VQ: ImageNet-style class folders (``root/<class>/*.png``,
  classes numbered in sorted folder-name order, as torchvision's ImageFolder) for class-conditional
  targets, or an image folder and a ``captions`` file (``relative/path<TAB>caption`` per line) for
  text-conditional ones. Each image is resized (short side, bicubic) and centre-cropped to the target's
  resolution.

The shards' key holds what the rows depend on (the target's weight digest, the prompts' digest, the
sampling, the seed), so rerunning resumes and an out_dir made for another target is refused.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from tqdm.auto import tqdm

from lantern.errors import ConfigError
from lantern.files import cache_mismatch, note_input, write_json_atomic
from lantern.models.condition import Condition
from lantern.models.sampling import SamplingConfig
from lantern.rng import keys_tensor
from lantern.training.shards import ShardStore

PROMPTS_NAME = "prompts.json"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp")


def tensors_digest(named: list[tuple[str, torch.Tensor]]) -> str:
    """sha256 over named tensors (names, dtypes, shapes, bytes)."""
    digest = hashlib.sha256()
    for name, tensor in named:
        tensor = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def module_digest(module: torch.nn.Module) -> str:
    """sha256 over a module's state dict: the weights' identity, whether they came from a file, a folder
    or a seeded initialisation."""
    return tensors_digest(sorted(module.state_dict().items()))


def prompts_digest(kind: str, prompts: Sequence) -> str:
    return hashlib.sha256(json.dumps({"kind": kind, "items": list(prompts)}).encode()).hexdigest()


def write_prompts(folder: Path, kind: str, prompts: Sequence) -> None:
    """The prompt table beside the shards, with the digest of its content (:func:`read_prompts` checks it)."""
    write_json_atomic(
        folder / PROMPTS_NAME, {"kind": kind, "items": list(prompts), "digest": prompts_digest(kind, prompts)}
    )


def read_prompts(folder: Path, kind: str, prompts: Sequence) -> list:
    """The prompt table the shards were made with, which the shards' key says is ``(kind, prompts)``.

    A table whose content differs from its digest or from ``prompts`` (altered after the data stage) is
    reported on stderr and written again from ``prompts``, never used.
    """
    path = folder / PROMPTS_NAME
    if not path.is_file():
        raise ConfigError(f"{str(path)!r} is missing: run stage=data first")
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
        stored = prompts_digest(saved["kind"], saved["items"])
    except (OSError, ValueError, KeyError, TypeError):
        saved, stored = {}, None
    if stored != saved.get("digest") or stored != prompts_digest(kind, prompts):
        cache_mismatch(path)
        write_prompts(folder, kind, prompts)
    return list(prompts)


def self_distill(
    store: ShardStore,
    target,
    conditioner,
    prompts: Sequence,
    sampling: SamplingConfig,
    seed: int,
    num_samples: int,
    batch_size: int,
    progress: bool = True,
) -> None:
    """Append rows ``store.rows .. num_samples - 1`` sampled by ``target`` (see the module docstring)."""
    from lantern.decoding.ar import ARDecoder

    decoder = ARDecoder(sampling)
    device = target.input_embeddings().device
    with tqdm(
        total=num_samples,
        initial=min(store.rows, num_samples),
        desc="self-distilled sequences",
        unit="seq",
        disable=not progress,
        dynamic_ncols=True,
        mininterval=1.0,
    ) as bar:
        for start in range(store.rows, num_samples, batch_size):
            rows = range(start, min(start + batch_size, num_samples))
            prompt = torch.tensor([i % len(prompts) for i in rows], dtype=torch.long)  # (b,)
            condition = conditioner.encode([prompts[i] for i in prompt.tolist()])
            condition = Condition(condition.values.to(device), condition.mask.to(device))
            codes = decoder.generate(target, condition, keys_tensor(seed, rows, device)).codes  # (b, N)
            store.append({"codes": codes.to("cpu", torch.int32), "prompt": prompt})
            bar.update(len(rows))


def _image_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def class_folder_items(root: str, num_classes: int) -> tuple[list[Path], list[int], list[int]]:
    """ImageNet-style ``root/<class>/...`` -> image paths, their prompt indices and the prompt table
    (class ids ``0 .. C-1`` in sorted folder-name order)."""
    base = Path(root)
    if not base.is_dir():
        raise ConfigError(f"data.root={root!r}: not a folder (expected one sub-folder of images per class)")
    classes = sorted(p.name for p in base.iterdir() if p.is_dir())
    if not classes:
        raise ConfigError(f"data.root={root!r} has no class sub-folders")
    if len(classes) > num_classes:
        raise ConfigError(f"data.root={root!r} has {len(classes)} class folders; the target has {num_classes} classes")
    paths, labels = [], []
    for label, name in enumerate(classes):
        files = _image_files(base / name)
        paths += files
        labels += [label] * len(files)
    if not paths:
        raise ConfigError(f"data.root={root!r} holds no images ({', '.join(IMAGE_SUFFIXES)})")
    return paths, labels, list(range(len(classes)))


def caption_file_items(root: str, captions: str | None) -> tuple[list[Path], list[int], list[str]]:
    """An image folder and a ``path<TAB>caption`` file -> image paths, prompt indices and distinct captions."""
    base = Path(root)
    if not base.is_dir():
        raise ConfigError(f"data.root={root!r}: not a folder")
    if not captions or not Path(captions).is_file():
        raise ConfigError(
            f"data.captions={captions!r}: a text-conditional target needs a captions file "
            "(one `relative/image/path<TAB>caption` per line)"
        )
    note_input(captions, "captions")
    paths, texts = [], []
    for number, line in enumerate(Path(captions).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        name, tab, caption = line.partition("\t")
        if not tab or not caption.strip():
            raise ConfigError(f"{captions}:{number}: expected `relative/path<TAB>caption`, got {line[:60]!r}")
        path = base / name
        if not path.is_file():
            raise ConfigError(f"{captions}:{number}: image {str(path)!r} not found")
        paths.append(path)
        texts.append(caption.strip())
    if not paths:
        raise ConfigError(f"data.captions={captions!r} lists no images")
    table = list(dict.fromkeys(texts))
    where = {text: i for i, text in enumerate(table)}
    return paths, [where[t] for t in texts], table


def load_image(path: Path, size: int) -> torch.Tensor:
    """An RGB image resized (short side to ``size``, bicubic) and centre-cropped -> (3, size, size) in [-1, 1]."""
    with Image.open(path) as image:
        image = image.convert("RGB")
        scale = size / min(image.size)
        image = image.resize(
            (max(size, round(image.size[0] * scale)), max(size, round(image.size[1] * scale))), Image.BICUBIC
        )
        left, top = (image.size[0] - size) // 2, (image.size[1] - size) // 2
        pixels = np.asarray(image.crop((left, top, left + size, top + size)), dtype=np.float32)
    return torch.from_numpy(pixels).permute(2, 0, 1) / 127.5 - 1.0


@torch.no_grad()
def tokenise_images(
    store: ShardStore, vq, paths: list[Path], prompt: list[int], size: int, batch_size: int, progress: bool = True
) -> None:
    """Append rows ``store.rows ..`` of the images ``paths`` tokenised by ``vq`` with their ``prompt`` indices."""
    device = next(vq.parameters()).device
    with tqdm(total=len(paths), initial=store.rows, desc="tokenising images", unit="img", disable=not progress) as bar:
        for start in range(store.rows, len(paths), batch_size):
            chunk = range(start, min(start + batch_size, len(paths)))
            images = torch.stack([load_image(paths[i], size) for i in chunk]).to(device)  # (b, 3, H, W)
            codes = vq.encode(images).flatten(1)  # (b, N)
            store.append({"codes": codes.to("cpu", torch.int32), "prompt": torch.tensor([prompt[i] for i in chunk])})
            bar.update(len(chunk))
