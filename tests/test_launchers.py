"""Sweeps through hydra-submitit-launcher: jobs as local processes, and SLURM configs checked before launch."""

import json
import subprocess
import sys

from helpers import REPO


def test_a_submitit_local_sweep_writes_both_records_and_the_table(tmp_path):
    sweep = tmp_path / "sweep"
    proc = subprocess.run(
        [
            sys.executable,
            "run.py",
            "-m",
            "hydra/launcher=local",
            "model=tiny_random_c2i",
            "decoding=ar,eagle",
            "num_images=2",
            "warmup=0",
            "wandb.mode=disabled",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Submitit 'local' sweep" in proc.stdout + proc.stderr
    decodings = {json.loads((sweep / job / "metrics.json").read_text())["decoding"] for job in ("0", "1")}
    assert decodings == {"ar", "eagle"}
    table = json.loads((sweep / "table.json").read_text())
    assert [row["method"] for row in table["rows"]] == ["AR", "EAGLE exact (chain, sampled)"] and not table["failed"]
    assert table["rows"][1]["baseline_ms"] > 0 and list((sweep / ".submitit").iterdir())


def test_a_slurm_sweep_without_a_partition_is_one_line_and_writes_nothing(tmp_path):
    sweep = tmp_path / "sweep"
    proc = subprocess.run(
        [sys.executable, "run.py", "-m", "hydra/launcher=slurm", "model=tiny_random_c2i", f"hydra.sweep.dir={sweep}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and lines == [
        "error: hydra.launcher.partition is required by SlurmLauncher: set it on the command line, "
        "e.g. hydra.launcher.partition=VALUE"
    ], proc.stderr
    assert not sweep.exists()
    bad = subprocess.run(
        [
            sys.executable,
            "run.py",
            "-m",
            "hydra/launcher=slurm",
            "hydra.launcher.partition=gpu",
            "hydra.launcher.timeout_min=0",
            "model=tiny_random_c2i",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (
        bad.returncode == 2
        and bad.stderr.strip() == "error: hydra.launcher.timeout_min=0: expected an integer >= 1 (minutes)"
    )
    assert not sweep.exists()
