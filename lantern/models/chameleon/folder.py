"""A Chameleon bundle written back as an HF ``ChameleonForConditionalGeneration`` folder (``scripts/export_hf.py``).

The folder is what :func:`lantern.models.chameleon.hf.load_target` reads and what transformers'
``ChameleonForConditionalGeneration.from_pretrained`` loads: ``config.json`` (transformers' ``ChameleonConfig``
keys with the ``vocabulary_map`` and the VQ's ``vq_config``), ``model.safetensors`` (the target's tensors, whose
names already are transformers', and the VQGAN's encoder side under ``model.vqmodel.``) and ``tokenizer.json``
(the bundle's prompt tokenizer). The VQGAN's decoder is not part of an HF folder (transformers has none):
``model.vq_ckpt`` keeps pointing at ``vqgan.ckpt`` for the real models, and the random presets rebuild theirs
from the seed. Weights are written in ``dtype``, atomically (a finished folder or none).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from lantern.errors import ConfigError
from lantern.files import write_folder_atomic
from lantern.models.bundle import ModelBundle
from lantern.models.chameleon.hf import VQ_PREFIX
from lantern.models.chameleon.model import ARCHITECTURE
from lantern.models.chameleon.vocab import read_layout
from lantern.models.checkpoint import TOKENIZER_NAME

CONFIG_NAME, WEIGHTS_NAME = "config.json", "model.safetensors"
# The VQGAN's tensors an HF folder holds (transformers' ChameleonVQVAE: the encoder side and the codebook).
VQ_PARTS = ("encoder.", "quant_conv.", "quantize.", "post_quant_conv.")


def vq_config(vq) -> dict:
    """transformers' ``ChameleonVQVAEConfig`` keys for our :class:`~lantern.models.chameleon.vqgan.VQGANConfig`."""
    return {
        "embed_dim": vq.embed_dim,
        "num_embeddings": vq.num_embeddings,
        "double_latent": False,
        "latent_channels": vq.z_channels,
        "resolution": vq.resolution,
        "in_channels": vq.in_channels,
        "base_channels": vq.base_channels,
        "channel_multiplier": list(vq.channel_multiplier),
        "num_res_blocks": vq.num_res_blocks,
        "attn_resolutions": list(vq.attn_resolutions) or None,
        "attn_type": "vanilla",
        "dropout": vq.dropout,
    }


def target_config(config, vq, vocabulary: dict[str, int]) -> dict:
    """``config.json`` of a target of :class:`~lantern.models.chameleon.model.ChameleonConfig` ``config``."""
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "chameleon",
        "vocab_size": config.text_vocab_size,
        "hidden_size": config.dim,
        "intermediate_size": config.ffn_hidden,
        "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head,
        "num_key_value_heads": config.n_kv_head,
        "hidden_act": "silu",
        "rms_norm_eps": config.norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "model_parallel_size": 1,
        "swin_norm": config.swin_norm,
        "tie_word_embeddings": False,
        "bos_token_id": config.bos_id,
        "pad_token_id": config.pad_id,
        "max_position_embeddings": max(4096, config.max_seq_len + 64),
        "vq_config": vq_config(vq),
        "vocabulary_map": dict(sorted(vocabulary.items(), key=lambda item: item[1])),
    }


def vq_tensors(vqgan: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The VQGAN's tensors an HF folder holds, under ``model.vqmodel.`` (its names are transformers')."""
    return {VQ_PREFIX + k: v for k, v in vqgan.state_dict().items() if k.startswith(VQ_PARTS)}


def save_target_folder(bundle, folder: str | os.PathLike, dtype: torch.dtype = torch.float32) -> Path:
    """Write ``bundle`` (a Chameleon-family :class:`~lantern.models.bundle.ModelBundle`: target, VQGAN and a
    conditioner holding the prompt tokenizer) to ``folder``; ConfigError when its tokenizer's vocabulary does
    not give the target's token layout (the folder would read back as another model)."""
    target, config = bundle.target, bundle.target.config
    tokenizer = bundle.conditioner.tokenizer
    vocabulary = {str(name): int(index) for name, index in tokenizer.get_vocab().items()}
    layout = read_layout(vocabulary, "the bundle's tokenizer", config.bos_id, config.pad_id)
    for key, value in vars(layout).items():
        if getattr(config, key) != value:
            raise ConfigError(
                f"the bundle's tokenizer gives {key}={value} but the target has {getattr(config, key)}: "
                "its folder would read back as another model"
            )
    tensors = {
        name: tensor.detach().to(device="cpu", dtype=dtype).contiguous()
        for name, tensor in {**target.state_dict(), **vq_tensors(bundle.vq)}.items()
    }
    text = json.dumps(
        {**target_config(config, bundle.vq.config, vocabulary), "torch_dtype": str(dtype).removeprefix("torch.")},
        indent=2,
    )

    def write(staging: Path) -> None:
        from safetensors.torch import save_file

        save_file(tensors, str(staging / WEIGHTS_NAME), metadata={"format": "pt"})
        (staging / CONFIG_NAME).write_text(text + "\n", encoding="utf-8")
        tokenizer.save(str(staging / TOKENIZER_NAME))

    return write_folder_atomic(folder, write)


@dataclass
class ChameleonBundle(ModelBundle):
    """A :class:`ModelBundle` of the Chameleon family (Anole, Lumina-mGPT): its target is written back as an HF
    ``ChameleonForConditionalGeneration`` folder."""

    def save_target(self, folder: str | os.PathLike, dtype: torch.dtype = torch.float32) -> Path:
        return save_target_folder(self, folder, dtype)
