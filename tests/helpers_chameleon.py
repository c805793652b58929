"""The tiny random HF Chameleon the Chameleon tests share: its sizes, the model and its saved folder."""

from __future__ import annotations

import pytest
import torch

from lantern.models.chameleon.vocab import TINY_WORDS, tiny_vocabulary, word_tokenizer
from lantern.models.checkpoint import TOKENIZER_NAME

transformers = pytest.importorskip("transformers")
from transformers import ChameleonConfig as HFConfig  # noqa: E402
from transformers import ChameleonForConditionalGeneration  # noqa: E402

CODES, GRID, SLOTS = 64, 4, 12
VQ = dict(num_embeddings=CODES, embed_dim=8, z_channels=32, resolution=16, base_channels=32)
VQ_HF = dict(
    num_embeddings=CODES, embed_dim=8, latent_channels=32, resolution=16, base_channels=32,
    channel_multiplier=[1, 1, 2], num_res_blocks=1,
)  # fmt: skip
PROMPTS = ["a red fox in the snow", "a cat", "an old house on a cliff at sunset"]


def hf_config(**overrides) -> HFConfig:
    vocab = tiny_vocabulary(CODES, TINY_WORDS)
    values = dict(
        vocab_size=len(vocab), hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=256, bos_token_id=0, pad_token_id=1, eos_token_id=2,
        vocabulary_map=vocab, vq_config=VQ_HF, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )  # fmt: skip
    values.update(overrides)
    return HFConfig(**values)


def hf_model(seed: int = 0, **overrides) -> ChameleonForConditionalGeneration:
    """A random HF Chameleon whose every weight (norms, qk-norm affine included) is perturbed."""
    torch.manual_seed(seed)
    model = ChameleonForConditionalGeneration(hf_config(**overrides)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            scale = 0.1 if "norm" in name else 0.05
            param.add_(scale * torch.randn_like(param))
    return model


def save_folder(model, folder, shard: str | None = None):
    model.save_pretrained(folder, **({"max_shard_size": shard} if shard else {}))
    word_tokenizer(model.config.vocabulary_map).save(str(folder / TOKENIZER_NAME))
    return folder
