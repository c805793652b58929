"""Result tables from run records, and the table a multirun writes at its end."""

import csv
import io
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import ClassVar

import pytest
from helpers import REPO
from helpers_tables import AR, SETTING, record, tree

from lantern.decoding.api import DecoderSettings, register
from lantern.decoding.jacobi.decoder import JacobiSettings
from lantern.errors import ConfigError
from lantern.results.render import _far_outliers, pareto_plot, to_csv, to_latex, to_markdown, write_tables
from lantern.results.tables import FAILED_NAME, Table, build_table, failed_jobs, load_records, table_rows

EAGLE = tree("eagle")


def rendered(rows) -> Table:
    return Table(rows=rows)


def md(table, **kwargs) -> str:
    """The Markdown table with its cells' padding removed (``| a | b |``), so rows read as one line."""
    text = to_markdown(table, **kwargs)
    return "\n".join(re.sub(r" +\|", " |", re.sub(r"\| +", "| ", line)) for line in text.splitlines())


def test_rows_follow_the_paper_order_and_speedup_comes_from_the_matching_ar_run(tmp_path):
    record(
        tmp_path,
        "c",
        tree("lantern", draft="chain", k=1000, delta=0.4),
        latency_s_per_image=0.05,
        mean_accepted_length=3.0,
    )
    record(
        tmp_path,
        "a",
        tree("lantern", draft="chain", k=1000, delta=0.1),
        latency_s_per_image=0.08,
        mean_accepted_length=2.0,
    )
    record(tmp_path, "b", AR, latency_s_per_image=0.1, mean_accepted_length=1.0, fid=50.0)
    record(tmp_path, "d", tree("eagle", draft="chain"), latency_s_per_image=0.2, mean_accepted_length=1.5)
    record(tmp_path, "e", tree("lantern_pp", draft="chain", k=10, lam=3.0, label="LANTERN++"), latency_s_per_image=0.1)
    table = build_table(load_records([tmp_path]))
    rows = table.rows
    assert [r["method"] for r in rows] == [
        "AR",
        "EAGLE exact (chain, deterministic)",
        "LANTERN k=1000 d=0.1 (chain, deterministic)",
        "LANTERN k=1000 d=0.4 (chain, deterministic)",
        "LANTERN++ k=10 l=3.0 (chain, deterministic)",
    ]
    assert [round(r["speedup"], 3) for r in rows] == [1.0, 0.5, 1.25, 2.0, 1.0]
    assert rows[0]["fid"] == 50.0 and rows[1]["baseline"].endswith("b")
    assert f"| AR | 1.00 | 100.0 | 1.00x | 100.0 | 50.00 | - | - | 0.000 / 0.000 | {tmp_path / 'b'} |" in md(table)
    assert rows[0]["baseline"] == f"itself ({tmp_path / 'b'})" and rows[1]["baseline_ms"] == 100.0
    assert (
        list(csv.DictReader(io.StringIO(to_csv(table))))[2]["method"] == "LANTERN k=1000 d=0.1 (chain, deterministic)"
    )
    assert r"\begin{tabular}" in to_latex(table) and "2.00$\\times$" in to_latex(table)
    paths = write_tables(load_records([tmp_path]), tmp_path / "out")
    assert all(p.is_file() for p in paths.values())


def test_rows_name_candidates_and_semantics_and_show_realised_tv_beside_delta(tmp_path):
    record(
        tmp_path,
        "a",
        tree("lantern", draft="chain", candidates="sampled", semantics="bounded", k=1000, delta=0.1),
        tv_realised_mean=0.05,
        tv_realised_max=0.1,
        latency_s_per_image=0.1,
    )
    record(
        tmp_path,
        "b",
        tree("lantern", draft="dynamic_tree", candidates="deterministic", semantics="reference", k=1000, delta=0.1),
        tv_realised_mean=0.75,
        tv_realised_max=0.99,
        latency_s_per_image=0.1,
    )
    record(tmp_path, "c", AR, latency_s_per_image=0.1)
    table = build_table(load_records([tmp_path]))
    rows = table.rows
    assert [r["method"] for r in rows] == [
        "AR",
        "LANTERN k=1000 d=0.1 (dynamic_tree, deterministic, reference)",  # one block per draft kind
        "LANTERN k=1000 d=0.1 (chain, sampled)",
    ]
    markdown = md(table)
    assert "| 0.10 | 0.050 / 0.100 |" in markdown and "| 0.10 | 0.750 / 0.990 |" in markdown
    assert any(note.startswith("Draft kinds: rows marked deterministic") for note in table.notes)
    assert to_latex(table).startswith("% Needs \\usepackage{booktabs}")
    assert rows[0]["tv_realised"] == 0.0 and "0.750 / 0.990" in to_latex(table)


def test_no_speedup_without_a_matching_baseline(tmp_path):
    record(tmp_path, "a", tree("eagle", draft="chain"), latency_s_per_image=0.2)
    record(tmp_path, "b", AR, latency_s_per_image=0.1, **{"seed": 1})
    record(tmp_path, "c", AR, latency_s_per_image=0.1, batch_size=4)
    record(tmp_path, "d", AR, latency_s_per_image=0.1, environment={"device": "cpu", "device_name": "cpu B"})
    record(
        tmp_path,
        "e",
        AR,
        latency_s_per_image=0.1,
        environment={"device": "cpu", "device_name": "cpu A (2 cores)", "num_threads": 2},
    )  # other threads
    table = build_table(load_records([tmp_path]))
    rows = table.rows
    assert (
        rows[-1]["method"]
        == "EAGLE exact (chain, deterministic) [batch_size=2, seed=0, device_name=cpu A (2 cores), num_threads=None]"
    )
    assert rows[-1]["speedup"] is None


def test_missing_or_empty_runs_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="runs path not found"):
        load_records([tmp_path / "nope"])
    with pytest.raises(ConfigError, match="no metrics.json"):
        load_records([tmp_path])


def test_multirun_writes_a_table_whose_rows_match_the_records(tmp_path):
    sweep = tmp_path / "sweep"
    proc = subprocess.run(
        [
            sys.executable,
            "run.py",
            "-m",
            "model=tiny_random_c2i",
            "decoding=ar,lantern",
            "num_images=2",
            "warmup=0",
            "wandb.mode=disabled",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    table = json.loads((sweep / "table.json").read_text())
    records = {json.loads((sweep / d / "metrics.json").read_text())["decoding"]: d for d in ("0", "1")}
    assert [row["method"] for row in table["rows"]] == ["AR", "LANTERN k=1000 d=0.1 (chain, sampled)"]
    lantern = json.loads((sweep / records["lantern"] / "metrics.json").read_text())
    assert table["rows"][1]["tau"] == lantern["mean_accepted_length"]
    assert table["rows"][1]["tv_realised"] == lantern["tv_realised_mean"] <= table["rows"][1]["delta"] == 0.1
    assert (sweep / "table.md").is_file() and (sweep / "table_pareto.png").is_file()


def test_speedup_spread_and_the_ar_time_behind_it(tmp_path):
    batches = [{"rank": 0, "indices": [0, 1], "seconds": 0.2}, {"rank": 0, "indices": [2, 3], "seconds": 0.4}]
    record(tmp_path, "ar", AR, latency_s_per_image=0.15, per_batch=batches, latency_s_iqr=[0.1, 0.2])
    record(
        tmp_path,
        "eagle",
        tree("eagle", draft="chain"),
        latency_s_per_image=0.1,
        per_batch=[{**batches[0], "seconds": 0.1}, {**batches[1], "seconds": 0.1}],
    )
    record(
        tmp_path,
        "own",
        tree("lantern", draft="chain", k=10, delta=0.1),
        latency_s_per_image=0.05,
        speedup=3.0,
        speedup_iqr=[2.5, 3.5],
        baseline_latency_s_per_image=0.15,
        speedup_baseline="ar, interleaved in this run",
    )
    table = build_table(load_records([tmp_path]))
    rows = table.rows
    ar, eagle, own = rows
    assert ar["latency_iqr_ms"] == [100.0, 200.0] and ar["baseline_ms"] == 150.0
    assert eagle["speedup"] == pytest.approx(1.5) and eagle["speedup_iqr"] == pytest.approx([2.5, 3.5])
    assert eagle["baseline_ms"] == pytest.approx(150.0) and eagle["baseline"] == str(tmp_path / "ar")
    assert own["speedup_iqr"] == [2.5, 3.5] and own["baseline_ms"] == pytest.approx(150.0)
    markdown = md(table, root=tmp_path)
    assert "| 100.0 [100.0, 200.0] |" not in markdown and "| 150.0 [100.0, 200.0] | 1.00x | 150.0 |" in markdown
    assert "| 1.50x [2.50, 3.50] | 150.0 |" in markdown and markdown.splitlines()[2].endswith("| ar |")


def test_latency_runs_lend_rows_their_latency_and_speedup_and_quality_runs_keep_theirs_as_throughput(tmp_path):
    quality, latency = tmp_path / "quality", tmp_path / "latency"
    quality.mkdir(), latency.mkdir()
    big = {"num_images": 1000, "batch_size": 50}
    record(quality, "ar", AR, latency_s_per_image=0.02, mean_accepted_length=1.0, fid=60.0, **big)
    record(
        quality,
        "lantern",
        tree("lantern", draft="chain", k=1000, delta=0.1),
        latency_s_per_image=0.04,
        fid=61.0,
        mean_accepted_length=2.2,
        speedup=0.5,
        baseline_latency_s_per_image=0.02,
        **big,
    )
    record(
        quality,
        "sjd",
        JacobiSettings(name="sjd", label="SJD", window=16, init="random"),
        latency_s_per_image=0.03,
        speedup=0.7,
        **big,
    )
    small = {"num_images": 30, "batch_size": 1}
    record(latency, "ar", AR, latency_s_per_image=0.66, mean_accepted_length=1.0, **small)
    record(
        latency,
        "lantern",
        tree("lantern", draft="chain", k=1000, delta=0.1),
        latency_s_per_image=0.6,
        speedup=1.1,
        speedup_iqr=[1.0, 1.2],
        baseline_latency_s_per_image=0.66,
        **small,
    )
    record(latency, "other", tree("lantern", draft="chain", k=1000, delta=0.4), latency_s_per_image=0.4, **small)
    table = build_table(load_records([quality]), latency=load_records([latency]))
    rows = table.rows
    assert [r["method"] for r in rows] == [
        "AR",
        "LANTERN k=1000 d=0.1 (chain, deterministic)",
        "SJD W=16 random",
    ]  # no setting notes
    ar, lantern, sjd = rows
    assert ar["latency_ms"] == pytest.approx(660.0) and ar["speedup"] == 1.0 and ar["latency_batch"] == 1
    assert ar["throughput_speedup"] == 1.0 and ar["throughput_batch"] == 50 and ar["fid"] == 60.0
    assert (
        lantern["speedup"] == 1.1
        and lantern["speedup_iqr"] == [1.0, 1.2]
        and lantern["baseline_ms"] == pytest.approx(660.0)
    )
    assert (
        lantern["throughput_speedup"] == 0.5
        and lantern["tau"] == 2.2
        and lantern["latency_run"] == str(latency / "lantern")
    )
    assert lantern["run"] == str(quality / "lantern")
    assert (
        sjd["latency_ms"] is None and sjd["speedup"] is None and sjd["throughput_speedup"] == 0.7
    )  # no latency run of it
    markdown = md(table, root=tmp_path)
    assert "| AR ms/image | throughput speed-up | FID |" in markdown and markdown.splitlines()[2].endswith(
        "| quality/ar | latency/ar |"
    )
    assert "| 600.0 | 1.10x [1.00, 1.20] | 660.0 | 0.50x | 61.00 |" in markdown
    assert "at batch 1 (latency run column)" in markdown and "at batch 50." in markdown
    assert "throughput speed-up &" in to_latex(table) and "{lrrrrrrrrr}" in to_latex(table)
    assert "throughput speed-up" not in md(build_table(load_records([quality])))  # no join, no extra column
    record(latency, "again", tree("lantern", draft="chain", k=1000, delta=0.1), latency_s_per_image=0.5, **small)
    with pytest.raises(ConfigError, match="two latency runs of LANTERN k=1000 d=0.1"):
        table_rows(load_records([quality]), latency=load_records([latency]))


def test_make_tables_joins_latency_runs(tmp_path):
    quality, latency = tmp_path / "quality", tmp_path / "latency"
    quality.mkdir(), latency.mkdir()
    record(quality, "ar", AR, latency_s_per_image=0.02, num_images=1000, batch_size=50)
    record(latency, "ar", AR, latency_s_per_image=0.5, batch_size=1)
    out = tmp_path / "tables"
    proc = subprocess.run(
        [sys.executable, "scripts/make_tables.py", str(quality), "--latency", str(latency), "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    table = json.loads((out / "table.json").read_text())
    assert table["rows"][0]["latency_ms"] == pytest.approx(500.0) and table["latency_runs"] == ["latency/ar"]
    # every file names runs relative to their sweep folders, never by this machine's absolute path
    assert table["runs"] == ["quality/ar"] and table["rows"][0]["run"] == "quality/ar"
    for written in out.iterdir():
        if written.suffix != ".png":
            assert str(tmp_path) not in written.read_text(), written.name


def test_runs_of_different_settings_are_told_apart(tmp_path):
    record(tmp_path, "a", AR, latency_s_per_image=0.1)
    record(tmp_path, "b", AR, latency_s_per_image=0.1, seed=1)
    assert sorted(r["method"] for r in table_rows(load_records([tmp_path]))) == ["AR [seed=0]", "AR [seed=1]"]


def test_a_failed_job_is_named_under_the_table(tmp_path):
    record(tmp_path, "0", AR, latency_s_per_image=0.1)
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / FAILED_NAME).write_text(
        json.dumps({"overrides": ["decoding=eagle"], "error": "RuntimeError: boom"})
    )
    paths = write_tables(load_records([tmp_path]), tmp_path, failed=failed_jobs([tmp_path]))
    assert "FAILED job 1 (decoding=eagle): RuntimeError: boom" in paths["md"].read_text()
    assert "% FAILED job 1 (decoding=eagle): RuntimeError: boom" in paths["tex"].read_text()
    assert json.loads(paths["json"].read_text())["failed"][0]["overrides"] == ["decoding=eagle"]


@pytest.mark.parametrize(
    "payload,message",
    [
        ([1, 2], "a JSON object is expected, not list"),
        ({}, "field 'decoding': field required"),
        (
            {**SETTING, "decoding": "ar", "latency_s_per_image": "0.1"},
            "field 'latency_s_per_image': input should be a valid number",
        ),
        ({**SETTING, "decoding": "ar", "num_images": "4"}, "field 'num_images': input should be a valid integer"),
        ({**SETTING, "decoding": "ar", "schema_version": 99}, "schema_version=99; this lantern reads versions 0, 1"),
        ({**SETTING, "decoding": "ar", "num_images": -5}, "num_images=-5: expected an integer >= 1"),
    ],
)
def test_make_tables_refuses_a_malformed_record_with_one_line_and_writes_nothing(tmp_path, payload, message):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.json").write_text(json.dumps(payload))
    out = tmp_path / "tables"
    proc = subprocess.run(
        [sys.executable, "scripts/make_tables.py", str(run), "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: '{run / 'metrics.json'}'") and message in lines[0], lines[0]
    assert not out.exists()


def test_make_tables_out_must_be_a_folder(tmp_path):
    run = record(tmp_path, "run", AR, latency_s_per_image=0.1)
    target = tmp_path / "table.md"
    target.write_text("keep")
    proc = subprocess.run(
        [sys.executable, "scripts/make_tables.py", str(run), "--out", str(target)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        proc.returncode == 2
        and proc.stderr.strip() == f"error: --out='{target}' is a file; give a folder (the tables are written into it)"
    )
    assert target.read_text() == "keep" and sorted(p.name for p in tmp_path.iterdir()) == ["run", "table.md"]


def sweep(tmp_path, *overrides):
    return subprocess.run(
        [
            sys.executable,
            "run.py",
            "-m",
            "model=tiny_random_c2i",
            "num_images=2",
            "warmup=0",
            "speedup_baseline=null",
            "wandb.mode=disabled",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
            *overrides,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow  # ~20 s of sweep jobs
def test_a_sweep_with_a_failed_job_still_writes_the_table_naming_it_and_a_rerun_skips_finished_jobs(tmp_path):
    jobs = "job._target_=lantern.run.job.GenerationJob,lantern.run.job.NoSuchJob"
    first = sweep(tmp_path, jobs)
    assert first.returncode != 0  # Hydra raises the failed job's error after the sweep
    folder = tmp_path / "sweep"
    table = json.loads((folder / "table.json").read_text())
    assert [row["method"] for row in table["rows"]] == ["AR"] and table["failed"][0]["run"] == str(folder / "1")
    failed = [line for line in (folder / "table.md").read_text().splitlines() if line.startswith("FAILED")]
    assert (
        len(failed) == 1
        and failed[0].startswith("FAILED job 1 (")
        and "Error locating target 'lantern.run.job.NoSuchJob'" in failed[0]
    )
    record_mtime = (folder / "0" / "metrics.json").stat().st_mtime_ns
    again = sweep(tmp_path, jobs)
    assert "already finished" in again.stdout and (folder / "0" / "metrics.json").stat().st_mtime_ns == record_mtime
    other = sweep(tmp_path, "seed=0,1")
    lines = [line for line in other.stderr.splitlines() if line.strip()]
    assert (
        other.returncode == 2
        and len(lines) == 1
        and lines[0].startswith(f"error: sweep folder '{folder}' holds a sweep of other overrides")
    )
    assert "job._target_" in (folder / "multirun.yaml").read_text()


def test_the_pareto_plot_lists_far_outliers_instead_of_squashing_the_axis(tmp_path):
    assert _far_outliers([60.0, 62.0, 64.0, 187.0]) == {187.0} and _far_outliers([60.0, 100.0, 110.0]) == set()
    rows = [
        {"speedup": s, "fid": f, "tau": 1.0, "method": m, "tv_realised": 0.0}
        for s, f, m in ((1.0, 64.0, "AR"), (1.1, 62.0, "exact"), (1.4, 66.0, "lantern"), (0.6, 187.0, "broken"))
    ]
    assert pareto_plot(rendered(rows), tmp_path / "p.png").stat().st_size > 0


@register
@dataclass(frozen=True)
class _DummySettings(DecoderSettings):
    """A decoder this project does not have: its settings class alone gives it a labelled row."""

    kind: ClassVar[str] = "test_dummy"
    width: int = 3

    def method(self) -> str:
        return f"{self.label} width={self.width}"

    def order(self) -> tuple:
        return (5, self.width)


def test_a_new_decoder_gets_a_labelled_row_without_table_code(tmp_path):
    record(tmp_path, "ar", AR, latency_s_per_image=0.2)
    record(tmp_path, "dummy", _DummySettings(name="dummy", label="DUMMY", width=7), latency_s_per_image=0.1)
    table = build_table(load_records([tmp_path]))
    assert [r["method"] for r in table.rows] == ["AR", "DUMMY width=7"]
    assert table.rows[1]["speedup"] == pytest.approx(2.0) and "| DUMMY width=7 |" in md(table)


@pytest.mark.parametrize(
    "changed, key",
    [
        ({"dtype": "bfloat16"}, "dtype"),
        ({"compile": "default"}, "compile"),
        ({"cfg_interval": 5}, "cfg_interval"),
        ({"config": {"attention": "reference"}}, "attention"),
        ({"environment": {"device": "cpu", "device_name": "cpu A (2 cores)", "num_threads": 1}}, "num_threads"),
        ({"inputs": {"/w/gpt.safetensors": {"role": "target", "sha256": "ab" * 32}}}, "inputs"),
    ],
)
def test_a_speedup_is_never_taken_from_an_unlike_ar_run(tmp_path, changed, key):
    record(tmp_path, "ar", AR, latency_s_per_image=0.2)
    record(tmp_path, "lantern", tree("lantern", k=1000, delta=0.1), latency_s_per_image=0.1, **changed)
    table = build_table(load_records([tmp_path]))
    lantern = next(r for r in table.rows if r["method"].startswith("LANTERN"))
    assert lantern["speedup"] is None and lantern["baseline_ms"] is None
    assert any(f"differs in {key} (" in note for note in table.notes), table.notes
    assert f"differs in {key} (" in md(table)


def test_an_older_record_without_settings_is_labelled_but_never_joined(tmp_path):
    record(tmp_path, "ar", AR, latency_s_per_image=0.2)
    old = tmp_path / "old"
    old.mkdir()
    (old / "metrics.json").write_text(
        json.dumps(
            {
                **SETTING,
                "schema_version": 1,
                "decoding": "lantern",
                "draft": "chain",
                "k": 10,
                "delta": 0.2,
                "latency_s_per_image": 0.1,
            }
        )
    )
    table = build_table(load_records([tmp_path]))
    row = next(r for r in table.rows if r["run"] == str(old))
    assert row["method"].startswith("LANTERN (draft=chain, k=10, delta=0.2)") and row["speedup"] is None
    assert any("holds no decoder settings" in note for note in table.notes)


def test_a_new_user_s_fp32_ar_and_bf16_lantern_runs_join_to_no_speedup(tmp_path):
    """The README's first try: AR in float32 and LANTERN in bfloat16, then make_tables over both."""
    common = ["model=tiny_random_c2i", "num_images=2", "batch_size=2", "warmup=0", "wandb.mode=disabled"]
    for name, extra in (
        ("ar", ["decoding=ar", "dtype=float32"]),
        ("lantern", ["decoding=lantern", "dtype=bfloat16", "speedup_baseline=null"]),
    ):
        proc = subprocess.run(
            [sys.executable, "run.py", *common, *extra, f"hydra.run.dir={tmp_path / 'runs' / name}"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
    proc = subprocess.run(
        [sys.executable, "scripts/make_tables.py", str(tmp_path / "runs"), "--out", str(tmp_path / "t")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    rows = json.loads((tmp_path / "t" / "table.json").read_text())["rows"]
    lantern = next(r for r in rows if r["method"].startswith("LANTERN"))
    assert lantern["speedup"] is None and "differs in dtype (this run 'bfloat16', the other 'float32')" in proc.stdout


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"num_images": 0}, "num_images=0: expected an integer >= 1"),
        ({"batch_size": -2}, "batch_size=-2: expected an integer >= 1"),
        ({"latency_s_per_image": -1.0}, "latency_s_per_image=-1.0: expected a finite number > 0 or null"),
        ({"latency_s_per_image": float("nan")}, "latency_s_per_image=nan: expected a finite number > 0"),
        ({"latency_s_per_image": 0.0}, "latency_s_per_image=0.0: expected a finite number > 0"),
        ({"speedup": float("inf")}, "speedup=inf: expected a finite number > 0"),
        ({"speedup_iqr": [1.0, -2.0]}, "speedup_iqr=[1.0, -2.0]: expected [q1, q3]"),
        ({"speedup_iqr": [1.0]}, "speedup_iqr=[1.0]: expected [q1, q3]"),
        ({"mean_accepted_length": 0.5}, "mean_accepted_length=0.5: expected a finite number >= 1"),
        ({"tv_realised_max": 1.5}, "tv_realised_max=1.5: expected a number in [0, 1]"),
        ({"tv_realised_mean": -0.2}, "tv_realised_mean=-0.2: expected a number in [0, 1]"),
        ({"fid": float("nan")}, "fid=nan: expected a finite number or null"),
    ],
)
def test_a_record_whose_values_no_run_can_produce_is_refused(tmp_path, fields, message):
    from lantern.results.record import RecordError, read_record

    run = record(tmp_path, "run", AR, **{"latency_s_per_image": 0.1, "speedup": 1.0, **fields})
    with pytest.raises(RecordError) as refused:
        read_record(run)
    shown = str(refused.value)
    assert shown.startswith(f"{str(run / 'metrics.json')!r} is not a valid run record: {message}"), shown


def test_one_run_given_three_times_is_one_row_with_a_note(tmp_path):
    from lantern.results.render import make_tables

    run = record(tmp_path, "run", AR, latency_s_per_image=0.1)
    table, paths = make_tables([str(run), str(run / "metrics.json"), str(tmp_path)], out=str(tmp_path / "t"))
    assert len(table.rows) == 1
    assert sum("given more than once, shown once" in note for note in table.notes) == 2
    assert "given more than once" in paths["md"].read_text()


def test_the_notes_name_the_inputs_by_short_hash_and_tell_two_sets_apart(tmp_path):
    def inputs(weights):
        return {
            "/w/gpt.safetensors": {"role": "target", "sha256": weights * 64, "bytes": 1},
            "/w/prompts.txt": {"role": "prompts", "sha256": "c" * 64, "bytes": 1},
            "/w/clip.safetensors": {"role": "metric", "sha256": "d" * 64, "bytes": 1},  # not a join input
        }

    one = record(tmp_path, "one", AR, latency_s_per_image=0.1, inputs=inputs("a"))
    table = build_table(load_records([one]))
    assert table.notes[-1] == f"Inputs (sha256): gpt.safetensors {'a' * 12}, prompts.txt {'c' * 12}."
    other = record(tmp_path, "other", EAGLE, latency_s_per_image=0.05, inputs=inputs("b"))
    table = build_table(load_records([one, other]))
    assert [row["speedup"] for row in table.rows if row["method"] != "AR"] == [None]  # other weights: no join
    lines = [note for note in table.notes if note.startswith("Inputs")]
    assert len(lines) == 2 and f"gpt.safetensors {'b' * 12}" in lines[1] and "1 of 2 runs" in lines[1], lines


def test_no_throughput_leaves_out_the_quality_runs_own_times(tmp_path):
    """Quality runs timed on a loaded machine: their latencies are not times, and no column may show them."""
    quality, latency = tmp_path / "quality", tmp_path / "latency"
    quality.mkdir(), latency.mkdir()
    record(quality, "ar", AR, latency_s_per_image=0.02, fid=60.0, num_images=1000, batch_size=10)
    record(quality, "eagle", EAGLE, latency_s_per_image=0.12, fid=61.0, num_images=1000, batch_size=10)
    record(latency, "ar", AR, latency_s_per_image=0.4, num_images=30, batch_size=1)
    record(latency, "eagle", EAGLE, latency_s_per_image=0.3, num_images=30, batch_size=1)
    records, timed = load_records([quality]), load_records([latency])
    assert [row["throughput_speedup"] for row in build_table(records, timed).rows] == [1.0, pytest.approx(1 / 6)]
    table = build_table(records, timed, throughput=False)
    assert [row["throughput_speedup"] for row in table.rows] == [None, None]
    assert [row["speedup"] for row in table.rows] == [1.0, pytest.approx(0.4 / 0.3)]
    text = to_markdown(table)
    assert "throughput speed-up |" not in text and "(make_tables --no-throughput)" in text


def ci(lo, hi):
    return {
        "lo": lo,
        "hi": hi,
        "level": 0.95,
        "resamples": 100,
        "seed": 0,
        "method": "percentile bootstrap over prompts",
    }


def test_quality_figures_show_their_intervals_and_overlaps_are_not_significant(tmp_path):
    quality = {"protocol": "world", "protocol_sha256": "ab" * 32, "protocol_subset": True, "schema_version": 3}
    record(
        tmp_path,
        "ar",
        AR,
        latency_s_per_image=0.1,
        fid=50.0,
        fid_ci=ci(48.0, 52.0),
        clip_score=0.30,
        clip_score_ci=ci(0.29, 0.31),
        prompt_accuracy=0.9,
        prompt_accuracy_ci=ci(0.85, 0.95),
        **quality,
    )
    lantern = tree("lantern", k=1000, delta=0.1)
    record(
        tmp_path,
        "l",
        lantern,
        latency_s_per_image=0.05,
        fid=51.0,
        fid_ci=ci(49.0, 53.5),
        clip_score=0.25,
        clip_score_ci=ci(0.24, 0.26),
        prompt_accuracy=0.8,
        prompt_accuracy_ci=ci(0.7, 0.86),
        **quality,
    )
    table = build_table(load_records([tmp_path]))
    text = md(table)
    assert "| AR | 1.00 | 100.0 | 1.00x | 100.0 | 50.00 ± 2.00 | 0.3000 ± 0.0100 | 0.900 ± 0.050 |" in text
    assert "| 51.00 ± 2.25 | 0.2500 ± 0.0100 | 0.800 ± 0.080 |" in text and "| world (subset) |" in text
    notes = "\n".join(table.notes)
    # FID and accuracy overlap AR's intervals; CLIP does not (0.24-0.26 vs 0.29-0.31).
    assert (
        "LANTERN k=1000 d=0.1 (chain, deterministic) vs AR: fid 51 vs 50, prompt_accuracy 0.8 vs 0.9: not significant"
        in notes
    )
    assert "clip_score 0.25" not in notes and "Protocol: world; 2 of 2 runs used the first N prompts" in notes
    row = next(r for r in csv.DictReader(io.StringIO(to_csv(table))) if r["method"] == "AR")
    assert json.loads(row["fid_ci"]) == [48.0, 52.0]
    pareto_plot(table, tmp_path / "p.png")  # draws the error bars


def test_runs_of_two_protocols_are_never_joined(tmp_path):
    record(tmp_path, "ar", AR, latency_s_per_image=0.1, protocol="world", protocol_sha256="a" * 64, schema_version=3)
    record(tmp_path, "l", tree("lantern", k=1000, delta=0.1), latency_s_per_image=0.05, protocol=None, schema_version=3)
    table = build_table(load_records([tmp_path]))
    lantern = next(r for r in table.rows if r["method"].startswith("LANTERN"))
    assert lantern["speedup"] is None and "[protocol=None" in lantern["method"]
    assert any("differs in protocol (this run None, the other 'world')" in note for note in table.notes)


def test_a_lossy_row_without_a_measured_tv_says_so_and_lossless_rows_keep_a_dash(tmp_path):
    from lantern.decoding.zipar.decoder import ZipARSettings

    record(tmp_path, "a", AR, latency_s_per_image=0.1)
    record(tmp_path, "b", ZipARSettings(name="zipar", label="ZipAR", window=4), latency_s_per_image=0.05)
    record(tmp_path, "c", EAGLE, latency_s_per_image=0.08)  # an older record: no TV, no ``lossless``
    record(
        tmp_path, "d", ZipARSettings(name="zipar", label="ZipAR", window=2), latency_s_per_image=0.07, lossless=False
    )
    rows = {r["method"]: r for r in build_table(load_records([tmp_path])).rows}
    assert [rows[m]["lossless"] for m in ("AR", "ZipAR-4", "EAGLE exact (chain, deterministic)", "ZipAR-2")] == [
        True,
        False,
        True,
        False,
    ]
    lines = {
        line.split(" |")[0].removeprefix("| "): line for line in md(build_table(load_records([tmp_path]))).splitlines()
    }
    assert "| lossy, TV not measured |" in lines["ZipAR-4"] and "| lossy, TV not measured |" in lines["ZipAR-2"]
    assert "TV not measured" not in lines["EAGLE exact (chain, deterministic)"] and "| 0.000 / 0.000 |" in lines["AR"]
    assert "lossy, TV not measured" in to_latex(build_table(load_records([tmp_path])))


def test_a_latency_run_from_another_checkout_and_thread_count_joins_but_other_weights_do_not(tmp_path):
    """Inputs join by role, file name and content, not by folder; threads change a quality run's time only."""

    def inputs(folder, digest):
        return {f"{folder}/worlds/gpt.safetensors": {"role": "target", "sha256": digest * 64}}

    def env(threads):
        return {"environment": {"device": "cpu", "device_name": "cpu A (2 cores)", "num_threads": threads}}

    quality, latency, other = (tmp_path / name for name in ("quality", "latency", "other"))
    for folder in (quality, latency, other):
        folder.mkdir()
    lantern = tree("lantern", draft="chain", k=1000, delta=0.1)
    record(quality, "lantern", lantern, latency_s_per_image=0.04, inputs=inputs("/a", "1"), **env(1))
    record(latency, "lantern", lantern, latency_s_per_image=0.6, speedup=1.1, inputs=inputs("/b", "1"), **env(2))
    record(other, "lantern", lantern, latency_s_per_image=0.6, speedup=1.1, inputs=inputs("/b", "2"), **env(2))
    joined = build_table(load_records([quality]), latency=load_records([latency]))
    assert joined.rows[0]["speedup"] == 1.1 and joined.rows[0]["latency_run"] == str(latency / "lantern")
    apart = build_table(load_records([quality]), latency=load_records([other]))
    assert apart.rows[0]["speedup"] is None and any("no latency run" in note for note in apart.notes)
