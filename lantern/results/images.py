"""A run folder's per-image files: ``tokens/NNNNNN.pt`` (codes, per-sample counters, the PNG's sha256) and
``NNNNNN.png``. The run wing writes them (:mod:`lantern.run.rundir`); tables and the report read them."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from lantern.files import image_name, png_bytes, save_torch_atomic, sha256_file, write_bytes_atomic

TOKENS_DIR = "tokens"


class ImageStore:
    """Per-image outputs of a run folder: ``tokens/NNNNNN.pt`` (written first) and ``NNNNNN.png`` (second)."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)

    def tokens_path(self, index: int) -> Path:
        return self.folder / TOKENS_DIR / f"{index:06d}.pt"

    def is_finished(self, index: int) -> bool:
        """Whether both of image ``index``'s files exist (:meth:`check` also says whether they are sound)."""
        return (self.folder / image_name(index)).is_file() and self.tokens_path(index).is_file()

    def finished(self, indices) -> set[int]:
        return {i for i in indices if self.is_finished(i)}

    def finished_any(self) -> bool:
        tokens = self.folder / TOKENS_DIR
        return tokens.is_dir() and any(self.is_finished(int(p.stem)) for p in tokens.glob("*.pt") if p.stem.isdigit())

    def check(self, index: int, length: int | None = None) -> str | None:
        """What is wrong with finished image ``index``'s files, or None when they are sound: its tokens file
        loads and holds ``length`` codes, and its PNG is the file the tokens file recorded (sha256; a folder
        written before PNG hashes were recorded has its PNG decoded instead)."""
        try:
            saved = self.load(index)
        except Exception as exc:  # truncated, foreign or corrupt: any failure to read it back
            return f"tokens file unreadable ({type(exc).__name__})"
        codes = saved.get("codes") if isinstance(saved, dict) else None
        if not isinstance(codes, torch.Tensor) or not isinstance(saved.get("per_sample"), dict):
            return "tokens file holds no codes"
        if length is not None and codes.numel() != length:
            return f"tokens file holds {codes.numel()} codes, not {length}"
        png = self.folder / image_name(index)
        try:
            if "png_sha256" in saved:
                return (
                    None if sha256_file(png) == saved["png_sha256"] else "PNG differs from the one its tokens recorded"
                )
            with Image.open(png) as image:
                image.load()
        except Exception as exc:
            return f"PNG unreadable ({type(exc).__name__})"
        return None

    def keep_sound(self, indices, length: int | None = None) -> tuple[set[int], dict[int, str]]:
        """The finished images among ``indices`` whose files pass :meth:`check`; the others' files are removed
        (so they are decoded again) and returned with what was wrong."""
        sound, bad = set(), {}
        for index in self.finished(indices):
            problem = self.check(index, length)
            if problem is None:
                sound.add(index)
                continue
            bad[index] = problem
            (self.folder / image_name(index)).unlink(missing_ok=True)
            self.tokens_path(index).unlink(missing_ok=True)
        return sound, bad

    def save(self, index: int, pixels: np.ndarray, codes: torch.Tensor, per_sample: dict[str, torch.Tensor]) -> None:
        """Write image ``index``: its tokens (N,), per-sample counters and its PNG's sha256, then the (H, W, 3)
        uint8 PNG. The tokens file comes first: an image counts as finished only when both exist."""
        png = png_bytes(pixels)
        payload = {
            "codes": codes.to("cpu", torch.int32).clone(),
            "per_sample": {key: value.detach().cpu().clone() for key, value in per_sample.items()},
            "png_sha256": hashlib.sha256(png).hexdigest(),
        }
        save_torch_atomic(self.tokens_path(index), payload)
        write_bytes_atomic(self.folder / image_name(index), png)

    def load(self, index: int) -> dict:
        """Image ``index``'s ``codes`` (N,) and ``per_sample`` counters (each without the batch dimension)."""
        return torch.load(self.tokens_path(index), map_location="cpu", weights_only=True)
