"""Text-conditioning interface shared by the caption encoders.

LlamaGen t2i conditions on per-token caption states that are LEFT-padded: the real tokens sit
at the end of the row, padded slots are exactly zero and the mask is ``True`` on real tokens.
Hugging Face tokenizers pad on the right, so encoders run the model on right-padded ids and
then rotate every row with :func:`left_pad` (LlamaGen: ``cat(emb[valid:], emb[:valid])``).
"""

from __future__ import annotations

import abc
import json
import os
import re
from dataclasses import dataclass

import torch

from lantern import checks
from lantern.errors import CheckpointError, ConfigError
from lantern.files import note_input


@dataclass
class TextEmbedding:
    """Per-token caption states and their validity mask.

    ``states`` is (B, L, D) float and ``mask`` is (B, L) bool with ``True`` on real tokens.
    Encoders return them left-padded: real tokens at the end of each row, padded slots zero.
    """

    states: torch.Tensor  # (B, L, D)
    mask: torch.Tensor  # (B, L) bool

    def __post_init__(self) -> None:
        if self.states.dim() != 3 or self.mask.dim() != 2:
            raise ValueError(
                f"TextEmbedding expects states (B, L, D) and mask (B, L), got "
                f"{tuple(self.states.shape)} and {tuple(self.mask.shape)}"
            )
        if tuple(self.states.shape[:2]) != tuple(self.mask.shape):
            raise ValueError(
                f"TextEmbedding states {tuple(self.states.shape)} and mask {tuple(self.mask.shape)} disagree on (B, L)"
            )
        if self.mask.dtype != torch.bool:
            raise ValueError(f"TextEmbedding mask must be torch.bool, got {self.mask.dtype}")

    def to(self, device: torch.device | str) -> TextEmbedding:
        """Return a copy with both tensors on ``device``."""
        return TextEmbedding(states=self.states.to(device), mask=self.mask.to(device))


def left_pad(states: torch.Tensor, mask: torch.Tensor) -> TextEmbedding:
    """Turn right-padded token states into the left-padded, zero-padded LlamaGen layout.

    ``states`` is (B, L, D) and ``mask`` (B, L) (bool or 0/1 ints) with each row's real tokens
    forming a prefix, as Hugging Face tokenizers produce with ``padding_side="right"``. Each row
    is rotated left by its number of real tokens ``n`` (``cat(row[n:], row[:n])``), so the real
    tokens keep their order and end at the last slot; the returned mask is ``True`` on the last
    ``n`` slots and every other slot of ``states`` is set to exactly zero. Rows with no real token
    come back all zero; full rows come back unchanged. The dtype and device of ``states`` are kept.
    """
    if states.dim() != 3 or mask.dim() != 2 or tuple(states.shape[:2]) != tuple(mask.shape):
        raise ValueError(
            f"left_pad expects states (B, L, D) and mask (B, L), got {tuple(states.shape)} and {tuple(mask.shape)}"
        )
    mask = mask.to(device=states.device, dtype=torch.bool)  # (B, L)
    length = mask.shape[1]
    valid = mask.sum(dim=1)  # (B,)
    positions = torch.arange(length, device=states.device)  # (L,)
    if not torch.equal(mask, positions[None, :] < valid[:, None]):
        raise ValueError("left_pad expects right-padded rows: each row's real tokens must be a prefix")
    source = (positions[None, :] + valid[:, None]) % length  # (B, L)
    rotated = torch.gather(states, 1, source[:, :, None].expand(-1, -1, states.shape[2]))  # (B, L, D)
    new_mask = positions[None, :] >= (length - valid)[:, None]  # (B, L)
    rotated = rotated.masked_fill(~new_mask[:, :, None], 0)  # (B, L, D)
    return TextEmbedding(states=rotated, mask=new_mask)


def check_max_length(max_length: int) -> int:
    """Return ``max_length`` if it is a positive integer, else raise :class:`ConfigError`."""
    return checks.integer("text max_length", max_length, 1)


class TextEncoder(abc.ABC):
    """A caption encoder producing left-padded per-token states.

    ``max_length`` is the row length L of every embedding and ``dim`` the state size D.
    """

    max_length: int
    dim: int

    @abc.abstractmethod
    def encode(self, prompts: list[str]) -> TextEmbedding:
        """Encode ``prompts`` into float32 (B, max_length, dim) left-padded, zero-padded states and mask."""


# A prompt longer than this many characters per kept token is cut at a whitespace before tokenizing
# (when the cut still holds more tokens than are kept): tokenizers split words at whitespace, so the
# kept tokens are the same, and a megabyte prompt costs milliseconds instead of seconds.
HEAD_CHARS_PER_TOKEN = 64
_LAST_SPACE = re.compile(r"\s(?=\S*$)")


class HFTextEncoder(TextEncoder):
    """A :class:`TextEncoder` around a Hugging Face encoder model and its tokenizer.

    Each prompt is first preprocessed (``preprocessing``: see :mod:`lantern.models.text.captions`; each
    distinct prompt once). The tokenizer pads to ``max_length`` on the right, truncates longer
    prompts and adds its special tokens (they count as real tokens). The model runs without
    gradients on the ids and attention mask; ``last_hidden_state`` is cast to float32 and passed
    through :func:`left_pad`. The tokenizer's ``padding_side`` is set to ``"right"``.
    """

    def __init__(
        self, model: torch.nn.Module, tokenizer, max_length: int, dim: int, preprocessing: str = "none"
    ) -> None:
        from lantern.models.text.captions import check_mode

        self.model = model.eval()
        self.tokenizer = tokenizer
        self.tokenizer.padding_side = "right"
        self.max_length = check_max_length(max_length)
        self.dim = int(dim)
        self.preprocessing = check_mode(preprocessing)
        self._prepared: dict[str, str] = {}

    def prepare(self, prompt: str) -> str:
        """The text the tokenizer gets for ``prompt``: preprocessed, and cut to a head that still holds
        every token the encoder keeps (:data:`HEAD_CHARS_PER_TOKEN`)."""
        if prompt not in self._prepared:
            from lantern.models.text.captions import preprocess

            text = preprocess(prompt, self.preprocessing)
            limit = HEAD_CHARS_PER_TOKEN * self.max_length
            if len(text) > limit:
                space = _LAST_SPACE.search(text, 0, limit)
                if space is not None and self._count(text[: space.start()]) > self.max_length:
                    text = text[: space.start()]
            self._prepared[prompt] = text
        return self._prepared[prompt]

    def _count(self, text: str) -> int:
        """Tokens of ``text`` with special tokens, counted up to ``max_length + 1``."""
        ids = self.tokenizer(text, truncation=True, max_length=self.max_length + 1)["input_ids"]
        return len(ids)

    def truncated(self, prompt: str) -> bool:
        """Whether ``prompt`` has more tokens (special tokens included) than the encoder keeps."""
        return self._count(self.prepare(prompt)) > self.max_length

    @property
    def device(self) -> torch.device:
        """The device holding the model's parameters."""
        return next(self.model.parameters()).device

    def encode(self, prompts: list[str]) -> TextEmbedding:
        """Encode ``prompts`` into float32 (B, max_length, dim) left-padded, zero-padded states and mask."""
        if isinstance(prompts, str) or not all(isinstance(p, str) for p in prompts):
            raise TypeError("encode expects a list of strings")
        prompts = list(prompts)
        device = self.device
        if not prompts:
            return TextEmbedding(
                states=torch.zeros(0, self.max_length, self.dim, device=device),
                mask=torch.zeros(0, self.max_length, dtype=torch.bool, device=device),
            )
        tokens = self.tokenizer(
            [self.prepare(prompt) for prompt in prompts],
            padding="max_length",
            truncation=True,
            max_length=self.max_length,
            return_tensors="pt",
        )
        input_ids = tokens["input_ids"].to(device)  # (B, L)
        attention_mask = tokens["attention_mask"].to(device)  # (B, L)
        with torch.no_grad():
            states = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (B, L, D)
        return left_pad(states.float(), attention_mask)


def read_model_config(path: str | os.PathLike, expected: str) -> dict:
    """Return the parsed ``config.json`` of the local model folder ``path``.

    Raises :class:`ConfigError` naming ``path`` and ``expected`` (what the folder should hold)
    when the folder or its config is missing or unreadable.
    """
    path = os.fspath(path)
    config_file = os.path.join(path, "config.json")
    if not os.path.isdir(path):
        raise ConfigError(f"text encoder folder not found: {path!r}; expected {expected}")
    if not os.path.isfile(config_file):
        raise ConfigError(f"text encoder folder {path!r} has no config.json; expected {expected}")
    try:
        with open(config_file, encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"text encoder config {config_file!r} is not readable JSON ({exc}); expected {expected}"
        ) from exc
    if not isinstance(config, dict):
        raise ConfigError(f"text encoder config {config_file!r} is not a JSON object; expected {expected}")
    return config


def dtype_kwargs(dtype: torch.dtype) -> dict:
    """``from_pretrained`` keyword selecting ``dtype``: ``dtype`` from transformers 4.56, else ``torch_dtype``."""
    import transformers

    major, minor = (int(part) for part in transformers.__version__.split(".")[:2])
    return {"dtype": dtype} if (major, minor) >= (4, 56) else {"torch_dtype": dtype}


def load_hf_encoder(model_class, path: str, dtype: torch.dtype, expected: str, label: str):
    """Load ``(model, tokenizer)`` from the local folder ``path`` (never downloads).

    Any failure becomes one :class:`CheckpointError` naming ``path`` and what was ``expected``.
    """
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # its "Loading weights" bars would sit on stderr beside our one-line errors
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = model_class.from_pretrained(path, local_files_only=True, **dtype_kwargs(dtype))
    except Exception as exc:  # noqa: BLE001 - any load failure means the folder is not a usable encoder
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(
            f"cannot load a {label} encoder from {path!r} ({reason[:200]}); expected {expected}"
        ) from exc
    note_input(path, "text_encoder")
    return model, tokenizer
