"""Result tables from run records, and the table a multirun writes at its end."""

import csv
import io
import json
import subprocess
import sys

import pytest

from lantern.errors import ConfigError
from lantern.tables import load_records, table_rows, to_csv, to_latex, to_markdown, write_tables
from test_run import REPO

SETTING = {"model": "m", "prompts": "p", "num_images": 4, "batch_size": 2, "seed": 0, "temperature": 1.0, "top_k": 0,
           "top_p": 1.0, "cfg_scale": 3.0, "environment": {"device": "cpu", "device_name": "cpu A (2 cores)"}}


def record(tmp_path, name, **fields):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "metrics.json").write_text(json.dumps({**SETTING, **fields}))
    return folder


def test_rows_follow_the_paper_order_and_speedup_comes_from_the_matching_ar_run(tmp_path):
    record(tmp_path, "c", decoding="lantern", draft="chain", k=1000, delta=0.4, latency_s_per_image=0.05, mean_accepted_length=3.0)
    record(tmp_path, "a", decoding="lantern", draft="chain", k=1000, delta=0.1, latency_s_per_image=0.08, mean_accepted_length=2.0)
    record(tmp_path, "b", decoding="ar", latency_s_per_image=0.1, mean_accepted_length=1.0, fid=50.0)
    record(tmp_path, "d", decoding="eagle", draft="chain", latency_s_per_image=0.2, mean_accepted_length=1.5)
    record(tmp_path, "e", decoding="lantern_pp", draft="chain", k=10, **{"lambda": 3.0}, latency_s_per_image=0.1)
    rows = table_rows(load_records([tmp_path]))
    assert [r["method"] for r in rows] == [
        "AR", "EAGLE exact (chain)", "LANTERN k=1000 d=0.1 (chain)", "LANTERN k=1000 d=0.4 (chain)", "LANTERN++ k=10 l=3.0 (chain)",
    ]
    assert [round(r["speedup"], 3) for r in rows] == [1.0, 0.5, 1.25, 2.0, 1.0]
    assert rows[0]["fid"] == 50.0 and rows[1]["baseline"].endswith("b")
    assert "| AR | 1.00 | 100.0 | 1.00x | 50.00 | - | - | 0.000 / 0.000 |" in to_markdown(rows)
    assert list(csv.DictReader(io.StringIO(to_csv(rows))))[2]["method"] == "LANTERN k=1000 d=0.1 (chain)"
    assert r"\begin{tabular}" in to_latex(rows) and "2.00$\\times$" in to_latex(rows)
    paths = write_tables(load_records([tmp_path]), tmp_path / "out")
    assert all(p.is_file() for p in paths.values())


def test_rows_name_candidates_and_semantics_and_show_realised_tv_beside_delta(tmp_path):
    record(tmp_path, "a", decoding="lantern", draft="chain", candidates="sampled", semantics="bounded", k=1000, delta=0.1,
           tv_realised_mean=0.05, tv_realised_max=0.1, latency_s_per_image=0.1)
    record(tmp_path, "b", decoding="lantern", draft="dynamic_tree", candidates="deterministic", semantics="reference", k=1000,
           delta=0.1, tv_realised_mean=0.75, tv_realised_max=0.99, latency_s_per_image=0.1)
    record(tmp_path, "c", decoding="ar", latency_s_per_image=0.1)
    rows = table_rows(load_records([tmp_path]))
    assert [r["method"] for r in rows] == [
        "AR", "LANTERN k=1000 d=0.1 (chain, sampled)", "LANTERN k=1000 d=0.1 (dynamic_tree, reference)"]
    markdown = to_markdown(rows)
    assert "| 0.10 | 0.050 / 0.100 |" in markdown and "| 0.10 | 0.750 / 0.990 |" in markdown
    assert rows[0]["tv_realised"] == 0.0 and "0.750 / 0.990" in to_latex(rows)


def test_no_speedup_without_a_matching_baseline(tmp_path):
    record(tmp_path, "a", decoding="eagle", draft="chain", latency_s_per_image=0.2)
    record(tmp_path, "b", decoding="ar", latency_s_per_image=0.1, **{"seed": 1})
    record(tmp_path, "c", decoding="ar", latency_s_per_image=0.1, batch_size=4)
    record(tmp_path, "d", decoding="ar", latency_s_per_image=0.1, environment={"device": "cpu", "device_name": "cpu B"})
    rows = table_rows(load_records([tmp_path]))
    assert rows[-1]["method"] == "EAGLE exact (chain)" and rows[-1]["speedup"] is None


def test_missing_or_empty_runs_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="runs path not found"):
        load_records([tmp_path / "nope"])
    with pytest.raises(ConfigError, match="no metrics.json"):
        load_records([tmp_path])


def test_multirun_writes_a_table_whose_rows_match_the_records(tmp_path):
    sweep = tmp_path / "sweep"
    proc = subprocess.run(
        [sys.executable, "run.py", "-m", "model=tiny_random_c2i", "decoding=ar,lantern", "num_images=2", "warmup=0",
         "wandb.mode=disabled", f"hydra.sweep.dir={sweep}"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    table = json.loads((sweep / "table.json").read_text())
    records = {json.loads((sweep / d / "metrics.json").read_text())["decoding"]: d for d in ("0", "1")}
    assert [row["method"] for row in table["rows"]] == ["AR", "LANTERN k=1000 d=0.1 (chain, sampled)"]
    lantern = json.loads((sweep / records["lantern"] / "metrics.json").read_text())
    assert table["rows"][1]["tau"] == lantern["mean_accepted_length"]
    assert table["rows"][1]["tv_realised"] == lantern["tv_realised_mean"] <= table["rows"][1]["delta"] == 0.1
    assert (sweep / "table.md").is_file() and (sweep / "table_pareto.png").is_file()
