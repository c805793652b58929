"""The sweep's report: per-token step indices of every decoder, the page beside the table, and how it looks."""

import pytest
import torch
from test_run import REPO

from lantern.decoding.stats import run_lengths

DECODERS = {
    "ar": ["decoding=ar"],
    "eagle": ["decoding=eagle"],
    "lantern": ["decoding=lantern"],
    "sjd": ["decoding=sjd"],
    "gsd": ["decoding=gsd"],
    "sjd_pp": ["decoding=sjd_pp"],
    "zipar": ["decoding=zipar", "window=4"],
    "vvs": ["decoding=vvs"],
}


def world_decode(overrides):
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "conf")):
        cfg = compose("config", overrides=["device=cpu", "dtype=float32", *overrides])
    bundle = instantiate(cfg.model.bundle)
    prompts = instantiate(cfg.prompts).items
    result = instantiate(cfg.decoding).generate(
        bundle.target, bundle.conditioner.encode(prompts[:2]), torch.tensor([3, 4])
    )
    return result, bundle.target.config


@pytest.mark.parametrize("name", list(DECODERS))
def test_every_token_names_the_step_that_emitted_it(name):
    result, cfg = world_decode(DECODERS[name])
    stats = result.per_sample
    steps = stats.token_steps.long()  # (B, N)
    assert steps.shape == result.codes.shape and (steps[:, 0] == 0).all()  # token 0: the prefill
    side = cfg.grid_size
    if name == "zipar":  # emitted row by row in parallel: in order along each grid row, rows start later and later
        rows = steps.view(steps.shape[0], -1, side)
        assert (rows[:, :, 1:] >= rows[:, :, :-1]).all()
        assert (rows[:, 1:, 0] > rows[:, :-1, 0]).all()
        assert (steps.amax(1) < steps.shape[1] - 1).all()  # fewer steps than raster AR
    else:  # raster order: a step's tokens follow the previous step's
        assert (steps[:, 1:] >= steps[:, :-1]).all()
    distinct = torch.tensor([len(set(row[1:].tolist())) for row in steps])
    # VVS numbers its skip steps too: they emit tokens without a target forward, so the distinct steps are
    # the target-forward steps plus the skip steps that committed this image's tokens.
    expected = stats.steps + (stats.skip_steps if name == "vvs" else 0)
    assert distinct.tolist() == expected.tolist()
    lengths = run_lengths(steps)
    assert (lengths[:, 1:] >= 1).all() and (lengths[:, 1:] <= steps.shape[1] - 1).all()
    if name == "ar":
        assert (lengths[:, 1:] == 1).all()
    if "histogram" in stats and name != "vvs":  # a step that accepted a drafts emitted a run of a + 1 tokens
        for row, histogram in zip(steps, stats.histogram, strict=True):
            runs = torch.bincount(torch.bincount(row[1:])[1:], minlength=histogram.numel() + 1)[1:]
            # the same steps; only the last may have emitted fewer (its tokens past the image are cut)
            assert runs.sum() == histogram.sum() and (runs - histogram).abs().sum() <= 2
