"""A static, preallocated key/value cache.

The cache is allocated once per generation with room for the whole sequence (plus any scratch
slots a speculative decoder asks for). Writing, accepting and rejecting tokens only index into it;
nothing is reallocated while decoding. Keys are stored after RoPE.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class SlotWrites(NamedTuple):
    """The slots (B, S) a forward writes, with (eagerly) every layer's flat write index computed once for all
    layers (:meth:`KVCache.writes`): ``flat`` (B * H * S,) the row of each (row, head, slot) entry in a layer's
    (B * H * max_len, hd) view. A copy of ``hd`` contiguous values per entry (``index_copy_``) costs about half
    of a ``scatter_`` of the same entries at the world's shapes."""

    slots: torch.Tensor
    flat: torch.Tensor


class KVCache:
    """Keys and values for every layer: one (B, H, max_len, head_dim) tensor per layer and kind.

    Each layer's keys and values are tensors of their own (not views of one stacked buffer): a compiled
    step mutates them in place at fixed addresses, whereas writes into views of one buffer become copies
    of the whole buffer under ``torch.compile`` (functionalised view mutation). ``k`` and ``v`` give the
    stacked (n_layer, B, H, max_len, head_dim) contents, a copy for inspection.
    """

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor]):
        keys, values = list(keys), list(values)
        shapes = {tuple(t.shape) for t in keys + values}
        if not keys or len(keys) != len(values) or len(shapes) != 1 or keys[0].dim() != 4:
            raise ValueError(f"keys and values must be equal lists of 4-d tensors of one shape, got {sorted(shapes)}")
        self.keys = keys
        self.values = values
        self.buffer: torch.Tensor | None = None  # see stacked()
        self.rows: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # see writes()

    def __copy__(self) -> KVCache:
        """A shallow copy without this cache's derived views (``buffer``, ``rows``): whoever gives the copy other
        tensors (the TV audit's replicas) must not write through views of these."""
        out = self.__class__.__new__(self.__class__)
        out.__dict__.update(self.__dict__)
        out.buffer, out.rows = None, None
        return out

    def stacked(self) -> KVCache:
        """This cache, its layers' keys and values moved (contents kept) into views of one buffer
        (2 * n_layer, B, H, max_len, hd), for eager steps: :meth:`move` is then one gather and one scatter for
        every layer instead of one each per layer and kind. In place, so whoever holds this cache sees the one
        the steps write. Not for compiled steps: under ``torch.compile`` a write into a view of one buffer
        becomes a copy of the whole buffer (see the class docstring)."""
        buffer = torch.stack(self.keys + self.values)
        count = len(self.keys)
        self.keys, self.values = list(buffer[:count].unbind(0)), list(buffer[count:].unbind(0))
        self.buffer, self.rows = buffer, None
        return self

    @classmethod
    def allocate(
        cls,
        n_layer: int,
        batch: int,
        n_head: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> KVCache:
        """Zero-filled cache for ``batch`` rows and ``max_len`` slots."""
        shape = (batch, n_head, max_len, head_dim)
        zeros = lambda: [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layer)]  # noqa: E731
        return cls(zeros(), zeros())

    @property
    def k(self) -> torch.Tensor:
        """All keys stacked (n_layer, B, H, max_len, hd): a copy."""
        return torch.stack(self.keys)

    @property
    def v(self) -> torch.Tensor:
        """All values stacked (n_layer, B, H, max_len, hd): a copy."""
        return torch.stack(self.values)

    def tensors(self) -> list[torch.Tensor]:
        """Every buffer (keys then values, by layer): what a compiled step may treat as static addresses."""
        return self.keys + self.values

    @property
    def batch(self) -> int:
        return self.keys[0].shape[0]

    @property
    def max_len(self) -> int:
        return self.keys[0].shape[2]

    def layer(self, index: int) -> LayerCache:
        """One layer's slots, handed to that layer's attention."""
        if self.rows is None:
            return LayerCache(self.keys[index], self.values[index])
        return LayerCache(self.keys[index], self.values[index], *self.rows[index])

    def writes(self, slots: torch.Tensor) -> torch.Tensor | SlotWrites:
        """``slots`` (B, S) as every layer of one forward writes them: eagerly a :class:`SlotWrites` (its flat
        index computed once, not once a layer); compiled, ``slots`` itself (Inductor writes in place)."""
        if torch.compiler.is_compiling() or not all(t.is_contiguous() for t in self.keys + self.values):
            return slots
        batch, heads, width, head_dim = self.keys[0].shape
        if self.rows is None:  # every layer's (B * H * max_len, hd) view, made once: the buffers never move
            self.rows = [
                (k.view(-1, head_dim), v.view(-1, head_dim)) for k, v in zip(self.keys, self.values, strict=True)
            ]
        rows = torch.arange(batch * heads, device=slots.device).view(batch, heads, 1) * width  # (B, H, 1)
        return SlotWrites(slots, (rows + slots[:, None, :]).reshape(-1))  # (B * H * S,)

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy slots ``src`` to ``dst`` in every layer's keys and values, per row: ``src``, ``dst`` are (B, n) long.

        Used after a speculative step to move the accepted path's entries into contiguous positions.
        ``src`` and ``dst`` may overlap when ``dst <= src`` elementwise (values are gathered first).
        """
        batch, n_head, _, head_dim = self.keys[0].shape
        if self.buffer is not None and not torch.compiler.is_compiling():  # eager, stacked: every layer at once
            count = self.buffer.shape[0]
            index = src[None, :, None, :, None].expand(count, batch, n_head, src.shape[1], head_dim)
            target = dst[None, :, None, :, None].expand_as(index)  # (2 * n_layer, B, H, n, hd)
            self.buffer.scatter_(3, target, self.buffer.gather(3, index))
            return
        if not torch.compiler.is_compiling():  # eager: gather + scatter_, as in LayerCache.update
            index = src[:, None, :, None].expand(batch, n_head, src.shape[1], head_dim)  # (B, H, n, hd)
            target = dst[:, None, :, None].expand_as(index)
            for cache in self.keys + self.values:
                cache.scatter_(2, target, cache.gather(2, index))
            return
        # Compiled: index_put_ writes the n moved slots in place; a scatter_ into a step's input would be
        # computed into a copy of every layer's whole cache and copied back (see LayerCache.update).
        rows, head = row_head_index(batch, n_head, src.device)
        for cache in self.keys + self.values:
            cache.index_put_((rows, head, dst[:, None, :]), cache[rows, head, src[:, None, :]])  # (B, H, n, hd)


class ValidityCache(KVCache):
    """A :class:`KVCache` that also keeps which slots hold real keys: ``valid`` (B, max_len) bool, True except
    where the prefill's mask hid a condition slot. Image tokens and draft nodes are never pads. The cache of
    the targets prompted by left-padded token ids (:class:`lantern.models.llama_parts.PromptedTarget`): CFG's
    unconditional context may be shorter or longer than the prompt, so each row's pads are kept here."""

    def __init__(self, keys, values, valid: torch.Tensor):
        super().__init__(keys, values)
        self.valid = valid

    @classmethod
    def allocate(cls, n_layer, batch, n_head, max_len, head_dim, dtype, device) -> ValidityCache:
        base = KVCache.allocate(n_layer, batch, n_head, max_len, head_dim, dtype, device)
        return cls(base.keys, base.values, torch.ones(batch, max_len, dtype=torch.bool, device=device))

    def tensors(self) -> list[torch.Tensor]:
        return self.keys + self.values + [self.valid]

    def write_valid(self, slots: torch.Tensor, mask: torch.Tensor, cond_len: int) -> torch.Tensor:
        """Record which keys written at ``slots`` (B, S) under ``mask`` (B, 1, S, L) are real; return the
        validity of every slot (B, max_len).

        Only the prefill writes condition slots (``< cond_len``); there the query at the last one (the
        image-start token, always real) sees exactly its row's real condition slots, so its mask row is
        their validity. Every other slot written is an image token or a draft node: real.
        """
        last = slots == cond_len - 1  # (B, S) the query at the last condition slot, when this call has it
        seen = (mask[:, 0] & last[:, :, None]).any(1)  # (B, L) the columns that query sees
        real = (slots >= cond_len) | seen.gather(1, slots.clamp_max(seen.shape[1] - 1))  # (B, S)
        return write_flags(self.valid, slots, real)


def write_flags(flags: torch.Tensor, slots: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``flags`` (B, max_len) with ``values`` (B, S) written at ``slots`` (B, S), in place; returns ``flags``."""
    if torch.compiler.is_compiling():  # in place at a fixed address (see LayerCache.update)
        rows = torch.arange(slots.shape[0], device=slots.device)[:, None]
        flags.index_put_((rows, slots), values)
    else:
        flags.scatter_(1, slots, values)
    return flags


def row_head_index(batch: int, heads: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Row (B, 1, 1) and head (1, H, 1) indices that, with per-row slots (B, 1, S), address (B, H, S) cache entries."""
    rows = torch.arange(batch, device=device)[:, None, None]
    head = torch.arange(heads, device=device)[None, :, None]
    return rows, head


class LayerCache:
    """One layer's slice of a :class:`KVCache`; attention writes new keys and reads the prefix."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, k_rows: torch.Tensor | None = None, v_rows=None):
        self.k = k  # (B, H, L, hd)
        self.v = v
        self.k_rows, self.v_rows = k_rows, v_rows  # (B * H * L, hd) views, when the cache made them (writes())

    def update(
        self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor, length: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``k``, ``v`` (B, H, S, hd) at per-row ``slots`` (B, S) and return the first ``length`` slots.

        Rows may write different slots (speculative rows accept different numbers of tokens). ``slots`` may be
        a :class:`SlotWrites` (eager), whose flat index is used as it is.
        """
        if isinstance(slots, SlotWrites):  # eager, prepared once a forward: contiguous rows of hd values
            head_dim = k.shape[3]
            k_rows = self.k.view(-1, head_dim) if self.k_rows is None else self.k_rows
            v_rows = self.v.view(-1, head_dim) if self.v_rows is None else self.v_rows
            k_rows.index_copy_(0, slots.flat, k.reshape(-1, head_dim))
            v_rows.index_copy_(0, slots.flat, v.reshape(-1, head_dim))
            if length == self.k.shape[2]:
                return self.k, self.v
            return self.k[:, :, :length], self.v[:, :, :length]
        if not torch.compiler.is_compiling():  # eager: a scatter_ costs a third of an index_put_
            index = slots[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[3])  # (B, H, S, hd)
            self.k.scatter_(2, index, k)
            self.v.scatter_(2, index, v)
            if length == self.k.shape[2]:  # masks over the whole capacity (every tree step): no slicing
                return self.k, self.v
            return self.k[:, :, :length], self.v[:, :, :length]
        # Compiled: an index_put_, which Inductor writes into the cache in place, whereas a scatter_ into a
        # step's input is computed into a copy of the whole cache and copied back.
        rows, head = row_head_index(*k.shape[:2], slots.device)
        index = (rows, head, slots[:, None, :])  # broadcasts to (B, H, S)
        self.k.index_put_(index, k)
        self.v.index_put_(index, v)
        return self.k[:, :, :length], self.v[:, :, :length]


class NoCache:
    """Stand-in for training and teacher forcing: attention sees exactly the keys it was given."""

    def layer(self, index: int) -> NoCache:
        return self

    def writes(self, slots: torch.Tensor) -> torch.Tensor:
        return slots

    def update(
        self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor, length: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return k, v
