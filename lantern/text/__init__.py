"""Caption encoders producing LlamaGen-style left-padded per-token text states.

``transformers`` is imported only when an encoder is loaded.
"""

from lantern.text.base import TextEmbedding, TextEncoder, left_pad
from lantern.text.minilm import MiniLMTextEncoder, load_minilm_encoder
from lantern.text.t5 import T5TextEncoder, load_t5_encoder

__all__ = [
    "MiniLMTextEncoder",
    "T5TextEncoder",
    "TextEmbedding",
    "TextEncoder",
    "left_pad",
    "load_minilm_encoder",
    "load_t5_encoder",
]
