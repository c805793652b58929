"""Network faults are one line each, against the loopback server (127.0.0.1 only, stops itself): a hub that
accepts and never answers fails within the read timeout (the default fails it within 60 s); a redirect loop, a
redirect to file:// or to a host the registry does not name is refused; a download that stalls mid-file is
given up with "rerun to resume"; a failed HEAD under huggingface_hub 2.x says "rerun to resume"; the probe dials
the hub's content hosts too; offline, every real preset and protocol fails in one line naming source and place."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fetch_helpers import FILES, REPO, serving, sha

from lantern.run.assets import download as dl
from lantern.run.assets import fetching, urls
from lantern.run.assets.registry import Source
from lantern.run.assets.store import AssetError


@pytest.fixture
def server():
    yield from serving()


@pytest.fixture
def online(monkeypatch):
    """huggingface_hub read HF_HUB_OFFLINE (the suite sets it) at import: these tests talk to the loopback hub."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)


@pytest.fixture
def fast():
    """Short timeouts for the test (restored after)."""
    before = urls.TIMEOUTS
    urls.set_timeouts(connect=2, read=2)
    yield
    urls.TIMEOUTS = before


def one_url(tmp_path: Path, monkeypatch, url: str, extra: str = "") -> dict:
    folder = tmp_path / "registry"
    folder.mkdir(exist_ok=True)
    pin = sha(FILES["/plain/data.zip"])
    (folder / "one.yaml").write_text(
        f'data:\n  dest: plain/data.zip\n  url: {url}\n  sha256: "{pin}"\n  verified: true\n  licence: test\n{extra}'
    )
    monkeypatch.setenv("LANTERN_ASSET_REGISTRY", str(folder))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return {"paths": {"assets": str(tmp_path / "assets")}, "model": {"name": "x"}, "assets": {"extra": ["data"]}}


def redirect(target: str):
    def answer(handler, send_body):
        handler.send_response(302)
        handler.send_header("Location", target.format(port=handler.server.server_address[1]))
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    return answer


def hang(release: threading.Event):
    def answer(handler, send_body):
        release.wait(20)  # accepts, never answers (until the test lets go)

    return answer


def test_default_timeouts_fail_a_hung_server_within_60_seconds():
    assert urls.Timeouts().connect + urls.Timeouts().read < 60


def test_a_hung_hub_fails_within_the_read_timeout_in_one_line(server, tmp_path, monkeypatch, fast, online):
    release = threading.Event()
    server.routes["/org/weights/resolve/main/config.json"] = hang(release)
    port = server.server_address[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    folder = tmp_path / "registry"
    folder.mkdir()
    (folder / "hub.yaml").write_text(
        "weights:\n  dest: org/weights\n  hub: {repo: org/weights, revision: main}\n  files: [config.json]\n  licence: t\n"
    )
    monkeypatch.setenv("LANTERN_ASSET_REGISTRY", str(folder))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    resolved = {"paths": {"assets": str(tmp_path / "assets")}, "model": {"name": "x"}, "assets": {"extra": ["weights"]}}
    start = time.monotonic()
    try:
        with pytest.raises(AssetError, match=r"config.json: the hub did not answer \(.*Timeout.*; rerun to resume"):
            fetching.fetch(resolved, say=lambda _: None, progress=False)
    finally:
        release.set()
    assert time.monotonic() - start < 15 and not (tmp_path / "assets/org").exists()


def test_fetch_py_takes_the_timeouts_and_refuses_a_bad_one(tmp_path):
    env = dict(os.environ, LANTERN_ASSETS=str(tmp_path / "a"), PYTHONPATH=str(REPO))
    args = [sys.executable, str(REPO / "scripts/fetch.py"), "model=tiny_random_c2i", "--read-timeout=0"]
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--read-timeout=0.0: expected" in proc.stderr


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("http://127.0.0.1:{port}/plain/loop", "a redirect loop"),
        ("file:///etc/passwd", "another scheme \\(file\\) is refused"),
        ("http://localhost:{port}/plain/data.zip", "'localhost', a host the registry does not name"),
    ],
)
def test_bad_redirects_are_refused_in_one_line(server, tmp_path, monkeypatch, fast, target, message):
    server.routes["/plain/loop"] = redirect(target)
    resolved = one_url(tmp_path, monkeypatch, f"http://127.0.0.1:{server.server_address[1]}/plain/loop")
    with pytest.raises(AssetError, match=message):
        fetching.fetch(resolved, say=lambda _: None, progress=False)
    assert not (tmp_path / "assets/plain").exists()


def test_a_redirect_to_a_host_the_registry_names_is_followed(server, tmp_path, monkeypatch, fast):
    server.routes["/plain/moved"] = redirect("http://localhost:{port}/plain/data.zip")
    port = server.server_address[1]
    resolved = one_url(tmp_path, monkeypatch, f"http://127.0.0.1:{port}/plain/moved", "  hosts: [localhost]\n")
    fetching.fetch(resolved, say=lambda _: None, progress=False)
    assert (tmp_path / "assets/plain/data.zip").read_bytes() == FILES["/plain/data.zip"]


def test_a_stalled_download_gives_up_saying_rerun_to_resume_and_a_rerun_resumes(server, tmp_path, monkeypatch, fast):
    release = threading.Event()
    data = FILES["/plain/data.zip"]

    def stall(handler, send_body):
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        if send_body:
            handler.wfile.write(data[:5000])
            handler.wfile.flush()
            release.wait(20)

    server.routes["/plain/slow"] = stall
    resolved = one_url(tmp_path, monkeypatch, f"http://127.0.0.1:{server.server_address[1]}/plain/slow")
    start = time.monotonic()
    try:
        with pytest.raises(AssetError, match=r"no answer for 2 s .* at \d+ bytes\); rerun to resume"):
            fetching.fetch(resolved, say=lambda _: None, progress=False)
    finally:
        release.set()
    assert time.monotonic() - start < 20 and not (tmp_path / "assets/plain/data.zip").exists()
    del server.routes["/plain/slow"]
    server.files["/plain/slow"] = data
    fetching.fetch(resolved, say=lambda _: None, progress=False)
    assert (tmp_path / "assets/plain/data.zip").read_bytes() == data


def test_a_failed_hub_head_says_rerun_to_resume_not_no_such_file():
    from huggingface_hub import errors

    source = Source(repo="org/weights", file="model.bin")

    def lost():
        raise errors.LocalEntryNotFoundError("An error happened while trying to locate the file on the Hub")

    with pytest.raises(AssetError, match="the hub did not answer; rerun to resume"):
        dl.hub_call(source, lost)

    def gone():
        raise errors.EntryNotFoundError("404")

    with pytest.raises(AssetError, match="no such file or revision"):
        dl.hub_call(source, gone)


def test_the_probe_dials_the_hubs_content_hosts_and_names_the_one_down(monkeypatch):
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    monkeypatch.delenv("LANTERN_HUB_CONTENT_HOSTS", raising=False)
    dialled = []

    def dial(host, port):
        dialled.append(host)
        return f"{host}:{port} does not answer" if host == dl.HUB_CONTENT_HOSTS[0] else None

    monkeypatch.setattr(dl, "dial", dial)
    why = dl.probe(Source(repo="org/weights", file="model.bin"), {})
    assert dialled == ["huggingface.co", *dl.HUB_CONTENT_HOSTS] and dl.HUB_CONTENT_HOSTS[0] in why
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:1")  # a mirror or test hub: only itself
    assert [h for h, _ in dl.hosts_of(Source(repo="o/w", file="m"))] == ["127.0.0.1"]
    mirrors = Source(url="https://a.example/x", mirrors=("https://b.example/x",), hosts=("c.example",))
    dialled.clear()
    assert dl.probe(mirrors, {}) is None and dialled == ["a.example", "b.example", "c.example"]


def _real_runs() -> list[list[str]]:
    models = sorted(p.stem for p in (REPO / "conf/model").glob("*.yaml"))
    runs = [[f"model={m}"] for m in models if not m.startswith("tiny_random") and m != "fashion_t2i"]
    protocols = ["lantern_coco17_5k", "sjd_coco17_5k", "llamagen_coco14_30k", "parti"]
    return runs + [["model=llamagen_t2i_xl_256", "decoding=ar", f"protocol={p}"] for p in protocols]


@pytest.mark.parametrize("overrides", _real_runs(), ids=lambda o: o[-1])
def test_offline_every_real_fetch_is_one_line_naming_source_and_place(overrides, tmp_path, monkeypatch):
    sys.path.insert(0, str(REPO / "scripts"))
    from fetch import compose_run_config

    root = tmp_path / "assets"
    monkeypatch.setenv("LANTERN_ASSETS", str(root))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there, as with no network
    monkeypatch.delenv("LANTERN_ASSET_REGISTRY", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(dl, "dial", lambda host, port: None if host == "never" else f"{host}:{port} does not answer")
    start = time.monotonic()
    with pytest.raises(AssetError) as caught:
        fetching.fetch(compose_run_config(overrides), say=lambda _: None, progress=False)
    text = str(caught.value)
    assert time.monotonic() - start < 60 and "\n" not in text
    assert text.startswith("cannot reach ") and f"copy the file to '{root}/" in text
    assert not [p for p in root.rglob("*") if p.is_file() and p.name != ".lock"]
