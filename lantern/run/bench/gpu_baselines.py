"""The GPU check's baselines and batch sweep (``scripts/gpu_check.py``): per target, the reference-grade AR
(LlamaGen's own ``generate()`` over the same weights, eager, where a LlamaGen checkout is found) beside the
engine-grade AR, the CUDA-graph mode beside plain compilation, and a short batch sweep (AR, exact chain, LANTERN
delta 0.1 at each ``--batches`` size: latency per image, images per second, peak memory, speed-up over AR at the
same batch). Decoders are composed from conf/ as everywhere (:func:`lantern.run.bench.gpu_check.decoders`).
"""

from __future__ import annotations

import statistics

import torch
from hydra.utils import instantiate

from lantern.errors import ConfigError
from lantern.models.condition import Condition
from lantern.models.sampling import SamplingConfig
from lantern.rng import keys_tensor
from lantern.run.compose import compose_config
from lantern.run.timing import peak_memory_mb, timed


def family_reference(target, code):
    """The reference-grade AR of ``target`` (its model config's ``reference_ar``, built on its weights), or None and
    why not. The world and the random GPT-XL are LlamaGen targets: LlamaGen's own generate() (a checkout)."""
    node = compose_config(target.overrides).model.get("reference_ar")
    if node is None:
        return None, "the model names no reference-grade AR"
    bundle = type("Bundle", (), {"target": target.model, "name": target.name})()
    try:
        return instantiate(node)(bundle=bundle, code=code), None
    except ConfigError as exc:
        return None, str(exc)


def reference_row(target, args, device, sampling: SamplingConfig, engine_s: float) -> dict:
    """The reference-grade AR's row: median seconds per image over ``args.images`` images (after one warm-up),
    its speed relative to the engine-grade AR and whether its greedy codes equal ours (or why it is absent)."""
    reference, why = family_reference(target, getattr(args, "llamagen", None))
    if reference is None:
        return {"mode": "ar reference", "skipped": why}
    conditions = target.conditions
    reference.generate(conditions[0], sampling, 0)  # warm-up (their caches are set up per call)
    times = [timed(lambda i=i: reference.generate(conditions[i], sampling, i), device)[0] for i in range(args.images)]
    greedy = SamplingConfig(temperature=0, cfg_scale=sampling.cfg_scale)
    theirs = reference.generate(conditions[1], greedy, 0)
    from lantern.decoding.ar import ARDecoder

    ours = ARDecoder(greedy).generate(target.model, conditions[1], keys_tensor(0, [1], device)).codes
    latency = statistics.median(times)
    return {
        "mode": "ar reference",
        "code": f"{reference.label} at {str(reference.commit)[:7]}",
        "compile": "none",
        "latency_ms": latency * 1000,
        "s_per_image": latency,
        "min_ms": min(times) * 1000,
        "max_ms": max(times) * 1000,
        "engine_ar_over_reference_ar": latency / engine_s,
        "greedy_codes_equal_ours": bool(torch.equal(theirs.to(ours.device), ours)),
    }


def batched(conditions: list[Condition], start: int, size: int) -> Condition:
    """``size`` conditions from ``start`` (cycling) stacked into one batch."""
    chosen = [conditions[(start + i) % len(conditions)] for i in range(size)]
    return Condition(torch.cat([c.values for c in chosen]), torch.cat([c.mask for c in chosen]))


def batch_sweep(target, modes: dict, args, device) -> list[dict]:
    """Per batch size of ``args.batches`` and mode of ``modes`` (label -> decoder, AR first): median seconds per
    batch over two batches after one warm-up, interleaved mode by mode; latency per image, images/s, peak memory
    and the speed-up over AR at that batch."""
    rows = []
    ar_label = next(iter(modes))
    for size in args.batches:
        keys = [keys_tensor(0, range(b * size, (b + 1) * size), device) for b in range(3)]
        inputs = [batched(target.conditions, b * size, size) for b in range(3)]
        times, memory = {label: [] for label in modes}, {}
        for decoder in modes.values():
            decoder.generate(target.model, inputs[0], keys[0])  # warm-up, compilation at this shape
        for b in (1, 2):
            for label, decoder in modes.items():
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                given, key = inputs[b], keys[b]
                seconds = timed(lambda d=decoder, x=given, k=key: d.generate(target.model, x, k), device)[0]
                times[label].append(seconds)
                memory[label] = max(memory.get(label, 0.0), peak_memory_mb(device))
        ar = statistics.median(times[ar_label])
        for label in modes:
            seconds = statistics.median(times[label])
            rows.append(
                {
                    "batch": size,
                    "mode": label,
                    "ms_per_image": 1000 * seconds / size,
                    "images_per_s": size / seconds,
                    "peak_memory_mb": memory[label],
                    "speedup_vs_ar_same_batch": ar / seconds,
                }
            )
    return rows


def markdown_lines(result: dict) -> list[str]:
    """The report's lines for a target's reference row and batch sweep (none when absent)."""
    lines = []
    reference = result.get("reference")
    if reference is not None and "skipped" in reference:
        lines += [f"Reference-grade AR: not timed ({reference['skipped']}).", ""]
    elif reference is not None:
        lines += [
            f"Reference-grade AR ({reference['code']}, eager): {reference['latency_ms']:.1f} ms/image "
            f"({reference['min_ms']:.1f}-{reference['max_ms']:.1f}); engine-grade AR over it: "
            f"{reference['engine_ar_over_reference_ar']:.2f}x; greedy codes equal ours: {reference['greedy_codes_equal_ours']}",
            "",
        ]
    if result.get("batch_sweep"):
        lines += [
            "| batch | mode | ms/image | images/s | peak memory MiB | speed-up vs AR (same batch) |",
            "|---|---|---|---|---|---|",
        ]
        for r in result["batch_sweep"]:
            lines.append(
                f"| {r['batch']} | {r['mode']} | {r['ms_per_image']:.1f} | {r['images_per_s']:.2f} | "
                f"{r['peak_memory_mb']:.0f} | {r['speedup_vs_ar_same_batch']:.2f}x |"
            )
        lines.append("")
    return lines
