"""Fashion-MNIST as a tiny text-to-image world: IDX reading, splits, captions, a torch Dataset.

The repository ships only the 10k test split (``data/fashion_mnist/t10k-*``). The 60k train
split comes from the Debian package ``dataset-fashion-mnist`` (installed under
``/usr/share/datasets/fashion-mnist``); point ``root`` at that folder to use it.

Captions are built from a handful of templates per class and chosen deterministically from an
index, so every prompt list and every dataset item is reproducible without a random state.
"""

from __future__ import annotations

import gzip
import os
import zlib
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from lantern import REPO_ROOT, checks
from lantern.errors import ConfigError

NUM_CLASSES = 10
IMAGE_SIZE = 28
SPLITS = ("train", "test")
SYSTEM_DATA_ROOT = "/usr/share/datasets/fashion-mnist"

OFFICIAL_CLASS_NAMES: tuple[str, ...] = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
"""The label names exactly as Zalando Research publishes them, in label order."""

CLASS_NAMES: tuple[str, ...] = (
    "T-shirt",
    "trousers",
    "pullover",
    "dress",
    "coat",
    "sandal",
    "shirt",
    "sneaker",
    "bag",
    "ankle boot",
)
"""Class names as they read in a caption, in label order; every caption contains its name."""

# The noun phrase of each class as it follows "of" in a caption ("a photo of <phrase>").
_PHRASES: tuple[str, ...] = (
    "a T-shirt",
    "a pair of trousers",
    "a pullover",
    "a dress",
    "a coat",
    "a sandal",
    "a shirt",
    "a sneaker",
    "a bag",
    "an ankle boot",
)

# Which way the item is photographed in the dataset: footwear from the side, the rest from
# the front.
_VIEWS: tuple[str, ...] = ("front", "front", "front", "front", "front", "side", "front", "side", "front", "side")

_TEMPLATES: tuple[str, ...] = (
    "a photo of {phrase}",
    "a black-and-white picture of {phrase}",
    "a grayscale image of {phrase}",
    "a small product photo of {phrase}",
    "{phrase} on a black background",
    "a low-resolution picture of {phrase}",
    "{phrase}, seen from the {view}",
)

# Background value of a Fashion-MNIST image: 0 in uint8, -1 after scaling to [-1, 1].
_BACKGROUND = -1.0
# Resolutions up to this size are reached by padding the 28x28 image with background;
# larger ones by bilinear resizing (see FashionMNISTImages).
_MAX_PADDED = 36

# IDX type codes (third magic byte) -> big-endian numpy dtype.
_IDX_DTYPES: dict[int, str] = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}

_FILE_PREFIX = {"train": "train", "test": "t10k"}


def _check_label(label: int) -> int:
    label = int(label)
    if not 0 <= label < NUM_CLASSES:
        raise ConfigError(f"Fashion-MNIST label must be in 0..{NUM_CLASSES - 1}, got {label}")
    return label


def all_captions(label: int) -> list[str]:
    """Return every caption template of class ``label`` filled in, in template order."""
    label = _check_label(label)
    return [t.format(phrase=_PHRASES[label], view=_VIEWS[label]) for t in _TEMPLATES]


def caption_for(label: int, index: int) -> str:
    """Return the caption of class ``label`` for item/prompt number ``index``.

    The template is ``index`` modulo the number of templates, so the same (label, index)
    always gives the same caption.
    """
    captions = all_captions(label)
    return captions[int(index) % len(captions)]


class Prompt(NamedTuple):
    """One text-to-image prompt: the class label and its caption."""

    label: int
    caption: str


def prompt_set(count: int, seed: int = 0) -> list[Prompt]:
    """Return a fixed, class-balanced list of ``count`` prompts.

    Prompt ``i`` has label ``i % 10``, so every prefix of length ``10k`` holds each class
    exactly ``k`` times. Within a class the captions walk through all templates in turn,
    starting at a per-class template chosen by ``seed``; the list depends only on
    ``(count, seed)``.
    """
    if count < 0:
        raise ConfigError(f"prompt count must be >= 0, got {count}")
    rng = np.random.default_rng(seed)
    offsets = rng.integers(0, len(_TEMPLATES), size=NUM_CLASSES)  # (10,)
    prompts = []
    for i in range(count):
        label = i % NUM_CLASSES
        prompts.append(Prompt(label, caption_for(label, int(offsets[label]) + i // NUM_CLASSES)))
    return prompts


def default_data_root() -> Path:
    """Return the repository's ``data/fashion_mnist`` folder (holds the shipped test split)."""
    return REPO_ROOT / "data" / "fashion_mnist"


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (gzip-compressed or plain) into a numpy array in native byte order.

    The header is validated: two zero bytes, a known type code, a dimension count, and the
    payload size must match the declared shape. Any problem raises :class:`ConfigError`.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"IDX file not found: {str(path)!r}")
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise ConfigError(f"{str(path)!r} is not a readable IDX file ({exc})") from exc
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES or raw[3] == 0:
        raise ConfigError(
            f"{str(path)!r} is not an IDX file: bad magic number {raw[:4].hex() or '(empty)'} "
            f"(expected 0000 + type code 08/09/0b/0c/0d/0e + dimension count)"
        )
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ConfigError(f"{str(path)!r} is a truncated IDX file: header cut short")
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != expected:
        raise ConfigError(
            f"{str(path)!r} is a corrupt IDX file: shape {shape} needs {expected} data bytes, found {len(raw) - header}"
        )
    data = np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
    return data.astype(dtype.newbyteorder("="))


def _find_split_file(root: Path, name: str) -> Path | None:
    for candidate in (root / f"{name}.gz", root / name):
        if candidate.is_file():
            return candidate
    return None


def load_split(root: str | os.PathLike | None, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Load a Fashion-MNIST split from the IDX files in ``root`` (None: the shipped folder).

    Returns ``(images, labels)``: uint8 ``(N, 28, 28)`` and int64 ``(N,)``. Files may be
    gzip-compressed (``*-ubyte.gz``) or plain (``*-ubyte``).
    """
    if split not in SPLITS:
        raise checks.refuse("Fashion-MNIST split", split, "one of " + ", ".join(SPLITS))
    root = default_data_root() if root is None else Path(root)
    prefix = _FILE_PREFIX[split]
    image_name = f"{prefix}-images-idx3-ubyte"
    label_name = f"{prefix}-labels-idx1-ubyte"
    image_path = _find_split_file(root, image_name)
    label_path = _find_split_file(root, label_name)
    if image_path is None or label_path is None:
        missing = image_name if image_path is None else label_name
        raise ConfigError(
            f"Fashion-MNIST {split} split not found: no {missing}[.gz] in {str(root)!r}; "
            f"run `apt-get install dataset-fashion-mnist` and point data_root at "
            f"{SYSTEM_DATA_ROOT}, or copy the {prefix}-* files into that folder"
        )
    images = read_idx(image_path)  # (N, 28, 28)
    labels = read_idx(label_path)  # (N,)
    _check_arrays(images, labels, f"{str(root)!r} ({split} split)")
    return images.astype(np.uint8, copy=False), labels.astype(np.int64)


def _check_arrays(images: np.ndarray, labels: np.ndarray, where: str) -> None:
    if images.ndim != 3 or images.shape[1:] != (IMAGE_SIZE, IMAGE_SIZE) or images.dtype != np.uint8:
        raise ConfigError(
            f"Fashion-MNIST images in {where} must be uint8 (N, 28, 28), got {images.dtype} {tuple(images.shape)}"
        )
    if labels.ndim != 1 or len(labels) != len(images):
        raise ConfigError(
            f"Fashion-MNIST labels in {where} must be shape ({len(images)},) to match the "
            f"images, got {tuple(labels.shape)}"
        )
    if len(labels) and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
        raise ConfigError(
            f"Fashion-MNIST labels in {where} must be in 0..{NUM_CLASSES - 1}, "
            f"found {int(labels.min())}..{int(labels.max())}"
        )


class FashionMNISTImages(Dataset):
    """Fashion-MNIST as ``(image, label, caption)`` items for a text-to-image model.

    ``image`` is float32 ``(3, R, R)`` in [-1, 1] (the grayscale channel replicated three
    times), ``label`` an int and ``caption`` is ``caption_for(label, index)``.

    Resolutions from 28 to 36 are reached by centring the 28x28 image on a background (-1)
    canvas: the background of Fashion-MNIST is exactly 0, so padding is lossless and keeps
    the original pixels sharp (32 = 28 + 2 on each side). Resizing by a non-integer factor
    would blur every item. Larger resolutions, where padding would shrink the garment to a
    small patch, and smaller ones use bilinear resizing (antialiased when shrinking).
    """

    def __init__(self, images: np.ndarray, labels: np.ndarray, resolution: int = 32):
        """Wrap uint8 ``images`` (N, 28, 28) and integer ``labels`` (N,); no I/O happens here."""
        images = np.asarray(images)
        labels = np.asarray(labels)
        _check_arrays(images, labels, "the given arrays")
        resolution = int(resolution)
        if resolution < 1:
            raise ConfigError(f"image resolution must be >= 1, got {resolution}")
        self.images = torch.from_numpy(np.ascontiguousarray(images))  # (N, 28, 28) uint8
        self.labels = torch.from_numpy(labels.astype(np.int64))  # (N,) int64
        self.resolution = resolution

    @classmethod
    def from_folder(cls, root: str | os.PathLike | None, split: str, resolution: int = 32) -> FashionMNISTImages:
        """Load ``split`` from the IDX files in ``root`` (None: the shipped folder)."""
        images, labels = load_split(root, split)
        return cls(images, labels, resolution)

    def __len__(self) -> int:
        """Number of images."""
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, str]:
        """Return ``(image (3, R, R) float32 in [-1, 1], label, caption)`` of item ``index``."""
        label = int(self.labels[index])
        image = self.images[index].float().div(127.5).sub(1.0)  # (28, 28)
        image = self._to_resolution(image)  # (R, R)
        return image.unsqueeze(0).repeat(3, 1, 1), label, caption_for(label, index)

    def _to_resolution(self, image: torch.Tensor) -> torch.Tensor:
        size = self.resolution
        if size == IMAGE_SIZE:
            return image
        if IMAGE_SIZE < size <= _MAX_PADDED:
            before = (size - IMAGE_SIZE) // 2
            after = size - IMAGE_SIZE - before
            return F.pad(image, (before, after, before, after), value=_BACKGROUND)
        resized = F.interpolate(
            image[None, None],  # (1, 1, 28, 28)
            size=(size, size),
            mode="bilinear",
            align_corners=False,
            antialias=size < IMAGE_SIZE,
        )  # (1, 1, R, R)
        return resized[0, 0].clamp(-1.0, 1.0)
