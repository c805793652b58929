"""Bootstrap intervals over prompts (lantern.metrics.intervals)."""

import numpy as np
import pytest

from lantern.errors import ConfigError
from lantern.metrics.intervals import Interval, bootstrap, bootstrap_mean, interval_fields, resample_indices


def test_mean_interval_has_the_normal_width_and_covers_the_mean():
    scores = np.random.default_rng(1).normal(0.3, 0.05, size=400)  # (N,) per-prompt scores
    ci = bootstrap_mean(scores, resamples=2000)
    expected = 1.96 * scores.std(ddof=1) / np.sqrt(len(scores))  # the normal approximation's half-width
    assert ci.lo < scores.mean() < ci.hi
    assert ci.half_width == pytest.approx(expected, rel=0.1)


def test_a_statistic_sees_the_same_draws_as_the_vectorised_mean():
    scores = np.random.default_rng(2).uniform(size=50)
    fast = bootstrap_mean(scores, resamples=300, seed=7, scale=100.0)
    slow = bootstrap(len(scores), lambda rows: 100.0 * scores[rows].mean(), resamples=300, seed=7)
    assert (fast.lo, fast.hi) == pytest.approx((slow.lo, slow.hi), rel=1e-12)
    assert fast.to_json() == {**slow.to_json(), "lo": fast.lo, "hi": fast.hi}


def test_draws_are_a_pure_function_of_seed_and_size():
    assert np.array_equal(resample_indices(10, 5, seed=3), resample_indices(10, 5, seed=3))
    assert not np.array_equal(resample_indices(10, 5, seed=3), resample_indices(10, 5, seed=4))
    assert resample_indices(10, 5).shape == (5, 10)


def test_more_prompts_narrow_the_interval():
    rng = np.random.default_rng(5)
    wide = bootstrap_mean(rng.normal(size=25), resamples=500)
    narrow = bootstrap_mean(rng.normal(size=2500), resamples=500)
    assert narrow.half_width < wide.half_width / 5


def test_record_entries_and_refusals():
    ci = bootstrap_mean(np.arange(10.0), resamples=100)
    fields = interval_fields("clip_score", 4.5, ci)
    assert fields["clip_score"] == 4.5 and fields["clip_score_ci"]["resamples"] == 100
    assert fields["clip_score_ci"]["method"] == "percentile bootstrap over prompts"
    with pytest.raises(ConfigError, match="resamples"):
        bootstrap_mean(np.arange(3.0), resamples=1)
    with pytest.raises(ConfigError, match="level"):
        bootstrap_mean(np.arange(3.0), level=1.5)
    with pytest.raises(ValueError):
        Interval(2.0, 1.0, 0.95, 10, 0)
