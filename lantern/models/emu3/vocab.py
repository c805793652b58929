"""Emu3's vocabulary: the visual-token id map, the special tokens of its image syntax, the random preset's words.

Image code ``c`` (row ``c`` of the VQ's codebook) is the token named ``<|visual token{c:06d}|>`` (transformers'
``Emu3ImageVocabularyMapping``: ``img2bpe``/``bpe2img``; BAAI's ``visual_template``). In Emu3-Gen those ids are
151854 .. 184621 (code c = id c + 151854). The special tokens are found by name, as BAAI's tokenizer names them:
``<|extra_203|>`` BOS, ``<|endoftext|>`` pad, ``<|image start|>`` BOI, ``<|image token|>`` (ends the image
header ``{H}*{W}``), ``<|extra_200|>`` EOL (after each row), ``<|extra_201|>`` EOF, ``<|image end|>`` EOI,
``<|extra_204|>`` EOS.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from lantern.errors import CheckpointError

VISUAL = re.compile(r"<\|visual token(\d{6})\|>")
SPECIAL = {
    "bos_id": "<|extra_203|>",
    "pad_id": "<|endoftext|>",
    "boi_id": "<|image start|>",
    "img_id": "<|image token|>",
    "eol_id": "<|extra_200|>",
    "eof_id": "<|extra_201|>",
    "eoi_id": "<|image end|>",
    "eos_id": "<|extra_204|>",
}
UNK = "<unk>"  # the random preset's word tokenizer's unknown word (Emu3's BPE has none)


def visual_token_name(code: int) -> str:
    """The vocabulary name of image code ``code`` (``<|visual token000010|>`` is code 10)."""
    return f"<|visual token{code:06d}|>"


def read_layout(vocab: Mapping[str, int], source: str) -> dict[str, int]:
    """The image codes' ids (``num_codes``, ``code_offset``: code c is id ``code_offset + c``) and the special ids
    (:data:`SPECIAL`'s keys) of a vocabulary map (name -> id), as :class:`~lantern.models.emu3.model.Emu3Config`
    fields; one CheckpointError naming what is missing.

    Only contiguous code ids in code order are supported (every release): the head is then a view of
    ``lm_head``'s rows and the id map an offset, not a gather per step.
    """
    codes = {}
    for name, index in vocab.items():
        match = VISUAL.fullmatch(name)
        if match:
            codes[int(match.group(1))] = int(index)
    if not codes:
        raise CheckpointError(f"{source}: the vocabulary has no visual tokens (<|visual token000000|> ...)")
    count, offset = len(codes), codes.get(0, -1)
    if sorted(codes) != list(range(count)) or any(codes[c] != offset + c for c in range(count)):
        raise CheckpointError(
            f"{source}: the {count} visual tokens do not hold contiguous ids in code order "
            f"(code 0 is id {offset}); only that layout is supported"
        )
    missing = [name for name in SPECIAL.values() if name not in vocab]
    if missing:
        raise CheckpointError(f"{source}: the vocabulary has no {missing[0]!r} token")
    return {"num_codes": count, "code_offset": offset, **{key: int(vocab[name]) for key, name in SPECIAL.items()}}


def tiny_vocabulary(num_codes: int, words: tuple[str, ...] = ()) -> dict[str, int]:
    """A small vocabulary in the release's order: pad, ``<unk>``, the specials, ``words``, digits and ``*`` (the
    image header ``{H}*{W}``), then the visual tokens (the release's are last too)."""
    names = ["<|endoftext|>", UNK, *(name for key, name in SPECIAL.items() if key != "pad_id"), "<image>"]
    names += [word for word in words if word] + [str(digit) for digit in range(10)] + ["*"]
    names += [visual_token_name(code) for code in range(num_codes)]
    return {name: index for index, name in enumerate(dict.fromkeys(names))}


def word_tokenizer(vocab: Mapping[str, int]):
    """A ``tokenizers`` word-level tokenizer over ``vocab`` (whitespace and punctuation split, digits one by
    one, ``<unk>`` for unknown words): the offline stand-in for the release's ``tokenizer.json``."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel(dict(vocab), unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)]
    )
    return tokenizer
