"""LlamaGen's drafters from its preset nodes: the seeded random one of the tiny presets, and files or HF-layout
folders (this project's, or the LANTERN release's ``jadohu/llamagen_drafter`` layout).

What a drafter for a LlamaGen target is (its blocks, 2D RoPE, folder layout) is
:class:`~lantern.models.llamagen.gpt.LlamaGenArch`, which :class:`~lantern.models.llamagen.gpt.GPTConfig`'s
``drafter_arch()`` gives; the drafter itself and its loading are family-free (:mod:`lantern.models.drafter`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch

from lantern.models.bundle import require_drafter
from lantern.models.devices import resolve_device, resolve_dtype
from lantern.models.drafter import CONDITION_INPUTS, Drafter, DrafterConfig, load_drafter_for
from lantern.models.dry import dry_twin, family_twin
from lantern.models.llamagen import hf_layout
from lantern.models.llamagen.bundle import configs, dry_config

# What model.drafter_ckpt may be, for the one-line refusal of a run that drafts with none.
WHERE = (
    "a drafter trained with scripts/train_drafter.py, an HF-layout folder, or the LANTERN release's drafter "
    "for LlamaGen-XL t2i"
)


def from_reference_keys(state_dict: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
    """Rename a LANTERN/EAGLE drafter state dict (``layers.0.self_attn.q_proj.weight``...) to ours
    (:func:`lantern.models.llamagen.hf_layout.drafter_from_hf`): the renamed dict and the file's frozen
    ``embed_tokens.weight`` (or ``None``), which is only used for checking."""
    return hf_layout.drafter_from_hf(state_dict)


@dry_twin(
    family_twin(
        "model.drafter", dry_config("model.drafter"), ("path",), {"condition_input": CONDITION_INPUTS}, drafter=WHERE
    )
)
def load_drafter(
    path: str | os.PathLike | None,
    gpt: Mapping,
    vq: Mapping,
    device: str = "cpu",
    dtype: str = "float32",
    norm_eps: float = 1e-6,
    condition_input: str = "embedding",
) -> Drafter:
    """Build the drafter for the LlamaGen target described by ``gpt``/``vq`` (model-config nodes) and load ``path``
    (:func:`~lantern.models.drafter.load_drafter_for`: a file or an HF-layout folder)."""
    require_drafter(path, WHERE)
    target, _ = configs(gpt, vq)
    return load_drafter_for(path, target, gpt["preset"], device, dtype, norm_eps, condition_input)


@dry_twin(family_twin("model.drafter", dry_config("model.drafter"), ("path",)))
def random_drafter(
    gpt: Mapping,
    vq: Mapping,
    init_seed: int = 0,
    n_layer: int = 1,
    device: str = "cpu",
    dtype: str = "float32",
    path: str | os.PathLike | None = None,
) -> Drafter:
    """A seeded, randomly initialised drafter for the described target (smoke runs and tests), or, when
    ``path`` is given, the drafter loaded from it (:func:`load_drafter`)."""
    if path is not None:
        return load_drafter(path, gpt, vq, device, dtype)
    torch.manual_seed(init_seed)
    drafter = Drafter(DrafterConfig(configs(gpt, vq)[0], n_layer=n_layer))
    return drafter.to(device=resolve_device(device), dtype=resolve_dtype(dtype)).eval()
