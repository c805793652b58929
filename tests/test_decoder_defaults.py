"""Every decoder with its defaults on every tiny model preset: a record, or (where a decoder cannot run on a
family by design) one ``error:`` line from the preflight, exit 2 and no folder.

Each run is ``python run.py model=PRESET decoding=DECODER`` with nothing else changed but the run's size
(one image, batch 1, no metrics, no AR baseline, W&B off), so a default that does not fit a model (ZipAR's
window on the world was one) fails here. The runs go through run.py in this process (:func:`runpy.run_path`).
The default suite runs every decoder on the world and every preset with LANTERN (the default decoder); the
full product is ``slow``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import run_in_process

REPO = Path(__file__).resolve().parents[1]
DECODERS = sorted(path.stem for path in (REPO / "conf" / "decoding").glob("*.yaml"))
WORLD = "fashion_t2i"
PRESETS = [WORLD, *sorted(path.stem for path in (REPO / "conf" / "model").glob("tiny_random_*.yaml"))]
SIZE = ("num_images=1", "batch_size=1", "metrics=none", "speedup_baseline=null", "wandb.mode=disabled", "warmup=0")

# (decoder, preset) -> text of the preflight's refusal, for a decoder that cannot run on a family by design.
# Empty: every decoder runs on every tiny preset.
REFUSED: dict[tuple[str, str], str] = {}


def run_defaults(tmp_path: Path, monkeypatch, decoder: str, preset: str) -> tuple[int, str, Path]:
    """``python run.py model=PRESET decoding=DECODER`` (one image) in this process: (status, stderr, folder)."""
    out = tmp_path / f"{decoder}-{preset}"
    status, _, stderr = run_in_process([f"model={preset}", f"decoding={decoder}", *SIZE], out, monkeypatch, base=())
    return status, stderr, out


def check_defaults(tmp_path, monkeypatch, decoder: str, preset: str) -> None:
    status, stderr, out = run_defaults(tmp_path, monkeypatch, decoder, preset)
    refused = REFUSED.get((decoder, preset))
    if refused is not None:
        lines = [line for line in stderr.splitlines() if line.strip()]
        assert status == 2 and len(lines) == 1 and lines[0].startswith("error: ") and refused in lines[0], stderr
        assert not out.exists()
        return
    assert status == 0, stderr[-3000:]
    record = json.loads((out / "metrics.json").read_text())
    assert record["num_images"] == 1 and (out / "000000.png").is_file()
    assert record["lossless"] in (True, False)  # every record says whether its rule is lossless


DEFAULT = [(decoder, WORLD) for decoder in DECODERS] + [("lantern", preset) for preset in PRESETS if preset != WORLD]
REST = [(d, p) for d in DECODERS for p in PRESETS if (d, p) not in DEFAULT]


@pytest.mark.parametrize("decoder,preset", DEFAULT, ids=[f"{d}-{p}" for d, p in DEFAULT])
def test_each_decoder_on_the_world_and_each_preset_with_lantern(tmp_path, monkeypatch, decoder, preset):
    check_defaults(tmp_path, monkeypatch, decoder, preset)


@pytest.mark.slow
@pytest.mark.parametrize("decoder,preset", REST, ids=[f"{d}-{p}" for d, p in REST])
def test_each_decoder_with_its_defaults_on_each_tiny_preset(tmp_path, monkeypatch, decoder, preset):
    check_defaults(tmp_path, monkeypatch, decoder, preset)


def test_the_cases_cover_the_product():
    assert len(DECODERS) >= 10 and len(PRESETS) >= 6
    assert sorted(DEFAULT + REST) == sorted((d, p) for d in DECODERS for p in PRESETS)
    assert set(REFUSED) <= set(DEFAULT + REST)
