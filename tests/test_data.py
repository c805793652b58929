"""Fast checks of the Fashion-MNIST data module and the shipped test split."""

from __future__ import annotations

import gzip
import hashlib
import re
from collections import Counter

import numpy as np
import pytest
import torch

from lantern.errors import ConfigError
from lantern.models.world.fashion_mnist import (
    CLASS_NAMES,
    FashionMNISTImages,
    all_captions,
    caption_for,
    default_data_root,
    load_split,
    prompt_set,
    read_idx,
)


@pytest.fixture(scope="module")
def test_split() -> tuple[np.ndarray, np.ndarray]:
    return load_split(default_data_root(), "test")


def test_shipped_test_split_loads(test_split):
    images, labels = test_split
    assert images.shape == (10000, 28, 28) and images.dtype == np.uint8
    assert labels.shape == (10000,) and labels.dtype == np.int64
    assert set(np.unique(labels).tolist()) == set(range(10))
    assert np.bincount(labels).tolist() == [1000] * 10


def test_load_split_defaults_to_shipped_folder(test_split):
    images, labels = load_split(None, "test")
    assert np.array_equal(images, test_split[0]) and np.array_equal(labels, test_split[1])


def test_readme_sha256_matches_files():
    root = default_data_root()
    listed = dict(
        (name, digest)
        for digest, name in re.findall(r"^([0-9a-f]{64})\s+(\S+)$", (root / "README.md").read_text(), re.M)
    )
    assert set(listed) == {"t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}
    for name, digest in listed.items():
        assert hashlib.sha256((root / name).read_bytes()).hexdigest() == digest, name


def test_no_train_split_shipped():
    assert not list(default_data_root().glob("train-*"))


def test_dataset_items_at_32(test_split):
    dataset = FashionMNISTImages(*test_split, resolution=32)
    assert len(dataset) == 10000
    for index in (0, 1, 9999):
        image, label, caption = dataset[index]
        assert image.shape == (3, 32, 32) and image.dtype == torch.float32
        assert image.min() >= -1.0 and image.max() <= 1.0
        assert torch.equal(image[0], image[1]) and torch.equal(image[0], image[2])
        assert label == int(test_split[1][index])
        assert caption == caption_for(label, index)
        # Padding is exact: the 2-pixel border is background and the centre is the original.
        assert torch.all(image[:, :2] == -1.0) and torch.all(image[:, :, -2:] == -1.0)
        original = torch.from_numpy(test_split[0][index]).float() / 127.5 - 1.0
        assert torch.allclose(image[0, 2:30, 2:30], original)


@pytest.mark.parametrize("resolution", [16, 28, 33, 64])
def test_dataset_other_resolutions(test_split, resolution):
    images, labels = test_split
    image, _, _ = FashionMNISTImages(images[:4], labels[:4], resolution)[3]
    assert image.shape == (3, resolution, resolution)
    assert image.min() >= -1.0 and image.max() <= 1.0


def test_dataloader_batches(test_split):
    dataset = FashionMNISTImages(test_split[0][:8], test_split[1][:8], 32)
    images, labels, captions = next(iter(torch.utils.data.DataLoader(dataset, batch_size=8)))
    assert images.shape == (8, 3, 32, 32) and labels.shape == (8,) and len(captions) == 8


def test_from_folder(test_split):
    dataset = FashionMNISTImages.from_folder(default_data_root(), "test", 32)
    assert len(dataset) == 10000 and dataset[5][1] == int(test_split[1][5])


def test_captions_deterministic_and_name_the_class():
    for label, name in enumerate(CLASS_NAMES):
        captions = all_captions(label)
        assert 5 <= len(captions) <= 8 and len(set(captions)) == len(captions)
        for caption in captions:
            assert name.lower() in caption.lower()
        for index in range(20):
            assert caption_for(label, index) == caption_for(label, index)
            assert caption_for(label, index) == captions[index % len(captions)]
    assert "a pair of trousers" in caption_for(1, 0)
    assert "an ankle boot" in caption_for(9, 0)
    with pytest.raises(ConfigError, match="label"):
        caption_for(10, 0)


def test_prompt_set_is_fixed_and_balanced():
    prompts = prompt_set(70)
    assert prompts == prompt_set(70, seed=0)
    assert [p.label for p in prompts] == [i % 10 for i in range(70)]
    assert Counter(p.label for p in prompts) == {c: 7 for c in range(10)}
    for label, caption in prompts:
        assert caption in all_captions(label)
    # Seven prompts per class walk through all seven templates.
    for c in range(10):
        assert {p.caption for p in prompts if p.label == c} == set(all_captions(c))
    assert prompt_set(70, seed=1) != prompts
    assert prompt_set(25)[:20] == prompt_set(20)


def test_read_idx_roundtrip_plain_and_gz(tmp_path):
    data = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    raw = bytes([0, 0, 0x08, 3]) + np.array([2, 3, 4], dtype=">u4").tobytes() + data.tobytes()
    (tmp_path / "a.idx").write_bytes(raw)
    (tmp_path / "a.idx.gz").write_bytes(gzip.compress(raw))
    assert np.array_equal(read_idx(tmp_path / "a.idx"), data)
    assert np.array_equal(read_idx(tmp_path / "a.idx.gz"), data)
    wide = np.array([1, -2, 300], dtype=np.int32)
    (tmp_path / "w.idx").write_bytes(
        bytes([0, 0, 0x0C, 1]) + np.array([3], dtype=">u4").tobytes() + wide.astype(">i4").tobytes()
    )
    assert read_idx(tmp_path / "w.idx").tolist() == [1, -2, 300]


@pytest.mark.parametrize(
    "payload, message",
    [
        (b"not an idx file at all", "bad magic number"),
        (b"", "bad magic number"),
        (bytes([0, 0, 0x08, 1]) + np.array([10], dtype=">u4").tobytes() + b"\0" * 3, "corrupt"),
        (bytes([0, 0, 0x08, 2]) + b"\0\0", "truncated"),
        (b"\x1f\x8b broken gzip", "not a readable IDX file"),
    ],
)
def test_bad_idx_file_raises_config_error(tmp_path, payload, message):
    path = tmp_path / "bad-idx1-ubyte"
    path.write_bytes(payload)
    with pytest.raises(ConfigError, match=message) as info:
        read_idx(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_bad_files_in_split_folder_raise_config_error(tmp_path):
    (tmp_path / "t10k-images-idx3-ubyte").write_bytes(b"junk")
    (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(b"junk")
    with pytest.raises(ConfigError, match="bad magic number"):
        load_split(tmp_path, "test")


def test_missing_train_split_gives_helpful_error(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_split(tmp_path, "train")
    message = str(info.value)
    assert str(tmp_path) in message and "\n" not in message
    assert "apt-get install dataset-fashion-mnist" in message
    assert "/usr/share/datasets/fashion-mnist" in message and "train-*" in message


def test_bad_split_name():
    with pytest.raises(ConfigError, match="split=.validation.: expected one of train, test"):
        load_split(default_data_root(), "validation")
