"""FID computed by clean-fid itself, to cross-check :mod:`lantern.metrics.fid` on the same folders.

clean-fid 0.1.35 calls ``scipy.linalg.sqrtm(disp=False)``, which scipy 1.18 removed; a shim gives it the
old signature for the duration of one call.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import types
import warnings
from collections.abc import Iterator

import numpy as np
import scipy.linalg
import torch

from lantern.metrics.features import list_pngs
from lantern.metrics.fid import InceptionFeatures
from lantern.models.devices import resolve_device


def _sqrtm_accepts_disp() -> bool:
    try:
        return "disp" in inspect.signature(scipy.linalg.sqrtm).parameters
    except (TypeError, ValueError):
        return True


def _legacy_linalg() -> types.SimpleNamespace:
    """A stand-in for ``scipy.linalg`` inside ``cleanfid.fid`` whose ``sqrtm`` still takes ``disp``.

    ``sqrtm(A, disp=False)`` returns ``(root, errest)`` like scipy < 1.18, with the Frobenius
    error estimate ``|root @ root - A| / |A|`` scipy used to return.
    """

    def sqrtm(matrix, disp=True, blocksize=64):
        root = scipy.linalg.sqrtm(matrix)
        if disp:
            return root
        errest = np.linalg.norm(root @ root - matrix, "fro") / np.linalg.norm(matrix, "fro")
        return root, errest

    return types.SimpleNamespace(sqrtm=sqrtm)


@contextlib.contextmanager
def _cleanfid_scipy_compat(module: types.ModuleType) -> Iterator[None]:
    """Give ``cleanfid.fid`` a ``sqrtm(disp=...)`` for the duration of one call when scipy lacks it.

    With a scipy that still takes ``disp`` (deprecated in 1.17) only its deprecation warning is muted.
    """
    if _sqrtm_accepts_disp():
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The `disp` argument is deprecated", category=DeprecationWarning)
            yield
        return
    original = module.linalg
    module.linalg = _legacy_linalg()
    try:
        yield
    finally:
        module.linalg = original


def fid_with_cleanfid(
    folder_a: str | os.PathLike,
    folder_b: str | os.PathLike,
    extractor: InceptionFeatures | None = None,
    *,
    device: str | torch.device = "cpu",
    batch_size: int = 32,
    verbose: bool = False,
) -> float:
    """FID between two PNG folders computed by clean-fid itself (``mode="clean"``), offline.

    clean-fid's ``compute_fid`` gets our :class:`InceptionFeatures` as ``custom_feat_extractor``, so it
    never fetches weights, and ``num_workers=0``. clean-fid 0.1.35 calls ``sqrtm(disp=False)``,
    which scipy 1.18 removed: only then, and only during this call, ``cleanfid.fid.linalg`` is
    replaced by a shim providing the old signature. The result uses clean-fid's own file listing,
    resizing and ``frechet_distance`` (scipy ``sqrtm``, ~15 s for 2048-d on one CPU core).
    """
    from cleanfid import fid as cleanfid_fid

    list_pngs(folder_a)
    list_pngs(folder_b)
    device = resolve_device(device) if isinstance(device, str) else torch.device(device)
    extractor = InceptionFeatures(device) if extractor is None else extractor
    with _cleanfid_scipy_compat(cleanfid_fid):
        score = cleanfid_fid.compute_fid(
            str(folder_a),
            str(folder_b),
            mode="clean",
            custom_feat_extractor=extractor,
            device=device,
            num_workers=0,
            batch_size=batch_size,
            verbose=verbose,
        )
    return float(score)
