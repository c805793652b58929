"""The embedded world's small CLIP: preprocessing, objective, training script and the shipped weights."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
from script_helpers import fashion_root, run_hydra_script

from lantern.metrics.classifier import pad_to_world
from lantern.metrics.clip import CLIPScore, encode_images, encode_texts
from lantern.models.world.fashion_mnist import CLASS_NAMES, NUM_CLASSES, all_captions, caption_for, load_split
from lantern.models.world.load import DEFAULT_WORLD, verify_world, world_file
from lantern.training.clip import (
    CONFIG_NAME,
    MODEL_NAME,
    PREFIX,
    WEIGHTS_NAME,
    caption_table,
    clip_batch,
    soft_clip_loss,
    zero_shot_scores,
)

TINY_ARGS = [
    "embed_dim=16",
    "vision_width=32",
    "vision_layers=1",
    "vision_head_width=16",
    "text_width=16",
    "text_heads=2",
    "text_layers=1",
]


@pytest.fixture(scope="module")
def test_split() -> tuple[np.ndarray, np.ndarray]:
    return load_split(None, "test")  # (10000, 28, 28) uint8, (10000,) int64


@pytest.fixture(scope="module")
def world_scorer() -> CLIPScore:
    if CONFIG_NAME not in json.loads((DEFAULT_WORLD / "manifest.json").read_text())["files"]:
        pytest.skip("the world's CLIP is not shipped in this checkout")
    verify_world(DEFAULT_WORLD)
    return CLIPScore(world_file(None, WEIGHTS_NAME), MODEL_NAME, "lantern", world_file(None, CONFIG_NAME))


def test_training_pixels_are_what_open_clip_preprocess_gives(test_split, world_scorer):
    images, labels = test_split
    pixels, y, _ = clip_batch(
        torch.from_numpy(images[:8]), torch.from_numpy(labels[:8]), torch.arange(8), augment=False
    )  # (8, 3, 32, 32)
    _, preprocess, _ = world_scorer.load()
    expected = torch.stack([preprocess(Image.fromarray(im)) for im in pad_to_world(images[:8])])  # (8, 3, 32, 32)
    torch.testing.assert_close(pixels, expected, atol=1e-5, rtol=0)
    assert y.tolist() == labels[:8].tolist()


def test_caption_ids_index_the_table_with_the_prefix_on_about_half(test_split):
    images, labels = (torch.from_numpy(a[:512]) for a in test_split)
    table = caption_table()
    assert len(table) == 2 * NUM_CLASSES * 7 and table[70 + 9 * 7] == PREFIX + all_captions(9)[0]
    torch.manual_seed(0)
    _, y, ids = clip_batch(images, labels, torch.arange(512))
    captions = [table[i] for i in ids.tolist()]
    assert all(CLASS_NAMES[label] in caption for label, caption in zip(y.tolist(), captions, strict=True))
    prefixed = np.mean([c.startswith(PREFIX) for c in captions])
    assert 0.4 < prefixed < 0.6
    assert len({c.removeprefix(PREFIX) for c in captions if CLASS_NAMES[3] in c}) == 7  # every template is drawn
    _, _, plain = clip_batch(images, labels, torch.arange(512), prefix_prob=0.0)
    assert int(plain.max()) < 70


def test_soft_targets_do_not_punish_same_class_pairs():
    labels = torch.tensor([0, 0, 1, 1])  # (4,)
    by_class = torch.eye(2)[labels]  # (4, 2): every item of a class embedded alike
    by_item = torch.eye(4)  # (4, 4): every item apart from all others
    scale = torch.tensor(math.log(100.0))
    soft_class, _ = soft_clip_loss(by_class, by_class, labels, scale)
    soft_item, _ = soft_clip_loss(by_item, by_item, labels, scale)
    plain_class, _ = soft_clip_loss(by_class, by_class, labels, scale, same_class_targets=False)
    plain_item, _ = soft_clip_loss(by_item, by_item, labels, scale, same_class_targets=False)
    assert soft_class.item() == pytest.approx(math.log(2), abs=1e-4)  # the entropy of the targets: optimal
    assert soft_item.item() > 10 * soft_class.item()
    assert plain_item.item() == pytest.approx(0.0, abs=1e-4) and plain_class.item() > 0.5  # InfoNCE prefers items


def test_zero_shot_scores_on_a_hand_made_case():
    text = torch.nn.functional.normalize(
        torch.randn(NUM_CLASSES * 7, 8, generator=torch.Generator().manual_seed(0)), dim=-1
    )
    class_emb = torch.nn.functional.normalize(text.view(NUM_CLASSES, 7, 8).mean(dim=1), dim=-1)  # (10, 8)
    labels = np.array([0, 1, 2, 3])
    images = class_emb[[0, 1, 2, 5]]  # (4, 8): the last image looks like class 5, not 3
    scores = zero_shot_scores(images, text, labels)
    assert scores["zero_shot_accuracy"] == pytest.approx(0.75)
    cos = (images @ text.T).view(4, NUM_CLASSES, 7)  # (4, 10, 7)
    assert scores["matched_cosine"] == pytest.approx(float(cos[torch.arange(4), torch.as_tensor(labels)].mean()))


def test_script_trains_exports_resumes_and_the_file_loads_through_clipscore(test_split, tmp_path, capsys):
    images, labels = test_split
    root = fashion_root(tmp_path / "data", images, labels, train=128, test=40)
    out = tmp_path / "out"
    argv = [
        f"data_root={str(root)}",
        f"test_root={str(root)}",
        f"out_dir={str(out)}",
        "steps=2",
        "batch_size=32",
        "progress=false",
        "log_every=1",
        "ckpt_every=1",
        "score_images=10",
        *TINY_ARGS,
    ]
    run_hydra_script("train_clip", argv)
    report = json.loads((out / "clip_report.json").read_text())
    assert report["training"]["steps"] == 2 and report["training"]["resumed_from"] is None
    assert set(report["test"]["conventions"]) == {"lantern", "torchmetrics"} and report["test"]["images"] == 40
    assert 0.0 <= report["test"]["conventions"]["lantern"]["zero_shot_accuracy"] <= 1.0
    weights = load_file(str(out / WEIGHTS_NAME))
    assert all(v.dtype == torch.float16 for v in weights.values() if v.is_floating_point())
    config = json.loads((out / CONFIG_NAME).read_text())
    assert config["text_cfg"]["width"] == 16 and config["vision_cfg"]["image_size"] == 32
    world = pad_to_world(images[-4:])  # (4, 32, 32, 3)
    captions = [caption_for(int(y), i) for i, y in enumerate(labels[-4:])]
    score = CLIPScore(str(out / WEIGHTS_NAME), MODEL_NAME, "lantern", str(out / CONFIG_NAME)).score(world, captions)
    assert -1.0 <= score <= 1.0
    assert report["test"]["clip_score"]["lantern"]["matched"] == pytest.approx(
        CLIPScore(str(out / WEIGHTS_NAME), MODEL_NAME, "lantern", str(out / CONFIG_NAME)).score(
            pad_to_world(images[-40:-30]), [caption_for(int(y), i) for i, y in enumerate(labels[-40:-30])]
        ),
        abs=1e-5,
    )
    run_hydra_script("train_clip", [*argv, "steps=3"])
    report = json.loads((out / "clip_report.json").read_text())
    assert report["training"]["steps"] == 3 and report["training"]["resumed_from"] == 2
    assert "zero-shot accuracy" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["steps=0"], "steps=0: expected an integer >= 1"),
        (["lr=nan"], "lr=nan: expected a finite number > 0"),
        (["prefix_prob=1.5"], "prefix_prob=1.5: expected a number in [0, 1]"),
        (["patch_size=5"], "patch_size must divide the image size 32"),
        (["context_length=8"], "context_length 8 is too short"),
        (["data_root=NOWHERE"], "Fashion-MNIST train split not found"),
        (["stepz=3"], "stepz"),
    ],
)
def test_bad_arguments_print_one_line_and_exit_2(argv, message, tmp_path, capsys):
    argv = [a.replace("NOWHERE", str(tmp_path / "nowhere")) for a in argv]
    with pytest.raises(SystemExit) as exit_info:
        run_hydra_script("train_clip", [*argv, f"out_dir={tmp_path / 'out'}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err
    assert not (tmp_path / "out").exists()


def test_shipped_clip_scores_matching_captions_above_mismatched_ones(test_split, world_scorer):
    images, labels = test_split
    world, labels = pad_to_world(images[:200]), labels[:200]  # (200, 32, 32, 3), (200,)
    clip, preprocess, tokenizer = world_scorer.load()
    image_emb = encode_images(clip, preprocess, world)  # (200, E)
    plain = [c for label in range(NUM_CLASSES) for c in all_captions(label)]  # (70,)
    for prefix in ("", PREFIX):
        scores = zero_shot_scores(image_emb, encode_texts(clip, tokenizer, [prefix + c for c in plain]), labels)
        assert scores["zero_shot_accuracy"] > 0.8, scores
        assert scores["matched_cosine"] > scores["mismatched_cosine"] + 0.2, scores
    matched = [caption_for(int(y), i) for i, y in enumerate(labels)]
    mismatched = [caption_for((int(y) + 5) % NUM_CLASSES, i) for i, y in enumerate(labels)]
    assert world_scorer.score(world, matched) > world_scorer.score(world, mismatched) + 0.2
    torchmetrics = CLIPScore(world_scorer.pretrained, MODEL_NAME, "torchmetrics", world_scorer.model_config)
    assert torchmetrics.score(world, matched) > torchmetrics.score(world, mismatched) + 20
