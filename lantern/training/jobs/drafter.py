"""The drafter factory: ``scripts/train_drafter.py`` turns any target into a trained EAGLE-style drafter.

Stages (``stage=all`` runs them in order; each resumes and can run alone once the earlier ones are done):

1. ``data``: token sequences in ``out_dir/data`` (:mod:`lantern.training.drafter_data`);
2. ``features``: the target's teacher-forced states in ``out_dir/features`` (:mod:`lantern.training.drafter_features`);
3. ``train``: the drafter on the feature shards in ``out_dir/train`` (checkpoints, resume, ``log.jsonl``;
   under ``torchrun --nproc_per_node=N`` DistributedDataParallel over N processes, the global batch split);
4. ``export``: ``out_dir/drafter`` (``config.json`` + ``model.safetensors``, loaded by ``model.drafter_ckpt=``),
   then the held-out report ``out_dir/report.json`` (agreement of the exported weights with the target on
   the last ``held_out`` share of the rows, which training never reads).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import time
from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from lantern import checks
from lantern.errors import ConfigError, writes_under
from lantern.files import remove_stale_temps, write_json_atomic
from lantern.models.drafter import Drafter, DrafterConfig, drafter_metadata, load_drafter_for, save_drafter_folder
from lantern.models.llamagen.gpt import default_taps
from lantern.models.sampling import SamplingConfig
from lantern.results.provenance import environment
from lantern.training import drafter_data
from lantern.training.drafter import FeatureObjective, evaluate_features
from lantern.training.drafter_features import FEATURE_DTYPES, check_target, teacher_features
from lantern.training.jobs.drafter_checks import RESUME_IGNORE, check_config, check_ready, require, trained_weights
from lantern.training.loop import EpochBatches, Trainer, warmup_cosine
from lantern.training.shards import ShardStore

REPORT_NAME = "report.json"
DRAFTER_FOLDER = "drafter"


def _digest(payload) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


class Factory:
    """The stages over one resolved config, one target bundle and one ``out_dir``."""

    def __init__(self, cfg: DictConfig, world):
        self.cfg = cfg
        self.world = world
        self.out_dir = Path(cfg.out_dir)
        self.bundle = instantiate(cfg.model.bundle)
        self.target = self.bundle.target.eval().requires_grad_(False)
        self.taps = self._taps()
        check_target(self.target, f"model={cfg.model.name}", self.taps)
        self.target_digest = drafter_data.module_digest(self.target)
        self.kind, self.prompts, self.paths, self.prompt_of = self._sources()
        self.condition_digest = self._condition_digest()
        steps = int(cfg.drafter.ttt_steps)
        if steps > self.target.config.num_image_tokens - 1:
            raise checks.refuse(
                "drafter.ttt_steps",
                steps,
                f"an integer <= {self.target.config.num_image_tokens - 1} (image tokens - 1)",
            )
        train_rows, _ = self.split()  # before any work: the batch must fit the training rows
        if cfg.stage in ("train", "all") and int(cfg.batch_size) > train_rows.numel():
            raise checks.refuse(
                "batch_size",
                cfg.batch_size,
                f"an integer <= {train_rows.numel()}, the training rows of {self.total_rows}",
            )
        self.data = ShardStore(self.out_dir / "data", self._data_key(), "drafter training sequences")
        name = "features" if not self.taps else "features_taps-" + "-".join(map(str, self.taps))
        self.features = ShardStore(self.out_dir / name, self._feature_key(), "drafter features")
        if cfg.compare_with:  # read now (weights only, shapes checked), not after data, features and training
            self._compare_drafter()

    # -- sources and keys ------------------------------------------------------------------------------

    def _taps(self) -> tuple[int, ...]:
        """The target layers the drafter reads (EAGLE-3 style), or () for the final-norm state."""
        taps = self.cfg.drafter.taps
        if taps is None:
            return default_taps(self.target.config.n_layer)
        return tuple(int(t) for t in taps)

    def _sources(self):
        """Prompt kind, prompt table, and (data=images) image paths with their prompt indices."""
        cfg, conditioner = self.cfg, self.bundle.conditioner
        kind = conditioner.kind
        if cfg.data == "images":
            if cfg.data_root is None:
                raise checks.refuse("data_root", None, "a folder of images (data=images)")
            if kind == "class":
                paths, prompt_of, table = drafter_data.class_folder_items(cfg.data_root, conditioner.num_classes)
            else:
                paths, prompt_of, table = drafter_data.caption_file_items(cfg.data_root, cfg.captions)
            if cfg.num_samples is not None:
                paths, prompt_of = paths[: int(cfg.num_samples)], prompt_of[: int(cfg.num_samples)]
            return kind, table, paths, prompt_of
        if cfg.prompts is not None:
            prompts = instantiate(cfg.prompts)
        elif kind == "class":
            prompts = list(range(conditioner.num_classes))  # every class, in turn
        else:
            prompts = instantiate(cfg.model.default_prompts)
        items = list(prompts)
        conditioner.check_all(items)
        return kind, items, None, None

    def _condition_digest(self) -> str:
        """sha256 of the conditions of the first prompts: rows depend on the conditioner (a text encoder's
        weights, length, preprocessing), which no file hash covers; encoding a few prompts is cheap."""
        condition = self.bundle.conditioner.encode(list(self.prompts[:16]))
        return drafter_data.tensors_digest([("values", condition.values), ("mask", condition.mask)])

    def remove_stale_temps(self) -> None:
        """Temporary files of killed writers (their names carry another pid): removed once this process holds the folder."""
        for folder in (self.data.folder, self.features.folder, self.out_dir / "train"):
            if folder.is_dir():
                remove_stale_temps(folder)

    def _sampling(self) -> SamplingConfig:
        gen = self.cfg.generation
        return SamplingConfig(temperature=gen.temperature, top_k=gen.top_k, top_p=gen.top_p, cfg_scale=gen.cfg_scale)

    def _data_key(self) -> dict:
        cfg = self.cfg
        key = {
            "kind": cfg.data,
            "prompts": drafter_data.prompts_digest(self.kind, self.prompts),
            "condition": self.condition_digest,
            "num_image_tokens": self.target.config.num_image_tokens,
        }
        if cfg.data == "self":
            gen = OmegaConf.to_container(cfg.generation, resolve=True)
            key.update(
                target=self.target_digest,
                target_config=_digest(dataclasses.asdict(self.target.config)),
                seed=int(gen["seed"]),
                sampling=self._sampling().__dict__,
            )
        else:
            files = [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in self.paths]
            key.update(
                vq=drafter_data.module_digest(self.bundle.vq), files=_digest(files), prompt_of=_digest(self.prompt_of)
            )
        return key

    def _feature_key(self) -> dict:
        cfg = self.cfg
        return {
            "data": _digest(self.data.key),
            "target": self.target_digest,
            "target_config": _digest(dataclasses.asdict(self.target.config)),
            "condition": self.condition_digest,
            "states": "final_norm",
            "taps": list(self.taps),
            "seed": int(cfg.seed),
            "cond_dropout": float(cfg.features.cond_dropout),
            "dtype": cfg.features.dtype,
        }

    @property
    def total_rows(self) -> int:
        return len(self.paths) if self.cfg.data == "images" else int(self.cfg.num_samples)

    def split(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Training rows and held-out rows (the last ``held_out`` share, at least one row)."""
        total = self.total_rows
        held = max(1, math.ceil(float(self.cfg.held_out) * total))
        if held >= total:
            raise ConfigError(f"held_out={self.cfg.held_out} leaves no training rows of {total}")
        return torch.arange(total - held), torch.arange(total - held, total)

    # -- stages ----------------------------------------------------------------------------------------

    def make_data(self) -> None:
        cfg, gen = self.cfg, self.cfg.generation
        drafter_data.write_prompts(self.data.folder, self.kind, self.prompts)
        if cfg.data == "self":
            drafter_data.self_distill(
                self.data,
                self.target,
                self.bundle.conditioner,
                self.prompts,
                self._sampling(),
                int(gen.seed),
                self.total_rows,
                int(gen.batch_size),
                cfg.progress,
            )
        else:
            drafter_data.tokenise_images(
                self.data,
                self.bundle.vq,
                self.paths,
                self.prompt_of,
                self.target.config.grid_size * self.bundle.vq.config.downsample,
                int(gen.batch_size),
                cfg.progress,
            )

    def make_features(self) -> None:
        require(self.data, self.total_rows, "data")
        cfg = self.cfg
        prompts = drafter_data.read_prompts(self.data.folder, self.kind, self.prompts)
        teacher_features(
            self.features,
            self.data,
            self.target,
            self.bundle.conditioner,
            prompts,
            int(cfg.seed),
            float(cfg.features.cond_dropout),
            FEATURE_DTYPES[cfg.features.dtype],
            int(cfg.features.batch_size),
            cfg.progress,
            self.taps,
        )

    def new_drafter(self) -> Drafter:
        torch.manual_seed(int(self.cfg.seed))
        spec = self.cfg.drafter
        config = DrafterConfig(
            self.target.config, n_layer=int(spec.n_layer), condition_input=spec.condition_input, taps=self.taps
        )
        return Drafter(config).to(self.bundle.device)

    def train(self) -> dict:
        require(self.features, self.total_rows, "features")
        cfg, world = self.cfg, self.world
        train_rows, _ = self.split()
        drafter = self.new_drafter()
        model = drafter
        if world.distributed:
            model = torch.nn.parallel.DistributedDataParallel(drafter)
        optimizer = torch.optim.AdamW(
            drafter.parameters(), lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay
        )
        spec = cfg.drafter
        objective = FeatureObjective(
            self.target,
            model,
            self.features,
            train_rows,
            spec.noise,
            spec.ce_weight,
            world.rank,
            world.size,
            steps=int(spec.ttt_steps),
            feature_weight=float(spec.feature_weight),
        )
        trainer = Trainer(
            drafter,
            optimizer,
            objective,
            EpochBatches(train_rows.numel(), cfg.batch_size, cfg.seed, lambda positions: positions),
            max_steps=cfg.steps,
            out_dir=self.out_dir / "train",
            ckpt_every=cfg.ckpt_every,
            log_every=cfg.log_every,
            progress=cfg.progress,
            grad_clip=cfg.grad_clip,
            lr_schedule=warmup_cosine(self.warmup_steps(), cfg.steps, cfg.min_lr_ratio),
            config=self.train_config(),
            resume_ignore=RESUME_IGNORE,
            export_name="drafter.safetensors",  # this project's format (what a world ships), fp16 as the folder
            export_dtype=torch.float16,
            export_metadata=drafter_metadata(drafter),
            world=world,
        )
        if world.is_main:
            params = sum(p.numel() for p in drafter.parameters()) / 1e6
            print(
                f"training a {cfg.drafter.n_layer}-layer {cfg.drafter.kind} drafter ({params:.2f}M parameters) for {cfg.model.name} on "
                f"{train_rows.numel()} sequences for {cfg.steps} steps of {cfg.batch_size}"
                + (f" over {world.size} processes" if world.distributed else ""),
                flush=True,
            )
        return trainer.fit()

    def warmup_steps(self) -> int:
        """``warmup_steps``, or 2% of ``steps`` (at least one) when null: a short run still reaches its rate."""
        given = self.cfg.warmup_steps
        return int(given) if given is not None else max(1, int(self.cfg.steps) // 50)

    def train_config(self) -> dict:
        """What the drafter's weights depend on (the trainer refuses to resume under another)."""
        config = OmegaConf.to_container(self.cfg, resolve=True)
        config.pop("model")
        config["target_digest"] = self.target_digest
        config["features_key"] = self.features.key
        return config

    def _compare_drafter(self) -> Drafter:
        """``compare_with``'s drafter for this target (a pickle is refused by the weights-only load)."""
        given = self.cfg.compare_with
        kind = "folder" if isinstance(given, str) and os.path.isdir(given) else "file"
        path = checks.path("compare_with", given, kind, "a drafter file or folder")
        return load_drafter_for(
            path,
            self.target.config,
            str(self.cfg.model.name),
            str(self.bundle.device),
            condition_input=self.cfg.compare_condition_input,
        )

    def export(self, summary: dict | None) -> dict:
        """Write ``out_dir/drafter`` from the trained weights, evaluate it and write the report."""
        from safetensors.torch import load_file

        weights = trained_weights(self.out_dir, self.cfg.steps)
        drafter = self.new_drafter()
        drafter.load_state_dict({k: v.float() for k, v in load_file(str(weights)).items()}, strict=True)
        folder = self.out_dir / DRAFTER_FOLDER
        # the family's table of the folder (LlamaGen: the image codes'; Chameleon: the whole vocabulary's)
        save_drafter_folder(drafter, drafter.config.arch.folder_embeddings(self.target), folder)
        spec, name, device = self.cfg.drafter, str(self.cfg.model.name), str(self.bundle.device)
        # read back as run.py will, through the family's description of the target (DrafterArch)
        shipped = load_drafter_for(
            folder,
            self.target.config,
            name,
            device,
            norm_eps=drafter.config.norm_eps,
            condition_input=spec.condition_input,
        )
        _, held_rows = self.split()
        evaluate = lambda d: evaluate_features(  # noqa: E731
            self.target,
            d,
            self.features,
            held_rows,
            int(self.cfg.eval_batch_size),
            float(spec.ce_weight),
            int(self.cfg.top_k),
            float(spec.feature_weight),
        )
        report = {
            "drafter": str(folder),
            "target": {"model": self.cfg.model.name, "digest": self.target_digest},
            "held_out": evaluate(shipped),
            "data": {"kind": self.cfg.data, "rows": self.total_rows, "disk_bytes": self.data.bytes()},
            "features": {
                "rows": self.features.rows,
                "disk_bytes": self.features.bytes(),
                "dtype": self.cfg.features.dtype,
            },
            "drafter_config": {**OmegaConf.to_container(spec, resolve=True), "taps": list(self.taps)},
        }
        if self.cfg.compare_with:
            other = self._compare_drafter()
            report["compare_with"] = {"drafter": str(self.cfg.compare_with), "held_out": evaluate(other)}
        if summary is not None:
            report["training"] = {k: summary[k] for k in ("steps", "resumed_from", "train_wall_s", "logs")}
        report["environment"] = environment(self.bundle.device)
        write_json_atomic(self.out_dir / REPORT_NAME, report)
        return report


@writes_under("out_dir")
def run(cfg: DictConfig, world, hold=None) -> dict:
    """Check, then run the configured stages; returns the report (rank 0, when export ran).

    ``world`` is the torchrun world (:class:`lantern.run.distributed.World`: ``rank``, ``size``, ``is_main``,
    ``distributed``, ``barrier()``); ``hold(folder)``, when given, returns the context manager that makes
    this process the folder's only writer (the script passes a folder lock on rank 0), entered after every
    check and before the first write.
    """
    check_config(cfg)
    torch.set_num_threads(int(cfg.num_threads))
    factory = Factory(cfg, world)
    check_ready(factory)
    stage = cfg.stage
    timings: dict[str, float] = {}
    with hold(factory.out_dir) if hold is not None else contextlib.nullcontext():
        if world.is_main:
            factory.remove_stale_temps()
        for name, action in (("data", factory.make_data), ("features", factory.make_features)):
            if stage in (name, "all"):
                started = time.perf_counter()
                if world.is_main:
                    action()
                world.barrier()
                factory.data = ShardStore(factory.data.folder, factory.data.key, factory.data.what)
                factory.features = ShardStore(factory.features.folder, factory.features.key, factory.features.what)
                timings[name] = time.perf_counter() - started
        summary = None
        if stage in ("train", "all"):
            started = time.perf_counter()
            summary = factory.train()
            timings["train"] = time.perf_counter() - started
        if stage in ("export", "all") and world.is_main:
            started = time.perf_counter()
            report = factory.export(summary)
            timings["export"] = time.perf_counter() - started
            report["wall_s_this_run"] = timings
            write_json_atomic(factory.out_dir / REPORT_NAME, report)
            return report
    return {"stages": timings, "out_dir": str(factory.out_dir)}
