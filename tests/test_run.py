"""End-to-end runs of the entry point (subprocesses, the tiny random world)."""

import json
import subprocess
import sys

import pytest
from helpers import REPO, run

from lantern.decoding.api import settings_from_record


def test_run_writes_images_grid_and_metrics(tmp_path):
    proc, out = run(tmp_path, "num_images=5", "batch_size=2", "seed=3")
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.glob("*.png")) == [f"{i:06d}.png" for i in range(5)] + ["grid.png"]
    metrics = json.loads((out / "metrics.json").read_text())
    metrics = {**metrics, **settings_from_record(metrics).record()}  # the decoder's knobs, flat
    assert metrics["num_images"] == 5 and metrics["decoding"] == "lantern" and metrics["seed"] == 3
    assert len(metrics["per_image"]) == 5 and all(r["latency_s"] > 0 for r in metrics["per_image"])
    assert metrics["tokens_per_s"] > 0 and metrics["environment"]["versions"]["torch"]
    assert metrics["config"]["model"]["name"] == "tiny_random_c2i"


def test_images_do_not_change_with_batch_size(tmp_path):
    one, out1 = run(tmp_path, "num_images=4", "batch_size=1", "warmup=0", name="b1")
    four, out4 = run(tmp_path, "num_images=4", "batch_size=4", "warmup=0", name="b4")
    assert one.returncode == 0 and four.returncode == 0, one.stderr + four.stderr
    for i in range(4):
        assert (out1 / f"{i:06d}.png").read_bytes() == (out4 / f"{i:06d}.png").read_bytes()


@pytest.mark.parametrize(
    "override,message",
    [
        ("top_k=-1", "top_k=-1"),
        ("top_p=1.5", "top_p=1.5"),
        ("temperature=-0.5", "temperature=-0.5"),
        ("cfg_scale=-1", "cfg_scale=-1"),
        ("num_images=0", "num_images=0"),
        ("model.bundle.gpt.preset=GPT-Q", "model.bundle.gpt.preset='GPT-Q': expected one of GPT-B"),
        ("model.bundle.gpt.model_type=x2i", "model_type"),
        ("model.bundle.gpt.image_size=30", "image_size 30"),
        ("dtype=int8", "dtype='int8'"),
        ("speedup_every=0", "speedup_every=0"),
    ],
)
def test_bad_input_is_one_line_nonzero_and_writes_nothing(tmp_path, override, message):
    proc, out = run(tmp_path, override)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], proc.stderr
    assert not out.exists()


@pytest.mark.parametrize(
    "overrides,message",
    [
        (("decoding=lantern", "delta=-0.1"), "delta=-0.1"),
        (("decoding=lantern", "delta=1.5"), "delta=1.5"),
        (("decoding=lantern", "delta=nan"), "delta=nan"),
        (("decoding=lantern", "k=0"), "k=0"),
        (("decoding=lantern", "k=5000"), "k=5000"),
        (("decoding=lantern_pp", "lambda=0.5"), "lambda=0.5"),
        (
            ("decoding=eagle", "model.drafter.gpt={preset:GPT-mini,model_type:c2i,image_size:32}"),
            "model.drafter.gpt: GPT vocabulary 16384 does not match the VQ codebook size 1024",  # before any load
        ),
        (
            (
                "decoding=lantern",
                "k=50",
                "model.neighbours.k_max=100",
                "model.neighbours.codebook.vq={preset:VQ-tiny,overrides:{codebook_size:512}}",
            ),
            "another codebook",
        ),
        (("decoding=eagle", "draft=chain", "draft.depth=0"), "depth=0"),
        (("decoding=lantern", "semantics=paper"), "semantics=paper is not an option; choose one of bounded, reference"),
        (("decoding=lantern", "semantics=reference", "decoding.acceptance.tv_audit_every=0"), "tv_audit_every=0"),
        (("decoding=lantern_pp", "semantics=reference", "k=1023"), "k+1=1024"),
        (
            ("decoding=lantern", "semantics=reference", "draft=dynamic_tree", "draft.candidates=sampled"),
            "use draft=static_tree or draft=chain",
        ),
    ],
)
def test_bad_speculative_input_is_one_line_and_writes_nothing(tmp_path, overrides, message):
    proc, out = run(tmp_path, "num_images=2", *overrides)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], proc.stderr
    assert not out.exists()


def test_speculative_run_records_acceptance(tmp_path):
    proc, out = run(
        tmp_path,
        "decoding=lantern",
        "delta=0.3",
        "draft.candidates=deterministic",
        "num_images=3",
        "warmup=0",
        wandb_off=False,
    )
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    metrics = {**metrics, **settings_from_record(metrics).record()}  # the decoder's knobs, flat
    assert metrics["decoding"] == "lantern" and metrics["delta"] == 0.3 and metrics["k"] == 1000
    assert metrics["draft"] == "chain" and metrics["mean_accepted_length"] >= 1.0
    assert sum(metrics["acceptance_histogram"]) == metrics["target_steps"]
    assert 0.0 < metrics["merged_mass_max"] <= 0.3 and metrics["decode_stats"]["drafter_forwards"] > 0
    assert metrics["semantics"] == "bounded" and metrics["neighbours_normalized"] is True
    assert 0.0 < metrics["tv_realised_mean"] <= metrics["tv_realised_max"] <= 0.3 + 1e-6
    assert metrics["tv_realised_coverage"] == 1.0
    assert all(row["steps"] >= 1 for row in metrics["per_image"])
    assert metrics["speedup"] > 0 and "interleaved" in metrics["speedup_baseline"]
    assert metrics["speedup"] == pytest.approx(metrics["baseline_latency_s_per_image"] / metrics["latency_s_per_image"])
    assert metrics["compared_latency_s_per_image"] == pytest.approx(metrics["latency_s_per_image"])
    assert list((out / "wandb").glob("offline-run-*/*.wandb")), "W&B logs offline by default"


def test_speedup_on_every_other_batch_compares_the_same_batches(tmp_path):
    proc, out = run(tmp_path, "decoding=eagle", "num_images=3", "batch_size=1", "warmup=0", "speedup_every=2")
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    metrics = {**metrics, **settings_from_record(metrics).record()}  # the decoder's knobs, flat
    assert "on 2 of 3 batches" in metrics["speedup_baseline"]
    rows = metrics["per_image"]
    assert metrics["compared_latency_s_per_image"] == pytest.approx((rows[0]["latency_s"] + rows[2]["latency_s"]) / 2)
    assert metrics["speedup"] == pytest.approx(
        metrics["baseline_latency_s_per_image"] / metrics["compared_latency_s_per_image"]
    )


def test_speedup_against_a_named_baseline_run(tmp_path):
    ar, ar_out = run(tmp_path, "decoding=ar", "num_images=3", "warmup=0", name="ar")
    assert ar.returncode == 0, ar.stderr
    proc, out = run(
        tmp_path,
        "decoding=eagle",
        "num_images=3",
        "warmup=0",
        "speedup_baseline=null",
        f"speedup_baseline_run={ar_out}",
        name="eagle",
    )
    assert proc.returncode == 0, proc.stderr
    ar_metrics = json.loads((ar_out / "metrics.json").read_text())
    metrics = json.loads((out / "metrics.json").read_text())
    metrics = {**metrics, **settings_from_record(metrics).record()}  # the decoder's knobs, flat
    assert metrics["speedup"] == pytest.approx(ar_metrics["latency_s_per_image"] / metrics["latency_s_per_image"])
    assert f"run {ar_out}" in metrics["speedup_baseline"] and "same setting and machine" in metrics["speedup_baseline"]
    other, other_out = run(
        tmp_path,
        "decoding=eagle",
        "num_images=4",
        "warmup=0",
        "speedup_baseline=null",
        f"speedup_baseline_run={ar_out}",
        name="other",
    )
    assert other.returncode == 2 and not other_out.exists()
    assert other.stderr.strip().splitlines()[-1] == (
        f"error: speedup_baseline_run='{ar_out}' differs from this run in num_images (this run 4, the other 3)"
    )
    both, both_out = run(tmp_path, "decoding=eagle", "num_images=3", f"speedup_baseline_run={ar_out}", name="both")
    assert both.returncode == 2 and "both set" in both.stderr and not both_out.exists()
    absent, _ = run(
        tmp_path, "decoding=eagle", "speedup_baseline=null", f"speedup_baseline_run={tmp_path}", name="absent"
    )
    assert absent.returncode == 2 and "no metrics.json there" in absent.stderr


def test_missing_checkpoint_and_text_encoder_are_named(tmp_path):
    proc, out = run(tmp_path, "model=llamagen_c2i_b_256", "decoding=ar")
    assert proc.returncode != 0 and "model.gpt_ckpt is required" in proc.stderr and not out.exists()
    vq = tmp_path / "vq.pt"
    vq.write_bytes(b"")
    proc, out = run(
        tmp_path,
        "model=llamagen_t2i_xl_256",
        f"model.gpt_ckpt={tmp_path / 'absent.pt'}",
        f"model.vq_ckpt={vq}",
        f"model.text_encoder_path={tmp_path}",  # a folder: the missing target is what is named
        "decoding=ar",
    )
    assert proc.returncode != 0 and "absent.pt" in proc.stderr.strip().splitlines()[-1] and not out.exists()


def test_default_world_main_job(tmp_path):
    """``python run.py`` shows the method: LANTERN (delta 0.1) at batch 1 on the world, AR timed interleaved,
    and one line with tau, the speed-up and the realised TV (fewer images here)."""
    out = tmp_path / "default"
    proc = subprocess.run(
        [sys.executable, "run.py", "num_images=4", "wandb.mode=disabled", f"hydra.run.dir={out}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    metrics = {**metrics, **settings_from_record(metrics).record()}  # the decoder's knobs, flat
    assert metrics["model"] == "fashion_t2i" and metrics["prompts"] == "fashion_mnist"
    assert metrics["decoding"] == "lantern" and metrics["delta"] == 0.1 and metrics["batch_size"] == 1
    assert [r["label"] for r in metrics["per_image"]] == [0, 1, 2, 3]
    assert (out / "grid.png").is_file() and (out / "000003.png").is_file()
    assert metrics["mean_accepted_length"] > 1.5  # the world's drafter is right more often than not
    assert 0 < metrics["tv_realised_max"] <= 0.1 + 1e-6  # fp32 sums of the moved mass
    line = proc.stdout.strip().splitlines()[-1]
    assert line.startswith("4 images, grid.png and metrics.json in") and str(out) in line
    tau, speedup = metrics["mean_accepted_length"], metrics["speedup"]
    tv = f"realised TV mean {metrics['tv_realised_mean']:.3f} max {metrics['tv_realised_max']:.3f}"
    assert metrics["speedup_baseline"] and f"tau {tau:.2f}, {speedup:.2f}x AR, {tv})" in line


def test_a_neighbour_table_in_the_other_distance_space_is_refused(tmp_path):
    from hydra import compose, initialize_config_dir

    from lantern.models.llamagen.bundle import random_vq
    from lantern.rules.neighbours import codebook_hash, load_or_build_table, table_path

    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "conf")):
        cfg = compose("config", overrides=["model=tiny_random_c2i"])
    codebook = random_vq(cfg.model.bundle.vq, cfg.model.bundle.init_seed).raw_codebook().detach()
    load_or_build_table(codebook, 16, False, tmp_path / "tables")  # built on raw rows
    raw = table_path(tmp_path / "tables", codebook_hash(codebook, False), 16, False)
    proc, out = run(
        tmp_path,
        "num_images=2",
        "decoding=lantern",
        "k=8",
        "model.neighbours.k_max=16",
        f"model.neighbours.path={raw}",
        "model.neighbours.normalize=true",
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert (
        lines[0].startswith("error: ")
        and "built on raw codebook rows but l2-normalised rows were requested" in lines[0]
    )
    assert not out.exists()
    # The same file is what the authors' semantics asks for by default: it runs.
    proc, out = run(
        tmp_path,
        "num_images=2",
        "warmup=0",
        "speedup_baseline=null",
        "decoding=lantern",
        "k=8",
        "model.neighbours.k_max=16",
        f"model.neighbours.path={raw}",
        "semantics=reference",
        name="reference",
    )
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    metrics = {**metrics, **settings_from_record(metrics).record()}  # the decoder's knobs, flat
    assert metrics["semantics"] == "reference" and metrics["neighbours_normalized"] is False


@pytest.mark.parametrize(
    "sweep, job",
    [
        ("top_p=0.5,1.5", "sweep job 1 (top_p=1.5)"),
        ("decoding=sjd window=16,0", "sweep job 1 (window=0)"),
        ("decoding=ar,lantern delta=0.1,2", "sweep job 1 (decoding=ar delta=2)"),
    ],
)
def test_a_multirun_checks_every_job_before_the_first_and_writes_nothing(tmp_path, sweep, job):
    folder = tmp_path / "sweep"
    proc = subprocess.run(
        [
            sys.executable,
            "run.py",
            "-m",
            "model=tiny_random_c2i",
            "num_images=2",
            "wandb.mode=disabled",
            *sweep.split(),
            f"hydra.sweep.dir={folder}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: {job}: "), proc.stderr
    assert not folder.exists() and not proc.stdout
