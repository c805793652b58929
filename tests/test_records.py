"""Records survive a killed run: ``metrics.json`` is either absent or whole, never half-written."""

import json
import os
import signal
import subprocess
import sys
import time

from helpers import REPO

WRITER = """
import sys, time
from lantern.files import write_json_atomic

class Slow:
    def __str__(self):
        print("writing", flush=True)
        time.sleep(60)  # killed here, in the middle of serialising the record
        return "never"

write_json_atomic(sys.argv[1], {"decoding": "ar", "rows": list(range(1000)), "slow": Slow()})
"""


def test_a_write_killed_midway_leaves_the_old_record_whole(tmp_path):
    record = tmp_path / "metrics.json"
    record.write_text(json.dumps({"decoding": "old"}))
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(record)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert writer.stdout.readline().strip() == "writing"
    writer.send_signal(signal.SIGKILL)
    writer.wait(timeout=30)
    assert json.loads(record.read_text()) == {"decoding": "old"}
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "metrics.json"]
    assert all(name.startswith(".metrics.json.") and name.endswith(".tmp") for name in leftovers)


def test_a_run_killed_while_generating_writes_no_record_and_no_table_row(tmp_path):
    out = tmp_path / "run"
    run = subprocess.Popen(
        [
            sys.executable,
            "run.py",
            "num_images=400",
            "batch_size=1",
            "warmup=0",
            "wandb.mode=disabled",
            "speedup_baseline=null",
            f"hydra.run.dir={out}",
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while not (out / "000002.png").exists():
        assert run.poll() is None and time.monotonic() < deadline, "the run ended or stalled before it was killed"
        time.sleep(0.1)
    os.kill(run.pid, signal.SIGKILL)
    run.wait(timeout=30)
    assert not (out / "metrics.json").exists()
    tables = subprocess.run(
        [sys.executable, "scripts/make_tables.py", str(out), "--out", str(tmp_path / "table")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert tables.returncode == 2 and tables.stderr.startswith("error:") and not (tmp_path / "table").exists()
