"""W&B logging of finished runs, offline (no account, no network)."""

import pytest

from lantern.errors import ConfigError
from lantern.tracking import WandbLogger, scalars


def test_offline_logging_writes_a_local_run(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    record = {"decoding": "lantern", "delta": 0.1, "mean_accepted_length": 2.5, "per_image": [1, 2], "config": {"k": 1000}}
    WandbLogger(mode="offline", project="lantern-test").log_run(tmp_path, record)
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))


def test_a_sweep_table_is_logged_offline(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    rows = [{"method": "AR", "tau": 1.0, "speedup": 1.0, "fid": None}, {"method": "LANTERN", "tau": 2.0, "speedup": 1.5, "fid": 3.0}]
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
