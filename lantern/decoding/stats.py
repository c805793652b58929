"""Per-image decode statistics: one typed object every decoder returns, and the run's acceptance summary.

A decoder's :class:`~lantern.decoding.api.DecodeResult` carries a :class:`DecodeStats`: CPU tensors with a
leading batch dimension, the fields a decoder does not measure left None. Speculative decoders build it
from their step logs with :func:`summarise`; the generation job saves one image's entries
(:meth:`DecodeStats.image`) beside its codes and, at the end of a run, reads them back into one object
(:meth:`DecodeStats.stack`) for :func:`acceptance_summary`. It reads like the mapping it replaces
(``stats["steps"]``, ``"histogram" in stats``, ``items()``), over the fields that are set.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch


@dataclass
class DecodeStats:
    """Per-image statistics, each a CPU tensor whose first dimension is the image.

    Every decoder: ``steps`` target steps after token 0 and ``tokens`` the tokens they produced (N - 1).
    Where the law of emitted tokens is accounted for: ``tv_realised_sum`` / ``tv_realised_max`` the realised
    TV between the target and each token's law, over ``tv_measured`` tokens; measured by the Monte Carlo audit
    (:mod:`lantern.decoding.audit`): ``tv_realised_var`` the variance of that sum, ``tv_plugin_sum`` the plug-in
    TVs of the same tokens, and no ``tv_realised_max`` (a maximum of noisy estimates measures the noise). Speculative decoders:
    ``histogram`` (B, D+1) steps that accepted 0..D drafts, ``merged_sum`` / ``merged_max`` the mass a
    relaxation moved onto ``accepted_drafts`` accepted drafts. VVS: ``skipped_tokens`` committed without a
    target forward, ``skipped_tv_sum`` / ``skipped_tv_measured`` their realised TV, ``skip_steps`` skip steps
    that committed some. ZipAR: ``tokens_per_step_max``.

    ``token_steps`` (B, N): the step that emitted each token in raster order, 0 for the prefill's token 0 and
    1, 2, ... for the steps after it (:func:`raster_steps`, :func:`summarise`, :func:`zipar_token_steps`);
    computed after decoding from what the steps logged, never inside a step. VVS numbers its skip steps too,
    and ``token_skipped`` (B, N) marks the tokens a skip step committed without a target forward.
    """

    steps: torch.Tensor
    tokens: torch.Tensor
    tv_realised_sum: torch.Tensor | None = None
    tv_realised_max: torch.Tensor | None = None
    tv_measured: torch.Tensor | None = None
    tv_realised_var: torch.Tensor | None = None
    tv_plugin_sum: torch.Tensor | None = None
    histogram: torch.Tensor | None = None
    merged_sum: torch.Tensor | None = None
    merged_max: torch.Tensor | None = None
    accepted_drafts: torch.Tensor | None = None
    skipped_tokens: torch.Tensor | None = None
    skipped_tv_sum: torch.Tensor | None = None
    skipped_tv_measured: torch.Tensor | None = None
    skip_steps: torch.Tensor | None = None
    tokens_per_step_max: torch.Tensor | None = None
    token_steps: torch.Tensor | None = None
    token_skipped: torch.Tensor | None = None

    def keys(self) -> list[str]:
        """The names of the fields that are set."""
        return [f.name for f in dataclasses.fields(self) if getattr(self, f.name) is not None]

    def items(self) -> Iterator[tuple[str, torch.Tensor]]:
        return ((key, getattr(self, key)) for key in self.keys())

    def __getitem__(self, key: str) -> torch.Tensor:
        value = getattr(self, key, None) if key in FIELDS else None
        if value is None:
            raise KeyError(key)
        return value

    def __contains__(self, key: object) -> bool:
        return key in FIELDS and getattr(self, str(key)) is not None

    def image(self, position: int) -> dict[str, torch.Tensor]:
        """Image ``position``'s entries, without the batch dimension (what a run folder stores per image)."""
        return {key: value[position] for key, value in self.items()}

    @classmethod
    def from_mapping(cls, entries: Mapping[str, torch.Tensor]) -> DecodeStats:
        """The statistics of ``entries`` (a stored mapping; names this version does not know are dropped)."""
        return cls(**{key: value for key, value in entries.items() if key in FIELDS})

    @classmethod
    def stack(cls, images: list[Mapping[str, torch.Tensor]]) -> DecodeStats | None:
        """One object over stored images' entries (:meth:`image`); the fields every image has. None when
        there are no images or one lacks ``steps`` (a record of a decoder that kept none)."""
        if not images or any("steps" not in image or "tokens" not in image for image in images):
            return None
        shared = [key for key in FIELDS if all(key in image for image in images)]
        return cls(**{key: torch.stack([image[key] for image in images]) for key in shared})


FIELDS = frozenset(f.name for f in dataclasses.fields(DecodeStats))


def exact_law(steps: torch.Tensor, num_tokens: int) -> DecodeStats:
    """The statistics of a decoder whose every token is drawn from the target (TV 0, every token measured):
    ``steps`` (B,) target steps after token 0."""
    batch = steps.shape[0]
    return DecodeStats(
        steps=steps,
        tokens=torch.full((batch,), num_tokens - 1, dtype=torch.long),
        tv_realised_sum=torch.zeros(batch, dtype=torch.float64),
        tv_realised_max=torch.zeros(batch, dtype=torch.float64),
        tv_measured=torch.full((batch,), num_tokens - 1, dtype=torch.long),
    )


def raster_steps(batch: int, num_tokens: int) -> torch.Tensor:
    """Token steps (B, N) of one token per step in raster order: token ``t`` at step ``t`` (AR)."""
    return torch.arange(num_tokens, dtype=torch.int16).expand(batch, -1).clone()


def emitted_steps(counts: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Token steps (B, N) from ``counts`` (B, S) tokens each step emitted in raster order after token 0
    (0 for a step that emitted none); tokens past the image are cut."""
    batch, steps = counts.shape
    numbers = torch.arange(1, steps + 1)
    out = torch.zeros(batch, num_tokens, dtype=torch.int16)
    for row in range(batch):  # a host loop over the batch, once per decode
        emitted = torch.repeat_interleave(numbers, counts[row].cpu().long())[: num_tokens - 1]
        out[row, 1 : 1 + emitted.numel()] = emitted.to(torch.int16)
    return out


def zipar_token_steps(batch: int, side: int, rows: int, window: int) -> torch.Tensor:
    """Token steps (B, N) of ZipAR's schedule (:mod:`lantern.decoding.zipar.step`), which is fixed: row 0
    starts at the prefill; row ``r`` starts once row ``r - 1`` has ``window`` tokens (row 1: once row 0 is
    complete) and every started row draws one token per step."""
    done = [1] + [0] * (rows - 1)
    out = torch.zeros(rows * side, dtype=torch.int16)
    step = 0
    while done[-1] < side:
        step += 1
        above = [side] + done[:-1]
        drawing = [
            (0 < done[r] < side) or (done[r] == 0 and above[r] >= window and (r >= 2 or above[r] == side))
            for r in range(rows)
        ]
        for r in range(rows):
            if drawing[r]:
                out[r * side + done[r]] = step
                done[r] += 1
    return out.expand(batch, -1).clone()


def run_lengths(token_steps: torch.Tensor) -> torch.Tensor:
    """Per token (..., N): how many tokens the step that emitted it emitted (the accepted run's length)."""
    flat = token_steps.long().reshape(-1, token_steps.shape[-1])
    counts = torch.zeros(flat.shape[0], int(flat.max()) + 1, dtype=torch.long)
    counts.scatter_add_(1, flat, torch.ones_like(flat))
    return counts.gather(1, flat).reshape(token_steps.shape)


def summarise(logs: list, num_tokens: int, depth: int) -> DecodeStats:
    """Per-sample CPU tensors from speculative step logs: steps, the acceptance histogram, realised TV, merged mass.

    Each log has ``accepted`` (B,) drafts accepted (-1 once a row finished), ``tv`` (B, D+1) the realised TV
    of each emitted token's law (NaN: not measured) and ``merged`` (B, D) the mass moved onto accepted
    drafts. A row's last step may overrun the image; its extra tokens are cut from the codes and not counted.
    """
    accepted_log = torch.stack([log.accepted for log in logs], dim=1)  # (B, S), -1 once a row finished
    tv_log = torch.stack([log.tv for log in logs], dim=1).double()  # (B, S, D+1)
    merged_log = torch.stack([log.merged for log in logs], dim=1).double()  # (B, S, D)
    batch, device = accepted_log.shape[0], accepted_log.device
    span = torch.arange(depth + 1, device=device)
    ran = accepted_log >= 0  # (B, S)
    histogram = torch.zeros(batch, depth + 2, dtype=torch.long, device=device)
    histogram.scatter_add_(1, torch.where(ran, accepted_log, depth + 1), torch.ones_like(accepted_log))
    emitted = span[None, None, :] <= accepted_log[:, :, None]  # (B, S, D+1) tokens each step emitted
    produced = torch.cumsum(emitted.sum(2), dim=1) - emitted.sum(2)  # (B, S) tokens before each step
    emitted &= (produced[:, :, None] + span[None, None, :]) < num_tokens - 1
    measured = emitted & ~torch.isnan(tv_log)
    realised = torch.where(measured, tv_log, 0.0)
    levels = span[None, None, :-1] < accepted_log[:, :, None]  # (B, S, D) accepted draft tokens
    moved = torch.where(levels, merged_log, 0.0)
    return DecodeStats(
        steps=ran.sum(1).cpu(),
        tokens=torch.full((batch,), num_tokens - 1, dtype=torch.long),
        histogram=histogram[:, : depth + 1].cpu(),
        tv_realised_sum=realised.sum((1, 2)).cpu(),
        tv_realised_max=realised.amax((1, 2)).cpu(),
        tv_measured=measured.sum((1, 2)).cpu(),
        merged_sum=moved.sum((1, 2)).cpu(),
        merged_max=moved.amax((1, 2)).cpu(),
        accepted_drafts=levels.sum((1, 2)).cpu(),
        token_steps=emitted_steps(emitted.sum(2).cpu(), num_tokens),
    )


def acceptance_summary(stats: DecodeStats | None) -> dict:
    """Run-level acceptance figures from every image's statistics (:meth:`DecodeStats.stack`).

    ``mean_accepted_length`` is tau: tokens produced after the first one divided by target steps,
    over all images (1.0 for plain AR). ``tv_realised_mean`` / ``tv_realised_max``: the total variation
    between the target and the law each token was actually drawn from, over the tokens where it was
    measured (``tv_realised_coverage`` of them; 0 for AR and exact rules). A speculative decoder adds
    ``acceptance_histogram`` (steps that accepted 0, 1, ... draft tokens) and ``merged_mass_mean`` /
    ``merged_mass_max``: the mass a relaxation moved onto each accepted draft token.
    """
    if stats is None:
        return {}
    steps, tokens = int(stats.steps.sum()), int(stats.tokens.sum())
    summary = {"mean_accepted_length": tokens / max(1, steps), "target_steps": steps}
    if stats.tv_measured is not None:
        measured = int(stats.tv_measured.sum())
        summary["tv_realised_mean"] = float(stats.tv_realised_sum.sum()) / measured if measured else None
        known_max = measured and stats.tv_realised_max is not None
        summary["tv_realised_max"] = float(stats.tv_realised_max.max()) if known_max else None
        summary["tv_realised_coverage"] = measured / max(1, tokens)
        if stats.tv_realised_var is not None:  # the Monte Carlo audit: a standard error and the plug-in beside it
            summary["tv_realised_se"] = float(stats.tv_realised_var.sum()) ** 0.5 / measured if measured else None
            plugin = float(stats.tv_plugin_sum.sum()) / measured if measured else None
            summary["tv_audit_mc"] = {"plugin_mean": plugin, "tokens": measured}
    if stats.histogram is not None:
        summary["acceptance_histogram"] = [int(v) for v in stats.histogram.sum(0)]
        summary["merged_mass_mean"] = float(stats.merged_sum.sum()) / max(1, int(stats.accepted_drafts.sum()))
        summary["merged_mass_max"] = float(stats.merged_max.max())
    return summary
