"""+experiment=batch_sweep on the world with tiny settings: every (mode, batch) job timed against AR at its own batch,
the table with batch, images/s and peak memory and a note per method on where it pays, the speed-up-against-batch
plot beside the table and in the report."""

from __future__ import annotations

import json
import subprocess
import sys

from helpers import ENV, REPO


def test_the_batch_sweep_writes_its_table_plot_and_report_on_the_world(tmp_path):
    sweep = tmp_path / "sweep"
    proc = subprocess.run(
        [
            sys.executable, "run.py", "-m", "+experiment=batch_sweep", "+experiment/mode=ar,eagle", "batch_size=1,2",
            "num_images=2", "warmup=0", "wandb.mode=disabled", f"hydra.sweep.dir={sweep}",
        ],
        cwd=REPO, env=ENV, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(p.read_text()) for p in sorted(sweep.rglob("metrics.json"))]
    assert sorted((r["decoding"], r["batch_size"]) for r in records) == [
        ("ar", 1),
        ("ar", 2),
        ("eagle", 1),
        ("eagle", 2),
    ]
    assert all(r["speedup"] > 0 and r["peak_memory_mb"] > 0 for r in records)
    text = (sweep / "table.md").read_text()
    header = [cell.strip() for cell in text.splitlines()[0].split("|")]
    assert {"batch", "images/s", "peak memory MiB", "speed-up vs compiled AR [IQR]"} <= set(header)
    assert "Batch sweep: speed-up over AR at the same batch size" in text
    assert "Batch sweep, EAGLE" in text and (" at 1, " in text) and (" at 2; " in text)
    rows = json.loads((sweep / "table.json").read_text())["rows"]
    eagle = {row["latency_batch"]: row for row in rows if row["decoder"] and row["decoder"].startswith("EAGLE")}
    assert set(eagle) == {1, 2} and all(abs(r["images_per_s"] * r["latency_ms"] - 1000) < 1e-6 for r in eagle.values())
    png = (sweep / "table_batch.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    report = (sweep / "report.html").read_text()
    assert "Speed-up over AR against batch size" in report
