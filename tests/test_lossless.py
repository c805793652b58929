"""Losslessness on the real world model: the randomised PIT of every generated token under the
teacher-forced target is iid uniform exactly when a decoder samples the target's joint law
(Rosenblatt). Pooled over image positions 1..63 and tested with Kolmogorov-Smirnov. Every shipped decoder
config states whether it is lossless (the record's ``lossless``); each that claims it passes the test.

Power: the negative controls (a tree that tests a value-selected subset of its sampled draws, the
bug exact decoding on sampled dynamic trees had; LANTERN at delta 0.4) must be rejected by the same
test. Seeds are fixed, so every p-value is reproducible; the thresholds leave orders of magnitude on
both sides. The quick subset runs by default; ``-m slow`` runs the whole matrix."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import REPO
from scipy.stats import kstest
from world_fixture import WORLD_SAMPLING, World, randomised_pit

from lantern.decoding.ar import ARDecoder
from lantern.decoding.tree.decoder import SpeculativeDecoder
from lantern.decoding.tree.draft import DynamicTree, chain, prior_tree
from lantern.decoding.tree.vvs import vvs
from lantern.rules.exact import ExactDeterministic, ExactSampled
from lantern.rules.factory import lantern, lantern_pp, lantern_reference

PASS = 1e-3  # a lossless decoder's p-value stays above this
FAIL = 1e-6  # a negative control's p-value falls below this


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return World(tmp_path_factory.mktemp("neighbours"))


class ValueSelectedTree(DynamicTree):
    """Negative control: the sampled dynamic tree testing only the draws it kept (the old behaviour)."""

    def grow(self, *args, **kwargs):
        draft = super().grow(*args, **kwargs)
        return dataclasses.replace(draft, candidates=torch.where(draft.children >= 0, draft.candidates, -1))


def ks_pvalue(world: World, decoder, images: int) -> float:
    codes = world.decode(decoder, images)
    values = randomised_pit(world.teacher_probabilities(codes), codes)[:, 1:].flatten()
    return float(kstest(values.numpy(), "uniform").pvalue)


def speculative(world, structure, rule):
    return SpeculativeDecoder(WORLD_SAMPLING, drafter=world.drafter, draft=structure, acceptance=rule)


def test_sampled_dynamic_tree_is_lossless_and_the_value_selected_one_is_not(world):
    good = ks_pvalue(world, speculative(world, DynamicTree(3, 10, 20, "sampled"), ExactSampled()), 40)
    bad = ks_pvalue(world, speculative(world, ValueSelectedTree(3, 10, 20, "sampled"), ExactSampled()), 40)
    assert good > PASS, f"exact decoding on a sampled dynamic tree: KS p = {good:.2e}"
    assert bad < FAIL, f"the negative control passed: KS p = {bad:.2e}"


def test_lantern_far_from_exact_is_caught(world):
    # 100 images: on the deep world's flatter drafter/target pair 40 gave p ~ 2e-4, short of FAIL
    p = ks_pvalue(world, speculative(world, chain(3), lantern(1000, 0.4, world.neighbours)), 100)
    assert p < FAIL, f"LANTERN delta=0.4 passed as lossless: KS p = {p:.2e}"


STRUCTURES = {
    "chain": lambda kind: chain(3, kind),
    "static_tree": lambda kind: prior_tree(4, 10, 30, candidates=kind),
    "dynamic_tree": lambda kind: DynamicTree(5, 10, 58, kind),
}
RULES = {
    "exact": lambda world, kind: ExactSampled() if kind == "sampled" else ExactDeterministic(),
    "lantern_delta0": lambda world, kind: lantern(1000, 0.0, world.neighbours),
    "lantern_pp_lambda1": lambda world, kind: lantern_pp(10, 1.0, world.neighbours),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["deterministic", "sampled"])
@pytest.mark.parametrize("structure", list(STRUCTURES))
@pytest.mark.parametrize("rule", list(RULES))
def test_losslessness_matrix(world, rule, structure, kind):
    p = ks_pvalue(world, speculative(world, STRUCTURES[structure](kind), RULES[rule](world, kind)), 120)
    assert p > PASS, f"{rule} on {structure} ({kind}): KS p = {p:.2e}"


@pytest.mark.slow
def test_ar_and_the_reference_at_delta_zero_on_a_chain_are_lossless(world):
    assert ks_pvalue(world, ARDecoder(WORLD_SAMPLING), 120) > PASS
    for kind in ("deterministic", "sampled"):
        rule = lantern_reference(1000, 0.0, world.neighbours)
        assert ks_pvalue(world, speculative(world, chain(3, kind), rule), 120) > PASS


# ----- every decoder's claim (the record's ``lossless``) ---------------------------------------------------

CLAIMS = {  # what each shipped decoder config claims with its defaults; a new config must be added here
    "ar": True,
    "eagle": True,
    "cool_sd": False,
    "entropy_aware": False,
    "sjd": True,
    "lantern": False,
    "lantern_pp": False,
    "gsd": False,
    "sjd_pp": False,
    "sjd_pac": False,
    "sjd_pac_lossless": True,
    "vvs": False,
    "zipar": False,
    "pjd": False,
}


def configured(cache_dir, decoding: str, *overrides: str):
    """The decoder ``conf/decoding/<decoding>.yaml`` builds on the world."""
    from lantern.run.compose import ModelParts, build_decoder, compose_config

    world = ["model=fashion_t2i", f"model.neighbours.cache_dir={cache_dir}"]
    cfg = compose_config([*world, f"decoding={decoding}", *overrides])
    return build_decoder(cfg.decoding, ModelParts(cfg.model))


def test_every_decoder_config_states_its_claim():
    shipped = sorted(path.stem for path in (REPO / "conf" / "decoding").glob("*.yaml"))
    assert shipped == sorted(CLAIMS), "a decoder config without a stated lossless claim"


@pytest.mark.parametrize("decoding", sorted(CLAIMS))
def test_every_decoder_that_claims_lossless_passes_the_pit_test(world, tmp_path, decoding):
    decoder = configured(tmp_path, decoding, "temperature=1.0", "cfg_scale=3.0")
    assert decoder.sampling == WORLD_SAMPLING
    assert decoder.settings.lossless() is CLAIMS[decoding]
    if CLAIMS[decoding]:
        p = ks_pvalue(world, decoder, 40)
        assert p > PASS, f"decoding={decoding} claims lossless: KS p = {p:.2e}"


def test_vvs_claims_lossless_only_without_skips_under_an_exact_rule(world):
    def claim(interval, rule):
        decoder = vvs(WORLD_SAMPLING, drafter=world.drafter, draft=chain(3), acceptance=rule, interval=interval)
        return decoder.settings.lossless()

    assert claim(None, ExactSampled()) is True
    assert claim(5, ExactSampled()) is False  # skipped tokens are never tested
    assert claim(None, lantern(1000, 0.0, world.neighbours)) is False  # a relaxed rule, whatever its delta
