"""MC-SJD (``decoding=sjd coupling=mc|gumbel``): greedy equality with AR (codes and PNGs), the couplings'
laws and collision rates, why a kept draft's law must be the new one (the released code keeps the old),
batch invariance, one compiled graph per batch shape, losslessness on the world (PIT/KS), τ above SJD's
on the world, configs, records and bad input."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from helpers import CountingBackend, expected, run, run_images, text_condition, tiny
from scipy.stats import chisquare, kstest

from lantern.decoding.api import settings_from_record
from lantern.decoding.ar import ARDecoder
from lantern.decoding.jacobi.decoder import JacobiSettings, gsd, sjd
from lantern.decoding.jacobi.redraw import (
    ConfidentReuse,
    GumbelCoupling,
    Independent,
    MaximalCoupling,
    gumbel_coupling,
    maximal_coupling,
)
from lantern.decoding.jacobi.sjd_pp import SjdPlusPlusDecoder
from lantern.errors import ConfigError
from lantern.models.sampling import SamplingConfig
from lantern.rng import keys_tensor
from lantern.rules.exact import residual

GREEDY = SamplingConfig(temperature=0, cfg_scale=3.0)
SAMPLED = SamplingConfig(temperature=1.0, cfg_scale=3.0)
COUPLED = ("mc", "gumbel")
REDRAWS = {"none": Independent, "mc": MaximalCoupling, "gumbel": GumbelCoupling}  # conf/coupling/*.yaml


@pytest.mark.parametrize("coupling", COUPLED)
@pytest.mark.parametrize("cfg_scale", [1.0, 3.0])
@pytest.mark.parametrize("window,init", [(1, "random"), (4, "horizon"), (16, "random")])
def test_greedy_coupled_sjd_reproduces_greedy_ar(coupling, window, init, cfg_scale):
    model, _ = tiny()
    cond, keys = text_condition(), keys_tensor(0, range(4))
    sampling = SamplingConfig(temperature=0, cfg_scale=cfg_scale)
    expected = ARDecoder(sampling).generate(model, cond, keys).codes
    result = sjd(sampling, window=window, init=init, redraw=REDRAWS[coupling]()).generate(model, cond, keys)
    assert torch.equal(result.codes, expected)
    plain = sjd(sampling, window=window, init=init).generate(model, cond, keys)
    assert torch.equal(result.per_sample["histogram"], plain.per_sample["histogram"])  # greedy: nothing to couple


def test_coupling_none_is_sjd_and_the_couplings_change_sampled_images():
    model, _ = tiny()
    cond, keys = text_condition(), keys_tensor(2, range(4))
    default = sjd(SAMPLED, window=4).generate(model, cond, keys)
    none = sjd(SAMPLED, window=4, redraw=Independent()).generate(model, cond, keys)
    assert torch.equal(none.codes, default.codes)
    assert torch.equal(none.per_sample["histogram"], default.per_sample["histogram"])
    for coupling in COUPLED:
        coupled = sjd(SAMPLED, window=4, redraw=REDRAWS[coupling]()).generate(model, cond, keys)
        assert not torch.equal(coupled.codes, default.codes), coupling
        assert float(coupled.per_sample["tv_realised_max"].max()) == 0.0


@pytest.mark.parametrize("coupling", COUPLED)
def test_a_coupling_is_an_object_that_combines_with_any_jacobi_method(coupling):
    """The redraw is its own object: GSD without grouping under a coupling is SJD under it, and SJD++ whose
    threshold keeps nothing, over a coupling, is that coupled SJD (same codes, same steps)."""
    model, _ = tiny()
    cond, keys = text_condition(), keys_tensor(3, range(4))
    plain = sjd(SAMPLED, window=4, redraw=REDRAWS[coupling]()).generate(model, cond, keys)
    grouped = gsd(SAMPLED, window=4, radius=0, redraw=REDRAWS[coupling]()).generate(model, cond, keys)
    never = SjdPlusPlusDecoder(SAMPLED, window=4, redraw=ConfidentReuse(1e9, REDRAWS[coupling]()))
    for other in (grouped, never.generate(model, cond, keys)):
        assert torch.equal(other.codes, plain.codes)
        assert torch.equal(other.per_sample["histogram"], plain.per_sample["histogram"])
    uncoupled = sjd(SAMPLED, window=4).generate(model, cond, keys)
    assert not torch.equal(plain.codes, uncoupled.codes)
    assert never.settings.coupling == coupling and never.settings.method().endswith(f"coupling={coupling}")


@pytest.mark.parametrize("coupling", COUPLED)
def test_coupled_images_do_not_depend_on_the_batch(coupling):
    model, _ = tiny()
    cond, keys = text_condition(), keys_tensor(5, range(4))
    together = sjd(SAMPLED, window=4, redraw=REDRAWS[coupling]()).generate(model, cond, keys)
    prompts = ("a red shirt", "b", "two words here now", "x y")
    for i in range(4):
        alone = sjd(SAMPLED, window=4, redraw=REDRAWS[coupling]()).generate(
            model, text_condition(prompts[i : i + 1]), keys[i : i + 1]
        )
        assert torch.equal(alone.codes[0], together.codes[i])
        assert int(alone.per_sample["steps"][0]) == int(together.per_sample["steps"][i])


# ----- the couplings, one position at a time ------------------------------------------------------

ROWS = 200_000


def laws(vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    p = torch.softmax(1.5 * torch.randn(vocab, generator=generator), -1)
    q = torch.softmax(1.5 * torch.randn(vocab, generator=generator), -1)
    return p, q


def couple(old: torch.Tensor, q: torch.Tensor, p: torch.Tensor, u: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """:func:`maximal_coupling` for one window slot per row: old drafts ``old`` (R,) drawn from laws ``q``
    (R, V), new law ``p`` (R, V), test uniforms ``u`` (R,). The second slot (output W) is the plain draw."""
    rows, vocab = q.shape
    window = torch.stack([old, old], 1)  # (R, 2): slot 1 is the token the coupling redraws
    draft_q = torch.stack([q, q], 1)  # (R, 2, V)
    state = SimpleNamespace(window=window, draft_q=draft_q, keys=keys, decided=torch.ones(rows, dtype=torch.long))
    p_draft = p.gather(1, old[:, None]).expand(-1, 2)  # (R, 2) p(x) at each old draft
    src = torch.tensor([[1, 2]]).expand(rows, -1)  # first rejection at slot 0: outputs 1 and 2 = W
    p_src = torch.stack([p, p], 1)
    return maximal_coupling(state, p_draft, torch.stack([u, u], 1), src, p_src)[:, 0]


def test_maximal_coupling_draws_p_and_repeats_the_old_draft_as_often_as_possible():
    """Old draft x ~ q, coupled with p: the new draft's law is p (chi-square) and it equals x with
    probability sum(min(p, q)) = 1 - TV(p, q), the maximum over all couplings."""
    vocab = 10
    p, q = laws(vocab, 3)
    generator = torch.Generator().manual_seed(4)
    old = torch.multinomial(q, ROWS, replacement=True, generator=generator)
    u = torch.rand(ROWS, generator=generator)
    new = couple(old, q.expand(ROWS, -1), p.expand(ROWS, -1), u, keys_tensor(9, range(ROWS)))
    counts = torch.bincount(new, minlength=vocab).double()
    assert chisquare(counts.numpy(), expected(p, ROWS)).pvalue > 1e-3
    overlap = float(torch.minimum(p, q).sum())
    same = float((new == old).double().mean())
    assert abs(same - overlap) < 4 * (overlap * (1 - overlap) / ROWS) ** 0.5
    independent = float((p * q).sum())
    assert same > independent + 0.1, "the coupling should repeat the old draft far more than independent draws"


def test_gumbel_coupling_draws_p_with_one_noise_per_token():
    """Each redraw races fixed exponentials keyed by (sample, token index): its law over samples is p;
    the same token index gives the same token for the same p at every step, and for a nearby p' it
    repeats far more often than an independent draw would."""
    vocab, rows = 10, 40_000
    p, _ = laws(vocab, 5)
    keys = keys_tensor(1, range(rows))
    decided = torch.full((rows,), 7)
    first = gumbel_coupling(keys, decided, p.expand(rows, 1, -1).contiguous())[:, 0]  # token 7 of each sample
    counts = torch.bincount(first, minlength=vocab).double()
    assert chisquare(counts.numpy(), expected(p, rows)).pvalue > 1e-3
    # Token 7 again, one step later and one slot further left: the same noise.
    again = gumbel_coupling(keys, decided - 1, p.expand(rows, 2, -1).contiguous())[:, 1]
    assert torch.equal(again, first)
    nearby = torch.softmax(p.log() + 0.3 * torch.randn(vocab, generator=torch.Generator().manual_seed(6)), -1)
    moved = gumbel_coupling(keys, decided, nearby.expand(rows, 1, -1).contiguous())[:, 0]
    assert float((moved == first).double().mean()) > float((p * nearby).sum()) + 0.3
    other = gumbel_coupling(keys, decided + 1, p.expand(rows, 1, -1).contiguous())[:, 0]  # token 8: new noise
    assert float((other == first).double().mean()) < float((p * p).sum()) + 0.02


@pytest.mark.parametrize("kept_law", ["new", "old"])
def test_a_kept_draft_must_carry_the_new_law(kept_law):
    """Three iterations of one position, starting from a point-mass initial draft: coupling with p1, then
    p2, then the test against p3 emits a token. Recording the coupled draft's law as the new law p (ours)
    emits p3 exactly; keeping the old law on a kept draft (the released code's
    ``resampled_target_scores[b, i] = draft_prob[b, i]`` when the test loop runs past the first
    rejection) does not."""
    vocab = 6
    generator = torch.Generator().manual_seed(11)
    p1, p2, p3 = (torch.softmax(1.5 * torch.randn(vocab, generator=generator), -1) for _ in range(3))
    x = torch.full((ROWS,), 2)
    law = torch.nn.functional.one_hot(x, vocab).float()  # (R, V) the initial point mass
    for step, p in enumerate((p1, p2)):
        u = torch.rand(ROWS, generator=generator)
        new = couple(x, law, p.expand(ROWS, -1), u, keys_tensor(3 + step, range(ROWS)))
        kept = (new == x)[:, None]  # a residual draw never returns the old draft
        law = torch.where(kept, law, p) if kept_law == "old" else p.expand(ROWS, -1)
        x = new
    # The test at p3 (the speculative test and its residual), then the emitted token's law.
    u = torch.rand(ROWS, generator=generator)
    passed = u * law.gather(1, x[:, None])[:, 0] < p3[x]
    fallback = torch.multinomial(residual(p3.expand(ROWS, -1), law), 1, generator=generator)[:, 0]
    emitted = torch.where(passed, x, fallback)
    counts = torch.bincount(emitted, minlength=vocab).double()
    pvalue = chisquare(counts.numpy(), expected(p3, ROWS)).pvalue
    if kept_law == "new":
        assert pvalue > 1e-3
    else:
        assert pvalue < 1e-6


# ----- compilation ---------------------------------------------------------------------------------


@pytest.mark.parametrize("coupling", COUPLED)
@pytest.mark.parametrize("sampling", [SAMPLED, GREEDY], ids=["sampled", "greedy"])
def test_coupled_step_captures_as_one_graph_and_matches_eager(coupling, sampling):
    model, _ = tiny()
    cond, keys = text_condition(), keys_tensor(0, range(4))
    expected = sjd(sampling, window=3, redraw=REDRAWS[coupling]()).generate(model, cond, keys)
    backend = CountingBackend()
    decoder = sjd(sampling, window=3, redraw=REDRAWS[coupling](), compile="default", backend=backend)
    for _ in range(2):  # a second batch of the same shape reuses the graph
        result = decoder.generate(model, cond, keys)
        assert torch.equal(result.codes, expected.codes)
        assert torch.equal(result.per_sample["histogram"], expected.per_sample["histogram"])
    assert backend.graphs == 1


# ----- the world: losslessness and τ -----------------------------------------------------------------

PASS = 1e-3


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from world_fixture import World

    return World(tmp_path_factory.mktemp("neighbours"))


def ks_pvalue(world, decoder, images: int) -> float:
    from world_fixture import randomised_pit

    codes = world.decode(decoder, images)
    values = randomised_pit(world.teacher_probabilities(codes), codes)[:, 1:].flatten()
    return float(kstest(values.numpy(), "uniform").pvalue)


@pytest.mark.parametrize("coupling", COUPLED)
def test_coupled_sjd_sampling_is_lossless(world, coupling):
    from world_fixture import WORLD_SAMPLING

    p = ks_pvalue(world, sjd(WORLD_SAMPLING, window=6, redraw=REDRAWS[coupling]()), 40)
    assert p > PASS, f"SJD coupling={coupling}: KS p = {p:.2e}"


@pytest.mark.slow
@pytest.mark.parametrize("coupling", COUPLED)
@pytest.mark.parametrize(
    "kwargs",
    [dict(window=16), dict(window=8, init="horizon"), dict(window=8, reuse=0.3)],
    ids=["w16", "horizon", "reuse"],
)
def test_coupled_sjd_variants_are_lossless(world, coupling, kwargs):
    from world_fixture import WORLD_SAMPLING

    p = ks_pvalue(world, sjd(WORLD_SAMPLING, redraw=REDRAWS[coupling](), **kwargs), 120)
    assert p > PASS, f"SJD coupling={coupling} {kwargs}: KS p = {p:.2e}"


@pytest.mark.slow  # ~17 s: a figure (tau), not a property; the laws and losslessness stay in the default suite
def test_coupling_raises_tau_on_the_world(world):
    """The point of the method: on the world's prompts, coupled redraws are accepted more often."""
    from world_fixture import WORLD_SAMPLING

    cond, keys = world.condition(20), keys_tensor(0, range(20))

    def tau(coupling):
        result = sjd(WORLD_SAMPLING, window=16, redraw=REDRAWS[coupling]()).generate(world.bundle.target, cond, keys)
        return float(result.per_sample["tokens"].sum() / result.per_sample["steps"].sum())

    plain, mc, gumbel = tau("none"), tau("mc"), tau("gumbel")
    assert mc > plain + 0.15 and gumbel > plain + 0.15, (plain, mc, gumbel)


# ----- configs and the command line ------------------------------------------------------------------


def test_greedy_mc_sjd_pngs_equal_greedy_ar_on_the_world(tmp_path):
    _, ar = run_images(tmp_path, "ar", "decoding=ar", "temperature=0")
    metrics, mc = run_images(tmp_path, "mc", "temperature=0", "decoding=sjd", "coupling=mc")
    assert mc == ar
    assert metrics["coupling"] == "mc" and metrics["decoding"] == "sjd" and metrics["mean_accepted_length"] > 1.0


@pytest.mark.parametrize("coupling", COUPLED)
def test_coupled_config_composes_and_records(tmp_path, coupling):
    proc, out = run(tmp_path, "decoding=sjd", f"coupling={coupling}", "window=4", "num_images=3", "batch_size=2")
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    metrics = {**metrics, **settings_from_record(metrics).record()}  # the decoder's knobs, flat
    assert metrics["coupling"] == coupling and metrics["acceptance"] == "exact" and metrics["window"] == 4
    assert metrics["mean_accepted_length"] >= 1.0 and sum(metrics["acceptance_histogram"]) == metrics["target_steps"]
    assert metrics["tv_realised_max"] == 0.0 and metrics.get("k") is None
    from lantern.results.tables import load_records

    settings = settings_from_record(load_records([out])[0])
    assert settings.method() == f"SJD W=4 random coupling={coupling}"


def test_settings_of_older_records_are_uncoupled():
    old = {"kind": "jacobi", "module": "lantern.decoding.jacobi.decoder", "name": "sjd", "label": "SJD", "window": 16}
    from lantern.decoding.api import settings_from_json

    settings = settings_from_json(old)
    assert settings.coupling == "none" and settings.method() == "SJD W=16 random"
    mc = JacobiSettings(name="sjd", label="SJD", coupling="mc")
    assert settings.order() < mc.order() and mc.record()["coupling"] == "mc"


def test_bad_coupling_is_one_line_and_writes_nothing(tmp_path):
    proc, out = run(tmp_path, "num_images=2", "decoding=sjd", "coupling=maximal")
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "coupling=maximal is not an option; choose one of gumbel, mc, none" in lines[0]
    assert not out.exists()
    with pytest.raises(ConfigError, match="redraw=1"):
        sjd(SAMPLED, redraw=1)
