"""The Emu3 family through the entry point: every decoder on tiny_random_emu3 (greedy eagle and sjd write AR's
PNGs), emu3_gen on a tiny Emu3ForConditionalGeneration folder made with save_pretrained, and folders of another
architecture refused in one line."""

from __future__ import annotations

import json
import shutil

import pytest
from family_helpers import pngs, run, tau
from helpers_emu3 import hf_model, save_folder

pytest.importorskip("transformers")

TINY = ("model=tiny_random_emu3", "num_images=1", "speedup_baseline=null", "metrics=none")


def test_greedy_eagle_sjd_and_sjd_pac_write_greedy_ars_pngs_on_tiny_random_emu3(tmp_path):
    """Lossless decoders (and greedy SJD-PAC) on the target that hides Emu3ForConditionalGeneration's row ends write
    AR's image."""
    for decoding in ("ar", "eagle", "sjd", "sjd_pac"):
        proc = run(tmp_path / decoding, *TINY, "temperature=0", f"decoding={decoding}")
        assert proc.returncode == 0, proc.stderr
    expected = pngs(tmp_path / "ar")
    assert len(expected) == 1
    assert all(pngs(tmp_path / decoding) == expected for decoding in ("eagle", "sjd", "sjd_pac"))
    assert tau(tmp_path / "sjd") > 1 and tau(tmp_path / "sjd_pac") > 1


def test_sampled_sjd_pac_records_tau_above_1_on_tiny_random_emu3(tmp_path):
    """run.py decoding=sjd_pac at its defaults (L 64, K 3, D 3, the preset's sampling) on Emu3's layout."""
    proc = run(tmp_path / "out", *TINY, "decoding=sjd_pac")
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    settings = metrics["settings"]
    assert (settings["kind"], settings["window"], settings["tree_width"], settings["tree_depth"]) == (
        "sjd_pac",
        64,
        3,
        3,
    )
    assert metrics["temperature"] == 1.0  # sampled: tau > 1 is not greedy's
    assert len(pngs(tmp_path / "out")) == 1 and metrics["mean_accepted_length"] > 1


@pytest.mark.parametrize(
    "overrides", [("decoding=lantern",), ("decoding=lantern_pp",), ("decoding=gsd",), ("decoding=sjd_pp",),
                  ("decoding=vvs",), ("decoding=zipar", "window=4")],
)  # fmt: skip
def test_every_other_decoder_runs_on_tiny_random_emu3(tmp_path, overrides):
    """The relaxed, Jacobi, VVS and ZipAR decoders on tiny_random_emu3 (Emu3ForConditionalGeneration's layout)."""
    proc = run(tmp_path / "out", *TINY, *overrides)
    assert proc.returncode == 0, proc.stderr
    assert len(pngs(tmp_path / "out")) == 1 and tau(tmp_path / "out") >= 1


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny Emu3ForConditionalGeneration save_pretrained folder (LM, VQ and a word-level tokenizer.json)."""
    return save_folder(hf_model(seed=5), tmp_path_factory.mktemp("emu3run") / "hf")


def emu3_gen(folder, *more: str) -> tuple[str, ...]:
    """emu3_gen at the folder's sizes: 32 px (8 x 8 codes), 64 condition slots, no drafter (decoding=ar)."""
    common = "model.cls_token_num=64 model.bundle.target.image_size=32 prompts=captions_demo num_images=2 batch_size=2"
    return ("model=emu3_gen", f"model.gpt_ckpt={folder}", *common.split(), *TINY[2:], "decoding=ar", *more)


def test_emu3_gen_runs_an_emu3forconditionalgeneration_save_pretrained_folder(tmp_path, folder):
    """emu3_gen reads target, VQ and tokenizer from one Emu3ForConditionalGeneration folder."""
    proc = run(tmp_path / "run", *emu3_gen(folder))
    assert proc.returncode == 0, proc.stderr
    assert len(pngs(tmp_path / "run")) == 2


def test_a_folder_of_another_architecture_is_one_error_line_exit_2_and_writes_nothing(tmp_path, folder):
    """A Chameleon folder, or an Emu3ForConditionalGeneration folder whose model_type is not emu3, given to
    emu3_gen or tiny_random_emu3."""
    from helpers_chameleon import hf_model as chameleon_model
    from helpers_chameleon import save_folder as save_chameleon

    chameleon = save_chameleon(chameleon_model(), tmp_path / "chameleon")
    renamed = tmp_path / "renamed"
    shutil.copytree(folder, renamed)
    config = json.loads((renamed / "config.json").read_text())
    (renamed / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
    cases = [
        (emu3_gen(chameleon), "ChameleonForConditionalGeneration (model_type 'chameleon'), not an Emu3"),
        (emu3_gen(renamed), "(model_type 'llama'), not an Emu3ForConditionalGeneration"),
        ((*TINY, f"model.gpt_ckpt={chameleon}", "decoding=ar"), "not an Emu3ForConditionalGeneration"),
        ((*TINY, f"model.gpt_ckpt={renamed}", "decoding=ar"), "not an Emu3ForConditionalGeneration"),
    ]
    for index, (overrides, message) in enumerate(cases):
        proc = run(tmp_path / f"out{index}", *overrides)
        stderr = proc.stderr.strip()
        assert (proc.returncode, stderr.count("\n")) == (2, 0), stderr  # one line, exit 2
        assert stderr.startswith("error: ") and message in stderr, stderr
        assert not (tmp_path / f"out{index}").exists()
