import json
from pathlib import Path

import pytest

from lantern.errors import CheckpointError
from lantern.world import read_manifest, sha256_file, verify_world

REPO = Path(__file__).resolve().parents[1]


def make_world(folder):
    (folder / "a.bin").write_bytes(b"weights")
    manifest = {"files": {"a.bin": {"sha256": sha256_file(folder / "a.bin"), "command": "python make_a.py"}}}
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_verify_accepts_intact_files(tmp_path):
    make_world(tmp_path)
    assert "a.bin" in verify_world(tmp_path)["files"]


def test_altered_or_missing_file_says_how_to_restore(tmp_path):
    make_world(tmp_path)
    (tmp_path / "a.bin").write_bytes(b"weightz")
    with pytest.raises(CheckpointError, match=r"a\.bin.*altered.*python make_a\.py"):
        verify_world(tmp_path)
    (tmp_path / "a.bin").unlink()
    with pytest.raises(CheckpointError, match=r"a\.bin.*missing.*python make_a\.py"):
        verify_world(tmp_path)


def test_missing_or_broken_manifest(tmp_path):
    with pytest.raises(CheckpointError, match="manifest not found"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text("{nope")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        read_manifest(tmp_path)


def test_shipped_world_matches_its_manifest():
    folder = REPO / "worlds" / "fashion_mnist"
    if not (folder / "manifest.json").is_file():
        pytest.skip("no shipped world in this checkout yet")
    manifest = verify_world(folder)
    assert manifest["total_bytes"] <= 30 * 2**20
