"""KID and IS: equal to torch-fidelity's statistics (and torchmetrics' kernel) on the same features."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from lantern.errors import CheckpointError, ConfigError
from lantern.files import image_name
from lantern.metrics import features as shared
from lantern.metrics.bootstrap import SHIFTED
from lantern.metrics.kid_is import KID, InceptionScore, ResampledMMD, inception_score, kid


@pytest.fixture(autouse=True)
def _fresh():
    shared.forget()
    yield
    shared.forget()


def test_kid_equals_torch_fidelity_and_the_full_set_mmd():
    fidelity = pytest.importorskip("torch_fidelity.metric_kid")
    rng = np.random.default_rng(0)
    generated, reference = rng.normal(0.1, 1, (60, 16)), rng.normal(0, 1, (70, 16))
    mean, std, size = kid(generated, reference, subsets=20, subset_size=30, seed=7)
    theirs = fidelity.kid_features_to_metric(
        torch.from_numpy(generated), torch.from_numpy(reference), kid_subsets=20, kid_subset_size=30, rng_seed=7, verbose=False,
    )  # fmt: skip
    assert (mean, std) == pytest.approx(
        (theirs["kernel_inception_distance_mean"], theirs["kernel_inception_distance_std"]), rel=1e-9
    )
    from torchmetrics.image.kid import poly_mmd

    full = float(poly_mmd(torch.from_numpy(reference[:60]), torch.from_numpy(generated)))  # it assumes equal sizes
    assert ResampledMMD(generated, reference[:60])(np.arange(60)) == pytest.approx(full, rel=1e-9)
    assert size == 30 and kid(generated, reference, 2, 500)[2] == 60  # lowered to the smaller set


def test_inception_score_equals_torch_fidelity():
    fidelity = pytest.importorskip("torch_fidelity.metric_isc")
    logits = np.random.default_rng(1).normal(0, 3, (95, 1008))
    ours = inception_score(logits, splits=10)
    theirs = fidelity.isc_features_to_metric(torch.from_numpy(logits), splits=10, shuffle=True, rng_seed=2020)
    assert ours == pytest.approx((theirs["inception_score_mean"], theirs["inception_score_std"]), rel=1e-12)
    assert inception_score(np.zeros((10, 1008)), splits=1) == (1.0, 0.0)  # one class for all: IS 1
    sharp = np.eye(1008)[np.arange(50) % 10] * 50  # 10 classes, confident: IS ~10
    assert inception_score(sharp, splits=1)[0] == pytest.approx(10, rel=1e-3)


class Pixels:
    net_id = "pixels-2048"

    def features(self, images, batch_size=32, progress=True):
        flat = np.asarray(images, np.float64).reshape(len(images), -1)  # (N, 48)
        return np.tile(flat, (1, 2048 // flat.shape[1] + 1))[:, :2048] / 255  # (N, 2048)


def _run(tmp_path, images):
    for i, image in enumerate(images):
        Image.fromarray(image).save(tmp_path / image_name(i))
    return tmp_path


def test_records_and_intervals(tmp_path):
    rng = np.random.default_rng(2)
    run_dir = _run(tmp_path, rng.integers(0, 256, (24, 4, 4, 3), dtype=np.uint8))
    reference = rng.integers(0, 256, (30, 4, 4, 3), dtype=np.uint8)
    metric = KID("toy", lambda: reference, subsets=5, subset_size=20, extractor=Pixels(), progress=False,
                 interval_resamples=30)  # fmt: skip
    metric.check(["p"] * 24)
    fields = metric(run_dir, ["p"] * 24, None)
    assert fields["kid_ci"]["method"] == SHIFTED and fields["kid_subset_size"] == 20
    layer = tmp_path / "fc.pth"
    torch.manual_seed(0)
    torch.save({"fc.weight": torch.randn(1008, 2048) * 0.05, "fc.bias": torch.randn(1008)}, layer)
    score = InceptionScore(str(layer), splits=2, extractor=Pixels(), progress=False, interval_resamples=30)
    score.check(["p"] * 24)
    fields = score(run_dir, ["p"] * 24, None)
    pool = Pixels().features(shared.run_images(run_dir, 24).source)
    weight = torch.load(layer)["fc.weight"].double().numpy()
    assert fields["inception_score"] == pytest.approx(inception_score(pool @ weight.T, 2)[0], rel=1e-9)
    assert fields["inception_score_ci"]["lo"] <= fields["inception_score"] <= fields["inception_score_ci"]["hi"]
    with_bias = InceptionScore(str(layer), splits=2, bias=True, extractor=Pixels(), progress=False)
    assert with_bias(run_dir, ["p"] * 24, None)["inception_score"] != pytest.approx(fields["inception_score"])


def test_a_file_without_the_softmax_layer_is_refused(tmp_path):
    torch.save({"fc.weight": torch.zeros(1000, 2048), "fc.bias": torch.zeros(1000)}, tmp_path / "imagenet.pth")
    with pytest.raises(CheckpointError, match=r"expected fc.weight \(1008, 2048\)"):
        InceptionScore(str(tmp_path / "imagenet.pth"), extractor=Pixels()).check(["p"])
    with pytest.raises(ConfigError, match="file not found"):
        InceptionScore(str(tmp_path / "none.pth"), extractor=Pixels()).check(["p"])
