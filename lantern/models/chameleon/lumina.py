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
target hides them with :class:`lantern.models.row_ends.RowEndTarget` (two physical cache slots per logical
one, an EOL companion live after each row's last code, the row end's output being its EOL's); logits are over
the codes only (Anole's head), which is the reference's masking of every other id, so EOL and EOI are forced,
never sampled, drafted or counted as accepted. The prompt's fixed tokens ``[BOI, H, W]`` end the condition
(the reference lets the model generate them; see docs/models.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from lantern.errors import CheckpointError, ConfigError
from lantern.models.chameleon.model import ChameleonConfig, ChameleonTarget
from lantern.models.row_ends import RowEndTarget

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


class LuminaTarget(RowEndTarget, ChameleonTarget):
    """Chameleon over Lumina-mGPT's image stream with the EOL tokens hidden (module docstring)."""

    def null_condition(self, batch: int) -> torch.Tensor:
        """CFG's unconditional context (B, T): ``[pad ..., BOI, H, W]`` (the reference's stream from BOI on)."""
        cfg, ids = self.config, self.padded_condition(batch)
        ids[:, -3], ids[:, -2:] = cfg.boi_id, cfg.size_id
        return ids

    def null_condition_mask(self, mask: torch.Tensor) -> torch.Tensor:
        """(B, T): only the null context's last three slots (BOI, H, W) are real."""
        null = torch.zeros_like(mask)
        null[:, -3:] = True
        return null

    def image_stream(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes (B, N) -> the reference's vocabulary ids after ``[BOI, H, W]``: rows each followed by EOL, then
        EOI (B, grid * (grid + 1) + 1); for checks."""
        cfg = self.config
        rows = (codes + cfg.code_offset).view(codes.shape[0], cfg.grid_size, cfg.grid_size)
        eol = torch.full_like(rows[:, :, :1], cfg.eol_id)
        stream = torch.cat([rows, eol], dim=2).flatten(1)
        return torch.cat([stream, torch.full_like(stream[:, :1], cfg.eoi_id)], dim=1)
