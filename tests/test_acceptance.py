"""Acceptance rules and neighbour tables on toy distributions (V ~ 8-50)."""

import math

import pytest
import torch
from scipy.stats import chi2

from lantern.errors import ConfigError
from lantern.speculative import neighbours as nbm
from lantern.speculative.acceptance import (
    ExactDeterministic,
    ExactSampled,
    Greedy,
    GreedyLantern,
    Lantern,
    LanternPP,
)
from lantern.speculative.neighbours import (
    check_table,
    codebook_hash,
    load_or_build_table,
    neighbour_table,
    to_storage,
)

V = 24


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _codebook(v=V, d=4, seed=0):
    return torch.randn(v, d, generator=_gen(seed))


def _dists(v=V, rows=64, seed=1, sharp=2.0):
    """Random target rows, some with exact zeros (as after top-k)."""
    g = _gen(seed)
    p = torch.softmax(sharp * torch.randn(rows, v, generator=g, dtype=torch.float64), -1)  # (R, V)
    p[: rows // 4, : v // 3] = 0.0
    return p / p.sum(-1, keepdim=True)


def _brute(codebook, k_max, normalize):
    rows = codebook.double()
    if normalize:
        rows = rows / rows.norm(dim=1, keepdim=True)
    out = []
    for i in range(rows.shape[0]):
        cand = [(float(((rows[i] - rows[j]) ** 2).sum().sqrt()), j) for j in range(rows.shape[0]) if j != i]
        out.append([j for _, j in sorted(cand)[:k_max]])
    return torch.tensor(out)


def _chi2_stat(counts, probs, n):
    support = probs > 0
    assert counts[~support].sum() == 0
    expected = probs[support] * n
    return float(((counts[support] - expected) ** 2 / expected).sum()), int(support.sum()) - 1


# ----------------------------------------------------------------------------- neighbour tables


@pytest.mark.parametrize("normalize", [True, False])
def test_table_matches_brute_force(normalize):
    cb = _codebook()
    cb[7] = cb[3]  # an exact tie for everyone: 3 must come before 7
    cb[11] = 2.5 * cb[5]  # same direction: a tie only in the normalised space
    table = neighbour_table(cb, V - 1, normalize)
    assert table.dtype == torch.int64 and table.shape == (V, V - 1)
    assert torch.equal(table, _brute(cb, V - 1, normalize))
    assert (table != torch.arange(V)[:, None]).all()


def test_normalised_and_raw_tables_differ():
    cb = _codebook() * torch.linspace(0.1, 5.0, V)[:, None]
    assert not torch.equal(neighbour_table(cb, 5, True), neighbour_table(cb, 5, False))


def test_chunking_gives_same_table():
    cb = _codebook(v=37)
    full = neighbour_table(cb, 10, True, chunk_size=37)
    for chunk in (1, 3, 8, 36, 100):
        assert torch.equal(neighbour_table(cb, 10, True, chunk_size=chunk), full)


def test_storage_dtype_and_bad_k_max():
    table = neighbour_table(_codebook(), 4)
    small = to_storage(table)
    assert small.dtype == torch.int16 and torch.equal(small.long(), table)
    assert to_storage(torch.tensor([[40000]])).dtype == torch.int32
    with pytest.raises(ConfigError, match="k_max=24"):
        neighbour_table(_codebook(), V)


def test_cache_hit_miss_and_slicing(tmp_path, monkeypatch):
    cb = _codebook()
    table = load_or_build_table(cb, 6, True, tmp_path)
    path = tmp_path / f"{codebook_hash(cb, True)}_6_norm.pt"
    assert path.is_file() and not list(tmp_path.glob("*.tmp"))
    assert torch.equal(table, neighbour_table(cb, 6, True))

    def boom(*args, **kwargs):
        raise AssertionError("rebuilt despite a valid cache")

    monkeypatch.setattr(nbm, "neighbour_table", boom)
    assert torch.equal(load_or_build_table(cb, 6, True, tmp_path), table)  # hit
    assert torch.equal(load_or_build_table(cb, 4, True, tmp_path), table[:, :4])  # wider table sliced
    with pytest.raises(AssertionError):
        load_or_build_table(cb, 6, False, tmp_path)  # other distance space: miss
    other = _codebook(seed=5)
    assert codebook_hash(other, True) != codebook_hash(cb, True)
    with pytest.raises(AssertionError):
        load_or_build_table(other, 6, True, tmp_path)  # other codebook: miss
    monkeypatch.undo()

    # A file under the other codebook's name whose stored hash is ours must never be used.
    forged = tmp_path / f"{codebook_hash(other, True)}_6_norm.pt"
    forged.write_bytes(path.read_bytes())
    rebuilt = load_or_build_table(other, 6, True, tmp_path)
    assert torch.equal(rebuilt, neighbour_table(other, 6, True))
    assert torch.load(forged, weights_only=True)["hash"] == codebook_hash(other, True)


def test_check_table_rejects_other_codebook():
    cb = _codebook()
    check_table(neighbour_table(cb, 5), cb)
    with pytest.raises(ConfigError, match="another codebook"):
        check_table(neighbour_table(_codebook(v=16), 5), cb)
    with pytest.raises(ConfigError, match="24"):
        Lantern(3, 0.1, neighbour_table(cb, 5)).verify(_dists(v=16), torch.zeros(64, dtype=torch.long), None, torch.rand(64))


# ----------------------------------------------------------------------------- relaxation properties


def _setup(seed=0, rows=64):
    cb = _codebook(seed=seed)
    table = neighbour_table(cb, V - 1)
    p = _dists(rows=rows, seed=seed + 10)
    q = _dists(rows=rows, seed=seed + 20, sharp=1.0)
    g = _gen(seed + 30)
    x = torch.multinomial(q, 1, generator=g).squeeze(1)  # (R,)
    u = torch.rand(rows, generator=g, dtype=torch.float64)  # (R,)
    return table, p, q, x, u


@pytest.mark.parametrize("seed", range(3))
def test_zero_relaxation_equals_exact(seed):
    table, p, q, x, u = _setup(seed)
    exact_s, exact_d = ExactSampled(), ExactDeterministic()
    for rule_s, rule_d in [
        (Lantern(8, 0.0, table, candidates="sampled"), Lantern(8, 0.0, table)),
        (LanternPP(8, 1.0, table, candidates="sampled"), LanternPP(8, 1.0, table)),
    ]:
        vs, vd = rule_s.verify(p, x, q, u), rule_d.verify(p, x, q, u)
        assert torch.equal(vs.accept, exact_s.verify(p, x, q, u).accept)
        assert torch.equal(vd.accept, exact_d.verify(p, x, q, u).accept)
        assert torch.equal(vd.p_tilde, p.gather(1, x[:, None]).squeeze(1))
        assert (vd.tv == 0).all()
        assert torch.allclose(rule_s.residual(p, q, x), exact_s.residual(p, q, x))
        # merged zero-mass neighbours change nothing in the deterministic residual either
        assert torch.allclose(rule_d.residual(p, q, x), exact_d.residual(p, q, x))
    assert torch.equal(GreedyLantern(8, 0.0, table).verify(p, x).accept, Greedy().verify(p, x).accept)


@pytest.mark.parametrize("delta", [0.05, 0.2, 0.5, 1.0])
def test_lantern_set_is_maximal_prefix_within_delta(delta):
    table, p, q, x, u = _setup(1, rows=128)
    k = 10
    rule = Lantern(k, delta, table)
    v = rule.verify(p, x, q, u)
    assert (v.tv <= delta).all()
    mask = rule.merged_mask(p, x)
    for r in range(p.shape[0]):
        m = int(v.size[r])
        nb = table[x[r], :k]
        expect = torch.zeros(V, dtype=torch.bool)
        expect[x[r]] = True
        expect[nb[:m]] = True
        assert torch.equal(mask[r], expect)
        cum = p[r, nb].cumsum(0)
        assert m == k or cum[m] > delta  # maximal prefix, by distance, not by probability
        assert math.isclose(float(v.tv[r]), float(cum[m - 1]) if m else 0.0)
        assert math.isclose(float(v.p_tilde[r]), float(p[r, expect].sum()), rel_tol=1e-12, abs_tol=1e-15)


@pytest.mark.parametrize("lam", [1.5, 3.0, 10.0])
def test_lantern_pp_bound(lam):
    table, p, q, x, u = _setup(2, rows=128)
    v = LanternPP(10, lam, table).verify(p, x, q, u)
    px = p.gather(1, x[:, None]).squeeze(1)
    assert (v.p_tilde <= lam * px * (1 + 1e-12)).all()
    assert (v.tv <= (lam - 1) * px).all()
    assert (v.size > 0).any()


def test_greedy_lantern_accepts_relaxed_argmax():
    table = neighbour_table(_codebook(), V - 1)
    x = torch.tensor([0])
    nb = table[0]
    p = torch.zeros(1, V, dtype=torch.float64)
    p[0, 0], p[0, nb[0]], p[0, nb[1]], p[0, nb[5]] = 0.3, 0.1, 0.05, 0.55
    assert not Greedy().verify(p, x).accept.item()
    assert not GreedyLantern(3, 0.2, table).verify(p, x).accept.item()  # 0.3 + 0.15 < 0.55
    p[0, nb[5]] = 0.4
    p[0, nb[10]] = 0.15
    assert GreedyLantern(2, 0.2, table).verify(p, x).accept.item()
    assert not GreedyLantern(2, 0.09, table).verify(p, x).accept.item()
    res = GreedyLantern(2, 0.09, table).residual(p, None, x)
    assert res[0, nb[5]] == 1.0


# ----------------------------------------------------------------------------- output distributions


def _lantern_step_law(rule, p, x):
    """Exact output law of one deterministic step: accept w.p. p~(x), else draw the residual."""
    v = rule.verify(p, x, None, torch.zeros_like(x, dtype=p.dtype))
    res = rule.residual(p, None, x)  # (R, V)
    out = (1 - v.p_tilde)[:, None] * res
    return out.scatter_add(1, x[:, None], v.p_tilde[:, None]), v


@pytest.mark.parametrize("delta", [0.0, 0.1, 0.4])
def test_lantern_step_moves_merged_mass_onto_x_analytic(delta):
    table = neighbour_table(_codebook(), V - 1)
    p = _dists(rows=V, seed=4).repeat(3, 1)  # (3V, V)
    x = torch.arange(V).repeat(3)
    rule = Lantern(12, delta, table)
    law, v = _lantern_step_law(rule, p, x)
    mask = rule.merged_mask(p, x)
    expect = p.masked_fill(mask, 0.0).scatter_add(1, x[:, None], v.p_tilde[:, None])
    assert torch.allclose(law, expect, atol=1e-12)
    assert torch.allclose(law.sum(-1), torch.ones(3 * V, dtype=p.dtype))
    tv = 0.5 * (law - p).abs().sum(-1)
    assert torch.allclose(tv, v.tv, atol=1e-12)
    assert (tv <= delta + 1e-12).all()
    if delta > 0:
        assert (v.size > 0).any()


def test_lantern_step_monte_carlo():
    table = neighbour_table(_codebook(), V - 1)
    g = _gen(7)
    base = torch.softmax(torch.randn(V, generator=g, dtype=torch.float64), -1)
    x0 = 2
    base[table[x0, :3]] = torch.tensor([0.06, 0.05, 0.3], dtype=torch.float64)
    base = base / base.sum()
    rule = Lantern(10, 0.2, table)
    n = 40000
    p = base.expand(n, V)
    x = torch.full((n,), x0)
    u = torch.rand(n, generator=g, dtype=torch.float64)
    v = rule.verify(p, x, None, u)
    assert int(v.size[0]) >= 1
    resid = rule.residual(p[:1], None, x[:1]).expand(n, V)
    draws = torch.multinomial(resid, 1, replacement=True, generator=g).squeeze(1)
    out = torch.where(v.accept, x, draws)
    counts = torch.bincount(out, minlength=V).double()
    target = base.masked_fill(rule.merged_mask(p[:1], x[:1])[0], 0.0)
    target[x0] = v.p_tilde[0]
    stat, dof = _chi2_stat(counts, target, n)
    assert stat < chi2.ppf(0.999, dof)
    stat_p, _ = _chi2_stat(counts, base.masked_fill(target == 0, 0.0) / base.masked_fill(target == 0, 0.0).sum(), n)
    assert stat_p > chi2.ppf(0.999, dof)  # visibly not p itself


def _sampled_run(residual_fn, p, q, n, g):
    x = torch.multinomial(q, n, replacement=True, generator=g)  # (n,)
    pp, qq = p.expand(n, -1), q.expand(n, -1)
    u = torch.rand(n, generator=g, dtype=p.dtype)
    accept = ExactSampled().verify(pp, x, qq, u).accept
    draws = torch.multinomial(residual_fn(p[None], q[None], x[:1]).squeeze(0), n, replacement=True, generator=g)
    out = torch.where(accept, x, draws)
    return torch.bincount(out, minlength=p.shape[0]).double()


def test_exact_sampled_preserves_p_and_wrong_residual_fails():
    g = _gen(11)
    v = 10
    p = torch.softmax(1.5 * torch.randn(v, generator=g, dtype=torch.float64), -1)
    q = torch.softmax(1.5 * torch.randn(v, generator=g, dtype=torch.float64), -1)
    assert 0.5 * (p - q).abs().sum() > 0.2
    n = 30000
    threshold = chi2.ppf(0.999, v - 1)
    good = _sampled_run(ExactSampled().residual, p, q, n, g)
    assert _chi2_stat(good, p, n)[0] < threshold
    bad = _sampled_run(lambda p_, q_, x_: p_, p, q, n, g)
    assert _chi2_stat(bad, p, n)[0] > threshold


def test_exact_deterministic_siblings_preserve_p():
    """Trying top-k siblings in order with the ExactDeterministic residual, then resampling, outputs p."""
    p = _dists(rows=1, seed=3)[0]
    rule = ExactDeterministic()
    cur, law, left = p.clone()[None], torch.zeros_like(p), 1.0
    for child in torch.argsort(p, descending=True)[:4]:
        c = child[None]
        pc = float(cur[0, child])
        law[child] += left * pc
        left *= 1 - pc
        cur = rule.residual(cur, None, c)
    law += left * cur[0]
    assert torch.allclose(law, p, atol=1e-12)


def test_residual_fallbacks_and_reference_mode():
    table = neighbour_table(_codebook(), V - 1)
    p = torch.zeros(1, V, dtype=torch.float64)
    p[0, 5] = 1.0
    x = torch.tensor([5])
    assert torch.equal(ExactSampled().residual(p, p, x), p)
    assert torch.equal(ExactDeterministic().residual(p, None, x), p)
    p = _dists(rows=8, seed=9)
    x = torch.arange(8)
    ref = Lantern(4, 0.05, table, residual="reference").residual(p, None, x)
    for r in range(8):
        assert (ref[r, table[r, :4]] == 0).all() and ref[r, r] == 0
    assert torch.allclose(ref.sum(-1), torch.ones(8, dtype=p.dtype))


# ----------------------------------------------------------------------------- validation


def test_bad_parameters_raise_config_error():
    table = neighbour_table(_codebook(), 8)
    for delta in (-0.1, 1.5, float("nan")):
        with pytest.raises(ConfigError, match=f"delta={delta}"):
            Lantern(4, delta, table)
    for k in (0, 9, -1):
        with pytest.raises(ConfigError, match=f"k={k}"):
            Lantern(k, 0.1, table)
    with pytest.raises(ConfigError, match="k=3"):
        Lantern(3, 0.1, torch.tensor([[1, 2, 0], [0, 2, 1], [0, 1, 2]]))  # k must be < V
    for lam in (0.5, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match=f"lambda={lam}"):
            LanternPP(4, lam, table)
    with pytest.raises(ConfigError, match="residual='both'"):
        Lantern(4, 0.1, table, residual="both")
    with pytest.raises(ConfigError, match="candidates='tree'"):
        LanternPP(4, 2.0, table, candidates="tree")
    with pytest.raises(ConfigError, match="integer table"):
        Lantern(4, 0.1, table.float())


def test_relaxed_sibling_test_maps_each_draw_onto_the_first_proximity_set_holding_it():
    p = torch.tensor([[0.05, 0.30, 0.10, 0.20, 0.15, 0.12, 0.08]])  # (1, V)
    table = torch.tensor([[(i + s) % 7 for s in range(1, 7)] for i in range(7)])  # neighbours i+1, i+2, ...
    rule = Lantern(3, 0.3, table, candidates="deterministic")
    x = torch.tensor([[2, 4]])  # siblings in order
    sets = [set(torch.nonzero(rule.merged_mask(p, x[:, s])[0]).flatten().tolist()) for s in range(2)]
    assert sets[0] == {2, 3} and sets[1] == {4, 5, 6, 0}  # S stops before exceeding delta=0.3
    for y in range(7):
        outcome = rule.try_siblings(p, x, torch.ones_like(x, dtype=torch.bool), None, None, torch.tensor([y]))
        expected = 0 if y in sets[0] else 1 if y in sets[1] else -1
        assert int(outcome.chosen) == expected and int(outcome.emitted) == y
        assert float(outcome.tv) == pytest.approx([0.2, 0.25, 0.0][expected])
