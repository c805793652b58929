"""Top-level knobs: each decoder's own (LANTERN's k, delta, LANTERN++'s lambda), given across decoders in a
sweep, and the CFG rule."""

import json
import subprocess
import sys

import pytest
from helpers import REPO
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

import lantern  # noqa: F401 - registers the resolvers the configs use
from lantern.cli.knobs import decoder_knobs, drop_foreign, forced
from lantern.decoding.api import settings_from_record
from lantern.run.compose import ModelParts, build_decoder


def decoder_of(cfg):
    return build_decoder(cfg.decoding, ModelParts(cfg.model))


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
def test_a_knob_the_decoder_lacks_is_left_out_and_the_records_keep_it_null(decoding, recorded):
    overrides = forced(["delta=0.2"])  # what run.py makes of a plain delta=0.2
    assert overrides == ["++delta=0.2"]
    cfg = composed(f"decoding={decoding}", *overrides)
    dropped = drop_foreign(cfg, overrides, decoding)
    assert ("delta" in cfg) == (decoding == "lantern") and (dropped == {}) == (decoding == "lantern")
    if decoding != "lantern":
        assert dropped == {"delta": "delta=0.2"}
    described = decoder_of(cfg).settings.record()
    assert {key: described.get(key) for key in recorded} == recorded  # ignored knobs are recorded as null


def test_lambda_and_k_reach_lantern_pp():
    described = decoder_of(composed("decoding=lantern_pp", "lambda=2", "k=7")).settings.record()
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
    for decoding in ("ar", "eagle"):  # each record says what its job left out
        config = records[decoding]["config"]
        assert config["dropped_overrides"] == ["delta=0.2"] and "delta" not in config
    assert records["lantern"]["config"]["delta"] == 0.2 and "dropped_overrides" not in records["lantern"]["config"]
    assert "decoding=ar has no such knob: delta=0.2 left out of this job" in proc.stderr


@pytest.mark.parametrize("decoding", sorted(path.stem for path in (REPO / "conf" / "decoding").glob("*.yaml")))
def test_a_decoder_config_defines_only_the_knobs_it_reads_and_a_cross_decoder_sweep_composes(decoding):
    raw = OmegaConf.load(REPO / "conf" / "decoding" / f"{decoding}.yaml")
    node = OmegaConf.to_yaml(raw.decoding)
    unread = [key for key in decoder_knobs()[decoding] if "${" + key + "}" not in node]
    assert unread == [], f"{decoding}.yaml defines knobs its decoder does not read: {unread}"
    overrides = forced(["delta=0.2", "k=5", "lambda=2"])
    cfg = composed(f"decoding={decoding}", *overrides)
    drop_foreign(cfg, overrides, decoding)
    own = decoder_knobs()[decoding]
    assert {key for key in ("k", "delta", "lambda") if key in cfg} == own & {"k", "delta", "lambda"}
