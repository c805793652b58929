"""The GPU check script's CPU form: it runs end to end and writes its report (so it cannot rot)."""

import json

import pytest
from script_helpers import load_script


def test_gpu_check_cpu_form_writes_its_report(tmp_path):
    script = load_script("gpu_check")
    out = tmp_path / "gpu"
    code = script.main(
        [
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--compile",
            "none",
            "--tiny",
            "--images",
            "2",
            "--targets",
            "world,llamagen",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    report = json.loads(out.with_suffix(".json").read_text())
    assert [r["target"].split()[0] for r in report["results"]] == ["embedded", "random"]
    for result in report["results"]:
        modes = [row["mode"] for row in result["rows"]]
        assert modes[:2] == ["ar eager", "ar none"] and "lantern d=0.4 chain3 sampled" in modes
        assert result["greedy_tokens_equal_compiled_vs_eager"] == 1.0
        assert all(row["latency_ms"] > 0 and row["tau"] >= 1.0 for row in result["rows"])
    assert "| mode | tau |" in out.with_suffix(".md").read_text()


def test_gpu_check_without_a_gpu_is_one_line(capsys):
    import torch

    if torch.cuda.is_available():
        return
    with pytest.raises(SystemExit) as exit_info:
        load_script("gpu_check").main(["--device", "cuda"])
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ")
