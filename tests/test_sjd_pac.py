"""SJD-PAC (``decoding=sjd_pac``): the released tree, greedy equals AR, one compiled graph, bad knobs, the record,
and the losslessness verdicts measured by the randomised PIT (docs/jacobi.md, "SJD-PAC as released")."""

from __future__ import annotations

import json
import math

import pytest
import torch
from helpers import CountingBackend, run_images, run_in_process, text_condition, tiny

from lantern.decoding.ar import ARDecoder
from lantern.decoding.jacobi.pac_exact import FirstAccepted
from lantern.decoding.jacobi.pac_step import Released, sibling_laws, sibling_targets
from lantern.decoding.jacobi.pac_tree import ProactiveTree
from lantern.decoding.jacobi.sjd_pac import sjd_pac
from lantern.errors import ConfigError
from lantern.models.sampling import SamplingConfig
from lantern.rng import keys_tensor
from lantern.rules.exact import residual

SAMPLED = SamplingConfig(temperature=1.0, cfg_scale=3.0)


def test_the_released_tree_has_13_tree_nodes_a_51_node_chain_and_9_paths():
    tree = ProactiveTree(3, 3, 64)
    tab = tree.tables if hasattr(tree, "tables") else tree._host
    assert (tree.tree_nodes, tree.main, tree.columns, tree.paths) == (13, 54, 53, 9)
    assert torch.equal(tab.paths[0], torch.arange(54))  # the main path is nodes 0..53, already in cache order
    assert (tab.paths[1:, 3:] == -1).all() and (tab.paths[1:, :3] >= 0).all()  # side paths end at depth D-1
    assert torch.equal(tab.ancestors.sum(1), tab.depth + 1)  # every node sees itself and its ancestors only
    assert len({tuple(row.tolist()) for row in tab.paths[:, :3]}) == 9  # 9 distinct leaves
    for row in range(9):  # node at depth c+1 of path row reads candidate branch[row, c] of column c
        for c in range(2):
            node = tab.paths[row, c + 1]
            assert tab.token_index[node] == tab.branch[row, c] * tree.columns + c
            assert tab.ancestors[node, tab.paths[row, c]]
    assert tab.branch[:, 0].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]  # path order: branch digits, depth 1 first
    assert tab.last[0].tolist() == [6, 2] and tab.last[4].tolist() == [7, 5]


@pytest.mark.parametrize(
    "kwargs,message",
    [(dict(tree_width=0), "tree_width=0"), (dict(tree_depth=0), "tree_depth=0"), (dict(window=12), "window=12")],
)
def test_out_of_range_knobs_are_refused(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        sjd_pac(SAMPLED, **kwargs)


@pytest.mark.parametrize(
    "override,message", [("tree_width=0", "tree_width=0"), ("tree_depth=0", "tree_depth=0"), ("window=12", "window=12")]
)
def test_bad_knobs_through_run_py_are_one_error_line_exit_2(tmp_path, monkeypatch, override, message):
    out = tmp_path / "run"
    status, stdout, stderr = run_in_process(["decoding=sjd_pac", override], out, monkeypatch)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert status == 2 and stdout == "" and not out.exists(), stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines


def test_sibling_tests_are_recursive_rejection_sampling():
    """Sibling b is tested against p after siblings 0..b-1 were rejected, with q without their tokens."""
    torch.manual_seed(0)
    q = torch.rand(1, 1, 6).softmax(-1)  # (B, T, V)
    p = torch.rand(1, 1, 6).softmax(-1)
    candidates = torch.tensor([[[2], [4]]])  # (B, K, T)
    q_sib = sibling_laws(q, candidates)
    assert q_sib[0, 1, 0, 2] == 0 and torch.allclose(q_sib[0, 1, 0].sum(), torch.tensor(1.0))
    p_tree = p[:, None].expand(1, 2, 1, 6)  # (B, P, T, V): two paths, siblings of one parent
    targets = sibling_targets(p_tree, q_sib)
    assert torch.equal(targets[0, 0, 0], p[0, 0]) and torch.allclose(targets[0, 1, 0], residual(p[0, 0], q[0, 0]))


@pytest.mark.parametrize("cfg_scale", [1.0, 3.0])
@pytest.mark.parametrize("window,width,depth", [(13, 3, 3), (8, 2, 2), (7, 2, 3), (5, 1, 3), (4, 2, 1)])
def test_greedy_sjd_pac_reproduces_greedy_ar(cfg_scale, window, width, depth):
    model, _ = tiny()
    cond, keys = text_condition(), keys_tensor(0, range(4))
    greedy = SamplingConfig(temperature=0, cfg_scale=cfg_scale)
    expected = ARDecoder(greedy).generate(model, cond, keys).codes
    result = sjd_pac(greedy, window=window, tree_width=width, tree_depth=depth).generate(model, cond, keys)
    assert torch.equal(result.codes, expected)
    assert result.per_sample["steps"].float().mean() < 15  # 15 tokens after the first: fewer forwards than AR


@pytest.mark.parametrize("sampling", [SAMPLED, SamplingConfig(temperature=0, cfg_scale=3.0)], ids=["sampled", "greedy"])
def test_sjd_pac_step_captures_as_one_graph_and_matches_eager(sampling):
    model, _ = tiny()
    cond, keys = text_condition(), keys_tensor(0, range(4))
    expected = sjd_pac(sampling, window=10, tree_width=2, tree_depth=3).generate(model, cond, keys)
    backend = CountingBackend()
    decoder = sjd_pac(sampling, window=10, tree_width=2, tree_depth=3, compile="default", backend=backend)
    for _ in range(2):  # a second batch of the same shape reuses the graph
        result = decoder.generate(model, cond, keys)
        assert torch.equal(result.codes, expected.codes)
        assert torch.equal(result.per_sample["histogram"], expected.per_sample["histogram"])
    assert backend.graphs == 1


def test_sampled_images_do_not_depend_on_the_batch():
    model, _ = tiny()
    cond, keys = text_condition(), keys_tensor(0, range(4))
    decoder = sjd_pac(SAMPLED, window=10, tree_width=2, tree_depth=3)
    whole = decoder.generate(model, cond, keys).codes
    prompts = ("a red shirt", "b", "two words here now", "x y")
    alone = decoder.generate(model, text_condition(prompts[2:]), keys[2:]).codes
    assert torch.equal(alone, whole[2:])


@pytest.mark.parametrize("width,measured", [(1, 15), (2, 0)])
def test_the_realised_tv_is_0_with_one_candidate_per_column_and_unmeasured_with_a_tree(width, measured):
    """K = 1 is SJD's test with a maximal-coupling refill (lossless: TV 0 on every token); with K >= 2 the emitted
    law has no closed form, so no token counts as measured (never a TV of 0)."""
    model, _ = tiny()
    result = sjd_pac(SAMPLED, window=8, tree_width=width, tree_depth=2).generate(
        model, text_condition(), keys_tensor(0, range(4))
    )
    assert result.per_sample["tv_measured"].tolist() == [measured] * 4
    assert float(result.per_sample["tv_realised_max"].max()) == 0.0


def test_run_py_on_the_world_records_tau_above_1_and_greedy_pngs_equal_ar(tmp_path):
    metrics, _ = run_images(tmp_path, "pac", "decoding=sjd_pac", "tv_audit=off")
    assert metrics["decoding"] == "sjd_pac" and metrics["mean_accepted_length"] > 1.0
    assert (metrics["window"], metrics["tree_width"], metrics["tree_depth"]) == (64, 3, 3)
    assert metrics["tv_realised_mean"] is None  # K >= 2: no closed form, and its Monte Carlo audit is off here
    saved = json.loads((tmp_path / "pac" / "metrics.json").read_text())["settings"]
    assert saved["kind"] == "sjd_pac"
    _, ar = run_images(tmp_path, "ar", "decoding=ar", "temperature=0")
    greedy, pac = run_images(tmp_path, "pac_greedy", "decoding=sjd_pac", "temperature=0")
    assert pac == ar and greedy["mean_accepted_length"] > 1.0


def test_with_one_candidate_per_column_the_lossless_variant_is_the_released_sampler():
    """K = 1: no siblings to select among and nothing drawn beside candidate 0, so both selections decode the same
    tokens in the same steps."""
    model, _ = tiny()
    cond, keys = text_condition(), keys_tensor(0, range(4))
    released = sjd_pac(SAMPLED, window=8, tree_width=1, tree_depth=3).generate(model, cond, keys)
    lossless = sjd_pac(SAMPLED, window=8, tree_width=1, tree_depth=3, selection=FirstAccepted()).generate(
        model, cond, keys
    )
    assert torch.equal(released.codes, lossless.codes)
    assert torch.equal(released.per_sample["histogram"], lossless.per_sample["histogram"])


@pytest.mark.parametrize("sampling", [SAMPLED, SamplingConfig(temperature=0, cfg_scale=3.0)], ids=["sampled", "greedy"])
def test_the_lossless_variant_captures_as_one_graph_greedy_equals_ar_and_records_tv_0(sampling):
    model, _ = tiny()
    cond, keys = text_condition(), keys_tensor(0, range(4))
    expected = sjd_pac(sampling, window=10, tree_width=2, tree_depth=3, selection=FirstAccepted()).generate(
        model, cond, keys
    )
    backend = CountingBackend()
    decoder = sjd_pac(
        sampling, window=10, tree_width=2, tree_depth=3, selection=FirstAccepted(), compile="default", backend=backend
    )
    result = decoder.generate(model, cond, keys)
    assert torch.equal(result.codes, expected.codes) and backend.graphs == 1
    assert (
        result.per_sample["tv_measured"].tolist() == [15] * 4 and float(result.per_sample["tv_realised_max"].max()) == 0
    )
    settings = decoder.settings
    assert settings.selection == "lossless" and settings.lossless()
    if sampling.greedy:
        assert torch.equal(result.codes, ARDecoder(sampling).generate(model, cond, keys).codes)


@pytest.mark.parametrize(
    "window,images", [(13, 40), pytest.param(64, 120, marks=pytest.mark.slow)], ids=["L13", "L64-slow"]
)
def test_the_lossless_variant_passes_the_pooled_pit_on_the_world(tmp_path_factory, window, images):
    """Randomised PIT / KS on the world (K 3, D 3; L 13 with 40 images in the default suite, the released L 64 with
    120 images in the slow one): the lossless variant passes."""
    from world_fixture import WORLD_SAMPLING, World
    from world_fixture import world_ks_pvalue as ks_pvalue

    world = World(tmp_path_factory.mktemp("neighbours"))
    p = ks_pvalue(world, sjd_pac(WORLD_SAMPLING, window=window, selection=FirstAccepted()), images)
    print(f"sjd_pac_lossless L {window}, {images} images: PIT p = {p:.3g}")
    assert p > PASS, f"KS p = {p:.2e}"


# ----- losslessness, measured -----------------------------------------------------------------------------------

PASS, FAIL = 1e-3, 1e-6


def markov_step(tree: ProactiveTree, state, root: torch.Tensor, transition: torch.Tensor):
    """One SJD-PAC step (verify, then the drawn token) when the target is the Markov chain ``transition`` (V, V) (the
    law after a node is the row of its token) and ``root`` (B,) is pending: (accepted (B,), columns, the drawn token
    (B,), the first emitted token (B,))."""
    from lantern import rng
    from lantern.decoding.jacobi.pac_step import verify
    from lantern.models.sampling import draw

    vocab = transition.shape[0]
    nodes = torch.cat([root[:, None], state.window.flatten(1)[:, tree.tables.token_index[1:]]], 1)  # (B, L)
    _, accepted, column = verify(tree, state, transition[nodes], greedy=False)
    law = column.failed.gather(1, accepted[:, None, None].expand(-1, 1, vocab))[:, 0]
    drawn = draw(law, rng.uniform(state.keys, state.decided, rng.JACOBI_RESIDUAL, 1)[:, 0])
    return accepted, column, drawn, torch.where(accepted >= 1, column.token[:, 0], drawn)


def fresh_state(tree: ProactiveTree, vocab: int, rows: int):
    """A first window: K distinct uniform candidates per column, their recorded law uniform (they follow it)."""
    from types import SimpleNamespace

    from lantern import rng
    from lantern.decoding.jacobi.pac_step import distinct_draws

    tree.tables = tree._host
    keys, decided = keys_tensor(0, range(rows)), torch.ones(rows, dtype=torch.long)
    q = torch.full((rows, tree.columns, vocab), 1.0 / vocab)
    uniforms = rng.uniform(keys, decided - 1, rng.JACOBI_INIT, tree.columns * tree.width).view(rows, -1, tree.width)
    return SimpleNamespace(window=distinct_draws(q, tree.width, uniforms), draft_q=q, keys=keys, decided=decided)


def markov_target(vocab: int = 4) -> torch.Tensor:
    torch.manual_seed(1)
    transition = torch.rand(vocab, vocab).pow(2)
    return transition / transition.sum(1, keepdim=True)


def chi_square(tokens: torch.Tensor, law: torch.Tensor) -> tuple[float, float]:
    """(chi-square p, TV) of ``tokens`` against ``law`` (V,)."""
    from scipy.stats import chisquare

    law = law.double() / law.double().sum()
    counts = torch.bincount(tokens, minlength=law.shape[0]).double()
    rows = tokens.shape[0]
    return chisquare(counts.numpy(), (law * rows).numpy()).pvalue, float(0.5 * (counts / rows - law).abs().sum())


def test_the_released_longest_path_rule_is_not_lossless_and_one_candidate_per_column_is():
    """One step on a Markov-chain target from a fresh window, 100k rows: with K = 1 (SJD's test, no siblings) the first
    emitted token follows the target (chi-square p > 1e-3); with the released K-ary tree (K = 2, D = 3) it does not
    (p < 1e-6): when two siblings both pass, the path with the longer passing continuation wins, not the first sibling,
    so the test's outcome picks the token. Measured TV 0.010 (docs/jacobi.md)."""
    transition, rows = markov_target(), 100_000
    verdicts = {}
    for width in (1, 2):
        tree = ProactiveTree(width, 3, 7)
        first = markov_step(tree, fresh_state(tree, 4, rows), torch.zeros(rows, dtype=torch.long), transition)[3]
        verdicts[width] = chi_square(first, transition[0])
    assert verdicts[1][0] > PASS, f"K=1: chi-square p = {verdicts[1][0]:.2e}"
    assert verdicts[2][0] < FAIL and verdicts[2][1] > 0.005, f"K=2: p = {verdicts[2][0]:.2e}, TV = {verdicts[2][1]:.4f}"


@pytest.mark.parametrize("window,width,depth", [(7, 2, 3), (13, 3, 3)])
def test_the_first_accepted_sibling_is_lossless_where_the_longest_path_is_not(window, width, depth):
    """The same one-step Monte Carlo (100k rows, the same uniforms and candidates) with the lossless selection
    (:class:`FirstAccepted`): the first emitted token follows the target (p > 1e-3), where the released rule on the
    same tree fails (p < 1e-6; the test above at K = 2, and here at K = 3)."""
    transition, rows = markov_target(), 100_000
    verdicts = {}
    for selection in (FirstAccepted(), Released()):
        tree = ProactiveTree(width, depth, window, selection)
        first = markov_step(tree, fresh_state(tree, 4, rows), torch.zeros(rows, dtype=torch.long), transition)[3]
        verdicts[selection.name] = chi_square(first, transition[0])
    assert verdicts["lossless"][0] > PASS, f"lossless: p = {verdicts['lossless'][0]:.2e}"
    assert verdicts["released"][0] < FAIL, f"released: p = {verdicts['released'][0]:.2e}"


def two_steps(tree: ProactiveTree, transition: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two SJD-PAC steps from a fresh window with pending token 0 (verify, the drawn token, the refill, verify again):
    (the second step's pending token (B,), its first emitted token (B,))."""
    from lantern.decoding.jacobi.pac_step import refill

    state = fresh_state(tree, 4, rows)
    accepted, column, pending, _ = markov_step(tree, state, torch.zeros(rows, dtype=torch.long), transition)
    window, recorded = refill(tree, state, column, accepted, greedy=False)
    state = type(state)(window=window, draft_q=recorded, keys=state.keys, decided=state.decided + accepted + 1)
    return pending, markov_step(tree, state, pending, transition)[3]


def test_continued_candidates_do_not_follow_the_law_they_are_tested_against():
    """Two steps with one branching level (D = 2: the longest path is then the first passing sibling), 100k rows: the
    second step's first token, given the pending token 0, follows the target with K = 1 and not with K = 3 (p < 1e-6):
    candidates 1..K-1 of a continued column are drawn from a residual but tested as draws from the recorded law."""
    transition, rows = markov_target(), 100_000
    verdicts = {}
    for width in (1, 3):
        pending, first = two_steps(ProactiveTree(width, 2, 8), transition, rows)
        verdicts[width] = chi_square(first[pending == 0], transition[0])
    assert verdicts[1][0] > PASS, f"K=1: chi-square p = {verdicts[1][0]:.2e}"
    assert verdicts[3][0] < FAIL and verdicts[3][1] > 0.01, f"K=3: p = {verdicts[3][0]:.2e}, TV = {verdicts[3][1]:.4f}"


@pytest.mark.parametrize("window,width,depth", [(8, 3, 2), (13, 3, 3)])
def test_the_lossless_continuation_draws_candidates_from_the_law_they_are_tested_against(window, width, depth):
    """The same two-step Monte Carlo (100k rows) with the lossless selection and continuation: the second step's first
    token follows the target given every pending token (p > 1e-3 for each), on one branching level (where the released
    continuation fails, above) and on the released tree's two (where a failed tree column is continued too)."""
    transition, rows = markov_target(), 100_000
    pending, first = two_steps(ProactiveTree(width, depth, window, FirstAccepted()), transition, rows)
    for r in range(4):
        p, tv = chi_square(first[pending == r], transition[r])
        assert p > PASS, f"pending {r}: p = {p:.2e}, TV = {tv:.4f}"


@pytest.mark.slow
@pytest.mark.parametrize("window,width,depth", [(8, 3, 2), (13, 3, 3)])
def test_whole_decodes_on_a_markov_target_fail_as_released_and_pass_lossless(window, width, depth):
    """Whole decodes (every step, the real step code) of 20k images of 16 tokens on a Markov-chain target: the law of
    a token given the one before it (pooled over positions, a lower bound of the TV per token) departs from the
    chain's as released (measured TV 0.0063 at (8, 3, 2), p = 5e-8; 0.0045 at (13, 3, 3), p = 3e-4; the noise floor
    is about 0.002) and follows it in the lossless variant (p = 0.83, 0.52). ``-s`` prints the figures."""
    from markov_target import MarkovTarget, decode, markov_chain, transition_tv

    transition, start = markov_chain(4)
    model = MarkovTarget(transition, start, 4)
    plain = SamplingConfig(temperature=1.0, cfg_scale=1.0)
    verdicts = {}
    for selection in (Released(), FirstAccepted()):
        decoder = sjd_pac(plain, window=window, tree_width=width, tree_depth=depth, selection=selection)
        verdicts[selection.name] = transition_tv(decode(decoder, model, 20_000), transition)
    print(f"L {window} K {width} D {depth}: (p, TV) released {verdicts['released']}, lossless {verdicts['lossless']}")
    assert verdicts["released"][0] < 1e-3 and verdicts["lossless"][0] > PASS, verdicts


@pytest.mark.slow
def test_the_pooled_pit_does_not_detect_sjd_pac_on_the_world_and_catches_its_control(tmp_path_factory):
    """Randomised PIT / KS on the world (40 images, prompts 0-39, seed 0): SJD-PAC at the released defaults passes
    (measured p = 0.447), GSD with wide groups (the control) fails (p = 3.7e-12). The one-step Monte Carlo above shows
    the loss the pooled test cannot see at this sample size."""
    from world_fixture import WORLD_SAMPLING, World
    from world_fixture import world_ks_pvalue as ks_pvalue

    from lantern.decoding.jacobi.decoder import gsd

    world = World(tmp_path_factory.mktemp("neighbours"))
    assert ks_pvalue(world, sjd_pac(WORLD_SAMPLING), 40) > PASS
    assert ks_pvalue(world, gsd(WORLD_SAMPLING, window=6, radius=7, p_thr=1.0, d_thr=None), 40) < FAIL


def tiny_pit_verdicts(preset: str, family, neighbours_dir, images: int = 256) -> tuple[float, float]:
    """(SJD-PAC's PIT p at its defaults, the control's p: LANTERN delta 0.4 on a sampled chain of 3) on a tiny
    random preset, ``images`` images each; both printed (``-s``) so a rerun can be compared with the docs."""
    from family_helpers import tiny_preset
    from helpers import SAMPLING, ks_pvalue

    from lantern.decoding.tree.decoder import SpeculativeDecoder
    from lantern.decoding.tree.draft import chain
    from lantern.rules.factory import lantern

    tiny = tiny_preset(preset, family, neighbours_dir)
    control = SpeculativeDecoder(
        SAMPLING, drafter=tiny[1], draft=chain(3, "sampled"), acceptance=lantern(1000, 0.4, tiny[2])
    )
    pac, bad = ks_pvalue(tiny, sjd_pac(SAMPLING), images), ks_pvalue(tiny, control, images)
    print(f"{preset} PIT, {images} images: sjd_pac p = {pac:.3g}, LANTERN delta 0.4 p = {bad:.3g}")
    return pac, bad


@pytest.mark.slow
def test_the_pooled_pit_does_not_detect_sjd_pac_on_tiny_lumina_and_catches_its_control(tmp_path_factory):
    """The same on tiny_random_lumina (256 images): SJD-PAC L 64, K 3, D 3 passes (measured p = 0.756); LANTERN
    delta 0.4 (the control) fails (p = 1.5e-43)."""
    from types import SimpleNamespace

    from lantern.models.chameleon import bundle as chameleon
    from lantern.models.chameleon import lumina_bundle

    family = SimpleNamespace(
        random_bundle=lumina_bundle.random_bundle,
        random_drafter=lumina_bundle.random_drafter,
        random_codebook=chameleon.random_codebook,
    )
    pac, bad = tiny_pit_verdicts("tiny_random_lumina", family, tmp_path_factory.mktemp("neighbours"))
    assert pac > PASS
    assert bad < FAIL and not math.isnan(bad)


@pytest.mark.slow
def test_the_pooled_pit_does_not_detect_sjd_pac_on_tiny_emu3_and_catches_its_control(tmp_path_factory):
    """The same on tiny_random_emu3 (256 images, about a minute here): SJD-PAC L 64, K 3, D 3 passes (measured
    p = 0.85); LANTERN delta 0.4 (the control) fails (p = 1.8e-55)."""
    from lantern.models.emu3 import bundle as emu3

    pac, bad = tiny_pit_verdicts("tiny_random_emu3", emu3, tmp_path_factory.mktemp("neighbours"))
    assert pac > PASS
    assert bad < FAIL and not math.isnan(bad)
