"""Caption prompts for Janus targets: DeepSeek's chat template, the folder's tokenizer, Janus's slot layout.

As DeepSeek's ``generation_inference.py`` (Janus-Pro README): the conversation ``[{"role": "<|User|>",
"content": caption}, {"role": "<|Assistant|>", "content": ""}]`` through the ``deepseek`` SFT template with an
empty system prompt, plus the image start tag: ``"<|User|>: {caption}\\n\\n<|Assistant|>:<begin_of_image>"``,
encoded by the tokenizer with BOS in front (``tokenizer.encode`` there; here BOS is put in front of the
encoding without special tokens, the same ids). A prompt of L ids fills the T condition slots as
``[BOS, (T - L masked pad slots), ids[1:]]`` (:mod:`lantern.models.janus.model` says why).
"""

from __future__ import annotations

import torch

from lantern.errors import ConfigError
from lantern.models.janus.hf import BOI, BOS, PAD
from lantern.models.prompt_ids import PromptConditioner

TEMPLATES = {"janus_pro": "<|User|>: {caption}\n\n<|Assistant|>:" + BOI}
EOS, UNK = "<｜end▁of▁sentence｜>", "<unk>"
USER, ASSISTANT = "<|User|>", "<|Assistant|>"


class JanusConditioner(PromptConditioner):
    """Captions -> prompt ids (B, T) in Janus's slot layout and their mask (B, T)."""

    templates = tuple(TEMPLATES)
    special = ("bos_id", "pad_id", "boi_id")

    def ids(self, prompt: str) -> list[int]:
        """The prompt context of one caption: BOS, then the template's tokens (the last is BOI)."""
        text = TEMPLATES[self.template].format(caption=prompt.strip())
        ids = [self.bos_id, *self.tokenizer.encode(text, add_special_tokens=False).ids]
        if ids[-1] != self.boi_id:
            raise ConfigError(f"the tokenizer does not end the prompt with {BOI} (id {self.boi_id}): {ids[-3:]}")
        return ids

    def place(self, values: torch.Tensor, mask: torch.Tensor, ids: list[int]) -> None:
        """``[BOS, pad ..., ids[1:]]``: BOS in slot 0, the rest right-aligned (the module docstring)."""
        values[0], mask[0] = ids[0], True
        if len(ids) > 1:
            values[len(values) - len(ids) + 1 :] = torch.tensor(ids[1:])
            mask[len(values) - len(ids) + 1 :] = True


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
