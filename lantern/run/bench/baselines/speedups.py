"""A run's speed-ups over its baselines, from the batches timed beside them, and what the baselines cost.

Each timed batch carries the decoder's seconds and, per baseline timed on it, that baseline's seconds under its
key (``baseline_seconds``: the engine-grade AR, ``reference_seconds``: the reference-grade AR). A speed-up is
the ratio of summed times over the batches that baseline timed, its spread the quartiles of per-batch ratios.
"""

from __future__ import annotations

import statistics

from lantern.results.spread import quartiles

# Record entries per baseline: the engine-grade AR keeps the names records had before version 5.
ENTRIES = {
    "baseline_seconds": {
        "speedup": "speedup",
        "latency": "baseline_latency_s_per_image",
        "median": "speedup_median",
        "iqr": "speedup_iqr",
        "described": "speedup_baseline",
    },
    "reference_seconds": {
        "speedup": "speedup_reference",
        "latency": "reference_latency_s_per_image",
        "median": "speedup_reference_median",
        "iqr": "speedup_reference_iqr",
        "described": "speedup_reference_baseline",
    },
}


def speedup_entries(batches: list[dict], key: str, name: str) -> dict:
    """The record entries of the speed-up over the baseline whose seconds each batch holds under ``key``."""
    names = ENTRIES[key]
    compared = [b for b in batches if b.get(key) is not None]
    if not compared:
        return {names["described"]: f"{name}: no batch was decoded by this process, so none was timed"}
    seconds = sum(b["seconds"] for b in compared)
    baseline_seconds = sum(b[key] for b in compared)
    images = sum(b["images"] for b in compared)
    ratios = [b[key] / b["seconds"] for b in compared]
    entries = {
        names["speedup"]: baseline_seconds / seconds,
        names["latency"]: baseline_seconds / images,
        names["median"]: statistics.median(ratios),
        names["iqr"]: quartiles(ratios),
        names["described"]: f"{name}, interleaved in this run on {len(compared)} of {len(batches)} "
        "batches (same prompts and seeds)",
    }
    if key == "baseline_seconds":
        entries["compared_latency_s_per_image"] = seconds / images
    return entries


def greedy_check(compared: int, equal: int, against: str | None, greedy: bool) -> dict:
    """The record's ``reference_greedy_check``: in greedy mode, how many images the reference-grade AR decoded
    and how many of them have exactly the codes of ``against`` (our engine-grade AR, or a lossless decoder)."""
    if not greedy:
        return {"checked": False, "why": "sampled: the reference draws from its own generator, not our keys"}
    if against is None:
        return {"checked": False, "why": "no lossless decoder of ours decoded the same batches"}
    return {"checked": True, "against": against, "images": compared, "equal": equal, "all_equal": compared == equal}


def baseline_cost(costs: dict) -> dict:
    """``baseline_cost_s``: per baseline, seconds spent outside the decoder's timed steps (setup, warm-up) and
    inside its own timed batches, so a reader sees what timing both baselines added to the run."""
    return {name: {key: round(value, 6) for key, value in entry.items()} for name, entry in costs.items()}
