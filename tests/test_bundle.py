"""Loading model files through configs, end to end, with official-format files of tiny size."""

import json
import subprocess
import sys
from pathlib import Path

import torch
from helpers import T5_DIM
from helpers import tiny_t5_folder as _tiny_t5_folder

from lantern.models.llamagen.gpt import Transformer, gpt_config
from lantern.models.vq_model import VQModel, vq_config

REPO = Path(__file__).resolve().parents[1]


def test_t2i_run_loads_official_format_files_and_a_local_t5(tmp_path):
    t5 = _tiny_t5_folder(tmp_path / "t5")
    torch.manual_seed(0)
    gpt = Transformer(
        gpt_config("GPT-nano", "t2i", 32, downsample=8, vocab_size=1024, caption_dim=T5_DIM, cls_token_num=12)
    )
    vq = VQModel(vq_config("VQ-tiny", codebook_size=1024))
    torch.save({"model": gpt.state_dict()}, tmp_path / "gpt.pt")
    torch.save(vq.state_dict(), tmp_path / "vq.pt")  # raw dict, like the FSDP-saved releases
    out = tmp_path / "run"
    overrides = [
        "model=llamagen_t2i_xl_256",
        "decoding=ar",  # official GPT/VQ/T5 files; no drafter
        f"model.gpt_ckpt={tmp_path / 'gpt.pt'}",
        f"model.vq_ckpt={tmp_path / 'vq.pt'}",
        f"model.text_encoder_path={t5}",
        "model.bundle.gpt.preset=GPT-nano",
        "model.bundle.gpt.image_size=32",
        f"+model.bundle.gpt.overrides={{vocab_size:1024,caption_dim:{T5_DIM},cls_token_num:12}}",
        "model.bundle.vq.preset=VQ-tiny",
        "+model.bundle.vq.overrides={codebook_size:1024}",
        "model.bundle.conditioner.max_length=12",
        "num_images=3",
        "batch_size=2",
        "top_k=50",
        "warmup=0",
        "wandb.mode=disabled",
        f"hydra.run.dir={out}",
    ]
    proc = subprocess.run([sys.executable, "run.py", *overrides], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["prompts"] == "captions_demo" and metrics["top_k"] == 50 and metrics["cfg_scale"] == 7.5
    assert metrics["distinct_prompts"][metrics["per_image"][0]["prompt_id"]].startswith("A photo of a red fox")
    assert (out / "000002.png").is_file()

    wrong = subprocess.run(
        [
            sys.executable,
            "run.py",
            *overrides[:-1],
            "model.bundle.conditioner.max_length=10",
            f"hydra.run.dir={tmp_path / 'bad'}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert wrong.returncode == 2 and "expects 12 condition tokens" in wrong.stderr and not (tmp_path / "bad").exists()

    no_t5 = subprocess.run(
        [
            sys.executable,
            "run.py",
            *[o for o in overrides[:-1] if not o.startswith("model.text_encoder_path")],
            f"model.text_encoder_path={tmp_path / 'no_t5'}",
            f"hydra.run.dir={tmp_path / 'no_t5_run'}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )  # its own folder: `out` holds a finished run
    assert (
        no_t5.returncode == 2
        and "no_t5" in no_t5.stderr.strip().splitlines()[-1]
        and not (tmp_path / "no_t5_run").exists()
    )


def test_every_family_bundle_gives_its_codebook_as_its_neighbour_tables_read_it():
    """``bundle.codebook()`` is the family-free way to the tokenizer's rows: for every random preset it is the
    codebook its neighbour config builds tables over (model.neighbours), and it is the tokenizer's own."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    presets = ("tiny_random_c2i", "tiny_random_chameleon", "tiny_random_janus", "tiny_random_lumina")
    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "conf")):
        for preset in presets:
            cfg = compose("config", overrides=[f"model={preset}", "device=cpu", "dtype=float32"])
            bundle = instantiate(cfg.model.bundle)
            neighbours = instantiate(cfg.model.neighbours, cache_dir="unused")
            book = bundle.codebook()
            assert book.ndim == 2 and book.shape[0] == bundle.target.config.vocab_size, preset
            assert not book.requires_grad and torch.equal(book, bundle.vq.raw_codebook().detach()), preset
            assert torch.equal(neighbours.codebook(), book), preset
