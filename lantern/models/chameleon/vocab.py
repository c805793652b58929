"""Chameleon's vocabulary: which ids are image codes, the special tokens, and the prompt tokenizer.

Image code ``c`` is the token named ``IMGIMG`` + the decimal digits of ``c`` written as letters (0 -> A ... 9 -> J)
+ ``Z`` (transformers' ``ChameleonImageVocabularyMapping``: ``bpe2img``/``img2bpe``). In the 7B releases those
ids are 4 .. 8195 (code c = id c + 4, SPEC §9). The special tokens are found by name: ``<racm3:break>`` starts
an image and ``<eoss>`` ends it (transformers' ``ChameleonProcessor``), ``<reserved08706>`` is Meta's
end-of-turn (their ``VocabInfo.eot_id``, id 8710, which LANTERN's Anole prompt puts before the image start).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from lantern.errors import CheckpointError

IMAGE_PREFIX, IMAGE_SUFFIX = "IMGIMG", "Z"
BOI, EOI, EOT = "<racm3:break>", "<eoss>", "<reserved08706>"
BOS, PAD, EOS, UNK = "<s>", "<pad>", "</s>", "<unk>"


def image_token_name(code: int) -> str:
    """The vocabulary name of image code ``code`` (``IMGIMGBAZ`` is code 10)."""
    return IMAGE_PREFIX + "".join(chr(ord("A") + int(digit)) for digit in str(code)) + IMAGE_SUFFIX


def _code_of(name: str) -> int | None:
    body = name[len(IMAGE_PREFIX) : -len(IMAGE_SUFFIX)]
    if not (name.startswith(IMAGE_PREFIX) and name.endswith(IMAGE_SUFFIX) and body):
        return None
    if not all("A" <= letter <= "J" for letter in body):
        return None
    return int("".join(str(ord(letter) - ord("A")) for letter in body))


@dataclass(frozen=True)
class Layout:
    """The image codes' ids (``code_offset .. code_offset + num_codes - 1``) and the special ids."""

    num_codes: int
    code_offset: int
    bos_id: int
    pad_id: int
    eot_id: int
    boi_id: int
    eoi_id: int


def read_layout(vocab: Mapping[str, int], source: str, bos_id: int | None = None, pad_id: int | None = None) -> Layout:
    """The :class:`Layout` of a vocabulary map (name -> id); one CheckpointError naming what is missing.

    Only contiguous code ids (code c = id offset + c, as every release) are supported: the head is then a
    view of ``lm_head``'s rows, not a gather per step.
    """
    codes = {}
    for name, index in vocab.items():
        code = _code_of(name)
        if code is not None:
            codes[code] = int(index)
    if not codes:
        raise CheckpointError(f"{source}: the vocabulary has no image tokens ({IMAGE_PREFIX}...{IMAGE_SUFFIX})")
    count = len(codes)
    offset = codes.get(0, -1)
    if sorted(codes) != list(range(count)) or any(codes[c] != offset + c for c in range(count)):
        raise CheckpointError(
            f"{source}: the {count} image tokens do not hold contiguous ids in code order "
            f"(code 0 is id {offset}); only that layout is supported"
        )

    def special(name: str, given: int | None) -> int:
        if given is not None:
            return int(given)
        if name not in vocab:
            raise CheckpointError(f"{source}: the vocabulary has no {name!r} token")
        return int(vocab[name])

    return Layout(
        num_codes=count,
        code_offset=offset,
        bos_id=special(BOS, bos_id),
        pad_id=special(PAD, pad_id),
        eot_id=special(EOT, None),
        boi_id=special(BOI, None),
        eoi_id=special(EOI, None),
    )


def tiny_vocabulary(num_codes: int, words: tuple[str, ...] = ()) -> dict[str, int]:
    """A small vocabulary in the 7B releases' order: ``<s> <pad> </s> <unk>``, the image codes (ids 4 ..),
    ``<eoss> <racm3:break> <reserved08706> <image>``, then ``words`` (for tests and the random preset)."""
    names = [BOS, PAD, EOS, UNK] + [image_token_name(c) for c in range(num_codes)]
    names += [EOI, BOI, EOT, "<image>"] + [word for word in words if word]
    return {name: index for index, name in enumerate(dict.fromkeys(names))}


# Words of the random preset's tokenizer (its prompts tokenise to these; anything else is <unk>).
TINY_WORDS = tuple(
    "a an the of on in with at and photo painting picture red blue green yellow black white small large old "
    "cat dog fox bird car house tree boat city street beach mountain river sky sunset snow night bowl cup "
    "flower field lighthouse bicycle wall cliff , .".split()
)


def word_tokenizer(vocab: Mapping[str, int]):
    """A ``tokenizers`` word-level tokenizer over ``vocab`` (whitespace and punctuation split, ``<unk>``
    for unknown words): the offline stand-in for the releases' BPE ``tokenizer.json``."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel(dict(vocab), unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return tokenizer
