"""Pinned bytes, against the loopback hub (127.0.0.1 only): a hub branch is resolved to a commit on the first
fetch and later fetches with that lock ask for the commit; a folder's patterns are matched on the hub's tree and
every match locked with its sha256 and size; an md5 pin and an upstream checksum list check a download; a URL's
mirrors are tried in order against one pin; an unverified pin warns and never deletes, a verified one refuses."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from fetch_helpers import BIG, COMMIT, FILES, serving, sha

from lantern.run.assets import fetching
from lantern.run.assets.check import check_assets
from lantern.run.assets.listing import rows
from lantern.run.assets.store import AssetError, Lock

DATA = FILES["/plain/data.zip"]


@pytest.fixture
def server():
    yield from serving()


@pytest.fixture
def hub(server, tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    return server


def use(tmp_path: Path, monkeypatch, text: str, *names: str) -> dict:
    folder = (
        tmp_path / f"registry-{len(list(tmp_path.glob('registry-*')))}"
    )  # a new folder: the registry is cached by folder
    folder.mkdir()
    (folder / "t.yaml").write_text(text)
    monkeypatch.setenv("LANTERN_ASSET_REGISTRY", str(folder))
    return {"paths": {"assets": str(tmp_path / "assets")}, "model": {"name": "x"}, "assets": {"extra": list(names)}}


def fetch(resolved: dict, said: list | None = None) -> None:
    fetching.fetch(resolved, say=(said.append if said is not None else lambda _: None), progress=False)


def test_a_branch_is_locked_to_its_commit_and_later_fetches_ask_for_it(hub, tmp_path, monkeypatch):
    resolved = use(
        tmp_path,
        monkeypatch,
        "w: {dest: org/weights, hub: {repo: org/weights, revision: main}, files: [config.json, model.bin], licence: t}\n",
        "w",
    )
    fetch(resolved)
    root = tmp_path / "assets"
    lock = json.loads((root / "assets.lock.json").read_text())
    assert lock["revisions"]["org/weights@main"]["commit"] == COMMIT
    assert lock["files"]["org/weights/model.bin"]["revision"] == COMMIT
    (root / "org/weights/model.bin").unlink()
    hub.requested.clear()
    fetch(resolved)
    assert hub.requested and all(f"/resolve/{COMMIT}/" in p for p in hub.requested if "/resolve/" in p)
    assert {r.revision for r in rows(root, fetching.plan(resolved)[1])} == {COMMIT}  # --list shows the commit


def test_patterns_take_one_file_or_shards_and_lock_each(hub, tmp_path, monkeypatch):
    hub.files["/org/janus/resolve/main/config.json"] = b'{"model_type": "janus"}'
    hub.files["/org/janus/resolve/main/tokenizer.json"] = b"{}"
    hub.files["/org/janus/resolve/main/model-00001-of-00002.safetensors"] = BIG
    hub.files["/org/janus/resolve/main/model-00002-of-00002.safetensors"] = BIG[::-1]
    hub.files["/org/janus/resolve/main/model.safetensors.index.json"] = b'{"weight_map": {}}'
    hub.files["/org/janus/resolve/main/README.md"] = b"not matched"
    entry = "j: {dest: org/janus, hub: {repo: org/janus, revision: main}, files: [config.json],"
    resolved = use(tmp_path, monkeypatch, entry + " patterns: ['*.json', 'model*.safetensors'], licence: t}\n", "j")
    root = tmp_path / "assets"
    assert [r.name for r in rows(root, fetching.plan(resolved)[1])] == [
        "config.json",
        "<files matching *.json>",
        "<files matching model*.safetensors>",
    ]
    fetch(resolved)
    lock = json.loads((root / "assets.lock.json").read_text())
    matched = lock["expansions"]["j"]["files"]
    assert matched == sorted(
        [
            "config.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.json",
            "tokenizer.json",
        ]
    )
    assert lock["expansions"]["j"]["revision"] == COMMIT and not (root / "org/janus/README.md").exists()
    for name in matched:
        assert lock["files"][f"org/janus/{name}"]["sha256"] == sha((root / "org/janus" / name).read_bytes())
    resolved["model"].update(assets={"gpt_ckpt": "j"}, gpt_ckpt=str(root / "org/janus"))
    resolved["model"]["bundle"] = {"gpt_ckpt": resolved["model"]["gpt_ckpt"]}
    resolved.pop("assets")
    check_assets(resolved)  # every matched file, as locked
    (root / "org/janus/model-00002-of-00002.safetensors").unlink()
    with pytest.raises(AssetError, match="model-00002-of-00002.safetensors' .* is not there"):
        check_assets(resolved)


def test_an_md5_pin_and_an_upstream_checksum_list_check_downloads(hub, tmp_path, monkeypatch):
    md5 = hashlib.md5(DATA, usedforsecurity=False).hexdigest()
    port = hub.server_address[1]
    url = f"http://127.0.0.1:{port}/plain/data.zip"
    good = use(
        tmp_path, monkeypatch, f"z: {{dest: z.zip, url: '{url}', md5: {md5}, verified: true, licence: t}}\n", "z"
    )
    fetch(good)
    assert Lock(tmp_path / "assets").get("z.zip")["md5"] == md5
    bad = use(
        tmp_path, monkeypatch, f"y: {{dest: y.zip, url: '{url}', md5: '{'0' * 32}', verified: true, licence: t}}\n", "y"
    )
    with pytest.raises(AssetError, match="has md5 .*its md5 pin .* says 0000.*the download was removed"):
        fetch(bad)
    assert not (tmp_path / "assets/y.zip").exists()
    hub.files["/org/gair/resolve/main/tokenizer/checklist.chk"] = f"{'1' * 32}  vqgan.ckpt\n".encode()
    hub.files["/org/gair/resolve/main/tokenizer/vqgan.ckpt"] = BIG
    entry = "v: {dest: cham/tokenizer/vqgan.ckpt, hub: {repo: org/gair, revision: main, file: tokenizer/vqgan.ckpt},"
    listed = use(tmp_path, monkeypatch, entry + " checksums: tokenizer/checklist.chk, licence: t}\n", "v")
    with pytest.raises(AssetError, match="vqgan.ckpt has md5 .* says 1111.*the download was removed"):
        fetch(listed)
    assert (tmp_path / "assets/cham/tokenizer/checklist.chk").is_file()
    assert not (tmp_path / "assets/cham/tokenizer/vqgan.ckpt").exists()
    right = hashlib.md5(BIG, usedforsecurity=False).hexdigest()
    hub.files["/org/gair/resolve/main/tokenizer/checklist.chk"] = f"{right}  vqgan.ckpt\n".encode()
    (tmp_path / "assets/cham/tokenizer/checklist.chk").unlink()
    Lock(tmp_path / "assets").entries.clear()
    (tmp_path / "assets/assets.lock.json").unlink()
    fetch(listed)
    assert Lock(tmp_path / "assets").get("cham/tokenizer/vqgan.ckpt")["md5"] == right


def test_mirrors_are_tried_in_order_against_one_pin(hub, tmp_path, monkeypatch):
    port = hub.server_address[1]
    hub.files["/wrong/data.zip"] = b"other bytes"
    urls = [f"http://127.0.0.1:{port}/{p}" for p in ("gone/data.zip", "wrong/data.zip", "plain/data.zip")]
    entry = f"m: {{dest: m.zip, url: {json.dumps(urls)}, sha256: '{sha(DATA)}', verified: true, licence: t}}\n"
    said = []
    fetch(use(tmp_path, monkeypatch, entry, "m"), said)
    assert (tmp_path / "assets/m.zip").read_bytes() == DATA
    assert [s.split(" -> ")[0] for s in said if s.startswith("fetching")] == [f"fetching {u}" for u in urls]
    one = f"n: {{dest: n.zip, url: {json.dumps(urls[:2])}, sha256: '{sha(DATA)}', verified: true, licence: t}}\n"
    with pytest.raises(AssetError, match=r"has sha256 .* \(tried 2 sources; the first said: .*HTTP 404"):
        fetch(use(tmp_path, monkeypatch, one, "n"))


def test_an_unverified_pin_warns_keeps_and_locks_a_verified_one_refuses_without_deleting(hub, tmp_path, monkeypatch):
    url = f"http://127.0.0.1:{hub.server_address[1]}/plain/data.zip"
    wrong = "e" * 64
    loose = use(
        tmp_path,
        monkeypatch,
        f"u: {{dest: u.zip, url: '{url}', sha256: '{wrong}', verified: false, licence: t}}\n",
        "u",
    )
    said = []
    fetch(loose, said)
    assert (tmp_path / "assets/u.zip").read_bytes() == DATA  # downloaded, kept
    assert any(s.startswith("warning: ") and "unverified pin: kept and locked" in s for s in said)
    assert "eeeeeeee" in Lock(tmp_path / "assets").get("u.zip")["warning"]
    hand = tmp_path / "assets/h.zip"  # a file copied by hand, then a verified pin it contradicts
    hand.write_bytes(b"copied by hand")
    strict = use(
        tmp_path, monkeypatch, f"h: {{dest: h.zip, url: '{url}', sha256: '{wrong}', verified: true, licence: t}}\n", "h"
    )
    with pytest.raises(AssetError, match="h.zip' .*has sha256 .*remove it and fetch again"):
        fetch(strict)
    assert hand.read_bytes() == b"copied by hand"  # refused, never deleted
    hand.write_bytes(b"copied by hand, again")
    soft = use(
        tmp_path,
        monkeypatch,
        f"h: {{dest: h.zip, url: '{url}', sha256: '{wrong}', verified: false, licence: t}}\n",
        "h",
    )
    fetch(soft)  # an unverified pin: a warning, the user's file kept and locked
    assert hand.read_bytes() == b"copied by hand, again" and Lock(tmp_path / "assets").get("h.zip")["warning"]
