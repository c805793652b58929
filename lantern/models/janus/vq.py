"""Janus's image tokenizer (transformers' ``JanusVQVAE``, DeepSeek's ``gen_vision_model``): LlamaGen's VQ-16.

DeepSeek's ``janus/models/vq_model.py`` is LlamaGen's VQ model (16384 codes of dim 8, l2-normalised codebook,
``ch_mult`` 1,1,2,2,4, attention at the lowest resolution, 384 px -> 24 x 24), so the tokenizer here is
:class:`lantern.models.vq_model.VQModel` with transformers' names mapped onto it:
``{encoder,decoder}.{down,up}.{i}.block.{j}`` -> ``conv_blocks.{i}.res.{j}``, ``...attn.{j}``,
``...{down,up}sample`` -> ``conv_blocks.{i}.*``, ``mid.{block_1,attn_1,block_2}`` -> ``mid.{0,1,2}``
(transformers' decoder lists its levels lowest resolution first, as LlamaGen's). ``JanusVQVAE.decode``
(l2-normalised code vectors, ``post_quant_conv``, decoder) is ``VQModel.decode_codes``; tested equal.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from lantern.errors import CheckpointError
from lantern.models.checkpoint import check_shapes
from lantern.models.vq_model import VQConfig, VQModel

USAGE_KEY = "quantize.codebook_used"  # LlamaGen's usage statistic; transformers' VQ has none


def vq_config(vq: Mapping) -> VQConfig:
    """A ``vq_config`` (transformers' ``JanusVQVAEConfig`` keys) as LlamaGen's :class:`VQConfig`."""
    if vq.get("double_latent", False):
        raise CheckpointError("vq_config has double_latent=true; Janus's VQ has a single latent")
    if int(vq.get("out_channels", 3)) != int(vq.get("in_channels", 3)):
        raise CheckpointError("vq_config: out_channels must equal in_channels (an image in, an image out)")
    return VQConfig(
        codebook_size=int(vq.get("num_embeddings", 16384)),
        codebook_embed_dim=int(vq.get("embed_dim", 8)),
        ch=int(vq.get("base_channels", 128)),
        ch_mult=tuple(int(m) for m in vq.get("channel_multiplier", (1, 1, 2, 2, 4))),
        z_channels=int(vq.get("latent_channels", 256)),
        num_res_blocks=int(vq.get("num_res_blocks", 2)),
        norm_groups=32,
        l2_norm=True,
        dropout=float(vq.get("dropout", 0.0)),
        in_channels=int(vq.get("in_channels", 3)),
    )


def theirs(name: str) -> str:
    """A LlamaGen VQ tensor name -> transformers' ``JanusVQVAE`` name."""
    match = re.match(r"^(encoder|decoder)\.conv_blocks\.(\d+)\.(res|attn|downsample|upsample)\.(.*)$", name)
    if match:
        part, level, kind, rest = match.groups()
        side = "down" if part == "encoder" else "up"
        return f"{part}.{side}.{level}.{'block' if kind == 'res' else kind}.{rest}"
    match = re.match(r"^(encoder|decoder)\.mid\.([012])\.(.*)$", name)
    if match:
        part, index, rest = match.groups()
        return f"{part}.mid.{('block_1', 'attn_1', 'block_2')[int(index)]}.{rest}"
    return name


def load_vq(state: Mapping[str, torch.Tensor], config: VQConfig, source: str) -> VQModel:
    """The VQ from a folder's ``model.vqmodel.*`` tensors (prefix removed), strictly: every tensor of the
    architecture and nothing else, in transformers' names (the message names theirs, with the prefix)."""
    model = VQModel(config)
    names = {theirs(k): k for k in model.state_dict() if k != USAGE_KEY}  # theirs -> ours
    shapes = {"model.vqmodel." + k: tuple(model.state_dict()[v].shape) for k, v in names.items()}
    check_shapes(shapes, {"model.vqmodel." + k: v for k, v in state.items()}, "a JanusVQVAE of that vq_config", source)
    loaded = {names[k]: v.float() for k, v in state.items()}
    loaded[USAGE_KEY] = torch.zeros_like(model.quantize.codebook_used)
    model.load_state_dict(loaded, strict=True)
    return model


def random_vq(config: VQConfig, init_seed: int = 0) -> VQModel:
    """A seeded random VQ (seed ``init_seed + 1``, as the other families' random tokenizers); its codebook is
    spread as a trained one (the LlamaGen init is near zero, which the l2-norm would make arbitrary)."""
    torch.manual_seed(init_seed + 1)
    model = VQModel(config)
    with torch.no_grad():
        model.quantize.embedding.weight.normal_()
    return model
