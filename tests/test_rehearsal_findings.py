"""What the rehearsal found, each pinned by a small test of its own.

* OpenAI's CLIP release files (``ViT-B-32.pt``) are TorchScript archives, which open_clip's ``torch.load`` under
  ``weights_only`` refuses: ``CLIPScore`` reads their tensors and builds the model with OpenAI's QuickGELU.
* SJD's FID reference is val2017 as it is, whose images have several sizes: their statistics are keyed by content
  (resolution 0), and pytorch-fid's features take them one at a time, as pytorch-fid's batch 1 does.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from fixtures.hub import shrink
from fixtures.hub.build_metrics import open_clip_configs, openai_clip_jit
from PIL import Image

from lantern.metrics import features as shared
from lantern.metrics.clip import CLIPScore, openai_archive


@pytest.fixture(autouse=True)
def _fresh():
    shared.forget()
    yield
    shared.forget()


def test_an_openai_release_archive_scores_as_its_tensors_in_a_quickgelu_clip(tmp_path):
    import open_clip

    configs = open_clip_configs(tmp_path / "configs")
    archive = tmp_path / "ViT-B-32.pt"
    openai_clip_jit(archive, configs, seed=3)
    tensors = openai_archive(str(archive))
    assert tensors is not None and "input_resolution" not in tensors and "visual.conv1.weight" in tensors
    assert openai_archive(configs[shrink.CLIP_MODEL]) is None  # not an archive
    state = tmp_path / "state.pt"
    torch.save(tensors, state)
    arch = json.loads(open(configs[shrink.CLIP_MODEL]).read())
    plain = {**arch, "quick_gelu": False}  # the same architecture under GELU: a file path alone would build this
    (tmp_path / "gelu").mkdir()
    (tmp_path / "gelu" / "lantern-replica-clip-gelu.json").write_text(json.dumps(plain))
    images = np.random.default_rng(0).integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
    captions = ["a red fox", "a cat", "a house"]
    ours = CLIPScore(str(archive), model=shrink.CLIP_MODEL, model_config=configs[shrink.CLIP_MODEL]).per_prompt(
        images, captions
    )
    open_clip.add_model_config(configs[shrink.CLIP_MODEL])
    same = CLIPScore(str(state), model=shrink.CLIP_MODEL, model_config=configs[shrink.CLIP_MODEL]).per_prompt(
        images, captions
    )
    gelu_config = str(tmp_path / "gelu" / "lantern-replica-clip-gelu.json")
    gelu = CLIPScore(str(state), model="lantern-replica-clip-gelu", model_config=gelu_config).per_prompt(
        images, captions
    )
    np.testing.assert_allclose(ours, same, rtol=1e-5, atol=1e-6)
    assert not np.allclose(ours, gelu, atol=1e-6)  # the activation matters: QuickGELU is OpenAI's


def test_a_raw_reference_set_of_several_sizes_is_keyed_by_content_and_featured_one_at_a_time(tmp_path, monkeypatch):
    from lantern.metrics import fid_stats
    from lantern.metrics.pytorch_fid import PytorchFIDInception

    rng = np.random.default_rng(1)
    sizes = [(48, 64), (64, 48), (40, 40)]
    for number, (height, width) in enumerate(sizes):
        pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(tmp_path / f"{number:06d}.png")
    key, fingerprint = fid_stats._source_key_and_fingerprint("coco2017_val", tmp_path, "net")
    assert key.resolution == 0 and len(fingerprint) == 64

    class MeanPool(torch.nn.Module):  # stands in for the Inception: (B, 3, H, W) -> [(B, 2048, 1, 1)]
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.ones(()))

        def forward(self, x):
            return [self.scale * x.mean(dim=(2, 3), keepdim=True).repeat(1, 2048 // 3 + 1, 1, 1)[:, :2048]]

    extractor = PytorchFIDInception("unused.pth")
    monkeypatch.setattr(extractor, "network", lambda: MeanPool())
    together = extractor.features(tmp_path, batch_size=50, progress=False)  # a batch of three sizes
    assert together.shape == (3, 2048)
    for number in range(len(sizes)):
        image = np.asarray(Image.open(tmp_path / f"{number:06d}.png"), dtype=np.float64) / 255.0
        np.testing.assert_allclose(together[number, :3], image.mean(axis=(0, 1)), rtol=1e-6)
