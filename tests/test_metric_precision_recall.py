"""Improved precision/recall: k-NN radii and coverage equal to torch-fidelity's, LANTERN's VGG16 pipeline."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from lantern.errors import CheckpointError, ConfigError
from lantern.files import image_name
from lantern.metrics import features as shared
from lantern.metrics.intervals import bootstrap, bootstrap_mean
from lantern.metrics.precision_recall import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    PrecisionRecall,
    VGG16Features,
    precision_recall,
)


@pytest.fixture(autouse=True)
def _fresh():
    shared.forget()
    yield
    shared.forget()


def _clustered(n: int, dim: int, seed: int, shift: float = 0.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n, dim)) + shift).astype(np.float32)


@pytest.mark.parametrize("shift", [0.0, 0.7])
def test_precision_and_recall_equal_torch_fidelity(shift):
    prc = pytest.importorskip("torch_fidelity.metric_prc")
    generated, reference = _clustered(80, 12, 0, shift), _clustered(100, 12, 1)
    ours = precision_recall(generated, reference, k=3, inclusive=True)
    theirs = prc.calculate_precision_recall_full(torch.from_numpy(generated), torch.from_numpy(reference), 3)
    part = prc.calculate_precision_recall_part(torch.from_numpy(generated), torch.from_numpy(reference), 3, 16)
    # torch-fidelity averages in float32; one image more or less inside would move a figure by 1/100
    assert ours == pytest.approx(theirs, abs=1e-6) and ours == pytest.approx(part, abs=1e-6)
    assert 0 < ours[0] < 1 and 0 < ours[1] < 1


def test_a_hand_made_case_and_the_strict_ball():
    # 1-D: reference at 0, 1, 2, 3, 4 (k=1 radius 1 each); generated at 0.5, 1.5, 4 and far away at 10, 12.
    reference = np.array([[0.0], [1.0], [2.0], [3.0], [4.0]])
    generated = np.array([[0.5], [1.5], [4.0], [10.0], [12.0]])
    # generated radii (k=1): 1, 1, 2.5, 2, 2 -> reference 0..2 within 1 of 0.5/1.5, 3 and 4 within 2.5 of 4.
    assert precision_recall(generated, reference, k=1) == (3 / 5, 5 / 5)
    # reference 3 is exactly at distance 1 of 4 (radius 1 of reference 3): strict and inclusive agree here;
    # a generated point exactly on a reference ball's boundary is where they differ.
    boundary = np.array([[5.0], [20.0], [21.0]])
    assert precision_recall(boundary, reference, k=1)[0] == 0.0
    assert precision_recall(boundary, reference, k=1, inclusive=True)[0] == pytest.approx(1 / 3)
    with pytest.raises(ConfigError, match="more than 3 images"):
        precision_recall(generated[:3], reference, k=3)


@pytest.fixture(scope="module")
def vgg_weights(tmp_path_factory):
    """torchvision's VGG16 with random weights in its state-dict layout (fp16 to halve the file)."""
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.vgg16(weights=None)
    path = tmp_path_factory.mktemp("vgg") / "vgg16-random.pth"
    torch.save({k: v.half() for k, v in model.state_dict().items()}, path)
    return path


def _lantern_reference_features(weights, images: np.ndarray) -> np.ndarray:
    """LANTERN's eval_prec_recall pipeline in torchvision terms: Resize([224, 224]) on PIL, ToTensor,
    Normalize, vgg16.features flattened, classifier[:4]."""
    import torchvision
    from torchvision import transforms

    model = torchvision.models.vgg16(weights=None)
    model.load_state_dict({k: v.float() for k, v in torch.load(weights).items()})
    model.eval()
    prep = transforms.Compose(
        [transforms.Resize([224, 224]), transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    )
    batch = torch.stack([prep(Image.fromarray(im)) for im in images])
    with torch.no_grad():
        return model.classifier[:4](model.features(batch).view(-1, 7 * 7 * 512)).numpy()


def test_vgg_features_are_lanterns_fc2(vgg_weights):
    images = np.random.default_rng(0).integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
    ours = VGG16Features(str(vgg_weights)).features(images, batch_size=2, progress=False)  # (3, 4096)
    expected = _lantern_reference_features(vgg_weights, images)
    assert ours.shape == (3, 4096) and (ours < 0).any()  # fc2 before its ReLU
    np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-5 * np.abs(expected).max())
    nearest = np.stack([np.asarray(Image.fromarray(im).resize((224, 224), Image.NEAREST)) for im in images])
    wrong_resize = _lantern_reference_features(vgg_weights, nearest)
    assert np.abs(wrong_resize - expected).max() > 100 * np.abs(ours - expected).max()


@pytest.mark.slow
def test_fc2_relu_features_equal_torch_fidelitys_extractor(vgg_weights):
    fidelity = pytest.importorskip("torch_fidelity.feature_extractor_vgg16")
    big = np.random.default_rng(1).integers(0, 256, (2, 224, 224, 3), dtype=np.uint8)  # no resize on either side
    theirs_net = fidelity.FeatureExtractorVGG16("vgg16", ["fc2_relu"], feature_extractor_weights_path=str(vgg_weights))
    (theirs,) = theirs_net(torch.from_numpy(big).permute(0, 3, 1, 2).contiguous())
    relu = VGG16Features(str(vgg_weights), layer="fc2_relu").features(big, progress=False)
    np.testing.assert_allclose(relu, theirs.numpy(), rtol=1e-4, atol=1e-5 * float(theirs.abs().max()))


def test_bad_weight_files_are_refused_before_generation(tmp_path):
    text = tmp_path / "vgg.pth"
    text.write_text("not a checkpoint")
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        VGG16Features(str(text)).check()
    partial = tmp_path / "partial.pth"
    torch.save({"features.0.weight": torch.zeros(64, 3, 3, 3)}, partial)
    with pytest.raises(CheckpointError, match="does not match torchvision VGG16: missing 31"):
        VGG16Features(str(partial)).check()
    with pytest.raises(ConfigError, match="file not found"):
        VGG16Features(str(tmp_path / "none.pth")).check()
    with pytest.raises(ConfigError, match="layer"):
        VGG16Features("x", layer="fc1")


class Pixels:
    """Features = the pixels of 2x2 images (12-d), a stand-in network."""

    net_id = "pixels"

    def features(self, images, batch_size=32, progress=True):
        return np.asarray(images, np.float64).reshape(len(images), -1)


def test_record_fields_and_intervals(tmp_path):
    rng = np.random.default_rng(5)
    reference = rng.integers(0, 256, (40, 2, 2, 3), dtype=np.uint8)
    generated = np.clip(rng.normal(128, 50, (30, 2, 2, 3)), 0, 255).astype(np.uint8)
    (tmp_path / "run").mkdir()
    for i, image in enumerate(generated):
        Image.fromarray(image).save(tmp_path / "run" / image_name(i))
    metric = PrecisionRecall("unused", lambda: reference, extractor=Pixels(), progress=False, interval_resamples=40)
    metric.check(["p"] * 30)
    fields = metric(tmp_path / "run", ["p"] * 30, None)
    gen, ref = generated.reshape(30, -1).astype(np.float64), reference.reshape(40, -1).astype(np.float64)
    assert (fields["precision"], fields["recall"]) == precision_recall(gen, ref)
    from lantern.metrics.precision_recall import coverage, distances, radii

    hits = coverage(distances(gen, ref), radii(distances(ref, ref), 3), False).numpy()
    expected = bootstrap_mean(hits, 40, 0)
    assert (fields["precision_ci"]["lo"], fields["precision_ci"]["hi"]) == (expected.lo, expected.hi)
    draws = []
    plain = bootstrap(30, lambda rows: draws.append(precision_recall(gen[rows], ref)[1]) or draws[-1], 40, 0)
    offset = fields["recall"] - np.mean(draws)
    assert fields["recall_ci"]["lo"] == pytest.approx(plain.lo + offset)
    assert fields["recall_ci"]["hi"] == pytest.approx(plain.hi + offset)
