"""W&B logging of finished runs, offline (no account, no network)."""

import pytest

from lantern.errors import ConfigError
from lantern.run.tracking import WandbLogger, scalars


def test_offline_logging_writes_a_local_run(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    record = {
        "decoding": "lantern",
        "delta": 0.1,
        "mean_accepted_length": 2.5,
        "per_image": [1, 2],
        "config": {"k": 1000},
    }
    WandbLogger(mode="offline", project="lantern-test").log_run(tmp_path, record)
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))


def test_a_sweep_table_is_logged_offline(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    rows = [
        {"method": "AR", "tau": 1.0, "speedup": 1.0, "fid": None},
        {"method": "LANTERN", "tau": 2.0, "speedup": 1.5, "fid": 3.0},
    ]
    WandbLogger(mode="offline", project="lantern-test").log_table(tmp_path, rows)
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))
    WandbLogger(mode="disabled").log_table(tmp_path / "off", rows)
    assert not (tmp_path / "off").exists()


def test_disabled_logs_nothing_and_bad_modes_are_refused(tmp_path):
    WandbLogger(mode="disabled").log_run(tmp_path, {"decoding": "ar"})
    assert not (tmp_path / "wandb").exists()
    with pytest.raises(ConfigError, match="wandb.mode='cloud'"):
        WandbLogger(mode="cloud")
    assert scalars({"a": 1, "b": [1], "c": "x", "d": None}) == {"a": 1, "c": "x", "d": None}


def test_runs_are_grouped_and_named_and_quiet(tmp_path, monkeypatch):
    import wandb

    seen = {}

    class FakeRun:
        def log(self, values):
            seen["logged"] = values

        def finish(self):
            seen["finished"] = True

    monkeypatch.setattr(wandb, "init", lambda **kwargs: seen.update(kwargs) or FakeRun())
    WandbLogger(mode="offline", group="sweep-2026-12-01", name="decoding=eagle,delta=0.1").log_run(
        tmp_path, {"decoding": "eagle"}
    )
    assert seen["group"] == "sweep-2026-12-01" and seen["name"] == "decoding=eagle,delta=0.1" and seen["finished"]
    assert seen["settings"].silent is True and seen["settings"].console == "off"
    WandbLogger(mode="offline").log_table(tmp_path / "2026-12-01", [{"method": "AR", "speedup_iqr": [1.0, 2.0]}])
    assert seen["group"] == "sweep-2026-12-01" and seen["job_type"] == "table"
    WandbLogger(mode="offline", quiet=False).log_run(tmp_path, {"decoding": "ar"})
    assert seen["settings"] is None


def test_online_without_a_key_or_a_server_is_one_line_before_any_work(tmp_path):
    import os
    import subprocess
    import sys

    from helpers import REPO

    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB")}
    env["HOME"] = str(tmp_path)  # no ~/.netrc
    cases = [
        ({}, "no W&B API key is set"),
        (
            {"WANDB_API_KEY": "a" * 40, "WANDB_BASE_URL": "http://127.0.0.1:9"},
            "W&B at http://127.0.0.1:9 does not answer",
        ),
    ]
    for extra, message in cases:
        out = tmp_path / "run"
        proc = subprocess.run(
            [
                sys.executable,
                "run.py",
                "model=tiny_random_c2i",
                "num_images=2",
                "wandb.mode=online",
                f"hydra.run.dir={out}",
            ],
            cwd=REPO,
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=300,
        )
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        assert lines[0].startswith("error: wandb.mode=online but ") and message in lines[0], lines[0]
        assert not out.exists()
