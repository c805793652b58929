"""Two AR baselines in one run (baseline=both): the engine-grade AR (ours, compiled like the decoder) and the
reference-grade AR (transformers' or LlamaGen's own generate(), eager) interleaved with the decoder on the same
batches; the record (version 5) carries both speed-ups, the reference's greedy check and what each baseline
cost; tables show both columns; older records still read."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import ENV, REPO

from lantern.results.record import SCHEMA_VERSION, read_record
from lantern.results.render import make_tables

pytest.importorskip("transformers")
LUMINA = ("model=tiny_random_lumina", "num_images=2", "batch_size=1", "temperature=0", "metrics=none")


def run(tmp_path, name: str, *overrides: str, env=None) -> tuple[subprocess.CompletedProcess, dict | None]:
    out = tmp_path / name
    proc = subprocess.run(
        [sys.executable, "run.py", f"hydra.run.dir={out}", "wandb.mode=disabled", "warmup=1", *overrides],
        cwd=REPO, env=env or ENV, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    record = out / "metrics.json"
    return proc, json.loads(record.read_text()) if record.is_file() else None


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    root = tmp_path_factory.mktemp("both")
    proc, record = run(root, "eagle", *LUMINA, "decoding=eagle", "baseline=both")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return root, record


def test_both_baselines_are_timed_on_the_same_batches_and_recorded(both):
    _, record = both
    assert record["schema_version"] == SCHEMA_VERSION == 5
    assert record["speedup"] > 0 and record["speedup_reference"] > 0
    assert "transformers generate()" in record["speedup_reference_baseline"]
    assert "on 2 of 2 batches" in record["speedup_reference_baseline"]
    for batch in record["per_batch"]:  # every batch timed by the decoder and both baselines
        assert batch["seconds"] > 0 and batch["baseline_seconds"] > 0 and batch["reference_seconds"] > 0
    reference_s = sum(b["reference_seconds"] for b in record["per_batch"])
    assert record["speedup_reference"] == pytest.approx(reference_s / sum(b["seconds"] for b in record["per_batch"]))
    assert record["reference_latency_s_per_image"] == pytest.approx(reference_s / 2)
    # Greedy: the reference's images are ours (checked against the engine-grade AR on the same batches).
    assert record["reference_greedy_check"] == {
        "checked": True,
        "against": "compiled AR",
        "images": 2,
        "equal": 2,
        "all_equal": True,
    }
    cost = record["baseline_cost_s"]  # outside the decoder's timed steps: setup and warm-up apart
    assert set(cost) == {"ar", "reference_ar"} and cost["reference_ar"]["setup_s"] > 0
    assert cost["reference_ar"]["timed_s"] == pytest.approx(reference_s, rel=1e-4)
    assert cost["ar"]["warmup_s"] > 0 and cost["ar"]["setup_s"] == 0
    assert read_record(both[0] / "eagle").speedup_reference == record["speedup_reference"]


def test_the_table_names_both_speed_ups(both, tmp_path):
    root, record = both
    table, paths = make_tables([str(root)], str(tmp_path / "t"))
    text = paths["md"].read_text()
    assert "speed-up vs compiled AR [IQR]" in text and "speed-up vs reference AR [IQR]" in text
    assert f"{record['speedup_reference']:.2f}x" in text and "reference AR ms/image" in text
    row = table.rows[0]
    assert row["speedup_reference"] == record["speedup_reference"]
    assert row["reference_ms"] == pytest.approx(1000 * record["reference_latency_s_per_image"])
    assert json.loads(paths["json"].read_text())["rows"][0]["speedup_reference"] == record["speedup_reference"]


def test_reference_alone_checks_greedy_codes_against_a_lossless_decoder(tmp_path):
    proc, record = run(tmp_path, "ref", *LUMINA, "decoding=eagle", "baseline=reference", "warmup=0")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert record.get("speedup") is None and record["speedup_reference"] > 0
    assert record["reference_greedy_check"]["against"].startswith("EAGLE")
    assert record["reference_greedy_check"]["all_equal"] is True
    assert set(record["baseline_cost_s"]) == {"reference_ar"}


def test_ar_against_its_reference_is_the_compiled_over_reference_figure(tmp_path):
    """decoding=ar with baseline=both: AR is its own engine-grade baseline (speed-up 1) and speedup_reference is
    the engine-grade AR's speed over the reference loop."""
    proc, record = run(tmp_path, "ar", *LUMINA, "decoding=ar", "baseline=both", "temperature=1", "num_images=1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert record["speedup"] == 1.0 and record["speedup_reference"] > 0
    assert record["reference_greedy_check"]["checked"] is False and "sampled" in record["reference_greedy_check"]["why"]


def test_the_worlds_reference_without_llamagens_code_is_one_error_line(tmp_path):
    env = {**ENV, "LANTERN_LLAMAGEN": str(tmp_path / "no-llamagen")}
    proc, record = run(tmp_path, "world", "num_images=1", "decoding=ar", "baseline=both", env=env)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and record is None, proc.stderr[-2000:]
    assert lines[0].startswith("error: no speedup_reference.code given") and "FoundationVision/LlamaGen" in lines[0]


def test_a_version_4_record_still_reads(both, tmp_path):
    _, record = both
    older = {key: value for key, value in record.items() if "reference" not in key and key != "baseline_cost_s"}
    older["schema_version"] = 4
    (tmp_path / "metrics.json").write_text(json.dumps(older))
    read = read_record(tmp_path)
    assert read.schema_version == 4 and read.speedup_reference is None and read.speedup == record["speedup"]
