"""Caption prompts for Chameleon targets: the model's own tokenizer, the reference's template, left padding.

Anole (LANTERN's ``models/ea_model_anole.py``, ``generate``): ``[BOS] + tokenize(caption) + [EOT, BOI]``
with ``tokenize`` the text tokenizer's ``encode(caption).ids`` (no special tokens of its own), rows
left-padded with the pad id, pads masked. The unconditional context of CFG is ``[BOS, BOI]``
(:meth:`lantern.models.chameleon.model.ChameleonTarget.null_condition`).
"""

from __future__ import annotations

import torch

from lantern.models.prompt_ids import PromptConditioner

TEMPLATES = ("anole",)


class ChameleonConditioner(PromptConditioner):
    """Captions -> left-padded prompt ids (B, T) and their mask (B, T), T the model's condition slots."""

    templates = TEMPLATES
    special = ("bos_id", "pad_id", "eot_id", "boi_id")

    def ids(self, prompt: str) -> list[int]:
        """The prompt context of one caption, by the template."""
        text = self.tokenizer.encode(prompt, add_special_tokens=False).ids
        return [self.bos_id, *text, self.eot_id, self.boi_id]

    def place(self, values: torch.Tensor, mask: torch.Tensor, ids: list[int]) -> None:
        """Left padding: the context fills the last ``len(ids)`` slots."""
        values[len(values) - len(ids) :] = torch.tensor(ids)
        mask[len(values) - len(ids) :] = True
