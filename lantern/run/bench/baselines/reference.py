"""The reference-grade AR: the family's reference loop (transformers' ``generate()``, LlamaGen's ``generate()``),
eager, on the run's own weights, driven like a decoder so the job can time it beside the others.

The family's reference is named by its model config (``model.reference_ar``: a partial that takes the bundle
and ``code``, a folder of reference code where the family's reference is not transformers). It is built by
:meth:`ReferenceAR.prepare` before the first timed batch (its cost is recorded, never timed as decoding),
and answers :meth:`generate` with codes only: its own sampling draws from torch's global generator, so its
sampled images are not ours; greedy ones must be (the job checks and records it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch

from lantern.decoding.api import DecodeResult, DecoderSettings, register
from lantern.decoding.stats import exact_law, raster_steps
from lantern.errors import ConfigError
from lantern.models.condition import Condition


class FamilyReference(Protocol):
    """What a family's reference loop offers (``lantern/models/<family>/reference_ar.py``)."""

    label: str  # the code that runs, e.g. "transformers generate()" or "LlamaGen generate()"
    batched: bool  # False: the reference decodes one prompt at a time, as the papers time it

    def generate(self, condition: Condition, sampling, seed: int) -> torch.Tensor:
        """Codes (B, N) long for ``condition`` (B prompts) under ``sampling``; ``seed`` seeds its own RNG."""
        ...


@register
@dataclass(frozen=True)
class ReferenceARSettings(DecoderSettings):
    """The reference-grade AR: ``reference`` names the code that ran (and its commit, where known)."""

    kind: ClassVar[str] = "reference_ar"
    baseline: ClassVar[bool] = True
    reference: str = ""

    def method(self) -> str:
        return f"{self.label} ({self.reference})" if self.reference else self.label

    def record(self) -> dict:
        return {**super().record(), "acceptance": None, "draft": None, "reference": self.reference}


class ReferenceAR:
    """Reference-grade AR: ``family`` (the model config's ``reference_ar`` partial) built on the run's bundle."""

    def __init__(self, sampling, family=None, code: str | None = None, name: str = "reference_ar"):
        self.sampling, self.family, self.code = sampling, family, code
        self.name, self.label = name, "AR (reference)"
        self.compile = "none"  # the papers' loop: eager
        self.reference: FamilyReference | None = None
        self.setup_s: float | None = None

    @property
    def settings(self) -> ReferenceARSettings:
        shown = ""
        if self.reference is not None:
            commit = getattr(self.reference, "commit", None)
            shown = self.reference.label + (f" at {commit[:7]}" if commit else "")
        return ReferenceARSettings(name=self.name, label=self.label, compile="none", reference=shown)

    def check_device(self, device) -> None:
        """Any device: the reference runs eagerly wherever its model is."""

    def check_model(self, model_name: str) -> None:
        """ConfigError before any work when the model names no reference-grade AR."""
        if self.family is None:
            raise ConfigError(
                f"baseline=both/reference: model={model_name} names no reference-grade AR (model.reference_ar); "
                "baseline=compiled times the engine-grade AR alone"
            )
        check = getattr(getattr(self.family, "func", self.family), "check", None)
        if check is not None:  # e.g. LlamaGen's checkout, before the run's first image
            check(self.code)

    def prepare(self, bundle) -> float:
        """Build the family's reference on ``bundle`` (once); returns the seconds it took (0 when built)."""
        if self.reference is not None:
            return 0.0
        self.check_model(bundle.name)
        started = time.perf_counter()
        self.reference = self.family(bundle=bundle, code=self.code)
        self.setup_s = time.perf_counter() - started
        return self.setup_s

    def generate(self, model, condition: Condition, keys: torch.Tensor) -> DecodeResult:
        """The reference's codes for ``condition``; its RNG seeded from the first image's key."""
        if self.reference is None:
            raise RuntimeError("ReferenceAR.generate before prepare(bundle)")
        seed = int(keys.reshape(-1)[0].item()) & 0x7FFF_FFFF_FFFF_FFFF
        codes = self.reference.generate(condition, self.sampling, seed)
        num_tokens, batch = codes.shape[1], codes.shape[0]
        per_sample = exact_law(torch.full((batch,), num_tokens - 1, dtype=torch.long), num_tokens)
        per_sample.token_steps = raster_steps(batch, num_tokens)
        return DecodeResult(codes, {"target_forwards": float(num_tokens)}, per_sample)
