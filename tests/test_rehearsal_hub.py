"""The loopback hub answers huggingface_hub 2.x as huggingface.co does (resolve with its headers, LFS bytes from
another host, ranges, model info, tree listings, the hub's error codes), replicas hold exactly what upstream's
listings name, and the rehearsal's registry copy differs from upstream's in pin values and URL hosts only."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import requests
import yaml
from fixtures.hub import pins
from fixtures.hub.replicas import Replicas, commit_of, hub_names, listings
from fixtures.hub.server import Hub, environment

COMMIT = "0123456789abcdef0123456789abcdef01234567"
BIG = bytes(range(256)) * 8192  # 2 MiB


@pytest.fixture
def hub(tmp_path, monkeypatch):
    from huggingface_hub import constants

    (tmp_path / "config.json").write_text('{"model_type": "t5"}')
    (tmp_path / "weights").write_bytes(BIG)
    (tmp_path / "nested.txt").write_text("x")
    files = {"config.json": tmp_path / "config.json", "model.safetensors": tmp_path / "weights"}
    files["sub/nested.txt"] = tmp_path / "nested.txt"
    with Hub(lifetime=120) as server:
        server.add_repo("org/repo", COMMIT, files, {"model.safetensors"})
        server.add_url("http://images.example.org/zips/a.zip", tmp_path / "weights")
        for key, value in environment(server).items():
            monkeypatch.setenv(key, value)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        yield server


def test_file_metadata_carries_the_hubs_headers_and_lfs_goes_to_another_host(hub):
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    lfs = get_hf_file_metadata(hf_hub_url("org/repo", "model.safetensors", revision="main", endpoint=hub.endpoint))
    assert lfs.commit_hash == COMMIT and lfs.etag == hashlib.sha256(BIG).hexdigest() and lfs.size == len(BIG)
    assert lfs.location.startswith(hub.content_base) and hub.content_base != hub.endpoint
    small = get_hf_file_metadata(hf_hub_url("org/repo", "config.json", revision=COMMIT, endpoint=hub.endpoint))
    data = b'{"model_type": "t5"}'
    assert small.etag == hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() and small.size == len(data)


def test_downloads_snapshots_ranges_and_errors(hub, tmp_path):
    from huggingface_hub import HfApi, errors, hf_hub_download, snapshot_download

    path = hf_hub_download("org/repo", "model.safetensors", revision="main", local_dir=tmp_path / "a")
    assert Path(path).read_bytes() == BIG
    folder = snapshot_download("org/repo", revision="main", allow_patterns=["*.json", "sub/*"], local_dir=tmp_path / "b")
    got = sorted(p.relative_to(folder).as_posix() for p in Path(folder).rglob("*") if p.is_file())
    assert [name for name in got if not name.startswith(".cache")] == ["config.json", "sub/nested.txt"]
    tree = list(HfApi(endpoint=hub.endpoint).list_repo_tree("org/repo", recursive=True, revision="main"))
    assert sorted(entry.path for entry in tree) == ["config.json", "model.safetensors", "sub", "sub/nested.txt"]
    assert HfApi(endpoint=hub.endpoint).model_info("org/repo").sha == COMMIT
    ranged = requests.get(hub.mirror("http://images.example.org/zips/a.zip"), headers={"Range": "bytes=100-"})
    assert ranged.status_code == 206 and ranged.content == BIG[100:]
    with pytest.raises(errors.EntryNotFoundError):
        hf_hub_download("org/repo", "tokenizer.json", revision="main", local_dir=tmp_path / "c")
    with pytest.raises(errors.RevisionNotFoundError):
        hf_hub_download("org/repo", "config.json", revision="f" * 40, local_dir=tmp_path / "c")
    with pytest.raises(errors.RepositoryNotFoundError):
        hf_hub_download("org/other", "config.json", revision="main", local_dir=tmp_path / "c")
    assert not (tmp_path / "c" / "tokenizer.json").exists()


def test_every_hub_replica_holds_exactly_its_listing_at_its_revision(tmp_path):
    """Built replicas serve the listing's names and nothing else (a weights layout the listing leaves open is
    its first one); the URL replicas are the one listed file. Large and slow builders are left out here."""
    replicas = Replicas(tmp_path)
    skip = {"pytorch__vision__vgg16", "mseitzer__pytorch-fid__inception", "FoundationVision__LlamaGen"}
    for stem, listing in listings().items():
        if stem in skip:
            continue
        built = replicas.build(stem)
        if listing["kind"] == "hub":
            assert sorted(built.files) == sorted(hub_names(listing)), stem
            assert len(commit_of(listing)) == 40
        else:
            assert list(built.files) == [listing["files"][0]["name"]], stem
        assert all(path.is_file() and path.stat().st_size > 0 for path in built.files.values()), stem


def test_the_registry_copy_changes_pin_values_and_url_hosts_only(tmp_path):
    """Every entry's rewrite (here the cheap sources') keeps names, revisions, files and destinations, and swaps
    only pins that upstream's registry sets."""
    registry = Path(__file__).resolve().parents[1] / "conf" / "assets"
    replicas = Replicas(tmp_path / "replicas")
    heavy = {"vgg16_torchvision", "pytorch_fid_inception", "llamagen_c2i_xl_384", "llamagen_c2i_xxl_384"}
    with Hub(lifetime=120) as hub:
        original = {n: e for p in registry.glob("*.yaml") for n, e in yaml.safe_load(p.read_text()).items()}
        names = {n for n, e in original.items() if (e.get("hub") or e.get("url")) and n not in heavy}
        copy = pins.rewrite_registry(registry, tmp_path / "copy", replicas, hub, only=names)
        rewritten = {n: e for p in copy.glob("*.yaml") for n, e in yaml.safe_load(p.read_text()).items()}
    assert set(rewritten) == set(original)
    changed = pins.differences(original, rewritten)
    assert changed and all(pins.allowed_change(*_parts(line, original, rewritten)) for line in changed), changed
    assert any(".sha256:" in line for line in changed) and any(".url:" in line for line in changed)


def _parts(line: str, original: dict, rewritten: dict):
    key = line.split(":", 1)[0]
    return key, _at(original, key), _at(rewritten, key)


def _at(tree, key: str):
    for part in key.replace("[", ".[").split("."):
        if part.startswith("["):
            tree = tree[int(part[1:-1])]
        else:
            tree = (tree or {}).get(part)
    return tree


def test_the_hub_stops_itself(tmp_path):
    hub = Hub(lifetime=0.5).start()
    base = hub.endpoint
    import time

    time.sleep(1.5)
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{base}/api/models/a/b", timeout=2)
    assert os.environ.get("HF_ENDPOINT") != base
