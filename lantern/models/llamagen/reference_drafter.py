"""Their drafter under our drafter's input convention, and what their ``generate()`` does step by step.

Both are outside work-arounds on an ``EaModel`` of the authors' code (``models/ea_model_llamagen.py``), in the
manner of :mod:`lantern.models.llamagen.reference_code`: methods of the instance are wrapped, none of their
lines changes.

**The drafter's inputs.** Their drafter entry ``j`` reads ``fc([e_{j+1}; f_j])`` like ours, but at the 119
condition entries their ``generate()`` feeds token id 0 (``input_ids`` starts with 120 zeros) and masks
nothing, whereas the world's drafter was trained, and runs in our decoders, with the target's condition
embeddings there and the padded condition entries masked (:func:`lantern.decoding.tree.session.drafter_prefill`).
A drafter fed other inputs than it was trained on accepts less (tau 1.53 against 1.86 on identical greedy
tokens), so comparing times across that difference compares the inputs, not the code. :class:`OurDrafterInputs`
makes their drafter read what ours reads: on the call that feeds the condition (the first after their
``reset_kv``) the embeddings of entries ``0 .. 118`` are the target's condition embeddings of slots
``1 .. 119`` and the target states at padded slots are ours (:func:`condition_layout`), and on every call
an attention mask hides the condition entries ours hides. The entry reading image token 0 and everything
after it are theirs as released.

**Their steps.** :class:`Probe` records, per ``generate()`` call, the accepted drafts of every verification
step (the list their ``generate()`` averages into its tau) and the seconds spent in their phases:
``prefill`` (``initialize_tree``: the condition forward and the first draft), ``target`` (``tree_decoding``:
the tree's target forward and its logits), ``walk`` (``evaluate_posterior``), ``drafter``
(``topK_genrate`` after the prefill: feeding the accepted tokens and growing the next tree; ours feeds the
accepted tokens in its ``advance`` phase) and ``advance`` (the rest of ``update_inference_inputs``: the KV
copy and the next token). Each wrapper reads ``time.perf_counter`` twice around one of their calls.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

from lantern.models.llamagen.reference_layout import REFERENCE_COND_SLOTS


@dataclass(frozen=True)
class DrafterInputs:
    """What our drafter reads at the condition entries, in their 120 slots (:func:`condition_layout`)."""

    embeds: torch.Tensor  # (rows, 120, D) the condition embeddings; slot j + 1 is read by entry j
    states: torch.Tensor  # (rows, 120, D) our target's final-norm states over the condition, read at padded slots
    padded: torch.Tensor  # (rows, 120, 1) bool: slots that hold no real condition token
    entries: torch.Tensor  # (rows, 120) long: 1 where their drafter entry is one ours attends to


def condition_layout(cond_emb: torch.Tensor, cond_mask: torch.Tensor, states: torch.Tensor) -> DrafterInputs:
    """Our model batch's condition embeddings (rows, T, D), mask (rows, T) bool (left-padded, as
    :func:`lantern.decoding.batch.guided_inputs` gives them: ``[cond; uncond]`` with CFG) and our target's
    final-norm states over them (rows, T, D), laid out in their 120 slots (see :class:`DrafterInputs`).

    Their slot ``120 - T + i`` holds our slot ``i``; the leading slots are zeros and padded. Entry ``j`` is one
    ours attends to iff it reads a real condition embedding (slot ``j + 1``; ours: ``cond_mask[:, 1:]``,
    :func:`lantern.decoding.tree.session.drafter_prefill`), and the last entry reads image token 0. The states
    matter at one padded slot: the one before the first real slot, whose entry is attended to. Their target's
    state there differs from ours (their HF port spreads a fully padded row's attention over the padded
    columns; LlamaGen keeps the diagonal), so their drafter reads ours at padded slots.
    """
    rows, cond_len, width = cond_emb.shape
    slots = REFERENCE_COND_SLOTS
    lead = slots - cond_len
    embeds = cond_emb.new_zeros(rows, slots, width)
    embeds[:, lead:] = cond_emb
    laid = states.new_zeros(rows, slots, width)
    laid[:, lead:] = states
    valid = torch.zeros(rows, slots, dtype=torch.long, device=cond_mask.device)
    valid[:, lead:] = cond_mask.long()
    entries = torch.cat([valid[:, 1:], torch.ones_like(valid[:, :1])], dim=1)  # entry j reads slot j + 1
    return DrafterInputs(embeds, laid, (valid == 0)[:, :, None], entries)


class _Prefixed(nn.Module):
    """Token embeddings whose first ``prefix.shape[1]`` positions are ``prefix`` instead (one call)."""

    def __init__(self, table: nn.Module, prefix: torch.Tensor):
        super().__init__()
        self.table, self.prefix = table, prefix

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        count = self.prefix.shape[1]
        return torch.cat([self.prefix.to(self.table.weight.dtype), self.table(input_ids[:, count:])], dim=1)


class OurDrafterInputs:
    """Wraps their drafter ``layer`` (``EaModel.ea_layer``): after :meth:`set` it reads our condition entries
    (see the module docstring); after :meth:`clear`, or before any :meth:`set`, it runs as released."""

    def __init__(self, layer: nn.Module):
        self.layer = layer
        self.inputs: DrafterInputs | None = None
        self.prefill = False
        self._forward, self._reset = layer.forward, layer.reset_kv
        layer.forward, layer.reset_kv = self.forward, self.reset_kv

    def set(self, inputs: DrafterInputs) -> None:
        """The next ``generate()``'s condition entries (:func:`condition_layout`)."""
        self.inputs = inputs

    def clear(self) -> None:
        self.inputs = None

    def reset_kv(self) -> None:
        """Their ``generate()`` resets the drafter's cache first: the next forward feeds the condition."""
        self._reset()
        self.prefill = self.inputs is not None

    def forward(self, hidden_states, input_ids, attention_mask=None, past_key_values=None, **kwargs):
        given = self.inputs
        if given is None:
            return self._forward(hidden_states, input_ids, attention_mask, past_key_values=past_key_values, **kwargs)
        rows, count = input_ids.shape
        past = 0 if past_key_values is None else past_key_values[0][0].shape[2]
        mask = torch.ones(rows, past + count, dtype=torch.long, device=input_ids.device)
        slots = min(given.entries.shape[1], past + count)
        mask[:, :slots] = given.entries[:, :slots]
        if not self.prefill:
            return self._forward(hidden_states, input_ids, mask, past_key_values=past_key_values, **kwargs)
        self.prefill = False  # the condition's call: hidden_states (rows, 120, D), input_ids 119 zeros + token 0
        hidden_states = torch.where(given.padded, given.states.to(hidden_states.dtype), hidden_states)
        table = self.layer.embed_tokens
        # entries 0 .. count-2 read the condition embeddings of slots 1 .. count-1; the last reads token 0
        self.layer.embed_tokens = _Prefixed(table, given.embeds[:, 1:count])
        try:
            return self._forward(hidden_states, input_ids, mask, past_key_values=past_key_values, **kwargs)
        finally:
            self.layer.embed_tokens = table


class Probe:
    """Wraps four methods of their ``eagle`` (an ``EaModel``) to record, per ``generate()`` call, the accepted
    drafts of each step (``accepted``) and the seconds of each phase (``seconds``); see the module docstring.
    :meth:`start` before each call clears them."""

    PHASES = ("prefill", "drafter", "target", "walk", "advance")

    def __init__(self, eagle: nn.Module):
        self.eagle = eagle
        self.accepted: list[int] = []
        self.seconds = dict.fromkeys(self.PHASES, 0.0)
        self._inner = 0.0  # drafter seconds inside the current update_inference_inputs
        self._wrap(eagle, "initialize_tree", "prefill")
        self._wrap(eagle, "tree_decoding", "target")
        self._wrap(eagle, "evaluate_posterior", "walk", record=True)
        self._wrap(eagle, "update_inference_inputs", "advance")
        self._wrap(eagle.ea_layer, "topK_genrate", "drafter")

    def start(self) -> None:
        self.accepted = []
        self.seconds = dict.fromkeys(self.PHASES, 0.0)

    def _wrap(self, owner, name: str, phase: str, record: bool = False) -> None:
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            started = time.perf_counter()
            out = inner(*args, **kwargs)
            spent = time.perf_counter() - started
            if phase == "drafter":
                self._inner += spent
                if not self.accepted:  # the first draft belongs to the prefill (initialize_tree)
                    return out
            elif phase == "advance":
                spent, self._inner = spent - self._inner, 0.0  # the drafter's share was counted as drafter
            elif phase == "prefill":
                self._inner = 0.0
            self.seconds[phase] += spent
            if record:
                self.accepted.append(int(out[1]))  # (best_candidate, accept_length, sample_p)
            return out

        setattr(owner, name, timed)
