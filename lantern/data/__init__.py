"""Datasets of the embedded world (Fashion-MNIST with generated captions)."""

from lantern.data.fashion_mnist import (
    CLASS_NAMES,
    NUM_CLASSES,
    OFFICIAL_CLASS_NAMES,
    FashionMNISTImages,
    Prompt,
    all_captions,
    caption_for,
    default_data_root,
    load_split,
    prompt_set,
    read_idx,
)

__all__ = [
    "CLASS_NAMES",
    "NUM_CLASSES",
    "OFFICIAL_CLASS_NAMES",
    "FashionMNISTImages",
    "Prompt",
    "all_captions",
    "caption_for",
    "default_data_root",
    "load_split",
    "prompt_set",
    "read_idx",
]
