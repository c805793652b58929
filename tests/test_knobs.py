"""Top-level knobs that reach every decoder: LANTERN's k, delta and lambda, and the CFG rule."""

import json
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from test_run import REPO

import lantern  # noqa: F401 - registers the resolvers the configs use
from lantern.decoding.api import settings_from_record


def composed(*overrides: str):
    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "conf")):
        return compose("config", overrides=["model=tiny_random_c2i", *overrides])


@pytest.mark.parametrize(
    "decoding,recorded",
    [
        ("ar", {"k": None, "delta": None, "lambda": None}),
        ("eagle", {"k": None, "delta": None, "lambda": None}),
        ("lantern", {"k": 1000, "delta": 0.2, "lambda": None}),
        ("lantern_pp", {"k": 10, "delta": None, "lambda": 3.0}),
    ],
)
def test_delta_is_a_top_level_key_for_every_decoder(decoding, recorded):
    cfg = composed(f"decoding={decoding}", "delta=0.2")  # no "+": the key exists whichever decoder runs
    assert cfg.delta == 0.2 and "k" in cfg and "lambda" in cfg
    described = instantiate(cfg.decoding).settings.record()
    assert {key: described.get(key) for key in recorded} == recorded  # ignored knobs are recorded as null


def test_lambda_and_k_reach_lantern_pp():
    described = instantiate(composed("decoding=lantern_pp", "lambda=2", "k=7").decoding).settings.record()
    assert described["lambda"] == 2 and described["k"] == 7


def test_cfg_rule_reaches_the_sampling_config():
    cfg = composed("cfg_scale=0.5", "cfg_interval=3")
    sampling = instantiate(cfg.sampling)
    assert sampling.cfg_below_one == "conditional" and not sampling.uses_cfg and sampling.last_guided_token == 4
    mixed = instantiate(composed("cfg_scale=0.5", "cfg_below_one=mix").sampling)
    assert mixed.uses_cfg and mixed.guidance_on(100)


def test_the_first_comparison_a_researcher_runs(tmp_path):
    """`python run.py -m decoding=ar,eagle,lantern delta=0.2` runs all three; only LANTERN uses delta."""
    sweep = tmp_path / "sweep"
    proc = subprocess.run(
        [
            sys.executable,
            "run.py",
            "-m",
            "decoding=ar,eagle,lantern",
            "delta=0.2",
            "model=tiny_random_c2i",
            "num_images=1",
            "warmup=0",
            "speedup_baseline=null",
            "wandb.mode=disabled",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = {r["decoding"]: r for r in (json.loads(p.read_text()) for p in sweep.glob("*/metrics.json"))}
    records = {name: {**r, **settings_from_record(r).record()} for name, r in records.items()}  # knobs, flat
    assert set(records) == {"ar", "eagle", "lantern"}
    assert [records[d].get("delta") for d in ("ar", "eagle", "lantern")] == [None, None, 0.2]
    assert records["lantern"]["k"] == 1000 and records["ar"].get("k") is None and records["lantern"]["lambda"] is None


@pytest.mark.parametrize("decoding", sorted(path.stem for path in (REPO / "conf" / "decoding").glob("*.yaml")))
def test_every_decoder_config_declares_the_lantern_knobs(decoding):
    cfg = composed(f"decoding={decoding}", "delta=0.2", "k=5", "lambda=2")
    assert (cfg.k, cfg.delta, cfg["lambda"]) == (5, 0.2, 2)
