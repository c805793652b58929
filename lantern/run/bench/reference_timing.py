"""The timing half of :mod:`lantern.run.bench.against_reference`: interleaved runs, tau at equal footing, and a
speed ratio only where the two sides' tau agree.

**Tau on one footing.** Both sides' tau is the mean over the verification steps that build the image of the
tokens each step appends (accepted drafts + 1). Ours: every step of the decode (it stops once ``N`` tokens are
decided; :attr:`lantern.decoding.stats.DecodeStats.histogram`). Theirs: the accepted lengths their
``generate()`` records (:class:`lantern.models.llamagen.reference_drafter.Probe`), cut after the step at which
``N`` tokens are decided; their loop runs on until more than ``N`` are appended (1-2 more steps, which they pay
for in time and which are counted in their per-step times, not in their tau).

**Agreement.** Sampled steps are noisy: the two taus agree when their difference is within ``TAU_Z`` standard
errors, each side's from the spread of its per-step tokens over every step of every image (one run: a repeat
decodes the same image). A mode whose taus disagree gets no speed ratio (``ratio: None`` and ``refused`` says
why): a ratio across different step compressions times the drafter's guesses, not the code.

**Per step and per phase.** ``ms per step`` is a side's time per image over the verification steps it ran
(prefill included in the time); the phases (ours: the eager step's phase timer; theirs: the probe) are
seconds per verification step, and ``prefill`` per image. ``other`` is what no phase covers (the host loop).
"""

from __future__ import annotations

import math
import statistics

import torch

from lantern.run.bench.common import ran_with
from lantern.run.timing import ratio_of_totals, timed

TAU_Z = 3.0  # standard errors of the difference within which two sampled taus agree
PHASES = ("drafter", "target", "walk", "advance")


def our_step_tokens(histogram: torch.Tensor) -> list[int]:
    """Tokens appended by each verification step of one image, from its histogram (D+1,) of steps that
    accepted 0..D drafts (the order of steps is not kept: it does not matter for a mean or a spread)."""
    return [accepted + 1 for accepted, count in enumerate(histogram.tolist()) for _ in range(int(count))]


def their_step_tokens(accepted: list[int], num_tokens: int) -> list[int]:
    """Tokens appended by each of their steps up to the one at which ``num_tokens`` are decided (their
    ``generate()`` holds the pending token apart: ``num_tokens - 1`` appended means ``num_tokens`` decided)."""
    out, total = [], 0
    for drafts in accepted:
        out.append(drafts + 1)
        total += drafts + 1
        if total >= num_tokens - 1:
            break
    return out


def tau_agreement(ours: list[list[int]], theirs: list[list[int]], z: float = TAU_Z) -> dict:
    """``ours``/``theirs``: per image, the tokens of each step. Their taus, the standard error of the
    difference, and whether they agree within ``z`` of it (exactly, when neither side varies: greedy)."""
    a = [t for image in ours for t in image]
    b = [t for image in theirs for t in image]
    tau_a, tau_b = statistics.fmean(a), statistics.fmean(b)
    var = lambda xs: statistics.variance(xs) if len(xs) > 1 else 0.0  # noqa: E731
    se = math.sqrt(var(a) / len(a) + var(b) / len(b))
    difference = tau_a - tau_b
    agree = abs(difference) <= z * se if se > 0 else difference == 0
    return {
        "tau_ours": tau_a,
        "tau_theirs": tau_b,
        "tau_se": se,
        "tau_z": abs(difference) / se if se > 0 else (0.0 if difference == 0 else math.inf),
        "tau_agree": bool(agree),
        "tau_steps": [len(a), len(b)],
    }


def compare(row: dict, times: dict, steps: dict, tokens: dict, phases: dict, speculative: bool) -> dict:
    """One mode's figures. ``times[side]`` (image, run) seconds; ``steps[side]`` (image, run) verification steps
    run; ``tokens[side]`` per image the tokens of each counted step (:func:`tau_agreement`); ``phases[side]``
    phase -> summed seconds over every timed run. The ratio is refused where the taus disagree."""
    ours_t, theirs_t = times["ours"], times["theirs"]
    ratio, per_run = ratio_of_totals(ours_t, theirs_t)
    record = {
        "mode": row["mode"],
        "ours_s_per_image": statistics.mean(statistics.median(t) for t in ours_t),
        "theirs_s_per_image": statistics.mean(statistics.median(t) for t in theirs_t),
        "ratio": ratio,
        "ratio_runs": per_run,
        "refused": None,
        "times_s": {"ours": ours_t, "theirs": theirs_t},  # (image, run)
        "steps": steps,
    }
    total_steps = {side: sum(sum(s) for s in steps[side]) for side in ("ours", "theirs")}
    total_time = {side: sum(sum(t) for t in times[side]) for side in ("ours", "theirs")}
    for side in ("ours", "theirs"):
        record[f"{side}_ms_per_step"] = 1000 * total_time[side] / total_steps[side]
        images = sum(len(t) for t in times[side])
        spent = phases[side]
        per_step = {phase: 1000 * spent.get(phase, 0.0) / total_steps[side] for phase in PHASES}
        per_step["prefill_per_image"] = 1000 * spent.get("prefill", 0.0) / images
        covered = sum(spent.get(phase, 0.0) for phase in (*PHASES, "prefill"))
        per_step["other"] = 1000 * (total_time[side] - covered) / total_steps[side]
        record[f"{side}_phases_ms"] = per_step
    record["step_ratio"] = record["ours_ms_per_step"] / record["theirs_ms_per_step"]
    if speculative:
        record.update(tau_agreement(tokens["ours"], tokens["theirs"]))
        if not record["tau_agree"]:
            record["refused"] = (
                f"tau differs beyond noise: ours {record['tau_ours']:.3f}, theirs {record['tau_theirs']:.3f} "
                f"({record['tau_z']:.1f} standard errors > {TAU_Z:g})"
            )
            record["ratio"] = record["step_ratio"] = None
    else:
        record.update({"tau_ours": 1.0, "tau_theirs": 1.0, "tau_agree": True})
    return record


def time_modes(sides, plan) -> list[dict]:
    """The interleaved timing of every mode, both sides (see :mod:`lantern.run.bench.against_reference`)."""
    for row in plan.rows:  # warm-up: caches, neighbour tables, allocator, per mode and side
        sides.ours(row, 0)()
        sides.theirs(row, 0)()
    num_tokens = sides.bundle.target.config.num_image_tokens
    records = []
    data = {row["mode"]: _empty(plan.images) for row in plan.rows}
    for run in range(plan.runs):
        for index in range(plan.images):
            for row in plan.rows:
                entry = data[row["mode"]]
                for side in ("ours", "theirs"):
                    seconds, result = timed(getattr(sides, side)(row, index), sides.bundle.device)
                    entry["times"][side][index].append(seconds)
                    steps, tokens, spent = _read(side, result, sides, num_tokens, bool(row["theirs"]))
                    entry["steps"][side][index].append(steps)
                    if run == 0:
                        entry["tokens"][side][index] = tokens
                    for phase, value in spent.items():
                        entry["phases"][side][phase] = entry["phases"][side].get(phase, 0.0) + value
    for row in plan.rows:
        entry = data[row["mode"]]
        record = compare(row, entry["times"], entry["steps"], entry["tokens"], entry["phases"], bool(row["theirs"]))
        record.update(
            {
                "ours_overrides": sides.overrides(row),
                "theirs_generate": row["theirs"] or {"generate": "LlamaForCausalLM.generate"},
                **ran_with(sides.our_decoder(row, greedy=False), sides.bundle.target),
                "theirs_compile": "none (their code is never compiled)",
                "threads": plan.threads,
            }
        )
        records.append(record)
        shown = "refused" if record["ratio"] is None else f"{record['ratio']:.3f}"
        print(
            f"{row['mode']:44s} ours {record['ours_s_per_image']:6.3f} s/image  theirs "
            f"{record['theirs_s_per_image']:6.3f}  ours/theirs {shown}  tau {record['tau_ours']:.2f} / "
            f"{record['tau_theirs']:.2f}  ms/step {record['ours_ms_per_step']:.1f} / {record['theirs_ms_per_step']:.1f}",
            flush=True,
        )
    return records


def _empty(images: int) -> dict:
    per_side = lambda make: {side: make() for side in ("ours", "theirs")}  # noqa: E731
    return {
        "times": per_side(lambda: [[] for _ in range(images)]),
        "steps": per_side(lambda: [[] for _ in range(images)]),
        "tokens": per_side(lambda: [None] * images),
        "phases": per_side(dict),
    }


def _read(side: str, result, sides, num_tokens: int, speculative: bool) -> tuple[int, list[int], dict]:
    """(verification steps run, tokens of each counted step, phase seconds) of one decode; AR: N - 1 steps of
    one token, no phases (neither side's AR times its phases)."""
    if not speculative:
        return num_tokens - 1, [1] * (num_tokens - 1), {}
    if side == "ours":
        stats = result.per_sample
        spent = {k[: -len("_time_s")]: v for k, v in result.stats.items() if k.endswith("_time_s")}
        return int(stats["steps"].sum()), our_step_tokens(stats["histogram"][0]), spent
    probe = sides.probe
    return len(probe.accepted), their_step_tokens(probe.accepted, num_tokens), dict(probe.seconds)
