"""The Chameleon family through the entry point: every decoder on tiny_random_chameleon (greedy eagle and sjd
write AR's PNGs), and anole_7b on a tiny ChameleonForConditionalGeneration folder made with save_pretrained,
with bad folders refused in one line."""

from __future__ import annotations

import json

import pytest
import torch
from family_helpers import pngs, relabelled, run, tau
from helpers_chameleon import CODES, VQ, hf_model, save_folder

from lantern.models.chameleon.vqgan import ChameleonVQGAN, VQGANConfig

pytest.importorskip("transformers")


def test_greedy_eagle_and_sjd_write_greedy_ars_pngs_on_tiny_random_chameleon(tmp_path):
    common = ("model=tiny_random_chameleon", "num_images=3", "batch_size=3", "temperature=0", "speedup_baseline=null")
    runs = {
        "ar": ("decoding=ar",),
        "eagle": ("decoding=eagle",),
        "eagle_dynamic": ("decoding=eagle", "draft=dynamic_tree"),
        "sjd": ("decoding=sjd",),
    }
    for name, overrides in runs.items():
        proc = run(tmp_path / name, *common, *overrides)
        assert proc.returncode == 0, proc.stderr
    expected = pngs(tmp_path / "ar")
    assert len(expected) == 3
    for name in runs:
        assert pngs(tmp_path / name) == expected, name
    # A random drafter rarely proposes a random target's argmax (greedy eagle's tau is about 1); SJD's
    # Jacobi iterations converge on several tokens at once.
    assert all(tau(tmp_path / name) >= 1 for name in runs) and tau(tmp_path / "sjd") > 1


def test_lantern_and_gsd_run_on_tiny_random_chameleon(tmp_path):
    for decoding in ("lantern", "gsd"):
        out = tmp_path / decoding
        proc = run(out, "model=tiny_random_chameleon", f"decoding={decoding}", "num_images=2", "batch_size=2")
        assert proc.returncode == 0, proc.stderr
        metrics = json.loads((out / "metrics.json").read_text())
        assert metrics["mean_accepted_length"] > 1 and metrics["tv_realised_max"] > 0 and metrics["speedup"] > 0


@pytest.fixture(scope="module")
def anole_files(tmp_path_factory):
    """A tiny Anole-layout folder (sharded) and a vqgan.ckpt of its VQGAN (their encoder, a random decoder)."""
    root = tmp_path_factory.mktemp("anole")
    reference = hf_model(seed=5)
    folder = save_folder(reference, root / "hf", shard="100KB")
    config = VQGANConfig(**VQ, channel_multiplier=(1, 1, 2), num_res_blocks=1)
    vq = ChameleonVQGAN(config).state_dict()
    vq.update(
        {k[len("model.vqmodel.") :]: v for k, v in reference.state_dict().items() if k.startswith("model.vqmodel.")}
    )
    torch.save({"state_dict": vq}, root / "vqgan.ckpt")
    return folder, root / "vqgan.ckpt"


def anole(folder, vq_ckpt, *more: str) -> tuple[str, ...]:
    vq = ",".join(
        f"{k}:{v}"
        for k, v in dict(num_embeddings=CODES, embed_dim=8, z_channels=32, resolution=16, base_channels=32).items()
    )
    return (
        "model=anole_7b",
        f"model.gpt_ckpt={folder}",
        f"model.vq_ckpt={vq_ckpt}",
        "model.cls_token_num=12",
        "model.bundle.target.image_size=16",
        f"model.bundle.vq={{{vq},channel_multiplier:[1,1,2],num_res_blocks:1}}",
        "num_images=2",
        "batch_size=2",
        "speedup_baseline=null",
        "decoding=ar",  # the folder has no drafter
        *more,
    )


def test_anole_preset_runs_a_save_pretrained_folder_with_its_vqgan(tmp_path, anole_files):
    folder, vq_ckpt = anole_files
    proc = run(tmp_path / "run", *anole(folder, vq_ckpt, "prompts=captions_demo", "model.cls_token_num=24"))
    assert proc.returncode == 0, proc.stderr
    assert len(pngs(tmp_path / "run")) == 2


def test_bad_chameleon_input_is_one_error_line_exit_2_and_writes_nothing(tmp_path, anole_files):
    import transformers

    folder, vq_ckpt = anole_files
    llama = tmp_path / "llama"
    transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2
    ).save_pretrained(llama)
    broken = tmp_path / "broken"
    broken.mkdir()
    for path in folder.iterdir():
        (broken / path.name).write_bytes(path.read_bytes())
    shard = sorted(set(json.loads((broken / "model.safetensors.index.json").read_text())["weight_map"].values()))[-1]
    (broken / shard).unlink()
    foreign = tmp_path / "foreign.ckpt"  # the right shape, one encoder-side tensor of another model
    state = torch.load(vq_ckpt, weights_only=True)["state_dict"]
    state["quant_conv.weight"] = state["quant_conv.weight"] + 0.01
    torch.save({"state_dict": state}, foreign)
    mislabelled = relabelled(folder, tmp_path / "mislabelled", model_type="janus")  # a Chameleon saying Janus
    cases = [
        (anole(llama, vq_ckpt), "not a ChameleonForConditionalGeneration"),
        (anole(mislabelled, vq_ckpt), "(model_type 'janus'), not a ChameleonForConditionalGeneration"),
        (anole(folder, foreign), "model.vqmodel.quant_conv.weight of"),
        (anole(broken, vq_ckpt), f"shard {shard!r}"),
        (anole(folder, vq_ckpt, "prompts=captions_demo"), "longer than the model's 12 condition slots"),
    ]
    for index, (overrides, message) in enumerate(cases):
        out = tmp_path / f"out{index}"
        proc = run(out, *overrides)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        assert lines[0].startswith("error: ") and message in lines[0], lines[0]
        assert not out.exists()


def test_the_vq_shape_is_the_folders_vq_config_with_the_preset_as_default(anole_files):
    from lantern.models.chameleon.bundle import load_bundle

    folder, vq_ckpt = anole_files
    meta = dict(num_embeddings=8192, embed_dim=256, z_channels=256, resolution=512, base_channels=128)  # anole_7b's
    bundle = load_bundle("anole", str(folder), str(vq_ckpt), {"image_size": 16, "cls_token_num": 12}, meta)
    assert bundle.vq.config == VQGANConfig(**VQ, channel_multiplier=(1, 1, 2), num_res_blocks=1)
    assert bundle.target.config.grid_size == 4


def test_a_wrong_image_size_or_a_missing_drafter_is_refused_before_any_read(anole_files):
    from lantern.errors import CheckpointError, ConfigError
    from lantern.models.chameleon.bundle import load_bundle, random_drafter

    folder, vq_ckpt = anole_files
    vq = dict(VQ, channel_multiplier=[1, 1, 2], num_res_blocks=1)
    with pytest.raises(ConfigError, match="image_size 32 is not the VQGAN's resolution 16"):
        load_bundle("anole", str(folder), str(vq_ckpt), {"image_size": 32, "cls_token_num": 12}, vq)
    target = {
        "image_size": 16,
        "cls_token_num": 8,
        "n_layer": 1,
        "n_head": 2,
        "dim": 32,
        "ffn_hidden": 64,
        "num_codes": CODES,
    }
    with pytest.raises(CheckpointError, match="not found: 'drafter/'"):
        random_drafter(target, vq, path="drafter/")
