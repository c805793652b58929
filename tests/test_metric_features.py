"""Shared images and features: a run's images are read once, each network's features computed once."""

from __future__ import annotations

import os

import numpy as np
import pytest
from PIL import Image

from lantern.errors import ConfigError
from lantern.files import image_name
from lantern.metrics import features as shared
from lantern.metrics.fid import FID


@pytest.fixture(autouse=True)
def _fresh():
    shared.forget()
    yield
    shared.forget()


class Counting:
    """A projection 'network' that counts the images it sees."""

    def __init__(self, net_id: str = "counting") -> None:
        self.net_id, self.seen = net_id, 0

    def features(self, images, batch_size=32, progress=True):
        if not isinstance(images, np.ndarray):
            images = np.stack([shared.read_png(p) for p in shared.list_pngs(images)])
        self.seen += len(images)
        return images.reshape(len(images), -1).astype(np.float64)[:, :6] + np.arange(6)  # (N, 6)


def _write(folder, images):
    folder.mkdir(exist_ok=True)
    for i, image in enumerate(images):
        Image.fromarray(image).save(folder / image_name(i))
    return folder


def test_run_images_are_read_once_and_again_when_a_file_changes(tmp_path, monkeypatch):
    images = np.random.default_rng(0).integers(0, 256, (5, 4, 4, 3), dtype=np.uint8)
    run_dir = _write(tmp_path / "run", images)
    reads = []
    original = shared.read_png
    monkeypatch.setattr(shared, "read_png", lambda p: reads.append(p) or original(p))
    first = shared.run_images(run_dir, 5)
    assert shared.run_images(run_dir, 5) is first and len(reads) == 5
    np.testing.assert_array_equal(first.source, images)
    assert shared.run_images(run_dir, 3).fingerprint != first.fingerprint and len(reads) == 8
    changed = images.copy()
    changed[2, 0, 0, 0] ^= 1
    Image.fromarray(changed[2]).save(run_dir / image_name(2))
    os.utime(run_dir / image_name(2), ns=(1, 1))  # a different modification time, whatever the clock
    again = shared.run_images(run_dir, 5)
    assert again.fingerprint != first.fingerprint and len(reads) == 13
    with pytest.raises(ConfigError, match="lacks 1 of its 6 images"):
        shared.run_images(run_dir, 6)


def test_features_are_computed_once_per_network_and_images(tmp_path):
    images = shared.image_set(np.random.default_rng(1).integers(0, 256, (7, 4, 4, 3), dtype=np.uint8))
    net, other = Counting(), Counting("other-net")
    a = shared.features(net, images)
    b = shared.features(net, images)
    assert a is b and net.seen == 7 and not a.flags.writeable
    shared.features(other, images)
    assert other.seen == 7  # another network id is another entry
    shared.features(net, shared.image_set(images.source[:3]))
    assert net.seen == 10


def test_features_on_disk_survive_the_process_and_a_bad_file_is_recomputed(tmp_path):
    source = np.random.default_rng(2).integers(0, 256, (4, 4, 4, 3), dtype=np.uint8)
    net = Counting()
    first = shared.features(net, shared.image_set(source), cache_dir=tmp_path)
    (path,) = (tmp_path / "features").glob("*.npz")
    shared.forget()  # a new process
    np.testing.assert_array_equal(shared.features(net, shared.image_set(source), cache_dir=tmp_path), first)
    assert net.seen == 4
    shared.forget()
    shared._save_npz(path, np.zeros((3, 6)))  # a file of another set's size under this name
    shared.features(net, shared.image_set(source), cache_dir=tmp_path)
    assert net.seen == 8
    shared.forget()
    path.write_bytes(b"not numpy")
    shared.features(net, shared.image_set(source), cache_dir=tmp_path)
    assert net.seen == 12


def test_altered_cached_features_are_recomputed_with_one_line(tmp_path, capsys):
    """The digest stored with the features: values changed under the same name and digest are never used."""
    source = np.random.default_rng(3).integers(0, 256, (4, 4, 4, 3), dtype=np.uint8)
    net = Counting()
    clean = np.array(shared.features(net, shared.image_set(source), cache_dir=tmp_path))
    (path,) = (tmp_path / "features").glob("*.npz")
    capsys.readouterr()
    with np.load(path) as data:
        digest = str(data["digest"])
    with path.open("wb") as handle:
        np.savez(handle, values=clean + 0.5, digest=np.str_(digest))  # tampered, digest kept
    shared.forget()
    again = shared.features(net, shared.image_set(source), cache_dir=tmp_path)
    np.testing.assert_array_equal(again, clean)
    assert net.seen == 8
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "does not match the digest" in lines[0] and path.name in lines[0]
    shared.forget()
    np.testing.assert_array_equal(shared.features(net, shared.image_set(source), cache_dir=tmp_path), clean)
    assert net.seen == 8 and not capsys.readouterr().err  # rewritten clean: read back silently


def test_a_folder_fingerprint_is_the_pixels_and_names(tmp_path):
    source = np.random.default_rng(3).integers(0, 256, (3, 4, 4, 3), dtype=np.uint8)
    folder = _write(tmp_path / "ref", source)
    assert shared.image_set(folder).fingerprint == shared.fingerprint(folder)
    assert shared.image_set(folder).fingerprint != shared.image_set(source).fingerprint


def test_two_metrics_on_one_network_share_its_pass(tmp_path):
    rng = np.random.default_rng(4)
    reference = rng.integers(0, 256, (12, 4, 4, 3), dtype=np.uint8)
    run_dir = _write(tmp_path / "run", rng.integers(0, 256, (6, 4, 4, 3), dtype=np.uint8))
    net = Counting()
    make = lambda: FID("toy", lambda: reference, cache_dir=str(tmp_path), progress=False, extractor=net)  # noqa: E731
    first, second = make()(run_dir, ["p"] * 6, None), make()(run_dir, ["p"] * 6, None)
    assert first["fid"] == second["fid"] and net.seen == 12 + 6  # reference once (stats cache), run once


def test_feature_and_statistics_caches_key_on_the_weights_bytes(tmp_path):
    """Two weights files of one architecture (a hand-copied pytorch-fid Inception beside the fetched one) give
    other features: their cache keys differ, and equal bytes under another name share one key."""
    from lantern.metrics.fid_stats import StatsKey
    from lantern.metrics.precision_recall import VGG16Features
    from lantern.metrics.pytorch_fid import PytorchFIDInception

    one, other, copy = tmp_path / "a.pth", tmp_path / "b.pth", tmp_path / "c.pth"
    one.write_bytes(b"weights one")
    other.write_bytes(b"weights two")
    copy.write_bytes(b"weights one")
    for make in (PytorchFIDInception, VGG16Features):
        ids = [make(str(path)).net_id for path in (one, other, copy)]
        assert ids[0] != ids[1] and ids[0] == ids[2]
        keys = {StatsKey("coco", 0, net_id, 5000).filename() for net_id in ids}
        assert len(keys) == 2
