"""CLIP score with open_clip, in both conventions of the field.

* ``lantern`` (LANTERN / LlamaGen papers): captions prefixed with "A photo depicts ", score = mean cosine
  of the image and text embeddings (about 0.3 for good samples), OpenAI ViT-B/32.
* ``torchmetrics`` (SJD and torchmetrics' ``CLIPScore``) on open_clip weights: plain captions, score =
  ``max(mean(100 * cosine), 0)``, torchmetrics 1.9's formula (it clamps the mean, not each image). The SJD
  protocol itself scores through torchmetrics with an HF CLIPModel:
  :class:`lantern.metrics.clip_torchmetrics.TorchmetricsCLIPScore`.

Weights are never downloaded: ``pretrained`` is a local open_clip weights file, OpenAI's own release file
(``ViT-B-32.pt``, a TorchScript archive: its tensors are read from it and the model built with OpenAI's QuickGELU)
or ``local-dir:FOLDER``.
``model_config`` optionally registers an open_clip architecture from a JSON file first (for small CLIPs
trained by this project, such as the embedded world's ``lantern-fashion-clip.json``). open_clip names a
registered architecture after the file's stem, so the file must be called ``<model>.json``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from lantern import checks
from lantern.errors import CheckpointError, ConfigError, LanternError
from lantern.files import note_input
from lantern.metrics import knobs
from lantern.metrics.bootstrap import MEAN_RESAMPLES, interval_settings, mean_fields
from lantern.metrics.features import run_images
from lantern.models.checkpoint import unreadable_reason

CONVENTIONS = {"lantern": ("A photo depicts ", 1.0, False), "torchmetrics": ("", 100.0, True)}


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Hide open_clip's INFO lines (it logs through the root logger, which Hydra sets to INFO)."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        root.setLevel(level)


def register_config(model: str, model_config: str | None) -> None:
    """Register ``model_config`` (a JSON named ``<model>.json``) with open_clip; ConfigError unless
    ``model`` is then an open_clip architecture. The file is noted as an input."""
    import open_clip

    if model_config is not None:
        if not os.path.isfile(model_config):
            raise ConfigError(f"CLIP model config not found: {model_config!r}")
        if Path(model_config).stem != model:
            raise ConfigError(
                f"open_clip registers {model_config!r} as model {Path(model_config).stem!r}, not {model!r}; "
                f"set the model name to the file's stem or name the file {model}.json"
            )
        open_clip.add_model_config(model_config)
        note_input(model_config, "metric")
    if model not in open_clip.list_models():
        raise ConfigError(f"unknown open_clip model {model!r} (register its JSON with model_config=FILE)")


def openai_archive(path: str) -> dict | None:
    """The tensors of an OpenAI CLIP release file (``ViT-B-32.pt``: a TorchScript archive, which ``torch.load``
    refuses under ``weights_only``), without its three integer attributes; None for any other file."""
    if not os.path.isfile(path) or not zipfile.is_zipfile(path):
        return None
    with zipfile.ZipFile(path) as archive:
        if not any(name.endswith("/constants.pkl") for name in archive.namelist()):
            return None
    state = torch.jit.load(path, map_location="cpu").state_dict()
    return {k: v for k, v in state.items() if k not in ("input_resolution", "context_length", "vocab_size")}


def _load(model: str, pretrained: str, model_config: str | None, device: str):
    import open_clip

    register_config(model, model_config)
    local = pretrained[len("local-dir:") :] if pretrained.startswith("local-dir:") else pretrained
    if not os.path.exists(local):
        raise ConfigError(
            f"CLIP weights not found: {pretrained!r}; give a local open_clip weights file or local-dir:FOLDER "
            "(named tags such as 'openai' download, which does not work offline)"
        )
    released = openai_archive(local)
    with _quiet():
        if released is None:
            clip, _, preprocess = open_clip.create_model_and_transforms(model, pretrained=pretrained, device=device)
        else:  # OpenAI's own weights: QuickGELU, as open_clip builds them for its 'openai' tag
            clip, _, preprocess = open_clip.create_model_and_transforms(model, device=device, force_quick_gelu=True)
            clip.load_state_dict(released, strict=True)
        tokenizer = open_clip.get_tokenizer(model)
    note_input(local, "metric")
    return clip.eval(), preprocess, tokenizer


@torch.no_grad()
def encode_images(clip, preprocess, images: np.ndarray, batch_size: int = 64, device: str = "cpu") -> torch.Tensor:
    """Unit-norm float32 embeddings (N, E) on the CPU of uint8 (N, H, W, 3) images, through ``preprocess``."""
    from PIL import Image

    embeddings = []
    for start in range(0, len(images), batch_size):
        pixels = torch.stack(
            [preprocess(Image.fromarray(im)) for im in images[start : start + batch_size]]
        )  # (b, 3, S, S)
        embeddings.append(torch.nn.functional.normalize(clip.encode_image(pixels.to(device)).float(), dim=-1).cpu())
    return torch.cat(embeddings)  # (N, E)


@torch.no_grad()
def encode_texts(clip, tokenizer, captions: Sequence[str], batch_size: int = 64, device: str = "cpu") -> torch.Tensor:
    """Unit-norm float32 embeddings (N, E) on the CPU of ``captions``, tokenized by ``tokenizer``."""
    embeddings = []
    for start in range(0, len(captions), batch_size):
        tokens = tokenizer(list(captions[start : start + batch_size])).to(device)  # (b, context_length)
        embeddings.append(torch.nn.functional.normalize(clip.encode_text(tokens).float(), dim=-1).cpu())
    return torch.cat(embeddings)  # (N, E)


def clip_cosines(
    clip, preprocess, tokenizer, images: np.ndarray, captions: Sequence[str], batch_size: int = 64, device: str = "cpu"
) -> np.ndarray:
    """Cosine similarity (N,) of each uint8 (N, H, W, 3) image with its caption."""
    image_emb = encode_images(clip, preprocess, images, batch_size, device)  # (N, E)
    text_emb = encode_texts(clip, tokenizer, captions, batch_size, device)  # (N, E)
    return (image_emb * text_emb).sum(-1).numpy()


def _check_captions(captions: Sequence) -> None:
    if any(not isinstance(c, str) for c in captions):
        raise ConfigError("metrics=clip needs text prompts; this prompt set holds class ids")


class CLIPScore:
    """The run's CLIP score (``clip_score``) under ``convention``; no I/O until it is computed."""

    def __init__(
        self,
        pretrained: str,
        model: str = "ViT-B-32",
        convention: str = "lantern",
        model_config: str | None = None,
        batch_size: int = 64,
        device: str = "cpu",
        interval_resamples: int | None = MEAN_RESAMPLES,
        interval_seed: int = 0,
    ):
        if convention not in CONVENTIONS:
            raise checks.refuse("metrics.clip.convention", convention, "one of " + ", ".join(CONVENTIONS))
        self.pretrained, self.model, self.convention = pretrained, knobs.name("metrics.clip.model", model), convention
        self.model_config, self.batch_size, self.device = model_config, knobs.batch_size("clip", batch_size), device
        self.interval_resamples, self.interval_seed = interval_settings(interval_resamples, interval_seed, "clip")
        self._loaded = None

    def load(self):
        """``(model, preprocess, tokenizer)``, loaded on first use and kept for later calls.

        A weights file that cannot be loaded (not a checkpoint, another architecture, a pickle of more
        than tensors) is one CheckpointError naming it.
        """
        if self._loaded is None:
            try:
                self._loaded = _load(self.model, self.pretrained, self.model_config, self.device)
            except LanternError:
                raise
            except Exception as exc:  # noqa: BLE001 - open_clip and torch raise many kinds for a bad file
                raise CheckpointError(
                    f"metrics.clip.pretrained={self.pretrained!r} cannot be loaded as {self.model} weights: "
                    f"{unreadable_reason(exc)}"
                ) from exc
        return self._loaded

    def check(self, prompts: Sequence, labels: Sequence[int] | None = None) -> None:
        """Before the first image: the prompts are captions and the model loads (it is kept for scoring)."""
        _check_captions(prompts)
        self.load()

    def per_prompt(self, images: np.ndarray, captions: Sequence[str]) -> np.ndarray:
        """Cosine (N,) of each uint8 (N, H, W, 3) image with its (prefixed) caption; the figure is
        ``scale * mean``, clamped at 0 under the torchmetrics convention."""
        _check_captions(captions)
        prefix = CONVENTIONS[self.convention][0]
        clip, preprocess, tokenizer = self.load()
        return clip_cosines(
            clip, preprocess, tokenizer, images, [prefix + c for c in captions], self.batch_size, self.device
        )

    def figure(self, scores: np.ndarray) -> float:
        """The convention's figure of per-prompt cosines (N,)."""
        _, scale, clamp = CONVENTIONS[self.convention]
        value = float(scale * np.mean(scores))
        return max(value, 0.0) if clamp else value

    def score(self, images: np.ndarray, captions: Sequence[str]) -> float:
        """Mean score of uint8 (N, H, W, 3) images against their captions."""
        return self.figure(self.per_prompt(images, captions))

    def __call__(self, run_dir: Path, prompts: Sequence, labels: Sequence[int] | None) -> dict:
        scores = self.per_prompt(run_images(run_dir, len(prompts)).source, list(prompts))  # (N,)
        fields = mean_fields("clip_score", scores, self.interval_resamples, self.interval_seed,
                             CONVENTIONS[self.convention][1])  # fmt: skip
        return {
            **fields,
            "clip_score": self.figure(scores),
            "clip_convention": self.convention,
            "clip_model": self.model,
        }


CLIPScore.dry = knobs.dry_metric(CLIPScore, "clip", files=("pretrained", "model_config"))
