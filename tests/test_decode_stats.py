"""Per-image decode statistics: a typed object read like the mapping it replaced, stored per image and
summarised per run."""

import pytest
import torch

from lantern.decoding.stats import DecodeStats, acceptance_summary, exact_law
from lantern.results.spread import quartiles


def speculative(steps, histogram, tv_sum, measured):
    batch = len(steps)
    return DecodeStats(
        steps=torch.tensor(steps),
        tokens=torch.full((batch,), 9),
        tv_realised_sum=torch.tensor(tv_sum, dtype=torch.float64),
        tv_realised_max=torch.tensor(tv_sum, dtype=torch.float64),
        tv_measured=torch.tensor(measured),
        histogram=torch.tensor(histogram),
        merged_sum=torch.zeros(batch, dtype=torch.float64),
        merged_max=torch.zeros(batch, dtype=torch.float64),
        accepted_drafts=torch.tensor([sum(i * n for i, n in enumerate(row)) for row in histogram]),
    )


def test_fields_that_are_not_set_are_not_entries():
    stats = exact_law(torch.tensor([9, 9]), 10)
    assert "tv_measured" in stats and "histogram" not in stats and "nonsense" not in stats
    assert stats.keys() == ["steps", "tokens", "tv_realised_sum", "tv_realised_max", "tv_measured"]
    with pytest.raises(KeyError):
        stats["histogram"]
    assert stats["tv_measured"].tolist() == [9, 9]


def test_stored_images_stack_back_and_summarise_over_the_run():
    stats = speculative([5, 3], [[2, 2, 1], [0, 1, 2]], [0.5, 0.25], [9, 8])
    images = [stats.image(0), stats.image(1)]
    assert images[1]["histogram"].tolist() == [0, 1, 2]
    again = DecodeStats.stack(images)
    assert torch.equal(again.histogram, stats.histogram) and again.skipped_tokens is None
    summary = acceptance_summary(again)
    assert summary["mean_accepted_length"] == 18 / 8 and summary["target_steps"] == 8
    assert summary["acceptance_histogram"] == [2, 3, 3] and summary["tv_realised_mean"] == 0.75 / 17
    assert summary["tv_realised_coverage"] == 17 / 18 and summary["merged_mass_mean"] == 0.0
    assert DecodeStats.stack([images[0], {"tokens": torch.tensor(9)}]) is None and acceptance_summary(None) == {}


def test_an_image_without_a_field_leaves_it_out_of_the_stack():
    ar, zipar = exact_law(torch.tensor([9]), 10), DecodeStats(steps=torch.tensor([4]), tokens=torch.tensor([9]))
    both = DecodeStats.stack([ar.image(0), zipar.image(0)])
    assert both.tv_measured is None and both.steps.tolist() == [9, 4]
    assert acceptance_summary(both) == {"mean_accepted_length": 18 / 13, "target_steps": 13}


def test_one_quartiles():
    assert (
        quartiles([]) is None and quartiles([2.0]) == [2.0, 2.0] and quartiles([1.0, 2.0, 3.0, 4.0, 5.0]) == [2.0, 4.0]
    )
