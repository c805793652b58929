"""Caption prompts for Janus targets: DeepSeek's chat template, the folder's tokenizer, Janus's slot layout.

As DeepSeek's ``generation_inference.py`` (Janus-Pro README): the conversation ``[{"role": "<|User|>",
"content": caption}, {"role": "<|Assistant|>", "content": ""}]`` through the ``deepseek`` SFT template with an
empty system prompt, plus the image start tag: ``"<|User|>: {caption}\\n\\n<|Assistant|>:<begin_of_image>"``,
encoded by the tokenizer with BOS in front (``tokenizer.encode`` there; here BOS is put in front of the
encoding without special tokens, the same ids). A prompt of L ids fills the T condition slots as
``[BOS, (T - L masked pad slots), ids[1:]]`` (:mod:`lantern.models.janus.model` says why).
"""

from __future__ import annotations

import os

import torch

from lantern.errors import ConfigError
from lantern.models.condition import Condition
from lantern.models.janus.hf import BOI, BOS, PAD

TEMPLATES = {"janus_pro": "<|User|>: {caption}\n\n<|Assistant|>:" + BOI}
EOS, UNK = "<｜end▁of▁sentence｜>", "<unk>"
USER, ASSISTANT = "<|User|>", "<|Assistant|>"


class JanusConditioner:
    """Captions -> prompt ids (B, T) in Janus's slot layout and their mask (B, T)."""

    kind = "text"

    def __init__(
        self,
        tokenizer,
        cls_token_num: int,
        bos_id: int,
        pad_id: int,
        boi_id: int,
        template: str = "janus_pro",
        device: str | torch.device = "cpu",
    ):
        if template not in TEMPLATES:
            raise ConfigError(f"prompt template={template!r}: expected one of {', '.join(TEMPLATES)}")
        self.tokenizer, self.cls_token_num, self.template = tokenizer, int(cls_token_num), template
        self.bos_id, self.pad_id, self.boi_id = bos_id, pad_id, boi_id
        self.device = torch.device(device)

    @classmethod
    def for_model(cls, tokenizer, config, template: str = "janus_pro", device="cpu") -> JanusConditioner:
        return cls(tokenizer, config.cls_token_num, config.bos_id, config.pad_id, config.boi_id, template, device)

    def check_model(self, config) -> None:
        """ConfigError unless ``config`` (a JanusConfig) has these slots and special ids."""
        mine = (self.cls_token_num, self.bos_id, self.pad_id, self.boi_id)
        theirs = tuple(getattr(config, name, None) for name in ("cls_token_num", "bos_id", "pad_id", "boi_id"))
        if mine != theirs:
            raise ConfigError(f"the prompt conditioner (slots, BOS, pad, BOI = {mine}) does not fit the model {theirs}")

    def ids(self, prompt: str) -> list[int]:
        """The prompt context of one caption: BOS, then the template's tokens (the last is BOI)."""
        text = TEMPLATES[self.template].format(caption=prompt.strip())
        ids = [self.bos_id, *self.tokenizer.encode(text, add_special_tokens=False).ids]
        if ids[-1] != self.boi_id:
            raise ConfigError(f"the tokenizer does not end the prompt with {BOI} (id {self.boi_id}): {ids[-3:]}")
        return ids

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
        """Captions -> Condition: values (B, T) long ``[BOS, pad ..., ids[1:]]`` and mask (B, T)."""
        for prompt in prompts:
            self.check(prompt)
        batch, slots = len(prompts), self.cls_token_num
        values = torch.full((batch, slots), self.pad_id, dtype=torch.long)
        mask = torch.zeros(batch, slots, dtype=torch.bool)
        for row, prompt in enumerate(prompts):
            ids = self.ids(prompt)
            values[row, 0], mask[row, 0] = ids[0], True
            if len(ids) > 1:
                values[row, slots - len(ids) + 1 :] = torch.tensor(ids[1:])
                mask[row, slots - len(ids) + 1 :] = True
        return Condition(values.to(self.device), mask.to(self.device))


def load_tokenizer(path: str | os.PathLike):
    """A ``tokenizers`` Tokenizer from a ``tokenizer.json``; ConfigError when it is not one."""
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(os.fspath(path))
    except Exception as exc:  # noqa: BLE001 - any failure means "not a tokenizer file"
        raise ConfigError(f"{os.fspath(path)!r} is not a tokenizers tokenizer.json ({type(exc).__name__})") from exc


# Words of the random preset's tokenizer (anything else is <unk>).
TINY_WORDS = tuple(
    "a an the of on in with at and photo painting picture red blue green yellow black white small large old "
    "cat dog fox bird car house tree boat city street beach mountain river sky sunset snow night bowl cup "
    "flower field lighthouse bicycle wall cliff table : , .".split()
)
SPECIAL = (BOS, EOS, PAD, UNK, BOI, "<end_of_image>", "<image_placeholder>", USER, ASSISTANT)


def tiny_vocabulary(words: tuple[str, ...] = TINY_WORDS) -> dict[str, int]:
    """A small vocabulary: Janus's special tokens by name (BOS 0, pad 2, BOI 4), then ``words``."""
    return {name: index for index, name in enumerate(dict.fromkeys([*SPECIAL, *(w for w in words if w)]))}


def word_tokenizer(vocab: dict[str, int]):
    """A ``tokenizers`` word-level tokenizer over ``vocab`` with the special tokens as added tokens (matched
    before splitting, as in the release's BPE ``tokenizer.json``): the offline stand-in for it."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel(dict(vocab), unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens([AddedToken(name, special=True) for name in SPECIAL if name in vocab])
    return tokenizer
