"""The AR sampler: inverse CDF on one counter-based uniform per row."""

import torch
from scipy.stats import chisquare

from lantern.models.sampling import sample
from lantern.rng import keys_tensor


def test_sample_draws_the_distribution_and_never_a_zero_mass_token():
    probs = torch.tensor([0.5, 0.0, 0.2, 0.25, 0.0, 0.05])
    keys = keys_tensor(3, range(20000))
    tokens = sample(probs.expand(len(keys), -1), keys, 7)
    counts = torch.bincount(tokens, minlength=6)
    assert counts[1] == 0 and counts[4] == 0
    support = probs > 0
    assert chisquare(counts[support].numpy(), (probs[support] * len(keys)).numpy()).pvalue > 1e-3


def test_a_wrong_sampler_fails_the_same_check():
    probs = torch.tensor([0.5, 0.0, 0.2, 0.25, 0.0, 0.05])
    keys = keys_tensor(3, range(20000))
    tilted = torch.tensor([0.45, 0.0, 0.22, 0.27, 0.0, 0.06])
    counts = torch.bincount(sample(tilted.expand(len(keys), -1), keys, 7), minlength=6)
    support = probs > 0
    assert chisquare(counts[support].numpy(), (probs[support] * len(keys)).numpy()).pvalue < 1e-6


def test_a_row_draw_does_not_depend_on_its_batch():
    torch.manual_seed(0)
    probs = torch.rand(6, 50).softmax(-1)
    keys = keys_tensor(1, range(6))
    together = sample(probs, keys, 4)
    alone = torch.cat([sample(probs[i : i + 1], keys[i : i + 1], 4) for i in range(6)])
    assert torch.equal(together, alone)
    assert not torch.equal(sample(probs, keys, 5), together)  # the step changes the draw
