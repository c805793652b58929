"""The generation job: prompts -> tokens -> images, with per-image timing and a provenance record."""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from lantern import checks
from lantern.errors import ConfigError
from lantern.files import image_name, inputs_read, labelled_grid, read_images, write_atomic
from lantern.models.bundle import ModelBundle
from lantern.results.assembly import RunParts, assemble_record
from lantern.results.baselines import read_baseline_run, recorded_speedup, speed_setting
from lantern.results.provenance import environment
from lantern.results.record import write_record
from lantern.rng import keys_tensor
from lantern.run.bench.baselines.speedups import baseline_cost, greedy_check, speedup_entries
from lantern.run.distributed import World, check_world
from lantern.run.prompts import PromptSet
from lantern.run.rundir import ImageStore, RunFolder, claim_run_folder
from lantern.run.timing import peak_memory_mb, timed

STORED_PROMPT_CHARS = 4096


def stored_prompt(prompt):
    """A prompt as the record keeps it: whole up to :data:`STORED_PROMPT_CHARS` characters (text encoders
    see far fewer tokens), else its start and the full text's length and sha256, so a 64 MB caption line
    does not make a 64 MB record and the exact text is still identified."""
    if not isinstance(prompt, str) or len(prompt) <= STORED_PROMPT_CHARS:
        return prompt
    digest = hashlib.sha256(prompt.encode("utf-8")).hexdigest()
    return f"{prompt[:STORED_PROMPT_CHARS]} [... {len(prompt)} characters in all, sha256 {digest}]"


class GenerationJob:
    """Generate ``num_images`` images (image ``i`` from prompt ``i % len(prompts)``) in batches.

    Latency per image is the decode time of its batch divided by the batch size, measured from after
    text encoding to the last token (VQ decoding excluded), with device synchronisation, after
    ``warmup`` untimed batches. With a ``baseline`` decoder (plain AR) of another kind, every
    ``baseline_every``-th batch is also decoded by the baseline, interleaved and alternating which goes
    first, and ``speedup`` is the ratio of the two decode times over those same batches. With
    ``baseline_run`` (a finished run's folder) it is the ratio to that run's recorded latency, checked
    first to share this run's setting and machine (:mod:`lantern.results.baselines`). A ``reference`` (the
    reference-grade AR, :mod:`lantern.run.bench.baselines`) is timed on the same batches beside both, its
    speed-up recorded as ``speedup_reference``; built before the first batch, its cost is recorded apart.
    """

    def __init__(
        self,
        bundle: ModelBundle,
        decoder,
        prompts: PromptSet,
        num_images: int,
        batch_size: int,
        seed: int,
        warmup: int = 1,
        save_grid: bool = True,
        progress: bool = True,
        baseline=None,
        baseline_every: int = 1,
        baseline_run: str | None = None,
        metrics=None,
        tracker=None,
        protocol: dict | None = None,
        reference=None,
    ):
        num_images, batch_size = (
            checks.integer("num_images", num_images, 1),
            checks.integer("batch_size", batch_size, 1),
        )
        warmup, seed = checks.integer("warmup", warmup, 0), checks.integer("seed", seed, 0)
        baseline_every = checks.integer("speedup_every", baseline_every, 1)
        if prompts.kind != bundle.conditioner.kind:
            raise ConfigError(
                f"prompt set {prompts.name!r} holds {prompts.kind} prompts but model {bundle.name!r} "
                f"takes {bundle.conditioner.kind} prompts"
            )
        self.bundle, self.decoder, self.prompts = bundle, decoder, prompts
        self.num_images, self.batch_size, self.seed = num_images, batch_size, seed
        self.warmup, self.save_grid, self.progress = warmup, save_grid, progress
        if baseline is not None and baseline_run is not None:
            raise ConfigError(
                "speedup_baseline and speedup_baseline_run are both set; set speedup_baseline=null "
                "to compare with the recorded run"
            )
        self.baseline, self.baseline_every, self.baseline_run = baseline, baseline_every, baseline_run
        self.reference = reference  # the reference-grade AR (baseline=both / reference), or None
        if reference is not None:
            reference.check_model(bundle.name)
        for each in (decoder, baseline, reference):  # compile modes the device cannot run, before any work
            if each is not None:
                each.check_device(bundle.device)
        self.metrics = dict(metrics or {})  # name -> callable(run_dir, prompts, labels) -> dict
        self.tracker = tracker  # e.g. lantern.run.tracking.WandbLogger: gets the finished record
        # The record's protocol entries (lantern.metrics.protocol.Protocol.check, run before the folder was claimed).
        self.protocol = dict(protocol) if protocol else {"protocol": None}
        self.items = prompts.for_images(num_images)
        self.labels = prompts.labels_for_images(num_images)
        bundle.conditioner.check_all(self.items)
        for metric in self.metrics.values():  # every metric's inputs (weights, folders) before the first image
            if hasattr(metric, "check"):
                metric.check(self.items, self.labels)

    def _decode(self, indices: list[int], decoder=None):
        bundle = self.bundle
        decoder = decoder or self.decoder
        condition = bundle.conditioner.encode([self.items[i] for i in indices])
        keys = keys_tensor(self.seed, indices, bundle.device)
        seconds, result = timed(lambda: decoder.generate(bundle.target, condition, keys), bundle.device)
        return result, seconds

    def _setting(self) -> dict:
        """The record's setting entries: with the decoder's compile mode, the config's attention and the
        machine, what makes two runs' latencies comparable (:func:`lantern.results.baselines.speed_setting`)."""
        sampling = self.decoder.sampling
        return {
            "model": self.bundle.name,
            "prompts": self.prompts.name,
            "num_images": self.num_images,
            "batch_size": self.batch_size,
            "seed": self.seed,
            **{key: getattr(sampling, key) for key in ("temperature", "top_k", "top_p", "cfg_scale", "cfg_interval")},
            "dtype": str(self.bundle.target.input_embeddings().dtype).removeprefix("torch."),
        }

    def _baselines(self) -> dict:
        """The baselines timed beside the decoder, by the batch key their seconds go under (the engine-grade AR
        is not timed beside itself)."""
        timed = {"baseline_seconds": self.baseline, "reference_seconds": self.reference}
        return {key: b for key, b in timed.items() if b is not None and type(b) is not type(self.decoder)}

    def _speedup(self, batches: list[dict]) -> dict:
        """Speed-up entries from every rank's ``batches`` (dicts with ``seconds``, ``images`` and per baseline
        timed beside them its seconds): over the engine-grade AR (``speedup``) and the reference-grade AR
        (``speedup_reference``), each a ratio of summed times with the quartiles of per-batch ratios."""
        entries = {}
        if self.baseline is not None and type(self.baseline) is type(self.decoder):
            entries = {"speedup": 1.0, "speedup_baseline": "this run is the baseline"}
        elif self.baseline is not None:
            entries = speedup_entries(batches, "baseline_seconds", self.baseline.name)
        if self.reference is not None:
            entries.update(speedup_entries(batches, "reference_seconds", self.reference.settings.method()))
        return entries

    def _decode_shard(self, store: ImageStore, indices: list[int], world: World) -> dict:
        """Decode ``indices`` (this rank's unfinished images) in batches, saving each image as it is done.

        Returns this rank's timing: per batch its indices, decode seconds and, when timed beside it, each
        baseline's seconds; the summed decoder counters; wall seconds and peak memory; what the baselines cost
        (setup, warm-up, timed batches) and, greedy, how many reference images equal ours.
        """
        bundle = self.bundle
        started = time.perf_counter()
        batches = [indices[s : s + self.batch_size] for s in range(0, len(indices), self.batch_size)]
        baselines = self._baselines()
        costs = {b.name: {"setup_s": 0.0, "warmup_s": 0.0, "timed_s": 0.0} for b in baselines.values()}
        if self.reference is not None and batches:  # the reference's model is built outside any timing
            costs[self.reference.name]["setup_s"] = self.reference.prepare(bundle)
        for _ in range(self.warmup if batches else 0):
            self._decode(batches[0])
            for baseline in baselines.values():
                costs[baseline.name]["warmup_s"] += self._decode(batches[0], baseline)[1]
        if bundle.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(bundle.device)
        timed_batches, stats, check = [], {}, {"images": 0, "equal": 0, "against": None}
        show = self.progress and world.is_main
        bar = tqdm(
            batches,
            desc=f"{self.decoder.name} x{len(indices)}" + (f" (rank 0 of {world.size})" if world.distributed else ""),
            unit="batch",
            disable=not show,
        )
        for number, batch in enumerate(bar):
            timed = dict(baselines) if number % self.baseline_every == 0 else {}
            compared = sum(b["timed"] for b in timed_batches)
            order = [None, *timed]  # None: the decoder; alternate which goes first, so drift hits all alike
            results = {key: self._decode(batch, timed.get(key)) for key in (order[::-1] if compared % 2 else order)}
            result, seconds = results[None]
            self._check_reference(results, result, check)
            pixels = bundle.decode_images(result.codes).cpu().numpy()  # (B, H, W, 3)
            for position, index in enumerate(batch):
                store.save(index, pixels[position], result.codes[position], result.per_sample.image(position))
            entry = {
                "rank": world.rank,
                "indices": batch,
                "images": len(batch),
                "seconds": seconds,
                "timed": bool(timed),
                "baseline_seconds": None,  # as records before version 5 have it, with or without a baseline
            }
            for key, baseline in baselines.items():
                entry[key] = results[key][1] if key in results else None
                costs[baseline.name]["timed_s"] += entry[key] or 0.0
            timed_batches.append(entry)
            for key, value in result.stats.items():
                stats[key] = stats.get(key, 0.0) + value
        return {
            "rank": world.rank,
            "images": len(indices),
            "decode_s": sum(b["seconds"] for b in timed_batches),
            "wall_s": time.perf_counter() - started,
            "peak_memory_mb": peak_memory_mb(bundle.device),
            "batches": timed_batches,
            "stats": stats,
            "baseline_cost": costs,
            "reference_check": check,
        }

    def _check_reference(self, results: dict, result, check: dict) -> None:
        """Greedy: count the reference-grade AR's images whose codes equal our engine-grade AR's on this batch
        (or a lossless decoder's when the engine-grade AR was not timed on it)."""
        if "reference_seconds" not in results or self.decoder.sampling.temperature != 0:
            return
        ours, against = None, None
        if "baseline_seconds" in results:
            ours, against = results["baseline_seconds"][0].codes, "compiled AR"
        elif self.decoder.settings.lossless():
            ours, against = result.codes, self.decoder.settings.method()
        if ours is None:
            return
        theirs = results["reference_seconds"][0].codes.to(ours.device)
        check["images"] += theirs.shape[0]
        check["equal"] += int((theirs == ours).all(dim=1).sum())
        check["against"] = against

    def run(
        self, out_dir: str | Path | RunFolder, config: dict | None = None, world: World | None = None
    ) -> dict | None:
        """Write ``000000.png`` ..., ``grid.png`` and ``metrics.json`` into ``out_dir``; return the record (rank 0).

        ``out_dir`` is a folder path (claimed here: locked, checked against ``config``) or a
        :class:`RunFolder` the caller has claimed. Images finished by an earlier process in the
        folder are kept, not redone; each rank of ``world`` decodes its share of the rest. Other ranks
        return None once their images are written.
        """
        world = world or World()
        if not isinstance(out_dir, RunFolder):
            with claim_run_folder(out_dir, config or {}, world) as folder:
                if folder.claim.finished is not None:
                    return folder.claim.finished.to_json()
                return self.run(folder, config, world)
        folder = out_dir
        check_world(world, self.num_images)
        recorded = None
        if self.baseline_run is not None:  # checked before anything is generated or written
            mine = {**self._setting(), "compile": self.decoder.settings.compile}
            recorded = read_baseline_run(
                self.baseline_run, speed_setting(mine, environment(self.bundle.device), config or {})
            )
        store = folder.store()
        shard = world.shard(list(range(self.num_images)))
        kept, redone = store.keep_sound(shard, self.bundle.target.config.num_image_tokens)
        if redone:  # a truncated or foreign file of an earlier process: decoded again, never a crash at the end
            first = min(redone)
            print(
                f"{len(redone)} stored image(s) failed their check and are decoded again "
                f"(first: {image_name(first)}: {redone[first]})",
                file=sys.stderr,
            )
        mine = [i for i in shard if i not in kept]
        if world.is_main:
            folder.start(inputs_read())  # refuses files changed since the folder's first images
        world.barrier()
        part = self._decode_shard(store, mine, world)
        parts = world.gather(part)  # every rank's images are on disk once it reaches this
        if not world.is_main:
            return None
        run = self._parts(store, parts, recorded, config or {})
        measured = {}  # every metric's entries, merged before the record is built once
        for evaluate in self.metrics.values():
            measured.update(evaluate(folder.path, self.items, self.labels))
        record = assemble_record(run, measured)
        write_record(record, folder.path)
        metrics = record.to_json()
        if self.tracker is not None:
            self.tracker.log_run(folder.path, metrics)
        return metrics

    def _parts(self, store: ImageStore, parts: list[dict], recorded: dict | None, config: dict) -> RunParts:
        """What the record is assembled from (:func:`lantern.results.assembly.assemble_record`): every rank's
        timing, each image's stored statistics, the speed-up; writes the grid of the first images."""
        distinct = list(dict.fromkeys(self.items))  # each prompt stored once; rows name it by position
        prompt_ids = {prompt: number for number, prompt in enumerate(distinct)}
        if self.save_grid:
            shown = min(64, self.num_images)
            grid = labelled_grid(list(read_images(store.folder, shown)), [str(self.items[i]) for i in range(shown)])
            write_atomic(store.folder / "grid.png", lambda tmp: grid.save(tmp, format="PNG"))
        batches = [b for part in parts for b in part["batches"]]
        decoded = sum(b["images"] for b in batches)
        total = sum(b["seconds"] for b in batches)
        speedup = (
            self._speedup(batches)
            if recorded is None
            else recorded_speedup(recorded, self.baseline_run, total / decoded if decoded else None)
        )
        if recorded is not None and self.reference is not None:
            speedup.update(speedup_entries(batches, "reference_seconds", self.reference.settings.method()))
        speedup.update(self._baseline_entries(parts))
        return RunParts(
            settings=self.decoder.settings,
            setting={**self._setting(), **self.protocol},
            parts=parts,
            images=[store.load(index)["per_sample"] for index in range(self.num_images)],
            prompt_ids=[prompt_ids[item] for item in self.items],
            tokens_per_image=self.bundle.target.config.num_image_tokens,
            labels=self.labels,
            speedup=speedup,
            details={
                "inputs": inputs_read(),
                "distinct_prompts": [stored_prompt(prompt) for prompt in distinct],
                "environment": environment(self.bundle.device),
                "config": config,
            },
        )

    def _baseline_entries(self, parts: list[dict]) -> dict:
        """``baseline_cost_s`` (every rank's, summed) and, with a reference-grade AR, ``reference_greedy_check``."""
        costs: dict[str, dict[str, float]] = {}
        for part in parts:
            for name, entry in part["baseline_cost"].items():
                mine = costs.setdefault(name, {})
                for key, value in entry.items():
                    mine[key] = mine.get(key, 0.0) + value
        entries = {"baseline_cost_s": baseline_cost(costs)} if costs else {}
        if self.reference is not None:
            checks_ = [part["reference_check"] for part in parts]
            against = next((c["against"] for c in checks_ if c["against"]), None)
            images, equal = sum(c["images"] for c in checks_), sum(c["equal"] for c in checks_)
            greedy = self.decoder.sampling.temperature == 0
            entries["reference_greedy_check"] = greedy_check(images, equal, against, greedy)
            if greedy and against and equal < images:
                print(
                    f"warning: the reference-grade AR's greedy codes differ from ours on {images - equal} of "
                    f"{images} images (recorded in reference_greedy_check)",
                    file=sys.stderr,
                )
        return entries
