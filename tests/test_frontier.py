"""make_tables --frontier: speed-up and tau against the realised TV, a line per method, unmeasured TV apart."""

import json
import subprocess
import sys

from helpers import REPO
from helpers_tables import AR, record, tree

from lantern.results.frontier import frontier_points
from lantern.results.tables import build_table, load_records


def runs(tmp_path):
    record(tmp_path, "ar", AR, latency_s_per_image=0.1, mean_accepted_length=1.0)
    lantern = dict(draft="chain", k=1000)
    record(
        tmp_path,
        "l1",
        tree("lantern", delta=0.1, **lantern),
        latency_s_per_image=0.08,
        mean_accepted_length=2.0,
        tv_realised_mean=0.02,
        tv_realised_max=0.1,
    )
    record(
        tmp_path,
        "l4",
        tree("lantern", delta=0.4, **lantern),
        latency_s_per_image=0.05,
        mean_accepted_length=3.0,
        tv_realised_mean=0.08,
        tv_realised_max=0.3,
    )
    record(tmp_path, "pac", tree("sjd_pac", label="SJD-PAC"), latency_s_per_image=0.04, mean_accepted_length=4.0)
    return tmp_path


def test_points_keep_exact_at_zero_and_unmeasured_tv_unmeasured(tmp_path):
    records = load_records([runs(tmp_path)])
    points = {p["run"].rsplit("/", 1)[-1]: p for p in frontier_points(build_table(records), records)}
    assert points["ar"]["tv"] == 0.0 and points["ar"]["speedup"] == 1.0
    assert (points["l1"]["label"], points["l1"]["tv"], points["l4"]["tv"]) == ("LANTERN", 0.02, 0.08)
    assert points["l4"]["speedup"] == 2.0 and points["l4"]["tau"] == 3.0
    assert points["pac"]["label"] == "SJD-PAC" and points["pac"]["tv"] is None  # never drawn at 0


def test_make_tables_frontier_writes_the_figure_and_its_points(tmp_path):
    (tmp_path / "runs").mkdir()
    runs(tmp_path / "runs")
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "make_tables.py"),
            str(tmp_path / "runs"),
            "--out",
            str(tmp_path / "out"),
            "--stem",
            "f",
            "--frontier",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "out" / "f_frontier.png").read_bytes()[:4] == b"\x89PNG"
    points = json.loads((tmp_path / "out" / "f_frontier.json").read_text())["points"]
    assert sorted((p["label"], p["tv"]) for p in points if p["tv"] is not None) == [
        ("AR", 0.0),
        ("LANTERN", 0.02),
        ("LANTERN", 0.08),
    ]
    assert [p["label"] for p in points if p["tv"] is None] == ["SJD-PAC"]
