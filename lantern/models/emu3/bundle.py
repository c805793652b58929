"""Emu3 bundles (target + VQ + prompt conditioner) and their drafters, built from a preset's nodes.

``target`` nodes: ``image_size`` and ``cls_token_num`` (nothing in a folder says them); for the seeded random
preset also the architecture (``n_layer``, ``n_head``, ``n_kv_head``, ``dim``, ``ffn_hidden``, ``num_codes``). ``vq`` nodes
(random preset only) are transformers' ``Emu3VQVAEConfig`` keys; a folder's VQ is its own ``vq_config``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from lantern import checks
from lantern.errors import CheckpointError, ConfigError
from lantern.models import bundle as shared  # the bundle protocol and the helpers every family's loaders share
from lantern.models.bundle import ModelBundle
from lantern.models.checkpoint import folder_source, read_tensor, tokenizer_file
from lantern.models.devices import resolve_device, resolve_dtype
from lantern.models.drafter import load_drafter_for
from lantern.models.dry import dry_twin, family_twin
from lantern.models.emu3 import hf
from lantern.models.emu3.condition import Emu3Conditioner, negative_ids
from lantern.models.emu3.model import Emu3Config, Emu3Target
from lantern.models.emu3.vocab import read_layout, tiny_vocabulary, word_tokenizer
from lantern.models.emu3.vq import downsample, load_vq, random_vq
from lantern.models.llama_parts import random_prompted_target
from lantern.models.prompt_ids import load_tokenizer

# Words of the random preset's tokenizer: its captions', and those of BAAI's positive and negative prompts.
TINY_WORDS = tuple(
    "a an the of on in with at and photo red blue small large old cat dog fox bird house tree boat sunset snow "
    "bowl table lighthouse bicycle wall cliff masterpiece film grained best quality lowres bad anatomy hands "
    "text error missing fingers extra digit fewer digits cropped worst low normal jpeg artifacts signature "
    "watermark username blurry , .".split()
)
CODEBOOK_KEY = "vqmodel.quantize.embedding.weight"  # as transformers 5 stores it
RESCALE = 1.0 / 0.00392156862745098  # postprocess's 1 / rescale_factor of the released preprocessor config (255.0)


def release_pixels(images: torch.Tensor) -> torch.Tensor:
    """VQ output (B, 3, H, W) ~[-1, 1] -> pixels (B, H, W, 3) uint8 as BAAI's processor and transformers'
    ``Emu3ImageProcessor.postprocess`` make them from the released config (mean = std = 0.5, rescale 1/255):
    ``(x + 1) / 2`` in fp32, times 255 in fp64 cast back to fp32, clipped to [0, 255] and truncated. This is
    ``127.5 x + 127.5`` truncated, one level below LlamaGen's ``127.5 x + 128`` in about half the values."""
    unit = (images.float() + 1.0) / 2.0  # (B, 3, H, W): the unnormalised image, in fp32 as numpy keeps it
    pixels = (unit.double() * RESCALE).float().clamp(0.0, 255.0)  # numpy: fp64 product, fp32 result, then clip
    return pixels.permute(0, 2, 3, 1).to(torch.uint8)  # truncation toward zero, as numpy's astype(uint8)


@dataclass
class Emu3Bundle(ModelBundle):
    """A :class:`ModelBundle` whose pixels are the release's (:func:`release_pixels`)."""

    @torch.inference_mode()
    def decode_images(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes (B, N) -> pixels (B, H, W, 3) uint8, one image at a time (see :meth:`ModelBundle.decode_images`)."""
        return torch.cat([release_pixels(self.vq.decode_codes(codes[i : i + 1])) for i in range(codes.shape[0])])


def grid_of(target: Mapping, vq: Mapping) -> int:
    """Codes per image side: ``image_size`` over the VQ's downsampling, which must divide it."""
    size, factor = checks.integer("model.image_size", target["image_size"], 1), downsample(vq)
    if size % factor:
        raise ConfigError(f"image_size {size} is not a multiple of the VQ's {factor}x downsample")
    return size // factor


def random_config(target: Mapping, vq: Mapping) -> tuple[Emu3Config, dict[str, int]]:
    """The seeded random preset's architecture and its vocabulary (``tiny_vocabulary``)."""
    num_codes = checks.integer("model.target.num_codes", target["num_codes"], 1)
    if num_codes != int(vq["codebook_size"]):
        raise ConfigError(f"{num_codes} image codes do not match the VQ's {vq['codebook_size']}")
    vocab = tiny_vocabulary(num_codes, TINY_WORDS)
    layout = read_layout(vocab, "the random preset's vocabulary")
    grid = grid_of(target, vq)
    config = Emu3Config(
        **Emu3Config.node_sizes(target, len(vocab)),
        n_kv_head=int(target.get("n_kv_head", 0)),  # 0: as n_head
        grid_size=grid,
        cls_token_num=target["cls_token_num"],
        null_ids=negative_ids(word_tokenizer(vocab), layout, grid),
        **layout,
    )
    return config, vocab


def folder_parts(folder: str, target: Mapping, tokenizer) -> tuple[Emu3Config, Mapping]:
    """A folder's target config and ``vq_config``, checked before any large read."""
    vq = hf.vq_section(folder)
    cls_token_num = checks.integer("model.cls_token_num", target["cls_token_num"], 2)
    return hf.check_folder(folder, grid_of(target, vq), cls_token_num, tokenizer), vq


def _random(node: Mapping) -> Emu3Config:
    """``config_of`` of the random preset's dry twins: its config, nothing built."""
    return random_config(node["target"], node["vq"])[0]


def _slots(node: Mapping) -> None:
    """``config_of`` of a folder preset's dry twins: what the node states (the folder says the rest)."""
    checks.integer("model.cls_token_num", node["target"]["cls_token_num"], 2)


DRAFTERS = "a drafter folder scripts/train_drafter.py exported"


@dry_twin(family_twin("model.bundle", _random, paths=("gpt_ckpt",)))
def random_bundle(
    name: str, target: Mapping, vq: Mapping, init_seed=0, device="cpu", dtype="float32", gpt_ckpt: str | None = None
) -> Emu3Bundle:
    """The seeded random tiny Emu3 (no files): target, VQ and a word-level tokenizer over its vocabulary.
    ``gpt_ckpt`` (an HF folder of the same architecture and vocabulary), when given, replaces target and VQ."""
    device, dtype = resolve_device(device), resolve_dtype(dtype)
    config, vocab = random_config(target, vq)
    tokenizer = word_tokenizer(vocab)
    model, vq_model = random_prompted_target(Emu3Target, config, init_seed), random_vq(vq, init_seed)
    if gpt_ckpt is not None:
        folder = shared.require_folder(gpt_ckpt, hf.ARCHITECTURE)
        loaded, folder_vq = folder_parts(folder, target, tokenizer)
        if loaded != config:
            raise CheckpointError(f"HF folder {folder!r} is not the random preset's architecture")
        model, state = hf.load_target(folder, config)
        vq_model = load_vq(folder_vq, state, folder_source(folder))
    conditioner = Emu3Conditioner.for_model(tokenizer, config, device=device)
    return shared.finish_family_bundle(Emu3Bundle, name, model, vq_model, conditioner, device, dtype)


@dry_twin(family_twin("model.bundle", _slots, paths=("gpt_ckpt",)))
def load_bundle(
    name: str, gpt_ckpt: str | None, target: Mapping, device: str = "cpu", dtype: str = "float32"
) -> Emu3Bundle:
    """An Emu3 target, its VQ and its tokenizer from one HF ``Emu3ForConditionalGeneration`` folder."""
    folder = shared.require_folder(
        gpt_ckpt, hf.ARCHITECTURE, "config.json, weights with model.vqmodel.*, tokenizer.json"
    )
    device, dtype = resolve_device(device), resolve_dtype(dtype)
    tokenizer = load_tokenizer(tokenizer_file(folder))
    config, vq = folder_parts(folder, target, tokenizer)
    model, state = hf.load_target(folder, config)
    vq_model = load_vq(vq, state, folder_source(folder))
    conditioner = Emu3Conditioner.for_model(tokenizer, config, device=device)
    return shared.finish_family_bundle(Emu3Bundle, name, model, vq_model, conditioner, device, dtype)


# ----- drafters and neighbours -----------------------------------------------------------------------------
@dry_twin(family_twin("model.drafter", _random, paths=("path",)))
def random_drafter(target, vq, init_seed=0, device="cpu", dtype="float32", path=None, name="tiny_random_emu3"):
    """A seeded random one-layer drafter of Emu3's kind (Llama's layer) for the random preset, or the one at ``path``."""
    return shared.family_drafter(random_config(target, vq)[0], path, name, init_seed, device, dtype)


@dry_twin(family_twin("model.drafter", _slots, paths=("path", "gpt_ckpt"), drafter=DRAFTERS))
def load_drafter(path, gpt_ckpt, target: Mapping, device="cpu", dtype="float32", name="emu3_gen"):
    """The drafter at ``path`` for the target folder ``gpt_ckpt`` (its config.json and tokenizer.json read)."""
    shared.require_drafter(path, DRAFTERS)
    folder = shared.require_folder(gpt_ckpt, hf.ARCHITECTURE)
    config, _ = folder_parts(folder, target, load_tokenizer(tokenizer_file(folder)))
    return load_drafter_for(path, config, name, device, dtype)


@dry_twin(family_twin("model.neighbours.codebook", lambda node: downsample(node["vq"])))
def random_codebook(vq: Mapping, init_seed: int = 0) -> torch.Tensor:
    """The random preset's VQ codebook (K, D) (code c is the decoder's token c: no id map needed)."""
    return random_vq(vq, init_seed).raw_codebook().detach()


@dry_twin(family_twin("model.neighbours.codebook", paths=("gpt_ckpt",)))
def folder_codebook(gpt_ckpt: str | os.PathLike) -> torch.Tensor:
    """A folder's VQ codebook (K, D), read alone from its shards."""
    return read_tensor(shared.require_folder(gpt_ckpt, hf.ARCHITECTURE), CODEBOOK_KEY).float()


# ----- timing (scripts/gpu_check.py) ------------------------------------------------------------------------
def timing_config(architecture: Mapping | None, target: Mapping, vq: Mapping) -> Emu3Config:
    """The config :func:`timing` builds its target of: ``architecture`` the fields of :class:`Emu3Config` but the
    grid and the condition slots; null: the random preset's own."""
    if architecture is None:
        return random_config(target, vq)[0]
    ids = (architecture["bos_id"], architecture["boi_id"], architecture["img_id"])
    return Emu3Config.for_architecture(architecture, target, grid_of(target, vq), null_ids=ids)


@dry_twin(family_twin("model.timing", lambda node: timing_config(node.get("architecture"), node["target"], node["vq"])))
def timing(architecture: Mapping | None, target: Mapping, vq: Mapping, device="cpu", dtype="float32", init_seed=0):
    """Random-weight parts of a preset for the GPU check: a target of :func:`timing_config` and a one-layer drafter."""
    config = timing_config(architecture, target, vq)
    return shared.timing_parts(Emu3Target, config, Emu3Conditioner, device, dtype, init_seed)
