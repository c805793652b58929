"""The pytorch-fid variant of FID's features (SJD's protocol), from a local weights file.

pytorch-fid (``pytorch_fid.fid_score``) reads each image with PIL as RGB, ``ToTensor`` to [0, 1], and
its ``InceptionV3`` (the FID Inception of 2015-12-05 rebuilt on torchvision's Inception v3, output
block 3) resizes to 299x299 with ``F.interpolate(..., mode="bilinear", align_corners=False)`` (no
antialias), scales to [-1, 1] and returns the 2048-d average pool; the distance uses
``scipy.linalg.sqrtm`` (``metrics.fid.method=sqrtm``). The network is pytorch-fid's own class, built
with the state dict of ``pt_inception-2015-12-05-6726825d.pth`` read from ``weights`` (its download is
replaced by that file), so the ``pytorch-fid`` package must be installed (``pip install pytorch-fid``).
Unlike clean-fid's, this resize aliases when it shrinks large images, which is why the two FIDs differ.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from lantern.errors import CheckpointError, ConfigError
from lantern.metrics import features as shared_features
from lantern.metrics import knobs
from lantern.metrics.features import ImageSource, iter_batches
from lantern.models.checkpoint import read_state_dict
from lantern.models.devices import resolve_device

NET_ID = "pytorch-fid-inception-2015-12-05-bilinear-299"


def _module():
    try:
        from pytorch_fid import inception
    except ImportError as exc:
        raise ConfigError(
            "the pytorch-fid variant of FID needs the pytorch-fid package: pip install pytorch-fid"
        ) from exc
    return inception


@contextlib.contextmanager
def _local_weights(module, state_dict: dict) -> Iterator[None]:
    """pytorch-fid fetches its weights with ``load_state_dict_from_url``: hand it ``state_dict`` instead."""
    original = module.load_state_dict_from_url
    module.load_state_dict_from_url = lambda *args, **kwargs: state_dict
    try:
        yield
    finally:
        module.load_state_dict_from_url = original


def build_network(weights: str | os.PathLike, device: str | torch.device = "cpu") -> torch.nn.Module:
    """pytorch-fid's ``InceptionV3([3])`` with ``weights`` loaded strictly, in eval mode on ``device``."""
    module = _module()
    if not Path(weights).is_file():
        raise ConfigError(f"metrics.fid.extractor.weights={str(weights)!r}: file not found")
    state_dict = read_state_dict(weights, "metric")
    try:
        with _local_weights(module, state_dict):
            net = module.InceptionV3([module.InceptionV3.BLOCK_INDEX_BY_DIM[2048]])
    except RuntimeError as exc:  # load_state_dict(strict=True) lists the missing and unexpected keys
        first = str(exc).strip().splitlines()
        raise CheckpointError(
            f"{str(weights)!r} does not match pytorch-fid's FID Inception: {' '.join(first[:3])[:300]}"
        ) from exc
    return net.to(device).eval()


class PytorchFIDInception:
    """pytorch-fid's features as a lazy extractor (loaded once per process, path and device)."""

    def __init__(self, weights: str, device: str = "cpu") -> None:
        self.weights, self.device = weights, device

    @functools.cached_property
    def net_id(self) -> str:
        """The network, its preprocessing and its weights' digest (the caches' key)."""
        return shared_features.weights_net_id(NET_ID, self.weights)

    def network(self) -> torch.nn.Module:
        device = resolve_device(self.device) if isinstance(self.device, str) else torch.device(self.device)
        key = ("pytorch-fid", os.path.realpath(self.weights), str(device))
        return shared_features.shared(key, lambda: build_network(self.weights, device))

    def check(self) -> None:
        self.network()

    @torch.no_grad()
    def features(self, images: ImageSource, batch_size: int = 50, progress: bool = True) -> np.ndarray:
        """(N, 2048) float64 pool features, as ``pytorch_fid.fid_score.get_activations`` returns them."""
        net = self.network()
        device = next(net.parameters()).device
        chunks = []
        total = shared_features.count(images)
        with tqdm(total=total, desc="pytorch-fid", unit="img", disable=not progress, dynamic_ncols=True) as bar:
            for batch in iter_batches(images, batch_size):
                # Images of several sizes (a raw reference set: SJD's val2017) go one at a time, as pytorch-fid's
                # batch 1 runs them; the network resizes each to 299 on its own, so batching changes nothing else.
                groups = [batch] if len({im.shape for im in batch}) == 1 else [[im] for im in batch]
                for group in groups:
                    pixels = torch.stack([torch.from_numpy(np.ascontiguousarray(im)).permute(2, 0, 1) for im in group])
                    pool = net(pixels.to(device).float() / 255.0)[0]  # (B, 2048, 1, 1)
                    chunks.append(pool.squeeze(3).squeeze(2).cpu().numpy().astype(np.float64))
                bar.update(len(batch))
        return np.concatenate(chunks)  # (N, 2048)


PytorchFIDInception.dry = knobs.dry_metric(PytorchFIDInception, "fid.extractor", files=("weights",))
