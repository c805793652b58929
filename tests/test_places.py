"""Nothing fetched or unpacked escapes its folder: a registry ``dest`` or file name that leaves ``paths.assets``
or is absolute, a ``revision`` that is no branch, tag or commit, a shard an index names outside its folder, and
a zip member that climbs out, is absolute or is a link are each refused in one line with nothing written."""

from __future__ import annotations

import io
import json
import stat
import zipfile
from pathlib import Path

import pytest

from lantern.errors import ConfigError
from lantern.run.assets import fetching, places
from lantern.run.assets.recipes import unzip
from lantern.run.assets.registry import load_registry, named, shard_names


def registry_of(tmp_path: Path, text: str) -> dict:
    folder = tmp_path / "registry"
    folder.mkdir(exist_ok=True)
    (folder / "one.yaml").write_text(text)
    return load_registry(str(folder))


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("{dest: ../x, url: 'https://a.example/x', licence: t}", "dest='../x': expected a relative path"),
        ("{dest: /etc/x, url: 'https://a.example/x', licence: t}", "dest='/etc/x': expected a relative path"),
        ("{dest: a/../../x, url: 'https://a.example/x', licence: t}", "dest='a/../../x'"),
        ("{dest: 'C:/x', url: 'https://a.example/x', licence: t}", "dest='C:/x'"),
        ("{dest: x, hub: {repo: o/r, revision: ../../..}, files: [a], licence: t}", "revision='../../..': expected"),
        ("{dest: x, hub: {repo: o/r, revision: 'main@{1}'}, files: [a], licence: t}", "revision='main@\\{1\\}'"),
        ("{dest: x, hub: {repo: o/r, revision: main, file: ../../x}, licence: t}", "hub.file='../../x'"),
        ("{dest: x, hub: {repo: o/r, revision: main}, files: [../y], licence: t}", "files='../y'"),
        ("{dest: x, url: 'https://a.example/x', sha256: abc, licence: t}", "sha256='abc': expected 64 hex digits"),
        ("{dest: x, url: 'https://a.example/x', md5: 12, licence: t}", "md5=12: expected 32 hex digits"),
        ("{dest: x, url: 'https://a.example/x', verified: maybe, licence: t}", "verified='maybe'"),
        ("{dest: x, url: 'file:///etc/passwd', licence: t}", "is not an HTTP\\(S\\) URL"),
    ],
)
def test_a_registry_entry_that_leaves_its_place_is_refused_when_read(tmp_path, entry, message):
    with pytest.raises(ConfigError, match=message):
        registry_of(tmp_path, f"bad: {entry}\n")


@pytest.mark.parametrize("revision", ["main", "v1.0", "refs/pr/1", "release-2024_05", "a" * 40])
def test_branches_tags_and_commits_are_revisions(revision):
    assert places.check_revision("asset x", revision) == revision
    assert places.is_commit(revision) == (revision == "a" * 40)


def test_a_shard_index_naming_a_file_outside_its_folder_is_refused(tmp_path):
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"a": "model-1.safetensors", "b": "../../escape.safetensors"}}))
    with pytest.raises(ConfigError, match="'../../escape.safetensors': expected a relative path"):
        shard_names(index)


def test_a_place_reached_through_a_link_out_of_the_root_is_refused(tmp_path):
    root, outside = tmp_path / "assets", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "org").symlink_to(outside)
    with pytest.raises(ConfigError, match="resolves to .*outside"):
        places.inside(root, "org/weights/model.bin", "asset x")
    assert places.inside(root, "plain/x", "asset x") == root / "plain/x"


def _zip(tmp_path: Path, members: dict[str, bytes], link: str | None = None) -> Path:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
        if link is not None:
            info = zipfile.ZipInfo(link)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, "/etc/passwd")
    path = tmp_path / "archive.zip"
    path.write_bytes(buffer.getvalue())
    return path


@pytest.mark.parametrize(
    ("members", "link", "message"),
    [
        ({"val/a.jpg": b"1", "val/../../x": b"2"}, None, "'val/../../x' would be written outside its folder"),
        ({"val/a.jpg": b"1", "/val/abs": b"2"}, None, None),  # absolute: not under val/, never extracted
        ({"val/a.jpg": b"1"}, "val/link", "member 'val/link' is a link"),
    ],
)
def test_a_zip_member_that_escapes_or_is_a_link_refuses_the_archive_before_writing(tmp_path, members, link, message):
    archive = _zip(tmp_path, members, link)
    out = tmp_path / "out"
    if message is None:
        unzip([archive], out, member="val/")
        assert sorted(p.name for p in out.iterdir()) == ["a.jpg"] and not (tmp_path / "val").exists()
        return
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        unzip([archive], out, member="val/")
    assert not out.exists() and not (tmp_path / "x").exists()


def test_an_absolute_member_named_for_extraction_is_refused(tmp_path):
    archive = _zip(tmp_path, {"/abs/captions.json": b"{}"})
    with pytest.raises(ConfigError, match="would be written outside its folder"):
        unzip([archive], tmp_path / "out.json", member="/abs/captions.json")
    assert not (tmp_path / "out.json").exists()


def test_fetch_derives_nothing_from_an_archive_with_an_escaping_member(tmp_path, monkeypatch):
    archive = _zip(tmp_path, {"val/a.jpg": b"1", "val/../../../escaped": b"2"})
    root = tmp_path / "assets"
    (root / "coco").mkdir(parents=True)
    archive.rename(root / "coco/val.zip")
    folder = tmp_path / "registry"
    folder.mkdir()
    (folder / "one.yaml").write_text(
        "zip: {dest: coco/val.zip, url: 'https://a.example/val.zip', licence: t}\n"
        "images: {dest: coco/val, recipe: {_target_: lantern.run.assets.recipes.unzip, member: val/},"
        " inputs: [zip], licence: t}\n"
    )
    monkeypatch.setenv("LANTERN_ASSET_REGISTRY", str(folder))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    resolved = {"paths": {"assets": str(root)}, "model": {"name": "x"}, "assets": {"extra": ["images"]}}
    with pytest.raises(ConfigError, match="would be written outside its folder"):
        fetching.fetch(resolved, say=lambda _: None)
    assert not (root / "coco/val").exists() and not list(tmp_path.rglob("escaped"))
    assert not list((root / ".partial").rglob("a.jpg"))


def test_a_folder_completed_from_another_repo_names_both_assets():
    registry = load_registry()
    resolved = {"model": {"assets": {"gpt_ckpt": ["lumina_mgpt_7b_512", "lumina_mgpt_7b_512_tokenizer"]}}}
    assert named(resolved) == [
        ("model.gpt_ckpt", "lumina_mgpt_7b_512"),
        ("model.gpt_ckpt", "lumina_mgpt_7b_512_tokenizer"),
    ]
    model, tokenizer = registry["lumina_mgpt_7b_512"], registry["lumina_mgpt_7b_512_tokenizer"]
    assert model.dest == tokenizer.dest and tokenizer.source.repo == "Alpha-VLLM/Lumina-mGPT-7B-768"
    assert {"tokenizer.json"} <= set(tokenizer.files) and "tokenizer.json" not in model.files
