"""The tiny random HF Emu3 the Emu3 tests share: the preset's sizes, the model and its saved folder."""

from __future__ import annotations

import pytest
import torch

from lantern.models.checkpoint import TOKENIZER_NAME
from lantern.models.emu3 import bundle
from lantern.models.emu3.vocab import word_tokenizer

transformers = pytest.importorskip("transformers")
from transformers import Emu3Config as HFConfig  # noqa: E402
from transformers import Emu3ForConditionalGeneration  # noqa: E402

# The tiny_random_emu3 preset's architecture (conf/model/tiny_random_emu3.yaml).
PIXELS, GRID, SLOTS, CODES = 32, 8, 64, 1024
TARGET = dict(
    image_size=PIXELS, cls_token_num=SLOTS, n_layer=2, n_head=4, n_kv_head=2, dim=64, ffn_hidden=128, num_codes=CODES
)
VQ = dict(
    codebook_size=CODES, embed_dim=8, latent_channels=8, base_channels=32, channel_multiplier=[1, 1, 2],
    num_res_blocks=1, attn_resolutions=[], temporal_downsample_factor=4, hidden_size=64, num_attention_heads=1,
)  # fmt: skip
PROMPTS = ["a red fox in the snow", "a cat", "an old house on a cliff at sunset"]
STREAM = GRID * (GRID + 1) + 3  # their image tokens after <|image token|>: rows + EOLs, then EOF, EOI, EOS


def hf_model(seed: int = 0, kv_heads: int = 2) -> Emu3ForConditionalGeneration:
    """A random HF Emu3ForConditionalGeneration of the preset's architecture, every weight perturbed."""
    torch.manual_seed(seed)
    config, vocab = bundle.random_config(TARGET, VQ)
    text = dict(
        vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=kv_heads, max_position_embeddings=512, rms_norm_eps=1e-5, pad_token_id=config.pad_id,
        bos_token_id=config.bos_id, eos_token_id=config.eos_id, attention_dropout=0.0,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    )  # fmt: skip
    model = Emu3ForConditionalGeneration(HFConfig(text_config=text, vq_config=VQ, vocabulary_map=vocab)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not name.startswith("model.vqmodel."):
                param.add_((0.1 if "norm" in name else 0.05) * torch.randn_like(param))
    return model


def save_folder(model, folder):
    model.save_pretrained(folder)
    word_tokenizer(model.config.vocabulary_map).save(str(folder / TOKENIZER_NAME))
    return folder
