"""The ``features`` stage of the drafter factory: the target's teacher-forced states, in shards.

For every data row (codes ``c`` (N,) under prompt ``p``) the target runs once, teacher-forced, and the
shard rows hold what a drafter step needs without the target:

* ``hidden`` (S, T+N-1, D): the final-norm states at every position (the drafter's input features
  and its regression targets; see :mod:`lantern.training.drafter`);
* ``cond`` (S, T, D) and ``mask`` (S, T): the condition embeddings and mask (condition entries read them);
* ``codes`` (S, N) int32, ``row`` (S,) the data row, ``null`` (S,) whether the row took the null condition.

Condition dropout is decided per row, not per step: row ``i`` takes the target's null condition under
its own mask (``null_condition_mask``; LlamaGen's is the caption's, as in training the target) when the
counter-based uniform of ``(seed, i)`` is below ``cond_dropout``. A row's features therefore never change
with batching, resumption or the number of rows, and the stored states are the ones the drafter is trained
on (EAGLE's recipe draws dropout per step; a fixed share of the rows stores half as much as both streams of
every row).

Storage per row: ``(2T + N - 1) * D`` numbers in ``dtype`` (fp16 by default): 24 KB for the world,
~1.2 MB for a t2i GPT-XL at 256 px (T = 120), so 100k rows stream from disk instead of RAM.
"""

from __future__ import annotations

import inspect

import torch
from tqdm.auto import tqdm

from lantern.errors import ConfigError
from lantern.models.condition import Condition
from lantern.rng import TRAIN_COND_DROPOUT, keys_tensor, uniform
from lantern.training.shards import ShardStore

FEATURE_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def check_target(target, what: str, taps: tuple[int, ...] = ()) -> None:
    """ConfigError unless ``target`` gives the teacher-forced states the drafter reads: its final-norm states
    (``teacher_hidden``) and, for ``taps``, the states entering those layers."""
    teacher = getattr(target, "teacher_hidden", None)
    if not callable(teacher):
        raise ConfigError(
            f"{what}: the target {type(target).__name__} gives no teacher-forced hidden states "
            "(teacher_hidden), which an EAGLE-style drafter is trained on"
        )
    if taps and "taps" not in inspect.signature(teacher).parameters:
        raise ConfigError(
            f"{what}: the target {type(target).__name__} gives no states of inner layers (teacher_hidden(taps=)), "
            f"which drafter.taps={list(taps)} reads; use drafter=eagle"
        )
    layers = target.config.n_layer
    bad = [t for t in taps if not 1 <= t < layers]
    if bad or len(set(taps)) != len(taps):
        raise ConfigError(
            f"{what}: drafter.taps={list(taps)}: expected distinct layer indices in [1, {layers - 1}] "
            f"(the target has {layers} layers)"
        )


def null_rows(seed: int, rows: range, cond_dropout: float) -> torch.Tensor:
    """(S,) bool: which of ``rows`` take the null condition."""
    if cond_dropout <= 0:
        return torch.zeros(len(rows), dtype=torch.bool)
    draws = uniform(keys_tensor(seed, rows), 0, TRAIN_COND_DROPOUT, 1)[:, 0]  # (S,)
    return draws < cond_dropout


@torch.no_grad()
def teacher_features(
    store: ShardStore,
    data: ShardStore,
    target,
    conditioner,
    prompts: list,
    seed: int,
    cond_dropout: float,
    dtype: torch.dtype,
    batch_size: int,
    progress: bool = True,
    taps: tuple[int, ...] = (),
) -> None:
    """Append feature rows ``store.rows .. data.rows - 1`` (see the module docstring); with ``taps`` the rows
    also hold ``taps`` (S, T+N-1, len(taps) * D), the states entering those target layers."""
    device = target.input_embeddings().device
    with tqdm(
        total=data.rows,
        initial=store.rows,
        desc="target features",
        unit="seq",
        disable=not progress,
        dynamic_ncols=True,
        mininterval=1.0,
    ) as bar:
        for start in range(store.rows, data.rows, batch_size):
            rows = range(start, min(start + batch_size, data.rows))
            batch = data.read(torch.arange(rows.start, rows.stop))
            codes = batch["codes"].long().to(device)  # (b, N)
            encoded = conditioner.encode([prompts[i] for i in batch["prompt"].tolist()])
            condition = Condition(encoded.values.to(device), encoded.mask.to(device))
            null = null_rows(seed, rows, cond_dropout)  # (b,)
            values = condition.values
            blank = target.null_condition(len(rows)).to(device=values.device, dtype=values.dtype)
            dropped = null.to(device)
            values = torch.where(dropped.view(-1, *([1] * (values.dim() - 1))), blank, values)
            mask = torch.where(dropped[:, None], target.null_condition_mask(condition.mask), condition.mask)
            cond_emb = target.embed_condition(values)  # (b, T, D)
            extra = {}
            if taps:
                hidden, tapped = target.teacher_hidden(cond_emb, codes, mask, taps=taps)
                extra["taps"] = tapped.to(dtype)  # (b, T+N-1, len(taps) * D)
            else:
                hidden = target.teacher_hidden(cond_emb, codes, mask)  # (b, T+N-1, D)
            store.append(
                {
                    **extra,
                    "hidden": hidden.to(dtype),
                    "cond": cond_emb.to(dtype),
                    "mask": mask.cpu(),
                    "codes": codes.to(torch.int32).cpu(),
                    "row": torch.arange(rows.start, rows.stop),
                    "null": null,
                }
            )
            bar.update(len(rows))
