"""CLIP score through torchmetrics' ``CLIPScore`` (the SJD convention), from a local HF CLIP folder.

torchmetrics 1.9 scores an image and its caption as ``100 * cos`` of the HF ``CLIPModel``'s image and
text features, the image through the folder's ``CLIPProcessor`` (shortest side bicubic to 224, centre
crop, OpenAI normalisation), the caption through its tokenizer truncated to 77 tokens, and reports
``max(mean, 0)``. Here the per-prompt scores come from torchmetrics' own update function (so the
interval can resample them) and ``clip_score`` is torchmetrics' figure; the model and processor are
handed to torchmetrics as the callable its ``model_name_or_path`` accepts, never downloaded.
``folder`` is an HF layout such as ``openai/clip-vit-base-patch16`` (config.json, weights, tokenizer and
preprocessor files).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from lantern.errors import CheckpointError, ConfigError
from lantern.files import note_input
from lantern.metrics import knobs
from lantern.metrics.bootstrap import MEAN_RESAMPLES, interval_settings, mean_fields
from lantern.metrics.features import run_images
from lantern.models.checkpoint import unreadable_reason
from lantern.models.devices import resolve_device


class FeatureTensors(torch.nn.Module):
    """An HF ``CLIPModel`` whose ``get_image_features``/``get_text_features`` return the projected tensors.

    transformers 5 returns an output object (the projection in ``pooler_output``) where torchmetrics 1.9's
    ``CLIPScore`` expects a tensor (it fails with "'BaseModelOutputWithPooling' object has no attribute
    'norm'"); this wrapper hands torchmetrics the tensor and changes nothing else.
    """

    def __init__(self, clip) -> None:
        super().__init__()
        self.clip = clip
        self.config = clip.config

    @staticmethod
    def _tensor(out) -> torch.Tensor:
        return out if isinstance(out, torch.Tensor) else out.pooler_output

    def get_image_features(self, *args, **kwargs) -> torch.Tensor:
        return self._tensor(self.clip.get_image_features(*args, **kwargs))  # (B, E)

    def get_text_features(self, *args, **kwargs) -> torch.Tensor:
        return self._tensor(self.clip.get_text_features(*args, **kwargs))  # (B, E)


def load_hf_clip(folder: str, device: str = "cpu"):
    """``(FeatureTensors(CLIPModel), CLIPProcessor)`` from a local HF folder (CheckpointError naming it when it is not one)."""
    from transformers import CLIPModel, CLIPProcessor

    if not (Path(folder) / "config.json").is_file():
        raise ConfigError(f"metrics.clip.folder={folder!r}: not an HF CLIP folder (no config.json)")
    try:
        model = CLIPModel.from_pretrained(folder, local_files_only=True).eval()
        processor = CLIPProcessor.from_pretrained(folder, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - transformers raises many kinds for a bad folder
        raise CheckpointError(
            f"metrics.clip.folder={folder!r} is not a loadable CLIPModel: {unreadable_reason(exc)}"
        ) from exc
    note_input(folder, "metric")
    return FeatureTensors(model).to(resolve_device(device) if isinstance(device, str) else device).eval(), processor


class TorchmetricsCLIPScore:
    """The run's ``clip_score`` as torchmetrics' ``CLIPScore`` computes it (x100, plain captions)."""

    def __init__(
        self,
        folder: str,
        batch_size: int = 64,
        device: str = "cpu",
        interval_resamples: int | None = MEAN_RESAMPLES,
        interval_seed: int = 0,
    ) -> None:
        self.folder, self.device = folder, device
        self.batch_size = knobs.batch_size("clip", batch_size)
        self.interval_resamples, self.interval_seed = interval_settings(interval_resamples, interval_seed, "clip")
        self._metric = None

    def metric(self):
        """torchmetrics' ``CLIPScore`` holding the folder's model and processor (loaded once)."""
        if self._metric is None:
            from torchmetrics.multimodal.clip_score import CLIPScore

            loaded = load_hf_clip(self.folder, self.device)
            self._metric = CLIPScore(model_name_or_path=lambda: loaded)
        return self._metric

    def check(self, prompts: Sequence, labels: Sequence[int] | None = None) -> None:
        """Before the first image: the prompts are captions and the folder loads."""
        if any(not isinstance(p, str) for p in prompts):
            raise ConfigError("metrics=clip needs text prompts; this prompt set holds class ids")
        self.metric()

    @torch.no_grad()
    def per_prompt(self, images: np.ndarray, captions: Sequence[str]) -> np.ndarray:
        """``100 * cos`` (N,) of uint8 (N, H, W, 3) images and their captions, by torchmetrics' update."""
        from torchmetrics.functional.multimodal.clip_score import _clip_score_update

        metric = self.metric()
        device = next(metric.model.parameters()).device
        scores = []
        for start in range(0, len(images), self.batch_size):
            batch = torch.from_numpy(np.ascontiguousarray(images[start : start + self.batch_size]))
            pixels = batch.permute(0, 3, 1, 2).to(device)  # (b, 3, H, W) uint8, as torchmetrics takes images
            score, _ = _clip_score_update(
                list(pixels), list(captions[start : start + len(batch)]), metric.model, metric.processor
            )
            scores.append(score.float().cpu())
        return torch.cat(scores).numpy().astype(np.float64)

    def __call__(self, run_dir: Path, prompts: Sequence, labels: Sequence[int] | None) -> dict:
        start = time.perf_counter()
        scores = self.per_prompt(run_images(run_dir, len(prompts)).source, list(prompts))  # (N,) x100
        fields = mean_fields("clip_score", scores, self.interval_resamples, self.interval_seed)
        fields["clip_score"] = max(fields["clip_score"], 0.0)  # torchmetrics clamps the mean at 0
        return {
            **fields,
            "clip_convention": "torchmetrics",
            "clip_model": os.path.basename(os.path.normpath(self.folder)),
            "clip_seconds": time.perf_counter() - start,
        }


TorchmetricsCLIPScore.dry = knobs.dry_metric(TorchmetricsCLIPScore, "clip", folders=("folder",))
