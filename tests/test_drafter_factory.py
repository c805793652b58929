"""scripts/train_drafter.py end to end on the tiny random target: stages, resume, refusals, DDP, and the drafter it exports."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
TINY = ["model=tiny_random_c2i", "num_threads=1", "progress=false"]
SMALL = [
    "num_samples=24",
    "generation.batch_size=8",
    "features.batch_size=8",
    "batch_size=4",
    "steps=6",
    "warmup_steps=1",
]


def factory(*overrides: str, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "train_drafter.py"), *TINY, *overrides],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("error: "), proc.stderr[-2000:]
    return lines[-1]


def snapshot(folder: Path) -> dict:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


def run_images(tmp_path: Path, name: str, *overrides: str) -> tuple[dict, list[bytes]]:
    out = tmp_path / name
    proc = subprocess.run(
        [sys.executable, "run.py", "model=tiny_random_c2i", f"hydra.run.dir={out}", "wandb.mode=disabled",
         "num_images=4", "batch_size=2", "speedup_baseline=null", *overrides],
        cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    metrics = json.loads((out / "metrics.json").read_text())
    return metrics, [(out / f"{i:06d}.png").read_bytes() for i in range(4)]


def test_the_new_users_command_gives_a_drafter_that_speeds_up_greedy_decoding(tmp_path):
    """The issue's command: one call, an exported folder; greedy EAGLE with it == greedy AR, tau > 1."""
    out = tmp_path / "factory"
    proc = factory("num_samples=64", "steps=40", f"out_dir={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in (out / "drafter").iterdir()) == ["config.json", "model.safetensors"]
    report = json.loads((out / "report.json").read_text())
    assert report["training"]["steps"] == 40 and report["data"]["rows"] == 64 and report["held_out"]["rows"] == 4
    assert 0.0 <= report["held_out"]["top1"] <= report["held_out"]["top5"] <= 1.0
    assert "held-out top-1 agreement" in proc.stdout
    ar, ar_png = run_images(tmp_path, "ar", "decoding=ar", "temperature=0")
    eagle, eagle_png = run_images(
        tmp_path, "eagle", "temperature=0", "decoding=eagle", f"model.drafter_ckpt={out / 'drafter'}"
    )
    assert eagle_png == ar_png
    assert eagle["mean_accepted_length"] > 1.0


def test_stages_run_alone_resume_and_refuse_out_of_order(tmp_path):
    out = tmp_path / "f"
    line = error_line(factory(*SMALL, "stage=features", f"out_dir={out}"))
    assert "holds 0 of 24 rows: run stage=data" in line
    assert factory(*SMALL, "stage=data", f"out_dir={out}").returncode == 0
    index = json.loads((out / "data" / "index.json").read_text())
    assert sum(s["rows"] for s in index["shards"]) == 24 and not (out / "features").exists()
    assert "run stage=features" in error_line(factory(*SMALL, "stage=train", f"out_dir={out}"))
    for stage in ("features", "train", "export"):
        proc = factory(*SMALL, f"stage={stage}", f"out_dir={out}")
        assert proc.returncode == 0, proc.stderr[-2000:]
    first = load_file(str(out / "drafter" / "model.safetensors"))
    made = lambda: {k: v for k, v in snapshot(out).items() if k.startswith(("data/", "features/"))}  # noqa: E731
    before = made()
    proc = factory(*SMALL, f"out_dir={out}")  # stage=all over finished stages: nothing made again
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert made() == before
    again = load_file(str(out / "drafter" / "model.safetensors"))
    assert all(torch.equal(first[k], again[k]) for k in first)

    # More samples extend the data and features; the finished training refuses the changed data.
    line = error_line(
        factory(*[o for o in SMALL if not o.startswith("num_samples")], "num_samples=32", f"out_dir={out}")
    )
    assert "was written with a different config (num_samples: 24 -> 32" in line
    assert sum(s["rows"] for s in json.loads((out / "features" / "index.json").read_text())["shards"]) == 32
    assert all(made()[name] == before[name] for name in before if "index" not in name)  # appended, not rewritten


def test_another_targets_out_dir_and_a_cut_shard_are_refused_untouched(tmp_path):
    out = tmp_path / "f"
    assert factory(*SMALL, "stage=data", f"out_dir={out}").returncode == 0
    before = snapshot(out)
    line = error_line(factory(*SMALL, "model.bundle.init_seed=5", "stage=data", f"out_dir={out}"))
    assert "holds drafter training sequences made for other inputs" in line and "target" in line
    assert snapshot(out) == before
    shard = out / "data" / "shard_00001.safetensors"
    shard.write_bytes(shard.read_bytes()[:100])
    line = error_line(factory(*SMALL, f"out_dir={out}"))
    assert "shard_00001.safetensors" in line and "cut short or altered" in line
    assert (out / "data" / "shard_00002.safetensors").is_file() and not (out / "features").exists()


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("stage=fit", "error: stage='fit': expected one of data, features, train, export, all"),
        ("data=pictures", "error: data='pictures': expected one of self, images"),
        ("features.dtype=int8", "error: features.dtype='int8': expected one of float16, bfloat16, float32"),
        ("held_out=1", "error: held_out=1: expected a number in (0, 1)"),
        ("num_samples=1", "error: num_samples=1: expected an integer >= 2"),
    ],
)
def test_bad_values_are_one_line_before_any_work(tmp_path, override, expected):
    out = tmp_path / "f"
    assert error_line(factory(override, f"out_dir={out}")) == expected
    assert not out.exists()


def test_an_unknown_model_is_one_line(tmp_path):
    line = error_line(factory("model=nope", f"out_dir={tmp_path / 'f'}"))
    assert "model=nope" in line and "tiny_random_c2i" in line


def kill_when(path: Path, args: list[str], out: Path) -> None:
    """Start the script, kill -9 it as soon as ``path`` exists (or it ends), and wait."""
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "scripts" / "train_drafter.py"), *TINY, *args, f"out_dir={out}"],
        cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and not path.is_file():
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.mark.parametrize(
    "stage", ["data", pytest.param("features", marks=pytest.mark.slow)]
)  # one in the default suite
def test_kill_during_a_stage_resumes_to_the_same_rows(tmp_path, stage):
    args = ["num_samples=48", "generation.batch_size=4", "features.batch_size=4"]
    whole = tmp_path / "whole"
    for name in ("data", "features")[: 1 + (stage == "features")]:
        assert factory(*args, f"stage={name}", f"out_dir={whole}").returncode == 0
    out = tmp_path / "killed"
    if stage == "features":
        shutil.copytree(whole / "data", out / "data")
    kill_when(out / stage / "index.json", [*args, f"stage={stage}"], out)
    assert factory(*args, f"stage={stage}", f"out_dir={out}").returncode == 0
    assert snapshot(out / stage) == snapshot(whole / stage)


def test_images_data_tokenises_class_folders(tmp_path):
    root = tmp_path / "classes"
    for label, colour in enumerate(["red", "blue", "green"]):
        (root / f"n0{label}").mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (40 + 8 * i, 36), colour).save(root / f"n0{label}" / f"{i}.png")
    out = tmp_path / "f"
    proc = factory(
        "data=images",
        f"data_root={root}",
        "num_samples=null",
        "generation.batch_size=4",
        "stage=data",
        f"out_dir={out}",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    from lantern.training.shards import ShardStore

    key = json.loads((out / "data" / "index.json").read_text())["key"]
    rows = ShardStore(out / "data", key, "data").read(torch.arange(9))
    assert rows["prompt"].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert rows["codes"].shape == (9, 16) and len({tuple(r) for r in rows["codes"].tolist()}) >= 2
    table = json.loads((out / "data" / "prompts.json").read_text())
    assert table == {"kind": "class", "items": [0, 1, 2], "digest": table["digest"]}
    line = error_line(
        factory("data=images", f"data_root={tmp_path / 'none'}", "stage=data", f"out_dir={tmp_path / 'g'}")
    )
    assert "not a folder" in line


@pytest.mark.slow  # ~16 s; tests/test_distributed.py keeps torchrun in the default suite
def test_torchrun_training_equals_one_process(tmp_path):
    """DDP over 2 processes with the same global batch == one process, to reduction-order noise."""
    one = tmp_path / "one"
    for stage in ("data", "features"):
        assert factory(*SMALL, "steps=8", f"stage={stage}", f"out_dir={one}").returncode == 0
    two = tmp_path / "two"
    shutil.copytree(one, two)
    assert factory(*SMALL, "steps=8", "stage=train", f"out_dir={one}").returncode == 0
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(REPO / "scripts" / "train_drafter.py"), *TINY, *SMALL, "steps=8", "stage=train", f"out_dir={two}"],
        cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The fp32 training states (the exported files are fp16, whose rounding would hide the comparison).
    a, b = (torch.load(d / "train" / "checkpoint.pt", weights_only=True)["model"] for d in (one, two))
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst < 1e-5, worst
    logs = [json.loads(line) for line in (two / "train" / "log.jsonl").read_text().splitlines()]
    assert logs[-1]["step"] == 8


def test_a_second_writer_is_refused(tmp_path):
    from lantern.run.lock import FolderLock

    out = tmp_path / "f"
    with FolderLock(out):
        line = error_line(factory(*SMALL, f"out_dir={out}"))
    assert "is being written by another process" in line
    assert sorted(p.name for p in out.iterdir()) == [".lock"]


def test_images_data_reads_a_caption_file_for_a_text_target(tmp_path):
    root = tmp_path / "images"
    root.mkdir()
    lines = []
    for i, (colour, caption) in enumerate(
        [("white", "a white shirt"), ("black", "a black boot"), ("grey", "a white shirt")]
    ):
        Image.new("RGB", (28, 28), colour).save(root / f"{i}.png")
        lines.append(f"{i}.png\t{caption}")
    captions = tmp_path / "captions.tsv"
    captions.write_text("\n".join(lines) + "\n")
    out = tmp_path / "f"
    world = ["model=fashion_t2i", "num_threads=1", "progress=false"]
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "train_drafter.py"), *world, "data=images", f"data_root={root}",
         f"captions={captions}", "num_samples=null", "stage=data", f"out_dir={out}"],
        cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = json.loads((out / "data" / "prompts.json").read_text())
    assert table == {"kind": "text", "items": ["a white shirt", "a black boot"], "digest": table["digest"]}
    from lantern.training.shards import ShardStore

    key = json.loads((out / "data" / "index.json").read_text())["key"]
    rows = ShardStore(out / "data", key, "data").read(torch.arange(3))
    assert rows["prompt"].tolist() == [0, 1, 0] and rows["codes"].shape == (3, 64)
    bad = tmp_path / "bad.tsv"
    bad.write_text("0.png a caption without a tab\n")
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "train_drafter.py"), *world, "data=images", f"data_root={root}",
         f"captions={bad}", "stage=data", f"out_dir={tmp_path / 'g'}"],
        cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert "bad.tsv:1: expected `relative/path<TAB>caption`" in error_line(proc)
    assert not (tmp_path / "g").exists()


def test_an_eagle3_drafter_exports_with_its_taps_and_decodes_losslessly(tmp_path):
    out = tmp_path / "f"
    proc = factory(*SMALL, "drafter=eagle3", "drafter.ttt_steps=2", f"out_dir={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = json.loads((out / "drafter" / "config.json").read_text())
    assert config["lantern_taps"] == [1]  # GPT-nano has 2 layers: the input of layer 1
    assert (out / "features_taps-1").is_dir() and not (out / "features").exists()
    report = json.loads((out / "report.json").read_text())
    assert report["drafter_config"]["kind"] == "eagle3" and report["drafter_config"]["taps"] == [1]
    ar, ar_png = run_images(tmp_path, "ar", "decoding=ar", "temperature=0")
    _, eagle_png = run_images(
        tmp_path, "e3", "temperature=0", "decoding=eagle", f"model.drafter_ckpt={out / 'drafter'}"
    )
    assert eagle_png == ar_png
    line = error_line(factory(*SMALL, "drafter=eagle3", "drafter.taps=[5]", f"out_dir={tmp_path / 'g'}"))
    assert "drafter.taps=[5]: expected distinct layer indices in [1, 1]" in line


def test_a_target_without_teacher_states_is_refused():
    from lantern.errors import ConfigError
    from lantern.training.drafter_features import check_target

    class Opaque:  # a family that gives logits only
        config = None

    with pytest.raises(ConfigError, match="gives no teacher-forced hidden states"):
        check_target(Opaque(), "model=opaque")


def test_an_unfinished_training_is_not_exported_and_ttt_is_bounded(tmp_path):
    out = tmp_path / "f"
    assert factory(*SMALL, f"out_dir={out}").returncode == 0  # steps=6, exported
    before = {p: p.read_bytes() if p.is_file() else None for p in sorted(out.rglob("*"))}  # .lock included
    line = error_line(factory(*SMALL, "steps=9", "stage=export", f"out_dir={out}"))
    assert "holds the weights of step 6, not of steps=9" in line
    assert {p: p.read_bytes() if p.is_file() else None for p in sorted(out.rglob("*"))} == before  # no file changed
    line = error_line(factory(*SMALL, "lr=0.001", "stage=train", f"out_dir={out}"))  # a resume under another lr
    assert "checkpoint.pt' was written with a different config (lr: 0.003 -> 0.001)" in line
    assert {p: p.read_bytes() if p.is_file() else None for p in sorted(out.rglob("*"))} == before  # refused unlocked
    line = error_line(factory(*SMALL, "drafter=eagle3", "drafter.ttt_steps=16", f"out_dir={tmp_path / 'g'}"))
    assert line == "error: drafter.ttt_steps=16: expected an integer <= 15 (image tokens - 1)"
    assert not (tmp_path / "g").exists()
