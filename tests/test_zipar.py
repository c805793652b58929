"""ZipAR (``decoding=zipar``): window = grid width is raster AR token for token, fewer forwards below it with
the step counts the schedule implies, batch invariance, one compiled graph per batch shape, tokens per
forward > 1 on the world, configs, records and bad input."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import CountingBackend, run, text_condition, tiny

from lantern.decoding.api import settings_from_record
from lantern.decoding.ar import ARDecoder
from lantern.decoding.zipar.decoder import default_window, zipar
from lantern.errors import ConfigError
from lantern.models.sampling import SamplingConfig
from lantern.rng import keys_tensor

GREEDY = SamplingConfig(temperature=0, cfg_scale=3.0)
SAMPLED = SamplingConfig(temperature=1.0, cfg_scale=3.0)


def schedule_steps(side: int, rows: int, window: int) -> int:
    """Forwards after the prefill by the rule alone: row 0 runs alone (token 0 from the prefill); row 1
    starts once row 0 is complete, row r >= 2 once row r-1 has ``window`` tokens; one token per row and step."""
    start = [0] * rows
    start[0] = -1  # token 0 of row 0 comes from the prefill
    for r in range(1, rows):
        if r == 1 or window >= side:
            start[r] = start[r - 1] + side  # after the row above is complete
        else:
            start[r] = start[r - 1] + window
    return start[-1] + side


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("cfg_scale", [1.0, 3.0])
def test_a_window_as_wide_as_the_grid_is_raster_ar(sampling, cfg_scale):
    model, _ = tiny()
    sampling = SamplingConfig(temperature=sampling.temperature, cfg_scale=cfg_scale)
    cond, keys = text_condition(), keys_tensor(0, range(4))
    expected = ARDecoder(sampling).generate(model, cond, keys).codes
    side = model.config.grid_size
    result = zipar(sampling, window=side).generate(model, cond, keys)
    assert torch.equal(result.codes, expected)
    assert result.per_sample["steps"].tolist() == [model.config.num_image_tokens - 1] * 4


@pytest.mark.parametrize("window", [1, 2, 3])
def test_narrower_windows_take_the_schedules_steps_and_draw_several_tokens(window):
    model, _ = tiny()
    cond, keys = text_condition(), keys_tensor(0, range(4))
    side = model.config.grid_size
    rows = model.config.num_image_tokens // side
    result = zipar(SAMPLED, window=window).generate(model, cond, keys)
    assert result.per_sample["steps"].tolist() == [schedule_steps(side, rows, window)] * 4
    assert (result.per_sample["tokens_per_step_max"] > 1).all()
    codes = result.codes
    assert codes.shape == (4, model.config.num_image_tokens) and int(codes.min()) >= 0
    assert int(codes.max()) < model.config.vocab_size
    # The first row is decoded before any other starts: raster AR there.
    ar = ARDecoder(SAMPLED).generate(model, cond, keys).codes
    assert torch.equal(codes[:, : 2 * side], ar[:, : 2 * side])  # row 1 starts on the true last token of row 0
    assert not torch.equal(codes, ar)


def test_images_do_not_depend_on_the_batch():
    model, _ = tiny()
    cond, keys = text_condition(), keys_tensor(5, range(4))
    together = zipar(SAMPLED, window=2).generate(model, cond, keys)
    prompts = ("a red shirt", "b", "two words here now", "x y")
    for i in range(4):
        alone = zipar(SAMPLED, window=2).generate(model, text_condition(prompts[i : i + 1]), keys[i : i + 1])
        assert torch.equal(alone.codes[0], together.codes[i])


@pytest.mark.parametrize("sampling", [SAMPLED, GREEDY], ids=["sampled", "greedy"])
def test_zipar_step_captures_as_one_graph_and_matches_eager(sampling):
    model, _ = tiny()
    cond, keys = text_condition(), keys_tensor(0, range(4))
    expected = zipar(sampling, window=2).generate(model, cond, keys)
    backend = CountingBackend()
    decoder = zipar(sampling, window=2, compile="default", backend=backend)
    for _ in range(2):  # a second batch of the same shape reuses the graph
        result = decoder.generate(model, cond, keys)
        assert torch.equal(result.codes, expected.codes)
        assert torch.equal(result.per_sample["steps"], expected.per_sample["steps"])
    assert backend.graphs == 1


def test_zipar_on_the_world_draws_more_than_one_token_per_forward(tmp_path):
    # No window given: the model's default, half the world's 8-token rows (window=4, the image-hash setting).
    knobs = ("tv_audit.reruns=16", "tv_audit.every=16")  # its Monte Carlo TV audit, kept small here
    proc, out = run(tmp_path, "model=fashion_t2i", "decoding=zipar", "num_images=4", "batch_size=2", *knobs)
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    metrics = {**metrics, **settings_from_record(metrics).record()}  # the decoder's knobs, flat
    assert metrics["decoding"] == "zipar" and metrics["window"] == 4 and metrics["draft"] == "next_set"
    assert metrics["mean_accepted_length"] == pytest.approx(63 / schedule_steps(8, 8, 4))
    assert metrics["mean_accepted_length"] > 1.0 and metrics.get("k") is None
    assert metrics["lossless"] is False and metrics["tv_realised_note"] is None  # measured by its audit
    assert metrics["tv_audit"] == "mc" and metrics["tv_realised_mean"] is not None and metrics["tv_realised_se"] > 0
    from lantern.results.tables import load_records

    assert settings_from_record(load_records([out])[0]).method() == "ZipAR-4"


@pytest.mark.parametrize(
    "overrides,message",
    [
        (("model=fashion_t2i", "decoding=zipar", "window=9"), "window=9: expected an integer in [1, 8]"),
        (("decoding=zipar", "window=0"), "window=0: expected an integer >= 1"),
    ],
)
def test_bad_zipar_input_is_one_line_and_writes_nothing(tmp_path, overrides, message):
    proc, out = run(tmp_path, "num_images=2", *overrides)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], proc.stderr
    assert not out.exists()
    with pytest.raises(ConfigError, match="window=2.5"):
        zipar(SAMPLED, window=2.5)


def test_the_default_window_comes_from_the_grid_and_is_recorded():
    # The paper's 16 on grids wider than 16 tokens (LlamaGen-L: 24), else half a row: never raster AR.
    assert [default_window(w) for w in (1, 2, 8, 16, 17, 24, 32)] == [1, 1, 4, 8, 16, 16, 16]
    model, _ = tiny()
    cond, keys = text_condition(), keys_tensor(0, range(4))
    side = model.config.grid_size
    decoder = zipar(SAMPLED)
    assert decoder.settings.window is None and decoder.settings.method() == "ZipAR"
    result = decoder.generate(model, cond, keys)
    explicit = zipar(SAMPLED, window=default_window(side)).generate(model, cond, keys)
    assert torch.equal(result.codes, explicit.codes)
    assert decoder.settings.window == default_window(side) < side
    assert decoder.settings.method() == f"ZipAR-{default_window(side)}"
