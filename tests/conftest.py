import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
KEYS_DIR = REPO.parent / "shared" / "llamagen_keys"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
# Tests get their own cache (paths.cache: neighbour tables, FID statistics), never the real runs' one.
_CACHE = tempfile.mkdtemp(prefix="lantern-test-cache-")
os.environ["LANTERN_CACHE"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
# The libraries' caches too (a run in this process would point them at its paths.cache, a test's temporary folder).
for _variable in ("WANDB_CACHE_DIR", "WANDB_DATA_DIR", "MPLCONFIGDIR"):
    os.environ.setdefault(_variable, os.path.join(_CACHE, _variable.lower()))
# Test models are tiny: one thread is fastest, and two oversubscribe a busy 2-core machine. The suite runs
# on pytest-xdist workers (pyproject's addopts), so the run.py and script subprocesses the tests start get one
# OpenMP thread too: two workers' subprocesses with two spinning threads each on 2 cores ran 3-4x slower.
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")


def read_layout(name: str) -> list[tuple[str, tuple[int, ...]]]:
    """Rows (name, shape) of an official checkpoint layout from shared/llamagen_keys."""
    path = KEYS_DIR / name
    if not path.is_file():
        pytest.skip(f"official layout {path} is not available in this checkout")
    rows = []
    for line in path.read_text().splitlines():
        key, shape, _ = line.split("\t")
        rows.append((key, tuple(int(s) for s in shape.split(","))))
    return rows


@pytest.fixture(autouse=True)
def _hash_cache_folder():
    """A run in this process keeps its sha256 cache in its paths.cache; the next test starts from the default."""
    yield
    from lantern.files import use_hash_cache_folder

    use_hash_cache_folder(None)
