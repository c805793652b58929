"""What the HF families' reference-grade AR shares: transformers' own model class on the run's weights, and its
``generate()`` run one prompt at a time, eager, as the papers time it.

A family's ``reference_ar.py`` names its transformers class, the logits processors of its reference script and
how a generated stream maps back to codes; this module loads the model (from ``model.gpt_ckpt``'s folder, or
from the bundle written back as one) and drives the loop. Nothing here names a family.
"""

from __future__ import annotations

import os
import tempfile

import torch

from lantern.errors import ConfigError


def load_hf_model(model_class, bundle, folder=None):
    """``model_class`` (a transformers ``...ForConditionalGeneration``) holding the run's weights, on the bundle's
    device and dtype in eval mode: read from ``folder`` (the preset's ``model.gpt_ckpt``) when given, else from the
    bundle written back as a folder (:meth:`~lantern.models.bundle.ModelBundle.save_target`; a family that cannot
    write one is refused, naming ``model.gpt_ckpt``)."""
    weight = bundle.target.input_embeddings()
    if folder is not None and os.path.isdir(os.fspath(folder)):
        return model_class.from_pretrained(os.fspath(folder), dtype=weight.dtype).to(weight.device).eval()
    with tempfile.TemporaryDirectory(prefix="lantern-reference-ar-") as tmp:
        try:
            written = bundle.save_target(os.path.join(tmp, "target"), torch.float32)
        except ConfigError as exc:
            raise ConfigError(
                f"the reference-grade AR of model={bundle.name} reads the model's folder: pass model.gpt_ckpt=FOLDER "
                f"({exc})"
            ) from None
        return model_class.from_pretrained(os.fspath(written), dtype=weight.dtype).to(weight.device).eval()


def prompt_ids(values: torch.Tensor, mask: torch.Tensor, row: int) -> torch.Tensor:
    """One prompt's real ids (1, L) from a condition's padded ``values`` (B, T) and ``mask`` (B, T), in order."""
    return values[row][mask[row]][None]


def sampling_kwargs(sampling) -> dict:
    """``generate()``'s sampling arguments for our SamplingConfig: greedy at temperature 0, else sampling with the
    same temperature, top-k (0: off) and top-p (1: off)."""
    if sampling.temperature == 0:
        return {"do_sample": False}
    return {"do_sample": True, "temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p}


class HFReference:
    """A family's reference loop over a transformers model: :meth:`generate` decodes each prompt by
    :meth:`one` (the family's ``generate()`` call and its stream -> codes) and stacks the codes."""

    label = "transformers generate()"
    batched = False  # one prompt at a time, as the reference scripts run it

    def __init__(self, model, config):
        import transformers

        self.model, self.config = model, config
        self.commit = f"transformers {transformers.__version__}"

    def generate(self, condition, sampling, seed: int) -> torch.Tensor:
        """Codes (B, N) long: each prompt of ``condition`` decoded alone; the RNG seeded once per batch."""
        torch.manual_seed(seed)
        rows = [self.one(prompt_ids(condition.values, condition.mask, row), sampling) for row in range(len(condition))]
        return torch.cat(rows).long()

    def one(self, ids: torch.Tensor, sampling) -> torch.Tensor:
        """Codes (1, N) for one prompt's ids (1, L)."""
        raise NotImplementedError

    def run(self, ids: torch.Tensor, processors: list, new_tokens: int, sampling) -> torch.Tensor:
        """``model.generate`` over ``ids`` with ``processors``, exactly ``new_tokens`` new tokens; returns them."""
        import transformers

        with torch.inference_mode():
            out = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new_tokens,
                logits_processor=transformers.LogitsProcessorList(processors),
                eos_token_id=None,
                **sampling_kwargs(sampling),
            )
        return out[:, ids.shape[1] :]


def rows_to_codes(stream: torch.Tensor, grid: int, offset: int) -> torch.Tensor:
    """A stream of rows each followed by one end-of-line token (B, >= grid * (grid + 1)) -> codes (B, grid * grid)."""
    rows = stream[:, : grid * (grid + 1)].reshape(stream.shape[0], grid, grid + 1)[:, :, :grid]
    return rows.reshape(stream.shape[0], grid * grid) - offset
