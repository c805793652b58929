"""Training: a generic resumable loop and the objectives of the embedded world's models."""

from lantern.training.loop import EpochBatches, Trainer, warmup_cosine

__all__ = ["EpochBatches", "Trainer", "warmup_cosine"]
