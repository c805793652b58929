"""Caption prompts for Chameleon targets: the model's own tokenizer, the reference's template, left padding.

Anole (LANTERN's ``models/ea_model_anole.py``, ``generate``): ``[BOS] + tokenize(caption) + [EOT, BOI]``
with ``tokenize`` the text tokenizer's ``encode(caption).ids`` (no special tokens of its own), rows
left-padded with the pad id, pads masked. The unconditional context of CFG is ``[BOS, BOI]``
(:meth:`lantern.models.chameleon.model.ChameleonTarget.null_condition`).
"""

from __future__ import annotations

import os

import torch

from lantern.errors import ConfigError
from lantern.models.condition import Condition

TEMPLATES = ("anole",)


class ChameleonConditioner:
    """Captions -> left-padded prompt ids (B, T) and their mask (B, T), T the model's condition slots."""

    kind = "text"

    def __init__(
        self,
        tokenizer,
        cls_token_num: int,
        bos_id: int,
        pad_id: int,
        eot_id: int,
        boi_id: int,
        template: str = "anole",
        device: str | torch.device = "cpu",
    ):
        if template not in TEMPLATES:
            raise ConfigError(f"prompt template={template!r}: expected one of {', '.join(TEMPLATES)}")
        self.tokenizer, self.cls_token_num, self.template = tokenizer, int(cls_token_num), template
        self.bos_id, self.pad_id, self.eot_id, self.boi_id = bos_id, pad_id, eot_id, boi_id
        self.device = torch.device(device)

    @classmethod
    def for_model(cls, tokenizer, config, template: str = "anole", device="cpu") -> ChameleonConditioner:
        """The conditioner of a target's ``config`` (its slots and special ids)."""
        return cls(
            tokenizer,
            config.cls_token_num,
            config.bos_id,
            config.pad_id,
            config.eot_id,
            config.boi_id,
            template,
            device,
        )

    def check_model(self, config) -> None:
        """ConfigError unless ``config`` (a ChameleonConfig) has these slots and special ids."""
        mine = (self.cls_token_num, self.bos_id, self.pad_id, self.eot_id, self.boi_id)
        theirs = tuple(
            getattr(config, name, None) for name in ("cls_token_num", "bos_id", "pad_id", "eot_id", "boi_id")
        )
        if mine != theirs:
            raise ConfigError(
                f"the prompt conditioner (slots, BOS, pad, EOT, BOI = {mine}) does not fit the model {theirs}"
            )

    def ids(self, prompt: str) -> list[int]:
        """The prompt context of one caption, by the template."""
        text = self.tokenizer.encode(prompt, add_special_tokens=False).ids
        return [self.bos_id, *text, self.eot_id, self.boi_id]

    def check(self, prompt) -> None:
        """ConfigError unless ``prompt`` is a non-empty caption whose context fits the condition slots."""
        if not isinstance(prompt, str) or not prompt.strip():
            raise ConfigError(f"text prompt {prompt!r} must be a non-empty string")
        length = len(self.ids(prompt))
        if length > self.cls_token_num:
            shown = prompt if len(prompt) <= 60 else prompt[:57] + "..."
            raise ConfigError(
                f"text prompt {shown!r} is {length} tokens with the template, longer than the model's "
                f"{self.cls_token_num} condition slots (model.cls_token_num)"
            )

    def check_all(self, prompts: list) -> None:
        for prompt in prompts:
            self.check(prompt)

    def encode(self, prompts: list) -> Condition:
        """Captions -> Condition with values (B, T) long (left-padded with the pad id) and mask (B, T)."""
        for prompt in prompts:
            self.check(prompt)
        batch, slots = len(prompts), self.cls_token_num
        values = torch.full((batch, slots), self.pad_id, dtype=torch.long)
        mask = torch.zeros(batch, slots, dtype=torch.bool)
        for row, prompt in enumerate(prompts):
            ids = self.ids(prompt)
            values[row, slots - len(ids) :] = torch.tensor(ids)
            mask[row, slots - len(ids) :] = True
        return Condition(values.to(self.device), mask.to(self.device))


def load_tokenizer(path: str | os.PathLike):
    """A ``tokenizers`` Tokenizer from a ``tokenizer.json``; ConfigError when it is not one."""
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(os.fspath(path))
    except Exception as exc:  # noqa: BLE001 - any failure means "not a tokenizer file"
        raise ConfigError(f"{os.fspath(path)!r} is not a tokenizers tokenizer.json ({type(exc).__name__})") from exc
