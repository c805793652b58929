"""Caption prompts for Emu3 targets, as BAAI's ``image_generation.py`` (mode ``G``) writes them.

A prompt is ``BOS + caption + POSITIVE + BOI + "{H}*{W}" + <|image token|>`` (their ``Emu3Processor``, the
header's sizes in codes: 90*90 for Emu3-Gen's 720 px), tokenised by the model's tokenizer with its special
tokens placed as ids (each piece between two of them encodes alone, as the whole string does), rows
left-padded with the pad id, pads masked. CFG's unconditional context is the same template around NEGATIVE
(:meth:`lantern.models.emu3.model.Emu3Target.null_condition`).
"""

from __future__ import annotations

import torch

from lantern.models.prompt_ids import PromptConditioner

POSITIVE = " masterpiece, film grained, best quality."
NEGATIVE = (
    "lowres, bad anatomy, bad hands, text, error, missing fingers, extra digit, fewer digits, cropped, worst "
    "quality, low quality, normal quality, jpeg artifacts, signature, watermark, username, blurry."
)


def template_ids(tokenizer, text: str, bos_id: int, boi_id: int, img_id: int, grid: int) -> list[int]:
    """``[BOS] text [BOI] "{grid}*{grid}" [IMG]`` as ids (``text`` already carries its suffix)."""

    def encode(piece: str) -> list[int]:
        return tokenizer.encode(piece, add_special_tokens=False).ids

    return [bos_id, *encode(text), boi_id, *encode(f"{grid}*{grid}"), img_id]


def negative_ids(tokenizer, layout: dict[str, int], grid: int) -> tuple[int, ...]:
    """CFG's unconditional context: NEGATIVE in the template (``layout`` holds the special ids)."""
    return tuple(template_ids(tokenizer, NEGATIVE, layout["bos_id"], layout["boi_id"], layout["img_id"], grid))


class Emu3Conditioner(PromptConditioner):
    """Captions -> left-padded prompt ids (B, T) and their mask (B, T), T the model's condition slots."""

    templates = ("emu3",)
    special = ("bos_id", "pad_id", "boi_id", "img_id", "grid_size")

    def ids(self, prompt: str) -> list[int]:
        """The prompt context of one caption (POSITIVE appended, as their script does)."""
        return template_ids(self.tokenizer, prompt + POSITIVE, self.bos_id, self.boi_id, self.img_id, self.grid_size)

    def place(self, values: torch.Tensor, mask: torch.Tensor, ids: list[int]) -> None:
        """Left padding: the context fills the last ``len(ids)`` slots."""
        values[len(values) - len(ids) :] = torch.tensor(ids)
        mask[len(values) - len(ids) :] = True
