"""The checks of :mod:`lantern.run.bench.against_reference` before any timing: the drafter's prefill on both
sides, and greedy equality.

**The drafter's prefill** (:func:`check_drafter_prefill`): our drafter over the condition entries and image
token 0 (:func:`lantern.decoding.tree.session.drafter_prefill`) against theirs on their target's states, once
reading our condition entries (:class:`lantern.models.llamagen.reference_drafter.OurDrafterInputs`: the
logits must agree to float rounding) and once as released (code 0 at every condition entry, nothing masked:
they differ, which is why their released drafter accepts less on the world).

**Greedy equality** (:func:`greedy_check`): see :mod:`lantern.run.bench.against_reference`.
"""

from __future__ import annotations

import torch

from lantern.decoding.batch import prefill_condition
from lantern.decoding.tree.session import drafter_prefill
from lantern.models.llamagen import reference_layout as convert
from lantern.models.llamagen.reference_drafter import condition_layout
from lantern.run.bench.reference_timing import our_step_tokens, their_step_tokens


@torch.inference_mode()
def check_drafter_prefill(bundle, drafter, reference, inputs, condition, seed: int = 0) -> dict[str, float]:
    """Largest absolute differences between our drafter's logits after image token 0 and theirs, fed the same
    target states (their target's, over their 120 slots), with their drafter reading our condition entries
    (``inputs``, the :class:`OurDrafterInputs` on their drafter) and as released. One prompt, no CFG."""
    gpt, config = bundle.target, bundle.target.config
    generator = torch.Generator().manual_seed(seed)
    first = torch.randint(0, config.vocab_size, (1,), generator=generator).to(condition.values.device)
    cond_emb, cond_len = gpt.embed_condition(condition.values), config.cls_token_num
    capacity = cond_len + 2
    hidden = prefill_condition(gpt, cond_emb, condition.mask, gpt.new_cache(1, capacity), capacity)  # (1, T, D)
    cache = drafter.new_cache(1, capacity)
    ours = gpt.head(drafter_prefill(gpt, drafter, cache, cond_emb, hidden, first, condition.mask, capacity))  # (1, V)
    # Theirs: their target over their 120 condition slots (left-padded, as their generate() lays them out).
    states, flags = convert.caption_inputs(condition.values, condition.mask)
    valid = int(flags.sum())
    states = torch.cat([states[:, valid:], states[:, :valid]], dim=1)
    flags = torch.flip(flags, dims=[-1])
    model = reference.target.model
    model.tree_mask = None
    their_hidden = model(cond_idx=states.to(cond_emb.dtype), attention_mask=flags)[0]  # (1, 120, D)
    slots = convert.REFERENCE_COND_SLOTS
    input_ids = torch.cat([torch.zeros(1, slots - 1, dtype=torch.long, device=first.device), first[:, None]], dim=1)
    layer = reference.eagle.ea_layer
    out = {}
    for name, matched in (("matched", True), ("released", False)):
        if matched:
            inputs.set(condition_layout(cond_emb, condition.mask, hidden))
        else:
            inputs.clear()
        inputs.reset_kv()  # the next forward feeds the condition, as in their generate()
        layer.tree_mask = None
        try:
            theirs = layer(their_hidden, input_ids=input_ids, use_cache=True)[0][:, -1]  # (1, D)
        finally:
            inputs.clear()
            inputs.reset_kv()
        out[f"drafter_prefill_{name}_max_abs_diff"] = float(
            (ours - reference.target.lm_head(theirs).float()).abs().max()
        )
    out["drafter_prefill_logits_scale"] = float(ours.abs().max())
    return out


def _mean(values: list[int]) -> float:
    return sum(values) / max(1, len(values))


def lantern_rows(plan) -> list[dict]:
    """The LANTERN modes (reference semantics, one per delta)."""
    return [row for row in plan.rows if row["theirs"] and row["theirs"]["lantern"]]


def greedy_check(sides, plan) -> list[dict]:
    """Temperature 0, per prompt: our AR and EAGLE-2 codes against their ``generate()``'s; our LANTERN
    (reference semantics) codes against our decoder walking with their ``evaluate_posterior``."""
    rows = []
    for index in range(plan.check_images):
        ours_ar = sides.ours(sides_row(plan, "ar"), index, greedy=True)().codes.cpu()
        theirs_ar = sides.theirs(sides_row(plan, "ar"), index, greedy=True)().cpu().long()
        eagle = sides_row(plan, "eagle-2 dynamic tree")
        ours_eagle = sides.ours(eagle, index, greedy=True)()
        theirs_eagle = sides.theirs(eagle, index, greedy=True)()
        num_tokens = sides.bundle.target.config.num_image_tokens
        # Tau on one footing (lantern.run.bench.reference_timing): equal when both drafters grow the same trees.
        tau_ours = _mean(our_step_tokens(ours_eagle.per_sample["histogram"][0]))
        tau_theirs = _mean(their_step_tokens(sides.probe.accepted, num_tokens))
        row = {
            "prompt": sides.items[index],
            "ar_equal": bool(torch.equal(ours_ar, theirs_ar)),
            "eagle2_equal": bool(torch.equal(ours_eagle.codes.cpu(), theirs_eagle.cpu().long())),
            "ours_eagle2_equals_ours_ar": bool(torch.equal(ours_eagle.codes.cpu(), ours_ar)),
            "ar_tokens_differing": int((ours_ar != theirs_ar).sum()),
            "tau_ours": tau_ours,
            "tau_theirs": tau_theirs,
            "eagle2_tau_equal": tau_ours == tau_theirs,
            "lantern": {},
        }
        for mode in lantern_rows(plan):
            ours_codes = sides.ours(mode, index, greedy=True)().codes.cpu()
            their_rule = sides.with_their_rule(mode)(index).codes.cpu()
            differing = (ours_codes != their_rule).nonzero()[:, -1]  # token indices (batch 1)
            row["lantern"][str(mode["theirs"]["delta"])] = {
                "equal": bool(torch.equal(ours_codes, their_rule)),
                "tokens_differing": int(differing.numel()),
                "first_differing": int(differing.min()) if differing.numel() else None,
            }
        rows.append(row)
        relaxed = ", ".join(
            f"LANTERN d{delta} equal {r['equal']}" + ("" if r["equal"] else f" (from token {r['first_differing']})")
            for delta, r in row["lantern"].items()
        )
        print(
            f"greedy prompt {index} ({row['prompt']!r}): AR equal {row['ar_equal']}, EAGLE-2 equal "
            f"{row['eagle2_equal']} (tau ours {row['tau_ours']:.2f}, theirs {row['tau_theirs']:.2f}), {relaxed}",
            flush=True,
        )
    return rows


def sides_row(plan, mode: str) -> dict:
    return next(row for row in plan.rows if row["mode"] == mode)
