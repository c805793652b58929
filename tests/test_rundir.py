"""One writer per run folder, and resume after any stop (Ctrl-C, kill -9) with byte-identical images."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import BASE, IMAGES, REPO, finish, start, uninterrupted_run, wait_for

from lantern.run.lock import FolderLock
from lantern.run.rundir import first_difference


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run of the configuration the tests interrupt."""
    return uninterrupted_run(tmp_path_factory)


def snapshot(folder: Path) -> dict:
    """Every file's (mtime, bytes) but the lock file's (each writer notes its pid there)."""
    return {
        p.relative_to(folder).as_posix(): (p.stat().st_mtime_ns, p.read_bytes())
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


def test_ctrl_c_then_kill_9_then_rerun_gives_the_uninterrupted_images_without_redoing_finished_ones(
    tmp_path, reference
):
    out = tmp_path / "run"
    first = start(out)
    wait_for(out / "000002.png", first)
    first.send_signal(signal.SIGINT)
    _, stderr = first.communicate(timeout=60)
    assert first.returncode == 130, stderr
    lines = [line for line in stderr.splitlines() if line.strip() and "batch/s" not in line and "%|" not in line]
    assert lines == [f"interrupted by Ctrl-C; finished images in {out} are kept, rerun the same command to resume"], (
        stderr
    )
    assert not (out / "metrics.json").exists() and (out / "run_config.json").is_file()

    second = start(out)
    wait_for(out / f"{len(list(out.glob('0*.png'))) + 2:06d}.png", second)
    kept = {name: entry for name, entry in snapshot(out).items() if name.endswith(".png")}
    second.send_signal(signal.SIGKILL)
    second.wait(timeout=60)
    assert not (out / "metrics.json").exists()

    third = finish(out)
    assert third.returncode == 0, third.stderr
    record = json.loads((out / "metrics.json").read_text())
    decoded = record["timing"]["images_decoded"]
    assert record["timing"]["images_kept"] == IMAGES - decoded >= len(kept) > 0  # a PNG is written after its tokens
    assert "kept, untimed" in record["timing"]["covers"] and record["latency_s_per_image"] > 0
    assert sum(row["latency_s"] is None for row in record["per_image"]) == IMAGES - decoded
    after = snapshot(out)
    redone = [name for name, entry in kept.items() if after[name][0] != entry[0]]
    assert not redone, f"finished images were redone: {redone}"
    for index in range(IMAGES):
        name = f"{index:06d}.png"
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name
    assert (out / "grid.png").read_bytes() == (reference / "grid.png").read_bytes()
    assert not [p for p in out.rglob("*.tmp")], "a killed writer's temporary file was left behind"
    ref = json.loads((reference / "metrics.json").read_text())
    assert [r["steps"] if "steps" in r else None for r in record["per_image"]] == [
        r["steps"] if "steps" in r else None for r in ref["per_image"]
    ]


def test_a_finished_run_is_skipped_and_a_changed_config_is_refused(tmp_path, reference):
    before = snapshot(reference)
    again = finish(reference)
    assert again.returncode == 0 and "already finished" in again.stdout, again.stderr
    changed = finish(reference, "seed=1")
    lines = [line for line in changed.stderr.splitlines() if line.strip()]
    assert changed.returncode == 2 and len(lines) == 1, changed.stderr
    assert lines[0] == (
        f"error: run folder '{reference}' holds a finished run with another config (seed: 0 -> 1); "
        "rerun with the same config to resume, or choose another folder"
    )
    assert snapshot(reference) == before


def test_a_second_writer_is_refused_and_changes_nothing(tmp_path):
    out = tmp_path / "run"
    (out / "tokens").mkdir(parents=True)
    (out / "run_config.json").write_text("{}")
    before = snapshot(out)
    with FolderLock(out):  # this test process is the live writer
        proc = finish(out)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert (
        lines[0].startswith(f"error: run folder '{out}' is being written by another process (")
        and f"pid {os.getpid()}" in lines[0]
    )
    assert snapshot(out) == before


@pytest.mark.slow  # the default suite checks the refusal against a live lock holder (the test above)
def test_two_concurrent_runs_into_one_folder_never_mix(tmp_path):
    out = tmp_path / "run"
    first = start(out, "num_images=200")
    wait_for(out / "000001.png", first)
    second = finish(out, "num_images=200", "seed=1")
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=60)
    assert second.returncode == 2 and "is being written by another process" in second.stderr, second.stderr
    assert json.loads((out / "run_config.json").read_text())["seed"] == 0


def test_bad_input_into_a_new_folder_leaves_no_folder(tmp_path):
    proc = finish(tmp_path / "run", "top_p=1.5")
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and not (tmp_path / "run").exists()


def test_first_difference_names_the_dotted_key():
    assert first_difference({"a": {"b": 1, "c": 2}}, {"a": {"b": 1, "c": 3}}) == "a.c: 2 -> 3"
    assert first_difference({"a": 1}, {"a": 1, "b": 2}) == "b: '<absent>' -> 2"
    assert first_difference({"a": [1, 2]}, {"a": [1, 2]}) is None


@pytest.mark.slow  # ~45 s; the single-run Ctrl-C / kill -9 resume test above stays in the default suite
def test_a_sweep_killed_midway_resumes_without_redoing_finished_jobs_or_images(tmp_path):
    sweep = tmp_path / "sweep"
    command = [sys.executable, "run.py", "-m", *BASE, "seed=0,1", f"hydra.sweep.dir={sweep}"]
    first = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(sweep / "1" / "000002.png", first)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=60)
    assert (sweep / "0" / "metrics.json").is_file() and not (sweep / "1" / "metrics.json").exists()
    done = snapshot(sweep / "0")
    kept = {name: entry for name, entry in snapshot(sweep / "1").items() if name.endswith(".png")}
    again = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "already finished" in again.stdout and snapshot(sweep / "0") == done
    after = snapshot(sweep / "1")
    assert all(after[name][0] == entry[0] for name, entry in kept.items()), "finished images were redone"
    record = json.loads((sweep / "1" / "metrics.json").read_text())
    assert record["seed"] == 1 and record["timing"]["images_kept"] >= len(kept)
    table = json.loads((sweep / "table.json").read_text())
    assert [row["method"] for row in table["rows"]] == ["AR [seed=0]", "AR [seed=1]"] and not table["failed"]
