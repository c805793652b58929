"""make_tables --frontier: speed-up and tau against the realised TV, a line per method; Monte Carlo TVs with their
standard error; a row without a TV is named, never drawn at 0."""

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
    record(
        tmp_path,
        "zip",
        tree("zipar", label="ZipAR"),
        latency_s_per_image=0.03,
        mean_accepted_length=2.5,
        tv_realised_mean=0.3,
        tv_realised_se=0.02,
        tv_audit="mc",
    )
    return tmp_path


def test_points_keep_exact_at_zero_and_unmeasured_tv_unmeasured(tmp_path):
    records = load_records([runs(tmp_path)])
    points = {p["run"].rsplit("/", 1)[-1]: p for p in frontier_points(build_table(records), records)}
    assert points["ar"]["tv"] == 0.0 and points["ar"]["speedup"] == 1.0
    assert (points["l1"]["label"], points["l1"]["tv"], points["l4"]["tv"]) == ("LANTERN", 0.02, 0.08)
    assert points["l4"]["speedup"] == 2.0 and points["l4"]["tau"] == 3.0
    assert points["pac"]["label"] == "SJD-PAC" and points["pac"]["tv"] is None  # never drawn at 0
    assert (points["zip"]["tv"], points["zip"]["tv_se"], points["zip"]["tv_audit"]) == (0.3, 0.02, "mc")
    assert points["l1"]["tv_se"] is None


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
        ("ZipAR", 0.3),
    ]
    assert [p["label"] for p in points if p["tv"] is None] == ["SJD-PAC"]
    unmeasured = json.loads((tmp_path / "out" / "f_frontier.json").read_text())["unmeasured"]
    assert unmeasured == [p["method"] for p in points if p["tv"] is None]
    assert "0.300 ± 0.020 (MC)" in (tmp_path / "out" / "f.md").read_text()


POINTS = sorted(p.stem for p in (REPO / "experiments" / "experiment" / "frontier").glob("*.yaml"))


def test_every_frontier_point_composes_builds_its_decoder_and_the_grid_is_each_method_at_three_settings():
    """``+experiment=frontier``: each method file at low, mid and high builds a decoder on the world; the three
    settings of a method are three decoders, and every method of conf/decoding but AR (the baseline every run times)
    is on the grid, lossy ones and exact ones alike (a new decoding file fails this until it joins)."""
    from hydra import compose, initialize_config_dir

    import lantern  # noqa: F401  (registers the ${lantern_root:} resolver the search path uses)
    from lantern.run.compose import ModelParts, build_decoder

    decodings, lossless = set(), {}
    for point in POINTS:
        built = set()
        for setting in ("low", "mid", "high"):
            with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "conf")):
                cfg = compose(
                    "config",
                    overrides=["+experiment=frontier", f"+experiment/frontier={point}", f"frontier_setting={setting}"],
                )
            decoder = build_decoder(cfg.decoding, ModelParts(cfg.model))
            built.add(str(sorted(decoder.settings.to_json().items())))
            lossless[point] = decoder.settings.lossless()
            decodings.add(cfg.decoding.get("name", decoder.name))
        assert len(built) == 3, f"{point}: its three settings build the same decoder"
    shipped = {p.stem for p in (REPO / "conf" / "decoding").glob("*.yaml")} - {"ar"}
    assert shipped <= decodings, f"not on the frontier grid: {sorted(shipped - decodings)}"
    assert {point for point, exact in lossless.items() if not exact} >= {"lantern", "gsd", "sjd_pac", "zipar"}


def test_the_frontier_preset_runs_two_points_and_its_report_shows_the_frontier(tmp_path):
    """Two of the grid's points (SJD-PAC as released, whose TV the Monte Carlo audit measures, and the lossless
    variant) on the world: the sweep's table carries the Monte Carlo TV with its error, the report embeds the
    frontier."""
    sweep = tmp_path / "sweep"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "run.py"),
            "-m",
            "+experiment=frontier",
            "+experiment/frontier=sjd_pac,sjd_pac_lossless",
            "frontier_setting=low",
            "num_images=1",
            "warmup=0",
            "tv_audit.reruns=16",
            "tv_audit.every=8",
            "wandb.mode=disabled",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = (sweep / "table.md").read_text()
    assert "(MC)" in table and "SJD-PAC lossless" in table
    assert "The frontier: speed-up and tau against the realised TV" in (sweep / "report.html").read_text()


def test_the_frontier_sweep_lists_every_method_file():
    """The sweep's list of methods is the folder's files (a glob over a group on hydra.searchpath finds none)."""
    import yaml

    params = yaml.safe_load((REPO / "experiments" / "experiment" / "frontier.yaml").read_text())["hydra"]["sweeper"]
    assert sorted(params["params"]["+experiment/frontier"].split(",")) == POINTS
