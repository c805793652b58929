"""scripts/frontier_world.sh on the entry points' contract (issue 56, item 6): bad arguments are one ``error:``
line, exit 2, nothing written and no Hydra warning; a good folder reaches every sweep whole (quoted for Hydra)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "frontier_world.sh"


def frontier(cwd: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize(
    "args,expected",
    [
        ((), "expected OUT_DIR and an optional TABLE_DIR, got 0 arguments"),
        (("out", "tables", "more"), "got 3 arguments"),
        (("a_file",), "OUT_DIR='a_file': a_file is a file; expected a folder"),
        (("a_file/below",), "OUT_DIR='a_file/below': a_file is a file"),
        (("out", "a_file"), "TABLE_DIR='a_file': a_file is a file"),
        (("",), "OUT_DIR='': expected a folder"),
        (("out${x}",), "expected a path without"),
    ],
    ids=["none", "three", "file", "under-a-file", "table-file", "empty", "interpolation"],
)
def test_bad_arguments_are_one_error_line_exit_2_and_nothing_written(tmp_path, args, expected):
    (tmp_path / "a_file").write_text("not a folder")
    before = listing(tmp_path)
    proc = frontier(tmp_path, *args)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert expected in lines[0] and proc.stdout == "", lines[0]
    assert listing(tmp_path) == before


def test_a_good_folder_reaches_every_sweep_whole(tmp_path):
    """``python`` replaced by a recorder: each sweep's ``hydra.sweep.dir`` parses back to the folder, commas
    and spaces included, and make_tables gets the absolute folders."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls"
    recorder = bin_dir / "python"
    recorder.write_text(f'#!/bin/sh\nfor a in "$@"; do printf "%s\\0" "$a" >> {log}; done\nprintf "\\n\\0" >> {log}\n')
    recorder.chmod(0o755)
    out = tmp_path / "it's a, b"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    proc = frontier(tmp_path, "it's a, b", env=env)
    assert proc.returncode == 0, proc.stderr
    calls = [call.strip("\0").split("\0") for call in log.read_text().split("\n\0") if call.strip("\0")]
    sweeps = [call for call in calls if call[0] == "run.py"]
    assert len(sweeps) == 2 and calls[-1][:2] == ["scripts/make_tables.py", str(out)]  # AR, +experiment=frontier
    assert "+experiment=frontier" in sweeps[1] and "tv_audit.images=null" in sweeps[1]
    parser = OverridesParser.create()
    for call in sweeps:
        given = next(a for a in call if a.startswith("hydra.sweep.dir="))
        override = parser.parse_override(given)
        assert not override.is_sweep_override() and Path(override.value()).parent == out, given


def test_run_py_with_a_file_as_its_sweep_folder_is_one_line_without_a_hydra_warning(tmp_path):
    (tmp_path / "a_file").write_text("not a folder")
    command = [sys.executable, "run.py", "-m", "model=tiny_random_c2i", "decoding=ar", "seed=0,1"]
    command += ["wandb.mode=disabled", f"hydra.sweep.dir={tmp_path / 'a_file' / 'sweep'}"]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Not a directory" in lines[0] and "a_file" in lines[0]


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("IMAGES", "0", "IMAGES='0': expected an integer in [1, 100000]"),
        ("WARMUP", "x", "WARMUP='x': expected an integer in [0, 100000]"),
        ("AUDIT_RERUNS", "2", "AUDIT_RERUNS='2': expected an integer in [4, 100000]"),
        ("AUDIT_RERUNS", "129", "AUDIT_RERUNS='129': expected an even integer"),
        ("AUDIT_IMAGES", "-1", "AUDIT_IMAGES='-1': expected an integer in [1, 100000]"),
    ],
)
def test_bad_sizes_are_one_error_line_exit_2_and_nothing_written(tmp_path, variable, value, expected):
    before = listing(tmp_path)
    proc = frontier(tmp_path, "out", env={**os.environ, variable: value})
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and expected in lines[0], proc.stderr
    assert listing(tmp_path) == before
