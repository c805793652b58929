"""The speculative benchmark script end to end on the tiny random model: every timed run is kept and the
spread of the per-run speed-ups is reported beside the median figure."""

import json
import subprocess
import sys

from lantern import REPO_ROOT


def test_bench_keeps_every_run_and_reports_the_spread(tmp_path):
    out = tmp_path / "bench"
    cmd = [
        sys.executable,
        str(REPO_ROOT / "scripts" / "bench_speculative.py"),
        "--model",
        "tiny_random_c2i",
        "--images",
        "2",
        "--runs",
        "3",
        "--settings",
        "sampling",
        "--structures",
        "chain",
        "--lantern-structures",
        "chain",
        "--deltas",
        "0.4",
        "--candidates",
        "deterministic",
        "--threads",
        "1",
        "--compile",
        "none",
        "--out",
        str(out),
        "--mode",
        "lantern d=0.4 chain(2)::decoding=lantern delta=0.4 draft.depth=2",
    ]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
    records = json.loads(out.with_suffix(".json").read_text())["records"]
    assert [r["mode"] for r in records] == [
        "ar",
        "eagle chain",
        "lantern d=0.4 chain",
        "lantern_pp l=3 k=10 chain",
        "lantern d=0.4 chain(2)",
    ]
    assert records[-1]["describe"]["depth"] == 2 and records[2]["describe"]["depth"] == 3  # --mode's overrides apply
    for record in records:
        times = record["times_s"]
        assert len(times) == 2 and all(len(t) == 3 and min(t) > 0 for t in times)  # (image, run)
        runs = record["speedup_runs"]
        assert len(runs) == 3
        ar = [sum(t[j] for t in records[0]["times_s"]) for j in range(3)]
        mode = [sum(t[j] for t in times) for j in range(3)]
        assert all(
            abs(r - a / m) < 1e-9 for r, a, m in zip(runs, ar, mode, strict=True)
        )  # run j: AR's j-th times / the mode's
        assert abs(record["speedup"] - sum(ar) / sum(mode)) < 1e-9  # every image and run
        assert min(runs) - 1e-12 <= record["speedup"] <= max(runs) + 1e-12
    assert records[0]["speedup_runs"] == [1.0, 1.0, 1.0]
    assert {(r["compile"], r["dtype"], r["threads"]) for r in records} == {("none", "float32", 1)}
    assert all(r["outside_target_ar_steps"] > 0 for r in records[1:])  # eager rows carry the breakdown
    table = out.with_suffix(".md").read_text()
    assert "| runs' range |" in table
    low, high = min(records[2]["speedup_runs"]), max(records[2]["speedup_runs"])
    assert f"| {low:.2f}-{high:.2f} |" in table


def test_every_candidate_kind_is_asked_for_explicitly():
    """The config's default kind is sampled: a deterministic row without its override would time sampled drafts."""
    from lantern.run.bench.speculative import modes

    rows = dict(modes(("chain",), ("chain",), (0.4,), ("deterministic", "sampled")))
    assert rows["eagle chain"] == ["decoding=eagle", "draft=chain", "draft.candidates=deterministic"]
    assert rows["eagle chain sampled"] == ["decoding=eagle", "draft=chain", "draft.candidates=sampled"]
    assert rows["lantern d=0.4 chain"][-1] == "draft.candidates=deterministic"


def test_target_forward_alone_runs_at_every_draft_size():
    """The compiled rows' reference point: a target forward over a step's tokens at its shapes, also for a tree
    with more tokens than the position table has rows past the middle of the image."""
    from hydra.utils import instantiate

    from lantern.models.sampling import SamplingConfig
    from lantern.run.bench.speculative import compose_config, target_forward_ms

    bundle = instantiate(compose_config(["model=tiny_random_c2i"]).model.bundle)
    count = bundle.target.config.max_seq_len  # more tokens than positions left after the middle of the image
    for sampling in (SamplingConfig(temperature=1.0, cfg_scale=2.0), SamplingConfig(temperature=1.0, cfg_scale=1.0)):
        for tokens in (1, 4, count):
            assert target_forward_ms(bundle, sampling, tokens, "none", repeats=2) > 0


def test_every_peer_row_composes_and_builds_before_timing():
    """Each --peers row (SJD, GSD, MC-SJD, ZipAR) is a config a run composes, built with stand-ins first."""
    from lantern.run.bench.speculative import PEERS, plan_from

    plan = plan_from(1, 1, 0, 1, "fashion_t2i", "", "", "0.1", "sampled", "sampling", ",".join(PEERS), [], "", None)
    assert [label for label, _ in plan.rows] == list(PEERS)
    assert dict(plan.rows)["zipar_4"] == ["decoding=zipar", "window=4"]


def test_bench_times_the_reference_grade_ar_beside_ar_with_reference(tmp_path):
    """--reference: the reference-grade AR (here transformers' generate() of the tiny Lumina-mGPT) is a row of its
    own, timed on the same images, and every row carries its speed-up over it beside the one over AR."""
    out = tmp_path / "bench"
    cmd = [
        sys.executable, str(REPO_ROOT / "scripts" / "bench_speculative.py"), "--model", "tiny_random_lumina",
        "--images", "1", "--runs", "2", "--settings", "sampling", "--structures", "chain", "--lantern-structures",
        "chain", "--deltas", "0.4", "--candidates", "deterministic", "--threads", "1", "--compile", "none",
        "--reference", "--out", str(out),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = json.loads(out.with_suffix(".json").read_text())["records"]
    assert [r["mode"] for r in records][:2] == ["ar", "ar reference"]
    reference = [sum(t[j] for t in records[1]["times_s"]) for j in range(2)]
    for record in records:
        mode = [sum(t[j] for t in record["times_s"]) for j in range(2)]
        assert abs(record["speedup_vs_reference_ar"] - sum(reference) / sum(mode)) < 1e-9
    assert "x vs reference AR)" in out.with_suffix(".md").read_text()
