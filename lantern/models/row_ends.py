"""A target whose image stream ends each row with a token the decoders must not see (Lumina-mGPT's and Emu3's
EOL after every row of codes, the last row too).

The decoders address image code ``n`` at logical position/slot ``T + n``; this target hides the row ends.
Its cache (:class:`RowEndCache`) holds two physical slots per logical slot: ``2s`` the token of logical slot
``s`` and ``2s + 1`` its EOL companion, which is live only when that token ends a row (code index
``n = position - T`` with ``(n + 1) % grid == 0``); the flag is kept per logical slot and written from the
query's position. A forward over S logical queries runs 2S physical ones, ``[code_0, eol_0, code_1, ...]``:

* RoPE positions: code ``n`` at ``T + n + n // grid`` (the EOLs before it), its companion one further;
  condition slots as they are (the RoPE is 1D, so a left padding is a constant shift).
* Mask (B, 1, 2S, 2L) from the logical M (B, 1, S, L): a code query sees code columns per M and companion
  columns where M and live, never its own; a companion query sees what its code sees plus its own code and
  live companions per M (its own included). Dead companions are hidden from every query; their outputs are
  discarded.
* The output of a row-end code is its EOL's (which predicts the next row's first code), so "output at n
  predicts n + 1" holds; logits are over the codes only, which is the references' masking of every other id,
  so the EOL is forced, never sampled, drafted or counted as accepted.

Teacher forcing (drafter training) runs the same layout without a cache, so it is the full interleaved
sequence with the same output rule. What a family adds: its body and head (:class:`PromptedTarget`), its
config's ``eol_id``, ``grid_size`` and ``cls_token_num``, its null condition and its ``image_stream``.
"""

from __future__ import annotations

import torch

from lantern.models.kv_cache import KVCache, ValidityCache, write_flags
from lantern.models.llama_parts import PromptedTarget, rope_angles


class RowEndCache(ValidityCache):
    """A :class:`ValidityCache` of 2 physical slots per logical slot (module docstring): keys and values
    (B, H, 2 * max_len, hd), ``valid`` (B, max_len) per logical slot, ``live`` (B, max_len) bool: the companion
    of logical slot ``s`` (physical ``2s + 1``) holds a real EOL. Callers address logical slots only."""

    def __init__(self, keys, values, valid: torch.Tensor, live: torch.Tensor):
        super().__init__(keys, values, valid)
        self.live = live

    @classmethod
    def allocate(cls, n_layer, batch, n_head, max_len, head_dim, dtype, device) -> RowEndCache:
        base = KVCache.allocate(n_layer, batch, n_head, 2 * max_len, head_dim, dtype, device)
        valid = torch.ones(batch, max_len, dtype=torch.bool, device=device)
        return cls(base.keys, base.values, valid, torch.zeros(batch, max_len, dtype=torch.bool, device=device))

    @property
    def max_len(self) -> int:
        return self.live.shape[1]

    def tensors(self) -> list[torch.Tensor]:
        return super().tensors() + [self.live]

    def write_live(self, slots: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        """Record whether the tokens written at logical ``slots`` (B, S) end a row (``ends`` (B, S)); return
        ``live`` (B, max_len)."""
        return write_flags(self.live, slots, ends)

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Move logical slots ``src`` to ``dst`` (B, n): both physical slots of each, and its live flag."""
        super().move(physical_slots(src), physical_slots(dst))
        if torch.compiler.is_compiling():  # in place (see KVCache.move)
            rows = torch.arange(src.shape[0], device=src.device)[:, None]  # (B, 1)
            self.live.index_put_((rows, dst), self.live[rows, src])
        else:
            self.live.scatter_(1, dst, self.live.gather(1, src))


def physical_slots(slots: torch.Tensor) -> torch.Tensor:
    """Logical slots (B, n) -> physical (B, 2n): ``[2s_0, 2s_0 + 1, 2s_1, ...]`` (each token, then its companion)."""
    return torch.stack([2 * slots, 2 * slots + 1], dim=-1).flatten(-2)


def expand_mask(mask: torch.Tensor, live: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Logical mask (B, 1, S, L), live companions (B, L) and the queries' slots (B, S) -> physical (B, 1, 2S, 2L)."""
    batch, _, seq, length = mask.shape
    own = (torch.arange(length, device=mask.device)[None, None, :] == slots[:, :, None])[:, None]  # (B, 1, S, L)
    live = live[:, None, None, :]  # (B, 1, 1, L)
    code = torch.stack([mask, mask & live & ~own], dim=-1)  # code query -> (code, companion) columns
    companion = torch.stack([mask | own, mask & live], dim=-1)  # companion query -> (code, companion) columns
    return torch.stack([code, companion], dim=3).reshape(mask.shape[0], 1, 2 * seq, 2 * length)


class RowEndTarget(PromptedTarget):
    """A :class:`PromptedTarget` over an image stream whose row ends are hidden (module docstring)."""

    cache_class = RowEndCache

    def row_end(self, positions: torch.Tensor) -> torch.Tensor:
        """Whether the token at each logical position ends an image row (its EOL follows): bool, same shape."""
        code = positions - self.config.cls_token_num
        return (code >= 0) & ((code + 1) % self.config.grid_size == 0)

    def physical_positions(self, positions: torch.Tensor) -> torch.Tensor:
        """Logical positions -> the positions of the interleaved stream (the EOLs before each code counted)."""
        code = (positions - self.config.cls_token_num).clamp_min(0)
        return positions + torch.div(code, self.config.grid_size, rounding_mode="floor")

    def forward_embeddings(
        self, x, positions, slots, mask, cache, taps: tuple[int, ...] = ()
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """As :meth:`PromptedTarget.forward_embeddings` over logical ``positions``, ``slots`` and ``mask``;
        each query runs with its EOL companion and a row-end code returns its companion's output."""
        batch, seq, dim = x.shape
        positions = positions.expand(batch, seq)  # (B, S)
        mask = self.visible(slots, mask, cache).expand(batch, -1, -1, -1)  # (B, 1, S, L) logical
        ends = self.row_end(positions)  # (B, S)
        if isinstance(cache, RowEndCache):
            live = cache.write_live(slots, ends)[:, : mask.shape[-1]]  # (B, L)
        else:  # teacher forcing: the columns are this call's queries
            live = torch.zeros(batch, mask.shape[-1], dtype=torch.bool, device=x.device).scatter(1, slots, ends)
        eol = self.model.embed_tokens.weight[self.config.eol_id].to(x.dtype)  # (D,)
        stream = torch.stack([x, eol.expand(batch, seq, dim)], dim=2).reshape(batch, 2 * seq, dim)
        where = self.physical_positions(positions)
        where = torch.stack([where, where + 1], dim=-1).reshape(batch, 2 * seq)  # (B, 2S)
        cos, sin = rope_angles(where, self.inv_freq, x.dtype)  # (B, 2S, hd)
        out = self.run_layers(
            stream, cos[:, None], sin[:, None], expand_mask(mask, live, slots), physical_slots(slots), cache, taps
        )

        def pick(states: torch.Tensor) -> torch.Tensor:  # (B, 2S, F) -> (B, S, F)
            pairs = states.view(batch, seq, 2, states.shape[-1])
            return torch.where(ends[..., None], pairs[:, :, 1], pairs[:, :, 0])

        return (pick(out[0]), pick(out[1])) if taps else pick(out)
