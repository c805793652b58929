"""Hardening 2: derived caches carry their own digest; entry points refuse bad input before any work.

Each refusal: one ``error:`` line, exit 2, and the tree as it was (snapshot before/after, ``.lock`` included).
The FID statistics, features and sha256 caches are tested beside their code (test_fid.py,
test_metric_features.py, test_provenance.py); the training caches here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lantern.training import drafter_data
from lantern.training.fashion import tokenize

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}


def tree(folder: Path) -> dict:
    """Every path under ``folder`` with its bytes (folders as None): what a refusal must leave as it was."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))}


def script(name: str, *args: str, cwd: Path = REPO, **kwargs) -> subprocess.CompletedProcess:
    """``python scripts/NAME ARGS`` run from ``cwd`` (``kwargs``: more of :func:`subprocess.run`'s)."""
    command = [sys.executable, str(REPO / "scripts" / name), *args]
    return subprocess.run(command, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=300, **kwargs)


def refused(proc: subprocess.CompletedProcess) -> str:
    """The one ``error:`` line of a refusal (exit 2, no traceback)."""
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
    return lines[0]


# -- caches ------------------------------------------------------------------------------------------------


class CountingVQ:
    """Codes = the first pixels of each image: enough to tell a recomputation from a cached read."""

    def __init__(self) -> None:
        self.calls = 0

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return (images[:, 0, :2, :2] * 10).round().long()  # (B, 2, 2)


def test_altered_token_codes_are_recomputed_with_one_line(tmp_path, capsys):
    dataset = [torch.rand(1, 4, 4) for _ in range(5)]
    vq, cache = CountingVQ(), tmp_path / "codes.pt"
    clean = tokenize(vq, dataset, cache, "a" * 64, batch=2, progress=False)
    assert tokenize(vq, dataset, cache, "a" * 64, batch=2, progress=False).equal(clean) and vq.calls == 3
    saved = torch.load(cache, weights_only=True)
    torch.save({**saved, "codes": saved["codes"] + 1}, cache)  # tampered, hash and digest kept
    capsys.readouterr()
    assert tokenize(vq, dataset, cache, "a" * 64, batch=2, progress=False).equal(clean) and vq.calls == 6
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "does not match the digest" in lines[0] and "codes.pt" in lines[0]
    assert tokenize(vq, dataset, cache, "a" * 64, batch=2, progress=False).equal(clean) and vq.calls == 6
    assert not capsys.readouterr().err


def test_an_altered_prompt_table_is_written_again_and_not_used(tmp_path, capsys):
    prompts = ["a white shirt", "a black boot"]
    drafter_data.write_prompts(tmp_path, "text", prompts)
    assert drafter_data.read_prompts(tmp_path, "text", prompts) == prompts and not capsys.readouterr().err
    path = tmp_path / drafter_data.PROMPTS_NAME
    saved = json.loads(path.read_text())
    path.write_text(json.dumps({**saved, "items": ["a red dress", "a black boot"]}))  # digest kept
    assert drafter_data.read_prompts(tmp_path, "text", prompts) == prompts
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "does not match the digest" in lines[0]
    assert json.loads(path.read_text())["items"] == prompts  # written again from the data's own prompts
    assert drafter_data.read_prompts(tmp_path, "text", prompts) == prompts and not capsys.readouterr().err


# -- training and export: refused before anything is made ---------------------------------------------------

TINY = ["model=tiny_random_c2i", "num_threads=1", "progress=false"]
SMALL = ["num_samples=24", "generation.batch_size=8", "features.batch_size=8", "batch_size=4", "steps=6"]


@pytest.mark.parametrize(
    ("name", "shown"), [("../../../../../x", "'../../../../../x'"), ("/tmp/elsewhere", "'/tmp/elsewhere'")]
)
def test_train_drafter_refuses_a_model_name_that_leaves_its_folder(tmp_path, name, shown):
    deep = tmp_path / "a" / "b" / "c" / "d"
    deep.mkdir(parents=True)
    before = tree(tmp_path)
    line = refused(script("train_drafter.py", *TINY, f"paths.outputs={deep / 'out'}", f"model.name={name}", cwd=deep))
    assert line.startswith(f"error: model.name={shown}: expected a plain name")
    assert tree(tmp_path) == before


def test_train_drafter_stage_train_on_an_empty_folder_leaves_nothing(tmp_path):
    (tmp_path / "empty").mkdir()
    before = tree(tmp_path)
    for out in (tmp_path / "new" / "f", tmp_path / "empty"):
        line = refused(script("train_drafter.py", *TINY, *SMALL, "stage=train", f"out_dir={out}"))
        assert "holds 0 of 24 rows: run stage=features" in line
    assert tree(tmp_path) == before  # no folder, no .lock; the existing empty folder stays as it was


def test_train_drafter_refuses_a_pickled_compare_with_at_the_start(tmp_path):
    import argparse

    pickle = tmp_path / "drafter.pt"
    torch.save({"model": argparse.Namespace(code="anything")}, pickle)  # not loadable with weights_only
    before = tree(tmp_path)
    out = tmp_path / "f"
    proc = script("train_drafter.py", *TINY, *SMALL, f"compare_with={pickle}", f"out_dir={out}")
    line = refused(proc)
    assert "drafter.pt" in line and "a pickle can run code" in line
    assert tree(tmp_path) == before and "self-distilled" not in proc.stderr  # no data made before the refusal


def test_export_hf_refuses_a_bad_part_and_leaves_nothing(tmp_path):
    before = tree(tmp_path)
    line = refused(script("export_hf.py", f"out_dir={tmp_path / 'p' / 'q'}", "parts=[../../x]"))
    assert line == "error: parts='../../x': expected one of target, drafter"
    assert tree(tmp_path) == before
    assert refused(script("export_hf.py", cwd=tmp_path)).startswith("error: out_dir is required")
    assert tree(tmp_path) == before


def test_export_hf_on_a_full_disk_is_one_line_and_nothing_half_written(tmp_path):
    import resource

    def small_files():  # every file over 200 kB fails as on a full disk (EFBIG; Python ignores SIGXFSZ)
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))

    out = tmp_path / "e" / "f"
    line = refused(script("export_hf.py", *TINY[:1], f"out_dir={out}", preexec_fn=small_files))
    assert line.startswith("error: File too large: ") and str(out) in line
    assert line.endswith("; free some space or write elsewhere (out_dir=DIR)")  # export_hf's knob, not run.py's
    assert not (tmp_path / "e").exists()  # no partial folder, no staging folder, no empty parents


# -- make_tables: every combination of protocol, none and subset -------------------------------------------

PROTOCOLS = {  # run -> the record's protocol fields
    "full": {"protocol": "world", "protocol_sha256": "a" * 64, "protocol_subset": False},
    "subset": {"protocol": "world", "protocol_sha256": "a" * 64, "protocol_subset": True},
    "none": {"protocol": None},
}


@pytest.mark.parametrize("latency", [False, True])
def test_make_tables_renders_runs_with_a_protocol_without_one_and_on_a_subset(tmp_path, latency):
    from helpers_tables import AR, record, tree

    quality, timed = tmp_path / "quality", tmp_path / "latency"
    quality.mkdir(), timed.mkdir()
    for i, (name, fields) in enumerate(PROTOCOLS.items()):
        settings = tree("lantern", k=1000, delta=(0.1, 0.2, 0.4)[i])
        record(quality, f"ar_{name}", AR, latency_s_per_image=0.1, schema_version=3, **fields)
        record(quality, f"l_{name}", settings, latency_s_per_image=0.05, schema_version=3, **fields)
        record(timed, f"l_{name}", settings, latency_s_per_image=0.5, batch_size=1, schema_version=3, **fields)
    out = tmp_path / "tables"
    args = [str(quality), "--out", str(out), *(["--latency", str(timed)] if latency else [])]
    proc = subprocess.run(
        [sys.executable, "scripts/make_tables.py", *args],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads((out / "table.json").read_text())["rows"]
    cells = {Path(row["run"]).name: row for row in rows}
    assert sorted(cells) == sorted(f"{kind}_{name}" for kind in ("ar", "l") for name in PROTOCOLS)
    markdown = (out / "table.md").read_text()
    for name, fields in PROTOCOLS.items():
        shown = {"full": "| world |", "subset": "| world (subset) |", "none": "| - |"}[name]
        line = next(line for line in markdown.splitlines() if f"quality/l_{name} |" in re.sub(" +", " ", line))
        assert shown in re.sub(" +", " ", line), line
        assert cells[f"l_{name}"]["protocol"] == fields["protocol"]
    assert (out / "table.tex").is_file() and (out / "table.csv").is_file()


# -- torchrun: the workers die with their launcher ---------------------------------------------------------


def _processes_naming(text: str) -> list[int]:
    """Live (not zombie) processes whose command line contains ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(int(entry.name))
        except (OSError, ValueError):
            continue
    return found


def _torchrun_train(out: Path, steps: int) -> subprocess.Popen:
    args = [*TINY, *SMALL[:-1], f"steps={steps}", "ckpt_every=4", "stage=train", f"out_dir={out}"]
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(REPO / "scripts" / "train_drafter.py"), *args],
        cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="finds the workers through /proc")
def test_killing_torchrun_kills_its_workers_and_the_rerun_resumes_bit_identically(tmp_path):
    import shutil
    import signal
    import time

    from safetensors.torch import load_file

    # Enough steps that the workers cannot finish in the launcher watch's poll interval after the first checkpoint
    # (tiny steps take milliseconds; at 40 a loaded machine saw the run end before its workers noticed the kill).
    whole, killed, steps = tmp_path / "whole", tmp_path / "killed", 400
    for stage in ("data", "features"):
        assert script("train_drafter.py", *TINY, *SMALL, f"stage={stage}", f"out_dir={whole}").returncode == 0
    shutil.copytree(whole, killed)
    launcher = _torchrun_train(killed, steps)
    deadline = time.monotonic() + 240
    while (
        launcher.poll() is None and not (killed / "train" / "checkpoint.pt").is_file() and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    workers = [pid for pid in _processes_naming(str(killed)) if pid != launcher.pid]
    assert launcher.poll() is None and len(workers) == 2, "training ended before the kill; raise steps"
    os.kill(launcher.pid, signal.SIGKILL)  # the launcher alone: its workers are in sessions of their own
    launcher.wait()
    deadline = time.monotonic() + 30
    while [pid for pid in workers if pid in _processes_naming(str(killed))] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in workers if pid in _processes_naming(str(killed))], "a worker outlived torchrun"
    stopped = torch.load(killed / "train" / "checkpoint.pt", weights_only=True)["step"]
    assert 0 < stopped < steps

    for out in (killed, whole):  # resumed after the kill; uninterrupted
        run = _torchrun_train(out, steps)
        _, err = run.communicate(timeout=300)
        assert run.returncode == 0, err[-2000:]
    a, b = (torch.load(d / "train" / "checkpoint.pt", weights_only=True)["model"] for d in (killed, whole))
    assert all(torch.equal(a[k], b[k]) for k in a)
    a, b = (load_file(str(d / "train" / "drafter.safetensors")) for d in (killed, whole))
    assert all(torch.equal(a[k], b[k]) for k in a)


# -- knobs that set work, and W&B names: refused before any work --------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["wandb.mode=offline", "wandb.project=a/b"], "error: wandb.project='a/b': expected a W&B project name"),
        (["wandb.mode=offline", f"wandb.project={'p' * 129}"], "expected a W&B project name of 1 to 128 characters"),
        (["wandb.mode=offline", "wandb.project=what?"], "error: wandb.project='what?': expected a W&B project name"),
    ],
)
def test_run_refuses_a_w_and_b_name_before_any_work(tmp_path, monkeypatch, overrides, expected):
    from helpers import run_in_process

    out = tmp_path / "run"
    status, stdout, stderr = run_in_process(overrides, out, monkeypatch)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert status == 2 and len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], stderr
    assert stdout == "" and not out.exists()


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            "metrics.clip.interval_resamples=1000000000000",
            "error: metrics.clip.interval_resamples=1000000000000: expected an integer in [2, 10000] or null",
        ),
        (
            "metrics.fid.interval_resamples=20000",
            "error: metrics.fid.interval_resamples=20000: expected an integer in [2, 10000] or null",
        ),
    ],
)
def test_the_world_s_metrics_refuse_an_unbounded_resample_count_before_any_work(tmp_path, override, expected):
    """The issue's command ran past 10 minutes; now it is refused before a model is loaded."""
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "run.py", "metrics=world", override, "num_images=2", "batch_size=2",
         "speedup_baseline=null", "wandb.mode=disabled", f"hydra.run.dir={out}"],
        cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert refused(proc) == expected and proc.stdout == ""
    assert not out.exists()


def test_w_and_b_names_are_checked_where_the_tracker_is_built(monkeypatch):
    from lantern.errors import ConfigError
    from lantern.run.tracking import WandbLogger, check_tracker

    WandbLogger(mode="offline", project="lantern paper", entity="my-team")  # spaces are allowed in a project
    with pytest.raises(ConfigError, match=r"^wandb.entity='my team': expected a W&B entity name"):
        WandbLogger(mode="offline", entity="my team")
    monkeypatch.setenv("WANDB_ENTITY", "a:b")
    with pytest.raises(ConfigError, match=r"^WANDB_ENTITY='a:b': expected a W&B entity name"):
        check_tracker({"_target_": "lantern.run.tracking.WandbLogger", "mode": "disabled", "project": "p"})
    check_tracker({"_target_": "some.OtherTracker", "project": "a/b"})  # not ours to judge
