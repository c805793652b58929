"""FLAN-T5-XL caption encoder used by LlamaGen text-to-image models.

LlamaGen t2i conditions on ``T5EncoderModel(...).last_hidden_state`` (2048-d for FLAN-T5-XL) of
captions cleaned twice by its caption cleaner (:mod:`lantern.models.text.captions`), tokenized to 120 tokens
(``</s>`` included in the mask), rotated to left padding with zeroed padded slots. LlamaGen runs the
encoder in bfloat16 by default. Weights are read from a local folder only; nothing is downloaded.
"""

from __future__ import annotations

import os

import torch

from lantern import checks
from lantern.errors import ConfigError
from lantern.models.text.base import HFTextEncoder, check_max_length, load_hf_encoder, read_model_config

T5_EXPECTED = "a local folder with a FLAN-T5 encoder and tokenizer (e.g. google/flan-t5-xl saved with save_pretrained)"

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


class T5TextEncoder(HFTextEncoder):
    """Left-padded FLAN-T5 encoder states (see :class:`lantern.models.text.base.HFTextEncoder`).

    ``model`` is a built ``transformers.T5EncoderModel`` and ``tokenizer`` its tokenizer, which
    must append ``</s>``; the constructor does no I/O. ``dim`` is the model's ``d_model``.
    ``preprocessing`` is LlamaGen's caption cleaning (``clean``) by default.
    """

    def __init__(self, model: torch.nn.Module, tokenizer, max_length: int = 120, preprocessing: str = "clean") -> None:
        super().__init__(model, tokenizer, max_length=max_length, dim=model.config.d_model, preprocessing=preprocessing)


def _resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype) and dtype in _DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype.lower() in _DTYPES:
        return _DTYPES[dtype.lower()]
    raise checks.refuse("model.text_encoder_dtype", dtype, "one of float32, bfloat16, float16")


def load_t5_encoder(
    path: str | os.PathLike,
    max_length: int = 120,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = "float32",
    preprocessing: str = "clean",
) -> T5TextEncoder:
    """Load a FLAN-T5 encoder and tokenizer from the local folder ``path`` (never downloads).

    ``dtype`` is the weight precision (float32, bfloat16 or float16; FLAN-T5 is known to
    overflow in float16); the returned states are always float32. ``preprocessing``: see
    :mod:`lantern.models.text.captions` (``clean``: LlamaGen's). Raises :class:`ConfigError`
    when ``path`` is not a folder with a T5 ``config.json``, and :class:`CheckpointError` when
    the weights or tokenizer in it cannot be loaded.
    """
    from lantern.models.text.captions import check_mode

    path = os.fspath(path)
    check_max_length(max_length)
    check_mode(preprocessing)
    torch_dtype = _resolve_dtype(dtype)
    config = read_model_config(path, T5_EXPECTED)
    if config.get("model_type") != "t5":
        raise ConfigError(
            f"text encoder folder {path!r} holds model_type {config.get('model_type')!r}, not 't5'; "
            f"expected {T5_EXPECTED}"
        )
    from transformers import T5EncoderModel

    model, tokenizer = load_hf_encoder(T5EncoderModel, path, torch_dtype, T5_EXPECTED, "T5")
    return T5TextEncoder(model.to(device), tokenizer, max_length=max_length, preprocessing=preprocessing)
