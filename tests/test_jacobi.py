"""Speculative Jacobi decoding (SJD) and grouped speculative decoding (GSD): greedy equality with AR,
batch invariance, GSD without grouping equal to SJD, GSD's realised law against a brute-force
enumeration and a Monte Carlo run of its test, one compiled graph per batch shape, losslessness on the
world (PIT/KS, GSD as the negative control), configs that compose and decode, bad input."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import CountingBackend, run, text_condition, tiny
from scipy.stats import chisquare, kstest

from lantern.decoding.api import settings_from_record
from lantern.decoding.ar import ARDecoder
from lantern.decoding.jacobi.decoder import gsd, sjd
from lantern.errors import ConfigError
from lantern.models.sampling import SamplingConfig
from lantern.rng import keys_tensor
from lantern.rules.exact import residual
from lantern.rules.grouped import Grouping, grouped_law

GREEDY = SamplingConfig(temperature=0, cfg_scale=3.0)
SAMPLED = SamplingConfig(temperature=1.0, cfg_scale=3.0)


@pytest.mark.parametrize("cfg_scale", [1.0, 3.0])
@pytest.mark.parametrize("window,init", [(1, "random"), (3, "horizon"), (5, "vertical"), (16, "random")])
def test_greedy_sjd_reproduces_greedy_ar(window, init, cfg_scale):
    model, _ = tiny()
    cond, keys = text_condition(), keys_tensor(0, range(4))
    sampling = SamplingConfig(temperature=0, cfg_scale=cfg_scale)
    expected = ARDecoder(sampling).generate(model, cond, keys).codes
    result = sjd(sampling, window=window, init=init).generate(model, cond, keys)
    assert torch.equal(result.codes, expected)
    histogram, steps = result.per_sample["histogram"], result.per_sample["steps"]
    assert histogram.shape == (4, window + 1) and torch.equal(histogram.sum(1), steps)
    assert histogram[:, 1:].sum() > 0, "the test should exercise accepted drafts"
    assert (steps < model.config.num_image_tokens - 1).any(), "SJD should save target forwards"


@pytest.mark.parametrize(
    "factory", [lambda s: sjd(s, window=4), lambda s: gsd(s, window=4, p_thr=1.0, d_thr=None)], ids=["sjd", "gsd"]
)
def test_images_do_not_depend_on_the_batch(factory):
    model, _ = tiny()
    cond, keys = text_condition(), keys_tensor(5, range(4))
    together = factory(SAMPLED).generate(model, cond, keys)
    prompts = ("a red shirt", "b", "two words here now", "x y")
    for i in range(4):
        alone = factory(SAMPLED).generate(model, text_condition(prompts[i : i + 1]), keys[i : i + 1])
        assert torch.equal(alone.codes[0], together.codes[i])
        assert int(alone.per_sample["steps"][0]) == int(together.per_sample["steps"][i])


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_gsd_without_grouping_is_sjd(sampling):
    model, _ = tiny()
    cond, keys = text_condition(), keys_tensor(1, range(4))
    plain = sjd(sampling, window=4).generate(model, cond, keys)
    off = gsd(sampling, window=4, radius=0).generate(model, cond, keys)
    assert torch.equal(off.codes, plain.codes)
    assert torch.equal(off.per_sample["histogram"], plain.per_sample["histogram"])
    assert float(off.per_sample["tv_realised_max"].max()) < 1e-5
    on = gsd(sampling, window=4, radius=3, p_thr=1.0, d_thr=None).generate(model, cond, keys)
    assert not torch.equal(on.codes, plain.codes), "grouping on should change something on this model"
    assert float(on.per_sample["tv_realised_max"].max()) > 1e-3


def brute_force_law(
    p: torch.Tensor, q: torch.Tensor, radius: int, p_thr: float, close: torch.Tensor | None
) -> torch.Tensor:
    """GSD's law at one position by enumeration: group of every token by explicit loops, then
    P(x) = q(x) a(x) + (1 - sum q a) norm(max(0, p - q))(x)."""
    vocab = p.shape[0]
    order = sorted(range(vocab), key=lambda t: (float(p[t]), t))  # ascending, ties by index (stable)
    accept = torch.zeros(vocab, dtype=torch.float64)
    for x in range(vocab):
        r = order.index(x)
        ranks = [r] if radius == 0 else range(r - radius, r + radius)
        group = [
            order[i]
            for i in ranks
            if 0 <= i < vocab
            and (
                order[i] == x
                or (abs(float(p[order[i]] - p[x])) < p_thr and (close is None or bool(close[x, order[i]])))
            )
        ]
        p_g, q_g = sum(float(p[y]) for y in group), sum(float(q[y]) for y in group)
        accept[x] = min(1.0, p_g / q_g) if q_g > 0 else 1.0
    taken = q.double() * accept
    rest = (p.double() - q.double()).clamp_min(0)
    rest = rest / rest.sum() if rest.sum() > 0 else p.double()
    return taken + (1 - taken.sum()) * rest


@pytest.mark.parametrize(
    "radius,p_thr,with_distance", [(0, 0.15, False), (2, 0.15, False), (3, 0.05, True), (7, 1.0, False)]
)
def test_grouped_law_matches_enumeration(radius, p_thr, with_distance):
    generator = torch.Generator().manual_seed(radius)
    vocab = 12
    p = torch.softmax(2 * torch.randn(6, vocab, generator=generator), -1)
    q = torch.softmax(2 * torch.randn(6, vocab, generator=generator), -1)
    q[0] = torch.nn.functional.one_hot(torch.tensor(3), vocab).float()  # a freshly initialised draft: point mass
    embeddings = torch.randn(vocab, 3, generator=generator)
    grouping = Grouping(radius, p_thr, 2.0 if with_distance else None)
    close = grouping.close_table(embeddings)
    law = grouped_law(p, q, grouping, close)
    for row in range(6):
        expected = brute_force_law(p[row], q[row], radius, p_thr, close)
        assert torch.allclose(law[row].double(), expected, atol=1e-6)
        assert abs(float(law[row].sum()) - 1) < 1e-5
    tv = 0.5 * (law - p).abs().sum(-1)
    if radius == 0:
        assert float(tv.max()) < 1e-6  # no grouping: speculative sampling, exact
    else:
        assert float(tv.max()) > 1e-3


@pytest.mark.parametrize("radius", [0, 3])
def test_the_test_draws_from_the_law_it_records(radius):
    """Monte Carlo of one position: draft x ~ q, accept with min(1, p(G)/q(G)), else draw the residual;
    the empirical law matches :func:`grouped_law` (chi-square): p itself for SJD (radius 0), not p for GSD."""
    generator = torch.Generator().manual_seed(7)
    vocab, draws = 10, 200_000
    p = torch.softmax(1.5 * torch.randn(1, vocab, generator=generator), -1)
    q = torch.softmax(1.5 * torch.randn(1, vocab, generator=generator), -1)
    grouping = Grouping(radius, 0.3, None)
    law = grouped_law(p, q, grouping, None)[0].double()
    drafts = torch.multinomial(q[0], draws, replacement=True, generator=generator)
    p_g, q_g = grouping.group_masses(p.expand(draws, -1), q.expand(draws, -1), drafts[:, None], None)
    passed = torch.rand(draws, generator=generator) < (p_g[:, 0] / q_g[:, 0]).clamp_max(1)
    fallback = torch.multinomial(residual(p, q)[0], draws, replacement=True, generator=generator)
    tokens = torch.where(passed, drafts, fallback)
    counts = torch.bincount(tokens, minlength=vocab).double()
    expected, target = law / law.sum() * draws, p[0].double() / p[0].double().sum() * draws
    assert chisquare(counts.numpy(), expected.numpy()).pvalue > 1e-3
    if radius == 0:
        assert torch.allclose(law, p[0].double(), atol=1e-6)
    else:
        assert chisquare(counts.numpy(), target.numpy()).pvalue < 1e-6


@pytest.mark.parametrize(
    "name,sampling,factory",
    [
        ("sjd-greedy", GREEDY, lambda s, **kw: sjd(s, window=3, **kw)),
        ("sjd-sampled-horizon", SAMPLED, lambda s, **kw: sjd(s, window=3, init="horizon", **kw)),
        ("sjd-reuse", SAMPLED, lambda s, **kw: sjd(s, window=3, reuse=0.2, **kw)),
        ("gsd-sampled", SAMPLED, lambda s, **kw: gsd(s, window=3, p_thr=1.0, d_thr=None, **kw)),
        ("gsd-greedy", GREEDY, lambda s, **kw: gsd(s, window=3, p_thr=1.0, d_thr=None, **kw)),
        ("gsd-distance", SAMPLED, lambda s, **kw: gsd(s, window=3, radius=2, d_thr=200.0, **kw)),
    ],
)
def test_jacobi_step_captures_as_one_graph_and_matches_eager(name, sampling, factory):
    model, _ = tiny()
    cond, keys = text_condition(), keys_tensor(0, range(4))
    expected = factory(sampling).generate(model, cond, keys)
    backend = CountingBackend()
    decoder = factory(sampling, compile="default", backend=backend)
    for _ in range(2):  # a second batch of the same shape reuses the graph
        result = decoder.generate(model, cond, keys)
        assert torch.equal(result.codes, expected.codes)
        assert torch.equal(result.per_sample["histogram"], expected.per_sample["histogram"])
    assert backend.graphs == 1


@pytest.mark.parametrize("every", [3, 10**6])
def test_an_audit_schedule_compiles_every_graph_in_the_first_call(every):
    """With the TV audit on every N-th step only, the first call compiles both step graphs (audited and
    not) it needs, or just the unaudited one when no step is audited; a second call compiles nothing."""
    model, _ = tiny()
    cond, keys = text_condition(), keys_tensor(0, range(4))
    backend = CountingBackend()
    decoder = gsd(SAMPLED, window=3, p_thr=1.0, d_thr=None, tv_audit_every=every, compile="default", backend=backend)
    decoder.generate(model, cond, keys)
    assert backend.graphs == (2 if every == 3 else 1)
    decoder.generate(model, cond, keys)
    assert backend.graphs == (2 if every == 3 else 1)


# ----- losslessness on the world ------------------------------------------------------------------

PASS, FAIL = 1e-3, 1e-6


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from world_fixture import World

    return World(tmp_path_factory.mktemp("neighbours"))


def ks_pvalue(world, decoder, images: int) -> float:
    from world_fixture import randomised_pit

    codes = world.decode(decoder, images)
    values = randomised_pit(world.teacher_probabilities(codes), codes)[:, 1:].flatten()
    return float(kstest(values.numpy(), "uniform").pvalue)


def test_sjd_sampling_is_lossless_and_gsd_is_caught(world):
    from world_fixture import WORLD_SAMPLING

    good = ks_pvalue(world, sjd(WORLD_SAMPLING, window=6), 40)
    bad = ks_pvalue(world, gsd(WORLD_SAMPLING, window=6, radius=7, p_thr=1.0, d_thr=None), 40)
    assert good > PASS, f"SJD: KS p = {good:.2e}"
    assert bad < FAIL, f"GSD with wide groups passed as lossless: KS p = {bad:.2e}"


@pytest.mark.slow
@pytest.mark.parametrize(
    "kwargs",
    [dict(window=16), dict(window=8, init="horizon"), dict(window=8, init="vertical"), dict(window=8, reuse=0.3)],
    ids=["w16", "horizon", "vertical", "reuse"],
)
def test_sjd_variants_are_lossless(world, kwargs):
    from world_fixture import WORLD_SAMPLING

    p = ks_pvalue(world, sjd(WORLD_SAMPLING, **kwargs), 120)
    assert p > PASS, f"SJD {kwargs}: KS p = {p:.2e}"


# ----- configs and the command line ------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides,fields",
    [
        (
            ("decoding=sjd", "window=4", "init=horizon", "reuse=0.3"),
            {"decoding": "sjd", "window": 4, "init": "horizon", "reuse": 0.3, "acceptance": "exact"},
        ),
        (
            ("decoding=gsd", "window=4", "gsd_p_thr=0.5"),
            {"decoding": "gsd", "gsd_radius": 7, "gsd_p_thr": 0.5, "acceptance": "gsd"},
        ),
    ],
)
def test_configs_compose_and_decode(tmp_path, overrides, fields):
    proc, out = run(tmp_path, *overrides, "num_images=3", "batch_size=2", "warmup=0")
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    metrics = {**metrics, **settings_from_record(metrics).record()}  # the decoder's knobs, flat
    for key, value in fields.items():
        assert metrics[key] == value, key
    assert metrics["mean_accepted_length"] >= 1.0 and sum(metrics["acceptance_histogram"]) == metrics["target_steps"]
    assert metrics["decode_stats"]["target_forwards"] >= 1 and metrics["speedup"] > 0
    assert metrics.get("k") is None and metrics.get("delta") is None
    assert metrics["tv_realised_coverage"] == 1.0
    if fields["decoding"] == "sjd":
        assert metrics["tv_realised_max"] == 0.0
    from lantern.results.tables import load_records

    assert settings_from_record(load_records([out])[0]).method().startswith(f"{fields['decoding'].upper()} W=4 ")


@pytest.mark.parametrize(
    "overrides,message",
    [
        (("decoding=sjd", "window=0"), "window=0: expected an integer >= 1"),
        (("decoding=sjd", "window=1000"), "window=1000: expected an integer in [1, 16]"),
        (("decoding=sjd", "init=diagonal"), "init='diagonal': expected one of random, horizon, vertical"),
        (("decoding=sjd", "reuse=1.5"), "reuse=1.5: expected a number in (0, 1]"),
        (("decoding=gsd", "gsd_radius=-1"), "gsd_radius=-1: expected an integer >= 0"),
        (("decoding=gsd", "gsd_p_thr=0"), "gsd_p_thr=0: expected a number in (0, 1]"),
        (("decoding=gsd", "gsd_p_thr=1.5"), "gsd_p_thr=1.5: expected a number in (0, 1]"),
        (("decoding=gsd", "gsd_d_thr=-2"), "gsd_d_thr=-2: expected a finite number > 0 or null"),
    ],
)
def test_bad_jacobi_input_is_one_line_and_writes_nothing(tmp_path, overrides, message):
    proc, out = run(tmp_path, "num_images=2", *overrides)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], proc.stderr
    assert not out.exists()


def test_bad_knobs_in_python():
    with pytest.raises(ConfigError, match="window=2.5"):
        sjd(SAMPLED, window=2.5)
    with pytest.raises(ConfigError, match="gsd_radius=true"):
        gsd(SAMPLED, radius=True)
    with pytest.raises(ConfigError, match="tv_audit_every=0"):
        gsd(SAMPLED, tv_audit_every=0)


@pytest.mark.parametrize("init", ["random", "horizon", "vertical"])
def test_fresh_window_slots_follow_the_initialisation(init):
    """Grid side 3, tokens 0..3 decided (values 30..33), new window for tokens 4..7 whose first slot is
    a Jacobi draw (11): horizon copies the slot to the left (a uniform code at column 0), vertical the
    token one row up (decided, or earlier in this window); initialised slots get point-mass laws."""
    from types import SimpleNamespace

    from lantern.decoding.jacobi.step import _refill

    vocab = 50
    model = SimpleNamespace(config=SimpleNamespace(vocab_size=vocab, grid_size=3))
    ctx = SimpleNamespace(model=model, window=4, init=init)
    state = SimpleNamespace(keys=keys_tensor(0, [0]), decided=torch.tensor([2]))
    codes = (torch.arange(20) + 30)[None]
    jacobi = torch.tensor([[True, False, False, False]])
    fresh = torch.tensor([[11, 0, 0, 0]])
    fresh_q = torch.full((1, 4, vocab), 1.0 / vocab)
    window, q = _refill(ctx, state, codes, torch.tensor([4]), jacobi, fresh, fresh_q, torch.tensor([9]))
    uniform = window[0, 2]
    expected = {"horizon": [11, 11, int(uniform), int(uniform)], "vertical": [11, 32, 33, 11]}
    assert int(window[0, 0]) == 11 and 0 <= int(uniform) < vocab
    if init in expected:
        assert window[0].tolist() == expected[init]
    assert torch.equal(q[0, 0], fresh_q[0, 0])
    assert torch.equal(q[0, 1:].argmax(-1), window[0, 1:]) and torch.equal(q[0, 1:].sum(-1), torch.ones(3))
