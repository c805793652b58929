"""Caption prompts as token ids in a family's condition slots: what the Chameleon and Janus conditioners share.

A family's conditioner says its templates, which special ids of its config it holds (``special``), how one
caption becomes its prompt context (``ids``) and where those ids sit among the T condition slots
(``place``); checking captions against the slots and building the batch's :class:`Condition` are written
here once.
"""

from __future__ import annotations

import os

import torch

from lantern.errors import ConfigError
from lantern.models.condition import Condition

# How a special id is named in messages.
SPECIAL_NAMES = {"bos_id": "BOS", "pad_id": "pad", "eot_id": "EOT", "boi_id": "BOI"}


class PromptConditioner:
    """Captions -> prompt ids (B, T) in a family's slot layout and their mask (B, T), T the model's condition
    slots. A family sets ``templates`` (the first is the default) and ``special`` (its config's special-id
    fields, held under their own names, given after ``cls_token_num`` in that order) and writes ``ids`` and
    ``place``."""

    kind = "text"
    templates: tuple[str, ...] = ()
    special: tuple[str, ...] = ()

    def __init__(self, tokenizer, cls_token_num: int, *ids: int, template: str | None = None, device="cpu"):
        """``ids``: the values of ``special``, in its order; ``template`` None: the family's first."""
        template = template or self.templates[0]
        if template not in self.templates:
            raise ConfigError(f"prompt template={template!r}: expected one of {', '.join(self.templates)}")
        if len(ids) != len(self.special):
            raise ConfigError(
                f"{type(self).__name__} takes {len(self.special)} special ids ({', '.join(self.special)})"
            )
        self.tokenizer, self.cls_token_num, self.template = tokenizer, int(cls_token_num), template
        self.device = torch.device(device)
        for name, value in zip(self.special, ids, strict=True):
            setattr(self, name, value)

    @classmethod
    def for_model(cls, tokenizer, config, template: str | None = None, device="cpu"):
        """The conditioner of a target's ``config`` (its slots and special ids)."""
        ids = (getattr(config, name) for name in cls.special)
        return cls(tokenizer, config.cls_token_num, *ids, template=template, device=device)

    def check_model(self, config) -> None:
        """ConfigError unless ``config`` has these slots and special ids."""
        names = ("cls_token_num", *self.special)
        mine = tuple(getattr(self, name) for name in names)
        theirs = tuple(getattr(config, name, None) for name in names)
        if mine != theirs:
            shown = ", ".join(["slots", *(SPECIAL_NAMES.get(name, name) for name in self.special)])
            raise ConfigError(f"the prompt conditioner ({shown} = {mine}) does not fit the model {theirs}")

    def ids(self, prompt: str) -> list[int]:
        """The prompt context of one caption, by the template."""
        raise NotImplementedError

    def place(self, values: torch.Tensor, mask: torch.Tensor, ids: list[int]) -> None:
        """Write one prompt context ``ids`` into its row's slots ``values`` (T,) and ``mask`` (T,) (pads, False)."""
        raise NotImplementedError

    def random_condition(self, index: int, vocab: int) -> Condition:
        """A stand-in prompt (1, T) for timing: ``[BOS, random ids..., BOI]`` of a length that varies with
        ``index`` (2 .. T), laid out as this family's prompts, the ids drawn from ``vocab`` seeded by ``index``."""
        length = 2 + (7 * index) % (self.cls_token_num - 1)
        generator = torch.Generator().manual_seed(index)
        text = torch.randint(0, vocab, (length - 2,), generator=generator).tolist()
        values = torch.full((1, self.cls_token_num), self.pad_id, dtype=torch.long)
        mask = torch.zeros(1, self.cls_token_num, dtype=torch.bool)
        self.place(values[0], mask[0], [self.bos_id, *text, self.boi_id])
        return Condition(values.to(self.device), mask.to(self.device))

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
        """Captions -> Condition: values (B, T) long (the pad id where no prompt id sits) and mask (B, T)."""
        self.check_all(prompts)
        values = torch.full((len(prompts), self.cls_token_num), self.pad_id, dtype=torch.long)
        mask = torch.zeros(len(prompts), self.cls_token_num, dtype=torch.bool)
        for row, prompt in enumerate(prompts):
            self.place(values[row], mask[row], self.ids(prompt))
        return Condition(values.to(self.device), mask.to(self.device))


def load_tokenizer(path: str | os.PathLike):
    """A ``tokenizers`` Tokenizer from a ``tokenizer.json``; ConfigError when it is not one."""
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(os.fspath(path))
    except Exception as exc:  # noqa: BLE001 - any failure means "not a tokenizer file"
        raise ConfigError(f"{os.fspath(path)!r} is not a tokenizers tokenizer.json ({type(exc).__name__})") from exc
