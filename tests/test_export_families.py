"""``scripts/export_hf.py`` for the Chameleon family (Anole and Lumina-mGPT layouts): the target is written as an
HF ``ChameleonForConditionalGeneration`` folder that transformers loads with no missing or unexpected key and
equal tensors, and that run.py reads back to the same PNGs, with the drafter beside it; a Janus target, which
keeps only a folder's generation path, is refused in one line (its drafter exports)."""

from __future__ import annotations

import pytest
import torch
from family_helpers import pngs, run
from script_helpers import run_hydra_script

pytest.importorskip("transformers")


def export(preset: str, out, *overrides: str) -> None:
    run_hydra_script("export_hf", [f"model={preset}", f"out_dir={out}", *overrides])


@pytest.mark.parametrize("preset", ["tiny_random_chameleon", "tiny_random_lumina"])
def test_a_chameleon_target_exports_as_a_folder_transformers_loads_and_run_py_reads_back(tmp_path, preset):
    from family_helpers import REPO
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate
    from transformers import ChameleonForConditionalGeneration
    from transformers.utils import logging

    export(preset, tmp_path / "hf")
    folder = tmp_path / "hf" / "target"
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]

    logging.set_verbosity_error()
    theirs, info = ChameleonForConditionalGeneration.from_pretrained(folder, output_loading_info=True)
    assert not any(info.values()), info  # no missing, unexpected or mismatched key
    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "conf")):
        cfg = compose("config", overrides=[f"model={preset}"])
    bundle = instantiate(cfg.model.bundle)
    mine = {**bundle.target.state_dict(), **{f"model.vqmodel.{k}": v for k, v in bundle.vq.state_dict().items()}}
    state = theirs.state_dict()
    assert len(state) > 20
    for name, tensor in state.items():
        assert torch.equal(tensor, mine[name]), name  # every tensor of the folder is the preset's own

    common = (f"model={preset}", "num_images=2", "temperature=0", "speedup_baseline=null", "decoding=eagle")
    given = run(tmp_path / "preset", *common)
    read = run(tmp_path / "read", *common, f"model.gpt_ckpt={folder}", f"model.drafter_ckpt={tmp_path / 'hf/drafter'}")
    assert given.returncode == 0 and read.returncode == 0, given.stderr + read.stderr
    assert len(pngs(tmp_path / "preset")) == 2 and pngs(tmp_path / "read") == pngs(tmp_path / "preset")


def test_a_janus_target_is_refused_in_one_line_and_its_drafter_exports(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        export("tiny_random_janus", tmp_path / "both")
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1 and err[0].startswith("error: model=tiny_random_janus")
    assert "parts=[drafter]" in err[0] and not (tmp_path / "both").exists()
    with pytest.raises(SystemExit):  # before any file is read: the 7B preset's folder need not exist
        export("janus_pro_7b", tmp_path / "seven", "model.gpt_ckpt=/nonexistent/Janus-Pro-7B")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: model=janus_pro_7b: a Janus target keeps only")
    export("tiny_random_janus", tmp_path / "drafter", "parts=[drafter]")
    assert (tmp_path / "drafter" / "drafter" / "model.safetensors").is_file()
