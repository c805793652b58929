"""A small, model-agnostic training loop that resumes exactly where it stopped.

The loop owns the optimisation step (zero grad, backward, optional clipping, LR schedule, step),
periodic atomic checkpoints, logging and the final weight export. Everything model-specific lives
in ``step_fn``: a callable ``step_fn(batch) -> (loss, logs)``. Rerunning the same command in the
same ``out_dir`` resumes from the last checkpoint and ends in the same state, bit for bit, as an
uninterrupted run, provided the data order depends only on ``(seed, epoch)`` (see
:class:`EpochBatches`) and ``step_fn`` draws random numbers only from the global generators
(which are checkpointed) or keeps its own state through ``state_dict``/``load_state_dict``.

Files in ``out_dir``: ``checkpoint.pt`` (latest training state), ``config.yaml`` (the resolved
config), ``log.jsonl`` (one line per log interval) and the exported weights (``model.safetensors``
unless renamed).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from lantern import checks
from lantern.errors import CheckpointError, ConfigError
from lantern.files import inputs_read, save_torch_atomic, write_atomic, write_text_atomic
from lantern.training.checkpoint import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_NAME,
    DEFAULT_RESUME_IGNORE,
    check_inputs,
    check_resume_config,
    read_checkpoint,
    rng_state,
    set_rng_state,
    truncate_log,
)

CONFIG_NAME = "config.yaml"
LOG_NAME = "log.jsonl"
# Upper bounds of the shared knobs that set work or memory: more steps than any job here needs (the largest
# run is ~10^5), a batch no CPU or GPU here holds, more threads than any machine has.
MAX_STEPS, MAX_BATCH, MAX_THREADS = 10**7, 2**16, 1024
StepFn = Callable[[Any], tuple[torch.Tensor, Mapping[str, Any]]]
BatchFactory = Callable[[int, int], Iterable[Any]]


def check_trainer_knobs(cfg: Mapping[str, Any]) -> None:
    """The knobs every training job shares, checked before any data is read or folder made: ``steps``,
    ``batch_size``, ``ckpt_every``, ``log_every``, ``num_threads`` >= 1, ``warmup_steps``, ``seed`` >= 0 (each
    below its cap), ``progress`` a bool, a
    finite ``lr`` > 0, ``min_lr_ratio`` in [0, 1], ``weight_decay`` >= 0 and ``grad_clip`` > 0 or null
    (those present in ``cfg``)."""
    for name, low, high in (
        ("steps", 1, MAX_STEPS),
        ("batch_size", 1, MAX_BATCH),
        ("ckpt_every", 1, MAX_STEPS),
        ("log_every", 1, MAX_STEPS),
        ("num_threads", 1, MAX_THREADS),
        ("warmup_steps", 0, MAX_STEPS),
        ("seed", 0, 2**63 - 1),
    ):
        if cfg.get(name) is not None:
            checks.capped(name, cfg[name], low, high)
    if "progress" in cfg:
        checks.flag("progress", cfg["progress"])
    if "lr" in cfg:
        checks.real("lr", cfg["lr"], 0, low_open=True)
    if "min_lr_ratio" in cfg:
        checks.probability("min_lr_ratio", cfg["min_lr_ratio"])
    if "weight_decay" in cfg:
        checks.real("weight_decay", cfg["weight_decay"], 0)
    if "grad_clip" in cfg:
        checks.optional(checks.real, "grad_clip", cfg["grad_clip"], 0, low_open=True)


def warmup_cosine(warmup_steps: int, total_steps: int, min_ratio: float = 0.0) -> Callable[[int], float]:
    """LR multiplier schedule: linear warmup over ``warmup_steps``, then cosine decay to ``min_ratio``.

    The returned function maps the 0-based index of the step about to be taken to a multiplier of
    the optimizer's base learning rate: ``(s + 1) / warmup_steps`` during warmup, then
    ``min_ratio + (1 - min_ratio) * (1 + cos(pi * t)) / 2`` with ``t`` going from 0 to 1 at
    ``total_steps`` (and held at ``min_ratio`` beyond).
    """
    warmup_steps = checks.integer("warmup_steps", warmup_steps, 0)
    total_steps = checks.integer("steps", total_steps, 1)
    min_ratio = checks.probability("min_lr_ratio", min_ratio)

    def schedule(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return schedule


class EpochBatches:
    """Deterministic shuffled mini-batches: the order of epoch ``e`` is a pure function of ``(seed, e)``.

    Calling ``batches(epoch, start)`` yields ``load(indices)`` for batches ``start, start + 1, ...``
    of that epoch, where ``indices`` is an int64 tensor (batch_size,) of dataset positions. A
    resumed run therefore needs only ``(epoch, start)`` to continue the exact same data stream.
    """

    def __init__(
        self, size: int, batch_size: int, seed: int, load: Callable[[torch.Tensor], Any], drop_last: bool = True
    ) -> None:
        """``size`` items, ``batch_size`` per batch, ``load`` turning an index tensor into a batch."""
        batch_size = checks.integer("batch_size", batch_size, 1)
        if size < 1 or (drop_last and size < batch_size):
            raise ConfigError(f"batch_size {batch_size} is larger than the dataset ({size} items)")
        self.size = int(size)
        self.batch_size = batch_size
        self.seed = int(seed)
        self.load = load
        self.drop_last = drop_last

    def __len__(self) -> int:
        """Number of batches per epoch."""
        if self.drop_last:
            return self.size // self.batch_size
        return math.ceil(self.size / self.batch_size)

    def permutation(self, epoch: int) -> torch.Tensor:
        """The item order (size,) int64 of ``epoch``."""
        order = np.random.default_rng([self.seed, int(epoch)]).permutation(self.size)
        return torch.from_numpy(order.astype(np.int64))

    def __call__(self, epoch: int, start: int = 0) -> Iterator[Any]:
        """Yield the batches of ``epoch`` from batch number ``start`` on."""
        order = self.permutation(epoch)
        for b in range(start, len(self)):
            yield self.load(order[b * self.batch_size : (b + 1) * self.batch_size])


def training_summary(summary: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    """The ``training`` block of a training report from :meth:`Trainer.fit`'s ``summary``, plus ``extra``."""
    return {
        "steps": summary["steps"],
        "resumed_from": summary["resumed_from"],
        "wall_s_this_run": summary["wall_s"],
        "train_wall_s_total": summary["train_wall_s"],
        **extra,
        "last_logs": summary["logs"],
    }


class Trainer:
    """Run ``max_steps`` optimizer steps of ``step_fn`` over ``batches``, checkpointing into ``out_dir``.

    Arguments:
        model: the module whose ``state_dict`` is checkpointed and exported (put it on its device first).
        optimizer: built over the model's parameters; its current learning rates are the base rates
            that ``lr_schedule`` multiplies.
        step_fn: ``step_fn(batch) -> (loss, logs)``; ``loss`` a scalar tensor to minimise, ``logs`` a
            mapping of names to floats or scalar tensors (averaged over each log interval). If
            ``step_fn`` also has ``after_step(step) -> logs | None`` it is called after every
            optimizer step with the 1-based step number; if it has ``state_dict()`` and
            ``load_state_dict(state)`` its state is checkpointed too.
        batches: ``batches(epoch, start)`` -> iterable of the batches of ``epoch`` from batch number
            ``start``; it must be deterministic (e.g. :class:`EpochBatches`).
        max_steps: total number of optimizer steps, counted across resumptions.
        out_dir: folder for the checkpoint, config, log and exported weights.
        ckpt_every: save a checkpoint every this many steps (and always after the last step).
        log_every: log averaged ``logs`` (and update the progress bar's loss) every this many steps.
        progress: show a tqdm progress bar.
        grad_clip: clip the global gradient norm to this value when not None.
        lr_schedule: ``lr_schedule(step_index) -> multiplier`` of the base learning rates (see
            :func:`warmup_cosine`); constant rates when None.
        config: the resolved run config, written to ``config.yaml`` and stored in every checkpoint;
            a resumption with a different config (outside ``resume_ignore``) is refused.
        resume_ignore: dotted config keys allowed to differ on resumption.
        export_name: file name of the exported weights (``.safetensors``).
        export_dtype: cast floating-point tensors to this dtype on export (None keeps them).
        export_metadata: extra string entries for the exported file's safetensors metadata (e.g.
            what a loader checks); ``step`` and ``config`` are always written.
        world: the torchrun ranks (:class:`lantern.run.distributed.World`) when ``step_fn`` runs a
            DistributedDataParallel model: every rank steps and resumes from the same checkpoint, rank 0
            alone writes (checkpoint, config, log, export) and logged values are averaged over ranks.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        step_fn: StepFn,
        batches: BatchFactory,
        max_steps: int,
        out_dir: str | os.PathLike,
        *,
        ckpt_every: int = 1000,
        log_every: int = 50,
        progress: bool = True,
        grad_clip: float | None = None,
        lr_schedule: Callable[[int], float] | None = None,
        config: Mapping[str, Any] | None = None,
        resume_ignore: Iterable[str] = DEFAULT_RESUME_IGNORE,
        export_name: str = "model.safetensors",
        export_dtype: torch.dtype | None = None,
        export_metadata: Mapping[str, str] | None = None,
        world=None,
    ) -> None:
        """Store the pieces; nothing is read or written until :meth:`fit`."""
        max_steps = checks.integer("steps", max_steps, 1)
        ckpt_every, log_every = checks.integer("ckpt_every", ckpt_every, 1), checks.integer("log_every", log_every, 1)
        grad_clip = checks.optional(checks.real, "grad_clip", grad_clip, 0, low_open=True)
        if not export_name.endswith(".safetensors"):
            raise ConfigError(f"export_name must end in .safetensors, got {export_name!r}")
        self.model = model
        self.optimizer = optimizer
        self.step_fn = step_fn
        self.batches = batches
        self.max_steps = max_steps
        self.out_dir = Path(out_dir)
        self.ckpt_every = ckpt_every
        self.log_every = log_every
        self.progress = progress
        self.grad_clip = grad_clip
        self.lr_schedule = lr_schedule
        self.config = dict(config) if config is not None else None
        self.resume_ignore = tuple(resume_ignore)
        self.export_name = export_name
        self.export_dtype = export_dtype
        self.export_metadata = {str(k): str(v) for k, v in (export_metadata or {}).items()}
        self.world = world
        self.base_lrs = [group["lr"] for group in optimizer.param_groups]
        self.step = 0
        self.epoch = 0
        self.batch_in_epoch = 0
        self.resumed_from: int | None = None
        self.train_wall_s = 0.0  # seconds spent in the step loop, summed over all resumptions
        self._loop_started: float | None = None
        self.inputs: dict[str, dict] = {}

    @property
    def checkpoint_path(self) -> Path:
        """``out_dir/checkpoint.pt``."""
        return self.out_dir / CHECKPOINT_NAME

    @property
    def export_path(self) -> Path:
        """Where :meth:`export` writes the weights."""
        return self.out_dir / self.export_name

    @property
    def is_main(self) -> bool:
        """Whether this process writes (rank 0, or the only process)."""
        return self.world is None or self.world.is_main

    def _stateful_step_fn(self) -> bool:
        return hasattr(self.step_fn, "state_dict") and hasattr(self.step_fn, "load_state_dict")

    def save_checkpoint(self) -> Path:
        """Write the full training state to ``checkpoint.pt`` atomically (temporary file + rename)."""
        state = {
            "format": CHECKPOINT_FORMAT,
            "step": self.step,
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "rng": rng_state(),
            "config": self.config,
            "inputs": self.inputs,
            "train_wall_s": self._total_wall_s(),
        }
        if self._stateful_step_fn():
            state["step_fn"] = self.step_fn.state_dict()
        if self.is_main:
            save_torch_atomic(self.checkpoint_path, state)
        return self.checkpoint_path

    def load_checkpoint(self) -> bool:
        """Restore the state from ``checkpoint.pt`` if it exists; returns whether it did."""
        path = self.checkpoint_path
        if not path.is_file():
            return False
        state = read_checkpoint(path)
        check_resume_config(path, state.get("config"), self.config, self.resume_ignore)
        check_inputs(path, state.get("inputs") or {}, self.inputs)
        if state["step"] > self.max_steps:
            raise ConfigError(
                f"the checkpoint in {str(self.out_dir)!r} is at step {state['step']}, beyond max_steps="
                f"{self.max_steps}; raise the step count or use a fresh out_dir"
            )
        try:
            self.model.load_state_dict(state["model"], strict=True)
            self.optimizer.load_state_dict(state["optimizer"])
        except (RuntimeError, ValueError, KeyError) as exc:
            raise CheckpointError(f"{str(path)!r} does not match this model/optimizer ({exc})") from exc
        if self._stateful_step_fn():
            self.step_fn.load_state_dict(state["step_fn"])
        set_rng_state(state["rng"])
        self.step = int(state["step"])
        self.epoch = int(state["epoch"])
        self.batch_in_epoch = int(state["batch_in_epoch"])
        self.train_wall_s = float(state.get("train_wall_s", 0.0))
        self.resumed_from = self.step
        if self.is_main:
            truncate_log(self.out_dir / LOG_NAME, self.step)
        return True

    def _total_wall_s(self) -> float:
        running = 0.0 if self._loop_started is None else time.perf_counter() - self._loop_started
        return self.train_wall_s + running

    def _write_config(self) -> None:
        if self.config is None or not self.is_main:
            return
        from omegaconf import OmegaConf

        text = OmegaConf.to_yaml(OmegaConf.create(self.config))
        write_text_atomic(self.out_dir / CONFIG_NAME, text)

    def export(self) -> Path:
        """Write the model's weights (contiguous, optionally cast) to ``export_path`` as safetensors."""
        from safetensors.torch import save_file

        tensors = {}
        for key, value in self.model.state_dict().items():
            value = value.detach().to("cpu")
            if self.export_dtype is not None and value.is_floating_point():
                value = value.to(self.export_dtype)
            tensors[key] = value.contiguous().clone()
        metadata = dict(self.export_metadata)
        metadata["step"] = str(self.step)
        if self.config is not None:
            metadata["config"] = json.dumps(self.config, default=str)
        if not self.is_main:
            return self.export_path
        write_atomic(self.export_path, lambda tmp: save_file(tensors, tmp, metadata=metadata))
        return self.export_path

    def _next_batch(self, iterator: Iterator[Any] | None) -> tuple[Any, Iterator[Any]]:
        if iterator is None:
            iterator = iter(self.batches(self.epoch, self.batch_in_epoch))
        for batch in iterator:
            return batch, iterator
        self.epoch += 1
        self.batch_in_epoch = 0
        iterator = iter(self.batches(self.epoch, 0))
        for batch in iterator:
            return batch, iterator
        raise ConfigError(f"the batch source yielded no batch for epoch {self.epoch}")

    def _log(
        self, sums: dict[str, Any], counts: dict[str, int], started: float, first_step: int, bar: tqdm
    ) -> dict[str, float]:
        record = {"step": self.step, "epoch": self.epoch}
        record.update({k: float(v) / counts[k] for k, v in sums.items()})
        if self.world is not None and self.world.distributed:  # every rank's share of the batch, averaged
            device = next(self.model.parameters()).device  # NCCL reduces device tensors only
            values = torch.tensor([record[k] for k in sums], dtype=torch.float64, device=device)
            torch.distributed.all_reduce(values)
            record.update(zip(sums, (values / self.world.size).cpu().tolist(), strict=True))
        record["lr"] = self.optimizer.param_groups[0]["lr"]
        elapsed = time.perf_counter() - started
        record["steps_per_s"] = (self.step - first_step) / elapsed if elapsed > 0 else 0.0
        if not self.is_main:
            return record
        with open(self.out_dir / LOG_NAME, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        bar.set_postfix(loss=f"{record.get('loss', float('nan')):.4f}")
        shown = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in record.items())
        tqdm.write(shown)
        return record

    def fit(self) -> dict[str, Any]:
        """Train to ``max_steps`` (resuming from ``checkpoint.pt`` if present), then export the weights.

        Returns a summary: ``steps``, ``resumed_from`` (None for a fresh run), ``wall_s`` of this
        call, ``train_wall_s`` (loop time summed over all runs up to the last checkpoint and this
        call), the last logged ``logs`` and the ``weights`` path.
        """
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.inputs = inputs_read()  # every file the job has read so far (weights, data), by content
        self.load_checkpoint()
        self._write_config()
        self.model.train()
        started = time.perf_counter()
        self._loop_started = started
        first_step = self.step
        sums: dict[str, Any] = {}  # per-key sums over the current log interval
        counts: dict[str, int] = {}  # per-key number of steps that reported it
        last: dict[str, float] = {}
        iterator = None
        with tqdm(
            total=self.max_steps,
            initial=self.step,
            disable=not (self.progress and self.is_main),
            desc="train",
            dynamic_ncols=True,
            mininterval=1.0,
        ) as bar:
            while self.step < self.max_steps:
                batch, iterator = self._next_batch(iterator)
                self.batch_in_epoch += 1
                if self.lr_schedule is not None:
                    factor = self.lr_schedule(self.step)
                    for group, base in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
                        group["lr"] = base * factor
                self.optimizer.zero_grad(set_to_none=True)
                loss, logs = self.step_fn(batch)
                if not bool(torch.isfinite(loss.detach())):
                    raise ConfigError(f"the loss is {float(loss)} at step {self.step + 1}; lower the learning rate")
                loss.backward()
                logs = {"loss": loss.detach(), **logs}
                if self.grad_clip is not None:
                    params = [p for group in self.optimizer.param_groups for p in group["params"]]
                    logs["grad_norm"] = torch.nn.utils.clip_grad_norm_(params, self.grad_clip)
                self.optimizer.step()
                self.step += 1
                if hasattr(self.step_fn, "after_step"):
                    logs.update(self.step_fn.after_step(self.step) or {})
                for key, value in logs.items():
                    value = value.detach() if isinstance(value, torch.Tensor) else value
                    sums[key] = sums[key] + value if key in sums else value
                    counts[key] = counts.get(key, 0) + 1
                bar.update(1)
                if self.step % self.log_every == 0 or self.step == self.max_steps:
                    last = self._log(sums, counts, started, first_step, bar)
                    sums, counts = {}, {}
                if self.step % self.ckpt_every == 0 or self.step == self.max_steps:
                    self.save_checkpoint()
        self.train_wall_s = self._total_wall_s()
        self._loop_started = None
        weights = self.export()
        return {
            "steps": self.step,
            "resumed_from": self.resumed_from,
            "wall_s": time.perf_counter() - started,
            "train_wall_s": self.train_wall_s,
            "logs": last,
            "weights": str(weights),
        }
