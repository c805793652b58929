"""HPSv2.1 on a tiny open_clip architecture: equal to the hpsv2 package's own scoring on the same weights."""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from lantern.errors import CheckpointError, ConfigError
from lantern.files import image_name
from lantern.metrics import features as shared
from lantern.metrics.hps import HPSv2, hps_input
from lantern.metrics.intervals import bootstrap_mean

NAME = "lantern-tiny-hps"
TINY = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 48, "layers": 1, "width": 64, "patch_size": 8},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}


def _hpsv2():
    """The hpsv2 package's open_clip fork (its top-level import wants ``clint`` for downloads only)."""
    if importlib.util.find_spec("hpsv2") is None:
        pytest.skip("the hpsv2 package (reference implementation) is not installed")
    package = Path(importlib.util.find_spec("hpsv2").submodule_search_locations[0])
    if not (package / "src" / "open_clip" / "bpe_simple_vocab_16e6.txt.gz").is_file():
        pytest.skip("hpsv2 1.2.0's wheel lacks src/open_clip/bpe_simple_vocab_16e6.txt.gz: copy open_clip's there")
    if importlib.util.find_spec("clint") is None and "clint" not in sys.modules:
        clint, textui = types.ModuleType("clint"), types.ModuleType("clint.textui")
        textui.progress = None
        clint.textui = textui
        sys.modules.update({"clint": clint, "clint.textui": textui})
    return importlib.import_module("hpsv2.src.open_clip")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(config path, HPS-format checkpoint, the hpsv2 model and its validation transform)."""
    folder = tmp_path_factory.mktemp("hps")
    config = folder / f"{NAME}.json"
    config.write_text(json.dumps(TINY))
    fork = _hpsv2()
    fork.add_model_config(str(config))
    torch.manual_seed(0)
    model, _, preprocess_val = fork.create_model_and_transforms(
        NAME, None, precision="fp32", device="cpu", light_augmentation=True, output_dict=True
    )
    checkpoint = folder / "HPS_v2.1_compressed.pt"
    torch.save({"state_dict": model.state_dict()}, checkpoint)
    return str(config), str(checkpoint), model.eval(), preprocess_val, fork.get_tokenizer(NAME)


def _theirs(tiny, images, captions) -> np.ndarray:
    """hpsv2.img_score.score's computation, one image at a time, on CPU."""
    _, _, model, preprocess_val, tokenizer = tiny
    scores = []
    with torch.no_grad():
        for image, caption in zip(images, captions, strict=True):
            pixels = preprocess_val(Image.fromarray(image)).unsqueeze(0)
            outputs = model(pixels, tokenizer([caption]))
            scores.append(torch.diagonal(outputs["image_features"] @ outputs["text_features"].T).item())
    return np.array(scores)


def test_scores_equal_the_hpsv2_package(tiny):
    config, checkpoint, *_ = tiny
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) for _ in range(3)]
    captions = ["A cat on a mat.", "two DOGS, running!", "an astronaut riding a horse"]
    metric = HPSv2(checkpoint, NAME, config, batch_size=2)
    ours = metric.per_prompt(np.stack(images), captions)
    theirs = _theirs(tiny, images, captions)
    assert np.abs(ours - theirs).max() < 1e-5
    assert not np.allclose(ours, metric.per_prompt(np.stack(images), captions[::-1]))  # the caption matters


def test_the_transform_is_the_packages_and_pads_a_wide_image(tiny):
    preprocess_val = tiny[3]
    wide = np.random.default_rng(1).integers(0, 256, (20, 40, 3), dtype=np.uint8)  # (H, W): padded top and bottom
    for image in (wide, wide[:, :20]):
        ours, theirs = hps_input(image, 48), preprocess_val(Image.fromarray(image))
        assert ours.shape == theirs.shape == (3, 48, 48)
        torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)
    bilinear = torch.nn.functional.interpolate(
        torch.from_numpy(wide[:, :20]).permute(2, 0, 1)[None].float() / 255, size=(48, 48), mode="bilinear"
    )[0]
    assert (hps_input(wide[:, :20], 48) - (bilinear - 0.45) / 0.27).abs().max() > 1e-2  # a wrong resize shows


def test_record_and_interval(tiny, tmp_path):
    config, checkpoint, *_ = tiny
    shared.forget()
    images = np.random.default_rng(2).integers(0, 256, (6, 32, 32, 3), dtype=np.uint8)
    for i, image in enumerate(images):
        Image.fromarray(image).save(tmp_path / image_name(i))
    captions = [f"a photo of thing {i}" for i in range(6)]
    metric = HPSv2(checkpoint, NAME, config, interval_resamples=200)
    metric.check(captions)
    fields = metric(tmp_path, captions, None)
    per_prompt = _theirs(tiny, list(images), captions)
    assert fields["hps"] == pytest.approx(per_prompt.mean(), abs=1e-6)
    expected = bootstrap_mean(metric.per_prompt(images, captions), 200, 0)
    assert (fields["hps_ci"]["lo"], fields["hps_ci"]["hi"]) == pytest.approx((expected.lo, expected.hi))


def test_bad_checkpoints_are_one_error(tiny, tmp_path):
    config, checkpoint, *_ = tiny
    with pytest.raises(ConfigError, match="file not found"):
        HPSv2(str(tmp_path / "none.pt"), NAME, config).check(["a"])
    state = torch.load(checkpoint)["state_dict"]
    del state["logit_scale"]
    torch.save({"state_dict": state}, tmp_path / "partial.pt")
    with pytest.raises(CheckpointError, match="missing 1: logit_scale"):
        HPSv2(str(tmp_path / "partial.pt"), NAME, config).check(["a"])
    (tmp_path / "text.pt").write_text("nope")
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        HPSv2(str(tmp_path / "text.pt"), NAME, config).check(["a"])
    with pytest.raises(ConfigError, match="text prompts"):
        HPSv2(checkpoint, NAME, config).check([3])


@pytest.mark.slow
def test_the_vit_h_14_checkpoint_layout_loads_strictly(tmp_path):
    """The hpsv2 fork's ViT-H-14 state dict (the layout of HPS_v2.1_compressed.pt) loads into ours strictly."""
    import open_clip

    fork = _hpsv2()
    with torch.device("meta"):
        theirs = fork.create_model("ViT-H-14", None, precision="fp32", device="meta")
        ours = open_clip.create_model("ViT-H-14", pretrained=None, device="meta")
    their_keys = {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
    our_keys = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    assert their_keys == our_keys
