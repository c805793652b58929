"""Bootstrap confidence intervals for quality figures, resampling prompts.

Every quality figure of a run (FID, CLIP score, precision/recall, HPS, IS, KID, classifier accuracy) is a
statistic of the run's images, one per prompt. Its interval comes from the percentile bootstrap over
prompts: draw ``n`` prompt indices with replacement ``resamples`` times, recompute the statistic on each
draw, and take the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles. Figures measured against fixed
reference data (FID against reference statistics, precision/recall against reference features) resample
the generated side only, so the interval is the uncertainty due to the finite prompt set.

The draws are a pure function of ``(seed, n, resamples)``, so two metrics of one run see the same
resampled prompt sets and a rerun gives the same interval. Results carry their method in the record:
``{name}_ci = {"lo", "hi", "level", "resamples", "seed", "method"}`` beside ``{name}``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from lantern import checks

DEFAULT_LEVEL = 0.95
PERCENTILE = "percentile bootstrap over prompts"
CI_SUFFIX = "_ci"
MAX_RESAMPLES = 10_000
"""The most draws an interval takes: a mean's draws are one (resamples, N) index array (10,000 x 30,000 prompts
is 2.4 GB), a set statistic's each recompute it; the percentile ends settle long before."""


def ci_key(name: str) -> str:
    """The record key of ``name``'s interval (``fid`` -> ``fid_ci``)."""
    return name + CI_SUFFIX


@dataclass(frozen=True)
class Interval:
    """A confidence interval ``[lo, hi]`` at ``level`` and how it was made."""

    lo: float
    hi: float
    level: float
    resamples: int
    seed: int
    method: str = PERCENTILE

    def __post_init__(self) -> None:
        if not (math.isfinite(self.lo) and math.isfinite(self.hi) and self.lo <= self.hi):
            raise ValueError(f"interval [{self.lo}, {self.hi}]: expected finite lo <= hi")

    @property
    def half_width(self) -> float:
        return (self.hi - self.lo) / 2

    def to_json(self) -> dict:
        return asdict(self)


def check_interval_settings(resamples: int, level: float) -> None:
    """Refuse a resample count outside [2, :data:`MAX_RESAMPLES`] or a level outside (0, 1) (one line naming
    the value)."""
    checks.integer("interval resamples", resamples, 2, MAX_RESAMPLES)
    checks.real("interval level", level, 0, 1, low_open=True, high_open=True)


def resample_indices(n: int, resamples: int, seed: int = 0) -> np.ndarray:
    """``(resamples, n)`` prompt indices drawn with replacement; a pure function of its arguments."""
    if n < 1:
        raise ValueError("a bootstrap needs at least one prompt")
    return np.random.default_rng([seed, n, resamples]).integers(0, n, size=(resamples, n))


def _percentiles(values: np.ndarray, level: float) -> tuple[float, float]:
    lo, hi = np.quantile(values, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def bootstrap(
    n: int, statistic: Callable[[np.ndarray], float], resamples: int = 1000, seed: int = 0, level: float = DEFAULT_LEVEL
) -> Interval:
    """Percentile interval of ``statistic(indices)`` over ``resamples`` draws of ``n`` prompt indices.

    ``statistic`` takes an ``(n,)`` int array of (repeated) prompt indices and returns the figure computed
    on those prompts' images, e.g. FID of the selected generated features against fixed reference stats.
    """
    check_interval_settings(resamples, level)
    draws = resample_indices(n, resamples, seed)  # (R, n)
    values = np.array([float(statistic(row)) for row in draws])  # (R,)
    if not np.all(np.isfinite(values)):
        raise ValueError("a bootstrap resample gave a non-finite statistic")
    return Interval(*_percentiles(values, level), level=level, resamples=resamples, seed=seed)


def bootstrap_mean(
    values: np.ndarray, resamples: int = 1000, seed: int = 0, level: float = DEFAULT_LEVEL, scale: float = 1.0
) -> Interval:
    """Interval of ``scale * mean(values)`` for per-prompt scores ``values`` (N,): CLIP, HPS, accuracy.

    Vectorised: the means of all draws come from one gather (``(R, N)`` indices), not a Python loop.
    """
    check_interval_settings(resamples, level)
    scores = np.asarray(values, dtype=np.float64).reshape(-1)  # (N,)
    if not np.all(np.isfinite(scores)):
        raise ValueError("per-prompt scores must be finite")
    means = scale * scores[resample_indices(len(scores), resamples, seed)].mean(axis=1)  # (R,)
    return Interval(*_percentiles(means, level), level=level, resamples=resamples, seed=seed)


def interval_fields(name: str, value: float, interval: Interval) -> dict:
    """The record entries of a figure and its interval: ``{name: value, name_ci: {...}}``."""
    return {name: float(value), ci_key(name): interval.to_json()}
