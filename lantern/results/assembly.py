"""Record assembly: a generation run's record from its parts, built once.

The job hands over what it measured (every rank's timing part, each image's stored statistics, the
speed-up entries) and what its metrics returned; :func:`assemble_record` derives the timing figures and
the acceptance summary, merges the metrics' entries last (they may refine any entry) and validates the
whole as the current schema version in one :func:`~lantern.results.record.build_record`.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field

from lantern.decoding.api import DecoderSettings
from lantern.decoding.stats import DecodeStats, acceptance_summary
from lantern.results.record import LOSSY_UNMEASURED, RunRecord, build_record
from lantern.results.spread import quartiles


@dataclass
class RunParts:
    """What a generation run measured and chose.

    ``settings`` the decoder's; ``setting`` the entries that make runs comparable (model, prompts, sampling,
    dtype...); ``parts`` every rank's timing (``rank``, ``images``, ``decode_s``, ``wall_s``,
    ``peak_memory_mb``, ``stats`` summed decoder counters, ``batches`` with ``indices``, ``images``,
    ``seconds``, ``baseline_seconds``); ``images`` each image's stored statistics (:meth:`DecodeStats.image`),
    in image order; ``prompt_ids`` and ``labels`` (None: unlabelled) per image; ``speedup`` the speed-up
    entries; ``details`` everything else the record keeps as it is (protocol, inputs, environment, config,
    distinct prompts).
    """

    settings: DecoderSettings
    setting: dict
    parts: list[dict]
    images: list[Mapping]
    prompt_ids: list[int]
    tokens_per_image: int
    labels: list | None = None
    speedup: dict = field(default_factory=dict)
    details: dict = field(default_factory=dict)


def per_image_rows(run: RunParts, latency: Mapping[int, float]) -> list[dict]:
    """One row per image: its prompt, latency (its batch's time over the batch), steps and tau where kept."""
    rows = []
    for index, stats in enumerate(run.images):
        row = {"index": index, "prompt_id": run.prompt_ids[index], "latency_s": latency.get(index)}
        if "steps" in stats:
            steps = int(stats["steps"])
            row["steps"] = steps
            row["mean_accepted_length"] = int(stats["tokens"]) / max(1, steps)
        if run.labels is not None:
            row["label"] = run.labels[index]
        rows.append(row)
    return rows


def timing_fields(run: RunParts) -> dict:
    """Latency, throughput and memory of the images this process decoded, its ranks and batches."""
    batches = [b for part in run.parts for b in part["batches"]]
    latency = {index: b["seconds"] / b["images"] for b in batches for index in b["indices"]}
    decoded, total = len(latency), sum(b["seconds"] for b in batches)
    kept = len(run.images) - decoded
    counters: dict[str, float] = {}
    for part in run.parts:
        for key, value in part["stats"].items():
            counters[key] = counters.get(key, 0.0) + value
    covers = f"the {decoded} images decoded by the last process"
    return {
        "latency_s_per_image": total / decoded if decoded else None,
        "latency_s_median": statistics.median(latency.values()) if decoded else None,
        "latency_s_iqr": quartiles(b["seconds"] / b["images"] for b in batches) if decoded else None,
        "tokens_per_s": run.tokens_per_image * decoded / total if decoded else None,
        "peak_memory_mb": max(part["peak_memory_mb"] for part in run.parts),
        "world_size": len(run.parts),
        "ranks": [
            {key: part[key] for key in ("rank", "images", "decode_s", "wall_s", "peak_memory_mb")} for part in run.parts
        ],
        "timing": {
            "images_decoded": decoded,
            "images_kept": kept,
            "covers": covers + (f"; {kept} finished earlier were kept, untimed" if kept else ""),
        },
        "decode_stats": counters,
        "per_image": per_image_rows(run, latency),
        "per_batch": [
            {
                key: b.get(key)
                for key in ("rank", "indices", "seconds", "baseline_seconds", "reference_seconds")
                if key in b
            }
            for b in batches
        ],
    }


def assemble_record(run: RunParts, metrics: Mapping | None = None) -> RunRecord:
    """The run record: decoder, setting, timing, speed-up, acceptance, then the ``metrics``' entries; one build.
    A lossy decoder that measures no TV (ZipAR) says so in ``tv_realised_note``."""
    acceptance = acceptance_summary(DecodeStats.stack(list(run.images)))
    lossless = run.settings.lossless()
    unmeasured = not lossless and acceptance.get("tv_realised_mean") is None
    return build_record(
        {
            "decoding": run.settings.name,
            "compile": run.settings.compile,
            "settings": run.settings.to_json(),
            "lossless": lossless,
            "tv_realised_note": LOSSY_UNMEASURED if unmeasured else None,
            **run.setting,
            "tokens_per_image": run.tokens_per_image,
            **timing_fields(run),
            **run.speedup,
            **acceptance,
            **run.details,
            **(metrics or {}),
        }
    )
