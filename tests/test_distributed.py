"""torchrun: images sharded by index over processes (gloo on CPU) equal a one-process run byte for byte."""

import json
import subprocess
import sys

from helpers import REPO

BASE = ("model=tiny_random_c2i", "num_images=5", "batch_size=2", "warmup=0", "wandb.mode=disabled")


def torchrun(nproc: int, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "run.py", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_two_gloo_processes_equal_one_process_byte_for_byte(tmp_path):
    two = torchrun(2, *BASE, f"hydra.run.dir={tmp_path / 'two'}")
    assert two.returncode == 0, two.stderr
    one = subprocess.run(
        [sys.executable, "run.py", *BASE, f"hydra.run.dir={tmp_path / 'one'}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert one.returncode == 0, one.stderr
    for name in [f"{i:06d}.png" for i in range(5)] + ["grid.png"]:
        assert (tmp_path / "two" / name).read_bytes() == (tmp_path / "one" / name).read_bytes(), name
    record = json.loads((tmp_path / "two" / "metrics.json").read_text())
    assert record["world_size"] == 2 and [r["rank"] for r in record["ranks"]] == [0, 1]
    assert [r["images"] for r in record["ranks"]] == [3, 2]  # image i on rank i % 2
    assert sorted(i for b in record["per_batch"] for i in b["indices"]) == list(range(5))
    assert {b["rank"] for b in record["per_batch"] if 1 in b["indices"]} == {1}
    assert record["timing"]["images_decoded"] == 5 and all(r["latency_s"] > 0 for r in record["per_image"])
    assert two.stdout.count("grid.png and metrics.json") == 1, "only rank 0 reports"


def test_more_processes_than_images_is_one_error_line_and_no_folder(tmp_path):
    proc = torchrun(3, *BASE, "num_images=2", f"hydra.run.dir={tmp_path / 'run'}")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: --nproc_per_node=3 is more than num_images=2: use at most 2 processes"], proc.stderr
    assert "exitcode: 2" in proc.stderr  # torchrun reports its processes' status 2 (and exits 1 itself)
    assert not (tmp_path / "run").exists()
