"""Realised-TV audits as objects: how a run learns the law each emitted token was drawn from.

Every record says which audit ran (``tv_audit``):

* ``exact``: the decoder's rule draws every token from the target's law (TV 0 by construction: AR, EAGLE, SJD,
  MC-SJD, the lossless SJD-PAC); ``tests/test_lossless.py`` holds each to the PIT test;
* ``closed_form``: the step computes the law each emitted token follows and records its TV to the target's law
  (LANTERN, LANTERN++, GSD, SJD++, VVS): exact, no error bar;
* ``mc``: :class:`MonteCarlo`, for decoders whose emitted law has no closed form (SJD-PAC as released with K >= 2,
  ZipAR, PJD, SJD-SV, and any decoder on request: ``tv_audit=mc``).

A decoder names its audit in ``tv_audit`` (:func:`named_audit`: ``exact`` when its settings are lossless, else
``closed_form``, unless the decoder says otherwise). One the Monte Carlo audit can rerun exposes ``rerun_plan``
(a :class:`RerunPlan`) and passes its ``observer`` attribute to the loop (:func:`lantern.decoding.loop.run_schedule`).

**What the Monte Carlo audit measures.** On every ``every``-th step of the first ``images`` images it reruns the
step from the same state ``reruns`` times with independent randomness: new keys (stream ``rng.AUDIT``) for every
uniform the step draws, and the drafts the state carries (a Jacobi window) drawn again from the law the decoder
records for them (its actual law where it tracks one, as SJD++ does). For each token the reference step emitted at
raster position ``n + j`` it keeps the reruns that emitted the same ``j`` tokens before it in its chain (and one
there), so what they emit at ``n + j`` follows the law the reference token was drawn from given its prefix: the law
the closed forms compute. A chain is the whole emission of a speculative or Jacobi step, a grid row's run in a PJD
step (:attr:`RerunPlan.chain`), a single token for ZipAR's independent rows. The target's law there comes from one teacher-forced forward over the image's final tokens. Reruns run
eagerly, replicated ``chunk`` at a time over copies of the caches, outside the timed decode (the job times them
apart: ``tv_audit_mc`` in the record, never in a speed-up).

**The estimator, and its bias.** The plug-in TV of a histogram is biased upward (of order ``sqrt(support / n)``:
about 0.1 at 1,000 draws from a law spread over 100 tokens), far above the losses to be measured. The audit records
instead a split-sample estimate (:mod:`lantern.decoding.audit_estimate`): one half of the reruns picks the tokens
whose surplus over the target clears the noise, the other half measures that surplus, and the halves swap.
``P(S) - p(S) <= TV(P, p)`` for every set ``S`` and ``S`` never sees the reruns that score it, so the estimate is
**unbiased for a lower bound of the TV, and unbiased for 0 when the decoder is lossless** (it can come out slightly
negative). It equals the TV where the surplus of ``P`` over ``p`` sits on tokens the other half sees clearly (LANTERN's
merged token, a tilted sibling) and falls short where a small surplus is spread thinly. Its standard error
(``tv_realised_se``) comes from independent groups of reruns. The plug-in mean (an upper value in expectation) is
kept beside it (``tv_audit_mc.plugin_mean``). The decoders with a closed form agree with it within the standard error
(tests/test_audit.py: LANTERN, LANTERN++, GSD).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from lantern import checks, rng
from lantern.decoding.batch import guided_inputs
from lantern.models.sampling import guided_logits_at, probabilities

AUDITS = ("exact", "closed_form", "mc")
MODES = ("auto", "always", "never")


def named_audit(decoder) -> str:
    """The audit ``decoder`` names (``tv_audit``), or ``exact`` for lossless settings and ``closed_form`` else."""
    named = getattr(decoder, "tv_audit", None)
    if named is not None:
        return named
    return "exact" if decoder.settings.lossless() else "closed_form"


class Emission(NamedTuple):
    """What one step emitted per row (B, E): ``positions`` raster indices, ``tokens``, ``valid`` which are real."""

    positions: torch.Tensor
    tokens: torch.Tensor
    valid: torch.Tensor


@dataclass(frozen=True)
class RerunPlan:
    """How the Monte Carlo audit reruns a decoder's step.

    ``caches``: the context's fields that hold caches (copied into the rerun batch); ``emitted(ctx, before,
    after)``: the step's :class:`Emission`; ``refresh(state) -> state``: the state with its in-flight drafts drawn
    again from their law, with the state's (rerun) keys (None: the state holds none); ``chained``: the step's tokens
    come in raster order, each read by the next (speculative and Jacobi steps), else they are drawn independently
    (ZipAR's rows); ``chain``: a chained emission's entries form chains of ``chain`` consecutive entries, each read
    by the next within its chain and the chains drawn independently given the state (PJD's grid rows; None: one
    chain). A chained step's reference count is the ``valid`` of its own emission, read from the state after it."""

    caches: tuple[str, ...]
    emitted: Callable
    refresh: Callable | None = None
    chained: bool = True
    chain: int | None = None


def chained_emission(ctx, before, after, width: int) -> Emission:
    """The ``width`` tokens a ``codes``/``decided`` state's step may emit: those after ``before.decided``."""
    span = torch.arange(width, device=before.decided.device)
    positions = before.decided[:, None] + span  # (B, E)
    count = after.decided - before.decided
    valid = (span[None, :] < count[:, None]) & (positions < ctx.num_tokens)
    tokens = after.codes.gather(1, positions.clamp_max(after.codes.shape[1] - 1))
    return Emission(positions, tokens, valid)


def _replicated(tensor: torch.Tensor, groups: int, batch: int, copies: int) -> torch.Tensor:
    """(B, ...) or (groups * B, ...) -> each image row repeated ``copies`` times in place (the CFG layout kept)."""
    lead = groups if tensor.shape[0] == groups * batch and groups > 1 else 1
    shaped = tensor.reshape(lead, batch, *tensor.shape[1:]).repeat_interleave(copies, dim=1)
    return shaped.reshape(lead * batch * copies, *tensor.shape[1:])


def replicate_state(state, groups: int, copies: int, keys: torch.Tensor):
    """A state (NamedTuple of per-image (B, ...) and per-model-row tensors) with every row ``copies`` times and
    ``keys`` (B * copies,) in place of its keys."""
    batch = state.keys.shape[0]
    fields = {
        name: _replicated(value, groups, batch, copies) if isinstance(value, torch.Tensor) else value
        for name, value in state._asdict().items()
    }
    return type(state)(**{**fields, "keys": keys})


def replicate_cache(cache, groups: int, batch: int, copies: int, into=None):
    """A copy of ``cache`` whose row tensors (every tensor attribute, or list of them, with ``groups * batch`` rows)
    hold each image row ``copies`` times; written into ``into`` (an earlier copy of the same shape) when given."""
    rows = groups * batch
    out = copy.copy(cache) if into is None else into
    for name, value in vars(cache).items():
        tensors = value if isinstance(value, list) else [value]
        if not tensors or not all(isinstance(t, torch.Tensor) and t.dim() and t.shape[0] == rows for t in tensors):
            continue
        copied = [_replicated(t, groups, batch, copies) for t in tensors]
        if into is None:
            setattr(out, name, copied if isinstance(value, list) else copied[0])
        else:
            targets = getattr(into, name)
            for target, source in zip(targets if isinstance(value, list) else [targets], copied, strict=True):
                target.copy_(source)
    return out


class MonteCarlo:
    """The Monte Carlo TV audit (module docstring) and its knobs: ``mode`` (``auto``: where the decoder names it;
    ``always``: every sampled decoder that can be rerun, beside or instead of its closed form; ``never``), ``reruns``
    per audited step (even, >= 4), ``every`` (audit steps ``every - 1, 2 every - 1, ...``), ``images`` (the first
    ``images`` images of the run; null: all), ``chunk`` (reruns per forward)."""

    kind = "mc"

    def __init__(self, mode: str = "auto", reruns: int = 256, every: int = 8, images: int | None = 8, chunk: int = 64):
        self.mode = checks.choice("tv_audit.mode", mode, MODES, note="when the Monte Carlo TV audit runs")
        self.reruns = checks.integer("tv_audit.reruns", reruns, 4, 1 << 20, note="reruns per audited step")
        if self.reruns % 2:
            raise checks.refuse("tv_audit.reruns", reruns, "an even integer >= 4", "the reruns are halved")
        self.every = checks.integer("tv_audit.every", every, 1, 1 << 20, note="audit every N-th step")
        self.images = checks.optional(checks.integer, "tv_audit.images", images, 1, 1 << 30, note="images audited")
        self.chunk = checks.integer("tv_audit.chunk", chunk, 1, 1 << 16, note="reruns per forward")

    def settings(self) -> dict:
        return {"reruns": self.reruns, "every": self.every, "images": self.images, "chunk": self.chunk}

    def wants(self, decoder) -> bool:
        """Whether this run's decoder is audited by Monte Carlo."""
        if self.mode == "never" or decoder.sampling.greedy or getattr(decoder, "rerun_plan", None) is None:
            return False
        return self.mode == "always" or named_audit(decoder) == "mc"

    @torch.inference_mode()
    def audit(self, decoder, model, condition, keys: torch.Tensor) -> tuple[dict, dict]:
        """Decode the batch again with the audit observing every step; return its per-image statistics (tensors
        (B,): ``tv_realised_sum``, ``tv_realised_var``, ``tv_plugin_sum``, ``tv_measured``) and its cost."""
        started = time.perf_counter()
        session = Session(self, decoder.rerun_plan, keys)
        decoder.observer = session
        try:
            codes = decoder.generate(model, condition, keys).codes
        finally:
            decoder.observer = None
        laws = target_laws(model, condition, decoder.sampling, codes, session.needed(codes.shape[1]))
        stats = session.estimates(codes, laws)
        cost = {"tv_audit_s": time.perf_counter() - started, "tv_audit_forwards": float(session.forwards)}
        cost["tv_audit_steps"] = float(session.steps)
        return stats, cost


class Audited(NamedTuple):
    """One audited step: ``positions`` (B, E), ``reference`` (B, E) which of them the reference step emitted (for
    chained steps set once the next state is seen), ``tokens`` (B, M, E) what each rerun emitted there (-1: none)."""

    positions: torch.Tensor
    reference: torch.Tensor
    tokens: torch.Tensor


class Session:
    """The loop's observer during an audited decode: reruns the audited steps, keeps what they emitted."""

    def __init__(self, audit: MonteCarlo, plan: RerunPlan, keys: torch.Tensor):
        self.audit, self.plan, self.keys = audit, plan, keys
        self.steps = self.forwards = 0
        self.records: list[Audited] = []
        self._open: tuple | None = None  # (record, context, state before) awaiting the reference step's emission
        self._replicas: dict[str, object] = {}

    def __call__(self, kind, step, ctx, state, index: int) -> None:
        self._close(state)
        if step is None or (index + 1) % self.audit.every:  # None: the loop's last state, after its last step
            return
        self.steps += 1
        tokens, positions, valid = [], None, None
        for start in range(0, self.audit.reruns, self.audit.chunk):
            copies = min(self.audit.chunk, self.audit.reruns - start)
            emission = self._rerun(step, ctx, state, index, start, copies)
            batch = state.keys.shape[0]
            shaped = torch.where(emission.valid, emission.tokens, -1).view(batch, copies, -1)
            tokens.append(shaped.to(torch.int32).cpu())
            positions, valid = emission.positions.view(batch, copies, -1)[:, 0], emission.valid.view(batch, copies, -1)
        reference = valid[:, 0].cpu()  # independent draws: the reference draws where every rerun does
        self.records.append(Audited(positions.cpu(), reference, torch.cat(tokens, dim=1)))
        if self.plan.chained:  # a copy: the reference step's emission is read against the state after it
            kept = type(state)(*(value.clone() if isinstance(value, torch.Tensor) else value for value in state))
            self._open = (len(self.records) - 1, ctx, kept)

    def _rerun(self, step, ctx, state, index: int, start: int, copies: int) -> Emission:
        groups, batch = ctx.groups, state.keys.shape[0]
        keys = rng.derived_keys(state.keys, index, rng.AUDIT, self.audit.reruns)[:, start : start + copies]
        rerun = replicate_state(state, groups, copies, keys.reshape(-1))
        replica = copy.copy(ctx)
        for name in self.plan.caches:
            key = f"{name}:{copies}"
            self._replicas[key] = replicate_cache(getattr(ctx, name), groups, batch, copies, self._replicas.get(key))
            setattr(replica, name, self._replicas[key])
        if self.plan.refresh is not None:
            rerun = self.plan.refresh(rerun)
        after, _ = step(replica, rerun, False)
        self.forwards += 1
        return self.plan.emitted(replica, rerun, after)

    def _close(self, after) -> None:
        """The reference count of the last audited chained step: its emission's ``valid``, ``after`` the state the
        step led to."""
        if self._open is None:
            return
        number, ctx, before = self._open
        valid = self.plan.emitted(ctx, before, after).valid.cpu()
        self.records[number] = self.records[number]._replace(reference=valid)
        self._open = None

    def needed(self, num_tokens: int) -> torch.Tensor:
        """(B, N) bool: the positions whose target law the estimates read."""
        if self._open is not None:
            raise RuntimeError("the audited decode's loop did not report its last state (run_schedule's observe)")
        batch = self.keys.shape[0]
        needed = torch.zeros(batch, num_tokens, dtype=torch.bool)
        for record in self.records:
            rows, slots = (record.reference & (record.positions < num_tokens)).nonzero(as_tuple=True)
            needed[rows, record.positions[rows, slots]] = True
        return needed

    def estimates(self, codes: torch.Tensor, laws: dict[tuple[int, int], torch.Tensor]) -> dict:
        """Per-image sums of the split-sample estimates, their variances and the plug-in TVs, and counts."""
        from lantern.decoding.audit_estimate import step_estimate

        batch = codes.shape[0]
        totals = {name: torch.zeros(batch, dtype=torch.float64) for name in ("sum", "var", "plugin")}
        measured = torch.zeros(batch, dtype=torch.long)
        codes = codes.cpu()
        for record in self.records:
            for row in range(batch):
                result = step_estimate(record, row, codes[row], laws, self.plan.chained, self.plan.chain)
                totals["sum"][row] += result.estimate
                totals["var"][row] += result.variance
                totals["plugin"][row] += result.plugin
                measured[row] += result.tokens
        return {
            "tv_realised_sum": totals["sum"],
            "tv_realised_var": totals["var"],
            "tv_plugin_sum": totals["plugin"],
            "tv_measured": measured,
        }


def target_laws(model, condition, sampling, codes: torch.Tensor, needed: torch.Tensor) -> dict:
    """The target's law (V,) at every ``needed`` (B, N) position given the image's tokens before it, from one
    teacher-forced forward: ``{(row, position): law}`` (CPU float64)."""
    emb, mask = guided_inputs(model, condition, sampling)
    groups = emb.shape[0] // codes.shape[0]
    hidden = model.forward_teacher(emb, codes.repeat(groups, 1), mask)  # (rows, N, D): row n predicts token n
    laws = {}
    for row, position in needed.nonzero().tolist():
        rows = torch.arange(groups, device=hidden.device) * codes.shape[0] + row
        logits = model.head(hidden[rows, position][:, None])  # (groups, 1, V)
        steps = torch.full((1, 1), position, device=hidden.device)
        law = probabilities(guided_logits_at(logits, sampling, steps), sampling)[0, 0]
        laws[(row, position)] = law.double().cpu()
    return laws


def with_audit(stats, measured: dict | None):
    """``stats`` (:class:`~lantern.decoding.stats.DecodeStats`) with its TV entries replaced by the Monte Carlo
    audit's ``measured`` ones (:meth:`MonteCarlo.audit`), or by none measured where the batch was not audited, so
    a run's realised TV comes from one audit."""
    import dataclasses

    batch = stats.steps.shape[0]
    if measured is None:
        zeros = torch.zeros(batch, dtype=torch.float64)
        measured = {
            "tv_realised_sum": zeros,
            "tv_realised_var": zeros,
            "tv_plugin_sum": zeros,
            "tv_measured": torch.zeros(batch, dtype=torch.long),
        }
    return dataclasses.replace(stats, tv_realised_max=None, **measured)


def audit_ran(decoder, monte_carlo: bool) -> str | None:
    """The record's ``tv_audit``: ``mc`` when the Monte Carlo audit ran, else the audit the decoder names, or None
    where it names ``mc`` and that did not run (then the TV is not measured)."""
    if monte_carlo:
        return "mc"
    named = named_audit(decoder)
    return None if named == "mc" else named
