"""Training data of the embedded Fashion-MNIST world: VQ token codes (cached) and the caption table.

Shared by ``scripts/train_gpt.py`` and ``scripts/train_drafter.py``. Images are tokenised once by the
world's VQ tokenizer and the codes cached beside the run, keyed by the tokenizer file's sha256; the
70 caption templates (7 per class) are encoded once by all-MiniLM-L6-v2.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tqdm.auto import tqdm

from lantern.files import cache_mismatch, content_digest, save_torch_atomic
from lantern.models.vq_model import VQModel
from lantern.models.world.fashion_mnist import NUM_CLASSES, FashionMNISTImages, all_captions
from lantern.training.vq import image_batch


@torch.no_grad()
def tokenize(
    vq: VQModel, dataset: FashionMNISTImages, cache: Path, vq_hash: str, batch: int = 500, progress: bool = True
) -> torch.Tensor:
    """Codes (N, G*G) int64 of every image, read from ``cache`` when it was made by the same tokenizer.

    ``vq_hash`` is the sha256 of the tokenizer's weights file; a cache made by another file or for
    a dataset of another length is recomputed and overwritten, and so is one whose content differs from
    the digest stored with it (with a line on stderr).
    """
    cache = Path(cache)
    if cache.is_file():
        try:
            saved = torch.load(cache, map_location="cpu", weights_only=True)
            intact = saved["digest"] == content_digest({"vq_sha256": saved["vq_sha256"], "codes": saved["codes"]})
        except (OSError, RuntimeError, KeyError, TypeError, EOFError):
            saved, intact = None, False
        if not intact:
            cache_mismatch(cache)
        elif saved.get("vq_sha256") == vq_hash and saved["codes"].shape[0] == len(dataset):
            return saved["codes"].long()
    codes = []
    for start in tqdm(range(0, len(dataset), batch), desc="tokenising", unit="batch", disable=not progress):
        images = image_batch(dataset, torch.arange(start, min(start + batch, len(dataset))))
        codes.append(vq.encode(images).flatten(1).to(torch.int16))  # (b, G*G)
    codes = torch.cat(codes)
    digest = content_digest({"vq_sha256": vq_hash, "codes": codes})
    save_torch_atomic(cache, {"vq_sha256": vq_hash, "codes": codes, "digest": digest})
    return codes.long()


def caption_table(max_length: int, encoder=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Encoder states (C, T, 384) and masks (C, T) of every caption template, and ids (classes, K).

    Caption ``ids[label, k]`` is template ``k`` of class ``label`` (:func:`all_captions` order), so
    ``ids.flatten()`` is ``0 .. C-1``. ``encoder`` is a loaded MiniLM text encoder (loaded here when None).
    """
    captions = [all_captions(label) for label in range(NUM_CLASSES)]
    per_class = len(captions[0])
    flat = [c for group in captions for c in group]
    if encoder is None:
        from lantern.models.text.minilm import load_minilm_encoder

        encoder = load_minilm_encoder(max_length=max_length)
    embedding = encoder.encode(flat)
    ids = torch.arange(len(flat)).view(NUM_CLASSES, per_class)
    return embedding.states, embedding.mask, ids
