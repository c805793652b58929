"""Experiments and run-end metrics, end to end through run.py (subprocesses on the shipped world)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from test_run import REPO

EXPERIMENTS = sorted(p.stem for p in (REPO / "experiments" / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_smoke_runs_and_writes_its_table(tmp_path, experiment):
    sweep = tmp_path / "sweep"
    proc = subprocess.run(
        [sys.executable, str(REPO / "run.py"), "-m", f"+experiment={experiment}", "num_images=1", "warmup=0",
         "metrics=none", "wandb.mode=disabled", f"hydra.sweep.dir={sweep}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,  # another working directory on purpose
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = sorted(p for p in sweep.iterdir() if (p / "metrics.json").is_file())
    table = json.loads((sweep / "table.json").read_text())
    assert len(table["rows"]) == len(runs) >= 2


def test_world_metrics_land_in_the_record(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "run.py", "metrics=world", "num_images=4", "batch_size=4", "warmup=0",
         "metrics.fid.reference.count=64", f"metrics.fid.cache_dir={tmp_path / 'fid'}", "wandb.mode=disabled", f"hydra.run.dir={out}"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["fid"] > 0 and metrics["fid_reference"] == "fashion_mnist_test_32"
    assert 0.0 <= metrics["prompt_accuracy"] <= 1.0
    assert any(Path(tmp_path / "fid").glob("fashion_mnist_test_32_64*"))
