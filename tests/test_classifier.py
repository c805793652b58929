"""The prompt-faithfulness classifier: model, input conversion, accuracy, strict loading, training."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from script_helpers import fashion_root, run_hydra_script
from torch import nn

from lantern.errors import CheckpointError, ConfigError
from lantern.metrics.classifier import (
    FashionClassifier,
    load_classifier,
    pad_to_world,
    prompt_accuracy,
    to_classifier_input,
)
from lantern.models.world.fashion_mnist import FashionMNISTImages, load_split
from lantern.training.classifier import ClassifierObjective, training_batch
from lantern.training.loop import EpochBatches, Trainer


@pytest.fixture(scope="module")
def test_split() -> tuple[np.ndarray, np.ndarray]:
    return load_split(None, "test")  # (10000, 28, 28) uint8, (10000,) int64


def test_forward_shapes_and_gray_input():
    torch.manual_seed(0)
    model = FashionClassifier(width=8).eval()
    gray = torch.rand(5, 1, 32, 32) * 2 - 1  # (5, 1, 32, 32)
    logits = model(gray.repeat(1, 3, 1, 1))  # (5, 10)
    assert logits.shape == (5, 10)
    torch.testing.assert_close(model(gray), logits)  # three equal channels read as one gray channel
    with pytest.raises(ConfigError, match="32, 32"):
        model(torch.zeros(2, 3, 28, 28))


def test_world_images_reach_the_model_as_training_images_do(test_split):
    images, labels = test_split
    world = pad_to_world(images[:4])  # (4, 32, 32, 3) uint8: what a generator of the world emits
    assert world.shape == (4, 32, 32, 3) and world.dtype == np.uint8
    dataset = FashionMNISTImages(images[:4], labels[:4], resolution=32)
    expected = torch.stack([dataset[i][0][:1] for i in range(4)])  # (4, 1, 32, 32)
    torch.testing.assert_close(to_classifier_input(world), expected)
    batch, y = training_batch(
        torch.from_numpy(images[:4]), torch.from_numpy(labels[:4]), torch.arange(4), augment=False
    )
    torch.testing.assert_close(batch, expected)
    assert y.tolist() == labels[:4].tolist()


def test_input_conversion_uses_the_channel_mean():
    pixels = np.zeros((1, 32, 32, 3), np.uint8)
    pixels[0, 0, 0] = (30, 60, 90)
    pixels[0, 0, 1] = 255
    x = to_classifier_input(pixels)  # (1, 1, 32, 32)
    assert x.shape == (1, 1, 32, 32)
    assert x[0, 0, 0, 0].item() == pytest.approx(60 / 127.5 - 1)
    assert x[0, 0, 0, 1].item() == 1.0 and x[0, 0, 1, 1].item() == -1.0
    with pytest.raises(ConfigError, match="uint8"):
        to_classifier_input(pixels.astype(np.float32))
    with pytest.raises(ConfigError, match=r"\(N, 32, 32, 3\)"):
        to_classifier_input(np.zeros((1, 28, 28, 3), np.uint8))


def test_augmentation_shifts_and_flips_within_the_background(test_split):
    images, labels = test_split
    torch.manual_seed(0)
    x, _ = training_batch(torch.from_numpy(images[:64]), torch.from_numpy(labels[:64]), torch.arange(64))
    assert x.shape == (64, 1, 32, 32) and x.min() >= -1 and x.max() <= 1
    plain, _ = training_batch(torch.from_numpy(images[:64]), torch.from_numpy(labels[:64]), torch.arange(64), False)
    assert not torch.equal(x, plain)
    torch.testing.assert_close(x.sum(dim=(1, 2, 3)), plain.sum(dim=(1, 2, 3)))  # nothing is cut off at +-2 px


class PixelClassifier(nn.Module):
    """Predicts class round(9 * (x + 1) / 2) from the top-left gray value: a known, exact classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.dummy = nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        classes = torch.round((x[:, 0, 0, 0] + 1) / 2 * 9).long()  # (N,)
        return F.one_hot(classes, 10).float() + self.dummy  # (N, 10)


def test_prompt_accuracy_on_a_hand_made_case():
    classes = np.array([0, 3, 5, 9, 2])
    images = np.zeros((5, 32, 32, 3), np.uint8)
    images[:, 0, 0, :] = np.round(classes * 255 / 9).astype(np.uint8)[:, None]
    model = PixelClassifier().train()
    assert prompt_accuracy(model, images, classes, batch_size=2) == 1.0
    assert prompt_accuracy(model, images, [0, 3, 5, 9, 1], batch_size=2) == pytest.approx(0.8)
    assert prompt_accuracy(model, images, [1, 1, 1, 1, 1]) == 0.0
    assert model.training  # the caller's mode is restored
    with pytest.raises(ConfigError, match="match the images"):
        prompt_accuracy(model, images, [0, 1])
    with pytest.raises(ConfigError, match="0..9"):
        prompt_accuracy(model, images, [0, 1, 2, 3, 10])


def test_loader_is_strict(tmp_path):
    torch.manual_seed(0)
    model = FashionClassifier(width=4)
    path = tmp_path / "classifier.safetensors"
    save_file({k: v.half() if v.is_floating_point() else v for k, v in model.state_dict().items()}, str(path))
    loaded = load_classifier(path, width=4)
    assert not loaded.training
    torch.testing.assert_close(loaded.head[2].weight, model.head[2].weight.half().float())
    with pytest.raises(CheckpointError, match="wrong shape"):
        load_classifier(path, width=8)
    with pytest.raises(CheckpointError, match="not found"):
        load_classifier(tmp_path / "missing.safetensors", width=4)
    extra = dict(load_file(str(path)))
    extra["head.bias_extra"] = torch.zeros(1)
    save_file(extra, str(tmp_path / "extra.safetensors"))
    with pytest.raises(CheckpointError, match="unexpected 1: head.bias_extra"):
        load_classifier(tmp_path / "extra.safetensors", width=4)


def test_training_reduces_the_loss(test_split, tmp_path):
    images, labels = (torch.from_numpy(a[:320]) for a in test_split)
    torch.manual_seed(0)
    model = FashionClassifier(width=8)
    objective = ClassifierObjective(model)
    x, y = training_batch(images, labels, torch.arange(320), augment=False)

    def eval_loss() -> float:
        model.eval()
        with torch.no_grad():
            loss = F.cross_entropy(model(x), y).item()
        model.train()
        return loss

    before = eval_loss()
    load = functools.partial(training_batch, images, labels)
    trainer = Trainer(
        model,
        torch.optim.AdamW(model.parameters(), lr=3e-3),
        objective,
        EpochBatches(320, 32, 0, load),
        max_steps=30,
        out_dir=tmp_path,
        ckpt_every=30,
        log_every=10,
        progress=False,
    )
    trainer.fit()
    assert eval_loss() < 0.7 * before


def test_script_without_data_prints_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_hydra_script("train_classifier", [f"data_root={tmp_path / 'nowhere'}", f"out_dir={tmp_path / 'out'}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: Fashion-MNIST train split not found") and "\n" not in err
    assert not (tmp_path / "out").exists()


def test_script_trains_exports_and_resumes(test_split, tmp_path, capsys):
    images, labels = test_split
    root = fashion_root(tmp_path / "data", images, labels, train=128, test=50)
    out = tmp_path / "out"
    argv = [
        f"data_root={str(root)}",
        f"test_root={str(root)}",
        f"out_dir={str(out)}",
        "steps=3",
        "batch_size=32",
        "width=4",
        "progress=false",
        "log_every=1",
        "ckpt_every=1",
    ]
    run_hydra_script("train_classifier", argv)
    report = json.loads((out / "classifier_report.json").read_text())
    assert 0.0 <= report["test"]["accuracy"] <= 1.0 and report["test"]["images"] == 50
    assert report["training"]["steps"] == 3 and report["training"]["resumed_from"] is None
    weights = load_file(str(out / "classifier.safetensors"))
    assert all(v.dtype == torch.float16 for k, v in weights.items() if "num_batches" not in k)
    load_classifier(out / "classifier.safetensors", width=4)
    run_hydra_script("train_classifier", [*argv, "steps=5"])
    report = json.loads((out / "classifier_report.json").read_text())
    assert report["training"]["steps"] == 5 and report["training"]["resumed_from"] == 3
    assert "test accuracy" in capsys.readouterr().out
