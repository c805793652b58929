"""Acceptance rules and neighbour tables on toy distributions (V ~ 8-50)."""

import math

import pytest
import torch
from scipy.stats import chi2

from lantern.decoding.tree.draft import finish_draft
from lantern.errors import ConfigError
from lantern.models.sampling import SamplingConfig
from lantern.rules import neighbours as nbm
from lantern.rules.exact import ExactDeterministic, ExactSampled
from lantern.rules.factory import lantern, lantern_pp, lantern_reference
from lantern.rules.neighbours import check_table, codebook_hash, load_or_build_table, neighbour_table, to_storage
from lantern.rules.relaxation import NeighbourRelaxation

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


def test_an_altered_cached_table_is_rebuilt_with_one_line(tmp_path, capsys):
    """Neighbours swapped in the cached file (name, hash and old digest kept) are never used: the clean
    table comes back, stderr says why once, and the rewritten file is read back silently."""
    cb = _codebook()
    clean = load_or_build_table(cb, 6, True, tmp_path)
    path = tmp_path / f"{codebook_hash(cb, True)}_6_norm.pt"
    saved = torch.load(path, weights_only=True)
    torch.save({**saved, "table": saved["table"].flip(1)}, path)  # same codes, other order: other neighbours
    capsys.readouterr()
    assert torch.equal(load_or_build_table(cb, 6, True, tmp_path), clean)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "does not match the digest" in lines[0] and path.name in lines[0]
    assert torch.equal(load_or_build_table(cb, 6, True, tmp_path), clean) and not capsys.readouterr().err
    torch.save({k: v for k, v in saved.items() if k != "digest"}, path)  # written before digests
    assert torch.equal(load_or_build_table(cb, 6, True, tmp_path), clean)
    assert "does not match the digest" in capsys.readouterr().err
    path.write_bytes(path.read_bytes()[:100])  # cut short
    assert torch.equal(load_or_build_table(cb, 6, True, tmp_path), clean)
    assert "does not match the digest" in capsys.readouterr().err


def test_an_altered_prebuilt_table_file_is_refused(tmp_path):
    cb = _codebook()
    load_or_build_table(cb, 6, True, tmp_path)
    path = tmp_path / f"{codebook_hash(cb, True)}_6_norm.pt"
    assert torch.equal(nbm.read_table_file(path, cb, True, 6), neighbour_table(cb, 6, True))
    saved = torch.load(path, weights_only=True)
    torch.save({**saved, "table": saved["table"].flip(1)}, path)
    with pytest.raises(ConfigError, match=r"^model.neighbours.path=.*does not match the digest stored with it"):
        nbm.read_table_file(path, cb, True, 6)


def test_check_table_rejects_other_codebook():
    cb = _codebook()
    check_table(neighbour_table(cb, 5), cb)
    with pytest.raises(ConfigError, match="another codebook"):
        check_table(neighbour_table(_codebook(v=16), 5), cb)
    with pytest.raises(ConfigError, match="24"):
        p = _dists(v=16)
        tokens = torch.zeros(64, 1, dtype=torch.long)
        lantern(3, 0.1, neighbour_table(cb, 5)).build("deterministic").node(
            p,
            tokens,
            torch.ones_like(tokens, dtype=torch.bool),
            p,
            torch.rand(64, 1),
            torch.ones_like(p),
            SamplingConfig(),
            True,
        )


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


def _siblings(p, count, seed):
    """``count`` distinct candidate tokens per row (R, count), in a random order."""
    g = _gen(seed)
    return torch.stack([torch.randperm(p.shape[1], generator=g)[:count] for _ in range(p.shape[0])])


def _tv(a, b):
    return 0.5 * (a - b).abs().sum(-1)


# ----------------------------------------------------------------------------- bounded relaxation


@pytest.mark.parametrize("kind", ["deterministic", "sampled"])
def test_zero_relaxation_leaves_the_target_unchanged(kind):
    table, p, q, x, u = _setup(0)
    tokens = _siblings(p, 4, 3)
    valid = torch.ones_like(tokens, dtype=torch.bool)
    for relaxation in (NeighbourRelaxation(8, table, delta=0.0), NeighbourRelaxation(8, table, lam=1.0)):
        relaxed = relaxation.relax(p, tokens, valid, q, kind)
        assert torch.equal(relaxed.target, p) and (relaxed.tv == 0).all()


@pytest.mark.parametrize("delta", [0.05, 0.2, 0.5, 1.0])
def test_one_candidate_takes_lanterns_maximal_prefix(delta):
    """With one candidate the bounded relaxation is LANTERN's A(x): the longest distance-ordered prefix
    of x's k neighbours with mass <= delta moves onto x; TV(p, p') = S_m exactly."""
    table, p, q, x, _ = _setup(1, rows=128)
    k = 10
    relaxed = NeighbourRelaxation(k, table, delta=delta).merge(p, x[:, None], torch.ones(128, 1, dtype=torch.bool))
    assert (relaxed.tv <= delta).all()
    for r in range(p.shape[0]):
        nb = table[x[r], :k]
        cum = p[r, nb].cumsum(0)
        m = int((cum <= delta).sum())
        assert m == k or cum[m] > delta  # maximal, by distance, not by probability
        expect = p[r].clone()
        expect[nb[:m]] = 0.0
        expect[x[r]] = p[r, x[r]] + (cum[m - 1] if m else 0.0)
        assert torch.allclose(relaxed.target[r], expect, atol=1e-12)
        assert math.isclose(float(relaxed.tv[r]), float(_tv(relaxed.target[r], p[r])), abs_tol=1e-12)


def test_siblings_share_one_budget():
    p = torch.tensor([[0.05, 0.30, 0.10, 0.20, 0.15, 0.12, 0.08]], dtype=torch.float64)  # (1, V)
    table = torch.tensor([[(i + s) % 7 for s in range(1, 7)] for i in range(7)])  # neighbours i+1, i+2, ...
    tokens, valid = torch.tensor([[2, 4]]), torch.ones(1, 2, dtype=torch.bool)
    relaxed = NeighbourRelaxation(3, table, delta=0.3).merge(p, tokens, valid)
    # sibling 2 takes 3 (0.20); 4 is a sibling (skipped, kept); 5 would make 0.32 > 0.3: stop.
    # sibling 4 has 0.10 left: 5 (0.12) does not fit.
    assert relaxed.gain.tolist() == [[pytest.approx(0.2), 0.0]]
    assert relaxed.target[0].tolist() == pytest.approx([0.05, 0.30, 0.30, 0.0, 0.15, 0.12, 0.08])
    alone = NeighbourRelaxation(3, table, delta=0.3).merge(p, tokens[:, 1:], valid[:, 1:])
    assert alone.gain.tolist() == [[pytest.approx(0.25)]]  # alone, 5, 6 and 0 fit the whole budget (0.25 <= 0.3)


@pytest.mark.parametrize("count", [1, 3, 10])
@pytest.mark.parametrize("delta", [0.05, 0.2, 0.4])
def test_merge_over_siblings_stays_within_delta(count, delta):
    table, p, q, _, _ = _setup(3, rows=64)
    tokens = _siblings(p, count, 5)
    relaxed = NeighbourRelaxation(20, table, delta=delta).merge(p, tokens, torch.ones_like(tokens, dtype=torch.bool))
    assert (relaxed.tv <= delta + 1e-12).all() and (relaxed.tv > 0).any()
    assert torch.allclose(relaxed.tv, _tv(relaxed.target, p), atol=1e-12)
    assert torch.allclose(relaxed.target.sum(-1), torch.ones(64, dtype=p.dtype)) and (relaxed.target >= 0).all()
    gained = relaxed.target.gather(1, tokens) - p.gather(1, tokens)
    assert torch.allclose(gained, relaxed.gain, atol=1e-12)  # the moved mass lands on the siblings


@pytest.mark.parametrize("lam", [1.5, 3.0, 10.0])
@pytest.mark.parametrize("kind", ["deterministic", "sampled"])
def test_lantern_pp_caps_every_receiver(lam, kind):
    table, p, q, _, _ = _setup(2, rows=128)
    tokens = _siblings(p, 3, 6)
    relaxed = NeighbourRelaxation(10, table, lam=lam).relax(
        p, tokens, torch.ones_like(tokens, dtype=torch.bool), q, kind
    )
    assert (relaxed.target <= torch.maximum(p, lam * p) * (1 + 1e-9) + 1e-15).all()
    assert (relaxed.tv > 0).any()


TRANSPORTS = [
    dict(receivers="fill", rounds=2),
    dict(receivers="fill", rounds=1),
    dict(receivers="first", rounds=1),
    dict(receivers="first", rounds=3),
]


@pytest.mark.parametrize("transport", TRANSPORTS, ids=lambda t: f"{t['receivers']}-{t['rounds']}")
@pytest.mark.parametrize("delta", [0.05, 0.2, 0.4, 1.0])
def test_transport_moves_surplus_to_nearby_deficits_within_delta(delta, transport):
    table, p, q, _, _ = _setup(4, rows=64)
    k = 6
    relaxed = NeighbourRelaxation(k, table, delta=delta, **transport).transport(p, q, torch.ones(64, dtype=torch.bool))
    target = relaxed.target
    assert (relaxed.tv <= delta + 1e-12).all() and (relaxed.tv > 0).all()
    assert torch.allclose(relaxed.tv, _tv(target, p), atol=1e-12)
    assert torch.allclose(target.sum(-1), torch.ones(64, dtype=p.dtype))
    assert (target <= torch.maximum(p, q) + 1e-12).all() and (target >= torch.minimum(p, q) - 1e-12).all()
    # every unit moved raises the one-candidate acceptance sum(min(p', q)) by one unit
    gain = torch.minimum(target, q).sum(-1) - torch.minimum(p, q).sum(-1)
    assert torch.allclose(gain, relaxed.tv, atol=1e-12)
    # mass only moves from a token to one of its k nearest codes
    for r in range(8):
        givers = torch.nonzero(target[r] < p[r] - 1e-15).flatten().tolist()
        takers = set(torch.nonzero(target[r] > p[r] + 1e-15).flatten().tolist())
        for y in givers:
            assert takers & set(table[y, :k].tolist())


def _ring(p, q, k=3, **transport):
    """Transport on a 6-code ring whose neighbours are i+1, i+2, ... (nearest first)."""
    table = torch.tensor([[(i + s) % 6 for s in range(1, 6)] for i in range(6)])
    p, q = torch.tensor([p], dtype=torch.float64), torch.tensor([q], dtype=torch.float64)
    return NeighbourRelaxation(k, table, **transport).transport(p, q, torch.ones(1, dtype=torch.bool))


def test_fill_tops_up_deficits_nearest_first_where_first_stops_at_one():
    # code 0 has surplus 0.30; its neighbours 1, 2, 3 have deficits 0.10, 0.05, 0.20
    p = [0.40, 0.10, 0.15, 0.10, 0.15, 0.10]
    q = [0.10, 0.20, 0.20, 0.30, 0.10, 0.10]  # code 4's surplus 0.05 finds no deficit among 5, 0, 1? 1 has one
    first = _ring(p, q, receivers="first", rounds=1, delta=1.0)
    # 0 offers 0.30 to 1 (room 0.10); 4 offers 0.05 to 1 too: 1's room is shared 0.30 : 0.05
    assert first.target[0].tolist() == pytest.approx(
        [0.40 - 0.30 / 0.35 * 0.10, 0.20, 0.15, 0.10, 0.15 - 0.05 / 0.35 * 0.10, 0.10]
    )
    fill = _ring(p, q, receivers="fill", rounds=1, delta=1.0)
    # 0 asks 1, 2, 3 for 0.10, 0.05, 0.15 (offer spent); 4 asks 5 (no room), 0 (no room), 1 for 0.05;
    # 1 was asked for 0.15 with room 0.10: both get 2/3 of what they asked
    got = [0.10 * 2 / 3, 0.05, 0.15, 0.05 * 2 / 3]
    assert fill.target[0].tolist() == pytest.approx(
        [0.40 - got[0] - got[1] - got[2], 0.20, 0.20, 0.25, 0.15 - got[3], 0.10]
    )
    # a second round offers 0's leftover to 3 (room 0.05 left, enough) and 4's to 1 (now full)
    left = 0.30 - got[0] - got[1] - got[2]
    again = _ring(p, q, receivers="fill", rounds=2, delta=1.0)
    assert again.target[0].tolist() == pytest.approx([0.10, 0.20, 0.20, 0.25 + left, 0.15 - got[3], 0.10])
    assert float(again.tv) == pytest.approx(0.30 + got[3])
    budget = _ring(p, q, receivers="fill", rounds=2, delta=0.2)
    assert float(budget.tv) == pytest.approx(0.2) and float(
        _tv(budget.target, torch.tensor([p], dtype=torch.float64))
    ) == pytest.approx(0.2)


@pytest.mark.parametrize("delta", [0.2, 0.4, 1.0])
def test_fill_and_rounds_move_more_than_first(delta):
    """On random laws the default transport uses more of the budget than the single nearest receiver."""
    table, p, q, _, _ = _setup(6, rows=64)
    active = torch.ones(64, dtype=torch.bool)
    moved = {
        name: NeighbourRelaxation(8, table, delta=delta, **t).transport(p, q, active).tv.mean()
        for name, t in {
            "first": dict(receivers="first", rounds=1),
            "fill": dict(receivers="fill", rounds=1),
            "fill2": dict(receivers="fill", rounds=2),
        }.items()
    }
    assert moved["first"] < moved["fill"] <= moved["fill2"]


def _first_deficit_column(table, p, q, k):
    """(R, V) the column of each code's first deficit neighbour among its k nearest (k when none)."""
    needy = (q > p)[:, table[:, :k]]  # (R, V, k)
    return torch.where(needy.any(-1), needy.to(torch.uint8).argmax(-1), torch.full(needy.shape[:2], k))


@pytest.mark.parametrize("lam", [None, 3.0])
def test_transport_scan_narrows_the_receiver_search_only(lam):
    """``scan`` limits where a donor looks for a receiver: the same law as searching all k whenever
    every donor's first deficit neighbour lies within the scan, another law (still within delta)
    when some lies beyond it."""
    table, p, q, _, _ = _setup(5, rows=64)
    k, delta = V - 1, (0.3 if lam is None else None)
    active = torch.ones(64, dtype=torch.bool)
    one = dict(delta=delta, lam=lam, receivers="first", rounds=1)  # the law whose first receiver the scan decides
    full = NeighbourRelaxation(k, table, scan=None, **one).transport(p, q, active)
    assert torch.equal(NeighbourRelaxation(k, table, scan=k, **one).transport(p, q, active).target, full.target)
    first = _first_deficit_column(table, p, q, k)  # (R, V)
    surplus = p > q
    deepest = int(first[surplus].max())
    assert deepest >= 2  # the case below is not vacuous
    within = NeighbourRelaxation(k, table, scan=deepest + 1, **one).transport(p, q, active)
    assert torch.equal(within.target, full.target)
    short = NeighbourRelaxation(k, table, scan=1, **one).transport(p, q, active)
    assert not torch.equal(short.target, full.target)
    if delta is not None:
        assert (short.tv <= delta + 1e-12).all()
    assert torch.allclose(short.tv, _tv(short.target, p), atol=1e-12)
    assert torch.allclose(short.target.sum(-1), torch.ones(64, dtype=p.dtype))


@pytest.mark.parametrize("scan", [0, -3, 2.5, True, "all"])
def test_bad_scan_is_refused(scan):
    table, *_ = _setup(0)
    with pytest.raises(ConfigError, match="scan="):
        lantern(5, 0.1, table, scan=scan)


@pytest.mark.parametrize(
    "bad", [dict(receivers="nearest"), dict(receivers=None), dict(rounds=0), dict(rounds=1.5), dict(rounds=True)]
)
def test_bad_transport_is_refused(bad):
    table, *_ = _setup(0)
    with pytest.raises(ConfigError, match=f"{next(iter(bad))}="):
        lantern(5, 0.1, table, **bad)
    with pytest.raises(ConfigError, match=f"{next(iter(bad))}="):
        lantern_pp(5, 3.0, table, **bad)


# ----------------------------------------------------------------------------- exact tests


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


def test_residual_fallbacks():
    p = torch.zeros(1, V, dtype=torch.float64)
    p[0, 5] = 1.0
    x = torch.tensor([5])
    assert torch.equal(ExactSampled().residual(p, p, x), p)
    assert torch.equal(ExactDeterministic().residual(p, None, x), p)


# ----------------------------------------------------------------------------- the authors' semantics


def test_reference_rejection_zeroes_k_plus_one_neighbours_only_after_a_merge():
    """Hand-computed: nearest_latents[x, :k+1] is zeroed only when at least one neighbour was merged."""
    p = torch.tensor([[0.05, 0.30, 0.10, 0.20, 0.15, 0.12, 0.08]], dtype=torch.float64)
    table = torch.tensor([[(i + s) % 7 for s in range(1, 7)] for i in range(7)])
    noise = torch.ones(1, 7, dtype=torch.float64)
    sampling = SamplingConfig()
    # x = 2, k = 2, delta = 0.25: neighbour 3 (0.20) merges, 4 would make 0.35; p~ = 0.30.
    # Rejected: x and the k+1 = 3 nearest (3, 4, 5) are zeroed: [0.05, 0.30, 0, 0, 0, 0, 0.08] / 0.43.
    rule = lantern_reference(2, 0.25, table).build("deterministic")
    out = rule.node(p, torch.tensor([[2]]), torch.ones(1, 1, dtype=torch.bool), p, None, noise, sampling)
    residual = torch.tensor([0.05, 0.30, 0, 0, 0, 0, 0.08], dtype=torch.float64) / 0.43
    assert torch.allclose(out.target[0], residual)
    law = 0.30 * torch.eye(7, dtype=torch.float64)[2] + 0.70 * residual
    assert float(out.tv[0]) == pytest.approx(float(_tv(law, p[0])))
    # delta = 0.1: nothing merges, only x is zeroed.
    rule = lantern_reference(2, 0.1, table).build("deterministic")
    out = rule.node(p, torch.tensor([[2]]), torch.ones(1, 1, dtype=torch.bool), p, None, noise, sampling)
    assert torch.allclose(out.target[0], p[0].index_fill(0, torch.tensor([2]), 0.0) / 0.90)
    assert float(out.tv[0]) == pytest.approx(0.0, abs=1e-12)


def test_reference_greedy_takes_the_longest_accepted_path():
    """Node 1 (token 0) fails the relaxed argmax test, node 2 (token 3) passes, and so does its child
    node 4: the reference keeps the path 2 -> 4 although node 1 was tried first; the next token is the
    unmodified argmax at node 4."""
    vocab = 7
    table = torch.tensor([[(i + s) % vocab for s in range(1, vocab)] for i in range(vocab)])
    tokens = torch.tensor([[6, 0, 3, 5, 4]])  # node 0 is the root
    parents = torch.tensor([[-1, 0, 0, 1, 2]])
    depth = torch.tensor([[0, 1, 1, 2, 2]])
    draws = torch.full((1, 5, 2), -1)
    draws[0, 0] = torch.tensor([0, 3])
    draws[0, 1, 0], draws[0, 2, 0] = 5, 4
    slots = torch.tensor([[0, 0, 1, 0, 0]])
    q = torch.zeros(1, 5, vocab)
    draft = finish_draft(tokens, parents, depth, q, draws, slots, 2, "greedy")
    p = torch.zeros(1, 5, vocab)
    p[0, 0] = torch.tensor([0.10, 0.05, 0.30, 0.25, 0.20, 0.05, 0.05])  # root: argmax 2; 3 + neighbour 4 = 0.45
    p[0, 1] = torch.tensor([0.2, 0.1, 0.1, 0.1, 0.1, 0.3, 0.1])  # below node 1 (never reached)
    p[0, 2] = torch.tensor([0.1, 0.1, 0.1, 0.1, 0.4, 0.1, 0.1])  # below node 2: argmax 4 = node 4's token
    p[0, 4] = torch.tensor([0.1, 0.6, 0.1, 0.05, 0.05, 0.05, 0.05])  # below node 4: argmax 1
    rule = lantern_reference(1, 0.2, table).build("greedy")
    path, next_token, tv, merged = rule.walk(draft, p)
    assert path.tolist() == [[2, 4]] and int(next_token) == 1
    assert merged[0].tolist() == pytest.approx([0.20, 0.10])  # the prefixes merged at nodes 2 and 4 (neighbours 4, 5)
    assert lantern(1, 0.2, table).build("greedy").walk is None  # bounded: the first-sibling walk


# ----------------------------------------------------------------------------- validation


def test_bad_parameters_raise_config_error():
    table = neighbour_table(_codebook(), 8)
    for delta in (-0.1, 1.5, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match=f"delta={delta}"):
            lantern(4, delta, table)
    for k in (0, 9, -1):
        with pytest.raises(ConfigError, match=f"k={k}"):
            lantern(k, 0.1, table)
    with pytest.raises(ConfigError, match="k=3"):
        lantern(3, 0.1, torch.tensor([[1, 2, 0], [0, 2, 1], [0, 1, 2]]))  # k must be < V
    for lam in (0.5, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match=f"lambda={lam}"):
            lantern_pp(4, lam, table)
    # An unknown semantics is no option of the conf/semantics group (tests/test_run.py, tests/test_bad_input.py).
    for every in (0, -2, 1.5):
        with pytest.raises(ConfigError, match=f"tv_audit_every={every}"):
            lantern_reference(4, 0.1, table, tv_audit_every=every)
    with pytest.raises(ConfigError, match="candidates='tree'"):
        lantern_pp(4, 2.0, table).build("tree")
    with pytest.raises(ConfigError, match="integer table"):
        lantern(4, 0.1, table.float())
    with pytest.raises(ConfigError, match="k\\+1=9 neighbours"):
        lantern_reference(8, 0.1, table)  # the authors' slice needs k+1 columns
