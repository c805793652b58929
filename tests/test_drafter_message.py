"""The missing-drafter message (issue 56, item 6) names the decoders that need no drafter, derived from their configs:
every conf/decoding option whose composed ``decoding`` node has no ``drafter`` key (sjd_pac and sjd_pp among them),
and those run on a folder with no drafter while a drafting decoder is refused in one line."""

from __future__ import annotations

import pytest
from helpers import REPO, run_in_process
from helpers_janus import hf_model, save_folder
from hydra import compose, initialize_config_dir

from lantern.errors import ConfigError
from lantern.models.bundle import drafterless_decoders, require_drafter

OPTIONS = sorted(p.stem for p in (REPO / "conf" / "decoding").glob("*.yaml"))


def test_the_message_names_exactly_the_decoders_whose_config_asks_for_no_drafter():
    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "conf")):
        composed = {name: compose("config", overrides=[f"decoding={name}"]).decoding for name in OPTIONS}
    needless = [name for name, node in composed.items() if "drafter" not in node]
    assert drafterless_decoders() == needless and {"ar", "sjd", "sjd_pac", "sjd_pp"} <= set(needless)
    assert "lantern" not in needless and "eagle" not in needless
    with pytest.raises(ConfigError) as raised:
        require_drafter(None, "a folder")
    listed = ", ".join(needless[:-1]) + f" and {needless[-1]}"
    assert str(raised.value).endswith(f"decoding={listed} need no drafter"), str(raised.value)


@pytest.fixture(scope="module")
def janus_folder(tmp_path_factory):
    return save_folder(hf_model(seed=5), tmp_path_factory.mktemp("janus_drafterless") / "hf", shard="100KB")


def janus(folder) -> tuple[str, ...]:
    """janus_pro_1b on a tiny folder, which has no drafter (model.drafter_ckpt stays null)."""
    return (
        "model=janus_pro_1b",
        f"model.gpt_ckpt={folder}",
        "model.cls_token_num=24",
        "model.bundle.target.image_size=16",
        "model.bundle.target.architecture=null",
        "prompts=captions_demo",
        "num_images=1",
        "speedup_baseline=null",
        "warmup=0",
        "wandb.mode=disabled",
    )


def test_sjd_pac_and_sjd_pp_run_without_a_drafter_and_lantern_is_refused_naming_them(
    tmp_path, monkeypatch, janus_folder
):
    for name in ("sjd_pac", "sjd_pp"):
        status, _, err = run_in_process([f"decoding={name}"], tmp_path / name, monkeypatch, base=janus(janus_folder))
        assert status == 0, err
    status, _, err = run_in_process(["decoding=lantern"], tmp_path / "lantern", monkeypatch, base=janus(janus_folder))
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2 and len(lines) == 1 and "no drafter checkpoint given" in lines[0], err
    assert "sjd_pac" in lines[0] and "sjd_pp" in lines[0] and not (tmp_path / "lantern").exists()
