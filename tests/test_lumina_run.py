"""Lumina-mGPT through the entry point: greedy eagle (chain, static and dynamic tree) and greedy sjd write greedy
AR's PNGs on tiny_random_lumina (the EOL tokens hidden inside the target, no decoder changed), the 7B preset on
a tiny ChameleonForConditionalGeneration folder with Lumina's vocabulary, and bad input in one line."""

from __future__ import annotations

import pytest
import torch
from family_helpers import pngs, run, tau
from helpers_chameleon import hf_model as anole_model
from helpers_chameleon import save_folder
from helpers_lumina import VQ, VQ_HF, hf_model

from lantern.models.chameleon.vqgan import ChameleonVQGAN, VQGANConfig

pytest.importorskip("transformers")

GREEDY = ("model=tiny_random_lumina", "num_images=2", "batch_size=2", "temperature=0", "speedup_baseline=null")


def check_same_pngs(tmp_path, runs: dict[str, tuple[str, ...]]) -> None:
    for name, overrides in {"ar": ("decoding=ar",), **runs}.items():
        proc = run(tmp_path / name, *GREEDY, *overrides)
        assert proc.returncode == 0, proc.stderr
    expected = pngs(tmp_path / "ar")
    assert len(expected) == 2
    for name in runs:
        assert pngs(tmp_path / name) == expected, name
        print(f"{name}: tau {tau(tmp_path / name):.3f}")


def test_greedy_eagle_chain_and_sjd_write_greedy_ars_pngs_on_tiny_random_lumina(tmp_path):
    runs = {"eagle": ("decoding=eagle",), "sjd": ("decoding=sjd",)}
    check_same_pngs(tmp_path, runs)
    assert all(tau(tmp_path / name) >= 1 for name in runs) and tau(tmp_path / "sjd") > 1


@pytest.mark.slow
def test_greedy_eagle_trees_and_zipar_write_greedy_ars_pngs(tmp_path):
    runs = {
        "eagle_static": ("decoding=eagle", "draft=static_tree"),
        "eagle_dynamic": ("decoding=eagle", "draft=dynamic_tree"),
        "zipar": ("decoding=zipar", "window=8"),  # rows a full row apart: AR's order
    }
    check_same_pngs(tmp_path, runs)


@pytest.mark.slow
def test_sampled_decoders_run_on_tiny_random_lumina(tmp_path):
    import json

    for decoding in ("lantern", "lantern_pp", "gsd", "zipar"):
        out = tmp_path / decoding
        window = ("window=4",) if decoding == "zipar" else ()
        proc = run(out, "model=tiny_random_lumina", f"decoding={decoding}", "num_images=2", "batch_size=2", *window)
        assert proc.returncode == 0, proc.stderr
        metrics = json.loads((out / "metrics.json").read_text())
        assert metrics["mean_accepted_length"] >= 1 and metrics["speedup"] > 0


@pytest.fixture(scope="module")
def lumina_files(tmp_path_factory):
    """A tiny Lumina-vocabulary folder (sharded), a vqgan.ckpt of its VQGAN (their encoder, a random decoder)
    and an Anole-vocabulary folder (no EOL token)."""
    root = tmp_path_factory.mktemp("lumina_run")
    reference = hf_model(seed=5)
    folder = save_folder(reference, root / "hf", shard="200KB")
    vq = ChameleonVQGAN(VQGANConfig(**VQ)).state_dict()
    prefix = "model.vqmodel."
    vq.update({k[len(prefix) :]: v for k, v in reference.state_dict().items() if k.startswith(prefix)})
    torch.save({"state_dict": vq}, root / "vqgan.ckpt")
    anole = save_folder(anole_model(seed=1, vq_config=VQ_HF), root / "anole")  # the same VQ shape as the preset
    return folder, root / "vqgan.ckpt", anole


def lumina_7b(folder, vq_ckpt, *more: str) -> tuple[str, ...]:
    vq = ",".join(f"{k}:{v}" for k, v in VQ.items() if k not in ("channel_multiplier", "num_res_blocks"))
    return (
        "model=lumina_mgpt_7b_768",
        f"model.gpt_ckpt={folder}",
        f"model.vq_ckpt={vq_ckpt}",
        "model.cls_token_num=32",
        f"model.bundle.target.image_size={VQ['resolution']}",
        f"model.bundle.vq={{{vq},channel_multiplier:[1,1,2],num_res_blocks:1}}",
        "num_images=2",
        "batch_size=2",
        "speedup_baseline=null",
        "decoding=sjd",  # no drafter needed
        *more,
    )


def test_the_7b_preset_runs_a_save_pretrained_folder_with_its_vqgan(tmp_path, lumina_files):
    folder, vq_ckpt, _ = lumina_files
    proc = run(tmp_path / "run", *lumina_7b(folder, vq_ckpt))
    assert proc.returncode == 0, proc.stderr
    assert len(pngs(tmp_path / "run")) == 2


def test_bad_lumina_input_is_one_error_line_exit_2_and_writes_nothing(tmp_path, lumina_files):
    folder, vq_ckpt, anole = lumina_files
    cases = [
        (lumina_7b(anole, vq_ckpt), "the vocabulary has no '<reserved08799>' token"),
        (lumina_7b(folder, vq_ckpt, "model.cls_token_num=20"), "longer than the model's 20 condition slots"),
        (("model=tiny_random_lumina", "model.bundle.target.image_size=48"), "image_size 48 is not the VQGAN's"),
        (
            ("model=tiny_random_lumina", "model.bundle.target.image_size=36", "model.bundle.vq.resolution=36"),
            "the side must be an even number of codes",
        ),
    ]
    for index, (overrides, message) in enumerate(cases):
        out = tmp_path / f"out{index}"
        proc = run(out, *overrides)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        assert lines[0].startswith("error: ") and message in lines[0], lines[0]
        assert not out.exists()


@pytest.mark.slow
def test_the_factory_trains_a_drafter_on_the_interleaved_stream_that_greedy_eagle_uses(tmp_path):
    """scripts/train_drafter.py reads the target's teacher-forced features (the interleaved stream, a row end's
    from its EOL); the drafter it exports proposes the greedy target's tokens more often than a random one."""
    import subprocess
    import sys

    from family_helpers import REPO

    out = tmp_path / "factory"
    command = [sys.executable, "scripts/train_drafter.py", "model=tiny_random_lumina", "num_samples=64", "steps=40"]
    proc = subprocess.run(
        [*command, f"out_dir={out}", "progress=false"], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    check_same_pngs(tmp_path, {"eagle": ("decoding=eagle", f"model.drafter_ckpt={out}/drafter")})
    assert tau(tmp_path / "eagle") > 1.05  # 1.07 measured (deterministic); the seeded random drafter's is 1.00


def test_the_gpu_checks_lumina_node_builds_7b_in_bf16_on_meta_and_its_tiny_form_runs(tmp_path):
    """scripts/gpu_check.py --targets lumina_mgpt_7b_768: Chameleon-7B's parameter count (7.01e9), bf16, on the
    meta device (nothing allocated); its CPU --tiny form times tiny_random_lumina and compiled greedy equals eager."""
    import json

    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate
    from script_helpers import load_script

    from lantern import REPO_ROOT

    for px in (768, 512):
        with initialize_config_dir(version_base="1.3", config_dir=str(REPO_ROOT / "conf")):
            cfg = compose("config", overrides=[f"model=lumina_mgpt_7b_{px}", "dtype=bfloat16"])
        parts = instantiate(cfg.model.timing, device="meta")
        count = sum(p.numel() for p in parts.target.parameters())
        assert abs(count / 1e9 - 7.01) < 0.01, count
        assert all(p.dtype == torch.bfloat16 for p in parts.target.parameters())
        assert parts.target.config.size_id == 8804 + px // 32 and parts.target.config.grid_size == px // 16
    out = tmp_path / "lumina"
    argv = ["--device", "cpu", "--dtype", "float32", "--compile", "none", "--tiny", "--images", "2"]
    assert load_script("gpu_check").main([*argv, "--targets", "lumina_mgpt_7b_768", "--out", str(out)]) == 0
    (result,) = json.loads(out.with_suffix(".json").read_text())["results"]
    assert "tiny_random_lumina" in result["target"] and result["tokens"] == 64
    assert result["greedy_tokens_equal_compiled_vs_eager"] == 1.0
