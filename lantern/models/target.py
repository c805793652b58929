"""The target-model protocol: what every decoder, rule, metric and table may ask of a model family.

A family (``llamagen/`` today) is a folder of its own whose model satisfies :class:`Target`; decoders
reach the model only through these methods and the shape facts of :class:`TargetShape`, never through
a family's modules. Sequence layout shared by every family: condition slots ``0 .. T-1``; image token
``n`` is fed at position ``T + n`` and its output predicts token ``n + 1``; the output at ``T - 1``
predicts token 0. Logits are fp32; caches are static and addressed by slots; masks are boolean over
cache slots, so tree and window verification need no other entry point.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from lantern import checks
from lantern.models.kv_cache import NoCache


class TargetShape(Protocol):
    """The shape facts a decoder reads from ``model.config``."""

    cls_token_num: int  # T: condition slots before the image
    num_image_tokens: int  # N
    grid_size: int  # image side in tokens (N = grid_size ** 2)
    vocab_size: int  # V: image codes
    max_seq_len: int  # T + N: rows of the position table


class GridShape:
    """The shape facts every family's config derives the same way from its ``dim``, ``n_head``, ``grid_size``
    and ``cls_token_num`` (mixed into the config dataclasses)."""

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head

    @property
    def num_image_tokens(self) -> int:
        return self.grid_size * self.grid_size

    @property
    def max_seq_len(self) -> int:
        """Condition slots plus one per image token (the rows of a position table)."""
        return self.cls_token_num + self.num_image_tokens


@runtime_checkable
class Target(Protocol):
    """A target model: no decoding state of its own; callers pass caches, positions, slots and masks."""

    config: TargetShape

    def embed_condition(self, condition: torch.Tensor) -> torch.Tensor:
        """The batch's condition (class ids (B,) or caption states (B, T, C)) -> embeddings (B, T, D)."""
        ...

    def null_condition(self, batch: int) -> torch.Tensor:
        """The unconditional input of classifier-free guidance, in the form :meth:`embed_condition` takes."""
        ...

    def null_condition_mask(self, mask: torch.Tensor) -> torch.Tensor:
        """Which slots (B, T) of :meth:`null_condition` hold real inputs in the unconditional rows whose
        conditional rows have the mask ``mask`` (B, T). Decoders mask each CFG half with its own mask."""
        ...

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """Image token ids (B, S) -> input embeddings (B, S, D)."""
        ...

    def input_embeddings(self) -> torch.Tensor:
        """The (V, D) input embedding table (its dtype and device are the model's)."""
        ...

    def forward_embeddings(
        self, x, positions, slots, mask, cache, taps: tuple[int, ...] = ()
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Embeddings (B, S, D) at ``positions`` written to cache ``slots`` under ``mask`` (B, 1, S, L) ->
        final-norm hidden states (B, S, D); with ``taps`` (layer indices), the pair ``(hidden, features)``
        whose features (B, S, len(taps) * D) concatenate the residual streams entering those layers."""
        ...

    def prefill(self, cond_emb: torch.Tensor, mask: torch.Tensor, cache) -> tuple[torch.Tensor, torch.Tensor]:
        """The condition into cache slots ``0 .. T-1``; fp32 logits (B, V) and hidden (B, D) predicting token 0."""
        ...

    def forward_tokens(
        self, tokens, positions, slots, mask, cache, taps: tuple[int, ...] = ()
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Image tokens (B, S) -> fp32 logits (B, S, V) from the final-norm state, and features: that state
        (B, S, D) without ``taps``, else the tapped layers' inputs (B, S, len(taps) * D)."""
        ...

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states (..., D) -> fp32 logits (..., V)."""
        ...

    def new_cache(self, batch: int, max_len: int | None = None):
        """A zeroed static cache for ``batch`` rows and ``max_len`` slots."""
        ...


def check_taps(taps, n_layer: int, name: str = "taps") -> tuple[int, ...]:
    """``taps`` as a tuple of ints, each a layer index in ``1 .. n_layer - 1``, none repeated; else a
    ConfigError naming the bad one (``name`` says where the taps come from). Tap ``i`` is the residual
    stream entering layer ``i``: 0 would be the token embeddings and ``n_layer`` the un-normed last state."""
    taps = tuple(taps)
    for tap in taps:
        note = f"{name}={checks.shown(list(taps))}: the input of one of the target's layers 1..{n_layer - 1}"
        checks.integer("tap", tap, 1, n_layer - 1, note=note)
    repeated = sorted({tap for tap in taps if taps.count(tap) > 1})
    if repeated:
        raise checks.refuse(name, list(taps), "distinct layer indices", f"tap {repeated[0]} is repeated")
    return tuple(int(tap) for tap in taps)


def prefix_causal_mask(cond_mask: torch.Tensor, length: int) -> torch.Tensor:
    """Causal mask (B, 1, L, L) over ``length`` slots whose first T columns follow ``cond_mask`` (B, T).

    As in the reference: padded condition columns are hidden from every query, and the diagonal is
    kept so a fully padded row still attends to itself.
    """
    batch, cond_len = cond_mask.shape
    device = cond_mask.device
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    columns = torch.ones(batch, length, dtype=torch.bool, device=device)
    columns[:, :cond_len] = cond_mask
    mask = causal[None] & columns[:, None, :]
    mask |= torch.eye(length, dtype=torch.bool, device=device)[None]
    return mask.unsqueeze(1)


class EmbeddingsTarget:
    """The protocol's methods that every family writes the same way over its own ``forward_embeddings``,
    ``embed_tokens`` and ``head``: prefill, feeding tokens, and the teacher-forced passes of training and checks.
    A family's target inherits them (before ``nn.Module``) and supplies those three and ``new_cache``."""

    def null_condition_mask(self, mask: torch.Tensor) -> torch.Tensor:
        """The null condition under its conditional row's mask (B, T), as LlamaGen's reference masks its null
        caption (the world's one class slot is always real); a family whose null context differs overrides it."""
        return mask

    def prefill(self, cond_emb: torch.Tensor, mask: torch.Tensor, cache) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the condition (B, T, D) into cache slots ``0..T-1`` under ``mask`` (B, 1, T, L).

        Returns the fp32 logits (B, V) and the hidden state (B, D) at the last condition position, which
        predict image token 0.
        """
        batch, seq = cond_emb.shape[:2]
        index = torch.arange(seq, device=cond_emb.device)
        hidden = self.forward_embeddings(cond_emb, index, index.expand(batch, seq), mask, cache)[:, -1]
        return self.head(hidden), hidden

    def forward_tokens(
        self, tokens, positions, slots, mask, cache, taps: tuple[int, ...] = ()
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed image tokens (B, S) at ``positions`` and ``slots``; return logits (B, S, V) and features.

        See the family's ``forward_embeddings`` for the arguments. Tree verification passes depth-based
        positions and a tree mask; plain decoding passes one token with a causal row. The logits always
        come from the final-norm state; the features are that state (B, S, D) without ``taps``, else the
        tapped layers' inputs (B, S, len(taps) * D), so a drafter's caller reads one tensor either way.
        """
        states = self.forward_embeddings(self.embed_tokens(tokens), positions, slots, mask, cache, taps)
        hidden, features = states if taps else (states, states)
        return self.head(hidden), features

    def teacher_hidden(
        self, cond_emb: torch.Tensor, tokens: torch.Tensor, cond_mask: torch.Tensor, taps: tuple[int, ...] = ()
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced pass without a cache over condition (B, T, D) then tokens (B, N).

        Returns the final-norm hidden states of every position, (B, T + N - 1, D); the last image
        token is not fed. Drafter training reads the condition positions too. With ``taps`` it returns
        ``(hidden, features)``, features (B, T + N - 1, len(taps) * D) as ``forward_embeddings`` taps them.
        """
        x = torch.cat([cond_emb, self.embed_tokens(tokens[:, :-1])], dim=1)  # (B, T + N - 1, D)
        seq = x.shape[1]
        positions = torch.arange(seq, device=x.device)
        mask = prefix_causal_mask(cond_mask, seq)
        return self.forward_embeddings(x, positions, positions.expand(x.shape[0], seq), mask, NoCache(), taps)

    def forward_teacher(self, cond_emb: torch.Tensor, tokens: torch.Tensor, cond_mask: torch.Tensor) -> torch.Tensor:
        """Teacher-forced hidden states (B, N, D) where row ``n`` predicts image token ``n``.

        The last condition position predicts token 0; see :meth:`teacher_hidden`.
        """
        return self.teacher_hidden(cond_emb, tokens, cond_mask)[:, cond_emb.shape[1] - 1 :]
