"""VVS: LANTERN with partial verification skipping and feature reuse (Dong et al., arXiv 2511.13587; HyattDD/VVS).

On a *skip step* no target forward runs: one root-to-leaf path of the freshly drafted tree is chosen at random,
its first ``s`` tokens are committed unverified (``s = min(depth of the path, floor(mean path length) - 1)``,
the root counted in a path's length), the drafter consumes them with *reused* target features (the ``s`` most
recent real ones, oldest first: the released ``reuse_prev`` policy) and the path's node ``s`` becomes the next
root. The next step (a *chain step*) verifies the next tree in one target forward that also carries the skipped
tokens as a causal chain in front of the tree, so their keys enter the target cache; their logits are what the
released code throws away, and here they give the exact realised TV of every skipped token. Every other step is
LANTERN's step (:func:`lantern.decoding.tree.step.speculative_step`'s phases, unchanged).

Schedule (the released ``uniform`` policy): step ``i`` of the loop skips when ``i % interval == 1`` and the row
has more than 5 tokens after token 0 (``new_token > 5``); the host knows ``i``, so each step is one of three pure,
static-shape functions (plain, skip, chain), each compiled with ``fullgraph=True``, and the one decode loop runs
them as a :class:`~lantern.decoding.loop.Schedule`. A row that is not yet
eligible at a skip step waits (no target forward runs for it; the released code verifies instead, see
docs/vvs.md). ``interval=None`` never skips: LANTERN token for token.

Realised TV: verified tokens carry the rule's accounting (the walk's TV, e.g. LANTERN's ``S_m <= delta``); a
skipped token ``d_k`` follows the law of a uniformly chosen path's node at depth ``k`` given the nodes above it
(each child's share of the leaves below its parent), and its TV against the target law at that position (read
from the chain step's logits) is recorded exactly. Tokens a row skips in its last step are never seen by the
target; they are counted as unmeasured (``tv_measured``), never as TV 0.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import torch

from lantern import checks, rng
from lantern.decoding.api import DecodeResult, register
from lantern.decoding.batch import repeat_rows, tree_attention_mask
from lantern.decoding.loop import Schedule, default_sync_every, run_schedule
from lantern.decoding.stats import DecodeStats, summarise
from lantern.decoding.tree.decoder import SpeculativeDecoder, TreeSettings
from lantern.decoding.tree.draft import Draft
from lantern.decoding.tree.session import drafter_consume
from lantern.decoding.tree.step import (
    SpecState,
    StepContext,
    StepLog,
    advance_phase,
    draft_phase,
    grid_positions,
    past_grid,
    verify_phase,
    walk_phase,
)
from lantern.errors import ConfigError
from lantern.models.sampling import guided_logits_at, verification_probabilities
from lantern.rules.factory import BoundedSpec

MIN_TOKENS = 5  # the released guard: no skip while a row has <= 5 tokens after token 0 ("enough cached features")


class VVSState(NamedTuple):
    """LANTERN's state plus what skipping needs, per image row (B) or model row (rows).

    ``target_length`` (B,) valid target cache slots (``spec.length`` is the drafter's; they differ by the ``s``
    skipped tokens not yet seen by the target); ``recent`` (rows, R, F) the last ``R`` real target features,
    oldest first; ``chain_law`` (B, C, V) the law each skipped token was chosen from; ``skipped`` (B, K) which
    code positions were committed unverified; ``skip_tv`` (B, 3) realised TV of skipped tokens: sum, max,
    count measured."""

    spec: SpecState
    target_length: torch.Tensor
    recent: torch.Tensor
    chain_law: torch.Tensor
    skipped: torch.Tensor
    skip_tv: torch.Tensor


@dataclass
class VVSContext:
    """LANTERN's step context and the chain width (the draft's depth)."""

    step: StepContext
    chain: int


# ----- helpers -------------------------------------------------------------------------------------


def push_features(recent: torch.Tensor, new: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """The last R of ``recent`` (rows, R, F) followed by the first ``count`` (B,) entries of ``new`` (rows, M, F)."""
    rows, width = recent.shape[:2]
    groups = rows // count.shape[0]
    buffer = torch.cat([recent, new], dim=1)  # (rows, R+M, F): the valid entries are its first R + count
    index = repeat_rows(count, groups)[:, None] + torch.arange(width, device=recent.device)  # (rows, R)
    return buffer.gather(1, index[:, :, None].expand(-1, -1, recent.shape[-1]))


def path_features(draft: Draft, walk, features: torch.Tensor, groups: int) -> torch.Tensor:
    """Target features (rows, D+1, F) at the root and the accepted path's nodes, as the drafter consumed them."""
    batch = walk.accepted.shape[0]
    nodes = torch.cat([torch.zeros(batch, 1, dtype=torch.long, device=features.device), walk.path], 1).clamp_min(0)
    index = repeat_rows(nodes, groups)[:, :, None].expand(-1, -1, features.shape[-1])
    return features.gather(1, index)


def random_path(draft: Draft, keys: torch.Tensor, decided: torch.Tensor, depth: int):
    """A uniformly chosen root-to-leaf path per row (the released ``random`` token policy) and how much of it
    a skip commits. Returns ``nodes`` (B, D) the path's node at depths 1..D (0 past its leaf), ``count`` (B,)
    ``s = min(leaf depth, floor(mean path length incl. the root) - 1)``, and ``laws`` (B, D, V): at depth ``k``
    the law the node was chosen from given the nodes above it (children weighted by their leaves)."""
    parents, ancestors, tokens = draft.parents, draft.ancestors, draft.tokens
    batch, count = tokens.shape
    device = tokens.device
    children = torch.zeros(batch, count, device=device).scatter_add(1, parents.clamp_min(0), (parents >= 0).float())
    leaf = children == 0  # (B, N+1); the root's -1 parent adds nothing
    leaf[:, 0] = False  # a root without children has no path (never drafted: depth >= 1)
    leaves = leaf.sum(1)  # (B,)
    below = (ancestors.float() * leaf[:, :, None].float()).sum(1)  # (B, N+1) leaves under each node
    mean_length = ((draft.depth + 1) * leaf).sum(1) // leaves.clamp_min(1)  # floor of the mean path length
    u = rng.uniform(keys, decided, rng.VVS_PATH, 1)[:, 0]
    pick = (u * leaves).long().clamp_max(leaves - 1)  # (B,) the pick-th leaf in node order
    rank = leaf.long().cumsum(1) - 1
    chosen = ((rank == pick[:, None]) & leaf).float().argmax(1)  # (B,)
    on_path = ancestors.gather(1, chosen[:, None, None].expand(-1, 1, count))[:, 0]  # (B, N+1)
    levels = torch.arange(1, depth + 1, device=device)
    at_level = on_path[:, None, :] & (draft.depth[:, None, :] == levels[None, :, None])  # (B, D, N+1)
    nodes = torch.where(at_level.any(-1), at_level.float().argmax(-1), torch.zeros_like(levels)[None])
    leaf_depth = draft.depth.gather(1, chosen[:, None])[:, 0]
    steps = torch.minimum(leaf_depth, mean_length - 1).clamp_min(1)
    above = torch.cat([torch.zeros(batch, 1, dtype=torch.long, device=device), nodes[:, :-1]], 1)  # (B, D)
    siblings = (parents[:, None, :] == above[:, :, None]).float()  # (B, D, N+1) children of the node above
    weight = siblings * below[:, None, :] / below.gather(1, above).clamp_min(1)[:, :, None]
    vocab = draft.q.shape[-1]
    laws = torch.zeros(batch, depth, vocab, device=device).scatter_add(
        2, tokens[:, None, :].expand(-1, depth, -1), weight
    )
    return nodes, steps, laws


# ----- the three steps -----------------------------------------------------------------------------


def plain_step(ctx: VVSContext, state: VVSState, audit: bool = True) -> tuple[VVSState, StepLog]:
    """LANTERN's step; the accepted path's features join ``recent``."""
    step, spec = ctx.step, state.spec
    draft, root = draft_phase(step, spec)
    p, features = verify_phase(step, spec, draft)
    walk = walk_phase(step, spec, draft, p, audit)
    new_spec, log = advance_phase(step, spec, draft, root, walk, features)
    advanced = new_spec.decided - spec.decided  # (B,) a+1, or 0 for a finished row
    recent = push_features(state.recent, path_features(draft, walk, features, step.groups), advanced)
    return state._replace(spec=new_spec, target_length=new_spec.length, recent=recent), log


def skip_step(ctx: VVSContext, state: VVSState, audit: bool = True) -> tuple[VVSState, StepLog]:
    """No target forward: commit ``s`` tokens of a random draft path; the drafter reads reused features."""
    step, spec = ctx.step, state.spec
    depth, groups = ctx.chain, step.groups
    draft, _ = draft_phase(step, spec)
    decided, length = spec.decided, spec.length
    batch, device = decided.shape[0], decided.device
    nodes, count, laws = random_path(draft, spec.keys, decided, depth)
    commit = (decided < step.num_tokens) & (decided - 1 > MIN_TOKENS)  # (B,)
    count = torch.where(commit, count, torch.zeros_like(count))
    span = torch.arange(depth + 1, device=device)
    path = draft.tokens.gather(1, nodes)  # (B, D) tokens d_1..d_D
    last = path.gather(1, (count - 1).clamp_min(0)[:, None])
    new_tokens = torch.where(span[None, :depth] < count[:, None], path, last)  # (B, D)
    new_tokens = torch.cat([new_tokens, last], 1)  # (B, D+1): the drafter consumes D+1 entries, s are real
    codes = spec.codes.scatter(
        1,
        decided[:, None] + span,
        torch.where(span[None] < count[:, None], new_tokens, spec.codes.gather(1, decided[:, None] + span)),
    )
    skipped = state.skipped.scatter(
        1, decided[:, None] + span, (span[None] < count[:, None]) | state.skipped.gather(1, decided[:, None] + span)
    )
    # Entry k stands for the position of the root (k = 0) or d_k and reads the k-th of the s newest features.
    width = state.recent.shape[1]
    source = (width - repeat_rows(count, groups)[:, None] + span[None, :]).clamp(0, width - 1)  # (rows, D+1)
    reused = state.recent.gather(1, source[:, :, None].expand(-1, -1, state.recent.shape[-1]))
    chain = torch.ones(depth + 1, depth + 1, dtype=torch.bool, device=device).tril().expand(batch, -1, -1)
    out = drafter_consume(
        step.model, step.drafter, step.drafter_cache, new_tokens, reused, length, spec.drafter_valid[:batch], chain
    )
    at = repeat_rows((count - 1).clamp_min(0), groups)[:, None, None].expand(-1, 1, out.shape[-1])
    root_feature = torch.where(repeat_rows(commit, groups)[:, None], out.gather(1, at)[:, 0], spec.root_feature)
    new_spec = spec._replace(codes=codes, decided=decided + count, length=length + count, root_feature=root_feature)
    accepted = torch.where(commit, count - 1, -1)  # s tokens emitted, as a walk that accepted s - 1 drafts
    tv = torch.full((batch, depth + 1), float("nan"), device=device)  # measured by the chain step
    log = StepLog(accepted, tv, torch.zeros(batch, depth, device=device))
    chain_law = torch.where(commit[:, None, None], laws, state.chain_law)
    return state._replace(spec=new_spec, chain_law=chain_law, skipped=skipped), log


def chain_step(ctx: VVSContext, state: VVSState, audit: bool = True) -> tuple[VVSState, StepLog]:
    """LANTERN's step whose target forward also carries the ``s`` skipped tokens, a causal chain before the tree.

    Entry ``e`` of the forward sits at slot ``target_length + e``: the chain (``e < s``), then the tree's
    ``N + 1`` nodes (so node ``i`` sits at ``length + i``, where LANTERN's step puts it), then ``C - s``
    padding entries that only see themselves. Chain entry ``j`` predicts skipped token ``d_{j+1}``."""
    step, spec = ctx.step, state.spec
    model, groups, width = step.model, step.groups, ctx.chain
    draft, root = draft_phase(step, spec)
    decided, length, base = spec.decided, spec.length, state.target_length
    batch, device = decided.shape[0], decided.device
    nodes = draft.num_nodes
    entries = width + nodes
    lag = length - base  # (B,) s
    e = torch.arange(entries, device=device)
    is_chain = e[None] < lag[:, None]  # (B, M)
    is_tree = ~is_chain & (e[None] < lag[:, None] + nodes)
    # The canonical order is [chain (C entries), tree (N+1)]; ``perm`` maps each entry to it.
    perm = torch.where(is_chain, e[None], torch.where(is_tree, width + e[None] - lag[:, None], e[None] - nodes))
    j = torch.arange(width, device=device)
    chain_tokens = spec.codes.gather(1, (decided[:, None] - 1 - lag[:, None] + j).clamp_min(0))  # (B, C)
    tokens = torch.cat([chain_tokens, draft.tokens], 1).gather(1, perm)  # (B, M)
    canon_positions = torch.cat([base[:, None] + j, length[:, None] + draft.depth], 1)
    positions = grid_positions(canon_positions.gather(1, perm), model.config.max_seq_len, past_grid(step.rule))
    real = j[None] < lag[:, None]  # (B, C)
    cc = (torch.ones(width, width, dtype=torch.bool, device=device).tril() & real[:, :, None] & real[:, None, :]) | (
        torch.eye(width, dtype=torch.bool, device=device)
    )
    top = torch.cat([cc, torch.zeros(batch, width, nodes, dtype=torch.bool, device=device)], 2)
    bottom = torch.cat([real[:, None, :].expand(-1, nodes, -1), draft.ancestors], 2)
    canon = torch.cat([top, bottom], 1)  # (B, M, M)
    ancestry = canon.gather(1, perm[:, :, None].expand(-1, -1, entries)).gather(
        2, perm[:, None, :].expand(-1, entries, -1)
    )
    mask = tree_attention_mask(spec.target_valid[:batch], base, ancestry)  # (B, 1, M, S)
    slots = base[:, None] + e
    logits, features = model.forward_tokens(
        repeat_rows(tokens, groups),
        repeat_rows(positions, groups),
        repeat_rows(slots, groups),
        repeat_rows(mask, groups),
        step.target_cache,
        step.drafter.config.taps,
    )  # (rows, M, V), (rows, M, F)
    tree_index = repeat_rows(lag[:, None] + torch.arange(nodes, device=device), groups)  # (rows, N+1)
    tree_logits = logits.gather(1, tree_index[:, :, None].expand(-1, -1, logits.shape[-1]))
    tree_features = features.gather(1, tree_index[:, :, None].expand(-1, -1, features.shape[-1]))
    p = verification_probabilities(
        guided_logits_at(tree_logits, step.sampling, decided[:, None] + draft.depth), step.sampling
    )
    # The skipped tokens' target laws: chain entry j predicts token index (decided - s) + j.
    predicted = decided[:, None] - lag[:, None] + j  # (B, C)
    p_chain = verification_probabilities(guided_logits_at(logits[:, :width], step.sampling, predicted), step.sampling)
    skipped_tokens = spec.codes.gather(1, predicted.clamp_max(spec.codes.shape[1] - 1))
    if step.sampling.greedy:  # the greedy target is a point mass at the argmax
        tv = (skipped_tokens != p_chain.argmax(-1)).float()
    else:
        tv = 0.5 * (p_chain - state.chain_law).abs().sum(-1)  # (B, C)
    counted = real & (predicted < step.num_tokens)
    tv = torch.where(counted, tv, torch.zeros_like(tv))
    skip_tv = state.skip_tv + torch.stack([tv.sum(1), torch.zeros_like(tv[:, 0]), counted.sum(1).float()], 1)
    skip_tv[:, 1] = torch.maximum(state.skip_tv[:, 1], tv.amax(1))

    walk = walk_phase(step, spec, draft, p, audit)
    new_spec, log = advance_phase(step, spec, draft, root, walk, tree_features)
    advanced = new_spec.decided - decided
    recent = push_features(state.recent, features[:, :width], lag)  # the chain's real features
    recent = push_features(recent, path_features(draft, walk, tree_features, groups), advanced)
    new_state = state._replace(spec=new_spec, target_length=new_spec.length, recent=recent, skip_tv=skip_tv)
    return new_state, log


STEPS = {"plain": plain_step, "skip": skip_step, "chain": chain_step}


# ----- the decoder ---------------------------------------------------------------------------------


@register
@dataclass(frozen=True)
class VVSSettings(TreeSettings):
    """LANTERN's settings plus the skip schedule."""

    kind: ClassVar[str] = "vvs"
    interval: int | None = 5
    policy: str = "uniform"
    select: str = "random"
    reuse_feature: str = "reuse_prev"

    def method(self) -> str:
        skip = f"skip every {self.interval}" if self.interval else "no skip"
        return f"{super().method()} {skip}"

    def lossless(self) -> bool:
        return super().lossless() and self.interval is None  # skipped tokens are never tested

    def record(self) -> dict:
        flat = {"skip_interval": self.interval, "skip_policy": self.policy, "select_token": self.select}
        return {**super().record(), **flat, "reuse_feature": self.reuse_feature}


class VVSDecoder(SpeculativeDecoder):
    """LANTERN (any rule the tree decoder takes) with VVS's uniform verification skipping.

    ``interval`` (int >= 2, or None: never skip): loop step ``i`` skips when ``i % interval == 1``.
    """

    rerun_plan = None  # its steps' schedule is not rerun by the Monte Carlo audit; its TV has a closed form

    def __init__(self, sampling, *, interval: int | None = 5, name: str = "vvs", label: str | None = "VVS", **kwargs):
        super().__init__(sampling, name=name, label=label, **kwargs)
        self.interval = checks.optional(
            checks.integer, "skip_interval", interval, 2, note="loop steps between verification skips"
        )
        if self.interval is not None and isinstance(self.spec, BoundedSpec):
            # A skipped token's law is the drafter's path law, not a relaxation of the target's: nothing bounds
            # its TV (the world: ~0.85 per skipped token), so the rule's promise would not hold on skip steps.
            raise ConfigError(
                f"semantics=bounded with skip_interval={self.interval}: skipped tokens are "
                "committed unverified and their TV is not bounded by delta; use semantics=reference or "
                "skip_interval=null"
            )
        self.schedule = Schedule.of(STEPS, self.compile, self.backend, kind=self.kind)
        self._vvs_contexts: dict[int, VVSContext] = {}
        self.last_skipped: torch.Tensor | None = None

    @property
    def settings(self) -> VVSSettings:
        base = super().settings
        return VVSSettings(
            name=base.name,
            label=base.label,
            compile=base.compile,
            draft=base.draft,
            rule=base.rule,
            interval=self.interval,
        )

    def capacity(self, config) -> int:
        return super().capacity(config) + self.draft.depth  # the chain step's padding entries

    def kind(self, index: int) -> str:
        """Which step loop step ``index`` runs (a host decision: the released uniform schedule)."""
        if self.interval is None:
            return "plain"
        if index % self.interval == 1:
            return "skip"
        return "chain" if index >= 2 and (index - 1) % self.interval == 1 else "plain"  # right after a skip

    @torch.inference_mode()
    def generate(self, model, condition, keys) -> DecodeResult:
        step_ctx, spec, timer, feature = self.prefill(model, condition, keys)
        num_tokens, depth = model.config.num_image_tokens, self.draft.depth
        batch, vocab = spec.decided.shape[0], model.config.vocab_size
        ctx = self._vvs_contexts.setdefault(id(step_ctx), VVSContext(step=step_ctx, chain=depth))  # one per shape
        state = VVSState(
            spec=spec,
            target_length=spec.length,
            recent=feature[:, None].expand(-1, depth + 1, -1).contiguous(),  # replaced before any skip reads it
            chain_law=torch.zeros(batch, depth, vocab, device=spec.codes.device),
            skipped=torch.zeros(spec.codes.shape, dtype=torch.bool, device=spec.codes.device),
            skip_tv=torch.zeros(batch, 3, device=spec.codes.device),
        )
        state, logs = run_schedule(
            self.schedule,
            ctx,
            state,
            # Every non-skip step decides >= 1 token per active row; a skip step may decide none (a row not yet
            # eligible), and at most every second step skips.
            2 * num_tokens,
            audit_every=self.spec.tv_audit_every,
            done=lambda s: s.spec.decided >= num_tokens,
            sync_every=default_sync_every(spec.codes.device, self.sync_every),
            guard=self.guard,
            timer=timer,
        )
        kinds = self.schedule.kinds(len(logs))
        committed = [log.accepted >= 0 for log, kind in zip(logs, kinds, strict=True) if kind == "skip"]  # (B,) each
        committed = torch.stack(committed, 1).cpu() if committed else torch.zeros(batch, 0, dtype=torch.bool)
        per_sample = self.statistics(state, logs, kinds, committed, num_tokens)
        self.last_skipped = state.skipped[:, :num_tokens].cpu()  # which tokens no target forward verified
        skips = kinds.count("skip")
        stats = {
            "target_forwards": float(1 + len(logs) - skips),
            # Skip steps that committed tokens for some row: target forwards LANTERN would have run there.
            "target_forwards_saved": float(committed.any(0).sum()),
            "skip_steps": float(skips),
            "drafter_forwards": float(1 + len(logs) * (self.draft.expansions + 1)),
        }
        if timer:
            stats.update({f"{phase}_time_s": seconds for phase, seconds in timer.totals().items()})
        return DecodeResult(state.spec.codes[:, :num_tokens], stats, per_sample)

    def statistics(self, state: VVSState, logs: list, kinds: list[str], committed, num_tokens: int) -> DecodeStats:
        """Per-image statistics: emitted tokens and the walk's TVs over every step, acceptance over the
        verified ones (tau = tokens / target forwards), plus the skipped tokens' realised TV.
        ``committed`` (B, skip steps): which skip steps committed each row's tokens."""
        depth = self.draft.depth
        every = summarise(logs, num_tokens, depth)
        verified = summarise([log for log, kind in zip(logs, kinds, strict=True) if kind != "skip"], num_tokens, depth)
        skip_tv = state.skip_tv.double().cpu()
        return dataclasses.replace(
            every,
            steps=verified.steps,
            histogram=verified.histogram,
            accepted_drafts=verified.accepted_drafts,
            merged_sum=verified.merged_sum,
            merged_max=verified.merged_max,
            tv_realised_sum=every.tv_realised_sum + skip_tv[:, 0],
            tv_realised_max=torch.maximum(every.tv_realised_max, skip_tv[:, 1]),
            tv_measured=every.tv_measured + skip_tv[:, 2].long(),
            skipped_tokens=state.skipped[:, :num_tokens].sum(1).cpu(),
            skipped_tv_sum=skip_tv[:, 0],
            skipped_tv_measured=skip_tv[:, 2].long(),
            skip_steps=committed.sum(1),  # skip steps that committed this row's tokens
            token_skipped=state.skipped[:, :num_tokens].cpu(),
        )


def vvs(sampling, *, drafter, draft, acceptance, interval: int | None = 5, **kwargs) -> VVSDecoder:
    """VVS on top of the tree decoder with ``acceptance`` (LANTERN's rule in ``conf/decoding/vvs.yaml``)."""
    return VVSDecoder(sampling, drafter=drafter, draft=draft, acceptance=acceptance, interval=interval, **kwargs)
