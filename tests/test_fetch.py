"""scripts/fetch.py against a loopback server (127.0.0.1 only, stops itself): hub-style and plain-URL files are
listed, downloaded, verified and locked; a dropped connection resumes; a wrong hash, a full disk and Ctrl-C
leave nothing under an asset's path and a rerun completes; a file changed after locking is refused; with no
network or HF_HUB_OFFLINE=1 a fetch is one error line in seconds."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fetch_helpers import BIG, COMMIT, FILES, REPO, Handler, serving, sha

from lantern.run.assets import fetching, listing
from lantern.run.assets.store import AssetError


@pytest.fixture
def server():
    yield from serving()


def registry(folder: Path, port: int, wrong: bool = False, verified: bool = True) -> Path:
    """A registry of one hub folder, one plain URL (pinned; ``verified``: a published pin) and a derived file."""
    folder.mkdir(parents=True, exist_ok=True)
    pin = "f" * 64 if wrong else sha(FILES["/plain/data.zip"])
    (folder / "fake.yaml").write_text(
        f"""
weights:
  dest: org/weights
  hub: {{repo: org/weights, revision: main}}
  files: [config.json, model.bin]
  licence: test
data:
  dest: plain/data.zip
  url: http://127.0.0.1:{port}/plain/data.zip
  sha256: "{pin}"
  verified: {str(verified).lower()}
  licence: test
inner:
  dest: derived/a.txt
  recipe: {{_target_: lantern.run.assets.recipes.unzip, member: inner/a.txt}}
  inputs: [data]
  licence: test
"""
    )
    return folder


def resolved(root: Path) -> dict:
    return {
        "paths": {"assets": str(root)},
        "model": {"name": "fake"},
        "assets": {"extra": ["weights", "data", "inner"]},
    }


@pytest.fixture
def setup(tmp_path, server, monkeypatch):
    from huggingface_hub import constants

    port = server.server_address[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # what the hub read at import (the suite may set it)
    monkeypatch.setenv("LANTERN_ASSET_REGISTRY", str(registry(tmp_path / "registry", port)))
    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return tmp_path / "assets", server


def test_fetch_lists_downloads_verifies_and_locks(setup):
    root, server = setup
    lines = listing.listing(resolved(root))
    assert len(lines) == 5 and all("missing" in line for line in lines[1:])
    assert any("hf://org/weights@main/model.bin" in line for line in lines)
    fetching.fetch(resolved(root), say=lambda _: None, progress=False)
    assert (root / "org/weights/model.bin").read_bytes() == BIG
    assert (root / "derived/a.txt").read_bytes() == BIG[::-1]
    lock = json.loads((root / "assets.lock.json").read_text())["files"]
    assert lock["org/weights/model.bin"]["sha256"] == sha(BIG) and lock["org/weights/model.bin"]["revision"] == COMMIT
    assert lock["plain/data.zip"]["sha256"] == sha(FILES["/plain/data.zip"])
    assert lock["derived/a.txt"]["recipe"] and lock["derived/a.txt"]["inputs"] == {
        "data": lock["plain/data.zip"]["sha256"]
    }
    assert all("present" in line for line in listing.listing(resolved(root))[1:])
    served = len(server.served)
    fetching.fetch(resolved(root), say=lambda _: None, progress=False)  # everything there: nothing downloaded
    assert len(server.served) == served


def test_a_dropped_connection_resumes_to_the_right_hash(setup):
    root, server = setup
    server.drop_once.update({"/plain/data.zip", "/org/weights/resolve/main/model.bin"})
    fetching.fetch(resolved(root), say=lambda _: None, progress=False)
    assert sha((root / "plain/data.zip").read_bytes()) == sha(FILES["/plain/data.zip"])
    assert sha((root / "org/weights/model.bin").read_bytes()) == sha(BIG)
    assert not server.drop_once  # both were dropped once, and resumed


def test_a_wrong_hash_is_refused_and_removed(setup, tmp_path, monkeypatch):
    root, server = setup
    monkeypatch.setenv("LANTERN_ASSET_REGISTRY", str(registry(tmp_path / "wrong", server.server_address[1], True)))
    with pytest.raises(AssetError, match="the download was removed"):
        fetching.fetch(resolved(root), say=lambda _: None, progress=False)
    assert not (root / "plain/data.zip").exists()
    assert not list((root / ".partial").rglob("data.zip"))


def test_a_changed_upstream_or_local_file_is_refused_after_locking(setup):
    root, server = setup
    fetching.fetch(resolved(root), say=lambda _: None, progress=False)
    (root / "org/weights/model.bin").write_bytes(BIG[:-1] + b"x")  # changed on disk
    with pytest.raises(AssetError, match="model.bin.*has sha256"):
        fetching.fetch(resolved(root), say=lambda _: None, progress=False)
    (root / "org/weights/model.bin").unlink()
    server.files["/org/weights/resolve/main/model.bin"] = BIG[::-1]  # changed upstream
    with pytest.raises(AssetError, match="says .*the download was removed"):
        fetching.fetch(resolved(root), say=lambda _: None, progress=False)
    assert not (root / "org/weights/model.bin").exists()


def test_offline_mode_and_an_unreachable_host_fail_at_once(setup, monkeypatch):
    root, server = setup
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(AssetError, match="HF_HUB_OFFLINE is set and hf://org/weights@main/config.json"):
        fetching.fetch(resolved(root), say=lambda _: None, progress=False)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    server.shutdown()
    server.server_close()
    start = time.monotonic()
    with pytest.raises(AssetError, match="cannot reach hf://org/weights@main/config.json .* copy the file to"):
        fetching.fetch(resolved(root), say=lambda _: None, progress=False)
    assert time.monotonic() - start < 10 and not (root / "org").exists()


def _cli(root: Path, port: int, tmp_path: Path, *extra: str, limit: int | None = None, **kw):
    env = dict(os.environ, HF_ENDPOINT=f"http://127.0.0.1:{port}", HF_HOME=str(tmp_path / "hf"), NO_PROXY="127.0.0.1")
    env.update(LANTERN_ASSETS=str(root), LANTERN_CACHE=str(tmp_path / "cache"), PYTHONPATH=str(REPO))
    env.update(LANTERN_ASSET_REGISTRY=str(tmp_path / "registry"), HF_HUB_DISABLE_PROGRESS_BARS="1")
    env.pop("HF_HUB_OFFLINE", None)
    code = "import sys, runpy; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
    command = [
        sys.executable,
        "-c",
        code,
        str(REPO / "scripts/fetch.py"),
        "model=tiny_random_c2i",
        "+assets.extra=[weights,data]",
        *extra,
    ]

    def cap():
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.Popen(
        command, env=env, cwd=tmp_path, preexec_fn=cap, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw
    )


def test_a_full_disk_then_a_rerun_complete_the_set(setup, tmp_path):
    root, server = setup
    proc = _cli(root, server.server_address[1], tmp_path, "--no-progress", limit=300_000)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and err.strip().count("\n") == 0 and err.startswith("error: "), err
    assert "free some space" in err
    assert not (root / "org/weights/model.bin").exists() and not (root / "plain/data.zip").exists()
    proc = _cli(root, server.server_address[1], tmp_path, "--no-progress")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert sha((root / "org/weights/model.bin").read_bytes()) == sha(BIG)


def test_ctrl_c_then_a_rerun_complete_the_set(setup, tmp_path):
    root, server = setup
    server.files["/plain/data.zip"] = FILES["/plain/data.zip"]
    slow = threading.Event()
    original = Handler._head

    def stalled(self, send_body):  # the plain file stalls after its first bytes until the test lets go
        if send_body and self.path == "/plain/data.zip" and not slow.is_set():
            self.send_response(200)
            self.send_header("Content-Length", str(len(BIG)))
            self.end_headers()
            self.wfile.write(FILES["/plain/data.zip"][:1000])
            self.wfile.flush()
            slow.wait(30)
            return
        original(self, send_body)

    Handler._head = stalled
    try:
        proc = _cli(root, server.server_address[1], tmp_path, "--no-progress")
        deadline = time.monotonic() + 30
        while not list((root / ".partial").rglob("data.zip")) and time.monotonic() < deadline:
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 130 and "interrupted" in err
        assert not (root / "plain/data.zip").exists()
    finally:
        slow.set()
        Handler._head = original
    proc = _cli(root, server.server_address[1], tmp_path, "--no-progress")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert sha((root / "plain/data.zip").read_bytes()) == sha(FILES["/plain/data.zip"])


def test_two_fetches_at_once_share_one_lock(setup, tmp_path):
    root, server = setup
    first = _cli(root, server.server_address[1], tmp_path, "--no-progress")
    second = _cli(root, server.server_address[1], tmp_path, "--no-progress")
    results = [p.communicate(timeout=60) for p in (first, second)]
    assert first.returncode == 0 and second.returncode == 0, results
    assert sha((root / "org/weights/model.bin").read_bytes()) == sha(BIG)


def test_the_real_presets_fail_in_seconds_here_and_list(tmp_path):
    env = dict(os.environ, LANTERN_ASSETS=str(tmp_path / "assets"), LANTERN_CACHE=str(tmp_path / "cache"))
    env.pop("HF_HUB_OFFLINE", None)
    env.pop("LANTERN_ASSET_REGISTRY", None)
    env["HF_ENDPOINT"] = "http://127.0.0.1:9"  # nothing listens there: as with no network, whatever this machine has
    args = [sys.executable, str(REPO / "scripts/fetch.py"), "model=llamagen_t2i_xl_256", "protocol=lantern_coco17_5k"]
    start = time.monotonic()
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert time.monotonic() - start < 60
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: cannot reach ")
    assert "t2i_XL_stage1_256.pt" in proc.stderr and not (tmp_path / "assets/llamagen").exists()
    listed = subprocess.run([*args, "--list"], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    for name in (
        "t2i_XL_stage1_256.pt",
        "flan-t5-xl",
        "llamagen_drafter",
        "captions_val2017_longest.json",
        "ViT-B-32.pt",
        "HPS_v2.1",
    ):
        assert name in listed.stdout


def test_a_derived_file_is_refused_when_altered_and_remade_when_removed(setup):
    root, server = setup
    fetching.fetch(resolved(root), say=lambda _: None, progress=False)
    (root / "derived/a.txt").write_bytes(b"edited")
    with pytest.raises(AssetError, match="asset inner.* was altered"):
        fetching.fetch(resolved(root), say=lambda _: None, progress=False)
    (root / "derived/a.txt").unlink()
    fetching.fetch(resolved(root), say=lambda _: None, progress=False)  # made again from its input
    assert (root / "derived/a.txt").read_bytes() == BIG[::-1]
