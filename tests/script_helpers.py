"""Helpers for tests that drive the training scripts in-process on small data roots."""

import importlib.util
from pathlib import Path

import numpy as np
from helpers import REPO


def load_script(name: str):
    """``scripts/<name>.py`` imported as a module (its ``main(argv)`` runs it in this process)."""
    spec = importlib.util.spec_from_file_location(f"{name}_script", REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_idx(path: Path, array: np.ndarray) -> None:
    """``array`` as an uncompressed IDX file of unsigned bytes (the Fashion-MNIST format)."""
    header = bytes([0, 0, 0x08, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def fashion_root(root: Path, images: np.ndarray, labels: np.ndarray, train: int, test: int) -> Path:
    """A Fashion-MNIST folder with the first ``train`` images as its train split and the last ``test`` as its test split."""
    root.mkdir(parents=True, exist_ok=True)
    write_idx(root / "train-images-idx3-ubyte", images[:train])
    write_idx(root / "train-labels-idx1-ubyte", labels[:train])
    write_idx(root / "t10k-images-idx3-ubyte", images[-test:])
    write_idx(root / "t10k-labels-idx1-ubyte", labels[-test:])
    return root


def run_hydra_script(name: str, overrides: list[str]) -> None:
    """Run the Hydra script ``scripts/<name>.py`` in this process with ``overrides`` on its command line, as
    ``python scripts/<name>.py KEY=VALUE ...`` does (user errors: one ``error:`` line and SystemExit(2))."""
    import sys

    from lantern.cli.main import run_hydra

    module = load_script(name)
    argv = sys.argv
    sys.argv = [f"{name}.py", *overrides]
    try:
        run_hydra(module.main)
    finally:
        sys.argv = argv
