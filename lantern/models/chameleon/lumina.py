"""Lumina-mGPT (Alpha-VLLM/Lumina-mGPT-7B-768, -512) as a target of every decoder: Chameleon with end-of-line tokens.

Facts from the reference (``lumina_mgpt/inference_solver.py``, ``lumina_mgpt/data/item_processor.py``,
``lumina_mgpt/data/convertsation.py``, ``xllmx/model/tokenizer.py``), every id found by name in the folder's
vocabulary as :mod:`lantern.models.chameleon.vocab` does (the 7B releases' ids in brackets):

* An image is ``<racm3:break>`` (BOI, 8197), the height and width tokens ``<reserved{8800 + n:05d}>`` with
  ``n = pixels // 32`` (= grid // 2: 768 px -> ``<reserved08824>``, 8828; 512 px -> 8820; their processors read
  ``id - 8804``), then each row of ``grid`` codes followed by ``<reserved08799>`` (EOL, 8803), then ``<eoss>``
  (EOI, 8196). Their ``MultiModalLogitsProcessor`` masks every id but the codes (4..8195) inside a row and forces
  EOL after each row (the last row too) and EOI after the last EOL.
* The prompt is ``[BOS] + encode(question + "<reserved08706>")`` with the question ``"Generate an image of
  {W}x{H} according to the following prompt:\\n{caption}"`` (:mod:`lantern.models.chameleon.lumina_bundle`).
* CFG (their ``LLMImageStartTriggeredUnbatchedClassifierFreeGuidanceLogitsProcessor``): the unconditional
  context is the generated stream from BOI on, ``[BOI, H, W]`` then the same codes and EOLs, in a cache of its
  own; ``scale * (cond - uncond) + uncond``. Defaults of their generate script: CFG 4.0, image top-k 2000.

The decoders address image code ``n`` at logical position/slot ``T + n`` and must not see the EOLs, so this
target hides them. Its cache (:class:`LuminaCache`) holds two physical slots per logical slot: ``2s`` the token
of logical slot ``s`` and ``2s + 1`` its EOL companion, which is live only when that token ends a row (code
index ``n = position - T`` with ``(n + 1) % grid == 0``); the flag is kept per logical slot and written from
the query's position. A forward over S logical queries runs 2S physical ones, ``[code_0, eol_0, code_1, ...]``:

* RoPE positions: code ``n`` at ``T + n + n // grid`` (the EOLs before it), its companion one further;
  condition slots as they are (Chameleon's RoPE is 1D, so the left padding is a constant shift, as Anole's).
* Mask (B, 1, 2S, 2L) from the logical M (B, 1, S, L): a code query sees code columns per M and companion
  columns where M and live, never its own; a companion query sees what its code sees plus its own code and
  live companions per M (its own included). Dead companions are hidden from every query; their outputs are
  discarded.
* The output of a row-end code is its EOL's (which predicts the next row's first code), so "output at n
  predicts n + 1" holds; logits are over the codes only (Anole's head), which is the reference's masking of
  every other id, so EOL and EOI are forced, never sampled, drafted or counted as accepted.

Teacher forcing (:meth:`teacher_hidden`, drafter training) runs the same layout without a cache, so it is
the full interleaved sequence with the same output rule. The prompt's fixed tokens ``[BOI, H, W]`` end the
condition (the reference lets the model generate them; see docs/models.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from lantern.errors import CheckpointError, ConfigError
from lantern.models.chameleon.model import ChameleonCache, ChameleonConfig, ChameleonTarget
from lantern.models.kv_cache import KVCache
from lantern.models.llama_parts import rope_angles

EOL = "<reserved08799>"  # Lumina's new_line_token
BOS_NAME = "<s>"  # the tokenizer's bos_token (their config.json's bos_token_id 1 is <pad>; the tokenizer's is read)
PATCH = 32  # pixels per resolution-token unit (their patch_size); one unit is 2 x 2 codes of the 16x VQGAN


def size_token(units: int) -> str:
    """The name of the resolution token for ``units`` (= pixels // 32 = grid // 2): ``<reserved{8800 + units:05d}>``."""
    return f"<reserved{8800 + units:05d}>"


@dataclass(frozen=True)
class LuminaConfig(ChameleonConfig):
    """A Chameleon config with Lumina's image syntax: ``eol_id`` ends each row, ``size_id`` (square images: the
    height and width tokens are one id) follows BOI, ``image_pixels`` is the side the prompt states."""

    eol_id: int = -1
    size_id: int = -1
    image_pixels: int = 0

    def __post_init__(self):
        super().__post_init__()
        if self.grid_size % 2:
            raise ConfigError(f"Lumina-mGPT images are whole {PATCH}-px units: a grid of {self.grid_size} is odd")
        for name in ("eol_id", "size_id"):
            value = getattr(self, name)
            if not 0 <= value < self.text_vocab_size or self.code_offset <= value < self.code_offset + self.num_codes:
                raise ConfigError(f"{name}={value} is not a special id of the vocabulary")


def lumina_config(base: ChameleonConfig, vocab: Mapping[str, int], image_pixels: int, source: str) -> LuminaConfig:
    """``base`` (read from a folder or the random preset) with Lumina's ids found by name in ``vocab``:
    BOS ``<s>``, EOL ``<reserved08799>``, the size token of ``base.grid_size``; CheckpointError naming a
    missing one (an image size the model has no resolution token for is refused here)."""
    units = base.grid_size // 2
    if base.grid_size % 2:
        raise ConfigError(
            f"image_size {image_pixels} is {base.grid_size} codes a side; Lumina-mGPT's resolution tokens count "
            f"2 x 2 codes ({PATCH} px with the 16x VQGAN), so the side must be an even number of codes"
        )
    ids = {}
    for key, name in (("bos_id", BOS_NAME), ("eol_id", EOL), ("size_id", size_token(units))):
        if name not in vocab:
            what = f" (the resolution token of {image_pixels} px)" if key == "size_id" else ""
            raise CheckpointError(f"{source}: the vocabulary has no {name!r} token{what}")
        ids[key] = int(vocab[name])
    fields = {name: getattr(base, name) for name in ChameleonConfig.__dataclass_fields__}
    return LuminaConfig(**{**fields, **ids, "image_pixels": int(image_pixels)})


class LuminaCache(ChameleonCache):
    """A :class:`ChameleonCache` of 2 physical slots per logical slot (module docstring): keys and values
    (B, H, 2 * max_len, hd), ``valid`` (B, max_len) as Chameleon's, ``live`` (B, max_len) bool: the companion
    of logical slot ``s`` (physical ``2s + 1``) holds a real EOL. Callers address logical slots only."""

    def __init__(self, keys, values, valid: torch.Tensor, live: torch.Tensor):
        super().__init__(keys, values, valid)
        self.live = live

    @classmethod
    def allocate(cls, n_layer, batch, n_head, max_len, head_dim, dtype, device) -> LuminaCache:
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
        if torch.compiler.is_compiling():  # in place at a fixed address (see LayerCache.update)
            rows = torch.arange(slots.shape[0], device=slots.device)[:, None]
            self.live.index_put_((rows, slots), ends)
        else:
            self.live.scatter_(1, slots, ends)
        return self.live

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


class LuminaTarget(ChameleonTarget):
    """Chameleon over Lumina-mGPT's image stream with the EOL tokens hidden (module docstring)."""

    cache_class = LuminaCache

    def null_condition(self, batch: int) -> torch.Tensor:
        """CFG's unconditional context (B, T): ``[pad ..., BOI, H, W]`` (the reference's stream from BOI on)."""
        cfg = self.config
        ids = torch.full((batch, cfg.cls_token_num), cfg.pad_id, dtype=torch.long, device=self.inv_freq.device)
        ids[:, -3], ids[:, -2:] = cfg.boi_id, cfg.size_id
        return ids

    def null_condition_mask(self, mask: torch.Tensor) -> torch.Tensor:
        """(B, T): only the null context's last three slots (BOI, H, W) are real."""
        null = torch.zeros_like(mask)
        null[:, -3:] = True
        return null

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
        """As :meth:`ChameleonTarget.forward_embeddings` over logical ``positions``, ``slots`` and ``mask``;
        each query runs with its EOL companion and a row-end code returns its companion's output."""
        batch, seq, dim = x.shape
        positions = positions.expand(batch, seq)  # (B, S)
        mask = self.visible(slots, mask, cache).expand(batch, -1, -1, -1)  # (B, 1, S, L) logical
        ends = self.row_end(positions)  # (B, S)
        if isinstance(cache, LuminaCache):
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

    def image_stream(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes (B, N) -> the reference's vocabulary ids after ``[BOI, H, W]``: rows each followed by EOL, then
        EOI (B, grid * (grid + 1) + 1); for checks."""
        cfg = self.config
        rows = (codes + cfg.code_offset).view(codes.shape[0], cfg.grid_size, cfg.grid_size)
        eol = torch.full_like(rows[:, :, :1], cfg.eol_id)
        stream = torch.cat([rows, eol], dim=2).flatten(1)
        return torch.cat([stream, torch.full_like(stream[:, :1], cfg.eoi_id)], dim=1)
