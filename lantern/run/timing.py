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
