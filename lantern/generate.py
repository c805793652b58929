"""The generation job: prompts -> tokens -> images, with per-image timing and a provenance record."""

from __future__ import annotations

import resource
import statistics
import time
from pathlib import Path

import torch
from tqdm import tqdm

from lantern.baselines import read_baseline_run, recorded_speedup
from lantern.bundle import ModelBundle
from lantern.errors import ConfigError
from lantern.images import image_name, labelled_grid, save_png
from lantern.prompts import PromptSet
from lantern.records import environment, write_json_atomic
from lantern.rng import keys_tensor


def synchronize(device: torch.device) -> None:
    """Wait for queued device work, so wall-clock times cover it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory_mb(device: torch.device) -> float:
    """Peak device memory (CUDA) or peak resident set size of this process (CPU), in MiB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# Keys every record carries, so tables can line runs up whatever produced them (None: not applicable or
# not measured in this run).
RECORD_DEFAULTS = {
    "acceptance": None, "draft": None, "k": None, "delta": None, "lambda": None, "semantics": None,
    "mean_accepted_length": 1.0, "tv_realised_mean": None, "tv_realised_max": None, "speedup": None, "fid": None,
    "clip_score": None,
}


def acceptance_summary(samples: list[dict[str, torch.Tensor]]) -> dict:
    """Run-level acceptance figures from the decoders' per-sample tensors.

    ``mean_accepted_length`` is tau: tokens produced after the first one divided by target steps,
    over all images (1.0 for plain AR). A speculative decoder adds ``acceptance_histogram`` (steps
    that accepted 0, 1, ... draft tokens); ``tv_realised_mean`` / ``tv_realised_max``: the total
    variation between the target and the law each token was actually drawn from, over the tokens
    where it was measured (``tv_realised_coverage`` of them; 0 for exact rules); and
    ``merged_mass_mean`` / ``merged_mass_max``: the mass a relaxation moved onto each accepted draft
    token (what older records called ``tv_mean`` / ``tv_max``).
    """
    if not samples or any("steps" not in s for s in samples):
        return {}
    steps = sum(int(s["steps"].sum()) for s in samples)
    tokens = sum(int(s["tokens"].sum()) for s in samples)
    summary = {"mean_accepted_length": tokens / max(1, steps), "target_steps": steps}
    if all("histogram" in s for s in samples):
        summary["acceptance_histogram"] = [int(v) for v in sum(s["histogram"].sum(0) for s in samples)]
        drafts = sum(int(s["accepted_drafts"].sum()) for s in samples)
        measured = sum(int(s["tv_measured"].sum()) for s in samples)
        summary["tv_realised_mean"] = (sum(float(s["tv_realised_sum"].sum()) for s in samples) / measured) if measured else None
        summary["tv_realised_max"] = max(float(s["tv_realised_max"].max()) for s in samples) if measured else None
        summary["tv_realised_coverage"] = measured / max(1, tokens)
        summary["merged_mass_mean"] = sum(float(s["merged_sum"].sum()) for s in samples) / max(1, drafts)
        summary["merged_mass_max"] = max(float(s["merged_max"].max()) for s in samples)
    return summary


class GenerationJob:
    """Generate ``num_images`` images (image ``i`` from prompt ``i % len(prompts)``) in batches.

    Latency per image is the decode time of its batch divided by the batch size, measured from after
    text encoding to the last token (VQ decoding excluded), with device synchronisation, after
    ``warmup`` untimed batches. With a ``baseline`` decoder (plain AR) of another kind, every
    ``baseline_every``-th batch is also decoded by the baseline, interleaved and alternating which goes
    first, and ``speedup`` is the ratio of the two decode times over those same batches. With
    ``baseline_run`` (a finished run's folder) it is the ratio to that run's recorded latency, checked
    first to share this run's setting and machine (:mod:`lantern.baselines`).
    """

    def __init__(
        self, bundle: ModelBundle, decoder, prompts: PromptSet, num_images: int, batch_size: int, seed: int,
        warmup: int = 1, save_grid: bool = True, progress: bool = True, baseline=None, baseline_every: int = 1,
        baseline_run: str | None = None, metrics=None, tracker=None,
    ):
        for name, value, low in (("num_images", num_images, 1), ("batch_size", batch_size, 1), ("warmup", warmup, 0),
                                 ("speedup_every", baseline_every, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ConfigError(f"{name}={value!r} must be an integer >= {low}")
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ConfigError(f"seed={seed!r} must be an integer >= 0")
        if prompts.kind != bundle.conditioner.kind:
            raise ConfigError(
                f"prompt set {prompts.name!r} holds {prompts.kind} prompts but model {bundle.name!r} "
                f"takes {bundle.conditioner.kind} prompts"
            )
        self.bundle, self.decoder, self.prompts = bundle, decoder, prompts
        self.num_images, self.batch_size, self.seed = num_images, batch_size, seed
        self.warmup, self.save_grid, self.progress = warmup, save_grid, progress
        if baseline is not None and baseline_run is not None:
            raise ConfigError("speedup_baseline and speedup_baseline_run are both set; set speedup_baseline=null "
                              "to compare with the recorded run")
        self.baseline, self.baseline_every, self.baseline_run = baseline, baseline_every, baseline_run
        self.metrics = dict(metrics or {})  # name -> callable(run_dir, prompts, labels) -> dict
        self.tracker = tracker  # e.g. lantern.tracking.WandbLogger: gets the finished record
        self.items = prompts.for_images(num_images)
        self.labels = prompts.labels_for_images(num_images)
        for prompt in self.items:
            bundle.conditioner.check(prompt)

    def _decode(self, indices: list[int], decoder=None):
        bundle = self.bundle
        decoder = decoder or self.decoder
        condition = bundle.conditioner.encode([self.items[i] for i in indices])
        keys = keys_tensor(self.seed, indices, bundle.device)
        synchronize(bundle.device)
        start = time.perf_counter()
        result = decoder.generate(bundle.gpt, condition, keys)
        synchronize(bundle.device)
        return result, time.perf_counter() - start

    def _setting(self) -> dict:
        """The record's setting entries: what makes two runs' latencies comparable (besides the machine)."""
        sampling = self.decoder.sampling
        return {"model": self.bundle.name, "prompts": self.prompts.name, "num_images": self.num_images,
                "batch_size": self.batch_size, "seed": self.seed,
                **{key: getattr(sampling, key) for key in ("temperature", "top_k", "top_p", "cfg_scale")}}

    def _compares(self) -> bool:
        """Whether the baseline is timed beside the decoder (not when the decoder is the baseline itself)."""
        return self.baseline is not None and type(self.baseline) is not type(self.decoder)

    def _speedup(self, seconds: float, baseline_seconds: float, images: int, compared: int, batches: int) -> dict:
        """``seconds`` and ``baseline_seconds``: both decoders' times over the ``compared`` batches (``images``)."""
        if self._compares():
            return {"speedup": baseline_seconds / seconds, "baseline_latency_s_per_image": baseline_seconds / images,
                    "compared_latency_s_per_image": seconds / images,
                    "speedup_baseline": f"{self.baseline.name}, interleaved in this run on {compared} of {batches} "
                                        "batches (same prompts and seeds)"}
        if self.baseline is not None:
            return {"speedup": 1.0, "speedup_baseline": "this run is the baseline"}
        return {}

    def run(self, out_dir: str | Path, config: dict | None = None) -> dict:
        """Write ``000000.png`` ..., ``grid.png`` and ``metrics.json`` into ``out_dir``; return the metrics."""
        out_dir = Path(out_dir)
        bundle = self.bundle
        recorded = None
        if self.baseline_run is not None:  # checked before anything is generated or written
            recorded = read_baseline_run(self.baseline_run, self._setting(), environment(bundle.device))
        batches = [list(range(s, min(s + self.batch_size, self.num_images))) for s in range(0, self.num_images, self.batch_size)]
        for _ in range(self.warmup):
            self._decode(batches[0])
            if self._compares():
                self._decode(batches[0], self.baseline)
        baseline_seconds = compared_seconds = 0.0
        compared = compared_images = 0
        if bundle.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(bundle.device)
        out_dir.mkdir(parents=True, exist_ok=True)
        per_image, grid_images, stats, samples = [], [], {}, []
        tokens_per_image = bundle.gpt.config.num_image_tokens
        bar = tqdm(batches, desc=f"{self.decoder.name} x{self.num_images}", unit="batch", disable=not self.progress)
        for number, indices in enumerate(bar):
            timed = self._compares() and number % self.baseline_every == 0
            if timed and compared % 2:  # alternate which goes first, so drift hits both alike
                baseline_seconds += self._decode(indices, self.baseline)[1]
            result, seconds = self._decode(indices)
            if timed and not compared % 2:
                baseline_seconds += self._decode(indices, self.baseline)[1]
            if timed:
                compared, compared_images, compared_seconds = compared + 1, compared_images + len(indices), compared_seconds + seconds
            pixels = bundle.decode_images(result.codes).cpu().numpy()  # (B, H, W, 3)
            samples.append(result.per_sample)
            for position, (index, image) in enumerate(zip(indices, pixels)):
                save_png(image, out_dir / image_name(index))
                row = {"index": index, "prompt": self.items[index], "latency_s": seconds / len(indices)}
                if "steps" in result.per_sample:
                    steps = int(result.per_sample["steps"][position])
                    row["steps"] = steps
                    row["mean_accepted_length"] = int(result.per_sample["tokens"][position]) / max(1, steps)
                if self.labels is not None:
                    row["label"] = self.labels[index]
                per_image.append(row)
                if len(grid_images) < 64:
                    grid_images.append(image)
            for key, value in result.stats.items():
                stats[key] = stats.get(key, 0.0) + value
        if self.save_grid:
            labels = [str(self.items[i]) for i in range(len(grid_images))]
            labelled_grid(grid_images, labels).save(out_dir / "grid.png")
        latencies = [row["latency_s"] for row in per_image]
        total = sum(latencies)
        metrics = {
            "decoding": self.decoder.name,
            **RECORD_DEFAULTS,
            **self.decoder.describe(),
            **self._setting(),
            "cfg_interval": self.decoder.sampling.cfg_interval,
            "tokens_per_image": tokens_per_image,
            "latency_s_per_image": total / len(latencies),
            "latency_s_median": statistics.median(latencies),
            "tokens_per_s": tokens_per_image * len(latencies) / total,
            "peak_memory_mb": peak_memory_mb(bundle.device),
            **(self._speedup(compared_seconds, baseline_seconds, compared_images, compared, len(batches)) if recorded is None
               else recorded_speedup(recorded, self.baseline_run, total / len(latencies))),
            **acceptance_summary(samples),
            "decode_stats": stats,
            "per_image": per_image,
            "environment": environment(bundle.device),
            "config": config or {},
        }
        for evaluate in self.metrics.values():
            metrics.update(evaluate(out_dir, self.items, self.labels))
        write_json_atomic(out_dir / "metrics.json", metrics)
        if self.tracker is not None:
            self.tracker.log_run(out_dir, metrics)
        return metrics
