"""Emu3's reference-grade AR: transformers' ``Emu3ForConditionalGeneration.generate()`` with the logits processors
of BAAI's ``image_generation.py``, eager, one prompt at a time: unbatched CFG over the negative prompt
(``UnbatchedClassifierFreeGuidanceLogitsProcessor``) and the image syntax forced by position
(``PrefixConstrainedLogitsProcessor`` over :func:`image_syntax`, BAAI's ``Emu3PrefixConstrainedLogitsHelper``).
"""

from __future__ import annotations

import torch

from lantern.models.hf_reference import HFReference, load_hf_model, rows_to_codes


def image_syntax(start: int, config):
    """The ids allowed after a prompt of ``start`` ids ending in ``<|image token|>`` (one square image): visual ids
    inside a row, EOL after each row, then EOF, EOI, EOS, then pads (BAAI's prefix-constrained helper)."""
    visual = list(range(config.code_offset, config.code_offset + config.num_codes))
    width = rows = config.grid_size
    tail = {1: config.eof_id, 2: config.eoi_id, 3: config.eos_id}

    def allowed(batch_id, input_ids):
        offset = input_ids.shape[0] - (start - 1)  # tokens from <|image token|> on
        if offset % (width + 1) == 0:
            return [config.eol_id]
        if offset - (width + 1) * rows in tail:
            return [tail[offset - (width + 1) * rows]]
        return [config.pad_id] if offset > (width + 1) * rows + 3 else visual

    return allowed


class Emu3Reference(HFReference):
    """Emu3's reference-grade AR (module docstring). ``folder``: the preset's ``model.gpt_ckpt``."""

    def __init__(self, bundle, code=None, folder=None):
        from transformers import Emu3ForConditionalGeneration

        super().__init__(load_hf_model(Emu3ForConditionalGeneration, bundle, folder), bundle.target.config)

    def one(self, ids: torch.Tensor, sampling) -> torch.Tensor:
        import transformers

        cfg = self.config
        processors = [transformers.PrefixConstrainedLogitsProcessor(image_syntax(ids.shape[1], cfg), 1)]
        if sampling.cfg_scale > 1:
            negative = torch.tensor([cfg.null_ids], device=ids.device)
            guidance = transformers.UnbatchedClassifierFreeGuidanceLogitsProcessor(
                sampling.cfg_scale, self.model, unconditional_ids=negative
            )
            processors.insert(0, guidance)
        stream = self.run(ids, processors, cfg.grid_size * (cfg.grid_size + 1) + 3, sampling)
        return rows_to_codes(stream, cfg.grid_size, cfg.code_offset)
