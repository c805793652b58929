"""The loopback hub answers huggingface_hub 2.x as huggingface.co does: resolve with its headers, LFS bytes from
another host, ranges, model info, tree listings, the hub's error codes; and it stops itself."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import requests
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

    path = hf_hub_download(
        "org/repo", "model.safetensors", revision="main", local_dir=tmp_path / "a", endpoint=hub.endpoint
    )
    assert Path(path).read_bytes() == BIG
    folder = snapshot_download(
        "org/repo", revision="main", allow_patterns=["*.json", "sub/*"], local_dir=tmp_path / "b", endpoint=hub.endpoint
    )
    got = sorted(p.relative_to(folder).as_posix() for p in Path(folder).rglob("*") if p.is_file())
    assert [name for name in got if not name.startswith(".cache")] == ["config.json", "sub/nested.txt"]
    tree = list(HfApi(endpoint=hub.endpoint).list_repo_tree("org/repo", recursive=True, revision="main"))
    assert sorted(entry.path for entry in tree) == ["config.json", "model.safetensors", "sub", "sub/nested.txt"]
    assert HfApi(endpoint=hub.endpoint).model_info("org/repo").sha == COMMIT
    ranged = requests.get(hub.mirror("http://images.example.org/zips/a.zip"), headers={"Range": "bytes=100-"})
    assert ranged.status_code == 206 and ranged.content == BIG[100:]
    with pytest.raises(errors.EntryNotFoundError):
        hf_hub_download("org/repo", "tokenizer.json", revision="main", local_dir=tmp_path / "c", endpoint=hub.endpoint)
    with pytest.raises(errors.RevisionNotFoundError):
        hf_hub_download("org/repo", "config.json", revision="f" * 40, local_dir=tmp_path / "c", endpoint=hub.endpoint)
    with pytest.raises(errors.RepositoryNotFoundError):
        hf_hub_download("org/other", "config.json", revision="main", local_dir=tmp_path / "c", endpoint=hub.endpoint)
    assert not (tmp_path / "c" / "tokenizer.json").exists()


def test_the_hub_stops_itself(tmp_path):
    hub = Hub(lifetime=0.5).start()
    base = hub.endpoint
    import time

    time.sleep(1.5)
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{base}/api/models/a/b", timeout=2)
    assert os.environ.get("HF_ENDPOINT") != base
