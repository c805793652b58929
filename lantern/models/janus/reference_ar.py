"""Janus-Pro's reference-grade AR: transformers' own ``JanusForConditionalGeneration.generate(generation_mode=
"image")``, eager, one prompt at a time (DeepSeek's ``generation_inference.py`` as transformers ships it: the
prompt and its unconditional twin, every id but BOS and BOI padded, in one batch, CFG on the generation head's
logits). A folder is read as its own ``from_pretrained``; the run's Janus target keeps only the generation path,
so the reference needs ``model.gpt_ckpt``'s folder.
"""

from __future__ import annotations

import torch

from lantern.errors import ConfigError
from lantern.models.hf_reference import HFReference, load_hf_model, sampling_kwargs


class JanusReference(HFReference):
    """Janus's reference-grade AR (module docstring). ``folder``: the preset's ``model.gpt_ckpt``."""

    def __init__(self, bundle, code=None, folder=None):
        from transformers import JanusForConditionalGeneration

        super().__init__(load_hf_model(JanusForConditionalGeneration, bundle, folder), bundle.target.config)

    def one(self, ids: torch.Tensor, sampling) -> torch.Tensor:
        cfg = self.config
        if sampling.cfg_scale <= 1:  # their generate() keeps both CFG rows and stacks them without a guidance step
            raise ConfigError(
                f"cfg_scale={sampling.cfg_scale}: transformers' Janus generate() always guides; its reference-grade AR "
                "needs cfg_scale > 1 (the reference's is 5)"
            )
        stated = self.model.model.vision_model.config.num_image_tokens  # what their generate() decodes
        if stated != cfg.num_image_tokens:
            raise ConfigError(
                f"the folder's vision_config.num_image_tokens={stated} but the preset decodes {cfg.num_image_tokens} "
                "codes: transformers' generate() would make another image size"
            )
        settings = self.model.generation_config
        settings.bos_token_id, settings.pad_token_id = cfg.bos_id, cfg.pad_id
        settings.generation_kwargs = {
            **(getattr(settings, "generation_kwargs", None) or {}),
            "boi_token_id": cfg.boi_id,
        }
        with torch.inference_mode():
            return self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                generation_mode="image",
                guidance_scale=sampling.cfg_scale,
                **sampling_kwargs(sampling),
            )
