"""Human Preference Score v2.1 (HPSv2.1), scored as the ``hpsv2`` package scores it, offline.

Model: open_clip ``ViT-H-14`` with the HPS v2.1 checkpoint (``HPS_v2.1_compressed.pt``, a
``{"state_dict": ...}`` of the whole CLIP) loaded strictly from a local path; nothing is downloaded.
Scoring (``hpsv2.img_score.score``): the image through the package's validation transform with its
``light_augmentation`` (``resize_longest_max``): RGB, ``ToTensor`` to [0, 1], the longer side resized
to the model's image size (224) with bicubic on the tensor (torchvision's default antialias),
zero-padded centrally to a square, normalised with OpenAI's mean and std; the prompt through the
model's tokenizer (77 tokens); the score of an image is the cosine of the unit image and text
embeddings (``diag(image_features @ text_features.T)``, no logit scale), about 0.2-0.35. ``hps`` is
its mean over prompts, with ``hps_ci`` from the per-prompt scores. The package scores under CUDA
autocast (fp16); ``precision="fp32"`` (the default here) does not, which moves scores by ~1e-3.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as TF

from lantern import checks
from lantern.errors import ConfigError, LanternError
from lantern.metrics import knobs
from lantern.metrics.bootstrap import MEAN_RESAMPLES, interval_settings, mean_fields
from lantern.metrics.clip import _quiet, register_config
from lantern.metrics.features import run_images
from lantern.models.checkpoint import check_state_dict, read_state_dict, unreadable_reason
from lantern.models.devices import resolve_device

OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)
PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def hps_input(image: np.ndarray, size: int) -> torch.Tensor:
    """(H, W, 3) uint8 -> (3, size, size) float32: longest side to ``size`` (bicubic), centred zero pad."""
    x = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1).float() / 255.0  # (3, H, W) in [0, 1]
    height, width = x.shape[1:]
    scale = size / float(max(height, width))
    if scale != 1.0:
        new = (round(height * scale), round(width * scale))
        x = TF.resize(x, list(new), InterpolationMode.BICUBIC)  # (3, h, w), antialiased
        pad_h, pad_w = size - new[0], size - new[1]
        x = F.pad(x, (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2))  # (3, size, size)
    mean, std = torch.tensor(OPENAI_MEAN)[:, None, None], torch.tensor(OPENAI_STD)[:, None, None]
    return (x - mean) / std


def image_size(model) -> int:
    size = model.visual.image_size
    return int(size[0] if isinstance(size, (tuple, list)) else size)


class HPSv2:
    """The run's HPSv2.1 (``hps``, ``hps_ci``): open_clip ``model`` + the HPS ``checkpoint``."""

    def __init__(
        self,
        checkpoint: str,
        model: str = "ViT-H-14",
        model_config: str | None = None,
        precision: str = "fp32",
        batch_size: int = 16,
        device: str = "cpu",
        interval_resamples: int | None = MEAN_RESAMPLES,
        interval_seed: int = 0,
    ) -> None:
        self.checkpoint, self.model, self.model_config = (
            checkpoint,
            knobs.name("metrics.hps.model", model),
            model_config,
        )
        self.precision = checks.choice("metrics.hps.precision", precision, PRECISIONS)
        self.batch_size = knobs.batch_size("hps", batch_size)
        self.device = device
        self.interval_resamples, self.interval_seed = interval_settings(interval_resamples, interval_seed, "hps")
        self._loaded = None

    def load(self):
        """``(model, tokenizer)``: ``model`` built by open_clip without weights, the checkpoint loaded strictly."""
        if self._loaded is not None:
            return self._loaded
        import open_clip

        if not os.path.isfile(self.checkpoint):
            raise ConfigError(f"metrics.hps.checkpoint={self.checkpoint!r}: file not found (HPS_v2.1_compressed.pt)")
        register_config(self.model, self.model_config)
        state_dict = read_state_dict(self.checkpoint, "metric")
        device = resolve_device(self.device) if isinstance(self.device, str) else torch.device(self.device)
        try:
            with _quiet():
                clip = open_clip.create_model(self.model, pretrained=None, device="cpu")
                tokenizer = open_clip.get_tokenizer(self.model)
        except LanternError:
            raise
        except Exception as exc:  # noqa: BLE001 - open_clip raises many kinds for a bad architecture
            raise ConfigError(f"open_clip cannot build {self.model!r}: {unreadable_reason(exc)}") from exc
        check_state_dict(clip, state_dict, f"open_clip {self.model} (HPS checkpoint)", self.checkpoint)
        clip.load_state_dict(state_dict, strict=True)
        clip = clip.to(device=device, dtype=PRECISIONS[self.precision]).eval()
        self._loaded = (clip, tokenizer)
        return self._loaded

    def check(self, prompts: Sequence, labels: Sequence[int] | None = None) -> None:
        """Before the first image: the prompts are captions and the checkpoint loads into the model."""
        if any(not isinstance(p, str) for p in prompts):
            raise ConfigError("metrics=hps needs text prompts; this prompt set holds class ids")
        self.load()

    @torch.no_grad()
    def per_prompt(self, images: np.ndarray, captions: Sequence[str]) -> np.ndarray:
        """HPS (N,) of uint8 (N, H, W, 3) images against their captions."""
        clip, tokenizer = self.load()
        param = next(clip.parameters())
        size = image_size(clip)
        scores = []
        for start in range(0, len(images), self.batch_size):
            batch = images[start : start + self.batch_size]
            pixels = torch.stack([hps_input(im, size) for im in batch]).to(param.device, param.dtype)  # (b, 3, S, S)
            tokens = tokenizer(list(captions[start : start + len(batch)])).to(param.device)  # (b, 77)
            image = F.normalize(clip.encode_image(pixels).float(), dim=-1)  # (b, E)
            text = F.normalize(clip.encode_text(tokens).float(), dim=-1)  # (b, E)
            scores.append((image * text).sum(-1).cpu())
        return torch.cat(scores).numpy().astype(np.float64)

    def __call__(self, run_dir: Path, prompts: Sequence, labels: Sequence[int] | None) -> dict:
        start = time.perf_counter()
        scores = self.per_prompt(run_images(run_dir, len(prompts)).source, list(prompts))
        return {
            **mean_fields("hps", scores, self.interval_resamples, self.interval_seed),
            "hps_model": self.model,
            "hps_seconds": time.perf_counter() - start,
        }


HPSv2.dry = knobs.dry_metric(HPSv2, "hps", files=("checkpoint", "model_config"))
