"""Export a model preset's target GPT and drafter in the HF layout of LANTERN's releases (``scripts/export_hf.py``).

The preset's own nodes build and load both models as a run would (the world's files, a checkpoint,
seeded random weights), so the folders hold exactly the weights a run decodes with; read back through
``model.gpt_ckpt=DIR/target model.drafter_ckpt=DIR/drafter`` they give the same images.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from lantern import checks
from lantern.errors import ConfigError, writes_under
from lantern.models.devices import resolve_dtype
from lantern.models.drafter import save_drafter_folder

PARTS = ("target", "drafter")


class NoConditioner:
    """Stands in for the preset's text encoder or class conditioner: an export writes weights and encodes no
    prompt, so a t2i preset needs no local FLAN-T5 folder to be exported."""

    def __init__(self, device=None):
        self.device = device

    def check_model(self, config) -> None:
        """Every model fits: nothing is conditioned."""


@writes_under("out_dir")
def export(cfg: DictConfig) -> dict[str, Path]:
    """Write ``cfg.parts`` of ``cfg.model`` to ``cfg.out_dir``/target and /drafter (``config.json`` and
    ``model.safetensors`` in ``cfg.weights_dtype``); return the folders written, by part."""
    out = Path(cfg.out_dir)  # required: a missing out_dir is refused first
    parts = list(cfg.parts) if OmegaConf.is_list(cfg.parts) else [cfg.parts]
    if not parts:
        raise checks.refuse("parts", parts, f"a non-empty list of {', '.join(PARTS)}")
    for part in parts:
        checks.choice("parts", part, PARTS)
    dtype = resolve_dtype(checks.choice("weights_dtype", cfg.weights_dtype, ("float32", "bfloat16", "float16")))
    refused = cfg.model.get("target_export_refused")
    if "target" in parts and refused:
        raise ConfigError(f"model={cfg.model.name}: {refused}; parts=[drafter] exports the drafter")
    if "conditioner" in cfg.model.bundle:  # a separate text encoder (LlamaGen t2i); a family's own tokenizer stays
        stand_in = {"_target_": f"{NoConditioner.__module__}.NoConditioner", "_partial_": True}
        OmegaConf.update(cfg, "model.bundle.conditioner", stand_in, merge=False)

    from hydra.utils import instantiate

    bundle = instantiate(cfg.model.bundle)
    drafter = None
    if "drafter" in parts:
        if "drafter" not in cfg.model:
            raise ConfigError(f"model={cfg.model.name} has no drafter to export; pass parts=[target]")
        drafter = instantiate(cfg.model.drafter)
        drafter.check_target(bundle.target.config)
    made = [folder for folder in (out, *out.parents) if not folder.exists()]  # made by the writes below
    written = {}
    try:
        if "target" in parts:
            written["target"] = bundle.save_target(out / "target", dtype)
        if drafter is not None:
            embeddings = drafter.config.arch.folder_embeddings(bundle.target)  # the table the family's folders keep
            written["drafter"] = save_drafter_folder(drafter, embeddings, out / "drafter", dtype)
    except BaseException:
        for folder in made:  # each part's folder is atomic; what this call made and left empty goes too
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
    return written
