"""CLIP score through open_clip on a tiny architecture with weights from a local file (no network)."""

import json

import numpy as np
import pytest
import torch

from lantern.errors import ConfigError
from lantern.metrics.clip import CLIPScore, _load, clip_cosines

TINY = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 64, "patch_size": 8},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}


@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory):
    import open_clip

    folder = tmp_path_factory.mktemp("clip")
    config = folder / "lantern-tiny-clip.json"
    config.write_text(json.dumps(TINY))
    open_clip.add_model_config(str(config))
    torch.manual_seed(0)
    model = open_clip.create_model("lantern-tiny-clip")
    weights = folder / "tiny.pt"
    torch.save(model.state_dict(), weights)
    return str(config), str(weights)


def test_both_conventions_score_the_same_cosines(tiny_clip):
    config, weights = tiny_clip
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(3, 32, 32, 3), dtype=np.uint8)
    captions = ["a shirt", "a bag", "an ankle boot"]
    clip, preprocess, tokenizer = _load("lantern-tiny-clip", weights, config, "cpu")
    prefixed = clip_cosines(clip, preprocess, tokenizer, images, ["A photo depicts " + c for c in captions])
    plain = clip_cosines(clip, preprocess, tokenizer, images, captions)
    lantern = CLIPScore(weights, "lantern-tiny-clip", "lantern", config).score(images, captions)
    metrics = CLIPScore(weights, "lantern-tiny-clip", "torchmetrics", config).score(images, captions)
    assert lantern == pytest.approx(float(prefixed.mean()), abs=1e-6)
    assert metrics == pytest.approx(max(float(100 * plain.mean()), 0.0), abs=1e-4)  # torchmetrics clamps the mean
    assert not np.allclose(prefixed, plain)  # the prefix changes the text embedding


def test_missing_weights_and_bad_settings_are_refused(tiny_clip, tmp_path):
    config, _ = tiny_clip
    images = np.zeros((1, 32, 32, 3), dtype=np.uint8)
    with pytest.raises(ConfigError, match="CLIP weights not found"):
        CLIPScore(str(tmp_path / "none.pt"), "lantern-tiny-clip", model_config=config).score(images, ["a"])
    with pytest.raises(ConfigError, match="convention='x100'"):
        CLIPScore("w.pt", convention="x100")
    with pytest.raises(ConfigError, match="needs text prompts"):
        CLIPScore("w.pt").score(images, [3])


def test_config_file_must_be_named_after_the_model(tiny_clip, tmp_path):
    config, weights = tiny_clip
    renamed = tmp_path / "clip_config.json"
    renamed.write_text(open(config).read())
    with pytest.raises(ConfigError, match="registers .* as model 'clip_config', not 'lantern-tiny-clip'"):
        CLIPScore(weights, "lantern-tiny-clip", model_config=str(renamed)).score(
            np.zeros((1, 32, 32, 3), np.uint8), ["a"]
        )


def test_the_loaded_model_is_kept_between_scores(tiny_clip):
    config, weights = tiny_clip
    metric = CLIPScore(weights, "lantern-tiny-clip", "lantern", config)
    assert metric._loaded is None  # constructing does no I/O
    images = np.zeros((2, 32, 32, 3), np.uint8)
    first = metric.score(images, ["a shirt", "a bag"])
    loaded = metric.load()
    assert metric.score(images, ["a shirt", "a bag"]) == first and metric.load() is loaded


def test_the_record_carries_the_score_and_its_interval_in_each_convention(tiny_clip, tmp_path):
    from PIL import Image

    from lantern.files import image_name
    from lantern.metrics.intervals import bootstrap_mean

    config, weights = tiny_clip
    images = np.random.default_rng(4).integers(0, 256, size=(12, 32, 32, 3), dtype=np.uint8)
    for i, image in enumerate(images):
        Image.fromarray(image).save(tmp_path / image_name(i))
    captions = [f"caption {i}" for i in range(12)]
    for convention, scale in (("lantern", 1.0), ("torchmetrics", 100.0)):
        metric = CLIPScore(weights, "lantern-tiny-clip", convention, config, interval_resamples=300, interval_seed=2)
        fields = metric(tmp_path, captions, None)
        per_prompt = metric.per_prompt(images, captions)  # (12,) cosines
        assert fields["clip_score"] == pytest.approx(max(scale * per_prompt.mean(), 0), rel=1e-6)
        expected = bootstrap_mean(per_prompt, 300, 2, scale=scale)
        ci = fields["clip_score_ci"]
        assert (ci["lo"], ci["hi"]) == pytest.approx((expected.lo, expected.hi), rel=1e-6)
        assert ci["lo"] <= scale * per_prompt.mean() <= ci["hi"] and ci["resamples"] == 300
    unscored = CLIPScore(weights, "lantern-tiny-clip", "lantern", config, interval_resamples=None)
    assert "clip_score_ci" not in unscored(tmp_path, captions, None)
