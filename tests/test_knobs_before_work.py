"""Every knob before any work (issue 56, item 5): a metric's and a family's knobs are checked by the preflight's dry
build (lantern.run.dry_build, lantern.models.dry), so a bad value is one ``error:`` line naming it, exit 2, no run
folder, and no weights read; the dry twins themselves read nothing."""

from __future__ import annotations

import pytest
from helpers import REPO, run_in_process

from lantern.cli.preflight import check_run_config
from lantern.errors import ConfigError
from lantern.run.compose import compose_config

WORLD = ("wandb.mode=disabled", "speedup_baseline=null", "num_images=2", "warmup=0")  # num_images=1 overrides it


@pytest.fixture
def no_weights(monkeypatch):
    """Every weights read of the model loaders fails the test: a refusal must come before any of them."""

    def forbidden(*args, **kwargs):
        raise AssertionError("weights were read before the bad value was refused")

    for module in ("lantern.models.checkpoint", "lantern.models.llamagen.bundle", "lantern.models.world.load"):
        for name in ("load_weights", "read_state_dict", "verify_world"):
            monkeypatch.setattr(f"{module}.{name}", forbidden, raising=False)


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (["metrics=world", "metrics.fid.batch_size=0"], "metrics.fid.batch_size=0: expected an integer >= 1"),
        (["metrics=world", "metrics.clip.batch_size=100000"], "metrics.clip.batch_size=100000: expected an integer in"),
        (["model.bundle.conditioner.max_length=0"], "model.bundle.conditioner.max_length=0"),
        (
            ["model.bundle.gpt.overrides.vocab_size=4096"],
            "GPT vocabulary 4096 does not match the VQ codebook size 2048",
        ),
        (["model.drafter.condition_input=label"], "model.drafter.condition_input='label': expected one of"),
        (["metrics=world", "num_images=1"], "num_images=1: metrics.fid needs at least 2 images"),
    ],
    ids=["fid-batch", "clip-batch", "text-length", "vocabulary", "drafter-input", "too-few-for-fid"],
)
def test_a_bad_knob_is_refused_before_any_weights_are_read(tmp_path, monkeypatch, no_weights, overrides, expected):
    status, out, err = run_in_process(overrides, tmp_path / "run", monkeypatch, base=WORLD)
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert expected in lines[0] and out == "" and not (tmp_path / "run").exists(), lines[0]


@pytest.mark.parametrize(
    "model,key,value",
    [
        ("tiny_random_chameleon", "model.bundle.target.n_layer", 10**12),
        ("tiny_random_lumina", "model.bundle.vq.num_res_blocks", 10**12),
        ("tiny_random_janus", "model.bundle.target.dim", 10**12),
        ("tiny_random_emu3", "model.bundle.vq.codebook_size", 10**12),
        ("tiny_random_c2i", "model.bundle.gpt.image_size", 10**12),
    ],
)
def test_each_familys_sizes_are_bounded_by_its_dry_twin(model, key, value):
    with pytest.raises(ConfigError, match=f"{key}={value}: expected an integer in"):
        check_run_config(compose_config([f"model={model}", f"{key}={value}"]))


def test_a_folder_preset_is_checked_without_its_folder_being_read(tmp_path):
    """A real preset's bundle, drafter and codebook twins stat the paths they are given and read none of them."""
    folder = tmp_path / "Janus-Pro-1B"
    folder.mkdir()  # empty: a read of its config.json would fail
    base = ["model=janus_pro_1b", f"model.gpt_ckpt={folder}", "decoding=lantern"]
    with pytest.raises(ConfigError, match="no drafter checkpoint given: .* sjd_pp and zipar need no drafter"):
        check_run_config(compose_config(base))
    with pytest.raises(ConfigError, match=r"model.drafter_ckpt='.*nowhere': expected an existing file or folder"):
        check_run_config(compose_config([*base, f"model.drafter_ckpt={tmp_path / 'nowhere'}"]))
    with pytest.raises(ConfigError, match="model.bundle.template='chat': expected one of janus_pro"):
        check_run_config(compose_config([*base, "decoding=ar", "model.bundle.template=chat"]))
    check_run_config(compose_config([*base, "decoding=ar"]))  # nothing in the folder is read by the preflight


PRESETS = sorted(p.stem for p in (REPO / "conf" / "model").glob("*.yaml"))


@pytest.mark.parametrize("model", PRESETS)
def test_every_presets_nodes_pass_their_dry_twins_as_shipped(tmp_path, model):
    """The twins accept what every preset states (its files given as paths that exist: nothing is read), the GPU
    check's ``timing`` node included, so a refusal is always about a value the user changed."""
    from omegaconf import OmegaConf

    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_bytes(b"")
    raw = OmegaConf.to_container(compose_config([f"model={model}"]), resolve=False)["model"]
    kinds = {"gpt_ckpt": "folder", "vq_ckpt": "file", "text_encoder_path": "folder", "drafter_ckpt": "folder"}
    given = [f"model.{key}={tmp_path / kind}" for key, kind in kinds.items() if key in raw]
    check_run_config(compose_config([f"model={model}", *given]))  # decoding=lantern: its drafter and codebook too


def forbidden_loader(**knobs):
    raise AssertionError("a loader without a dry twin was run by the preflight")


def test_a_model_loader_without_a_dry_twin_is_never_run_by_the_preflight():
    """A family that adds a loader and no twin is checked when it loads, not loaded twice; a metric's constructor
    (which reads nothing) is run."""
    from lantern.run.dry_build import dry_instantiate

    node = {"_target_": f"{__name__}.forbidden_loader", "size": 3, "part": {"_target_": f"{__name__}.forbidden_loader"}}
    assert dry_instantiate(node, "model.bundle", twins_only=True) is None
    with pytest.raises(AssertionError, match="without a dry twin"):
        dry_instantiate(node, "metrics.mine")
