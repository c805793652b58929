"""Timing shared by the generation job and the benchmarks: device synchronisation, peak memory, spreads."""

from __future__ import annotations

import resource
import statistics

import torch


def synchronize(device: torch.device) -> None:
    """Wait for queued device work, so wall-clock times cover it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory_mb(device: torch.device) -> float:
    """Peak device memory (CUDA) or peak resident set size of this process (CPU), in MiB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def quartiles(values) -> list[float]:
    """[q1, q3] of ``values`` (inclusive method; one value gives [v, v])."""
    values = list(values)
    if len(values) == 1:
        return [values[0], values[0]]
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return [q1, q3]


def ratio_of_totals(numerator, denominator) -> tuple[float, list[float]]:
    """Two sides' times, each (item, run) nested lists of seconds, interleaved run by run: (the ratio of their
    totals over every item and run, the same ratio run by run). The first is a mediant of the second, so it
    always lies within their range (a ratio of per-item medians need not)."""
    runs = len(numerator[0])
    top = [sum(t[j] for t in numerator) for j in range(runs)]  # run j, every item
    bottom = [sum(t[j] for t in denominator) for j in range(runs)]
    return sum(top) / sum(bottom), [a / b for a, b in zip(top, bottom, strict=True)]
