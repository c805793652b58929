"""Fault injection: kill -9 at several points, damaged files of finished images, a full disk, a held lock.

Every case ends in a rerun of the same command and compares its folder with an uninterrupted run of the
same configuration: the images must be the same files, byte for byte.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

# IMAGES, BASE and the uninterrupted run (`clean` below) are test_rundir's: the tiny model at batch 1
from helpers import IMAGES, REPO, finish, start, uninterrupted_run, wait_for


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run of the configuration the tests interrupt."""
    return uninterrupted_run(tmp_path_factory)


@pytest.fixture(scope="module")
def clean(reference):  # noqa: F811 (the imported fixture, requested by name)
    """test_rundir's uninterrupted run of the configuration every test here damages (read, never changed)."""
    return reference


def same_images(out: Path, clean: Path) -> None:
    for index in range(IMAGES):
        name = f"{index:06d}.png"
        assert (out / name).read_bytes() == (clean / name).read_bytes(), name
    steps = [row.get("steps") for row in json.loads((out / "metrics.json").read_text())["per_image"]]
    assert steps == [row.get("steps") for row in json.loads((clean / "metrics.json").read_text())["per_image"]]
    assert not list(out.rglob("*.tmp"))


@pytest.mark.parametrize(
    "point",
    [
        "tokens/000003.pt",  # mid-image: the default suite keeps this one
        pytest.param("run_config.json", marks=pytest.mark.slow),
        pytest.param("000020.png", marks=pytest.mark.slow),
    ],
)
def test_a_kill_9_at_any_point_then_a_rerun_ends_as_the_clean_run(tmp_path, clean, point):
    out = tmp_path / "run"
    proc = start(out)
    wait_for(out / point, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    rerun = finish(out)
    assert rerun.returncode == 0, rerun.stderr
    same_images(out, clean)


def test_damaged_files_of_finished_images_are_decoded_again_never_a_crash_at_the_end(tmp_path, clean):
    out = tmp_path / "run"
    shutil.copytree(clean, out)
    (out / "metrics.json").unlink()  # as a run killed after its images, before its record
    (out / "grid.png").unlink()
    truncated = out / "tokens" / "000002.pt"
    truncated.write_bytes(truncated.read_bytes()[:100])
    (out / "tokens" / "000005.pt").write_bytes(b"not a tokens file")
    (out / "000007.png").write_bytes((out / "000008.png").read_bytes())  # a PNG that is not its tokens' image
    (out / "000009.png").write_bytes(b"")
    rerun = finish(out)
    assert rerun.returncode == 0, rerun.stderr
    notice = [line for line in rerun.stderr.splitlines() if "failed their check" in line]
    assert notice and notice[0].startswith("4 stored image(s) failed their check and are decoded again"), rerun.stderr
    assert "000002.png: tokens file unreadable" in notice[0]
    record = json.loads((out / "metrics.json").read_text())
    assert record["timing"]["images_decoded"] == 4
    same_images(out, clean)


def test_a_finished_run_is_reported_without_taking_its_lock(tmp_path, clean):
    from lantern.run.lock import FolderLock

    with FolderLock(clean, what="run folder"):  # another reader or a stuck writer holds it
        again = finish(clean)
    assert again.returncode == 0 and "already finished" in again.stdout, again.stderr


def _capped(limit: int):
    def cap():
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return cap


def test_a_full_disk_while_saving_tokens_is_an_oserror_naming_the_file(tmp_path):
    """torch's own writer reports a full disk as a C++ iostream error; the image store's is an OSError."""
    script = (
        "import sys, numpy as np, torch\n"
        "from lantern.run.rundir import ImageStore\n"
        "from lantern.errors import user_message\n"
        f"store = ImageStore({str(tmp_path)!r})\n"
        "try:\n"
        "    store.save(0, np.zeros((8, 8, 3), np.uint8), torch.arange(4096), {'steps': torch.tensor(3)})\n"
        "except OSError as exc:\n"
        "    print(user_message(exc))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120, preexec_fn=_capped(8192)
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("File too large: ") and "000000.pt" in proc.stdout, proc.stdout
    assert not list(tmp_path.rglob("*.pt")) and not list(tmp_path.rglob("*.png")) and not list(tmp_path.rglob("*.tmp"))


def test_make_tables_on_a_full_disk_writes_none_of_its_files(tmp_path, clean):
    out = tmp_path / "tables"
    out.mkdir()
    # matplotlib's font cache is built on a fresh machine's first import; build it before the cap, so
    # the capped run reports only its own files.
    env = {**os.environ, "MPLCONFIGDIR": str(tmp_path / "mpl")}
    subprocess.run([sys.executable, "-c", "import matplotlib.font_manager"], env=env, check=True, timeout=300)
    proc = subprocess.run(
        [sys.executable, "scripts/make_tables.py", str(clean), "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_capped(2048),
        env=env,
    )
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(errors) == 1 and errors[0].startswith("error: File too large"), proc.stderr
    assert list(out.iterdir()) == []
