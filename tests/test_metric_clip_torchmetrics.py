"""torchmetrics' CLIPScore from a local HF folder: a tiny random CLIPModel saved with save_pretrained."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from lantern.errors import CheckpointError, ConfigError
from lantern.files import image_name
from lantern.metrics import features as shared
from lantern.metrics.clip_torchmetrics import TorchmetricsCLIPScore
from lantern.metrics.intervals import bootstrap_mean


def _byte_vocab() -> dict[str, int]:
    """A CLIP BPE vocabulary of single bytes only (GPT-2's byte-to-unicode table), with the specials."""
    from open_clip.tokenizer import bytes_to_unicode

    chars = list(bytes_to_unicode().values())
    tokens = chars + [c + "</w>" for c in chars] + ["<|startoftext|>", "<|endoftext|>"]
    return {t: i for i, t in enumerate(tokens)}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer

    root = tmp_path_factory.mktemp("hf_clip")
    vocab = _byte_vocab()
    (root / "vocab.json").write_text(json.dumps(vocab))
    (root / "merges.txt").write_text("#version: 0.2\n")
    tokenizer = CLIPTokenizer(str(root / "vocab.json"), str(root / "merges.txt"))
    images = CLIPImageProcessor(size={"shortest_edge": 40}, crop_size={"height": 40, "width": 40})
    torch.manual_seed(0)
    config = CLIPConfig(
        text_config={"vocab_size": len(vocab), "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1,
                     "num_attention_heads": 2, "max_position_embeddings": 77,
                     "bos_token_id": vocab["<|startoftext|>"], "eos_token_id": vocab["<|endoftext|>"]},
        vision_config={"image_size": 40, "patch_size": 8, "hidden_size": 32, "intermediate_size": 48,
                       "num_hidden_layers": 1, "num_attention_heads": 2},
        projection_dim=16,
    )  # fmt: skip
    CLIPModel(config).save_pretrained(root)
    CLIPProcessor(image_processor=images, tokenizer=tokenizer).save_pretrained(root)
    return root


def _write_run(folder, images):
    for i, image in enumerate(images):
        Image.fromarray(image).save(folder / image_name(i))


def test_scores_are_torchmetrics_clipscore(folder, tmp_path):
    from torchmetrics.multimodal.clip_score import CLIPScore

    shared.forget()
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (5, 32, 48, 3), dtype=np.uint8)  # not square: the processor crops
    captions = ["a red bus", "two cats", "A Kitchen, with a stove.", "sky", "a man riding a horse on a beach"]
    _write_run(tmp_path, images)
    metric = TorchmetricsCLIPScore(str(folder), batch_size=2, interval_resamples=300)
    metric.check(captions)
    fields = metric(tmp_path, captions, None)
    model, processor = metric.metric().model, metric.metric().processor
    reference = CLIPScore(model_name_or_path=lambda: (model, processor))
    per_image = []
    for image, caption in zip(images, captions, strict=True):
        single = CLIPScore(model_name_or_path=lambda: (model, processor))
        single.update(torch.from_numpy(image).permute(2, 0, 1), caption)
        per_image.append(float(single.compute()))
        reference.update(torch.from_numpy(image).permute(2, 0, 1)[None], [caption])
    ours = metric.per_prompt(images, captions)
    positive = ours > 0
    np.testing.assert_allclose(ours[positive], np.array(per_image)[positive], atol=1e-4)  # compute clamps at 0
    assert fields["clip_score"] == pytest.approx(float(reference.compute()), abs=1e-4)
    with torch.no_grad():  # the x100 scale of a plain cosine
        pixels = processor(images=list(images), return_tensors="pt")["pixel_values"]
        text = processor(text=captions, return_tensors="pt", padding=True)
        clip = model.clip  # the HF CLIPModel itself (transformers 5: projections in pooler_output)
        cos = torch.nn.functional.cosine_similarity(
            clip.get_image_features(pixels).pooler_output,
            clip.get_text_features(text["input_ids"], text["attention_mask"]).pooler_output,
        )
    np.testing.assert_allclose(ours, 100 * cos.numpy(), atol=1e-4)
    expected = bootstrap_mean(ours, 300, 0)
    assert (fields["clip_score_ci"]["lo"], fields["clip_score_ci"]["hi"]) == (expected.lo, expected.hi)


def test_bad_folders_are_one_error(tmp_path, folder):
    with pytest.raises(ConfigError, match="no config.json"):
        TorchmetricsCLIPScore(str(tmp_path)).check(["a"])
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="not a loadable CLIPModel"):
        TorchmetricsCLIPScore(str(tmp_path)).check(["a"])
    with pytest.raises(ConfigError, match="text prompts"):
        TorchmetricsCLIPScore(str(folder)).check([1])
