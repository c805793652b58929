"""The Janus family through the entry point: every decoder on tiny_random_janus (greedy eagle and sjd write AR's
PNGs), and janus_pro_1b on a tiny JanusForConditionalGeneration folder made with save_pretrained, with bad input
refused in one line."""

from __future__ import annotations

import json

import pytest
from family_helpers import pngs, relabelled, run, tau
from helpers_janus import hf_model, save_folder

pytest.importorskip("transformers")


GREEDY = ("model=tiny_random_janus", "num_images=3", "batch_size=3", "temperature=0", "speedup_baseline=null")


def greedy_runs(tmp_path, runs: dict[str, tuple[str, ...]]) -> None:
    for name, overrides in {"ar": ("decoding=ar",), **runs}.items():
        proc = run(tmp_path / name, *GREEDY, *overrides)
        assert proc.returncode == 0, proc.stderr
    expected = pngs(tmp_path / "ar")
    assert len(expected) == 3 and len(set(expected.values())) == 3
    for name in runs:
        assert pngs(tmp_path / name) == expected, name


def test_greedy_eagle_and_sjd_write_greedy_ars_pngs_on_tiny_random_janus(tmp_path):
    greedy_runs(tmp_path, {"eagle": ("decoding=eagle",), "sjd": ("decoding=sjd",)})
    # A random drafter rarely proposes a random target's argmax (greedy eagle's tau is about 1); SJD's
    # Jacobi iterations converge on several tokens at once.
    assert tau(tmp_path / "eagle") >= 1 and tau(tmp_path / "sjd") > 1


@pytest.mark.slow
def test_greedy_dynamic_tree_and_full_width_zipar_write_greedy_ars_pngs_on_tiny_random_janus(tmp_path):
    # ZipAR at window = grid width (8) is raster AR: its row-start masks meet the remapped positions too.
    greedy_runs(
        tmp_path, {"eagle_dynamic": ("decoding=eagle", "draft=dynamic_tree"), "zipar": ("decoding=zipar", "window=8")}
    )


def sampled(tmp_path, decodings: tuple[tuple[str, ...], ...], least: float) -> None:
    for overrides in decodings:
        out = tmp_path / "_".join(overrides).replace("=", "-")
        proc = run(out, "model=tiny_random_janus", *overrides, "num_images=2", "batch_size=2")
        assert proc.returncode == 0, proc.stderr
        metrics = json.loads((out / "metrics.json").read_text())
        assert metrics["mean_accepted_length"] > least and metrics["speedup"] > 0, overrides
        assert len(pngs(out)) == 2


def test_lantern_and_gsd_run_on_tiny_random_janus(tmp_path):
    sampled(tmp_path, (("decoding=lantern",), ("decoding=gsd",)), least=1)


@pytest.mark.slow
def test_lantern_pp_and_zipar_run_on_tiny_random_janus(tmp_path):
    # LANTERN++ with a random drafter at CFG 5 accepts about nothing (tau 1.0); it only has to run.
    sampled(tmp_path, (("decoding=lantern_pp",), ("decoding=zipar", "window=4")), least=0.99)


@pytest.fixture(scope="module")
def janus_folder(tmp_path_factory):
    """A tiny Janus-Pro-layout folder (sharded) with its tokenizer."""
    return save_folder(hf_model(seed=5), tmp_path_factory.mktemp("janus_run") / "hf", shard="100KB")


def janus(folder, *more: str) -> tuple[str, ...]:
    return (
        "model=janus_pro_1b",
        f"model.gpt_ckpt={folder}",
        "model.cls_token_num=24",
        "model.bundle.target.image_size=16",
        "model.bundle.target.architecture=null",
        "num_images=2",
        "batch_size=2",
        "speedup_baseline=null",
        "decoding=ar",  # the folder has no drafter
        *more,
    )


def test_janus_pro_preset_runs_a_save_pretrained_folder(tmp_path, janus_folder):
    proc = run(tmp_path / "run", *janus(janus_folder, "prompts=captions_demo"))
    assert proc.returncode == 0, proc.stderr
    assert len(pngs(tmp_path / "run")) == 2


def test_bad_janus_input_is_one_error_line_exit_2_and_writes_nothing(tmp_path, janus_folder):
    import transformers

    llama = tmp_path / "llama"
    transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2
    ).save_pretrained(llama)
    broken = tmp_path / "broken"
    broken.mkdir()
    for path in janus_folder.iterdir():
        (broken / path.name).write_bytes(path.read_bytes())
    shard = sorted(set(json.loads((broken / "model.safetensors.index.json").read_text())["weight_map"].values()))[-1]
    (broken / shard).unlink()
    mislabelled = relabelled(janus_folder, tmp_path / "mislabelled", model_type="chameleon")  # a Janus saying Chameleon
    cases = [
        (janus(llama), "not a JanusForConditionalGeneration"),
        (janus(mislabelled), "(model_type 'chameleon'), not a JanusForConditionalGeneration"),
        (janus(broken), f"shard {shard!r}"),
        (janus(janus_folder, "model.cls_token_num=12", "prompts=captions_demo"), "longer than the model's 12"),
        (janus(janus_folder, "model.bundle.target.image_size=32"), "image_size=32: expected 16"),
    ]
    for index, (overrides, message) in enumerate(cases):
        out = tmp_path / f"out{index}"
        proc = run(out, *overrides)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        assert lines[0].startswith("error: ") and message in lines[0], lines[0]
        assert not out.exists()


def test_a_folder_of_another_size_or_a_missing_drafter_is_refused_before_any_read(janus_folder, tmp_path):
    from lantern.errors import CheckpointError, ConfigError
    from lantern.models.janus.bundle import load_bundle, load_drafter

    target = {"image_size": 16, "cls_token_num": 24, "architecture": {"n_layer": 24, "dim": 2048}}
    with pytest.raises(CheckpointError, match="has n_layer=2, but this preset is for n_layer=24"):
        load_bundle("janus_pro_1b", str(janus_folder), target)
    with pytest.raises(ConfigError, match="architecture.layers=24: expected a size named one of n_layer"):
        load_bundle("janus_pro_1b", str(janus_folder), dict(target, architecture={"layers": 24}))
    with pytest.raises(ConfigError, match="no drafter checkpoint given"):
        load_drafter(None, str(janus_folder), target)
    # A drafter exported for the folder's target loads for the preset (its sizes read from the folder alone).
    from helpers_janus import load

    from lantern.models.drafter import Drafter, DrafterConfig, save_drafter_folder

    model, _ = load(janus_folder)
    drafter = Drafter(DrafterConfig(model.config))
    folder = save_drafter_folder(drafter, drafter.config.arch.folder_embeddings(model), tmp_path / "drafter")
    target = dict(target, architecture=None)
    assert load_drafter(str(folder), str(janus_folder), target).config == drafter.config
