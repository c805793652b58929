"""Teacher-forced training of a text-conditional GPT on pre-tokenised images.

Images are tokenised once by the world's VQ tokenizer; captions come from a small fixed set whose
encoder states are computed once, so a step costs one teacher-forced GPT pass. A share of the
samples get the null caption (the model's ``uncond_embedding``), which is what CFG needs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lantern.models.llamagen.gpt import Transformer


def draw_conditions(
    model: Transformer,
    caption_ids: torch.Tensor,
    states: torch.Tensor,
    masks: torch.Tensor,
    indices: torch.Tensor,
    cond_dropout: float,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Condition values (B, ...), masks (B, T) and dropout flags (B,) bool (on the CPU) for samples ``indices`` (B,).

    Each sample takes one of its K conditions ``caption_ids`` (M, K) at random, then a share
    ``cond_dropout`` of the samples take the model's null condition (what CFG needs) under its mask
    (``null_condition_mask``: LlamaGen's is the caption's). Draws use the global torch generator
    (checkpointed by the trainer), in this order: choice, then dropout.
    """
    batch = indices.shape[0]
    choice = torch.randint(0, caption_ids.shape[1], (batch,))
    caption = caption_ids[indices, choice]  # (B,)
    values, mask = states[caption].to(device), masks[caption].to(device)  # (B, ...), (B, T)
    drop = torch.rand(batch) < cond_dropout
    null = model.null_condition(batch).to(device=values.device, dtype=values.dtype)
    dropped = drop.to(device)
    values = torch.where(dropped.view(-1, *([1] * (values.dim() - 1))), null, values)
    return values, torch.where(dropped[:, None], model.null_condition_mask(mask), mask), drop


class GPTObjective:
    """``step_fn`` for :class:`lantern.training.loop.Trainer`: next-token cross-entropy.

    ``codes`` (N, G*G) are the image tokens, ``caption_ids`` (N, K) the indices of the K captions
    each image may take (one is drawn per step), ``states`` (C, T, D) and ``masks`` (C, T) the
    left-padded encoder states of the C captions. Random draws use the global torch generator,
    which the trainer checkpoints.
    """

    def __init__(
        self,
        model: Transformer,
        codes: torch.Tensor,
        caption_ids: torch.Tensor,
        states: torch.Tensor,
        masks: torch.Tensor,
        cond_dropout: float = 0.1,
    ):
        self.model = model
        self.codes = codes
        self.caption_ids = caption_ids
        self.states = states
        self.masks = masks
        self.cond_dropout = cond_dropout

    def __call__(self, indices: torch.Tensor) -> tuple[torch.Tensor, dict]:
        model = self.model
        tokens = self.codes[indices]  # (B, N)
        states, mask, _ = draw_conditions(model, self.caption_ids, self.states, self.masks, indices, self.cond_dropout)
        hidden = model.forward_teacher(model.embed_condition(states), tokens, mask)  # (B, N, D)
        logits = model.head(hidden)  # (B, N, V)
        loss = F.cross_entropy(logits.flatten(0, 1), tokens.flatten())
        accuracy = (logits.argmax(-1) == tokens).float().mean()
        return loss, {"loss": loss.detach(), "token_acc": accuracy}
