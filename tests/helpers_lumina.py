"""The tiny random HF Chameleon of the tiny_random_lumina preset the Lumina tests share."""

from __future__ import annotations

import pytest
import torch

from lantern.models.chameleon.lumina_bundle import tiny_words
from lantern.models.chameleon.vocab import tiny_vocabulary

transformers = pytest.importorskip("transformers")
from transformers import ChameleonConfig as HFConfig  # noqa: E402
from transformers import ChameleonForConditionalGeneration  # noqa: E402

# The tiny_random_lumina preset's architecture (conf/model/tiny_random_lumina.yaml).
PIXELS, GRID, SLOTS, CODES = 32, 8, 32, 1024
TARGET = dict(image_size=PIXELS, cls_token_num=SLOTS, n_layer=2, n_head=4, dim=64, ffn_hidden=128, num_codes=CODES)
VQ = dict(
    num_embeddings=CODES, embed_dim=8, z_channels=16, resolution=PIXELS, base_channels=32,
    channel_multiplier=[1, 1, 2], num_res_blocks=1,
)  # fmt: skip
VQ_HF = dict(
    num_embeddings=CODES, embed_dim=8, latent_channels=16, resolution=PIXELS, base_channels=32,
    channel_multiplier=[1, 1, 2], num_res_blocks=1,
)  # fmt: skip
PROMPTS = ["a red fox in the snow", "a cat", "an old house on a cliff at sunset"]
STREAM = GRID * (GRID + 1) + 1  # the reference's image tokens after [BOI, H, W]: rows + EOLs, then EOI


def lumina_vocabulary() -> dict[str, int]:
    return tiny_vocabulary(CODES, tiny_words(PIXELS))


def hf_model(seed: int = 0) -> ChameleonForConditionalGeneration:
    """A random HF Chameleon of the preset's architecture whose every weight is perturbed."""
    torch.manual_seed(seed)
    vocab = lumina_vocabulary()
    # bos_token_id 1 as Lumina's own config.json; the tokenizer's <s> is what counts.
    config = HFConfig(
        vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=512, bos_token_id=1, pad_token_id=1, eos_token_id=2,
        vocabulary_map=vocab, vq_config=VQ_HF, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )  # fmt: skip
    model = ChameleonForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.add_((0.1 if "norm" in name else 0.05) * torch.randn_like(param))
    return model
