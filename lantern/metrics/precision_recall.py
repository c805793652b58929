"""Improved precision and recall (Kynkäänniemi et al. 2019) on VGG16 fc2 features, k = 3.

As LANTERN computes it (``entrypoints/eval_prec_recall.py``, taken from youngjung's
improved-precision-and-recall-metric-pytorch): each image is resized to 224x224 by torchvision's
``Resize`` on the PIL image (PIL bilinear), scaled to [0, 1] and normalised with the ImageNet mean and
std; the features are torchvision VGG16's ``features`` flattened (512 x 7 x 7) through
``classifier[:4]`` (fc1, ReLU, dropout off, fc2), i.e. fc2 before its ReLU, 4096-d. A set's manifold is
the union of balls around its features, each of radius the distance to its k-th nearest other feature
(the (k+1)-th smallest distance, counting itself). Precision is the share of generated features inside
the reference manifold, recall the share of reference features inside the generated manifold; a point
is inside a ball when its distance is ``<`` the radius (LANTERN) or ``<=`` (torch-fidelity,
``inclusive=True``; torch-fidelity also takes ``fc2_relu``, ``layer="fc2_relu"``, and resizes with its
TF1 bilinear, which is not offered here).

Weights: torchvision's ``vgg16`` state dict (``vgg16-397923af.pth``, IMAGENET1K_V1) from a local path,
loaded strictly. Distances are float64 (as LANTERN's); a run holds the (N_ref, N_gen) and (N_gen, N_gen)
matrices, 8 bytes an entry.

Intervals resample the generated set against the fixed reference features: precision is a mean of
per-image indicators (``bootstrap_mean``); recall is recomputed on each draw, the draw's radii from its
own k nearest neighbours (repeats included), and shifted to the estimate
(:func:`lantern.metrics.bootstrap.statistic_fields`).
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from tqdm.auto import tqdm

from lantern import checks
from lantern.errors import ConfigError
from lantern.metrics import features as shared_features
from lantern.metrics import knobs
from lantern.metrics.bootstrap import SET_RESAMPLES, interval_settings, mean_fields, statistic_fields
from lantern.metrics.features import ImageSource, iter_batches
from lantern.models.checkpoint import check_state_dict, read_state_dict
from lantern.models.devices import resolve_device

VGG_SIZE = 224
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
LAYERS = ("fc2", "fc2_relu")
MAX_K = 1000  # nearest neighbours per image (the method uses 3)
FEATURE_DIM = 4096


def build_vgg16() -> torch.nn.Module:
    """torchvision's VGG16 architecture with its parameters on the meta device (no memory, no init)."""
    import torchvision

    with torch.device("meta"):
        return torchvision.models.vgg16(weights=None)


def vgg_input(image: np.ndarray) -> torch.Tensor:
    """(H, W, 3) uint8 -> (3, 224, 224) float32: PIL bilinear resize, [0, 1], ImageNet normalisation."""
    resized = Image.fromarray(image).resize((VGG_SIZE, VGG_SIZE), Image.BILINEAR)
    x = torch.from_numpy(np.asarray(resized, dtype=np.float32) / 255.0).permute(2, 0, 1)  # (3, 224, 224)
    mean, std = torch.tensor(IMAGENET_MEAN)[:, None, None], torch.tensor(IMAGENET_STD)[:, None, None]
    return (x - mean) / std


class VGG16Features:
    """VGG16 fc2 features from torchvision's weights at ``weights`` (loaded on first use, shared per process)."""

    def __init__(self, weights: str, layer: str = "fc2", device: str = "cpu") -> None:
        self.weights, self.device = weights, device
        self.layer = checks.choice("metrics.precision_recall.layer", layer, LAYERS)

    @functools.cached_property
    def net_id(self) -> str:
        """The network, layer, preprocessing and the weights' digest (the feature cache's key)."""
        return shared_features.weights_net_id(f"vgg16-{self.layer}-pil-bilinear-{VGG_SIZE}", self.weights)

    def network(self) -> torch.nn.Module:
        """The loaded network (CheckpointError naming the file if it is not torchvision's VGG16)."""
        device = resolve_device(self.device) if isinstance(self.device, str) else torch.device(self.device)

        def load() -> torch.nn.Module:
            model = build_vgg16()
            state_dict = read_state_dict(self.weights, "metric")
            check_state_dict(model, state_dict, "torchvision VGG16", os.fspath(self.weights))
            model.load_state_dict(state_dict, strict=True, assign=True)
            return model.to(device=device, dtype=torch.float32).eval()

        return shared_features.shared(("vgg16", os.path.realpath(self.weights), str(device)), load)

    def check(self) -> None:
        if not Path(self.weights).is_file():
            raise ConfigError(f"metrics.precision_recall.weights={str(self.weights)!r}: file not found")
        self.network()

    @torch.no_grad()
    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """(B, 3, 224, 224) normalised -> (B, 4096) fc2 (or fc2_relu) features."""
        model = self.network()
        device = next(model.parameters()).device
        x = model.features(pixels.to(device)).flatten(1)  # (B, 25088); avgpool is the identity at 224
        x = model.classifier[:4](x)  # (B, 4096) fc1, ReLU, dropout (eval: off), fc2
        return torch.relu(x) if self.layer == "fc2_relu" else x

    def features(self, images: ImageSource, batch_size: int = 32, progress: bool = True) -> np.ndarray:
        """(N, 4096) float32 features of uint8 images or a PNG folder."""
        chunks = []
        total = shared_features.count(images)
        with tqdm(total=total, desc="VGG16 features", unit="img", disable=not progress, dynamic_ncols=True) as bar:
            for batch in iter_batches(images, batch_size):
                pixels = torch.stack([vgg_input(image) for image in batch])  # (B, 3, 224, 224)
                chunks.append(self.forward(pixels).float().cpu().numpy())
                bar.update(len(batch))
        return np.concatenate(chunks)  # (N, 4096)


def distances(a: np.ndarray, b: np.ndarray) -> torch.Tensor:
    """(Na, Nb) float64 Euclidean distances between rows of ``a`` (Na, D) and ``b`` (Nb, D)."""
    x = torch.from_numpy(np.array(a, dtype=np.float64))  # copies: shared feature arrays are read-only
    y = torch.from_numpy(np.array(b, dtype=np.float64))
    return torch.cdist(x, y)


def radii(self_distances: torch.Tensor, k: int) -> torch.Tensor:
    """(N,) distance of each point to its k-th nearest other point, from its (N, N) distance matrix."""
    if self_distances.shape[0] <= k:
        raise ConfigError(f"precision/recall with k={k} needs more than {k} images, got {self_distances.shape[0]}")
    return self_distances.kthvalue(k + 1, dim=1).values  # the (k+1)-th smallest counts the point itself


def coverage(cross: torch.Tensor, ball_radii: torch.Tensor, inclusive: bool) -> torch.Tensor:
    """(Q,) 1.0 where query q lies in some ball: ``cross`` (Q, M) query-to-centre distances, radii (M,)."""
    inside = cross <= ball_radii if inclusive else cross < ball_radii
    return inside.any(dim=1).double()


def precision_recall(
    generated: np.ndarray, reference: np.ndarray, k: int = 3, inclusive: bool = False
) -> tuple[float, float]:
    """(precision, recall) of generated (N, D) features against reference (M, D) features."""
    ref_gen = distances(reference, generated)  # (M, N)
    precision = coverage(ref_gen.T, radii(distances(reference, reference), k), inclusive).mean()
    recall = coverage(ref_gen, radii(distances(generated, generated), k), inclusive).mean()
    return float(precision), float(recall)


class PrecisionRecall:
    """The run's improved precision and recall (``precision``, ``recall``, each with ``_ci``).

    ``reference`` returns the reference images (uint8 array or PNG folder); their features are cached on
    disk under ``cache_dir``. ``weights`` is torchvision's VGG16 state dict.
    """

    def __init__(
        self,
        weights: str,
        reference: Callable[[], np.ndarray | str],
        reference_name: str = "reference",
        k: int = 3,
        layer: str = "fc2",
        inclusive: bool = False,
        batch_size: int = 32,
        cache_dir: str | None = None,
        device: str = "cpu",
        progress: bool = True,
        interval_resamples: int | None = SET_RESAMPLES,
        interval_seed: int = 0,
        extractor=None,
    ) -> None:
        self.k = checks.capped("metrics.precision_recall.k", k, 1, MAX_K, note="nearest neighbours of each image")
        self.min_images = self.k + 1  # each image's k-th neighbour among the others (the preflight compares)
        self.inclusive = checks.flag("metrics.precision_recall.inclusive", inclusive)
        self.reference = reference
        self.reference_name = knobs.name("metrics.precision_recall.reference_name", reference_name)
        self.batch_size, self.cache_dir = knobs.batch_size("precision_recall", batch_size), cache_dir
        self.progress = progress
        self.interval_resamples, self.interval_seed = interval_settings(
            interval_resamples, interval_seed, "precision_recall"
        )
        self.extractor = VGG16Features(weights, layer, device) if extractor is None else extractor
        self._reference = None

    def check(self, prompts: Sequence, labels: Sequence[int] | None = None) -> None:
        """Before the first image: the VGG16 weights load and the reference set is there."""
        if hasattr(self.extractor, "check"):
            self.extractor.check()
        self._reference = self.reference()
        if not isinstance(self._reference, np.ndarray):
            shared_features.list_pngs(self._reference)

    def _features(self, images: shared_features.ImageSet, cache_dir: str | None) -> np.ndarray:
        return shared_features.features(
            self.extractor, images, batch_size=self.batch_size, progress=self.progress, cache_dir=cache_dir
        )

    def __call__(self, run_dir: Path, prompts: Sequence, labels: Sequence[int] | None) -> dict:
        start = time.perf_counter()
        source = self._reference if self._reference is not None else self.reference()
        reference = self._features(shared_features.image_set(source), self.cache_dir)  # (M, D)
        generated = self._features(shared_features.run_images(run_dir, len(prompts)), None)  # (N, D)
        ref_gen = distances(reference, generated)  # (M, N)
        gen_gen = distances(generated, generated)  # (N, N)
        in_reference = coverage(ref_gen.T, radii(distances(reference, reference), self.k), self.inclusive)  # (N,)
        recall = float(coverage(ref_gen, radii(gen_gen, self.k), self.inclusive).mean())

        def resampled_recall(rows: np.ndarray) -> float:
            picked = torch.from_numpy(rows)
            draw_radii = radii(gen_gen[picked][:, picked], self.k)  # (n,) repeats are neighbours at 0
            return float(coverage(ref_gen[:, picked], draw_radii, self.inclusive).mean())

        n, resamples, seed = len(generated), self.interval_resamples, self.interval_seed
        return {
            **mean_fields("precision", in_reference.numpy(), resamples, seed),
            **statistic_fields("recall", recall, n, resampled_recall, resamples, seed),
            "precision_recall_k": self.k,
            "precision_recall_reference": self.reference_name,
            "precision_recall_seconds": time.perf_counter() - start,
        }


PrecisionRecall.dry = knobs.dry_metric(PrecisionRecall, "precision_recall", files=("weights",))
