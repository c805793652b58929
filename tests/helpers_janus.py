"""The tiny random HF Janus the Janus tests share: its sizes, the model, its saved folder and its loaded target."""

from __future__ import annotations

import pytest
import torch

from lantern.models.checkpoint import TOKENIZER_NAME
from lantern.models.janus import hf
from lantern.models.janus.condition import tiny_vocabulary, word_tokenizer

transformers = pytest.importorskip("transformers")
from transformers import JanusConfig as HFConfig  # noqa: E402
from transformers import JanusForConditionalGeneration  # noqa: E402

CODES, GRID, SLOTS, CFG = 64, 4, 24, 5.0
VQ_HF = dict(
    num_embeddings=CODES, embed_dim=8, latent_channels=32, base_channels=32, channel_multiplier=[1, 1, 2],
    num_res_blocks=1, projection_dim=64, image_token_embed_dim=64,
)  # fmt: skip
PROMPTS = ["a red fox in the snow", "a cat", "an old house on a cliff at sunset"]


def hf_config(**text) -> HFConfig:
    vocab = tiny_vocabulary()
    values = dict(
        model_type="llama", vocab_size=len(vocab), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6,
        bos_token_id=0, pad_token_id=2,
    )  # fmt: skip
    values.update(text)
    vision = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=GRID * 16, patch_size=16,
                  projection_dim=64, mlp_ratio=2, num_image_tokens=GRID * GRID)  # fmt: skip
    return HFConfig(text_config=values, vision_config=vision, vq_config=VQ_HF)


def hf_model(seed: int = 0, **text) -> JanusForConditionalGeneration:
    """A random HF Janus whose every weight (norms, biases, generation embeddings included) is perturbed."""
    torch.manual_seed(seed)
    model = JanusForConditionalGeneration(hf_config(**text)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            scale = 0.1 if "norm" in name else 0.2 if "vqmodel" not in name else 0.02
            param.add_(scale * torch.randn_like(param))
    return model


def save_folder(model, folder, shard: str | None = None):
    model.save_pretrained(folder, **({"max_shard_size": shard} if shard else {}))
    word_tokenizer(tiny_vocabulary()).save(str(folder / TOKENIZER_NAME))
    return folder


def load(folder):
    config = hf.check_folder(folder, GRID, SLOTS, word_tokenizer(tiny_vocabulary()))
    return hf.load_target(folder, config)
