"""The pytorch-fid variant: our features and FID equal pytorch-fid's own on random FID-Inception weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from lantern.errors import CheckpointError, ConfigError
from lantern.metrics import features as shared
from lantern.metrics.fid import FIDStats, fid_from_stats
from lantern.metrics.pytorch_fid import PytorchFIDInception

pf_inception = pytest.importorskip("pytorch_fid.inception")
pf_score = pytest.importorskip("pytorch_fid.fid_score")


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """Random weights in the layout of pt_inception-2015-12-05-6726825d.pth (torchvision's names, 1008 classes)."""
    import torchvision

    torch.manual_seed(0)
    net = torchvision.models.inception_v3(weights=None, aux_logits=False, num_classes=1008, init_weights=True)
    path = tmp_path_factory.mktemp("pfid") / "pt_inception-random.pth"
    torch.save(net.state_dict(), path)
    return path


def _pngs(folder, images):
    folder.mkdir()
    files = []
    for i, image in enumerate(images):
        files.append(folder / f"{i:03d}.png")
        Image.fromarray(image).save(files[-1])
    return [str(f) for f in files]


def test_features_equal_pytorch_fid(weights, tmp_path, monkeypatch):
    shared.forget()
    images = np.random.default_rng(0).integers(0, 256, (3, 64, 64, 3), dtype=np.uint8)
    files = _pngs(tmp_path / "a", images)
    ours = PytorchFIDInception(str(weights)).features(tmp_path / "a", batch_size=2, progress=False)  # (3, 2048)
    state = torch.load(weights)
    monkeypatch.setattr(pf_inception, "load_state_dict_from_url", lambda *args, **kwargs: state)
    model = pf_inception.InceptionV3([3]).eval()
    theirs = pf_score.get_activations(files, model, batch_size=3, dims=2048, device="cpu", num_workers=0)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    # clean-fid's antialiased bicubic resize instead of pytorch-fid's bilinear gives other features
    from lantern.metrics.fid import clean_resize

    resized = torch.from_numpy(clean_resize(images[0])).permute(2, 0, 1)[None] / 255.0
    with torch.no_grad():
        clean = model(resized)[0].reshape(1, -1).numpy()
    assert np.abs(clean - theirs[:1]).max() > 100 * np.abs(ours - theirs).max()


@pytest.mark.parametrize("count", [300, 40])  # full-rank and rank-deficient covariances
def test_sqrtm_distance_equals_pytorch_fid(count):
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(count, 32)), rng.normal(0.2, 1.3, size=(count, 32)) @ rng.normal(size=(32, 32)) / 6
    sa, sb = FIDStats.from_features(a), FIDStats.from_features(b)
    theirs = pf_score.calculate_frechet_distance(sa.mu, sa.sigma, sb.mu, sb.sigma)
    assert fid_from_stats(sa, sb, method="sqrtm") == pytest.approx(theirs, rel=1e-9)


def test_bad_weights_are_one_error(weights, tmp_path):
    shared.forget()
    state = torch.load(weights)
    del state["fc.bias"]
    torch.save(state, tmp_path / "partial.pth")
    with pytest.raises(CheckpointError, match="does not match pytorch-fid's FID Inception"):
        PytorchFIDInception(str(tmp_path / "partial.pth")).check()
    with pytest.raises(ConfigError, match="file not found"):
        PytorchFIDInception(str(tmp_path / "none.pth")).check()
