"""The Chameleon family's reference-grade AR: transformers' ``ChameleonForConditionalGeneration.generate()`` with
the logits processors of each model's reference script, eager, one prompt at a time.

- Lumina-mGPT (``inference_solver.py``): after ``[BOI, H, W]``, image ids only inside a row, EOL forced after
  each row, EOI after the last (:class:`LuminaImageProcessor`); CFG by an unconditional context that is the
  stream from BOI on, in a cache of its own (:class:`LuminaCFGProcessor`).
- Anole (LANTERN's ``ea_model_anole.py``): image ids only (:class:`ImageIdsProcessor`); CFG against the context
  ``[BOS, BOI]`` (transformers' ``UnbatchedClassifierFreeGuidanceLogitsProcessor``).

transformers' class masks every image id in its logits (a text-chat default); Lumina's copy of the class does so
only under ``mask_image_logits`` (false in its released config) and Anole's generation needs image ids, so the
reference model's list of image ids to mask is emptied after loading.
"""

from __future__ import annotations

import torch

from lantern.models.hf_reference import HFReference, load_hf_model, rows_to_codes

try:  # transformers is a dependency of the family's folders; the processors subclass its base class
    from transformers import LogitsProcessor
except ImportError:  # pragma: no cover - the package always installs it
    LogitsProcessor = object


def load_chameleon(bundle, folder):
    """transformers' ChameleonForConditionalGeneration on the run's weights, image ids not masked."""
    from transformers import ChameleonForConditionalGeneration

    model = load_hf_model(ChameleonForConditionalGeneration, bundle, folder)
    model.model.vocabulary_mapping.image_tokens = []  # module docstring
    return model


class ImageIdsProcessor(LogitsProcessor):
    """Every id but the ``num_codes`` image ids from ``offset`` masked (LANTERN's Anole generate)."""

    def __init__(self, offset: int, num_codes: int):
        self.offset, self.num_codes = offset, num_codes

    def __call__(self, input_ids, scores):
        allowed = torch.zeros(scores.shape[-1], dtype=torch.bool, device=scores.device)
        allowed[self.offset : self.offset + self.num_codes] = True
        return scores.masked_fill(~allowed, -float("inf"))


class LuminaImageProcessor(LogitsProcessor):
    """Lumina-mGPT's image syntax for one image after a prompt of ``start`` ids ending in ``[BOI, H, W]``: image
    ids only inside a row, EOL forced after each row, EOI after the last EOL."""

    def __init__(self, start: int, config):
        self.start, self.cfg = start, config
        self.codes = ImageIdsProcessor(config.code_offset, config.num_codes)

    def __call__(self, input_ids, scores):
        made = input_ids.shape[1] - self.start  # image-stream tokens so far
        cfg, forced = self.cfg, None
        if (made + 1) % (cfg.grid_size + 1) == 0:
            forced = cfg.eol_id
        elif made == cfg.grid_size * (cfg.grid_size + 1):
            forced = cfg.eoi_id
        if forced is None:
            return self.codes(input_ids, scores)
        out = torch.full_like(scores, -float("inf"))
        out[:, forced] = 0
        return out


class LuminaCFGProcessor(LogitsProcessor):
    """Lumina-mGPT's image-start-triggered unbatched CFG: the unconditional context is the stream from BOI on
    (``[BOI, H, W]``, then every generated token), run in a cache of its own; ``scale * (cond - uncond) + uncond``."""

    def __init__(self, model, scale: float, boi_index: int):
        from transformers import DynamicCache

        self.model, self.scale, self.boi_index = model, scale, boi_index
        self.cache, self.fed = DynamicCache(config=model.config), 0

    def __call__(self, input_ids, scores):
        context = input_ids[:, self.boi_index :]
        out = self.model(input_ids=context[:, self.fed :], cache=self.cache, use_cache=True)
        self.fed = context.shape[1]
        uncond = out.logits[:, -1].float()
        return self.scale * (scores - uncond) + uncond


class LuminaReference(HFReference):
    """Lumina-mGPT's reference-grade AR (module docstring). ``folder``: the preset's ``model.gpt_ckpt``."""

    def __init__(self, bundle, code=None, folder=None):
        super().__init__(load_chameleon(bundle, folder), bundle.target.config)

    def one(self, ids: torch.Tensor, sampling) -> torch.Tensor:
        cfg = self.config
        processors = [LuminaImageProcessor(ids.shape[1], cfg)]
        if sampling.cfg_scale > 1:  # guidance when > 1, as every decoder of ours
            processors.insert(0, LuminaCFGProcessor(self.model, sampling.cfg_scale, ids.shape[1] - 3))
        stream = self.run(ids, processors, cfg.grid_size * (cfg.grid_size + 1) + 1, sampling)
        return rows_to_codes(stream, cfg.grid_size, cfg.code_offset)


class AnoleReference(HFReference):
    """Anole's reference-grade AR (module docstring). ``folder``: the preset's ``model.gpt_ckpt``."""

    def __init__(self, bundle, code=None, folder=None):
        super().__init__(load_chameleon(bundle, folder), bundle.target.config)

    def one(self, ids: torch.Tensor, sampling) -> torch.Tensor:
        from transformers import UnbatchedClassifierFreeGuidanceLogitsProcessor

        cfg = self.config
        processors = [ImageIdsProcessor(cfg.code_offset, cfg.num_codes)]
        if sampling.cfg_scale > 1:
            null = torch.tensor([[cfg.bos_id, cfg.boi_id]], device=ids.device)
            processors.insert(0, UnbatchedClassifierFreeGuidanceLogitsProcessor(sampling.cfg_scale, self.model, null))
        return self.run(ids, processors, cfg.grid_size * cfg.grid_size, sampling) - cfg.code_offset
