"""Every cache under ``paths.cache`` (issue 56, item 3): run.py (a sweep, with W&B offline and its table plot) and
scripts/fetch.py (a hub download from a loopback server) with HOME an empty folder leave nothing there."""

from __future__ import annotations

import hashlib
import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
COMMIT = "c0ffee" + "0" * 34
# model.bin is as large as the files whose hashes are remembered on disk (lantern.files.HASH_FULL_BYTES, 64 MiB).
FILES = {"/org/weights/resolve/main/model.bin": b"\1" * (64 << 20), "/org/weights/resolve/main/config.json": b"{}"}
# What could move a cache away from HOME on its own: left out, so the run's defaults are what is tested.
MOVERS = ("LANTERN_CACHE", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "HF_HOME", "TORCH_HOME")


def bare_env(home: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in MOVERS and not k.startswith(("WANDB_", "MPL"))}
    return {**env, "HOME": str(home), "PYTHONPATH": str(REPO), **extra}


def everything_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_run_py_sweep_writes_nothing_under_home(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    command = [sys.executable, "run.py", "-m", "model=tiny_random_c2i", "decoding=ar", "num_images=1", "seed=0,1"]
    command += ["warmup=0", "speedup_baseline=null", f"paths.cache={tmp_path / 'cache'}"]
    command += [f"hydra.sweep.dir={tmp_path / 'sweep'}"]  # W&B offline (the default): its service logs too
    proc = subprocess.run(command, cwd=REPO, env=bare_env(home), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "sweep" / "table_pareto.png").is_file()
    assert everything_under(home) == [], everything_under(home)
    assert (tmp_path / "cache" / "wandb").is_dir()  # where W&B's service wrote its logs instead


class Hub(http.server.BaseHTTPRequestHandler):
    """Just enough of a hub for huggingface_hub's download of a file at a revision."""

    def log_message(self, *args):
        pass

    def _answer(self, body: bool) -> None:
        path = self.path.split("?")[0].replace(f"/resolve/{COMMIT}/", "/resolve/main/")  # main's one commit
        data = FILES.get(path)
        self.send_response(200 if data is not None else 404)
        data = data or b""
        self.send_header("Content-Length", str(len(data)))
        self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        self.send_header("X-Repo-Commit", COMMIT)
        self.end_headers()
        if body:
            self.wfile.write(data)

    def do_HEAD(self):
        self._answer(False)

    def do_GET(self):
        self._answer(True)


@pytest.fixture
def hub():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stop = threading.Timer(300, server.shutdown)  # bounded, whatever the test does
    stop.start()
    yield server.server_address[1]
    stop.cancel()
    server.shutdown()
    server.server_close()


def test_fetch_py_writes_nothing_under_home(tmp_path, hub):
    home = tmp_path / "home"
    home.mkdir()
    (tmp_path / "registry").mkdir()
    (tmp_path / "registry" / "fake.yaml").write_text(
        "weights: {dest: org/weights, hub: {repo: org/weights, revision: main}, files: [config.json, model.bin], "
        "licence: test}\n"
    )
    env = bare_env(
        home,
        HF_ENDPOINT=f"http://127.0.0.1:{hub}",
        NO_PROXY="127.0.0.1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        LANTERN_ASSETS=str(tmp_path / "assets"),
        LANTERN_ASSET_REGISTRY=str(tmp_path / "registry"),
    )
    env.pop("HF_HUB_OFFLINE", None)
    command = [sys.executable, "scripts/fetch.py", "model=tiny_random_c2i", "+assets.extra=[weights]"]
    command += [f"paths.cache={tmp_path / 'cache'}", "--no-progress"]
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "assets" / "org/weights/model.bin").read_bytes() == FILES["/org/weights/resolve/main/model.bin"]
    assert everything_under(home) == [], everything_under(home)
    assert (tmp_path / "cache" / "sha256.json").is_file()  # the hash of model.bin, remembered under paths.cache
