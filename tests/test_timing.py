"""The speed-up statistic the benchmarks share: a ratio of total times, inside the range of its runs."""

import random
import statistics

from lantern.run.timing import ratio_of_totals


def test_ratio_of_totals_and_its_runs():
    ar = [[1.0, 2.0], [3.0, 4.0]]  # (image, run)
    mode = [[0.5, 1.0], [1.0, 3.0]]
    ratio, runs = ratio_of_totals(ar, mode)
    assert runs == [4.0 / 1.5, 6.0 / 4.0]
    assert ratio == 10.0 / 5.5


def test_the_ratio_lies_within_its_runs_where_a_ratio_of_medians_does_not():
    rng = random.Random(0)
    outside = 0
    for _ in range(200):
        ar = [[rng.uniform(0.2, 0.6) for _ in range(3)] for _ in range(6)]
        mode = [[rng.uniform(0.1, 0.5) for _ in range(3)] for _ in range(6)]
        ratio, runs = ratio_of_totals(ar, mode)
        assert min(runs) - 1e-12 <= ratio <= max(runs) + 1e-12
        medians = statistics.mean(map(statistics.median, ar)) / statistics.mean(map(statistics.median, mode))
        outside += not min(runs) <= medians <= max(runs)
    assert outside > 0  # the statistic the benchmarks printed before: it can leave its own spread


def test_timed_returns_the_result_and_covers_the_call():
    import time

    import torch

    from lantern.run.timing import timed

    seconds, result = timed(lambda: time.sleep(0.05) or "done", torch.device("cpu"))
    assert result == "done" and 0.05 <= seconds < 5
