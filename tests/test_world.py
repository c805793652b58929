import json
from pathlib import Path

import pytest

from lantern.errors import CheckpointError
from lantern.files import sha256_file
from lantern.models.world.load import read_manifest, verify_world

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
    stats = sum(
        e["bytes"] for name, e in manifest["files"].items() if name.endswith(".npz")
    )  # FID reference statistics
    assert manifest["total_bytes"] - stats <= 30 * 2**20 and stats <= 20 * 2**20


@pytest.mark.parametrize("name", ["../outside.bin", "../../../etc/passwd", "/etc/passwd", "sub/../../outside.bin", ""])
def test_manifest_names_outside_the_world_folder_are_refused_unhashed(tmp_path, name, monkeypatch):
    world = tmp_path / "world"
    world.mkdir()
    (tmp_path / "outside.bin").write_bytes(b"secret")
    (world / "manifest.json").write_text(json.dumps({"files": {name: {"sha256": "0" * 64, "command": "x"}}}))
    hashed = []
    monkeypatch.setattr("lantern.models.world.load.note_input", lambda path, role: hashed.append(path) or "f" * 64)
    with pytest.raises(CheckpointError, match="only (relative paths|files) inside"):
        verify_world(world)
    assert hashed == []  # nothing outside the folder is read


def test_a_symlink_out_of_the_world_folder_is_refused(tmp_path):
    world = tmp_path / "world"
    world.mkdir()
    (tmp_path / "outside.bin").write_bytes(b"secret")
    (world / "a.bin").symlink_to(tmp_path / "outside.bin")
    (world / "manifest.json").write_text(json.dumps({"files": {"a.bin": {"sha256": "0" * 64}}}))
    with pytest.raises(CheckpointError, match="outside the world folder"):
        verify_world(world)


def test_restore_advice_suggests_git_only_for_tracked_files_of_this_repository(tmp_path):
    make_world(tmp_path)  # a world outside the repository
    (tmp_path / "a.bin").write_bytes(b"weightz")
    with pytest.raises(CheckpointError) as outside:
        verify_world(tmp_path)
    assert "git checkout" not in str(outside.value) and "restore it from where the world folder came from" in str(
        outside.value
    )
    from lantern.models.world.load import restore_hint

    shipped = REPO / "worlds" / "fashion_mnist" / "gpt.safetensors"
    if shipped.is_file():
        assert restore_hint(shipped) == "restore it with `git checkout -- worlds/fashion_mnist/gpt.safetensors`"


def test_a_world_is_pinned_whole_a_deleted_entry_is_an_error_not_a_skipped_check(tmp_path):
    from lantern.models.world.load import world_file

    make_world(tmp_path)
    (tmp_path / "b.bin").write_bytes(b"drafter")
    with pytest.raises(CheckpointError, match=r"no entry for 'b\.bin', which the world loads"):
        world_file(str(tmp_path), "b.bin")
    with pytest.raises(CheckpointError, match=r"no entry for 'b\.bin'"):
        verify_world(tmp_path, loads=("b.bin",))
    assert world_file(str(tmp_path), "a.bin") == str(tmp_path / "a.bin")
    (tmp_path / "a.bin").write_bytes(b"weightz")  # and a file that has one is checked when it is asked for
    with pytest.raises(CheckpointError, match=r"a\.bin.*altered"):
        world_file(str(tmp_path), "a.bin")


def test_the_shipped_world_refuses_to_load_a_file_whose_entry_was_deleted(tmp_path):
    import shutil

    from lantern.models.world.load import load_world

    world = tmp_path / "world"
    shutil.copytree(REPO / "worlds" / "fashion_mnist", world)
    manifest = json.loads((world / "manifest.json").read_text())
    del manifest["files"]["gpt.safetensors"]
    (world / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=r"no entry for 'gpt\.safetensors'"):
        load_world("fashion_t2i", {}, {}, conditioner=lambda: None, folder=str(world))
