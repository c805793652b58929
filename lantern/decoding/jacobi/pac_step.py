"""One SJD-PAC step as a pure, static-shape function: verify a proactive tree, emit the longest passing path, refill.

SJD-PAC (Kang et al., CVPR 2026; released sampler ``SJDPACSpeculativeSampler`` in KangJialiang/SJD-PAC,
``scheduler/sjd_pac_iteration_lumina_mgpt.py``) keeps, per image row, ``K`` candidates for each of ``C`` columns
(the tokens ``n .. n+C-1`` after the pending one) with one recorded law per column, laid out as the tree of
:mod:`lantern.decoding.jacobi.pac_tree`. One step:

1. one target forward over the tree's ``L`` nodes (the pending token at the root), each node seeing its ancestors;
2. **verification**: every path is tested left to right with the speculative test ``u < p(x) / q(x)``; on the
   branching columns sibling ``b`` is tested as in recursive rejection sampling, against the target law after
   siblings ``0 .. b-1`` were rejected (``p <- norm(max(0, p - q))``) and a ``q`` without their tokens; a node's
   uniform is shared by every path through it. ``tree.selection`` picks the emitted path: as released
   (:class:`Released`), the one with the longest passing prefix (the first on ties), even where an earlier sibling
   on another path also passed (the released ``torch.max`` over path lengths); the lossless
   :class:`~lantern.decoding.jacobi.pac_exact.FirstAccepted` takes the first passing sibling at each column;
3. the first failing column of that path draws its token from the residual after all ``K`` siblings failed (on
   the chain: ``norm(max(0, p - q))``); after a whole main path passed, from ``p`` at the node after it (the
   released code drops that law and draws a uniform code there; see docs/jacobi.md);
4. **Adaptive Continuation** and **Proactive Drafting** (the refill): every later column keeps the candidates'
   test against this forward's (now stale) law, and ``tree.selection`` draws its candidates from the outcome. As
   released: where the winning path's draft passed, it stays candidate 0 and ``K - 1`` more are drawn from the
   residual of that test; where it failed, ``K`` distinct candidates are drawn from the residual; either way the law recorded for the column is this forward's ``p`` there (columns past
   the branching ones follow the main path, as released). Columns past the old window take ``K`` distinct
   uniform codes with the uniform law. Greedy decoding takes ``p``'s top ``K`` (the argmax first).

Cache: node ``j`` sits at slot ``L_n + j``; the accepted path's entries are moved to ``L_n .. L_n + a``
(the main path is already there). No host reads: the step compiles with ``fullgraph=True``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from lantern import rng
from lantern.decoding.batch import repeat_rows
from lantern.decoding.jacobi.state import JacobiContext, JacobiLog, JacobiState
from lantern.decoding.jacobi.step import structure_laws
from lantern.models.sampling import draw
from lantern.rules.exact import normalised, residual, sampled_test


class Columns(NamedTuple):
    """Per column ``c`` in ``0 .. C`` of the winning path (B, C+1, ...): ``law`` the target law there (this
    forward's), ``kept`` the residual after its own draft's test (for the candidates beside a passing draft),
    ``failed`` the residual after every sibling failed, ``passed`` (B, C+1) its draft's test, ``token`` (B, C+1)
    its draft. Columns at and past the branching ones follow the main path (the released ``target_rows``)."""

    law: torch.Tensor
    kept: torch.Tensor
    failed: torch.Tensor
    passed: torch.Tensor
    token: torch.Tensor


class PathTests(NamedTuple):
    """Every path's tests (P paths, T branching columns, C columns): ``tokens`` (B, P, T) its tree drafts,
    ``p_tree`` (B, P, T, V) the law at each draft's parent, ``q_sib`` (B, K, T, V) the law sibling ``b`` was drawn
    from (without the earlier siblings), ``p_sib`` (B, P, T, V) the target each draft is tested against (its
    parent's law after the earlier siblings failed), ``p_nodes`` (B, L, V) the law after every node, ``x_main``
    (B, C-T) the chain's drafts, ``passed`` (B, P, C) each path's draft tests (the chain: the main path only)."""

    tokens: torch.Tensor
    p_tree: torch.Tensor
    q_sib: torch.Tensor
    p_sib: torch.Tensor
    p_nodes: torch.Tensor
    x_main: torch.Tensor
    passed: torch.Tensor


def distinct_draws(law: torch.Tensor, count: int, uniforms: torch.Tensor) -> torch.Tensor:
    """``count`` tokens per row of ``law`` (B, C, V) drawn without replacement, in order: (B, count, C);
    ``uniforms`` (B, C, count). A row with fewer tokens of positive mass repeats its argmax."""
    drawn = []
    for b in range(count):  # K is a host constant: the loop unrolls
        token = draw(law, uniforms[..., b])  # (B, C)
        drawn.append(token)
        law = law.scatter(-1, token[..., None], 0.0)
    return torch.stack(drawn, dim=1)


def sibling_laws(q: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """(B, K, T, V): the law sibling ``b`` is tested against, ``q`` (B, T, V) without candidates ``0 .. b-1``
    (B, K, T), renormalised (the candidates were drawn from ``q`` without replacement)."""
    laws = [q]
    for b in range(1, candidates.shape[1]):
        laws.append(normalised(laws[-1].scatter(2, candidates[:, b - 1, :, None], 0.0), laws[-1]))
    return torch.stack(laws, dim=1)


def sibling_targets(p_tree: torch.Tensor, q_sib: torch.Tensor) -> torch.Tensor:
    """(B, P, T, V): the target law each path's draft is tested against on the branching columns: its parent's
    law ``p_tree`` (B, P, T, V) after siblings ``0 .. b-1`` failed, ``p <- norm(max(0, p - q_b))``. At column
    ``c`` paths group as (G, K, s) with ``s = K^(T-1-c)``: the K axis is the branch at ``c``."""
    batch, paths, branching, vocab = p_tree.shape
    width = q_sib.shape[1]
    if branching == 0:  # depth 1: no branching column
        return p_tree
    columns = []
    for c in range(branching):
        stride = width ** (branching - 1 - c)
        view = p_tree[:, :, c].reshape(batch, paths // (width * stride), width, stride, vocab)
        current = view[:, :, 0]  # (B, G, s, V): the siblings share their parent's law
        laws = [current]
        for b in range(1, width):
            current = residual(current, q_sib[:, b - 1, c][:, None, None])
            laws.append(current)
        columns.append(torch.stack(laws, dim=2).reshape(batch, paths, vocab))
    return torch.stack(columns, dim=2)


def _rows(x: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
    """``x`` (B, P, ...) at path ``row`` (B,) of each image row: (B, ...)."""
    index = row.view(-1, *([1] * (x.dim() - 1))).expand(-1, 1, *x.shape[2:])
    return x.gather(1, index)[:, 0]


def _at_columns(x: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
    """``x`` (B, P, T, V) at a path ``row`` (B, T) chosen per column: (B, T, V)."""
    return x.gather(1, row[:, None, :, None].expand(-1, 1, -1, x.shape[-1]))[:, 0]


def path_tests(tree, state: JacobiState, p_nodes: torch.Tensor, greedy: bool) -> PathTests:
    """Every path's draft tests: on the branching columns sibling ``b`` against its parent's law after siblings
    ``0 .. b-1`` failed (recursive rejection sampling), on the chain the main path's speculative test."""
    tab, branching = tree.tables, tree.branching
    candidates, q = state.window, state.draft_q  # (B, K, C), (B, C, V)
    cols, paths = candidates.shape[2], tab.paths.shape[0]
    u_nodes = rng.uniform(state.keys, state.decided, rng.JACOBI_ACCEPT, tree.window)  # (B, L) one per node
    columns = torch.arange(branching, device=q.device)
    tokens = candidates.flatten(1)[:, tab.branch * cols + columns]  # (B, P, T) each path's tree drafts
    p_tree = p_nodes[:, tab.paths[:, :branching]]  # (B, P, T, V) the law at each tested draft's parent
    q_sib = sibling_laws(q[:, :branching], candidates[:, :, :branching])  # (B, K, T, V)
    p_sib = sibling_targets(p_tree, q_sib)  # (B, P, T, V)
    q_x = q_sib.gather(3, candidates[:, :, :branching, None])[..., 0][:, tab.branch, columns]  # (B, P, T)
    p_x = p_sib.gather(3, tokens[..., None])[..., 0]
    u_tree = u_nodes[:, tab.node_rows[:, :branching]]  # (B, P, T) shared by the paths through a node
    tree_pass = tokens == p_tree.argmax(-1) if greedy else sampled_test(p_x, q_x, u_tree)

    p_main = p_nodes[:, : cols + 1]  # (B, C+1, V) the main path's laws (nodes 0 .. M-1)
    x_main = candidates[:, 0, branching:]  # (B, C-T)
    p_chain = p_main[:, branching:cols]
    if greedy:
        chain_pass = x_main == p_chain.argmax(-1)
    else:
        p_cx, q_cx = p_chain.gather(2, x_main[..., None])[..., 0], q[:, branching:].gather(2, x_main[..., None])[..., 0]
        chain_pass = sampled_test(p_cx, q_cx, u_nodes[:, branching + 1 : cols + 1])
    main_only = (torch.arange(paths, device=q.device) == 0)[None, :, None]  # (1, P, 1)
    passed = torch.cat([tree_pass, chain_pass[:, None].expand(-1, paths, -1) & main_only], dim=2)  # (B, P, C)
    return PathTests(tokens, p_tree, q_sib, p_sib, p_nodes, x_main, passed)


def longest_path(tree, passed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The released selection: the path (B,) with the longest passing prefix of ``passed`` (B, P, C), the first
    path on ties (``torch.max`` over path lengths), and that length ``a`` (B,)."""
    paths = passed.shape[1]
    lengths = passed.long().cumprod(dim=2).sum(dim=2)  # (B, P)
    order = torch.arange(paths - 1, -1, -1, device=passed.device)  # ties go to the first path
    row = (lengths * paths + order).argmax(dim=1)  # (B,)
    return row, lengths.gather(1, row[:, None])[:, 0]


def winning_columns(tree, state: JacobiState, tests: PathTests, row: torch.Tensor) -> Columns:
    """The columns of path ``row`` (B,): branching ones from its own tree nodes, the rest from the main path."""
    tab, width, branching = tree.tables, tree.width, tree.branching
    q, vocab = state.draft_q, state.draft_q.shape[-1]
    last = _at_columns(tests.p_sib, tab.last[row])  # (B, T, V) the last sibling's target at each column
    q_own = tests.q_sib.gather(1, tab.branch[row][:, None, :, None].expand(-1, 1, -1, vocab))[:, 0]  # (B, T, V)
    failed_tree = residual(last, tests.q_sib[:, width - 1])
    p_leaf = tests.p_nodes.gather(1, tab.paths[row, branching][:, None, None].expand(-1, 1, vocab))  # (B, 1, V)
    p_main = tests.p_nodes[:, : tree.columns + 1]  # (B, C+1, V)
    law_chain = torch.cat([p_leaf, p_main[:, branching + 1 :]], dim=1)  # (B, C+1-T, V)
    q_pad = torch.cat([q, torch.zeros_like(q[:, :1])], dim=1)  # (B, C+1, V) nothing drafted past the window
    side = (row != 0)[:, None, None]
    q_chain = torch.cat([q_pad[:, branching : branching + 1].masked_fill(side, 0.0), q_pad[:, branching + 1 :]], 1)
    chain_residual = residual(law_chain, q_chain)
    passed = tests.passed
    never = torch.zeros_like(passed[:, 0, :1])  # (B, 1) the column past the window has no draft
    own = torch.cat([_rows(passed, row), never], dim=1)  # (B, C+1)
    main = torch.cat([passed[:, 0], never], dim=1)
    return Columns(
        law=torch.cat([_rows(tests.p_tree, row), law_chain], dim=1),
        kept=torch.cat([residual(_rows(tests.p_sib, row), q_own), chain_residual], dim=1),
        failed=torch.cat([failed_tree, chain_residual], dim=1),
        passed=torch.cat([own[:, : branching + 1], main[:, branching + 1 :]], dim=1),
        token=torch.cat([_rows(tests.tokens, row), tests.x_main, torch.zeros_like(never, dtype=torch.long)], dim=1),
    )


def verify(tree, state: JacobiState, p_nodes: torch.Tensor, greedy: bool) -> tuple[torch.Tensor, torch.Tensor, Columns]:
    """Test every path; return the path ``tree.selection`` picks (B,), its passing prefix length ``a`` (B,) and its
    columns."""
    tests = path_tests(tree, state, p_nodes, greedy)
    row, accepted = tree.selection.select(tree, tests.passed)
    return row, accepted, winning_columns(tree, state, tests, row)


def refill(tree, state: JacobiState, column: Columns, accepted: torch.Tensor, greedy: bool):
    """The next candidates (B, K, C) and recorded laws (B, C, V): new column ``j`` is old column ``a + 1 + j``.
    ``tree.selection.candidates`` draws a continued column's candidates from its test's outcome."""
    width, cols, vocab = tree.width, tree.columns, state.draft_q.shape[-1]
    span = torch.arange(cols, device=accepted.device)
    source = accepted[:, None] + 1 + span  # (B, C)
    fresh = source >= cols  # past the old window: uniform codes, as the released ``_uniform_pad``
    source = source.clamp_max(cols)
    take = source[..., None].expand(-1, -1, vocab)
    uniform = torch.full_like(state.draft_q, 1.0 / vocab)
    recorded = torch.where(fresh[..., None], uniform, column.law.gather(1, take))  # (B, C, V)
    passed = column.passed.gather(1, source) & ~fresh
    residuals = torch.where(passed[..., None], column.kept.gather(1, take), column.failed.gather(1, take))
    law = torch.where(fresh[..., None], uniform, residuals)
    uniforms = rng.uniform(state.keys, state.decided, rng.JACOBI_DRAFT, cols * width).view(-1, cols, width)
    if greedy:
        drawn = distinct_draws(law, width, uniforms)  # (B, K, C) only the fresh columns' are kept
        return torch.where(fresh[:, None], drawn, recorded.topk(width, dim=-1).indices.transpose(1, 2)), recorded
    token = column.token.gather(1, source)  # (B, C) each continued column's tested draft
    return tree.selection.candidates(recorded, law, passed, token, uniforms), recorded


class Released:
    """SJD-PAC's released selection and continuation: the longest passing path wins (:func:`longest_path`); a
    continued column keeps its passing draft as candidate 0 and draws the other ``K - 1`` from its test's residual,
    or draws all ``K`` from the residual after every sibling failed (lossy: docs/jacobi.md)."""

    name = "released"
    lossless = False
    select = staticmethod(longest_path)

    @staticmethod
    def candidates(recorded, law, passed, token, uniforms) -> torch.Tensor:
        """(B, K, C): ``law`` (B, C, V) the residual each column draws from, ``passed`` (B, C) whether its draft
        ``token`` (B, C) passed, ``uniforms`` (B, C, K); ``recorded`` (the law tested next step) is not read."""
        width = uniforms.shape[-1]
        drawn = distinct_draws(law, width, uniforms)  # (B, K, C)
        kept = torch.cat([token[:, None], drawn[:, : width - 1]], dim=1)
        return torch.where(passed[:, None], kept, drawn)


def pac_step(ctx: JacobiContext, state: JacobiState, audit: bool = True) -> tuple[JacobiState, JacobiLog]:
    """Verify the tree, emit the winning path and one drawn token, move the path's cache entries, refill."""
    tree, greedy = ctx.test, ctx.sampling.greedy
    tab, cols = tree.tables, tree.columns
    decided, length = state.decided, state.length
    batch, device = decided.shape[0], decided.device
    active = decided < ctx.num_tokens  # (B,) finished rows run along without advancing
    pending = state.codes.gather(1, (decided - 1)[:, None])  # (B, 1)
    inputs = torch.cat([pending, state.window.flatten(1)[:, tab.token_index[1:]]], dim=1)  # (B, L) node tokens
    p_nodes = structure_laws(ctx, state, inputs, tab.ancestors, tab.depth)  # (B, L, V)
    row, accepted, column = verify(tree, state, p_nodes, greedy)

    at = accepted[:, None, None].expand(-1, 1, p_nodes.shape[-1])
    if greedy:
        next_token = column.law.gather(1, at)[:, 0].argmax(-1)
    else:
        next_token = draw(
            column.failed.gather(1, at)[:, 0], rng.uniform(state.keys, decided, rng.JACOBI_RESIDUAL, 1)[:, 0]
        )
    span = torch.arange(cols + 1, device=device)
    emitted = column.token.scatter(1, accepted[:, None], next_token[:, None])  # (B, C+1)
    codes = state.codes.scatter(1, decided[:, None] + span, emitted)
    on_path = (span[None, :] <= accepted[:, None]) & active[:, None]
    source = torch.where(on_path, tab.paths[row].clamp_min(0), span[None, :])  # self-copies past the path
    ctx.cache.move(repeat_rows(length[:, None] + source, ctx.groups), repeat_rows(length[:, None] + span, ctx.groups))
    advance = torch.where(active, accepted + 1, torch.zeros_like(accepted))
    window, recorded = refill(tree, state, column, accepted, greedy)

    # Lossless: greedy, one candidate per column (SJD's test and a maximal coupling), or the RRS selection.
    known = greedy or tree.width == 1 or tree.selection.lossless
    tv = torch.full((batch, cols + 1), 0.0 if known else float("nan"), device=device)  # NaN: law not known
    log = JacobiLog(torch.where(active, accepted, -1), tv, torch.zeros(batch, cols, device=device))
    new_state = state._replace(
        codes=codes, decided=decided + advance, length=length + advance, window=window, draft_q=recorded
    )
    return new_state, log
