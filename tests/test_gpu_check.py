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
            "--batches",
            "1,2",
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
        # The batch sweep: AR, exact chain and LANTERN 0.1 at each batch, AR 1x at its own batch.
        sweep = result["batch_sweep"]
        assert [(r["batch"], r["mode"].split()[0]) for r in sweep] == [
            (b, m) for b in (1, 2) for m in ("ar", "exact", "lantern")
        ]
        assert all(r["images_per_s"] > 0 and r["peak_memory_mb"] > 0 for r in sweep)
        assert [r["speedup_vs_ar_same_batch"] for r in sweep if r["mode"] == "ar none"] == [1.0, 1.0]
    # The reference-grade AR: LlamaGen's own generate() over the same weights where a checkout is found.
    for result in report["results"]:
        reference = result["reference"]
        assert reference["mode"] == "ar reference"
        if "skipped" in reference:
            assert "FoundationVision/LlamaGen" in reference["skipped"]
        else:
            assert reference["greedy_codes_equal_ours"] is True and reference["engine_ar_over_reference_ar"] > 0
    text = out.with_suffix(".md").read_text()
    assert (
        "| mode | tau |" in text and "| batch | mode | ms/image | images/s |" in text and "Reference-grade AR" in text
    )


def test_gpu_check_without_a_gpu_is_one_line(capsys):
    import torch

    if torch.cuda.is_available():
        return
    with pytest.raises(SystemExit) as exit_info:
        load_script("gpu_check").main(["--device", "cuda"])
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ")


def test_gpu_check_cpu_form_times_the_family_presets_on_their_tiny_sizes(tmp_path):
    script = load_script("gpu_check")
    out = tmp_path / "families"
    argv = ["--device", "cpu", "--dtype", "float32", "--compile", "none", "--tiny", "--images", "2"]
    assert script.main([*argv, "--targets", "anole_7b,janus_pro_7b", "--out", str(out)]) == 0
    report = json.loads(out.with_suffix(".json").read_text())
    names = [r["target"] for r in report["results"]]
    assert "tiny_random_chameleon" in names[0] and "tiny_random_janus" in names[1]
    for result in report["results"]:
        assert result["tokens"] == 64  # both tiny presets: 8 x 8 codes
        assert [row["mode"] for row in result["rows"]] == ["ar eager", "ar none", "lantern d=0.1 chain3 sampled"]
        assert result["greedy_tokens_equal_compiled_vs_eager"] == 1.0
        assert all(row["s_per_image"] > 0 and row["tau"] >= 1.0 for row in result["rows"])


# Anole: 32 layers of 4 x 4096^2 + 3 x 4096 x 11008, embeddings and lm_head of 65536 rows: 7.01e9. Janus: 30 such
# layers, 102400 embedding rows, no text head (never used), the generation embeddings, aligner and head: 6.59e9.
@pytest.mark.parametrize(("preset", "billions"), [("anole_7b", 7.01), ("janus_pro_7b", 6.59)])
def test_the_7b_timing_nodes_build_the_full_architecture_in_bf16_without_memory(preset, billions):
    """The presets' timing nodes on the meta device: the release's parameter count, every tensor bf16, and the
    drafter one layer of the family's kind (nothing is allocated; on a GPU the same build is materialised)."""
    import torch
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from lantern import REPO_ROOT

    with initialize_config_dir(version_base="1.3", config_dir=str(REPO_ROOT / "conf")):
        cfg = compose("config", overrides=[f"model={preset}", "dtype=bfloat16"])
    parts = instantiate(cfg.model.timing, device="meta")
    count = sum(p.numel() for p in parts.target.parameters())
    assert abs(count / 1e9 - billions) < 0.01, count
    tensors = [*parts.target.parameters(), *parts.drafter.parameters()]
    assert all(t.device.type == "meta" and t.dtype == torch.bfloat16 for t in tensors)
    assert parts.target.inv_freq.dtype == torch.float32 and len(parts.drafter.layers) == 1
    assert len(parts.conditions) == 64 and parts.conditions[5].mask.shape == (1, 128)


def test_gpu_check_compiled_form_compiles_every_decoder_like_its_ar(tmp_path):
    """``--compile default``: every row but eager AR names the compile mode its decoder ran with (read from the
    decoder), and it is compiled AR's; a decoder built by position with its compile mode in the wrong slot (the
    label) would run eager beside compiled AR and fail here."""
    script = load_script("gpu_check")
    out = tmp_path / "compiled"
    argv = ["--device", "cpu", "--dtype", "float32", "--compile", "default", "--tiny", "--images", "2"]
    assert script.main([*argv, "--targets", "janus_pro_7b", "--out", str(out)]) == 0
    report = json.loads(out.with_suffix(".json").read_text())
    rows = {row["mode"]: row for row in report["results"][0]["rows"]}
    assert list(rows) == ["ar eager", "ar default", "lantern d=0.1 chain3 sampled"]
    assert rows["ar eager"]["compile"] == "none" and rows["ar default"]["compile"] == "default"
    for label, row in rows.items():
        if label != "ar eager":
            assert (row["compile"], row["dtype"], row["attention"]) == ("default", "float32", "fast"), label
    assert rows["lantern d=0.1 chain3 sampled"]["drafter_dtype"] == "float32"
    table = out.with_suffix(".md").read_text()
    assert "| lantern d=0.1 chain3 sampled |" in table and table.count("default, float32, fast |") == 2
