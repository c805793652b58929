"""+experiment=sjd_pac_table end to end on the tiny Lumina-mGPT and Emu3 targets: every row, the step columns and
the published "paper" block read from the shipped CSV (lantern.results.published)."""

import json
import subprocess
import sys

import pytest
from helpers import REPO

from lantern.errors import ConfigError
from lantern.results.published import attach_published, read_published
from lantern.results.tables import Table

CSV = REPO / "results" / "published" / "sjd_pac_readme.csv"
SHOWN = (
    "method",
    "tau",
    "step compression",
    "speed-up vs compiled AR [IQR]",
    "latency / step",
    "FID",
    "CLIP",
    "realised TV mean / max",
    "paper step",
    "paper latency",
    "paper FID",
    "paper CLIP",
)


def sweep(tmp_path, experiment, *overrides):
    out = tmp_path / "sweep"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "run.py"),
            "-m",
            f"+experiment={experiment}",
            "protocol=none",  # the COCO files are not here; the benchmark of the paper block is named instead
            "num_images=1",
            "batch_size=1",
            "warmup=0",
            "metrics=none",
            "wandb.mode=disabled",
            f"hydra.sweep.dir={out}",
            *overrides,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


@pytest.mark.parametrize(
    ("experiment", "model", "paper", "sjd_pac_step"),
    [
        ("sjd_pac_table", "tiny_random_lumina", "Lumina-mGPT", 4.51),
        ("sjd_pac_table", "tiny_random_emu3", "Emu3", 4.31),
        ("sjd_pac_table_latency", "tiny_random_lumina", "Lumina-mGPT", 4.51),
    ],
)
def test_the_table_has_every_row_and_column_on_tiny_targets(tmp_path, experiment, model, paper, sjd_pac_step):
    # The random Emu3 preset cannot be written back as a folder, which its reference-grade AR reads (a real
    # preset reads model.gpt_ckpt): it is timed against the engine-grade AR alone.
    alone = ["baseline=compiled"] if model == "tiny_random_emu3" else []
    out = sweep(
        tmp_path, experiment, f"model={model}", f"published.model={paper}", "published.benchmark=MS-COCO 2017", *alone
    )
    table = json.loads((out / "table.json").read_text())
    rows = {row["method"].split(" ")[0]: row for row in table["rows"]}
    assert set(rows) == {"AR", "EAGLE", "SJD", "LANTERN++", "GSD", "SJD-PAC"}
    header = (out / "table.md").read_text().splitlines()[0]
    assert all(f" {name} " in header for name in SHOWN), header
    for row in rows.values():  # step compression is AR's forwards over the decoder's; AR's is exactly 1
        assert row["step_compression"] >= 1
        assert row["latency_per_step"] == pytest.approx(row["speedup"] / row["step_compression"])
    assert rows["AR"]["step_compression"] == 1.0
    if not alone:  # the paper's figure beside both speed-ups
        assert all(row["speedup_reference"] > 0 for row in rows.values()), header
        assert " speed-up vs reference AR [IQR] " in header and " paper latency " in header
    assert rows["SJD-PAC"]["step_compression"] > 1
    assert rows["SJD-PAC"]["paper_step_compression"] == sjd_pac_step
    notes = "\n".join(table["notes"])
    assert "KangJialiang/SJD-PAC" in notes and "SJD²" in notes


def test_the_published_csv_names_its_source_and_matches_labels_only():
    data, source = read_published(CSV)
    assert any("4fbc099f7f765b6b363a767da317c0fb8ad4a980" in line for line in source)
    assert len(data) == 22  # every row of the README's table
    rows = [
        {"method": "SJD W=16 random", "protocol": "parti"},
        {"method": "SJD-PAC L=64 K=4 D=3", "protocol": "parti"},
        {"method": "GSD W=16", "protocol": "sjd_coco17_5k"},
    ]
    table = Table(rows=rows)
    benchmarks = {"sjd_coco17_5k": "MS-COCO 2017", "parti": "PartiPrompts"}
    attach_published(table, {"path": str(CSV), "model": "Lumina-mGPT", "benchmarks": benchmarks})
    assert [r["paper_step_compression"] for r in rows] == [2.28, 4.62, 3.39]  # SJD is not SJD-PAC's prefix
    assert rows[2]["paper_speedup"] == 3.62 and rows[0]["paper_fid"] is None  # Parti has no FID
    with pytest.raises(ConfigError, match="published.model"):
        attach_published(Table(rows=[]), {"path": str(CSV), "model": "Janus"})


def test_a_published_csv_without_a_source_is_refused(tmp_path):
    bare = tmp_path / "bare.csv"
    bare.write_text("\n".join(line for line in CSV.read_text().splitlines() if not line.startswith("#")))
    with pytest.raises(ConfigError, match="source"):
        read_published(bare)


def test_a_sweep_with_an_unknown_published_model_is_refused_before_any_job(tmp_path):
    out = tmp_path / "sweep"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "run.py"),
            "-m",
            "+experiment=sjd_pac_table",
            "model=tiny_random_lumina",
            "protocol=none",
            "published.model=Janus",
            "wandb.mode=disabled",
            f"hydra.sweep.dir={out}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith("error: published.model='Janus'")
    assert not any(out.rglob("metrics.json"))
