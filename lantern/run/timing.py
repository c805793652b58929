"""Timing shared by the generation job and the benchmarks: one :func:`timed` call, peak memory, ratios.

Every wall-clock time of a decode (the job's batches, the benchmarks' images and steps) is taken by
:func:`timed`: the device's queued work is waited for before the clock starts and before it stops.
Spreads of the times (``quartiles``) are :mod:`lantern.results.spread`'s.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")


def synchronize(device: torch.device) -> None:
    """Wait for queued device work, so wall-clock times cover it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], T], device: torch.device) -> tuple[float, T]:
    """``(seconds, fn())``: wall-clock seconds of ``fn()``, synchronising ``device`` before and after."""
    synchronize(device)
    start = time.perf_counter()
    result = fn()
    synchronize(device)
    return time.perf_counter() - start, result


def peak_memory_mb(device: torch.device) -> float:
    """Peak device memory (CUDA) or peak resident set size of this process (CPU), in MiB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def ratio_of_totals(numerator, denominator) -> tuple[float, list[float]]:
    """Two sides' times, each (item, run) nested lists of seconds, interleaved run by run: (the ratio of their
    totals over every item and run, the same ratio run by run). The first is a mediant of the second, so it
    always lies within their range (a ratio of per-item medians need not)."""
    runs = len(numerator[0])
    top = [sum(t[j] for t in numerator) for j in range(runs)]  # run j, every item
    bottom = [sum(t[j] for t in denominator) for j in range(runs)]
    return sum(top) / sum(bottom), [a / b for a, b in zip(top, bottom, strict=True)]
