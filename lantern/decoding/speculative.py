"""Speculative decoding: a drafter proposes a tree, the target verifies it in one forward.

Any drafter, draft structure and acceptance rule combine here. Per row (image) the decoder keeps
``n`` decided tokens and ``L = T + n - 1`` valid cache slots in both the target's and the drafter's
static caches; the last decided token is pending (not yet in the target cache) and is the root of
the next draft. One step:

1. the structure grows a draft through :class:`DrafterSession` (drafter entries for tree nodes go to
   scratch slots after ``L``);
2. the target runs once over ``[root, nodes]`` at slots ``L .. L+N``, positions ``L + depth``, with
   a tree mask, giving the target distribution ``p`` at every node;
3. :func:`~lantern.speculative.verify.walk_tree` accepts a path and draws the next token;
4. the accepted path's target cache entries are moved to ``L .. L+m`` (``KVCache.move``) and the
   drafter consumes the accepted tokens with their true target features.

Rows accept different numbers of tokens; every index is per row. The only host synchronisation is
one read per step of (smallest ``n``, largest ``L``), which decides termination and mask widths.
"""

from __future__ import annotations

import time

import torch

from lantern.conditioning import Condition
from lantern.decoding.base import DecodeResult, guided_inputs
from lantern.models.gpt import Transformer, prefix_causal_mask
from lantern.sampling import SamplingConfig, guided_logits, guided_logits_at, next_token, verification_probabilities
from lantern.speculative.acceptance import AcceptanceRule
from lantern.speculative.drafter import Drafter
from lantern.speculative.verify import walk_tree


class PhaseClock:
    """Time spent per phase without synchronising each step: CUDA events read once at the end, or
    ``perf_counter`` on the CPU (where work is synchronous)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: dict[str, list] = {}

    def now(self):
        """A time mark."""
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def add(self, phase: str, start, stop) -> None:
        """Count the span between two marks towards ``phase``."""
        self.marks.setdefault(phase, []).append((start, stop))

    def totals(self) -> dict[str, float]:
        """Seconds per phase (synchronises once on CUDA)."""
        if self.cuda and self.marks:
            torch.cuda.synchronize()
            return {k: sum(a.elapsed_time(b) for a, b in v) / 1000 for k, v in self.marks.items()}
        return {k: sum(b - a for a, b in v) for k, v in self.marks.items()}


def _column_validity(cond_mask: torch.Tensor, width: int) -> torch.Tensor:
    """(rows, width) bool: columns under ``cond_mask`` (rows, C) follow it, later columns are valid."""
    valid = torch.ones(cond_mask.shape[0], width, dtype=torch.bool, device=cond_mask.device)
    valid[:, : cond_mask.shape[1]] = cond_mask
    return valid


class DrafterSession:
    """The drafter's side of one draft: implements the ``Expander`` protocol of the draft structures.

    Entry 0 is the root (the pending token, whose drafter feature ``root_feature`` was computed when
    the previous step's tokens were consumed); entry ``e >= 1`` is written at drafter cache slot
    ``L + e - 1`` and attends to the valid prefix ``< L`` and to its ancestor entries.
    """

    def __init__(
        self, model: Transformer, drafter: Drafter, cache, sampling: SamplingConfig, root_feature: torch.Tensor,
        base: torch.Tensor, decided: torch.Tensor, columns: torch.Tensor, width: int, max_entries: int,
    ):
        self.model, self.drafter, self.cache, self.sampling = model, drafter, cache, sampling
        self.base, self.decided, self.columns = base, decided, columns[:, :width]
        batch, rows = base.shape[0], root_feature.shape[0]
        self.groups = rows // batch
        device = base.device
        self.features = torch.zeros(rows, max_entries, root_feature.shape[-1], dtype=root_feature.dtype, device=device)
        self.features[:, 0] = root_feature
        self.depth = torch.zeros(batch, max_entries, dtype=torch.long, device=device)
        self.ancestors = torch.eye(max_entries, dtype=torch.bool, device=device).repeat(batch, 1, 1)  # (B, E, E)
        # Per step, not per expansion: which cache columns are the valid prefix, and which entry each
        # scratch column holds (entry e >= 1 lives at column L + e - 1).
        columns = torch.arange(width, device=device)
        self.prefix = (columns[None, :] < base[:, None]) & self.columns[:batch]  # (B, W)
        self.entry = columns[None, :] - base[:, None] + 1  # (B, W)
        self.entry_index = self.entry.clamp(0, max_entries - 1)[:, None, :]  # (B, 1, W)
        self.count = 1
        self.forwards = 0
        logits = model.head(root_feature)[:, None]  # (rows, 1, V)
        self.root_q = verification_probabilities(guided_logits_at(logits, sampling, decided[:, None]), sampling)[:, 0]

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        return x.repeat(self.groups, *([1] * (x.dim() - 1)))

    def expand(self, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        """Feed nodes ``tokens`` (B, n) under entries ``parents`` (B, n); return their q (B, n, V)."""
        batch, n = tokens.shape
        start, stop = self.count, self.count + n
        device = tokens.device
        depth = self.depth.gather(1, parents) + 1  # (B, n)
        self.depth[:, start:stop] = depth
        self.ancestors[:, start:stop] |= self.ancestors.gather(1, parents[:, :, None].expand(-1, -1, self.ancestors.shape[2]))
        ancestors = self.ancestors[:, start:stop]  # (B, n, E): own bit from the identity, then the parent's
        in_scratch = (self.entry >= 1) & (self.entry < stop)  # (B, W)
        tree = ancestors.gather(2, self.entry_index.expand(-1, n, -1))  # (B, n, W)
        mask = self.prefix[:, None, :] | (tree & in_scratch[:, None, :])  # (B, n, W)
        slots = self.base[:, None] + torch.arange(start - 1, stop - 1, device=device)  # (B, n)
        positions = self.base[:, None] - 1 + depth  # drafter entry index of each node
        parent_features = self.features.gather(1, self._rows(parents)[:, :, None].expand(-1, -1, self.features.shape[-1]))
        out = self.drafter(
            self.model.embed_tokens(self._rows(tokens)), parent_features, self._rows(positions), self._rows(slots),
            self._rows(mask)[:, None], self.cache,
        )  # (rows, n, D)
        self.features[:, start:stop] = out
        self.count = stop
        self.forwards += 1
        logits = self.model.head(out)  # (rows, n, V)
        return verification_probabilities(guided_logits_at(logits, self.sampling, self.decided[:, None] + depth), self.sampling)


class SpeculativeDecoder:
    """Draft with ``drafter`` in the shape of ``draft``, verify with ``acceptance``.

    The rule is specialised to the candidates the structure produces: greedy decoding (temperature 0)
    drafts the drafter's top-ranked children whatever ``draft.candidates`` says (sampled drafts
    degenerate to them) and uses the rule's greedy form, recorded as ``candidates: greedy``; sampling
    uses the structure's ``candidates`` (deterministic top-k children, or children sampled without
    replacement). ``name`` labels the records (eagle, lantern...).
    """

    def __init__(self, sampling: SamplingConfig, drafter: Drafter, draft, acceptance: AcceptanceRule, name: str = "speculative"):
        self.sampling = sampling
        self.drafter = drafter
        self.draft = draft
        self.mode = "greedy" if sampling.greedy else draft.candidates
        self.rule = acceptance.for_candidates(self.mode)
        self.rule.check_draft(draft)
        self.name = name

    def describe(self) -> dict:
        """Decoder settings recorded with results (``candidates`` as decoded: greedy at temperature 0)."""
        return {**self.draft.describe(), **self.rule.describe(), "candidates": self.mode}

    @torch.inference_mode()
    def generate(self, model: Transformer, condition: Condition, keys: torch.Tensor) -> DecodeResult:
        """Decode all image tokens for ``condition`` (B prompts) with per-sample RNG ``keys`` (B,)."""
        cfg, sampling, drafter = model.config, self.sampling, self.drafter
        drafter.check_target(cfg)
        clock = PhaseClock(keys.device)
        cond_len, num_tokens = cfg.cls_token_num, cfg.num_image_tokens
        depth, nodes = self.draft.depth, self.draft.nodes
        cond_emb, cond_mask = guided_inputs(model, condition, sampling)
        rows, batch = cond_emb.shape[0], len(condition)
        groups = rows // batch
        device = cond_emb.device
        capacity = cond_len + num_tokens + depth + nodes + 2
        target_cache, drafter_cache = model.new_cache(rows, capacity), drafter.new_cache(rows, capacity)
        target_columns = _column_validity(cond_mask, capacity)
        drafter_columns = _column_validity(cond_mask[:, 1:], capacity)

        started = clock.now()
        index = torch.arange(cond_len, device=device)
        hidden = model.forward_embeddings(
            cond_emb, index, index.expand(rows, -1), prefix_causal_mask(cond_mask, cond_len), target_cache
        )  # (rows, T, D)
        codes = torch.zeros(batch, num_tokens + 2 * depth + 2, dtype=torch.long, device=device)
        codes[:, 0] = next_token(guided_logits(model.head(hidden[:, -1]), sampling, 0), sampling, keys, 0)
        clock.add("target", started, clock.now())

        started = clock.now()
        embeds = torch.cat([drafter.condition_inputs(model, cond_emb), model.embed_tokens(codes[:, :1].repeat(groups, 1))], dim=1)  # (rows, T, D)
        root_feature = drafter(
            embeds, hidden, index, index.expand(rows, -1), prefix_causal_mask(cond_mask[:, 1:], cond_len), drafter_cache
        )[:, -1]  # (rows, D)
        clock.add("drafter", started, clock.now())

        decided = torch.ones(batch, dtype=torch.long, device=device)  # n
        length = torch.full((batch,), cond_len, dtype=torch.long, device=device)  # L
        # Per-step logs, summarised once at the end: accepted drafts (-1 for a finished row) and the
        # mass moved onto each accepted level. A row takes at most num_tokens - 1 steps.
        accepted_log = torch.full((batch, num_tokens), -1, dtype=torch.long, device=device)
        tv_log = torch.zeros(batch, num_tokens, depth + 1, dtype=torch.float64, device=device)  # realised TV per emitted token
        merged_log = torch.zeros(batch, num_tokens, depth, dtype=torch.float64, device=device)
        step_index = 0
        target_forwards, drafter_forwards = 1, 1
        span = torch.arange(depth + 1, device=device)
        last_position = cfg.max_seq_len - 1
        while True:
            smallest, longest = torch.stack([decided.min(), length.max()]).tolist()  # the step's one sync
            if smallest >= num_tokens:
                break
            active = decided < num_tokens  # (B,)
            root = codes.gather(1, (decided - 1)[:, None])[:, 0]

            started = clock.now()
            session = DrafterSession(
                model, drafter, drafter_cache, sampling, root_feature, length, decided, drafter_columns,
                longest + nodes + 1, nodes + 1,
            )
            draft = self.draft.grow(session, root, keys, decided, self.mode)
            drafter_forwards += session.forwards
            clock.add("drafter", started, clock.now())

            started = clock.now()
            count = draft.num_nodes
            width = longest + count
            columns = torch.arange(width, device=device)
            relative = columns[None, :] - length[:, None]  # (B, W)
            prefix = (relative < 0) & target_columns[:batch, :width]
            in_tree = (relative >= 0) & (relative < count)
            tree = draft.ancestors.gather(2, relative.clamp(0, count - 1)[:, None, :].expand(-1, count, -1))
            mask = (prefix[:, None, :] | (tree & in_tree[:, None, :]))[:, None]  # (B, 1, N+1, W)
            slots = length[:, None] + torch.arange(count, device=device)  # (B, N+1)
            positions = (length[:, None] + draft.depth).clamp_max(last_position)
            logits, node_hidden = model.forward_tokens(
                draft.tokens.repeat(groups, 1), positions.repeat(groups, 1), slots.repeat(groups, 1),
                mask.repeat(groups, 1, 1, 1), target_cache,
            )  # (rows, N+1, V), (rows, N+1, D)
            p = verification_probabilities(guided_logits_at(logits, sampling, decided[:, None] + draft.depth), sampling)
            target_forwards += 1
            clock.add("target", started, clock.now())

            started = clock.now()
            walk = walk_tree(draft, p, self.rule, sampling, keys, decided, audit=step_index % self.rule.tv_audit_every == 0)
            accepted = walk.accepted
            advance = torch.where(active, accepted + 1, torch.zeros_like(accepted))
            path_nodes = torch.cat([torch.zeros(batch, 1, dtype=torch.long, device=device), walk.path], dim=1)  # (B, D+1)
            on_path = (span[None, :] <= accepted[:, None]) & active[:, None]
            source = torch.where(on_path, path_nodes.clamp_min(0), span[None, :])  # self-copies past the path
            new_tokens = torch.cat([draft.tokens.gather(1, walk.path.clamp_min(0)), root[:, None]], dim=1)
            new_tokens.scatter_(1, accepted[:, None], walk.next_token[:, None])  # (B, D+1): path, then the drawn token
            codes.scatter_(1, decided[:, None] + span[None, :], new_tokens)
            target_cache.move((length[:, None] + source).repeat(groups, 1), (length[:, None] + span[None, :]).repeat(groups, 1))
            clock.add("verify", started, clock.now())

            started = clock.now()
            features = node_hidden.gather(1, source.repeat(groups, 1)[:, :, None].expand(-1, -1, node_hidden.shape[-1]))
            entries = length[:, None] + span[None, :]  # (B, D+1)
            consume_width = longest + depth + 1
            consume_columns = torch.arange(consume_width, device=device)
            consume_mask = (consume_columns[None, None, :] <= entries[:, :, None]) & drafter_columns[:batch, None, :consume_width]
            out = drafter(
                model.embed_tokens(new_tokens.repeat(groups, 1)), features, entries.repeat(groups, 1),
                entries.repeat(groups, 1), consume_mask.repeat(groups, 1, 1)[:, None], drafter_cache,
            )  # (rows, D+1, D)
            root_feature = out.gather(1, accepted.repeat(groups)[:, None, None].expand(-1, 1, out.shape[-1]))[:, 0]
            drafter_forwards += 1
            clock.add("drafter", started, clock.now())

            accepted_log[:, step_index] = torch.where(active, accepted, -1)
            tv_log[:, step_index] = walk.tv.double()
            merged_log[:, step_index] = walk.merged.double()
            step_index += 1
            decided = decided + advance
            length = length + advance

        ran = accepted_log >= 0  # (B, S)
        steps = ran.sum(1)
        histogram = torch.zeros(batch, depth + 2, dtype=torch.long, device=device)
        histogram.scatter_add_(1, torch.where(ran, accepted_log, depth + 1), torch.ones_like(accepted_log))
        # Emitted tokens of each step: entries 0..accepted (a row's last step may overrun the image; its
        # extra tokens are cut from the codes and not counted here either).
        emitted = (span[None, None, :] <= accepted_log[:, :, None])  # (B, S, D+1)
        produced = torch.cumsum(emitted.sum(2), dim=1) - emitted.sum(2)  # (B, S) tokens before each step
        emitted &= (produced[:, :, None] + span[None, None, :]) < num_tokens - 1
        measured = emitted & ~torch.isnan(tv_log)
        realised = torch.where(measured, tv_log, 0.0)
        levels = (span[None, None, :-1] < accepted_log[:, :, None])  # (B, S, D) accepted draft tokens
        moved = torch.where(levels, merged_log, 0.0)
        histogram = histogram[:, : depth + 1]
        timing = clock.totals()
        stats = {
            "target_forwards": float(target_forwards),
            "drafter_forwards": float(drafter_forwards),
            "target_time_s": timing.get("target", 0.0),
            "drafter_time_s": timing.get("drafter", 0.0),
            "verify_time_s": timing.get("verify", 0.0),
        }
        per_sample = {
            "steps": steps.cpu(),
            "tokens": torch.full((batch,), num_tokens - 1, dtype=torch.long),
            "histogram": histogram.cpu(),
            "tv_realised_sum": realised.sum((1, 2)).cpu(),
            "tv_realised_max": realised.amax((1, 2)).cpu(),
            "tv_measured": measured.sum((1, 2)).cpu(),
            "merged_sum": moved.sum((1, 2)).cpu(),
            "merged_max": moved.amax((1, 2)).cpu(),
            "accepted_drafts": levels.sum((1, 2)).cpu(),
        }
        return DecodeResult(codes[:, :num_tokens], stats, per_sample)
